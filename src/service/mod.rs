//! The `tollgate.v1.Budget` gRPC service: validation, identity, and the
//! translation between wire messages and the pure core + store.
//!
//! Each handler: identify the caller from its bearer token, validate every
//! field (naming the field on failure), check the caller may use the scope,
//! resolve the scope's policy, run one store operation at the injected
//! clock's `now`, and answer. Errors go through one mapping,
//! `From<ServiceError> for Status` in [`error`].

pub mod admin;
pub mod error;
pub mod validate;
pub mod watch;

use std::sync::{Arc, Mutex};

use rand::{RngExt, SeedableRng, rngs::StdRng};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tokio_util::sync::CancellationToken;
use tollgate_client::clock::{Clock, to_unix_ms};
use tollgate_proto::v1::{
    self, LeaseLimit, LeaseRequest, LeaseResponse, ReconsiderDecision, ReconsiderRequest,
    ReconsiderResponse, ReleaseRequest, ReleaseResponse, ReportRequest, ReportResponse,
    ScopeCertainty, ScopeEvent, WatchRequest, budget_server::Budget,
};
use tonic::{Request, Response, Status};
use tracing::{Span, field::Empty, instrument};

use crate::auth::{Authenticator, Identity};
use crate::budget::{GrantAsk, GrantLimit};
use crate::config::Config;
use crate::evidence::{EvidenceInput, assess};
use crate::metrics::CoordinatorMetrics;
use crate::policy::SharedPolicies;
use crate::scope::{EvidenceLevel, ScopeKey};
use crate::slots::{JITTER_SCALE, SlotAsk};
use crate::store::{Reconsidered, Store};

use self::error::ServiceError;
use self::watch::{EventHub, StateChange, Watched};

/// The Budget service. Cheap to clone: everything is shared.
#[derive(Clone)]
pub struct BudgetService {
    store: Arc<dyn Store>,
    /// Shared with the Admin service, which swaps in changed policies.
    policies: SharedPolicies,
    auth: Arc<Authenticator>,
    /// The coordinator's clock, the authority for cooldowns and slots.
    clock: Arc<dyn Clock>,
    /// Slot jitter; seedable so a run can be replayed.
    rng: Arc<Mutex<StdRng>>,
    hub: EventHub,
    watch_buffer: usize,
    /// Cancelled when the server starts draining: Watch streams end then.
    shutdown: CancellationToken,
    /// Made from the global meter provider when the service is built.
    metrics: Arc<CoordinatorMetrics>,
}

impl std::fmt::Debug for BudgetService {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BudgetService").finish_non_exhaustive()
    }
}

impl BudgetService {
    /// A service over `store`, configured by `config`.
    pub fn new(
        store: Arc<dyn Store>,
        config: &Config,
        clock: Arc<dyn Clock>,
        shutdown: CancellationToken,
    ) -> Self {
        Self::with_policies(
            store,
            config,
            SharedPolicies::new(config.policies.clone()),
            EventHub::default(),
            clock,
            shutdown,
        )
    }

    /// A service resolving against `policies` and publishing on `hub`, both
    /// shared with the Admin service.
    pub fn with_policies(
        store: Arc<dyn Store>,
        config: &Config,
        policies: SharedPolicies,
        hub: EventHub,
        clock: Arc<dyn Clock>,
        shutdown: CancellationToken,
    ) -> Self {
        let rng = match config.limits.rng_seed {
            Some(seed) => StdRng::seed_from_u64(seed),
            None => rand::make_rng::<StdRng>(),
        };
        BudgetService {
            store,
            policies,
            auth: Arc::new(config.auth.clone()),
            clock: Arc::clone(&clock),
            rng: Arc::new(Mutex::new(rng)),
            hub,
            watch_buffer: config.limits.watch_buffer,
            shutdown,
            metrics: Arc::new(CoordinatorMetrics::new(
                &opentelemetry::global::meter("tollgate"),
                Arc::clone(&clock),
            )),
        }
    }

    /// Where state changes are published (the Admin API publishes here too).
    pub fn hub(&self) -> &EventHub {
        &self.hub
    }

    fn now_ms(&self) -> i64 {
        to_unix_ms(self.clock.now())
    }

