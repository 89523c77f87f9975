//! Learned pacing: how fast a route's waiting intents may be woken. Pure.
//!
//! A fixed wake rate is right for one fleet shape only: too low and the
//! backlog left by a cooldown drains past every deadline, too high and the
//! wake-ups are the next overload. The coordinator sees what no single
//! worker sees — every worker's first attempts, successes and rejections on
//! a route — so it learns the rate instead:
//!
//! - **capacity** is the most the upstream has served in a one-second
//!   window without rejecting anything, and what it served in a window that
//!   did reject (a saturated window measures capacity directly, which is how
//!   a capacity that came back smaller is learned at once);
//! - **first-attempt rate** is a moving average of reported first attempts;
//! - **spare capacity** is the difference, what retries may use (while a
//!   window's first attempts run ahead of their average, the excess takes
//!   retry slots: see [`PacingState::decide`]);
//! - the **wake rate** follows the spare while nobody waits, and is probed
//!   upward only in windows where it was actually used and nothing was
//!   rejected: slow start (a first step of an eighth of the most the
//!   upstream has served, each clean window doubling the step, each step
//!   climbed across its window rather than jumped, see
//!   [`PacingState::rate_at`]) until the first rejection. The first
//!   rejection of a window cuts it at once back to the last rate a window
//!   used cleanly; the window's end sets it just under the spare it
//!   measured (what a window serves includes the limiter's banked burst),
//!   not below that clean rate once and never below half after —
//!   multiplicative back-off that trusts a saturated sample no further than
//!   a halving. From there the rate climbs back to the measured edge, then
//!   a sixteenth at a time; the spare read from a clean window moves it
//!   only once it is twice that edge (the edge was an outage's stragglers,
//!   not the upstream's). A cut to a fallback, with no edge measured, heads
//!   for the midpoint between it and the rate that drew it (bisection).
//!
//! When first attempts alone ask for more than the upstream serves (a window
//! that drew rejections served less than its first attempts, with a margin:
//! a brownout, an upstream that came back smaller), no wake rate can help:
//! the route becomes [`Mode::Saturated`]. Every attempt, first ones
//! included, then waits for a slot (workers are told to hold first
//! attempts), and the rate is the whole fleet's: just under what a saturated
//! window served, then up a sixteenth per clean window while within a
//! quarter of that edge (a thirty-second for its first eighth past it) and
//! by twice the distance from it beyond, within the probe headroom of the
//! rate (slow where the edge was, fast once the upstream has grown back,
//! which nothing else says while every attempt waits for a slot); a
//! rejection goes back below the last clean rate, and those reported in the
//! next window while the cut's own cooldown holds are its stragglers, not
//! answered again. The overflow is judged as soon as the window holds a
//! quarter of a window's first attempts, so the fleet stops sending them
//! straight within the window that found it. A window whose demand the rate
//! met in full lets first attempts go straight again.
//!
//! Rejections that arrive while a hint cooldown is in force, or whose hint
//! closes the route for longer than two windows (an outage, not an
//! overload), are explained by the cooldown: the window is frozen, nothing
//! is learned from it, and when the cooldown ends pacing resumes from what
//! was learned before it (slow start climbing from the moment the hint
//! passes, or, for an outage's hint that passed late in a window, from the
//! next window's start). A short cooldown explains them only in the window
//! after a cut, though: short hints re-armed back to back by the rate's own
//! overshoot would otherwise freeze it, so beyond that window the rate
//! steps down a sixteenth a window, or to the spare when that is lower. A limiter that re-arms its full
//! `Retry-After` on every rejected attempt is detected when successive
//! hints stop counting down ([`Mode::PenaltyExtending`]): nothing is woken
//! until the latest hint passes, then exactly one probe, and only a success
//! reopens the route.
//!
//! Everything is integer math on milli-units (rates in thousandths of an
//! event per second), so a decision is the same on every replica. The
//! state is a handful of integers: the memory store keeps it as it is, the
//! Redis store as the versioned bytes of [`PacingState::encode`], and
//! every decision about it is made here, by whichever store holds it.

mod codec;
pub mod model;
mod slot;
mod window;

