//! Contract cases for learned pacing: both stores wake intents at the same
//! learned rate, tell far ones to ask again, back off on rejections and
//! detect a limiter that re-arms its window.

use super::common::{T0, scope};
use crate::hints::{EvidenceInput, assess};
use crate::pacing::cursor::SlotAsk;
use crate::pacing::{Asker, Mode, PacingView};
use crate::policy::Policy;
use crate::scope::ScopeKey;
use crate::store::{LevelHint, Reconsidered, ReportBatch, Reported, Slotted, Store, Tenant};

fn key() -> ScopeKey {
    scope("c", "r")
}

/// One worker's report at `now_ms`: counts, and a 429 with
/// `Retry-After: hint` received then when `hint` is given.
async fn report(
    s: &dyn Store,
    now_ms: i64,
    counts: (u32, u32, u32),
    hint: Option<&str>,
    p: &Policy,
) -> Reported {
    let (first_attempts, successes, rejections) = counts;
    let hints: Vec<LevelHint> = hint
        .map(|h| LevelHint {
            caller_wide: false,
            assessment: assess(
                &EvidenceInput {
                    http_status: 429,
                    retry_after: Some(h),
                    receipt_ms: now_ms,
                    ..EvidenceInput::default()
                },
                p,
                now_ms,
            ),
        })
        .into_iter()
        .collect();
    let batch = ReportBatch {
        worker_id: "w",
        first_attempts,
        successes,
        rejections,
        counts_age_ms: 0,
        hints: &hints,
        now_ms,
        tenant: Tenant::NONE,
        stated: None,
    };
    s.report(&key(), batch, p).await.expect("report")
}

async fn pacing(s: &dyn Store, now_ms: i64, p: &Policy) -> PacingView {
    s.scope_detail(&key().route, p, now_ms)
        .await
        .expect("detail")
        .expect("known")
        .pacing
}

fn asking(intent: &str, now_ms: i64) -> SlotAsk<'_> {
    SlotAsk {
        intent_id: intent,
        floor_ms: 0,
        deadline_ms: now_ms + 60_000,
        reserve_ms: 100,
        now_ms,
        jitter_ppm: 0,
        asker: Asker::Retry,
        tenant: Tenant::NONE,
        may_call_back: false,
    }
}

/// `intent` asking for a slot at T0, just after a 429 with a 10 s
/// `Retry-After` was reported.
async fn ask_in_a_cooldown(s: &dyn Store, intent: &str, p: &Policy) -> Slotted {
    report(s, T0, (0, 0, 1), Some("10"), p).await;
    s.reconsider(&key().route, asking(intent, T0), p)
        .await
        .expect("answer")
}

pub(crate) async fn a_far_slot_is_ask_again_and_a_near_one_is_given(s: &dyn Store) {
    let p = Policy::default();
    let far = ask_in_a_cooldown(s, "i", &p).await;
    let Reconsidered::AskAgain(again) = far.decided else {
        panic!("a slot 10 s ahead is beyond the horizon: {far:?}");
    };
    assert!(
        again > T0 && again < T0 + 10_000,
        "ask again before the cooldown ends: {again}"
    );
    assert_eq!(far.pacing.asking, 1);
    // Within the reconsider horizon of the cooldown's end.
    let near_at = T0 + 10_000 - p.pacing.horizon_ms / 2;
    let near = s
        .reconsider(&key().route, asking("i", near_at), &p)
        .await
        .expect("answer");
    assert_eq!(near.decided, Reconsidered::Slot(T0 + 10_000));
    assert_eq!(
        near.pacing.asking, 0,
        "given a slot, it no longer waits to ask"
    );
}

/// An intent told to ask again that never asks again (its caller cancelled
/// it, say) stops counting as asking once its deadline passes, whether or
/// not anyone asks after it: what an operator sees after a storm drains.
pub(crate) async fn an_intent_that_never_asks_again_stops_counting_at_its_deadline(s: &dyn Store) {
    let p = Policy::default();
    let told = ask_in_a_cooldown(s, "gone", &p).await;
    assert!(
        matches!(told.decided, Reconsidered::AskAgain(_)),
        "{told:?}"
    );
    let deadline = asking("gone", T0).deadline_ms;
    assert_eq!(pacing(s, deadline - 1, &p).await.asking, 1, "still waiting");
    assert_eq!(
        pacing(s, deadline, &p).await.asking,
        0,
        "its deadline passed"
    );
    let reported = report(s, deadline + 1, (1, 1, 0), None, &p).await;
    assert_eq!(reported.pacing.asking, 0, "nor in a report's view");
}

