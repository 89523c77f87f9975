//! Runtime control of the coordinator: the operations behind the Admin API,
//! live reload and the state file, free of gRPC.
//!
//! [`Control`] owns the running [`PolicyDoc`] (the rules as written, with
//! explicit versions) and the freezes. Every change goes the same way, under
//! one lock so changes are totally ordered:
//! 1. build and validate the new document (one validation: [`PolicyDoc::build`]);
//! 2. write the state file (so an acknowledged change survives a kill);
//! 3. put it in force ([`SharedPolicies::replace`], the store's freeze);
//! 4. publish it to Watch streams and append the audit record.
//!
//! # Versions
//! A changed rule gets `max(every version in use) + 1`, so a new version is
//! never one a worker has seen before. Rules an `apply` leaves effectively
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
mod mute;
pub mod persist;
mod plan;

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;

use tollgate_client::clock::{Clock, to_unix_ms};

use crate::config::{ConfigError, MAX_RULES, PolicyDoc, RuleSpec};
use crate::events::{EventHub, PolicySnapshot, StateChange};
use crate::policy::{PolicySpec, SharedPolicies};
use crate::scope::RouteKey;
use crate::store::{Store, StoreError};

use self::audit::{AuditLog, AuditRecord};
use self::persist::{FreezeRecord, PersistError, StateFile};

pub use self::mute::MUTE_FOREVER_MS;
pub use self::plan::{Change, ChangeKind, plan, spec_fields};

/// Who a policy-file reload is recorded as.
pub const FILE_ACTOR: &str = "policy-file";
/// Who an expired freeze is lifted by.
pub const EXPIRY_ACTOR: &str = "expiry";

/// Why a control operation was refused.
#[derive(Debug, thiserror::Error)]
pub enum AdminError {
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
    /// The state file; `None` keeps runtime changes in memory only.
    pub state_file: Option<PathBuf>,
}

#[derive(Debug)]
struct State {
    doc: PolicyDoc,
    file_digest: u64,
    freezes: BTreeMap<RouteKey, FreezeRecord>,
}

