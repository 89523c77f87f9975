//! A closed loop: the controller pacing a fluid fleet against a fluid
//! upstream (a token bucket with a burst of one tick), on a virtual clock
//! in 100 ms ticks. Not the storm benchmark — a small model of it, to
//! check the claims `docs/pacing.md` makes of the whole controller (the
//! model's target split between first attempts and waiting intents) on
//! shapes it was not tuned on.

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
}

/// What one run shows, per second.
#[derive(Debug, Default)]
struct Run {
    /// Whether the route was saturated at the end of each second.
    saturated: Vec<bool>,
    /// Attempts offered to the upstream in each second, in thousandths of
    /// the capacity in force then.
    load_permille: Vec<i64>,
    /// Attempts served in each second, in thousandths of the capacity in
    /// force then.
    served_permille: Vec<i64>,
    /// Intents waiting (retries and held first attempts) at each second's
    /// end.
    waiting: Vec<i64>,
}

/// Runs the loop for `secs`.
fn run(shape: Shape, secs: i64) -> Run {
    run_stating(shape, secs, 0)
}

/// [`run`], with the upstream stating its quota (the capacity in force a
/// second, all of it left, resetting in a second) on every answer before
/// second `stating_until`, and three workers reporting it each tick.
fn run_stating(shape: Shape, secs: i64, stating_until: i64) -> Run {
    let p = PacingPolicy::default();
    let mut st = PacingState::new(T0, &p);
    let mut cursor = 0;
    let mut cooldown = 0;
    // Retries waiting for a slot, and first attempts held for one.
    let mut backlog = 0i64;
    let mut held_first = 0i64;
    // First attempts held as they arrived, before their first ask.
    let mut fresh_first = 0i64;
    // Slots given: when, and whether a held first attempt takes it.
    let mut slots: VecDeque<(i64, bool)> = VecDeque::new();
    let mut tokens = 0i64;
    let mut seed = 7u64;
    let mut out = Run::default();
    let mut offered_this_sec = 0;
    let mut served_this_sec = 0;
    let mut heard_late = (0i64, 0i64, 0i64, 0i64);
    for tick in 0..secs * TICKS_PER_SEC {
        let now = T0 + tick * TICK_MS;
        let sec = tick / TICKS_PER_SEC;
        let cap = shape.capacity_at(sec);
        tokens = (tokens + cap / TICKS_PER_SEC).min(cap / TICKS_PER_SEC);
        // Waiting intents ask until the coordinator says "ask again": the
        // retries after the cooldown, held first attempts after one that
        // closes the route only (as the coordinator floors them). First
        // attempts held as they arrived ask once each, as arriving, before
        // those already waiting.
        for first in [false, true] {
            let (waiting, floor) = if first {
                let closing = cooldown - now > CLOSING_MS;
                (&mut held_first, if closing { cooldown } else { now })
            } else {
                (&mut backlog, cooldown)
            };
            let mut fresh = if first {
                std::mem::take(&mut fresh_first)
            } else {
                0
            };
            *waiting += fresh;
            while *waiting > 0 {
                let arriving = fresh > 0;
                fresh = (fresh - 1).max(0);
                seed = seed
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                let ask = WakeAsk {
                    now_ms: now,
                    floor_ms: floor,
                    // First attempts and retries wait out the same floor.
                    held_floor_ms: floor,
                    deadline_ms: now + 60_000,
                    reserve_ms: 100,
                    jitter_ppm: ((seed >> 33) % 1_000_000) as u32,
                    // One deadline for all: none is ahead of another.
                    waiting: 0,
                    cursor_us: cursor,
                    asker: if first {
                        Asker::FirstAttempt { arriving }
                    } else {
                        Asker::Retry
                    },
                };
                match st.decide(&ask, &p) {
                    SlotDecision::Slot { at_ms, cursor_us } => {
                        cursor = cursor_us;
                        slots.push_back((at_ms, first));
                        *waiting -= 1;
                    }
                    // The rest of the fresh ones still ask once, as the
                    // arriving; they wait with the others after.
                    _ if fresh > 0 => {}
                    _ => break,
                }
            }
        }
        let (mut woken, mut woken_first) = (0, 0);
        while slots.front().is_some_and(|&(s, _)| s < now + TICK_MS) {
            let (_, first) = slots.pop_front().unwrap_or_default();
            woken += 1;
            woken_first += i64::from(first);
        }
        // Saturated or inside a cooldown that closes the route, the
        // workers hold their first attempts for slots too (as the
        // coordinator tells them); woken ones go as first attempts.
        let arriving = shape.lam / TICKS_PER_SEC;
        let direct = if holds_first_attempts(true, st.mode(), true, cooldown, st.closed_until, now)
        {
            fresh_first += arriving;
            0
        } else {
            arriving
        };
        let first = direct + woken_first;
        let offered = direct + woken;
        offered_this_sec += offered;
        let served = offered.min(tokens.max(0));
        tokens -= served;
        served_this_sec += served;
        let rejected = offered - served;
        backlog += rejected;
        let in_outage = (shape.outage_at..shape.outage_at + shape.outage_len).contains(&sec);
        let until = if in_outage && shape.long_hints {
            shape.recovery_ms()
        } else {
            // An ordinary limiter's 1 s, rounded up to whole seconds.
            (now + 1000).div_euclid(1000) * 1000 + 1000
        };
        // Workers report what a tick saw at the next one, as a report
        // interval delays it: the controller always hears late.
        let (first, served, rejected, until) =
            std::mem::replace(&mut heard_late, (first, served, rejected, until));
        let hints = vec![until; rejected.min(64) as usize];
        if sec < stating_until && served > 0 {
            for worker in ["a", "b", "c"] {
                let statement = stated::Statement {
                    worker: worker.into(),
                    received_ms: now,
                    verdict: stated::StatedVerdict::Usable,
                    raw: String::new(),
                    quota: cap,
                    window_ms: 1000,
                    remaining: cap,
                    reset_ms: 1000,
                    pace_m: stated::Statement::pace_of(cap, 1000, cap, 1000),
                };
                let weighing = stated::Weighing {
                    needed: 2,
                    cap_ms: 5000,
                    min_owners: 1,
                };
                st.observe_statement(statement, weighing, now, &p);
            }
        }
        st.observe(
            &ReportSample {
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
                counts_age_ms: TICK_MS,
            },
            &p,
        );
        if rejected > 0 {
            cooldown = cooldown.max(until);
        }
        if (tick + 1) % TICKS_PER_SEC == 0 {
            st.advance(now + TICK_MS, &p);
            let saturated = st.mode() == Mode::Saturated;
            out.saturated.push(saturated);
            out.load_permille.push(offered_this_sec * 1000 / cap.max(1));
            out.served_permille
                .push(served_this_sec * 1000 / cap.max(1));
            out.waiting.push(backlog + held_first);
            offered_this_sec = 0;
            served_this_sec = 0;
        }
    }
    out
}

