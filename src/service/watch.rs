//! Watch: scope changes pushed to workers so they do not poll.
//!
//! State changes are published once on an [`EventHub`](crate::events::EventHub) (a broadcast
//! channel); each Watch stream has its own task that filters them for the
//! scopes it names, turns cooldown ends (which are instants, not changes)
//! into events with a timer, and writes into a bounded per-stream channel.
//!
//! A consumer that stops reading fills its channel; rather than buffer
//! without bound, the task puts a final RESOURCE_EXHAUSTED status in the last
//! free place and ends — the worker reconnects and gets a fresh snapshot,
//! which is all it needs (scope state is a level, not a log). The task also
//! ends when the client goes away, when the broadcast dropped events for it,
//! and on server shutdown (with UNAVAILABLE), so no task outlives its stream.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{broadcast, mpsc};
use tokio_util::sync::CancellationToken;
use tollgate_proto::v1::{self, ScopeEvent, ScopeEventKind};
use tollgate_vocab::clock::{Clock, to_unix_ms};
use tonic::Status;

use crate::events::{CooldownSupport, PolicySnapshot, ScopeSnapshot, StateChange};
use crate::pacing::{Mode, holds_first_attempts};
use crate::scope::{EvidenceLevel, ScopeKey};

/// A cooldown's end is re-checked at least this often, because the wall
/// clock may jump (or, under test, be moved by hand).
const RECHECK: Duration = Duration::from_secs(1);

/// One watched scope and what its watcher has been told.
#[derive(Debug, Clone)]
pub struct Watched {
    /// Echoed in every event, as the worker named it.
    pub scope: v1::Scope,
    /// The scope's key.
    pub key: ScopeKey,
    /// The effective cooldown last announced; 0 when none.
    pub cooldown_until_ms: i64,
    /// The cooldown's end has been announced.
    pub ended_sent: bool,
    /// The policy version last announced.
    pub policy_version: u64,
    /// The freeze last announced.
    pub frozen: Option<String>,
    /// The corroboration of the cooldown last announced, or read when the
    /// watch opened.
    pub support: CooldownSupport,
    /// Whether first attempts wait out the cooldown, by the policy.
    pub hold_first_attempts: bool,
    /// The pacing mode last announced by a PACING_CHANGED event, or read
    /// when the watch opened.
    pub pacing: Option<Mode>,
    /// The latest deadline of the last CALL_BACK sent; 0 when none.
    pub call_back_until_ms: i64,
}

impl Watched {
    /// A watched scope, named by the worker as `scope`, starting from the
    /// core's snapshot of it at `now_ms`.
    pub fn new(scope: v1::Scope, snapshot: ScopeSnapshot, now_ms: i64) -> Self {
        Watched {
            scope,
            ended_sent: snapshot.cooldown_until_ms <= now_ms,
            key: snapshot.key,
            cooldown_until_ms: snapshot.cooldown_until_ms,
            policy_version: snapshot.policy_version,
            frozen: snapshot.frozen,
            support: snapshot.support,
            hold_first_attempts: snapshot.hold_first_attempts,
            pacing: snapshot.pacing,
            call_back_until_ms: 0,
        }
    }

    fn event(&self, kind: ScopeEventKind, now_ms: i64) -> ScopeEvent {
        ScopeEvent {
            scope: Some(self.scope.clone()),
            kind: kind.into(),
            cooldown_until_unix_ms: self.cooldown_until_ms,
            policy_version: self.policy_version,
            frozen: self.frozen.is_some(),
            reason: self.frozen.clone().unwrap_or_default(),
            cooldown_corroborated: self.support.corroborated,
            cooldown_workers: self.support.workers,
            hold_first_attempts: holds_first_attempts(
                self.hold_first_attempts,
                self.pacing.unwrap_or_default(),
                self.support.corroborated,
                self.cooldown_until_ms,
                self.support.closed_until_ms,
                now_ms,
            ),
            pacing_state: self
                .pacing
                .map(|m| m.as_str().to_owned())
                .unwrap_or_default(),
            call_back_deadline_unix_ms: if kind == ScopeEventKind::CallBack {
                self.call_back_until_ms
            } else {
                0
            },
        }
    }
}

type Tx = mpsc::Sender<Result<ScopeEvent, Status>>;

/// Whether the stream goes on.
enum Flow {
    Go,
    Stop,
}

fn send(tx: &Tx, event: ScopeEvent) -> Flow {
    // This task is the only sender, so capacity cannot shrink under us; the
    // last free place is kept for the status that ends a lagging stream.
    if tx.capacity() <= 1 {
        let _ = tx.try_send(Err(Status::resource_exhausted(
            "watch consumer fell behind and its buffer is full; reconnect for a fresh snapshot",
        )));
        return Flow::Stop;
    }
    match tx.try_send(Ok(event)) {
        Ok(()) => Flow::Go,
        Err(_) => Flow::Stop,
    }
}

