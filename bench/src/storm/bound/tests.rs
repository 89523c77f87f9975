use rand::rngs::StdRng;
use rand::{RngExt, SeedableRng};

use super::*;
use crate::storm::test_config;

fn at(s: f64) -> Duration {
    Duration::from_secs_f64(s)
}

/// An intent arriving at `arrive` s with its deadline at `deadline` s.
fn job(arrive: f64, deadline: f64) -> Job {
    Job {
        arrive: at(arrive),
        last: at(deadline) - NANO,
    }
}

/// No outage within the tests' few seconds.
const NO_OUTAGE: [&str; 4] = ["--outage-start-s", "1000", "--outage-s", "1"];

fn greedy(config: &StormConfig, jobs: &[Job]) -> u64 {
    let arrivals: Vec<Duration> = jobs.iter().map(|j| j.arrive).collect();
    replay(config, jobs, &arrivals)
}

#[test]
fn earliest_deadline_first_not_first_come() {
    // 1 request/s, a bucket of one, full at 0: admissions possible at 0,
    // 1 and 2 s. A takes 0; at 1 s B (deadline 3 s) and C (deadline 1.5 s)
    // wait. First come serves B and loses C; earliest deadline serves C at
    // 1 s and B at 2 s.
    let config = test_config(&[&["--capacity", "1"][..], &NO_OUTAGE].concat());
    let jobs = [job(0.0, 5.0), job(0.2, 3.0), job(0.4, 1.5)];
    let b = bound(&config, &jobs);
    assert_eq!(
        b,
        Bound {
            served: 3,
            witnessed: 3
        }
    );
    assert_eq!(greedy(&config, &jobs), 3);
}

#[test]
fn an_outage_eats_the_intents_whose_deadlines_end_inside_it() {
    // 1 request/s, a bucket of one, full outage 2–6 s (the bank lost at
    // 2 s; the first token after it at 7 s). D lives only inside the
    // outage. B and C must be served before 2 s, on the token held since 0
    // and the one earned at 1 s; A can wait for 7 s. So 3, and D lost.
    let config = test_config(&[
        "--capacity",
        "1",
        "--outage-start-s",
        "2",
        "--outage-s",
        "4",
    ]);
    let jobs = [job(0.0, 10.0), job(0.5, 3.0), job(1.5, 4.0), job(2.5, 5.5)];
    assert_eq!(
        bound(&config, &jobs),
        Bound {
            served: 3,
            witnessed: 3
        }
    );
    // Serving as soon as the limiter allows spends the token held at 0 on
    // A, serves B at 1 s, and C's next token would be at 2 s, when the
    // outage takes it: 2. Why the bound is not that greedy schedule.
    assert_eq!(greedy(&config, &jobs), 2);
}

#[test]
fn a_fixed_window_boundary_serves_two_quotas_at_once_the_others_do_not() {
    // C = 2/s; four intents at 0.9 s that must be sent before 1.5 s.
    let jobs = [job(0.9, 1.5); 4];
    let shaped = |shape: &[&str]| {
        let words = [&["--capacity", "2"][..], &NO_OUTAGE, shape].concat();
        bound(&test_config(&words), &jobs)
    };
    // Fixed 1 s windows of 2: two in [0, 1), two more at the 1 s boundary.
    assert_eq!(
        shaped(&["--limiter", "fixed-window", "--window", "1"]),
        Bound {
            served: 4,
            witnessed: 4
        }
    );
    // Sliding 1 s window of 2: the two sent at 0.9 s count until 1.9 s.
    assert_eq!(
        shaped(&["--limiter", "sliding-window", "--window", "1"]),
        Bound {
            served: 2,
            witnessed: 2
        }
    );
    // A bucket holding 1 s (two): two at 0.9 s, one more at 1.4 s.
    assert_eq!(
        shaped(&["--burst", "1"]),
        Bound {
            served: 3,
            witnessed: 3
        }
    );
}

#[test]
fn the_capacity_in_force_scales_the_windows() {
    // C = 4/s, 1 s fixed windows; a brownout at 0.5 × C over 1–3 s, then
    // 0.25 × C. Quotas per window: 4, 2, 2, 1, 1, ... Ten intents arriving
    // at 0 that may wait until just before 5 s: 4 + 2 + 2 + 1 + 1 = 10,
    // and an eleventh is lost.
    let config = test_config(&[
        "--capacity",
        "4",
        "--limiter",
        "fixed-window",
        "--outage-start-s",
        "1",
        "--outage-s",
        "2",
        "--outage-capacity",
        "0.5",
        "--capacity-after",
        "0.25",
    ]);
    let jobs = [job(0.0, 5.0); 11];
    assert_eq!(
        bound(&config, &jobs),
        Bound {
            served: 10,
            witnessed: 10
        }
    );
}

