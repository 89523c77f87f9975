//! Runtime control of the coordinator: the operations behind the Admin API,
//! live reload and the state file, free of gRPC.
//!
//! [`Control`] owns the running [`PolicyDoc`] (the rules as written, with
//! explicit versions) and the freezes. Every change goes the same way, under
//! one lock so a replica's changes are totally ordered:
//! 1. compute the new state from the latest one and validate it
//!    ([`PolicyDoc::build`]);
//! 2. make it durable with its audit records: the state file with one
//!    coordinator; with replicas on a shared store, a compare-and-set of the
//!    shared document (see `commit`), so a change through any replica is one
//!    change of the fleet and an acknowledged change survives any replica;
//! 3. put it in force ([`SharedPolicies::replace`]) and publish it to Watch
//!    streams (other replicas follow within a second).
//!
//! # Layers
//! The running policy is the policy file with runtime changes laid over it
//! (see `overrides`): a reload keeps an SRE's change to a rule the file did
//! not touch; `policy clear` hands a rule back to the file.
//!
//! # Versions
//! A changed rule gets `max(every version in use) + 1`, so a new version is
//! never one a worker has seen before — or the `policy_version` the policy
//! file names for it, when that is higher still (the file's key means what
//! it says; a lower one cannot be honoured without going back, so it is
//! logged and the next version used). Rules a change leaves effectively
//! unchanged keep their version (and their workers see no event).
//!
//! # Outstanding leases when a policy tightens
//! They are honoured until they expire (at most the lease TTL, 10 s by
//! default, 300 s at most): their tokens were charged to the window when
//! granted, so they already count against the tightened allowance, and a
//! worker cannot be made to give back a token it may be spending right now.
//! Every lease *after* the change is computed under the new policy, and the
//! balance is recomputed from the same spend and first attempts — a ratio
//! change rescales the balance, it never refills it. The same holds for a
//! freeze: no new lease or slot, outstanding leases run out.

pub mod audit;
mod commit;
mod mute;
pub mod overrides;
pub mod persist;
mod plan;
mod scopes;
mod versions;

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;

use tollgate_vocab::clock::{Clock, to_unix_ms};

use crate::config::{ConfigError, MAX_RULES, PolicyDoc, RuleSpec};
use crate::events::EventHub;
use crate::policy::{PolicySpec, SharedPolicies};
use crate::scope::RouteKey;
use crate::store::{Store, StoreError};

use self::audit::{AuditLog, AuditRecord};
use self::commit::{Outcome, State, to_json};
use self::overrides::Overrides;
use self::persist::{FreezeRecord, PersistError};
use self::versions::{pin_versions, relayer};

pub use self::commit::RECONCILE_EVERY;
pub use self::mute::MUTE_FOREVER_MS;
pub use self::plan::{Change, ChangeKind, plan, spec_fields};

/// Who a policy-file reload is recorded as.
pub const FILE_ACTOR: &str = "policy-file";
/// Who an expired freeze is lifted by.
pub const EXPIRY_ACTOR: &str = "expiry";
/// How long a changed policy file must stay the same before a reload
/// applies it. A tool that writes the file in place truncates it first,
/// and an empty file is a valid policy with no rules: read mid-write, it
/// would drop every rule until the next poll.
pub const FILE_SETTLE: std::time::Duration = std::time::Duration::from_millis(100);

