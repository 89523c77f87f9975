//! The worker's cache of leased retry tokens, its report batcher and its view
//! of scope state.
//!
//! # How tokens flow
//! The hot path, [`LeaseCache::try_take`], takes a token from a lease already
//! held for the scope: one map lookup and one uncontended lock, no RPC. When
//! the tokens left fall to the low-water mark, it asks the background task to
//! lease another batch, so a steady worker never waits for the coordinator.
//! [`LeaseCache::take`] is the same with one bounded `Lease` RPC when the
//! cache is empty (the first retry of a scope).
//!
//! Leases expire. Tokens still held when a lease is about to expire are given
//! back with `Release`, so they return to the fleet instead of counting as
//! spent; a lease that expires anyway is simply dropped (the coordinator has
//! already counted it).
//!
//! # Reports
//! First attempts, successes and rate-limit evidence are counted locally and
//! sent in one `Report` per scope at least every [`LeaseCacheConfig::report_interval`].
//! A report that fails is merged back and sent again (bounded), so nothing is
//! lost to a short outage.
//!
//! # When the coordinator is gone
//! If the [`CoordinatorLink`] is degraded, takes are answered by a
//! conservative per-process [`LocalBudget`] plus [`AdaptiveThrottle`] instead
//! of hanging; the background task keeps probing and the fleet budget is used
//! again as soon as an RPC succeeds.
//!
//! The background task ends when the last clone of the cache is dropped,
//! after a final flush and release.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, SystemTime};

use dashmap::DashMap;
use rand::rngs::StdRng;
use rand::{RngExt, SeedableRng};
use tokio::sync::{Notify, mpsc};
use tokio::task::JoinSet;
use tokio::time::Instant;
use tokio_util::sync::{CancellationToken, DropGuard};
use tollgate_proto::v1::{
    Evidence, LeaseLimit, LeaseRequest, ReleaseRequest, ReportRequest, RetryClass, ScopeEventKind,
    WatchRequest,
};

use crate::clock::{Clock, from_unix_ms, to_unix_ms};
use crate::fallback::{AdaptiveThrottle, LocalBudget};
use crate::link::{CoordinatorLink, LinkState};
use crate::scope::Scope;
use crate::telemetry::TraceOrigin;

/// Evidence items kept per scope between two reports; the proto allows 64.
const MAX_EVIDENCE_PER_REPORT: usize = 64;
/// Scopes with unsent reports, or with cached tokens, kept at once. Beyond
/// it new scopes are not cached (takes still work through `take`).
const MAX_SCOPES: usize = 10_000;
/// The coordinator watches at most this many scopes per stream.
const MAX_WATCHED_SCOPES: usize = 64;
/// How often a degraded worker checks whether the coordinator is back.
const PROBE_INTERVAL: Duration = Duration::from_secs(1);

/// Tuning for the cache. The defaults suit a worker making tens of retries a
/// second per scope.
#[derive(Debug, Clone)]
pub struct LeaseCacheConfig {
    /// Tokens asked for per lease.
    pub batch: u32,
    /// Refill when this few tokens are left.
    pub low_water: u32,
    /// How often reports are flushed and leases tended.
    pub report_interval: Duration,
    /// Tokens are given back this long before their lease expires, to leave
    /// room for clock skew and the Release round trip.
    pub expiry_margin: Duration,
    /// The fallback budget's ratio of retries to first attempts.
    pub fallback_ratio: f64,
    /// The fallback budget's floor, in retries per second per scope.
    pub fallback_floor_per_sec: f64,
    /// The fallback budget's window.
    pub fallback_window: Duration,
    /// Seed for the throttle's draws; `None` seeds from the OS.
    pub seed: Option<u64>,
}

impl Default for LeaseCacheConfig {
    fn default() -> Self {
        LeaseCacheConfig {
            batch: 20,
            low_water: 5,
            report_interval: Duration::from_millis(100),
            expiry_margin: Duration::from_millis(500),
            // Half the fleet default (0.2) and a tenth of its floor: a worker
            // that cannot see the fleet assumes it is one of many.
            fallback_ratio: 0.1,
            fallback_floor_per_sec: 1.0,
            fallback_window: Duration::from_secs(10),
            seed: None,
        }
    }
}