    fn identify<T>(&self, request: &Request<T>) -> Result<Identity, ServiceError> {
        let header = request
            .metadata()
            .get("authorization")
            .and_then(|v| v.to_str().ok());
        Ok(self.auth.identify(header)?)
    }

    /// Validates a scope field and checks the caller may use it.
    fn scope(
        &self,
        identity: Identity,
        field: &str,
        scope: Option<&v1::Scope>,
    ) -> Result<ScopeKey, ServiceError> {
        let key = validate::scope(field, scope)?;
        self.auth.check(identity, &key.route.caller_scope)?;
        crate::telemetry::record_scope(&Span::current(), &key);
        Ok(key)
    }

    fn jitter(&self) -> u32 {
        let mut rng = self.rng.lock().unwrap_or_else(|e| e.into_inner());
        rng.random_range(0..JITTER_SCALE)
    }
}

#[tonic::async_trait]
impl Budget for BudgetService {
    #[instrument(name = "tollgate.lease", skip_all, fields(tollgate.caller_scope = Empty, tollgate.route = Empty, tollgate.priority = Empty, tollgate.want = Empty, tollgate.decision = Empty, tollgate.reason = Empty, tollgate.tokens.granted = Empty, tollgate.tokens.remaining = Empty, tollgate.policy_version = Empty))]
    async fn lease(
        &self,
        request: Request<LeaseRequest>,
    ) -> Result<Response<LeaseResponse>, Status> {
        let identity = self.identify(&request)?;
        let req = request.into_inner();
        let scope = self.scope(identity, "scope", req.scope.as_ref())?;
        validate::worker_id(&req.worker_id)?;
        let want = validate::want(req.want)?;
        let retry_class = validate::retry_class(req.retry_class)?;
        let policy = self.policies.current().resolve(&scope.route);
        let ask_now = self.now_ms();
        let ask = GrantAsk {
            worker_id: &req.worker_id,
            priority: scope.priority,
            retry_class,
            want,
            now_ms: ask_now,
        };
        let out = self
            .store
            .lease(&scope, ask, &policy)
            .await
            .map_err(ServiceError::from)?;
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
        span.record("tollgate.policy_version", policy.policy_version);
        self.metrics
            .lease(&scope, &out.grant, out.lease_id.as_deref(), ask_now);
        Ok(Response::new(LeaseResponse {
            lease_id: out.lease_id.unwrap_or_default(),
            granted: out.grant.granted,
            expires_at_unix_ms: out.grant.expires_at_ms,
            policy_version: policy.policy_version,
            cooldown_until_unix_ms: out.view.cooldown_until_ms,
            limit: match out.grant.limit {
                GrantLimit::None => LeaseLimit::None,
                GrantLimit::BudgetExhausted => LeaseLimit::BudgetExhausted,
                GrantLimit::FairShare => LeaseLimit::FairShare,
                GrantLimit::Frozen => LeaseLimit::Frozen,
            }
            .into(),
            remaining: out.grant.remaining,
        }))
    }

    #[instrument(name = "tollgate.release", skip_all, fields(tollgate.caller_scope = Empty, tollgate.route = Empty, tollgate.priority = Empty, tollgate.tokens.spent = Empty, tollgate.tokens.returned = Empty))]
    async fn release(
        &self,
        request: Request<ReleaseRequest>,
    ) -> Result<Response<ReleaseResponse>, Status> {
        let identity = self.identify(&request)?;
        let req = request.into_inner();
        let scope = self.scope(identity, "scope", req.scope.as_ref())?;
        validate::worker_id(&req.worker_id)?;
        validate::name("lease_id", &req.lease_id, validate::MAX_ID)?;
        let returned = self
            .store
            .release(
                &scope,
                &req.worker_id,
                &req.lease_id,
                req.spent,
                self.now_ms(),
            )
            .await
            .map_err(ServiceError::from)?;
        Span::current().record("tollgate.tokens.spent", req.spent);
        Span::current().record("tollgate.tokens.returned", returned);
        self.metrics.release(&scope, &req.lease_id, returned);
        Ok(Response::new(ReleaseResponse { returned }))
    }