/// Why a control operation was refused.
#[derive(Debug, thiserror::Error)]
pub enum ControlError {
    /// The version named is not the rule's current one.
    #[error("{target} is at policy_version {current}, not {expected}; read it again and retry")]
    Stale {
        /// The rule.
        target: String,
        /// Its version now (0: it does not exist).
        current: u64,
        /// The version the caller named.
        expected: u64,
    },
    /// No such rule.
    #[error("no rule {0}")]
    NotFound(String),
    /// The rule is as the policy file says: there is no runtime change to
    /// clear.
    #[error("{0} has no runtime change over the policy file")]
    NoRuntimeChange(String),
    /// The resulting policy is invalid.
    #[error(transparent)]
    Invalid(#[from] ConfigError),
    /// The change could not be made durable, so it was not made.
    #[error(transparent)]
    Persist(#[from] PersistError),
    /// The store failed.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// No policy file is configured (for diff and reload).
    #[error("the coordinator runs without a policy file")]
    NoPolicyFile,
}

/// Where runtime state is kept.
#[derive(Debug, Clone, Default)]
pub struct Paths {
    /// The policy file (live reload, diff).
    pub policy_file: Option<PathBuf>,
    /// The state file; `None` keeps runtime changes in memory only (or in
    /// the shared store, with replicas).
    pub state_file: Option<PathBuf>,
}

/// The runtime controls. Shared by the Admin service and the reload task.
pub struct Control {
    state: tokio::sync::Mutex<State>,
    policies: SharedPolicies,
    store: Arc<dyn Store>,
    hub: EventHub,
    /// This process's copy of the audit: the log itself with one
    /// coordinator; with replicas the shared log is in the store and this
    /// keeps what this replica recorded (and writes `--audit-log`, if set).
    audit: AuditLog,
    clock: Arc<dyn Clock>,
    paths: Paths,
    /// Muted workers by scope; written with every save. A std mutex: it is
    /// only held to copy or swap the map, never across an await.
    mutes: std::sync::Mutex<mute::Mutes>,
}

impl std::fmt::Debug for Control {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Control").finish_non_exhaustive()
    }
}

/// What the caller asks [`Control::set_rule`] to write.
#[derive(Debug, Clone)]
pub struct SetRule {
    /// Caller-scope pattern.
    pub caller_scope: String,
    /// Route pattern.
    pub route: String,
    /// The version read; 0 to create.
    pub expected_version: u64,
    /// The keys.
    pub spec: PolicySpec,
    /// Only the set keys change.
    pub patch: bool,
    /// For the audit log.
    pub reason: String,
}

impl SetRule {
    /// The audit log's name for this change.
    fn action(&self) -> &'static str {
        if self.patch {
            "policy.patch"
        } else {
            "policy.set"
        }
    }
}

/// One audit record of a change made at `at_ms`.
struct Note<'a> {
    who: &'a str,
    action: &'a str,
    reason: &'a str,
    at_ms: i64,
}

impl Note<'_> {
    fn record(&self, target: &str, before: String, after: String, version: u64) -> AuditRecord {
        AuditRecord {
            seq: 0,
            at_ms: self.at_ms,
            who: self.who.to_owned(),
            action: self.action.to_owned(),
            target: target.to_owned(),
            before,
            after,
            policy_version: version,
            reason: self.reason.to_owned(),
        }
    }

    /// One record per rule a whole-document change touched.
    fn changes(&self, changes: &[Change], version: u64) -> Vec<AuditRecord> {
        changes
            .iter()
            .map(|c| {
                let kind = match c.kind {
                    ChangeKind::Added => "added",
                    ChangeKind::Removed => "removed",
                    ChangeKind::Changed => "changed",
                };
                let before: BTreeMap<_, _> = c.fields.iter().map(|(f, b, _)| (f, b)).collect();
                let after: BTreeMap<_, _> = c.fields.iter().map(|(f, _, a)| (f, a)).collect();
                self.record(
                    &c.target,
                    to_json(&before),
                    format!("{kind}: {}", to_json(&after)),
                    version,
                )
            })
            .collect()
    }
}

fn check_size(doc: &PolicyDoc) -> Result<(), ControlError> {
    if doc.rules.len() > MAX_RULES {
        return Err(ConfigError::Invalid {
            place: "[[rule]]".into(),
            reason: format!("at most {MAX_RULES} rules"),
        }
        .into());
    }
    Ok(())
}

