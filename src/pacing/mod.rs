//! Learned pacing: how fast a route's waiting intents may be woken. Pure.
//!
//! A fixed wake rate is right for one fleet shape only: too low and the
//! backlog left by a cooldown drains past every deadline, too high and the
//! wake-ups are the next overload. The coordinator sees what no single
//! worker sees — every worker's first attempts, successes and rejections on
//! a route — so it estimates the upstream's limiter instead
//! ([`model::LimiterModel`], written down in `docs/pacing.md`, "The
//! model"): its sustained rate ρ̂ and its bank, measured from empty instant
//! to empty instant, probed at a bounded gain on a fixed schedule. The
//! model gives a **target**, the rate at which the fleet's attempts in all
//! may reach the upstream. [`PacingState`] splits it:
//!
//! - while the first attempts' rate (a moving average of those sent
//!   straight) is under the target, they go straight and waiting intents
//!   are woken at the target less that rate;
//! - once it reaches the target (a brownout under the fleet's arrivals, an
//!   upstream back smaller, demand above the limit), the route is
//!   [`Mode::Saturated`]: every attempt, first ones included, waits for a
//!   slot at the target, in deadline order, until a window's demand fits in
//!   the slots it was given.
//!
//! Rejections that a closing hint (longer than two windows) explains, and
//! windows it covers, teach nothing: when it passes the fleet resumes at ρ̂
//! less the margin. A limiter that re-arms its full `Retry-After` on every
//! rejected attempt is detected when successive hints stop counting down
//! ([`Mode::PenaltyExtending`]): nothing is woken until the latest hint
//! passes, then exactly one probe, and only a success reopens the route.
//!
//! Everything is integer math on milli-units (rates in thousandths of an
//! event per second), so a decision is the same on every replica. The
//! memory store keeps the state as it is, the Redis store as the versioned
//! bytes of [`PacingState::encode`], and every decision about it is made
//! here, by whichever store holds it.

mod codec;
pub mod cursor;
pub mod model;
mod slot;
pub mod stated;

pub use slot::{Asker, SlotDecision, WakeAsk};

use model::{LimiterModel, Phase};
use stated::{InForce, StatedState, StatedView, Statement, Weighing};

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
/// A cooldown longer than this says the upstream is out, not that the
/// fleet is over its capacity: nothing is learned under it, and first
/// attempts wait it out.
pub const CLOSING_MS: i64 = 2 * WINDOW_MS;
/// How late a worker's counts arrive in the normal course: its report
/// tick (the client's default report interval), which is why a
/// measurement lasts at least three of them ([`model::MEASURE_MS`]).
pub const REPORT_TICK_MS: i64 = 100;

