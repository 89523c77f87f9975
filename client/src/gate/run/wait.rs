//! The wait between attempts: the scope's state, `Reconsider` (a slot, or
//! "ask again" until one is near), the wait itself, the re-check at the
//! wake-up and admission with a permit and a token.

use std::time::Duration;

use rand::RngExt;
use tokio::sync::OwnedSemaphorePermit;
use tokio::sync::broadcast::error::RecvError;
use tokio_util::sync::CancellationToken;
use tollgate_proto::v1::{ReconsiderDecision, RetryClass};

use super::{Run, engine_bug, lock};
use crate::classify::ResponseClass;
use crate::clock::to_unix_ms;
use crate::engine::{Decision, EngineError, GateRefusal, Phase, WakeCheck, WakeDecision};
use crate::fallback::Pace;
use crate::gate::intent::{Shadowed, TokenSource, WaitEvidence};
use crate::lease::{ScopeView, Take};
use crate::link::LinkState;
use crate::wire;

/// Re-evaluations of one wake-up when the policy version keeps changing; past
/// it the newest version is used as is. Bounds the loop, not the safety: each
/// re-evaluation still ends in the same admission checks.
const MAX_REEVALUATIONS: u32 = 4;

/// The least time between two `Reconsider` calls of one intent told to ask
/// again, whatever instant the coordinator named (one in the past included):
/// with the gate's `min_wait` above it, every ask-again makes progress toward
/// the deadline, so the loop ends.
const ASK_AGAIN_FLOOR: Duration = Duration::from_millis(1);

/// What the wait after a reply came to.
pub(super) enum Admitted {
    Yes {
        permit: OwnedSemaphorePermit,
        token: TokenSource,
        at: Duration,
    },
    Ended,
}

/// Who asks the coordinator for a slot.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Asking {
    /// A retry.
    Retry,
    /// A first attempt held for a slot; `arriving` on its first ask, which
    /// the coordinator counts as a first attempt arriving (what its slots
    /// release later is a backlog, not an arrival rate).
    FirstAttempt { arriving: bool },
}

impl Asking {
    fn is_first_attempt(self) -> bool {
        matches!(self, Asking::FirstAttempt { .. })
    }
}

/// The coordinator's answer to `Reconsider`.
pub(super) enum Slot {
    /// A slot at this elapsed instant; under a shadow policy, what
    /// enforcing would have answered instead.
    At(Duration, Option<Shadowed>),
    /// Nothing given yet: ask again at this elapsed instant.
    AskAgain(Duration),
    Infeasible,
    Frozen,
}

/// What planning a wait came to.
enum Planned {
    /// Wait until the engine's next start, then re-check and admit;
    /// `alone` when no slot came from the coordinator.
    Wake { alone: bool },
    /// Wait until this instant, then plan again; never an attempt then.
    AskAgain(Duration),
    /// The intent ended.
    Ended,
}

