//! The async gate: runs one intent's attempts on tokio time, driving the
//! decision [`engine`](crate::engine) and asking the fleet for what only the
//! fleet knows.
//!
//! # Why a gate and not a retry loop
//! A retry loop sleeps and sends again. The gate treats a failed attempt as
//! one input to an admission decision that is taken again, in full, before
//! every later attempt: the intent may have been cancelled or completed
//! meanwhile, its deadline may no longer fit, the scope's policy may have
//! changed, the fleet may have no retry token left, and this process may have
//! no capacity. A timer that elapsed proves none of that.
//!
//! # The decision order, per response
//! 1. **classify** the reply ([`Observation`]); report it to the fleet
//!    (first attempts, successes, throttling evidence with its raw hint and
//!    wall times).
//! 2. **effect known?** an unknown effect on a [`Repetition::Reconcile`]
//!    intent runs the reconcile hook *before* any replay: applied ends the
//!    intent `succeeded`, absent makes a replay a first performance.
//! 3. **repetition**, 4. **owner**, 6. **hint**, 7. **earliest time**: the
//!    engine ([`Intent::on_response`]).
//! 5. **scope**: the scope's cooldown, freeze and policy version from the
//!    lease cache's Watch-fed [`ScopeView`].
//! 8. **`Reconsider`**: the coordinator's slot may only move the start later
//!    ([`Intent::defer`]). With the coordinator unreachable there is no slot,
//!    so the gate spreads the wait with local jitter instead.
//! 9. **wait** on tokio time; cancellation and completion evidence end the
//!    wait at once.
//! 10. **re-check** cancellation, the deadline at the *current* time and the
//!     scope's policy version (a changed version re-runs steps 5–9).
//! 11. **admit**: a local capacity permit, then a leased token
//!     ([`LeaseCache::take`]), then exactly one attempt under
//!     `tokio::time::timeout` of its reserved cap. The permit comes first
//!     because it can be given back; a token cannot.
//!
//! The result is the outcome, the last reply kept separately, and one
//! [`AttemptEvidence`] per attempt (never a payload).

use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use dashmap::DashMap;
use rand::rngs::StdRng;
use rand::{RngExt, SeedableRng};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tollgate_proto::v1::{
    Evidence, ReconsiderDecision, ReconsiderRequest, RetryClass, ScopeCertainty,
};
use tracing::Instrument;

use crate::classify::{Classification, Effect, ResponseClass, TransportFailure};
use crate::clock::{Clock, to_unix_ms};
use crate::engine::{
    Decision, EngineError, GateRefusal, Intent, IntentSpec, Observation, Phase, Policy, RetryOwner,
    WakeCheck, WakeDecision,
};
use crate::evidence::{AttemptRecord, Outcome, ResponseStatus};
use crate::hint::bounded_to;
use crate::lease::{LeaseCache, ScopeView, Take};
use crate::link::LinkState;
use crate::owner::OwnerMark;
use crate::scope::{Priority, Scope};

pub use crate::engine::Repetition as RepetitionKind;

/// Re-evaluations of one wake-up when the policy version keeps changing; past
/// it the newest version is used as is. Bounds the loop, not the safety: each
/// re-evaluation still ends in the same admission checks.
const MAX_REEVALUATIONS: u32 = 4;
/// The proto's bounds on evidence text.
const MAX_PUSHBACK_BYTES: usize = 64;
const MAX_INTENT_ID_BYTES: usize = 128;

/// Tuning for a [`Gate`].
#[derive(Debug, Clone)]
pub struct GateConfig {
    /// Attempts in flight through this gate at once, first attempts
    /// included. A full gate refuses (`capacity_unavailable`) instead of
    /// queueing: a hidden queue would spend deadlines invisibly.
    pub max_in_flight: usize,
    /// Every wait is at least this long, whatever the policy floor and a
    /// jitter draw say, so the gate never retries immediately.
    pub min_wait: Duration,
    /// With the coordinator unreachable there is no slot to spread the fleet,
    /// so each wait gets up to this much extra local jitter (bounded by the
    /// wait itself and by the deadline).
    pub local_spread: Duration,
    /// Whether this host's wall clock may convert an HTTP-date hint.
    pub clock_trusted: bool,
    /// Seed for jitter draws; `None` seeds from the OS.
    pub seed: Option<u64>,
}

impl Default for GateConfig {
    fn default() -> Self {
        GateConfig {
            max_in_flight: 1024,
            min_wait: Duration::from_millis(10),
            local_spread: Duration::from_secs(1),
            clock_trusted: true,
            seed: None,
        }
    }
}

/// A boxed future, as the reconcile hook returns.
pub type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send + 'static>>;

/// Looks up whether an attempt whose effect is unknown took effect.
pub type ReconcileHook = Arc<dyn Fn(ReconcileQuery) -> BoxFuture<Reconciled> + Send + Sync>;

/// What the reconcile hook is asked about.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReconcileQuery {
    /// The intent whose effect is in doubt.
    pub intent_id: Arc<str>,
    /// The attempt that may have taken effect.
    pub attempt_id: String,
    /// Its number.
    pub number: u32,
}

/// The answer of an authoritative lookup.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reconciled {
    /// The effect happened: the intent is done.
    Applied,
    /// The effect did not happen: another attempt is a first performance.
    Absent,
    /// The lookup could not tell (or did not answer within the attempt cap).
    Unknown,
}

