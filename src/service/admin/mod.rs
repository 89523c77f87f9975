//! The `tollgate.v1.Admin` gRPC service: admin identity, validation and the
//! wire ↔ core translation. The operations themselves (and their ordering,
//! persistence, audit and Watch events) live in the core: the changes in
//! [`crate::control::Control`] (reached through [`Coordinator::control`]), the
//! scope reads in [`Coordinator`]; errors go through the one mapping in
//! [`super::error`].

use std::sync::Arc;

use tollgate_proto::v1::{self, admin_server::Admin};
use tonic::{Request, Response, Status};
use tracing::instrument;

use crate::auth::Authenticator;
use crate::config::PolicyDoc;
use crate::control::overrides::DEFAULTS;
use crate::control::{Control, SetRule};
use crate::coordinator::Coordinator;
use crate::pacing::PacingView;
use crate::policy::Pattern;
use crate::scope::{Priority, RouteKey};
use crate::store::ScopeFilter;
use crate::tenancy::Owner;

use super::error::ServiceError;
use super::validate::{self, MAX_CALLER_SCOPE, MAX_ROUTE};

/// Longest reason, in bytes.
pub const MAX_REASON: usize = 256;
/// Longest duration text in a policy field.
pub const MAX_DURATION_TEXT: usize = 32;
/// Largest policy file `ApplyPolicies` takes.
pub const MAX_TOML_BYTES: usize = 512 * 1024;
/// Largest scope page.
pub const MAX_PAGE: usize = 500;
/// Longest tenant name: a `[[token]]` entry's name is at most 64 bytes.
const MAX_TENANT: usize = 64;
/// Largest audit page.
pub const MAX_AUDIT_PAGE: usize = 1000;
/// Longest freeze.
pub const MAX_FREEZE_MS: u64 = 7 * 24 * 3_600_000;

type Result<T> = std::result::Result<T, ServiceError>;

mod evidence;
mod wire;

use wire::spec_of;
use wire::{changes_of, count, freeze_of, hint_of, page_token, parse_page_token, rule_of, tokens};

/// The Admin service. Cheap to clone.
#[derive(Clone)]
pub struct AdminService {
    core: Arc<Coordinator>,
    auth: Arc<Authenticator>,
}

impl std::fmt::Debug for AdminService {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AdminService").finish_non_exhaustive()
    }
}

impl AdminService {
    /// An Admin service over `core`, admitting the admins `auth` names.
    pub fn new(core: Arc<Coordinator>, auth: Arc<Authenticator>) -> Self {
        AdminService { core, auth }
    }

    fn control(&self) -> &Control {
        self.core.control()
    }

    /// The admin's name for the audit log.
    fn admin<T>(&self, request: &Request<T>) -> Result<String> {
        let header = super::authorization(request);
        let loopback = request.remote_addr().is_some_and(|a| a.ip().is_loopback());
        let who = self.auth.identify_admin(header, loopback)?;
        tracing::Span::current().record("who", who.as_str());
        Ok(who)
    }
}

fn reason(value: &str) -> Result<()> {
    validate::optional_name("reason", value, MAX_REASON)
}

fn route_key(caller_scope: &str, route: &str) -> Result<RouteKey> {
    validate::name("caller_scope", caller_scope, MAX_CALLER_SCOPE)?;
    validate::name("route", route, MAX_ROUTE)?;
    Ok(RouteKey {
        caller_scope: caller_scope.to_owned(),
        route: route.to_owned(),
    })
}

/// Whether a request names `[defaults]` rather than a rule. `[defaults]`
/// covers every caller scope: a narrower pattern with it is refused.
fn names_defaults(caller_scope: &str, route: &str) -> Result<bool> {
    if route != DEFAULTS {
        return Ok(false);
    }
    if caller_scope != "*" {
        return Err(ServiceError::invalid(
            "caller_scope",
            "`[defaults]` covers every caller scope: name it with caller_scope `*`",
        ));
    }
    Ok(true)
}

