//! Watch across replicas: scope changes travel over Redis pub/sub.
//!
//! A change happens on one replica (the one a worker reported to) but its
//! watchers are on every replica. Each replica publishes the changes its
//! service emits on one channel and feeds what the others publish into its
//! local [`EventHub`], which its Watch streams already read — the hub's
//! interface is unchanged. Messages carry the sender's origin id so a
//! replica does not deliver its own changes twice.
//!
//! Pub/sub is fire-and-forget: a message published while a replica's
//! subscription is down is lost to that replica's watchers. That is
//! acceptable because scope state is a level, not a log — every Lease,
//! Report and Reconsider answer carries the current cooldown, and a Watch
//! reconnect starts with a snapshot read from Redis.
//!
//! The relay is a task the server runs beside its services, over the Redis
//! store's public connection target: it feeds the core's hub, so it sits
//! above both rather than inside the store.

use std::time::Duration;

use serde_json::{Value, json};
use tokio::sync::mpsc;
use tokio_stream::StreamExt;
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

use crate::events::{CooldownSupport, EventHub, StateChange};
use crate::scope::{EvidenceLevel, RouteKey};
use crate::store::redis::{RedisSetupError, RedisTarget};

/// Changes waiting to be published before newer ones are dropped.
const OUTBOX: usize = 1024;

/// Bridges a replica's [`EventHub`] to the other replicas through Redis.
#[derive(Debug)]
pub struct EventRelay {
    /// Asked for a client on every (re)connect, so a relay behind
    /// Sentinels follows the primary.
    target: RedisTarget,
    channel: String,
    /// Tells this replica's own messages apart when they come back.
    origin: u64,
}

impl EventRelay {
    /// A relay on `target`'s first node (on a cluster, PUBLISH reaches every
    /// node's subscribers), on the channel `PREFIX:events`.
    pub fn new(target: &RedisTarget, prefix: &str) -> Result<EventRelay, RedisSetupError> {
        Ok(EventRelay {
            target: target.clone(),
            channel: format!("{prefix}:events"),
            origin: rand::random(),
        })
    }

    /// A hub whose published changes also go to Redis, and the relay task
    /// to run beside the server until `shutdown`.
    pub fn start(self, shutdown: CancellationToken) -> (EventHub, impl Future<Output = ()>) {
        let (hub, outbox) = EventHub::relayed(OUTBOX);
        let task = self.run(hub.clone(), outbox, shutdown);
        (hub, task)
    }

    async fn run(
        self,
        hub: EventHub,
        outbox: mpsc::Receiver<StateChange>,
        shutdown: CancellationToken,
    ) {
        tokio::select! {
            () = shutdown.cancelled() => {}
            () = self.publish_all(outbox) => {}
            () = self.subscribe_forever(&hub) => {}
        }
    }

    async fn publish_all(&self, mut outbox: mpsc::Receiver<StateChange>) {
        let mut conn = None;
        while let Some(change) = outbox.recv().await {
            // A policy set is this replica's own (its file, its Admin
            // calls): its replacement is not relayed.
            let Some(message) = encode(self.origin, &change) else {
                continue;
            };
            let message = message.to_string();
            if conn.is_none() {
                conn = tokio::time::timeout(Duration::from_secs(1), async {
                    self.target
                        .primary_client()
                        .await?
                        .get_multiplexed_async_connection()
                        .await
                })
                .await
                .ok()
                .and_then(Result::ok);
            }
            let Some(c) = conn.as_mut() else {
                warn!("redis unreachable: a scope change was not relayed to other replicas");
                continue;
            };
            let sent = tokio::time::timeout(
                Duration::from_secs(1),
                redis::cmd("PUBLISH")
                    .arg(&self.channel)
                    .arg(&message)
                    .query_async::<i64>(c),
            )
            .await;
            if !matches!(sent, Ok(Ok(_))) {
                warn!("publishing a scope change failed; other replicas miss it");
                conn = None;
            }
        }
    }

    /// Subscribes, and after any loss of the connection subscribes again
    /// (waits grow to 1 s), for as long as it is polled.
    async fn subscribe_forever(&self, hub: &EventHub) {
        let mut wait = Duration::from_millis(50);
        loop {
            let pubsub = async { self.target.primary_client().await?.get_async_pubsub().await };
            match pubsub.await {
                Ok(mut pubsub) => match pubsub.subscribe(&self.channel).await {
                    Ok(()) => {
                        info!(channel = %self.channel, "relaying scope changes between replicas");
                        wait = Duration::from_millis(50);
                        let mut messages = pubsub.on_message();
                        while let Some(msg) = messages.next().await {
                            let Ok(text) = msg.get_payload::<String>() else {
                                continue;
                            };
                            match decode(&text) {
                                Some((origin, _)) if origin == self.origin => {}
                                Some((_, change)) => hub.publish_remote(change),
                                None => debug!("ignoring an unreadable relay message"),
                            }
                        }
                        warn!("relay subscription lost; resubscribing");
                    }
                    Err(err) => warn!(cause = %err, "relay subscribe failed"),
                },
                Err(err) => debug!(cause = %err, "relay cannot reach redis yet"),
            }
            tokio::time::sleep(wait).await;
            wait = (wait * 2).min(Duration::from_secs(1));
        }
    }
}

fn route_json(route: &RouteKey) -> Value {
    json!([route.caller_scope, route.route])
}

