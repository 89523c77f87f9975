//! Contract cases for corroborated evidence: one faulty worker must not
//! stall a tenant, on every backend alike.

use super::common::{T0, scope};
use crate::hints::corroboration::Claim;
use crate::hints::{EvidenceInput, Merge, assess};
use crate::policy::Policy;
use crate::scope::{RouteKey, ScopeKey};
use crate::store::{LevelHint, ReportBatch, Store, Tenant};

fn key() -> ScopeKey {
    scope("c", "r")
}

/// Workers `w0..wN` report first attempts: they are the route's active
/// workers, none with evidence.
pub(super) async fn quiet_fleet(s: &dyn Store, n: usize, p: &Policy) {
    for i in 0..n {
        let batch = ReportBatch {
            worker_id: &format!("w{i}"),
            first_attempts: 1,
            successes: 0,
            rejections: 0,
            counts_age_ms: 0,
            hints: &[],
            now_ms: T0,
            tenant: Tenant::NONE,
            stated: None,
        };
        s.report(&key(), batch, p).await.expect("deposit");
    }
}

/// `worker` reports a 429 with `Retry-After: hint` received at `T0`.
async fn report_429(s: &dyn Store, worker: &str, hint: &str, uncertain: bool, p: &Policy) -> Merge {
    report_refusal(s, worker, Some(hint), uncertain, T0, p).await
}

/// `worker` reports one 429 (with `Retry-After: hint`, if any) received at
/// `now_ms`.
async fn report_refusal(
    s: &dyn Store,
    worker: &str,
    hint: Option<&str>,
    uncertain: bool,
    now_ms: i64,
    p: &Policy,
) -> Merge {
    let input = EvidenceInput {
        http_status: 429,
        retry_after: hint,
        receipt_ms: now_ms,
        ..EvidenceInput::default()
    };
    let hints = [LevelHint {
        caller_wide: uncertain,
        assessment: assess(&input, p, now_ms),
    }];
    let batch = ReportBatch {
        worker_id: worker,
        first_attempts: 0,
        successes: 0,
        rejections: 1,
        counts_age_ms: 0,
        hints: &hints,
        now_ms,
        tenant: Tenant::NONE,
        stated: None,
    };
    s.report(&key(), batch, p).await.expect("report").merges[0]
}

pub(crate) async fn one_enormous_hint_among_quiet_workers_reaches_only_the_cap(s: &dyn Store) {
    let p = Policy::default();
    quiet_fleet(s, 11, &p).await;
    let m = report_429(s, "w0", "999999999", false, &p).await;
    assert_eq!(m.cooldown_until_ms, T0 + 5_000, "the uncorroborated cap");
    assert!(!m.corroborated);
    assert_eq!(m.claim, Claim::Uncorroborated);
    let view = s.view(&key().route, T0).await.expect("view");
    assert_eq!(view.cooldown_until_ms, T0 + 5_000);
    let d = s
        .scope_detail(&key().route, &p, T0)
        .await
        .expect("detail")
        .expect("known");
    let c = d.route_evidence.corroboration;
    assert_eq!(
        (c.corroborated, c.workers, c.reporters, c.needed),
        (false, 1, 1, 3)
    );
    assert_eq!(d.route_evidence.workers.len(), 1);
    assert_eq!(d.route_evidence.workers[0].0, "w0");
    assert_eq!(d.route_evidence.workers[0].1.uncorroborated, 1);
}

pub(crate) async fn a_lone_claim_reaches_no_further_than_the_typical_hint(s: &dyn Store) {
    let p = Policy::default();
    quiet_fleet(s, 11, &p).await;
    // The route's hints lately say two seconds: an overload, not an outage.
    for i in 1..=4 {
        report_429(s, &format!("w{i}"), "2", false, &p).await;
    }
    let m = report_429(s, "w0", "999999999", false, &p).await;
    assert_eq!(
        m.cooldown_until_ms,
        T0 + 2_000,
        "one worker's claim reaches no further than the typical hint, under the 5 s cap"
    );
    assert_eq!(
        m.claim,
        Claim::Outlier,
        "enough workers reported to judge it"
    );
    // Three workers that agree on a longer closure still set it in full.
    for i in 5..=6 {
        report_429(s, &format!("w{i}"), "60", false, &p).await;
    }
    let m = report_429(s, "w7", "60", false, &p).await;
    assert!(m.corroborated);
    assert_eq!(m.cooldown_until_ms, T0 + 60_000);
}

