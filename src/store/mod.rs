//! Where scope state lives, behind one async trait.
//!
//! The trait's operations are the state changes that must be atomic per
//! scope — grant a lease (take tokens), release one, apply a worker's report
//! (first attempts, successes, every hint merged into cooldowns and the
//! stated limit weighed into pacing), advance
//! a slot cursor, freeze — so a shared store (Redis) makes each one atomic
//! (a server-side script, or a decision made in Rust and written by
//! compare-and-set) and replicas stay stateless. The decision math itself
//! lives in the pure modules ([`crate::budget`], [`crate::hints`],
//! [`crate::pacing::cursor`], [`crate::pacing`]); a store only applies it to the
//! state it holds.
//!
//! Time is passed in (`now_ms`, from the core's injected clock) instead of
//! being read here, so the in-memory store is deterministic under test.
//!
//! Futures are boxed (`StoreFuture`) so the trait is object-safe and the
//! server holds an `Arc<dyn Store>`, chosen at start (limitador's shape).

pub mod control_state;
pub mod memory;
pub mod redis;

use std::future::Future;
use std::pin::Pin;

use crate::budget::{BudgetError, BudgetSnapshot, Grant, GrantAsk, LeaseEnd};
use crate::hints::{Assessment, EvidenceDetail, HintRecord, Merge};
use crate::pacing::cursor::{SlotAsk, SlotError, SlotOutcome};
use crate::pacing::{Mode, PacingView, WINDOW_MS};
use crate::policy::{Pattern, Policy};
use crate::scope::{EvidenceLevel, RouteKey, ScopeKey};

pub use crate::telemetry::scopes::{OwnerCounts, ScopeCounts};
pub use crate::tenancy::{Owner, Tenant};
pub use control_state::{Committed, ControlSnapshot, ControlStateStore, MEMORY_RECORDS};
pub use memory::MemoryStore;
pub use redis::{RedisOptions, RedisStore, RedisTarget};

/// A boxed store operation.
pub type StoreFuture<'a, T> = Pin<Box<dyn Future<Output = Result<T, StoreError>> + Send + 'a>>;

/// Why a store operation failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum StoreError {
    /// The bounded number of scopes is reached and every scope is live (a
    /// lease, cooldown, freeze or waiting intent): the coldest unpinned ones
    /// were already evicted to make room, and there were none.
    #[error("scope limit reached ({max} scopes, every one live)")]
    ScopeLimit {
        /// The configured bound.
        max: usize,
    },
    /// The calling token holds its quota of scopes and every one is busy
    /// (a lease, a waiting intent, a freeze or a mute): its own coldest
    /// idle ones, cooled down or not, were already evicted to make room,
    /// and there were none. Another token's scopes are never taken.
    #[error(
        "this token holds its quota of {quota} scopes (max_scopes of its [[token]]), every one busy"
    )]
    ScopeQuota {
        /// The token's quota.
        quota: usize,
    },
    /// The budget refused the operation.
    #[error(transparent)]
    Budget(#[from] BudgetError),
    /// The slot cursor refused the operation.
    #[error(transparent)]
    Slots(#[from] SlotError),
    /// The backing store could not be reached (never for the in-memory store).
    #[error("store unavailable: {0}")]
    Unavailable(String),
}

impl StoreError {
    /// Whether retrying the same operation later may succeed without any
    /// change by the caller (a store outage, not a refusal).
    pub fn is_transient(&self) -> bool {
        matches!(self, StoreError::Unavailable(_))
    }
}

/// A route's effective state: its own and its caller scope's, merged.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RouteView {
    /// `max` of the route's and the caller scope's cooldowns; 0 when none.
    pub cooldown_until_ms: i64,
    /// `max` of cooldowns and backoffs: nothing is reconsidered before it.
    pub floor_ms: i64,
    /// An operator's freeze and its reason.
    pub frozen: Option<String>,
}

/// A lease's outcome.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeaseOutcome {
    /// The lease to name in `Release`; `None` when nothing was granted.
    pub lease_id: Option<String>,
    /// What was granted and why not more.
    pub grant: Grant,
    /// The route's state at the time of the grant.
    pub view: RouteView,
}