    #[instrument(name = "tollgate.report", skip_all, fields(tollgate.caller_scope = Empty, tollgate.route = Empty, tollgate.priority = Empty, tollgate.first_attempts = Empty, tollgate.evidence = Empty, tollgate.hint.form = Empty, tollgate.hint.valid = Empty, tollgate.hint.delay_ms = Empty, tollgate.hint.capped = Empty, tollgate.cooldown_until_unix_ms = Empty, tollgate.policy_version = Empty))]
    async fn report(
        &self,
        request: Request<ReportRequest>,
    ) -> Result<Response<ReportResponse>, Status> {
        let identity = self.identify(&request)?;
        let req = request.into_inner();
        let scope = self.scope(identity, "scope", req.scope.as_ref())?;
        validate::worker_id(&req.worker_id)?;
        let first_attempts = validate::count("first_attempts", req.first_attempts)?;
        let successes = validate::count("successes", req.successes)?;
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
        let policy = self.policies.current().resolve(&scope.route);
        let now = self.now_ms();
        self.store
            .deposit(
                &scope,
                &req.worker_id,
                first_attempts,
                successes,
                &policy,
                now,
            )
            .await
            .map_err(ServiceError::from)?;

        let mut verdicts = Vec::with_capacity(req.evidence.len());
        let mut backoff_ms = 0;
        for e in &req.evidence {
            let input = EvidenceInput {
                http_status: e.http_status,
                grpc_code: e.grpc_code,
                retry_after: e.has_retry_after.then_some(e.retry_after.as_str()),
                pushback_ms: e.has_pushback.then_some(e.pushback_ms.as_str()),
                receipt_ms: e.receipt_unix_ms,
            };
            let assessment = assess(&input, &policy, now);
            self.metrics
                .hint(assessment.form.as_str(), assessment.valid);
            // The span keeps the newest hint; every one is counted above.
            let span = Span::current();
            span.record("tollgate.hint.form", assessment.form.as_str());
            span.record("tollgate.hint.valid", assessment.valid);
            span.record("tollgate.hint.delay_ms", assessment.delay_ms);
            span.record("tollgate.hint.capped", assessment.capped);
            // An uncertain scope is never narrowed: the evidence covers the
            // whole caller scope.
            let level = match ScopeCertainty::try_from(e.certainty) {
                Ok(ScopeCertainty::Uncertain) => {
                    EvidenceLevel::Caller(scope.route.caller_scope.clone())
                }
                _ => EvidenceLevel::Route(scope.route.clone()),
            };
            let merge = self
                .store
                .merge_evidence(&level, &assessment, &policy, now)
                .await
                .map_err(ServiceError::from)?;
            if assessment.clock_skew {
                tracing::warn!(scope = %scope, worker_id = %req.worker_id,
                    receipt_unix_ms = e.receipt_unix_ms, now_unix_ms = now,
                    "clock_skew: worker receipt time disagrees with the coordinator clock");
            }
            if merge.raised {
                self.metrics
                    .cooldown(level.to_string(), merge.cooldown_until_ms);
                tracing::info!(level = %level, cooldown_until_unix_ms = merge.cooldown_until_ms,
                    form = assessment.form.as_str(), capped = assessment.capped, "cooldown started");
                self.hub.publish(StateChange::Cooldown {
                    level,
                    cooldown_until_ms: merge.cooldown_until_ms,
                });
            }
            if assessment.widen_backoff {
                backoff_ms = backoff_ms.max(merge.backoff_ms);
            }
            verdicts.push(v1::HintVerdict {
                form: assessment.form.as_str().to_owned(),
                valid: assessment.valid,
                delay_ms: assessment.delay_ms,
                capped: assessment.capped,
                clock_skew: assessment.clock_skew,
                reason: assessment.reason.to_owned(),
            });
        }
        let view = self
            .store
            .view(&scope.route, now)
            .await
            .map_err(ServiceError::from)?;
        let span = Span::current();
        span.record("tollgate.first_attempts", first_attempts);
        span.record("tollgate.evidence", req.evidence.len());
        span.record("tollgate.cooldown_until_unix_ms", view.cooldown_until_ms);
        span.record("tollgate.policy_version", policy.policy_version);
        Ok(Response::new(ReportResponse {
            cooldown_until_unix_ms: view.cooldown_until_ms,
            policy_version: policy.policy_version,
            verdicts,
            backoff_ms,
        }))
    }