/// Whether, and how, an intent may be sent more than once.
#[derive(Clone)]
pub enum Repetition {
    /// Repeating is harmless by nature.
    Safe,
    /// The upstream deduplicates by this key, sent with every attempt.
    IdempotencyKey(Arc<str>),
    /// Not safe to repeat blindly; the hook tells whether an attempt whose
    /// effect is unknown took effect.
    Reconcile(ReconcileHook),
    /// Neither safe to repeat nor checkable.
    NonRepeatable,
}

impl Repetition {
    /// A reconcile hook from an async closure.
    pub fn reconcile<F, Fut>(hook: F) -> Self
    where
        F: Fn(ReconcileQuery) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Reconciled> + Send + 'static,
    {
        Repetition::Reconcile(Arc::new(move |query| Box::pin(hook(query))))
    }

    /// The engine's view of it.
    pub fn kind(&self) -> RepetitionKind {
        match self {
            Repetition::Safe => RepetitionKind::Safe,
            Repetition::IdempotencyKey(_) => RepetitionKind::IdempotencyKey,
            Repetition::Reconcile(_) => RepetitionKind::Reconcilable,
            Repetition::NonRepeatable => RepetitionKind::NonRepeatable,
        }
    }
}

impl std::fmt::Debug for Repetition {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The key may be sensitive (it often embeds an order or account id).
        f.write_str(match self {
            Repetition::Safe => "Safe",
            Repetition::IdempotencyKey(_) => "IdempotencyKey(..)",
            Repetition::Reconcile(_) => "Reconcile(..)",
            Repetition::NonRepeatable => "NonRepeatable",
        })
    }
}

/// One semantic operation to get done, and the rules it runs under.
#[derive(Debug, Clone)]
pub struct GateIntent {
    intent_id: Arc<str>,
    scope: Scope,
    policy: Policy,
    repetition: Repetition,
    /// The mark of a layer above that owns retries, if any.
    owned_by: Option<OwnerMark>,
    cancel: CancellationToken,
}

impl GateIntent {
    /// An intent that is safe to repeat, owned here, never cancelled. The
    /// policy carries the end-to-end deadline (`total_budget`, from the first
    /// start), the attempt cap, the per-attempt reserve, the wait floor, the
    /// backoff and the longest hint honoured.
    pub fn new(intent_id: impl Into<Arc<str>>, scope: Scope, policy: Policy) -> Self {
        GateIntent {
            intent_id: intent_id.into(),
            scope,
            policy,
            repetition: Repetition::Safe,
            owned_by: None,
            cancel: CancellationToken::new(),
        }
    }

    /// Sets how the intent may be repeated.
    pub fn repetition(mut self, repetition: Repetition) -> Self {
        self.repetition = repetition;
        self
    }

    /// Sets the priority class (part of the scope).
    pub fn priority(mut self, priority: Priority) -> Self {
        self.scope.priority = priority;
        self
    }

    /// Cancels the intent when `token` is cancelled: a pending wait ends at
    /// once and a reply arriving after it is discarded.
    pub fn cancel_token(mut self, token: CancellationToken) -> Self {
        self.cancel = token;
        self
    }

    /// Declares that a layer above owns retries (its mark was found on the
    /// incoming request): this gate makes one attempt, forwards the mark, and
    /// ends `owner_elsewhere` instead of retrying.
    pub fn owned_by(mut self, mark: Option<OwnerMark>) -> Self {
        self.owned_by = mark;
        self
    }

    /// The intent's id.
    pub fn intent_id(&self) -> &str {
        &self.intent_id
    }
    /// Its scope.
    pub fn scope(&self) -> &Scope {
        &self.scope
    }
    /// Its policy.
    pub fn policy(&self) -> &Policy {
        &self.policy
    }
}

/// What the closure gets for one attempt.
#[derive(Debug, Clone)]
pub struct Attempt {
    /// 1 for the first attempt.
    pub number: u32,
    /// The stable id every attempt is bound to.
    pub intent_id: Arc<str>,
    /// `{intent_id}#{number}`.
    pub attempt_id: String,
    /// Attach to the request (see [`OwnerMark::apply`]): it tells layers
    /// below that retries are owned. When a layer above owns them, this is
    /// that layer's mark, passed on.
    pub owner_mark: OwnerMark,
    /// Send with every attempt when the intent is deduplicated by key.
    pub idempotency_key: Option<Arc<str>>,
    /// The attempt is abandoned (as a timeout after send) at this instant.
    pub must_end_by: Instant,
}

/// What one attempt produced: the observation the gate decides on, and the
/// caller's value (a success value, or a response to hand back even when it
/// was a 429).
#[derive(Debug)]
pub struct Reply<T> {
    /// The status, its classification and the raw hint.
    pub observation: Observation,
    /// The caller's value, if the attempt produced one.
    pub value: Option<T>,
}

impl<T> Reply<T> {
    /// A reply with a value.
    pub fn new(observation: Observation, value: T) -> Self {
        Reply {
            observation,
            value: Some(value),
        }
    }

    /// A reply with no value (a transport failure, a refused request).
    pub fn failed(observation: Observation) -> Self {
        Reply {
            observation,
            value: None,
        }
    }
}

/// How an attempt came to be admitted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TokenSource {
    /// The first attempt needs no retry token.
    FirstAttempt,
    /// A token from a fleet lease.
    Leased {
        /// The lease it came from.
        lease_id: Arc<str>,
    },
    /// The coordinator was unreachable; the local fallback budget admitted it.
    Fallback,
}