pub use slot::{SlotDecision, WakeAsk};

/// One observation window. Rates are judged per window and the controller
/// changes at most once per window, so one burst of 429s is one cut.
pub const WINDOW_MS: i64 = 1000;
/// `Retry-After` is whole seconds, so two hints for the same instant may
/// differ by up to this much; only a larger jump is an extension.
pub const HINT_GRANULARITY_MS: i64 = 1000;
/// Hints that move the end later this many times in a row, each received
/// while the previous one still held, mark a penalty-extending limiter.
pub const EXTENSIONS_TO_DETECT: i64 = 2;
/// A gap without reports longer than this many windows is closed as one
/// empty window: nothing more can be learned from silence.
const MAX_CATCH_UP: i64 = 16;
/// Milli-units per unit.
pub const MILLI: i64 = 1000;
/// Before anything pushed back, the fleet's total may grow to the most the
/// upstream has served plus this fraction of it (1/N) per window. The
/// rate is halved at the first rejection, and slots are handed out at most
/// a horizon (a quarter window) ahead, so an eighth keeps the window that
/// finds the edge within a tenth above what was served.
pub const PROBE_HEADROOM: i64 = 8;
/// A cooldown longer than this says the upstream is out, not that the
/// fleet is over its capacity: nothing is learned under it, and first
/// attempts wait it out.
pub const CLOSING_MS: i64 = 2 * WINDOW_MS;

/// A sixteenth under `rate_m`: where a rate goes after one found the edge,
/// close enough to keep the upstream busy, far enough that a limiter's
/// banked burst is not spent by the next window.
fn just_under(rate_m: i64) -> i64 {
    rate_m - rate_m / 16
}

/// Whether first attempts should wait for a slot, when the policy lets them
/// (`hold`): while the route is [`Mode::Saturated`] (first attempts alone
/// overflow the upstream, so they are paced with everything else), or
/// inside a cooldown ending at `cooldown_until_ms` that distinct workers
/// corroborate (one worker's capped claim must not hold the whole fleet's
/// first attempts) and that closes the route: one that lasts longer than
/// two windows, or the end of one that did (`closed_until_ms`, the end of
/// the latest closing hint; 0 when not known). A short cooldown (a hint of
/// a second, the kind an overload draws) holds retries, which pacing
/// answers for; holding the fleet's first attempts for it would leave the
/// capacity they use idle.
pub fn holds_first_attempts(
    hold: bool,
    mode: Mode,
    corroborated: bool,
    cooldown_until_ms: i64,
    closed_until_ms: i64,
    now_ms: i64,
) -> bool {
    let closing = cooldown_until_ms.saturating_sub(now_ms) > CLOSING_MS
        || now_ms < closed_until_ms.min(cooldown_until_ms);
    hold && (mode == Mode::Saturated || corroborated && closing)
}

/// How long a worker may hold a report of counts alone, in ms
/// (`ReportResponse.counts_hold_ms`): a window while the route is calm
/// (steady or pinned, no cooldown in force at `now_ms`, first attempts not
/// `held`), 0 otherwise. Calm, counts change nothing before the window they
/// land in closes, so a worker sends about one report a window instead of
/// one per tick. While pacing learns, each window's counts must land in
/// that window, and corroboration counts the workers heard lately: a fleet
/// whose counts lag lets a few liars, who report at once, outnumber it.
pub fn counts_hold_ms(mode: Mode, cooldown_until_ms: i64, held: bool, now_ms: i64) -> i64 {
    let calm = matches!(mode, Mode::Steady | Mode::Pinned) && cooldown_until_ms <= now_ms && !held;
    if calm { WINDOW_MS } else { 0 }
}

/// The horizon of a pinned rate: ten years, far past any deadline. Nothing learned can pull a slot earlier, so slots
/// are handed out at any distance, as a fixed rate always was.
pub const PINNED_HORIZON_MS: i64 = 10 * 365 * 86_400_000;