pub(crate) async fn the_earliest_deadline_takes_the_next_slot(s: &dyn Store) {
    let p = Policy::default(); // learned, at its floor: a slot every 100 ms
    let route = &key().route;
    let at = async |intent: &str, now_ms: i64, deadline_ms: i64| {
        let ask = SlotAsk {
            deadline_ms,
            ..asking(intent, now_ms)
        };
        s.reconsider(route, ask, &p).await.expect("answer").decided
    };
    let (far, near) = (T0 + 60_000, T0 + 5_000);
    for (i, intent) in ["a", "b", "c"].into_iter().enumerate() {
        let slot = T0 + 100 * i as i64;
        assert_eq!(at(intent, T0, far).await, Reconsidered::Slot(slot));
    }
    for (intent, deadline) in [
        ("far", far),
        ("near1", near),
        ("near2", near),
        ("near3", near),
    ] {
        assert!(matches!(
            at(intent, T0, deadline).await,
            Reconsidered::AskAgain(_)
        ));
    }
    // The next slot (T0 + 300) is within the horizon, but three intents
    // with an earlier deadline wait for it: the far one asks again.
    assert!(matches!(
        at("far", T0 + 100, far).await,
        Reconsidered::AskAgain(_)
    ));
    assert_eq!(
        at("near1", T0 + 100, near).await,
        Reconsidered::Slot(T0 + 300)
    );
    // Slots nobody asked for in time go to whoever asks.
    assert_eq!(
        at("far", T0 + 2_000, far).await,
        Reconsidered::Slot(T0 + 2_000)
    );
}

pub(crate) async fn rejections_outside_a_cooldown_cut_the_wake_rate(s: &dyn Store) {
    let p = Policy::default();
    // A clean window: 20/s of first attempts, 60/s served in all.
    report(s, T0, (20, 60, 0), None, &p).await;
    // A refusal marks the limiter empty; the next one at least 300 ms later
    // marks it empty again, and what was served in between is its rate:
    // 25 in 500 ms.
    report(s, T0 + 1_000, (10, 30, 5), None, &p).await;
    assert_eq!(pacing(s, T0 + 1_000, &p).await.mode, Mode::BackingOff);
    report(s, T0 + 1_500, (10, 25, 5), None, &p).await;
    let view = pacing(s, T0 + 1_500, &p).await;
    assert_eq!(view.mode, Mode::BackingOff);
    assert_eq!(view.capacity_m, 50_000);
    assert_eq!(view.first_rate_m, 20_000);
    assert_eq!(view.spare_m, 30_000);
    assert_eq!(
        view.wake_rate_m,
        50_000 * 15 / 16 - 20_000,
        "the measured rate less the margin, less the first attempts"
    );
}

pub(crate) async fn first_attempts_that_overflow_the_upstream_are_paced_too(s: &dyn Store) {
    let p = Policy::default();
    // First attempts alone ask for 100/s; the upstream serves 60/s of
    // them, answering the rest with 1 s hints (a short cooldown, not an
    // outage). A hint of a second says its credit comes back a second
    // later: the measurement runs that long, from one refusal to the next.
    report(s, T0, (100, 100, 0), None, &p).await;
    report(s, T0 + 1_000, (50, 50, 10), Some("1"), &p).await;
    assert_eq!(pacing(s, T0 + 1_500, &p).await.mode, Mode::BackingOff);
    report(s, T0 + 2_000, (50, 60, 20), Some("1"), &p).await;
    let view = pacing(s, T0 + 2_000, &p).await;
    assert_eq!(view.mode, Mode::Saturated);
    assert_eq!(view.capacity_m, 60_000);
    assert_eq!(
        view.wake_rate_m, 56_250,
        "every attempt is paced just under what the upstream serves"
    );
    // Inside the next short cooldown a retry waits it out; a held first
    // attempt is paced from now, as the pacing answers for the overload.
    report(s, T0 + 2_100, (0, 0, 1), Some("2"), &p).await;
    let retry = s
        .reconsider(&key().route, asking("retry", T0 + 2_100), &p)
        .await
        .expect("answer");
    assert!(
        matches!(retry.decided, Reconsidered::AskAgain(at) if at < T0 + 4_100),
        "a retry waits for the cooldown: {retry:?}"
    );
    let first = SlotAsk {
        asker: Asker::FirstAttempt { arriving: true },
        ..asking("first", T0 + 2_100)
    };
    let held = s.reconsider(&key().route, first, &p).await.expect("answer");
    assert!(
        matches!(held.decided, Reconsidered::Slot(at) if at < T0 + 2_100 + p.pacing.horizon_ms),
        "a held first attempt is paced from now: {held:?}"
    );
    // Once first attempts fall under the target and a window's demand
    // fits in the slots it was given, they go straight again.
    report(s, T0 + 3_000, (10, 10, 0), None, &p).await;
    assert_ne!(pacing(s, T0 + 5_000, &p).await.mode, Mode::Saturated);
}

