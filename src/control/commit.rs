//! How a change becomes durable and in force, and how a replica follows
//! changes made through the others.
//!
//! A change is computed from the [`State`] the replica runs, then made
//! durable — the state file (one coordinator), or a compare-and-set of
//! the shared document in the store with its audit records (replicas) —
//! and only then put in force. When another replica committed first, the
//! change is computed again from the newer state (so a version check sees
//! the other SRE's change and refuses as stale).
//!
//! Replicas follow the shared document two ways: a notice from the store
//! after every commit, and a revision check every [`RECONCILE_EVERY`] so a
//! missed notice cannot leave a replica stale for longer than that.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::Notify;
use tracing::{debug, warn};

use crate::config::PolicyDoc;
use crate::events::{PolicySnapshot, StateChange};
use crate::scope::RouteKey;
use crate::store::{ControlStateStore, StoreError};

use super::audit::{self, AuditRecord};
use super::overrides::Overrides;
use super::persist::{self, FreezeRecord, PersistError, StateFile};
use super::{Control, ControlError};

/// How often a replica re-checks the shared revision without a notice.
pub const RECONCILE_EVERY: Duration = Duration::from_secs(1);
/// Commits tried before a change gives up under contention.
const CAS_ATTEMPTS: usize = 8;

/// What a replica runs: the composed document and its layers, the freezes.
#[derive(Debug, Clone)]
pub(super) struct State {
    /// The running document: `overrides` over `file_doc`, versions explicit.
    pub(super) doc: PolicyDoc,
    /// The policy file's layer as last applied.
    pub(super) file_doc: PolicyDoc,
    /// The runtime layer.
    pub(super) overrides: Overrides,
    /// Digest of the policy-file text the file layer came from.
    pub(super) file_digest: u64,
    pub(super) freezes: BTreeMap<RouteKey, FreezeRecord>,
    /// The shared revision this state is; `None` before it was read (or
    /// with no shared store).
    pub(super) rev: Option<u64>,
    /// Digest of this replica's own policy file as last read: a reload is
    /// triggered by this replica's file changing, not by another replica
    /// having applied a different one.
    pub(super) local_digest: u64,
}

impl State {
    pub(super) fn to_file(&self) -> StateFile {
        StateFile {
            format: persist::FORMAT,
            file_digest: self.file_digest,
            doc: self.doc.clone(),
            freezes: self.freezes.values().cloned().collect(),
            file_doc: Some(self.file_doc.clone()),
            overrides: self.overrides.clone(),
            // Mutes are the Control's, not the shared document's: `save`
            // fills them in for the state file.
            mutes: Vec::new(),
        }
    }

    /// The state `saved` describes, kept at `rev`.
    pub(super) fn from_saved(saved: StateFile, rev: Option<u64>, local_digest: u64) -> State {
        let freezes = saved
            .freezes
            .into_iter()
            .map(|f| {
                let key = RouteKey {
                    caller_scope: f.caller_scope.clone(),
                    route: f.route.clone(),
                };
                (key, f)
            })
            .collect();
        State {
            // A state file from before the layers: its document is the file
            // layer, with no runtime change known as one.
            file_doc: saved.file_doc.unwrap_or_else(|| saved.doc.clone()),
            doc: saved.doc,
            overrides: saved.overrides,
            file_digest: saved.file_digest,
            freezes,
            rev,
            local_digest,
        }
    }
}

/// What a change produces from the state it saw.
pub(super) struct Outcome<T> {
    /// The new state; `None` leaves the document alone.
    pub(super) next: Option<State>,
    /// The audit records of the change (their `seq` is assigned on commit).
    pub(super) records: Vec<AuditRecord>,
    /// What the caller is told.
    pub(super) value: T,
}

impl Control {
    fn shared(&self) -> Option<&dyn ControlStateStore> {
        self.store.control_state()
    }

    /// Runs `op` on the latest state and commits its outcome, again from
    /// a newer state when another replica committed first.
    pub(super) async fn change<T>(
        &self,
        op: impl Fn(&State, i64) -> Result<Outcome<T>, ControlError>,
    ) -> Result<(T, Vec<AuditRecord>), ControlError> {
        let mut st = self.state.lock().await;
        for _ in 0..CAS_ATTEMPTS {
            self.refresh_locked(&mut st).await?;
            let Outcome {
                next,
                records,
                value,
            } = op(&st, self.now_ms())?;
            if let Some(records) = self.commit(&mut st, next, records).await? {
                return Ok((value, records));
            }
            debug!("another replica changed the runtime state first; computing again");
        }
        Err(StoreError::Unavailable("runtime state contended; try again".into()).into())
    }

    /// Makes `next` durable with `records`, then puts it in force; `None`
    /// when the shared document moved on meanwhile (nothing was written).
    async fn commit(
        &self,
        st: &mut State,
        next: Option<State>,
        mut records: Vec<AuditRecord>,
    ) -> Result<Option<Vec<AuditRecord>>, ControlError> {
        if let Some(next) = &next {
            next.doc.build()?;
        }
        match self.shared() {
            Some(shared) => {
                let bodies: Vec<String> = records.iter().map(audit::body).collect();
                let expected = next.as_ref().map(|_| st.rev.unwrap_or(0));
                if expected.is_none() && bodies.is_empty() {
                    return Ok(Some(records));
                }
                let json = next.as_ref().map(|n| to_json(&n.to_file()));
                let Some(done) = shared
                    .commit(expected, json.as_deref().unwrap_or(""), &bodies)
                    .await?
                else {
                    return Ok(None);
                };
                for (record, seq) in records.iter_mut().zip(done.seqs) {
                    record.seq = seq;
                    self.audit.keep(record);
                }
                if let Some(mut next) = next {
                    next.rev = Some(done.rev);
                    self.put_in_force(st, next)?;
                }
            }
            None => {
                if let Some(next) = &next {
                    self.save(next)?;
                }
                records = records.into_iter().map(|r| self.audit.append(r)).collect();
                if let Some(next) = next {
                    self.put_in_force(st, next)?;
                }
            }
        }
        Ok(Some(records))
    }

