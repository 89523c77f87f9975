//! [`LocalPacer`]: the pace of the wake-ups a worker decides alone.
//!
//! # Why
//! With the coordinator reachable, the intents that waited out a cooldown
//! wake at the route's learned wake rate, one slot each. Cut off from it, a
//! worker would wake every intent it held at the cooldown's end, spread only
//! by a local jitter: a fleet that lost its coordinator during an outage
//! sends the whole backlog it held in the first second the upstream is back.
//!
//! So the worker paces those wake-ups itself, the way the coordinator paces
//! the fleet after a cooldown (`docs/pacing.md`, slow start), at the scale of
//! its own traffic: the first step is an eighth of what the upstream served
//! this worker in its last window without a rejection, the rate climbs in a
//! straight line across each window, each window whose rate was used doubles
//! the step, and the first rejection goes back at once to the rate the last
//! window without a rejection let wake-ups go at (half, if none), once per
//! window; after a cut the rate climbs a sixteenth a window. That is the
//! rate measured, not the rate the window had climbed to by its end: the
//! upstream's answers to a window's last wake-ups come back in the next one,
//! so the end of a clean window may already be past the upstream's room.
//! Every worker of a fleet doing this adds up to the coordinator's own slow
//! start: an eighth of what the upstream served the fleet, then doubling. A
//! window whose demand the rate met stops the pacing.
//!
//! The pacer only holds wake-ups back while the upstream is pressed: a
//! rejection in the current window, or in the last window that got any
//! answer (a worker that held everything through an outage got none since).
//! Otherwise it lets everything go, as before it existed.
//!
//! Retries and first attempts a cooldown held are paced here; a first
//! attempt sent straight is not (as with the coordinator unless it says the
//! route is saturated). The local budget and the adaptive throttle still
//! bound the retries this lets go.
//!
//! Time is an argument (elapsed since any fixed epoch) and random draws come
//! from the caller, so tests are exact.

use std::time::Duration;

/// The length of a window: one second, as the coordinator's.
const WINDOW: Duration = Duration::from_secs(1);

/// The first step of slow start is what the upstream served this worker in
/// a clean window divided by this (the coordinator's slow start: an eighth).
const FIRST_STEP_DIVISOR: f64 = 8.0;

/// After a cut the rate climbs by itself divided by this a window.
const STEP_AFTER_CUT_DIVISOR: f64 = 16.0;

/// The least step, wake-ups per second: a pacer that knew nothing of the
/// upstream (no clean window yet, a zero floor) must still climb.
const MIN_STEP: f64 = 1.0;

/// Credit banked while nobody asks is capped at this much of the rate (and
/// at least one wake-up): a pacer idle for a while must not release a burst.
const CREDIT_SPAN: Duration = Duration::from_millis(250);

/// An intent told "not yet" asks again within this (the coordinator's
/// default reconsider horizon), at a uniform draw, so the intents waiting on
/// one pacer do not all ask at one instant.
pub const ASK_AGAIN_WITHIN: Duration = Duration::from_millis(250);

/// Paces one scope's wake-ups while its worker decides alone.
#[derive(Debug, Clone)]
pub struct LocalPacer {
    /// The least rate, wake-ups per second (the local budget's floor: it lets
    /// that many retries through whatever the traffic). May be zero.
    floor: f64,
    /// The window the counts below are for, since elapsed zero.
    window: u64,
    counts: Counts,
    /// Successes in the last window that got any and no rejection.
    clean_served: u64,
    /// Whether the last window that got an answer had a rejection in it.
    pressed: bool,
    paced: Option<Paced>,
}

#[derive(Debug, Clone, Copy, Default)]
struct Counts {
    served: u64,
    rejected: u64,
    /// Wake-ups let go while paced.
    let_go: u64,
    /// Wake-ups told "not yet".
    held_back: u64,
}

#[derive(Debug, Clone, Copy)]
struct Paced {
    /// The rate at the window's start and what it climbs across the window.
    base: f64,
    climb: f64,
    /// The step the next climb starts from.
    step: f64,
    /// The rate the last window without a rejection let wake-ups go at
    /// (over the part of it that was paced); 0 for none yet.
    clean: f64,
    /// When the pacing began.
    since: Duration,
    /// A rejection has cut the rate: slow start is over.
    cut: bool,
    /// This window already cut.
    cut_this_window: bool,
    /// Wake-ups banked, and the instant they were banked to.
    credit: f64,
    credited_at: Duration,
}

/// What the pacer says about a wake-up.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Pace {
    /// Go now.
    Go,
    /// Not yet: decide again after this long.
    Later(Duration),
}

impl LocalPacer {
    /// A pacer that never goes below `floor_per_sec` while it paces.
    ///
    /// # Panics
    /// If `floor_per_sec` is negative or not finite: a programmer error in a
    /// constant, not a peer's input.
    pub fn new(floor_per_sec: f64) -> Self {
        assert!(
            floor_per_sec.is_finite() && floor_per_sec >= 0.0,
            "LocalPacer floor must be >= 0"
        );
        LocalPacer {
            floor: floor_per_sec,
            window: 0,
            counts: Counts::default(),
            clean_served: 0,
            pressed: false,
            paced: None,
        }
    }

