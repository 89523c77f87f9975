//! The model of an upstream's limiter, estimated from what the fleet
//! reports, and the pacing it gives (`docs/pacing.md`, "The model").
//!
//! A limiter admits at most `σ + ρ·τ` requests in any interval of length
//! τ: ρ is its sustained rate, σ its burst. What the fleet reports proves
//! two kinds of things about it. A refusal marks an *empty instant* (the
//! limiter had no credit then), and between two empty instants a limiter
//! whose bank never overflowed admitted exactly ρ per second: the *span
//! estimate*. A clean window proves only `served ≤ σ + ρ`, so it never
//! raises ρ̂ by itself; only an excess over ρ̂ larger than the bank can
//! explain does.
//!
//! [`LimiterModel`] keeps the estimates (ρ̂, σ̂, the limiter's memory) and
//! the pacing [`Phase`], and answers one question: the **target**, the
//! rate at which the whole fleet's attempts may reach the upstream. It is
//! fed every [`Report`]'s counts as they come and a [`WindowEnd`] when a
//! window closes. Pure and integer: every replica computes the same.
//!
//! It is the controller `docs/pacing.md` describes as the model, checked
//! against the three limiter shapes on a virtual clock (`model_sim.rs`);
//! the coordinator still paces with [`PacingState`](super::PacingState).

use super::{HINT_GRANULARITY_MS, MILLI, WINDOW_MS};

/// A fraction `num / den`, for the gains and margins below.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Fraction {
    /// Numerator.
    pub num: i64,
    /// Denominator.
    pub den: i64,
}

impl Fraction {
    /// `value × num / den`, rounded down.
    pub fn of(self, value: i64) -> i64 {
        value.saturating_mul(self.num) / self.den
    }
}

/// How far a probe offers over ρ̂: the overshoot a probe may cause when
/// ρ̂ is right. BBR probes at 1.25 because a link has no bank to hide an
/// overshoot; a limiter's bank hides one for its whole memory, so a probe
/// here must be small enough to be harmless that long: the tenth the
/// benchmark allows in any second, less what ρ̂ may be off by (a reading
/// averages a second of reports; a few percent).
pub const PROBE_GAIN: Fraction = Fraction { num: 17, den: 16 };

/// What cruise leaves unused of ρ̂: the estimate's one window of slack
/// keeps cruise under the edge, and the bank refills between probes. The price
/// is utilisation: at least fifteen sixteenths of ρ̂ while work waits.
pub const CRUISE_GAIN: Fraction = Fraction { num: 15, den: 16 };

/// Windows of cruise with work waiting before a probe. A probe that finds
/// no more costs about (PROBE_GAIN − 1)·ρ̂ refusals for a report round
/// trip plus the pressed window that measures ρ, about 0.15·ρ̂, against
/// this many windows of ρ̂: under one percent of attempts refused while
/// the capacity does not move, by the schedule rather than by luck.
pub const PROBE_EVERY: u32 = 16;

/// The longest span between empty instants the model keeps per window
/// counts for. A longer one is cut: its start is no longer known empty,
/// so it bounds ρ from below only. Thirty-two seconds covers the memory
/// of every limiter shape the benchmarks run (bursts up to 10 s).
pub const MAX_SPAN: usize = 32;

/// The shortest a refusal's pressure is held to measure ρ: three report
/// ticks, so the reading averages a few reports' counts. A limiter whose
/// `Retry-After` says its credit comes back later than this is pressed
/// that long (a whole-second hint: a second): a reading over less than
/// that reads what came back, an echo of what the fleet sent before.
pub const MEASURE_MS: i64 = 300;

/// Limiters whose hint says credit comes back later than this are not
/// measured by pressing (pressing a ten-second window is ten seconds of
/// overshoot): the span between windows with refusals, checked against
/// the bank, measures them.
pub const MAX_PRESS_MS: i64 = WINDOW_MS;

/// Before anything is measured, the fleet's target doubles every window
/// it was used in (BBR's startup, at a gain of two per window rather than
/// per round trip: a window is the shortest interval the fleet's counts
/// resolve).
const STARTUP_GAIN: Fraction = Fraction { num: 2, den: 1 };

/// One report's counts, as the model reads them.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Report {
    /// The coordinator's clock.
    pub now_ms: i64,
    /// Attempts served.
    pub served: i64,
    /// Capacity refusals no closing hint explains: each marks an empty
    /// instant.
    pub refused: i64,
    /// The longest `Retry-After` among those refusals, ms (whole seconds,
    /// as hints are sent): a limiter's hint names when its credit comes
    /// back, which is its memory.
    pub longest_hint_ms: i64,
}

