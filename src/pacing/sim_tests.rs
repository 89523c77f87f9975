//! A closed loop: the controller pacing a fluid fleet against a fluid
//! upstream, on a virtual clock in 100 ms ticks. Not the storm benchmark —
//! a small model of it, to show the learned rate lands on the true spare
//! capacity within a few seconds of recovery on shapes the controller was
//! not tuned on.

use std::collections::VecDeque;

use super::*;

const T0: i64 = 1_700_000_000_000;
const TICK_MS: i64 = 100;
const TICKS_PER_SEC: i64 = 1000 / TICK_MS;

/// One fleet and upstream.
#[derive(Debug, Clone, Copy)]
struct Shape {
    /// Capacity before the outage, attempts/s.
    cap: i64,
    /// First-attempt arrivals, attempts/s.
    lam: i64,
    /// Seconds from the start to the outage, and its length.
    outage_at: i64,
    outage_len: i64,
    /// Capacity served during the outage, in tenths of `cap`.
    during_tenths: i64,
    /// The outage's hints name its end (true) or say 1 s (a brownout).
    long_hints: bool,
    /// Capacity after the outage, in tenths of `cap`.
    after_tenths: i64,
}

impl Shape {
    fn capacity_at(&self, sec: i64) -> i64 {
        if sec < self.outage_at {
            self.cap
        } else if sec < self.outage_at + self.outage_len {
            self.cap * self.during_tenths / 10
        } else {
            self.cap * self.after_tenths / 10
        }
    }

    fn recovery_ms(&self) -> i64 {
        T0 + (self.outage_at + self.outage_len) * 1000
    }

    fn true_spare(&self) -> i64 {
        self.cap * self.after_tenths / 10 - self.lam
    }
}

/// What one run shows, per second.
#[derive(Debug, Default)]
struct Run {
    /// The wake rate at the end of each second, whole slots per second.
    rates: Vec<i64>,
    /// Attempts offered to the upstream in each second, in thousandths of
    /// the capacity in force then.
    load_permille: Vec<i64>,
}

/// Runs the loop for `secs`.
fn run(shape: Shape, secs: i64) -> Run {
    let p = PacingPolicy::default();
    let mut st = PacingState::new(T0, &p);
    let mut cursor = 0;
    let mut cooldown = 0;
    let mut backlog = 0i64;
    let mut slots: VecDeque<i64> = VecDeque::new();
    let mut tokens = 0i64;
    let mut seed = 7u64;
    let mut out = Run::default();
    let mut offered_this_sec = 0;
    for tick in 0..secs * TICKS_PER_SEC {
        let now = T0 + tick * TICK_MS;
        let sec = tick / TICKS_PER_SEC;
        let cap = shape.capacity_at(sec);
        tokens = (tokens + cap / TICKS_PER_SEC).min(cap / TICKS_PER_SEC);
        // Waiting intents ask until the coordinator says "ask again".
        while backlog > 0 {
            seed = seed
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            let ask = WakeAsk {
                now_ms: now,
                floor_ms: cooldown,
                deadline_ms: now + 60_000,
                reserve_ms: 100,
                jitter_ppm: ((seed >> 33) % 1_000_000) as u32,
                waiting: backlog,
                cursor_us: cursor,
            };
            match st.decide(&ask, &p) {
                SlotDecision::Slot { at_ms, cursor_us } => {
                    cursor = cursor_us;
                    slots.push_back(at_ms);
                    backlog -= 1;
                }
                _ => break,
            }
        }
        let mut retries = 0;
        while slots.front().is_some_and(|&s| s < now + TICK_MS) {
            slots.pop_front();
            retries += 1;
        }
        let first = shape.lam / TICKS_PER_SEC;
        let offered = first + retries;
        offered_this_sec += offered;
        let served = offered.min(tokens.max(0));
        tokens -= served;
        let rejected = offered - served;
        backlog += rejected;
        let in_outage = (shape.outage_at..shape.outage_at + shape.outage_len).contains(&sec);
        let until = if in_outage && shape.long_hints {
            shape.recovery_ms()
        } else {
            // An ordinary limiter's 1 s, rounded up to whole seconds.
            (now + 1000).div_euclid(1000) * 1000 + 1000
        };
        let hints = vec![until; rejected.min(64) as usize];
        st.observe(
            &Observation {
                now_ms: now,
                first_attempts: first as u32,
                successes: served as u32,
                rejections: rejected as u32,
                hint_until_ms: &hints,
                cooldown_until_ms: cooldown,
                cooldown_after_ms: if rejected > 0 {
                    cooldown.max(until)
                } else {
                    cooldown
                },
            },
            &p,
        );
        if rejected > 0 {
            cooldown = cooldown.max(until);
        }
        if (tick + 1) % TICKS_PER_SEC == 0 {
            st.advance(now + TICK_MS, &p);
            out.rates.push(st.wake_rate_m() / MILLI);
            out.load_permille.push(offered_this_sec * 1000 / cap.max(1));
            offered_this_sec = 0;
        }
    }
    out
}

