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
//! [`PacingState`](super::PacingState) splits its target between first
//! attempts and the intents that wait.

use super::{CLOSING_MS, HINT_GRANULARITY_MS, MILLI, REPORT_TICK_MS, WINDOW_MS, share_made_within};
use crate::codec::{DecodeError, Reader, Writer};

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
/// no more ends at its first refusal against a measured ρ̂: it costs about
/// (PROBE_GAIN − 1)·ρ̂ refusals while it spends the bank and for the report
/// round trip, about 0.06·ρ̂, against this many windows of ρ̂: under one
/// percent of attempts refused while the capacity does not move, by the
/// schedule rather than by luck. No more: a rise that nothing announces is
/// found only by a probe, so this is how long one can go unseen.
pub const PROBE_EVERY: u32 = 8;

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
pub const MEASURE_MS: i64 = 3 * REPORT_TICK_MS;

/// Limiters whose hint says credit comes back later than this are not
/// measured by pressing (pressing a ten-second window is ten seconds of
/// overshoot): the span between windows with refusals, checked against
/// the bank, measures them. It is the hint that closes a route
/// ([`CLOSING_MS`]): a hint in whole seconds, the only kind there is, says
/// 1 s or, as an HTTP date rounded to the second, up to 2 s for a limiter
/// whose credit comes back within a window.
pub const MAX_PRESS_MS: i64 = CLOSING_MS;

/// Before anything is measured, the target climbs past what the upstream
/// served by a step that doubles every window work waited in (BBR's
/// startup, at a gain of two per window rather than per round trip: a
/// window is the shortest interval the fleet's counts resolve). The gain is
/// on the step, not on the whole target: the first attempts a fleet sends
/// straight are most of what it offers, and doubling them would overshoot
/// the edge by as much again.
const STARTUP_GAIN: Fraction = Fraction { num: 2, den: 1 };

/// The first startup step over what a window served: the probe's own
/// sixteenth twice over, so startup finds an edge within a few windows of
/// an upstream several times what the fleet sends, and overshoots by at
/// most one doubled step where it finds it.
const FIRST_STEP: Fraction = Fraction { num: 1, den: 8 };

/// One report's counts, as the model reads them.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Report {
    /// The coordinator's clock.
    pub now_ms: i64,
    /// How old the report's oldest count is (0: not said): its counts were
    /// made in the `age_ms` before `now_ms`.
    pub age_ms: i64,
    /// Attempts served.
    pub served: i64,
    /// Capacity refusals whose hint does not close the route: each marks
    /// an empty instant.
    pub refused: i64,
    /// Refusals whose hint closes the route (longer than [`CLOSING_MS`]):
    /// an outage's, or a window limiter's quota spent seconds before its
    /// boundary. They measure nothing by themselves; the instants they
    /// name are the credit returns.
    pub closing: i64,
    /// The longest `Retry-After` among all the refusals, ms (whole
    /// seconds, as hints are sent): a limiter's hint names when its credit
    /// comes back, which is its memory.
    pub longest_hint_ms: i64,
}

impl Report {
    /// The report with only its counts made in the last `span_ms`, as if
    /// made evenly over their age ([`share_made_within`]).
    fn made_within(&self, span_ms: i64) -> Report {
        let share = |n: i64| share_made_within(n, self.age_ms, span_ms);
        Report {
            age_ms: self.age_ms.min(span_ms.max(0)),
            served: share(self.served),
            refused: share(self.refused),
            closing: share(self.closing),
            ..*self
        }
    }
}

/// How a window ended, beyond its counts.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct WindowEnd {
    /// The instant it ended (the next one starts).
    pub at_ms: i64,
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
    /// Nothing measured yet: the target climbs by a step that doubles
    /// each window work waited in.
    Startup {
        /// The target in force, milli-attempts per second.
        target_m: i64,
        /// The step it climbs to it (0: none), across the window that
        /// starts at `from_ms`: a target that jumped at the window's start
        /// would overshoot an edge it crossed by the whole step until the
        /// first refusal is reported; climbed, by what it climbs
        /// meanwhile.
        step_m: i64,
        /// When the climb began.
        from_ms: i64,
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
        /// Refused since `since_ms`: whether the limiter was kept pressed.
        refused: i64,
        /// A probe is due when it ends: it interrupted a drain that had
        /// one due (the limiter's memory of a pressing far over the edge
        /// reads as a fall in the window after).
        probe: bool,
    },
    /// The window after the edge was found, at the cruise rate: its
    /// refusals, if they go on through a whole one, say the capacity is
    /// under even that.
    Drain {
        /// Entered in the window now accumulating: its refusals were drawn
        /// before the drain, not by it.
        fresh: bool,
        /// Probe as soon as it is over: the measurement pressed far over
        /// the edge, and a limiter spends capacity refusing (parsing,
        /// authenticating, answering), so it served less than its rate by
        /// what the refusals cost. A probe from the low reading finds the
        /// rest; a probe's own refusals are few, and cost little.
        probe: bool,
    },
    /// Pressing over a ρ̂ a proof raised starved the limiter (bound 8 of
    /// `docs/pacing.md`): the fleet sends only the floor until the
    /// limiter serves without refusing, its debt repaid, and then drains
    /// at the ρ̂ the proof was taken from.
    Recover {
        /// When it began: only counts made since say the debt is repaid.
        since_ms: i64,
    },
    /// An outage: nothing is learned; when it ends the fleet resumes at ρ̂
    /// less the margin, or, with nothing measured, at the startup target
    /// in force before it.
    Closed {
        /// The startup target to resume at if nothing was measured.
        startup_m: i64,
    },
}

