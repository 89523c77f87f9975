//! The embedded store: scope state in a [`DashMap`], nothing to run.
//!
//! Each operation takes one map entry's lock for its whole read-modify-write,
//! which is what makes it atomic per route. Caller-scope state (where
//! uncertain evidence lands) lives in a second map; a route operation reads
//! it first and never holds both locks, so there is no lock order to get
//! wrong. The price: a caller-wide cooldown merged concurrently with a
//! `Reconsider` may miss that one slot — the worker still sees the cooldown
//! on its next call or on `Watch`.

use std::future::ready;
use std::sync::atomic::{AtomicU64, Ordering};

use dashmap::DashMap;

use crate::budget::{BudgetLedger, GrantAsk, GrantLimit};
use crate::hints::{Assessment, EvidenceDetail, HintState, Merge, Reporter};
use crate::policy::Policy;
use crate::scope::{RouteKey, ScopeKey};
use crate::slots::{SlotAsk, SlotCursor, SlotOutcome};

use super::{
    LeaseOutcome, Reconsidered, ReportBatch, Reported, RouteView, ScopeDetail, ScopeFilter,
    ScopePage, ScopeSummary, Store, StoreError, StoreFuture,
};

/// State of one `(caller_scope, route)`.
#[derive(Debug)]
struct RouteState {
    budget: BudgetLedger,
    hints: HintState,
    slots: SlotCursor,
    frozen: Option<String>,
    /// For idle eviction.
    last_touched_ms: i64,
}

/// State of a whole caller scope: only evidence from uncertain scopes.
#[derive(Debug, Default)]
struct CallerState {
    hints: HintState,
    last_touched_ms: i64,
}

/// The in-memory [`Store`].
#[derive(Debug)]
pub struct MemoryStore {
    routes: DashMap<RouteKey, RouteState>,
    callers: DashMap<String, CallerState>,
    /// Routes plus caller scopes kept at most; a bound on memory that a
    /// stream of invented scope names cannot lift.
    max_scopes: usize,
    next_lease: AtomicU64,
    /// Makes lease ids from before a restart unrecognisable after it.
    lease_nonce: u32,
}

impl MemoryStore {
    /// An empty store holding at most `max_scopes` routes and caller scopes.
    pub fn new(max_scopes: usize) -> Self {
        MemoryStore {
            routes: DashMap::new(),
            callers: DashMap::new(),
            max_scopes,
            next_lease: AtomicU64::new(1),
            lease_nonce: rand::random(),
        }
    }

    fn full(&self) -> bool {
        self.routes.len() + self.callers.len() >= self.max_scopes
    }

    /// Runs `f` on the route's state under its entry lock, creating the
    /// state if there is room.
    fn with_route<T>(
        &self,
        key: &RouteKey,
        now_ms: i64,
        f: impl FnOnce(&mut RouteState) -> T,
    ) -> Result<T, StoreError> {
        if let Some(mut state) = self.routes.get_mut(key) {
            state.last_touched_ms = state.last_touched_ms.max(now_ms);
            return Ok(f(&mut state));
        }
        if self.full() {
            return Err(StoreError::ScopeLimit {
                max: self.max_scopes,
            });
        }
        let mut state = self
            .routes
            .entry(key.clone())
            .or_insert_with(|| RouteState {
                budget: BudgetLedger::new(now_ms),
                hints: HintState::default(),
                slots: SlotCursor::default(),
                frozen: None,
                last_touched_ms: now_ms,
            });
        Ok(f(&mut state))
    }

    /// The caller scope's (cooldown, floor), read without creating anything.
    fn caller_floor(&self, caller_scope: &str) -> (i64, i64) {
        self.callers
            .get(caller_scope)
            .map_or((0, 0), |c| (c.hints.cooldown_until_ms, c.hints.floor_ms()))
    }

    fn view_of(state: &RouteState, caller: (i64, i64)) -> RouteView {
        RouteView {
            cooldown_until_ms: state.hints.cooldown_until_ms.max(caller.0),
            floor_ms: state.hints.floor_ms().max(caller.1),
            frozen: state.frozen.clone(),
        }
    }

    fn summary(
        key: &RouteKey,
        state: &RouteState,
        caller: (i64, i64),
        now_ms: i64,
    ) -> ScopeSummary {
        ScopeSummary {
            route: key.clone(),
            view: Self::view_of(state, caller),
            leases_outstanding: state.budget.live_leases(now_ms),
            waiting: state.slots.waiting(now_ms),
            last_touched_ms: state.last_touched_ms,
        }
    }