/// What the gate learned while waiting after an attempt.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct WaitEvidence {
    /// The engine's earliest reconsideration time (hint or backoff, floored).
    pub engine_next_start: Duration,
    /// The scope's cooldown, as elapsed time, when it was later.
    pub cooldown: Option<Duration>,
    /// The coordinator's slot, as elapsed time.
    pub slot: Option<Duration>,
    /// Local jitter added because no slot was available.
    pub local_spread: Option<Duration>,
    /// The start finally waited for.
    pub planned_start: Duration,
    /// The coordinator could not be asked; local rules decided.
    pub degraded: bool,
    /// The scope's policy version when the wait began.
    pub policy_version_at_wait: u64,
    /// The version the wake-up was evaluated under.
    pub policy_version_at_wake: u64,
    /// How often the wake-up was re-evaluated for a changed version.
    pub reevaluations: u32,
}

/// The evidence of one attempt: the engine's record plus what only the gate
/// saw. Never a payload.
#[derive(Debug, Clone, PartialEq)]
pub struct AttemptEvidence {
    /// Status, hint (raw and read), times and decision.
    pub record: AttemptRecord,
    /// How the attempt was admitted.
    pub token: TokenSource,
    /// The scope's policy version at admission.
    pub policy_version: u64,
    /// The reconcile hook's answer, when the effect was in doubt.
    pub reconciled: Option<Reconciled>,
    /// The wait that followed this attempt's reply, if any.
    pub wait: Option<WaitEvidence>,
}

/// How an intent ended.
#[derive(Debug)]
pub struct IntentResult<T> {
    /// The terminal reason.
    pub outcome: Outcome,
    /// The value of the last reply kept (a reply arriving after cancellation
    /// is discarded, not kept).
    pub value: Option<T>,
    /// The last observation kept, reported apart from the outcome.
    pub last_response: Option<Observation>,
    /// One per attempt started, in order.
    pub attempts: Vec<AttemptEvidence>,
}

impl<T> IntentResult<T> {
    /// Whether the intent succeeded.
    pub fn succeeded(&self) -> bool {
        self.outcome == Outcome::Succeeded
    }

    /// The status of the last reply kept.
    pub fn last_status(&self) -> Option<ResponseStatus> {
        self.last_response.as_ref().map(|o| o.status)
    }
}

/// Completion evidence delivered by [`Gate::complete`], per running intent.
struct Completion {
    token: CancellationToken,
    runs: usize,
}

struct Inner {
    cache: LeaseCache,
    clock: Arc<dyn Clock>,
    capacity: Arc<Semaphore>,
    config: GateConfig,
    rng: Mutex<StdRng>,
    completions: DashMap<Arc<str>, Completion>,
}

/// Runs intents under the fleet's budget and this process's limits. Cheap to
/// clone; clones share capacity, leases and the completion registry.
#[derive(Clone)]
pub struct Gate {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for Gate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Gate")
            .field("cache", &self.inner.cache)
            .field("available", &self.inner.capacity.available_permits())
            .finish_non_exhaustive()
    }
}

impl Gate {
    /// A gate over `cache` (tokens, reports, scope views) with its own local
    /// capacity.
    pub fn new(cache: LeaseCache, clock: Arc<dyn Clock>, config: GateConfig) -> Self {
        let rng = match config.seed {
            Some(seed) => StdRng::seed_from_u64(seed),
            None => rand::make_rng(),
        };
        Gate {
            inner: Arc::new(Inner {
                cache,
                clock,
                capacity: Arc::new(Semaphore::new(config.max_in_flight)),
                config,
                rng: Mutex::new(rng),
                completions: DashMap::new(),
            }),
        }
    }

    /// The lease cache the gate takes tokens from.
    pub fn cache(&self) -> &LeaseCache {
        &self.inner.cache
    }

    /// Whether the coordinator is usable right now.
    pub fn link_state(&self) -> LinkState {
        self.inner.cache.link().state()
    }

    /// Attempts that could start now without exceeding `max_in_flight`.
    pub fn available_capacity(&self) -> usize {
        self.inner.capacity.available_permits()
    }

    /// Delivers authoritative completion evidence for `intent_id`: a retry it
    /// is waiting for is dropped and the intent ends `succeeded`. Returns
    /// whether such an intent is running.
    pub fn complete(&self, intent_id: &str) -> bool {
        match self.inner.completions.get(intent_id) {
            Some(entry) => {
                entry.token.cancel();
                true
            }
            None => false,
        }
    }

    /// Runs `intent` to its end: the first attempt now, later ones only as
    /// the decision order admits them.
    pub async fn run<T, F, Fut>(&self, intent: GateIntent, attempt: F) -> IntentResult<T>
    where
        F: FnMut(Attempt) -> Fut,
        Fut: Future<Output = Reply<T>>,
    {
        // The span model and its attributes: `telemetry` and docs/telemetry.md.
        let span = tracing::info_span!(
            "tollgate.intent",
            tollgate.intent_id = %intent.intent_id,
            tollgate.caller_scope = %crate::telemetry::caller_scope_attr(&intent.scope.caller_scope),
            tollgate.route = %intent.scope.route,
            tollgate.priority = priority_attr(intent.scope.priority),
            tollgate.outcome = tracing::field::Empty,
            tollgate.attempts = tracing::field::Empty,
        );
        let run = Run::new(self, intent);
        let result = run.drive(attempt).instrument(span.clone()).await;
        span.record("tollgate.outcome", result.outcome.as_str());
        span.record("tollgate.attempts", result.attempts.len());
        crate::telemetry::record_intent(&result.attempts, result.outcome.as_str());
        result
    }