impl Phase {
    /// The operator's name (`PacingView::phase`).
    pub fn as_str(self) -> &'static str {
        match self {
            Phase::Startup { .. } => "startup",
            Phase::Cruise { .. } => "cruise",
            Phase::Probe => "probe",
            Phase::Measure { .. } => "measure",
            Phase::Drain { .. } => "drain",
            Phase::Recover { .. } => "recover",
            Phase::Closed { .. } => "closed",
        }
    }
}

/// The instants a limiter's long hints named for its credit to come back,
/// and what was served between them: on a window limiter, the span
/// between two of them holds one window's quota, however the fleet spread
/// it (`LimiterModel::credit_returns`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
struct CreditReturns {
    /// The latest named instant that has come (0: none yet): the span
    /// being counted starts there.
    from_ms: i64,
    /// The next named instant, once a refusal after `from_ms` named it
    /// (0: none yet): the span ends there.
    until_ms: i64,
    /// Served in reports after `from_ms`.
    served: i64,
    /// The length of the last span read (0: none yet).
    gap_ms: i64,
}

/// What the model knows of a limiter's cliff (bound 8 of `docs/pacing.md`):
/// whether pressing it over its edge serves next to nothing, because each
/// refusal costs it what serving does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Cliff {
    /// Not seen: a probe refused over a proof presses the limiter to judge
    /// the proof, and one refused over a measured ρ̂ drains.
    Unseen,
    /// Pressing over a proof starved the limiter and ρ̂ went back to before
    /// the proof ([`LimiterModel::collapsed`]): a cliff, or a capacity that
    /// fell as it was pressed. The drain at that ρ̂ tells which: a fall
    /// refuses it.
    Suspected,
    /// The drain at the ρ̂ before the proof served a clean window: the
    /// capacity had not fallen, pressing starved the limiter. A probe's
    /// refusal here runs the limiter into a debt that a drain at 15/16
    /// repays at a sixteenth of the capacity, refusing everything
    /// meanwhile, and pressing to judge a proof runs up more: a refused
    /// probe goes to the floor at once, and undoes the proof it stood on.
    Seen,
}