/// How a window ended, beyond its counts.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct WindowEnd {
    /// Whether work waited for the target in it (slots were all taken, or
    /// intents were told to ask again for lack of rate): only then does a
    /// probe or startup's doubling prove anything.
    pub demand: bool,
    /// Whether a closing hint covered it (an outage): nothing is learned,
    /// and the limiter is taken to have lost its bank.
    pub closed: bool,
}

/// What the fleet is doing with the model.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Phase {
    /// Nothing measured yet: the target doubles each window it is used.
    Startup {
        /// The target in force, milli-attempts per second.
        target_m: i64,
    },
    /// Serving ρ̂ less the margin.
    Cruise {
        /// Windows with demand since the last probe.
        windows: u32,
    },
    /// Offering [`PROBE_GAIN`] over ρ̂ until the limiter refuses or the
    /// excess served is more than the bank explains.
    Probe,
    /// A refusal came back: the rate that drew it is held until another
    /// refusal comes at least [`MEASURE_MS`] (or the limiter's memory)
    /// later. Between two refusals the limiter went from empty to empty,
    /// so what it served in between, over the time between, is ρ.
    Measure {
        /// The target that drew the refusal, held.
        drew_m: i64,
        /// The report that carried the refusal.
        since_ms: i64,
        /// From when a refusal ends the measurement.
        until_ms: i64,
        /// Served since `since_ms`.
        served: i64,
    },
    /// The window after the edge was found, at the cruise rate: its
    /// refusals, if they go on through a whole one, say the capacity is
    /// under even that.
    Drain {
        /// Entered in the window now accumulating: its refusals were drawn
        /// before the drain, not by it.
        fresh: bool,
    },
    /// An outage: nothing is offered for the model's sake, nothing learned.
    Closed,
}

/// The instants a limiter's long hints named for its credit to come back,
/// and what was served since the latest: on a window limiter, the span
/// between two of them holds one window's quota, however the fleet spread
/// it (`LimiterModel::on_report`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
struct CreditReturns {
    /// The one before the latest, and the latest (0: none yet).
    named: [i64; 2],
    /// Served in reports after the latest.
    served: i64,
}

/// Windows served beyond a rate not yet measured, awaiting a
/// measurement: whatever they served over the ρ it finds was the bank.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Unexplained {
    /// Served per window, oldest first.
    windows: Vec<i64>,
}

/// The estimates of one route's limiter and the pacing phase.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LimiterModel {
    /// ρ̂, milli-attempts per second; `None` until a refusal measured it.
    rate_m: Option<i64>,
    /// σ̂, milli-attempts: the largest burst the limiter was seen to serve
    /// over ρ̂. Zero until seen: a span is trusted only where it needs no
    /// more bank than was seen.
    burst_m: i64,
    /// The same bank in ms of the ρ̂ it was seen at: a token bucket's
    /// burst is usually set as time at its rate, so when ρ̂ grows its bank
    /// is taken to grow with it (the larger of the two is what a clean
    /// probe must exceed).
    burst_ms: i64,
    /// The longest honest hint seen while pressed, ms.
    hint_memory_ms: i64,
    /// The credit returns the limiter's long hints named.
    credit: CreditReturns,
    /// What was served over a guess of ρ that the next measurement will
    /// judge: the first contact's window (served before ρ̂ existed), or
    /// the excess a clean probe took as growth. If the measurement finds ρ
    /// no higher, that much was the bank.
    unexplained_m: Option<Unexplained>,
    /// Served per closed window since the last window with a refusal
    /// (oldest first).
    span: Vec<i64>,
    /// Whether `span` starts at a known empty instant.
    span_anchored: bool,
    /// The window being accumulated: served and refused so far.
    w_served: i64,
    w_refused: i64,
    /// The pacing phase.
    phase: Phase,
    /// The floor no target goes under: a route paced to nothing never
    /// learns that its upstream came back.
    floor_m: i64,
}

impl LimiterModel {
    /// A route seen for the first time, paced from `start_m` (what its
    /// first attempts alone already send, or the floor).
    pub fn new(start_m: i64, floor_m: i64) -> Self {
        Self {
            rate_m: None,
            burst_m: 0,
            burst_ms: 0,
            hint_memory_ms: 0,
            unexplained_m: None,
            credit: CreditReturns::default(),
            span: Vec::new(),
            span_anchored: false,
            w_served: 0,
            w_refused: 0,
            phase: Phase::Startup {
                target_m: start_m.max(floor_m),
            },
            floor_m,
        }
    }

