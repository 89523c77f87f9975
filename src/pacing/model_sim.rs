//! The limiter model against the three limiter shapes of `docs/pacing.md`
//! (token bucket, sliding window, fixed window), on a virtual clock: a
//! fleet with more work than the limiter admits sends at the model's
//! target, its refusals reach the model a report tick later, and each
//! second closes a window. Every check is one of the model's claims.

use std::collections::VecDeque;

use super::model::{LimiterModel, PROBE_EVERY, Phase, Report, WindowEnd};
use super::{CLOSING_MS, MILLI, WINDOW_MS};

/// The simulation's time step, ms.
const STEP_MS: i64 = 10;
/// Workers report every tick this long: a refusal reaches the model at
/// the next tick after it.
const REPORT_MS: i64 = 100;

/// A limiter, admitting or refusing one request at an instant, at the
/// sustained rate in force then (the run changes it).
trait Limiter {
    fn admit(&mut self, at_ms: i64, rate: f64) -> bool;
    /// The `Retry-After` it sends with a refusal at `at_ms`: when credit
    /// comes back, rounded up to whole seconds.
    fn hint_ms(&self, at_ms: i64, rate: f64) -> i64;
}

/// Whole seconds, rounded up, as `Retry-After` carries them.
fn whole_seconds(ms: i64) -> i64 {
    (ms.max(1) + 999) / 1000 * 1000
}

/// A window limiter's quota at `rate`: at least one request.
fn quota(rate: f64, window_ms: i64) -> usize {
    (rate * window_ms as f64 / 1000.0).max(1.0) as usize
}

/// Refilled at the rate in force up to `burst_s` of it; starts full.
struct TokenBucket {
    burst_s: f64,
    tokens: f64,
    at_ms: i64,
}

impl Limiter for TokenBucket {
    fn admit(&mut self, at_ms: i64, rate: f64) -> bool {
        let size = (rate * self.burst_s).max(1.0);
        self.tokens = (self.tokens + rate * (at_ms - self.at_ms) as f64 / 1000.0).min(size);
        self.at_ms = at_ms;
        if self.tokens >= 1.0 {
            self.tokens -= 1.0;
            true
        } else {
            false
        }
    }

    fn hint_ms(&self, _at_ms: i64, rate: f64) -> i64 {
        whole_seconds(((1.0 - self.tokens) / rate * 1000.0) as i64)
    }
}

/// At most `rate × window` admitted in any trailing window.
struct SlidingWindow {
    window_ms: i64,
    admitted: VecDeque<i64>,
}

impl Limiter for SlidingWindow {
    fn admit(&mut self, at_ms: i64, rate: f64) -> bool {
        while self
            .admitted
            .front()
            .is_some_and(|&t| t <= at_ms - self.window_ms)
        {
            self.admitted.pop_front();
        }
        let admitted = self.admitted.len() < quota(rate, self.window_ms);
        if admitted {
            self.admitted.push_back(at_ms);
        }
        admitted
    }

    fn hint_ms(&self, at_ms: i64, _rate: f64) -> i64 {
        let oldest = self.admitted.front().copied().unwrap_or(at_ms);
        whole_seconds(oldest + self.window_ms - at_ms)
    }
}

/// At most `rate × window` per window aligned to zero, reset at each
/// boundary.
struct FixedWindow {
    window_ms: i64,
    index: i64,
    count: usize,
}

impl Limiter for FixedWindow {
    fn admit(&mut self, at_ms: i64, rate: f64) -> bool {
        let index = at_ms / self.window_ms;
        if index != self.index {
            self.index = index;
            self.count = 0;
        }
        let admitted = self.count < quota(rate, self.window_ms);
        if admitted {
            self.count += 1;
        }
        admitted
    }

    fn hint_ms(&self, at_ms: i64, _rate: f64) -> i64 {
        whole_seconds((at_ms / self.window_ms + 1) * self.window_ms - at_ms)
    }
}

/// One second as the limiter saw it.
#[derive(Debug, Clone, Copy)]
struct Second {
    offered: i64,
    served: i64,
    refused: i64,
    /// The limiter's sustained rate in force at the second's end.
    capacity: f64,
    target_m: i64,
}

/// The limiters' sustained rate before any change, per second.
const CAPACITY: f64 = 1000.0;

/// The second from which startup is over: from 10/s, steps of an eighth
/// of what was served, doubling each window, reach 1 000/s in about a
/// dozen windows; the reading after the edge is pressed only briefly (low
/// by an echo on a window limiter), and the probes after it climb the rest
/// in a few more.
const STARTED: usize = 20;

