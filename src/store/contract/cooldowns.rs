//! Contract cases for evidence and what follows from it: cooldowns at the
//! route and caller level, the backoff of hintless rejections, and the
//! reconsideration slots a cooldown moves.

use super::common::{T0, ask, deposit, merge, merge_429, scope, slot_ask};
use crate::budget::GrantAsk;
use crate::hints::{EvidenceInput, assess};
use crate::pacing::cursor::SlotAsk;
use crate::policy::{Policy, PolicySpec, WakeRate};
use crate::scope::{EvidenceLevel, Priority, RouteKey, ScopeKey};
use crate::store::{LevelHint, Reconsidered, ReportBatch, Slotted, Store, Tenant};

/// A pinned wake rate: slots at any distance, the cursor's own
/// rules, nothing learned.
fn pinned(rate: u32) -> Policy {
    Policy::try_new(&PolicySpec {
        wake_rate: Some(WakeRate::Pinned(rate)),
        ..PolicySpec::default()
    })
    .expect("valid")
}

pub(crate) async fn a_cooldown_reaches_every_priority_and_slots_follow_it(s: &dyn Store) {
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
        .expect("slot")
        .decided;
    assert_eq!(slot, Reconsidered::Slot(T0 + 30_000));
}

pub(crate) async fn uncertain_evidence_covers_the_whole_caller_scope(s: &dyn Store) {
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

pub(crate) async fn hintless_rejections_widen_the_backoff_and_successes_narrow_it(s: &dyn Store) {
    let p = Policy::default();
    let key = scope("c", "r");
    let level = EvidenceLevel::Route(key.route.clone());
    let base = i64::try_from(p.backoff_base_ms).expect("base");
    // A hintless rejection received `after` ms past T0.
    let refused = |after: i64| {
        let input = EvidenceInput {
            http_status: 503,
            retry_after: Some("junk"),
            receipt_ms: T0 + after,
            ..EvidenceInput::default()
        };
        assess(&input, &p, T0 + after)
    };
    // Each refused once the backoff the one before set has passed: a round
    // each, a step each.
    let mut steps = Vec::new();
    for after in [0, base, 3 * base] {
        let m = merge(s, &level, &refused(after), &p).await;
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
    assert_eq!(view.floor_ms, T0 + 7 * base);
    // Refused again while that backoff holds: explained by it, no wider.
    let m = merge(s, &level, &refused(4 * base), &p).await;
    assert_eq!(m.backoff_ms, 4 * p.backoff_base_ms);
    deposit(s, &key, "w", 0, 2, &p, T0).await.expect("deposit");
    let m = merge(s, &level, &refused(8 * base), &p).await;
    assert_eq!(
        m.backoff_ms,
        4 * p.backoff_base_ms,
        "a report with successes narrows by one step, then the next round widens it again"
    );
}

pub(crate) async fn one_report_deposits_and_merges_every_hint_in_order(s: &dyn Store) {
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
        counts_age_ms: 0,
        hints: &hints,
        now_ms: T0,
        tenant: Tenant::NONE,
        stated: None,
    };
    let reported = s.report(&key, batch, &p).await.expect("report");
    let merges: Vec<(bool, i64)> = reported
        .merges
        .iter()
        .map(|m| (m.raised, m.cooldown_until_ms))
        .collect();
    assert_eq!(
        merges,
        [
            (true, T0 + 30_000),
            (true, T0 + 50_000),
            (false, T0 + 30_000)
        ]
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

pub(crate) async fn slots_are_spread_jittered_idempotent_and_deadline_checked(s: &dyn Store) {
    let p = pinned(50);
    let route = scope("c", "r").route;
    let rate = 50;
    let interval = 1_000_000i64.div_euclid(rate) / 1000; // ms, for rates dividing 1e6
    // A floor ahead of now, so the slots are still pending when asked again.
    let at = |intent| SlotAsk {
        floor_ms: T0 + 1_000,
        ..slot_ask(intent, T0)
    };
    let a = s
        .reconsider(&route, at("a"), &p)
        .await
        .expect("slot")
        .decided;
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
    let most = SlotAsk {
        jitter_ppm: 999_999,
        ..at("b")
    };
    let b = s.reconsider(&route, most, &p).await.expect("slot").decided;
    assert_eq!(
        b,
        Reconsidered::Slot(T0 + 1_000 + interval + interval / 16),
        "the refusal took no interval; jitter places the slot in the first \
         sixteenth of its own"
    );
}

pub(crate) async fn a_later_cooldown_voids_a_pending_slot_and_unfreezing_works(s: &dyn Store) {
    let p = pinned(50);
    let key = scope("c", "r");
    let first = s
        .reconsider(&key.route, slot_ask("i", T0), &p)
        .await
        .expect("slot")
        .decided;
    assert_eq!(first, Reconsidered::Slot(T0));
    merge_429(s, EvidenceLevel::Caller("c".into()), "10", &p).await;
    let Slotted {
        decided: moved,
        view,
        ..
    } = s
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