impl Run<'_> {
    /// After a `Wait` decision: scope, `Reconsider`, wait, re-check, admit.
    pub(super) async fn wait(&mut self, completion: &CancellationToken) -> Admitted {
        let view = self.gate.inner.cache.view(&self.scope);
        let mut evidence = WaitEvidence {
            engine_next_start: self.next_start().unwrap_or_default(),
            policy_version_at_wait: view.policy_version,
            policy_version_at_wake: view.policy_version,
            ..WaitEvidence::default()
        };
        let mut view = view;
        // The last instant the coordinator said to ask again at: a wait
        // decided alone after it (the coordinator gone meanwhile) starts
        // there, as the intent would have asked then.
        let mut asked_back = Duration::ZERO;
        loop {
            let (until, asking, alone) = match self.plan(&view, &mut evidence, asked_back).await {
                Planned::Ended => return self.end_wait(evidence),
                Planned::AskAgain(at) => {
                    asked_back = at;
                    (at, true, false)
                }
                Planned::Wake { alone } => match self.next_start() {
                    Some(next_start) => (next_start, false, alone),
                    None => return self.end_wait(evidence),
                },
            };
            let waited = if asking {
                self.pause_asking(until, completion).await
            } else {
                evidence.planned_start = until;
                self.pause(until, completion).await
            };
            if !waited {
                return self.end_wait(evidence);
            }
            let current = self.gate.inner.cache.view(&self.scope);
            // Version 0 means the worker had not heard of the scope's policy
            // yet: learning it is not a rotation.
            let rotated = evidence.policy_version_at_wake != 0
                && current.policy_version != evidence.policy_version_at_wake;
            evidence.policy_version_at_wake = current.policy_version;
            view = current;
            if asking {
                // An ask-again instant is a time to ask, not to start: plan
                // again (under whatever version is current) and ask.
                continue;
            }
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
            if alone && let Some(at) = self.paced_alone(&mut evidence) {
                // Not yet by the worker's own pace: plan again then (with
                // the coordinator, if it is back by then).
                if !self.defer(at) {
                    return self.end_wait(evidence);
                }
                continue;
            }
            break;
        }
        let admitted = self.admit(&view).await;
        self.attach_wait(evidence);
        admitted
    }

    /// Waits until elapsed `until`; cancellation and completion evidence end
    /// the wait (and the intent) at once. Returns whether it ran to `until`.
    pub(super) async fn pause(&mut self, until: Duration, completion: &CancellationToken) -> bool {
        tokio::select! {
            biased;
            () = self.cancel.cancelled() => {
                let now = self.now();
                self.cancel_at(now);
                false
            }
            () = completion.cancelled() => {
                let now = self.now();
                if let Err(err) = self.engine.complete(now) {
                    engine_bug(&err);
                }
                false
            }
            () = tokio::time::sleep_until(self.epoch + until) => true,
        }
    }

    /// Told to ask again: waits until elapsed `until`, or until the
    /// coordinator calls the intent back sooner (a CALL_BACK on its scope
    /// reaching its deadline: slots go unused that it can take).
    /// Cancellation and completion evidence end the wait as in
    /// [`Run::pause`]. Returns whether it is to ask again now.
    pub(super) async fn pause_asking(
        &mut self,
        until: Duration,
        completion: &CancellationToken,
    ) -> bool {
        let mut calls = self.gate.inner.cache.call_backs();
        let scope = self.scope.clone();
        let deadline_ms = to_unix_ms(self.wall_at(self.engine.policy().total_budget()));
        let called = async {
            loop {
                match calls.recv().await {
                    Ok(call) if call.scope == scope && call.deadline_ms >= deadline_ms => return,
                    Ok(_) => {}
                    // Fell behind: perhaps called; asking early costs a call.
                    Err(RecvError::Lagged(_)) => return,
                    Err(RecvError::Closed) => std::future::pending::<()>().await,
                }
            }
        };
        tokio::select! {
            waited = self.pause(until, completion) => waited,
            () = called => true,
        }
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

    /// Before the wait: floor, scope state, coordinator slot or local spread
    /// (decided alone, from `asked_back` at the earliest: the last instant
    /// the coordinator said to ask again at).
    async fn plan(
        &mut self,
        view: &ScopeView,
        evidence: &mut WaitEvidence,
        asked_back: Duration,
    ) -> Planned {
        let Phase::Waiting { since, next_start } = self.engine.phase() else {
            return Planned::Ended;
        };
        let now = self.now();
        if view.frozen {
            self.refuse(GateRefusal::BudgetExhausted);
            return Planned::Ended;
        }
        let mut until = next_start.max(since.saturating_add(self.gate.inner.config.min_wait));
        if let Some(cooldown) = view.cooldown_until {
            let at = self.elapsed_at(cooldown);
            if at > until {
                if view.shadow {
                    // The fleet's cooldown is the policy under trial; the
                    // engine's own wait (this attempt's hint) still holds.
                    self.shadow(evidence, Shadowed::WouldDelay);
                } else {
                    evidence.cooldown = Some(at);
                    until = at;
                }
            }
        }
        until = until.max(now);
        let reconsidered = if self.gate.link_state() == LinkState::Connected {
            self.reconsider(until, Asking::Retry).await
        } else {
            None
        };
        let alone = reconsidered.is_none();
        match reconsidered {
            Some(Slot::At(at, shadowed)) => {
                evidence.slot = Some(at);
                if let Some(shadowed) = shadowed {
                    self.shadow(evidence, shadowed);
                }
                until = until.max(at);
            }
            Some(Slot::AskAgain(at)) => {
                evidence.asked_again = evidence.asked_again.saturating_add(1);
                let at = self.ask_again_at(at);
                // The next start is not moved to the instant to ask again:
                // a call-back may bring the ask sooner. But an instant no
                // attempt could follow ends the intent now (the deadline
                // gate), not after a pointless wait.
                if !self.engine.fits(at) && !self.defer(at.max(next_start)) {
                    return Planned::Ended;
                }
                return Planned::AskAgain(at);
            }
            Some(Slot::Infeasible) => {
                // The coordinator's refusal stands even if this clock thinks
                // the slot would fit: defer past the budget to end the intent.
                until = until.max(self.engine.policy().total_budget());
            }
            Some(Slot::Frozen) => {
                self.refuse(GateRefusal::BudgetExhausted);
                return Planned::Ended;
            }
            None => {
                let since = match self.engine.phase() {
                    Phase::Waiting { since, .. } => since,
                    _ => until,
                };
                until = self.alone(evidence, since, until.max(asked_back));
            }
        }
        if until > next_start && !self.defer(until) {
            return Planned::Ended;
        }
        Planned::Wake { alone }
    }

    /// Records on `evidence` (and counts) what a shadow policy let through;
    /// a refusal outranks a delay.
    pub(super) fn shadow(&self, evidence: &mut WaitEvidence, shadowed: Shadowed) {
        if evidence.shadowed == Some(shadowed) || evidence.shadowed == Some(Shadowed::WouldRefuse) {
            return;
        }
        evidence.shadowed = Some(shadowed);
        crate::telemetry::record_shadow(&self.scope.route, shadowed.as_str());
    }

    /// Moves the engine's next start to `until`; false if the intent ended
    /// (it no longer fits the deadline).
    fn defer(&mut self, until: Duration) -> bool {
        let now = self.now();
        still_waiting(self.engine.defer(now, until))
    }

    /// The instant to ask again: the coordinator's, but never sooner than
    /// `min_wait` (at least [`ASK_AGAIN_FLOOR`]) from now.
    pub(super) fn ask_again_at(&self, at: Duration) -> Duration {
        let floor = self.gate.inner.config.min_wait.max(ASK_AGAIN_FLOOR);
        at.max(self.now().saturating_add(floor))
    }

    /// Decided alone (no usable answer from the coordinator): the wake-up
    /// is `until` plus a local spread, so the intents deciding alone do not
    /// all start at one instant; recorded in `evidence`. Once the worker's
    /// own pace has held the wake-up back, its draws spread it instead.
    pub(super) fn alone(
        &self,
        evidence: &mut WaitEvidence,
        since: Duration,
        until: Duration,
    ) -> Duration {
        evidence.degraded = true;
        if evidence.paced_alone > 0 {
            return until;
        }
        let spread = self.spread_after(since, until);
        if !spread.is_zero() {
            evidence.local_spread = Some(spread);
        }
        until + spread
    }

    /// At a wake-up decided alone, the worker's own pace for the scope
    /// ([`LocalPacer`](crate::fallback::LocalPacer)): `Some(at)` to decide
    /// again at elapsed `at` (counted in `evidence`), `None` to go now.
    pub(super) fn paced_alone(&self, evidence: &mut WaitEvidence) -> Option<Duration> {
        match self.gate.inner.cache.pace_alone(&self.scope) {
            Pace::Go => None,
            Pace::Later(after) => {
                evidence.paced_alone = evidence.paced_alone.saturating_add(1);
                Some(self.ask_again_at(self.now().saturating_add(after)))
            }
        }
    }

    /// Up to `local_spread` of extra wait after a wait from `since` to
    /// `until`, no more than that wait, and never so much that an attempt
    /// stops fitting the deadline.
    fn spread_after(&self, since: Duration, until: Duration) -> Duration {
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

    /// `Reconsider`: asks the coordinator for a slot, for a retry or a held
    /// first attempt. `None` when it could not be asked or gave no usable
    /// answer.
    pub(super) async fn reconsider(&self, not_before: Duration, asking: Asking) -> Option<Slot> {
        let policy = self.engine.policy();
        let request = wire::reconsider_request(
            &self.scope,
            &self.intent_id,
            self.wall_at(not_before),
            self.wall_at(policy.total_budget()),
            self.gate.inner.lateness.reserve(policy.attempt_cap()),
            asking.is_first_attempt(),
            asking == Asking::FirstAttempt { arriving: true },
        );
        let answer = match self.gate.inner.cache.link().reconsider(request).await {
            Ok(answer) => answer,
            Err(err) => {
                tracing::debug!(cause = %err, "no slot; deciding locally");
                return None;
            }
        };
        let at = |unix_ms| self.elapsed_at(crate::clock::from_unix_ms(unix_ms));
        match ReconsiderDecision::try_from(answer.decision) {
            Ok(ReconsiderDecision::Slot) => Some(Slot::At(
                at(answer.slot_unix_ms),
                Shadowed::from_wire(answer.shadowed),
            )),
            Ok(ReconsiderDecision::AskAgain) => Some(Slot::AskAgain(at(answer.ask_again_unix_ms))),
            Ok(ReconsiderDecision::DeadlineInfeasible) => Some(Slot::Infeasible),
            Ok(ReconsiderDecision::Frozen) => Some(Slot::Frozen),
            Ok(ReconsiderDecision::Unspecified) | Err(_) => None,
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
        // cancellation and the deadline at the instant of admission, which
        // is how late this start came after its slot.
        let now = self.now();
        if let Some(due) = self.next_start() {
            self.gate.inner.lateness.record(now.saturating_sub(due));
        }
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
}

/// Whether an engine decision keeps the intent waiting; an engine error is
/// a bug in this driver and ends it.
pub(super) fn still_waiting(decision: Result<Decision, EngineError>) -> bool {
    match decision {
        Ok(Decision::Wait { .. }) => true,
        Ok(Decision::Stop(_)) => false,
        Err(err) => {
            engine_bug(&err);
            false
        }
    }
}
