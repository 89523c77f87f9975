//! The contract every [`Store`] backend honours, as one test suite that
//! each backend instantiates (`contract_tests!`): the in-memory store, Redis
//! and Redis Cluster run the same cases, which is what proves the Lua port
//! and the Rust modules agree.

pub(crate) mod corroboration;
pub(crate) mod pacing;

use super::{ReportBatch, Store, StoreError};
use crate::scope::ScopeKey;

/// Reports `first_attempts` for `key` by worker `w` at `now_ms` (no
/// successes, no hints): the smallest state change that creates a route.
pub(crate) async fn deposit(
    s: &dyn Store,
    key: &ScopeKey,
    first_attempts: u32,
    now_ms: i64,
) -> Result<(), StoreError> {
    let batch = ReportBatch {
        worker_id: "w",
        first_attempts,
        successes: 0,
        rejections: 0,
        hints: &[],
        now_ms,
    };
    s.report(key, batch, &crate::policy::Policy::default())
        .await
        .map(drop)
}

/// A store under test and whatever must live as long as it (a Redis server
/// process), for `contract_tests!`.
pub(crate) struct Fixture {
    pub(crate) store: Box<dyn Store>,
    _guard: Box<dyn std::any::Any + Send>,
    reset: Option<Box<dyn Fn() + Send>>,
}

impl Fixture {
    pub(crate) fn new(store: impl Store, guard: impl std::any::Any + Send) -> Self {
        Fixture {
            store: Box::new(store),
            _guard: Box::new(guard),
            reset: None,
        }
    }

    /// Empties the backend between cases run on one fixture.
    pub(crate) fn with_reset(mut self, reset: impl Fn() + Send + 'static) -> Self {
        self.reset = Some(Box::new(reset));
        self
    }

    pub(crate) fn reset(&self) {
        if let Some(reset) = &self.reset {
            reset();
        }
    }
}

