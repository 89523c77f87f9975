//! The slot decision at wake time.
//!
//! Slots are handed out when an intent asks, at the rate learned *then*.
//! A slot further ahead than the policy's horizon is not given: the intent
//! is told to ask again. Slots fixed far ahead at the low rate in force
//! during an outage would lie past most deadlines, and a later rise of the
//! rate could not pull them back; an intent that asks again gets the new
//! rate. How soon it asks again grows with its estimated wait (seven
//! eighths of the way there each time), so a long wait costs a few
//! coordinator calls, not one per horizon.

use super::cursor::{JITTER_SCALE, MAX_PENDING_PER_ROUTE};
use super::model::{CRUISE_GAIN, Fraction, Phase};
use super::stated::InForce;
use super::{MILLI, Mode, PacingPolicy, PacingState, Rule, WINDOW_MS};

/// More waiting intents than a route can hold say nothing more about the
/// wait; the bound also keeps the estimate's arithmetic far from overflow.
const MAX_WAITING: i64 = MAX_PENDING_PER_ROUTE as i64;

/// A queue ahead longer than this (about 30 years) puts a slot past any
/// horizon; the bound keeps the product far from overflow.
const MAX_QUEUED_US: i64 = 1_000_000_000_000_000;

/// How far into its interval a slot may fall: the part of the interval
/// that cruise leaves unused ([`CRUISE_GAIN`]), so two slots are never
/// closer than the cruise gain of an interval. At cruise that is one
/// interval at ρ̂: a limiter that admits no burst at all (nginx's
/// `limit_req` without `burst`, requests at least 1/ρ apart) refuses
/// nothing the slots send while ρ̂ ≤ ρ. Jittered over the whole interval,
/// two slots came as close as the clock's grain at any rate, such a
/// limiter refused a few a second however slowly the fleet went, and
/// every refusal read as the limiter empty: the fleet was held at a fifth
/// of its rate.
fn slot_jitter_us(interval_us: i64) -> i64 {
    interval_us - CRUISE_GAIN.of(interval_us)
}

/// One waiting intent asking when to go.
#[derive(Debug, Clone, Copy)]
pub struct WakeAsk {
    /// The coordinator's clock.
    pub now_ms: i64,
    /// `max(cooldown, backoff, the worker's not_before)`.
    pub floor_ms: i64,
    /// The floor a first attempt held for a slot waits for now (the
    /// cooldown as far as it closes the route). A later `floor_ms`, a
    /// cooldown held first attempts need not wait out, leaves the intervals
    /// before it to them.
    pub held_floor_ms: i64,
    /// The intent's end-to-end deadline.
    pub deadline_ms: i64,
    /// Time the attempt needs after its slot.
    pub reserve_ms: i64,
    /// `0..JITTER_SCALE`, drawn by the caller from an injected RNG.
    pub jitter_ppm: u32,
    /// Intents on this route told to ask again and still waiting whose
    /// deadline comes before this one's: the queue ahead of it, in
    /// deadline order.
    pub waiting: i64,
    /// The route's slot cursor (start of the next free interval, Unix µs).
    pub cursor_us: i64,
    /// Who asks: a retry, or a first attempt held for a slot.
    pub asker: Asker,
}

/// Who asks for a slot.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Asker {
    /// A retry: it waits out every cooldown.
    Retry,
    /// A first attempt held for a slot (saturated pacing, or a cooldown
    /// that closes the route).
    FirstAttempt {
        /// Its first ask: its intent arrived just now. While first
        /// attempts are held, what the fleet sends is a backlog the slots
        /// release, not the rate intents arrive at; these asks are.
        arriving: bool,
    },
}

impl Asker {
    /// A first attempt, held or arriving.
    pub fn is_first_attempt(self) -> bool {
        matches!(self, Asker::FirstAttempt { .. })
    }
}

