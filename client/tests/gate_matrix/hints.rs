//! Rows about the server's `Retry-After`: a valid hint that cannot fit the
//! deadline, HTTP-dates under clock skew, malformed, negative and enormous
//! hints, a hint beyond the local maximum, and repeated 429s ending at the
//! caps.

use std::time::Duration;

use tokio::time::Instant;
use tollgate_client::clock::Clock;
use tollgate_client::gate::{GateConfig, IntentResult, TokenSource};
use tollgate_client::hint::{HintForm, HintVerdict};
use tollgate_client::outcome::{Outcome, RecordDecision};

use super::intent;
use crate::common::{Upstream, http};
use crate::support::pipes::*;

fn decisions<T>(result: &IntentResult<T>) -> Vec<Option<RecordDecision>> {
    result.attempts.iter().map(|a| a.record.decision).collect()
}

#[tokio::test(start_paused = true)]
async fn valid_hint_but_deadline_infeasible_stops_at_receipt() {
    let h = harness();
    let upstream = Upstream::new(vec![http(429, Some("10"))]);
    let began = Instant::now();
    // 12 s left, a 3 s reserve: 10 s of hint plus 3 s cannot fit.
    let result = h
        .gate
        .run(
            intent("i-deadline", policy(secs(12), 5, secs(3), None)),
            upstream.attempt(),
        )
        .await;
    assert_eq!(result.outcome, Outcome::DeadlineInfeasible);
    assert_eq!(upstream.calls(), 1);
    assert!(
        began.elapsed() < secs(1),
        "stopped at receipt, not after a pointless wait"
    );
    let record = &result.attempts[0].record;
    assert_eq!(
        record.wait,
        Some(secs(10)),
        "the infeasibility calculation is kept"
    );
    assert_eq!(
        result.last_status(),
        Some(tollgate_client::outcome::ResponseStatus::Http(429))
    );
    assert_eq!(result.value, Some(1), "the last response is handed back");
}

#[tokio::test(start_paused = true)]
async fn http_date_with_clock_skew_is_bounded_or_refused() {
    // The server's clock runs an hour ahead: its date asks for an hour.
    let h = harness();
    let ahead = httpdate::fmt_http_date(h.clock.now() + secs(3600));
    let upstream = Upstream::new(vec![http(429, Some(&ahead))]);
    let result = h
        .gate
        .run(
            intent("i-skew-ahead", policy(secs(60), 3, secs(5), Some(secs(30)))),
            upstream.attempt(),
        )
        .await;
    assert_eq!(
        result.outcome,
        Outcome::HintExceedsCap,
        "bounded visibly, not slept on"
    );
    let hint = result.attempts[0].record.hint.clone().unwrap();
    assert_eq!(hint.form, HintForm::Date);
    assert_eq!(hint.raw.as_deref(), Some(ahead.as_str()));

    // The server's clock runs behind: its date is already past. That is not
    // permission to retry at once; the floors still apply.
    let behind = httpdate::fmt_http_date(h.clock.now() - secs(120));
    let upstream = Upstream::new(vec![http(429, Some(&behind)), http(200, None)]);
    let result = h
        .gate
        .run(
            intent(
                "i-skew-behind",
                policy(secs(60), 3, secs(5), Some(secs(30))),
            ),
            upstream.attempt(),
        )
        .await;
    assert_eq!(result.outcome, Outcome::Succeeded);
    assert_eq!(
        result.attempts[0].record.hint.as_ref().unwrap().verdict,
        HintVerdict::Valid {
            delay: Duration::ZERO,
            past: true
        }
    );
    let starts = upstream.starts();
    assert!(
        starts[1] - starts[0] >= ms(20) + ms(100),
        "the policy floor still applies"
    );

    // A host whose clock is not trusted refuses to convert a date at all.
    let h = harness_with(GateConfig {
        clock_trusted: false,
        ..gate_config()
    });
    let upstream = Upstream::new(vec![http(429, Some(&ahead))]);
    let result = h
        .gate
        .run(
            intent("i-untrusted", policy(secs(60), 3, secs(5), None)),
            upstream.attempt(),
        )
        .await;
    assert_eq!(result.outcome, Outcome::ClockUntrusted);
    assert_eq!(upstream.calls(), 1);
}