/// The runtime controls. Shared by the Admin service and the reload task.
pub struct Control {
    state: tokio::sync::Mutex<State>,
    policies: SharedPolicies,
    store: Arc<dyn Store>,
    hub: EventHub,
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

/// Every version in `doc` made explicit, so the document alone says what
/// workers are told (and survives a reload of the state file unchanged).
fn pin_versions(doc: &mut PolicyDoc) -> Result<(), ConfigError> {
    let set = doc.build()?;
    let default_version = set.default_policy().policy_version;
    doc.defaults.policy_version = Some(default_version);
    for i in 0..doc.rules.len() {
        let version = doc
            .rule_policy(&doc.rules[i])
            .map(|p| p.policy_version)
            .unwrap_or(default_version);
        doc.rules[i].policy.policy_version = Some(version);
    }
    Ok(())
}

fn max_version(doc: &PolicyDoc) -> u64 {
    doc.rules
        .iter()
        .filter_map(|r| r.policy.policy_version)
        .chain(doc.defaults.policy_version)
        .max()
        .unwrap_or(1)
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

fn to_json<T: serde::Serialize>(value: &T) -> String {
    serde_json::to_string(value).unwrap_or_default()
}

impl Control {
    /// Starts from `doc` (the policy file's, with `file_text` its text), or
    /// from the state file when there is one: its document, re-reconciled
    /// with the file if the file changed meanwhile, and its freezes
    /// reapplied to the store.
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
    ) -> Result<Control, AdminError> {
        let mut doc = doc;
        pin_versions(&mut doc)?;
        let file_digest = file_text.map_or(0, persist::digest);
        let saved = match &paths.state_file {
            Some(path) => persist::load(path)?,
            None => None,
        };
        let control = Control {
            state: tokio::sync::Mutex::new(State {
                doc: doc.clone(),
                file_digest,
                freezes: BTreeMap::new(),
            }),
            policies,
            store,
            hub,
            audit,
            clock,
            paths,
            mutes: std::sync::Mutex::default(),
        };
        if let Some(saved) = saved {
            let now = control.now_ms();
            control.reapply_mutes(saved.mutes, now).await?;
            let mut st = control.state.lock().await;
            st.doc = saved.doc;
            for f in saved.freezes {
                if f.expires_at_ms.is_some_and(|at| at <= now) {
                    continue;
                }
                let key = RouteKey {
                    caller_scope: f.caller_scope.clone(),
                    route: f.route.clone(),
                };
                control
                    .store
                    .set_freeze(&key, Some(f.reason.clone()), now)
                    .await?;
                st.freezes.insert(key, f);
            }
            crate::telemetry::freezes::record_freezes(&st.freezes);
            control.policies.replace(st.doc.build()?);
            tracing::info!(
                rules = st.doc.rules.len(),
                freezes = st.freezes.len(),
                "runtime changes reapplied from the state file"
            );
            if saved.file_digest != file_digest && file_text.is_some() {
                tracing::warn!(
                    "the policy file changed while the coordinator was down; applying it over the saved state"
                );
                control
                    .apply_locked(
                        &mut st,
                        FILE_ACTOR,
                        doc,
                        "policy.reload",
                        "file changed while stopped",
                        file_digest,
                    )
                    .await?;
            }
        } else {
            control.policies.replace(doc.build()?);
            let st = control.state.lock().await;
            control.save(&st.doc, &st.freezes, st.file_digest)?;
        }
        Ok(control)
    }

    fn now_ms(&self) -> i64 {
        to_unix_ms(self.clock.now())
    }

    /// The running document.
    pub async fn doc(&self) -> PolicyDoc {
        self.state.lock().await.doc.clone()
    }

    /// The freeze of `route`, if any.
    pub async fn freeze_of(&self, route: &RouteKey) -> Option<FreezeRecord> {
        self.state.lock().await.freezes.get(route).cloned()
    }

    /// The audit log.
    pub fn audit(&self) -> &AuditLog {
        &self.audit
    }

    /// The configured policy file.
    pub fn policy_file(&self) -> Option<&PathBuf> {
        self.paths.policy_file.as_ref()
    }

    fn save(
        &self,
        doc: &PolicyDoc,
        freezes: &BTreeMap<RouteKey, FreezeRecord>,
        file_digest: u64,
    ) -> Result<(), PersistError> {
        let Some(path) = &self.paths.state_file else {
            return Ok(());
        };
        persist::save(
            path,
            &StateFile {
                format: persist::FORMAT,
                file_digest,
                doc: doc.clone(),
                freezes: freezes.values().cloned().collect(),
                mutes: self.mute_records(),
            },
        )
    }

    /// Validates, persists and puts `doc` in force, then tells watchers.
    fn commit(&self, st: &mut State, doc: PolicyDoc, file_digest: u64) -> Result<(), AdminError> {
        if doc.rules.len() > MAX_RULES {
            return Err(ConfigError::Invalid {
                place: "[[rule]]".into(),
                reason: format!("at most {MAX_RULES} rules"),
            }
            .into());
        }
        let set = doc.build()?;
        self.save(&doc, &st.freezes, file_digest)?;
        self.policies.replace(set);
        st.doc = doc;
        st.file_digest = file_digest;
        self.hub.publish(StateChange::Policies(PolicySnapshot(
            self.policies.current(),
        )));
        Ok(())
    }

    #[allow(clippy::too_many_arguments)]
    fn record(
        &self,
        who: &str,
        action: &str,
        target: &str,
        before: String,
        after: String,
        policy_version: u64,
        reason: &str,
    ) -> AuditRecord {
        self.audit.append(AuditRecord {
            seq: 0,
            at_ms: self.now_ms(),
            who: who.to_owned(),
            action: action.to_owned(),
            target: target.to_owned(),
            before,
            after,
            policy_version,
            reason: reason.to_owned(),
        })
    }

    /// Creates, replaces or patches one rule (optimistic on its version).
    pub async fn set_rule(&self, who: &str, req: SetRule) -> Result<RuleSpec, AdminError> {
        let mut st = self.state.lock().await;
        let target = format!("{}|{}", req.caller_scope, req.route);
        let index = st.doc.find(&req.caller_scope, &req.route);
        let current = index
            .and_then(|i| st.doc.rules[i].policy.policy_version)
            .unwrap_or(0);
        if current != req.expected_version {
            return Err(AdminError::Stale {
                target,
                current,
                expected: req.expected_version,
            });
        }
        let version = max_version(&st.doc) + 1;
        let before = index.map(|i| st.doc.rules[i].clone());
        let mut spec = match (&before, req.patch) {
            (Some(old), true) => req.spec.over(&old.policy),
            _ => req.spec,
        };
        spec.policy_version = Some(version);
        let rule = RuleSpec {
            caller_scope: req.caller_scope,
            route: req.route,
            policy: spec,
        };
        let mut doc = st.doc.clone();
        match index {
            Some(i) => doc.rules[i] = rule.clone(),
            None => doc.rules.push(rule.clone()),
        }
        let digest = st.file_digest;
        self.commit(&mut st, doc, digest)?;
        let action = if req.patch {
            "policy.patch"
        } else {
            "policy.set"
        };
        self.record(
            who,
            action,
            &target,
            before.map(|b| to_json(&b.policy)).unwrap_or_default(),
            to_json(&rule.policy),
            version,
            &req.reason,
        );
        Ok(rule)
    }

    /// Removes one rule (optimistic on its version); returns its version.
    pub async fn delete_rule(
        &self,
        who: &str,
        caller_scope: &str,
        route: &str,
        expected_version: u64,
        reason: &str,
    ) -> Result<u64, AdminError> {
        let mut st = self.state.lock().await;
        let target = format!("{caller_scope}|{route}");
        let i = st
            .doc
            .find(caller_scope, route)
            .ok_or_else(|| AdminError::NotFound(target.clone()))?;
        let current = st.doc.rules[i].policy.policy_version.unwrap_or(0);
        if current != expected_version {
            return Err(AdminError::Stale {
                target,
                current,
                expected: expected_version,
            });
        }
        let mut doc = st.doc.clone();
        let removed = doc.rules.remove(i);
        let digest = st.file_digest;
        self.commit(&mut st, doc, digest)?;
        self.record(
            who,
            "policy.delete",
            &target,
            to_json(&removed.policy),
            String::new(),
            current,
            reason,
        );
        Ok(current)
    }

    /// Applies a whole document (from `apply -f` or a reload); with
    /// `dry_run` only plans. Returns the changes and the new version (0
    /// when nothing was applied).
    pub async fn apply(
        &self,
        who: &str,
        target: PolicyDoc,
        dry_run: bool,
        action: &str,
        reason: &str,
        file_digest: Option<u64>,
    ) -> Result<(Vec<Change>, u64), AdminError> {
        let mut st = self.state.lock().await;
        if dry_run {
            return Ok((plan(&st.doc, &target), 0));
        }
        let digest = file_digest.unwrap_or(st.file_digest);
        self.apply_locked(&mut st, who, target, action, reason, digest)
            .await
    }

    async fn apply_locked(
        &self,
        st: &mut State,
        who: &str,
        mut target: PolicyDoc,
        action: &str,
        reason: &str,
        file_digest: u64,
    ) -> Result<(Vec<Change>, u64), AdminError> {
        target.build()?;
        let changes = plan(&st.doc, &target);
        if changes.is_empty() {
            if file_digest != st.file_digest {
                // Same policy, new file text: remember it, so a restart
                // does not re-apply it.
                let doc = st.doc.clone();
                self.commit(st, doc, file_digest)?;
            }
            return Ok((changes, 0));
        }
        let version = max_version(&st.doc) + 1;
        // Unchanged rules keep their version; changed and added ones get the new one.
        let changed = |id: &str| changes.iter().any(|c| c.target == id);
        target.defaults.policy_version = Some(if changed("[defaults]") {
            version
        } else {
            st.doc.defaults.policy_version.unwrap_or(1)
        });
        for rule in &mut target.rules {
            let id = rule.id();
            rule.policy.policy_version = Some(if changed(&id) {
                version
            } else {
                st.doc
                    .find(&rule.caller_scope, &rule.route)
                    .and_then(|i| st.doc.rules[i].policy.policy_version)
                    .unwrap_or(version)
            });
        }
        self.commit(st, target, file_digest)?;
        for c in &changes {
            let kind = match c.kind {
                ChangeKind::Added => "added",
                ChangeKind::Removed => "removed",
                ChangeKind::Changed => "changed",
            };
            let before: BTreeMap<_, _> = c.fields.iter().map(|(f, b, _)| (f, b)).collect();
            let after: BTreeMap<_, _> = c.fields.iter().map(|(f, _, a)| (f, a)).collect();
            self.record(
                who,
                action,
                &c.target,
                to_json(&before),
                format!("{kind}: {}", to_json(&after)),
                version,
                reason,
            );
        }
        Ok((changes, version))
    }

    /// Compares the running policy with the policy file now on disk.
    pub async fn diff_file(&self) -> Result<Vec<Change>, AdminError> {
        let path = self
            .paths
            .policy_file
            .as_ref()
            .ok_or(AdminError::NoPolicyFile)?;
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            path: path.clone(),
            source,
        })?;
        let doc = PolicyDoc::from_toml(&text)?;
        Ok(plan(&self.state.lock().await.doc, &doc))
    }

    /// Re-reads the policy file and applies it if its text changed since it
    /// was last applied (`force`: even if not). An invalid file is logged
    /// and the running policy kept. Returns whether a reload was attempted.
    pub async fn reload_file(&self, force: bool) -> bool {
        let Some(path) = self.paths.policy_file.clone() else {
            return false;
        };
        let text = match std::fs::read_to_string(&path) {
            Ok(t) => t,
            Err(err) => {
                tracing::error!(cause = %err, path = %path.display(),
                    "policy file unreadable; keeping the running policy");
                return true;
            }
        };
        let digest = persist::digest(&text);
        let mut st = self.state.lock().await;
        if !force && digest == st.file_digest {
            return false;
        }
        let result = match PolicyDoc::from_toml(&text) {
            Ok(doc) => {
                self.apply_locked(&mut st, FILE_ACTOR, doc, "policy.reload", "", digest)
                    .await
            }
            Err(err) => Err(err.into()),
        };
        match result {
            Ok((changes, version)) => tracing::info!(path = %path.display(),
                changes = changes.len(), policy_version = version, "policy file reloaded"),
            Err(err) => {
                // Remember the digest so a bad file is reported once, not every second.
                st.file_digest = digest;
                tracing::error!(cause = %err, path = %path.display(),
                    "policy file rejected; keeping the running policy");
            }
        }
        true
    }

    /// Freezes `route`: no new leases or slots until unfrozen or `expires_at_ms`.
    pub async fn freeze(
        &self,
        who: &str,
        route: &RouteKey,
        reason: &str,
        expires_at_ms: Option<i64>,
    ) -> Result<FreezeRecord, AdminError> {
        let mut st = self.state.lock().await;
        let now = self.now_ms();
        let record = FreezeRecord {
            caller_scope: route.caller_scope.clone(),
            route: route.route.clone(),
            reason: reason.to_owned(),
            by: who.to_owned(),
            since_ms: now,
            expires_at_ms,
        };
        let mut freezes = st.freezes.clone();
        let before = freezes.insert(route.clone(), record.clone());
        self.save(&st.doc, &freezes, st.file_digest)?;
        self.store
            .set_freeze(route, Some(reason.to_owned()), now)
            .await?;
        st.freezes = freezes;
        crate::telemetry::freezes::record_freezes(&st.freezes);
        self.hub.publish(StateChange::Freeze {
            route: route.clone(),
            reason: Some(reason.to_owned()),
        });
        let version = self.policies.current().resolve(route).policy_version;
        self.record(
            who,
            "scope.freeze",
            &route.to_string(),
            before.map(|b| to_json(&b)).unwrap_or_default(),
            to_json(&record),
            version,
            reason,
        );
        Ok(record)
    }

    /// Lifts the freeze of `route`; returns the freeze lifted, if any.
    pub async fn unfreeze(
        &self,
        who: &str,
        route: &RouteKey,
        reason: &str,
    ) -> Result<Option<FreezeRecord>, AdminError> {
        let mut st = self.state.lock().await;
        let mut freezes = st.freezes.clone();
        let before = freezes.remove(route);
        self.save(&st.doc, &freezes, st.file_digest)?;
        self.store.set_freeze(route, None, self.now_ms()).await?;
        st.freezes = freezes;
        crate::telemetry::freezes::record_freezes(&st.freezes);
        self.hub.publish(StateChange::Freeze {
            route: route.clone(),
            reason: None,
        });
        let version = self.policies.current().resolve(route).policy_version;
        self.record(
            who,
            "scope.unfreeze",
            &route.to_string(),
            before.as_ref().map(to_json).unwrap_or_default(),
            String::new(),
            version,
            reason,
        );
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
    ) -> Result<bool, AdminError> {
        let _order = self.state.lock().await;
        let now = self.now_ms();
        let existed = self.store.reset_scope(route, now).await?;
        if existed {
            // Watchers merge cooldowns by `max`, so they must be told the
            // route's own cooldown is gone; what remains is the caller
            // scope's, which a route reset leaves alone.
            let left = self.store.view(route, now).await?;
            self.hub.publish(StateChange::Reset {
                route: route.clone(),
                cooldown_until_ms: left.cooldown_until_ms,
            });
        }
        let version = self.policies.current().resolve(route).policy_version;
        self.record(
            who,
            "scope.reset",
            &route.to_string(),
            format!("{{\"existed\":{existed}}}"),
            String::new(),
            version,
            reason,
        );
        Ok(existed)
    }
}
