//! Contract cases for stated limits: on every backend, statements from
//! enough workers pace the whole fleet at the stated quota, one worker's
//! lie changes nothing, a bad statement is evidence only, and a statement
//! that stops arriving hands pacing back to what was learned.

use super::common::{T0, scope};
use crate::hints::stated::{StatedInput, read_statement};
use crate::pacing::Asker;
use crate::pacing::Mode;
use crate::pacing::cursor::SlotAsk;
use crate::pacing::stated::{InForce, STATED_HOLD_MS, StatedVerdict};
use crate::policy::Policy;
use crate::scope::ScopeKey;
use crate::store::{Reconsidered, ReportBatch, ScopeDetail, Store, Tenant};
use tollgate_vocab::ratelimit::StatedField;

fn key() -> ScopeKey {
    scope("c", "stated")
}

fn fields(remaining: &str, reset: &str) -> Vec<StatedField> {
    let f = |name, value: &str| StatedField {
        name,
        value: value.to_owned(),
        truncated: false,
    };
    vec![
        f("x-ratelimit-limit", "1000, 1000;w=1"),
        f("x-ratelimit-remaining", remaining),
        f("x-ratelimit-reset", reset),
    ]
}

/// `worker` reports 100 first attempts and the statement `stated` received
/// at `now_ms`.
async fn report(s: &dyn Store, worker: &str, stated: &[StatedField], now_ms: i64, p: &Policy) {
    report_first(s, worker, stated, 100, now_ms, p).await;
}

/// [`report`] with `first` first attempts, all served.
async fn report_first(
    s: &dyn Store,
    worker: &str,
    stated: &[StatedField],
    first: u32,
    now_ms: i64,
    p: &Policy,
) {
    let statement = read_statement(
        &StatedInput {
            fields: stated,
            receipt_ms: now_ms,
        },
        worker,
        p,
        now_ms,
    );
    let batch = ReportBatch {
        worker_id: worker,
        first_attempts: first,
        successes: first,
        rejections: 0,
        counts_age_ms: 0,
        hints: &[],
        now_ms,
        tenant: Tenant::NONE,
        stated: Some(&statement),
    };
    s.report(&key(), batch, p).await.expect("report");
}

async fn detail(s: &dyn Store, now_ms: i64, p: &Policy) -> ScopeDetail {
    s.scope_detail(&key().route, p, now_ms)
        .await
        .expect("detail")
        .expect("known")
}

/// Four workers heard from: three are needed to corroborate.
async fn fleet(s: &dyn Store, p: &Policy) {
    for w in ["w1", "w2", "w3", "w4"] {
        crate::store::contract::deposit_as(s, &key(), w, 100, T0, p).await;
    }
}

pub(crate) async fn statements_from_enough_workers_pace_the_whole_fleet(s: &dyn Store) {
    let p = Policy::default();
    fleet(s, &p).await;
    // 1 000 of 1 000/s left, a second to go: 1 000/s, less 3 %.
    for w in ["w1", "w2"] {
        report(s, w, &fields("1000", "1"), T0 + 500, &p).await;
    }
    let d = detail(s, T0 + 500, &p).await;
    assert_eq!(d.pacing.stated.in_force, InForce::Uncorroborated, "{d:?}");
    assert_ne!(d.pacing.mode, Mode::Stated, "two of three needed");
    report(s, "w3", &fields("1000", "1"), T0 + 600, &p).await;
    let d = detail(s, T0 + 600, &p).await;
    assert_eq!(d.pacing.mode, Mode::Stated, "{d:?}");
    assert_eq!(d.pacing.stated.in_force, InForce::Corroborated);
    assert_eq!(d.pacing.stated.workers, 3);
    assert_eq!(d.pacing.stated.quota, 1000);
    assert_eq!(d.pacing.wake_rate_m, 970_000, "no search: the stated pace");
    assert_eq!(d.stated_recent.len(), 3);
    // Nothing stated for the hold: learned pacing again.
    let d = detail(s, T0 + 600 + STATED_HOLD_MS, &p).await;
    assert_eq!(d.pacing.stated.in_force, InForce::Expired);
    assert_ne!(d.pacing.mode, Mode::Stated);
}