/// The contract every [`Store`] backend must honour, as one test suite a
/// backend instantiates with `contract_tests!(make)`, where `make` is an
/// `async fn() -> Option<Fixture>`; `None` skips (a backend whose server is
/// not installed, after saying so). Each case is its own test.
///
/// `contract_tests!(one_fixture make)` runs every case in one test on one
/// fixture, [`Fixture::reset`] between cases: for a backend whose server is
/// slow to start (a Redis Cluster node waits ~2 s before serving).
macro_rules! contract_tests {
    ($make:path) => {
        crate::store::contract::contract_tests!(@cases each $make);
    };
    (one_fixture $make:path) => {
        crate::store::contract::contract_tests!(@cases all $make);
    };
    (@each $make:path; $($name:ident),*) => {
        $(
            #[tokio::test]
            async fn $name() {
                let Some(f) = $make().await else { return };
                cases::$name(&*f.store).await;
            }
        )*
    };
    (@all $make:path; $($name:ident),*) => {
        #[tokio::test]
        async fn every_contract_case() {
            let Some(f) = $make().await else { return };
            $(
                f.reset();
                cases::$name(&*f.store).await;
            )*
        }
    };
    (@cases $mode:ident $make:path) => {
        crate::store::contract::contract_tests!(@$mode $make; leases_take_tokens_and_release_returns_them, a_cooldown_reaches_every_priority_and_slots_follow_it, uncertain_evidence_covers_the_whole_caller_scope, a_frozen_scope_grants_nothing_and_gives_no_slot, idle_scopes_are_evicted_and_live_ones_kept, first_attempts_grow_the_allowance_and_slide_out, leases_are_fair_and_expired_ones_keep_their_charge, throttled_retries_cost_more_and_classes_do_not_share, hintless_rejections_widen_the_backoff_and_successes_narrow_it, slots_are_spread_jittered_idempotent_and_deadline_checked, a_later_cooldown_voids_a_pending_slot_and_unfreezing_works, the_store_is_healthy_when_it_can_serve, scopes_are_listed_in_pages_and_filtered, scope_detail_shows_balance_leases_and_the_cooldown_hint, reset_forgets_budget_and_cooldown_but_keeps_a_freeze, one_report_deposits_and_merges_every_hint_in_order, one_enormous_hint_among_quiet_workers_reaches_only_the_cap, a_lone_claim_reaches_no_further_than_the_typical_hint, shorter_claims_do_not_corroborate_a_longer_cooldown, three_agreeing_workers_corroborate_the_full_cooldown, an_outlier_among_twenty_does_not_set_the_cooldown, uncertain_evidence_from_one_worker_does_not_broaden, a_muted_worker_moves_nothing_and_a_noisy_one_is_flagged, a_normal_only_fleet_uses_most_of_the_budget, lower_classes_never_take_criticals_reserve, a_retry_that_succeeded_earns_its_token_back, a_far_slot_is_ask_again_and_a_near_one_is_given, rejections_outside_a_cooldown_cut_the_wake_rate, a_limiter_that_rearms_its_window_is_detected, one_workers_claim_is_not_a_corroborated_cooldown, first_attempts_that_overflow_the_upstream_are_paced_too);

        /// The cases, each a function of the store under test.
        mod cases {
        pub(super) use crate::store::contract::corroboration::*;
        pub(super) use crate::store::contract::pacing::*;
        use crate::budget::{BudgetError, GrantAsk, GrantLimit, LeaseEnd};
        use crate::hints::{Assessment, EvidenceInput, Merge, assess};
        use crate::policy::{Policy, PolicySpec, WakeRate};
        use crate::scope::{EvidenceLevel, Priority, RetryClass, RouteKey, ScopeKey};
        use crate::slots::SlotAsk;
        use crate::store::{LevelHint, Reconsidered, ReportBatch, Slotted, Store, StoreError};

        const T0: i64 = 1_700_000_000_000;

        /// A pinned wake rate: slots at any distance, the cursor's own
        /// rules, nothing learned.
        fn pinned(rate: u32) -> Policy {
            Policy::try_new(&PolicySpec {
                wake_rate: Some(WakeRate::Pinned(rate)),
                ..PolicySpec::default()
            })
            .expect("valid")
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

        /// Ends lease `id` of `worker` with `spent` tokens spent, none of
        /// whose retries succeeded.
        fn end<'a>(worker: &'a str, id: &'a str, spent: u32, now_ms: i64) -> LeaseEnd<'a> {
            LeaseEnd {
                worker_id: worker,
                lease_id: id,
                spent,
                retry_successes: 0,
                now_ms,
            }
        }

        /// A report of counts only, at `now_ms`.
        async fn deposit(
            s: &dyn Store,
            key: &ScopeKey,
            worker: &str,
            first_attempts: u32,
            successes: u32,
            p: &Policy,
            now_ms: i64,
        ) -> Result<(), StoreError> {
            let batch = ReportBatch {
                worker_id: worker,
                first_attempts,
                successes,
                rejections: 0,
                hints: &[],
                now_ms,
            };
            s.report(key, batch, p).await.map(drop)
        }

        /// Reports one assessed hint at `level` (by worker `w` on a route
        /// of that level, at `T0`) and returns its merge.
        async fn merge(s: &dyn Store, level: &EvidenceLevel, a: &Assessment, p: &Policy) -> Merge {
            let key = match level {
                EvidenceLevel::Route(route) => ScopeKey {
                    route: route.clone(),
                    priority: Priority::Critical,
                },
                EvidenceLevel::Caller(caller) => scope(caller, "r"),
            };
            let hints = [LevelHint {
                caller_wide: matches!(level, EvidenceLevel::Caller(_)),
                assessment: a.clone(),
            }];
            let batch = ReportBatch {
                worker_id: "w",
                first_attempts: 0,
                successes: 0,
                rejections: 0,
                hints: &hints,
                now_ms: T0,
            };
            let reported = s.report(&key, batch, p).await.expect("report");
            reported.merges[0]
        }

        /// Merges a 429 with `Retry-After: hint`, received at `T0`, at `level`.
        async fn merge_429(s: &dyn Store, level: EvidenceLevel, hint: &str, p: &Policy) -> Merge {
            let input = EvidenceInput {
                http_status: 429,
                retry_after: Some(hint),
                receipt_ms: T0,
                ..EvidenceInput::default()
            };
            merge(s, &level, &assess(&input, p, T0), p).await
        }

        fn slot_ask(intent: &str, now_ms: i64) -> SlotAsk<'_> {
            SlotAsk {
                intent_id: intent,
                floor_ms: 0,
                deadline_ms: i64::MAX,
                reserve_ms: 0,
                now_ms,
                jitter_ppm: 0,
                first_attempt: false,
            }
        }

        pub(super) async fn leases_take_tokens_and_release_returns_them(s: &dyn Store) {
            let p = Policy::default();
            let key = scope("c", "r");
            // Critical alone may spend the whole allowance: 100 tokens.
            let first = s.lease(&key, ask("w", 80, T0), &p).await.expect("lease");
            assert_eq!(first.grant.granted, 80);
            let id = first.lease_id.expect("an id when granted");
            let second = s.lease(&key, ask("w", 40, T0), &p).await.expect("lease");
            assert_eq!(second.grant.granted, 20);
            assert_eq!(s.release(&key, end("w", &id, 15, T0)).await, Ok(65));
            assert!(matches!(
                s.release(&key, end("w", &id, 0, T0)).await,
                Err(StoreError::Budget(_))
            ));
        }

        pub(super) async fn a_cooldown_reaches_every_priority_and_slots_follow_it(s: &dyn Store) {
            let p = pinned(50);
            let key = scope("c", "r");
            let m = merge_429(s, EvidenceLevel::Route(key.route.clone()), "30", &p).await;
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
            let slot = s
                .reconsider(&key.route, slot_ask("i", T0), &p)
                .await
                .expect("slot").decided;
            assert_eq!(slot, Reconsidered::Slot(T0 + 30_000));
        }

        pub(super) async fn uncertain_evidence_covers_the_whole_caller_scope(s: &dyn Store) {
            let p = Policy::default();
            merge_429(s, EvidenceLevel::Caller("c".into()), "20", &p).await;
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

        pub(super) async fn a_frozen_scope_grants_nothing_and_gives_no_slot(s: &dyn Store) {
            let p = Policy::default();
            let key = scope("c", "r");
            s.set_freeze(&key.route, Some("incident".into()), T0)
                .await
                .expect("freeze");
            let leased = s.lease(&key, ask("w", 5, T0), &p).await.expect("lease");
            assert_eq!(leased.grant.granted, 0);
            assert_eq!(leased.grant.limit, GrantLimit::Frozen);
            let r = s
                .reconsider(&key.route, slot_ask("i", T0), &p)
                .await
                .expect("slot").decided;
            assert_eq!(r, Reconsidered::Frozen);
        }

        pub(super) async fn scopes_are_listed_in_pages_and_filtered(s: &dyn Store) {
            use crate::policy::Pattern;
            use crate::store::ScopeFilter;
            let p = Policy::default();
            for route in ["r1", "r2", "r3"] {
                deposit(s, &scope("c", route), "w", 1, 0, &p, T0).await.expect("deposit");
            }
            deposit(s, &scope("d", "r1"), "w", 1, 0, &p, T0).await.expect("deposit");
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

        pub(super) async fn scope_detail_shows_balance_leases_and_the_cooldown_hint(s: &dyn Store) {
            let p = Policy::default();
            let key = scope("c", "r");
            assert_eq!(
                s.scope_detail(&key.route, &p, T0).await.expect("detail"),
                None
            );
            s.lease(&key, ask("w", 30, T0), &p).await.expect("lease");
            merge_429(s, EvidenceLevel::Route(key.route.clone()), "30", &p).await;
            let d = s
                .scope_detail(&key.route, &p, T0)
                .await
                .expect("detail")
                .expect("known");
            assert_eq!(d.summary.leases_outstanding, 1);
            assert_eq!(d.budget.tokens_outstanding, 30);
            assert_eq!(d.budget.classes[0].active_workers, 1);
            assert_eq!(d.budget.classes[0].allowance_milli, 100_000);
            assert_eq!(d.budget.classes[0].available_milli, 100_000 - 30_000);
            // Normal may not touch critical's 0.2 reserve, and critical's
            // lease came out of the normal and bulk shares first.
            assert_eq!(d.budget.classes[1].allowance_milli, 80_000);
            assert_eq!(d.budget.classes[1].available_milli, 70_000);
            assert_eq!(d.budget.classes[2].available_milli, 20_000);
            assert_eq!(d.route_cooldown_until_ms, T0 + 30_000);
            assert_eq!(d.route_hints.len(), 1);
            assert_eq!(d.route_hints[0].cooldown_until_ms, Some(T0 + 30_000));
        }

        pub(super) async fn reset_forgets_budget_and_cooldown_but_keeps_a_freeze(s: &dyn Store) {
            let p = Policy::default();
            let key = scope("c", "r");
            let lease = s.lease(&key, ask("w", 50, T0), &p).await.expect("lease");
            merge_429(s, EvidenceLevel::Route(key.route.clone()), "30", &p).await;
            s.set_freeze(&key.route, Some("incident".into()), T0)
                .await
                .expect("freeze");
            assert_eq!(s.reset_scope(&key.route, T0).await, Ok(true));
            let view = s.view(&key.route, T0).await.expect("view");
            assert_eq!(view.cooldown_until_ms, 0);
            assert_eq!(view.frozen.as_deref(), Some("incident"));
            let id = lease.lease_id.expect("granted");
            assert!(s.release(&key, end("w", &id, 0, T0)).await.is_err());
            s.set_freeze(&key.route, None, T0).await.expect("unfreeze");
            let again = s.lease(&key, ask("w", 50, T0), &p).await.expect("lease");
            assert_eq!(again.grant.granted, 50, "the window starts over");
            let unknown = scope("c", "never");
            assert_eq!(s.reset_scope(&unknown.route, T0).await, Ok(false));
        }

        pub(super) async fn idle_scopes_are_evicted_and_live_ones_kept(s: &dyn Store) {
            let p = Policy::default();
            for i in 0..3 {
                deposit(s, &scope("c", &format!("r{i}")), "w", 1, 0, &p, T0).await.expect("deposit");
            }
            let frozen = scope("c", "frozen");
            s.set_freeze(&frozen.route, Some("incident".into()), T0)
                .await
                .expect("freeze");
            let cooling = scope("c", "cooling");
            merge_429(s, EvidenceLevel::Route(cooling.route.clone()), "120", &p).await;
            assert_eq!(
                s.evict_idle(T0 + 1_000, 60_000).await,
                Ok(0),
                "not idle yet"
            );
            assert_eq!(s.evict_idle(T0 + 61_000, 60_000).await, Ok(3));
            assert_eq!(
                s.view(&cooling.route, T0 + 61_000)
                    .await
                    .expect("view")
                    .cooldown_until_ms,
                T0 + 120_000,
                "a cooldown still running keeps its scope"
            );
            let view = s.view(&frozen.route, T0 + 61_000).await.expect("view");
            assert_eq!(view.frozen.as_deref(), Some("incident"));
            assert_eq!(s.evict_idle(T0 + 200_000, 60_000).await, Ok(1));
        }

        pub(super) async fn first_attempts_grow_the_allowance_and_slide_out(s: &dyn Store) {
            let p = Policy::default(); // 10/s × 10 s floor, ratio 0.2
            let key = scope("c", "r");
            deposit(s, &key, "w", 250, 0, &p, T0).await.expect("deposit");
            // critical alone reaches the whole allowance: 100 + 0.2 × 250
            let g = s.lease(&key, ask("w", 1000, T0), &p).await.expect("lease");
            assert_eq!(g.grant.granted, 150);
            assert_eq!(g.grant.limit, GrantLimit::BudgetExhausted);
            assert_eq!(g.grant.remaining, 0);
            assert_eq!(g.grant.expires_at_ms, T0 + p.lease_ttl_ms as i64);
            // A window later the deposit and the charge have slid out.
            let later = T0 + 10_000;
            let g = s
                .lease(&key, ask("w", 1000, later), &p)
                .await
                .expect("lease");
            assert_eq!(g.grant.granted, 100);
        }

        pub(super) async fn leases_are_fair_and_expired_ones_keep_their_charge(s: &dyn Store) {
            let p = Policy::default(); // 100 tokens critical may reach
            let key = scope("c", "r");
            for i in 0..9 {
                deposit(s, &key, &format!("m{i}"), 0, 0, &p, T0).await.expect("deposit");
            }
            let greedy = s
                .lease(&key, ask("greedy", 1000, T0), &p)
                .await
                .expect("lease");
            assert_eq!(greedy.grant.granted, 10, "an equal share of 100 among 10");
            assert_eq!(greedy.grant.limit, GrantLimit::FairShare);
            let id = greedy.lease_id.expect("id");
            assert!(matches!(
                s.release(&key, end("someone-else", &id, 0, T0)).await,
                Err(StoreError::Budget(_))
            ));
            assert!(matches!(
                s.release(&key, end("greedy", &id, 11, T0)).await,
                Err(StoreError::Budget(BudgetError::SpentExceedsGrant {
                    spent: 11,
                    granted: 10
                }))
            ));
            let expired = T0 + p.lease_ttl_ms as i64;
            assert!(matches!(
                s.release(&key, end("greedy", &id, 0, expired)).await,
                Err(StoreError::Budget(_))
            ));
            assert!(matches!(
                s.release(&scope("c", "unknown"), end("w", "nope", 0, T0)).await,
                Err(StoreError::Budget(_))
            ));
        }

        pub(super) async fn throttled_retries_cost_more_and_classes_do_not_share(s: &dyn Store) {
            let p = Policy::default();
            let key = scope("c", "r");
            // 30 throttled retries cost 60 of the 100 tokens.
            let g = s
                .lease(
                    &key,
                    GrantAsk {
                        retry_class: RetryClass::Throttled,
                        ..ask("w", 30, T0)
                    },
                    &p,
                )
                .await
                .expect("lease");
            assert_eq!(g.grant.granted, 30);
            assert_eq!(g.grant.remaining, 20, "40 tokens left, 2 a retry");
            let bulk = ScopeKey::new("c", "r", Priority::Bulk);
            let g = s
                .lease(
                    &bulk,
                    GrantAsk {
                        priority: Priority::Bulk,
                        ..ask("w", 100, T0)
                    },
                    &p,
                )
                .await
                .expect("lease");
            assert_eq!(g.grant.granted, 20, "bulk's own 0.2 share");
        }

        /// Shares borrow down, never up: a fleet sending only normal work
        /// reaches everything but critical's reserve.
        pub(super) async fn a_normal_only_fleet_uses_most_of_the_budget(s: &dyn Store) {
            let p = Policy::default(); // 100 tokens; critical's reserve 0.2
            let normal = ScopeKey::new("c", "r", Priority::Normal);
            let g = s
                .lease(&normal, GrantAsk { priority: Priority::Normal, ..ask("w", 1000, T0) }, &p)
                .await
                .expect("lease");
            assert_eq!(g.grant.granted, 80, "at least 80 % of the formula");
            assert_eq!(g.grant.limit, GrantLimit::BudgetExhausted);
            let critical = s.lease(&scope("c", "r"), ask("w", 1000, T0), &p).await.expect("lease");
            assert_eq!(critical.grant.granted, 20, "critical's reserve is intact");
        }

        /// Neither an exhausting bulk class nor a greedy normal one can
        /// take critical's reserve, whichever asks first.
        pub(super) async fn lower_classes_never_take_criticals_reserve(s: &dyn Store) {
            let p = &Policy::default();
            let lease = |route: &'static str, priority: Priority| async move {
                let key = ScopeKey::new("c", route, priority);
                s.lease(&key, GrantAsk { priority, ..ask("w", 1000, T0) }, p)
                    .await
                    .expect("lease")
                    .grant
                    .granted
            };
            // Bulk first: its own 0.2; normal then the rest but critical's.
            assert_eq!(lease("a", Priority::Bulk).await, 20);
            assert_eq!(lease("a", Priority::Normal).await, 60);
            assert_eq!(lease("a", Priority::Critical).await, 20);
            // Greedy normal first: bulk finds its share borrowed, and
            // critical still finds its reserve.
            assert_eq!(lease("b", Priority::Normal).await, 80);
            assert_eq!(lease("b", Priority::Bulk).await, 0);
            assert_eq!(lease("b", Priority::Critical).await, 20);
        }

        /// A retry that succeeded earns its token back (the budget bounds
        /// failing retries); successes beyond what was spent are refused.
        pub(super) async fn a_retry_that_succeeded_earns_its_token_back(s: &dyn Store) {
            let p = Policy::default();
            let key = scope("c", "r");
            let g = s.lease(&key, ask("w", 100, T0), &p).await.expect("lease");
            assert_eq!(g.grant.granted, 100);
            let id = g.lease_id.expect("id");
            let too_many = LeaseEnd { retry_successes: 11, ..end("w", &id, 10, T0) };
            assert!(matches!(
                s.release(&key, too_many).await,
                Err(StoreError::Budget(BudgetError::SuccessesExceedSpent {
                    successes: 11,
                    spent: 10
                }))
            ));
            let ok = LeaseEnd { retry_successes: 4, ..end("w", &id, 10, T0) };
            assert_eq!(s.release(&key, ok).await, Ok(94), "90 unspent + 4 that succeeded");
            let again = s.lease(&key, ask("w", 1000, T0), &p).await.expect("lease");
            assert_eq!(again.grant.granted, 94, "only the 6 failed retries stay spent");
        }

        pub(super) async fn hintless_rejections_widen_the_backoff_and_successes_narrow_it(s: &dyn Store) {
            let p = Policy::default();
            let key = scope("c", "r");
            let level = EvidenceLevel::Route(key.route.clone());
            let input = EvidenceInput {
                http_status: 503,
                retry_after: Some("junk"),
                receipt_ms: T0,
                ..EvidenceInput::default()
            };
            let a = assess(&input, &p, T0);
            let mut steps = Vec::new();
            for _ in 0..3 {
                let m = merge(s, &level, &a, &p).await;
                assert!(!m.raised);
                steps.push(m.backoff_ms);
            }
            assert_eq!(
                steps,
                [
                    p.backoff_base_ms,
                    2 * p.backoff_base_ms,
                    4 * p.backoff_base_ms
                ]
            );
            let view = s.view(&key.route, T0).await.expect("view");
            assert_eq!(view.cooldown_until_ms, 0);
            assert_eq!(view.floor_ms, T0 + 4 * p.backoff_base_ms as i64);
            deposit(s, &key, "w", 0, 2, &p, T0).await.expect("deposit");
            let m = merge(s, &level, &a, &p).await;
            assert_eq!(
                m.backoff_ms,
                4 * p.backoff_base_ms,
                "a report with successes narrows by one step, then one more rejection"
            );
        }

        pub(super) async fn slots_are_spread_jittered_idempotent_and_deadline_checked(s: &dyn Store) {
            let p = pinned(50);
            let route = scope("c", "r").route;
            let rate = 50;
            let interval = 1_000_000i64.div_euclid(rate) / 1000; // ms, for rates dividing 1e6
            // A floor ahead of now, so the slots are still pending when asked again.
            let at = |intent| SlotAsk {
                floor_ms: T0 + 1_000,
                ..slot_ask(intent, T0)
            };
            let a = s.reconsider(&route, at("a"), &p).await.expect("slot").decided;
            assert_eq!(a, Reconsidered::Slot(T0 + 1_000));
            let again = SlotAsk {
                jitter_ppm: 999_999,
                ..at("a")
            };
            let again = s.reconsider(&route, again, &p).await.expect("slot").decided;
            assert_eq!(again, a, "asking again while pending: the same slot");
            let late = SlotAsk {
                deadline_ms: T0 + 1_000 + interval,
                reserve_ms: 1,
                ..at("late")
            };
            let refused = s.reconsider(&route, late, &p).await.expect("slot").decided;
            assert_eq!(
                refused,
                Reconsidered::DeadlineInfeasible(T0 + 1_000 + interval)
            );
            let half = SlotAsk {
                jitter_ppm: 500_000,
                ..at("b")
            };
            let b = s.reconsider(&route, half, &p).await.expect("slot").decided;
            assert_eq!(
                b,
                Reconsidered::Slot(T0 + 1_000 + interval + interval / 2),
                "the refusal took no interval; jitter places the slot inside its own"
            );
        }

        pub(super) async fn a_later_cooldown_voids_a_pending_slot_and_unfreezing_works(s: &dyn Store) {
            let p = pinned(50);
            let key = scope("c", "r");
            let first = s
                .reconsider(&key.route, slot_ask("i", T0), &p)
                .await
                .expect("slot").decided;
            assert_eq!(first, Reconsidered::Slot(T0));
            merge_429(s, EvidenceLevel::Caller("c".into()), "10", &p).await;
            let Slotted { decided: moved, view: view, .. } = s
                .reconsider(&key.route, slot_ask("i", T0), &p)
                .await
                .expect("slot");
            assert_eq!(moved, Reconsidered::Slot(T0 + 10_000));
            assert_eq!(view.cooldown_until_ms, T0 + 10_000);
            s.set_freeze(&key.route, Some("x".into()), T0)
                .await
                .expect("freeze");
            s.set_freeze(&key.route, None, T0).await.expect("unfreeze");
            let leased = s.lease(&key, ask("w", 1, T0), &p).await.expect("lease");
            assert_eq!(leased.grant.granted, 1);
            assert_eq!(leased.view.frozen, None);
        }

        pub(super) async fn one_report_deposits_and_merges_every_hint_in_order(s: &dyn Store) {
            let p = Policy::default();
            let key = scope("c", "r");
            let hint = |caller_wide: bool, retry_after: &'static str| {
                let input = EvidenceInput {
                    http_status: 429,
                    retry_after: Some(retry_after),
                    receipt_ms: T0,
                    ..EvidenceInput::default()
                };
                LevelHint {
                    caller_wide,
                    assessment: assess(&input, &p, T0),
                }
            };
            // The third hint asks for less than the route already has.
            let hints = [hint(false, "30"), hint(true, "50"), hint(false, "20")];
            let batch = ReportBatch {
                worker_id: "w",
                first_attempts: 100,
                successes: 1,
                rejections: 0,
                hints: &hints,
                now_ms: T0,
            };
            let reported = s.report(&key, batch, &p).await.expect("report");
            let merges: Vec<(bool, i64)> = reported
                .merges
                .iter()
                .map(|m| (m.raised, m.cooldown_until_ms))
                .collect();
            assert_eq!(
                merges,
                [(true, T0 + 30_000), (true, T0 + 50_000), (false, T0 + 30_000)]
            );
            assert_eq!(reported.view.cooldown_until_ms, T0 + 50_000);
            let detail = s
                .scope_detail(&key.route, &p, T0)
                .await
                .expect("detail")
                .expect("the report created the route");
            assert_eq!(detail.budget.first_attempts, 100);
            assert_eq!(detail.route_cooldown_until_ms, T0 + 30_000);
            assert_eq!(detail.caller_cooldown_until_ms, T0 + 50_000);
            assert_eq!(detail.route_hints.len(), 2);
            assert_eq!(detail.caller_hints.len(), 1);
        }

        pub(super) async fn the_store_is_healthy_when_it_can_serve(s: &dyn Store) {
            assert_eq!(s.health().await, Ok(()));
        }
        }
    };
}
pub(crate) use contract_tests;
