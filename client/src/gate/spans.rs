//! The span model on the gate's side: one `tollgate.intent` span per intent
//! and one `tollgate.attempt` span per attempt, with the attributes that
//! `docs/telemetry.md` lists. Recording lives here so the driver reads as
//! the decision order and nothing else.

use std::time::Duration;

use super::intent::{AttemptEvidence, GateIntent, TokenSource, WaitEvidence};
use crate::hint::HintVerdict;
use crate::outcome::{AttemptRecord, ResponseStatus};
use crate::scope::Priority;

/// The `tollgate.intent` span; its outcome and attempt count are recorded
/// when the intent ends ([`record_end`]).
pub(super) fn intent_span(intent: &GateIntent) -> tracing::Span {
    tracing::info_span!(
        "tollgate.intent",
        tollgate.intent_id = %intent.intent_id(),
        tollgate.caller_scope = %crate::telemetry::caller_scope_attr(&intent.scope().caller_scope),
        tollgate.route = %intent.scope().route,
        tollgate.priority = priority_attr(intent.scope().priority),
        tollgate.outcome = tracing::field::Empty,
        tollgate.attempts = tracing::field::Empty,
        tollgate.held = tracing::field::Empty,
    )
}

/// How the intent ended, on its span; `held` says whether a cooldown held
/// its first attempt (visible even when it ended with none).
pub(super) fn record_end(span: &tracing::Span, outcome: &str, attempts: usize, held: bool) {
    span.record("tollgate.outcome", outcome);
    span.record("tollgate.attempts", attempts);
    if held {
        span.record("tollgate.held", true);
    }
}

/// The `tollgate.attempt` span of the attempt just pushed: its number,
/// the attempts before it (gRFC A45's `previous-rpc-attempts`), how it
/// was admitted, and the wait that preceded it (for a first attempt, the
/// hold inside a cooldown, if any).
pub(super) fn attempt_span(
    number: u32,
    attempts: &[AttemptEvidence],
    held: Option<&WaitEvidence>,
) -> tracing::Span {
    let span = tracing::info_span!(
        "tollgate.attempt",
        tollgate.attempt = number,
        tollgate.previous_attempts = number.saturating_sub(1),
        tollgate.token = tracing::field::Empty,
        tollgate.policy_version = tracing::field::Empty,
        tollgate.wait_ms = tracing::field::Empty,
        tollgate.slot_delay_ms = tracing::field::Empty,
        tollgate.cooldown = tracing::field::Empty,
        tollgate.degraded = tracing::field::Empty,
        tollgate.asked_again = tracing::field::Empty,
        tollgate.paced_alone = tracing::field::Empty,
        tollgate.shadow = tracing::field::Empty,
        tollgate.held = tracing::field::Empty,
        tollgate.status = tracing::field::Empty,
        tollgate.class = tracing::field::Empty,
        tollgate.hint.form = tracing::field::Empty,
        tollgate.hint.valid = tracing::field::Empty,
        tollgate.hint.delay_ms = tracing::field::Empty,
        tollgate.decision = tracing::field::Empty,
    );
    let n = attempts.len();
    if let Some(current) = attempts.last() {
        span.record(
            "tollgate.token",
            match current.token {
                TokenSource::FirstAttempt => "first_attempt",
                TokenSource::Leased { .. } => "leased",
                TokenSource::Fallback => "fallback",
            },
        );
        span.record("tollgate.policy_version", current.policy_version);
    }
    // The wait before this attempt: after the previous reply, or, for a held
    // first attempt, since the intent began.
    let (waited_since, wait) = match n.checked_sub(2).and_then(|i| attempts.get(i)) {
        Some(previous) => (previous.record.receipt, previous.wait.as_ref()),
        None => {
            if held.is_some() {
                span.record("tollgate.held", true);
            }
            (held.map(|_| Duration::ZERO), held)
        }
    };
    if let (Some(since), Some(current)) = (waited_since, attempts.last()) {
        span.record(
            "tollgate.wait_ms",
            millis(current.record.start.saturating_sub(since)),
        );
    }
    if let Some(wait) = wait {
        if let Some(slot) = wait.slot {
            span.record(
                "tollgate.slot_delay_ms",
                millis(slot.saturating_sub(wait.engine_next_start)),
            );
        }
        span.record("tollgate.cooldown", wait.cooldown.is_some());
        span.record("tollgate.degraded", wait.degraded);
        span.record("tollgate.asked_again", wait.asked_again);
        if wait.degraded {
            span.record("tollgate.paced_alone", wait.paced_alone);
        }
        if let Some(shadowed) = wait.shadowed {
            span.record("tollgate.shadow", shadowed.as_str());
        }
    }
    span
}

/// What came back for an attempt, and what was decided, on its span.
pub(super) fn record_response(span: &tracing::Span, record: &AttemptRecord) {
    match record.status {
        Some(ResponseStatus::Http(code)) => span.record("tollgate.status", code),
        Some(ResponseStatus::Grpc(code)) => {
            span.record("tollgate.status", tracing::field::debug(code))
        }
        Some(ResponseStatus::Transport(failure)) => {
            span.record("tollgate.status", tracing::field::debug(failure))
        }
        None => span,
    };
    if let Some(c) = record.classification {
        span.record("tollgate.class", tracing::field::debug(c.class));
    }
    if let Some(hint) = &record.hint {
        span.record("tollgate.hint.form", hint.form.as_str());
        match hint.verdict {
            HintVerdict::Absent => {}
            HintVerdict::Valid { delay, .. } => {
                span.record("tollgate.hint.valid", true);
                span.record("tollgate.hint.delay_ms", millis(delay));
            }
            HintVerdict::ExceedsCap { delay, .. } => {
                span.record("tollgate.hint.valid", false);
                span.record("tollgate.hint.delay_ms", millis(delay));
            }
            _ => {
                span.record("tollgate.hint.valid", false);
            }
        }
    }
    if let Some(decision) = record.decision {
        span.record("tollgate.decision", decision.as_str());
    }
}

/// The priority as the coordinator names it (`critical`, `normal`, `bulk`).
fn priority_attr(priority: Priority) -> &'static str {
    match priority {
        Priority::Critical => "critical",
        Priority::Bulk => "bulk",
        Priority::Normal | Priority::Unspecified => "normal",
    }
}

fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}