#[tokio::test(start_paused = true)]
async fn malformed_negative_and_enormous_hints_fall_back_visibly_never_immediately() {
    let h = harness();
    for raw in ["soon", "-1", "1.5", ""] {
        let upstream = Upstream::new(vec![http(429, Some(raw)), http(200, None)]);
        let result = h
            .gate
            .run(
                intent(&format!("i-bad-{raw}"), policy(secs(60), 3, secs(5), None)),
                upstream.attempt(),
            )
            .await;
        assert_eq!(result.outcome, Outcome::Succeeded, "{raw:?}");
        let record = &result.attempts[0].record;
        let hint = record.hint.clone().unwrap();
        assert_eq!(hint.form, HintForm::Invalid, "{raw:?}");
        assert!(matches!(hint.verdict, HintVerdict::Invalid(_)), "{raw:?}");
        assert_eq!(hint.raw.as_deref(), Some(raw), "raw text kept as evidence");
        // The fallback is the policy's backoff (2 s after one attempt); the
        // coordinator's slot may only put it later, by at most one slot
        // interval (1 s: a new route's learned wake rate starts at its
        // floor, one a second).
        let waited = result.attempts[0].wait.clone().unwrap();
        assert_eq!(
            waited.engine_next_start - record.receipt.unwrap(),
            secs(2),
            "{raw:?}"
        );
        assert!(record.wait >= Some(secs(2)), "{raw:?}");
        let slot = waited.slot.expect("a slot from the coordinator");
        assert!(
            slot >= waited.engine_next_start && slot <= waited.engine_next_start + secs(1),
            "{raw:?}: {slot:?}"
        );
        let starts = upstream.starts();
        assert!(starts[1] - starts[0] >= secs(2), "{raw:?}: never immediate");
    }

    // Enormous: saturates, then exceeds any cap; without a cap it cannot fit
    // the deadline. Either way the intent stops instead of retrying early.
    let enormous = "99999999999999999999999";
    let upstream = Upstream::new(vec![http(429, Some(enormous))]);
    let capped = h
        .gate
        .run(
            intent(
                "i-huge-capped",
                policy(secs(60), 3, secs(5), Some(secs(30))),
            ),
            upstream.attempt(),
        )
        .await;
    assert_eq!(capped.outcome, Outcome::HintExceedsCap);
    let uncapped = h
        .gate
        .run(
            intent("i-huge", policy(secs(60), 3, secs(5), None)),
            upstream.attempt(),
        )
        .await;
    assert_eq!(uncapped.outcome, Outcome::DeadlineInfeasible);
    assert_eq!(upstream.calls(), 2);
}

#[tokio::test(start_paused = true)]
async fn hint_beyond_the_local_max_stops_explicitly() {
    let h = harness();
    let upstream = Upstream::new(vec![http(429, Some("120")), http(200, None)]);
    let began = Instant::now();
    let result = h
        .gate
        .run(
            intent("i-long-hint", policy(secs(600), 3, secs(5), Some(secs(30)))),
            upstream.attempt(),
        )
        .await;
    assert_eq!(result.outcome, Outcome::HintExceedsCap);
    assert_eq!(upstream.calls(), 1, "no silently shortened wait");
    assert!(began.elapsed() < secs(1));
    assert_eq!(
        result.attempts[0].record.hint.as_ref().unwrap().verdict,
        HintVerdict::ExceedsCap {
            delay: secs(120),
            cap: secs(30)
        }
    );
}

#[tokio::test(start_paused = true)]
async fn repeated_429s_terminate_at_the_caps() {
    let h = harness();
    let upstream = Upstream::new(vec![http(429, Some("1"))]);
    let result = h
        .gate
        .run(
            intent("i-429s", policy(secs(60), 4, secs(2), None)),
            upstream.attempt(),
        )
        .await;
    assert_eq!(result.outcome, Outcome::AttemptCap);
    assert_eq!(upstream.calls(), 4);
    assert!(
        result.attempts[1..]
            .iter()
            .all(|a| matches!(a.token, TokenSource::Leased { .. }))
    );

    // A tighter deadline ends the sequence first.
    let upstream = Upstream::new(vec![http(429, Some("1"))]);
    let result = h
        .gate
        .run(
            intent("i-429s-deadline", policy(secs(5), 10, secs(2), None)),
            upstream.attempt(),
        )
        .await;
    assert_eq!(result.outcome, Outcome::DeadlineInfeasible);
    assert!(upstream.calls() < 10);
    assert!(
        decisions(&result).iter().all(Option::is_some),
        "every attempt has its decision"
    );
}
