//! The driver: one [`Run`] per [`Gate::run`] call takes an intent through
//! the decision order in the gate's module docs, against the engine, the
//! lease cache, the coordinator and the local capacity semaphore.

use std::future::Future;
use std::sync::Arc;
use std::sync::Mutex;
use std::time::{Duration, SystemTime};

use rand::RngExt;
use tokio::sync::OwnedSemaphorePermit;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tollgate_proto::v1::{ReconsiderDecision, RetryClass};
use tracing::Instrument;

use super::Gate;
use super::intent::{
    Attempt, AttemptEvidence, GateIntent, IntentResult, ReconcileQuery, Reconciled, Repetition,
    Reply, TokenSource, WaitEvidence,
};
use super::spans::{attempt_span, record_response};
use crate::classify::{Classification, Effect, ResponseClass, TransportFailure};
use crate::engine::{
    AttemptStart, Decision, EngineError, GateRefusal, Intent, IntentSpec, Observation, Phase,
    RetryOwner, WakeCheck, WakeDecision,
};
use crate::lease::{ScopeView, Take};
use crate::link::LinkState;
use crate::outcome::{Outcome, ResponseStatus};
use crate::owner::OwnerMark;
use crate::scope::Scope;
use crate::wire;

/// Re-evaluations of one wake-up when the policy version keeps changing; past
/// it the newest version is used as is. Bounds the loop, not the safety: each
/// re-evaluation still ends in the same admission checks.
const MAX_REEVALUATIONS: u32 = 4;

/// How an attempt's execution ended.
enum Executed<T> {
    Replied(Reply<T>),
    TimedOut,
    Cancelled,
}

/// The state of one `run`.
pub(super) struct Run<'g> {
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
    pub(super) fn new(gate: &'g Gate, intent: GateIntent) -> Self {
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

    pub(super) async fn drive<T, F, Fut>(mut self, mut attempt: F) -> IntentResult<T>
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
            let attempt_span = attempt_span(start.number, &self.attempts);
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
    async fn execute<T, F, Fut>(&self, start: AttemptStart, attempt: &mut F) -> Executed<T>
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

    /// Reports the reply to the fleet: successes (a retry's success earns
    /// its leased token back), throttling evidence (raw hint, send and
    /// receipt wall times), and every other answer to the adaptive throttle.
    fn report(&self, observation: &Observation, sent_wall: SystemTime) {
        let cache = &self.gate.inner.cache;
        match observation.classification.class {
            ResponseClass::Success => {
                cache.record_success(&self.scope);
                // Only a retry holds a token: a first attempt is
                // `TokenSource::FirstAttempt`, a fallback one has no lease.
                if let Some(TokenSource::Leased { lease_id }) =
                    self.attempts.last().map(|a| &a.token)
                {
                    cache.record_retry_success(&self.scope, lease_id);
                }
            }
            ResponseClass::Throttled => {
                let receipt_wall = self.gate.inner.clock.now();
                cache.record_evidence(
                    &self.scope,
                    wire::evidence(observation, &self.intent_id, sent_wall, receipt_wall),
                );
            }
            // A transport failure says nothing about the upstream's
            // willingness; an answer that was not a refusal for capacity
            // counts as accepted.
            _ if matches!(observation.status, ResponseStatus::Transport(_)) => {}
            _ => cache.record_upstream_answer(true),
        }
    }

    /// Effect known? An unknown effect on a reconcilable intent is looked up before
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

    /// After a `Wait` decision: scope, `Reconsider`, wait, re-check, admit.
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

    /// Before the wait: floor, scope state, coordinator slot or local spread.
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

    /// `Reconsider`: asks the coordinator for a slot. `None` when it could not be
    /// asked or gave no usable answer.
    async fn reconsider(&self, not_before: Duration) -> Option<Slot> {
        let policy = self.engine.policy();
        let request = wire::reconsider_request(
            &self.scope,
            &self.intent_id,
            self.wall_at(not_before),
            self.wall_at(policy.total_budget()),
            policy.attempt_cap(),
        );
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
            Ok(ReconsiderDecision::Unspecified | ReconsiderDecision::AskAgain) | Err(_) => None,
        }
    }

    /// Re-check and admit at the wake-up: re-check, then capacity, then a token,
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
