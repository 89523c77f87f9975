//! `tollgate scopes mute|unmute`, and the evidence lines of `scopes show`:
//! whether a cooldown is corroborated, by how many workers, which workers
//! disagree (`noisy`), which are muted.

use std::time::Duration;

use serde_json::{Value, json};
use tollgate_proto::v1;

use super::args::ScopeRef;
use super::render::{emit, print_table, time};
use super::{Client, EXIT_OK, Failure, Outcome};

/// `scopes mute`: keeps `worker`'s hints on the scope as evidence only.
pub(super) async fn mute(
    client: &mut Client,
    scope: ScopeRef,
    worker: String,
    reason: String,
    duration: Option<Duration>,
) -> Outcome {
    let req = client.request(v1::MuteWorkerRequest {
        caller_scope: scope.caller_scope.clone(),
        route: scope.route.clone(),
        worker_id: worker,
        reason,
        duration_ms: duration.map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX)),
    })?;
    let m = client
        .inner
        .mute_worker(req)
        .await
        .map_err(|s| Failure::status("muting the worker", &s))?
        .into_inner();
    emit(
        client.output,
        || mute_json(&m),
        || {
            outln!(
                "muted {} on {}|{} until {}",
                m.worker_id,
                scope.caller_scope,
                scope.route,
                until(m.expires_at_unix_ms)
            );
        },
    );
    Ok(EXIT_OK)
}

/// `scopes unmute`.
pub(super) async fn unmute(
    client: &mut Client,
    scope: ScopeRef,
    worker: String,
    reason: String,
) -> Outcome {
    let req = client.request(v1::UnmuteWorkerRequest {
        caller_scope: scope.caller_scope.clone(),
        route: scope.route.clone(),
        worker_id: worker.clone(),
        reason,
    })?;
    client
        .inner
        .unmute_worker(req)
        .await
        .map_err(|s| Failure::status("unmuting the worker", &s))?;
    emit(
        client.output,
        || json!({"muted": false, "worker_id": worker}),
        || outln!("unmuted {worker} on {}|{}", scope.caller_scope, scope.route),
    );
    Ok(EXIT_OK)
}

fn until(unix_ms: i64) -> String {
    if unix_ms > 0 {
        time(unix_ms)
    } else {
        "unmuted".into()
    }
}

fn mute_json(m: &v1::MuteState) -> Value {
    json!({
        "muted": m.muted, "worker_id": m.worker_id, "reason": m.reason, "by": m.by,
        "expires_at_unix_ms": m.expires_at_unix_ms,
    })
}

/// A level's evidence as data (`scopes show -o json|yaml`).
pub(super) fn evidence_json(e: Option<&v1::EvidenceState>) -> Value {
    let Some(e) = e else { return Value::Null };
    json!({
        "supported_until_unix_ms": e.supported_until_unix_ms,
        "corroborated": e.corroborated, "workers": e.workers,
        "reporters": e.reporters, "needed": e.needed,
        "noisy_workers": e.noisy_workers,
        "disagreeing": e.disagreeing.iter().map(|w| json!({
            "worker_id": w.worker_id, "claim_until_unix_ms": w.claim_until_unix_ms,
            "hints": w.hints, "outliers": w.outliers,
            "uncorroborated": w.uncorroborated, "noisy": w.noisy,
        })).collect::<Vec<_>>(),
        "mutes": e.mutes.iter().map(mute_json).collect::<Vec<_>>(),
    })
}

/// The evidence lines of `scopes show`, one block per level that has any.
pub(super) fn print_evidence(s: &v1::ScopeState) {
    for (level, e) in [
        ("route", s.route_evidence.as_ref()),
        ("caller", s.caller_evidence.as_ref()),
    ] {
        let Some(e) = e else { continue };
        if e.reporters == 0 && e.disagreeing.is_empty() && e.mutes.is_empty() {
            continue;
        }
        if e.reporters == 0 && e.disagreeing.is_empty() {
            // Only mutes: nothing was weighed, so there is no verdict to
            // give ("UNCORROBORATED by 0 of 0" read as a finding).
            outln!("evidence ({level}) no hints counted; muted workers' hints are ignored");
        } else {
            outln!(
                "evidence ({level}) {} by {} of {} reporting workers ({} needed), supports {}",
                if e.corroborated {
                    "corroborated"
                } else {
                    "UNCORROBORATED"
                },
                e.workers,
                e.reporters,
                e.needed,
                time(e.supported_until_unix_ms)
            );
        }
        if e.noisy_workers > 0 {
            outln!("  noisy workers {}", e.noisy_workers);
        }
        if !e.disagreeing.is_empty() {
            let rows: Vec<Vec<String>> = e
                .disagreeing
                .iter()
                .map(|w| {
                    vec![
                        w.worker_id.clone(),
                        if w.noisy { "NOISY".into() } else { "-".into() },
                        w.hints.to_string(),
                        w.outliers.to_string(),
                        w.uncorroborated.to_string(),
                        time(w.claim_until_unix_ms),
                    ]
                })
                .collect();
            print_table(
                &[
                    "WORKER",
                    "FLAG",
                    "HINTS",
                    "OUTLIERS",
                    "UNCORROBORATED",
                    "CLAIMS_UNTIL",
                ],
                &rows,
            );
        }
        for m in &e.mutes {
            outln!(
                "  muted {} until {}{}",
                m.worker_id,
                until(m.expires_at_unix_ms),
                if m.reason.is_empty() {
                    String::new()
                } else {
                    format!(" by {}: {}", m.by, m.reason)
                }
            );
        }
    }
}
