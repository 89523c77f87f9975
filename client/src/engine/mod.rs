//! The retry decision engine: a sans-IO state machine for one intent.
//!
//! It never sleeps, sends or reads a clock. The driver — `tollgate simulate`
//! on a virtual clock, or the async gate on `tokio::time` — tells it what
//! happened and when, and carries out what it decides:
//!
//! ```text
//!            start_attempt(now)                 on_response(now, obs, rng)
//!  Fresh ─────────────────────▶ InFlight ──────────────────────────────▶ Stop(outcome)
//!                                  ▲                    │
//!            start_attempt(now)    │                    ▼ Wait { next_start }
//!   Admitted ◀──── on_wake(now) ◀──┼───────────── Waiting ── defer(now, later slot)
//!                  (Start)         │                    │
//!                                  │                    └─ refuse(now, no token / no capacity / owner)
//!  cancel(now) from any phase ─▶ Ended(cancelled)
//! ```
//!
//! Time is a [`Duration`] elapsed since the intent's first start (zero), on a
//! monotonic clock; every call's `now` must not go backwards. Wall time is
//! only needed to convert an HTTP-date hint, and is derived as
//! `wall_at_start + now`.
//!
//! # Decision order at a response
//! The whole order, worker and coordinator, is in `docs/decision-order.md`;
//! the engine's part of it:
//! 1. Intent active: a cancelled intent is already ended and takes no response.
//! 2. Classify ([`crate::classify`]): success → `succeeded`; not retryable →
//!    `non_retryable`; a second retry-once failure (500) → `non_retryable`.
//! 3. Effect: an unknown effect on an operation that is not repeat-safe →
//!    `reconciliation_required` (a lookup exists) or `indeterminate`.
//! 4. Owner: if another layer owns retries → `owner_elsewhere`.
//! 5. Attempt cap: every allowed attempt started → `attempt_cap`.
//! 6. Hint ([`crate::hint`]): a date under an untrusted clock →
//!    `clock_untrusted`; above `max_hint` → `hint_exceeds_cap`; gRPC pushback
//!    "do not retry" → `non_retryable`.
//! 7. Wait: `max(min_wait, hint)` for a valid hint, else
//!    `max(min_wait, backoff)` (jittered if policy says so). A valid server
//!    delay is never shortened, so jitter applies only to the local backoff;
//!    spreading a fleet that got the same hint is the coordinator's slots' job.
//! 8. Deadline: `next_start + attempt_cap > total_budget` →
//!    `deadline_infeasible` now, at receipt, not after a pointless wait.
//!
//! Naming the scope is not the engine's: the gate names it when it asks the
//! coordinator.
//!
//! # Before the first attempt
//! A scope whose upstream is known to refuse everyone until a cooldown ends
//! may hold first attempts too: [`Intent::hold`] moves the first start
//! later (never earlier) and runs the same deadline gate, ending a `Fresh`
//! intent `deadline_infeasible` with no attempt at all when the held start
//! cannot fit. The first attempt may not start before the hold.
//!
//! # At reconsideration
//! The gate may insert coordinator steps between `Wait` and the next start:
//! [`Intent::defer`] to a later slot (re-running the deadline gate),
//! [`Intent::refuse`] when no token, no capacity or another owner stops it.
//! Then [`Intent::on_wake`] re-checks cancellation and the deadline against
//! the *current* time — the earlier gate is never reused — and
//! [`Intent::start_attempt`] must follow at that same instant.

use std::time::Duration;

use rand::Rng;

use crate::classify::{Classification, Effect, ResponseClass};
use crate::hint::{HintReading, HintRules, HintVerdict};
use crate::outcome::{AttemptRecord, Outcome, RecordDecision, ResponseStatus};

mod decision;
mod policy;

pub use decision::{
    AttemptStart, Decision, EngineError, GateRefusal, Observation, Phase, WakeCheck, WakeDecision,
};
pub use policy::{
    DEFAULT_BACKOFF, DEFAULT_MAX_ATTEMPTS, DEFAULT_MAX_HINT, DEFAULT_MIN_WAIT, IntentPolicy,
    IntentPolicyBuilder, IntentSpec, PolicyError, RepetitionKind, RetryOwner,
};

