//! Holding a first attempt for a slot.
//!
//! # Why
//! A scope's cooldown says its upstream refuses everyone until it ends. A
//! retry already waits it out; a first attempt made inside it only adds a
//! refusal the fleet knew was coming, and a fleet of fresh intents arriving
//! together then hits the upstream at the instant the cooldown ends. And when
//! first attempts alone ask for more than the upstream serves (the
//! coordinator's pacing is `saturated`), every one sent straight beyond its
//! capacity is a refusal too. When the coordinator says so
//! (`ScopeView::hold_first_attempts`), a first attempt waits for a slot
//! exactly as a retry does (`Reconsider` marked `first_attempt`, which the
//! coordinator floors by the cooldown as far as it closes the scope,
//! honouring a slot, "ask again", deadline infeasible and a freeze), then
//! goes as the first attempt: it needs no retry token and is counted as a
//! first attempt.
//!
//! With the coordinator unreachable (or giving no usable answer) it waits
//! locally until the cooldown ends plus a local spread, as a retry would,
//! if that still fits the deadline, and then as long as the worker's own
//! pace holds it back (`LocalPacer`). A held start that cannot fit ends
//! the intent `deadline_infeasible` before any attempt.

use std::time::Duration;

use tokio_util::sync::CancellationToken;

use super::Run;
use super::wait::{Asking, Slot, still_waiting};
use crate::engine::GateRefusal;
use crate::gate::intent::{Shadowed, WaitEvidence};
use crate::link::LinkState;
use crate::outcome::Outcome;

/// What the hold before a first attempt came to.
pub(super) enum Held {
    /// No cooldown to wait out: the first attempt starts now.
    No,
    /// Held; the first attempt starts at this elapsed instant.
    StartAt(Duration),
    /// The intent ended while held, with no attempt.
    Ended(Outcome),
}

impl Run<'_> {
    /// Holds the first attempt for a slot (after the scope's known cooldown,
    /// if one lasts), when the coordinator says first attempts should.
    pub(super) async fn hold(&mut self, completion: &CancellationToken) -> Held {
        let view = self.gate.inner.cache.view(&self.scope);
        if !view.hold_first_attempts {
            return Held::No;
        }
        if view.shadow {
            // Held under the policy under trial: let through, counted.
            crate::telemetry::record_shadow(&self.scope.route, Shadowed::WouldDelay.as_str());
            return Held::No;
        }
        let now = self.now();
        let cooldown = view
            .cooldown_until
            .map(|c| self.elapsed_at(c))
            .filter(|&c| c > now);
        // Paced with no cooldown: a slot from now, and only while the
        // coordinator can give one (deciding alone, a first attempt goes).
        if cooldown.is_none() && self.gate.link_state() != LinkState::Connected {
            return Held::No;
        }
        let start = cooldown.unwrap_or(now);
        let mut evidence = WaitEvidence {
            engine_next_start: start,
            cooldown,
            policy_version_at_wait: view.policy_version,
            policy_version_at_wake: view.policy_version,
            ..WaitEvidence::default()
        };
        tracing::debug!(
            in_cooldown = cooldown.is_some(),
            "first attempt held for a slot"
        );
        let started = now;
        // The coordinator floors a held first attempt by the cooldown as far
        // as it closes the scope (a short one is its pacing's to answer
        // for), so the hold starts from now; deciding alone, from the end of
        // the cooldown.
        let mut until = now;
        // Only the first ask says the intent arrived, so the coordinator
        // counts each held first attempt once however often it asks.
        let mut arriving = true;
        // The last instant the coordinator said to ask again at: a hold
        // decided alone after it starts there, as the intent would have
        // asked then.
        let mut asked_back = Duration::ZERO;
        loop {
            if !self.hold_until(self.now(), until) {
                return self.end_hold(evidence);
            }
            let reconsidered = if self.gate.link_state() == LinkState::Connected {
                let asked = self
                    .reconsider(until, Asking::FirstAttempt { arriving })
                    .await;
                arriving = false;
                asked
            } else {
                None
            };
            let alone = reconsidered.is_none();
            let (wake, asking) = match reconsidered {
                Some(Slot::At(at, shadowed)) => {
                    if let Some(shadowed) = shadowed {
                        self.shadow(&mut evidence, shadowed);
                    }
                    evidence.slot = Some(at);
                    // Never before the instant it asked from, which the
                    // engine already holds it to: the coordinator floors the
                    // slot there, and named as a Unix millisecond (rounded
                    // down) it can fall a moment before. Started then, the
                    // intent ended `indeterminate` (the engine refuses a
                    // start before its hold ends).
                    until = until.max(at);
                    (until, false)
                }
                Some(Slot::AskAgain(at)) => {
                    evidence.asked_again = evidence.asked_again.saturating_add(1);
                    let at = self.ask_again_at(at);
                    // Not held to the instant to ask again (a call-back may
                    // bring the ask sooner), unless no start could follow
                    // it: then the hold below ends the intent now.
                    if !self.engine.fits(at) {
                        until = until.max(at);
                    }
                    asked_back = at;
                    (at, true)
                }
                Some(Slot::Infeasible) => {
                    // As after a reply: the coordinator's refusal stands.
                    until = until.max(self.engine.policy().total_budget());
                    (until, false)
                }
                Some(Slot::Frozen) => {
                    self.refuse(GateRefusal::BudgetExhausted);
                    return self.end_hold(evidence);
                }
                None => {
                    // Alone, like a retry: spread, or every intent held in
                    // this cooldown starts at the instant it ends.
                    until = self.alone(&mut evidence, started, until.max(start).max(asked_back));
                    (until, false)
                }
            };
            if !self.hold_until(self.now(), until) {
                return self.end_hold(evidence);
            }
            let waited = if asking {
                self.pause_asking(wake, completion).await
            } else {
                evidence.planned_start = wake;
                self.pause(wake, completion).await
            };
            if !waited {
                return self.end_hold(evidence);
            }
            evidence.policy_version_at_wake =
                self.gate.inner.cache.view(&self.scope).policy_version;
            if alone && let Some(at) = self.paced_alone(&mut evidence) {
                // Not yet by the worker's own pace: hold until then and
                // decide again (with the coordinator, if it is back).
                until = at;
                continue;
            }
            if !asking {
                break;
            }
        }
        // At the held start, cancellation and the deadline are checked again
        // against the current time, as at a retry's wake-up, which is how
        // late this start came after its slot.
        let now = self.now();
        self.gate.inner.lateness.record(now.saturating_sub(until));
        if self.cancel.is_cancelled() {
            self.cancel_at(now);
            return self.end_hold(evidence);
        }
        if !self.hold_until(now, now) {
            return self.end_hold(evidence);
        }
        self.held = Some(evidence);
        Held::StartAt(now)
    }

    /// Holds the engine's first start until `until`, deciding at `now`;
    /// false if the intent ended (a start then cannot fit the deadline).
    /// `now` is the caller's reading: reading the clock again here would
    /// leave the engine later than the instant the caller then starts at.
    fn hold_until(&mut self, now: Duration, until: Duration) -> bool {
        let until = until.max(self.engine.held_until().unwrap_or_default());
        still_waiting(self.engine.hold(now, until))
    }

    fn end_hold(&mut self, evidence: WaitEvidence) -> Held {
        self.held = Some(evidence);
        Held::Ended(
            self.engine
                .outcome()
                .map_or(Outcome::Indeterminate, |(o, _)| o),
        )
    }
}