/// What the controller is doing, for operators (GetScope, Watch, metrics).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[repr(u8)]
pub enum Mode {
    /// Nothing pushed back and the rate was not used up: held.
    #[default]
    Steady = 0,
    /// The last window used the rate and drew no rejection; it was raised.
    Probing = 1,
    /// The last window drew rejections; the rate was cut.
    BackingOff = 2,
    /// Hints keep re-arming: nothing is woken until the latest one passes.
    PenaltyExtending = 3,
    /// The policy pins a number.
    Pinned = 4,
    /// The policy names the upstream's limit; the fleet is paced under it.
    KnownLimit = 5,
    /// First attempts alone ask for more than the upstream serves: every
    /// attempt waits for a slot, paced at the capacity.
    Saturated = 6,
}

impl Mode {
    /// The wire/label name.
    pub fn as_str(self) -> &'static str {
        match self {
            Mode::Steady => "steady",
            Mode::Probing => "probing",
            Mode::BackingOff => "backing_off",
            Mode::PenaltyExtending => "penalty_extending",
            Mode::Pinned => "pinned",
            Mode::KnownLimit => "known_limit",
            Mode::Saturated => "saturated",
        }
    }

    /// From its integer code (`Mode as u8`, as stored and as watch events
    /// carry it); an unknown code reads as steady.
    pub fn from_code(v: i64) -> Mode {
        match v {
            1 => Mode::Probing,
            2 => Mode::BackingOff,
            3 => Mode::PenaltyExtending,
            4 => Mode::Pinned,
            5 => Mode::KnownLimit,
            6 => Mode::Saturated,
            _ => Mode::Steady,
        }
    }
}

/// The policy's part in pacing, resolved per route.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PacingPolicy {
    /// `wake_rate = <number>`: obeyed as given, in milli-slots per second.
    pub pinned_m: Option<i64>,
    /// `upstream_limit × upstream_share`, in milli-attempts per second: the
    /// whole fleet's attempts are paced under it from the start.
    pub known_limit_m: Option<i64>,
    /// Never slower: a route that is paced to nothing never learns that
    /// the upstream came back.
    pub floor_m: i64,
    /// Never faster, whatever was learned.
    pub ceiling_m: i64,
    /// A slot further ahead than this is not given; the intent is told to
    /// ask again, so a rate that rises meanwhile applies to it at once.
    pub horizon_ms: i64,
}

impl Default for PacingPolicy {
    fn default() -> Self {
        Self {
            pinned_m: None,
            known_limit_m: None,
            floor_m: MILLI,
            ceiling_m: 100_000 * MILLI,
            // A quarter window: slots given ahead run at the rate they were
            // given at, so this is how long a cut takes to bite.
            horizon_ms: WINDOW_MS / 4,
        }
    }
}

/// What an operator sees of a route's pacing (GetScope, metrics, spans).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct PacingView {
    /// What the controller is doing.
    pub mode: Mode,
    /// Slots per second in force, milli-units (0 while penalty-extending).
    pub wake_rate_m: i64,
    /// Capacity estimate, milli-attempts per second.
    pub capacity_m: i64,
    /// First-attempt rate, milli-attempts per second.
    pub first_rate_m: i64,
    /// What first attempts leave of the capacity, milli-attempts per second.
    pub spare_m: i64,
    /// While penalty-extending: when the latest hint passes; 0 otherwise.
    pub penalty_until_ms: i64,
    /// The end of the latest hint that closed the route (0: none).
    pub closed_until_ms: i64,
    /// Intents told to ask again and still waiting.
    pub asking: usize,
}

impl PacingView {
    /// A milli-unit rate per second as a number per second.
    pub fn per_sec(milli: i64) -> f64 {
        milli as f64 / MILLI as f64
    }
}

/// What one Report tells the controller.
#[derive(Debug, Clone, Copy, Default)]
pub struct Observation<'a> {
    /// The coordinator's clock.
    pub now_ms: i64,
    /// First attempts the worker made since its last report.
    pub first_attempts: u32,
    /// Attempts that succeeded, first or retry.
    pub successes: u32,
    /// Attempts rejected for capacity (429/503/RESOURCE_EXHAUSTED). At least
    /// `hint_until_ms.len()`; a report's evidence list is bounded, the count
    /// is not.
    pub rejections: u32,
    /// The end instant of each valid hint among those rejections.
    pub hint_until_ms: &'a [i64],
    /// The route's cooldown as it was *before* this report's evidence was
    /// merged: rejections received while it held are explained by it.
    pub cooldown_until_ms: i64,
    /// The route's cooldown after this report's evidence was merged, as
    /// the fleet accepted it (corroborated or capped): a cooldown that
    /// closes the route freezes the windows it covers, whether or not any
    /// one hint in the report did.
    pub cooldown_after_ms: i64,
}