/// The answer to a [`WakeAsk`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SlotDecision {
    /// Reconsider at `at_ms`; the route's cursor moves to `cursor_us`.
    Slot {
        /// The slot.
        at_ms: i64,
        /// The cursor after this slot.
        cursor_us: i64,
    },
    /// Nothing given yet: ask again at `at_ms` (the cursor is untouched).
    AskAgain {
        /// When to ask again.
        at_ms: i64,
    },
    /// No slot can fit the deadline plus the reserve; nothing was taken.
    Infeasible {
        /// The earliest slot there could have been.
        at_ms: i64,
    },
}

/// Windows an estimate of the wait looks ahead at most.
const MAX_DRAIN_WINDOWS: i64 = 64;

/// How long `waiting` intents take to be woken if the rate doubles every
/// window up to the ceiling, the fastest probing raises it; at the rate in
/// force when it is `capacity` (the target of a saturated route: the
/// upstream's capacity, which grows only by small steps). The
/// estimate is optimistic on purpose: an intent asked back too early is
/// only asked again, one asked back too late cannot use a rate that rose
/// meanwhile.
fn drain_ms(waiting: i64, rate_m: i64, ceiling_m: i64, capacity: bool) -> i64 {
    let mut left = waiting.clamp(0, MAX_WAITING) * MILLI;
    let mut rate = rate_m.max(1);
    let mut windows = 0;
    while left > 0 && windows < MAX_DRAIN_WINDOWS {
        left -= rate;
        if !capacity {
            rate = (2 * rate).min(ceiling_m.max(rate));
        }
        windows += 1;
    }
    windows * WINDOW_MS
}

/// Whether a slot at the asker's floor would take the intervals before it
/// from askers whose floor is `held_floor_ms`: booked there, it moves the
/// route's one cursor past them. Saturated, a retry waiting out a cooldown
/// that held first attempts need not, booked at its end, took every
/// interval before it from the first attempts asking meanwhile: the
/// upstream went idle for up to a horizon before each such cooldown ended
/// (the storm's reference run served 0.77-0.79 of its capacity in those
/// seconds). Asked back at its floor instead, it takes a slot then.
fn floor_skips(floor_ms: i64, held_floor_ms: i64, cursor_us: i64) -> bool {
    floor_ms > held_floor_ms && floor_ms.saturating_mul(1000) > cursor_us
}

/// Whether little is booked ahead of `ask`: the cursor lies within half
/// the horizon of now.
fn cursor_idle(ask: &WakeAsk, horizon_ms: i64) -> bool {
    ask.cursor_us
        <= ask
            .now_ms
            .saturating_add(horizon_ms.max(1) / 2)
            .saturating_mul(1000)
}

/// What a saturated route's window must have given out by now, as a share
/// of its rate prorated over the window so far, before its slots count as
/// taken: below it, with little booked ahead, slots go unused while intents
/// wait asked back for later instants, and the route calls some back
/// ([`PacingState::call_back`]). The eighth spared is the slots' own
/// jitter and the lag of the asks a window's first slots answer.
const CALL_BACK_BELOW: Fraction = Fraction { num: 7, den: 8 };

