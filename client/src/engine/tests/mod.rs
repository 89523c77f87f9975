//! One test per branch of the decision order and per misuse the engine
//! refuses. Every hint form is in `hints`, the wait and what ends it in
//! `reconsideration`, a held first attempt in `hold`; the helpers here serve
//! them all.

use std::time::Duration;

use rand::SeedableRng;
use rand::rngs::StdRng;

use super::*;
use crate::backoff::{Backoff, Jitter};
use crate::classify::{GrpcCode, Sent, TransportFailure};
use crate::hint::HintForm;

const NOON: &str = "Mon, 01 Jan 2024 12:00:00 GMT";

fn s(secs: u64) -> Duration {
    Duration::from_secs(secs)
}

fn ms(millis: u64) -> Duration {
    Duration::from_millis(millis)
}

/// README's schedule-a policy: 20 s budget, 3 attempts, 4 s cap, 1 s floor,
/// backoff 1 s base, 60 s cap, no jitter, no hint cap.
fn policy() -> IntentPolicy {
    policy_with(None)
}

fn policy_with(max_hint: Option<Duration>) -> IntentPolicy {
    IntentPolicy::try_new(
        s(20),
        3,
        s(4),
        s(1),
        Backoff {
            base: s(1),
            cap: s(60),
            jitter: Jitter::None,
        },
        max_hint,
    )
    .expect("valid policy")
}

fn spec(repetition: RepetitionKind) -> IntentSpec {
    IntentSpec {
        intent_id: "intent-1".to_owned(),
        repetition,
        retry_owner: RetryOwner::Here,
        wall_at_start: httpdate::parse_http_date(NOON).expect("date"),
        clock_trusted: true,
    }
}

fn fresh() -> Intent {
    Intent::new(spec(RepetitionKind::Safe), policy())
}

fn rng() -> StdRng {
    StdRng::seed_from_u64(42)
}

/// Starts attempt 1 at 0 and answers it at `receipt`.
fn first(intent: &mut Intent, receipt: Duration, obs: Observation) -> Decision {
    intent.start_attempt(Duration::ZERO).expect("start");
    intent
        .on_response(receipt, obs, &mut rng())
        .expect("response")
}

fn http(status: u16, hint: Option<&str>) -> Observation {
    Observation::http(status, hint)
}

fn wait_of(decision: Decision) -> Duration {
    match decision {
        Decision::Wait { wait, .. } => wait,
        other => panic!("expected a wait, got {other:?}"),
    }
}

/// Waits out a `Wait` at exactly `next_start` and starts the next attempt.
fn wake_and_start(intent: &mut Intent, decision: Decision) -> Duration {
    let Decision::Wait { next_start, .. } = decision else {
        panic!("expected a wait, got {decision:?}");
    };
    assert_eq!(
        intent.on_wake(next_start, WakeCheck::default()),
        Ok(WakeDecision::Start)
    );
    intent.start_attempt(next_start).expect("start");
    next_start
}

// --- Classification -------------------------------------------------

#[test]
fn success_ends_the_intent() {
    let mut intent = fresh();
    assert_eq!(
        first(&mut intent, s(2), http(200, None)),
        Decision::Stop(Outcome::Succeeded)
    );
    assert_eq!(intent.outcome(), Some((Outcome::Succeeded, s(2))));
    let record = &intent.records()[0];
    assert_eq!(record.hint, None, "a success consults no hint");
    assert_eq!(record.remaining, None);
}

#[test]
fn other_4xx_and_409_stop_as_non_retryable() {
    for status in [400, 404, 409, 422] {
        let mut intent = fresh();
        assert_eq!(
            first(&mut intent, s(1), http(status, Some("1"))),
            Decision::Stop(Outcome::NonRetryable),
            "{status}"
        );
    }
}

#[test]
fn a_500_is_retried_at_most_once() {
    let mut intent = fresh();
    let d = first(&mut intent, s(1), http(500, None));
    assert_eq!(wait_of(d), s(2), "fallback after one attempt");
    let t = wake_and_start(&mut intent, d);
    assert_eq!(
        intent.on_response(t + s(1), http(500, None), &mut rng()),
        Ok(Decision::Stop(Outcome::NonRetryable))
    );
}

#[test]
fn a_500_after_other_failures_still_gets_its_one_retry() {
    let mut intent = fresh();
    let d = first(&mut intent, s(1), http(503, Some("1")));
    let t = wake_and_start(&mut intent, d);
    let d = intent
        .on_response(t + s(1), http(500, None), &mut rng())
        .expect("response");
    assert!(matches!(d, Decision::Wait { .. }));
}

// --- Effect and repetition ----------------------------------------