/// The controller of one route.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PacingState {
    /// The window being accumulated (`now_ms / WINDOW_MS`).
    pub win: i64,
    /// First attempts reported in it.
    pub w_first: i64,
    /// Successes reported in it.
    pub w_ok: i64,
    /// Rejections in it that the controller must answer for.
    pub w_rej: i64,
    /// Every rejection in it that no closing hint explains, a short
    /// cooldown or not: what first attempts sent straight drew.
    pub w_refused: i64,
    /// Slots it granted in it: whether the rate was actually used.
    pub w_granted: i64,
    /// Of those, slots for first attempts held for one: a backlog released,
    /// not first attempts arriving.
    pub w_held: i64,
    /// The rate before the cut at its first rejection (0: no cut yet).
    pub w_cut_from: i64,
    /// Intents it told to ask again because the rate, not a cooldown, put
    /// their slot past the horizon: demand the rate fell short of.
    pub w_short: i64,
    /// 1 when a cooldown or a closing hint explained something in it.
    pub w_frozen: i64,
    /// Intents it told to ask again whose turn in deadline order, at the
    /// rate in force, comes too late for their deadline: waiting intents
    /// being lost for lack of rate.
    pub w_late: i64,
    /// The wake rate, milli-slots per second.
    pub rate_m: i64,
    /// The rate in force when rejections last came back (0: never).
    pub rate_max_m: i64,
    /// The last rate a window used without a rejection (0: none yet).
    pub rate_ok_m: i64,
    /// Capacity estimate, milli-attempts per second.
    pub cap_m: i64,
    /// First-attempt rate, moving average, milli-attempts per second.
    pub lam_m: i64,
    /// The end of the latest hint seen, and how many times in a row it
    /// jumped later while the previous one still held.
    pub hint_until: i64,
    /// See `hint_until`.
    pub streak: i64,
    /// The end of the latest hint that closed the route (longer than two
    /// windows): windows before it are not learned from.
    pub closed_until: i64,
    /// While penalty-extending: the instant the latest hint passes.
    pub penalty_until: i64,
    /// While penalty-extending: when the one probe was granted (0: none yet).
    pub probe_at: i64,
    /// What the controller is doing.
    pub mode: Mode,
    /// While slow start raises the rate: the rate the window began at
    /// (0: not ramping). The rate in force climbs from it to `rate_m`
    /// across the window ([`rate_at`](Self::rate_at)).
    pub ramp_from_m: i64,
    /// The window right after the last one whose end cut a saturated rate
    /// (0: none). Rejections in it inside the short cooldown the cut's own
    /// rejections set are the cut's stragglers (see `observe`).
    pub settle_win: i64,
}

impl PacingState {
    /// A route seen for the first time: paced at the floor (or the pinned
    /// number or the known limit) until something is learned.
    pub fn new(now_ms: i64, policy: &PacingPolicy) -> Self {
        let mut st = Self {
            win: now_ms.div_euclid(WINDOW_MS),
            w_first: 0,
            w_ok: 0,
            w_rej: 0,
            w_refused: 0,
            w_granted: 0,
            w_held: 0,
            w_cut_from: 0,
            w_short: 0,
            w_frozen: 0,
            w_late: 0,
            rate_m: policy.floor_m,
            rate_max_m: 0,
            rate_ok_m: 0,
            cap_m: 0,
            lam_m: 0,
            hint_until: 0,
            streak: 0,
            closed_until: 0,
            penalty_until: 0,
            probe_at: 0,
            mode: Mode::Steady,
            ramp_from_m: 0,
            settle_win: 0,
        };
        st.apply_policy(policy);
        st
    }

