//! The embedded store: scope state in a [`DashMap`], nothing to run.
//!
//! Each operation takes one map entry's lock for its whole read-modify-write,
//! which is what makes it atomic per route. Caller-scope state (where
//! uncertain evidence lands) lives in a second map; a route operation reads
//! it first and never holds both locks, so there is no lock order to get
//! wrong. The price: a caller-wide cooldown merged concurrently with a
//! `Reconsider` may miss that one slot — the worker still sees the cooldown
//! on its next call or on `Watch`.
//!
//! # Reaching `max_scopes`
//! The bound keeps a flood of invented scope names from growing memory
//! without end. When an operation needs a new scope and the store is full,
//! the store makes room at once instead of refusing: it evicts the coldest
//! scopes (least recently touched) that hold nothing live — never one with
//! an unexpired lease, a cooldown or backoff ahead, a freeze or a waiting
//! intent — in one batch of [`ROOM_BATCH_PERMILLE`] of the bound, so the
//! pass over the map is paid once per batch, not per new scope. Only when
//! every scope is live is the operation refused, and then without another
//! pass for [`ROOM_RETRY_MS`] (`ScopeLimit`, which the
//! service answers RESOURCE_EXHAUSTED and the client's link treats as "the
//! coordinator is unusable": the worker falls back to its local budget). A
//! flood of invented names therefore pushes out cold scopes, whose loss
//! costs their first-attempt count (the next window rebuilds it), never a
//! live lease or cooldown. Occupancy, evictions and refusals are counted
//! in [`ScopeCounts`] for the `tollgate.scopes.*` metrics.
//!
//! Route state is kept compact (`route`): see there for what a scope costs.

mod report;
mod route;

use std::collections::BinaryHeap;
use std::future::ready;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, Ordering};

use dashmap::DashMap;
use dashmap::mapref::one::RefMut;

use crate::budget::{BudgetLedger, GrantAsk, GrantLimit, LeaseEnd, MAX_WINDOW_SECS};
use crate::hints::{EvidenceDetail, HintState};
use crate::policy::Policy;
use crate::scope::{RouteKey, ScopeKey};
use crate::slots::SlotAsk;

use super::{
    LeaseOutcome, Reconsidered, ReportBatch, Reported, RouteView, ScopeCounts, ScopeDetail,
    ScopeFilter, ScopePage, ScopeSummary, Slotted, Store, StoreError, StoreFuture,
};
use route::{RouteLookup, RouteName, RouteState};

/// The share of `max_scopes` (permille) one room-making pass evicts: 1/64
/// of the bound, at least one scope.
pub const ROOM_BATCH_PERMILLE: usize = 16;
/// After a pass found nothing to evict (every scope live), new scopes are
/// refused without another pass for this long (coordinator time): a table
/// full of live leases stays full for about a lease's lifetime, and a pass
/// per refused call would cost a scan of the whole map each.
pub const ROOM_RETRY_MS: i64 = 250;

/// State of a whole caller scope: only evidence from uncertain scopes.
#[derive(Debug, Default)]
struct CallerState {
    hints: HintState,
    last_touched_ms: i64,
}

/// The in-memory [`Store`].
#[derive(Debug)]
pub struct MemoryStore {
    routes: DashMap<RouteName, RouteState>,
    callers: DashMap<String, CallerState>,
    /// Set before the first caller scope is created, never cleared: until
    /// then the Lease and Report paths skip `callers` (most stores never
    /// hold one: only evidence from an uncertain scope lands there), where
    /// each read hashed the caller scope and locked a shard. A read racing
    /// the first insert sees the map as it was just before, as a read made
    /// just before would.
    callers_used: AtomicBool,
    /// Routes plus caller scopes kept at most; a bound on memory that a
    /// stream of invented scope names cannot lift.
    max_scopes: usize,
    /// One room-making pass at a time: the others wait for its result
    /// instead of scanning the same map again.
    making_room: Mutex<()>,
    /// Before this instant a full table refuses at once (see
    /// [`ROOM_RETRY_MS`]).
    room_retry_at_ms: AtomicI64,
    evicted_idle: AtomicU64,
    evicted_for_room: AtomicU64,
    refused: AtomicU64,
}

