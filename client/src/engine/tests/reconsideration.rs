//! A waiting intent at its reconsideration: a wake re-runs the deadline gate
//! at the current time, cancellation and completion evidence end the wait,
//! an admission holds for its instant only, a defer only moves later, and
//! the gate may refuse for budget, capacity or owner.

use super::*;

#[test]
fn a_late_wake_re_checks_the_deadline_at_the_current_time() {
    let mut intent = fresh();
    // 2 + 12 = 14; 14 + 4 = 18 fits at receipt.
    let d = first(&mut intent, s(2), http(429, Some("12")));
    assert_eq!(
        d,
        Decision::Wait {
            next_start: s(14),
            wait: s(12)
        }
    );
    // Woken at 17: 17 + 4 = 21 > 20.
    assert_eq!(
        intent.on_wake(s(17), WakeCheck::default()),
        Ok(WakeDecision::Stop(Outcome::DeadlineInfeasible))
    );
    assert_eq!(intent.outcome(), Some((Outcome::DeadlineInfeasible, s(17))));
    assert_eq!(intent.waited_time(), s(15), "the late part was waited too");
    assert_eq!(intent.records()[0].woke, Some(s(17)));
}

#[test]
fn a_wake_before_next_start_is_refused() {
    let mut intent = fresh();
    first(&mut intent, s(2), http(429, Some("3")));
    assert_eq!(
        intent.on_wake(s(4), WakeCheck::default()),
        Err(EngineError::EarlyWake {
            now: s(4),
            next_start: s(5)
        })
    );
}

#[test]
fn cancellation_at_wake_stops_before_any_start() {
    let mut intent = fresh();
    first(&mut intent, s(2), http(429, Some("3")));
    assert_eq!(
        intent.on_wake(s(5), WakeCheck { cancelled: true }),
        Ok(WakeDecision::Stop(Outcome::Cancelled))
    );
    assert!(matches!(
        intent.start_attempt(s(5)),
        Err(EngineError::WrongPhase { .. })
    ));
    assert_eq!(intent.attempts_started(), 1);
}

#[test]
fn cancel_while_waiting_drops_the_delayed_attempt() {
    let mut intent = fresh();
    first(&mut intent, s(2), http(429, Some("3")));
    assert_eq!(intent.cancel(s(3)), Ok(Outcome::Cancelled));
    assert_eq!(intent.waited_time(), s(1));
    assert!(matches!(
        intent.on_wake(s(5), WakeCheck::default()),
        Err(EngineError::WrongPhase { .. })
    ));
    assert_eq!(intent.outcome(), Some((Outcome::Cancelled, s(3))));
}

#[test]
fn cancel_in_flight_discards_the_response() {
    let mut intent = fresh();
    intent.start_attempt(Duration::ZERO).expect("start");
    assert_eq!(intent.cancel(s(1)), Ok(Outcome::Cancelled));
    let record = &intent.records()[0];
    assert!(record.response_discarded);
    assert_eq!(
        record.decision,
        Some(RecordDecision::Stop(Outcome::Cancelled))
    );
    assert_eq!(intent.request_time(), s(1));
    assert!(matches!(
        intent.on_response(s(2), http(200, None), &mut rng()),
        Err(EngineError::WrongPhase { .. })
    ));
    assert_eq!(intent.last_status(), None);
}

#[test]
fn cancel_before_the_first_start_and_after_the_end() {
    let mut intent = fresh();
    assert_eq!(intent.cancel(Duration::ZERO), Ok(Outcome::Cancelled));
    assert_eq!(intent.attempts_started(), 0);

    let mut done = fresh();
    first(&mut done, s(1), http(200, None));
    assert_eq!(done.cancel(s(2)), Ok(Outcome::Succeeded), "the end stands");
}

#[test]
fn an_admission_is_for_its_instant_only() {
    let mut intent = fresh();
    first(&mut intent, s(2), http(429, Some("3")));
    assert_eq!(
        intent.on_wake(s(5), WakeCheck::default()),
        Ok(WakeDecision::Start)
    );
    assert_eq!(
        intent.start_attempt(s(6)),
        Err(EngineError::StaleAdmission {
            admitted_at: s(5),
            now: s(6)
        })
    );
}

#[test]
fn defer_moves_later_and_re_runs_the_deadline_gate() {
    let mut intent = fresh();
    first(&mut intent, s(2), http(429, Some("3")));
    assert_eq!(
        intent.defer(s(2), s(4)),
        Err(EngineError::DeferEarlier {
            until: s(4),
            next_start: s(5)
        })
    );
    assert_eq!(
        intent.defer(s(2), s(9)),
        Ok(Decision::Wait {
            next_start: s(9),
            wait: s(7)
        })
    );
    assert_eq!(intent.records()[0].next_start, Some(s(9)));
    assert!(matches!(
        intent.on_wake(s(5), WakeCheck::default()),
        Err(EngineError::EarlyWake { .. })
    ));
    assert_eq!(
        intent.defer(s(3), s(17)),
        Ok(Decision::Stop(Outcome::DeadlineInfeasible))
    );
    assert_eq!(intent.outcome(), Some((Outcome::DeadlineInfeasible, s(3))));
}

#[test]
fn the_gate_can_refuse_for_budget_capacity_or_owner() {
    for (refusal, outcome) in [
        (GateRefusal::BudgetExhausted, Outcome::BudgetExhausted),
        (
            GateRefusal::CapacityUnavailable,
            Outcome::CapacityUnavailable,
        ),
        (GateRefusal::OwnerElsewhere, Outcome::OwnerElsewhere),
    ] {
        let mut intent = fresh();
        first(&mut intent, s(2), http(429, Some("3")));
        assert_eq!(intent.refuse(s(5), refusal), Ok(outcome));
        assert_eq!(intent.outcome(), Some((outcome, s(5))));
        assert_eq!(intent.waited_time(), s(3));
    }
    let mut in_flight = fresh();
    in_flight.start_attempt(Duration::ZERO).expect("start");
    assert!(
        in_flight
            .refuse(s(1), GateRefusal::BudgetExhausted)
            .is_err()
    );
}

#[test]
fn completion_evidence_while_waiting_ends_succeeded_without_another_start() {
    let mut intent = fresh();
    first(&mut intent, s(2), http(429, Some("3")));
    assert_eq!(intent.complete(s(3)), Ok(Outcome::Succeeded));
    assert_eq!(intent.outcome(), Some((Outcome::Succeeded, s(3))));
    assert_eq!(intent.waited_time(), s(1));
    assert!(matches!(
        intent.on_wake(s(5), WakeCheck::default()),
        Err(EngineError::WrongPhase { .. })
    ));
    assert_eq!(intent.attempts_started(), 1);

    let mut in_flight = fresh();
    in_flight.start_attempt(Duration::ZERO).expect("start");
    assert!(matches!(
        in_flight.complete(s(1)),
        Err(EngineError::WrongPhase { .. })
    ));
}
