//! The coordinator's wire protocol, spoken in one place: every `Lease`,
//! `Release`, `Report`, `Watch` and `Reconsider` request, every piece of
//! throttling `Evidence` and every stated limit the worker sends is built here, so the proto's
//! bounds and conventions (wall times as Unix milliseconds, text cut to the
//! proto's limits, the worker id left for the link to fill in) hold for all
//! of them.

use std::time::{Duration, SystemTime};

use tokio::time::Instant;

use tollgate_proto::v1::{
    Evidence, LeaseRequest, ReconsiderRequest, ReleaseRequest, ReportRequest, RetryClass,
    ScopeCertainty, StatedField, StatedLimit, WatchRequest,
};

use crate::clock::to_unix_ms;
use crate::engine::Observation;
use crate::hint::{MAX_RAW_HINT_BYTES, bounded_to};
use crate::outcome::ResponseStatus;
use crate::scope::Scope;
use crate::telemetry::TraceOrigin;

/// Evidence items kept per scope between two reports; the proto allows 64.
const MAX_EVIDENCE_PER_REPORT: usize = 64;
/// The proto's bound on `Evidence.pushback_ms`.
const MAX_PUSHBACK_BYTES: usize = 64;
/// The proto's bound on an intent id.
const MAX_INTENT_ID_BYTES: usize = 128;

// Every request leaves `worker_id` empty: `CoordinatorLink` stamps its own,
// so no caller can send under another worker's name.

/// Asks for `want` tokens of `class` for `scope`.
pub(crate) fn lease_request(scope: &Scope, want: u32, class: RetryClass) -> LeaseRequest {
    LeaseRequest {
        scope: Some(scope.to_wire()),
        worker_id: String::new(),
        want,
        retry_class: class as i32,
    }
}

/// Gives back a lease, saying how many of its tokens were spent and how many
/// of those retries succeeded (their tokens are refunded).
pub(crate) fn release_request(
    scope: &Scope,
    lease_id: String,
    spent: u32,
    retry_successes: u32,
) -> ReleaseRequest {
    ReleaseRequest {
        scope: Some(scope.to_wire()),
        worker_id: String::new(),
        lease_id,
        spent,
        // The proto refuses a refund above `spent`.
        retry_successes: retry_successes.min(spent),
    }
}

/// What a scope's next `Report` will carry: the lease cache batches into
/// it, and it lives here, beside the one function that sends it, so the
/// message and its bounds are in one file.
#[derive(Debug, Default)]
pub(crate) struct PendingReport {
    pub(crate) first_attempts: u32,
    pub(crate) successes: u32,
    /// Every refusal for capacity, counted even when `evidence` is full and
    /// keeps only the newest items: learned pacing judges the upstream's
    /// capacity from how many were refused, not from the sample.
    pub(crate) rejections: u32,
    pub(crate) evidence: Vec<Evidence>,
    /// The latest limit the upstream stated on the scope: one per report is
    /// enough, since the latest is what paces the fleet, so a busy scope
    /// sends one statement a report, not one per response.
    pub(crate) stated: Option<StatedLimit>,
    /// When the oldest count or evidence in it was made: a report held back
    /// while the coordinator was out of reach tells its age, so learned
    /// pacing does not read a backlog of counts as this second's traffic.
    pub(crate) since: Option<Instant>,
    /// The trace the report is sent under: the newest intent whose evidence
    /// it holds, else the first intent counted in it.
    pub(crate) origin: TraceOrigin,
}

impl PendingReport {
    pub(crate) fn merge(&mut self, other: PendingReport) {
        self.first_attempts = self.first_attempts.saturating_add(other.first_attempts);
        self.successes = self.successes.saturating_add(other.successes);
        self.rejections = self.rejections.saturating_add(other.rejections);
        self.since = match (self.since, other.since) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
        if !self.origin.is_set() {
            self.origin = other.origin;
        }
        for item in other.evidence {
            self.push_evidence(item);
        }
        self.keep_latest_stated(other.stated);
    }

    /// Keeps the statement received last.
    pub(crate) fn keep_latest_stated(&mut self, stated: Option<StatedLimit>) {
        let newer = match (&self.stated, &stated) {
            (Some(held), Some(new)) => new.receipt_unix_ms >= held.receipt_unix_ms,
            (None, Some(_)) => true,
            _ => false,
        };
        if newer {
            self.stated = stated;
        }
    }

