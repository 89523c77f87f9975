//! Decoding a script's reply (a flat array: `'ok'` or `'err'`, then
//! positional fields) into the store's types.

use redis::Value;

use crate::budget::BudgetError;
use crate::pacing::cursor::SlotError;
use crate::scope::RouteKey;
use crate::store::{RouteView, ScopeSummary, StoreError};

pub(super) fn unsigned(n: i64) -> u64 {
    u64::try_from(n).unwrap_or(0)
}

pub(super) fn count(n: i64) -> usize {
    usize::try_from(n).unwrap_or(0)
}

/// The summary fields every `detail.lua` reply opens with; the owner by
/// the name the route carries (`owner_named`, the store's quotas: a reply
/// is read below them).
pub(super) fn summary_of(
    route: &RouteKey,
    r: &Reply,
    owner_named: impl Fn(&str) -> crate::tenancy::Owner,
) -> Result<ScopeSummary, StoreError> {
    Ok(ScopeSummary {
        route: route.clone(),
        view: RouteView {
            cooldown_until_ms: r.int(2)?,
            floor_ms: r.int(3)?,
            frozen: r.text(4),
        },
        leases_outstanding: count(r.int(5)?),
        waiting: count(r.int(6)?),
        last_touched_ms: r.int(7)?,
        owner: r
            .text(8)
            .map_or(crate::tenancy::Owner::NONE, |name| owner_named(&name)),
    })
}

/// The three fields of a `RouteView` written from field `at` (cooldown,
/// floor, freeze), as every route script ends its answer.
pub(super) fn view_at(r: &Reply, at: usize) -> Result<RouteView, StoreError> {
    Ok(RouteView {
        cooldown_until_ms: r.int(at)?,
        floor_ms: r.int(at + 1)?,
        frozen: r.text(at + 2),
    })
}

/// A script's reply: `{'ok', …}` or `{'err', reason, …}`.
pub(super) struct Reply(Vec<Value>);

impl Reply {
    /// Turns an `err` reply into the refusal it names.
    pub(super) fn ok(values: Vec<Value>) -> Result<Reply, StoreError> {
        let reply = Reply(values);
        match reply.text(0).as_deref() {
            Some("ok") => Ok(reply),
            Some("err") => Err(match reply.text(1).as_deref() {
                Some("lease_not_found") => BudgetError::LeaseNotFound.into(),
                Some("spent_exceeds_grant") => BudgetError::SpentExceedsGrant {
                    spent: 0,
                    granted: u32::try_from(reply.int(2).unwrap_or(0)).unwrap_or(0),
                }
                .into(),
                Some("successes_exceed_spent") => BudgetError::SuccessesExceedSpent {
                    successes: 0,
                    spent: 0,
                }
                .into(),
                Some("too_many_leases") => BudgetError::TooManyLeases.into(),
                Some("too_many_waiting") => SlotError::TooManyWaiting.into(),
                // One Lease of a batch whose script failed (lease_batch.lua).
                Some("failed") => {
                    StoreError::Unavailable(format!("redis: {}", reply.text(2).unwrap_or_default()))
                }
                other => StoreError::Unavailable(format!("redis script refused: {other:?}")),
            }),
            _ => Err(StoreError::Unavailable(
                "redis script gave an unexpected reply".into(),
            )),
        }
    }

    pub(super) fn int(&self, i: usize) -> Result<i64, StoreError> {
        match self.0.get(i) {
            Some(Value::Int(n)) => Ok(*n),
            Some(Value::Nil) => Ok(0),
            _ => Err(StoreError::Unavailable(format!(
                "redis script reply: field {i} is not an integer"
            ))),
        }
    }

    /// A field's bytes; `None` for Lua `false` (a nil reply).
    pub(super) fn bytes(&self, i: usize) -> Option<&[u8]> {
        match self.0.get(i) {
            Some(Value::BulkString(bytes)) => Some(bytes),
            _ => None,
        }
    }

    /// A string field; `None` for Lua `false` (a nil reply).
    pub(super) fn text(&self, i: usize) -> Option<String> {
        match self.0.get(i) {
            Some(Value::BulkString(bytes)) => Some(String::from_utf8_lossy(bytes).into_owned()),
            Some(Value::SimpleString(s)) => Some(s.clone()),
            _ => None,
        }
    }
}