impl MemoryStore {
    /// An empty store holding at most `max_scopes` routes and caller scopes.
    pub fn new(max_scopes: usize) -> Self {
        MemoryStore {
            routes: DashMap::new(),
            callers: DashMap::new(),
            callers_used: AtomicBool::new(false),
            max_scopes,
            making_room: Mutex::new(()),
            room_retry_at_ms: AtomicI64::new(i64::MIN),
            evicted_idle: AtomicU64::new(0),
            evicted_for_room: AtomicU64::new(0),
            refused: AtomicU64::new(0),
        }
    }

    fn live(&self) -> usize {
        self.routes.len() + self.callers.len()
    }

    /// Room for one more scope, evicting the coldest unpinned ones if the
    /// store is full; `ScopeLimit` when every scope is live.
    fn ensure_room(&self, now_ms: i64) -> Result<(), StoreError> {
        if self.live() < self.max_scopes {
            return Ok(());
        }
        if now_ms >= self.room_retry_at_ms.load(Ordering::Relaxed) {
            let _one_pass = self.making_room.lock().unwrap_or_else(|e| e.into_inner());
            // Another pass may have made room while this one waited.
            if self.live() < self.max_scopes || self.make_room(now_ms) > 0 {
                return Ok(());
            }
            self.room_retry_at_ms
                .store(now_ms.saturating_add(ROOM_RETRY_MS), Ordering::Relaxed);
        }
        self.refused.fetch_add(1, Ordering::Relaxed);
        Err(StoreError::ScopeLimit {
            max: self.max_scopes,
        })
    }

    /// Evicts up to one batch of the coldest unpinned scopes; returns how
    /// many. One pass over both maps, keeping the coldest candidates in a
    /// bounded heap (no copy of the whole map), then each is removed only
    /// if it is still cold and unpinned under its own entry lock.
    fn make_room(&self, now_ms: i64) -> usize {
        let batch = (self.max_scopes * ROOM_BATCH_PERMILLE / 1000).max(1);
        // Max-heap on last touch: the top is the warmest of the coldest.
        let mut coldest: BinaryHeap<(i64, Victim)> = BinaryHeap::with_capacity(batch + 1);
        let mut offer = |touched: i64, victim: &dyn Fn() -> Victim| {
            if coldest.len() < batch {
                coldest.push((touched, victim()));
            } else if coldest.peek().is_some_and(|(t, _)| touched < *t) {
                coldest.pop();
                coldest.push((touched, victim()));
            }
        };
        for e in self.routes.iter() {
            if !e.value().pinned(now_ms) {
                offer(e.value().last_touched_ms, &|| {
                    Victim::Route(e.key().clone())
                });
            }
        }
        for e in self.callers.iter() {
            if e.value().hints.live_until_ms() <= now_ms {
                offer(e.value().last_touched_ms, &|| {
                    Victim::Caller(e.key().clone())
                });
            }
        }
        let evicted = coldest
            .into_iter()
            .filter(|(touched, victim)| match victim {
                Victim::Route(name) => self
                    .routes
                    .remove_if(name, |_, s| {
                        s.last_touched_ms <= *touched && !s.pinned(now_ms)
                    })
                    .is_some(),
                Victim::Caller(name) => self
                    .callers
                    .remove_if(name, |_, c| {
                        c.last_touched_ms <= *touched && c.hints.live_until_ms() <= now_ms
                    })
                    .is_some(),
            })
            .count();
        self.evicted_for_room
            .fetch_add(evicted as u64, Ordering::Relaxed);
        evicted
    }