    /// ρ̂, once measured.
    pub fn rate_m(&self) -> Option<i64> {
        self.rate_m
    }

    /// σ̂ now: the largest bank seen, or the longest one in time at ρ̂.
    pub fn burst_m(&self) -> i64 {
        let timed = self
            .rate_m
            .map_or(0, |rate| rate.saturating_mul(self.burst_ms) / WINDOW_MS);
        self.burst_m.max(timed)
    }

    /// Records a bank the limiter was seen to serve, `bank_m` over ρ̂.
    fn saw_bank(&mut self, bank_m: i64) {
        self.burst_m = self.burst_m.max(bank_m);
        if let Some(rate) = self.rate_m.filter(|&rate| rate > 0) {
            self.burst_ms = self.burst_ms.max(bank_m.saturating_mul(WINDOW_MS) / rate);
        }
    }

    /// The limiter's memory M̂, ms: how long its credit takes to come back
    /// (σ̂/ρ̂, or the longest honest hint). A reading over a shorter time
    /// measures an echo of what the fleet sent a memory ago, not ρ.
    pub fn memory_ms(&self) -> i64 {
        let from_burst = match self.rate_m {
            Some(rate) if rate > 0 => self.burst_m().saturating_mul(WINDOW_MS) / rate,
            _ => 0,
        };
        from_burst.max(self.hint_memory_ms)
    }

    /// Windows of cruise with demand before a probe: [`PROBE_EVERY`] per
    /// second the limiter's hints say its credit takes to come back. A
    /// probe that finds no more costs refusals for as long as the limiter
    /// remembers (a fixed window's tail after its quota runs out early),
    /// so probes are that much rarer and cost the same share of attempts.
    fn probe_every(&self) -> u32 {
        let seconds = (self.hint_memory_ms + WINDOW_MS - 1) / WINDOW_MS;
        PROBE_EVERY.saturating_mul(u32::try_from(seconds.clamp(1, 3_600)).unwrap_or(1))
    }

    /// The phase.
    pub fn phase(&self) -> Phase {
        self.phase
    }

    /// The rate the fleet's attempts in all may reach the upstream at now,
    /// milli-attempts per second.
    pub fn target_m(&self) -> i64 {
        let target = match (self.phase, self.rate_m) {
            (Phase::Closed, _) => return 0,
            (Phase::Startup { target_m }, _) => target_m,
            (Phase::Measure { drew_m, .. }, _) => drew_m,
            (_, None) => self.floor_m,
            (Phase::Cruise { .. }, Some(rate)) => CRUISE_GAIN.of(rate),
            (Phase::Probe, Some(rate)) => PROBE_GAIN.of(rate),
            (Phase::Drain { .. }, Some(rate)) => CRUISE_GAIN.of(rate),
        };
        target.max(self.floor_m)
    }

    /// Takes in one report's counts.
    pub fn on_report(&mut self, report: &Report) {
        self.credit_returns(report);
        if self.phase == Phase::Closed {
            return;
        }
        self.w_served += report.served;
        self.w_refused += report.refused;
        if report.refused > 0 {
            self.hint_memory_ms = self.hint_memory_ms.max(report.longest_hint_ms);
        }
        if let Phase::Measure {
            drew_m,
            since_ms,
            until_ms,
            served,
        } = self.phase
        {
            let served = served + report.served;
            let elapsed = (report.now_ms - since_ms).max(1);
            let reading = served * MILLI * WINDOW_MS / elapsed;
            if report.now_ms >= until_ms && report.refused > 0 {
                // Empty again: what it served in between is ρ.
                self.measured(reading);
            } else if report.now_ms >= until_ms + WINDOW_MS {
                // No refusal for a window past the memory while the rate
                // that drew one was held: the limiter serves at least it.
                let floor = self.rate_m.map_or(reading, |rate| rate.max(reading));
                self.measured(floor);
            } else {
                self.phase = Phase::Measure {
                    drew_m,
                    since_ms,
                    until_ms,
                    served,
                };
            }
            return;
        }
        if report.refused == 0 {
            return;
        }
        // A refusal: the limiter is empty now. Startup and probes found
        // the edge; in cruise the capacity fell (or ρ̂ is high).
        let drew_m = self.target_m();
        if self.hint_memory_ms > MAX_PRESS_MS {
            // Credit comes back only after a long while (the limiter's own
            // hint says so): pressing would overshoot that long. Give back
            // at once, and let the window's end measure from the span.
            self.phase = match self.phase {
                Phase::Probe | Phase::Cruise { .. } => Phase::Drain { fresh: true },
                Phase::Startup { target_m } => Phase::Startup {
                    target_m: (target_m / 2).max(self.floor_m),
                },
                phase => phase,
            };
            return;
        }
        if matches!(
            self.phase,
            Phase::Startup { .. } | Phase::Probe | Phase::Cruise { .. }
        ) {
            self.phase = Phase::Measure {
                drew_m,
                since_ms: report.now_ms,
                until_ms: report.now_ms + MEASURE_MS.max(self.hint_memory_ms),
                served: 0,
            };
        }
    }