    fn register(&self, intent_id: &Arc<str>) -> CompletionGuard {
        let mut entry = self
            .inner
            .completions
            .entry(intent_id.clone())
            .or_insert_with(|| Completion {
                token: CancellationToken::new(),
                runs: 0,
            });
        entry.runs += 1;
        CompletionGuard {
            gate: self.clone(),
            intent_id: intent_id.clone(),
            token: entry.token.clone(),
        }
    }
}

/// Keeps an intent reachable by [`Gate::complete`] while it runs.
struct CompletionGuard {
    gate: Gate,
    intent_id: Arc<str>,
    token: CancellationToken,
}

impl Drop for CompletionGuard {
    fn drop(&mut self) {
        self.gate
            .inner
            .completions
            .remove_if_mut(&self.intent_id, |_, completion| {
                completion.runs -= 1;
                completion.runs == 0
            });
    }
}

/// How an attempt's execution ended.
enum Executed<T> {
    Replied(Reply<T>),
    TimedOut,
    Cancelled,
}

/// The state of one `run`.
struct Run<'g> {
    gate: &'g Gate,
    intent_id: Arc<str>,
    scope: Scope,
    repetition: Repetition,
    owner_mark: Option<OwnerMark>,
    cancel: CancellationToken,
    engine: Intent,
    epoch: Instant,
    attempts: Vec<AttemptEvidence>,
}

/// What the wait after a reply came to.
enum Admitted {
    Yes {
        permit: OwnedSemaphorePermit,
        token: TokenSource,
        at: Duration,
    },
    Ended,
}

impl<'g> Run<'g> {
    fn new(gate: &'g Gate, intent: GateIntent) -> Self {
        let owner = match intent.owned_by {
            Some(_) => RetryOwner::Elsewhere,
            None => RetryOwner::Here,
        };
        let spec = IntentSpec {
            intent_id: intent.intent_id.to_string(),
            repetition: intent.repetition.kind(),
            retry_owner: owner,
            wall_at_start: gate.inner.clock.now(),
            clock_trusted: gate.inner.config.clock_trusted,
        };
        Run {
            gate,
            intent_id: intent.intent_id,
            scope: intent.scope,
            repetition: intent.repetition,
            owner_mark: intent.owned_by,
            cancel: intent.cancel,
            engine: Intent::new(spec, intent.policy),
            epoch: Instant::now(),
            attempts: Vec::new(),
        }
    }

    /// Elapsed time since the intent began, the engine's clock.
    fn now(&self) -> Duration {
        Instant::now().saturating_duration_since(self.epoch)
    }

    /// The wall time at elapsed `at`, from one reading of each clock.
    fn wall_at(&self, at: Duration) -> SystemTime {
        let now = self.now();
        let wall = self.gate.inner.clock.now();
        if at >= now {
            wall + (at - now)
        } else {
            wall - (now - at)
        }
    }

    /// The elapsed time of wall instant `wall`, from one reading of each.
    fn elapsed_at(&self, wall: SystemTime) -> Duration {
        let now = self.now();
        match wall.duration_since(self.gate.inner.clock.now()) {
            Ok(ahead) => now.saturating_add(ahead),
            Err(behind) => now.saturating_sub(behind.duration()),
        }
    }