pub(crate) async fn a_limiter_that_rearms_its_window_is_detected(s: &dyn Store) {
    let p = Policy::default();
    // Every rejection inside the window moves its end later: no countdown.
    for (i, at) in [T0, T0 + 2_000, T0 + 4_000].into_iter().enumerate() {
        report(s, at, (0, 0, 1), Some("10"), &p).await;
        let mode = pacing(s, at, &p).await.mode;
        assert_eq!(
            mode == Mode::PenaltyExtending,
            i == 2,
            "after report {i}: {mode:?}"
        );
    }
    let view = pacing(s, T0 + 5_000, &p).await;
    assert_eq!(view.penalty_until_ms, T0 + 14_000);
    assert_eq!(view.wake_rate_m, 0);
    let held = s
        .reconsider(&key().route, asking("i", T0 + 5_000), &p)
        .await
        .expect("answer");
    assert!(
        matches!(held.decided, Reconsidered::AskAgain(at) if at >= T0 + 14_000),
        "nothing is woken before the latest hint passes: {held:?}"
    );
    // Then exactly one probe; its success reopens the route.
    let probe = s
        .reconsider(&key().route, asking("i", T0 + 14_000), &p)
        .await
        .expect("answer");
    assert_eq!(probe.decided, Reconsidered::Slot(T0 + 14_000));
    let second = s
        .reconsider(&key().route, asking("j", T0 + 14_100), &p)
        .await
        .expect("answer");
    assert!(
        matches!(second.decided, Reconsidered::AskAgain(_)),
        "{second:?}"
    );
    report(s, T0 + 14_200, (0, 1, 0), None, &p).await;
    assert_ne!(
        pacing(s, T0 + 14_300, &p).await.mode,
        Mode::PenaltyExtending
    );
}

pub(crate) async fn one_workers_claim_is_not_a_corroborated_cooldown(s: &dyn Store) {
    let policy = Policy::default();
    let p = &policy;
    // Eleven active workers: three must agree before the fleet holds.
    super::corroboration::quiet_fleet(s, 11, p).await;
    let claim = |worker: &'static str| async move {
        let hints = [LevelHint {
            caller_wide: false,
            assessment: assess(
                &EvidenceInput {
                    http_status: 429,
                    retry_after: Some("60"),
                    receipt_ms: T0,
                    ..EvidenceInput::default()
                },
                p,
                T0,
            ),
        }];
        let batch = ReportBatch {
            worker_id: worker,
            first_attempts: 0,
            successes: 0,
            rejections: 1,
            counts_age_ms: 0,
            hints: &hints,
            now_ms: T0,
            tenant: Tenant::NONE,
            stated: None,
        };
        s.report(&key(), batch, p).await.expect("report")
    };
    let alone = claim("w0").await;
    assert!(alone.view.cooldown_until_ms > T0, "capped, but a cooldown");
    assert!(!alone.cooldown_corroborated, "one worker's word");
    claim("w1").await;
    let agreed = claim("w2").await;
    assert!(agreed.cooldown_corroborated, "three workers agree");
}

pub(crate) async fn a_report_held_back_for_seconds_counts_only_its_share_in_the_window(
    s: &dyn Store,
) {
    let p = Policy::default();
    // The same counts, made over the last 250 ms (one report interval late
    // at most) and over the last 5 s (held back while the coordinator was
    // out of reach): only a twentieth of the old one's fall in this window.
    for (route, age) in [("fresh", 250), ("held", 5_000)] {
        let batch = ReportBatch {
            worker_id: "w",
            first_attempts: 1_000,
            successes: 1_000,
            rejections: 0,
            counts_age_ms: age,
            hints: &[],
            now_ms: T0 + 250,
            tenant: Tenant::NONE,
            stated: None,
        };
        s.report(&scope("c", route), batch, &p)
            .await
            .expect("report");
    }
    let detail = |route| {
        let p = &p;
        async move {
            s.scope_detail(&scope("c", route).route, p, T0 + 1_000)
                .await
                .expect("detail")
                .expect("known")
        }
    };
    let (fresh, held) = (detail("fresh").await, detail("held").await);
    assert_eq!(fresh.pacing.first_rate_m, 1_000_000);
    assert_eq!(held.pacing.first_rate_m, 50_000, "{:?}", held.pacing);
    // What the upstream served without refusing, nothing being measured.
    assert_eq!(held.pacing.capacity_m * 20, fresh.pacing.capacity_m);
    // The budget takes every count, whatever its age.
    assert_eq!(held.budget.first_attempts, fresh.budget.first_attempts);
}