/// `[defaults]` as a rule answer: both patterns empty, as `PolicyRule`
/// says and `ListPolicies` answers it.
fn defaults_rule(doc: &PolicyDoc) -> v1::PolicyRule {
    rule_of(doc, None)
}

#[tonic::async_trait]
impl Admin for AdminService {
    #[instrument(skip_all, fields(who = tracing::field::Empty))]
    async fn list_policies(
        &self,
        request: Request<v1::ListPoliciesRequest>,
    ) -> std::result::Result<Response<v1::ListPoliciesResponse>, Status> {
        self.admin(&request)?;
        let doc = self.control().doc().await;
        // Most specific first: the order the running set matches in.
        let set = self.core.policies().current();
        let mut rules: Vec<v1::PolicyRule> = Vec::with_capacity(doc.rules.len());
        for r in set.rules() {
            let (c, rt) = (r.caller_scope.text(), r.route.text());
            if let Some(i) = doc.find(&c, &rt) {
                rules.push(rule_of(&doc, Some(&doc.rules[i])));
            }
        }
        Ok(Response::new(v1::ListPoliciesResponse {
            defaults: Some(rule_of(&doc, None)),
            rules,
        }))
    }

    #[instrument(skip_all, fields(who = tracing::field::Empty))]
    async fn get_policy(
        &self,
        request: Request<v1::GetPolicyRequest>,
    ) -> std::result::Result<Response<v1::PolicyRule>, Status> {
        self.admin(&request)?;
        let req = request.into_inner();
        route_key(&req.caller_scope, &req.route)?;
        let doc = self.control().doc().await;
        if names_defaults(&req.caller_scope, &req.route)? {
            return Ok(Response::new(defaults_rule(&doc)));
        }
        let i = doc.find(&req.caller_scope, &req.route).ok_or_else(|| {
            ServiceError::from(crate::control::ControlError::NotFound(format!(
                "{}|{}",
                req.caller_scope, req.route
            )))
        })?;
        Ok(Response::new(rule_of(&doc, Some(&doc.rules[i]))))
    }

    #[instrument(skip_all, fields(who = tracing::field::Empty))]
    async fn set_policy(
        &self,
        request: Request<v1::SetPolicyRequest>,
    ) -> std::result::Result<Response<v1::PolicyRule>, Status> {
        let who = self.admin(&request)?;
        let req = request.into_inner();
        route_key(&req.caller_scope, &req.route)?;
        reason(&req.reason)?;
        let spec = spec_of(req.fields)?;
        let defaults = names_defaults(&req.caller_scope, &req.route)?;
        let set = SetRule {
            caller_scope: req.caller_scope,
            route: req.route,
            expected_version: req.expected_version,
            spec,
            patch: req.patch,
            reason: req.reason,
        };
        if defaults {
            self.control()
                .set_defaults(&who, set)
                .await
                .map_err(ServiceError::from)?;
            let doc = self.control().doc().await;
            return Ok(Response::new(defaults_rule(&doc)));
        }
        let rule = self
            .control()
            .set_rule(&who, set)
            .await
            .map_err(ServiceError::from)?;
        let doc = self.control().doc().await;
        Ok(Response::new(rule_of(&doc, Some(&rule))))
    }

