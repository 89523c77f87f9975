//! The contract every [`Store`] backend honours, as one test suite that
//! each backend instantiates (`contract_tests!`): the in-memory store, Redis
//! and Redis Cluster run the same cases, which is what proves that the
//! decisions made in Rust (the budget, hints, slots, pacing) read and write
//! the same state on every backend, and that the Redis scripts take and
//! count atomically what those decisions allow. The cases live in submodules grouped by what
//! they exercise (`budget`, `cooldowns`, `admin`, `corroboration`,
//! `pacing`, `stated`); `common` holds the helpers the first three share.
//! The scope quotas of caller tokens (`quotas`) need a store made with
//! tokens, so a backend runs them apart (`quota_tests!`).

pub(crate) mod admin;
pub(crate) mod budget;
mod common;
pub(crate) mod cooldowns;
pub(crate) mod corroboration;
pub(crate) mod pacing;
pub(crate) mod quotas;
pub(crate) mod stated;

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
        first_attempts,
        ..ReportBatch::empty("w", now_ms)
    };
    s.report(key, batch, &crate::policy::Policy::default())
        .await
        .map(drop)
}

/// Reports `first_attempts` for `key` by `worker` at `now_ms` under
/// `policy`: makes the worker one of the route's active workers.
pub(crate) async fn deposit_as(
    s: &dyn Store,
    key: &ScopeKey,
    worker: &str,
    first_attempts: u32,
    now_ms: i64,
    policy: &crate::policy::Policy,
) {
    let batch = ReportBatch {
        first_attempts,
        ..ReportBatch::empty(worker, now_ms)
    };
    s.report(key, batch, policy).await.expect("report");
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
        crate::store::contract::contract_tests!(@$mode $make; leases_take_tokens_and_release_returns_them, lease_ids_reveal_no_counter, a_cooldown_reaches_every_priority_and_slots_follow_it, uncertain_evidence_covers_the_whole_caller_scope, a_frozen_scope_grants_nothing_and_gives_no_slot, idle_scopes_are_evicted_and_live_ones_kept, first_attempts_grow_the_allowance_and_slide_out, leases_are_fair_and_expired_ones_keep_their_charge, a_fleet_larger_than_the_budget_still_gets_one_token_each, throttled_retries_cost_more_and_classes_do_not_share, hintless_rejections_widen_the_backoff_and_successes_narrow_it, slots_are_spread_jittered_idempotent_and_deadline_checked, a_later_cooldown_voids_a_pending_slot_and_unfreezing_works, a_store_that_serves_reports_itself_healthy, scopes_are_listed_in_pages_and_filtered, scope_detail_shows_balance_leases_and_the_cooldown_hint, reset_forgets_budget_and_cooldown_but_keeps_a_freeze, one_report_deposits_and_merges_every_hint_in_order, one_enormous_hint_among_quiet_workers_reaches_only_the_cap, a_lone_claim_reaches_no_further_than_the_typical_hint, shorter_claims_do_not_corroborate_a_longer_cooldown, three_agreeing_workers_corroborate_the_full_cooldown, an_outlier_among_twenty_does_not_set_the_cooldown, uncertain_evidence_from_one_worker_does_not_broaden, hintless_refusals_from_other_workers_support_a_cooldown_to_the_cap, a_muted_worker_moves_nothing_and_a_noisy_one_is_flagged, a_normal_only_fleet_uses_most_of_the_budget, lower_classes_never_take_criticals_reserve, a_retry_that_succeeded_earns_its_token_back, a_far_slot_is_ask_again_and_a_near_one_is_given, an_intent_that_never_asks_again_stops_counting_at_its_deadline, the_earliest_deadline_takes_the_next_slot, rejections_outside_a_cooldown_cut_the_wake_rate, a_limiter_that_rearms_its_window_is_detected, one_workers_claim_is_not_a_corroborated_cooldown, first_attempts_that_overflow_the_upstream_are_paced_too, a_report_held_back_for_seconds_counts_only_its_share_in_the_window, a_worker_back_after_the_window_counts_among_the_active, statements_from_enough_workers_pace_the_whole_fleet, a_lying_statement_changes_nothing_for_the_fleet, a_stated_pace_with_slots_unused_calls_back_the_earliest_deadlines);

        /// The cases, each a function of the store under test.
        mod cases {
            pub(super) use crate::store::contract::admin::*;
            pub(super) use crate::store::contract::budget::*;
            pub(super) use crate::store::contract::cooldowns::*;
            pub(super) use crate::store::contract::corroboration::*;
            pub(super) use crate::store::contract::pacing::*;
            pub(super) use crate::store::contract::stated::*;
        }
    };
}
pub(crate) use contract_tests;
