//! The stated-limit lines of `tollgate scopes show` and its JSON: what the
//! upstream states about its quota on the route, the pace it sets, and the
//! latest statements whatever their verdict (a statement that is not
//! usable is shown, never used).

use serde_json::{Value, json};
use tollgate_proto::v1;

use super::render::time;

/// The stated limit as JSON (`null` when the coordinator sent none).
pub(super) fn stated_json(s: Option<&v1::StatedLimitState>) -> Value {
    let Some(s) = s else {
        return Value::Null;
    };
    json!({
        "state": s.state, "pace": s.pace, "limit": s.limit,
        "window_secs": s.window_secs, "remaining": s.remaining,
        "reset_unix_ms": s.reset_unix_ms, "workers": s.workers, "needed": s.needed,
        "recent": s.recent.iter().map(|r| json!({
            "worker_id": r.worker_id, "receipt_unix_ms": r.receipt_unix_ms,
            "verdict": r.verdict, "raw": r.raw, "pace": r.pace,
        })).collect::<Vec<_>>(),
    })
}

/// The stated limit's lines; nothing when no statement was ever reported.
pub(super) fn print_stated(s: Option<&v1::StatedLimitState>) {
    let Some(s) = s.filter(|s| s.state != "none" || !s.recent.is_empty()) else {
        return;
    };
    let window = if s.window_secs > 0 {
        format!(" per {} s", s.window_secs)
    } else {
        String::new()
    };
    let reset = if s.reset_unix_ms > 0 {
        format!(", resets {}", time(s.reset_unix_ms))
    } else {
        String::new()
    };
    outln!(
        "  stated        {}: pace {:.1}/s from {} of {}{window} remaining{reset}; {} of {} workers needed",
        s.state,
        s.pace,
        s.remaining,
        s.limit,
        s.workers,
        s.needed
    );
    for r in &s.recent {
        outln!(
            "    {} {} {} ({:.1}/s): {}",
            time(r.receipt_unix_ms),
            r.worker_id,
            r.verdict,
            r.pace,
            r.raw
        );
    }
}
