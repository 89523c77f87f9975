//! The `tollgate.v1.Budget` gRPC service: validation, identity, and the
//! translation between wire messages and the [`Coordinator`] core.
//!
//! Each handler: identify the caller from its bearer token, validate every
//! field (naming the field on failure), check the caller may use the scope,
//! make **one** call into the core, record the span and metrics, and answer.
//! Which store operation runs and which Watch event is published is the
//! core's business. Errors go through one mapping,
//! `From<ServiceError> for Status` in [`error`].

pub mod admin;
pub mod error;
pub mod quota;
pub mod validate;
pub mod watch;

use std::sync::{Arc, LazyLock};

use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tokio_util::sync::CancellationToken;
use tollgate_proto::v1::{
    self, LeaseLimit, LeaseRequest, LeaseResponse, ReconsiderDecision, ReconsiderRequest,
    ReconsiderResponse, ReleaseRequest, ReleaseResponse, ReportRequest, ReportResponse,
    ScopeCertainty, ScopeEvent, WatchRequest, budget_server::Budget,
};
use tonic::metadata::{Ascii, MetadataKey};
use tonic::{Request, Response, Status};
use tracing::{Span, field::Empty, instrument};

use crate::auth::{Authenticator, Identity};
use crate::budget::GrantLimit;
use crate::coordinator::{
    Coordinator, ReportIn, ReportOut, ReportedResponse, Shadowed, SlotRequest,
};
use crate::hints::EvidenceInput;
use crate::hints::corroboration::Claim;
use crate::hints::stated::StatedInput;
use crate::metrics::CoordinatorMetrics;
use crate::pacing::PacingView;
use crate::scope::ScopeKey;
use crate::store::Reconsidered;
use crate::telemetry::{LEASE_SPAN, RECONSIDER_SPAN, RELEASE_SPAN, REPORT_SPAN, WATCH_SPAN};
use crate::tenancy::Tenant;

use self::error::ServiceError;
use self::quota::WatchQuota;
use self::watch::Watched;

/// The `authorization` metadata key, parsed once: a lookup by `&str`
/// parses and checks the name on every call.
static AUTHORIZATION: LazyLock<MetadataKey<Ascii>> =
    LazyLock::new(|| MetadataKey::from_static("authorization"));

/// The request's `authorization` metadata, if it is text.
fn authorization<T>(request: &Request<T>) -> Option<&str> {
    request
        .metadata()
        .get(&*AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
}

/// The Budget service. Cheap to clone: everything is shared.
#[derive(Clone)]
pub struct BudgetService {
    core: Arc<Coordinator>,
    auth: Arc<Authenticator>,
    watch_buffer: usize,
    /// Cancelled when the server starts draining: Watch streams end then.
    shutdown: CancellationToken,
    /// Made from the global meter provider when the service is built.
    metrics: Arc<CoordinatorMetrics>,
    /// Bounds the Watch streams open at once.
    watch_quota: Arc<WatchQuota>,
}

impl std::fmt::Debug for BudgetService {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BudgetService").finish_non_exhaustive()
    }
}

impl BudgetService {
    /// A service over `core`, authenticating with `auth`; Watch streams
    /// buffer `watch_buffer` events and end when `shutdown` is cancelled.
    pub fn new(
        core: Arc<Coordinator>,
        auth: Arc<Authenticator>,
        watch_buffer: usize,
        shutdown: CancellationToken,
    ) -> Self {
        let meter = opentelemetry::global::meter("tollgate");
        let metrics = CoordinatorMetrics::new(&meter, Arc::clone(core.clock()));
        let tenants = auth.tenants().into_iter().map(|t| t.name).collect();
        let store = Arc::downgrade(core.store());
        let owners = store.clone();
        crate::telemetry::scopes::register(
            &meter,
            Arc::new(move || store.upgrade().and_then(|s| s.counts())),
            Arc::new(move || {
                owners
                    .upgrade()
                    .map(|s| s.owner_counts())
                    .unwrap_or_default()
            }),
            tenants,
        );
        BudgetService {
            core,
            auth,
            watch_buffer,
            shutdown,
            metrics: Arc::new(metrics),
            watch_quota: WatchQuota::new(usize::MAX, usize::MAX),
        }
    }

