//! Stated limits: pacing the whole fleet at the quota the upstream states
//! (`RateLimit`, `X-RateLimit-*`), weighed across workers. Pure.
//!
//! Learned pacing finds the upstream's rate by being refused; an upstream
//! that states its quota, what is left of it and when it resets tells the
//! fleet what learning could only approach (`docs/pacing.md`, bound 1: a
//! rise is told, not found). While a statement holds, the fleet spends the
//! remaining quota evenly until its reset, first attempts included, and
//! never faster than the stated rate (quota over window), less the
//! policy's `stated_margin`.
//!
//! # Why remaining over reset, and not the quota alone
//! Limits are usually shared: other clients, other fleets, a retry from an
//! earlier run spend from the same quota. A published number cannot show
//! them, so the advice for one is to budget for a part of it
//! (`upstream_share`). A statement does show them: what they spent is gone
//! from `remaining`. Pacing at `remaining / reset` is what is left after
//! them, re-read at every statement, so the fleet yields to others as they
//! spend; `stated_margin` only covers what they spend between two
//! statements.
//!
//! # One worker does not speak for the fleet
//! Each worker's latest usable statement is kept as its claim of a pace,
//! as a hint is kept as its claim of a cooldown
//! ([`crate::hints::corroboration`]):
//!
//! - **Corroborated**: with at least `needed` distinct workers' live
//!   statements (`needed` as for hints, from the route's active workers),
//!   the pace is the `needed`-th lowest of theirs. Fewer than `needed`
//!   liars can neither slow the fleet (their low claims sort below it) nor
//!   speed it up (their high claims sort above it). When at least
//!   `2 × needed − 1` were received within the last window, those decide
//!   alone (fewer than `needed` liars are then fewer than the honest among
//!   them): a quota stated anew binds within a window, not once the
//!   claims of workers that sent nothing since expire.
//! - **Uncorroborated**: fewer live statements than `needed` may only lower
//!   the learned target, never raise it, and each worker's only for the
//!   policy's `uncorroborated_cap` from the start of its streak of
//!   statements: no longer than a lying `Retry-After` may hold the fleet.
//!
//! A statement whose verdict is not usable (invalid, contradictory, absurd,
//! an untrusted clock) is kept as evidence ([`StatedState::recent`]) and
//! withdraws that worker's earlier claim: it never becomes permission. A
//! statement lives [`STATED_HOLD_MS`] after it was received; when none
//! arrives for that long, learned pacing paces again.

use std::collections::VecDeque;

use super::{MILLI, WINDOW_MS};
use crate::codec::{DecodeError, Reader, Writer};

/// How long a statement paces after it was received. Workers send the
/// latest with each report, a report a window at most while the route is
/// calm: three windows is a missed report and its round trip, and short
/// enough that a quota that stopped being stated stops pacing quickly.
pub const STATED_HOLD_MS: i64 = 3 * WINDOW_MS;
/// Workers whose latest statement is kept per route, so `needed` (a
/// fraction of a large fleet) can always be met; the one heard from longest
/// ago is forgotten first. Hint corroboration keeps claims for as many
/// workers ([`crate::hints::corroboration::MAX_EVIDENCE_WORKERS`]).
pub const MAX_STATEMENT_WORKERS: usize = 1024;
/// Statements kept as evidence per route, whatever their verdict.
pub const RECENT_STATEMENTS: usize = 4;
/// A statement's raw fields are kept up to this many bytes as evidence.
pub const MAX_STATED_RAW: usize = 512;

/// How the coordinator read one statement.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[repr(u8)]
pub enum StatedVerdict {
    /// Every check passed and it says something about a request quota.
    #[default]
    Usable = 0,
    /// A field not in its syntax.
    Invalid = 1,
    /// The statement disagrees with itself.
    Contradictory = 2,
    /// Not believable against the receipt time.
    Absurd = 3,
    /// An epoch reset under an untrusted clock.
    ClockUntrusted = 4,
    /// Usable, but nothing in it paces requests (another unit, no window
    /// and no reset).
    Unsupported = 5,
}