    #[instrument(skip_all, fields(who = tracing::field::Empty))]
    async fn delete_policy(
        &self,
        request: Request<v1::DeletePolicyRequest>,
    ) -> std::result::Result<Response<v1::DeletePolicyResponse>, Status> {
        let who = self.admin(&request)?;
        let req = request.into_inner();
        route_key(&req.caller_scope, &req.route)?;
        reason(&req.reason)?;
        let defaults = names_defaults(&req.caller_scope, &req.route)?;
        if req.clear {
            let target = if defaults {
                req.route.clone()
            } else {
                format!("{}|{}", req.caller_scope, req.route)
            };
            let (_, policy_version) = self
                .control()
                .clear_rule(&who, &target, &req.reason)
                .await
                .map_err(ServiceError::from)?;
            return Ok(Response::new(v1::DeletePolicyResponse {
                deleted_version: 0,
                policy_version,
            }));
        }
        // A rule literally named `[defaults]` (which `set` once made) can
        // still be deleted.
        let literal = || async { self.control().doc().await.find("*", DEFAULTS).is_some() };
        if defaults && !literal().await {
            return Err(ServiceError::invalid(
                "route",
                "`[defaults]` cannot be deleted; clear drops its runtime change",
            )
            .into());
        }
        let deleted_version = self
            .control()
            .delete_rule(
                &who,
                &req.caller_scope,
                &req.route,
                req.expected_version,
                &req.reason,
            )
            .await
            .map_err(ServiceError::from)?;
        Ok(Response::new(v1::DeletePolicyResponse {
            deleted_version,
            policy_version: 0,
        }))
    }

    #[instrument(skip_all, fields(who = tracing::field::Empty))]
    async fn apply_policies(
        &self,
        request: Request<v1::ApplyPoliciesRequest>,
    ) -> std::result::Result<Response<v1::PolicyChanges>, Status> {
        let who = self.admin(&request)?;
        let req = request.into_inner();
        reason(&req.reason)?;
        if req.toml.len() > MAX_TOML_BYTES {
            return Err(ServiceError::invalid(
                "toml",
                format!("is longer than {MAX_TOML_BYTES} bytes"),
            )
            .into());
        }
        // The document is one field of the request: its errors name the
        // field first, then the place inside the document.
        let in_toml = |e: crate::control::ControlError| match e {
            crate::control::ControlError::Invalid(e) => {
                ServiceError::invalid("toml", e.to_string())
            }
            other => ServiceError::from(other),
        };
        let doc = PolicyDoc::from_toml(&req.toml)
            .map_err(|e| in_toml(crate::control::ControlError::from(e)))?;
        let (changes, version) = self
            .control()
            .apply(&who, doc, req.dry_run, "policy.apply", &req.reason)
            .await
            .map_err(in_toml)?;
        let applied = !req.dry_run && !changes.is_empty();
        Ok(Response::new(changes_of(
            changes,
            applied,
            version,
            String::new(),
        )))
    }

    #[instrument(skip_all, fields(who = tracing::field::Empty))]
    async fn diff_policies(
        &self,
        request: Request<v1::DiffPoliciesRequest>,
    ) -> std::result::Result<Response<v1::PolicyChanges>, Status> {
        self.admin(&request)?;
        let changes = self
            .control()
            .diff_file()
            .await
            .map_err(ServiceError::from)?;
        let file = self
            .control()
            .policy_file()
            .map(|p| p.display().to_string())
            .unwrap_or_default();
        Ok(Response::new(changes_of(changes, false, 0, file)))
    }