/// What taking a token gave.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Take {
    /// A token from a fleet lease.
    Leased {
        /// The lease the token came from (shared, so taking allocates nothing).
        lease_id: Arc<str>,
        /// The policy version the lease was granted under.
        policy_version: u64,
    },
    /// The fleet budget has no token for this scope now.
    Exhausted,
    /// An operator froze the scope.
    Frozen,
    /// The coordinator is unreachable; the local fallback budget admitted
    /// (`true`) or refused (`false`) the retry.
    Fallback(bool),
}

impl Take {
    /// Whether a retry may go ahead.
    pub fn admitted(&self) -> bool {
        matches!(self, Take::Leased { .. } | Take::Fallback(true))
    }
}

/// What the worker knows of a scope from leases and the Watch stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ScopeView {
    /// The scope's cooldown, if one is known.
    pub cooldown_until: Option<SystemTime>,
    /// The newest policy version seen for the scope.
    pub policy_version: u64,
    /// Whether an operator froze the scope.
    pub frozen: bool,
}

#[derive(Debug)]
struct HeldLease {
    id: Arc<str>,
    granted: u32,
    remaining: u32,
    expires_at: SystemTime,
}

#[derive(Debug, Default)]
struct ScopeTokens {
    leases: VecDeque<HeldLease>,
    refilling: bool,
    /// The coordinator granted nothing: do not ask again before this.
    exhausted_until: Option<SystemTime>,
    view: ScopeView,
}

impl ScopeTokens {
    fn held(&self) -> u32 {
        self.leases.iter().map(|l| l.remaining).sum()
    }
}

/// One retry class of one scope: its tokens, and the signal that a refill
/// in flight has finished, so a take that finds nothing waits for that
/// refill instead of racing it with a second `Lease`.
#[derive(Debug, Default)]
struct TokenEntry {
    state: Mutex<ScopeTokens>,
    refilled: Notify,
}

/// Both retry classes of a scope under one map entry, so the hot path looks
/// a scope up by reference (no key to build, nothing to allocate).
#[derive(Debug, Default)]
struct ScopeEntry {
    classes: [TokenEntry; 2],
}

impl ScopeEntry {
    fn class(&self, class: RetryClass) -> &TokenEntry {
        match class {
            RetryClass::Throttled => &self.classes[1],
            RetryClass::Transient | RetryClass::Unspecified => &self.classes[0],
        }
    }

    fn each(&self) -> impl Iterator<Item = &TokenEntry> {
        self.classes.iter()
    }
}

#[derive(Debug, Default)]
struct PendingReport {
    first_attempts: u32,
    successes: u32,
    evidence: Vec<Evidence>,
    /// The trace the report is sent under: the newest intent whose evidence
    /// it holds, else the first intent counted in it.
    origin: TraceOrigin,
}

impl PendingReport {
    fn merge(&mut self, other: PendingReport) {
        self.first_attempts = self.first_attempts.saturating_add(other.first_attempts);
        self.successes = self.successes.saturating_add(other.successes);
        if !self.origin.is_set() {
            self.origin = other.origin;
        }
        for item in other.evidence {
            self.push_evidence(item);
        }
    }

    /// Keeps the newest evidence: it carries the latest hint.
    fn push_evidence(&mut self, item: Evidence) {
        if self.evidence.len() == MAX_EVIDENCE_PER_REPORT {
            self.evidence.remove(0);
        }
        self.evidence.push(item);
    }

    fn is_empty(&self) -> bool {
        self.first_attempts == 0 && self.successes == 0 && self.evidence.is_empty()
    }
}

type TokenKey = (Scope, RetryClass);

