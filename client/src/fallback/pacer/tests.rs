use std::time::Duration;

use super::{ASK_AGAIN_WITHIN, LocalPacer, Pace};

fn ms(ms: u64) -> Duration {
    Duration::from_millis(ms)
}

/// `n` answers at `at`, all accepted or all rejected.
fn answers(pacer: &mut LocalPacer, at: Duration, n: u64, accepted: bool) {
    for _ in 0..n {
        pacer.answered(at, accepted);
    }
}

/// Wake-ups let go from `from` to before `to` by a backlog that always
/// waits: every `tick` each waiter asks until one is told "not yet".
fn let_go(pacer: &mut LocalPacer, from: Duration, to: Duration, tick: Duration) -> u64 {
    let mut gone = 0;
    let mut at = from;
    while at < to {
        while pacer.wake(at, 0.5) == Pace::Go {
            gone += 1;
        }
        at += tick;
    }
    gone
}

/// A worker the upstream served 80 a second, then pushed back on (window
/// 1), then answered nothing while everything was held (windows 2 to 4).
fn after_an_outage() -> LocalPacer {
    let mut pacer = LocalPacer::new(1.0);
    answers(&mut pacer, ms(100), 80, true);
    answers(&mut pacer, ms(1_100), 10, false);
    pacer
}

#[test]
fn a_pacer_never_pushed_back_on_lets_everything_go() {
    let mut pacer = LocalPacer::new(1.0);
    answers(&mut pacer, ms(100), 50, true);
    for at in [ms(200), ms(1_500), ms(9_000)] {
        for _ in 0..500 {
            assert_eq!(pacer.wake(at, 0.5), Pace::Go);
        }
    }
    assert_eq!(pacer.rate(ms(9_000)), None);
}

#[test]
fn after_an_outage_wake_ups_climb_from_the_floor_by_an_eighth_of_what_was_served() {
    let mut pacer = after_an_outage();
    // Window 5 climbs from the floor (1) to 1 + 80/8: about 1 + 5 let go,
    // plus the one that goes at once.
    let first = let_go(&mut pacer, ms(5_000), ms(6_000), ms(10));
    assert!((6..=8).contains(&first), "first window let go {first}");
    // Each window whose rate was used doubles the step: 11 → 31, 31 → 71.
    let second = let_go(&mut pacer, ms(6_000), ms(7_000), ms(10));
    assert!((19..=23).contains(&second), "second window let go {second}");
    let third = let_go(&mut pacer, ms(7_000), ms(8_000), ms(10));
    assert!((48..=54).contains(&third), "third window let go {third}");
    let rate = pacer.rate(ms(8_500)).expect("still pacing");
    assert!((110.0..=112.0).contains(&rate), "rate {rate}");
}

#[test]
fn a_held_wake_up_asks_again_within_the_horizon_at_its_draw() {
    let mut pacer = after_an_outage();
    assert_eq!(pacer.wake(ms(5_000), 0.5), Pace::Go);
    assert_eq!(pacer.wake(ms(5_000), 0.0), Pace::Later(ms(1)));
    assert_eq!(
        pacer.wake(ms(5_000), 0.5),
        Pace::Later(ASK_AGAIN_WITHIN / 2)
    );
}

#[test]
fn a_rejection_while_paced_goes_back_to_what_the_last_clean_window_let_go() {
    let mut pacer = after_an_outage();
    let_go(&mut pacer, ms(5_000), ms(6_000), ms(10));
    let clean = let_go(&mut pacer, ms(6_000), ms(7_000), ms(10)) as f64;
    let_go(&mut pacer, ms(7_000), ms(7_500), ms(10));
    // Window 7 runs from 31 towards 71; at its middle the rate is 51.
    let rate = pacer.rate(ms(7_500)).expect("pacing");
    assert!((50.0..=52.0).contains(&rate), "rate {rate}");
    // Back to what window 6 let go (about 21 a second), not to the 31 it
    // had climbed to by its end.
    pacer.answered(ms(7_500), false);
    assert_eq!(pacer.rate(ms(7_500)), Some(clean));
    assert_eq!(pacer.rate(ms(7_900)), Some(clean), "no climb after a cut");
    let_go(&mut pacer, ms(7_500), ms(8_000), ms(10));
    // After a cut the rate climbs a sixteenth of itself a window.
    let rate = pacer
        .rate(ms(9_000) - Duration::from_nanos(1))
        .expect("pacing");
    let climbed = clean + (clean / 16.0).max(1.0);
    assert!((rate - climbed).abs() < 1e-3, "rate {rate}, want {climbed}");
}