/// Runs `seconds` with the fleet always having more work than the target
/// (`demand_m` caps what it has, per second; `None` is unbounded), with
/// `changes` (second, fraction of [`CAPACITY`]) applied at their second.
fn run(
    limiter: &mut dyn Limiter,
    seconds: i64,
    demand_m: Option<i64>,
    changes: &[(i64, f64)],
) -> (LimiterModel, Vec<Second>) {
    let mut model = LimiterModel::new(10 * MILLI, MILLI);
    let mut out = Vec::new();
    let mut credit_m = 0i64;
    let mut capacity = CAPACITY;
    let mut window = Second {
        offered: 0,
        served: 0,
        refused: 0,
        capacity,
        target_m: 0,
    };
    let mut tick = (0i64, 0i64, 0i64);
    let mut longest_hint_ms = 0i64;
    // A hint longer than two windows closes the route, as the coordinator
    // does: nothing is sent until it ends, and the windows it covers are
    // closed to learning.
    let mut hold_until = 0i64;
    let mut closed = false;
    let mut demand_met = true;
    for step in 0..seconds * WINDOW_MS / STEP_MS {
        let at = step * STEP_MS;
        if let Some(&(_, factor)) = changes.iter().find(|(s, _)| s * WINDOW_MS == at) {
            capacity = CAPACITY * factor;
        }
        let target = model.target_m(at);
        let held = at < hold_until;
        closed |= held;
        let rate = if held {
            0
        } else {
            demand_m.map_or(target, |d| d.min(target))
        };
        if demand_m.is_some_and(|d| d < target) {
            demand_met = false;
        }
        credit_m += rate * STEP_MS / WINDOW_MS;
        while credit_m >= MILLI {
            credit_m -= MILLI;
            window.offered += 1;
            if limiter.admit(at, capacity) {
                window.served += 1;
                tick.0 += 1;
            } else {
                window.refused += 1;
                let hint = limiter.hint_ms(at, capacity);
                longest_hint_ms = longest_hint_ms.max(hint);
                if hint > CLOSING_MS {
                    hold_until = hold_until.max(at + hint);
                    tick.2 += 1;
                } else {
                    tick.1 += 1;
                }
            }
        }
        let next = at + STEP_MS;
        if next % REPORT_MS == 0 {
            model.on_report(&Report {
                now_ms: next,
                age_ms: REPORT_MS,
                served: tick.0,
                refused: tick.1,
                closing: tick.2,
                longest_hint_ms,
            });
            tick = (0, 0, 0);
            longest_hint_ms = 0;
        }
        if next % WINDOW_MS == 0 {
            window.capacity = capacity;
            window.target_m = target;
            out.push(window);
            model.on_window(&WindowEnd {
                at_ms: next,
                demand: demand_met,
                closed: std::mem::take(&mut closed),
            });
            window = Second {
                offered: 0,
                served: 0,
                refused: 0,
                capacity,
                target_m: 0,
            };
            demand_met = true;
        }
    }
    (model, out)
}

/// The busiest second from `from` on, over the capacity in force.
fn peak(seconds: &[Second], from: usize) -> f64 {
    seconds[from..]
        .iter()
        .map(|s| s.offered as f64 / s.capacity)
        .fold(0.0, f64::max)
}

/// Refused over offered, from `from` on.
fn refused_share(seconds: &[Second], from: usize) -> f64 {
    let (refused, offered) = seconds[from..]
        .iter()
        .fold((0, 0), |(r, o), s| (r + s.refused, o + s.offered));
    refused as f64 / offered.max(1) as f64
}

/// The least served over capacity in any second from `from` on.
fn least_utilisation(seconds: &[Second], from: usize) -> f64 {
    seconds[from..]
        .iter()
        .map(|s| s.served as f64 / s.capacity)
        .fold(f64::INFINITY, f64::min)
}

fn trace(seconds: &[Second]) -> String {
    seconds
        .iter()
        .enumerate()
        .map(|(i, s)| {
            format!(
                "{i}: target {} offered {} served {} refused {} capacity {}\n",
                s.target_m / MILLI,
                s.offered,
                s.served,
                s.refused,
                s.capacity
            )
        })
        .collect()
}

/// A token bucket at rest: full.
fn token_bucket(burst_s: f64) -> Box<dyn Limiter> {
    Box::new(TokenBucket {
        burst_s,
        tokens: (CAPACITY * burst_s).max(1.0),
        at_ms: 0,
    })
}

fn sliding_window(window_ms: i64) -> Box<dyn Limiter> {
    Box::new(SlidingWindow {
        window_ms,
        admitted: VecDeque::new(),
    })
}

fn fixed_window(window_ms: i64) -> Box<dyn Limiter> {
    Box::new(FixedWindow {
        window_ms,
        index: 0,
        count: 0,
    })
}