impl Control {
    /// Starts from `doc` (the policy file's, with `file_text` its text).
    /// With a shared store, from the shared state when there is one (the
    /// file applied over it if its text differs from the one last applied);
    /// otherwise from the state file when there is one: its document,
    /// re-reconciled with the file if the file changed meanwhile, and its
    /// freezes reapplied to the store.
    // Each argument is a separately owned piece the server shares with the
    // Budget service; a builder would only rename them.
    #[allow(clippy::too_many_arguments)]
    pub async fn start(
        doc: PolicyDoc,
        file_text: Option<&str>,
        policies: SharedPolicies,
        store: Arc<dyn Store>,
        hub: EventHub,
        audit: AuditLog,
        clock: Arc<dyn Clock>,
        paths: Paths,
    ) -> Result<Control, ControlError> {
        let raw = doc;
        let mut file_doc = raw.clone();
        pin_versions(&mut file_doc)?;
        let file_digest = file_text.map_or(0, persist::digest);
        let shared = store.control_state().is_some();
        let saved = match &paths.state_file {
            Some(path) if !shared => persist::load(path)?,
            _ => None,
        };
        let fresh = State {
            doc: file_doc.clone(),
            file_doc,
            overrides: Overrides::default(),
            file_digest,
            freezes: BTreeMap::new(),
            rev: None,
            local_digest: file_digest,
        };
        policies.replace(fresh.doc.build()?);
        let control = Control {
            state: tokio::sync::Mutex::new(fresh),
            policies,
            store,
            hub,
            audit,
            clock,
            paths,
            mutes: std::sync::Mutex::default(),
        };
        let known = if shared {
            control.start_shared().await
        } else {
            control.start_local(saved).await?
        };
        if known.is_some_and(|known| known != file_digest) && file_text.is_some() {
            tracing::warn!(
                "the policy file differs from the one the running state was last reconciled with; applying it over the runtime changes"
            );
            control
                .reload_doc(raw, file_digest, "file changed while stopped")
                .await?;
        }
        Ok(control)
    }

    /// Reads the shared state; returns the digest of the policy-file text
    /// it was last reconciled with (`None`: nothing to compare with).
    async fn start_shared(&self) -> Option<u64> {
        let mut st = self.state.lock().await;
        match self.refresh_locked(&mut st).await {
            Ok(()) => {
                tracing::info!(
                    rev = st.rev,
                    rules = st.doc.rules.len(),
                    freezes = st.freezes.len(),
                    "runtime state shared through the store"
                );
                Some(st.file_digest)
            }
            Err(err) => {
                // Serving the file is what a lone coordinator would do; the
                // reconcile loop adopts the shared state once it answers.
                tracing::warn!(cause = %err,
                    "shared runtime state unreadable; serving the policy file until the store answers");
                None
            }
        }
    }

    /// Restores the state file, if any, reapplying its freezes to the
    /// store; returns the digest of the policy-file text it was last
    /// reconciled with (`None`: no state file yet).
    async fn start_local(
        &self,
        saved: Option<persist::StateFile>,
    ) -> Result<Option<u64>, ControlError> {
        let mut st = self.state.lock().await;
        let Some(saved) = saved else {
            self.save(&st)?;
            return Ok(None);
        };
        let known = saved.file_digest;
        let now = self.now_ms();
        self.reapply_mutes(saved.mutes.clone(), now).await?;
        let mut next = State::from_saved(saved, None, st.local_digest);
        next.freezes
            .retain(|_, f| f.expires_at_ms.is_none_or(|at| at > now));
        self.follow_freezes(&BTreeMap::new(), &next.freezes).await?;
        // The saved document is what was in force: published as a change.
        st.doc = PolicyDoc::default();
        self.put_in_force(&mut st, next)?;
        tracing::info!(
            rules = st.doc.rules.len(),
            freezes = st.freezes.len(),
            "runtime changes reapplied from the state file"
        );
        Ok(Some(known))
    }

    fn now_ms(&self) -> i64 {
        to_unix_ms(self.clock.now())
    }

    /// The running document.
    pub async fn doc(&self) -> PolicyDoc {
        self.state.lock().await.doc.clone()
    }

    /// The runtime layer: which rules SREs changed over the policy file.
    pub async fn overrides(&self) -> Overrides {
        self.state.lock().await.overrides.clone()
    }

    /// The freeze of `route`, if any.
    pub async fn freeze_of(&self, route: &RouteKey) -> Option<FreezeRecord> {
        self.state.lock().await.freezes.get(route).cloned()
    }