#[test]
fn jackson_gives_each_slot_to_the_range_that_ends_first() {
    // Slots 0..: the job ending at 0 must have slot 0; the wide one waits.
    let taken = jackson(&[Some((0, 5)), Some((0, 0)), Some((1, 1)), Some((1, 1)), None]);
    assert_eq!(taken, [Some(2), Some(0), Some(1), None, None]);
}

/// The best schedule whose attempts all fall on a grid of `step`, by
/// exhaustive search: at each grid instant, send 0, 1, … of the live jobs,
/// earliest last instant first (for a given count, the best choice).
fn brute_force(config: &StormConfig, jobs: &[Job], step: Duration, until: Duration) -> u64 {
    fn go(
        limiter: &Limiter,
        jobs: &[Job],
        done: u32,
        t: Duration,
        step: Duration,
        until: Duration,
    ) -> u64 {
        if t > until {
            return 0;
        }
        let mut live: Vec<usize> = (0..jobs.len())
            .filter(|&i| done & (1 << i) == 0 && jobs[i].arrive <= t && t <= jobs[i].last)
            .collect();
        live.sort_by_key(|&i| jobs[i].last);
        let mut best = go(limiter, jobs, done, t + step, step, until);
        let (mut limiter, mut done) = (limiter.clone(), done);
        for (n, &i) in live.iter().enumerate() {
            if limiter.offer(t) != Decision::Admit {
                break;
            }
            done |= 1 << i;
            best = best.max(n as u64 + 1 + go(&limiter, jobs, done, t + step, step, until));
        }
        best
    }
    go(
        &Limiter::new(config, 0.0),
        jobs,
        0,
        Duration::ZERO,
        step,
        until,
    )
}

#[test]
fn no_schedule_found_by_exhaustive_search_beats_the_bound() {
    let mut rng = StdRng::seed_from_u64(7);
    let step = Duration::from_millis(250);
    let shapes: [&[&str]; 6] = [
        &["--burst", "0.5"],
        &["--burst", "2"],
        &["--limiter", "fixed-window", "--window", "1"],
        &["--limiter", "fixed-window", "--window", "2"],
        &["--limiter", "sliding-window", "--window", "1"],
        &["--limiter", "sliding-window", "--window", "2"],
    ];
    let (mut checked, mut exact) = (0, 0);
    for case in 0..120 {
        let capacity = ["1", "2", "3"][rng.random_range(0..3)];
        let outage = ["0", "0.5"][rng.random_range(0..2)];
        let words = [
            &[
                "--capacity",
                capacity,
                "--outage-start-s",
                "2",
                "--outage-s",
                "1.5",
            ][..],
            &["--outage-capacity", outage],
            shapes[case % shapes.len()],
        ]
        .concat();
        let mut command = vec!["storm"];
        command.extend_from_slice(&words);
        let parsed = <Cli as clap::Parser>::parse_from(command).command;
        // A window too short to hold a request in the brownout is refused.
        let Ok(config) = StormConfig::try_from_command(&parsed) else {
            continue;
        };
        let jobs: Vec<Job> = (0..5)
            .map(|_| {
                let arrive = step * rng.random_range(0..16);
                let last = arrive + step * rng.random_range(0..12);
                Job { arrive, last }
            })
            .collect();
        let b = bound(&config, &jobs);
        let searched = brute_force(&config, &jobs, step, Duration::from_secs(8));
        assert!(
            b.witnessed <= b.served && searched <= b.served,
            "{words:?} {jobs:?}: bound {b:?}, exhaustive search {searched}"
        );
        checked += 1;
        exact += usize::from(b.witnessed == b.served);
    }
    // Most of these small cases are decided exactly.
    assert!(checked >= 80, "{checked} cases checked");
    assert!(exact * 10 >= checked * 9, "{exact} of {checked} exact");
}

#[derive(clap::Parser)]
struct Cli {
    #[command(flatten)]
    command: crate::storm::StormCommand,
}