struct Shared {
    link: CoordinatorLink,
    config: LeaseCacheConfig,
    clock: Arc<dyn Clock>,
    /// Keyed by the worker's own scopes (not a peer's input), so a fast
    /// seeded hasher is safe here; hashing two strings with SipHash was
    /// most of the cost of a take.
    tokens: DashMap<Scope, Arc<ScopeEntry>, foldhash::fast::RandomState>,
    /// The wall clock as of the last tick or lease, in Unix ms. The hot path
    /// checks lease expiry against it instead of reading the clock: the
    /// expiry margin is several ticks wide, so a tick-old clock is safe.
    coarse_now_ms: AtomicI64,
    views: DashMap<Scope, ScopeView>,
    reports: Mutex<HashMap<Scope, PendingReport>>,
    fallback: Mutex<Fallback>,
    refill: mpsc::Sender<TokenKey>,
}

struct Fallback {
    epoch: Instant,
    budgets: HashMap<Scope, LocalBudget>,
    throttle: AdaptiveThrottle,
    rng: StdRng,
}

impl Fallback {
    fn budget(&mut self, scope: &Scope, config: &LeaseCacheConfig) -> &mut LocalBudget {
        if !self.budgets.contains_key(scope) && self.budgets.len() >= MAX_SCOPES {
            // Forgetting is the conservative direction only for the
            // earned part; the floor restarts. Bounded memory wins.
            self.budgets.clear();
        }
        self.budgets.entry(scope.clone()).or_insert_with(|| {
            LocalBudget::new(
                config.fallback_window,
                config.fallback_ratio,
                config.fallback_floor_per_sec,
            )
        })
    }
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    // A panic while holding one of these locks leaves plain counters behind,
    // which are still safe to use.
    mutex.lock().unwrap_or_else(|e| e.into_inner())
}

/// A clonable handle on the cache; the background task lives as long as the
/// last clone.
#[derive(Clone)]
pub struct LeaseCache {
    shared: Arc<Shared>,
    _stop: Arc<DropGuard>,
}

impl std::fmt::Debug for LeaseCache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LeaseCache")
            .field("worker_id", &self.shared.link.worker_id())
            .field("scopes", &self.shared.tokens.len())
            .finish_non_exhaustive()
    }
}

impl LeaseCache {
    /// Starts the cache and its background task on the current tokio runtime.
    pub fn start(link: CoordinatorLink, config: LeaseCacheConfig, clock: Arc<dyn Clock>) -> Self {
        let now_ms = to_unix_ms(clock.now());
        let (refill, refill_rx) = mpsc::channel(1024);
        let rng = match config.seed {
            Some(seed) => StdRng::seed_from_u64(seed),
            None => rand::make_rng(),
        };
        let shared = Arc::new(Shared {
            link,
            clock,
            tokens: DashMap::with_hasher(foldhash::fast::RandomState::default()),
            coarse_now_ms: AtomicI64::new(now_ms),
            views: DashMap::new(),
            reports: Mutex::new(HashMap::new()),
            fallback: Mutex::new(Fallback {
                epoch: Instant::now(),
                budgets: HashMap::new(),
                throttle: AdaptiveThrottle::new(
                    AdaptiveThrottle::DEFAULT_K,
                    Duration::from_secs(120),
                ),
                rng,
            }),
            refill,
            config,
        });
        let stop = CancellationToken::new();
        tokio::spawn(background(shared.clone(), refill_rx, stop.clone()));
        LeaseCache {
            shared,
            _stop: Arc::new(stop.drop_guard()),
        }
    }

    /// The link this cache talks through.
    pub fn link(&self) -> &CoordinatorLink {
        &self.shared.link
    }