/// The part of `count` counts, made evenly over the `age_ms` before now,
/// that was made in the last `span_ms` (all of them when they span no
/// more), rounded to the nearest.
pub fn share_made_within(count: i64, age_ms: i64, span_ms: i64) -> i64 {
    if age_ms <= span_ms {
        return count;
    }
    // Counts are a report's (u32) and ages bounded by validation: no
    // overflow.
    (count * span_ms.max(0) + age_ms / 2) / age_ms
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
/// (steady, pinned or paced by a stated limit, no cooldown in force at
/// `now_ms`, first attempts not `held`), 0 otherwise. Calm, counts change
/// nothing before the window they land in closes, so a worker sends about
/// one report a window instead of one per tick. While pacing learns, each
/// window's counts must land in that window, and corroboration counts the
/// workers heard lately: a fleet whose counts lag lets a few liars, who
/// report at once, outnumber it. A stated pace is not learned from counts,
/// and each report a window carries its worker's latest statement, which
/// lives three windows ([`stated::STATED_HOLD_MS`]): every honest worker's
/// claim stays live between its reports. That holds while a `stated` pace
/// (corroborated) paces a saturated route too, first attempts held: what
/// the slots release and whether saturation ends are the coordinator's own
/// counts (grants and asks, not reports), and the pace is the statement's;
/// a saturated route reporting at every tick sent one `Report` per attempt.
pub fn counts_hold_ms(
    mode: Mode,
    stated: &StatedView,
    cooldown_until_ms: i64,
    held: bool,
    now_ms: i64,
) -> i64 {
    let paced_by_statement =
        mode == Mode::Saturated && stated.in_force == InForce::Corroborated && stated.agreed;
    let calm = (mode.is_calm() && !held || paced_by_statement) && cooldown_until_ms <= now_ms;
    if calm { WINDOW_MS } else { 0 }
}

/// The horizon of a pinned rate: ten years, far past any deadline. Nothing learned can pull a slot earlier, so slots
/// are handed out at any distance, as a fixed rate always was.
pub const PINNED_HORIZON_MS: i64 = 10 * 365 * 86_400_000;

/// What the controller is doing, for operators (GetScope, Watch, metrics).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[repr(u8)]
pub enum Mode {
    /// Cruising at the measured rate less the margin, or, with nothing
    /// measured yet, at what the upstream serves while nobody waits.
    #[default]
    Steady = 0,
    /// Offering more than is known to be served: startup climbing with work
    /// waiting, or a probe (`model::Phase::Startup`, `model::Phase::Probe`).
    Probing = 1,
    /// The limiter refused: the rate that drew it is held to measure ρ,
    /// then the fleet drains below it (`model::Phase::Measure`,
    /// `model::Phase::Drain`).
    BackingOff = 2,
    /// Hints keep re-arming: nothing is woken until the latest one passes.
    PenaltyExtending = 3,
    /// The policy pins a number.
    Pinned = 4,
    /// The policy names the upstream's limit; the fleet is paced under it.
    KnownLimit = 5,
    /// Every attempt, first ones included, waits for a slot at the whole
    /// target, in deadline order: first attempts alone reach what the
    /// upstream serves, or intents waiting would miss their deadlines
    /// behind first attempts sent straight.
    Saturated = 6,
    /// The upstream states its quota and enough workers agree
    /// ([`stated`]): the fleet's attempts in all, first ones included, are
    /// paced at the stated pace (waiting intents at it less the first
    /// attempts' rate; every attempt once they alone reach it, as
    /// [`Mode::Saturated`]).
    Stated = 7,
}

impl Mode {
    /// A mode in which counts may wait a window (`counts_hold_ms`, given no
    /// cooldown and first attempts not held): nothing is being learned.
    pub fn is_calm(self) -> bool {
        matches!(self, Mode::Steady | Mode::Pinned | Mode::Stated)
    }

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
            Mode::Stated => "stated_limit",
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
            7 => Mode::Stated,
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
    /// `stated_margin`, permille: the part of a stated pace the fleet
    /// leaves unspent ([`stated`]).
    pub stated_margin_permille: i64,
}

/// `stated_margin`'s default, permille. A stated `remaining` already shows
/// what others sharing the quota spent; the margin covers what they spend
/// between two statements (a report tick) and the fleet's own lag, and
/// keeps the fleet at 97 % of the stated rate, inside the benchmark's 95 %.
pub const STATED_MARGIN_PERMILLE: i64 = 30;

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
            stated_margin_permille: STATED_MARGIN_PERMILLE,
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
    /// Whether `capacity_m` was measured (ρ̂) rather than what the upstream
    /// served without refusing.
    pub measured: bool,
    /// σ̂, milli-attempts: the largest burst the limiter was seen to serve
    /// over its rate (0 until seen).
    pub burst_m: i64,
    /// The model's phase (`model::Phase::as_str`); empty unless the rate is
    /// learned.
    pub phase: &'static str,
    /// What the upstream states and the pace it sets.
    pub stated: StatedView,
}

impl PacingView {
    /// A milli-unit rate per second as a number per second.
    pub fn per_sec(milli: i64) -> f64 {
        milli as f64 / MILLI as f64
    }
}

/// What one Report tells the controller: its sample of the route, in the
/// sense of BBR's rate sample. Not the client's `Observation` (one response
/// as a worker saw it), which a report's counts are made from.
#[derive(Debug, Clone, Copy, Default)]
pub struct ReportSample<'a> {
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
    /// How old the oldest of these counts is (0: not said): they were made
    /// in the `counts_age_ms` before `now_ms`. For a report held back, the
    /// share of its counts in the current window and that part of it
    /// ([`crate::store::ReportBatch::window_counts`]).
    pub counts_age_ms: i64,
}