    /// Follows the credit returns a limiter's long hints name. A refusal
    /// whose hint says credit comes back only after more than a window
    /// names an instant; one after that instant has come, naming an
    /// instant a second or more later, starts a new episode. Between two
    /// named instants a window limiter's quota came back once and was
    /// spent (a fixed window's boundary to the next), so what was served
    /// between them, over the time between, is ρ. An outage names its end
    /// too, and a span across one reads low; only when two spans in a row
    /// have the same length (a window limiter is periodic, outages are
    /// not) does the reading replace ρ̂; otherwise it only raises it.
    fn credit_returns(&mut self, report: &Report) {
        let [older, latest] = self.credit.named;
        if latest > 0 && report.now_ms > latest {
            self.credit.served += report.served;
        }
        if report.refused == 0 || report.longest_hint_ms <= MAX_PRESS_MS {
            return;
        }
        let named = report.now_ms.saturating_add(report.longest_hint_ms);
        if latest > 0 && (report.now_ms < latest || named <= latest + HINT_GRANULARITY_MS) {
            // The same episode: refused again before the credit it named
            // came back (a countdown, or a limiter re-arming its penalty),
            // or naming the same instant to a hint's rounding.
            return;
        }
        if latest > 0 {
            let gap = named - latest;
            let reading = self.credit.served * MILLI * WINDOW_MS / gap.max(1);
            let periodic = older > 0 && (gap - (latest - older)).abs() <= HINT_GRANULARITY_MS;
            match (self.rate_m, periodic) {
                (Some(rate), false) => self.rate_m = Some(rate.max(reading)),
                (None, false) => self.rate_m = Some(reading.max(1)),
                (_, true) => {
                    self.judged(reading);
                    // A window limiter's quota is a bank of the whole
                    // window at ρ: a probe spends it for up to a window
                    // before anything is refused, which is not growth.
                    self.saw_bank(reading.saturating_mul(gap) / WINDOW_MS);
                }
            }
        }
        self.credit = CreditReturns {
            named: [latest, named],
            served: 0,
        };
    }

    /// A measurement of ρ is in: the bank is what was served over it
    /// while the last guess stood, and the edge is behind the fleet.
    fn measured(&mut self, rate_m: i64) {
        self.judged(rate_m);
        self.phase = Phase::Drain { fresh: true };
    }

    /// ρ is `rate_m`, measured: what was served over it while a guess
    /// stood was the bank.
    fn judged(&mut self, rate_m: i64) {
        if let Some(unexplained) = self.unexplained_m.take() {
            self.saw_bank(excess_m(&unexplained.windows, rate_m));
        }
        self.rate_m = Some(rate_m.max(1));
    }

    /// Closes the window: learns what only a whole window shows (the span
    /// since the last empty window, the bank, growth) and moves the phase
    /// on.
    pub fn on_window(&mut self, end: &WindowEnd) {
        let served = std::mem::take(&mut self.w_served);
        let refused = std::mem::take(&mut self.w_refused);
        if end.closed {
            // An upstream out has no bank left when it returns: the end of
            // the outage is an empty instant, and the span is measured
            // from it.
            self.span.clear();
            self.span_anchored = true;
            self.phase = Phase::Closed;
            return;
        }
        if self.span.len() >= MAX_SPAN {
            self.span.remove(0);
            self.span_anchored = false;
        }
        self.span.push(served);
        if refused > 0 {
            self.on_empty_window();
        } else {
            self.on_clean_window(end.demand);
        }
    }