impl StatedVerdict {
    /// The wire/label name.
    pub fn as_str(self) -> &'static str {
        match self {
            StatedVerdict::Usable => "usable",
            StatedVerdict::Invalid => "invalid",
            StatedVerdict::Contradictory => "contradictory",
            StatedVerdict::Absurd => "absurd",
            StatedVerdict::ClockUntrusted => "clock_untrusted",
            StatedVerdict::Unsupported => "unsupported",
        }
    }

    fn from_code(v: i64) -> Option<Self> {
        Some(match v {
            0 => StatedVerdict::Usable,
            1 => StatedVerdict::Invalid,
            2 => StatedVerdict::Contradictory,
            3 => StatedVerdict::Absurd,
            4 => StatedVerdict::ClockUntrusted,
            5 => StatedVerdict::Unsupported,
            _ => return None,
        })
    }
}

/// One worker's statement, read: the binding quota it states (the one
/// whose pace is lowest) and the pace that quota sets alone.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Statement {
    /// The reporting worker.
    pub worker: String,
    /// When the response was received, on the coordinator's clock.
    pub received_ms: i64,
    /// What the statement came to.
    pub verdict: StatedVerdict,
    /// The fields as received (bounded by [`MAX_STATED_RAW`]).
    pub raw: String,
    /// The binding quota, 0 when not stated.
    pub quota: i64,
    /// Its window, ms; 0 when not stated.
    pub window_ms: i64,
    /// What remains of it, when stated (else the quota).
    pub remaining: i64,
    /// When it resets, ms after receipt; 0 when not stated.
    pub reset_ms: i64,
    /// The pace it sets alone before the margin, milli-attempts per
    /// second: the remaining spread evenly until the reset, at most quota
    /// over window. `None` unless usable.
    pub pace_m: Option<i64>,
}

impl Statement {
    /// The pace a quota state sets: `remaining` spread evenly until the
    /// reset, at most `quota` per `window_ms`; `None` when nothing says how
    /// fast.
    ///
    /// Resets are stated in whole seconds, rounded up, so the reset lies up
    /// to a second before the one stated: `remaining` is spread over the
    /// stated reset less that second. A reset within the next second says
    /// only whether anything is left (an exhausted quota paces nothing until
    /// its reset is stated); how fast it may go is the window's rate.
    /// Spreading it over a whole second instead would read a window spent
    /// evenly as spent too fast and settle the fleet at two thirds of it.
    pub fn pace_of(quota: i64, window_ms: i64, remaining: i64, reset_ms: i64) -> Option<i64> {
        let cap = (window_ms > 0).then(|| mul_div(quota, MILLI * 1000, window_ms));
        let spread = match reset_ms {
            ..=0 => None,
            1..=RESET_ROUNDING_MS if remaining > 0 => None,
            1..=RESET_ROUNDING_MS => Some(0),
            _ => Some(mul_div(
                remaining,
                MILLI * 1000,
                reset_ms - RESET_ROUNDING_MS,
            )),
        };
        match (cap, spread) {
            (Some(c), Some(s)) => Some(c.min(s)),
            (c, s) => c.or(s),
        }
    }

    fn live(&self, now_ms: i64) -> bool {
        self.received_ms.saturating_add(STATED_HOLD_MS) > now_ms
    }
}

/// How much earlier than stated a reset may come: resets are whole seconds,
/// rounded up.
const RESET_ROUNDING_MS: i64 = 1000;

/// `a × b / c` without overflow, saturating, for non-negative inputs.
fn mul_div(a: i64, b: i64, c: i64) -> i64 {
    let v = i128::from(a.max(0)) * i128::from(b) / i128::from(c.max(1));
    i64::try_from(v).unwrap_or(i64::MAX)
}

/// One worker's latest statement, with the start of its streak.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
struct Claim {
    statement: Statement,
    /// When its current streak of live statements began: an uncorroborated
    /// claim lowers the pace for at most the cap from here, however often
    /// it is repeated.
    since_ms: i64,
}