/// What `Reconsider` decided.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reconsidered {
    /// Reconsider at this instant.
    Slot(i64),
    /// The earliest slot would not fit the deadline.
    DeadlineInfeasible(i64),
    /// The scope is frozen: no slots.
    Frozen,
    /// No slot yet: ask again at this instant.
    AskAgain(i64),
}

/// What `Reconsider` decided, with the route's state and pacing then.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Slotted {
    /// A slot, ask again, a refusal, or frozen.
    pub decided: Reconsidered,
    /// The route's effective state.
    pub view: RouteView,
    /// The route's pacing at the decision.
    pub pacing: PacingView,
    /// The pacing mode before the decision (closing a window there can
    /// change it).
    pub pacing_was: Mode,
    /// The route calls back the intents told to ask again whose deadline
    /// is at or before this instant ([`crate::pacing::PacingState::call_back`]).
    pub call_back_until_ms: Option<i64>,
}

impl From<SlotOutcome> for Reconsidered {
    fn from(outcome: SlotOutcome) -> Self {
        match outcome {
            SlotOutcome::Slot(at) => Reconsidered::Slot(at),
            SlotOutcome::DeadlineInfeasible(at) => Reconsidered::DeadlineInfeasible(at),
            SlotOutcome::AskAgain(at) => Reconsidered::AskAgain(at),
        }
    }
}

/// One assessed hint of a report, and whether it covers the reported route
/// or its whole caller scope.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LevelHint {
    /// The worker was unsure which scope the response spoke for: the hint
    /// covers the whole caller scope, because an uncertain scope is never
    /// narrowed silently.
    pub caller_wide: bool,
    /// How the coordinator read it.
    pub assessment: Assessment,
}

impl LevelHint {
    /// The level this hint lands on, for a report on `route`.
    pub fn level(&self, route: &RouteKey) -> EvidenceLevel {
        if self.caller_wide {
            EvidenceLevel::Caller(route.caller_scope.clone())
        } else {
            EvidenceLevel::Route(route.clone())
        }
    }
}

/// A worker's report, validated and assessed: what [`Store::report`]
/// applies as one state change.
#[derive(Debug, Clone, Copy)]
pub struct ReportBatch<'a> {
    /// The reporting worker (an active worker of the scope's class).
    pub worker_id: &'a str,
    /// First attempts since the last report: they grow the allowance.
    pub first_attempts: u32,
    /// Successes since the last report: each narrows the backoff step.
    pub successes: u32,
    /// Attempts refused for capacity since the last report (at least the
    /// rejections among `hints`): what pacing judges capacity from.
    pub rejections: u32,
    /// How long before `now_ms` the oldest count was made; 0 reads as
    /// within the current window.
    pub counts_age_ms: i64,
    /// The rate-limit evidence, in the order the worker saw it.
    pub hints: &'a [LevelHint],
    /// The coordinator's clock at the report.
    pub now_ms: i64,
    /// The reporting token, with how many caller tokens may use the
    /// scope's caller scope ([`Tenant::NONE`] in open dev mode): a new
    /// scope is charged to its quota; where several tokens may use the
    /// caller scope, its first attempts are kept apart from the others'
    /// and corroboration needs workers of two
    /// ([`Reporter::tokens`](crate::hints::Reporter)).
    pub tenant: Tenant,
    /// The limit the upstream last stated to the worker, read: weighed
    /// into the route's pacing with the other workers' statements
    /// ([`crate::pacing::stated`]) before the report's counts.
    pub stated: Option<&'a crate::pacing::stated::Statement>,
}

/// The counts of a report that learned pacing takes into the window it
/// lands in ([`ReportBatch::window_counts`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WindowCounts {
    /// First attempts.
    pub first_attempts: u32,
    /// Successes.
    pub successes: u32,
    /// Rejections, never fewer than the hints carried before the share.
    pub rejections: u32,
    /// How long before the report the counts above were made in: its
    /// `counts_age_ms`, or for a report held back the part of the current
    /// window that its share is.
    pub span_ms: i64,
}

impl<'a> ReportBatch<'a> {
    /// `worker_id`'s report at `now_ms` with nothing in it, by no tenant
    /// ([`Tenant::NONE`]): the base the counts and hints of a report are
    /// set on.
    pub fn empty(worker_id: &'a str, now_ms: i64) -> Self {
        Self {
            worker_id,
            first_attempts: 0,
            successes: 0,
            rejections: 0,
            counts_age_ms: 0,
            hints: &[],
            now_ms,
            tenant: Tenant::NONE,
            stated: None,
        }
    }
}

