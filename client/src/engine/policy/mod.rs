//! What an intent is and the rules it runs under: its repetition kind, retry
//! owner and validated [`IntentPolicy`], built from a deadline and a default
//! for every other rule, each named with the reason for its value.

use std::time::{Duration, SystemTime};

use thiserror::Error;

use crate::backoff::{Backoff, Jitter};

/// Whether, and how, an operation may be sent more than once.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum RepetitionKind {
    /// Repeating is harmless by nature (a read, a PUT of the same value).
    Safe,
    /// The upstream deduplicates by an idempotency key sent with every attempt.
    IdempotencyKey,
    /// Not safe to repeat blindly, but an authoritative lookup can tell
    /// whether an attempt took effect.
    Reconcilable,
    /// Neither safe to repeat nor checkable.
    NonRepeatable,
}

impl RepetitionKind {
    /// Whether an attempt whose effect is unknown may simply be sent again.
    pub fn is_repeat_safe(self) -> bool {
        matches!(self, RepetitionKind::Safe | RepetitionKind::IdempotencyKey)
    }
}

/// Which layer repeats this intent. Exactly one may, or retries multiply
/// through the stack.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RetryOwner {
    /// This engine's driver repeats attempts.
    Here,
    /// A layer above owns retries: this one propagates the evidence instead.
    Elsewhere,
}

/// The fixed facts of one intent.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IntentSpec {
    /// The stable identity every attempt is bound to.
    pub intent_id: String,
    /// Decides what an unknown effect allows.
    pub repetition: RepetitionKind,
    /// Decides whether this layer may retry at all.
    pub retry_owner: RetryOwner,
    /// Wall time at elapsed zero; receipt wall time is this plus elapsed time,
    /// so an HTTP-date hint is converted against the receipt, once.
    pub wall_at_start: SystemTime,
    /// Whether the wall clock may convert an HTTP-date. An untrusted clock
    /// makes a date hint `clock_untrusted` instead of a guess.
    pub clock_trusted: bool,
}

/// Why a [`IntentPolicy`] was refused.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum PolicyError {
    /// A deadline already over admits nothing; checked first, so a zero
    /// deadline is not reported as the zero attempt reserve derived from it.
    #[error("total_budget (the deadline) must be greater than zero")]
    ZeroBudget,
    /// At least the first attempt must be allowed.
    #[error("max_attempts must be at least 1")]
    NoAttempts,
    /// A zero cap would reserve nothing and bound nothing.
    #[error("attempt_cap must be greater than zero")]
    ZeroAttemptCap,
    /// Not even the first attempt could be reserved inside the budget.
    #[error("attempt_cap ({cap:?}) exceeds total_budget ({budget:?})")]
    CapExceedsBudget {
        /// The per-attempt cap.
        cap: Duration,
        /// The end-to-end budget.
        budget: Duration,
    },
}

/// Attempts in all, the first included, when the builder is not told
/// otherwise: the first attempt and two retries. Three is the AWS SDKs'
/// standard retry mode too; a third retry into the same overloaded upstream
/// rarely succeeds where two failed, and what bounds a retry storm is the
/// fleet's budget, not each intent's count.
pub const DEFAULT_MAX_ATTEMPTS: u32 = 3;

/// The policy's floor on every wait, by default: none of its own. The gate
/// already holds every wait to at least
/// [`GateConfig::min_wait`](crate::gate::GateConfig::min_wait), so a retry
/// never follows its refusal at once; a policy floor is for an upstream
/// known to need longer.
pub const DEFAULT_MIN_WAIT: Duration = Duration::ZERO;