pub(crate) async fn shorter_claims_do_not_corroborate_a_longer_cooldown(s: &dyn Store) {
    let p = Policy::default();
    quiet_fleet(s, 11, &p).await;
    let lie = report_429(s, "w0", "999999999", false, &p).await;
    assert_eq!(lie.cooldown_until_ms, T0 + 5_000);
    let mut last = None;
    for i in 1..=4 {
        last = Some(report_429(s, &format!("w{i}"), "2", false, &p).await);
    }
    let m = last.expect("four reports");
    // Four workers agree on two seconds; the five the lone claim set still
    // holds, and nobody corroborated it.
    assert_eq!(m.cooldown_until_ms, T0 + 5_000);
    assert!(!m.corroborated, "the cooldown in force rests on one worker");
}

pub(crate) async fn three_agreeing_workers_corroborate_the_full_cooldown(s: &dyn Store) {
    let p = Policy::default();
    quiet_fleet(s, 11, &p).await;
    report_429(s, "w0", "60", false, &p).await;
    report_429(s, "w1", "60", false, &p).await;
    let m = report_429(s, "w2", "60", false, &p).await;
    assert!(m.raised && m.corroborated);
    assert_eq!((m.cooldown_until_ms, m.workers), (T0 + 60_000, 3));
    assert_eq!(m.claim, Claim::Agreed);
}

pub(crate) async fn an_outlier_among_twenty_does_not_set_the_cooldown(s: &dyn Store) {
    let p = Policy::default();
    quiet_fleet(s, 21, &p).await;
    report_429(s, "w0", "300", false, &p).await;
    let mut last = None;
    for i in 1..=20 {
        last = Some(report_429(s, &format!("w{i}"), "5", false, &p).await);
    }
    let m = last.expect("twenty reports");
    assert!(m.corroborated);
    assert_eq!(m.cooldown_until_ms, T0 + 5_000);
    // The outlier reports again once the fleet has spoken: judged an outlier.
    let again = report_429(s, "w0", "300", false, &p).await;
    assert_eq!(again.claim, Claim::Outlier);
    assert_eq!(again.cooldown_until_ms, T0 + 5_000);
    let d = s
        .scope_detail(&key().route, &p, T0)
        .await
        .expect("detail")
        .expect("known");
    let w0 = &d.route_evidence.workers[0];
    assert_eq!(w0.0, "w0", "the outlier is kept as evidence and counted");
    assert_eq!((w0.1.hints, w0.1.outliers, w0.1.uncorroborated), (2, 1, 1));
}

pub(crate) async fn uncertain_evidence_from_one_worker_does_not_broaden(s: &dyn Store) {
    let p = Policy::default();
    quiet_fleet(s, 10, &p).await;
    let other = RouteKey {
        caller_scope: "c".into(),
        route: "other".into(),
    };
    report_429(s, "w0", "60", true, &p).await;
    let view = s.view(&other, T0).await.expect("view");
    assert_eq!(
        view.cooldown_until_ms,
        T0 + 5_000,
        "one worker: the cap only"
    );
    report_429(s, "w1", "60", true, &p).await;
    report_429(s, "w2", "60", true, &p).await;
    let view = s.view(&other, T0).await.expect("view");
    assert_eq!(
        view.cooldown_until_ms,
        T0 + 60_000,
        "three agree: broadened"
    );
    let d = s
        .scope_detail(&key().route, &p, T0)
        .await
        .expect("detail")
        .expect("known");
    assert!(d.caller_evidence.corroboration.corroborated);
    assert_eq!(d.caller_evidence.corroboration.workers, 3);
}

/// `worker` reports a 429 without a `Retry-After` at `now_ms`.
async fn report_hintless(s: &dyn Store, worker: &str, now_ms: i64, p: &Policy) -> Merge {
    report_refusal(s, worker, None, false, now_ms, p).await
}

