//! Every form of hint at engine level: delays and HTTP-dates, what makes
//! one invalid, saturation, the hint cap, an untrusted clock, gRPC pushback,
//! and the backoff when no hint is given.

use super::*;
use crate::hint::InvalidHint;

/// The decision for one 429 received at elapsed 2 s (12:00:02 wall).
fn decide_hint(raw: &str, max_hint: Option<Duration>, clock_trusted: bool) -> (Decision, Intent) {
    let mut spec = spec(RepetitionKind::Safe);
    spec.clock_trusted = clock_trusted;
    let mut intent = Intent::new(spec, policy_with(max_hint));
    let d = first(&mut intent, s(2), http(429, Some(raw)));
    (d, intent)
}

#[test]
fn valid_delays_wait_exactly_the_hint_when_above_the_floor() {
    for (raw, secs) in [("3", 3), (" 3\t", 3), ("007", 7), ("0", 1)] {
        let (d, _) = decide_hint(raw, None, true);
        assert_eq!(wait_of(d), s(secs), "{raw:?}");
    }
}

#[test]
fn invalid_hints_fall_back_to_backoff_never_to_zero() {
    for raw in ["+3", "-1", "1.5", "NaN", "", "   ", "tomorrow", "3 s"] {
        let (d, intent) = decide_hint(raw, None, true);
        assert_eq!(wait_of(d), s(2), "{raw:?}: backoff after one attempt");
        let hint = intent.records()[0].hint.clone().expect("hint read");
        assert_eq!(hint.form, HintForm::Invalid, "{raw:?}");
        assert_eq!(hint.raw.as_deref(), Some(raw), "raw text kept");
    }
}

#[test]
fn an_overflowing_delay_saturates_and_never_becomes_a_short_wait() {
    let raw = "18446744073709551616";
    let (d, _) = decide_hint(raw, Some(s(300)), true);
    assert_eq!(d, Decision::Stop(Outcome::HintExceedsCap));
    // Without a hint cap the enormous wait cannot fit the budget.
    let (d, intent) = decide_hint(raw, None, true);
    assert_eq!(d, Decision::Stop(Outcome::DeadlineInfeasible));
    assert_eq!(intent.records()[0].next_start, Some(Duration::MAX));
}

#[test]
fn dates_are_converted_once_against_the_receipt_wall_time() {
    // Received at 12:00:02: a date of 12:00:07 is 5 s away.
    let (d, intent) = decide_hint("Mon, 01 Jan 2024 12:00:07 GMT", None, true);
    assert_eq!(wait_of(d), s(5));
    assert_eq!(
        intent.records()[0].hint.as_ref().map(|h| h.form),
        Some(HintForm::Date)
    );
    for raw in ["Monday, 01-Jan-24 12:00:07 GMT", "Mon Jan  1 12:00:07 2024"] {
        assert_eq!(wait_of(decide_hint(raw, None, true).0), s(5), "{raw}");
    }
}

#[test]
fn lowercase_and_malformed_dates_are_invalid() {
    for raw in [
        "mon, 01 jan 2024 12:00:07 gmt",
        "Mon, 01 Jan 2024 25:00:07 GMT",
        "2024-01-01T12:00:07Z",
    ] {
        let (d, intent) = decide_hint(raw, None, true);
        assert_eq!(wait_of(d), s(2), "{raw}");
        assert_eq!(
            intent.records()[0].hint.as_ref().map(|h| h.verdict),
            Some(HintVerdict::Invalid(InvalidHint::Malformed))
        );
    }
}

#[test]
fn a_past_date_is_zero_then_floored() {
    let (d, intent) = decide_hint("Mon, 01 Jan 2024 11:00:00 GMT", None, true);
    assert_eq!(wait_of(d), s(1), "min_wait floors a past date");
    assert_eq!(
        intent.records()[0].hint.as_ref().map(|h| h.verdict),
        Some(HintVerdict::Valid {
            delay: Duration::ZERO,
            past: true
        })
    );
}

#[test]
fn a_date_a_century_out_exceeds_the_cap_or_the_deadline() {
    let raw = "Sat, 01 Jan 2124 12:00:00 GMT";
    assert_eq!(
        decide_hint(raw, Some(s(60)), true).0,
        Decision::Stop(Outcome::HintExceedsCap)
    );
    assert_eq!(
        decide_hint(raw, None, true).0,
        Decision::Stop(Outcome::DeadlineInfeasible)
    );
}

#[test]
fn an_untrusted_clock_refuses_a_date_but_honours_a_delay() {
    assert_eq!(
        decide_hint("Mon, 01 Jan 2024 12:00:07 GMT", None, false).0,
        Decision::Stop(Outcome::ClockUntrusted)
    );
    assert_eq!(wait_of(decide_hint("3", None, false).0), s(3));
}

#[test]
fn a_hint_above_max_hint_stops_and_is_never_shortened() {
    let (d, intent) = decide_hint("11", Some(s(10)), true);
    assert_eq!(d, Decision::Stop(Outcome::HintExceedsCap));
    assert_eq!(intent.outcome(), Some((Outcome::HintExceedsCap, s(2))));
    assert_eq!(wait_of(decide_hint("10", Some(s(10)), true).0), s(10));
}

#[test]
fn grpc_pushback_is_a_hint_and_a_negative_one_means_stop() {
    let mut intent = fresh();
    let obs = Observation::grpc(GrpcCode::ResourceExhausted, Sent::After, Some("1500"));
    assert_eq!(wait_of(first(&mut intent, s(1), obs)), ms(1500));
    let mut intent = fresh();
    let obs = Observation::grpc(GrpcCode::ResourceExhausted, Sent::After, Some("-1"));
    assert_eq!(
        first(&mut intent, s(1), obs),
        Decision::Stop(Outcome::NonRetryable)
    );
}

#[test]
fn an_absent_hint_uses_the_backoff_for_the_attempts_completed() {
    let mut intent = fresh();
    let d = first(&mut intent, s(2), http(429, None));
    assert_eq!(wait_of(d), s(2));
    let t = wake_and_start(&mut intent, d);
    let d = intent
        .on_response(t + s(1), http(503, None), &mut rng())
        .expect("response");
    assert_eq!(wait_of(d), s(4));
}
