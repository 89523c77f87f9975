//! The cache's I/O: leasing batches, flushing reports, releasing leases
//! about to expire, the Watch stream, and the background task that runs
//! them until the last clone of the cache is dropped.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use tokio::sync::{Notify, mpsc};
use tokio::task::JoinSet;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tollgate_proto::v1::{LeaseLimit, RetryClass, ScopeEventKind};

use super::{HeldLease, MAX_SCOPES, PendingReport, ScopeView, Shared, TokenKey, lock};
use crate::clock::{from_unix_ms, to_unix_ms};
use crate::link::LinkState;
use crate::scope::Scope;
use crate::wire;

/// The coordinator watches at most this many scopes per stream.
const MAX_WATCHED_SCOPES: usize = 64;
/// The longest hold of counts alone honoured, whatever a coordinator says:
/// a pacing window, the longest span whose counts it takes whole
/// (`ReportRequest.counts_age_ms`).
const MAX_COUNTS_HOLD: Duration = Duration::from_secs(1);
/// How often a degraded worker checks whether the coordinator is back.
const PROBE_INTERVAL: Duration = Duration::from_secs(1);

/// Leases a batch for `key` and adds it to the cache.
pub(super) async fn refill(shared: &Shared, key: TokenKey) {
    let (scope, class) = &key;
    let request = wire::lease_request(scope, shared.config.batch, *class);
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
    if let Some(shadowed) = crate::outcome::Shadowed::from_wire(lease.shadowed) {
        crate::telemetry::record_shadow(&scope.route, shadowed.as_str());
    }
    tokens.view.policy_version = tokens.view.policy_version.max(lease.policy_version);
    tokens.view.cooldown_until =
        (lease.cooldown_until_unix_ms > 0).then(|| from_unix_ms(lease.cooldown_until_unix_ms));
    tokens.view.frozen = lease.limit == LeaseLimit::Frozen as i32;
    tokens.exhausted_until = None;
    if lease.granted > 0 {
        tokens.leases.push_back(HeldLease::new(
            lease.lease_id.into(),
            lease.granted,
            from_unix_ms(lease.expires_at_unix_ms),
        ));
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

/// Which pending reports a flush sends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Flush {
    /// Every one: the caller asked, or the cache is closing.
    All,
    /// Every one but counts alone on a scope the coordinator called calm
    /// ([`ScopeView::counts_hold`]) with no cooldown in force: those go at
    /// the last tick of the pacing window they were made in.
    Due,
}

impl Flush {
    /// Whether `report` goes now, at `now_ms` on the shared clock, with
    /// ticks `interval` apart.
    fn sends(
        self,
        report: &PendingReport,
        view: Option<&ScopeView>,
        now_ms: i64,
        interval: Duration,
    ) -> bool {
        if self == Flush::All || report.rejections > 0 || !report.evidence.is_empty() {
            return true;
        }
        let Some(view) = view else { return true };
        let cooling = view
            .cooldown_until
            .is_some_and(|until| to_unix_ms(until) > now_ms);
        if cooling || view.counts_hold.is_zero() {
            return true;
        }
        // Windows are whole multiples of the hold on the shared clock. Sent
        // in the window they were made in, the counts count there: landing
        // a window late would add one window's successes to the next, and
        // hide the moment the upstream degraded.
        let window = (view.counts_hold.as_millis() as i64).max(1);
        let into_window = Duration::from_millis(now_ms.rem_euclid(window) as u64);
        into_window + interval >= view.counts_hold
    }
}

pub(super) async fn flush_reports(shared: &Shared, which: Flush) {
    let now_ms = to_unix_ms(shared.clock.now());
    let interval = shared.config.report_interval;
    let pending: Vec<_> = lock(&shared.reports)
        .extract_if(|scope, report| {
            let view = shared.views.get(scope);
            which.sends(report, view.as_deref(), now_ms, interval)
        })
        .collect();
    for (scope, report) in pending {
        if report.is_empty() {
            continue;
        }
        let request = wire::report_request(&scope, &report);
        match report.origin.scope(shared.link.report(request)).await {
            Ok(answer) => merge_view(shared, &scope, |v| {
                v.policy_version = v.policy_version.max(answer.policy_version);
                v.hold_first_attempts = answer.hold_first_attempts;
                v.shadow = answer.shadow;
                v.counts_hold = Duration::from_millis(answer.counts_hold_ms).min(MAX_COUNTS_HOLD);
                if answer.cooldown_until_unix_ms > 0 {
                    let until = from_unix_ms(answer.cooldown_until_unix_ms);
                    v.cooldown_until = v.cooldown_until.max(Some(until));
                }
            }),
            Err(err) if err.is_unreachable() => {
                // Keep it for the next flush; merging keeps it bounded. A
                // report that timed out may still be applied (a hung
                // coordinator reads it when it resumes): its counts are not
                // sent twice, at the cost of losing them if it never
                // arrives. Its evidence is: merging a hint again only
                // confirms the cooldown it raised.
                let mut report = report;
                if err.may_have_arrived() {
                    report.first_attempts = 0;
                    report.successes = 0;
                    report.rejections = 0;
                }
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

/// Gives back leases about to expire, held or retired (spent, with retries
/// that succeeded on them); drops expired ones and spent ones with nothing to
/// refund.
async fn tend_leases(shared: &Shared) {
    let now = shared.clock.now();
    shared
        .coarse_now_ms
        .store(to_unix_ms(now), Ordering::Relaxed);
    let horizon = now + shared.config.expiry_margin + shared.config.report_interval * 2;
    let mut releases = Vec::new();
    for entry in shared.tokens.iter() {
        for slot in entry.value().each() {
            let mut tokens = lock(&slot.state);
            // Retired here as a take would retire them, so the refund of a
            // spent lease's retries goes back at this pass, not after the
            // next take (whose Lease would find it still charged).
            tokens.retire(now + shared.config.expiry_margin);
            let mut keep = |lease: &HeldLease| {
                if lease.expires_at <= now {
                    return false;
                }
                if lease.expires_at <= horizon {
                    if lease.worth_releasing() {
                        releases.push(Release::of(entry.key(), lease));
                    }
                    return false;
                }
                true
            };
            // A retired lease whose refund has settled goes now; the rest
            // by the rule above.
            let mut settled = Vec::new();
            tokens.retired.retain_mut(|lease| {
                let now_or_never = lease.expires_at > now && lease.refund_settled();
                if now_or_never {
                    settled.push(Release::of(entry.key(), lease));
                }
                !now_or_never
            });
            tokens.leases.retain(&mut keep);
            tokens.retired.retain(&mut keep);
            releases.extend(settled);
        }
    }
    for release in releases {
        release.send(shared).await;
    }
}

/// One lease to give back, taken out of the cache before any RPC.
struct Release {
    scope: Scope,
    lease_id: String,
    spent: u32,
    retry_successes: u32,
}

impl Release {
    fn of(scope: &Scope, lease: &HeldLease) -> Self {
        Release {
            scope: scope.clone(),
            lease_id: lease.id.to_string(),
            spent: lease.spent(),
            retry_successes: lease.refunds(),
        }
    }

    async fn send(self, shared: &Shared) {
        let request =
            wire::release_request(&self.scope, self.lease_id, self.spent, self.retry_successes);
        // A failed release only means the tokens count as spent at expiry,
        // which is the conservative direction.
        let _ = shared.link.release(request).await;
    }
}

async fn release_all(shared: &Shared) {
    let mut releases = Vec::new();
    for entry in shared.tokens.iter() {
        for slot in entry.value().each() {
            let mut tokens = lock(&slot.state);
            let tokens = &mut *tokens;
            for lease in tokens.leases.drain(..).chain(tokens.retired.drain(..)) {
                if lease.worth_releasing() {
                    releases.push(Release::of(entry.key(), &lease));
                }
            }
        }
    }
    for release in releases {
        release.send(shared).await;
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
    let request = wire::watch_request(&scopes);
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
            if kind == ScopeEventKind::PacingChanged
                || event.hold_first_attempts && !v.hold_first_attempts
            {
                // Pacing that changed, or a hold heard of before any answer
                // says whether counts may wait under it: they go at once
                // until one does (a measurement that began needs them now).
                v.counts_hold = Duration::ZERO;
            }
            v.hold_first_attempts = event.hold_first_attempts;
        };
        merge_view(&shared, &scope, update);
        if let Some(entry) = shared.tokens.get(&scope) {
            for slot in entry.value().each() {
                update(&mut lock(&slot.state).view);
            }
        }
        if kind == ScopeEventKind::CallBack && event.call_back_deadline_unix_ms > 0 {
            // Nobody listening is no error: no intent waits to be called.
            let _ = shared.call_backs.send(super::CallBack {
                scope,
                deadline_ms: event.call_back_deadline_unix_ms,
            });
        }
    }
}

pub(super) async fn background(
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
                let degraded = shared.link.state() == LinkState::Degraded;
                let probe = degraded && last_probe.elapsed() >= PROBE_INTERVAL;
                // Degraded, reports wait until the coordinator answers
                // again (the probe below): each would only time out, and a
                // hung coordinator reads every one it was sent when it
                // resumes, all as counts made then, so the seconds of
                // recovery it missed land in its first window back and
                // read as capacity. Held, the counts go in one report once
                // it answers, whose `counts_age_ms` says how long they span.
                if !degraded {
                    flush_reports(&shared, Flush::Due).await;
                }
                tend_leases(&shared).await;
                if degraded {
                    // Takes answer from the fallback without RPCs, so
                    // something must notice the coordinator coming back:
                    // one lease attempt per probe interval, never a loop.
                    // On a scope the worker leased on, or else one it
                    // reported on or holds a report for: a worker whose
                    // first attempts never failed holds no tokens, one
                    // whose first report failed has no view either, and
                    // while its intents wait out a cooldown alone nothing
                    // else would call.
                    if probe {
                        last_probe = Instant::now();
                        let key = shared
                            .tokens
                            .iter()
                            .next()
                            .map(|e| e.key().clone())
                            .or_else(|| shared.views.iter().next().map(|e| e.key().clone()))
                            .or_else(|| lock(&shared.reports).keys().next().cloned())
                            .map(|scope| (scope, RetryClass::Transient));
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
    flush_reports(&shared, Flush::All).await;
    release_all(&shared).await;
}
