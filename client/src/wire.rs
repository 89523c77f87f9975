//! The coordinator's wire protocol, spoken in one place: every `Lease`,
//! `Release`, `Report`, `Watch` and `Reconsider` request, every piece of
//! throttling `Evidence` and every stated limit the worker sends is built here, so the proto's
//! bounds and conventions (wall times as Unix milliseconds, text cut to the
//! proto's limits, the worker id left for the link to fill in) hold for all
//! of them.

use std::time::{Duration, SystemTime};

use tollgate_proto::v1::{
    Evidence, LeaseRequest, ReconsiderRequest, ReleaseRequest, ReportRequest, RetryClass,
    ScopeCertainty, StatedField, StatedLimit, WatchRequest,
};

use crate::clock::to_unix_ms;
use crate::engine::Observation;
use crate::hint::{MAX_RAW_HINT_BYTES, bounded_to};
use crate::lease::PendingReport;
use crate::outcome::ResponseStatus;
use crate::scope::Scope;

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
        attempt_reserve_ms: u64::try_from(attempt_reserve.as_millis()).unwrap_or(u64::MAX),
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