    /// Takes a token without any RPC: from a held lease, or from the local
    /// fallback when the coordinator is unreachable.
    pub fn try_take(&self, scope: &Scope, class: RetryClass) -> Take {
        if self.shared.link.state() == LinkState::Degraded {
            return self.fallback_take(scope);
        }
        let Some(entry) = self.shared.tokens.get(scope) else {
            self.request_refill(scope, class);
            return Take::Exhausted;
        };
        let now = from_unix_ms(self.shared.coarse_now_ms.load(Ordering::Relaxed));
        let mut tokens = lock(&entry.class(class).state);
        if tokens.view.frozen {
            return Take::Frozen;
        }
        let margin = self.shared.config.expiry_margin;
        while tokens
            .leases
            .front()
            .is_some_and(|l| l.remaining == 0 || l.expires_at <= now + margin)
        {
            tokens.leases.pop_front();
        }
        let policy_version = tokens.view.policy_version;
        let taken = tokens.leases.front_mut().map(|lease| {
            lease.remaining -= 1;
            Take::Leased {
                lease_id: lease.id.clone(),
                policy_version,
            }
        });
        let wants_refill = !tokens.refilling
            && tokens.held() <= self.shared.config.low_water
            && tokens.exhausted_until.is_none_or(|until| now >= until);
        if wants_refill {
            tokens.refilling = true;
        }
        drop(tokens);
        drop(entry);
        if wants_refill {
            self.send_refill(scope, class);
        }
        taken.unwrap_or(Take::Exhausted)
    }

    /// Puts a lease of `tokens` tokens for `scope` in the cache as if the
    /// coordinator had granted it, so the hot path can be measured with
    /// leases already held and no coordinator (`benches/hot_path.rs`).
    ///
    /// Not for production use: a real lease comes only from `Lease`.
    #[doc(hidden)]
    pub fn seed_held_lease_for_bench(
        &self,
        scope: &Scope,
        class: RetryClass,
        tokens: u32,
        expires_at: SystemTime,
    ) {
        let entry = self.entry(scope);
        lock(&entry.class(class).state).leases.push_back(HeldLease {
            id: "bench-seeded".into(),
            granted: tokens,
            remaining: tokens,
            expires_at,
        });
    }

    /// Like [`try_take`](Self::try_take), but when the cache holds nothing for
    /// the scope, waits for one lease (one RPC, bounded by the link timeout):
    /// the refill already in flight if there is one, else its own.
    pub async fn take(&self, scope: &Scope, class: RetryClass) -> Take {
        // A scope seen for the first time is leased right here rather than
        // handed to the background task, so the Lease runs in the caller's
        // span (a dashboard sees it under the intent that needed it).
        let known = self.shared.tokens.contains_key(scope);
        if known || self.shared.link.state() == LinkState::Degraded {
            match self.try_take(scope, class) {
                Take::Exhausted => {}
                other => return other,
            }
        }
        let entry = self.entry(scope);
        let slot = entry.class(class);
        // Registered before the flag is read, so a refill finishing in
        // between still wakes this take.
        let refilled = slot.refilled.notified();
        tokio::pin!(refilled);
        refilled.as_mut().enable();
        let own_refill = {
            let mut tokens = lock(&slot.state);
            let now = self.shared.clock.now();
            if tokens.exhausted_until.is_some_and(|until| now < until) {
                return Take::Exhausted;
            }
            !std::mem::replace(&mut tokens.refilling, true)
        };
        if own_refill {
            refill(&self.shared, (scope.clone(), class)).await;
        } else {
            // The refill in flight ends within one RPC timeout; the margin
            // covers its bookkeeping. Past it this take answers from what
            // the cache holds, which is the conservative side.
            let bound = self.shared.link.rpc_timeout() + Duration::from_millis(50);
            let _ = tokio::time::timeout(bound, refilled).await;
        }
        // If the refill failed because the coordinator is gone, the link is
        // degraded now and this answers from the fallback.
        self.try_take(scope, class)
    }

    fn fallback_take(&self, scope: &Scope) -> Take {
        let mut fallback = lock(&self.shared.fallback);
        let now = fallback.epoch.elapsed();
        let draw: f64 = fallback.rng.random();
        if !fallback.throttle.admit(now, draw) {
            return Take::Fallback(false);
        }
        let config = &self.shared.config;
        Take::Fallback(fallback.budget(scope, config).withdraw(now))
    }

    fn entry(&self, scope: &Scope) -> Arc<ScopeEntry> {
        if let Some(entry) = self.shared.tokens.get(scope) {
            return Arc::clone(entry.value());
        }
        Arc::clone(self.shared.tokens.entry(scope.clone()).or_default().value())
    }