impl ReportBatch<'_> {
    /// The hint ends pacing learns from: those the fleet agreed with. An
    /// outlier's or an uncorroborated claim is one worker's word (pacing
    /// would read a liar's ever-later claims as a re-arming limiter), and a
    /// muted worker's is evidence only.
    pub fn agreed_hint_ends(&self, merges: &[Merge]) -> Vec<i64> {
        self.hints
            .iter()
            .zip(merges)
            .filter(|(_, m)| m.claim == crate::hints::corroboration::Claim::Agreed)
            .filter_map(|(h, _)| h.assessment.cooldown_until_ms)
            .collect()
    }

    /// What pacing takes in from this report: its window's counts, the
    /// hint ends the fleet agreed with (`hint_ends`, from
    /// [`agreed_hint_ends`](Self::agreed_hint_ends)) and the route's
    /// cooldown before and after the report's evidence was merged.
    pub fn observation<'h>(
        &self,
        hint_ends: &'h [i64],
        cooldown_before_ms: i64,
        cooldown_after_ms: i64,
    ) -> crate::pacing::ReportSample<'h> {
        let counted = self.window_counts();
        crate::pacing::ReportSample {
            now_ms: self.now_ms,
            first_attempts: counted.first_attempts,
            successes: counted.successes,
            rejections: counted.rejections,
            hint_until_ms: hint_ends,
            cooldown_until_ms: cooldown_before_ms,
            cooldown_after_ms,
            counts_age_ms: counted.span_ms,
        }
    }

    /// What learned pacing counts in the window the report lands in.
    ///
    /// The rejections are the report's count, and never fewer than the
    /// hints it carries (an older worker sends no count). A report whose
    /// counts span at most a window is taken whole, as it always was: its
    /// counts are this window's traffic, give or take a report interval.
    /// One spanning more was held back while the coordinator was out of
    /// reach (or hung): its counts are taken as made evenly over their span,
    /// and only the share inside the current window counts, or a
    /// reconnecting fleet's backlog of successes would read as capacity.
    /// The budget takes every count whatever the age.
    pub fn window_counts(&self) -> WindowCounts {
        let rejections = self
            .rejections
            .max(u32::try_from(self.hints.len()).unwrap_or(u32::MAX));
        let age = self.counts_age_ms;
        let span_ms = if age <= WINDOW_MS {
            age
        } else {
            self.now_ms.rem_euclid(WINDOW_MS)
        };
        let share = |count: u32| {
            u32::try_from(crate::pacing::share_made_within(
                i64::from(count),
                age,
                span_ms,
            ))
            .unwrap_or(count)
        };
        WindowCounts {
            first_attempts: share(self.first_attempts),
            successes: share(self.successes),
            rejections: share(rejections),
            span_ms,
        }
    }
}

/// What a report changed.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Reported {
    /// One per [`ReportBatch::hints`] item, in order: whether it raised its
    /// level's cooldown, the cooldown and backoff after it.
    pub merges: Vec<Merge>,
    /// The route's effective state after the whole report.
    pub view: RouteView,
    /// The route's pacing after the report.
    pub pacing: PacingView,
    /// The pacing mode before the report, to tell a change.
    pub pacing_was: Mode,
    /// Whether the effective cooldown (the route's, or the caller scope's
    /// when later) rests on enough distinct workers: one worker's claim,
    /// capped, must not hold the whole fleet's first attempts.
    pub cooldown_corroborated: bool,
}

/// Which routes [`Store::list_scopes`] returns.
#[derive(Debug, Clone)]
pub struct ScopeFilter {
    /// Caller scopes to include (`exact`, `prefix*`, `*`).
    pub caller_scope: Pattern,
    /// Routes to include.
    pub route: Pattern,
    /// Only frozen routes: the first question in an incident.
    pub frozen_only: bool,
    /// Only routes charged to this owner: what one tenant holds.
    pub owner: Option<Owner>,
}