    pub(super) fn save(&self, st: &State) -> Result<(), PersistError> {
        match &self.paths.state_file {
            Some(path) => {
                let mut file = st.to_file();
                file.mutes = self.mute_records();
                persist::save(path, &file)
            }
            None => Ok(()),
        }
    }

    /// Replaces the running state with `next`, telling watchers when the
    /// policies changed.
    pub(super) fn put_in_force(&self, st: &mut State, next: State) -> Result<(), ControlError> {
        let changed = next.doc != st.doc;
        let set = changed.then(|| next.doc.build()).transpose()?;
        let local_digest = st.local_digest;
        *st = next;
        st.local_digest = local_digest;
        if let Some(set) = set {
            self.policies.replace(set);
            self.hub.publish(StateChange::Policies(PolicySnapshot(
                self.policies.current(),
            )));
        }
        crate::telemetry::freezes::record_freezes(
            st.freezes
                .iter()
                .map(|(route, f)| (route, f.since_ms, f.expires_at_ms)),
        );
        Ok(())
    }

    /// Brings `st` up to the shared revision (nothing without a shared
    /// store). With nothing shared yet — the first replica to start, or a
    /// Redis that lost its data — this replica's state becomes the shared one.
    pub(super) async fn refresh_locked(&self, st: &mut State) -> Result<(), ControlError> {
        let Some(shared) = self.shared() else {
            return Ok(());
        };
        let rev = shared.revision().await?;
        if st.rev == Some(rev) {
            return Ok(());
        }
        if rev == 0
            && let Some(done) = shared.commit(Some(0), &to_json(&st.to_file()), &[]).await?
        {
            if st.rev.is_some() {
                // The store lost its data, route keys with their
                // freezes included: put the freezes back in force.
                tracing::warn!(
                    freezes = st.freezes.len(),
                    "the store lost the shared runtime state; restored this replica's"
                );
                self.follow_freezes(&BTreeMap::new(), &st.freezes).await?;
            }
            st.rev = Some(done.rev);
            return Ok(());
        }
        let Some(snapshot) = shared.load().await? else {
            return Ok(());
        };
        let saved: StateFile =
            serde_json::from_str(&snapshot.state).map_err(|e| PersistError::Invalid {
                path: "the shared runtime state in the store".into(),
                reason: e.to_string(),
            })?;
        let next = State::from_saved(saved, Some(snapshot.rev), st.local_digest);
        self.follow_freezes(&st.freezes, &next.freezes).await?;
        self.put_in_force(st, next)
    }

    /// Puts in the store the freezes recorded or lifted since `before`
    /// (through any replica): the replica that recorded one applies it
    /// too, but if it died in between, the others (or its own restart, from
    /// nothing) still do. Setting a freeze twice changes nothing. From an
    /// empty `before`, it puts every freeze back (a restart, a store that
    /// lost its data).
    pub(super) async fn follow_freezes(
        &self,
        before: &BTreeMap<RouteKey, FreezeRecord>,
        after: &BTreeMap<RouteKey, FreezeRecord>,
    ) -> Result<(), ControlError> {
        let now = self.now_ms();
        for (route, f) in after {
            if before.get(route).map(|b| &b.reason) != Some(&f.reason) {
                self.store
                    .set_freeze(route, Some(f.reason.clone()), now)
                    .await?;
            }
        }
        for route in before.keys().filter(|r| !after.contains_key(*r)) {
            self.store.set_freeze(route, None, now).await?;
        }
        Ok(())
    }

    /// Follows changes made through other replicas: on each notice from
    /// the store, and every [`RECONCILE_EVERY`] in case one was missed.
    /// Returns at once without a shared store; otherwise runs as long as
    /// it is polled.
    pub async fn follow_shared(&self) {
        let Some(shared) = self.shared() else {
            return std::future::pending().await;
        };
        let notify = Arc::new(Notify::new());
        let notices = shared.notices(Arc::clone(&notify));
        let reconcile = async {
            let mut failing = false;
            loop {
                tokio::select! {
                    () = notify.notified() => {}
                    () = tokio::time::sleep(RECONCILE_EVERY) => {}
                }
                let mut st = self.state.lock().await;
                match self.refresh_locked(&mut st).await {
                    Ok(()) => failing = false,
                    Err(err) if !failing => {
                        failing = true;
                        warn!(cause = %err, "reading the shared runtime state failed; running the last one read");
                    }
                    Err(_) => {}
                }
            }
        };
        tokio::select! {
            () = notices => {}
            () = reconcile => {}
        }
    }
}

pub(super) fn to_json<T: serde::Serialize>(value: &T) -> String {
    serde_json::to_string(value).unwrap_or_default()
}