#[test]
fn slow_start_cut_without_a_clean_window_halves_once_per_window() {
    let mut pacer = after_an_outage();
    let_go(&mut pacer, ms(5_000), ms(5_500), ms(10));
    // Half way up from 1 to 11.
    assert_eq!(pacer.rate(ms(5_500)), Some(6.0));
    pacer.answered(ms(5_500), false);
    assert_eq!(pacer.rate(ms(5_500)), Some(3.0));
    pacer.answered(ms(5_800), false);
    assert_eq!(pacer.rate(ms(5_800)), Some(3.0), "one cut a window");
    // The next window's rejection may cut again, never below the floor.
    pacer.answered(ms(6_000), false);
    assert_eq!(pacer.rate(ms(6_000)), Some(1.5));
    pacer.answered(ms(7_000), false);
    pacer.answered(ms(8_000), false);
    assert_eq!(pacer.rate(ms(8_000)), Some(1.0));
}

#[test]
fn a_window_whose_demand_the_rate_met_ends_the_pacing() {
    let mut pacer = after_an_outage();
    let_go(&mut pacer, ms(5_000), ms(7_000), ms(10));
    // Window 7: only three wake-ups, all served.
    for at in [ms(7_100), ms(7_200), ms(7_300)] {
        assert_eq!(pacer.wake(at, 0.5), Pace::Go);
        pacer.answered(at, true);
    }
    assert_eq!(pacer.rate(ms(8_000)), None);
    for _ in 0..200 {
        assert_eq!(pacer.wake(ms(8_000), 0.5), Pace::Go);
    }
}

#[test]
fn a_window_with_nobody_waiting_ends_the_pacing() {
    let mut pacer = after_an_outage();
    let_go(&mut pacer, ms(5_000), ms(6_000), ms(10));
    assert!(pacer.rate(ms(6_000)).is_some());
    assert_eq!(pacer.rate(ms(7_500)), None, "nobody woke in window 6");
    // Still pressed (no answer since the rejections): a new backlog starts
    // over from the floor.
    assert_eq!(pacer.wake(ms(7_500), 0.5), Pace::Go);
    assert_eq!(pacer.rate(ms(7_500)), Some(6.0));
}

#[test]
fn rejections_that_start_the_pacing_do_not_count_as_a_cut() {
    let mut pacer = LocalPacer::new(1.0);
    answers(&mut pacer, ms(100), 80, true);
    // Window 1 is pushed back on, and the backlog starts pacing in it.
    answers(&mut pacer, ms(1_000), 5, false);
    let_go(&mut pacer, ms(1_000), ms(2_000), ms(10));
    // Slow start carries on: 11 at the window's end, then a step of 20.
    assert_eq!(pacer.rate(ms(2_500)), Some(21.0));
}

#[test]
fn a_zero_floor_still_climbs() {
    let mut pacer = LocalPacer::new(0.0);
    answers(&mut pacer, ms(100), 3, false);
    let gone = let_go(&mut pacer, ms(100), ms(3_000), ms(10));
    assert!(gone >= 3, "let go {gone}");
}

#[test]
fn a_window_paced_from_its_middle_counts_its_rate_over_that_part() {
    let mut pacer = after_an_outage();
    // Paced from 5.5 s: 6 a second climbing to 11, about 5 let go in half a
    // second, which is a rate of about 10, not 5.
    let gone = let_go(&mut pacer, ms(5_500), ms(6_000), ms(10));
    pacer.answered(ms(6_000), false);
    let rate = pacer.rate(ms(6_000)).expect("pacing");
    assert_eq!(rate, gone as f64 * 2.0);
    assert!((8.0..=11.0).contains(&rate), "rate {rate}");
}
