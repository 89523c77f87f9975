//! Scope state changes and where they are published: the core's side of
//! Watch.
//!
//! Every change (a cooldown raised by a report, a freeze, a policy change, a
//! reset) is published once by the coordinator core on the [`EventHub`], a
//! broadcast channel beside the state it describes (mini-redis keeps its
//! pub/sub in `db.rs` for the same reason). The gRPC Watch streams in
//! `service::watch` and the Redis relay between replicas only subscribe to
//! it, so this module depends on nothing above the store.

use std::sync::Arc;

use tokio::sync::{broadcast, mpsc};

use crate::policy::PolicySet;
use crate::scope::{EvidenceLevel, RouteKey, ScopeKey};

/// Changes kept for slow stream tasks before they see `Lagged`.
const HUB_CAPACITY: usize = 4096;

/// How well distinct workers' hints support a cooldown (see
/// [`crate::hints::corroboration`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CooldownSupport {
    /// It rests on enough distinct workers; false: it is one worker's
    /// claim, held to the uncorroborated cap.
    pub corroborated: bool,
    /// Distinct workers whose claims reach it.
    pub workers: u32,
    /// The end of the latest hint that closed the route (longer than two
    /// windows; `PacingView::closed_until_ms`), 0 when none: first attempts
    /// wait for it to pass, also in the last two seconds of the cooldown.
    pub closed_until_ms: i64,
}

/// A change of scope state, as published by the coordinator core.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StateChange {
    /// A cooldown started or was extended at this level.
    Cooldown {
        /// A route, or a whole caller scope.
        level: EvidenceLevel,
        /// The new cooldown.
        cooldown_until_ms: i64,
        /// Whether distinct workers' hints corroborate it, and how many.
        support: CooldownSupport,
    },
    /// An operator froze (`Some(reason)`) or unfroze a route.
    Freeze {
        /// The route.
        route: RouteKey,
        /// The reason, when frozen.
        reason: Option<String>,
    },
    /// The policy set was replaced (Admin API, reload): each stream
    /// re-resolves its scopes, because a rule's patterns may cover routes
    /// no one could list in advance.
    Policies(PolicySnapshot),
    /// The policy of a route changed.
    Policy {
        /// The route.
        route: RouteKey,
        /// Its new version.
        policy_version: u64,
    },
    /// A route's learned pacing changed in a way workers act on
    /// (`Coordinator::announce_pacing` says which): a penalty, saturation,
    /// a stated pace, or the end of a calm state, when held counts must go.
    Pacing {
        /// The route.
        route: RouteKey,
        /// The mode now.
        mode: crate::pacing::Mode,
    },
    /// A route saturated at a stated pace calls back the intents told to
    /// ask again whose deadline is at or before `deadline_ms`: its slots
    /// go unused (`crate::pacing::PacingState::call_back`).
    CallBack {
        /// The route.
        route: RouteKey,
        /// The latest deadline called back.
        deadline_ms: i64,
    },
    /// An operator reset a route: its own cooldown is gone, so a watcher
    /// must drop the one it holds (a `max` merge would keep it forever).
    Reset {
        /// The route.
        route: RouteKey,
        /// The effective cooldown left after the reset (the caller scope's,
        /// which a route reset does not touch); 0 when none.
        cooldown_until_ms: i64,
    },
}

/// A policy set as published; equal when it is the same set.
#[derive(Debug, Clone)]
pub struct PolicySnapshot(pub Arc<PolicySet>);

impl PartialEq for PolicySnapshot {
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.0, &other.0)
    }
}

impl Eq for PolicySnapshot {}

/// Where state changes are published; every Watch stream subscribes.
#[derive(Debug, Clone)]
pub struct EventHub {
    tx: broadcast::Sender<StateChange>,
    /// With a shared store, where this replica's changes leave for the
    /// others (the Redis relay); `None` for a single coordinator.
    outbox: Option<mpsc::Sender<StateChange>>,
}

impl Default for EventHub {
    fn default() -> Self {
        EventHub {
            tx: broadcast::channel(HUB_CAPACITY).0,
            outbox: None,
        }
    }
}

impl EventHub {
    /// A hub whose published changes are also queued (up to `capacity`) on
    /// the returned receiver, for a relay to other replicas.
    pub fn relayed(capacity: usize) -> (EventHub, mpsc::Receiver<StateChange>) {
        let (tx, rx) = mpsc::channel(capacity);
        let hub = EventHub {
            outbox: Some(tx),
            ..EventHub::default()
        };
        (hub, rx)
    }

    /// Publishes a change to every current watcher (none is fine), and to
    /// other replicas when relayed. A full outbox drops the change for the
    /// other replicas rather than slowing the request: their workers still
    /// see it in every answer and on their next Watch snapshot.
    pub fn publish(&self, change: StateChange) {
        if let Some(outbox) = &self.outbox
            && outbox.try_send(change.clone()).is_err()
        {
            tracing::warn!("relay outbox full: a scope change stays on this replica");
        }
        let _ = self.tx.send(change);
    }

    /// Delivers a change that another replica published, to local
    /// watchers only (it must not go back out).
    pub fn publish_remote(&self, change: StateChange) {
        let _ = self.tx.send(change);
    }

    /// A receiver of changes published from now on.
    pub fn subscribe(&self) -> broadcast::Receiver<StateChange> {
        self.tx.subscribe()
    }
}

/// What a watcher is told about one scope when its stream opens: the
/// level that later [`StateChange`]s are applied to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ScopeSnapshot {
    /// The scope watched.
    pub key: ScopeKey,
    /// The effective cooldown; 0 when none.
    pub cooldown_until_ms: i64,
    /// The scope's policy version now.
    pub policy_version: u64,
    /// The freeze reason, when frozen.
    pub frozen: Option<String>,
    /// Whether first attempts wait out the cooldown (the policy's
    /// `hold_first_attempts`).
    pub hold_first_attempts: bool,
    /// The route's pacing mode now (`None`: the store holds nothing for
    /// it). A watcher's first event says whether first attempts are held,
    /// as a Report answer would, so it needs the mode as much as the
    /// changes after.
    pub pacing: Option<crate::pacing::Mode>,
    /// How distinct workers support the effective cooldown now, and the
    /// end of the latest closing hint.
    pub support: CooldownSupport,
}