/// What sets a route's rate: the model, or the policy's number, or a
/// limiter that re-arms its penalty.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Rule {
    /// The model's target ([`model::LimiterModel`]).
    Learned,
    /// `wake_rate = <number>`, milli-slots per second: obeyed as given.
    Pinned { rate_m: i64 },
    /// `upstream_limit × upstream_share`, milli-attempts per second: first
    /// attempts take their share, retries the rest.
    Known { limit_m: i64 },
    /// Hints keep re-arming: nothing is woken until `until_ms`, then one
    /// probe (granted at `probe_at_ms`, 0 for none yet).
    Penalty { until_ms: i64, probe_at_ms: i64 },
}

/// The controller of one route.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PacingState {
    /// The window being accumulated (`now_ms / WINDOW_MS`).
    pub(super) win: i64,
    /// First attempts reported in it.
    pub(super) w_first: i64,
    /// Successes reported in it.
    pub(super) w_ok: i64,
    /// Rejections in it that no earlier closure explains.
    pub(super) w_refused: i64,
    /// Slots it granted: whether the rate was used.
    pub(super) w_granted: i64,
    /// Of those, slots for first attempts held for one: a backlog
    /// released, not first attempts arriving.
    pub(super) w_held: i64,
    /// First attempts held as they arrived (their first ask): the rate
    /// intents arrive at while their first attempts wait for slots.
    pub(super) w_arrived: i64,
    /// Intents it told to ask again because the rate, not a cooldown, put
    /// their slot past the horizon: demand the rate fell short of.
    pub(super) w_short: i64,
    /// Of those, intents whose turn in deadline order, at the rate in
    /// force, comes after their deadline.
    pub(super) w_late: i64,
    /// The wake rate in force, milli-slots per second (derived: see
    /// [`settle`](Self::settle)).
    pub(super) rate_m: i64,
    /// First attempts arriving, moving average, milli-attempts per second:
    /// those sent straight (and, while saturated, those held as they
    /// arrived).
    pub(super) lam_m: i64,
    /// Every attempt waits for a slot at the target.
    pub(super) saturated: bool,
    /// The end of the latest hint seen, and how many times in a row it
    /// jumped later while the previous one still held.
    pub(super) hint_until: i64,
    /// See `hint_until`.
    pub(super) streak: i64,
    /// The end of the latest hint that closed the route (longer than two
    /// windows): windows before it are not learned from.
    pub(super) closed_until: i64,
    /// What sets the rate.
    pub(super) rule: Rule,
    /// The upstream's limiter as estimated.
    pub(super) model: LimiterModel,
    /// What workers report the upstream states about its quota.
    pub(super) stated: StatedState,
}

impl PacingState {
    /// A route seen for the first time: paced at the floor (or the pinned
    /// number or the known limit) until something is learned.
    pub fn new(now_ms: i64, policy: &PacingPolicy) -> Self {
        let mut st = Self {
            win: now_ms.div_euclid(WINDOW_MS),
            w_first: 0,
            w_ok: 0,
            w_refused: 0,
            w_granted: 0,
            w_held: 0,
            w_arrived: 0,
            w_short: 0,
            w_late: 0,
            rate_m: policy.floor_m,
            lam_m: 0,
            saturated: false,
            hint_until: 0,
            streak: 0,
            closed_until: 0,
            rule: Rule::Learned,
            model: LimiterModel::new(policy.floor_m, policy.floor_m),
            stated: StatedState::default(),
        };
        st.apply_policy(policy);
        st.settle(now_ms, policy);
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
        match self.rule {
            Rule::Penalty { .. } => Mode::PenaltyExtending,
            Rule::Pinned { .. } => Mode::Pinned,
            Rule::Known { .. } => Mode::KnownLimit,
            Rule::Learned if self.saturated => Mode::Saturated,
            Rule::Learned if self.stated.in_force() == InForce::Corroborated => Mode::Stated,
            Rule::Learned => match self.model.phase() {
                Phase::Startup { step_m, .. } if step_m > 0 => Mode::Probing,
                Phase::Probe => Mode::Probing,
                Phase::Measure { .. } | Phase::Drain { .. } | Phase::Recover { .. } => {
                    Mode::BackingOff
                }
                _ => Mode::Steady,
            },
        }
    }