impl Default for ScopeFilter {
    fn default() -> Self {
        ScopeFilter {
            caller_scope: Pattern::Any,
            route: Pattern::Any,
            frozen_only: false,
            owner: None,
        }
    }
}

/// One line of a scope listing: enough to pick the scope to look at.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ScopeSummary {
    /// The route.
    pub route: RouteKey,
    /// Its effective state (cooldown, floor, freeze).
    pub view: RouteView,
    /// Leases granted and neither released nor expired.
    pub leases_outstanding: usize,
    /// Intents holding a slot still ahead.
    pub waiting: usize,
    /// When any operation last touched the route.
    pub last_touched_ms: i64,
    /// The token whose quota the route is charged to: the one that made
    /// it ([`Owner::NONE`] in open dev mode, for an operator's, or in a
    /// store that keeps no owners).
    pub owner: Owner,
}

/// A page of [`ScopeSummary`], ordered by route key.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ScopePage {
    /// At most the asked-for number of routes.
    pub scopes: Vec<ScopeSummary>,
    /// Pass as `after` for the next page; `None` on the last page.
    pub next: Option<RouteKey>,
}

/// Everything an operator sees about one route.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ScopeDetail {
    /// The route's summary.
    pub summary: ScopeSummary,
    /// Balance, spend and workers by priority class, at the given policy.
    pub budget: BudgetSnapshot,
    /// The route's own cooldown (the caller scope's may be later).
    pub route_cooldown_until_ms: i64,
    /// The caller scope's cooldown, from uncertain evidence; 0 when none.
    pub caller_cooldown_until_ms: i64,
    /// The backoff step hintless rejections have widened to.
    pub backoff_step: u8,
    /// Recent hints on the route, oldest first (bounded).
    pub route_hints: Vec<HintRecord>,
    /// Recent hints on the whole caller scope, oldest first (bounded).
    pub caller_hints: Vec<HintRecord>,
    /// Whether the route's cooldown is corroborated, by how many workers,
    /// which workers disagree and which are muted.
    pub route_evidence: EvidenceDetail,
    /// The same for the caller scope's (uncertain) evidence.
    pub caller_evidence: EvidenceDetail,
    /// How fast the route's waiting intents are woken, and what was learned.
    pub pacing: PacingView,
    /// The latest limits workers reported the upstream stated, oldest
    /// first, whatever their verdict (bounded).
    pub stated_recent: Vec<crate::pacing::stated::Statement>,
}

impl ScopeDetail {
    /// The evidence of the level whose cooldown is in force
    /// ([`crate::hints::in_force`]): how well that cooldown is supported.
    pub fn evidence_in_force(&self) -> &EvidenceDetail {
        crate::hints::in_force(
            Some((self.route_cooldown_until_ms, &self.route_evidence)),
            Some((self.caller_cooldown_until_ms, &self.caller_evidence)),
        )
        .unwrap_or(&self.route_evidence)
    }
}