/// The local backoff by default, the wait when a response has no usable
/// hint: up to 500 ms after the first attempt, doubling to 30 s, fully
/// jittered. These are the steps of the coordinator's built-in scope
/// backoff (`backoff_base = "500ms"`, `backoff_max = "30s"`; the ceiling
/// after `n` attempts is `base · 2ⁿ`, hence a base of half the first step),
/// so a worker backs off as its coordinator widens a scope that gets
/// hintless refusals, also when it cannot reach it. Full jitter because a
/// fleet that failed together and backs off without it retries together,
/// most of all when no coordinator slot spreads it.
pub const DEFAULT_BACKOFF: Backoff = Backoff {
    base: Duration::from_millis(250),
    cap: Duration::from_secs(30),
    jitter: Jitter::Full,
};

/// The longest valid hint an intent waits out, by default: the
/// coordinator's built-in `max_hint`, so a worker does not wait longer for
/// one hint than its coordinator holds the fleet's cooldown for it. A
/// longer hint ends the intent `hint_exceeds_cap`; a shorter one that
/// leaves no room for the next attempt before the deadline ends it
/// `deadline_infeasible`.
pub const DEFAULT_MAX_HINT: Duration = Duration::from_secs(300);

/// The rules an intent is decided under. Built by [`IntentPolicy::builder`]
/// (or [`IntentPolicy::try_new`], which takes every field), so an engine
/// never runs under a policy that cannot admit even one attempt.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IntentPolicy {
    total_budget: Duration,
    max_attempts: u32,
    attempt_cap: Duration,
    min_wait: Duration,
    backoff: Backoff,
    max_hint: Option<Duration>,
}

impl IntentPolicy {
    /// Starts a policy whose intents end by `deadline`, end to end from the
    /// first start; everything else has a default until set (see
    /// [`IntentPolicyBuilder`]).
    ///
    /// ```
    /// use std::time::Duration;
    /// use tollgate_client::IntentPolicy;
    ///
    /// let policy = IntentPolicy::builder(Duration::from_secs(30))
    ///     .max_attempts(4)
    ///     .max_hint(Duration::from_secs(60))
    ///     .build()?;
    /// assert_eq!(policy.attempt_cap(), Duration::from_millis(7_500));
    /// # Ok::<(), tollgate_client::PolicyError>(())
    /// ```
    pub fn builder(deadline: Duration) -> IntentPolicyBuilder {
        IntentPolicyBuilder {
            deadline,
            max_attempts: DEFAULT_MAX_ATTEMPTS,
            attempt_cap: None,
            min_wait: DEFAULT_MIN_WAIT,
            backoff: DEFAULT_BACKOFF,
            max_hint: Some(DEFAULT_MAX_HINT),
        }
    }

    /// Validates and builds a policy from every field; the one validation
    /// [`IntentPolicyBuilder::build`] runs too.
    ///
    /// - `total_budget`: end-to-end, from the first start (the deadline).
    /// - `max_attempts`: attempts in all, the first included.
    /// - `attempt_cap`: per attempt, reserved in full before every start.
    /// - `min_wait`: a floor on every wait, hinted or not.
    /// - `backoff`: the wait when the hint is absent or invalid.
    /// - `max_hint`: a longer valid hint stops the intent.
    pub fn try_new(
        total_budget: Duration,
        max_attempts: u32,
        attempt_cap: Duration,
        min_wait: Duration,
        backoff: Backoff,
        max_hint: Option<Duration>,
    ) -> Result<IntentPolicy, PolicyError> {
        if total_budget.is_zero() {
            return Err(PolicyError::ZeroBudget);
        }
        if max_attempts == 0 {
            return Err(PolicyError::NoAttempts);
        }
        if attempt_cap.is_zero() {
            return Err(PolicyError::ZeroAttemptCap);
        }
        if attempt_cap > total_budget {
            return Err(PolicyError::CapExceedsBudget {
                cap: attempt_cap,
                budget: total_budget,
            });
        }
        Ok(IntentPolicy {
            total_budget,
            max_attempts,
            attempt_cap,
            min_wait,
            backoff,
            max_hint,
        })
    }