    fn lease_now(
        &self,
        scope: &ScopeKey,
        ask: GrantAsk<'_>,
        policy: &Policy,
    ) -> Result<LeaseOutcome, StoreError> {
        let caller = self.caller_floor(&scope.route.caller_scope);
        let id = format!(
            "{:08x}-{:x}",
            self.lease_nonce,
            self.next_lease.fetch_add(1, Ordering::Relaxed)
        );
        self.with_route(&scope.route, ask.now_ms, |state| {
            let view = Self::view_of(state, caller);
            if view.frozen.is_some() {
                let remaining = state
                    .budget
                    .available_milli(policy, ask.priority, ask.now_ms)
                    / policy.cost(ask.retry_class).max(1);
                return Ok(LeaseOutcome {
                    lease_id: None,
                    grant: crate::budget::Grant {
                        granted: 0,
                        limit: GrantLimit::Frozen,
                        remaining,
                        expires_at_ms: ask.now_ms,
                    },
                    view,
                });
            }
            let grant = state.budget.grant(policy, ask, &id)?;
            Ok(LeaseOutcome {
                lease_id: (grant.granted > 0).then_some(id),
                grant,
                view,
            })
        })?
    }
}

impl MemoryStore {
    /// The route's deposit and route-level hints under the route's entry
    /// lock, then the caller-level hints under the caller's: never both
    /// locks at once (see the module doc for what that costs).
    fn report_now(
        &self,
        scope: &ScopeKey,
        report: ReportBatch<'_>,
        policy: &Policy,
    ) -> Result<Reported, StoreError> {
        let now_ms = report.now_ms;
        if report.successes > 0
            && let Some(mut caller) = self.callers.get_mut(&scope.route.caller_scope)
        {
            caller.hints.decay();
        }
        let mut merges: Vec<Option<Merge>> = vec![None; report.hints.len()];
        let active = self.with_route(&scope.route, now_ms, |state| {
            state.budget.deposit(
                policy,
                report.worker_id,
                scope.priority,
                report.first_attempts,
                now_ms,
            );
            if report.successes > 0 {
                state.hints.decay();
            }
            let reporter = Reporter {
                worker_id: report.worker_id,
                active: state.budget.active_workers(now_ms, policy.window_ms()),
            };
            for (merge, hint) in merges.iter_mut().zip(report.hints) {
                if !hint.caller_wide {
                    *merge = Some(
                        state
                            .hints
                            .merge(&hint.assessment, reporter, policy, now_ms),
                    );
                }
            }
            reporter.active
        })?;
        // Broadening to the caller scope is judged against the reporting
        // route's workers: the ones whose retries it would hold back first.
        let reporter = Reporter {
            worker_id: report.worker_id,
            active,
        };
        for (merge, hint) in merges.iter_mut().zip(report.hints) {
            if hint.caller_wide {
                let caller = &scope.route.caller_scope;
                *merge =
                    Some(self.merge_caller(caller, &hint.assessment, reporter, policy, now_ms)?);
            }
        }
        Ok(Reported {
            merges: merges.into_iter().flatten().collect(),
            view: self.view_now(&scope.route),
        })
    }

    /// A route's effective state; an unknown route has its caller scope's.
    fn view_now(&self, route: &RouteKey) -> RouteView {
        let caller = self.caller_floor(&route.caller_scope);
        match self.routes.get(route) {
            Some(state) => Self::view_of(&state, caller),
            None => RouteView {
                cooldown_until_ms: caller.0,
                floor_ms: caller.1,
                frozen: None,
            },
        }
    }

    /// Merges one hint into a caller scope's state, creating it if there
    /// is room.
    fn merge_caller(
        &self,
        caller: &str,
        assessment: &Assessment,
        reporter: Reporter<'_>,
        policy: &Policy,
        now_ms: i64,
    ) -> Result<Merge, StoreError> {
        if !self.callers.contains_key(caller) && self.full() {
            return Err(StoreError::ScopeLimit {
                max: self.max_scopes,
            });
        }
        let mut state = self.callers.entry(caller.to_owned()).or_default();
        state.last_touched_ms = state.last_touched_ms.max(now_ms);
        Ok(state.hints.merge(assessment, reporter, policy, now_ms))
    }
}