    #[instrument(skip_all, fields(who = tracing::field::Empty))]
    async fn list_scopes(
        &self,
        request: Request<v1::ListScopesRequest>,
    ) -> std::result::Result<Response<v1::ListScopesResponse>, Status> {
        self.admin(&request)?;
        let req = request.into_inner();
        let pattern = |field: &str, value: &str, max: usize| -> Result<Pattern> {
            if value.is_empty() {
                return Ok(Pattern::Any);
            }
            validate::name(field, value, max)?;
            Ok(Pattern::parse(value))
        };
        // Tenants by their entries' names; a token's value is never shown
        // nor asked for.
        let tenants = self.auth.tenants();
        let owner = if req.tenant.is_empty() {
            None
        } else {
            validate::name("tenant", &req.tenant, MAX_TENANT)?;
            let Some(at) = tenants.iter().position(|t| t.name == req.tenant) else {
                return Err(
                    ServiceError::invalid("tenant", "no [[token]] entry has this name").into(),
                );
            };
            if self.core.store().owner_counts().is_empty() {
                return Err(Status::failed_precondition(
                    "tenant: this store charges scopes to no token",
                ));
            }
            Some(Owner::token(at))
        };
        let filter = ScopeFilter {
            caller_scope: pattern("caller_scope", &req.caller_scope, MAX_CALLER_SCOPE)?,
            route: pattern("route", &req.route, MAX_ROUTE)?,
            frozen_only: req.frozen_only,
            owner,
        };
        let limit = match req.page_size as usize {
            0 => 100,
            n if n <= MAX_PAGE => n,
            _ => {
                return Err(
                    ServiceError::invalid("page_size", format!("must be 0..={MAX_PAGE}")).into(),
                );
            }
        };
        let after = parse_page_token(&req.page_token)?;
        let page = self
            .core
            .list_scopes(&filter, after.as_ref(), limit)
            .await
            .map_err(ServiceError::from)?;
        let set = self.core.policies().current();
        Ok(Response::new(v1::ListScopesResponse {
            scopes: page
                .scopes
                .iter()
                .map(|s| v1::ScopeSummary {
                    caller_scope: s.route.caller_scope.clone(),
                    route: s.route.route.clone(),
                    cooldown_until_unix_ms: s.view.cooldown_until_ms,
                    frozen: s.view.frozen.is_some(),
                    leases_outstanding: count(s.leases_outstanding),
                    slot_backlog: count(s.waiting),
                    policy_version: set.resolve(&s.route).policy_version,
                    last_touched_unix_ms: s.last_touched_ms,
                    tenant: s
                        .owner
                        .index()
                        .and_then(|i| tenants.get(i))
                        .map(|t| t.name.clone())
                        .unwrap_or_default(),
                })
                .collect(),
            next_page_token: page.next.as_ref().map(page_token).unwrap_or_default(),
        }))
    }

    #[instrument(skip_all, fields(who = tracing::field::Empty))]
    async fn get_scope(
        &self,
        request: Request<v1::GetScopeRequest>,
    ) -> std::result::Result<Response<v1::ScopeState>, Status> {
        self.admin(&request)?;
        let req = request.into_inner();
        let key = route_key(&req.caller_scope, &req.route)?;
        let set = self.core.policies().current();
        let policy = set.resolve(&key);
        let policy_rule = set.resolve_rule(&key).map_or_else(
            || "[defaults]".to_owned(),
            |r| format!("{}|{}", r.caller_scope.text(), r.route.text()),
        );
        let detail = self
            .core
            .scope_detail(&key)
            .await
            .map_err(ServiceError::from)?;
        let freeze = freeze_of(self.control().freeze_of(&key).await);
        let mut state = v1::ScopeState {
            caller_scope: key.caller_scope.clone(),
            route: key.route.clone(),
            policy_version: policy.policy_version,
            policy_rule,
            freeze: Some(freeze),
            ..v1::ScopeState::default()
        };
        let Some(d) = detail else {
            return Ok(Response::new(state));
        };
        let mut hints: Vec<v1::HintRecord> = d
            .route_hints
            .iter()
            .map(|h| hint_of(h, "route"))
            .chain(d.caller_hints.iter().map(|h| hint_of(h, "caller")))
            .collect();
        hints.sort_by_key(|h| h.at_unix_ms);
        let cooldown = d.summary.view.cooldown_until_ms;
        // The newest hint that asked for exactly the cooldown in force.
        let source = hints
            .iter()
            .rev()
            .find(|h| h.valid && cooldown > 0 && h.cooldown_until_unix_ms == cooldown)
            .cloned();
        state.known = true;
        state.first_attempts_in_window = d.budget.first_attempts;
        state.allowance = tokens(d.budget.allowance_milli);
        state.classes = Priority::ALL
            .iter()
            .map(|p| {
                let c = d.budget.classes[p.index()];
                v1::ClassBalance {
                    priority: match p {
                        Priority::Critical => v1::Priority::Critical,
                        Priority::Normal => v1::Priority::Normal,
                        Priority::Bulk => v1::Priority::Bulk,
                    }
                    .into(),
                    allowance: tokens(c.allowance_milli),
                    spent: tokens(c.spent_milli),
                    available: tokens(c.available_milli),
                    active_workers: count(c.active_workers),
                }
            })
            .collect();
        state.leases_outstanding = count(d.budget.leases_outstanding);
        state.tokens_outstanding = d.budget.tokens_outstanding;
        state.cooldown_until_unix_ms = cooldown;
        state.cooldown_source = source;
        state.floor_unix_ms = d.summary.view.floor_ms;
        state.backoff_step = u32::from(d.backoff_step);
        state.slot_backlog = count(d.summary.waiting);
        state.recent_hints = hints;
        state.last_touched_unix_ms = d.summary.last_touched_ms;
        let recorded = self.control().mutes_of(&key);
        state.route_evidence = Some(evidence::evidence_of(&d.route_evidence, &recorded));
        state.caller_evidence = Some(evidence::evidence_of(&d.caller_evidence, &recorded));
        let per_sec = PacingView::per_sec;
        state.pacing = Some(v1::PacingState {
            state: d.pacing.mode.as_str().to_owned(),
            wake_rate: per_sec(d.pacing.wake_rate_m),
            capacity_estimate: per_sec(d.pacing.capacity_m),
            first_attempt_rate: per_sec(d.pacing.first_rate_m),
            spare_capacity: per_sec(d.pacing.spare_m),
            penalty_until_unix_ms: d.pacing.penalty_until_ms,
            asking: count(d.pacing.asking),
            capacity_measured: d.pacing.measured,
            burst_estimate: per_sec(d.pacing.burst_m),
            phase: d.pacing.phase.to_owned(),
            stated: Some(stated_state(&d.pacing.stated, &d.stated_recent)),
        });
        Ok(Response::new(state))
    }

