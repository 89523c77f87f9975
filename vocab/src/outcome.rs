//! Outcomes: the terminal outcome of an intent, and one record per attempt.
//!
//! Records hold what happened and why the engine decided as it did —
//! statuses, raw hints and how they were read, times, waits, the decision —
//! and never a request or response payload, so they are safe to log and to
//! ship to the coordinator.

use std::time::Duration;

use serde::Serialize;

use crate::classify::{Classification, GrpcCode, TransportFailure};
use crate::hint::HintReading;

/// The terminal reason of an intent (DESIGN.md's outcome vocabulary).
///
/// The last response is always reported beside the outcome, never folded
/// into it: `deadline_infeasible` after a 429 and after a 503 are the same
/// outcome with different evidence.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Outcome {
    /// Authoritative completion evidence arrived.
    Succeeded,
    /// The owner withdrew the intent; no delayed attempt may revive it.
    Cancelled,
    /// The next attempt, with its full reserve, cannot finish inside the
    /// end-to-end budget.
    DeadlineInfeasible,
    /// Every allowed attempt was made.
    AttemptCap,
    /// No retry token was available (the gate's coordinator lease).
    BudgetExhausted,
    /// The response says a repeat will not help.
    NonRetryable,
    /// The server sent a date and the local clock may not convert it.
    ClockUntrusted,
    /// The server asked for a longer wait than policy allows; the wait is
    /// never silently shortened.
    HintExceedsCap,
    /// No local queue or concurrency capacity at reconsideration time.
    CapacityUnavailable,
    /// Another layer owns retries for this request; evidence is propagated.
    OwnerElsewhere,
    /// The last attempt's effect is unknown; look it up before replaying.
    ReconciliationRequired,
    /// The last attempt's effect is unknown and can be neither looked up nor
    /// safely repeated.
    Indeterminate,
}

impl Outcome {
    /// The snake_case name used in JSON, spans and metrics.
    pub fn as_str(self) -> &'static str {
        match self {
            Outcome::Succeeded => "succeeded",
            Outcome::Cancelled => "cancelled",
            Outcome::DeadlineInfeasible => "deadline_infeasible",
            Outcome::AttemptCap => "attempt_cap",
            Outcome::BudgetExhausted => "budget_exhausted",
            Outcome::NonRetryable => "non_retryable",
            Outcome::ClockUntrusted => "clock_untrusted",
            Outcome::HintExceedsCap => "hint_exceeds_cap",
            Outcome::CapacityUnavailable => "capacity_unavailable",
            Outcome::OwnerElsewhere => "owner_elsewhere",
            Outcome::ReconciliationRequired => "reconciliation_required",
            Outcome::Indeterminate => "indeterminate",
        }
    }

    /// What a person is told, as the first sentence of a message.
    pub fn describe(self) -> &'static str {
        match self {
            Outcome::Succeeded => "Succeeded",
            Outcome::Cancelled => "Cancelled by its owner",
            Outcome::DeadlineInfeasible => "Stopped: retry budget cannot fit another request",
            Outcome::AttemptCap => "Stopped: every allowed attempt was made",
            Outcome::BudgetExhausted => "Stopped: no retry token is available",
            Outcome::NonRetryable => "Stopped: the response is not one to retry",
            Outcome::ClockUntrusted => {
                "Stopped: the service sent a date and the local clock is not trusted to convert it"
            }
            Outcome::HintExceedsCap => {
                "Stopped: the service asked for a longer wait than policy allows"
            }
            Outcome::CapacityUnavailable => "Stopped: no local capacity for another attempt",
            Outcome::OwnerElsewhere => "Stopped: another layer owns retries for this request",
            Outcome::ReconciliationRequired => {
                "Stopped: the last attempt may have taken effect; reconcile before replaying"
            }
            Outcome::Indeterminate => {
                "Stopped: the last attempt may have taken effect and cannot be checked or repeated"
            }
        }
    }
}

impl std::fmt::Display for Outcome {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The status a response carried, in the protocol it came in.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ResponseStatus {
    /// An HTTP status code.
    Http(u16),
    /// A gRPC status code.
    Grpc(GrpcCode),
    /// No status: the transport failed.
    Transport(TransportFailure),
}

/// What the engine decided for one attempt.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RecordDecision {
    /// Wait, then reconsider.
    Wait,
    /// The intent ended at this attempt.
    Stop(Outcome),
}

