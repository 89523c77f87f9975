//! What an intent is and the rules it runs under: its repetition kind, retry
//! owner and validated [`IntentPolicy`].

use std::time::{Duration, SystemTime};

use thiserror::Error;

use crate::backoff::Backoff;

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

/// The rules an intent is decided under. Built by [`IntentPolicy::try_new`], so an
/// engine never runs under a policy that cannot admit even one attempt.
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
    /// Validates and builds a policy.
    ///
    /// - `total_budget`: end-to-end, from the first start.
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