/// The wire form of a change; `None` for a replica-local one (a policy set
/// replaced on this replica, whose policies are its own).
fn encode(origin: u64, change: &StateChange) -> Option<Value> {
    // The origin is a string: JSON numbers are not exact past 2^53.
    let origin = origin.to_string();
    Some(match change {
        StateChange::Cooldown {
            level,
            cooldown_until_ms,
            support,
        } => {
            let mut v = match level {
                EvidenceLevel::Route(route) => {
                    json!({"o": origin, "k": "cooldown", "route": route_json(route), "until": cooldown_until_ms})
                }
                EvidenceLevel::Caller(caller) => {
                    json!({"o": origin, "k": "cooldown", "caller": caller, "until": cooldown_until_ms})
                }
            };
            v["corroborated"] = json!(support.corroborated);
            v["workers"] = json!(support.workers);
            v["closed_until"] = json!(support.closed_until_ms);
            v
        }
        StateChange::Freeze { route, reason } => {
            json!({"o": origin, "k": "freeze", "route": route_json(route), "reason": reason})
        }
        StateChange::Policy {
            route,
            policy_version,
        } => {
            json!({"o": origin, "k": "policy", "route": route_json(route), "version": policy_version})
        }
        StateChange::Reset {
            route,
            cooldown_until_ms,
        } => {
            json!({"o": origin, "k": "reset", "route": route_json(route), "until": cooldown_until_ms})
        }
        StateChange::Pacing { route, mode } => {
            json!({"o": origin, "k": "pacing", "route": route_json(route), "mode": *mode as u8})
        }
        StateChange::CallBack { route, deadline_ms } => {
            json!({"o": origin, "k": "call_back", "route": route_json(route), "until": deadline_ms})
        }
        StateChange::Policies(_) => return None,
    })
}

fn decode(text: &str) -> Option<(u64, StateChange)> {
    let v: Value = serde_json::from_str(text).ok()?;
    let origin = v.get("o")?.as_str()?.parse().ok()?;
    let route = || -> Option<RouteKey> {
        let pair = v.get("route")?.as_array()?;
        Some(RouteKey {
            caller_scope: pair.first()?.as_str()?.to_owned(),
            route: pair.get(1)?.as_str()?.to_owned(),
        })
    };
    let change = match v.get("k")?.as_str()? {
        "cooldown" => StateChange::Cooldown {
            level: match v.get("caller").and_then(Value::as_str) {
                Some(caller) => EvidenceLevel::Caller(caller.to_owned()),
                None => EvidenceLevel::Route(route()?),
            },
            cooldown_until_ms: v.get("until")?.as_i64()?,
            // Absent from a replica that predates corroboration.
            support: CooldownSupport {
                corroborated: v
                    .get("corroborated")
                    .and_then(Value::as_bool)
                    .unwrap_or(false),
                workers: v
                    .get("workers")
                    .and_then(Value::as_u64)
                    .and_then(|w| u32::try_from(w).ok())
                    .unwrap_or(0),
                closed_until_ms: v.get("closed_until").and_then(Value::as_i64).unwrap_or(0),
            },
        },
        "freeze" => StateChange::Freeze {
            route: route()?,
            reason: v.get("reason")?.as_str().map(str::to_owned),
        },
        "policy" => StateChange::Policy {
            route: route()?,
            policy_version: v.get("version")?.as_u64()?,
        },
        "reset" => StateChange::Reset {
            route: route()?,
            cooldown_until_ms: v.get("until")?.as_i64()?,
        },
        "pacing" => StateChange::Pacing {
            route: route()?,
            mode: crate::pacing::Mode::from_code(v.get("mode")?.as_i64()?),
        },
        "call_back" => StateChange::CallBack {
            route: route()?,
            deadline_ms: v.get("until")?.as_i64()?,
        },
        _ => return None,
    };
    Some((origin, change))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_change_survives_the_wire() {
        let route = RouteKey {
            caller_scope: "c|x".into(),
            route: "GET /a".into(),
        };
        let changes = [
            StateChange::Cooldown {
                level: EvidenceLevel::Route(route.clone()),
                cooldown_until_ms: 1_704_110_430_000,
                support: CooldownSupport {
                    corroborated: true,
                    workers: 3,
                    closed_until_ms: 1_704_110_430_000,
                },
            },
            StateChange::Cooldown {
                level: EvidenceLevel::Caller("c".into()),
                cooldown_until_ms: 5,
                support: CooldownSupport::default(),
            },
            StateChange::Freeze {
                route: route.clone(),
                reason: Some("incident".into()),
            },
            StateChange::Freeze {
                route: route.clone(),
                reason: None,
            },
            StateChange::Policy {
                route: route.clone(),
                policy_version: 7,
            },
            StateChange::Pacing {
                route: route.clone(),
                mode: crate::pacing::Mode::PenaltyExtending,
            },
            StateChange::CallBack {
                route: route.clone(),
                deadline_ms: 1_704_110_431_250,
            },
            StateChange::Reset {
                route,
                cooldown_until_ms: 0,
            },
        ];
        for change in changes {
            let text = encode(u64::MAX, &change).expect("relayed").to_string();
            assert_eq!(decode(&text), Some((u64::MAX, change)));
        }
        assert_eq!(decode("{}"), None);
    }
}