    #[instrument(skip_all, fields(who = tracing::field::Empty))]
    async fn freeze_scope(
        &self,
        request: Request<v1::FreezeScopeRequest>,
    ) -> std::result::Result<Response<v1::FreezeState>, Status> {
        let who = self.admin(&request)?;
        let req = request.into_inner();
        let key = route_key(&req.caller_scope, &req.route)?;
        validate::name("reason", &req.reason, MAX_REASON)?;
        if req.duration_ms > MAX_FREEZE_MS {
            return Err(ServiceError::invalid(
                "duration_ms",
                format!("must be at most {MAX_FREEZE_MS} (7 days)"),
            )
            .into());
        }
        let expires = (req.duration_ms > 0)
            .then(|| self.core.now_ms() + i64::try_from(req.duration_ms).unwrap_or(i64::MAX));
        let record = self
            .control()
            .freeze(&who, &key, &req.reason, expires)
            .await
            .map_err(ServiceError::from)?;
        Ok(Response::new(freeze_of(Some(record))))
    }

    #[instrument(skip_all, fields(who = tracing::field::Empty))]
    async fn unfreeze_scope(
        &self,
        request: Request<v1::UnfreezeScopeRequest>,
    ) -> std::result::Result<Response<v1::FreezeState>, Status> {
        let who = self.admin(&request)?;
        let req = request.into_inner();
        let key = route_key(&req.caller_scope, &req.route)?;
        reason(&req.reason)?;
        self.control()
            .unfreeze(&who, &key, &req.reason)
            .await
            .map_err(ServiceError::from)?;
        Ok(Response::new(v1::FreezeState::default()))
    }

    #[instrument(skip_all, fields(who = tracing::field::Empty))]
    async fn mute_worker(
        &self,
        request: Request<v1::MuteWorkerRequest>,
    ) -> std::result::Result<Response<v1::MuteState>, Status> {
        self.mute(request).await
    }