/// The limiters whose memory a second of pressing covers, by name.
fn pressable() -> Vec<(&'static str, Box<dyn Limiter>)> {
    vec![
        ("token bucket, 0.1 s burst", token_bucket(0.1)),
        ("token bucket, 1 s burst", token_bucket(1.0)),
        ("sliding window, 1 s", sliding_window(1000)),
        ("fixed window, 1 s", fixed_window(1000)),
    ]
}

/// The benchmark's claims, from `settled` on: every second within 1.1 ×
/// the capacity in force, at least 90 % of it served while work waits,
/// at most 1 % of attempts refused.
fn claims_hold(name: &str, seconds: &[Second], settled: usize) {
    let log = trace(seconds);
    assert!(peak(seconds, settled) <= 1.1, "{name}: peak\n{log}");
    assert!(
        least_utilisation(seconds, settled) >= 0.9,
        "{name}: utilisation\n{log}"
    );
    assert!(
        refused_share(seconds, settled) <= 0.01,
        "{name}: refused\n{log}"
    );
}

#[test]
fn each_pressable_limiter_is_found_and_held() {
    for (name, mut limiter) in pressable() {
        let (model, seconds) = run(limiter.as_mut(), 90, None, &[]);
        let rate = model.rate_m().expect("measured") / MILLI;
        assert!((950..=1030).contains(&rate), "{name}: ρ̂ {rate}");
        claims_hold(name, &seconds, STARTED);
    }
}

#[test]
fn a_drop_is_followed_from_the_second_after_it() {
    for (name, mut limiter) in pressable() {
        let (model, seconds) = run(limiter.as_mut(), 90, None, &[(40, 0.4)]);
        let rate = model.rate_m().expect("measured") / MILLI;
        assert!((380..=420).contains(&rate), "{name}: ρ̂ {rate}");
        claims_hold(name, &seconds[..40], STARTED);
        // The first second of the drop is exempt: nothing shows it before
        // the limiter refuses.
        claims_hold(name, &seconds, 42);
    }
}

#[test]
fn a_rise_is_found_at_the_probe_gain_per_proof() {
    // Unannounced, a rise is found only by probing past the rate known,
    // and a clean probe proves more only once its excess over ρ̂ is more
    // than the bank: (PROBE_GAIN − 1)·ρ̂ a window against a bank of a
    // tenth of a second takes two windows a proof, and from 375/s to
    // 900/s is ln(2.4)/ln(17/16) ≈ 14.4 proofs, after the next probe is
    // due (PROBE_EVERY windows at most): about 45 windows. A window
    // limiter of one second has no bank beyond the window: a proof a
    // window.
    for (name, mut limiter, settled) in [
        ("token bucket, 0.1 s burst", token_bucket(0.1), 96),
        ("sliding window, 1 s", sliding_window(1000), 80),
        ("fixed window, 1 s", fixed_window(1000), 78),
    ] {
        let (_, seconds) = run(limiter.as_mut(), 100, None, &[(0, 0.4), (40, 1.0)]);
        let log = trace(&seconds);
        assert!(peak(&seconds, STARTED) <= 1.1, "{name}: peak\n{log}");
        assert!(
            least_utilisation(&seconds, settled) >= 0.9,
            "{name}: utilisation\n{log}"
        );
    }
}

#[test]
fn a_ten_second_bank_is_spent_once_then_the_rate_is_held() {
    // First contact from rest: nothing tells a bank from a rate until the
    // bank is spent, so startup overshoots it once (docs/pacing.md, the
    // bounds on paper); from then on the claims hold.
    let mut limiter = token_bucket(10.0);
    let (model, seconds) = run(limiter.as_mut(), 90, None, &[]);
    let rate = model.rate_m().expect("measured") / MILLI;
    assert!((950..=1030).contains(&rate), "ρ̂ {rate}");
    assert!(model.burst_m() / MILLI >= 9_000, "σ̂ {}", model.burst_m());
    claims_hold("token bucket, 10 s burst", &seconds, 30);
}

#[test]
fn a_drop_behind_a_large_bank_is_followed_once_it_shows() {
    // 1000/s → 400/s behind a bank of 10 s: the limiter serves the fleet
    // from whatever its bank holds until it is spent, and nothing is
    // refused meanwhile; from the second after it refuses, the claims
    // hold.
    let mut limiter = token_bucket(10.0);
    let (model, seconds) = run(limiter.as_mut(), 100, None, &[(40, 0.4)]);
    let rate = model.rate_m().expect("measured") / MILLI;
    assert!((380..=420).contains(&rate), "ρ̂ {rate}");
    let first_refusal = (40..seconds.len())
        .find(|&s| seconds[s].refused > 0)
        .expect("refused once the bank is spent");
    claims_hold("token bucket, 10 s burst", &seconds, first_refusal + 2);
}