/// What [`Intent::decide`] learned on the way to its decision, for the record.
#[derive(Debug, Default)]
struct Findings {
    hint: Option<HintReading>,
    remaining: Option<Duration>,
    wait: Option<Duration>,
    next_start: Option<Duration>,
}

/// One intent under one policy: the state machine.
#[derive(Debug, Clone)]
pub struct Intent {
    spec: IntentSpec,
    policy: IntentPolicy,
    phase: Phase,
    records: Vec<AttemptRecord>,
    /// The clock may not go backwards: every call's `now` is checked against it.
    latest: Duration,
    request_time: Duration,
    waited_time: Duration,
    /// 500-class failures are retried at most once per intent.
    retry_once_spent: bool,
    /// When a hold began and the earliest first start it allows
    /// ([`Intent::hold`]); `None` for a first attempt that was not held.
    held: Option<(Duration, Duration)>,
}

impl Intent {
    /// A fresh intent; its first attempt starts at elapsed zero.
    pub fn new(spec: IntentSpec, policy: IntentPolicy) -> Self {
        Intent {
            spec,
            policy,
            phase: Phase::Fresh,
            records: Vec::new(),
            latest: Duration::ZERO,
            request_time: Duration::ZERO,
            waited_time: Duration::ZERO,
            retry_once_spent: false,
            held: None,
        }
    }

    /// Whether an attempt starting at `start` can finish, with its full
    /// reserve, inside the budget. The gate asks this of a coordinator slot.
    pub fn fits(&self, start: Duration) -> bool {
        start
            .checked_add(self.policy.attempt_cap())
            .is_some_and(|end| end <= self.policy.total_budget())
    }

    /// Starts an attempt: the first from [`Phase::Fresh`], a later one from
    /// [`Phase::Admitted`] at the instant of admission.
    pub fn start_attempt(&mut self, now: Duration) -> Result<AttemptStart, EngineError> {
        self.check_call("start_attempt", now)?;
        match self.phase {
            Phase::Fresh => match self.held {
                Some((_, until)) if now < until => {
                    return Err(EngineError::EarlyWake {
                        now,
                        next_start: until,
                    });
                }
                Some((since, _)) => self.waited_time += now - since,
                None => {}
            },
            Phase::Admitted { at } if at == now => {}
            Phase::Admitted { at } => {
                return Err(EngineError::StaleAdmission {
                    admitted_at: at,
                    now,
                });
            }
            phase => {
                return Err(EngineError::WrongPhase {
                    call: "start_attempt",
                    phase,
                });
            }
        }
        if !self.fits(now) {
            return Err(EngineError::WouldMissDeadline { now });
        }
        self.latest = now;
        let number = self.attempts_started() + 1;
        self.records
            .push(AttemptRecord::started(&self.spec.intent_id, number, now));
        self.phase = Phase::InFlight { start: now };
        Ok(AttemptStart {
            number,
            at: now,
            must_end_by: now + self.policy.attempt_cap(),
        })
    }

    /// Takes the response of the attempt in flight, received at `now`, and
    /// decides: wait then reconsider, or stop. The decision and its evidence
    /// are recorded on the attempt.
    pub fn on_response<R: Rng + ?Sized>(
        &mut self,
        now: Duration,
        observation: Observation,
        rng: &mut R,
    ) -> Result<Decision, EngineError> {
        self.check_call("on_response", now)?;
        let Phase::InFlight { start } = self.phase else {
            return Err(EngineError::WrongPhase {
                call: "on_response",
                phase: self.phase,
            });
        };
        let cap = self.policy.attempt_cap();
        if now - start > cap {
            return Err(EngineError::AttemptOverran {
                start,
                receipt: now,
                cap,
            });
        }
        self.latest = now;
        self.request_time += now - start;

        let (decision, findings) = self.decide(now, &observation, rng);
        if matches!(decision, Decision::Wait { .. })
            && observation.classification.class == ResponseClass::RetryOnce
        {
            self.retry_once_spent = true;
        }
        if let Some(record) = self.records.last_mut() {
            record.receipt = Some(now);
            record.status = Some(observation.status);
            record.classification = Some(observation.classification);
            record.hint = findings.hint;
            record.remaining = findings.remaining;
            record.wait = findings.wait;
            record.next_start = findings.next_start;
            record.decision = Some(match decision {
                Decision::Wait { .. } => RecordDecision::Wait,
                Decision::Stop(outcome) => RecordDecision::Stop(outcome),
            });
        }
        self.phase = match decision {
            Decision::Wait { next_start, .. } => Phase::Waiting {
                since: now,
                next_start,
            },
            Decision::Stop(outcome) => Phase::Ended { outcome, at: now },
        };
        Ok(decision)
    }

