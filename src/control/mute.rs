//! Muting a worker's evidence on a scope: its hints are still recorded and
//! counted, but move no cooldown there. For the worker an operator has
//! found lying or broken (GetScope flags it `noisy`) while its owner fixes
//! it. The mute is held by the store — so on Redis every replica applies it
//! — and, like a freeze, written to the state file first, so with the
//! in-memory store it survives a restart.

use std::collections::BTreeMap;

use crate::config::ConfigError;
use crate::hints::corroboration::MAX_MUTES;
use crate::scope::RouteKey;

use super::commit::Outcome;
use super::persist::MuteRecord;
use super::{Control, ControlError, Note, to_json};

/// Mutes by scope and worker.
pub(super) type Mutes = BTreeMap<(RouteKey, String), MuteRecord>;

/// The store's "until" for a mute without an end: 2^53 ms, exact in Lua's
/// doubles, some 285,000 years away.
pub const MUTE_FOREVER_MS: i64 = 1 << 53;

impl Control {
    /// The mutes to write to the state file: those not yet lapsed.
    pub(super) fn mute_records(&self) -> Vec<MuteRecord> {
        let now = self.now_ms();
        self.mutes_map()
            .values()
            .filter(|m| m.expires_at_ms.is_none_or(|at| at > now))
            .cloned()
            .collect()
    }

    fn mutes_map(&self) -> std::sync::MutexGuard<'_, Mutes> {
        // A panic elsewhere cannot leave the map half-written: every write
        // is a whole swap.
        self.mutes.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Puts the state file's mutes back in the store at start.
    pub(super) async fn reapply_mutes(
        &self,
        saved: Vec<MuteRecord>,
        now: i64,
    ) -> Result<(), ControlError> {
        for m in saved {
            if m.expires_at_ms.is_some_and(|at| at <= now) {
                continue;
            }
            let route = RouteKey {
                caller_scope: m.caller_scope.clone(),
                route: m.route.clone(),
            };
            let until = m.expires_at_ms.unwrap_or(MUTE_FOREVER_MS);
            self.store
                .set_mute(&route, &m.worker_id, Some(until), now)
                .await?;
            self.mutes_map().insert((route, m.worker_id.clone()), m);
        }
        Ok(())
    }

    /// The mutes recorded on `route` (by this coordinator's control; the
    /// store's own list, shared by every replica, is in GetScope's evidence).
    pub fn mutes_of(&self, route: &RouteKey) -> Vec<MuteRecord> {
        let now = self.now_ms();
        self.mutes_map()
            .iter()
            .filter(|((r, _), m)| r == route && m.expires_at_ms.is_none_or(|at| at > now))
            .map(|(_, m)| m.clone())
            .collect()
    }

    /// Swaps in `next`, writes the state file, and restores the old map if
    /// the write fails (an unacknowledged change is not made).
    async fn save_mutes(&self, next: Mutes) -> Result<Mutes, ControlError> {
        let st = self.state.lock().await;
        let before = std::mem::replace(&mut *self.mutes_map(), next);
        if let Err(err) = self.save(&st) {
            *self.mutes_map() = before;
            return Err(err.into());
        }
        Ok(before)
    }

    /// Mutes `worker_id`'s evidence on `route` (and on its caller scope)
    /// until `expires_at_ms`, or until unmuted.
    pub async fn mute(
        &self,
        who: &str,
        route: &RouteKey,
        worker_id: &str,
        reason: &str,
        expires_at_ms: Option<i64>,
    ) -> Result<MuteRecord, ControlError> {
        let now = self.now_ms();
        let record = MuteRecord {
            caller_scope: route.caller_scope.clone(),
            route: route.route.clone(),
            worker_id: worker_id.to_owned(),
            reason: reason.to_owned(),
            by: who.to_owned(),
            since_ms: now,
            expires_at_ms,
        };
        let key = (route.clone(), worker_id.to_owned());
        let mut next = self.mutes_map().clone();
        let previous = next.insert(key, record.clone());
        let before = self.save_mutes(next).await?;
        let until = expires_at_ms.unwrap_or(MUTE_FOREVER_MS);
        let applied = self
            .store
            .set_mute(route, worker_id, Some(until), now)
            .await;
        if !matches!(applied, Ok(true)) {
            self.save_mutes(before).await?;
            applied?;
            return Err(ConfigError::Invalid {
                place: "worker_id".into(),
                reason: format!("at most {MAX_MUTES} workers muted per scope"),
            }
            .into());
        }
        let version = self.policies.current().resolve(route).policy_version;
        self.audit_only(
            Note {
                who,
                action: "scope.mute",
                reason,
                at_ms: now,
            },
            format!("{route} worker {worker_id}"),
            previous.map(|p| to_json(&p)).unwrap_or_default(),
            to_json(&record),
            version,
        )
        .await?;
        Ok(record)
    }

    /// Lifts the mute of `worker_id` on `route`; returns it, if any.
    pub async fn unmute(
        &self,
        who: &str,
        route: &RouteKey,
        worker_id: &str,
        reason: &str,
    ) -> Result<Option<MuteRecord>, ControlError> {
        let key = (route.clone(), worker_id.to_owned());
        let mut next = self.mutes_map().clone();
        let lifted = next.remove(&key);
        self.save_mutes(next).await?;
        self.store
            .set_mute(route, worker_id, None, self.now_ms())
            .await?;
        let version = self.policies.current().resolve(route).policy_version;
        self.audit_only(
            Note {
                who,
                action: "scope.unmute",
                reason,
                at_ms: self.now_ms(),
            },
            format!("{route} worker {worker_id}"),
            lifted.as_ref().map(to_json).unwrap_or_default(),
            String::new(),
            version,
        )
        .await?;
        Ok(lifted)
    }

    /// Records a change that lives outside the runtime document (a mute) in
    /// the one audit log: the shared one on Redis, the local one otherwise.
    async fn audit_only(
        &self,
        note: Note<'_>,
        target: String,
        before: String,
        after: String,
        version: u64,
    ) -> Result<(), ControlError> {
        self.change(|_, _| {
            Ok(Outcome {
                next: None,
                records: vec![note.record(&target, before.clone(), after.clone(), version)],
                value: (),
            })
        })
        .await?;
        Ok(())
    }
}