/// How the weighing rules stand for this route, from the policy and the
/// route's active workers at the latest report.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Weighing {
    /// Distinct workers needed to corroborate a pace.
    pub needed: i64,
    /// How long one worker's uncorroborated statement may lower the pace,
    /// from the start of its streak.
    pub cap_ms: i64,
    /// Distinct owners (caller tokens) among the workers that corroborate
    /// a pace: two where several tokens share the caller scope, so one
    /// token's workers, however many ids it invents, cannot set the others'
    /// pace ([`crate::hints::corroboration::Rules::min_owners`]).
    pub min_owners: i64,
}

/// Whether and how statements pace the route now.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[repr(u8)]
pub enum InForce {
    /// No statement, or none live: learned pacing paces.
    #[default]
    None = 0,
    /// Enough workers agree: the fleet is paced at the stated pace.
    Corroborated = 1,
    /// Too few workers: the stated pace may only lower the learned target.
    Uncorroborated = 2,
    /// Statements were received, none live now.
    Expired = 3,
}

impl InForce {
    /// The wire/label name.
    pub fn as_str(self) -> &'static str {
        match self {
            InForce::None => "none",
            InForce::Corroborated => "corroborated",
            InForce::Uncorroborated => "uncorroborated",
            InForce::Expired => "expired",
        }
    }
}

/// The stated pace in force, and the statement it came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct StatedView {
    /// Whether and how statements pace the route.
    pub in_force: InForce,
    /// The fleet's pace, milli-attempts per second, margin applied; 0 when
    /// none is in force.
    pub pace_m: i64,
    /// The binding statement's quota, window (ms) and remaining.
    pub quota: i64,
    /// See `quota`.
    pub window_ms: i64,
    /// See `quota`.
    pub remaining: i64,
    /// When its quota resets, coordinator clock; 0 when not stated.
    pub reset_at_ms: i64,
    /// Distinct workers with a live usable statement.
    pub workers: i64,
    /// Distinct workers needed.
    pub needed: i64,
    /// Corroborated, and the workers agree: the `needed`-th highest live
    /// pace is within the margin of the one in force. While they disagree
    /// (a quota changing, heard by some workers and not yet by others)
    /// each statement may move the pace, so none should wait.
    pub agreed: bool,
}

/// A route's statements: each worker's latest claim and the recent
/// statements as evidence.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct StatedState {
    claims: Vec<Claim>,
    recent: VecDeque<Statement>,
    weighing: Weighing,
    /// How statements weighed at the last settle: the mode an operator
    /// sees between two.
    in_force: InForce,
    /// The policy's margin at the last settle, for views between two.
    margin_permille: i64,
}

/// The claim whose pace corroborates: the `needed`-th lowest live pace,
/// once the claims at or below it come from `min_owners` owners at least
/// (the lowest pace that many distinct workers, of that many tokens, each
/// allow). `None` when the live claims cannot corroborate.
fn corroborating<'a>(live: &mut [&'a Claim], needed: i64, min_owners: i64) -> Option<&'a Claim> {
    let needed = usize::try_from(needed).ok()?.max(1);
    if live.len() < needed {
        return None;
    }
    if min_owners <= 1 {
        // Without sorting a large fleet's claims on every decision.
        let (_, nth, _) = live.select_nth_unstable_by_key(needed - 1, |c| c.statement.pace_m);
        return Some(*nth);
    }
    live.sort_unstable_by_key(|c| c.statement.pace_m);
    let mut owners: Vec<&str> = Vec::new();
    for (i, c) in live.iter().enumerate() {
        let who = crate::scope::owner_of(&c.statement.worker);
        if !owners.contains(&who) {
            owners.push(who);
        }
        if i + 1 >= needed && owners.len() as i64 >= min_owners {
            return Some(*c);
        }
    }
    None
}

/// Whether the live claims agree with `chosen`, the corroborated one: the
/// `needed`-th highest of their paces is within `margin_permille` of its
/// pace. The `needed`-th highest, as the pace is the `needed`-th lowest:
/// fewer than `needed` liars can make the claims seem to disagree no more
/// than they can move the pace.
fn agreed(live: &mut [&Claim], needed: i64, chosen: &Claim, margin_permille: i64) -> bool {
    let Ok(needed) = usize::try_from(needed.max(1)) else {
        return false;
    };
    let Some(k) = live.len().checked_sub(needed) else {
        return false;
    };
    let (_, high, _) = live.select_nth_unstable_by_key(k, |c| c.statement.pace_m);
    let pace = chosen.statement.pace_m.unwrap_or(0);
    let high = high.statement.pace_m.unwrap_or(0);
    high <= pace.saturating_add(mul_div(pace, margin_permille.clamp(0, MILLI), MILLI))
}