impl RecordDecision {
    /// `wait` or the outcome's name.
    pub fn as_str(self) -> &'static str {
        match self {
            RecordDecision::Wait => "wait",
            RecordDecision::Stop(outcome) => outcome.as_str(),
        }
    }
}

/// The evidence of one attempt. Times are elapsed since the intent's first
/// start; `None` means the step did not happen (yet).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AttemptRecord {
    /// Binds every attempt to the one semantic operation it repeats.
    pub intent_id: String,
    /// Unique per attempt (`{intent_id}#{number}`), so an upstream's logs can
    /// tell a retry from a duplicate.
    pub attempt_id: String,
    /// 1 for the first attempt.
    pub number: u32,
    /// When the attempt started.
    pub start: Duration,
    /// When its response arrived; `None` while in flight or if cancelled.
    pub receipt: Option<Duration>,
    /// The status received.
    pub status: Option<ResponseStatus>,
    /// How the response was classified.
    pub classification: Option<Classification>,
    /// The server's hint as received and read; `None` when the response was
    /// not one to retry, so no hint was consulted.
    pub hint: Option<HintReading>,
    /// The wait chosen (hint or backoff, floored); also recorded when the
    /// wait could not fit the deadline, as the infeasibility calculation.
    pub wait: Option<Duration>,
    /// `receipt + wait`: the earliest reconsideration time, not a promise.
    pub next_start: Option<Duration>,
    /// Budget left at receipt.
    pub remaining: Option<Duration>,
    /// When the scheduler actually woke for the next attempt (later than
    /// `next_start` when it woke late).
    pub woke: Option<Duration>,
    /// The decision taken at receipt (or at cancellation while in flight).
    pub decision: Option<RecordDecision>,
    /// The intent was cancelled while this attempt was in flight, so its
    /// response, if any, is not evidence for this intent.
    pub response_discarded: bool,
}

impl AttemptRecord {
    /// The record of attempt `number` of `intent_id`, started `start` after
    /// the intent's first start; the engine fills in the rest as it learns it.
    pub fn started(intent_id: &str, number: u32, start: Duration) -> Self {
        AttemptRecord {
            intent_id: intent_id.to_owned(),
            attempt_id: format!("{intent_id}#{number}"),
            number,
            start,
            receipt: None,
            status: None,
            classification: None,
            hint: None,
            wait: None,
            next_start: None,
            remaining: None,
            woke: None,
            decision: None,
            response_discarded: false,
        }
    }
}

/// What a shadow policy let through: what enforcing would have done, as
/// the coordinator answers it and as the gate records its own holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Shadowed {
    /// Enforcing would have refused: fewer tokens than wanted (budget or
    /// fair share), or no slot that fits the deadline.
    WouldRefuse,
    /// Enforcing would have started later: a later slot, the scope's
    /// cooldown, a held first attempt.
    WouldDelay,
}

impl Shadowed {
    /// The label in metrics and spans.
    pub fn as_str(self) -> &'static str {
        match self {
            Shadowed::WouldRefuse => "would_refuse",
            Shadowed::WouldDelay => "would_delay",
        }
    }

    /// As an answer carries it; `Unspecified` when nothing was shadowed.
    pub fn wire(shadowed: Option<Shadowed>) -> tollgate_proto::v1::ShadowDecision {
        use tollgate_proto::v1::ShadowDecision;
        match shadowed {
            None => ShadowDecision::Unspecified,
            Some(Shadowed::WouldRefuse) => ShadowDecision::WouldRefuse,
            Some(Shadowed::WouldDelay) => ShadowDecision::WouldDelay,
        }
    }

    /// From a coordinator's answer; `None` when nothing was shadowed.
    pub fn from_wire(decision: i32) -> Option<Shadowed> {
        use tollgate_proto::v1::ShadowDecision;
        match ShadowDecision::try_from(decision) {
            Ok(ShadowDecision::WouldRefuse) => Some(Shadowed::WouldRefuse),
            Ok(ShadowDecision::WouldDelay) => Some(Shadowed::WouldDelay),
            Ok(ShadowDecision::Unspecified) | Err(_) => None,
        }
    }
}