    /// Bounds Watch streams: `total` open at once, `per_token` per caller
    /// token (unbounded unless set).
    pub fn with_watch_limits(mut self, total: usize, per_token: usize) -> Self {
        self.watch_quota = WatchQuota::new(total, per_token);
        self
    }

    fn identify<T>(&self, request: &Request<T>) -> Result<Identity, ServiceError> {
        if let Some(crate::auth::Authenticated(identity)) = request.extensions().get() {
            return Ok(*identity);
        }
        Ok(self.auth.identify(authorization(request))?)
    }

    /// Validates a scope field and checks the caller may use it.
    fn scope(
        &self,
        identity: Identity,
        field: &str,
        scope: Option<v1::Scope>,
    ) -> Result<ScopeKey, ServiceError> {
        let key = validate::scope(field, scope)?;
        self.auth.check(identity, &key.route.caller_scope)?;
        crate::telemetry::record_scope(&Span::current(), &key);
        Ok(key)
    }

    /// Records a report's outcome on its span and in the metrics.
    fn record_report(
        &self,
        scope: &ScopeKey,
        out: &ReportOut,
        first_attempts: u32,
        evidence: usize,
    ) {
        let span = Span::current();
        for a in &out.assessments {
            self.metrics.hint(a.form.as_str(), a.valid);
        }
        // The span keeps the newest valid hint, else the newest one: a
        // hintless 503 reported with a 429's Retry-After must not hide it.
        // Every hint is counted above.
        let shown = out
            .assessments
            .iter()
            .rev()
            .find(|a| a.valid)
            .or_else(|| out.assessments.last());
        if let Some(a) = shown {
            span.record("tollgate.hint.form", a.form.as_str());
            span.record("tollgate.hint.valid", a.valid);
            span.record("tollgate.hint.delay_ms", a.delay_ms);
            span.record("tollgate.hint.capped", a.capped);
        }
        for (level, until) in &out.raised {
            self.metrics.cooldown(level.to_string(), *until);
        }
        for merge in out.merges.iter().filter(|m| m.claim != Claim::None) {
            self.metrics.claim(merge.claim.as_str(), merge.noisy);
            // The span keeps the newest claim's standing, like the hint.
            span.record("tollgate.hint.claim", merge.claim.as_str());
            span.record("tollgate.cooldown.corroborated", merge.corroborated);
            span.record("tollgate.cooldown.workers", merge.workers);
        }
        span.record("tollgate.first_attempts", first_attempts);
        span.record("tollgate.evidence", evidence);
        span.record(
            "tollgate.cooldown_until_unix_ms",
            out.view.cooldown_until_ms,
        );
        span.record("tollgate.policy_version", out.policy_version);
        self.metrics.pacing(&scope.route, &out.pacing);
    }
}

#[tonic::async_trait]
impl Budget for BudgetService {
    #[instrument(name = LEASE_SPAN, skip_all, fields(tollgate.caller_scope = Empty, tollgate.route = Empty, tollgate.priority = Empty, tollgate.want = Empty, tollgate.decision = Empty, tollgate.reason = Empty, tollgate.tokens.granted = Empty, tollgate.tokens.remaining = Empty, tollgate.policy_version = Empty, tollgate.shadow = Empty))]
    async fn lease(
        &self,
        request: Request<LeaseRequest>,
    ) -> Result<Response<LeaseResponse>, Status> {
        let identity = self.identify(&request)?;
        let mut req = request.into_inner();
        let scope = self.scope(identity, "scope", req.scope.take())?;
        validate::worker_id(&req.worker_id)?;
        let want = validate::want(req.want)?;
        let retry_class = validate::retry_class(req.retry_class)?;
        let tenant = Tenant {
            owner: identity.owner(),
            tokens: self.auth.tokens_for(&scope.route.caller_scope),
        };
        let leased = self
            .core
            .lease(
                tenant,
                &scope,
                &identity.own(&req.worker_id),
                want,
                retry_class,
            )
            .await
            .map_err(ServiceError::from)?;
        let (out, policy_version) = (leased.outcome, leased.policy_version);
        let span = Span::current();
        span.record("tollgate.want", want);
        span.record(
            "tollgate.decision",
            if out.grant.granted > 0 {
                "granted"
            } else {
                "denied"
            },
        );
        span.record(
            "tollgate.reason",
            crate::metrics::limit_str(out.grant.limit),
        );
        span.record("tollgate.tokens.granted", out.grant.granted);
        span.record("tollgate.tokens.remaining", out.grant.remaining);
        span.record("tollgate.policy_version", policy_version);
        if let Some(shadowed) = leased.shadowed {
            span.record("tollgate.shadow", shadowed.as_str());
            self.metrics.shadow("lease", shadowed);
        }
        self.metrics
            .lease(&scope, &out.grant, out.lease_id.as_deref(), leased.now_ms);
        Ok(Response::new(LeaseResponse {
            lease_id: out.lease_id.unwrap_or_default(),
            granted: out.grant.granted,
            expires_at_unix_ms: out.grant.expires_at_ms,
            policy_version,
            cooldown_until_unix_ms: out.view.cooldown_until_ms,
            limit: match out.grant.limit {
                GrantLimit::None => LeaseLimit::None,
                GrantLimit::BudgetExhausted => LeaseLimit::BudgetExhausted,
                GrantLimit::FairShare => LeaseLimit::FairShare,
                GrantLimit::Frozen => LeaseLimit::Frozen,
            }
            .into(),
            remaining: out.grant.remaining,
            shadowed: Shadowed::wire(leased.shadowed).into(),
        }))
    }

