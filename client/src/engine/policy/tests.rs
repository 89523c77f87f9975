//! The builder's defaults, and its errors: the ones `try_new` gives for the
//! same rules, since `build` validates through it.

use std::time::Duration;

use super::*;

fn s(secs: u64) -> Duration {
    Duration::from_secs(secs)
}

#[test]
fn a_deadline_alone_gets_every_documented_default() {
    let policy = IntentPolicy::builder(s(30))
        .build()
        .expect("defaults are valid");
    assert_eq!(policy.total_budget(), s(30));
    assert_eq!(policy.max_attempts(), DEFAULT_MAX_ATTEMPTS);
    assert_eq!(policy.attempt_cap(), s(10), "an even share of 30 s");
    assert_eq!(policy.min_wait(), DEFAULT_MIN_WAIT);
    assert_eq!(policy.backoff(), DEFAULT_BACKOFF);
    assert_eq!(policy.max_hint(), Some(DEFAULT_MAX_HINT));
}

#[test]
fn the_defaults_have_their_documented_values() {
    assert_eq!(DEFAULT_MAX_ATTEMPTS, 3);
    assert_eq!(DEFAULT_MIN_WAIT, Duration::ZERO);
    assert_eq!(DEFAULT_MAX_HINT, s(300));
    // The coordinator's built-in scope backoff: 500 ms after the first
    // attempt, doubling, at most 30 s.
    let steps: Vec<u128> = (1..=8)
        .map(|n| DEFAULT_BACKOFF.ceiling(n).as_millis())
        .collect();
    assert_eq!(
        steps,
        [500, 1_000, 2_000, 4_000, 8_000, 16_000, 30_000, 30_000]
    );
    assert_eq!(DEFAULT_BACKOFF.jitter, Jitter::Full);
}

#[test]
fn the_default_reserve_follows_the_attempt_count_in_either_order() {
    let policy = IntentPolicy::builder(s(30)).max_attempts(5).build();
    assert_eq!(policy.map(|p| p.attempt_cap()), Ok(s(6)));
    let one = IntentPolicy::builder(s(30)).max_attempts(1).build();
    assert_eq!(one.map(|p| p.attempt_cap()), Ok(s(30)), "all of it");
    let set_first = IntentPolicy::builder(s(30))
        .attempt_cap(s(2))
        .max_attempts(5)
        .build();
    assert_eq!(
        set_first.map(|p| p.attempt_cap()),
        Ok(s(2)),
        "a set reserve stays"
    );
}

#[test]
fn every_rule_set_is_the_rule_built() {
    let backoff = Backoff {
        base: s(1),
        cap: s(8),
        jitter: Jitter::None,
    };
    let built = IntentPolicy::builder(s(20))
        .max_attempts(4)
        .attempt_cap(s(3))
        .min_wait(Duration::from_millis(100))
        .backoff(backoff)
        .max_hint(s(60))
        .build();
    let positional = IntentPolicy::try_new(
        s(20),
        4,
        s(3),
        Duration::from_millis(100),
        backoff,
        Some(s(60)),
    );
    assert_eq!(built, positional);
    assert!(built.is_ok());
    let unbounded = IntentPolicy::builder(s(20)).max_hint(None).build();
    assert_eq!(unbounded.map(|p| p.max_hint()), Ok(None));
}

#[test]
fn a_zero_deadline_is_refused_as_such_not_as_the_reserve_derived_from_it() {
    assert_eq!(
        IntentPolicy::builder(Duration::ZERO).build(),
        Err(PolicyError::ZeroBudget)
    );
    let b = DEFAULT_BACKOFF;
    assert_eq!(
        IntentPolicy::try_new(Duration::ZERO, 1, s(1), Duration::ZERO, b, None),
        Err(PolicyError::ZeroBudget)
    );
}

#[test]
fn no_attempts_is_refused() {
    assert_eq!(
        IntentPolicy::builder(s(30)).max_attempts(0).build(),
        Err(PolicyError::NoAttempts)
    );
}

#[test]
fn a_zero_reserve_is_refused() {
    assert_eq!(
        IntentPolicy::builder(s(30))
            .attempt_cap(Duration::ZERO)
            .build(),
        Err(PolicyError::ZeroAttemptCap)
    );
}

#[test]
fn a_reserve_longer_than_the_deadline_is_refused() {
    assert_eq!(
        IntentPolicy::builder(s(3)).attempt_cap(s(4)).build(),
        Err(PolicyError::CapExceedsBudget {
            cap: s(4),
            budget: s(3)
        })
    );
}