    /// The floor the route's own (`route_floor_ms`: cooldown, backoff,
    /// mutes) puts under a slot. A held first attempt waits out a cooldown
    /// only as far as it closes the route (the latest closing hint): a short
    /// one after that, the kind an overload draws, is what pacing answers
    /// for, and holding first attempts for it too would leave the capacity
    /// idle until it ends.
    pub fn floor_for(&self, route_floor_ms: i64, first_attempt: bool, now_ms: i64) -> i64 {
        if first_attempt {
            route_floor_ms.min(self.closed_until.max(now_ms))
        } else {
            route_floor_ms
        }
    }

    /// The current [`Mode`].
    pub fn mode(&self) -> Mode {
        self.mode
    }

    /// The wake rate the current window ends at, milli-slots per second
    /// (while slow start ramps, [`rate_at`](Self::rate_at) gives the one in
    /// force at an instant, as [`view`](Self::view) shows); 0 while a
    /// penalty holds the route closed.
    pub fn wake_rate_m(&self) -> i64 {
        if self.mode() == Mode::PenaltyExtending {
            0
        } else {
            self.rate_m
        }
    }

    /// The rate slots are handed out at, at `now_ms`: `rate_m`, or, while
    /// slow start ramps, the straight line from the rate the window began
    /// at to `rate_m` at its end. A rate that jumped at the window's start
    /// would overshoot an edge it crossed by the whole step until the
    /// first rejection is reported; ramped, by what it climbs meanwhile.
    pub fn rate_at(&self, now_ms: i64) -> i64 {
        let from = self.ramp_from_m;
        if from <= 0 || from >= self.rate_m || !self.adaptive() {
            return self.rate_m;
        }
        let into = (now_ms - self.win * WINDOW_MS).clamp(0, WINDOW_MS);
        from + (self.rate_m - from) * into / WINDOW_MS
    }

    /// Capacity estimate, milli-attempts per second.
    pub fn capacity_m(&self) -> i64 {
        self.cap_m
    }

    /// What first attempts leave of the capacity, milli-attempts per second.
    pub fn spare_m(&self) -> i64 {
        (self.cap_m - self.lam_m).max(0)
    }

    /// What an operator sees at `now_ms`, with `asking` intents waiting to
    /// ask again: the wake rate is the one slots are handed out at then
    /// (part way up a ramp while slow start climbs).
    pub fn view(&self, asking: usize, now_ms: i64) -> PacingView {
        let penalty = self.mode() == Mode::PenaltyExtending;
        PacingView {
            mode: self.mode(),
            wake_rate_m: if penalty { 0 } else { self.rate_at(now_ms) },
            capacity_m: self.cap_m,
            first_rate_m: self.lam_m,
            spare_m: self.spare_m(),
            penalty_until_ms: if penalty { self.penalty_until } else { 0 },
            closed_until_ms: self.closed_until,
            asking,
        }
    }

    /// Brings the state to `now_ms` (closing finished windows) and applies a
    /// policy change. Called before reading the rate.
    pub fn advance(&mut self, now_ms: i64, policy: &PacingPolicy) {
        let now_win = now_ms.div_euclid(WINDOW_MS);
        let mut steps = 0;
        while self.win < now_win && steps < MAX_CATCH_UP {
            self.close_window(policy);
            self.win += 1;
            steps += 1;
        }
        // A long silence: nothing was used or rejected in it.
        self.win = self.win.max(now_win);
        self.apply_policy(policy);
        self.reopen(now_ms, policy);
    }

    /// Starts slow start as soon as a closing hint that ended in the
    /// window's first half has passed, rather than at the window's end: a
    /// backlog held through an outage loses every deadline that falls
    /// while the rate waits for the window to close. Once per window (the
    /// ramp marks it), and only while nothing has been refused since.
    fn reopen(&mut self, now_ms: i64, policy: &PacingPolicy) {
        if self.reopens_window()
            && self.closed_until <= now_ms
            && self.rate_max_m == 0
            && self.ramp_from_m == 0
        {
            self.probe_up(0, self.spare_m());
            self.clamp_rate(policy);
        }
    }