    /// The decision order (module docs, from classification to the deadline gate) for one response, with
    /// the evidence gathered on the way.
    fn decide<R: Rng + ?Sized>(
        &self,
        now: Duration,
        observation: &Observation,
        rng: &mut R,
    ) -> (Decision, Findings) {
        let mut findings = Findings::default();
        let stop = |outcome, findings| (Decision::Stop(outcome), findings);
        let Classification { class, effect } = observation.classification;
        match class {
            ResponseClass::Success => return stop(Outcome::Succeeded, findings),
            ResponseClass::NonRetryable => return stop(Outcome::NonRetryable, findings),
            ResponseClass::RetryOnce if self.retry_once_spent => {
                return stop(Outcome::NonRetryable, findings);
            }
            ResponseClass::Throttled | ResponseClass::Transient | ResponseClass::RetryOnce => {}
        }
        if effect == Effect::Unknown && !self.spec.repetition.is_repeat_safe() {
            let outcome = match self.spec.repetition {
                RepetitionKind::Reconcilable => Outcome::ReconciliationRequired,
                _ => Outcome::Indeterminate,
            };
            return stop(outcome, findings);
        }
        if self.spec.retry_owner == RetryOwner::Elsewhere {
            return stop(Outcome::OwnerElsewhere, findings);
        }

        // From here the response is one to retry: its hint and the budget
        // left are evidence even when the intent stops below.
        let rules = HintRules {
            clock_trusted: self.spec.clock_trusted,
            max_hint: self.policy.max_hint(),
        };
        let reading = observation.read_hint(self.spec.wall_at_start + now, rules);
        let verdict = reading.verdict;
        findings.hint = Some(reading);
        findings.remaining = Some(self.policy.total_budget().saturating_sub(now));

        if self.attempts_started() >= self.policy.max_attempts() {
            return stop(Outcome::AttemptCap, findings);
        }
        let basis = match verdict {
            HintVerdict::ClockUntrusted => return stop(Outcome::ClockUntrusted, findings),
            HintVerdict::ExceedsCap { .. } => return stop(Outcome::HintExceedsCap, findings),
            HintVerdict::DoNotRetry => return stop(Outcome::NonRetryable, findings),
            HintVerdict::Valid { delay, .. } => delay,
            // The floor bounds the jitter's range before the draw.
            HintVerdict::Absent | HintVerdict::Invalid(_) => self.policy.backoff().delay_at_least(
                self.attempts_started(),
                self.policy.min_wait(),
                rng,
            ),
        };
        let wait = basis.max(self.policy.min_wait());
        let next_start = now.saturating_add(wait);
        findings.wait = Some(wait);
        findings.next_start = Some(next_start);
        if !self.fits(next_start) {
            return stop(Outcome::DeadlineInfeasible, findings);
        }
        (Decision::Wait { next_start, wait }, findings)
    }

