//! Operator actions on scopes: freezes (with their expiry) and resets.
//! A freeze's record is runtime state, kept like a policy change (the
//! state file, or the store shared by replicas); its effect — no leases,
//! no slots — is the store's, on the route itself.

use crate::events::StateChange;
use crate::scope::RouteKey;

use super::commit::{Outcome, to_json};
use super::persist::FreezeRecord;
use super::{Control, ControlError, EXPIRY_ACTOR, Note};

impl Control {
    /// Freezes `route`: no new leases or slots until unfrozen or `expires_at_ms`.
    pub async fn freeze(
        &self,
        who: &str,
        route: &RouteKey,
        reason: &str,
        expires_at_ms: Option<i64>,
    ) -> Result<FreezeRecord, ControlError> {
        // The record first, with its audit: it is what every replica follows
        // (`Control::follow_freezes`), so a coordinator that dies before the
        // store has the freeze leaves it to the others, or to its restart.
        let (record, _) = self
            .change(|st, now| {
                let record = FreezeRecord {
                    caller_scope: route.caller_scope.clone(),
                    route: route.route.clone(),
                    reason: reason.to_owned(),
                    by: who.to_owned(),
                    since_ms: now,
                    expires_at_ms,
                };
                let mut next = st.clone();
                let before = next.freezes.insert(route.clone(), record.clone());
                let note = Note {
                    who,
                    action: "scope.freeze",
                    reason,
                    at_ms: now,
                };
                let audit = note.record(
                    &route.to_string(),
                    before.map(|b| to_json(&b)).unwrap_or_default(),
                    to_json(&record),
                    self.policies.current().resolve(route).policy_version,
                );
                Ok(Outcome {
                    next: Some(next),
                    records: vec![audit],
                    value: record,
                })
            })
            .await?;
        self.store
            .set_freeze(route, Some(reason.to_owned()), self.now_ms())
            .await?;
        self.hub.publish(StateChange::Freeze {
            route: route.clone(),
            reason: Some(reason.to_owned()),
        });
        Ok(record)
    }

    /// Lifts the freeze of `route`; returns the freeze lifted, if any.
    pub async fn unfreeze(
        &self,
        who: &str,
        route: &RouteKey,
        reason: &str,
    ) -> Result<Option<FreezeRecord>, ControlError> {
        // The record first, as for a freeze; the store is unfrozen even
        // with no record left (a freeze a crash left behind).
        let (before, _) = self
            .change(|st, now| {
                let mut next = st.clone();
                let before = next.freezes.remove(route);
                // Every replica lifts expired freezes; the ones that come
                // second find nothing left to record.
                if before.is_none() && who == EXPIRY_ACTOR {
                    return Ok(Outcome {
                        next: None,
                        records: Vec::new(),
                        value: None,
                    });
                }
                let note = Note {
                    who,
                    action: "scope.unfreeze",
                    reason,
                    at_ms: now,
                };
                let audit = note.record(
                    &route.to_string(),
                    before.as_ref().map(to_json).unwrap_or_default(),
                    String::new(),
                    self.policies.current().resolve(route).policy_version,
                );
                Ok(Outcome {
                    next: Some(next),
                    records: vec![audit],
                    value: before,
                })
            })
            .await?;
        self.store.set_freeze(route, None, self.now_ms()).await?;
        self.hub.publish(StateChange::Freeze {
            route: route.clone(),
            reason: None,
        });
        Ok(before)
    }

    /// Lifts every freeze whose expiry has passed.
    pub async fn expire_freezes(&self) {
        let now = self.now_ms();
        let expired: Vec<RouteKey> = {
            let st = self.state.lock().await;
            st.freezes
                .iter()
                .filter(|(_, f)| f.expires_at_ms.is_some_and(|at| at <= now))
                .map(|(k, _)| k.clone())
                .collect()
        };
        for route in expired {
            if let Err(err) = self.unfreeze(EXPIRY_ACTOR, &route, "freeze expired").await {
                tracing::error!(cause = %err, scope = %route, "lifting an expired freeze failed");
            }
        }
    }

    /// Forgets `route`'s budget, cooldown and slots (the freeze stays).
    pub async fn reset(
        &self,
        who: &str,
        route: &RouteKey,
        reason: &str,
    ) -> Result<bool, ControlError> {
        let now = self.now_ms();
        let existed = self.store.reset_scope(route, now).await?;
        if existed {
            // Watchers merge cooldowns by `max`, so they must be told the
            // route's own cooldown is gone; what remains is the caller
            // scope's, which a route reset leaves alone. Published through
            // the hub, so the relay carries it to every replica's watchers.
            let left = self.store.view(route, now).await?;
            self.hub.publish(StateChange::Reset {
                route: route.clone(),
                cooldown_until_ms: left.cooldown_until_ms,
            });
        }
        self.change(|_, now| {
            let note = Note {
                who,
                action: "scope.reset",
                reason,
                at_ms: now,
            };
            let record = note.record(
                &route.to_string(),
                format!("{{\"existed\":{existed}}}"),
                String::new(),
                self.policies.current().resolve(route).policy_version,
            );
            Ok(Outcome {
                next: None,
                records: vec![record],
                value: (),
            })
        })
        .await?;
        Ok(existed)
    }
}