    /// The estimated limiter.
    pub fn model(&self) -> &LimiterModel {
        &self.model
    }

    /// The wake rate in force, milli-slots per second; 0 while a penalty
    /// holds the route closed.
    pub fn wake_rate_m(&self) -> i64 {
        match self.rule {
            Rule::Penalty { .. } => 0,
            _ => self.rate_m,
        }
    }

    /// Capacity estimate at `now_ms`, milli-attempts per second: the limit
    /// the policy states, or the upstream's corroborated stated pace (less
    /// the margin: what the fleet may spend, first attempts included), or
    /// ρ̂ once measured, or before that the target (what the upstream
    /// served without refusing, and the climb past it). `stated` is the
    /// statements' view at `now_ms`.
    fn capacity_m(&self, stated: &StatedView, now_ms: i64) -> i64 {
        if let Rule::Known { limit_m } = self.rule {
            return limit_m;
        }
        if self.rule == Rule::Learned && stated.in_force == InForce::Corroborated {
            return stated.pace_m;
        }
        self.model
            .rate_m()
            .unwrap_or_else(|| self.model.target_m(now_ms))
    }

    /// What an operator sees at `now_ms`, with `asking` intents waiting to
    /// ask again.
    pub fn view(&self, asking: usize, now_ms: i64) -> PacingView {
        // Read at `now_ms`: statements may have expired since the last
        // settle (an outage sends no reports to settle on). Read once: the
        // capacity and the view's own copy are the same reading.
        let stated = self.stated.view_now(now_ms);
        let capacity_m = self.capacity_m(&stated, now_ms);
        let penalty_until_ms = match self.rule {
            Rule::Penalty { until_ms, .. } => until_ms,
            _ => 0,
        };
        let learned = self.rule == Rule::Learned;
        PacingView {
            mode: self.mode(),
            wake_rate_m: self.wake_rate_m(),
            capacity_m,
            first_rate_m: self.lam_m,
            spare_m: (capacity_m - self.lam_m).max(0),
            penalty_until_ms,
            closed_until_ms: self.closed_until,
            asking,
            measured: learned && self.model.rate_m().is_some(),
            burst_m: self.model.burst_m(),
            phase: if learned {
                self.model.phase().as_str()
            } else {
                ""
            },
            stated,
        }
    }

    /// The statements on the route kept as evidence, oldest first.
    pub fn stated_recent(&self) -> impl Iterator<Item = &Statement> {
        self.stated.recent()
    }

    /// Takes in one worker's statement of the upstream's limit, weighed
    /// under `weighing` ([`stated`]): the hook by which a stated quota
    /// reaches the target. Before [`observe`](Self::observe) of the same
    /// report, so its counts are judged under the pace it sets.
    pub fn observe_statement(
        &mut self,
        statement: Statement,
        weighing: Weighing,
        now_ms: i64,
        policy: &PacingPolicy,
    ) {
        self.advance(now_ms, policy);
        self.stated.record(statement, weighing, now_ms);
        self.settle(now_ms, policy);
    }

    /// Brings the state to `now_ms` (closing finished windows) and applies a
    /// policy change. Called before reading the rate.
    pub fn advance(&mut self, now_ms: i64, policy: &PacingPolicy) {
        let now_win = now_ms.div_euclid(WINDOW_MS);
        let mut steps = 0;
        while self.win < now_win && steps < MAX_CATCH_UP {
            self.close_window();
            self.win += 1;
            steps += 1;
        }
        // A long silence: nothing was used or rejected in it.
        self.win = self.win.max(now_win);
        self.apply_policy(policy);
        if self.closed_until <= now_ms {
            // The outage is over: the backlog held through it goes now,
            // not at the window's end.
            self.model.reopen();
        }
        self.settle(now_ms, policy);
    }