    /// Reconsiders at `now`, when the wait is over: re-checks cancellation
    /// and the deadline against `now` itself (a late wake may no longer fit,
    /// whatever was true at receipt).
    pub fn on_wake(
        &mut self,
        now: Duration,
        check: WakeCheck,
    ) -> Result<WakeDecision, EngineError> {
        let (since, next_start) = self.waiting("on_wake", now)?;
        if now < next_start {
            return Err(EngineError::EarlyWake { now, next_start });
        }
        self.latest = now;
        if let Some(last) = self.records.last_mut() {
            last.woke = Some(now);
        }
        let stop = if check.cancelled {
            Some(Outcome::Cancelled)
        } else if !self.fits(now) {
            Some(Outcome::DeadlineInfeasible)
        } else {
            None
        };
        if let Some(outcome) = stop {
            self.end(now, outcome);
            return Ok(WakeDecision::Stop(outcome));
        }
        self.waited_time += now - since;
        self.phase = Phase::Admitted { at: now };
        Ok(WakeDecision::Start)
    }

    /// Moves the next start later (a coordinator slot after the engine's own
    /// `next_start`) and re-runs the deadline gate for it. Never earlier: that
    /// would wait less than the hint or the floor.
    pub fn defer(&mut self, now: Duration, until: Duration) -> Result<Decision, EngineError> {
        let (since, next_start) = self.waiting("defer", now)?;
        if until < next_start {
            return Err(EngineError::DeferEarlier { until, next_start });
        }
        self.latest = now;
        if !self.fits(until) {
            self.end(now, Outcome::DeadlineInfeasible);
            return Ok(Decision::Stop(Outcome::DeadlineInfeasible));
        }
        if let Some(last) = self.records.last_mut() {
            last.next_start = Some(until);
            last.wait = Some(until - since);
        }
        self.phase = Phase::Waiting {
            since,
            next_start: until,
        };
        Ok(Decision::Wait {
            next_start: until,
            wait: until - since,
        })
    }

    /// Holds the first attempt until at least `until` (a scope's cooldown,
    /// then a coordinator slot after it) and runs the deadline gate for a
    /// start then: an attempt that could not fit ends the intent
    /// `deadline_infeasible` now, before any attempt. Only before the first
    /// start, and only ever later.
    pub fn hold(&mut self, now: Duration, until: Duration) -> Result<Decision, EngineError> {
        self.check_call("hold", now)?;
        if self.phase != Phase::Fresh {
            return Err(EngineError::WrongPhase {
                call: "hold",
                phase: self.phase,
            });
        }
        let since = match self.held {
            Some((_, held_until)) if until < held_until => {
                return Err(EngineError::DeferEarlier {
                    until,
                    next_start: held_until,
                });
            }
            Some((since, _)) => since,
            None => now,
        };
        self.latest = now;
        self.held = Some((since, until));
        if !self.fits(until) {
            self.end(now, Outcome::DeadlineInfeasible);
            return Ok(Decision::Stop(Outcome::DeadlineInfeasible));
        }
        Ok(Decision::Wait {
            next_start: until,
            // A hold until an instant already past (the gate read its clock
            // once for `until` and again for `now`) is no wait at all.
            wait: until.saturating_sub(since),
        })
    }

    /// The earliest first start a hold allows, when the first attempt was
    /// held.
    pub fn held_until(&self) -> Option<Duration> {
        self.held.map(|(_, until)| until)
    }

    /// Ends the intent for a reason only the gate can see (no token, no
    /// capacity, another owner), before an attempt starts.
    pub fn refuse(&mut self, now: Duration, refusal: GateRefusal) -> Result<Outcome, EngineError> {
        self.check_call("refuse", now)?;
        if let Phase::InFlight { .. } = self.phase {
            return Err(EngineError::WrongPhase {
                call: "refuse",
                phase: self.phase,
            });
        }
        self.latest = now;
        let outcome = Outcome::from(refusal);
        self.end(now, outcome);
        Ok(outcome)
    }

    /// Authoritative completion evidence for this exact intent arrived from
    /// outside its own attempts (a reconciliation lookup, a webhook, another
    /// worker) before the next attempt started: the pending retry is dropped
    /// and the intent ends `succeeded`. In flight it is refused: the
    /// attempt's own response decides, then this may follow.
    pub fn complete(&mut self, now: Duration) -> Result<Outcome, EngineError> {
        self.check_call("complete", now)?;
        if let Phase::InFlight { .. } = self.phase {
            return Err(EngineError::WrongPhase {
                call: "complete",
                phase: self.phase,
            });
        }
        self.latest = now;
        self.end(now, Outcome::Succeeded);
        Ok(Outcome::Succeeded)
    }