    async fn drive<T, F, Fut>(mut self, mut attempt: F) -> IntentResult<T>
    where
        F: FnMut(Attempt) -> Fut,
        Fut: Future<Output = Reply<T>>,
    {
        let completion = self.gate.register(&self.intent_id);
        let mut value = None;
        let mut last_response = None;
        if let Some(outcome) = self.first_checks(&completion.token) {
            return self.finish(outcome, value, last_response);
        }
        let Ok(mut permit) = self.gate.inner.capacity.clone().try_acquire_owned() else {
            let outcome = self.refuse(GateRefusal::CapacityUnavailable);
            return self.finish(outcome, value, last_response);
        };
        let mut token = TokenSource::FirstAttempt;
        let mut at = Duration::ZERO;
        loop {
            let start = match self.engine.start_attempt(at) {
                Ok(start) => start,
                Err(err) => return self.finish(engine_bug(&err), value, last_response),
            };
            if start.number == 1 {
                self.gate.inner.cache.record_first_attempt(&self.scope);
            }
            // start_attempt has just pushed the engine's record for it.
            if let Some(record) = self.engine.records().last().cloned() {
                self.attempts.push(AttemptEvidence {
                    record,
                    token,
                    policy_version: self.gate.inner.cache.view(&self.scope).policy_version,
                    reconciled: None,
                    wait: None,
                });
            }
            let sent_wall = self.gate.inner.clock.now();
            let attempt_span = self.attempt_span(start.number);
            let executed = self
                .execute(start, &mut attempt)
                .instrument(attempt_span.clone())
                .await;
            drop(permit);
            // A reply that took its whole cap is received at the cap: the
            // timer fired then, and any lateness is the scheduler's, not the
            // upstream's.
            let receipt = self.now().min(start.must_end_by);
            let reply = match executed {
                Executed::Cancelled => {
                    let outcome = self.cancel_at(receipt);
                    return self.finish(outcome, value, last_response);
                }
                Executed::TimedOut => {
                    Reply::failed(Observation::transport(TransportFailure::Timeout))
                }
                Executed::Replied(reply) if self.cancel.is_cancelled() => {
                    // Arrived after cancellation: discarded, and the record
                    // says so.
                    drop(reply);
                    let outcome = self.cancel_at(receipt);
                    return self.finish(outcome, value, last_response);
                }
                Executed::Replied(reply) => reply,
            };
            self.report(&reply.observation, sent_wall);
            let observation = match self
                .reconcile(reply.observation.clone(), start.number)
                .await
            {
                Some(observation) => observation,
                None => {
                    let outcome = self.cancel_at(receipt);
                    return self.finish(outcome, value, last_response);
                }
            };
            if reply.value.is_some() {
                value = reply.value;
            }
            last_response = Some(reply.observation);
            let decision = {
                let mut rng = lock(&self.gate.inner.rng);
                self.engine.on_response(receipt, observation, &mut *rng)
            };
            self.sync_record();
            if let Some(record) = self.engine.records().last() {
                record_response(&attempt_span, record);
            }
            match decision {
                Ok(Decision::Stop(outcome)) => return self.finish(outcome, value, last_response),
                Ok(Decision::Wait { .. }) => {}
                Err(err) => return self.finish(engine_bug(&err), value, last_response),
            }
            match self.wait(&completion.token).await {
                Admitted::Yes {
                    permit: p,
                    token: t,
                    at: a,
                } => {
                    permit = p;
                    token = t;
                    at = a;
                }
                Admitted::Ended => {
                    let outcome = self
                        .engine
                        .outcome()
                        .map_or(Outcome::Indeterminate, |(o, _)| o);
                    return self.finish(outcome, value, last_response);
                }
            }
        }
    }

    /// The `tollgate.attempt` span of the attempt just pushed: its number,
    /// the attempts before it (gRFC A45's `previous-rpc-attempts`), how it
    /// was admitted, and the wait that preceded it.
    fn attempt_span(&self, number: u32) -> tracing::Span {
        let span = tracing::info_span!(
            "tollgate.attempt",
            tollgate.attempt = number,
            tollgate.previous_attempts = number.saturating_sub(1),
            tollgate.token = tracing::field::Empty,
            tollgate.policy_version = tracing::field::Empty,
            tollgate.wait_ms = tracing::field::Empty,
            tollgate.slot_delay_ms = tracing::field::Empty,
            tollgate.cooldown = tracing::field::Empty,
            tollgate.degraded = tracing::field::Empty,
            tollgate.status = tracing::field::Empty,
            tollgate.class = tracing::field::Empty,
            tollgate.hint.form = tracing::field::Empty,
            tollgate.hint.valid = tracing::field::Empty,
            tollgate.hint.delay_ms = tracing::field::Empty,
            tollgate.decision = tracing::field::Empty,
        );
        let n = self.attempts.len();
        if let Some(current) = self.attempts.last() {
            span.record(
                "tollgate.token",
                match current.token {
                    TokenSource::FirstAttempt => "first_attempt",
                    TokenSource::Leased { .. } => "leased",
                    TokenSource::Fallback => "fallback",
                },
            );
            span.record("tollgate.policy_version", current.policy_version);
        }
        if let Some(previous) = n.checked_sub(2).and_then(|i| self.attempts.get(i)) {
            let start = self.attempts[n - 1].record.start;
            if let Some(receipt) = previous.record.receipt {
                span.record("tollgate.wait_ms", millis(start.saturating_sub(receipt)));
            }
            if let Some(wait) = &previous.wait {
                if let Some(slot) = wait.slot {
                    span.record(
                        "tollgate.slot_delay_ms",
                        millis(slot.saturating_sub(wait.engine_next_start)),
                    );
                }
                span.record("tollgate.cooldown", wait.cooldown.is_some());
                span.record("tollgate.degraded", wait.degraded);
            }
        }
        span
    }

    /// Cancellation or completion evidence before the first start.
    fn first_checks(&mut self, completion: &CancellationToken) -> Option<Outcome> {
        if self.cancel.is_cancelled() {
            return Some(self.cancel_at(Duration::ZERO));
        }
        if completion.is_cancelled() {
            return Some(
                self.engine
                    .complete(Duration::ZERO)
                    .unwrap_or_else(|e| engine_bug(&e)),
            );
        }
        None
    }

    /// Runs one attempt under its reserved cap and the cancellation token.
    async fn execute<T, F, Fut>(
        &self,
        start: crate::engine::AttemptStart,
        attempt: &mut F,
    ) -> Executed<T>
    where
        F: FnMut(Attempt) -> Fut,
        Fut: Future<Output = Reply<T>>,
    {
        let attempt_id = format!("{}#{}", self.intent_id, start.number);
        let owner_mark = self
            .owner_mark
            .clone()
            .unwrap_or_else(|| OwnerMark::for_attempt(&attempt_id));
        let idempotency_key = match &self.repetition {
            Repetition::IdempotencyKey(key) => Some(key.clone()),
            _ => None,
        };
        let must_end_by = self.epoch + start.must_end_by;
        let future = attempt(Attempt {
            number: start.number,
            intent_id: self.intent_id.clone(),
            attempt_id,
            owner_mark,
            idempotency_key,
            must_end_by,
        });
        tokio::select! {
            // Cancellation wins a tie: a reply ready at the same instant is
            // discarded, never revived.
            biased;
            () = self.cancel.cancelled() => Executed::Cancelled,
            result = tokio::time::timeout_at(must_end_by, future) => match result {
                Ok(reply) => Executed::Replied(reply),
                Err(_) => Executed::TimedOut,
            },
        }
    }