    /// Runs `f` on the route's state under its entry lock, creating the
    /// state if there is room (or room can be made).
    fn with_route<T>(
        &self,
        route: &RouteLookup<'_>,
        now_ms: i64,
        f: impl FnOnce(&mut RouteState) -> T,
    ) -> Result<T, StoreError> {
        if let Some(mut state) = self.routes.get_mut(route.name()) {
            state.last_touched_ms = state.last_touched_ms.max(now_ms);
            return Ok(f(&mut state));
        }
        self.ensure_room(now_ms)?;
        let mut state = self
            .routes
            .entry(RouteName::of(route.key()))
            .or_insert_with(|| RouteState::new(now_ms));
        state.last_touched_ms = state.last_touched_ms.max(now_ms);
        Ok(f(&mut state))
    }

    /// The caller scope's (cooldown, floor), read without creating anything.
    fn caller_floor(&self, caller_scope: &str) -> (i64, i64) {
        self.read_caller(caller_scope, |c| {
            (c.hints.cooldown_until_ms, c.hints.floor_ms())
        })
        .unwrap_or((0, 0))
    }

    /// `f` of the caller scope's state, if it has any.
    fn read_caller<T>(&self, caller_scope: &str, f: impl FnOnce(&CallerState) -> T) -> Option<T> {
        if !self.callers_used.load(Ordering::Acquire) {
            return None;
        }
        self.callers.get(caller_scope).map(|c| f(&c))
    }

