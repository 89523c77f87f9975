//! `tollgate audit`: who changed what, newest first.

use serde_json::{Value, json};
use tollgate_proto::v1;

use super::render::{emit, or_dash, print_table, time};
use super::{Client, EXIT_OK, Failure, Outcome};

/// Prints the newest `limit` audit records.
pub(super) async fn run(client: &mut Client, limit: u32) -> Outcome {
    let req = client.request(v1::ListAuditRequest {
        limit,
        before_seq: 0,
    })?;
    let records = client
        .inner
        .list_audit(req)
        .await
        .map_err(|s| Failure::status("reading the audit log", &s))?
        .into_inner()
        .records;
    emit(
        client.output,
        || Value::Array(records.iter().map(record_json).collect()),
        || {
            let rows: Vec<Vec<String>> = records
                .iter()
                .map(|r| {
                    vec![
                        r.seq.to_string(),
                        time(r.at_unix_ms),
                        r.who.clone(),
                        r.action.clone(),
                        r.target.clone(),
                        r.policy_version.to_string(),
                        format!("{} -> {}", or_dash(&r.before), or_dash(&r.after)),
                        r.reason.clone(),
                    ]
                })
                .collect();
            print_table(
                &[
                    "SEQ",
                    "WHEN",
                    "WHO",
                    "ACTION",
                    "TARGET",
                    "VERSION",
                    "BEFORE -> AFTER",
                    "REASON",
                ],
                &rows,
            );
        },
    );
    Ok(EXIT_OK)
}

fn record_json(r: &v1::AuditRecord) -> Value {
    json!({
        "seq": r.seq, "at_unix_ms": r.at_unix_ms, "who": r.who, "action": r.action,
        "target": r.target, "before": r.before, "after": r.after,
        "policy_version": r.policy_version, "reason": r.reason,
    })
}