    /// Takes in one report.
    pub fn observe(&mut self, obs: &ReportSample<'_>, policy: &PacingPolicy) {
        self.advance(obs.now_ms, policy);
        let now = obs.now_ms;
        self.w_first += i64::from(obs.first_attempts);
        self.w_ok += i64::from(obs.successes);
        let rejections = i64::from(obs.rejections).max(obs.hint_until_ms.len() as i64);
        if obs.cooldown_after_ms.saturating_sub(now) > CLOSING_MS {
            self.closed_until = self.closed_until.max(obs.cooldown_after_ms);
        }
        let mut longest_hint_ms = 0;
        for &until in obs.hint_until_ms {
            self.track_hint(now, until);
            longest_hint_ms = longest_hint_ms.max(until.saturating_sub(now));
        }
        if let Rule::Penalty { until_ms, .. } = self.rule {
            if obs.successes > 0 && now >= until_ms {
                // The probe (or anything after the penalty) got through.
                self.leave_penalty(now, policy);
            }
            return;
        }
        if obs.successes > 0 && now >= self.hint_until {
            self.streak = 0;
        }
        // Rejections whose hint ends no later than the latest closing
        // hint's end were drawn inside that closure and reported after it
        // (reports lag): they say nothing of what the fleet sends now. The
        // hints are a sample of the rejections (evidence is bounded): the
        // share they say was drawn inside is explained.
        let hints = obs.hint_until_ms.len() as i64;
        let inside = obs
            .hint_until_ms
            .iter()
            .filter(|&&until| until.saturating_sub(now) <= CLOSING_MS && until <= self.closed_until)
            .count() as i64;
        // And rejections whose own hint closes the route were drawn by the
        // outage (or a window limiter's spent quota), not by the rate.
        let mut closing = 0;
        for &until in obs.hint_until_ms {
            if until.saturating_sub(now) > CLOSING_MS {
                self.closed_until = self.closed_until.max(until);
                closing += 1;
            }
        }
        let share = |n: i64| if hints > 0 { rejections * n / hints } else { 0 };
        let closing = share(closing);
        let refused = rejections - share(inside) - closing;
        self.w_refused += refused + closing;
        if self.rule == Rule::Learned {
            self.model.on_report(&model::Report {
                now_ms: now,
                age_ms: obs.counts_age_ms.max(0),
                served: i64::from(obs.successes),
                refused,
                closing,
                longest_hint_ms,
            });
        }
        self.settle(now, policy);
    }

    /// Closes the window being accumulated: the first-attempt rate, the
    /// model's window, and whether saturation still holds.
    fn close_window(&mut self) {
        // A window a closing hint covered, even in part, or one that
        // refused attempts and served none (an upstream out, whatever its
        // hints said), says nothing of the upstream's capacity.
        let closed =
            self.win * WINDOW_MS < self.closed_until || self.w_ok == 0 && self.w_refused > 0;
        if !closed && !matches!(self.rule, Rule::Penalty { .. }) {
            // First attempts arriving. Split, the rate is what first
            // attempts sent straight use: one held for a short cooldown
            // takes a wake slot like a retry, so it is not counted twice.
            // Saturated, every attempt is paced at the whole target and the
            // rate says whether first attempts alone reach it: those held
            // as they arrived count, not what the slots release. A backlog
            // released by slots is not a rate first attempts keep up: once
            // arrivals stop, a saturated route's slots release held first
            // attempts for as long as the backlog lasts, and counting them
            // left the split waking retries at the floor when saturation
            // ended.
            let arrived_m = if self.saturated {
                self.straight_first() + self.w_arrived
            } else {
                self.straight_first()
            } * MILLI;
            if self.lam_m == 0 {
                self.lam_m = arrived_m;
            } else {
                self.lam_m += (arrived_m - self.lam_m).div_euclid(4);
            }
        }
        // Work waited for the rate: intents were told to ask again for
        // lack of it, or nearly every slot it could give was taken.
        let demand = self.w_short > 0 || 8 * self.w_granted * MILLI >= 7 * self.rate_m.max(1);
        if self.rule == Rule::Learned {
            // While a corroborated statement sets the pace, work waiting
            // for it says nothing of the model's own target: startup would
            // climb from the stated pace by ever larger steps it never
            // tried, and a statement that stops arriving would hand the
            // route over at that untried top. The model holds at what was
            // served, so learned pacing takes over at the stated pace.
            let stated = self.stated.in_force() == InForce::Corroborated;
            self.model.on_window(&model::WindowEnd {
                at_ms: (self.win + 1) * WINDOW_MS,
                demand: demand && !stated,
                closed,
            });
            if self.saturated && !demand && !closed {
                // The target met every intent that asked: first attempts
                // fit again and go straight.
                self.saturated = false;
            }
            if self.w_late > 0 && self.model.estimates((self.win + 1) * WINDOW_MS) {
                // Intents that wait would meet their deadline only if they
                // went before first attempts sent straight, which have all
                // of theirs ahead of them: every attempt is the same size,
                // so serving the earliest deadlines first loses the fewest.
                // Paced together, first attempts take their turn in
                // deadline order with everything else — at a rate the
                // model estimates, never at the floor it starts from.
                self.saturated = true;
            }
        }
        self.clear_window();
    }

