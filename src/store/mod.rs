//! Where scope state lives, behind one async trait.
//!
//! The trait's operations are the state changes that must be atomic per
//! scope — grant a lease (take tokens), release one, deposit first attempts,
//! merge a cooldown, advance a slot cursor, freeze — so a shared store (Redis,
//! later) can run each one as a single server-side script and replicas stay
//! stateless. The decision math itself lives in the pure modules
//! ([`crate::budget`], [`crate::evidence`], [`crate::slots`]); a store only
//! applies it to the state it holds.
//!
//! Time is passed in (`now_ms`, from the service's injected clock) instead of
//! being read here, so the in-memory store is deterministic under test.
//!
//! Futures are boxed (`StoreFuture`) so the trait is object-safe and the
//! server holds an `Arc<dyn Store>`, chosen at start (limitador's shape).

pub mod memory;

use std::future::Future;
use std::pin::Pin;

use crate::budget::{BudgetError, BudgetSnapshot, Grant, GrantAsk};
use crate::evidence::{Assessment, HintRecord, Merge};
use crate::policy::{Pattern, Policy};
use crate::scope::{EvidenceLevel, RouteKey, ScopeKey};
use crate::slots::{SlotAsk, SlotError};

pub use memory::MemoryStore;

/// A boxed store operation.
pub type StoreFuture<'a, T> = Pin<Box<dyn Future<Output = Result<T, StoreError>> + Send + 'a>>;

/// Why a store operation failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum StoreError {
    /// The bounded number of scopes is reached. Nothing is evicted inline
    /// (that would let a flood of invented names push out live scopes); the
    /// server's sweeper frees idle ones periodically.
    #[error("scope limit reached ({max} scopes); idle scopes are evicted periodically")]
    ScopeLimit {
        /// The configured bound.
        max: usize,
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
pub struct ScopeView {
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
    pub view: ScopeView,
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
}

impl Default for ScopeFilter {
    fn default() -> Self {
        ScopeFilter {
            caller_scope: Pattern::Any,
            route: Pattern::Any,
            frozen_only: false,
        }
    }
}

/// One line of a scope listing: enough to pick the scope to look at.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ScopeSummary {
    /// The route.
    pub route: RouteKey,
    /// Its effective state (cooldown, floor, freeze).
    pub view: ScopeView,
    /// Leases granted and neither released nor expired.
    pub leases_outstanding: usize,
    /// Intents holding a slot still ahead.
    pub waiting: usize,
    /// When any operation last touched the route.
    pub last_touched_ms: i64,
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
}

/// Scope state, shared by every request of the coordinator.
pub trait Store: Send + Sync + 'static {
    /// Grants up to `ask.want` tokens of `scope` (none while frozen) and
    /// records the lease.
    fn lease<'a>(
        &'a self,
        scope: &'a ScopeKey,
        ask: GrantAsk<'a>,
        policy: &'a Policy,
    ) -> StoreFuture<'a, LeaseOutcome>;

    /// Ends a lease, refunding `granted − spent`; returns the refund.
    fn release<'a>(
        &'a self,
        scope: &'a ScopeKey,
        worker_id: &'a str,
        lease_id: &'a str,
        spent: u32,
        now_ms: i64,
    ) -> StoreFuture<'a, u32>;

    /// Deposits first attempts (they grow the budget) and successes (they
    /// narrow the backoff of the route and of its caller scope).
    #[allow(clippy::too_many_arguments)]
    fn deposit<'a>(
        &'a self,
        scope: &'a ScopeKey,
        worker_id: &'a str,
        first_attempts: u32,
        successes: u32,
        policy: &'a Policy,
        now_ms: i64,
    ) -> StoreFuture<'a, ()>;

    /// Merges one piece of assessed evidence into the cooldown and backoff
    /// of `level`.
    fn merge_evidence<'a>(
        &'a self,
        level: &'a EvidenceLevel,
        assessment: &'a Assessment,
        policy: &'a Policy,
        now_ms: i64,
    ) -> StoreFuture<'a, Merge>;

    /// Gives an intent a slot after the route's floor (and `ask.floor_ms`,
    /// the worker's own not-before), advancing the route's cursor.
    fn reconsider<'a>(
        &'a self,
        route: &'a RouteKey,
        ask: SlotAsk<'a>,
        policy: &'a Policy,
    ) -> StoreFuture<'a, (Reconsidered, ScopeView)>;

    /// The route's effective state; an unknown route has the empty state
    /// (and reading it creates nothing).
    fn view<'a>(&'a self, route: &'a RouteKey, now_ms: i64) -> StoreFuture<'a, ScopeView>;

    /// Freezes (`Some(reason)`) or unfreezes a route. For the Admin API.
    fn set_freeze<'a>(
        &'a self,
        route: &'a RouteKey,
        reason: Option<String>,
        now_ms: i64,
    ) -> StoreFuture<'a, ()>;

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
}