    #[instrument(skip_all, fields(who = tracing::field::Empty))]
    async fn unmute_worker(
        &self,
        request: Request<v1::UnmuteWorkerRequest>,
    ) -> std::result::Result<Response<v1::MuteState>, Status> {
        self.unmute(request).await
    }

    #[instrument(skip_all, fields(who = tracing::field::Empty))]
    async fn reset_scope(
        &self,
        request: Request<v1::ResetScopeRequest>,
    ) -> std::result::Result<Response<v1::ResetScopeResponse>, Status> {
        let who = self.admin(&request)?;
        let req = request.into_inner();
        let key = route_key(&req.caller_scope, &req.route)?;
        reason(&req.reason)?;
        let existed = self
            .control()
            .reset(&who, &key, &req.reason)
            .await
            .map_err(ServiceError::from)?;
        Ok(Response::new(v1::ResetScopeResponse { existed }))
    }

    #[instrument(skip_all, fields(who = tracing::field::Empty))]
    async fn list_audit(
        &self,
        request: Request<v1::ListAuditRequest>,
    ) -> std::result::Result<Response<v1::ListAuditResponse>, Status> {
        self.admin(&request)?;
        let req = request.into_inner();
        let limit = match req.limit as usize {
            0 => 50,
            n if n <= MAX_AUDIT_PAGE => n,
            _ => {
                return Err(ServiceError::invalid(
                    "limit",
                    format!("must be 0..={MAX_AUDIT_PAGE}"),
                )
                .into());
            }
        };
        let records = self
            .control()
            .audit_page(req.before_seq, limit)
            .await
            .map_err(ServiceError::from)?
            .into_iter()
            .map(|r| v1::AuditRecord {
                seq: r.seq,
                at_unix_ms: r.at_ms,
                who: r.who,
                action: r.action,
                target: r.target,
                before: r.before,
                after: r.after,
                policy_version: r.policy_version,
                reason: r.reason,
            })
            .collect();
        Ok(Response::new(v1::ListAuditResponse { records }))
    }
}

/// The stated limit of a route as GetScope shows it.
fn stated_state(
    view: &crate::pacing::stated::StatedView,
    recent: &[crate::pacing::stated::Statement],
) -> v1::StatedLimitState {
    let per_sec = PacingView::per_sec;
    let unsigned = |n: i64| u64::try_from(n).unwrap_or(0);
    let count = |n: i64| u32::try_from(n).unwrap_or(u32::MAX);
    v1::StatedLimitState {
        state: view.in_force.as_str().to_owned(),
        pace: per_sec(view.pace_m),
        limit: unsigned(view.quota),
        window_secs: unsigned(view.window_ms / 1000),
        remaining: unsigned(view.remaining),
        reset_unix_ms: view.reset_at_ms,
        workers: count(view.workers),
        needed: count(view.needed),
        recent: recent
            .iter()
            .map(|s| v1::StatedRecord {
                worker_id: s.worker.clone(),
                receipt_unix_ms: s.received_ms,
                verdict: s.verdict.as_str().to_owned(),
                raw: s.raw.clone(),
                pace: s.pace_m.map_or(0.0, per_sec),
            })
            .collect(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::PolicySpec;

    #[test]
    fn page_tokens_round_trip_and_refuse_garbage() {
        let key = RouteKey {
            caller_scope: "tenant a".into(),
            route: "GET /x".into(),
        };
        assert_eq!(
            parse_page_token(&page_token(&key)).expect("valid"),
            Some(key)
        );
        assert!(parse_page_token("zz").is_err());
        assert!(parse_page_token("6162").is_err(), "no separator");
    }

    #[test]
    fn policy_fields_round_trip() {
        let spec = PolicySpec {
            retry_ratio: Some(0.1),
            window: Some("5s".into()),
            ..PolicySpec::default()
        };
        assert_eq!(
            spec_of(Some(crate::policy_wire::fields_of(&spec))).expect("valid"),
            spec
        );
    }
}