    /// This process's audit log (see [`Control::audit_page`] for the
    /// fleet's).
    pub fn audit(&self) -> &AuditLog {
        &self.audit
    }

    /// Up to `limit` audit records older than `before_seq` (0: the newest),
    /// newest first: the shared log with replicas, this process's otherwise.
    pub async fn audit_page(
        &self,
        before_seq: u64,
        limit: usize,
    ) -> Result<Vec<AuditRecord>, ControlError> {
        let Some(shared) = self.store.control_state() else {
            return Ok(self.audit.list(before_seq, limit));
        };
        Ok(shared
            .audit(before_seq, limit)
            .await?
            .iter()
            // A record this version cannot read is skipped, not fatal.
            .filter_map(|line| serde_json::from_str(line).ok())
            .collect())
    }

    /// The configured policy file.
    pub fn policy_file(&self) -> Option<&PathBuf> {
        self.paths.policy_file.as_ref()
    }

    /// Creates, replaces or patches one rule (optimistic on its version).
    /// The rule is a runtime change: it stays over the policy file until
    /// cleared or until the file changes that same rule.
    pub async fn set_rule(&self, who: &str, req: SetRule) -> Result<RuleSpec, ControlError> {
        let action = req.action();
        let (rule, _) = self
            .change(|st, now| {
                let target = format!("{}|{}", req.caller_scope, req.route);
                let index = st.doc.find(&req.caller_scope, &req.route);
                let before = index.map(|i| st.doc.rules[i].clone());
                let current = before
                    .as_ref()
                    .and_then(|r| r.policy.policy_version)
                    .unwrap_or(0);
                if current != req.expected_version {
                    return Err(ControlError::Stale {
                        target,
                        current,
                        expected: req.expected_version,
                    });
                }
                let mut spec = match (&before, req.patch) {
                    (Some(old), true) => req.spec.clone().over(&old.policy),
                    _ => req.spec.clone(),
                };
                spec.policy_version = None;
                let rule = RuleSpec {
                    caller_scope: req.caller_scope.clone(),
                    route: req.route.clone(),
                    policy: spec,
                };
                let mut overrides = st.overrides.clone();
                overrides.set(&req.caller_scope, &req.route, Some(rule));
                let (next, _, version) = relayer(
                    st,
                    st.file_doc.clone(),
                    overrides,
                    std::slice::from_ref(&target),
                    |_| None,
                )?;
                let rule = next.doc.rules[next
                    .doc
                    .find(&req.caller_scope, &req.route)
                    .ok_or_else(|| ControlError::NotFound(target.clone()))?]
                .clone();
                let note = Note {
                    who,
                    action,
                    reason: &req.reason,
                    at_ms: now,
                };
                let record = note.record(
                    &target,
                    before.map(|b| to_json(&b.policy)).unwrap_or_default(),
                    to_json(&rule.policy),
                    version,
                );
                Ok(Outcome {
                    next: Some(next),
                    records: vec![record],
                    value: rule,
                })
            })
            .await?;
        Ok(rule)
    }

    /// Replaces or patches `[defaults]` (optimistic on its version), as
    /// [`Control::set_rule`] does a rule: a runtime change over the policy
    /// file until cleared or until the file changes `[defaults]` itself.
    /// `req`'s patterns are not read. Returns the running `[defaults]`.
    pub async fn set_defaults(&self, who: &str, req: SetRule) -> Result<PolicySpec, ControlError> {
        let action = req.action();
        let (defaults, _) = self
            .change(|st, now| {
                let target = overrides::DEFAULTS.to_owned();
                let before = st.doc.defaults.clone();
                let current = before.policy_version.unwrap_or(0);
                if current != req.expected_version {
                    return Err(ControlError::Stale {
                        target,
                        current,
                        expected: req.expected_version,
                    });
                }
                let mut spec = if req.patch {
                    req.spec.clone().over(&before)
                } else {
                    req.spec.clone()
                };
                spec.policy_version = None;
                let mut overrides = st.overrides.clone();
                overrides.defaults = Some(spec);
                let (next, _, version) = relayer(
                    st,
                    st.file_doc.clone(),
                    overrides,
                    std::slice::from_ref(&target),
                    |_| None,
                )?;
                let defaults = next.doc.defaults.clone();
                let note = Note {
                    who,
                    action,
                    reason: &req.reason,
                    at_ms: now,
                };
                let record = note.record(&target, to_json(&before), to_json(&defaults), version);
                Ok(Outcome {
                    next: Some(next),
                    records: vec![record],
                    value: defaults,
                })
            })
            .await?;
        Ok(defaults)
    }