    /// The end-to-end budget.
    pub fn total_budget(&self) -> Duration {
        self.total_budget
    }
    /// Attempts in all, the first included.
    pub fn max_attempts(&self) -> u32 {
        self.max_attempts
    }
    /// The per-attempt cap.
    pub fn attempt_cap(&self) -> Duration {
        self.attempt_cap
    }
    /// The floor on every wait.
    pub fn min_wait(&self) -> Duration {
        self.min_wait
    }
    /// The local backoff.
    pub fn backoff(&self) -> Backoff {
        self.backoff
    }
    /// The longest valid hint honoured.
    pub fn max_hint(&self) -> Option<Duration> {
        self.max_hint
    }
}

/// An [`IntentPolicy`] in the making: the deadline, and a default for every
/// other rule until it is set.
///
/// | rule | default |
/// |---|---|
/// | [`max_attempts`](Self::max_attempts) | [`DEFAULT_MAX_ATTEMPTS`] (3) |
/// | [`attempt_cap`](Self::attempt_cap) | the deadline's even share per attempt: `deadline / max_attempts` |
/// | [`min_wait`](Self::min_wait) | [`DEFAULT_MIN_WAIT`] (none beyond the gate's own floor) |
/// | [`backoff`](Self::backoff) | [`DEFAULT_BACKOFF`] (≤ 500 ms, doubling to 30 s, full jitter) |
/// | [`max_hint`](Self::max_hint) | [`DEFAULT_MAX_HINT`] (300 s) |
///
/// The attempt reserve's default is a rule, not a constant, because it must
/// follow the deadline: an even share is the largest reserve under which
/// every allowed attempt fits before the deadline when each runs its whole
/// reserve back to back, and it never exceeds a short deadline. Waits
/// between attempts come out of the same deadline, so an intent whose early
/// attempts ran to their reserve ends `deadline_infeasible` before its last.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[must_use = "a builder makes no policy until `build` is called"]
pub struct IntentPolicyBuilder {
    deadline: Duration,
    max_attempts: u32,
    /// `None` until set, so the default follows the attempt count whichever
    /// order the two are set in.
    attempt_cap: Option<Duration>,
    min_wait: Duration,
    backoff: Backoff,
    max_hint: Option<Duration>,
}

impl IntentPolicyBuilder {
    /// Attempts in all, the first included (at least 1).
    pub fn max_attempts(mut self, attempts: u32) -> Self {
        self.max_attempts = attempts;
        self
    }

    /// The attempt reserve: how long one attempt may take, reserved in full
    /// before every start (greater than zero, at most the deadline). An
    /// attempt that cannot fit its reserve before the deadline is not
    /// started.
    pub fn attempt_cap(mut self, reserve: Duration) -> Self {
        self.attempt_cap = Some(reserve);
        self
    }

    /// A floor on every wait, hinted or not.
    pub fn min_wait(mut self, floor: Duration) -> Self {
        self.min_wait = floor;
        self
    }

    /// The wait when a response carries no usable hint.
    pub fn backoff(mut self, backoff: Backoff) -> Self {
        self.backoff = backoff;
        self
    }

    /// The longest valid hint waited out; a longer one ends the intent
    /// `hint_exceeds_cap`, never shortened. `None` leaves hints bounded by
    /// the deadline alone.
    pub fn max_hint(mut self, cap: impl Into<Option<Duration>>) -> Self {
        self.max_hint = cap.into();
        self
    }

    /// The policy, validated by [`IntentPolicy::try_new`]: the same errors
    /// for the same rules.
    pub fn build(self) -> Result<IntentPolicy, PolicyError> {
        // Zero attempts has no share; `try_new` refuses it before it looks
        // at the reserve.
        let even_share = || self.deadline.checked_div(self.max_attempts);
        let attempt_cap = self
            .attempt_cap
            .or_else(even_share)
            .unwrap_or(self.deadline);
        IntentPolicy::try_new(
            self.deadline,
            self.max_attempts,
            attempt_cap,
            self.min_wait,
            self.backoff,
            self.max_hint,
        )
    }
}

#[cfg(test)]
mod tests;