impl StatedState {
    /// Takes in one worker's statement under the rules in force.
    pub fn record(&mut self, statement: Statement, weighing: Weighing, now_ms: i64) {
        self.weighing = weighing;
        self.recent.push_back(statement.clone());
        while self.recent.len() > RECENT_STATEMENTS {
            self.recent.pop_front();
        }
        let at = self
            .claims
            .iter()
            .position(|c| c.statement.worker == statement.worker);
        let since_ms = match at.map(|i| &self.claims[i]) {
            Some(c) if c.statement.pace_m.is_some() && c.statement.live(now_ms) => c.since_ms,
            _ => statement.received_ms,
        };
        let claim = Claim {
            statement: Statement {
                // The claim needs no raw text: `recent` keeps it.
                raw: String::new(),
                ..statement
            },
            since_ms,
        };
        match at {
            Some(i) => self.claims[i] = claim,
            None => {
                if self.claims.len() >= MAX_STATEMENT_WORKERS {
                    // The worker heard from longest ago is forgotten first.
                    if let Some(oldest) =
                        (0..self.claims.len()).min_by_key(|&i| self.claims[i].statement.received_ms)
                    {
                        self.claims.swap_remove(oldest);
                    }
                }
                self.claims.push(claim);
            }
        }
    }

    /// How statements weighed when the target was last computed.
    pub fn in_force(&self) -> InForce {
        self.in_force
    }

    /// The statements kept as evidence, oldest first.
    pub fn recent(&self) -> impl Iterator<Item = &Statement> {
        self.recent.iter()
    }

    /// The target at `now_ms` given the learned one, and how statements
    /// weigh in it: the corroborated pace replaces it; an uncorroborated
    /// one may only lower it. `margin_permille` of the stated pace is left
    /// unspent.
    pub fn target(
        &mut self,
        learned_m: i64,
        margin_permille: i64,
        now_ms: i64,
    ) -> (i64, StatedView) {
        self.margin_permille = margin_permille;
        let view = self.view(margin_permille, now_ms);
        self.in_force = view.in_force;
        let target = match view.in_force {
            InForce::Corroborated => view.pace_m,
            InForce::Uncorroborated => learned_m.min(view.pace_m),
            InForce::None | InForce::Expired => learned_m,
        };
        (target, view)
    }

    /// What an operator sees at `now_ms`, under the margin of the last
    /// settle.
    pub fn view_now(&self, now_ms: i64) -> StatedView {
        self.view(self.margin_permille, now_ms)
    }

