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
//! A retry that succeeded earns its token back ([`LeaseCache::record_retry_success`]):
//! the count travels in that lease's `Release`. A lease whose last token is
//! taken is therefore kept (retired by the next take or the background
//! task's next pass, no longer taken from): the replies of its last retries
//! usually arrive after the token was taken. It is
//! released once its refund has settled (every token refunded, or no new
//! success for one pass of the background task), else near its expiry if
//! it holds anything to give back.
//!
//! # Reports
//! First attempts, successes, rejections and rate-limit evidence are counted locally, the
//! latest stated limit (`RateLimit`, `X-RateLimit-*`, from any response) is kept, and all
//! sent in one `Report` per scope at the next [`LeaseCacheConfig::report_interval`] tick.
//! While the coordinator says the scope is calm ([`ScopeView::counts_hold`]) and no
//! cooldown is in force, a report of counts alone waits for the last tick of the
//! coordinator's pacing window (a second), so a worker with steady traffic costs about
//! one `Report` a second per scope; a rejection or evidence goes at the next tick.
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
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use dashmap::DashMap;
use rand::rngs::StdRng;
use rand::{RngExt, SeedableRng};
use tokio::sync::{Notify, broadcast, mpsc};
use tokio::time::Instant;
use tokio_util::sync::{CancellationToken, DropGuard};
use tollgate_proto::v1::{Evidence, RetryClass, StatedLimit};

use crate::clock::{Clock, from_unix_ms, to_unix_ms};
use crate::fallback::{AdaptiveThrottle, LocalBudget, LocalPacer, Pace};
use crate::link::{CoordinatorLink, LinkState};
use crate::scope::Scope;
use crate::telemetry::TraceOrigin;
use crate::wire::PendingReport;
mod background;

use background::{Flush, background, flush_reports, refill};

/// Scopes with unsent reports, or with cached tokens, kept at once. Beyond
/// it new scopes are not cached (takes still work through `take`).
const MAX_SCOPES: usize = 10_000;
/// Call-backs kept for intents that have not looked yet; one that falls
/// further behind is called back (it asks early: one RPC, nothing lost).
const CALL_BACKS_KEPT: usize = 64;

/// Tuning for the cache. The defaults suit a worker making tens of retries a
/// second per scope.
#[derive(Debug, Clone)]
pub struct LeaseCacheConfig {
    /// Tokens asked for per lease.
    pub batch: u32,
    /// Refill when this few tokens are left.
    pub low_water: u32,
    /// How often reports are flushed and leases tended (see the module
    /// docs for when counts alone wait longer).
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

/// A scope's coordinator calls back its intents told to ask again whose
/// deadline is at or before `deadline_ms` (Unix ms): its slots go unused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct CallBack {
    pub(crate) scope: Scope,
    pub(crate) deadline_ms: i64,
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
    /// Whether first attempts should wait out `cooldown_until` instead of
    /// hitting an upstream known to refuse them. The coordinator's policy
    /// decides (from `Report` answers and Watch events), not the worker.
    pub hold_first_attempts: bool,
    /// The scope's policy is in shadow mode (from `Report` answers): the
    /// gate lets through what it would hold for the cooldown or for a
    /// slot, and records it as shadowed.
    pub shadow: bool,
    /// The coordinator's pacing window while it calls the scope calm, zero
    /// otherwise (from `Report` answers; zero until one says so, and again
    /// when a Watch event first tells of a first-attempt hold, until an
    /// answer says whether counts may wait under it): reports of counts
    /// alone then wait for the window's last tick.
    pub counts_hold: Duration,
}

#[derive(Debug)]
struct HeldLease {
    id: Arc<str>,
    granted: u32,
    remaining: u32,
    expires_at: SystemTime,
    /// Retries that succeeded with a token of this lease; sent in its
    /// `Release` so their tokens are refunded.
    retry_successes: u32,
    /// `retry_successes` at the background task's previous pass, to tell
    /// when the replies of a retired lease's retries stopped coming.
    seen_successes: u32,
}