    /// The owner withdraws the intent at `now`. While waiting, the delayed
    /// attempt is dropped; in flight, the attempt's response is discarded.
    /// Returns the terminal outcome, which is the earlier one if the intent
    /// had already ended.
    pub fn cancel(&mut self, now: Duration) -> Result<Outcome, EngineError> {
        if let Phase::Ended { outcome, .. } = self.phase {
            return Ok(outcome);
        }
        self.check_call("cancel", now)?;
        self.latest = now;
        if let (Phase::InFlight { .. }, Some(last)) = (self.phase, self.records.last_mut()) {
            last.decision = Some(RecordDecision::Stop(Outcome::Cancelled));
            last.response_discarded = true;
        }
        self.end(now, Outcome::Cancelled);
        Ok(Outcome::Cancelled)
    }

    /// Ends the intent at `now`, counting the time since the current phase
    /// began as request or waiting time, so each is counted once.
    fn end(&mut self, now: Duration, outcome: Outcome) {
        match self.phase {
            Phase::InFlight { start } => self.request_time += now - start,
            Phase::Waiting { since, .. } => self.waited_time += now - since,
            Phase::Fresh => {
                if let Some((since, _)) = self.held {
                    self.waited_time += now - since;
                }
            }
            Phase::Admitted { .. } | Phase::Ended { .. } => {}
        }
        self.phase = Phase::Ended { outcome, at: now };
    }

    /// `check_call`, and the wait's start and earliest end for a call that is
    /// only valid while waiting.
    fn waiting(
        &self,
        call: &'static str,
        now: Duration,
    ) -> Result<(Duration, Duration), EngineError> {
        self.check_call(call, now)?;
        match self.phase {
            Phase::Waiting { since, next_start } => Ok((since, next_start)),
            phase => Err(EngineError::WrongPhase { call, phase }),
        }
    }

    /// Refuses any call on an ended intent and any `now` before the latest
    /// time seen. Each call records `now` as the latest only once all its
    /// checks pass, so a refused call changes nothing.
    fn check_call(&self, call: &'static str, now: Duration) -> Result<(), EngineError> {
        if let Phase::Ended { .. } = self.phase {
            return Err(EngineError::WrongPhase {
                call,
                phase: self.phase,
            });
        }
        if now < self.latest {
            return Err(EngineError::TimeWentBack {
                now,
                previous: self.latest,
            });
        }
        Ok(())
    }

    /// The intent's fixed facts.
    pub fn spec(&self) -> &IntentSpec {
        &self.spec
    }
    /// The policy it runs under.
    pub fn policy(&self) -> &IntentPolicy {
        &self.policy
    }
    /// Where it is now.
    pub fn phase(&self) -> Phase {
        self.phase
    }
    /// The terminal outcome and when it happened, once ended.
    pub fn outcome(&self) -> Option<(Outcome, Duration)> {
        match self.phase {
            Phase::Ended { outcome, at } => Some((outcome, at)),
            _ => None,
        }
    }
    /// One record per attempt started, in order.
    pub fn records(&self) -> &[AttemptRecord] {
        &self.records
    }
    /// Attempts started so far.
    pub fn attempts_started(&self) -> u32 {
        u32::try_from(self.records.len()).unwrap_or(u32::MAX)
    }
    /// Elapsed time spent in attempts.
    pub fn request_time(&self) -> Duration {
        self.request_time
    }
    /// Elapsed time actually spent waiting (including a late wake).
    pub fn waited_time(&self) -> Duration {
        self.waited_time
    }
    /// The last response received, whatever the outcome.
    pub fn last_status(&self) -> Option<ResponseStatus> {
        self.records.iter().rev().find_map(|r| r.status)
    }
}

#[cfg(test)]
mod tests;