    /// What an operator sees at `now_ms` under `margin_permille`.
    pub fn view(&self, margin_permille: i64, now_ms: i64) -> StatedView {
        let mut live: Vec<&Claim> = self
            .claims
            .iter()
            .filter(|c| c.statement.pace_m.is_some() && c.statement.live(now_ms))
            .collect();
        let needed = self.weighing.needed.max(1);
        let workers = live.len() as i64;
        // The claims of the last window decide alone when there are at
        // least 2 x needed - 1 of them: then fewer than `needed` liars are
        // fewer than the honest ones among them, and the `needed`-th
        // lowest still lies among honest paces. Otherwise a change the
        // upstream stated (a quota back after a brownout) binds only once
        // the older claims of workers that sent nothing since expire.
        let mut recent: Vec<&Claim> = live
            .iter()
            .copied()
            .filter(|c| c.statement.received_ms > now_ms - WINDOW_MS)
            .collect();
        let decisive = recent.len() as i64 >= 2 * needed - 1;
        let fresh = if decisive {
            corroborating(&mut recent, needed, self.weighing.min_owners)
        } else {
            None
        };
        let chosen =
            match fresh.or_else(|| corroborating(&mut live, needed, self.weighing.min_owners)) {
                Some(c) => Some((InForce::Corroborated, c)),
                // Only the claims still within the cap of their streak's start
                // may slow the fleet; the lowest of them does.
                None => live
                    .iter()
                    .filter(|c| c.since_ms.saturating_add(self.weighing.cap_ms) > now_ms)
                    .min_by_key(|c| c.statement.pace_m)
                    .map(|c| (InForce::Uncorroborated, *c)),
            };
        let keep = MILLI - margin_permille.clamp(0, MILLI);
        let agreed = match chosen {
            Some((InForce::Corroborated, c)) => agreed(&mut live, needed, c, margin_permille),
            _ => false,
        };
        match chosen {
            Some((in_force, c)) => {
                let s = &c.statement;
                StatedView {
                    in_force,
                    agreed,
                    pace_m: mul_div(s.pace_m.unwrap_or(0), keep, MILLI),
                    quota: s.quota,
                    window_ms: s.window_ms,
                    remaining: s.remaining,
                    reset_at_ms: if s.reset_ms > 0 {
                        s.received_ms.saturating_add(s.reset_ms)
                    } else {
                        0
                    },
                    workers,
                    needed,
                }
            }
            None => StatedView {
                in_force: if self.claims.is_empty() {
                    InForce::None
                } else {
                    InForce::Expired
                },
                workers,
                needed,
                ..StatedView::default()
            },
        }
    }

    /// Writes the state in [`crate::pacing`]'s encoding.
    pub(super) fn write(&self, w: &mut Writer) {
        w.int(self.weighing.needed)
            .int(self.weighing.cap_ms)
            .int(self.weighing.min_owners)
            .int(self.in_force as i64)
            .int(self.margin_permille);
        w.int(self.claims.len() as i64);
        for c in &self.claims {
            write_statement(w, &c.statement);
            w.int(c.since_ms);
        }
        w.int(self.recent.len() as i64);
        for s in &self.recent {
            write_statement(w, s);
        }
    }

    /// Reads what [`write`](Self::write) wrote.
    pub(super) fn read(r: &mut Reader<'_>, what: &'static str) -> Result<Self, DecodeError> {
        let mut st = StatedState {
            weighing: Weighing {
                needed: r.int()?,
                cap_ms: r.int()?,
                min_owners: r.int()?,
            },
            in_force: match r.int()? {
                0 => InForce::None,
                1 => InForce::Corroborated,
                2 => InForce::Uncorroborated,
                3 => InForce::Expired,
                _ => return Err(DecodeError::Malformed { what }),
            },
            margin_permille: r.int()?,
            ..StatedState::default()
        };
        let claims: usize = r.small()?;
        if claims > MAX_STATEMENT_WORKERS {
            return Err(DecodeError::Malformed { what });
        }
        for _ in 0..claims {
            let statement = read_statement(r, what)?;
            let since_ms = r.int()?;
            st.claims.push(Claim {
                statement,
                since_ms,
            });
        }
        let recent: usize = r.small()?;
        if recent > RECENT_STATEMENTS {
            return Err(DecodeError::Malformed { what });
        }
        for _ in 0..recent {
            st.recent.push_back(read_statement(r, what)?);
        }
        Ok(st)
    }
}

fn write_statement(w: &mut Writer, s: &Statement) {
    w.text(&s.worker)
        .int(s.received_ms)
        .int(s.verdict as i64)
        .text(&s.raw)
        .int(s.quota)
        .int(s.window_ms)
        .int(s.remaining)
        .int(s.reset_ms)
        .opt_int(s.pace_m);
}

fn read_statement(r: &mut Reader<'_>, what: &'static str) -> Result<Statement, DecodeError> {
    Ok(Statement {
        worker: r.text()?,
        received_ms: r.int()?,
        verdict: StatedVerdict::from_code(r.int()?).ok_or(DecodeError::Malformed { what })?,
        raw: r.text()?,
        quota: r.int()?,
        window_ms: r.int()?,
        remaining: r.int()?,
        reset_ms: r.int()?,
        pace_m: r.opt_int()?,
    })
}

#[cfg(test)]
mod tests;
