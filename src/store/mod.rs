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

use crate::budget::{BudgetError, Grant, GrantAsk};
use crate::evidence::{Assessment, Merge};
use crate::policy::Policy;
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
