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
//! # Quotas per token
//! The bound is a pool every tenant shares, so each caller token also has
//! a quota of it ([`crate::tenancy::TenantLimits`]): every route and caller
//! scope is charged to the token that made it ([`Owner`], kept in the
//! route's time stamp) and counted per token. A token that needs a new
//! scope while it holds its quota makes room among **its own** scopes
//! only, coldest first, in a batch of [`ROOM_BATCH_PERMILLE`] of its
//! quota; and there a scope under a cooldown or backoff goes too, as long
//! as nothing else holds it (no unexpired lease, waiting intent, freeze
//! or mute): a tenant must not keep scopes in memory by reporting 429s on
//! them. Only when every one of its scopes is busy is it refused
//! (`ScopeQuota`, RESOURCE_EXHAUSTED naming its quota), without another
//! pass for [`ROOM_RETRY_MS`]. A token under its quota that finds the
//! table full evicts as before, but only scopes that are its own, an
//! operator's or open dev mode's ([`Owner::NONE`]), or of a token over its
//! quota: never a scope of another token within its quota, cold or not.
//! With the default quotas (the table split evenly,
//! [`crate::tenancy::fair_share`]) that is always enough; quotas set per
//! token that add up to more than the table can leave a token under its
//! quota refused at a full table (the server warns about them at start).
//! The per-token counts are kept as scopes come and go, give or take the
//! calls in flight (as the table's bound is).
//!
//! Route state is kept compact (`route`): see there for what a scope costs.

mod report;
mod route;

use std::collections::BinaryHeap;
use std::future::ready;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, AtomicUsize, Ordering};

use dashmap::DashMap;
use dashmap::mapref::one::RefMut;

use crate::budget::{BudgetLedger, GrantAsk, GrantLimit, LeaseEnd, MAX_WINDOW_SECS};
use crate::hints::{EvidenceDetail, HintState};
use crate::pacing::cursor::SlotAsk;
use crate::policy::Policy;
use crate::scope::{RouteKey, ScopeKey};

use super::{
    LeaseOutcome, OwnerCounts, Reconsidered, ReportBatch, Reported, RouteView, ScopeCounts,
    ScopeDetail, ScopeFilter, ScopePage, ScopeSummary, Slotted, Store, StoreError, StoreFuture,
};
use crate::tenancy::Owner;
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
#[derive(Debug)]
struct CallerState {
    hints: HintState,
    last_touched_ms: i64,
    /// The token whose quota it is charged to: the one whose report (or
    /// the operator whose mute) made it.
    owner: Owner,
}

impl CallerState {
    fn new(owner: Owner) -> Self {
        CallerState {
            hints: HintState::default(),
            last_touched_ms: 0,
            owner,
        }
    }

    /// As [`RouteState::pinned`](route::RouteState::pinned): its evidence
    /// is live.
    fn pinned(&self, now_ms: i64) -> bool {
        self.hints.live_until_ms() > now_ms
    }

    /// As [`RouteState::busy`](route::RouteState::busy): an operator's mute
    /// holds it.
    fn busy(&self, now_ms: i64) -> bool {
        self.hints.mutes.values().any(|&until| until > now_ms)
    }
}

/// Which scopes a room-making pass may evict.
#[derive(Debug, Clone, Copy)]
enum Room {
    /// `Owner` is at its quota: its own scopes that are not busy.
    Own(Owner),
    /// The table is full and the asking owner is under its quota: scopes
    /// with nothing live of that owner, of nobody, or of an owner over
    /// its quota.
    Table(Owner),
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
    /// By [`Owner::index`]: each token's scope quota. Empty (no quotas)
    /// in open dev mode.
    quotas: Vec<usize>,
    /// By raw [`Owner`] (0: nobody's): the scopes each holds now. Owners
    /// past the end (a store built without quotas) are not counted.
    held: Vec<AtomicUsize>,
    /// By raw [`Owner`]: before this instant a token at its quota whose
    /// scopes were all busy is refused at once (see [`ROOM_RETRY_MS`]).
    quota_retry_at_ms: Vec<AtomicI64>,
    /// By raw [`Owner`]: new scopes refused at its quota.
    refused_quota: Vec<AtomicU64>,
}

impl MemoryStore {
    /// An empty store holding at most `max_scopes` routes and caller
    /// scopes, with no quota per token (open dev mode, tests, benchmarks).
    pub fn new(max_scopes: usize) -> Self {
        MemoryStore::with_quotas(max_scopes, Vec::new())
    }