#[test]
fn an_unknown_effect_needs_a_repeat_safe_operation() {
    let timeout = || Observation::transport(TransportFailure::Timeout);
    let cases = [
        (RepetitionKind::Safe, None),
        (RepetitionKind::IdempotencyKey, None),
        (
            RepetitionKind::Reconcilable,
            Some(Outcome::ReconciliationRequired),
        ),
        (RepetitionKind::NonRepeatable, Some(Outcome::Indeterminate)),
    ];
    for (repetition, expected) in cases {
        let mut intent = Intent::new(spec(repetition), policy());
        let d = first(&mut intent, s(4), timeout());
        match expected {
            Some(outcome) => assert_eq!(d, Decision::Stop(outcome), "{repetition:?}"),
            None => assert!(matches!(d, Decision::Wait { .. }), "{repetition:?}"),
        }
    }
}

#[test]
fn a_known_absent_effect_may_be_sent_again_even_if_non_repeatable() {
    for obs in [
        http(429, Some("1")),
        http(408, None),
        Observation::transport(TransportFailure::ConnectRefused),
        Observation::transport(TransportFailure::Dns),
        Observation::grpc(GrpcCode::DeadlineExceeded, Sent::Before, None),
    ] {
        let mut intent = Intent::new(spec(RepetitionKind::NonRepeatable), policy());
        let d = first(&mut intent, s(1), obs.clone());
        assert!(matches!(d, Decision::Wait { .. }), "{obs:?}");
    }
}

#[test]
fn a_server_error_is_retried_only_when_repeat_safe() {
    // A 503 may come from a gateway whose upstream already acted: like 500,
    // 502 and 504 it is retried only for an operation safe to repeat.
    for status in [500, 502, 503, 504] {
        let mut once = Intent::new(spec(RepetitionKind::NonRepeatable), policy());
        assert_eq!(
            first(&mut once, s(1), http(status, None)),
            Decision::Stop(Outcome::Indeterminate),
            "{status} non-repeatable"
        );
        for repetition in [RepetitionKind::Safe, RepetitionKind::IdempotencyKey] {
            let mut safe = Intent::new(spec(repetition), policy());
            let d = first(&mut safe, s(1), http(status, Some("1")));
            assert!(
                matches!(d, Decision::Wait { .. }),
                "{status} {repetition:?}"
            );
        }
    }
}

#[test]
fn a_gateway_error_or_grpc_deadline_after_send_is_an_unknown_effect() {
    for obs in [
        http(502, None),
        http(503, None),
        http(504, None),
        Observation::grpc(GrpcCode::DeadlineExceeded, Sent::After, None),
        Observation::grpc(GrpcCode::Unavailable, Sent::After, None),
    ] {
        let mut intent = Intent::new(spec(RepetitionKind::Reconcilable), policy());
        assert_eq!(
            first(&mut intent, s(1), obs.clone()),
            Decision::Stop(Outcome::ReconciliationRequired),
            "{obs:?}"
        );
    }
}

// --- Owner -----------------------------------------------------------

#[test]
fn another_owner_means_propagate_not_retry() {
    let mut spec = spec(RepetitionKind::Safe);
    spec.retry_owner = RetryOwner::Elsewhere;
    let mut intent = Intent::new(spec, policy());
    assert_eq!(
        first(&mut intent, s(1), http(429, Some("1"))),
        Decision::Stop(Outcome::OwnerElsewhere)
    );
    // Success is still success: ownership only matters for a retry.
    let mut spec = self::spec(RepetitionKind::Safe);
    spec.retry_owner = RetryOwner::Elsewhere;
    let mut intent = Intent::new(spec, policy());
    assert_eq!(
        first(&mut intent, s(1), http(200, None)),
        Decision::Stop(Outcome::Succeeded)
    );
}

// --- Attempt cap -----------------------------------------------------

#[test]
fn the_attempt_cap_stops_and_keeps_the_hint_as_evidence() {
    let mut intent = fresh();
    let mut d = first(&mut intent, s(1), http(429, Some("1")));
    for _ in 0..2 {
        let t = wake_and_start(&mut intent, d);
        d = intent
            .on_response(t + s(1), http(429, Some("1")), &mut rng())
            .expect("response");
    }
    assert_eq!(d, Decision::Stop(Outcome::AttemptCap));
    assert_eq!(intent.attempts_started(), 3);
    let last = intent.records().last().expect("records");
    assert_eq!(last.hint.as_ref().map(|h| h.form), Some(HintForm::Delay));
    assert_eq!(last.wait, None, "no wait was planned");
}

// --- The deadline gate at receipt ------------------------------------