    /// Whether a closing hint covered the window's start but ended in its
    /// first half, and nothing has been refused since, on a route whose
    /// rate is learned: the fleet is coming back within this window.
    pub(super) fn reopens_window(&self) -> bool {
        let start = self.win * WINDOW_MS;
        self.adaptive()
            && start < self.closed_until
            && self.closed_until <= start + WINDOW_MS / 2
            && self.w_refused == 0
    }

    /// Takes in one report.
    pub fn observe(&mut self, obs: &Observation<'_>, policy: &PacingPolicy) {
        self.advance(obs.now_ms, policy);
        let now = obs.now_ms;
        self.w_first += i64::from(obs.first_attempts);
        self.w_ok += i64::from(obs.successes);
        let rejections = i64::from(obs.rejections).max(obs.hint_until_ms.len() as i64);
        if obs.cooldown_after_ms.saturating_sub(now) > CLOSING_MS {
            self.closed_until = self.closed_until.max(obs.cooldown_after_ms);
        }
        for &until in obs.hint_until_ms {
            self.track_hint(now, until);
        }
        if self.mode() == Mode::PenaltyExtending {
            if obs.successes > 0 && now >= self.penalty_until {
                // The probe (or anything after the penalty) got through.
                self.leave_penalty(policy);
            }
            return;
        }
        if obs.successes > 0 && now >= self.hint_until {
            self.streak = 0;
        }
        // A hint that closes the route for more than two windows says the
        // upstream is out, not that the fleet is over its capacity. The
        // hints are a sample of the rejections (evidence is bounded): the
        // share they say was closing is explained.
        let hints = obs.hint_until_ms.len() as i64;
        let closing = obs
            .hint_until_ms
            .iter()
            .filter(|&&until| until.saturating_sub(now) > CLOSING_MS)
            .count() as i64;
        // So are rejections whose hint ends no later than the latest
        // closing hint: drawn inside that closure and reported after it
        // (reports lag), not drawn by what the fleet sends now.
        let inside = obs
            .hint_until_ms
            .iter()
            .filter(|&&until| until.saturating_sub(now) <= CLOSING_MS && until <= self.closed_until)
            .count() as i64;
        let explained = if hints > 0 {
            rejections * (closing + inside) / hints
        } else {
            0
        };
        if self.mode() == Mode::Saturated
            && self.win == self.settle_win
            && now < obs.cooldown_until_ms
        {
            // The window after a saturated cut, inside the short cooldown
            // the cut's own rejections set: drawn before the cut (reports
            // lag) by the rate it answered already. Counted, they would cut
            // again and set the edge under what the upstream served.
            return;
        }
        self.w_refused += rejections - explained;
        if self.overflowing(now) {
            // Part of a window: the share of first attempts served, at the
            // first-attempt rate, is what the upstream serves; but reports
            // lag, and successes of attempts made before the overflow still
            // arrive in it, so the pace is half that until the window's end
            // measures it.
            let edge_m = self.lam_m * self.w_ok / self.w_first.max(1);
            self.saturate(edge_m, edge_m / 2, policy);
            // The rest of the window mixes two regimes: nothing is learned
            // from it (its rejections are mostly the first attempts sent
            // before the workers heard).
            self.w_frozen = 1;
        }
        let saturated = self.mode() == Mode::Saturated;
        // Every attempt is paced while saturated, so a short cooldown
        // explains nothing then: the rate drew what came back.
        if now < obs.cooldown_until_ms && !saturated {
            if rejections > 0 {
                self.w_frozen = 1;
            }
            return;
        }
        for &until in obs.hint_until_ms {
            if until.saturating_sub(now) > CLOSING_MS {
                self.closed_until = self.closed_until.max(until);
            }
        }
        if closing > 0 {
            self.w_frozen = 1;
        }
        self.w_rej += rejections - explained;
        let answered = if saturated {
            self.w_refused
        } else {
            self.w_rej
        };
        // A saturated window that mixes two regimes (just entered) answers
        // for nothing: its rejections are the stragglers of the attempts
        // sent before the workers heard.
        let switching = saturated && self.w_frozen == 1;
        if answered > 0 && self.w_cut_from == 0 && self.learning() && !switching {
            // Back to the last rate that drew nothing, at the first
            // rejection the fleet answers for rather than at the window's
            // end: a probe that found the edge stops overshooting within a
            // report interval, and the rest of the window still measures
            // the upstream near its capacity. Once per window; the window's
            // end decides the rate from what it measured (see learn).
            let drew = self.rate_at(now);
            self.w_cut_from = drew;
            let back = if saturated {
                // Every attempt is paced: below the last rate a window used
                // cleanly (a limiter's burst can make a rate over the edge
                // look clean for a window).
                just_under(self.rate_ok_m)
            } else if self.rate_ok_m > 0 {
                self.rate_ok_m
            } else {
                self.rate_m / 2
            };
            self.rate_m = drew.min(back).max(policy.floor_m);
            self.ramp_from_m = 0;
            if !saturated {
                self.mode = Mode::BackingOff;
            }
        }
    }