pub(crate) async fn a_lying_statement_changes_nothing_for_the_fleet(s: &dyn Store) {
    let p = Policy::default();
    fleet(s, &p).await;
    for w in ["w1", "w2", "w3"] {
        report(s, w, &fields("1000", "1"), T0, &p).await;
    }
    let honest = detail(s, T0 + 10, &p).await.pacing;
    assert_eq!(honest.mode, Mode::Stated);
    // A tiny remaining, then an absurd reset.
    // Consistent (no window for a two-second reset to contradict): it reads
    // as usable, and its 1/s is outweighed, not refused.
    let tiny = [
        StatedField {
            value: "1000".to_owned(),
            ..fields("", "")[0].clone()
        },
        fields("1", "")[1].clone(),
        fields("", "2")[2].clone(),
    ];
    report(s, "liar", &tiny, T0 + 20, &p).await;
    let absurd = [
        fields("0", "")[1].clone(),
        StatedField {
            value: "99999999999".to_owned(),
            ..fields("", "")[2].clone()
        },
    ];
    report(s, "liar2", &absurd, T0 + 30, &p).await;
    let d = detail(s, T0 + 40, &p).await;
    assert_eq!(d.pacing.wake_rate_m, honest.wake_rate_m, "{d:?}");
    assert!(
        d.stated_recent
            .iter()
            .any(|s| s.worker == "liar" && s.pace_m == Some(1_000)),
        "the lie was read as usable and outweighed: {d:?}"
    );
    let last = d.stated_recent.last().expect("kept");
    assert_eq!(last.verdict, StatedVerdict::Absurd);
    assert!(last.raw.contains("99999999999"));
}

/// Saturated at a stated pace (first attempts alone reach it), a window
/// whose slots go unused with nothing booked ahead calls back the intents
/// told to ask again with the earliest deadlines, as many as half a
/// horizon's slots serve; intents that did not ask again by their instant
/// and a horizon after it are taken as gone, and not called.
pub(crate) async fn a_stated_pace_with_slots_unused_calls_back_the_earliest_deadlines(
    s: &dyn Store,
) {
    let p = Policy::default();
    fleet(s, &p).await;
    // Three workers state 1 000/s and send 1 002 first attempts a second.
    for second in 0..17 {
        let now_ms = T0 + second * 1000;
        for w in ["w1", "w2", "w3"] {
            report_first(s, w, &fields("1000", "1"), 334, now_ms, &p).await;
        }
    }
    let start = T0 + 16_050;
    let d = detail(s, start, &p).await;
    assert_eq!(d.pacing.mode, Mode::Saturated, "{d:?}");
    assert_eq!(d.pacing.wake_rate_m, 970_000, "{d:?}");
    let route = &key().route;
    let ask = async |intent: &str, now_ms: i64, deadline_ms: i64| {
        let ask = SlotAsk {
            intent_id: intent,
            floor_ms: 0,
            deadline_ms,
            reserve_ms: 100,
            now_ms,
            jitter_ppm: 0,
            asker: Asker::Retry,
            tenant: Tenant::NONE,
            may_call_back: true,
        };
        s.reconsider(route, ask, &p).await.expect("answer")
    };
    // Intents fill the horizon (a slot every 1.03 ms) until one is told
    // to ask again; ten more, deadlines a second apart, are told so too.
    let mut filled = 0;
    while matches!(
        ask(&format!("s{filled}"), start, start + 60_000)
            .await
            .decided,
        Reconsidered::Slot(_)
    ) {
        filled += 1;
        assert!(filled < 1_000, "the horizon fills");
    }
    let deadline = |i: i64| start + 10_000 + i * 1_000;
    let mut again = 0;
    for i in 0..10 {
        let told = ask(&format!("q{i}"), start, deadline(i)).await;
        let Reconsidered::AskAgain(at) = told.decided else {
            panic!("the horizon is booked: {told:?}");
        };
        assert_eq!(told.call_back_until_ms, None, "the horizon is booked");
        again = again.max(at);
    }
    // Later in the window, the cursor idle and under a third of the pace
    // given out: whoever asks takes a slot, and the route calls back up to
    // 121 in deadline order: the ten. (The one told to ask again while
    // filling was told to within half a horizon, did not, and is gone.)
    let late = start + 700;
    assert!(late < again, "before they ask again: {again}");
    let first = ask("late", late, start + 60_000).await;
    assert!(matches!(first.decided, Reconsidered::Slot(_)), "{first:?}");
    assert_eq!(first.pacing.mode, Mode::Saturated);
    assert_eq!(first.call_back_until_ms, Some(deadline(9)), "{first:?}");
    // None of them asked again by their instant and a horizon after it:
    // nobody is listening, nobody is called.
    let later = again + p.pacing.horizon_ms + 1;
    let second = ask("later", later, start + 60_000).await;
    assert!(
        matches!(second.decided, Reconsidered::Slot(_)),
        "{second:?}"
    );
    assert_eq!(second.pacing.mode, Mode::Saturated);
    assert_eq!(second.call_back_until_ms, None, "{second:?}");
}