impl PacingState {
    /// Decides a Reconsider: a slot within the horizon, ask again, or a
    /// refusal. Brings the state to `ask.now_ms` first.
    pub fn decide(&mut self, ask: &WakeAsk, policy: &PacingPolicy) -> SlotDecision {
        self.advance(ask.now_ms, policy);
        if ask.asker == (Asker::FirstAttempt { arriving: true }) {
            self.w_arrived += 1;
        }
        let now = ask.now_ms;
        let floor = ask.floor_ms.max(now);
        let jitter = i64::from(ask.jitter_ppm.min(JITTER_SCALE - 1));
        let spread = |span: i64| span * jitter / i64::from(JITTER_SCALE);
        if let Rule::Penalty {
            until_ms,
            probe_at_ms,
        } = self.rule
        {
            return self.decide_penalty(ask, floor, spread(WINDOW_MS), until_ms, probe_at_ms);
        }
        let rate_m = self.rate_m;
        let interval_us = (1_000 * MILLI * MILLI + rate_m - 1) / rate_m.max(1);
        let booked_us = ask.cursor_us.max(floor.saturating_mul(1000));
        let hot_us = self.after_hot_first_attempts_us(now, interval_us);
        let start_us = booked_us.max(hot_us);
        let slot = start_us
            .saturating_add(spread(slot_jitter_us(interval_us)))
            .div_euclid(1000);
        let horizon = policy.horizon_ms.max(1);
        // Earlier deadlines go first: the slots of the intents ahead of this
        // one come before its own, and it takes the next slot only if they
        // still leave it within the horizon. Unless little is booked ahead
        // (the cursor is within half the horizon of now): whoever asks then
        // takes the next slot, so the rate is never left idle for intents
        // that are not asking at that moment. Booking only from now on
        // would waste the gap between each slot and the next ask. The
        // order still holds where it matters: an intent far back in the
        // queue is told to ask again when its turn is estimated to come, so
        // the intents asking at any moment are mostly the urgent ones.
        let queued_us = if cursor_idle(ask, horizon) {
            0
        } else {
            (ask.waiting.clamp(0, MAX_WAITING) * interval_us).min(MAX_QUEUED_US)
        };
        // The interval's start decides: its jitter is the slot's own, not
        // a reason to make the intent ask again.
        if start_us.saturating_add(queued_us).div_euclid(1000) <= now + horizon {
            if slot.saturating_add(ask.reserve_ms) > ask.deadline_ms {
                return SlotDecision::Infeasible { at_ms: slot };
            }
            if self.mode() == Mode::Saturated
                && floor_skips(floor, ask.held_floor_ms.max(now), ask.cursor_us)
            {
                // Never past the last instant its slot still fits.
                let last = ask.deadline_ms.saturating_sub(ask.reserve_ms);
                return SlotDecision::AskAgain {
                    at_ms: (floor + spread(horizon / 2)).min(last),
                };
            }
            self.w_granted += 1;
            self.w_held += i64::from(ask.asker.is_first_attempt());
            return SlotDecision::Slot {
                at_ms: slot,
                cursor_us: start_us + interval_us,
            };
        }
        // Not even the floor fits: no rate could help.
        if floor.saturating_add(ask.reserve_ms) > ask.deadline_ms {
            return SlotDecision::Infeasible { at_ms: floor };
        }
        // The last instant to ask again while a slot can still fit, less
        // a draw over half the horizon. Without the draw, an intent sent to
        // its last chance comes back a fixed time after it arrived, and a
        // worker whose intents arrive at a fixed rate brings every one of
        // them back at the same phase of that rate: the phases of a fleet's
        // workers then decide who finds the slots free. Four worker
        // processes at a fixed rate, twice what the upstream served, were
        // served 0.97, 0.44, 0.53 and 0.45 of their intents; with arrivals
        // at random instants, 0.60-0.63 each.
        let last_chance = ask
            .deadline_ms
            .saturating_sub(ask.reserve_ms.saturating_add(horizon))
            .saturating_sub(spread(horizon / 2))
            // Past it, the intent polls for a slot that frees within the
            // horizon: every eighth of it at most, not at every ask's floor.
            .max(now + 1 + spread(horizon / 8));
        // Only first attempts running hot put it past the horizon: demand
        // the window had (it used its rate); it asks again when the
        // window's share frees.
        if booked_us.saturating_add(queued_us).div_euclid(1000) <= now + horizon {
            self.w_short += 1;
            let freed = hot_us.div_euclid(1000) - horizon / 2 + spread(horizon / 2);
            return SlotDecision::AskAgain {
                at_ms: freed.max(now + 1).min(last_chance),
            };
        }
        // The rate, not a cooldown, put the slot past the horizon.
        let short = floor <= now + horizon;
        if short {
            self.w_short += 1;
            // Its turn in deadline order, at the rate in force.
            let turn_us = start_us.saturating_add(
                (ask.waiting.clamp(0, MAX_WAITING) * interval_us).min(MAX_QUEUED_US),
            );
            if turn_us.div_euclid(1000).saturating_add(ask.reserve_ms) > ask.deadline_ms {
                self.w_late += 1;
            }
        }
        // A saturated route's rate is the upstream's capacity, learned or
        // stated, unless a statement brought it to the floor: a quota of
        // zero, or nothing left until a reset, says what the upstream has
        // now, not what returns after it, so the wait is estimated as if
        // the rate rose as fast as it can. Estimated at the floor, an
        // intent asking in an outage the upstream states would be told to
        // come back at its last chance, behind every intent that asked
        // after it. (A learned rate at the floor is the model's estimate
        // of what the upstream serves, and is taken as one.)
        let told_nothing =
            self.stated.in_force() == InForce::Corroborated && rate_m <= policy.floor_m;
        let saturated = self.mode() == Mode::Saturated;
        // Recovering, the model holds the floor only until the limiter has
        // repaid what the refusals cost it, then drains at ρ̂: the wait is
        // estimated at ρ̂. At the floor, every intent asking in those
        // seconds would be told to come back at its last chance, and the
        // backlog would reach the upstream in deadline order only after
        // the first attempts that arrived behind it.
        let (wait_rate_m, capacity) = match (self.model.phase(), self.model.rate_m()) {
            (Phase::Recover { .. }, Some(rho_m)) if saturated => (rho_m.max(rate_m), true),
            _ => (rate_m, saturated && !told_nothing),
        };
        let estimate = slot.saturating_add(drain_ms(
            ask.waiting,
            wait_rate_m,
            policy.ceiling_m,
            capacity,
        ));
        // Seven eighths of the way to the estimate: it is optimistic (the
        // rate doubling every window), so this rarely overshoots the slot
        // even with the spread below (at most an eighth past it), and a long
        // wait costs a few calls (the distance shrinks eightfold each time).
        // Three quarters cost a tenth more Reconsider calls for no intent
        // saved (docs/storm/README.md's reference command: its RPCs per
        // worker per second).
        let gap = estimate.saturating_sub(now + horizon);
        let toward = now + (gap.saturating_mul(7) / 8).max(horizon / 2);
        // Intents the rate turned away together are spread over a quarter
        // of their wait, or they ask again together, and the slots between
        // their asks go unused. Waiting out a cooldown, the horizon's half
        // is spread enough: the rate decides after it ends.
        let span = if short {
            (gap / 4).max(horizon / 2)
        } else {
            horizon / 2
        };
        let again = toward.max(floor - horizon) + spread(span);
        // Ask again while a slot can still fit.
        SlotDecision::AskAgain {
            at_ms: again.min(last_chance),
        }
    }

