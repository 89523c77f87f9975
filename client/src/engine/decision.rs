//! What the engine is told (an [`Observation`]) and what it answers
//! ([`Decision`], [`WakeDecision`], [`AttemptStart`]), its phases and errors.

use std::time::{Duration, SystemTime};

use thiserror::Error;

use crate::classify::{
    Classification, GrpcCode, Sent, TransportFailure, classify_grpc, classify_http,
    classify_transport,
};
use crate::hint::{HintReading, HintRules, read_pushback_ms, read_retry_after};
use crate::outcome::{Outcome, ResponseStatus};
use crate::ratelimit::StatedField;

/// One response or transport outcome, as the driver saw it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Observation {
    /// The status, which also says how to read `hint`.
    pub status: ResponseStatus,
    /// What the status means for retrying.
    pub classification: Classification,
    /// The raw hint header: `Retry-After` for HTTP, `grpc-retry-pushback-ms`
    /// for gRPC. Read by [`crate::hint`] at receipt, never here.
    pub hint: Option<String>,
    /// The limit the response stated (`RateLimit`, `X-RateLimit-*`), raw, on
    /// any status: evidence the worker reports for the fleet's pacing. No
    /// step of the decision order reads it.
    pub stated: Vec<StatedField>,
}

impl Observation {
    /// An HTTP response, classified by [`classify_http`].
    pub fn http(status: u16, retry_after: Option<&str>) -> Self {
        Observation {
            status: ResponseStatus::Http(status),
            classification: classify_http(status),
            hint: retry_after.map(str::to_owned),
            stated: Vec::new(),
        }
    }

    /// A gRPC status, classified by [`classify_grpc`].
    pub fn grpc(code: GrpcCode, sent: Sent, pushback_ms: Option<&str>) -> Self {
        Observation {
            status: ResponseStatus::Grpc(code),
            classification: classify_grpc(code, sent),
            hint: pushback_ms.map(str::to_owned),
            stated: Vec::new(),
        }
    }

    /// A transport failure, classified by [`classify_transport`].
    pub fn transport(failure: TransportFailure) -> Self {
        Observation {
            status: ResponseStatus::Transport(failure),
            classification: classify_transport(failure),
            hint: None,
            stated: Vec::new(),
        }
    }

    /// The same observation with the limit the response stated
    /// ([`crate::ratelimit::stated_fields`]).
    pub fn with_stated(self, stated: Vec<StatedField>) -> Self {
        Observation { stated, ..self }
    }

    /// The same observation under another classification (an operator's
    /// explicit retry list, for example).
    pub fn classified_as(self, classification: Classification) -> Self {
        Observation {
            classification,
            ..self
        }
    }

    pub(super) fn read_hint(&self, receipt_wall: SystemTime, rules: HintRules) -> HintReading {
        let raw = self.hint.as_deref();
        match self.status {
            ResponseStatus::Http(_) => read_retry_after(raw, receipt_wall, rules),
            ResponseStatus::Grpc(_) => read_pushback_ms(raw, rules),
            ResponseStatus::Transport(_) => HintReading::absent(),
        }
    }
}

/// What to do after a response.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Decision {
    /// Wait until at least `next_start`, then reconsider. Nothing is reserved.
    Wait {
        /// The earliest reconsideration time.
        next_start: Duration,
        /// `next_start - receipt`.
        wait: Duration,
    },
    /// The intent ended.
    Stop(Outcome),
}

/// What the driver knows at wake-up that the engine cannot.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct WakeCheck {
    /// The owner withdrew the intent.
    pub cancelled: bool,
}

/// What to do at reconsideration time.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WakeDecision {
    /// Every engine gate passes now: call [`Intent::start_attempt`](super::Intent::start_attempt) with the
    /// same `now`.
    Start,
    /// The intent ended.
    Stop(Outcome),
}

/// The gate's reasons to end an intent that the engine cannot see.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GateRefusal {
    /// The coordinator granted no retry token.
    BudgetExhausted,
    /// Local queue or concurrency is full at reconsideration time.
    CapacityUnavailable,
    /// Another layer turned out to own retries.
    OwnerElsewhere,
}

impl From<GateRefusal> for Outcome {
    fn from(refusal: GateRefusal) -> Outcome {
        match refusal {
            GateRefusal::BudgetExhausted => Outcome::BudgetExhausted,
            GateRefusal::CapacityUnavailable => Outcome::CapacityUnavailable,
            GateRefusal::OwnerElsewhere => Outcome::OwnerElsewhere,
        }
    }
}

/// A started attempt.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AttemptStart {
    /// 1 for the first attempt.
    pub number: u32,
    /// When it started.
    pub at: Duration,
    /// `at + attempt_cap`: the driver must give up on the attempt by then
    /// (the reserve the deadline gate counted on).
    pub must_end_by: Duration,
}

/// Where an intent is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Phase {
    /// Created; the first attempt has not started.
    Fresh,
    /// An attempt is in flight.
    InFlight {
        /// When it started.
        start: Duration,
    },
    /// Waiting to reconsider; nothing is reserved.
    Waiting {
        /// When the wait began (the receipt).
        since: Duration,
        /// The earliest reconsideration time.
        next_start: Duration,
    },
    /// Every engine gate passed at `at`; the attempt must start then.
    Admitted {
        /// The instant of admission.
        at: Duration,
    },
    /// Over.
    Ended {
        /// Why.
        outcome: Outcome,
        /// When.
        at: Duration,
    },
}

/// A driver called the engine out of order. These are programming errors in
/// the driver, reported rather than panicked on.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum EngineError {
    /// The call does not apply in the current phase.
    #[error("{call} is not valid in phase {phase:?}")]
    WrongPhase {
        /// The call made.
        call: &'static str,
        /// The phase the intent was in.
        phase: Phase,
    },
    /// The elapsed clock went backwards.
    #[error("time went backwards: {now:?} after {previous:?}")]
    TimeWentBack {
        /// The time passed.
        now: Duration,
        /// The latest time seen before.
        previous: Duration,
    },
    /// A wake before the earliest reconsideration time would wait less than
    /// the hint or the floor.
    #[error("woke at {now:?}, before next_start {next_start:?}")]
    EarlyWake {
        /// The wake time.
        now: Duration,
        /// The earliest reconsideration time.
        next_start: Duration,
    },
    /// Time passed between admission and start, so the admission is stale.
    #[error("admitted at {admitted_at:?} but started at {now:?}; call on_wake again")]
    StaleAdmission {
        /// When the gates passed.
        admitted_at: Duration,
        /// When the start was attempted.
        now: Duration,
    },
    /// An attempt started at `now` could not finish inside the budget.
    #[error("an attempt starting at {now:?} cannot finish inside the budget")]
    WouldMissDeadline {
        /// The attempted start.
        now: Duration,
    },
    /// A response arrived after the attempt's cap: the driver must bound
    /// every attempt by its reserve.
    #[error("response at {receipt:?} overran the attempt started at {start:?} (cap {cap:?})")]
    AttemptOverran {
        /// The attempt's start.
        start: Duration,
        /// The response's receipt.
        receipt: Duration,
        /// The per-attempt cap.
        cap: Duration,
    },
    /// A deferral may only move the next start later.
    #[error("cannot defer to {until:?}, before next_start {next_start:?}")]
    DeferEarlier {
        /// The requested time.
        until: Duration,
        /// The current earliest reconsideration time.
        next_start: Duration,
    },
}