    /// Whether the rate is the controller's to set (not pinned, not under
    /// a known limit, not held by a penalty).
    fn learning(&self) -> bool {
        self.adaptive() || self.mode() == Mode::Saturated
    }

    /// Whether the rate is learned as a retry rate: what may become
    /// saturated.
    fn adaptive(&self) -> bool {
        matches!(self.mode(), Mode::Steady | Mode::Probing | Mode::BackingOff)
    }

    /// Whether the window says first attempts alone overflow the upstream:
    /// it drew rejections and served less than the first attempts sent
    /// straight, by more than `over / under` (attempts in flight blur the
    /// edge). First attempts that waited for a slot are not sent straight:
    /// a backlog released after an outage is paced already. Nothing served
    /// is an outage, not an overflow. Nor can first attempts overflow where
    /// they arrive at less than half what the upstream has served, nor in a
    /// window where they came faster than twice their learned rate: slots
    /// are counted when granted but first attempts when reported, so first
    /// attempts released by slots near a window's end are reported in the
    /// next one, looking straight, and a retry-rate probe's rejections then
    /// make the window look overflowed (a false saturation paces the whole
    /// fleet at a few successes' worth).
    fn overflowed(&self, over: i64, under: i64) -> bool {
        let straight = self.straight_first();
        self.w_refused > 0
            && self.w_ok > 0
            && under * straight > over * self.w_ok
            && 2 * self.lam_m >= self.cap_m
            && straight * MILLI <= 2 * self.lam_m
    }

    /// Whether first attempts sent straight crowd out intents that wait:
    /// the window drew rejections (the fleet is at the upstream's edge),
    /// intents waiting for a slot were told their turn comes too late for
    /// their deadline, and first attempts sent straight took at least half
    /// of what was served. Every attempt is the same size, so serving the
    /// earliest deadlines first loses the fewest; a first attempt has all
    /// its deadline ahead of it, and going straight it takes the capacity
    /// an intent with seconds left needed. Paced together, first attempts
    /// wait their turn in deadline order with everything else.
    fn crowded(&self) -> bool {
        let straight = self.straight_first();
        self.w_late > 0 && self.w_refused > 0 && self.w_ok > 0 && 2 * straight >= self.w_ok
    }

    /// Whether first attempts alone have overflowed the upstream in the
    /// window so far, judged once it holds a quarter of a window's worth of
    /// them (fewer say little), and only when clear: by a quarter, with a
    /// quarter of the first attempts sent straight refused (reports lag,
    /// and an attempt is counted when it starts but its outcome when it
    /// ends, so part of a window mixes before and after, and rejections
    /// reported late from the window before prove nothing), and not in the
    /// quarter window after a closing cooldown (rejections reported then
    /// were drawn inside it): the fleet's first attempts then stop going
    /// straight within the window that found it, not a window later.
    fn overflowing(&self, now_ms: i64) -> bool {
        self.adaptive()
            && self.lam_m > 0
            && now_ms >= self.closed_until.saturating_add(WINDOW_MS / 4)
            && 4 * self.w_first * MILLI >= self.lam_m
            && 4 * self.w_refused >= self.straight_first()
            && self.overflowed(5, 4)
    }