    /// The store `config` asks for: `max_scopes`, and each caller token's
    /// quota of it.
    pub fn for_config(config: &crate::config::Config) -> Self {
        MemoryStore::with_quotas(config.limits.max_scopes, config.tenant_limits().scopes)
    }

    /// An empty store holding at most `max_scopes` routes and caller
    /// scopes, caller token entry `i` at most `quotas[i]` of them.
    pub fn with_quotas(max_scopes: usize, quotas: Vec<usize>) -> Self {
        let owners = quotas.len() + 1;
        MemoryStore {
            quotas,
            held: (0..owners).map(|_| AtomicUsize::new(0)).collect(),
            quota_retry_at_ms: (0..owners).map(|_| AtomicI64::new(i64::MIN)).collect(),
            refused_quota: (0..owners).map(|_| AtomicU64::new(0)).collect(),
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

    /// `owner`'s quota; `None` when it has none (nobody's, or a store
    /// without quotas).
    fn quota(&self, owner: Owner) -> Option<usize> {
        owner.index().and_then(|i| self.quotas.get(i)).copied()
    }

    /// How many scopes `owner` holds (0 for an owner not counted).
    fn held(&self, owner: Owner) -> usize {
        self.held
            .get(usize::from(owner.get()))
            .map_or(0, |n| n.load(Ordering::Relaxed))
    }

    /// Counts a scope made for `owner`.
    fn charge(&self, owner: Owner) {
        if let Some(n) = self.held.get(usize::from(owner.get())) {
            n.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Counts a scope of `owner` gone.
    fn discharge(&self, owner: Owner) {
        if let Some(n) = self.held.get(usize::from(owner.get())) {
            // Never below zero, whatever the order of concurrent updates.
            let _ = n.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |v| {
                Some(v.saturating_sub(1))
            });
        }
    }

    /// Whether `owner` holds more than its quota (scopes made before a
    /// count caught up): its scopes are fair game for a full table.
    fn over_quota(&self, owner: Owner) -> bool {
        self.quota(owner).is_some_and(|q| self.held(owner) > q)
    }

    /// Room for one more scope of `owner`: within its quota (making room
    /// among its own scopes if it holds its quota), then in the table
    /// (evicting the coldest unpinned scopes it may take, see the module
    /// doc); `ScopeQuota` or `ScopeLimit` when there is none.
    fn ensure_room(&self, owner: Owner, now_ms: i64) -> Result<(), StoreError> {
        if let Some(quota) = self.quota(owner)
            && self.held(owner) >= quota
        {
            self.own_room(owner, quota, now_ms)?;
        }
        if self.live() < self.max_scopes {
            return Ok(());
        }
        if now_ms >= self.room_retry_at_ms.load(Ordering::Relaxed) {
            let _one_pass = self.making_room.lock().unwrap_or_else(|e| e.into_inner());
            // Another pass may have made room while this one waited.
            if self.live() < self.max_scopes || self.make_room(now_ms, Room::Table(owner)) > 0 {
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

    /// Room within `owner`'s `quota`, evicting its own coldest scopes that
    /// are not busy; `ScopeQuota` when every one is.
    fn own_room(&self, owner: Owner, quota: usize, now_ms: i64) -> Result<(), StoreError> {
        let raw = usize::from(owner.get());
        let retry_at = &self.quota_retry_at_ms[raw];
        if now_ms >= retry_at.load(Ordering::Relaxed) {
            let _one_pass = self.making_room.lock().unwrap_or_else(|e| e.into_inner());
            if self.held(owner) < quota || self.make_room(now_ms, Room::Own(owner)) > 0 {
                return Ok(());
            }
            retry_at.store(now_ms.saturating_add(ROOM_RETRY_MS), Ordering::Relaxed);
        }
        self.refused_quota[raw].fetch_add(1, Ordering::Relaxed);
        Err(StoreError::ScopeQuota { quota })
    }

    /// Evicts up to one batch of the coldest scopes `room` allows; returns
    /// how many. One pass over both maps, keeping the coldest candidates
    /// in a bounded heap (no copy of the whole map), then each is removed
    /// only if it is still cold and evictable under its own entry lock.
    fn make_room(&self, now_ms: i64, room: Room) -> usize {
        let bound = match room {
            Room::Own(owner) => self.quota(owner).unwrap_or(self.max_scopes),
            Room::Table(_) => self.max_scopes,
        };
        let batch = (bound * ROOM_BATCH_PERMILLE / 1000).max(1);
        // Whether a scope of `owner`, pinned and busy as given, may go.
        let over_quota: Vec<bool> = (0..self.held.len())
            .map(|raw| self.over_quota(Owner::from_raw(raw as u16)))
            .collect();
        let evictable = |owner: Owner, pinned: bool, busy: bool| match room {
            Room::Own(me) => owner == me && !busy,
            Room::Table(me) => {
                !pinned
                    && (owner == me
                        || self.quota(owner).is_none()
                        || over_quota.get(usize::from(owner.get())) == Some(&true))
            }
        };
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
            let s = e.value();
            if evictable(s.owner(), s.pinned(now_ms), s.busy(now_ms)) {
                offer(s.last_touched_ms(), &|| Victim::Route(e.key().clone()));
            }
        }
        for e in self.callers.iter() {
            let c = e.value();
            if evictable(c.owner, c.pinned(now_ms), c.busy(now_ms)) {
                offer(c.last_touched_ms, &|| Victim::Caller(e.key().clone()));
            }
        }
        let evicted = coldest
            .into_iter()
            .filter_map(|(touched, victim)| match victim {
                Victim::Route(name) => self
                    .routes
                    .remove_if(&name, |_, s| {
                        s.last_touched_ms() <= touched
                            && evictable(s.owner(), s.pinned(now_ms), s.busy(now_ms))
                    })
                    .map(|(_, s)| s.owner()),
                Victim::Caller(name) => self
                    .callers
                    .remove_if(&name, |_, c| {
                        c.last_touched_ms <= touched
                            && evictable(c.owner, c.pinned(now_ms), c.busy(now_ms))
                    })
                    .map(|(_, c)| c.owner),
            })
            .map(|owner| self.discharge(owner))
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
        owner: Owner,
        now_ms: i64,
        f: impl FnOnce(&mut RouteState) -> T,
    ) -> Result<T, StoreError> {
        if let Some(mut state) = self.routes.get_mut(route.name()) {
            state.touch(now_ms);
            return Ok(f(&mut state));
        }
        self.ensure_room(owner, now_ms)?;
        let mut state = match self.routes.entry(RouteName::of(route.key())) {
            dashmap::Entry::Occupied(e) => e.into_ref(),
            dashmap::Entry::Vacant(e) => {
                self.charge(owner);
                e.insert(RouteState::new(now_ms, owner))
            }
        };
        state.touch(now_ms);
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

    /// The caller scope's state, created for `owner` if it has none (room
    /// for it is the caller's business).
    fn caller_entry(&self, caller_scope: &str, owner: Owner) -> RefMut<'_, String, CallerState> {
        self.callers_used.store(true, Ordering::Release);
        match self.callers.entry(caller_scope.to_owned()) {
            dashmap::Entry::Occupied(e) => e.into_ref(),
            dashmap::Entry::Vacant(e) => {
                self.charge(owner);
                e.insert(CallerState::new(owner))
            }
        }
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
            last_touched_ms: state.last_touched_ms(),
            owner: state.owner(),
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
        let route = RouteLookup::of(&scope.route);
        self.with_route(&route, ask.tenant.owner, ask.now_ms, |state| {
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

    /// What each token with a quota holds, for the per-tenant metrics.
    pub fn owner_counts(&self) -> Vec<OwnerCounts> {
        self.quotas
            .iter()
            .enumerate()
            .map(|(i, &quota)| {
                let owner = Owner::token(i);
                OwnerCounts {
                    owner,
                    held: self.held(owner),
                    quota,
                    refused: self.refused_quota[usize::from(owner.get())].load(Ordering::Relaxed),
                }
            })
            .collect()
    }

    fn reconsider_now(
        &self,
        route: &RouteKey,
        ask: SlotAsk<'_>,
        policy: &Policy,
    ) -> Result<Slotted, StoreError> {
        let caller = self.caller_floor(&route.caller_scope);
        let tenant = ask.tenant;
        self.with_route(&RouteLookup::of(route), tenant.owner, ask.now_ms, |state| {
            let view = Self::view_of(state, caller);
            if view.frozen.is_some() {
                let pacing = state.pacing_view(ask.now_ms, &policy.pacing);
                return Ok(Slotted {
                    decided: Reconsidered::Frozen,
                    view,
                    pacing,
                    pacing_was: pacing.mode,
                    call_back_until_ms: None,
                });
            }
            let (outcome, pacing, pacing_was, call_back_until_ms) =
                state.assign_slot(ask, view.floor_ms, &policy.pacing)?;
            Ok(Slotted {
                decided: outcome.into(),
                view,
                pacing,
                pacing_was,
                call_back_until_ms,
            })
        })
        .and_then(|r| r)
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
        Box::pin(ready(self.reconsider_now(route, ask, policy)))
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
        // An operator's freeze of a route nobody made is nobody's.
        Box::pin(ready(self.with_route(
            &RouteLookup::of(route),
            Owner::NONE,
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
                    && filter.owner.is_none_or(|o| e.value().owner() == o)
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
            .with_route(&RouteLookup::of(route), Owner::NONE, now_ms, |state| {
                set_mute(&mut state.hints_mut().mutes, worker_id, until_ms, now_ms)
            })
            .and_then(|on_route| {
                let caller = &route.caller_scope;
                if !self.callers.contains_key(caller) {
                    self.ensure_room(Owner::NONE, now_ms)?;
                }
                let mut state = self.caller_entry(caller, Owner::NONE);
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
                stated_recent: state
                    .pacing()
                    .map(|p| p.stated_recent().cloned().collect())
                    .unwrap_or_default(),
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
            if s.last_touched_ms() > idle_since || s.pinned(now_ms) {
                if s.last_touched_ms() <= quiet_since {
                    s.compact(now_ms);
                }
                return true;
            }
            self.discharge(s.owner());
            false
        });
        self.callers.retain(|_, c| {
            let keep = c.last_touched_ms > idle_since || c.pinned(now_ms);
            if !keep {
                self.discharge(c.owner);
            }
            keep
        });
        let evicted = before.saturating_sub(self.live());
        self.evicted_idle
            .fetch_add(evicted as u64, Ordering::Relaxed);
        Box::pin(ready(Ok(evicted)))
    }

    fn counts(&self) -> Option<ScopeCounts> {
        Some(MemoryStore::counts(self))
    }

    fn owner_counts(&self) -> Vec<OwnerCounts> {
        MemoryStore::owner_counts(self)
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

    /// The quota cases, in a table far larger than the quotas.
    mod quotas {
        async fn make() -> Option<crate::store::contract::Fixture> {
            let limits = crate::store::contract::quotas::limits();
            Some(crate::store::contract::Fixture::new(
                super::MemoryStore::with_quotas(64, limits.scopes),
                (),
            ))
        }

        crate::store::contract::quotas::quota_tests!(make);
    }

    use crate::budget::GrantAsk;
    use crate::scope::{Priority, RetryClass};
    use crate::store::contract::deposit;
    use crate::tenancy::Tenant;

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
            tenant: Tenant::NONE,
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

    /// A report by `tenant` on `key` at `now_ms` carrying a 429 with
    /// `Retry-After: 300`: the scope cools down for five minutes.
    async fn cool_down(
        s: &MemoryStore,
        tenant: Tenant,
        key: &ScopeKey,
        now_ms: i64,
    ) -> Result<Reported, StoreError> {
        let p = Policy::default();
        let input = crate::hints::EvidenceInput {
            http_status: 429,
            retry_after: Some("300"),
            receipt_ms: now_ms,
            ..crate::hints::EvidenceInput::default()
        };
        let hints = [super::super::LevelHint {
            caller_wide: false,
            assessment: crate::hints::assess(&input, &p, now_ms),
        }];
        let batch = ReportBatch {
            worker_id: "w",
            first_attempts: 1,
            successes: 0,
            rejections: 1,
            counts_age_ms: 0,
            hints: &hints,
            now_ms,
            tenant,
            stated: None,
        };
        s.report(key, batch, &p).await
    }

    fn tenant(i: usize) -> Tenant {
        Tenant {
            owner: Owner::token(i),
            tokens: 1,
        }
    }

    async fn lease_by(
        s: &MemoryStore,
        who: Tenant,
        key: &ScopeKey,
        now_ms: i64,
    ) -> Result<LeaseOutcome, StoreError> {
        let ask = GrantAsk {
            worker_id: "w",
            priority: key.priority,
            retry_class: RetryClass::Transient,
            want: 1,
            now_ms,
            tenant: who,
        };
        s.lease(key, ask, &Policy::default()).await
    }

    fn b_key(i: usize) -> ScopeKey {
        ScopeKey::new("b", &format!("r{i}"), Priority::Critical)
    }

    #[tokio::test]
    async fn a_token_at_its_quota_evicts_its_own_cooled_down_scopes_never_anothers() {
        let s = MemoryStore::with_quotas(8, vec![4, 4]);
        let (a, b) = (tenant(0), tenant(1));
        // B's scope is busy with a lease; its other scope is only cold.
        lease_by(&s, b, &b_key(0), T0).await.expect("b busy");
        deposit(&s, &b_key(1), 1, T0).await.expect("unowned");
        // A fills its quota with scopes it cooled down itself.
        for i in 0..4 {
            cool_down(&s, a, &key(i), T0 + 1 + i as i64)
                .await
                .expect("a's quota");
        }
        assert_eq!(s.held(a.owner), 4);
        // Twenty more: each evicts A's own coldest, cooldown or not.
        for i in 4..24 {
            cool_down(&s, a, &key(i), T0 + 100 + i as i64)
                .await
                .expect("room among a's own scopes");
            assert!(s.held(a.owner) <= 4);
        }
        assert!(
            s.routes
                .contains_key(RouteLookup::of(&b_key(0).route).name())
        );
        assert!(
            s.routes
                .contains_key(RouteLookup::of(&b_key(1).route).name())
        );
        assert!(!s.routes.contains_key(RouteLookup::of(&key(0).route).name()));
        // B is under its quota: a new scope of its own is admitted.
        lease_by(&s, b, &b_key(2), T0 + 200)
            .await
            .expect("b's room");
        assert_eq!(s.held(b.owner), 2);
        let counts = s.owner_counts();
        assert_eq!((counts[0].held, counts[0].quota), (4, 4));
    }

    #[tokio::test]
    async fn a_token_whose_scopes_are_all_busy_is_refused_at_its_quota_alone() {
        let s = MemoryStore::with_quotas(8, vec![2, 2]);
        let (a, b) = (tenant(0), tenant(1));
        for i in 0..2 {
            lease_by(&s, a, &key(i), T0).await.expect("a's quota");
        }
        let refused = lease_by(&s, a, &key(2), T0 + 1).await;
        assert_eq!(refused, Err(StoreError::ScopeQuota { quota: 2 }));
        assert_eq!(s.owner_counts()[0].refused, 1);
        // B is not held out by A's full quota, and the table is not full.
        lease_by(&s, b, &b_key(0), T0 + 1).await.expect("b's room");
        assert_eq!(s.counts().refused, 0);
        // Once A's leases expire, its own coldest makes room.
        lease_by(&s, a, &key(2), T0 + 10_000)
            .await
            .expect("a's own room");
        assert_eq!(s.held(a.owner), 2);
    }

    #[tokio::test]
    async fn a_full_table_never_takes_a_scope_of_a_token_within_its_quota() {
        // Quotas of 6 each in a table of 8: oversubscribed, as a per-token
        // setting may make it.
        let s = MemoryStore::with_quotas(8, vec![6, 6]);
        let (a, b) = (tenant(0), tenant(1));
        for i in 0..3 {
            deposit_as(&s, b, &b_key(i), T0).await;
        }
        for i in 0..5 {
            deposit_as(&s, a, &key(i), T0 + 1 + i as i64).await;
        }
        // Table full, A under its quota: B's colder scopes stay, A's own go.
        deposit_as(&s, a, &key(5), T0 + 10).await;
        assert_eq!((s.held(a.owner), s.held(b.owner)), (5, 3));
        assert!(!s.routes.contains_key(RouteLookup::of(&key(0).route).name()));
        // Nobody's scopes (an operator's) are fair game too.
        let open = MemoryStore::with_quotas(2, vec![2]);
        deposit(&open, &b_key(0), 1, T0).await.expect("nobody's");
        deposit_as(&open, a, &key(0), T0 + 1).await;
        deposit_as(&open, a, &key(1), T0 + 2).await;
        assert_eq!(open.held(a.owner), 2);
        assert_eq!(open.held(Owner::NONE), 0);
    }

    async fn deposit_as(s: &MemoryStore, who: Tenant, key: &ScopeKey, now_ms: i64) {
        let batch = ReportBatch {
            first_attempts: 1,
            tenant: who,
            ..ReportBatch::empty("w", now_ms)
        };
        s.report(key, batch, &Policy::default())
            .await
            .expect("room");
    }

    #[tokio::test]
    async fn listing_filters_by_owner_and_the_counts_follow_idle_eviction() {
        let s = MemoryStore::with_quotas(8, vec![4, 4]);
        deposit_as(&s, tenant(0), &key(0), T0).await;
        deposit_as(&s, tenant(1), &b_key(0), T0).await;
        let mine = ScopeFilter {
            owner: Some(Owner::token(1)),
            ..ScopeFilter::default()
        };
        let page = s.list_scopes(&mine, None, 10, T0).await.expect("list");
        assert_eq!(page.scopes.len(), 1);
        assert_eq!(page.scopes[0].route, b_key(0).route);
        assert_eq!(page.scopes[0].owner, Owner::token(1));
        assert_eq!(s.evict_idle(T0 + 1_000_000, 60_000).await, Ok(2));
        assert_eq!((s.held(Owner::token(0)), s.held(Owner::token(1))), (0, 0));
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