    #[instrument(name = "tollgate.reconsider", skip_all, fields(tollgate.caller_scope = Empty, tollgate.route = Empty, tollgate.priority = Empty, tollgate.decision = Empty, tollgate.slot_unix_ms = Empty, tollgate.slot.delay_ms = Empty, tollgate.cooldown_until_unix_ms = Empty, tollgate.policy_version = Empty))]
    async fn reconsider(
        &self,
        request: Request<ReconsiderRequest>,
    ) -> Result<Response<ReconsiderResponse>, Status> {
        let identity = self.identify(&request)?;
        let req = request.into_inner();
        let scope = self.scope(identity, "scope", req.scope.as_ref())?;
        validate::worker_id(&req.worker_id)?;
        validate::name("intent_id", &req.intent_id, validate::MAX_ID)?;
        let not_before = validate::unix_ms("not_before_unix_ms", req.not_before_unix_ms, false)?;
        let deadline = validate::unix_ms("deadline_unix_ms", req.deadline_unix_ms, true)?;
        let reserve = validate::attempt_reserve(req.attempt_reserve_ms)?;
        let policy = self.policies.current().resolve(&scope.route);
        let ask_now = self.now_ms();
        let ask = SlotAsk {
            intent_id: &req.intent_id,
            floor_ms: not_before,
            deadline_ms: deadline,
            reserve_ms: reserve,
            now_ms: ask_now,
            jitter_ppm: self.jitter(),
        };
        let (decided, view) = self
            .store
            .reconsider(&scope.route, ask, &policy)
            .await
            .map_err(ServiceError::from)?;
        let (decision, slot, label) = match decided {
            Reconsidered::Slot(at) => (ReconsiderDecision::Slot, at, "slot"),
            Reconsidered::DeadlineInfeasible(at) => (
                ReconsiderDecision::DeadlineInfeasible,
                at,
                "deadline_infeasible",
            ),
            Reconsidered::Frozen => (ReconsiderDecision::Frozen, 0, "frozen"),
        };
        let span = Span::current();
        let slot_delay = (slot > 0).then(|| slot - ask_now);
        span.record("tollgate.decision", label);
        span.record("tollgate.slot_unix_ms", slot);
        if let Some(delay) = slot_delay {
            span.record("tollgate.slot.delay_ms", delay);
        }
        span.record("tollgate.cooldown_until_unix_ms", view.cooldown_until_ms);
        span.record("tollgate.policy_version", policy.policy_version);
        self.metrics.slot(label, slot_delay);
        Ok(Response::new(ReconsiderResponse {
            decision: decision.into(),
            slot_unix_ms: slot,
            cooldown_until_unix_ms: view.cooldown_until_ms,
            policy_version: policy.policy_version,
            reserves_token: false,
        }))
    }

    type WatchStream = ReceiverStream<Result<ScopeEvent, Status>>;

    #[instrument(name = "tollgate.watch", skip_all, fields(tollgate.scopes = Empty))]
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
        // Subscribe before reading snapshots, so no change falls in between.
        let changes = self.hub.subscribe();
        let now = self.now_ms();
        let mut watched = Vec::with_capacity(req.scopes.len());
        for (i, scope) in req.scopes.iter().enumerate() {
            let key = self.scope(identity, &format!("scopes[{i}]"), Some(scope))?;
            let view = self
                .store
                .view(&key.route, now)
                .await
                .map_err(ServiceError::from)?;
            watched.push(Watched {
                scope: scope.clone(),
                policy_version: self.policies.current().resolve(&key.route).policy_version,
                key,
                cooldown_until_ms: view.cooldown_until_ms,
                ended_sent: view.cooldown_until_ms <= now,
                frozen: view.frozen,
            });
        }
        Span::current().record("tollgate.scopes", watched.len());
        let (tx, rx) = mpsc::channel(self.watch_buffer);
        tokio::spawn(watch::run(
            watched,
            changes,
            tx,
            Arc::clone(&self.clock),
            self.shutdown.clone(),
        ));
        Ok(Response::new(ReceiverStream::new(rx)))
    }
}