/// Windows served beyond a rate not yet measured, awaiting a
/// measurement: whatever they served over the ρ it finds was the bank,
/// unless it finds the capacity fell.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Unexplained {
    /// Served per window, oldest first.
    windows: Vec<i64>,
    /// ρ̂ when they were served (a probe's proof raised it from this;
    /// `None` at first contact, when nothing was measured). A measurement
    /// under this less the cruise margin is a capacity that fell: the
    /// windows were served at the capacity of their time, and judged
    /// against the fall they would read as a bank the limiter never had,
    /// one that no probe could ever prove more than.
    before_m: Option<i64>,
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
    /// Windows startup has climbed in a row, offering more than was
    /// served before: the only windows in which a bank can show before
    /// anything is measured.
    climbed: u32,
    /// The window being accumulated: served and refused so far.
    w_served: i64,
    w_refused: i64,
    /// The pacing phase.
    phase: Phase,
    /// Whether pressing this limiter over its edge starves it.
    cliff: Cliff,
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
            climbed: 0,
            w_served: 0,
            w_refused: 0,
            phase: Phase::Startup {
                target_m: start_m.max(floor_m),
                step_m: 0,
                from_ms: 0,
            },
            cliff: Cliff::Unseen,
            floor_m,
        }
    }

    /// ρ̂, once measured.
    pub fn rate_m(&self) -> Option<i64> {
        self.rate_m
    }

    /// Whether the model has an estimate at `now_ms` to pace every attempt
    /// by: ρ̂, or a target above the floor (startup's, from what the
    /// upstream was seen to serve). A route first heard of while its
    /// upstream was out (a coordinator restarted during an outage) has
    /// neither: its target is the floor, a placeholder, and every attempt
    /// held to it would starve the fleet that first attempts sent straight
    /// would have found the capacity with.
    pub fn estimates(&self, now_ms: i64) -> bool {
        self.rate_m.is_some() || self.target_m(now_ms) > self.floor_m
    }

    /// σ̂ now: the largest bank seen, or the longest one in time at ρ̂,
    /// or, on a limiter whose hints say its credit comes back more than a
    /// window later, what ρ̂ earns in that time: a window limiter's quota
    /// is a bank of its whole window, spent before anything is refused,
    /// and a probe that spends it proves no growth.
    pub fn burst_m(&self) -> i64 {
        let Some(rate) = self.rate_m else {
            return self.burst_m;
        };
        let mut ms = self.burst_ms;
        if self.hint_memory_ms > MAX_PRESS_MS {
            ms = ms.max(self.hint_memory_ms);
        }
        self.burst_m.max(rate.saturating_mul(ms) / WINDOW_MS)
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
        if self.hint_memory_ms <= MAX_PRESS_MS {
            // Whole-second hints of a limiter pressed within a window.
            return PROBE_EVERY;
        }
        let seconds = (self.hint_memory_ms + WINDOW_MS - 1) / WINDOW_MS;
        PROBE_EVERY.saturating_mul(u32::try_from(seconds.clamp(1, 3_600)).unwrap_or(1))
    }

    /// The phase.
    pub fn phase(&self) -> Phase {
        self.phase
    }

    /// The rate the fleet's attempts in all may reach the upstream at
    /// `now_ms`, milli-attempts per second.
    pub fn target_m(&self, now_ms: i64) -> i64 {
        let target = match (self.phase, self.rate_m) {
            (
                Phase::Startup {
                    target_m,
                    step_m,
                    from_ms,
                },
                _,
            ) if step_m > 0 => {
                let into = now_ms.saturating_sub(from_ms).clamp(0, WINDOW_MS);
                target_m - step_m + step_m * into / WINDOW_MS
            }
            (Phase::Closed { .. }, Some(rate)) => CRUISE_GAIN.of(rate),
            (Phase::Closed { startup_m }, None) => startup_m,
            (Phase::Startup { target_m, .. }, _) => target_m,
            (Phase::Measure { drew_m, .. }, _) => drew_m,
            (Phase::Recover { .. }, _) => self.floor_m,
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
        if matches!(self.phase, Phase::Closed { .. }) {
            return;
        }
        self.w_served += report.served;
        self.w_refused += report.refused;
        if report.refused > 0 && report.longest_hint_ms <= MAX_PRESS_MS {
            // A longer hint is the limiter's memory only once it repeats
            // (`credit_returns`): an outage's hint is as long, once.
            self.hint_memory_ms = self.hint_memory_ms.max(report.longest_hint_ms);
        }
        if matches!(self.phase, Phase::Measure { .. }) {
            self.measuring(report);
        } else if report.refused > 0 {
            self.refused_now(report);
        } else if let Phase::Recover { since_ms } = self.phase
            && report.served > 0
            && report.now_ms - report.age_ms.max(REPORT_TICK_MS) >= since_ms
        {
            // Served, and nothing refused, by counts all made since the
            // fleet fell to the floor: the debt is repaid (a limiter in
            // debt serves nothing). A report holding counts from before
            // says nothing: a worker whose attempts were served just
            // before the collapse reports them with no refusal, and ended
            // the recovery in the collapse's own window, into the debt.
            // Counts of unsaid age are taken as a tick old. Refusals drawn
            // before may still be reported in this window, which the drain
            // expects.
            self.phase = Phase::Drain {
                fresh: true,
                probe: false,
            };
        }
    }

    /// A report while measuring: the measurement begins when serving
    /// does, and ends at a refusal past its end (or a window after it).
    fn measuring(&mut self, report: &Report) {
        let Phase::Measure {
            drew_m,
            since_ms,
            until_ms,
            served,
            refused,
            probe,
        } = self.phase
        else {
            return;
        };
        // Counts land when their report does, a report tick after they were
        // made, so a tick's counts straddle the measurement's start, as the
        // refusal that started it was reported a tick late: they count
        // whole. Counts that span more were held (a worker's calls were
        // slow, or it kept them while its coordinator did not answer):
        // only those made since a tick before the measurement began are
        // its own. Read whole, a coordinator resumed after SIGSTOP took its
        // fleet's recovery on local budgets for the limiter's rate, and
        // measured 433/s of a limiter of 200/s.
        let report = &report.made_within(report.now_ms - since_ms + REPORT_TICK_MS);
        let served = served + report.served;
        let refused = refused + report.refused;
        let elapsed = (report.now_ms - since_ms).max(1);
        let reading = served * MILLI * WINDOW_MS / elapsed;
        // Where the measurement starts, and what it has counted since.
        let (since, served, refused) = if served == 0 {
            // Nothing served since it began: the upstream is out (or
            // the fleet sent nothing, waiting out a cooldown), which
            // says nothing of its rate. The measurement starts when
            // serving does: a span across the rest of an outage would
            // read its idle time as a low rate.
            (report.now_ms, 0, 0)
        } else if served == report.served && report.age_ms > 0 {
            // The first report that served anything: serving began no
            // earlier than its oldest count (a silence before it, the
            // fleet waiting out an outage's hints, is not the limiter's
            // rate).
            (since_ms.max(report.now_ms - report.age_ms), served, refused)
        } else if report.now_ms >= until_ms && report.refused > 0 {
            // Empty again: what it served in between is ρ, if the
            // limiter was kept empty in between.
            let dry = refused > served;
            if dry
                && self
                    .rate_m
                    .is_some_and(|rate| reading < CRUISE_GAIN.of(rate))
            {
                if !self.collapsed(report.now_ms) {
                    self.starved(reading, report.now_ms);
                }
            } else if pressed(served, refused) {
                self.measured(reading, drew_m, probe, dry);
            } else {
                self.unpressed(drew_m);
            }
            return;
        } else if report.now_ms >= until_ms + WINDOW_MS {
            // No refusal for a window past the memory while the rate
            // that drew one was held: the limiter serves at least what
            // it served.
            match self.rate_m {
                Some(rate) => self.measured(rate.max(reading), drew_m, probe, false),
                None => self.unpressed(drew_m),
            }
            return;
        } else {
            (since_ms, served, refused)
        };
        // A measurement that starts later ends as much later.
        self.phase = Phase::Measure {
            drew_m,
            since_ms: since,
            until_ms: until_ms + (since - since_ms),
            served,
            refused,
            probe,
        };
    }

    /// A refusal outside a measurement: the limiter is empty now.
    fn refused_now(&mut self, report: &Report) {
        // A refusal: the limiter is empty now. Startup and probes found
        // the edge; in cruise the capacity fell (or ρ̂ is high).
        let mut drew_m = self.target_m(report.now_ms);
        if let Phase::Startup {
            target_m,
            step_m,
            from_ms,
        } = self.phase
            && step_m > 0
            && report.now_ms > from_ms
        {
            // Startup's climb is over the edge by as much as the bank hid
            // (a refusal comes only once it is spent, and is counted a
            // report later): held there, the measurement would press the
            // limiter that far over for its whole length. A probe's gain
            // over what was served, in the last whole window or in this
            // one so far, presses it as well if the edge is under that;
            // if not, the refusal was not the limiter kept empty, and the
            // climb resumes from there.
            let last = self.span.last().copied().unwrap_or(0) * MILLI;
            let now = self.w_served * MILLI * WINDOW_MS / (report.now_ms - from_ms);
            // Never under where the climb began, which was served: a
            // refusal reported before anything was served since (the
            // stragglers of a pressing) would otherwise hold the floor.
            let served_m = PROBE_GAIN.of(last.max(now)).max(target_m - step_m);
            drew_m = drew_m.min(served_m).max(self.floor_m);
        }
        if self.hint_memory_ms > MAX_PRESS_MS {
            // Credit comes back only after a long while (the limiter's own
            // hint says so): pressing would overshoot that long. Give back
            // at once, and let the window's end measure from the span.
            self.phase = match self.phase {
                Phase::Probe | Phase::Cruise { .. } => Phase::Drain {
                    fresh: true,
                    probe: false,
                },
                Phase::Startup { target_m, .. } => Phase::Startup {
                    target_m: (target_m / 2).max(self.floor_m),
                    step_m: 0,
                    from_ms: 0,
                },
                phase => phase,
            };
            return;
        }
        if self.phase == Phase::Probe && self.cliff == Cliff::Seen {
            // A probe refused on a cliff: the floor until the debt it ran
            // up is repaid, then a drain at ρ̂, which a proof since (the
            // bank served it) no longer raises.
            if !self.collapsed(report.now_ms) {
                self.phase = Phase::Recover {
                    since_ms: report.now_ms,
                };
            }
            return;
        }
        if self.phase == Phase::Probe && self.unexplained_m.is_none() {
            // A probe refused against a ρ̂ that was measured, not raised by
            // a proof since: the edge is where it was. Pressing to measure
            // it again would overshoot for the limiter's memory to learn
            // nothing; the probe ends.
            self.phase = Phase::Drain {
                fresh: true,
                probe: false,
            };
            return;
        }
        // Refused a window after the drain began: not the stragglers of
        // what drew it, but a capacity that fell (it may fall during a
        // probe too).
        let fell = matches!(self.phase, Phase::Drain { fresh: false, .. });
        if self.cliff == Cliff::Suspected && (fell || matches!(self.phase, Phase::Cruise { .. })) {
            // The ρ̂ before the proof was refused: the capacity fell.
            self.cliff = Cliff::Unseen;
        }
        if fell
            || matches!(
                self.phase,
                Phase::Startup { .. } | Phase::Probe | Phase::Cruise { .. }
            )
        {
            // Startup found the edge by overshooting it by up to its step,
            // so its reading is pressed only for MEASURE_MS and is low by
            // what the refusals cost (and, on a window limiter, an echo of
            // the climb): the probe after it finds the rest at a probe's
            // overshoot rather than a step's.
            let press_ms = match self.phase {
                Phase::Startup { .. } => MEASURE_MS,
                _ => MEASURE_MS.max(self.hint_memory_ms),
            };
            self.phase = Phase::Measure {
                drew_m,
                since_ms: report.now_ms,
                until_ms: report.now_ms + press_ms,
                served: 0,
                refused: 0,
                probe: matches!(self.phase, Phase::Drain { probe: true, .. }),
            };
        }
    }

    /// Follows the credit returns a limiter's long hints name. A refusal
    /// whose hint says credit comes back only after more than a window
    /// names an instant; one after that instant has come, naming an
    /// instant a second or more later, names the next. Between two named
    /// instants a window limiter's quota came back once and was spent (a
    /// fixed window's boundary to the next), so what was served between
    /// them, counted once the second has come (reports of the quota's last
    /// attempts arrive after the refusal that named it), over the time
    /// between, is ρ. An outage names its end too, and a span across one
    /// reads low: only when two spans in a row have the same length (a
    /// window limiter is periodic, outages are not) does the reading
    /// replace ρ̂; otherwise it only raises it.
    fn credit_returns(&mut self, report: &Report) {
        let now = report.now_ms;
        let c = self.credit;
        if c.from_ms > 0 && now > c.from_ms && (c.until_ms == 0 || now <= c.until_ms) {
            self.credit.served += report.served;
        }
        if c.until_ms > 0 && now > c.until_ms {
            if c.from_ms > 0 {
                self.read_credit_span(c.until_ms - c.from_ms);
            }
            self.credit.from_ms = c.until_ms;
            self.credit.until_ms = 0;
            self.credit.served = report.served;
        }
        if report.closing == 0 || report.longest_hint_ms <= MAX_PRESS_MS {
            return;
        }
        let named = now.saturating_add(report.longest_hint_ms);
        let latest = self.credit.until_ms.max(self.credit.from_ms);
        if latest > 0 && (now < latest || named <= latest + HINT_GRANULARITY_MS) {
            // The same episode: refused again before the credit it named
            // came back (a countdown, or a limiter re-arming its penalty),
            // or naming the same instant to a hint's rounding.
            return;
        }
        if latest > 0 {
            // A second episode: an outage's hint is as long as a window
            // limiter's, once; twice, it is the limiter's memory.
            self.hint_memory_ms = self.hint_memory_ms.max(report.longest_hint_ms);
        }
        self.credit.until_ms = named;
    }

    /// Reads a span between two credit returns `gap` ms apart.
    fn read_credit_span(&mut self, gap: i64) {
        let reading = self.credit.served * MILLI * WINDOW_MS / gap.max(1);
        let last = std::mem::replace(&mut self.credit.gap_ms, gap);
        let periodic = last > 0 && (gap - last).abs() <= HINT_GRANULARITY_MS;
        match (self.rate_m, periodic) {
            (Some(rate), false) => self.rate_m = Some(rate.max(reading)),
            (None, false) => self.rate_m = Some(reading.max(1)),
            (_, true) => {
                self.judged(reading);
                // Periodic: the hint is the limiter's memory, not an
                // outage's end.
                self.hint_memory_ms = self.hint_memory_ms.max(gap);
                // A window limiter's quota is a bank of the whole window
                // at ρ: a probe spends it for up to a window before
                // anything is refused, which is not growth.
                self.saw_bank(reading.saturating_mul(gap) / WINDOW_MS);
            }
        }
    }

    /// A measurement of ρ is in: the bank is what was served over it
    /// while the last guess stood, and the edge is behind the fleet. `dry`:
    /// the limiter refused more than it served while measured.
    fn measured(&mut self, rate_m: i64, drew_m: i64, due: bool, dry: bool) {
        let reading_m = rate_m;
        let rate_m = self.not_an_echo(reading_m, dry);
        // Raised to the climb's rate, the reading was not ρ, and the climb
        // is the floor taken instead: nothing says how much of it a bank
        // served.
        let floor = rate_m > reading_m;
        if floor {
            self.unexplained_m = None;
        }
        let fell = match self.rate_m {
            Some(rate) => rate_m < CRUISE_GAIN.of(rate),
            // The first measurement, with no climb before it: the demand
            // that fit before was refused now, so the capacity fell.
            None => self.climbed == 0,
        };
        if fell || floor {
            // A drop: the windows before it were served at the ρ of their
            // time, and judged against this one they would read as a bank
            // the limiter never had. A floor: they are what it was taken
            // from. Either way the span restarts at the measurement's end,
            // an empty instant.
            self.span.clear();
            self.span_anchored = true;
        }
        // The first measurement ends startup's climb, pressed only
        // MEASURE_MS: it reads low by what the refusals cost the limiter
        // and, on a window limiter, by the echo of the climb. So does one
        // pressed far over the edge. The probe after either finds the rest
        // at a probe's overshoot.
        let first = self.rate_m.is_none();
        self.judged(rate_m);
        self.phase = Phase::Drain {
            fresh: true,
            probe: due || first || drew_m > PROBE_GAIN.of(PROBE_GAIN.of(rate_m)),
        };
    }

    /// A fall measured while the limiter refused more than it served: a
    /// limiter that spends as much refusing as serving serves next to
    /// nothing while pressed, and a capacity that fell serves what it
    /// serves; the counts cannot tell which. Neither is ρ to cruise at:
    /// the search starts again from the reading, as startup, whose climb
    /// doubles its step each window work waits and whose measurement
    /// presses only a probe's gain over what was served, where refusals
    /// cost little.
    fn starved(&mut self, reading_m: i64, now_ms: i64) {
        self.rate_m = None;
        self.unexplained_m = None;
        self.span.clear();
        self.span_anchored = true;
        self.climbed = 0;
        let base = reading_m.max(self.floor_m);
        let step = FIRST_STEP.of(base).max(MILLI);
        self.phase = Phase::Startup {
            target_m: base.saturating_add(step),
            step_m: step,
            from_ms: now_ms,
        };
    }

    /// A fall measured while the limiter refused more than it served (or,
    /// on a limiter seen to starve, a probe's refusal: [`Cliff::Seen`]),
    /// while ρ̂ stood on a proof no measurement had judged yet (drawn by
    /// the probe after it, mostly: one from a measured ρ̂ just ends at its
    /// first refusal). Both readings of `starved` fit, but the proof is
    /// the likelier cause: a bank the model had not seen serves a probe's
    /// windows as well as a rise does. Where a refusal costs what
    /// serving does, the limiter then serves nothing until the fleet falls
    /// far under its rate and the debt of its refusals is repaid (bound 8
    /// of `docs/pacing.md`), and a search restarted from what it served
    /// climbs back from next to nothing. So ρ̂ is taken back to what it
    /// was before the proof, the proof's windows over it are the bank, and
    /// the fleet sends the floor until the limiter serves without
    /// refusing. If the capacity did fall, the drain or the cruise after it
    /// draws a refusal from it, and that one starts the search again.
    /// Whether ρ̂ stood on such a proof: if not, nothing changes.
    fn collapsed(&mut self, now_ms: i64) -> bool {
        let Some(Unexplained {
            windows,
            before_m: Some(before_m),
        }) = self.unexplained_m.take_if(|u| u.before_m.is_some())
        else {
            return false;
        };
        if self.cliff == Cliff::Unseen {
            self.cliff = Cliff::Suspected;
        }
        self.saw_bank(excess_m(&windows, before_m));
        self.rate_m = Some(before_m.max(1));
        self.span.clear();
        self.span_anchored = true;
        self.phase = Phase::Recover { since_ms: now_ms };
        true
    }

    /// The first measurement, unless it reads an echo: a limiter whose
    /// memory is longer than the measurement (a sliding window of many
    /// seconds) serves, once the climb spent it, only what the fleet's
    /// own sending of a memory ago gives back, and after an outage that
    /// is next to nothing. Judged against such a reading, the climb's
    /// windows would be a bank of more than [`MAX_SPAN`] seconds, longer
    /// than any limiter the model follows, and pacing at it would only
    /// ever be given back what it sends. What the limiter served across
    /// the climb, window by window without refusing, is then the rate it
    /// sustained for that long, and the model takes that.
    ///
    /// The same holds of a limiter that spends its capacity refusing: a
    /// climb pressed over its edge is served next to nothing while it
    /// refuses (a refusal that costs what a request does), and the reading
    /// is what pressing left, not ρ. A measurement that ends inside the
    /// window of its first refusal is judged against the climb's windows
    /// closed so far. So is one that refused more than it served (`dry`)
    /// after startup climbed, whatever bank its reading would make of the
    /// climb: a search started again from a starved reading found the edge
    /// again, pressed it dry again, and read 120/s of 1 000/s, seven
    /// seconds of bank at that rate, which then proved nothing for a
    /// minute (the storm's `--reject-cost 1.0`). Either way the reading
    /// is only ever raised: a 10 s bucket's first contact is dry too (its
    /// climb spent the bank, and was pressed at what the bank served), and
    /// its climb's rate is under ρ.
    fn not_an_echo(&self, reading_m: i64, dry: bool) -> i64 {
        if self.rate_m.is_some() {
            return reading_m;
        }
        let climb = match &self.unexplained_m {
            Some(unexplained) => &unexplained.windows[..],
            None => self.climb_windows(),
        };
        let bank_m = excess_m(climb, reading_m);
        let pressed_dry = dry && self.climbed > 0;
        if climb.is_empty() || (!pressed_dry && bank_m <= reading_m.saturating_mul(MAX_SPAN as i64))
        {
            return reading_m;
        }
        let served: i64 = climb.iter().sum();
        reading_m.max(served * MILLI / climb.len() as i64)
    }

    /// The closed windows of the span that can have drawn on a bank before
    /// anything was measured: those startup climbed in, and the one before
    /// them. Before them the fleet's demand fit, and a refusal after a
    /// steady stretch is a capacity that fell.
    fn climb_windows(&self) -> &[i64] {
        let climbed = usize::try_from(self.climbed).unwrap_or(usize::MAX);
        &self.span[self.span.len().saturating_sub(climbed.saturating_add(1))..]
    }

    /// The refusals that began a measurement were not the limiter kept
    /// empty (a herd woken in one instant by a whole-second hint, a
    /// straggler, a fleet that was holding its attempts): nothing was
    /// measured, and the phase it interrupted goes on at the rate that
    /// drew them.
    fn unpressed(&mut self, drew_m: i64) {
        self.phase = self.resumed(drew_m);
    }

    /// The phase the fleet goes on in after an interruption that taught
    /// nothing (an outage, a measurement that did not press): cruise at
    /// ρ̂, or with nothing measured, startup from `startup_m` with no climb
    /// under way.
    fn resumed(&self, startup_m: i64) -> Phase {
        match self.rate_m {
            Some(_) => Phase::Cruise { windows: 0 },
            None => Phase::Startup {
                target_m: startup_m.max(self.floor_m),
                step_m: 0,
                from_ms: 0,
            },
        }
    }

    /// ρ is `rate_m`, measured: what was served over it while a guess
    /// stood was the bank, unless the capacity fell since.
    fn judged(&mut self, rate_m: i64) {
        if let Some(unexplained) = self.unexplained_m.take()
            && unexplained
                .before_m
                .is_none_or(|before| rate_m >= CRUISE_GAIN.of(before))
        {
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
            let startup_m = match self.phase {
                // A window that refused everything and served nothing is
                // what a limiter repaying its debt looks like too: it
                // recovers once it serves without refusing, not when a
                // hint passes.
                Phase::Recover { .. } => return,
                Phase::Closed { startup_m } => startup_m,
                _ => self.target_m(end.at_ms),
            };
            self.phase = Phase::Closed { startup_m };
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
            self.on_clean_window(served, end);
        }
    }

    /// The outage is over (its closing hint has passed): the fleet resumes
    /// at once rather than at the window's end, since a backlog held
    /// through it loses every deadline that falls meanwhile.
    pub fn reopen(&mut self) {
        if let Phase::Closed { startup_m } = self.phase {
            self.phase = self.resumed(startup_m);
        }
    }

    fn on_empty_window(&mut self) {
        if self.rate_m.is_none() {
            // The first contact: its last window served ρ and whatever
            // bank the limiter had, which the measurement under way tells
            // apart.
            self.unexplained_m = Some(Unexplained {
                windows: self.climb_windows().to_vec(),
                before_m: None,
            });
        }
        let span = std::mem::take(&mut self.span);
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
            (Phase::Closed { startup_m }, _) => self.resumed(startup_m),
            (Phase::Drain { fresh: true, probe }, Some(_)) => Phase::Drain {
                fresh: false,
                probe,
            },
            (Phase::Drain { fresh: false, .. }, Some(rate)) if self.memory_ms() > MAX_PRESS_MS => {
                // Refused all through a window at the cruise rate with no
                // measurement (a memory too long to press): the capacity is
                // under that. Multiplicative decrease until a window comes
                // back clean.
                self.rate_m = Some(CRUISE_GAIN.of(rate).max(1));
                Phase::Drain {
                    fresh: false,
                    probe: false,
                }
            }
            (Phase::Drain { fresh: false, .. }, Some(_)) => {
                // A limiter that can be pressed, refused a window after the
                // measurement: the measurement's stragglers, or a capacity
                // that fell again. Cruise, where a refusal is measured.
                Phase::Cruise { windows: 0 }
            }
            (Phase::Probe | Phase::Cruise { .. } | Phase::Startup { .. }, Some(_)) => {
                Phase::Drain {
                    fresh: false,
                    probe: false,
                }
            }
            (phase, _) => phase,
        };
    }

    fn on_clean_window(&mut self, served: i64, end: &WindowEnd) {
        let demand = end.demand;
        let Some(rate) = self.rate_m else {
            self.phase = match self.phase {
                Phase::Startup {
                    target_m, step_m, ..
                } => {
                    // The upstream served this much without refusing: the
                    // target starts from it, and climbs past it only where
                    // work waited. A climb's top is not proven by the
                    // window that reached it (it was reached at the
                    // window's end, a report round trip before any refusal
                    // it drew can be counted): the next climb starts from
                    // what was served, or from where this one started.
                    let base = (target_m - step_m).max(served * MILLI);
                    self.climbed = if demand { self.climbed + 1 } else { 0 };
                    if demand {
                        let step = STARTUP_GAIN.of(step_m).max(FIRST_STEP.of(base)).max(MILLI);
                        Phase::Startup {
                            target_m: base.saturating_add(step),
                            step_m: step,
                            from_ms: end.at_ms,
                        }
                    } else {
                        Phase::Startup {
                            target_m: (served * MILLI).max(self.floor_m),
                            step_m: 0,
                            from_ms: 0,
                        }
                    }
                }
                Phase::Closed { startup_m } => self.resumed(startup_m),
                phase => phase,
            };
            return;
        };
        if self.cliff == Cliff::Suspected && matches!(self.phase, Phase::Drain { .. }) {
            self.cliff = Cliff::Seen;
        }
        self.phase = match self.phase {
            Phase::Drain { probe: true, .. } => Phase::Probe,
            Phase::Startup { .. }
            | Phase::Closed { .. }
            | Phase::Drain { .. }
            | Phase::Recover { .. } => Phase::Cruise { windows: 0 },
            Phase::Probe => {
                // Clean: proof of more only once what was served over ρ̂
                // since the limiter was last empty is more than its bank,
                // and more than one window of probing offers: σ̂ is the
                // largest bank *seen*, and a limiter may hold more, so a
                // single window's excess proves nothing (a false proof
                // would probe on from it, over the edge by the gain twice).
                // Counts are whole attempts: a window's excess is one
                // probe's to within one attempt.
                let excess = excess_m(&self.span, rate);
                if excess > self.burst_m().max(PROBE_GAIN.of(rate) - rate + MILLI) {
                    // More than the bank seen so far explains: the upstream
                    // grew, or its bank is larger than seen. The next
                    // measurement tells which.
                    self.unexplained_m = Some(Unexplained {
                        windows: self.span.clone(),
                        before_m: Some(rate),
                    });
                    self.rate_m = Some(PROBE_GAIN.of(rate));
                    self.span.clear();
                    self.span_anchored = false;
                }
                if demand {
                    Phase::Probe
                } else {
                    Phase::Drain {
                        fresh: false,
                        probe: false,
                    }
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

/// Whether a measurement that served `served` and refused `refused` kept
/// the limiter empty: refusals came at least at a quarter of a probe's
/// excess over what was served (a probe that found the edge draws that
/// much less what the bank and the report round trip absorb; a herd woken
/// in one instant, or a straggler, draws a handful).
fn pressed(served: i64, refused: i64) -> bool {
    let excess = PROBE_GAIN.num - PROBE_GAIN.den;
    refused.saturating_mul(4 * PROBE_GAIN.den) >= served.saturating_mul(excess)
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

/// The model as bytes, for the Redis store's copy of a route's pacing
/// ([`PacingState::encode`](super::PacingState::encode) holds it): its
/// estimates, then its span, then its phase, in one fixed order.
impl LimiterModel {
    pub(super) fn write(&self, w: &mut Writer) {
        w.opt_int(self.rate_m)
            .int(self.burst_m)
            .int(self.burst_ms)
            .int(self.hint_memory_ms)
            .int(self.credit.from_ms)
            .int(self.credit.until_ms)
            .int(self.credit.served)
            .int(self.credit.gap_ms);
        w.flag(self.unexplained_m.is_some());
        if let Some(unexplained) = &self.unexplained_m {
            write_windows(w, &unexplained.windows);
            w.opt_int(unexplained.before_m);
        }
        write_windows(w, &self.span);
        w.flag(self.span_anchored)
            .int(i64::from(self.climbed))
            .int(self.w_served)
            .int(self.w_refused)
            .int(self.floor_m);
        match self.phase {
            Phase::Startup {
                target_m,
                step_m,
                from_ms,
            } => w.int(0).int(target_m).int(step_m).int(from_ms),
            Phase::Cruise { windows } => w.int(1).int(i64::from(windows)),
            Phase::Probe => w.int(2),
            Phase::Measure {
                drew_m,
                since_ms,
                until_ms,
                served,
                refused,
                probe,
            } => w
                .int(3)
                .int(drew_m)
                .int(since_ms)
                .int(until_ms)
                .int(served)
                .int(refused)
                .flag(probe),
            Phase::Drain { fresh, probe } => w.int(4).flag(fresh).flag(probe),
            Phase::Closed { startup_m } => w.int(5).int(startup_m),
            Phase::Recover { since_ms } => w.int(6).int(since_ms),
        };
        w.int(self.cliff as i64);
    }

    pub(super) fn read(r: &mut Reader<'_>, what: &'static str) -> Result<Self, DecodeError> {
        let rate_m = r.opt_int()?;
        let (burst_m, burst_ms, hint_memory_ms) = (r.int()?, r.int()?, r.int()?);
        let credit = CreditReturns {
            from_ms: r.int()?,
            until_ms: r.int()?,
            served: r.int()?,
            gap_ms: r.int()?,
        };
        let unexplained_m = if r.flag()? {
            Some(Unexplained {
                windows: read_windows(r, what)?,
                before_m: r.opt_int()?,
            })
        } else {
            None
        };
        let span = read_windows(r, what)?;
        let span_anchored = r.flag()?;
        let climbed = r.small()?;
        let (w_served, w_refused, floor_m) = (r.int()?, r.int()?, r.int()?);
        let phase = match r.int()? {
            0 => Phase::Startup {
                target_m: r.int()?,
                step_m: r.int()?,
                from_ms: r.int()?,
            },
            1 => Phase::Cruise {
                windows: r.small()?,
            },
            2 => Phase::Probe,
            3 => Phase::Measure {
                drew_m: r.int()?,
                since_ms: r.int()?,
                until_ms: r.int()?,
                served: r.int()?,
                refused: r.int()?,
                probe: r.flag()?,
            },
            4 => Phase::Drain {
                fresh: r.flag()?,
                probe: r.flag()?,
            },
            5 => Phase::Closed {
                startup_m: r.int()?,
            },
            6 => Phase::Recover { since_ms: r.int()? },
            _ => return Err(DecodeError::Malformed { what }),
        };
        let cliff = match r.int()? {
            0 => Cliff::Unseen,
            1 => Cliff::Suspected,
            2 => Cliff::Seen,
            _ => return Err(DecodeError::Malformed { what }),
        };
        Ok(Self {
            rate_m,
            burst_m,
            burst_ms,
            hint_memory_ms,
            credit,
            unexplained_m,
            span,
            span_anchored,
            climbed,
            w_served,
            w_refused,
            phase,
            cliff,
            floor_m,
        })
    }
}

/// Served per window, its count first.
fn write_windows(w: &mut Writer, windows: &[i64]) {
    w.int(windows.len() as i64);
    for &served in windows {
        w.int(served);
    }
}

/// At most [`MAX_SPAN`] windows: a longer list is no model's.
fn read_windows(r: &mut Reader<'_>, what: &'static str) -> Result<Vec<i64>, DecodeError> {
    let len: usize = r.small()?;
    if len > MAX_SPAN {
        return Err(DecodeError::Malformed { what });
    }
    (0..len).map(|_| r.int()).collect()
}