#[test]
fn a_wait_that_cannot_fit_the_reserve_stops_at_receipt() {
    // The worked example in docs/decision-order.md: 12 s left, Retry-After 10,
    // a 3 s reserve.
    let policy = IntentPolicy::try_new(s(12), 3, s(3), Duration::ZERO, policy().backoff(), None)
        .expect("policy");
    let mut intent = Intent::new(spec(RepetitionKind::Safe), policy);
    assert_eq!(
        first(&mut intent, Duration::ZERO, http(429, Some("10"))),
        Decision::Stop(Outcome::DeadlineInfeasible)
    );
    assert_eq!(
        intent.outcome(),
        Some((Outcome::DeadlineInfeasible, Duration::ZERO))
    );
    let record = &intent.records()[0];
    assert_eq!(
        record.wait,
        Some(s(10)),
        "the infeasibility calculation is kept"
    );
    assert_eq!(record.next_start, Some(s(10)));
    assert_eq!(record.remaining, Some(s(12)));
    assert_eq!(intent.waited_time(), Duration::ZERO, "no pointless wait");
}

#[test]
fn a_start_exactly_at_the_limit_fits() {
    let intent = fresh();
    assert!(intent.fits(s(16)));
    assert!(!intent.fits(s(16) + Duration::from_nanos(1)));
    assert!(!intent.fits(Duration::MAX));
}

// --- Misuse and records --------------------------------------------------------

#[test]
fn time_may_not_go_backwards_and_attempts_may_not_overrun() {
    let mut intent = fresh();
    intent.start_attempt(s(1)).expect("start");
    assert_eq!(
        intent.on_response(ms(500), http(200, None), &mut rng()),
        Err(EngineError::TimeWentBack {
            now: ms(500),
            previous: s(1)
        })
    );
    assert_eq!(
        intent.on_response(s(6), http(200, None), &mut rng()),
        Err(EngineError::AttemptOverran {
            start: s(1),
            receipt: s(6),
            cap: s(4)
        })
    );
}

#[test]
fn policies_that_cannot_admit_an_attempt_are_refused() {
    let b = policy().backoff();
    let z = Duration::ZERO;
    assert_eq!(
        IntentPolicy::try_new(s(20), 0, s(4), z, b, None),
        Err(PolicyError::NoAttempts)
    );
    assert_eq!(
        IntentPolicy::try_new(s(20), 1, z, z, b, None),
        Err(PolicyError::ZeroAttemptCap)
    );
    assert_eq!(
        IntentPolicy::try_new(s(3), 1, s(4), z, b, None),
        Err(PolicyError::CapExceedsBudget {
            cap: s(4),
            budget: s(3)
        })
    );
}

#[test]
fn every_attempt_has_one_record_bound_to_the_intent() {
    let mut intent = fresh();
    let d = first(&mut intent, s(2), http(429, Some("3")));
    let t = wake_and_start(&mut intent, d);
    intent
        .on_response(t + s(3), http(200, None), &mut rng())
        .expect("response");
    let records = intent.records();
    assert_eq!(records.len(), 2);
    assert_eq!(records[0].attempt_id, "intent-1#1");
    assert_eq!(records[1].attempt_id, "intent-1#2");
    assert!(records.iter().all(|r| r.intent_id == "intent-1"));
    assert_eq!(records[0].decision, Some(RecordDecision::Wait));
    assert_eq!(records[0].remaining, Some(s(18)));
    assert_eq!(records[1].start, s(5));
    assert_eq!(intent.last_status(), Some(ResponseStatus::Http(200)));
    assert_eq!(intent.request_time(), s(5));
    assert_eq!(intent.waited_time(), s(3));
}

#[test]
fn outcome_names_are_snake_case_everywhere() {
    let all = [
        Outcome::Succeeded,
        Outcome::Cancelled,
        Outcome::DeadlineInfeasible,
        Outcome::AttemptCap,
        Outcome::BudgetExhausted,
        Outcome::NonRetryable,
        Outcome::ClockUntrusted,
        Outcome::HintExceedsCap,
        Outcome::CapacityUnavailable,
        Outcome::OwnerElsewhere,
        Outcome::ReconciliationRequired,
        Outcome::Indeterminate,
    ];
    for outcome in all {
        let json = serde_json::to_string(&outcome).expect("serialize");
        assert_eq!(json, format!("\"{}\"", outcome.as_str()));
        assert_eq!(RecordDecision::Stop(outcome).as_str(), outcome.as_str());
    }
    assert_eq!(
        Outcome::DeadlineInfeasible.to_string(),
        "deadline_infeasible"
    );
}

mod hints;
mod hold;
mod reconsideration;