    /// How many intents told to ask again to call back now, after `ask`
    /// was given a slot on a route whose own floor is `route_floor_ms`; 0
    /// for none. Saturated, every attempt waits for a slot in deadline
    /// order, and an intent asked back waits for the instant its turn was
    /// estimated at. When arrivals stop or the rate rises, the turns come
    /// sooner than estimated: the cursor idles (little booked ahead) and
    /// the window gives out less than its rate, while the intents that
    /// could take those slots wait for later instants. Calling back the
    /// intents that half a horizon's slots would serve (those with the
    /// earliest deadlines) fills the gap; more would only ask to be told to
    /// ask again. Not under a cooldown or a penalty, where slots are held on
    /// purpose, nor on a route that is not saturated, where first attempts
    /// take what retries leave. Only at a stated pace: a learned rate is an
    /// estimate, and the slots a call-back fills are its overshoot when it
    /// is high (docs/pacing.md, "Known limits", the startup item).
    pub fn call_back(&self, ask: &WakeAsk, route_floor_ms: i64, policy: &PacingPolicy) -> u32 {
        let stated = self.stated.in_force() == InForce::Corroborated;
        if self.mode() != Mode::Saturated
            || !stated
            || route_floor_ms > ask.now_ms
            || !cursor_idle(ask, policy.horizon_ms)
        {
            return 0;
        }
        let into = self.window_elapsed_ms(ask.now_ms);
        let due_m = CALL_BACK_BELOW.of(self.rate_m.saturating_mul(into) / WINDOW_MS);
        if self.w_granted.saturating_mul(MILLI) >= due_m {
            return 0;
        }
        let half = policy.horizon_ms.max(1) / 2;
        let count = self.rate_m.saturating_mul(half) / (MILLI * 1000);
        u32::try_from(count.clamp(1, MAX_WAITING)).unwrap_or(u32::MAX)
    }