    /// Reports the reply to the fleet: successes, throttling evidence (raw
    /// hint, send and receipt wall times), and every other answer to the
    /// adaptive throttle.
    fn report(&self, observation: &Observation, sent_wall: SystemTime) {
        let cache = &self.gate.inner.cache;
        match observation.classification.class {
            ResponseClass::Success => cache.record_success(&self.scope),
            ResponseClass::Throttled => {
                let receipt_wall = self.gate.inner.clock.now();
                cache.record_evidence(
                    &self.scope,
                    self.evidence(observation, sent_wall, receipt_wall),
                );
            }
            // A transport failure says nothing about the upstream's
            // willingness; an answer that was not a refusal for capacity
            // counts as accepted.
            _ if matches!(observation.status, ResponseStatus::Transport(_)) => {}
            _ => cache.record_upstream_answer(true),
        }
    }

    fn evidence(
        &self,
        observation: &Observation,
        sent: SystemTime,
        receipt: SystemTime,
    ) -> Evidence {
        let hint = observation.hint.as_deref();
        let (http_status, grpc_code) = match observation.status {
            ResponseStatus::Http(status) => (u32::from(status), 0),
            ResponseStatus::Grpc(code) => (0, code as u32),
            ResponseStatus::Transport(_) => (0, 0),
        };
        let is_http = http_status != 0;
        Evidence {
            http_status,
            grpc_code,
            has_retry_after: is_http && hint.is_some(),
            retry_after: if is_http {
                hint.map(|h| bounded_to(h, crate::hint::MAX_RAW_HINT_BYTES))
                    .unwrap_or_default()
            } else {
                String::new()
            },
            has_pushback: !is_http && hint.is_some(),
            pushback_ms: if is_http {
                String::new()
            } else {
                hint.map(|h| bounded_to(h, MAX_PUSHBACK_BYTES))
                    .unwrap_or_default()
            },
            receipt_unix_ms: to_unix_ms(receipt),
            sent_unix_ms: to_unix_ms(sent),
            certainty: ScopeCertainty::Known as i32,
            intent_id: bounded_to(&self.intent_id, MAX_INTENT_ID_BYTES),
        }
    }

    /// Step 2: an unknown effect on a reconcilable intent is looked up before
    /// any replay. Returns the observation to decide on, reclassified by the
    /// lookup's answer, or `None` if the intent was cancelled meanwhile.
    async fn reconcile(&mut self, observation: Observation, number: u32) -> Option<Observation> {
        let Classification { class, effect } = observation.classification;
        let Repetition::Reconcile(hook) = &self.repetition else {
            return Some(observation);
        };
        if effect != Effect::Unknown || !class.is_retryable() {
            return Some(observation);
        }
        let query = ReconcileQuery {
            intent_id: self.intent_id.clone(),
            attempt_id: format!("{}#{number}", self.intent_id),
            number,
        };
        let bound = self.engine.policy().attempt_cap();
        let answer = tokio::select! {
            biased;
            () = self.cancel.cancelled() => return None,
            answer = tokio::time::timeout(bound, hook(query)) => answer.unwrap_or(Reconciled::Unknown),
        };
        tracing::debug!(reconciled = ?answer, "effect looked up before any replay");
        if let Some(last) = self.attempts.last_mut() {
            last.reconciled = Some(answer);
        }
        Some(match answer {
            Reconciled::Applied => observation.classified_as(Classification {
                class: ResponseClass::Success,
                effect: Effect::Applied,
            }),
            Reconciled::Absent => observation.classified_as(Classification {
                class,
                effect: Effect::Absent,
            }),
            Reconciled::Unknown => observation,
        })
    }

    /// Steps 5–11 after a `Wait` decision.
    async fn wait(&mut self, completion: &CancellationToken) -> Admitted {
        let view = self.gate.inner.cache.view(&self.scope);
        let mut evidence = WaitEvidence {
            engine_next_start: self.next_start().unwrap_or_default(),
            policy_version_at_wait: view.policy_version,
            policy_version_at_wake: view.policy_version,
            ..WaitEvidence::default()
        };
        let mut view = view;
        loop {
            if !self.plan(&view, &mut evidence).await {
                return self.end_wait(evidence);
            }
            let Some(next_start) = self.next_start() else {
                return self.end_wait(evidence);
            };
            evidence.planned_start = next_start;
            tokio::select! {
                biased;
                () = self.cancel.cancelled() => {
                    let now = self.now();
                    self.cancel_at(now);
                    return self.end_wait(evidence);
                }
                () = completion.cancelled() => {
                    let now = self.now();
                    if let Err(err) = self.engine.complete(now) {
                        engine_bug(&err);
                    }
                    return self.end_wait(evidence);
                }
                () = tokio::time::sleep_until(self.epoch + next_start) => {}
            }
            let current = self.gate.inner.cache.view(&self.scope);
            // Version 0 means the worker had not heard of the scope's policy
            // yet: learning it is not a rotation.
            let rotated = evidence.policy_version_at_wake != 0
                && current.policy_version != evidence.policy_version_at_wake;
            evidence.policy_version_at_wake = current.policy_version;
            view = current;
            if rotated && evidence.reevaluations < MAX_REEVALUATIONS {
                // A timer set under the old version must not bypass the new
                // one: plan again (cooldown, slot, deadline) under it.
                evidence.reevaluations += 1;
                tracing::debug!(
                    policy_version = view.policy_version,
                    "policy changed while waiting; re-evaluating"
                );
                continue;
            }
            break;
        }
        let admitted = self.admit(&view).await;
        self.attach_wait(evidence);
        admitted
    }