    #[instrument(name = RELEASE_SPAN, skip_all, fields(tollgate.caller_scope = Empty, tollgate.route = Empty, tollgate.priority = Empty, tollgate.tokens.spent = Empty, tollgate.tokens.returned = Empty))]
    async fn release(
        &self,
        request: Request<ReleaseRequest>,
    ) -> Result<Response<ReleaseResponse>, Status> {
        let identity = self.identify(&request)?;
        let mut req = request.into_inner();
        let scope = self.scope(identity, "scope", req.scope.take())?;
        validate::worker_id(&req.worker_id)?;
        validate::name("lease_id", &req.lease_id, validate::MAX_ID)?;
        if req.retry_successes > req.spent {
            return Err(ServiceError::invalid(
                "retry_successes",
                "must not exceed `spent`: only a spent token can buy a retry that succeeded",
            )
            .into());
        }
        let returned = self
            .core
            .release(
                &scope,
                &identity.own(&req.worker_id),
                &req.lease_id,
                req.spent,
                req.retry_successes,
            )
            .await
            .map_err(ServiceError::from)?;
        Span::current().record("tollgate.tokens.spent", req.spent);
        Span::current().record("tollgate.tokens.returned", returned);
        self.metrics.release(&scope, &req.lease_id, returned);
        Ok(Response::new(ReleaseResponse { returned }))
    }