/// The contract every [`Store`] backend must honour, as one test suite a
/// backend instantiates with `contract_tests!(constructor)`.
#[cfg(test)]
macro_rules! contract_tests {
    ($make:expr) => {
        use crate::budget::{GrantAsk, GrantLimit};
        use crate::evidence::{EvidenceInput, assess};
        use crate::policy::Policy;
        use crate::scope::{EvidenceLevel, Priority, RetryClass, RouteKey, ScopeKey};
        use crate::slots::SlotAsk;
        use crate::store::{Reconsidered, Store, StoreError};

        const T0: i64 = 1_700_000_000_000;

        fn store() -> Box<dyn Store> {
            Box::new($make)
        }

        fn scope(caller: &str, route: &str) -> ScopeKey {
            ScopeKey::new(caller, route, Priority::Critical)
        }

        fn ask(worker: &str, want: u32, now_ms: i64) -> GrantAsk<'_> {
            GrantAsk {
                worker_id: worker,
                priority: Priority::Critical,
                retry_class: RetryClass::Transient,
                want,
                now_ms,
            }
        }

        fn slot_ask(intent: &str, now_ms: i64) -> SlotAsk<'_> {
            SlotAsk {
                intent_id: intent,
                floor_ms: 0,
                deadline_ms: i64::MAX,
                reserve_ms: 0,
                now_ms,
                jitter_ppm: 0,
            }
        }

        #[tokio::test]
        async fn leases_take_tokens_and_release_returns_them() {
            let s = store();
            let p = Policy::default();
            let key = scope("c", "r");
            let first = s.lease(&key, ask("w", 40, T0), &p).await.expect("lease");
            assert_eq!(first.grant.granted, 40);
            let id = first.lease_id.expect("an id when granted");
            let second = s.lease(&key, ask("w", 40, T0), &p).await.expect("lease");
            assert_eq!(second.grant.granted, 10);
            assert_eq!(s.release(&key, "w", &id, 15, T0).await, Ok(25));
            assert!(matches!(
                s.release(&key, "w", &id, 0, T0).await,
                Err(StoreError::Budget(_))
            ));
        }

        #[tokio::test]
        async fn a_cooldown_reaches_every_priority_and_slots_follow_it() {
            let s = store();
            let p = Policy::default();
            let key = scope("c", "r");
            let input = EvidenceInput {
                http_status: 429,
                retry_after: Some("30"),
                receipt_ms: T0,
                ..EvidenceInput::default()
            };
            let a = assess(&input, &p, T0);
            let m = s
                .merge_evidence(&EvidenceLevel::Route(key.route.clone()), &a, &p, T0)
                .await
                .expect("merge");
            assert!(m.raised);
            let bulk = ScopeKey::new("c", "r", Priority::Bulk);
            let leased = s
                .lease(
                    &bulk,
                    GrantAsk {
                        priority: Priority::Bulk,
                        ..ask("w", 1, T0)
                    },
                    &p,
                )
                .await
                .expect("lease");
            assert_eq!(leased.view.cooldown_until_ms, T0 + 30_000);
            let (slot, _) = s
                .reconsider(&key.route, slot_ask("i", T0), &p)
                .await
                .expect("slot");
            assert_eq!(slot, Reconsidered::Slot(T0 + 30_000));
        }

        #[tokio::test]
        async fn uncertain_evidence_covers_the_whole_caller_scope() {
            let s = store();
            let p = Policy::default();
            let input = EvidenceInput {
                http_status: 429,
                retry_after: Some("20"),
                receipt_ms: T0,
                ..EvidenceInput::default()
            };
            let a = assess(&input, &p, T0);
            s.merge_evidence(&EvidenceLevel::Caller("c".into()), &a, &p, T0)
                .await
                .expect("merge");
            let other_route = RouteKey {
                caller_scope: "c".into(),
                route: "other".into(),
            };
            let view = s.view(&other_route, T0).await.expect("view");
            assert_eq!(view.cooldown_until_ms, T0 + 20_000);
            let other_caller = RouteKey {
                caller_scope: "d".into(),
                route: "other".into(),
            };
            assert_eq!(
                s.view(&other_caller, T0)
                    .await
                    .expect("view")
                    .cooldown_until_ms,
                0
            );
        }

        #[tokio::test]
        async fn a_frozen_scope_grants_nothing_and_gives_no_slot() {
            let s = store();
            let p = Policy::default();
            let key = scope("c", "r");
            s.set_freeze(&key.route, Some("incident".into()), T0)
                .await
                .expect("freeze");
            let leased = s.lease(&key, ask("w", 5, T0), &p).await.expect("lease");
            assert_eq!(leased.grant.granted, 0);
            assert_eq!(leased.grant.limit, GrantLimit::Frozen);
            let (r, _) = s
                .reconsider(&key.route, slot_ask("i", T0), &p)
                .await
                .expect("slot");
            assert_eq!(r, Reconsidered::Frozen);
        }

        #[tokio::test]
        async fn scopes_are_listed_in_pages_and_filtered() {
            use crate::policy::Pattern;
            use crate::store::ScopeFilter;
            let s = store();
            let p = Policy::default();
            for route in ["r1", "r2", "r3"] {
                s.deposit(&scope("c", route), "w", 1, 0, &p, T0)
                    .await
                    .expect("deposit");
            }
            s.deposit(&scope("d", "r1"), "w", 1, 0, &p, T0)
                .await
                .expect("deposit");
            let all = ScopeFilter::default();
            let first = s.list_scopes(&all, None, 3, T0).await.expect("list");
            assert_eq!(first.scopes.len(), 3);
            let next = first.next.expect("a second page");
            let second = s.list_scopes(&all, Some(&next), 3, T0).await.expect("list");
            assert_eq!(second.scopes.len(), 1);
            assert_eq!(second.next, None);
            assert_eq!(second.scopes[0].route.caller_scope, "d");
            let only_c = ScopeFilter {
                caller_scope: Pattern::parse("c"),
                route: Pattern::parse("r*"),
                frozen_only: false,
            };
            let page = s.list_scopes(&only_c, None, 10, T0).await.expect("list");
            assert_eq!(page.scopes.len(), 3);
            s.set_freeze(&scope("c", "r2").route, Some("x".into()), T0)
                .await
                .expect("freeze");
            let frozen = ScopeFilter {
                frozen_only: true,
                ..ScopeFilter::default()
            };
            let page = s.list_scopes(&frozen, None, 10, T0).await.expect("list");
            assert_eq!(page.scopes.len(), 1);
            assert_eq!(page.scopes[0].route.route, "r2");
        }

        #[tokio::test]
        async fn scope_detail_shows_balance_leases_and_the_cooldown_hint() {
            let s = store();
            let p = Policy::default();
            let key = scope("c", "r");
            assert_eq!(
                s.scope_detail(&key.route, &p, T0).await.expect("detail"),
                None
            );
            s.lease(&key, ask("w", 30, T0), &p).await.expect("lease");
            let input = EvidenceInput {
                http_status: 429,
                retry_after: Some("30"),
                receipt_ms: T0,
                ..EvidenceInput::default()
            };
            s.merge_evidence(
                &EvidenceLevel::Route(key.route.clone()),
                &assess(&input, &p, T0),
                &p,
                T0,
            )
            .await
            .expect("merge");
            let d = s
                .scope_detail(&key.route, &p, T0)
                .await
                .expect("detail")
                .expect("known");
            assert_eq!(d.summary.leases_outstanding, 1);
            assert_eq!(d.budget.tokens_outstanding, 30);
            assert_eq!(d.budget.classes[0].active_workers, 1);
            assert_eq!(d.budget.classes[0].available_milli, 50_000 - 30_000);
            assert_eq!(d.route_cooldown_until_ms, T0 + 30_000);
            assert_eq!(d.route_hints.len(), 1);
            assert_eq!(d.route_hints[0].cooldown_until_ms, Some(T0 + 30_000));
        }

        #[tokio::test]
        async fn reset_forgets_budget_and_cooldown_but_keeps_a_freeze() {
            let s = store();
            let p = Policy::default();
            let key = scope("c", "r");
            let lease = s.lease(&key, ask("w", 50, T0), &p).await.expect("lease");
            let input = EvidenceInput {
                http_status: 429,
                retry_after: Some("30"),
                receipt_ms: T0,
                ..EvidenceInput::default()
            };
            s.merge_evidence(
                &EvidenceLevel::Route(key.route.clone()),
                &assess(&input, &p, T0),
                &p,
                T0,
            )
            .await
            .expect("merge");
            s.set_freeze(&key.route, Some("incident".into()), T0)
                .await
                .expect("freeze");
            assert_eq!(s.reset_scope(&key.route, T0).await, Ok(true));
            let view = s.view(&key.route, T0).await.expect("view");
            assert_eq!(view.cooldown_until_ms, 0);
            assert_eq!(view.frozen.as_deref(), Some("incident"));
            let id = lease.lease_id.expect("granted");
            assert!(s.release(&key, "w", &id, 0, T0).await.is_err());
            s.set_freeze(&key.route, None, T0).await.expect("unfreeze");
            let again = s.lease(&key, ask("w", 50, T0), &p).await.expect("lease");
            assert_eq!(again.grant.granted, 50, "the window starts over");
            let unknown = scope("c", "never");
            assert_eq!(s.reset_scope(&unknown.route, T0).await, Ok(false));
        }

        #[tokio::test]
        async fn scopes_are_bounded_and_idle_ones_evicted() {
            let s = store(); // room for 8
            let p = Policy::default();
            for i in 0..8 {
                s.deposit(&scope("c", &format!("r{i}")), "w", 1, 0, &p, T0)
                    .await
                    .expect("room");
            }
            let err = s.deposit(&scope("c", "r8"), "w", 1, 0, &p, T0).await;
            assert_eq!(err, Err(StoreError::ScopeLimit { max: 8 }));
            assert_eq!(
                s.evict_idle(T0 + 1_000, 60_000).await,
                Ok(0),
                "not idle yet"
            );
            assert_eq!(s.evict_idle(T0 + 61_000, 60_000).await, Ok(8));
            s.deposit(&scope("c", "r8"), "w", 1, 0, &p, T0 + 61_000)
                .await
                .expect("room again");
        }
    };
}
#[cfg(test)]
pub(crate) use contract_tests;