    /// Recomputes what follows from the state at `now_ms`: saturation and
    /// the wake rate.
    fn settle(&mut self, now_ms: i64, policy: &PacingPolicy) {
        let hi = policy.ceiling_m.max(policy.floor_m);
        match self.rule {
            Rule::Penalty { .. } => {}
            Rule::Pinned { rate_m } => self.rate_m = rate_m.max(1),
            Rule::Known { limit_m } => {
                self.saturated = false;
                self.rate_m = (limit_m - self.lam_m).clamp(policy.floor_m, hi);
            }
            Rule::Learned => {
                let learned = self.model.target_m(now_ms);
                let (target, stated) =
                    self.stated
                        .target(learned, policy.stated_margin_permille, now_ms);
                // First attempts alone reach what the upstream is measured
                // (or stated) to serve: every attempt is paced.
                let known =
                    self.model.rate_m().is_some() || stated.in_force == InForce::Corroborated;
                if known && self.lam_m >= target {
                    self.saturated = true;
                }
                let rate = if self.saturated {
                    target
                } else {
                    target - self.lam_m
                };
                self.rate_m = rate.clamp(policy.floor_m, hi);
            }
        }
    }

    /// Whether the rate is the model's split: retries woken at the target
    /// less the first attempts sent straight.
    pub(super) fn splits_target(&self) -> bool {
        self.rule == Rule::Learned && !self.saturated
    }

    /// First attempts the window sent straight to the upstream: those
    /// reported, less those that waited for a slot (a backlog released by
    /// slots is paced already, not a rate first attempts keep up). Counts
    /// arrive by report and grants as they happen, so the difference is
    /// floored at zero.
    fn straight_first(&self) -> i64 {
        (self.w_first - self.w_held).max(0)
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
        if let Rule::Penalty { until_ms, .. } = self.rule {
            // Still rejected: wait for the new end, then probe once more.
            self.rule = Rule::Penalty {
                until_ms: until_ms.max(self.hint_until),
                probe_at_ms: 0,
            };
        } else if self.streak >= EXTENSIONS_TO_DETECT {
            self.rule = Rule::Penalty {
                until_ms: self.hint_until,
                probe_at_ms: 0,
            };
        }
    }

    fn leave_penalty(&mut self, now_ms: i64, policy: &PacingPolicy) {
        self.rule = Rule::Learned;
        self.streak = 0;
        self.clear_window();
        self.apply_policy(policy);
        self.settle(now_ms, policy);
    }

    fn clear_window(&mut self) {
        self.w_first = 0;
        self.w_ok = 0;
        self.w_refused = 0;
        self.w_granted = 0;
        self.w_held = 0;
        self.w_arrived = 0;
        self.w_short = 0;
        self.w_late = 0;
    }

    /// A pinned number and a known limit override what was learned.
    fn apply_policy(&mut self, policy: &PacingPolicy) {
        if matches!(self.rule, Rule::Penalty { .. }) {
            return;
        }
        self.rule = if let Some(rate_m) = policy.pinned_m {
            Rule::Pinned { rate_m }
        } else if let Some(limit_m) = policy.known_limit_m {
            Rule::Known { limit_m }
        } else {
            Rule::Learned
        };
    }
}

#[cfg(test)]
mod model_sim;
#[cfg(test)]
mod sim_tests;
#[cfg(test)]
mod tests;