    #[instrument(name = REPORT_SPAN, skip_all, fields(tollgate.caller_scope = Empty, tollgate.route = Empty, tollgate.priority = Empty, tollgate.first_attempts = Empty, tollgate.evidence = Empty, tollgate.hint.form = Empty, tollgate.hint.valid = Empty, tollgate.hint.delay_ms = Empty, tollgate.hint.capped = Empty, tollgate.hint.claim = Empty, tollgate.cooldown.corroborated = Empty, tollgate.cooldown.workers = Empty, tollgate.cooldown_until_unix_ms = Empty, tollgate.policy_version = Empty))]
    async fn report(
        &self,
        request: Request<ReportRequest>,
    ) -> Result<Response<ReportResponse>, Status> {
        let identity = self.identify(&request)?;
        let mut req = request.into_inner();
        let scope = self.scope(identity, "scope", req.scope.take())?;
        validate::worker_id(&req.worker_id)?;
        let first_attempts = validate::count("first_attempts", req.first_attempts)?;
        let successes = validate::count("successes", req.successes)?;
        let rejections = validate::count("rejections", req.rejections)?;
        let counts_age_ms = validate::counts_age_ms(req.counts_age_ms)?;
        if req.evidence.len() > validate::MAX_EVIDENCE {
            return Err(ServiceError::invalid(
                "evidence",
                format!("at most {} items", validate::MAX_EVIDENCE),
            )
            .into());
        }
        for (i, e) in req.evidence.iter().enumerate() {
            validate::evidence(&format!("evidence[{i}]"), e)?;
        }
        let responses = req
            .evidence
            .iter()
            .map(|e| ReportedResponse {
                input: EvidenceInput {
                    http_status: e.http_status,
                    grpc_code: e.grpc_code,
                    retry_after: e.has_retry_after.then_some(e.retry_after.as_str()),
                    pushback_ms: e.has_pushback.then_some(e.pushback_ms.as_str()),
                    receipt_ms: e.receipt_unix_ms,
                },
                uncertain: matches!(
                    ScopeCertainty::try_from(e.certainty),
                    Ok(ScopeCertainty::Uncertain)
                ),
            })
            .collect();
        let stated_fields = req
            .stated_limit
            .as_ref()
            .map(|s| validate::stated_limit("stated_limit", s))
            .transpose()?;
        let worker_id = identity.own(&req.worker_id);
        let report = ReportIn {
            stated: match (&stated_fields, &req.stated_limit) {
                (Some(fields), Some(s)) => Some(StatedInput {
                    fields,
                    receipt_ms: s.receipt_unix_ms,
                }),
                _ => None,
            },
            worker_id: &worker_id,
            first_attempts,
            successes,
            rejections,
            counts_age_ms,
            responses,
            tokens: self.auth.tokens_for(&scope.route.caller_scope),
            owner: identity.owner(),
        };
        let out = self
            .core
            .report(&scope, report)
            .await
            .map_err(ServiceError::from)?;
        self.record_report(&scope, &out, first_attempts, req.evidence.len());
        let verdicts = out
            .assessments
            .iter()
            .map(|a| v1::HintVerdict {
                form: a.form.as_str().to_owned(),
                valid: a.valid,
                delay_ms: a.delay_ms,
                capped: a.capped,
                clock_skew: a.clock_skew,
                reason: a.reason.to_owned(),
            })
            .collect();
        Ok(Response::new(ReportResponse {
            cooldown_until_unix_ms: out.view.cooldown_until_ms,
            policy_version: out.policy_version,
            verdicts,
            backoff_ms: out.backoff_ms,
            hold_first_attempts: out.hold_first_attempts,
            shadow: out.shadow,
            counts_hold_ms: u64::try_from(out.counts_hold_ms).unwrap_or(0),
        }))
    }

    #[instrument(name = RECONSIDER_SPAN, skip_all, fields(tollgate.caller_scope = Empty, tollgate.route = Empty, tollgate.priority = Empty, tollgate.decision = Empty, tollgate.slot_unix_ms = Empty, tollgate.pacing.wake_rate = Empty, tollgate.pacing.capacity = Empty, tollgate.pacing.spare = Empty, tollgate.pacing.state = Empty, tollgate.slot.delay_ms = Empty, tollgate.cooldown_until_unix_ms = Empty, tollgate.policy_version = Empty, tollgate.shadow = Empty))]
    async fn reconsider(
        &self,
        request: Request<ReconsiderRequest>,
    ) -> Result<Response<ReconsiderResponse>, Status> {
        let identity = self.identify(&request)?;
        let mut req = request.into_inner();
        let scope = self.scope(identity, "scope", req.scope.take())?;
        validate::worker_id(&req.worker_id)?;
        validate::name("intent_id", &req.intent_id, validate::MAX_ID)?;
        let not_before = validate::unix_ms("not_before_unix_ms", req.not_before_unix_ms, false)?;
        let deadline = validate::unix_ms("deadline_unix_ms", req.deadline_unix_ms, true)?;
        let reserve = validate::attempt_reserve(req.attempt_reserve_ms)?;
        let asker = validate::asker(req.first_attempt, req.arriving)?;
        let intent_id = identity.own(&req.intent_id);
        let request = SlotRequest {
            intent_id: &intent_id,
            not_before_ms: not_before,
            deadline_ms: deadline,
            reserve_ms: reserve,
            asker,
            tenant: Tenant {
                owner: identity.owner(),
                tokens: 1,
            },
        };
        let out = self
            .core
            .reconsider(&scope.route, request)
            .await
            .map_err(ServiceError::from)?;
        let (decision, slot, label) = match out.decided {
            Reconsidered::Slot(at) => (ReconsiderDecision::Slot, at, "slot"),
            Reconsidered::DeadlineInfeasible(at) => (
                ReconsiderDecision::DeadlineInfeasible,
                at,
                "deadline_infeasible",
            ),
            Reconsidered::Frozen => (ReconsiderDecision::Frozen, 0, "frozen"),
            Reconsidered::AskAgain(at) => (ReconsiderDecision::AskAgain, at, "ask_again"),
        };
        let span = Span::current();
        let slot_delay = (slot > 0).then(|| slot - out.now_ms);
        span.record("tollgate.decision", label);
        span.record("tollgate.slot_unix_ms", slot);
        span.record(
            "tollgate.pacing.wake_rate",
            PacingView::per_sec(out.pacing.wake_rate_m),
        );
        span.record(
            "tollgate.pacing.capacity",
            PacingView::per_sec(out.pacing.capacity_m),
        );
        span.record(
            "tollgate.pacing.spare",
            PacingView::per_sec(out.pacing.spare_m),
        );
        span.record("tollgate.pacing.state", out.pacing.mode.as_str());
        self.metrics.pacing(&scope.route, &out.pacing);
        if let Some(delay) = slot_delay {
            span.record("tollgate.slot.delay_ms", delay);
        }
        span.record(
            "tollgate.cooldown_until_unix_ms",
            out.view.cooldown_until_ms,
        );
        span.record("tollgate.policy_version", out.policy_version);
        self.metrics.slot(label, slot_delay);
        if let Some(shadowed) = out.shadowed {
            span.record("tollgate.shadow", shadowed.as_str());
            self.metrics.shadow("reconsider", shadowed);
        }
        let ask_again = decision == ReconsiderDecision::AskAgain;
        Ok(Response::new(ReconsiderResponse {
            decision: decision.into(),
            // Only a slot (or a refusal's would-be slot) is a slot: a worker
            // that does not know ASK_AGAIN must not read one here.
            slot_unix_ms: if ask_again { 0 } else { slot },
            cooldown_until_unix_ms: out.view.cooldown_until_ms,
            policy_version: out.policy_version,
            reserves_token: false,
            ask_again_unix_ms: if ask_again { slot } else { 0 },
            wake_rate: PacingView::per_sec(out.pacing.wake_rate_m),
            shadowed: Shadowed::wire(out.shadowed).into(),
        }))
    }