    /// The caller scope's state, created if it has none (room for it is
    /// the caller's business).
    fn caller_entry(&self, caller_scope: &str) -> RefMut<'_, String, CallerState> {
        self.callers_used.store(true, Ordering::Release);
        self.callers.entry(caller_scope.to_owned()).or_default()
    }

    fn view_of(state: &RouteState, caller: (i64, i64)) -> RouteView {
        RouteView {
            cooldown_until_ms: state.hints().cooldown_until_ms.max(caller.0),
            floor_ms: state.hints().floor_ms().max(caller.1),
            frozen: state.frozen().cloned(),
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
            leases_outstanding: state.live_leases(now_ms),
            waiting: state.waiting(now_ms),
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
        let id = crate::budget::new_lease_id();
        self.with_route(&RouteLookup::of(&scope.route), ask.now_ms, |state| {
            let view = Self::view_of(state, caller);
            if view.frozen.is_some() {
                let remaining =
                    state
                        .budget(ask.now_ms)
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
            let grant = state.budget(ask.now_ms).grant(policy, ask, &id)?;
            Ok(LeaseOutcome {
                lease_id: (grant.granted > 0).then_some(id),
                grant,
                view,
            })
        })?
    }

    /// Occupancy and eviction counts, for the `tollgate.scopes.*` metrics.
    pub fn counts(&self) -> ScopeCounts {
        ScopeCounts {
            live: self.live(),
            limit: self.max_scopes,
            evicted_idle: self.evicted_idle.load(Ordering::Relaxed),
            evicted_for_room: self.evicted_for_room.load(Ordering::Relaxed),
            refused: self.refused.load(Ordering::Relaxed),
        }
    }
}

/// A scope a room-making pass may evict.
#[derive(Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Victim {
    Route(RouteName),
    Caller(String),
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

    fn release<'a>(&'a self, scope: &'a ScopeKey, end: LeaseEnd<'a>) -> StoreFuture<'a, u32> {
        let result = match self.routes.get_mut(RouteLookup::of(&scope.route).name()) {
            Some(mut state) => state
                .budget(end.now_ms)
                .release(end)
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
    ) -> StoreFuture<'a, Slotted> {
        let caller = self.caller_floor(&route.caller_scope);
        let result = self
            .with_route(&RouteLookup::of(route), ask.now_ms, |state| {
                let view = Self::view_of(state, caller);
                if view.frozen.is_some() {
                    let pacing = state.pacing_view(ask.now_ms, &policy.pacing);
                    return Ok(Slotted {
                        decided: Reconsidered::Frozen,
                        view,
                        pacing,
                        pacing_was: pacing.mode,
                    });
                }
                let (outcome, pacing, pacing_was) =
                    state.assign_slot(ask, view.floor_ms, &policy.pacing)?;
                Ok(Slotted {
                    decided: outcome.into(),
                    view,
                    pacing,
                    pacing_was,
                })
            })
            .and_then(|r| r);
        Box::pin(ready(result))
    }

    fn view<'a>(&'a self, route: &'a RouteKey, _now_ms: i64) -> StoreFuture<'a, RouteView> {
        Box::pin(ready(Ok(self.view_now(&RouteLookup::of(route)))))
    }

    fn set_freeze<'a>(
        &'a self,
        route: &'a RouteKey,
        reason: Option<String>,
        now_ms: i64,
    ) -> StoreFuture<'a, ()> {
        Box::pin(ready(self.with_route(
            &RouteLookup::of(route),
            now_ms,
            |state| state.set_frozen(reason),
        )))
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
                filter.caller_scope.matches(k.caller_scope())
                    && filter.route.matches(k.route())
                    && (!filter.frozen_only || e.value().frozen().is_some())
            })
            .map(|e| e.key().key())
            .filter(|k| after.is_none_or(|a| k > a))
            .collect();
        keys.sort_unstable();
        let more = keys.len() > limit;
        keys.truncate(limit);
        let scopes: Vec<ScopeSummary> = keys
            .iter()
            .filter_map(|k| {
                let caller = self.caller_floor(&k.caller_scope);
                self.routes
                    .get(RouteLookup::of(k).name())
                    .map(|state| Self::summary(k, &state, caller, now_ms))
            })
            .collect();
        let next = if more { keys.last().cloned() } else { None };
        Box::pin(ready(Ok(ScopePage { scopes, next })))
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
            .with_route(&RouteLookup::of(route), now_ms, |state| {
                set_mute(&mut state.hints_mut().mutes, worker_id, until_ms, now_ms)
            })
            .and_then(|on_route| {
                let caller = &route.caller_scope;
                if !self.callers.contains_key(caller) {
                    self.ensure_room(now_ms)?;
                }
                let mut state = self.caller_entry(caller);
                state.last_touched_ms = state.last_touched_ms.max(now_ms);
                Ok(on_route & set_mute(&mut state.hints.mutes, worker_id, until_ms, now_ms))
            });
        Box::pin(ready(result))
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
        // The route's last_touched is left alone so looking does not keep
        // a scope from being evicted.
        let detail = self.routes.get(RouteLookup::of(route).name()).map(|state| {
            let summary = Self::summary(route, &state, caller, now_ms);
            // A copy, so a quiet route's ledger is not rebuilt by looking.
            let mut budget = state
                .budget_if_any()
                .cloned()
                .unwrap_or_else(|| BudgetLedger::new(now_ms));
            ScopeDetail {
                summary,
                budget: budget.snapshot(policy, now_ms),
                route_cooldown_until_ms: state.hints().cooldown_until_ms,
                caller_cooldown_until_ms: caller_cooldown,
                backoff_step: state.hints().backoff_step,
                route_hints: state.recent_hints(),
                caller_hints,
                route_evidence: state.hints().evidence(now_ms),
                caller_evidence,
                pacing: state.pacing_view(now_ms, &policy.pacing),
            }
        });
        Box::pin(ready(Ok(detail)))
    }

    fn reset_scope<'a>(&'a self, route: &'a RouteKey, now_ms: i64) -> StoreFuture<'a, bool> {
        let known = match self.routes.get_mut(RouteLookup::of(route).name()) {
            Some(mut state) => {
                state.reset(now_ms);
                true
            }
            None => false,
        };
        Box::pin(ready(Ok(known)))
    }

    /// Also compacts the routes it keeps that have been untouched for the
    /// longest window: their quiet ledgers and inert hints are dropped
    /// (`route::RouteState::compact`), which is what keeps an idle scope
    /// small until it is evicted.
    fn evict_idle(&self, now_ms: i64, idle_ms: i64) -> StoreFuture<'_, usize> {
        let before = self.live();
        let idle_since = now_ms.saturating_sub(idle_ms);
        let quiet_since = now_ms.saturating_sub(MAX_WINDOW_SECS as i64 * 1000);
        self.routes.retain(|_, s| {
            if s.last_touched_ms > idle_since || s.pinned(now_ms) {
                if s.last_touched_ms <= quiet_since {
                    s.compact(now_ms);
                }
                return true;
            }
            false
        });
        self.callers
            .retain(|_, c| c.last_touched_ms > idle_since || c.hints.live_until_ms() > now_ms);
        let evicted = before.saturating_sub(self.live());
        self.evicted_idle
            .fetch_add(evicted as u64, Ordering::Relaxed);
        Box::pin(ready(Ok(evicted)))
    }

    fn counts(&self) -> Option<ScopeCounts> {
        Some(MemoryStore::counts(self))
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

    use crate::budget::GrantAsk;
    use crate::scope::{Priority, RetryClass};
    use crate::store::contract::deposit;

    const T0: i64 = 1_700_000_000_000;

    fn key(i: usize) -> ScopeKey {
        ScopeKey::new("c", &format!("r{i}"), Priority::Critical)
    }

    async fn lease(s: &MemoryStore, i: usize, now_ms: i64) -> Result<LeaseOutcome, StoreError> {
        let ask = GrantAsk {
            worker_id: "w",
            priority: Priority::Critical,
            retry_class: RetryClass::Transient,
            want: 1,
            now_ms,
        };
        s.lease(&key(i), ask, &Policy::default()).await
    }

    /// Only the memory store counts scopes: a shared store's bound is the
    /// server's own memory limit plus key expiry (docs/deploying.md).
    #[tokio::test]
    async fn at_the_limit_the_coldest_scope_makes_room() {
        let s = MemoryStore::new(8);
        for i in 0..8 {
            deposit(&s, &key(i), 1, T0 + i as i64).await.expect("room");
        }
        // r0 is the coldest: touched first, nothing live in it.
        deposit(&s, &key(8), 1, T0 + 100).await.expect("room made");
        let c = s.counts();
        assert_eq!(
            (c.live, c.limit, c.evicted_for_room, c.refused),
            (8, 8, 1, 0)
        );
        assert_eq!(
            s.scope_detail(&key(0).route, &Policy::default(), T0 + 100)
                .await,
            Ok(None)
        );
        assert!(
            s.scope_detail(&key(1).route, &Policy::default(), T0 + 100)
                .await
                .expect("detail")
                .is_some()
        );
    }

    #[tokio::test]
    async fn live_scopes_are_never_evicted_to_make_room() {
        let s = MemoryStore::new(8);
        for i in 0..8 {
            lease(&s, i, T0).await.expect("room");
        }
        // Every scope holds an unexpired lease: refused, nothing evicted.
        let refused = lease(&s, 8, T0 + 1_000).await;
        assert_eq!(refused, Err(StoreError::ScopeLimit { max: 8 }));
        assert_eq!(s.counts().refused, 1);
        assert_eq!(s.counts().evicted_for_room, 0);
        // Once the leases expire (ttl 10 s) the coldest goes.
        lease(&s, 8, T0 + 10_000)
            .await
            .expect("room once leases expired");
        assert_eq!(s.counts().evicted_for_room, 1);
        // Idle eviction still empties the table later, and is counted.
        assert_eq!(s.evict_idle(T0 + 1_000_000, 60_000).await, Ok(8));
        assert_eq!(s.counts().evicted_idle, 8);
    }

    #[tokio::test]
    async fn a_quiet_scope_is_compacted_and_still_answers() {
        let s = MemoryStore::new(8);
        let lease = lease(&s, 0, T0).await.expect("lease");
        assert_eq!(lease.grant.granted, 1);
        // A window and more later, the sweeper keeps the scope (idle TTL
        // not reached) but drops its quiet ledger.
        assert_eq!(s.evict_idle(T0 + 61_000, 600_000).await, Ok(0));
        let name = RouteName::of(&key(0).route);
        assert!(s.routes.get(&name).expect("kept").budget_if_any().is_none());
        let d = s
            .scope_detail(&key(0).route, &Policy::default(), T0 + 61_000)
            .await
            .expect("detail")
            .expect("known");
        assert_eq!(
            d.budget.classes[0].available_milli, 100_000,
            "a full window again"
        );
    }
}