impl Store for MemoryStore {
    fn lease<'a>(
        &'a self,
        scope: &'a ScopeKey,
        ask: GrantAsk<'a>,
        policy: &'a Policy,
    ) -> StoreFuture<'a, LeaseOutcome> {
        Box::pin(ready(self.lease_now(scope, ask, policy)))
    }

    fn release<'a>(
        &'a self,
        scope: &'a ScopeKey,
        worker_id: &'a str,
        lease_id: &'a str,
        spent: u32,
        now_ms: i64,
    ) -> StoreFuture<'a, u32> {
        let result = match self.routes.get_mut(&scope.route) {
            Some(mut state) => state
                .budget
                .release(worker_id, lease_id, spent, now_ms)
                .map_err(StoreError::from),
            None => Err(crate::budget::BudgetError::LeaseNotFound.into()),
        };
        Box::pin(ready(result))
    }

    fn report<'a>(
        &'a self,
        scope: &'a ScopeKey,
        report: ReportBatch<'a>,
        policy: &'a Policy,
    ) -> StoreFuture<'a, Reported> {
        Box::pin(ready(self.report_now(scope, report, policy)))
    }

    fn reconsider<'a>(
        &'a self,
        route: &'a RouteKey,
        ask: SlotAsk<'a>,
        policy: &'a Policy,
    ) -> StoreFuture<'a, (Reconsidered, RouteView)> {
        let caller = self.caller_floor(&route.caller_scope);
        let result = self
            .with_route(route, ask.now_ms, |state| {
                let view = Self::view_of(state, caller);
                if view.frozen.is_some() {
                    return Ok((Reconsidered::Frozen, view));
                }
                let ask = SlotAsk {
                    floor_ms: ask.floor_ms.max(view.floor_ms),
                    ..ask
                };
                let decided = match state.slots.assign(ask, policy.wake_rate_per_sec)? {
                    SlotOutcome::Slot(at) => Reconsidered::Slot(at),
                    SlotOutcome::DeadlineInfeasible(at) => Reconsidered::DeadlineInfeasible(at),
                };
                Ok((decided, view))
            })
            .and_then(|r| r);
        Box::pin(ready(result))
    }

    fn view<'a>(&'a self, route: &'a RouteKey, _now_ms: i64) -> StoreFuture<'a, RouteView> {
        Box::pin(ready(Ok(self.view_now(route))))
    }

    fn set_freeze<'a>(
        &'a self,
        route: &'a RouteKey,
        reason: Option<String>,
        now_ms: i64,
    ) -> StoreFuture<'a, ()> {
        Box::pin(ready(
            self.with_route(route, now_ms, |state| state.frozen = reason),
        ))
    }

    fn set_mute<'a>(
        &'a self,
        route: &'a RouteKey,
        worker_id: &'a str,
        until_ms: Option<i64>,
        now_ms: i64,
    ) -> StoreFuture<'a, bool> {
        use crate::hints::corroboration::set_mute;
        let result = self
            .with_route(route, now_ms, |state| {
                set_mute(&mut state.hints.mutes, worker_id, until_ms, now_ms)
            })
            .and_then(|on_route| {
                let caller = &route.caller_scope;
                if !self.callers.contains_key(caller) && self.full() {
                    return Err(StoreError::ScopeLimit {
                        max: self.max_scopes,
                    });
                }
                let mut state = self.callers.entry(caller.clone()).or_default();
                state.last_touched_ms = state.last_touched_ms.max(now_ms);
                Ok(on_route & set_mute(&mut state.hints.mutes, worker_id, until_ms, now_ms))
            });
        Box::pin(ready(result))
    }

    fn list_scopes<'a>(
        &'a self,
        filter: &'a ScopeFilter,
        after: Option<&'a RouteKey>,
        limit: usize,
        now_ms: i64,
    ) -> StoreFuture<'a, ScopePage> {
        // Collect the matching keys first (bounded by max_scopes), then read
        // each entry on its own, so no map lock is held across the sort.
        let mut keys: Vec<RouteKey> = self
            .routes
            .iter()
            .filter(|e| {
                let k = e.key();
                filter.caller_scope.matches(&k.caller_scope)
                    && filter.route.matches(&k.route)
                    && (!filter.frozen_only || e.value().frozen.is_some())
                    && after.is_none_or(|a| k > a)
            })
            .map(|e| e.key().clone())
            .collect();
        keys.sort_unstable();
        let more = keys.len() > limit;
        keys.truncate(limit);
        let scopes: Vec<ScopeSummary> = keys
            .iter()
            .filter_map(|k| {
                let caller = self.caller_floor(&k.caller_scope);
                self.routes
                    .get(k)
                    .map(|state| Self::summary(k, &state, caller, now_ms))
            })
            .collect();
        let next = if more { keys.last().cloned() } else { None };
        Box::pin(ready(Ok(ScopePage { scopes, next })))
    }

    fn scope_detail<'a>(
        &'a self,
        route: &'a RouteKey,
        policy: &'a Policy,
        now_ms: i64,
    ) -> StoreFuture<'a, Option<ScopeDetail>> {
        let (caller_cooldown, caller_hints, caller_evidence) = self
            .callers
            .get(&route.caller_scope)
            .map_or((0, Vec::new(), EvidenceDetail::default()), |c| {
                (
                    c.hints.cooldown_until_ms,
                    c.hints.recent.iter().cloned().collect(),
                    c.hints.evidence(now_ms),
                )
            });
        let caller = self.caller_floor(&route.caller_scope);
        // get_mut only because the budget's series advance when read; the
        // route's last_touched is left alone so looking does not keep a
        // scope from being evicted.
        let detail = self.routes.get_mut(route).map(|mut state| {
            let summary = Self::summary(route, &state, caller, now_ms);
            ScopeDetail {
                summary,
                budget: state.budget.snapshot(policy, now_ms),
                route_cooldown_until_ms: state.hints.cooldown_until_ms,
                caller_cooldown_until_ms: caller_cooldown,
                backoff_step: state.hints.backoff_step,
                route_hints: state.hints.recent.iter().cloned().collect(),
                caller_hints,
                route_evidence: state.hints.evidence(now_ms),
                caller_evidence,
            }
        });
        Box::pin(ready(Ok(detail)))
    }

    fn reset_scope<'a>(&'a self, route: &'a RouteKey, now_ms: i64) -> StoreFuture<'a, bool> {
        let known = match self.routes.get_mut(route) {
            Some(mut state) => {
                state.budget = BudgetLedger::new(now_ms);
                // Mutes are an operator's decision, like the freeze.
                state.hints = HintState {
                    mutes: std::mem::take(&mut state.hints.mutes),
                    ..HintState::default()
                };
                state.slots = SlotCursor::default();
                state.last_touched_ms = state.last_touched_ms.max(now_ms);
                true
            }
            None => false,
        };
        Box::pin(ready(Ok(known)))
    }

    fn evict_idle(&self, now_ms: i64, idle_ms: i64) -> StoreFuture<'_, usize> {
        let before = self.routes.len() + self.callers.len();
        let idle_since = now_ms.saturating_sub(idle_ms);
        self.routes.retain(|_, s| {
            s.last_touched_ms > idle_since
                || s.frozen.is_some()
                || s.hints.live_until_ms() > now_ms
                || s.budget.live_leases(now_ms) > 0
                || s.slots.waiting(now_ms) > 0
        });
        self.callers
            .retain(|_, c| c.last_touched_ms > idle_since || c.hints.live_until_ms() > now_ms);
        let after = self.routes.len() + self.callers.len();
        Box::pin(ready(Ok(before.saturating_sub(after))))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    async fn make() -> Option<crate::store::contract::Fixture> {
        Some(crate::store::contract::Fixture::new(
            MemoryStore::new(8),
            (),
        ))
    }

    crate::store::contract::contract_tests!(make);

    /// Only the memory store counts scopes: a shared store's bound is the
    /// server's own memory limit plus key expiry (docs/deploying.md).
    #[tokio::test]
    async fn scopes_are_bounded_until_idle_ones_are_evicted() {
        use crate::scope::{Priority, ScopeKey};
        use crate::store::contract::deposit;
        const T0: i64 = 1_700_000_000_000;
        let s = MemoryStore::new(8);
        let key = |i: usize| ScopeKey::new("c", &format!("r{i}"), Priority::Critical);
        for i in 0..8 {
            deposit(&s, &key(i), 1, T0).await.expect("room");
        }
        let err = deposit(&s, &key(8), 1, T0).await;
        assert_eq!(err, Err(StoreError::ScopeLimit { max: 8 }));
        assert_eq!(s.evict_idle(T0 + 61_000, 60_000).await, Ok(8));
        deposit(&s, &key(8), 1, T0 + 61_000)
            .await
            .expect("room again");
    }
}