    /// How far into the current window `now_ms` is, within the window.
    fn window_elapsed_ms(&self, now_ms: i64) -> i64 {
        (now_ms - self.win * WINDOW_MS).clamp(0, WINDOW_MS)
    }

    /// While first attempts run faster than their average, where the
    /// window's next retry may start (Unix µs; 0 when they do not): after
    /// the slots granted in it and one interval for each first attempt
    /// beyond the average's share of the window so far. The wake rate is
    /// the spare the average leaves, so first attempts running hot (an
    /// arrival burst, a small fleet's noise) would otherwise take the
    /// upstream past its capacity by the excess; retries yield it instead,
    /// and the rate is unchanged once first attempts fall back. An eighth
    /// of a window's first attempts is allowed for reports of the window
    /// before that arrive late, and they take the rest of the window at
    /// most. While saturated every attempt is paced already, and a pinned
    /// or known rate is the operator's. With no average yet (a route new to
    /// this coordinator, or one restarted inside an outage that froze every
    /// window since) there is nothing to run ahead of: every first attempt
    /// would look hot and starve retries.
    fn after_hot_first_attempts_us(&self, now_ms: i64, interval_us: i64) -> i64 {
        if !self.splits_target() || self.lam_m <= 0 {
            return 0;
        }
        let start_ms = self.win * WINDOW_MS;
        let into = self.window_elapsed_ms(now_ms);
        let expected_m = self.lam_m * into / WINDOW_MS + self.lam_m / 8;
        let straight_m = self.straight_first() * MILLI;
        let excess = (straight_m - expected_m).max(0) / MILLI;
        if excess == 0 {
            return 0;
        }
        // The rest of this window at most: a burst of counts (a worker's
        // report held while its coordinator was away) is not a rate, and
        // must not push retries windows out. (The count's bound keeps the
        // product from overflowing.)
        let taken = (self.w_granted + excess).clamp(0, MAX_WAITING);
        start_ms
            .saturating_mul(1000)
            .saturating_add((taken * interval_us).min(WINDOW_MS * 1000))
    }

    /// While a penalty holds: nothing until the latest hint passes, then
    /// one probe; another only if the first was lost (no report in two
    /// windows).
    fn decide_penalty(
        &mut self,
        ask: &WakeAsk,
        floor: i64,
        spread: i64,
        until_ms: i64,
        probe_at_ms: i64,
    ) -> SlotDecision {
        let now = ask.now_ms;
        let opens = floor.max(until_ms);
        if opens.saturating_add(ask.reserve_ms) > ask.deadline_ms {
            return SlotDecision::Infeasible { at_ms: opens };
        }
        if now < opens {
            return SlotDecision::AskAgain {
                at_ms: opens + spread,
            };
        }
        if probe_at_ms == 0 || now - probe_at_ms > 2 * WINDOW_MS {
            self.rule = Rule::Penalty {
                until_ms,
                probe_at_ms: now,
            };
            self.w_granted += 1;
            self.w_held += i64::from(ask.asker.is_first_attempt());
            return SlotDecision::Slot {
                at_ms: now,
                cursor_us: ask.cursor_us.max(now.saturating_mul(1000)),
            };
        }
        SlotDecision::AskAgain {
            at_ms: now + WINDOW_MS + spread,
        }
    }
}