/// Scope state, shared by every request of the coordinator.
pub trait Store: Send + Sync + 'static {
    /// Grants up to `ask.want` tokens of `scope` (none while frozen) and
    /// records the lease. A new scope is charged to `ask.tenant`'s quota,
    /// and where several tokens share the caller scope its grant is also
    /// bounded by what its own reports earn; a store that keeps no quotas
    /// charges nothing.
    fn lease<'a>(
        &'a self,
        scope: &'a ScopeKey,
        ask: GrantAsk<'a>,
        policy: &'a Policy,
    ) -> StoreFuture<'a, LeaseOutcome>;

    /// Ends a lease, refunding `granted − spent + retry_successes`;
    /// returns the refund.
    fn release<'a>(&'a self, scope: &'a ScopeKey, end: LeaseEnd<'a>) -> StoreFuture<'a, u32>;

    /// Applies one worker report as one state change: deposits first
    /// attempts (they grow the budget) and successes (they narrow the
    /// backoff of the route and of its caller scope), merges every
    /// assessed hint, in order, into the cooldown and backoff of its level,
    /// and feeds the counts to the route's pacing ([`crate::pacing`]).
    /// A new scope is charged to `report.tenant`'s quota, and its first
    /// attempts are kept apart from other tokens' where several share the
    /// caller scope. Returns one [`Merge`] per hint and the route's state
    /// afterwards.
    fn report<'a>(
        &'a self,
        scope: &'a ScopeKey,
        report: ReportBatch<'a>,
        policy: &'a Policy,
    ) -> StoreFuture<'a, Reported>;

    /// Gives an intent a slot after the route's floor (and `ask.floor_ms`,
    /// the worker's own not-before) at the route's learned or pinned wake
    /// rate (`policy.pacing`), advancing the route's cursor; or tells it to
    /// ask again when its slot would lie beyond the policy's horizon. A new
    /// scope is charged to `ask.tenant`'s quota.
    fn reconsider<'a>(
        &'a self,
        route: &'a RouteKey,
        ask: SlotAsk<'a>,
        policy: &'a Policy,
    ) -> StoreFuture<'a, Slotted>;

    /// The route's effective state; an unknown route has the empty state
    /// (and reading it creates nothing).
    fn view<'a>(&'a self, route: &'a RouteKey, now_ms: i64) -> StoreFuture<'a, RouteView>;

    /// Freezes (`Some(reason)`) or unfreezes a route. For the Admin API.
    fn set_freeze<'a>(
        &'a self,
        route: &'a RouteKey,
        reason: Option<String>,
        now_ms: i64,
    ) -> StoreFuture<'a, ()>;

    /// Mutes `worker_id`'s evidence on `route` and on its caller scope
    /// until `until_ms` (`None` lifts the mute): its hints are still
    /// recorded but move no cooldown. A mute survives a reset and keeps
    /// the state alive until it lapses. Returns false when a level's mute
    /// list is full ([`crate::hints::corroboration::MAX_MUTES`]).
    fn set_mute<'a>(
        &'a self,
        route: &'a RouteKey,
        worker_id: &'a str,
        until_ms: Option<i64>,
        now_ms: i64,
    ) -> StoreFuture<'a, bool>;

    /// Routes matching `filter` in key order, strictly after `after`, at
    /// most `limit` of them. For the Admin API; reading creates nothing.
    fn list_scopes<'a>(
        &'a self,
        filter: &'a ScopeFilter,
        after: Option<&'a RouteKey>,
        limit: usize,
        now_ms: i64,
    ) -> StoreFuture<'a, ScopePage>;

    /// One route's live state with its budget at `policy`; `None` when the
    /// store holds nothing for it. Reading creates nothing.
    fn scope_detail<'a>(
        &'a self,
        route: &'a RouteKey,
        policy: &'a Policy,
        now_ms: i64,
    ) -> StoreFuture<'a, Option<ScopeDetail>>;

    /// Forgets a route's budget window, leases, cooldown, backoff and slot
    /// cursor, keeping its freeze (unfreezing is its own decision). Leases
    /// granted before are forgotten: releasing one is NOT_FOUND, and the
    /// tokens in workers' hands are spent against nothing. Returns whether
    /// the route was known. Caller-scope evidence is left alone: it covers
    /// other routes too.
    fn reset_scope<'a>(&'a self, route: &'a RouteKey, now_ms: i64) -> StoreFuture<'a, bool>;

    /// Forgets scopes untouched for `idle_ms` that hold nothing live (no
    /// unexpired lease, waiting intent, cooldown or freeze); returns how many.
    fn evict_idle(&self, now_ms: i64, idle_ms: i64) -> StoreFuture<'_, usize>;

    /// Occupancy of a bounded scope table; `None` for a store whose bound is
    /// elsewhere (Redis: its own memory limit and key expiry).
    fn counts(&self) -> Option<ScopeCounts> {
        None
    }

    /// What each token with a quota holds of a bounded scope table; empty
    /// for a store that keeps no quotas (Redis).
    fn owner_counts(&self) -> Vec<OwnerCounts> {
        Vec::new()
    }

    /// Whether the store can serve now; the server's health check reports
    /// NOT_SERVING while it fails. Always healthy for an embedded store.
    fn health(&self) -> StoreFuture<'_, ()> {
        Box::pin(std::future::ready(Ok(())))
    }

    /// Where the runtime control state (policies, freezes, audit) is
    /// shared with other replicas; `None` for a store only this process
    /// uses, whose runtime state is the process's own.
    fn control_state(&self) -> Option<&dyn ControlStateStore> {
        None
    }
}

#[cfg(test)]
pub(crate) mod contract;