/// The upstream's own behaviour corroborates a cooldown: other workers
/// refused without a hint while it holds support it, each to its refusal
/// plus the cap, and enough of them keep it rolling while the upstream keeps
/// refusing. A lone claim never reaches its full length that way, and
/// hintless refusals with no cooldown in force set none.
pub(crate) async fn hintless_refusals_from_other_workers_support_a_cooldown_to_the_cap(
    s: &dyn Store,
) {
    let p = Policy::default();
    quiet_fleet(s, 11, &p).await;
    let m = report_hintless(s, "w5", T0, &p).await;
    assert_eq!(m.cooldown_until_ms, 0, "no cooldown to support");
    // One worker claims 300 s: the fleet waits the cap.
    let m = report_429(s, "w0", "300", false, &p).await;
    assert_eq!((m.cooldown_until_ms, m.corroborated), (T0 + 5_000, false));
    // Refused without a hint 2 s in: one worker alone reaches its own cap.
    let m = report_hintless(s, "w1", T0 + 2_000, &p).await;
    assert_eq!((m.cooldown_until_ms, m.corroborated), (T0 + 7_000, false));
    assert!(m.raised && !m.support_moved);
    // A second, and three workers (the claimant among them) agree: the same
    // end, newly corroborated.
    let m = report_hintless(s, "w2", T0 + 2_000, &p).await;
    assert_eq!((m.cooldown_until_ms, m.corroborated), (T0 + 7_000, true));
    assert!(!m.raised && m.support_moved);
    // Still refused 6 s in: it rolls on, never to the claimed 300 s.
    report_hintless(s, "w1", T0 + 6_000, &p).await;
    let m = report_hintless(s, "w2", T0 + 6_000, &p).await;
    assert_eq!((m.cooldown_until_ms, m.corroborated), (T0 + 11_000, true));
    let view = s.view(&key().route, T0 + 6_000).await.expect("view");
    assert_eq!(view.cooldown_until_ms, T0 + 11_000);
}

pub(crate) async fn a_muted_worker_moves_nothing_and_a_noisy_one_is_flagged(s: &dyn Store) {
    let p = Policy::default();
    quiet_fleet(s, 11, &p).await;
    let mut m = report_429(s, "liar", "300", false, &p).await;
    for _ in 0..4 {
        m = report_429(s, "liar", "300", false, &p).await;
    }
    assert!(m.noisy, "five uncorroborated claims of five");
    let d = s
        .scope_detail(&key().route, &p, T0)
        .await
        .expect("detail")
        .expect("known");
    assert_eq!(d.route_evidence.noisy, 1);
    assert!(d.route_evidence.workers[0].1.noisy());

    assert_eq!(
        s.set_mute(&key().route, "w1", Some(T0 + 60_000), T0).await,
        Ok(true)
    );
    let muted = report_429(s, "w1", "120", false, &p).await;
    assert_eq!(muted.claim, Claim::Muted);
    assert!(!muted.raised);
    // A reset keeps the mute, as it keeps a freeze.
    assert_eq!(s.reset_scope(&key().route, T0).await, Ok(true));
    let muted = report_429(s, "w1", "120", true, &p).await;
    assert_eq!(muted.claim, Claim::Muted, "muted on the caller scope too");
    let d = s
        .scope_detail(&key().route, &p, T0)
        .await
        .expect("detail")
        .expect("known");
    assert_eq!(d.route_evidence.mutes, vec![("w1".to_owned(), T0 + 60_000)]);
    assert_eq!(s.set_mute(&key().route, "w1", None, T0).await, Ok(true));
    let heard = report_429(s, "w1", "3", false, &p).await;
    assert_eq!(heard.claim, Claim::Agreed);
    assert_eq!(heard.cooldown_until_ms, T0 + 3_000);
}

/// A worker back after longer than the budget window is one of the route's
/// active workers again from its own report: its lone claim, with one
/// other worker active, is not the whole fleet's word.
pub(crate) async fn a_worker_back_after_the_window_counts_among_the_active(s: &dyn Store) {
    let p = Policy::default();
    let long_ago = T0 - 2 * p.window_ms();
    let quiet = |worker, now_ms| ReportBatch {
        first_attempts: 1,
        successes: 1,
        ..ReportBatch::empty(worker, now_ms)
    };
    s.report(&key(), quiet("back", long_ago), &p)
        .await
        .expect("deposit");
    s.report(&key(), quiet("here", T0), &p)
        .await
        .expect("deposit");
    let m = report_429(s, "back", "300", false, &p).await;
    assert!(!m.corroborated, "two active workers, one claim: {m:?}");
    assert_eq!(m.cooldown_until_ms, T0 + 5_000, "the uncorroborated cap");
}