    fn request_refill(&self, scope: &Scope, class: RetryClass) {
        if self.shared.tokens.len() >= MAX_SCOPES {
            return;
        }
        let entry = self.entry(scope);
        if !std::mem::replace(&mut lock(&entry.class(class).state).refilling, true) {
            self.send_refill(scope, class);
        }
    }

    /// Hands a refill to the background task. If its queue is full the flag
    /// is cleared again, or no later take would ever ask for this scope.
    fn send_refill(&self, scope: &Scope, class: RetryClass) {
        if self.shared.refill.try_send((scope.clone(), class)).is_err()
            && let Some(entry) = self.shared.tokens.get(scope)
        {
            let slot = entry.class(class);
            lock(&slot.state).refilling = false;
            slot.refilled.notify_waiters();
        }
    }

    /// What the worker knows of `scope`: cooldown, policy version, freeze.
    pub fn view(&self, scope: &Scope) -> ScopeView {
        self.shared.views.get(scope).map(|v| *v).unwrap_or_default()
    }

    /// Counts a first attempt; it earns retry budget fleet-wide (and in the
    /// local fallback).
    pub fn record_first_attempt(&self, scope: &Scope) {
        {
            let mut fallback = lock(&self.shared.fallback);
            let now = fallback.epoch.elapsed();
            let config = &self.shared.config;
            fallback.budget(scope, config).deposit(now);
        }
        self.with_report(scope, |r| {
            r.first_attempts = r.first_attempts.saturating_add(1);
            if !r.origin.is_set() {
                r.origin = TraceOrigin::current();
            }
        });
    }

    /// Counts a success; it decays the scope's backoff step.
    pub fn record_success(&self, scope: &Scope) {
        self.record_upstream_answer(true);
        self.with_report(scope, |r| r.successes = r.successes.saturating_add(1));
    }

    /// Queues rate-limit evidence for the next report.
    pub fn record_evidence(&self, scope: &Scope, evidence: Evidence) {
        self.record_upstream_answer(false);
        self.with_report(scope, |r| {
            r.push_evidence(evidence);
            let origin = TraceOrigin::current();
            if origin.is_set() {
                r.origin = origin;
            }
        });
    }

    /// Feeds the adaptive throttle: `accepted` is false for overload answers.
    pub fn record_upstream_answer(&self, accepted: bool) {
        let mut fallback = lock(&self.shared.fallback);
        let now = fallback.epoch.elapsed();
        fallback.throttle.record(now, accepted);
    }

    fn with_report(&self, scope: &Scope, update: impl FnOnce(&mut PendingReport)) {
        let mut reports = lock(&self.shared.reports);
        if !reports.contains_key(scope) && reports.len() >= MAX_SCOPES {
            tracing::warn!("report buffer full; dropping a report for a new scope");
            return;
        }
        update(reports.entry(scope.clone()).or_default());
    }

    /// Sends every pending report now instead of at the next tick.
    pub async fn flush(&self) {
        flush_reports(&self.shared).await;
    }
}

/// Leases a batch for `key` and adds it to the cache.
async fn refill(shared: &Shared, key: TokenKey) {
    let (scope, class) = &key;
    let request = LeaseRequest {
        scope: Some(scope.to_wire()),
        worker_id: String::new(),
        want: shared.config.batch,
        retry_class: *class as i32,
    };
    let result = shared.link.lease(request).await;
    let now = shared.clock.now();
    shared
        .coarse_now_ms
        .store(to_unix_ms(now), Ordering::Relaxed);
    let entry = Arc::clone(shared.tokens.entry(scope.clone()).or_default().value());
    let slot = entry.class(*class);
    // Whatever happens below, takes waiting on this refill look again.
    let _wake = WakeOnDrop(&slot.refilled);
    let mut tokens = lock(&slot.state);
    tokens.refilling = false;
    let Ok(lease) = result else {
        return;
    };
    tokens.view.policy_version = tokens.view.policy_version.max(lease.policy_version);
    tokens.view.cooldown_until =
        (lease.cooldown_until_unix_ms > 0).then(|| from_unix_ms(lease.cooldown_until_unix_ms));
    tokens.view.frozen = lease.limit == LeaseLimit::Frozen as i32;
    tokens.exhausted_until = None;
    if lease.granted > 0 {
        tokens.leases.push_back(HeldLease {
            id: lease.lease_id.into(),
            granted: lease.granted,
            remaining: lease.granted,
            expires_at: from_unix_ms(lease.expires_at_unix_ms),
        });
    } else {
        // Nothing granted: asking again on every take would turn an
        // exhausted budget into an RPC storm. Wait a report interval.
        tokens.exhausted_until = Some(now + shared.config.report_interval);
    }
    let view = tokens.view;
    drop(tokens);
    merge_view(shared, scope, |v| {
        v.policy_version = v.policy_version.max(view.policy_version);
        v.cooldown_until = view.cooldown_until.max(v.cooldown_until);
        v.frozen = view.frozen;
    });
}