impl HeldLease {
    fn new(id: Arc<str>, granted: u32, expires_at: SystemTime) -> Self {
        HeldLease {
            id,
            granted,
            remaining: granted,
            expires_at,
            retry_successes: 0,
            seen_successes: 0,
        }
    }

    fn spent(&self) -> u32 {
        self.granted.saturating_sub(self.remaining)
    }

    /// The refund claimed, never more than the tokens spent: the coordinator
    /// refuses a `Release` that claims more.
    fn refunds(&self) -> u32 {
        self.retry_successes.min(self.spent())
    }

    /// Whether a `Release` would give anything back; otherwise the lease may
    /// just expire, as the coordinator already counts it spent.
    fn worth_releasing(&self) -> bool {
        self.remaining > 0 || self.refunds() > 0
    }

    /// For a retired lease, at each pass of the background task: whether to
    /// release it now rather than near its expiry. Its refund returns budget
    /// the fleet's recovery needs, so it goes as soon as no more can come:
    /// every spent token refunded, or no new success since the last pass.
    fn refund_settled(&mut self) -> bool {
        let settled = self.refunds() > 0
            && (self.refunds() == self.spent() || self.retry_successes == self.seen_successes);
        self.seen_successes = self.retry_successes;
        settled
    }
}

#[derive(Debug, Default)]
struct ScopeTokens {
    leases: VecDeque<HeldLease>,
    /// Leases no longer taken from (spent, or too near expiry), kept until
    /// the background task's `tend_leases` releases or drops them, so a retry
    /// that succeeds after its lease's last token was taken still earns a
    /// refund.
    retired: Vec<HeldLease>,
    refilling: bool,
    /// The coordinator granted nothing: do not ask again before this.
    exhausted_until: Option<SystemTime>,
    view: ScopeView,
}

impl ScopeTokens {
    /// Stops taking from the leases at the front that are spent or expire
    /// by `until`: they are kept (retired) so their retries' refunds still
    /// count, until `tend_leases` releases or drops them.
    fn retire(&mut self, until: SystemTime) {
        while self
            .leases
            .front()
            .is_some_and(|l| l.remaining == 0 || l.expires_at <= until)
        {
            self.retired.extend(self.leases.pop_front());
        }
    }

    fn held(&self) -> u32 {
        self.leases.iter().map(|l| l.remaining).sum()
    }

    /// Counts a successful retry on lease `id`, if it is still held.
    fn retry_succeeded(&mut self, id: &str) -> bool {
        let lease = self
            .leases
            .iter_mut()
            .chain(self.retired.iter_mut())
            .find(|l| &*l.id == id);
        match lease {
            Some(lease) => {
                lease.retry_successes = lease.retry_successes.saturating_add(1).min(lease.spent());
                true
            }
            None => false,
        }
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
    /// Every CALL_BACK heard on the Watch stream, for the intents told to
    /// ask again.
    call_backs: broadcast::Sender<CallBack>,
    reports: Mutex<HashMap<Scope, PendingReport>>,
    fallback: Mutex<Fallback>,
    refill: mpsc::Sender<TokenKey>,
}

struct Fallback {
    epoch: Instant,
    budgets: HashMap<Scope, LocalBudget>,
    /// Fed with every answer, connected or not, so a worker that loses the
    /// coordinator knows what the upstream last served it.
    pacers: HashMap<Scope, LocalPacer>,
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

    fn pacer(&mut self, scope: &Scope, config: &LeaseCacheConfig) -> &mut LocalPacer {
        if !self.pacers.contains_key(scope) && self.pacers.len() >= MAX_SCOPES {
            // As for the budgets: a forgotten pacer lets go until the next
            // rejection; bounded memory wins.
            self.pacers.clear();
        }
        self.pacers
            .entry(scope.clone())
            .or_insert_with(|| LocalPacer::new(config.fallback_floor_per_sec))
    }