    /// Records an answer from the upstream: `accepted` is false for a
    /// capacity rejection (a 429 or its like). A rejection while paced cuts
    /// the rate at once, once per window.
    pub fn answered(&mut self, now: Duration, accepted: bool) {
        self.roll(now);
        if accepted {
            self.counts.served += 1;
            return;
        }
        self.counts.rejected += 1;
        let floor = self.floor;
        if let Some(paced) = &mut self.paced
            && !paced.cut_this_window
        {
            paced.accrue(now, self.window);
            let back = if paced.clean > 0.0 {
                paced.clean.min(paced.rate_at(now, self.window))
            } else {
                paced.rate_at(now, self.window) / 2.0
            };
            paced.base = back.max(floor);
            paced.climb = 0.0;
            paced.cut = true;
            paced.cut_this_window = true;
        }
    }

    /// Whether a wake-up decided alone goes now; `draw` is uniform in
    /// `[0, 1)` and spreads a "not yet".
    pub fn wake(&mut self, now: Duration, draw: f64) -> Pace {
        self.roll(now);
        if self.paced.is_none() {
            if !self.pressed && self.counts.rejected == 0 {
                return Pace::Go;
            }
            self.paced = Some(Paced::start(self.floor, self.clean_served, now));
        }
        let window = self.window;
        let paced = self.paced.as_mut().expect("paced was just ensured");
        paced.accrue(now, window);
        if paced.credit >= 1.0 {
            paced.credit -= 1.0;
            self.counts.let_go += 1;
            return Pace::Go;
        }
        self.counts.held_back += 1;
        let later = ASK_AGAIN_WITHIN.mul_f64(draw.clamp(0.0, 1.0));
        Pace::Later(later.max(Duration::from_millis(1)))
    }

    /// The rate in force, wake-ups per second; `None` while not pacing.
    pub fn rate(&mut self, now: Duration) -> Option<f64> {
        self.roll(now);
        let window = self.window;
        self.paced.as_ref().map(|p| p.rate_at(now, window))
    }

    /// Closes every window before the one `now` is in.
    fn roll(&mut self, now: Duration) {
        let index = window_index(now);
        if index <= self.window {
            return;
        }
        let counts = std::mem::take(&mut self.counts);
        if counts.served + counts.rejected > 0 {
            self.pressed = counts.rejected > 0;
            if counts.rejected == 0 {
                self.clean_served = counts.served;
            }
        }
        if let Some(paced) = &mut self.paced {
            let end = window_start(self.window + 1);
            paced.accrue(end, self.window);
            let reached = paced.base + paced.climb;
            let used = counts.held_back > 0 || (counts.let_go as f64) * 2.0 >= reached;
            if paced.cut_this_window {
                // Cut at the rejection already; from here a sixteenth a
                // window. (Rejections before the pacing began in this window
                // are what started it, not a verdict on its rate.)
                paced.step = (paced.base / STEP_AFTER_CUT_DIVISOR).max(MIN_STEP);
            } else if used {
                let paced_for = end.saturating_sub(paced.since.max(window_start(self.window)));
                if !paced_for.is_zero() {
                    paced.clean = counts.let_go as f64 / paced_for.as_secs_f64();
                }
                paced.base = reached;
                if !paced.cut {
                    paced.step *= 2.0;
                } else {
                    paced.step = (reached / STEP_AFTER_CUT_DIVISOR).max(MIN_STEP);
                }
            } else {
                // The rate met the demand: nothing left to pace.
                self.paced = None;
            }
        }
        if let Some(paced) = &mut self.paced {
            if index > self.window + 1 {
                // A window with no answer and no wake-up: nobody waits.
                self.paced = None;
            } else {
                paced.climb = paced.step;
                paced.cut_this_window = false;
            }
        }
        self.window = index;
    }
}

impl Paced {
    fn start(floor: f64, clean_served: u64, now: Duration) -> Self {
        let step = (clean_served as f64 / FIRST_STEP_DIVISOR).max(MIN_STEP);
        Paced {
            base: floor,
            climb: step,
            step,
            clean: 0.0,
            since: now,
            cut: false,
            cut_this_window: false,
            // One wake-up may go at once: the floor's own.
            credit: 1.0,
            credited_at: now,
        }
    }

    /// The rate at `at` inside window `window`: from `base` at its start to
    /// `base + climb` at its end, in a straight line.
    fn rate_at(&self, at: Duration, window: u64) -> f64 {
        let into = at.saturating_sub(window_start(window));
        let fraction = (into.as_secs_f64() / WINDOW.as_secs_f64()).min(1.0);
        self.base + self.climb * fraction
    }

    /// Banks the wake-ups the rate earned from `credited_at` to `now`.
    fn accrue(&mut self, now: Duration, window: u64) {
        let elapsed = now.saturating_sub(self.credited_at);
        if elapsed.is_zero() {
            return;
        }
        let rate = self.rate_at(now, window);
        let cap = (rate * CREDIT_SPAN.as_secs_f64()).max(1.0);
        self.credit = (self.credit + rate * elapsed.as_secs_f64()).min(cap);
        self.credited_at = now;
    }
}

fn window_index(at: Duration) -> u64 {
    (at.as_nanos() / WINDOW.as_nanos()) as u64
}

fn window_start(index: u64) -> Duration {
    WINDOW * u32::try_from(index).unwrap_or(u32::MAX)
}

#[cfg(test)]
mod tests;
