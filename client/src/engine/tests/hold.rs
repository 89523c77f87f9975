//! Holding the first attempt inside a known cooldown: the hold only moves
//! the first start later, runs the deadline gate, and ends a fresh intent
//! with no attempt when the held start cannot fit.

use super::*;

#[test]
fn a_held_first_attempt_starts_at_the_hold_and_counts_it_as_waiting() {
    let mut intent = fresh();
    assert_eq!(
        intent.hold(ms(100), s(5)),
        Ok(Decision::Wait {
            next_start: s(5),
            wait: s(5) - ms(100),
        })
    );
    assert_eq!(intent.phase(), Phase::Fresh);
    assert_eq!(intent.held_until(), Some(s(5)));
    // A coordinator slot after the cooldown moves it later still.
    assert!(matches!(intent.hold(s(1), s(6)), Ok(Decision::Wait { .. })));
    let start = intent.start_attempt(s(6)).expect("start at the hold");
    assert_eq!(start.number, 1, "still the first attempt");
    assert_eq!(intent.waited_time(), s(6) - ms(100));
}

#[test]
fn a_hold_until_an_instant_already_past_waits_for_nothing() {
    // Real clocks move between two readings: the gate may ask to hold until
    // the instant it read just before `now`.
    let mut intent = fresh();
    assert_eq!(
        intent.hold(ms(100), ms(99)),
        Ok(Decision::Wait {
            next_start: ms(99),
            wait: Duration::ZERO,
        })
    );
    let start = intent.start_attempt(ms(100)).expect("start now");
    assert_eq!(start.number, 1);
    assert_eq!(intent.waited_time(), Duration::ZERO);
}

#[test]
fn a_held_first_attempt_may_not_start_early_nor_be_held_earlier() {
    let mut intent = fresh();
    intent.hold(Duration::ZERO, s(5)).expect("hold");
    assert_eq!(
        intent.start_attempt(s(4)),
        Err(EngineError::EarlyWake {
            now: s(4),
            next_start: s(5),
        })
    );
    assert_eq!(
        intent.hold(s(1), s(3)),
        Err(EngineError::DeferEarlier {
            until: s(3),
            next_start: s(5),
        })
    );
    assert_eq!(intent.attempts_started(), 0);
}

#[test]
fn a_hold_that_cannot_fit_the_deadline_ends_the_intent_with_no_attempt() {
    let mut intent = fresh();
    // 20 s budget, 4 s cap: a start at 17 s would end at 21 s.
    assert_eq!(
        intent.hold(ms(10), s(17)),
        Ok(Decision::Stop(Outcome::DeadlineInfeasible))
    );
    assert_eq!(
        intent.outcome(),
        Some((Outcome::DeadlineInfeasible, ms(10)))
    );
    assert_eq!(intent.attempts_started(), 0);
    assert!(intent.records().is_empty());
    assert!(matches!(
        intent.start_attempt(s(17)),
        Err(EngineError::WrongPhase { .. })
    ));
}

#[test]
fn a_hold_is_only_for_the_first_attempt_and_ends_like_a_wait() {
    let mut intent = fresh();
    first(&mut intent, s(1), http(429, Some("2")));
    assert!(matches!(
        intent.hold(s(1), s(3)),
        Err(EngineError::WrongPhase { call: "hold", .. })
    ));

    let mut cancelled = fresh();
    cancelled.hold(Duration::ZERO, s(5)).expect("hold");
    assert_eq!(cancelled.cancel(s(2)), Ok(Outcome::Cancelled));
    assert_eq!(cancelled.waited_time(), s(2));
    assert_eq!(cancelled.attempts_started(), 0);

    let mut frozen = fresh();
    frozen.hold(Duration::ZERO, s(5)).expect("hold");
    assert_eq!(
        frozen.refuse(s(1), GateRefusal::BudgetExhausted),
        Ok(Outcome::BudgetExhausted)
    );
}