/// Runs one Watch stream until its client, the server or the buffer ends it.
pub async fn run(
    mut watched: Vec<Watched>,
    mut changes: broadcast::Receiver<StateChange>,
    tx: Tx,
    clock: Arc<dyn Clock>,
    shutdown: CancellationToken,
) {
    let now = to_unix_ms(clock.now());
    for w in &watched {
        if let Flow::Stop = send(&tx, w.event(ScopeEventKind::Snapshot, now)) {
            return;
        }
    }
    loop {
        let now = to_unix_ms(clock.now());
        for w in watched.iter_mut() {
            if w.cooldown_until_ms > 0 && !w.ended_sent && w.cooldown_until_ms <= now {
                w.ended_sent = true;
                if let Flow::Stop = send(&tx, w.event(ScopeEventKind::CooldownEnded, now)) {
                    return;
                }
            }
        }
        let next_end = watched
            .iter()
            .filter(|w| w.cooldown_until_ms > now && !w.ended_sent)
            .map(|w| w.cooldown_until_ms)
            .min();
        let wait = next_end
            .map(|end| Duration::from_millis(u64::try_from(end - now).unwrap_or(1)).min(RECHECK));
        tokio::select! {
            biased;
            () = shutdown.cancelled() => {
                let _ = tx.try_send(Err(Status::unavailable(
                    "coordinator shutting down; reconnect to watch again",
                )));
                return;
            }
            () = tx.closed() => return,
            change = changes.recv() => match change {
                Ok(change) => {
                    if let Flow::Stop = apply(&mut watched, &change, to_unix_ms(clock.now()), &tx) {
                        return;
                    }
                }
                Err(broadcast::error::RecvError::Lagged(_)) => {
                    let _ = tx.try_send(Err(Status::resource_exhausted(
                        "watch stream missed scope changes; reconnect for a fresh snapshot",
                    )));
                    return;
                }
                Err(broadcast::error::RecvError::Closed) => return,
            },
            () = tokio::time::sleep(wait.unwrap_or(RECHECK)), if wait.is_some() => {}
        }
    }
}

/// Applies one change to every watched scope it covers, sending what each
/// watcher must hear; `now_ms` decides whether a cooldown left after a
/// reset is still running.
fn apply(watched: &mut [Watched], change: &StateChange, now_ms: i64, tx: &Tx) -> Flow {
    for w in watched.iter_mut() {
        for kind in events_for(w, change, now_ms) {
            if let Flow::Stop = send(tx, w.event(kind, now_ms)) {
                return Flow::Stop;
            }
        }
    }
    Flow::Go
}