    /// Keeps the newest evidence: it carries the latest hint.
    pub(crate) fn push_evidence(&mut self, item: Evidence) {
        if self.evidence.len() == MAX_EVIDENCE_PER_REPORT {
            self.evidence.remove(0);
        }
        self.evidence.push(item);
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.first_attempts == 0
            && self.successes == 0
            && self.rejections == 0
            && self.evidence.is_empty()
            && self.stated.is_none()
    }
}

/// One batched report for `scope`: its counts and the newest evidence.
pub(crate) fn report_request(scope: &Scope, report: &PendingReport) -> ReportRequest {
    ReportRequest {
        scope: Some(scope.to_wire()),
        worker_id: String::new(),
        first_attempts: report.first_attempts,
        successes: report.successes,
        rejections: report.rejections,
        evidence: report.evidence.clone(),
        counts_age_ms: report
            .since
            .map_or(0, |since| since.elapsed().as_millis() as u64),
        stated_limit: report.stated.clone(),
    }
}

/// The limit one response stated: its raw fields and the wall time it was
/// received at (the coordinator reads a reset against it).
pub(crate) fn stated_limit(observation: &Observation, receipt: SystemTime) -> Option<StatedLimit> {
    if observation.stated.is_empty() {
        return None;
    }
    Some(StatedLimit {
        fields: observation
            .stated
            .iter()
            .map(|f| StatedField {
                name: f.name.to_owned(),
                value: f.value.clone(),
                truncated: f.truncated,
            })
            .collect(),
        receipt_unix_ms: to_unix_ms(receipt),
        http_status: match observation.status {
            ResponseStatus::Http(status) => u32::from(status),
            _ => 0,
        },
    })
}

/// Subscribes to the state of `scopes`.
pub(crate) fn watch_request(scopes: &[Scope]) -> WatchRequest {
    WatchRequest {
        scopes: scopes.iter().map(Scope::to_wire).collect(),
        worker_id: String::new(),
    }
}

/// Asks for a slot no earlier than `not_before` that still leaves
/// `attempt_reserve` before `deadline`, for a retry or a held
/// `first_attempt` (`arriving` on the held first attempt's first ask).
pub(crate) fn reconsider_request(
    scope: &Scope,
    intent_id: &str,
    not_before: SystemTime,
    deadline: SystemTime,
    attempt_reserve: Duration,
    first_attempt: bool,
    arriving: bool,
) -> ReconsiderRequest {
    ReconsiderRequest {
        scope: Some(scope.to_wire()),
        worker_id: String::new(),
        intent_id: bounded_to(intent_id, MAX_INTENT_ID_BYTES),
        not_before_unix_ms: to_unix_ms(not_before),
        deadline_unix_ms: to_unix_ms(deadline),
        // Rounded up: a reserve rounded down would fit a slot the
        // attempt cannot take.
        attempt_reserve_ms: u64::try_from(attempt_reserve.as_micros().div_ceil(1000))
            .unwrap_or(u64::MAX),
        first_attempt,
        arriving,
    }
}

/// Throttling evidence from one reply: its status, the raw hint in the field
/// its protocol uses, and the wall times it was sent and received at (the
/// coordinator reads an HTTP-date hint against the receipt time).
pub(crate) fn evidence(
    observation: &Observation,
    intent_id: &str,
    sent: SystemTime,
    receipt: SystemTime,
) -> Evidence {
    let hint = observation.hint.as_deref();
    let (http_status, grpc_code) = match observation.status {
        ResponseStatus::Http(status) => (u32::from(status), 0),
        ResponseStatus::Grpc(code) => (0, code as u32),
        ResponseStatus::Transport(_) => (0, 0),
    };
    let is_http = http_status != 0;
    let bounded = |limit| hint.map(|h| bounded_to(h, limit)).unwrap_or_default();
    Evidence {
        http_status,
        grpc_code,
        has_retry_after: is_http && hint.is_some(),
        retry_after: if is_http {
            bounded(MAX_RAW_HINT_BYTES)
        } else {
            String::new()
        },
        has_pushback: !is_http && hint.is_some(),
        pushback_ms: if is_http {
            String::new()
        } else {
            bounded(MAX_PUSHBACK_BYTES)
        },
        receipt_unix_ms: to_unix_ms(receipt),
        sent_unix_ms: to_unix_ms(sent),
        certainty: ScopeCertainty::Known as i32,
        intent_id: bounded_to(intent_id, MAX_INTENT_ID_BYTES),
    }
}