    fn end_wait(&mut self, evidence: WaitEvidence) -> Admitted {
        self.attach_wait(evidence);
        self.sync_record();
        Admitted::Ended
    }

    fn attach_wait(&mut self, evidence: WaitEvidence) {
        if let Some(last) = self.attempts.last_mut() {
            last.wait = Some(evidence);
        }
    }

    /// The engine's current earliest reconsideration time, while waiting.
    fn next_start(&self) -> Option<Duration> {
        match self.engine.phase() {
            Phase::Waiting { next_start, .. } => Some(next_start),
            _ => None,
        }
    }

    /// Steps 5–8: floor, scope state, coordinator slot or local spread.
    /// Returns false if the intent ended.
    async fn plan(&mut self, view: &ScopeView, evidence: &mut WaitEvidence) -> bool {
        let Phase::Waiting { since, next_start } = self.engine.phase() else {
            return false;
        };
        let now = self.now();
        if view.frozen {
            self.refuse(GateRefusal::BudgetExhausted);
            return false;
        }
        let mut until = next_start.max(since.saturating_add(self.gate.inner.config.min_wait));
        if let Some(cooldown) = view.cooldown_until {
            let at = self.elapsed_at(cooldown);
            if at > until {
                evidence.cooldown = Some(at);
                until = at;
            }
        }
        until = until.max(now);
        let reconsidered = if self.gate.link_state() == LinkState::Connected {
            self.reconsider(until).await
        } else {
            None
        };
        match reconsidered {
            Some(Slot::At(at)) => {
                evidence.slot = Some(at);
                until = until.max(at);
            }
            Some(Slot::Infeasible) => {
                // The coordinator's refusal stands even if this clock thinks
                // the slot would fit: defer past the budget to end the intent.
                until = until.max(self.engine.policy().total_budget());
            }
            Some(Slot::Frozen) => {
                self.refuse(GateRefusal::BudgetExhausted);
                return false;
            }
            None => {
                evidence.degraded = true;
                let spread = self.local_spread(until);
                if !spread.is_zero() {
                    evidence.local_spread = Some(spread);
                }
                until += spread;
            }
        }
        if until > next_start {
            let now = self.now();
            match self.engine.defer(now, until) {
                Ok(Decision::Wait { .. }) => {}
                Ok(Decision::Stop(_)) => return false,
                Err(err) => {
                    engine_bug(&err);
                    return false;
                }
            }
        }
        true
    }

    /// Up to `local_spread` of extra wait, no more than the wait itself, and
    /// never so much that the next attempt stops fitting the deadline.
    fn local_spread(&self, until: Duration) -> Duration {
        let Phase::Waiting { since, .. } = self.engine.phase() else {
            return Duration::ZERO;
        };
        let policy = self.engine.policy();
        let latest_fit = policy.total_budget().saturating_sub(policy.attempt_cap());
        let bound = self
            .gate
            .inner
            .config
            .local_spread
            .min(until.saturating_sub(since))
            .min(latest_fit.saturating_sub(until));
        if bound.is_zero() {
            return Duration::ZERO;
        }
        let nanos = lock(&self.gate.inner.rng).random_range(0..=bound.as_nanos());
        Duration::from_nanos(u64::try_from(nanos).unwrap_or(u64::MAX))
    }

    /// Step 8: asks the coordinator for a slot. `None` when it could not be
    /// asked or gave no usable answer.
    async fn reconsider(&self, not_before: Duration) -> Option<Slot> {
        let policy = self.engine.policy();
        let request = ReconsiderRequest {
            scope: Some(self.scope.to_wire()),
            worker_id: String::new(),
            intent_id: bounded_to(&self.intent_id, MAX_INTENT_ID_BYTES),
            not_before_unix_ms: to_unix_ms(self.wall_at(not_before)),
            deadline_unix_ms: to_unix_ms(self.wall_at(policy.total_budget())),
            attempt_reserve_ms: u64::try_from(policy.attempt_cap().as_millis()).unwrap_or(u64::MAX),
        };
        let answer = match self.gate.inner.cache.link().reconsider(request).await {
            Ok(answer) => answer,
            Err(err) => {
                tracing::debug!(cause = %err, "no slot; deciding locally");
                return None;
            }
        };
        match ReconsiderDecision::try_from(answer.decision) {
            Ok(ReconsiderDecision::Slot) => Some(Slot::At(
                self.elapsed_at(crate::clock::from_unix_ms(answer.slot_unix_ms)),
            )),
            Ok(ReconsiderDecision::DeadlineInfeasible) => Some(Slot::Infeasible),
            Ok(ReconsiderDecision::Frozen) => Some(Slot::Frozen),
            Ok(ReconsiderDecision::Unspecified) | Err(_) => None,
        }
    }