    fn on_empty_window(&mut self) {
        let span = std::mem::take(&mut self.span);
        if self.rate_m.is_none() {
            // The first contact: its last window served ρ and whatever
            // bank the limiter had, which the measurement under way tells
            // apart.
            self.unexplained_m = Some(Unexplained {
                windows: span.clone(),
            });
        }
        if let Some(rate) = self.rate_m {
            // What the span served over ρ̂ came from the bank.
            self.saw_bank(excess_m(&span, rate));
        }
        if self.rate_m.is_none() && !matches!(self.phase, Phase::Measure { .. }) {
            // The first contact with a limiter too slow to press: what it
            // served over its memory before this refusal. Exact for a
            // sliding window (full at the refusal); over ρ by what a bank
            // held at the lookback's start, which the decrease below takes
            // back while refusals go on.
            let back = usize::try_from((self.memory_ms() + WINDOW_MS - 1) / WINDOW_MS)
                .unwrap_or(1)
                .clamp(1, span.len().max(1));
            let recent = &span[span.len().saturating_sub(back)..];
            let served: i64 = recent.iter().sum();
            self.rate_m = Some((served * MILLI / back as i64).max(1));
        }
        if let Some(reading) = self.span_reading(&span) {
            // Where the empty instants fell inside the span's first and
            // last windows is not known, nor whether the limiter stayed
            // pressed after the last: the reading bounds ρ from below.
            self.rate_m = Some(self.rate_m.map_or(reading, |rate| rate.max(reading)));
        }
        self.span_anchored = true;
        self.phase = match (self.phase, self.rate_m) {
            (Phase::Closed, _) => Phase::Cruise { windows: 0 },
            (Phase::Drain { fresh: true }, Some(_)) => Phase::Drain { fresh: false },
            (Phase::Drain { fresh: false }, Some(rate)) => {
                // Refused all through a window at the cruise rate with no
                // measurement (a memory too long to press): the capacity is
                // under that. Multiplicative decrease until a window comes
                // back clean.
                self.rate_m = Some(CRUISE_GAIN.of(rate).max(1));
                Phase::Drain { fresh: false }
            }
            (Phase::Probe | Phase::Cruise { .. } | Phase::Startup { .. }, Some(_)) => {
                Phase::Drain { fresh: false }
            }
            (phase, _) => phase,
        };
    }

    fn on_clean_window(&mut self, demand: bool) {
        let Some(rate) = self.rate_m else {
            self.phase = match self.phase {
                Phase::Startup { target_m } if demand => Phase::Startup {
                    target_m: STARTUP_GAIN.of(target_m),
                },
                Phase::Closed => Phase::Startup {
                    target_m: self.floor_m,
                },
                phase => phase,
            };
            return;
        };
        self.phase = match self.phase {
            Phase::Startup { .. } | Phase::Closed | Phase::Drain { .. } => {
                Phase::Cruise { windows: 0 }
            }
            Phase::Probe => {
                // Clean: proof of more only once what was served over ρ̂
                // since the limiter was last empty is more than its bank.
                let excess = excess_m(&self.span, rate);
                if excess > self.burst_m() {
                    // More than the bank seen so far explains: the upstream
                    // grew, or its bank is larger than seen. The next
                    // measurement tells which.
                    self.unexplained_m = Some(Unexplained {
                        windows: self.span.clone(),
                    });
                    self.rate_m = Some(PROBE_GAIN.of(rate));
                    self.span.clear();
                    self.span_anchored = false;
                }
                if demand {
                    Phase::Probe
                } else {
                    Phase::Drain { fresh: false }
                }
            }
            Phase::Cruise { windows } => {
                let windows = windows + u32::from(demand);
                if windows >= self.probe_every() {
                    Phase::Probe
                } else {
                    Phase::Cruise { windows }
                }
            }
            phase @ Phase::Measure { .. } => phase,
        };
    }

    /// ρ from a span of windows that ends in one with a refusal, if it
    /// measures it: it starts at an empty instant, is at least the
    /// limiter's memory long, and the bank, had ρ been what the span says,
    /// never needed to hold more than σ̂ (a bank that overflowed lost
    /// credit, and the span would read low).
    fn span_reading(&self, span: &[i64]) -> Option<i64> {
        let windows = span.len() as i64;
        // A limiter that can be pressed is measured by pressing, exactly;
        // a span is its second best.
        let memory = self.memory_ms();
        if !self.span_anchored || memory <= MAX_PRESS_MS || windows * WINDOW_MS < memory {
            return None;
        }
        let total: i64 = span.iter().sum();
        let rate = total * MILLI / windows;
        let mut bank = 0i64;
        for &served in span {
            bank = (bank + rate - served * MILLI).max(0);
            if bank > self.burst_m() {
                return None;
            }
        }
        Some(rate)
    }
}

/// The most a span served over `rate_m` in any run of its windows ending
/// at its last: what a bank must have held to serve it.
fn excess_m(span: &[i64], rate_m: i64) -> i64 {
    let mut run = 0i64;
    let mut most = 0i64;
    for &served in span.iter().rev() {
        run += served * MILLI - rate_m;
        most = most.max(run);
    }
    most
}