    /// Removes one rule (optimistic on its version); returns its version.
    /// Like a set, the removal stays over the policy file until cleared.
    pub async fn delete_rule(
        &self,
        who: &str,
        caller_scope: &str,
        route: &str,
        expected_version: u64,
        reason: &str,
    ) -> Result<u64, ControlError> {
        let (version, _) = self
            .change(|st, now| {
                let target = format!("{caller_scope}|{route}");
                let i = st
                    .doc
                    .find(caller_scope, route)
                    .ok_or_else(|| ControlError::NotFound(target.clone()))?;
                let current = st.doc.rules[i].policy.policy_version.unwrap_or(0);
                if current != expected_version {
                    return Err(ControlError::Stale {
                        target,
                        current,
                        expected: expected_version,
                    });
                }
                let mut overrides = st.overrides.clone();
                overrides.set(caller_scope, route, None);
                let (next, _, _) = relayer(st, st.file_doc.clone(), overrides, &[], |_| None)?;
                let note = Note {
                    who,
                    action: "policy.delete",
                    reason,
                    at_ms: now,
                };
                let record = note.record(
                    &target,
                    to_json(&st.doc.rules[i].policy),
                    String::new(),
                    current,
                );
                Ok(Outcome {
                    next: Some(next),
                    records: vec![record],
                    value: current,
                })
            })
            .await?;
        Ok(version)
    }

    /// Drops the runtime change of one rule (`caller_scope|route`, or
    /// `[defaults]`): it is the policy file's again. Returns the changes
    /// and the new version (0 when nothing changed); NOT_FOUND when the
    /// rule has no runtime change.
    pub async fn clear_rule(
        &self,
        who: &str,
        target: &str,
        reason: &str,
    ) -> Result<(Vec<Change>, u64), ControlError> {
        let (out, _) = self
            .change(|st, now| {
                let mut overrides = st.overrides.clone();
                if !overrides.clear(target) {
                    return Err(ControlError::NoRuntimeChange(target.to_owned()));
                }
                let (next, changes, version) =
                    relayer(st, st.file_doc.clone(), overrides, &[], |_| None)?;
                let note = Note {
                    who,
                    action: "policy.clear",
                    reason,
                    at_ms: now,
                };
                let mut records = note.changes(&changes, version);
                if records.is_empty() {
                    records.push(note.record(target, String::new(), "file".into(), version));
                }
                Ok(Outcome {
                    next: Some(next),
                    records,
                    value: (changes, version),
                })
            })
            .await?;
        Ok(out)
    }

    /// Applies a whole document at runtime (`apply -f`); with `dry_run`
    /// only plans. Every rule it changes becomes a runtime change over the
    /// policy file. Returns the changes and the new version (0 when nothing
    /// was applied).
    pub async fn apply(
        &self,
        who: &str,
        target: PolicyDoc,
        dry_run: bool,
        action: &str,
        reason: &str,
    ) -> Result<(Vec<Change>, u64), ControlError> {
        target.build()?;
        check_size(&target)?;
        if dry_run {
            let mut st = self.state.lock().await;
            self.refresh_locked(&mut st).await?;
            return Ok((plan(&st.doc, &target), 0));
        }
        let (out, _) = self
            .change(|st, now| {
                let changes = plan(&st.doc, &target);
                if changes.is_empty() {
                    return Ok(Outcome {
                        next: None,
                        records: Vec::new(),
                        value: (changes, 0),
                    });
                }
                let ids: Vec<String> = changes.iter().map(|c| c.target.clone()).collect();
                let mut overrides = st.overrides.clone();
                overrides.record(&target, &ids);
                let (next, changes, version) =
                    relayer(st, st.file_doc.clone(), overrides, &[], |_| None)?;
                let note = Note {
                    who,
                    action,
                    reason,
                    at_ms: now,
                };
                Ok(Outcome {
                    next: Some(next),
                    records: note.changes(&changes, version),
                    value: (changes, version),
                })
            })
            .await?;
        Ok(out)
    }

