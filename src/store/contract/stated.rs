//! Contract cases for stated limits: on every backend, statements from
//! enough workers pace the whole fleet at the stated quota, one worker's
//! lie changes nothing, a bad statement is evidence only, and a statement
//! that stops arriving hands pacing back to what was learned.

use super::common::{T0, scope};
use crate::hints::stated::{StatedInput, read_statement};
use crate::pacing::Mode;
use crate::pacing::stated::{InForce, STATED_HOLD_MS, StatedVerdict};
use crate::policy::Policy;
use crate::scope::ScopeKey;
use crate::store::{ReportBatch, ScopeDetail, Store, Tenant};
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
        first_attempts: 100,
        successes: 100,
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