    type WatchStream = ReceiverStream<Result<ScopeEvent, Status>>;

    #[instrument(name = WATCH_SPAN, skip_all, fields(tollgate.scopes = Empty))]
    async fn watch(
        &self,
        request: Request<WatchRequest>,
    ) -> Result<Response<Self::WatchStream>, Status> {
        let identity = self.identify(&request)?;
        let req = request.into_inner();
        validate::worker_id(&req.worker_id)?;
        if req.scopes.is_empty() || req.scopes.len() > validate::MAX_WATCH_SCOPES {
            return Err(ServiceError::invalid(
                "scopes",
                format!("must name 1..={} scopes", validate::MAX_WATCH_SCOPES),
            )
            .into());
        }
        let keys = req
            .scopes
            .iter()
            .enumerate()
            .map(|(i, scope)| self.scope(identity, &format!("scopes[{i}]"), Some(scope.clone())))
            .collect::<Result<Vec<_>, _>>()?;
        let permit = self.watch_quota.acquire(identity)?;
        let (changes, snapshots) = self.core.watch(&keys).await.map_err(ServiceError::from)?;
        let now = self.core.now_ms();
        let watched: Vec<Watched> = req
            .scopes
            .into_iter()
            .zip(snapshots)
            .map(|(scope, snapshot)| Watched::new(scope, snapshot, now))
            .collect();
        Span::current().record("tollgate.scopes", watched.len());
        let (tx, rx) = mpsc::channel(self.watch_buffer);
        let stream = watch::run(
            watched,
            changes,
            tx.clone(),
            Arc::clone(self.core.clock()),
            self.shutdown.clone(),
        );
        let revoked = self.auth.revoked(identity);
        let refuse = tx.clone();
        tokio::spawn(async move {
            // The stream's place in the quota lasts as long as its task.
            let _permit = permit;
            tokio::select! {
                () = stream => {}
                // A removed or rotated token stops working at once, open
                // streams included.
                () = revoked => {
                    let _ = refuse.try_send(Err(Status::unauthenticated(
                        "the bearer token this stream was opened with was revoked",
                    )));
                }
            }
        });
        Ok(Response::new(ReceiverStream::new(rx)))
    }
}