    /// Steps 10–11 at the wake-up: re-check, then capacity, then a token,
    /// then the engine's own re-check at the current time.
    async fn admit(&mut self, view: &ScopeView) -> Admitted {
        let now = self.now();
        let check = WakeCheck {
            cancelled: self.cancel.is_cancelled(),
        };
        if check.cancelled || !self.engine.fits(now) {
            // The engine ends it (cancelled or deadline_infeasible) at now;
            // nothing is taken.
            let _ = self.engine.on_wake(now, check);
            self.sync_record();
            return Admitted::Ended;
        }
        if view.frozen {
            self.refuse(GateRefusal::BudgetExhausted);
            return Admitted::Ended;
        }
        let Ok(permit) = self.gate.inner.capacity.clone().try_acquire_owned() else {
            self.refuse(GateRefusal::CapacityUnavailable);
            return Admitted::Ended;
        };
        let class = match self.engine.records().last().and_then(|r| r.classification) {
            Some(c) if c.class == ResponseClass::Throttled => RetryClass::Throttled,
            _ => RetryClass::Transient,
        };
        let token = match self.gate.inner.cache.take(&self.scope, class).await {
            Take::Leased { lease_id, .. } => TokenSource::Leased { lease_id },
            Take::Fallback(true) => TokenSource::Fallback,
            Take::Exhausted | Take::Frozen | Take::Fallback(false) => {
                self.refuse(GateRefusal::BudgetExhausted);
                return Admitted::Ended;
            }
        };
        // Taking a token may have cost an RPC: the engine re-checks
        // cancellation and the deadline at the instant of admission.
        let now = self.now();
        let check = WakeCheck {
            cancelled: self.cancel.is_cancelled(),
        };
        let decision = self.engine.on_wake(now, check);
        self.sync_record();
        match decision {
            Ok(WakeDecision::Start) => Admitted::Yes {
                permit,
                token,
                at: now,
            },
            Ok(WakeDecision::Stop(_)) => Admitted::Ended,
            Err(err) => {
                engine_bug(&err);
                Admitted::Ended
            }
        }
    }

    fn refuse(&mut self, refusal: GateRefusal) -> Outcome {
        let now = self.now();
        let outcome = self
            .engine
            .refuse(now, refusal)
            .unwrap_or_else(|e| engine_bug(&e));
        self.sync_record();
        outcome
    }

    fn cancel_at(&mut self, now: Duration) -> Outcome {
        let outcome = self.engine.cancel(now).unwrap_or_else(|e| engine_bug(&e));
        self.sync_record();
        outcome
    }

    /// Copies the engine's newest record into the gate's evidence.
    fn sync_record(&mut self) {
        if let (Some(record), Some(evidence)) =
            (self.engine.records().last(), self.attempts.last_mut())
        {
            evidence.record = record.clone();
        }
    }

    fn finish<T>(
        mut self,
        outcome: Outcome,
        value: Option<T>,
        last_response: Option<Observation>,
    ) -> IntentResult<T> {
        self.sync_record();
        tracing::debug!(outcome = outcome.as_str(), "intent ended");
        IntentResult {
            outcome,
            value,
            last_response,
            attempts: self.attempts,
        }
    }
}

/// What came back for an attempt, and what was decided, on its span.
fn record_response(span: &tracing::Span, record: &AttemptRecord) {
    match record.status {
        Some(ResponseStatus::Http(code)) => span.record("tollgate.status", code),
        Some(ResponseStatus::Grpc(code)) => {
            span.record("tollgate.status", tracing::field::debug(code))
        }
        Some(ResponseStatus::Transport(failure)) => {
            span.record("tollgate.status", tracing::field::debug(failure))
        }
        None => span,
    };
    if let Some(c) = record.classification {
        span.record("tollgate.class", tracing::field::debug(c.class));
    }
    if let Some(hint) = &record.hint {
        use crate::hint::HintVerdict;
        span.record("tollgate.hint.form", hint.form.as_str());
        match hint.verdict {
            HintVerdict::Absent => {}
            HintVerdict::Valid { delay, .. } => {
                span.record("tollgate.hint.valid", true);
                span.record("tollgate.hint.delay_ms", millis(delay));
            }
            HintVerdict::ExceedsCap { delay, .. } => {
                span.record("tollgate.hint.valid", false);
                span.record("tollgate.hint.delay_ms", millis(delay));
            }
            _ => {
                span.record("tollgate.hint.valid", false);
            }
        }
    }
    if let Some(decision) = record.decision {
        span.record("tollgate.decision", decision.as_str());
    }
}

/// The priority as the coordinator names it (`critical`, `normal`, `bulk`).
fn priority_attr(priority: crate::scope::Priority) -> &'static str {
    use crate::scope::Priority;
    match priority {
        Priority::Critical => "critical",
        Priority::Bulk => "bulk",
        Priority::Normal | Priority::Unspecified => "normal",
    }
}

fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

/// The coordinator's answer to `Reconsider`.
enum Slot {
    At(Duration),
    Infeasible,
    Frozen,
}

/// An engine error is a bug in this driver; the intent ends `indeterminate`
/// (never a retry) and the error is logged.
fn engine_bug(err: &EngineError) -> Outcome {
    tracing::error!(cause = %err, "gate misdrove the decision engine; ending the intent");
    Outcome::Indeterminate
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    // The RNG has no invariant a panic could break.
    mutex.lock().unwrap_or_else(|e| e.into_inner())
}