#[test]
fn demand_under_the_capacity_is_never_refused_and_teaches_nothing() {
    // Probes and startup's doubling prove something only where work
    // waited for the target: a fleet that needs 500/s of a 1000/s limiter
    // is never pushed past what it needs.
    let mut limiter = token_bucket(0.1);
    let (model, seconds) = run(limiter.as_mut(), 60, Some(500 * MILLI), &[]);
    assert_eq!(seconds.iter().map(|s| s.refused).sum::<i64>(), 0);
    assert_eq!(model.rate_m(), None);
    assert!(seconds[20..].iter().all(|s| s.offered == 500));
}

#[test]
fn an_outage_learns_nothing_and_resumes_at_the_rate_known() {
    let mut limiter = token_bucket(0.1);
    let (mut model, _) = run(limiter.as_mut(), 30, None, &[]);
    let rate = model.rate_m().expect("measured");
    let closed = WindowEnd {
        at_ms: 0,
        demand: true,
        closed: true,
    };
    for at in 0..5 {
        model.on_report(&Report {
            now_ms: 30_000 + at * WINDOW_MS,
            age_ms: WINDOW_MS,
            served: 0,
            refused: 0,
            closing: 400,
            longest_hint_ms: 10_000,
        });
        model.on_window(&closed);
        assert!(matches!(model.phase(), Phase::Closed { .. }), "closed");
    }
    assert_eq!(model.rate_m(), Some(rate), "nothing learned from it");
    model.on_window(&WindowEnd {
        at_ms: 0,
        demand: true,
        closed: false,
    });
    assert_eq!(model.target_m(0), super::model::CRUISE_GAIN.of(rate));
}

#[test]
fn a_fixed_window_of_ten_seconds_is_found_from_the_instants_its_hints_name() {
    // Its refusals name the boundary, seconds away: the route closes until
    // it, and the quota served between two boundaries, over the time
    // between, is ρ. Its quota is a bank of the whole window, so probes
    // come a window's length apart for each second it remembers, and a
    // probe that finds no more costs the tail of one window (refused, or
    // closed until the boundary): the claims hold between probes.
    // The instants are named to the second, so a span of 10 s reads ρ
    // within a tenth, and cruise serves what it reads less the margin.
    let (model, seconds) = run(fixed_window(10_000).as_mut(), 160, None, &[]);
    let rate = model.rate_m().expect("measured") / MILLI;
    assert!((900..=1030).contains(&rate), "ρ̂ {rate}");
    let log = trace(&seconds);
    assert!(peak(&seconds, 45) <= 1.1, "{log}");
    assert!(refused_share(&seconds, 45) <= 0.01, "{log}");
    let probe = (45..seconds.len())
        .find(|&s| seconds[s].refused > 0)
        .unwrap_or(seconds.len());
    assert!(probe >= 90, "a probe every {} windows", PROBE_EVERY * 9);
    assert!(least_utilisation(&seconds[..probe], 45) >= 0.85, "{log}");
}