    /// An upstream answer, for the throttle; the instant it was heard.
    fn heard(&mut self, accepted: bool) -> Duration {
        let now = self.epoch.elapsed();
        self.throttle.record(now, accepted);
        now
    }

    /// An upstream answer on `scope`, for the throttle and the pacer.
    fn answered(&mut self, scope: &Scope, config: &LeaseCacheConfig, accepted: bool) {
        let now = self.heard(accepted);
        self.pacer(scope, config).answered(now, accepted);
    }
}

use crate::lock;

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
            call_backs: broadcast::channel(CALL_BACKS_KEPT).0,
            reports: Mutex::new(HashMap::new()),
            fallback: Mutex::new(Fallback {
                epoch: Instant::now(),
                budgets: HashMap::new(),
                pacers: HashMap::new(),
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

    /// The call-backs heard from now on.
    pub(crate) fn call_backs(&self) -> broadcast::Receiver<CallBack> {
        self.shared.call_backs.subscribe()
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
        tokens.retire(now + self.shared.config.expiry_margin);
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
        lock(&self.shared.fallback).answered(scope, &self.shared.config, true);
        self.with_report(scope, |r| r.successes = r.successes.saturating_add(1));
    }

    /// Counts a retry that succeeded with a token of lease `lease_id`: the
    /// lease's `Release` claims its token back. Returns whether the lease was
    /// still held (one that expired or was released already earns nothing).
    pub fn record_retry_success(&self, scope: &Scope, lease_id: &str) -> bool {
        let Some(entry) = self.shared.tokens.get(scope) else {
            return false;
        };
        // The token's class is not carried with it; a scope holds a few
        // leases per class, so looking in both is cheap.
        entry
            .each()
            .any(|slot| lock(&slot.state).retry_succeeded(lease_id))
    }

    /// Counts a refusal for capacity and queues its rate-limit evidence for
    /// the next report.
    pub fn record_evidence(&self, scope: &Scope, evidence: Evidence) {
        lock(&self.shared.fallback).answered(scope, &self.shared.config, false);
        self.with_report(scope, |r| {
            r.rejections = r.rejections.saturating_add(1);
            r.push_evidence(evidence);
            let origin = TraceOrigin::current();
            if origin.is_set() {
                r.origin = origin;
            }
        });
    }

    /// Keeps the limit a response on `scope` stated, for the next report
    /// (the latest replaces any held). Like counts, it may wait for the
    /// window's last report while the scope is calm.
    pub fn record_stated(&self, scope: &Scope, stated: StatedLimit) {
        self.with_report(scope, |r| r.keep_latest_stated(Some(stated)));
    }

    /// Feeds the adaptive throttle: `accepted` is false for overload answers.
    pub fn record_upstream_answer(&self, accepted: bool) {
        lock(&self.shared.fallback).heard(accepted);
    }

    /// Deciding alone (no slot from the coordinator), whether a wake-up on
    /// `scope` goes now or waits this much longer: the worker's own pace
    /// after the upstream pushed back ([`LocalPacer`]).
    pub fn pace_alone(&self, scope: &Scope) -> Pace {
        let mut fallback = lock(&self.shared.fallback);
        let now = fallback.epoch.elapsed();
        let draw: f64 = fallback.rng.random();
        let config = &self.shared.config;
        fallback.pacer(scope, config).wake(now, draw)
    }

    fn with_report(&self, scope: &Scope, update: impl FnOnce(&mut PendingReport)) {
        let mut reports = lock(&self.shared.reports);
        if !reports.contains_key(scope) && reports.len() >= MAX_SCOPES {
            tracing::warn!("report buffer full; dropping a report for a new scope");
            return;
        }
        let report = reports.entry(scope.clone()).or_default();
        report.since.get_or_insert_with(Instant::now);
        update(report);
    }

    /// Sends every pending report now instead of at the next tick.
    pub async fn flush(&self) {
        flush_reports(&self.shared, Flush::All).await;
    }
}

#[cfg(test)]
mod tests;