/// What `change` means for one watcher (updating what it has been told):
/// usually nothing or one event; a reset that lowers a running cooldown is
/// an end (the client clears its cooldown) and, if the caller scope's
/// cooldown still runs, a new start.
fn events_for(w: &mut Watched, change: &StateChange, now_ms: i64) -> Vec<ScopeEventKind> {
    let kind = match change {
        StateChange::Cooldown {
            level,
            cooldown_until_ms,
            support,
        } => {
            let covers = match level {
                EvidenceLevel::Route(route) => *route == w.key.route,
                EvidenceLevel::Caller(caller) => *caller == w.key.route.caller_scope,
            };
            if !covers || *cooldown_until_ms < w.cooldown_until_ms {
                return Vec::new();
            }
            if *cooldown_until_ms == w.cooldown_until_ms {
                // The same cooldown: news only if its support changed
                // while it still runs.
                if w.ended_sent
                    || *cooldown_until_ms <= now_ms
                    || support.corroborated == w.support.corroborated
                {
                    return Vec::new();
                }
                w.support = *support;
                ScopeEventKind::CooldownSupportChanged
            } else {
                w.cooldown_until_ms = *cooldown_until_ms;
                w.support = *support;
                w.ended_sent = false;
                ScopeEventKind::CooldownStarted
            }
        }
        StateChange::Freeze { route, reason } => {
            if *route != w.key.route || *reason == w.frozen {
                return Vec::new();
            }
            w.frozen = reason.clone();
            if reason.is_some() {
                ScopeEventKind::Frozen
            } else {
                ScopeEventKind::Unfrozen
            }
        }
        StateChange::Policy {
            route,
            policy_version,
        } => {
            if *route != w.key.route || *policy_version == w.policy_version {
                return Vec::new();
            }
            w.policy_version = *policy_version;
            ScopeEventKind::PolicyChanged
        }
        StateChange::Policies(PolicySnapshot(set)) => {
            let policy = set.resolve(&w.key.route);
            if policy.policy_version == w.policy_version {
                return Vec::new();
            }
            w.policy_version = policy.policy_version;
            w.hold_first_attempts = policy.hold_first_attempts;
            ScopeEventKind::PolicyChanged
        }
        StateChange::Pacing { route, mode } => {
            if *route != w.key.route || w.pacing == Some(*mode) {
                return Vec::new();
            }
            w.pacing = Some(*mode);
            ScopeEventKind::PacingChanged
        }
        StateChange::CallBack { route, deadline_ms } => {
            if *route != w.key.route {
                return Vec::new();
            }
            w.call_back_until_ms = *deadline_ms;
            ScopeEventKind::CallBack
        }
        StateChange::Reset {
            route,
            cooldown_until_ms,
        } => {
            if *route != w.key.route || w.ended_sent || *cooldown_until_ms >= w.cooldown_until_ms {
                return Vec::new();
            }
            w.cooldown_until_ms = *cooldown_until_ms;
            w.ended_sent = *cooldown_until_ms <= now_ms;
            if w.ended_sent {
                return vec![ScopeEventKind::CooldownEnded];
            }
            return vec![
                ScopeEventKind::CooldownEnded,
                ScopeEventKind::CooldownStarted,
            ];
        }
    };
    vec![kind]
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::events::EventHub;
    use crate::scope::{Priority, RouteKey};
    use tollgate_vocab::clock::{ManualClock, from_unix_ms};

    const T0: i64 = 1_700_000_000_000;

    fn watched() -> Vec<Watched> {
        vec![Watched {
            scope: v1::Scope {
                caller_scope: "c".into(),
                route: "r".into(),
                priority: 0,
            },
            key: ScopeKey::new("c", "r", Priority::Normal),
            cooldown_until_ms: 0,
            ended_sent: false,
            policy_version: 1,
            frozen: None,
            support: CooldownSupport::default(),
            hold_first_attempts: true,
            pacing: None,
            call_back_until_ms: 0,
        }]
    }

    fn cooldown(caller: &str, until: i64) -> StateChange {
        StateChange::Cooldown {
            level: EvidenceLevel::Route(RouteKey {
                caller_scope: caller.into(),
                route: "r".into(),
            }),
            cooldown_until_ms: until,
            support: CooldownSupport::default(),
        }
    }

    #[tokio::test]
    async fn a_lagging_consumer_is_ended_with_a_clear_status() {
        let hub = EventHub::default();
        let changes = hub.subscribe();
        for i in 1..=10 {
            hub.publish(cooldown("c", T0 + i * 1000));
        }
        let (tx, mut rx) = mpsc::channel(4);
        let clock = Arc::new(ManualClock::new(from_unix_ms(T0)));
        run(watched(), changes, tx, clock, CancellationToken::new()).await;
        let mut got = Vec::new();
        while let Some(item) = rx.recv().await {
            got.push(item);
        }
        assert_eq!(got.len(), 4);
        assert!(got[..3].iter().all(Result::is_ok));
        let status = got[3].as_ref().expect_err("ends with a status");
        assert_eq!(status.code(), tonic::Code::ResourceExhausted);
    }

    #[tokio::test(start_paused = true)]
    async fn cooldowns_start_and_end_and_other_scopes_are_filtered() {
        let hub = EventHub::default();
        let changes = hub.subscribe();
        let (tx, mut rx) = mpsc::channel(16);
        let clock = Arc::new(ManualClock::new(from_unix_ms(T0)));
        let shutdown = CancellationToken::new();
        let task = tokio::spawn(run(watched(), changes, tx, clock.clone(), shutdown.clone()));
        let kind = |item: Option<Result<ScopeEvent, Status>>| {
            item.expect("an event").expect("not a status").kind()
        };
        assert_eq!(kind(rx.recv().await), ScopeEventKind::Snapshot);
        hub.publish(cooldown("other", T0 + 5000));
        hub.publish(cooldown("c", T0 + 5000));
        let started = rx.recv().await.expect("event").expect("ok");
        assert_eq!(started.kind(), ScopeEventKind::CooldownStarted);
        assert_eq!(started.cooldown_until_unix_ms, T0 + 5000);
        clock.advance(Duration::from_secs(6));
        assert_eq!(kind(rx.recv().await), ScopeEventKind::CooldownEnded);
        shutdown.cancel();
        let last = rx.recv().await.expect("a final status");
        assert_eq!(last.expect_err("status").code(), tonic::Code::Unavailable);
        task.await.expect("the task ends with the stream");
    }

    /// A call-back reaches the watchers of its route only, with the
    /// deadline it names; every other event says 0 there.
    #[test]
    fn a_call_back_names_its_deadline_to_its_route_only() {
        let call = |caller: &str| StateChange::CallBack {
            route: RouteKey {
                caller_scope: caller.into(),
                route: "r".into(),
            },
            deadline_ms: T0 + 30_000,
        };
        let mut w = watched().remove(0);
        assert!(events_for(&mut w, &call("other"), T0).is_empty());
        assert_eq!(
            events_for(&mut w, &call("c"), T0),
            [ScopeEventKind::CallBack]
        );
        let event = w.event(ScopeEventKind::CallBack, T0);
        assert_eq!(event.call_back_deadline_unix_ms, T0 + 30_000);
        assert_eq!(event.cooldown_until_unix_ms, 0, "no state moved");
        let other = w.event(ScopeEventKind::PolicyChanged, T0);
        assert_eq!(other.call_back_deadline_unix_ms, 0);
    }

    /// A corroborated cooldown that closes the route holds first attempts
    /// until its end, also in its last two seconds, as the Report answer
    /// says: the event carries the closing hint's end.
    #[test]
    fn a_closing_cooldown_holds_first_attempts_to_its_end() {
        let end = T0 + 10_000;
        let closing = |closed_until_ms| StateChange::Cooldown {
            level: EvidenceLevel::Route(RouteKey {
                caller_scope: "c".into(),
                route: "r".into(),
            }),
            cooldown_until_ms: end,
            support: CooldownSupport {
                corroborated: true,
                workers: 3,
                closed_until_ms,
            },
        };
        let mut w = watched().remove(0);
        events_for(&mut w, &closing(end), T0);
        let late = end - 1_000;
        assert!(
            w.event(ScopeEventKind::CooldownStarted, T0)
                .hold_first_attempts
        );
        assert!(
            w.event(ScopeEventKind::CooldownStarted, late)
                .hold_first_attempts
        );
        assert!(
            !w.event(ScopeEventKind::CooldownStarted, end)
                .hold_first_attempts
        );
        // A short cooldown (no closing hint) holds retries only near its end.
        let mut w = watched().remove(0);
        events_for(&mut w, &closing(0), T0);
        assert!(
            !w.event(ScopeEventKind::CooldownStarted, late)
                .hold_first_attempts
        );
    }

    /// The same cooldown, newly corroborated, is news (first attempts may
    /// now be held); the same support again, or after the end, is not.
    #[test]
    fn a_cooldown_that_gains_support_is_announced_once() {
        let supported = |corroborated| StateChange::Cooldown {
            level: EvidenceLevel::Route(RouteKey {
                caller_scope: "c".into(),
                route: "r".into(),
            }),
            cooldown_until_ms: T0 + 3_000,
            support: CooldownSupport {
                corroborated,
                workers: if corroborated { 3 } else { 1 },
                closed_until_ms: 0,
            },
        };
        let mut w = watched().remove(0);
        assert_eq!(
            events_for(&mut w, &supported(false), T0),
            [ScopeEventKind::CooldownStarted]
        );
        assert!(events_for(&mut w, &supported(false), T0).is_empty());
        assert_eq!(
            events_for(&mut w, &supported(true), T0 + 1_000),
            [ScopeEventKind::CooldownSupportChanged]
        );
        assert_eq!(
            w.event(ScopeEventKind::CooldownSupportChanged, T0)
                .cooldown_workers,
            3
        );
        assert!(events_for(&mut w, &supported(true), T0 + 1_000).is_empty());
        assert!(
            events_for(&mut w, &supported(false), T0 + 3_000).is_empty(),
            "the cooldown is over"
        );
    }

    #[test]
    fn a_reset_ends_the_cooldown_and_restarts_the_one_left() {
        let route = RouteKey {
            caller_scope: "c".into(),
            route: "r".into(),
        };
        let mut w = watched().remove(0);
        assert_eq!(
            events_for(&mut w, &cooldown("c", T0 + 30_000), T0),
            [ScopeEventKind::CooldownStarted]
        );
        let reset = |until| StateChange::Reset {
            route: route.clone(),
            cooldown_until_ms: until,
        };
        assert_eq!(
            events_for(&mut w, &reset(T0 + 10_000), T0),
            [
                ScopeEventKind::CooldownEnded,
                ScopeEventKind::CooldownStarted
            ]
        );
        assert_eq!(w.cooldown_until_ms, T0 + 10_000);
        assert_eq!(
            events_for(&mut w, &reset(0), T0),
            [ScopeEventKind::CooldownEnded]
        );
        assert!(
            events_for(&mut w, &reset(0), T0).is_empty(),
            "nothing left to end"
        );
    }
}
