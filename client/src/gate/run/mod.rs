//! The driver: one [`Run`] per [`Gate::run`] call takes an intent through
//! the decision order in the gate's module docs, against the engine, the
//! lease cache, the coordinator and the local capacity semaphore.
//!
//! - `hold`: before the first attempt, a known cooldown the coordinator says
//!   first attempts should wait out.
//! - `wait`: between attempts, `Reconsider`, the wait, the re-check and
//!   admission.

use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use super::Gate;
use super::intent::{
    Attempt, AttemptEvidence, GateIntent, IntentResult, ReconcileQuery, Reconciled, Repetition,
    Reply, TokenSource, WaitEvidence,
};
use super::spans::{attempt_span, record_response};
use crate::classify::{Classification, Effect, ResponseClass, TransportFailure};
use crate::engine::{
    AttemptStart, Decision, EngineError, GateRefusal, Intent, IntentSpec, Observation, RetryOwner,
};
use crate::outcome::{Outcome, ResponseStatus};
use crate::owner::OwnerMark;
use crate::scope::Scope;
use crate::wire;

mod hold;
mod wait;

use hold::Held;
use wait::Admitted;

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
    /// The wait before the first attempt, when a cooldown held it.
    held: Option<WaitEvidence>,
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
            held: None,
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
        let mut at = match self.hold(&completion.token).await {
            Held::No => Duration::ZERO,
            Held::StartAt(at) => at,
            Held::Ended(outcome) => return self.finish(outcome, value, last_response),
        };
        let Ok(mut permit) = self.gate.inner.capacity.clone().try_acquire_owned() else {
            let outcome = self.refuse(GateRefusal::CapacityUnavailable);
            return self.finish(outcome, value, last_response);
        };
        let mut token = TokenSource::FirstAttempt;
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
            let attempt_span = attempt_span(start.number, &self.attempts, self.held.as_ref());
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

    /// Reports the reply to the fleet: the limit it stated, successes (a
    /// retry's success earns its leased token back), throttling evidence
    /// (raw hint, send and receipt wall times), and every other answer to
    /// the adaptive throttle.
    fn report(&self, observation: &Observation, sent_wall: SystemTime) {
        let cache = &self.gate.inner.cache;
        if let Some(stated) = wire::stated_limit(observation, self.gate.inner.clock.now()) {
            // On every response, success or refusal: a quota stated before
            // it runs out is what lets the fleet never run it out.
            cache.record_stated(&self.scope, stated);
        }
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
            held: self.held,
            began: self.epoch,
        }
    }
}

/// An engine error is a bug in this driver; the intent ends `indeterminate`
/// (never a retry) and the error is logged.
fn engine_bug(err: &EngineError) -> Outcome {
    tracing::error!(cause = %err, "gate misdrove the decision engine; ending the intent");
    Outcome::Indeterminate
}

use crate::lock;