/// Prints the table in `docs/pacing.md` ("What it does, on a virtual
/// clock"): every shape, steady, a drop to 400/s at 40 s and a rise from
/// 400/s at 40 s, 160 s each. Run it with
/// `cargo test --lib pacing::model_sim::the_table -- --ignored --nocapture`.
/// It checks what the table claims where the model holds, and prints the
/// rest (sliding windows longer than a second are the model's known gap).
/// `TABLE_TRACE="fixed window, 10 s/steady"` also prints that run second
/// by second.
#[test]
#[ignore = "prints docs/pacing.md's table"]
fn the_table() {
    // Name, a limiter at rest, and whether the model's claims hold on it.
    type Shape = (&'static str, fn() -> Box<dyn Limiter>, bool);
    let shapes: [Shape; 7] = [
        ("token bucket, 0.1 s burst", || token_bucket(0.1), true),
        ("token bucket, 1 s burst", || token_bucket(1.0), true),
        ("token bucket, 10 s burst", || token_bucket(10.0), true),
        ("sliding window, 1 s", || sliding_window(1000), true),
        ("fixed window, 1 s", || fixed_window(1000), true),
        ("sliding window, 10 s", || sliding_window(10_000), false),
        // Its probes cost the tail of a window (checked between probes by
        // its own test).
        ("fixed window, 10 s", || fixed_window(10_000), false),
    ];
    let cases: [(&str, &[(i64, f64)]); 3] = [
        ("steady", &[]),
        ("drop", &[(40, 0.4)]),
        ("rise", &[(0, 0.4), (40, 1.0)]),
    ];
    for (name, make, holds) in shapes {
        for (case, changes) in cases {
            let (model, seconds) = run(make().as_mut(), 160, None, changes);
            if std::env::var("TABLE_TRACE").is_ok_and(|t| t == format!("{name}/{case}")) {
                println!("{}", trace(&seconds));
            }
            let back = (41..seconds.len()).find(|&s| least_utilisation(&seconds, s) >= 0.9);
            println!(
                "{name:26} {case:6} ρ̂ {:>5} peak[10,40) {:.3} peak[42,) {:.3} \
                 refused[100,) {:.2} % served[100,) {:.3} ≥ 0.9 from {back:?}",
                model.rate_m().map_or(0, |r| r / MILLI),
                peak(&seconds[..40], 10),
                peak(&seconds, 42),
                100.0 * refused_share(&seconds, 100),
                least_utilisation(&seconds, 100),
            );
            if holds && case != "rise" {
                assert!(refused_share(&seconds, 100) <= 0.01, "{name} {case}");
                assert!(least_utilisation(&seconds, 100) >= 0.9, "{name} {case}");
            }
        }
    }
}

/// Feeds `model` one report at `now_ms` covering the 100 ms before it.
fn tell(model: &mut LimiterModel, now_ms: i64, served: i64, refused: i64) {
    model.on_report(&Report {
        now_ms,
        age_ms: REPORT_MS,
        served,
        refused,
        closing: 0,
        longest_hint_ms: if refused > 0 { 1_000 } else { 0 },
    });
}

/// Closes the window ending at `at_ms`, work waiting in it.
fn close(model: &mut LimiterModel, at_ms: i64) {
    model.on_window(&WindowEnd {
        at_ms,
        demand: true,
        closed: false,
    });
}

/// Startup climbing from 800/s with work waiting, served what it offered
/// (the ramp's mean) each window: targets 900, 1 050, then 1 350 climbed
/// across the window that starts at 3 s.
fn climbing() -> LimiterModel {
    let mut model = LimiterModel::new(800 * MILLI, MILLI);
    for (second, served) in [(1, 800), (2, 850), (3, 950)] {
        tell(&mut model, second * WINDOW_MS, served, 0);
        close(&mut model, second * WINDOW_MS);
    }
    assert_eq!(
        model.phase(),
        Phase::Startup {
            target_m: 1_350 * MILLI,
            step_m: 400 * MILLI,
            from_ms: 3_000
        }
    );
    model
}

#[test]
fn startup_measures_at_a_probes_gain_over_what_was_served_not_at_its_climb() {
    let mut model = climbing();
    // 800 served in the 800 ms of the window so far (1 000/s); the climb
    // is at 1 270/s when the first refusal comes, over the edge by what
    // the bank hid. The measurement holds 17/16 of the 1 000/s served.
    tell(&mut model, 3_800, 800, 2);
    let Phase::Measure { drew_m, .. } = model.phase() else {
        panic!("{:?}", model.phase());
    };
    assert_eq!(drew_m, 1_062_500);
}

#[test]
fn a_first_reading_that_makes_the_climb_a_bank_of_minutes_is_an_echo() {
    // A sliding window of many seconds, empty after an outage, served the
    // climb; once it is full it gives back only what the fleet sent a
    // window ago: 20/s read over 300 ms.
    let mut model = climbing();
    tell(&mut model, 3_900, 1_000, 3);
    close(&mut model, 4_000);
    tell(&mut model, 4_100, 3, 40);
    tell(&mut model, 4_200, 3, 40);
    tell(&mut model, 4_300, 3, 40);
    // Judged against 30/s, the climb's windows would be a bank of a
    // minute of it; the rate it sustained across them is taken instead.
    let climb = [800, 850, 950, 1_000];
    let mean = climb.iter().sum::<i64>() * MILLI / climb.len() as i64;
    assert_eq!(model.rate_m(), Some(mean));
}

/// [`climbing`]'s first refusal at 3.8 s, then the first measurement,
/// pressed for three report ticks, each serving `served` and refusing
/// `refused`.
fn first_contact(served: i64, refused: i64) -> LimiterModel {
    let mut model = climbing();
    tell(&mut model, 3_800, 800, 2);
    for now_ms in [3_900, 4_000, 4_100] {
        tell(&mut model, now_ms, served, refused);
    }
    model
}

#[test]
fn a_probe_due_after_a_measurement_survives_a_fall_measured_meanwhile() {
    // The first measurement: pressed 300 ms at 1 062/s, 300 served.
    let mut model = first_contact(100, 10);
    assert_eq!(model.rate_m(), Some(1_000 * MILLI));
    // The first measurement is followed by a probe: it was pressed only
    // 300 ms, low by what refusals cost the limiter.
    assert_eq!(
        model.phase(),
        Phase::Drain {
            fresh: true,
            probe: true
        }
    );
    close(&mut model, 4_000);
    // The window after, the limiter still refuses what the pressing left
    // (a sliding window remembers it for its length): taken as a fall and
    // measured over the limiter's memory, at the same 1 000/s, the probe
    // stays due.
    tell(&mut model, 4_500, 90, 1);
    assert!(
        matches!(model.phase(), Phase::Measure { probe: true, .. }),
        "{:?}",
        model.phase()
    );
    tell(&mut model, 5_000, 100, 5);
    close(&mut model, 5_000);
    tell(&mut model, 5_900, 900, 20);
    assert_eq!(model.rate_m(), Some(1_000 * MILLI));
    assert!(
        matches!(model.phase(), Phase::Drain { probe: true, .. }),
        "{:?}",
        model.phase()
    );
    close(&mut model, 6_000);
    close(&mut model, 7_000);
    assert_eq!(model.phase(), Phase::Probe);
}

/// The mean of [`climbing`]'s closed windows, 800, 850 and 950 served
/// without a refusal.
const CLIMB_MEAN_M: i64 = (800 + 850 + 950) * MILLI / 3;

#[test]
fn a_first_reading_that_refusing_starved_is_judged_by_the_climb_before_it() {
    // An upstream that spends as much refusing as serving: pressed over
    // its edge it serves next to nothing, and the measurement ends inside
    // the window of its first refusal, 20/s read over 300 ms. Against it
    // the climb's windows would be a bank of two minutes: their mean is
    // taken.
    let model = first_contact(2, 40);
    assert_eq!(model.rate_m(), Some(CLIMB_MEAN_M));
}

#[test]
fn a_dry_reading_after_a_climb_is_judged_by_the_climb_whatever_bank_it_implies() {
    // The same upstream, pressed less hard: 120/s read over 300 ms while
    // it refused three times what it served. Against 120/s the climb's
    // windows would be a bank of 19 s, short of the echo's bound, and a
    // bank that large proves nothing for minutes; refusals outnumbering
    // what was served say the reading is what pressing left.
    let mut model = first_contact(12, 40);
    assert_eq!(model.rate_m(), Some(CLIMB_MEAN_M));
    // The climb is a floor taken for ρ, not a measurement of it: what it
    // served over the floor is not a bank. Judged as one, a climb over a
    // low floor became a bank no probe could prove past (983 attempts
    // over 283/s in the storm's reference run with `--reject-cost 1.0
    // --seed 21`).
    close(&mut model, 4_000);
    assert_eq!(model.burst_m(), 0);
}

#[test]
fn a_fall_read_while_refusals_outnumber_what_was_served_restarts_the_search() {
    // ρ̂ = 1 000/s measured at first contact, the drain after it refused
    // through a window: a fall, measured over the limiter's 1 s memory.
    let mut model = first_contact(100, 10);
    close(&mut model, 4_000);
    tell(&mut model, 4_500, 0, 100);
    // The limiter spends its capacity refusing: 38 served and 1 000
    // refused in the second pressed.
    tell(&mut model, 4_600, 2, 100);
    for now_ms in (4_700..=5_500).step_by(100) {
        tell(&mut model, now_ms, 4, 100);
    }
    // Not cruise at 38/s: startup from it, a step of an eighth climbing
    // across the window from the instant the measurement ended.
    assert_eq!(model.rate_m(), None);
    assert_eq!(
        model.phase(),
        Phase::Startup {
            target_m: 38 * MILLI + 4_750,
            step_m: 4_750,
            from_ms: 5_500
        }
    );
}

/// ρ̂ = 1 000/s measured at first contact, then raised to 1 062.5/s by
/// the probe after it, served whole for two windows: more than a window's
/// excess and any bank seen, a proof (what a bank the model has not seen
/// also gives). Returns the model, probing on, and the instant reached.
fn proven() -> (LimiterModel, i64) {
    let mut model = first_contact(100, 10);
    close(&mut model, 4_000);
    tell(&mut model, 5_000, 930, 0);
    close(&mut model, 5_000);
    assert_eq!(model.phase(), Phase::Probe);
    let mut at = 5_000;
    for _ in 0..2 {
        at += WINDOW_MS;
        tell(&mut model, at, 1_062, 0);
        close(&mut model, at);
    }
    assert_eq!(model.rate_m(), Some(1_062_500));
    assert_eq!(model.phase(), Phase::Probe);
    (model, at)
}

/// Twelve reports of 100 ms from `at`, each `served` and `refused`, the
/// windows closed as they end: the limiter pressed past its 1 s memory.
/// Returns the instant reached.
fn pressed_for_a_second(model: &mut LimiterModel, mut at: i64, served: i64, refused: i64) -> i64 {
    for _ in 0..12 {
        at += 100;
        tell(model, at, served, refused);
        if at % WINDOW_MS == 0 {
            close(model, at);
        }
    }
    at
}

/// A report of `first` (served, refused) 100 ms after `at`, then reports
/// that each served `then` and refused nothing to the window's end, which
/// closes. Returns the window's end.
fn straggled(model: &mut LimiterModel, mut at: i64, first: (i64, i64), then: i64) -> i64 {
    at += 100;
    tell(model, at, first.0, first.1);
    while at % WINDOW_MS != 0 {
        at += 100;
        tell(model, at, then, 0);
    }
    close(model, at);
    at
}

#[test]
fn a_fall_measured_after_a_proof_is_no_bank_and_a_rise_is_proven_from_it() {
    let (mut model, at) = proven();
    // Then the capacity falls to 120/s; refused no more than served, so
    // the reading is a fall, measured over the limiter's 1 s memory.
    let mut at = pressed_for_a_second(&mut model, at, 12, 10);
    assert_eq!(model.rate_m(), Some(120 * MILLI));
    // The windows the proof left unexplained were served at the capacity
    // of their time: judged against the fall they would be a bank of
    // nearly 2 000 attempts, sixteen seconds of 120/s.
    assert!(model.burst_m() < 120 * MILLI, "σ̂ {}", model.burst_m());
    // Back at 1 000/s, everything offered is served: a probe from 120/s
    // proves more within a few windows of being due.
    let mut windows = 0;
    while model.rate_m() == Some(120 * MILLI) && windows < 20 {
        at += WINDOW_MS;
        let served = model.target_m(at) / MILLI;
        tell(&mut model, at, served, 0);
        close(&mut model, at);
        windows += 1;
    }
    assert!(
        model.rate_m() > Some(120 * MILLI),
        "still {:?} after {windows} windows, {:?}",
        model.rate_m(),
        model.phase()
    );
}

/// [`proven`], then the probe from there is refused, and the limiter,
/// whose refusals cost what serving does, serves next to nothing while
/// pressed. Returns the model and the instant reached.
pub(super) fn starved_by_a_probe_from_a_proof() -> (LimiterModel, i64) {
    let (mut model, at) = proven();
    let at = pressed_for_a_second(&mut model, at, 3, 110);
    (model, at)
}

/// [`starved_by_a_probe_from_a_proof`], then back at the ρ̂ before the
/// proof: the floor until the limiter serves without refusing, a drain,
/// and a clean window of cruise. Returns the model, cruising, and the
/// instant reached.
fn recovered() -> (LimiterModel, i64) {
    let (mut model, mut at) = starved_by_a_probe_from_a_proof();
    // Not a search from 30/s: ρ̂ is what it was before the proof, the
    // proof's windows over it were the bank, and the fleet sends the
    // floor while the limiter repays what its refusals cost.
    let Phase::Recover { since_ms } = model.phase() else {
        panic!("{:?}", model.phase());
    };
    assert!(since_ms <= at);
    assert_eq!(model.rate_m(), Some(1_000 * MILLI));
    assert_eq!(model.burst_m(), 124 * MILLI);
    assert_eq!(model.target_m(at), MILLI);
    // A store that keeps the model as bytes reads the phase back.
    let mut w = crate::codec::Writer::new(0);
    model.write(&mut w);
    let bytes = w.finish();
    let mut r = crate::codec::Reader::new(&bytes, "model", 0).expect("format");
    assert_eq!(LimiterModel::read(&mut r, "model"), Ok(model.clone()));
    // A worker whose attempts were served just before the collapse
    // reports them with no refusal: counts made before the floor say
    // nothing of the debt, and the floor holds.
    model.on_report(&Report {
        now_ms: at + 50,
        age_ms: at + 50 - since_ms + REPORT_MS,
        served: 2,
        refused: 0,
        closing: 0,
        longest_hint_ms: 0,
    });
    assert_eq!(model.phase(), Phase::Recover { since_ms });
    // Refusals drawn before go on arriving: the floor holds through them.
    at = straggled(&mut model, at, (0, 40), 0);
    assert_eq!(model.phase(), Phase::Recover { since_ms });
    // Served without a refusal: the debt is repaid, drain at ρ̂, whose
    // window takes the stragglers' refusals as drawn before it.
    at += 100;
    tell(&mut model, at, 1, 0);
    assert_eq!(
        model.phase(),
        Phase::Drain {
            fresh: true,
            probe: false
        }
    );
    assert_eq!(model.target_m(at), 937_500);
    at = straggled(&mut model, at, (5, 30), 90);
    at += WINDOW_MS;
    tell(&mut model, at, 930, 0);
    close(&mut model, at);
    assert_eq!(model.phase(), Phase::Cruise { windows: 0 });
    assert_eq!(model.target_m(at), 937_500);
    (model, at)
}

#[test]
fn a_probe_from_a_proof_that_starves_the_limiter_returns_to_the_rate_before_the_proof() {
    let (mut model, at) = recovered();
    // Had the capacity fallen instead, cruise starves it too; that
    // reading, with no proof standing, starts the search again.
    let at = pressed_for_a_second(&mut model, at, 3, 110);
    assert_eq!(model.rate_m(), None, "{:?}", model.phase());
    assert!(model.target_m(at) < 100 * MILLI, "{:?}", model.phase());
}

/// Cruises at the target from `at`, each window served whole, until the
/// probe is due. Returns the instant reached.
fn cruised_to_a_probe(model: &mut LimiterModel, mut at: i64) -> i64 {
    for _ in 0..=PROBE_EVERY {
        at += WINDOW_MS;
        let served = model.target_m(at) / MILLI;
        tell(model, at, served, 0);
        close(model, at);
        if model.phase() == Phase::Probe {
            return at;
        }
    }
    panic!("no probe after {PROBE_EVERY} windows: {:?}", model.phase());
}

#[test]
fn on_a_limiter_seen_to_starve_a_refused_probe_goes_to_the_floor_without_pressing() {
    // The limiter starved when pressed, and the ρ̂ before the proof was
    // then served whole: a cliff, not a fall.
    let (mut model, at) = recovered();
    let mut at = cruised_to_a_probe(&mut model, at);
    // The probe is refused: the debt it ran up is repaid at the floor,
    // not pressed on to measure an edge that is where it was.
    at += 100;
    tell(&mut model, at, 60, 8);
    assert_eq!(model.phase(), Phase::Recover { since_ms: at });
    assert_eq!(model.rate_m(), Some(1_000 * MILLI));
    assert_eq!(model.target_m(at), MILLI);
    at = straggled(&mut model, at, (0, 20), 0);
    at += 100;
    tell(&mut model, at, 1, 0);
    at = straggled(&mut model, at, (0, 0), 900);
    assert_eq!(model.phase(), Phase::Cruise { windows: 0 });
    // A probe the bank serves for three windows proves more than σ̂...
    let mut at = cruised_to_a_probe(&mut model, at);
    let bank = model.burst_m();
    while model.rate_m() == Some(1_000 * MILLI) {
        at += WINDOW_MS;
        assert!(at < 40_000, "no proof: {:?}", model.phase());
        let served = model.target_m(at) / MILLI;
        tell(&mut model, at, served, 0);
        close(&mut model, at);
    }
    assert_eq!(model.rate_m(), Some(1_062_500));
    // ...and the probe over it is refused: the proof is undone at once,
    // its excess the bank, without pressing the limiter to judge it.
    at += 100;
    tell(&mut model, at, 60, 8);
    assert_eq!(model.phase(), Phase::Recover { since_ms: at });
    assert_eq!(model.rate_m(), Some(1_000 * MILLI));
    assert!(model.burst_m() > bank, "σ̂ {} ≤ {bank}", model.burst_m());
}

#[test]
fn a_fall_found_after_the_collapse_is_no_cliff() {
    // The limiter starved when pressed over a proof, and the floor repaid
    // its debt...
    let (mut model, mut at) = starved_by_a_probe_from_a_proof();
    at = straggled(&mut model, at, (1, 0), 0);
    assert!(
        matches!(model.phase(), Phase::Drain { .. }),
        "{:?}",
        model.phase()
    );
    // ...but the ρ̂ before the proof is refused too: the capacity fell
    // (to 500/s, refused less than served), measured as ever.
    at = pressed_for_a_second(&mut model, at, 50, 10);
    assert_eq!(model.rate_m(), Some(500 * MILLI), "{:?}", model.phase());
    let at = straggled(&mut model, at, (50, 0), 468);
    // A probe refused from there drains as on any limiter.
    let mut at = cruised_to_a_probe(&mut model, at);
    at += 100;
    tell(&mut model, at, 30, 4);
    assert!(
        matches!(model.phase(), Phase::Drain { .. }),
        "{:?}",
        model.phase()
    );
}