    /// First attempts the window sent straight to the upstream: those
    /// reported, less those that waited for a slot (a backlog released by
    /// slots is paced already, not a rate first attempts keep up). Counts
    /// arrive by report and grants as they happen, so the difference is
    /// floored at zero.
    fn straight_first(&self) -> i64 {
        (self.w_first - self.w_held).max(0)
    }

    /// Keeps the rate within the policy's floor and ceiling (a ceiling under
    /// the floor yields to it).
    fn clamp_rate(&mut self, policy: &PacingPolicy) {
        self.rate_m = self
            .rate_m
            .clamp(policy.floor_m, policy.ceiling_m.max(policy.floor_m));
    }

    /// Paces every attempt from now on at `rate_m`, under `edge_m`, what the
    /// upstream is estimated to serve.
    fn saturate(&mut self, edge_m: i64, rate_m: i64, policy: &PacingPolicy) {
        self.cap_m = edge_m;
        self.rate_m = rate_m;
        self.clamp_rate(policy);
        self.rate_ok_m = self.rate_m;
        self.rate_max_m = edge_m;
        self.ramp_from_m = 0;
        // A cut earlier in the window was of a retry rate: it says nothing
        // of this one.
        self.w_cut_from = 0;
        self.mode = Mode::Saturated;
    }

    /// Follows the latest hint end; counts jumps that can only be a limiter
    /// re-arming its window on an attempt made during it.
    fn track_hint(&mut self, now: i64, until: i64) {
        if until > self.hint_until.saturating_add(HINT_GRANULARITY_MS) {
            if now < self.hint_until {
                self.streak += 1;
            } else {
                self.streak = 0;
            }
            self.hint_until = until;
        } else {
            // The same end (a countdown) or an earlier one.
            self.hint_until = self.hint_until.max(until);
        }
        if self.mode() == Mode::PenaltyExtending {
            // Still rejected: wait for the new end, then probe once more.
            self.penalty_until = self.penalty_until.max(self.hint_until);
            self.probe_at = 0;
        } else if self.streak >= EXTENSIONS_TO_DETECT {
            self.mode = Mode::PenaltyExtending;
            self.penalty_until = self.hint_until;
            self.probe_at = 0;
        }
    }

    fn leave_penalty(&mut self, policy: &PacingPolicy) {
        self.mode = Mode::Steady;
        self.streak = 0;
        self.penalty_until = 0;
        self.probe_at = 0;
        self.clear_window();
        self.apply_policy(policy);
    }

    fn clear_window(&mut self) {
        self.w_first = 0;
        self.w_ok = 0;
        self.w_rej = 0;
        self.w_refused = 0;
        self.w_granted = 0;
        self.w_held = 0;
        self.w_cut_from = 0;
        self.w_short = 0;
        self.w_frozen = 0;
        self.w_late = 0;
    }

    /// A pinned number and a known limit override what was learned.
    fn apply_policy(&mut self, policy: &PacingPolicy) {
        if self.mode() == Mode::PenaltyExtending {
            return;
        }
        let hi = policy.ceiling_m.max(policy.floor_m);
        if let Some(pinned) = policy.pinned_m {
            // Obeyed as given: an operator who pins a number means it.
            self.rate_m = pinned.max(1);
            self.mode = Mode::Pinned;
        } else if let Some(limit) = policy.known_limit_m {
            // Known in advance: first attempts take their share first. A
            // cut (the limit was wrong, or shared with someone else) holds
            // for the window after it, then the limit rules again.
            self.cap_m = limit;
            let room = (limit - self.lam_m).max(0).clamp(policy.floor_m, hi);
            self.rate_m = if self.mode() == Mode::BackingOff {
                self.rate_m.min(room)
            } else {
                room
            };
            self.mode = Mode::KnownLimit;
        } else if matches!(self.mode(), Mode::Pinned | Mode::KnownLimit) {
            self.mode = Mode::Steady;
        }
    }
}

#[cfg(test)]
mod model_sim;
#[cfg(test)]
mod sim_tests;
#[cfg(test)]
mod tests;