/// Runs `shape` until `seconds` after its outage ends; also the second it
/// ends at.
fn past_recovery(shape: Shape, seconds: i64) -> (Run, usize) {
    let recovery = shape.outage_at + shape.outage_len;
    (run(shape, recovery + seconds), recovery as usize)
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

/// The claims from `from` (a second index) on: no second offers more than
/// 1.1 × the capacity in force, except the first contact's (from its first
/// refusal to the second after it: startup overshoots by what its step and
/// the bank hide, once), and every second in `served` in which at least a
/// second's worth of capacity waits serves at least 90 % of it.
fn assert_claims(shape: Shape, run: &Run, from: usize, served: std::ops::Range<usize>) {
    let contact = (from..run.load_permille.len())
        .find(|&s| run.load_permille[s] > run.served_permille[s])
        .unwrap_or(run.load_permille.len());
    for s in from..run.load_permille.len() {
        let exempt = (contact..=contact + 1).contains(&s);
        assert!(
            run.load_permille[s] <= 1100 || exempt,
            "{shape:?}: {}‰ of the capacity offered at {s} s: {:?}",
            run.load_permille[s],
            run.load_permille
        );
    }
    for s in served.start..served.end.min(run.served_permille.len()) {
        let capacity = shape.capacity_at(s as i64);
        if run.waiting[s] >= capacity {
            assert!(
                run.served_permille[s] >= 900,
                "{shape:?}: {}‰ served at {s} s with {} waiting: {:?}",
                run.served_permille[s],
                run.waiting[s],
                run.served_permille
            );
        }
    }
}

/// An outage whose hints name its end, on fleets the controller was not
/// tuned on: when it ends, the backlog goes at what the upstream serves
/// (startup from what first attempts were served, to the first refusal,
/// then cruise under what that measured), from the third second on where
/// first attempts alone were within a third of the capacity, and from the
/// fourth where they were 0.6 of it: startup climbs from what each window
/// served by an eighth, then a quarter, then half, and only the window
/// after that crosses 0.9 (a climb's top is proven only by the window
/// after it, `docs/pacing.md`, "Startup").
#[test]
fn after_an_outage_the_backlog_goes_at_the_capacity() {
    for (shape, settled) in [
        (STORM, 3),
        (
            Shape {
                cap: 2000,
                lam: 1200,
                outage_len: 6,
                ..STORM
            },
            4,
        ),
        (
            Shape {
                cap: 1000,
                lam: 400,
                after_tenths: 6,
                ..STORM
            },
            3,
        ),
        (
            Shape {
                cap: 200,
                lam: 120,
                outage_len: 20,
                ..STORM
            },
            4,
        ),
    ] {
        let (run, recovery) = past_recovery(shape, 30);
        assert_claims(shape, &run, recovery, recovery + settled..usize::MAX);
    }
}

/// First attempts far below the upstream (200/s of 1 000/s): nothing
/// refused before the outage, so the spare is unknown, and startup climbs
/// to it, a step doubling each window, within six seconds.
#[test]
fn first_attempts_far_below_the_upstream_find_the_spare_by_startup() {
    let shape = Shape {
        cap: 1000,
        lam: 200,
        ..STORM
    };
    let (run, recovery) = past_recovery(shape, 30);
    assert_claims(shape, &run, recovery, recovery + 7..usize::MAX);
}

/// A brownout to 40 % under first attempts at 80 %: every attempt is paced
/// at what the upstream serves from the second after it shows, and when it
/// ends nothing says so: probes find the capacity back at the probe's gain
/// per proof, within the bound `docs/pacing.md` derives for an unannounced
/// rise (from 0.4 to 0.9 of the capacity: ln(2.25)/ln(17/16) ≈ 13.4
/// proofs of about two windows each, after a probe is due).
#[test]
fn a_brownout_is_paced_at_its_capacity_and_its_end_found_by_probes() {
    let shape = Shape {
        during_tenths: 4,
        long_hints: false,
        outage_len: 8,
        ..STORM
    };
    let (run, recovery) = past_recovery(shape, 45);
    let shown = shape.outage_at as usize + 2;
    assert!(
        run.saturated[shown..recovery].iter().all(|&s| s),
        "{:?}",
        run.saturated
    );
    // Served from the second after the probe that follows the first
    // reading (pressed briefly, and low) until the brownout ends; after
    // it, the rise is found only by probing.
    assert_claims(shape, &run, shown, shown + 2..recovery);
    let found = (recovery..run.served_permille.len())
        .find(|&s| run.served_permille[s] >= 900)
        .expect("the capacity is found again");
    let proofs = 2.25f64.ln() / (17.0f64 / 16.0).ln();
    let bound = (2.0 * proofs).ceil() as usize + model::PROBE_EVERY as usize;
    assert!(
        found - recovery <= bound,
        "found {} s after the brownout ended, bound {bound} s: {:?}",
        found - recovery,
        run.served_permille
    );
}

/// An upstream out for 3 s answering with 1–2 s hints (a limiter down, not
/// a closing hint): refusals with nothing served between them measure no
/// rate, and when it returns the fleet goes at most of what it knew.
#[test]
fn an_outage_answering_with_short_hints_teaches_no_rate() {
    let shape = Shape {
        cap: 1000,
        lam: 800,
        outage_at: 5,
        outage_len: 3,
        during_tenths: 0,
        long_hints: false,
        after_tenths: 10,
    };
    let (run, recovery) = past_recovery(shape, 20);
    assert_claims(shape, &run, recovery, 0..0);
    assert!(
        run.served_permille[recovery + 2..]
            .iter()
            .all(|&s| s >= 700),
        "{:?}",
        run.served_permille
    );
}

/// A stated quota that stops arriving, with a backlog still waiting, hands
/// the route to learned pacing at the pace it set: the statements paced the
/// fleet under the edge, so nothing was measured, and startup had held at
/// what was served rather than climbing by steps nobody tried. The fleet
/// goes on at about that pace, finds the edge with one startup step and
/// cruises under it: no second over 1.1 × the capacity, none under 0.85
/// of it while a backlog waits. (Before, startup had doubled its step every
/// window the statement paced, and the hand-off released the backlog at
/// that untried top.)
#[test]
fn learned_pacing_takes_over_at_the_pace_a_statement_set() {
    let run = run_stating(STORM, 40, 25);
    for s in 16..40 {
        assert!(
            run.load_permille[s] <= 1100,
            "{}‰ offered at {s} s: {:?}",
            run.load_permille[s],
            run.load_permille
        );
        assert!(
            run.waiting[s] >= STORM.cap,
            "the backlog went at once at {s} s: {:?}",
            run.waiting
        );
        assert!(
            run.served_permille[s] >= 850,
            "{}‰ served at {s} s: {:?}",
            run.served_permille[s],
            run.served_permille
        );
    }
}