/// Within 5 s of recovery the rate reaches the true spare capacity (within
/// 20 %); from then on, while the backlog lasts, it probes around it:
/// every second within a quarter of it (a probe oversteps, and the cut goes
/// back to the last rate that drew nothing) and within a tenth on average.
/// The load offered in any second after recovery is at most 1.1 × the
/// capacity in force.
fn assert_converges(shape: Shape) {
    let run = run(shape, shape.outage_at + shape.outage_len + 15);
    let rates = &run.rates;
    let spare = shape.true_spare();
    let recovery = (shape.outage_at + shape.outage_len) as usize;
    let from = recovery + 5;
    assert!(
        rates[recovery..=from]
            .iter()
            .any(|&rate| (rate - spare).abs() * 5 <= spare),
        "{shape:?}: not within 20 % of the spare {spare}/s by {from} s; all: {rates:?}"
    );
    for (s, &rate) in rates.iter().enumerate().skip(from) {
        assert!(
            (rate - spare).abs() * 4 <= spare,
            "{shape:?}: at {s} s the rate is {rate}/s, the spare {spare}/s; all: {rates:?}"
        );
    }
    let after = &rates[from..];
    let mean = after.iter().sum::<i64>() / after.len().max(1) as i64;
    assert!(
        (mean - spare).abs() * 10 <= spare,
        "{shape:?}: the rate averages {mean}/s against a spare of {spare}/s; all: {rates:?}"
    );
    // After recovery the fleet offers at most a little over the capacity in
    // force (the probe that finds the edge, an eighth of the spare).
    let recovered = (shape.outage_at + shape.outage_len) as usize;
    let peak = run.load_permille[recovered..]
        .iter()
        .max()
        .copied()
        .unwrap_or(0);
    assert!(
        peak <= 1100,
        "{shape:?}: {peak}‰ of capacity offered in one second; {:?}",
        run.load_permille
    );
}

const STORM: Shape = Shape {
    cap: 1000,
    lam: 800,
    outage_at: 5,
    outage_len: 10,
    during_tenths: 0,
    long_hints: true,
    after_tenths: 10,
};

#[test]
fn the_storm_shape_converges_to_the_spare() {
    assert_converges(STORM);
}

#[test]
fn a_bigger_upstream_with_fewer_first_attempts_converges() {
    assert_converges(Shape {
        cap: 2000,
        lam: 1200,
        outage_len: 6,
        ..STORM
    });
}

#[test]
fn an_upstream_that_returns_at_six_tenths_converges() {
    assert_converges(Shape {
        cap: 1000,
        lam: 400,
        after_tenths: 6,
        ..STORM
    });
}

#[test]
fn a_brownout_with_short_hints_converges() {
    assert_converges(Shape {
        during_tenths: 4,
        long_hints: false,
        outage_len: 8,
        ..STORM
    });
}

#[test]
fn a_small_upstream_converges() {
    assert_converges(Shape {
        cap: 200,
        lam: 120,
        outage_len: 20,
        ..STORM
    });
}