    /// Replaces the file layer with `raw` (a policy file's document as
    /// read, its versions as written), keeping runtime changes to rules the
    /// file did not change.
    async fn reload_doc(
        &self,
        raw: PolicyDoc,
        digest: u64,
        reason: &str,
    ) -> Result<(Vec<Change>, u64), ControlError> {
        raw.build()?;
        check_size(&raw)?;
        let (out, _) = self
            .change(|st, now| {
                let file_changes = plan(&st.file_doc, &raw);
                let mut overrides = st.overrides.clone();
                for c in &file_changes {
                    overrides.clear(&c.target);
                }
                let named = |id: &str| versions::named_version(&raw, id);
                for id in versions::version_edits(&st.file_doc, &raw) {
                    overrides.clear(&id);
                }
                let (mut next, changes, version) = relayer(st, raw.clone(), overrides, &[], named)?;
                next.file_digest = digest;
                let note = Note {
                    who: FILE_ACTOR,
                    action: "policy.reload",
                    reason,
                    at_ms: now,
                };
                Ok(Outcome {
                    next: Some(next),
                    records: note.changes(&changes, version),
                    value: (changes, version),
                })
            })
            .await?;
        Ok(out)
    }

    /// Compares the running policy with the policy file now on disk; a
    /// runtime change over the file shows here as drift.
    pub async fn diff_file(&self) -> Result<Vec<Change>, ControlError> {
        let path = self
            .paths
            .policy_file
            .as_ref()
            .ok_or(ControlError::NoPolicyFile)?;
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            path: path.clone(),
            source,
        })?;
        let doc = PolicyDoc::from_toml(&text)?;
        let mut st = self.state.lock().await;
        self.refresh_locked(&mut st).await?;
        Ok(plan(&st.doc, &doc))
    }

    /// Re-reads the policy file and applies it if its text changed since
    /// this replica last read it (`force`: even if not). A changed text is
    /// applied only if it reads the same again [`FILE_SETTLE`] later; one
    /// still being written waits for the next poll. An invalid file is
    /// logged and the running policy kept. Returns whether a reload was
    /// attempted.
    pub async fn reload_file(&self, force: bool) -> bool {
        let Some(path) = self.paths.policy_file.clone() else {
            return false;
        };
        let read = || {
            std::fs::read_to_string(&path).inspect_err(|err| {
                tracing::error!(cause = %err, path = %path.display(),
                    "policy file unreadable; keeping the running policy");
            })
        };
        let Ok(text) = read() else { return true };
        let digest = persist::digest(&text);
        if !force && digest == self.state.lock().await.local_digest {
            return false;
        }
        tokio::time::sleep(FILE_SETTLE).await;
        match read() {
            Ok(again) if again == text => {}
            Ok(_) => {
                tracing::info!(path = %path.display(),
                    "policy file is being written; reading it again at the next poll");
                return true;
            }
            Err(_) => return true,
        }
        // Remember it now, so a bad file is reported once, not every poll.
        self.state.lock().await.local_digest = digest;
        let result = match PolicyDoc::from_toml(&text) {
            Ok(doc) => self.reload_doc(doc, digest, "").await,
            Err(err) => Err(err.into()),
        };
        match result {
            Ok((changes, version)) => tracing::info!(path = %path.display(),
                changes = changes.len(), policy_version = version, "policy file reloaded"),
            Err(err) => tracing::error!(cause = %err, path = %path.display(),
                "policy file rejected; keeping the running policy"),
        }
        true
    }
}

#[cfg(test)]
mod tests;