/// Wakes every take waiting on a refill when the refill is done with its
/// state (declared before the state's lock guard, so dropped after it).
struct WakeOnDrop<'a>(&'a Notify);

impl Drop for WakeOnDrop<'_> {
    fn drop(&mut self) {
        self.0.notify_waiters();
    }
}

fn merge_view(shared: &Shared, scope: &Scope, update: impl FnOnce(&mut ScopeView)) {
    if !shared.views.contains_key(scope) && shared.views.len() >= MAX_SCOPES {
        return;
    }
    update(&mut shared.views.entry(scope.clone()).or_default());
}

async fn flush_reports(shared: &Shared) {
    let pending = std::mem::take(&mut *lock(&shared.reports));
    for (scope, report) in pending {
        if report.is_empty() {
            continue;
        }
        let request = ReportRequest {
            scope: Some(scope.to_wire()),
            worker_id: String::new(),
            first_attempts: report.first_attempts,
            successes: report.successes,
            evidence: report.evidence.clone(),
        };
        match report.origin.scope(shared.link.report(request)).await {
            Ok(answer) => merge_view(shared, &scope, |v| {
                v.policy_version = v.policy_version.max(answer.policy_version);
                if answer.cooldown_until_unix_ms > 0 {
                    let until = from_unix_ms(answer.cooldown_until_unix_ms);
                    v.cooldown_until = v.cooldown_until.max(Some(until));
                }
            }),
            Err(err) if err.is_unreachable() => {
                // Keep it for the next flush; merging keeps it bounded.
                lock(&shared.reports)
                    .entry(scope)
                    .or_default()
                    .merge(report);
            }
            Err(err) => {
                tracing::warn!(cause = %err, scope = %scope, "report refused; dropping it");
            }
        }
    }
}

/// Gives back tokens of leases about to expire; drops expired ones.
async fn tend_leases(shared: &Shared) {
    let now = shared.clock.now();
    shared
        .coarse_now_ms
        .store(to_unix_ms(now), Ordering::Relaxed);
    let horizon = now + shared.config.expiry_margin + shared.config.report_interval * 2;
    let mut releases = Vec::new();
    for entry in shared.tokens.iter() {
        for slot in entry.value().each() {
            lock(&slot.state).leases.retain(|lease| {
                if lease.expires_at <= now {
                    return false;
                }
                if lease.expires_at <= horizon {
                    releases.push((
                        entry.key().clone(),
                        lease.id.to_string(),
                        lease.granted - lease.remaining,
                    ));
                    return false;
                }
                true
            });
        }
    }
    for (scope, lease_id, spent) in releases {
        release(shared, &scope, lease_id, spent).await;
    }
}

async fn release(shared: &Shared, scope: &Scope, lease_id: String, spent: u32) {
    let request = ReleaseRequest {
        scope: Some(scope.to_wire()),
        worker_id: String::new(),
        lease_id,
        spent,
        // The lease cache does not yet count which of its retries
        // succeeded, so it claims no refund (the conservative direction).
        retry_successes: 0,
    };
    // A failed release only means the tokens count as spent at expiry,
    // which is the conservative direction.
    let _ = shared.link.release(request).await;
}

async fn release_all(shared: &Shared) {
    let mut releases = Vec::new();
    for entry in shared.tokens.iter() {
        for slot in entry.value().each() {
            for lease in lock(&slot.state).leases.drain(..) {
                releases.push((
                    entry.key().clone(),
                    lease.id.to_string(),
                    lease.granted - lease.remaining,
                ));
            }
        }
    }
    for (scope, lease_id, spent) in releases {
        release(shared, &scope, lease_id, spent).await;
    }
}

/// The scopes worth watching: those the worker holds tokens or views for.
fn watched_scopes(shared: &Shared) -> Vec<Scope> {
    let mut scopes: Vec<Scope> = shared.views.iter().map(|e| e.key().clone()).collect();
    scopes.sort();
    scopes.truncate(MAX_WATCHED_SCOPES);
    scopes
}

async fn watch(shared: Arc<Shared>, scopes: Vec<Scope>) {
    let request = WatchRequest {
        scopes: scopes.iter().map(Scope::to_wire).collect(),
        worker_id: String::new(),
    };
    let Ok(mut stream) = shared.link.watch(request).await else {
        return;
    };
    while let Ok(Some(event)) = stream.message().await {
        let Some(wire) = event.scope.as_ref() else {
            continue;
        };
        let scope = Scope::from_wire(wire);
        let kind = ScopeEventKind::try_from(event.kind).unwrap_or(ScopeEventKind::Unspecified);
        let cooldown =
            (event.cooldown_until_unix_ms > 0).then(|| from_unix_ms(event.cooldown_until_unix_ms));
        let update = |v: &mut ScopeView| {
            v.policy_version = v.policy_version.max(event.policy_version);
            match kind {
                ScopeEventKind::CooldownEnded => v.cooldown_until = None,
                _ => v.cooldown_until = cooldown.max(v.cooldown_until),
            }
            v.frozen = event.frozen;
        };
        merge_view(&shared, &scope, update);
        if let Some(entry) = shared.tokens.get(&scope) {
            for slot in entry.value().each() {
                update(&mut lock(&slot.state).view);
            }
        }
    }
}

async fn background(
    shared: Arc<Shared>,
    mut refills: mpsc::Receiver<TokenKey>,
    stop: CancellationToken,
) {
    let mut tick = tokio::time::interval(shared.config.report_interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut tasks = JoinSet::new();
    let mut watching: Vec<Scope> = Vec::new();
    let mut watch_task: Option<tokio::task::AbortHandle> = None;
    let mut last_probe = Instant::now();
    loop {
        tokio::select! {
            () = stop.cancelled() => break,
            Some(key) = refills.recv() => {
                let shared = shared.clone();
                tasks.spawn(async move { refill(&shared, key).await });
            }
            _ = tick.tick() => {
                flush_reports(&shared).await;
                tend_leases(&shared).await;
                if shared.link.state() == LinkState::Degraded {
                    // Takes answer from the fallback without RPCs, so
                    // something must notice the coordinator coming back:
                    // one lease attempt per probe interval, never a loop.
                    if last_probe.elapsed() >= PROBE_INTERVAL {
                        last_probe = Instant::now();
                        let key = shared
                            .tokens
                            .iter()
                            .next()
                            .map(|e| (e.key().clone(), RetryClass::Transient));
                        if let Some(key) = key {
                            let shared = shared.clone();
                            tasks.spawn(async move { refill(&shared, key).await });
                        }
                    }
                    continue;
                }
                let scopes = watched_scopes(&shared);
                let stream_ended = watch_task.as_ref().is_some_and(|t| t.is_finished());
                if !scopes.is_empty() && (scopes != watching || stream_ended) {
                    if let Some(old) = watch_task.take() {
                        old.abort();
                    }
                    watching = scopes.clone();
                    watch_task = Some(tasks.spawn(watch(shared.clone(), scopes)));
                }
            }
            Some(_) = tasks.join_next(), if !tasks.is_empty() => {}
        }
    }
    tasks.abort_all();
    flush_reports(&shared).await;
    release_all(&shared).await;
}
