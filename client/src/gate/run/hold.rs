//! Holding a first attempt inside a known cooldown.
//!
//! # Why
//! A scope's cooldown says its upstream refuses everyone until it ends. A
//! retry already waits it out; a first attempt made inside it only adds a
//! refusal the fleet knew was coming, and a fleet of fresh intents arriving
//! together then hits the upstream at the instant the cooldown ends. When the
//! coordinator's policy says so (`ScopeView::hold_first_attempts`), a first
//! attempt inside a known cooldown waits for a slot exactly as a retry does
//! (`Reconsider` with `not_before` = the cooldown's end, honouring a slot,
//! "ask again", deadline infeasible and a freeze), then goes as the first
//! attempt: it needs no retry token and is counted as a first attempt.
//!
//! With the coordinator unreachable (or giving no usable answer) it waits
//! locally until the cooldown ends plus a local spread, as a retry would,
//! if that still fits the deadline. A held start that cannot fit ends
//! the intent `deadline_infeasible` before any attempt.

use std::time::Duration;

use tokio_util::sync::CancellationToken;

use super::Run;
use super::wait::{Slot, still_waiting};
use crate::engine::GateRefusal;
use crate::gate::intent::WaitEvidence;
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
    /// Holds the first attempt while the scope's known cooldown lasts, when
    /// the coordinator says first attempts should.
    pub(super) async fn hold(&mut self, completion: &CancellationToken) -> Held {
        let view = self.gate.inner.cache.view(&self.scope);
        let Some(cooldown) = view.cooldown_until.filter(|_| view.hold_first_attempts) else {
            return Held::No;
        };
        let cooldown = self.elapsed_at(cooldown);
        if cooldown <= self.now() {
            return Held::No;
        }
        let mut evidence = WaitEvidence {
            engine_next_start: cooldown,
            cooldown: Some(cooldown),
            policy_version_at_wait: view.policy_version,
            policy_version_at_wake: view.policy_version,
            ..WaitEvidence::default()
        };
        tracing::debug!("first attempt held inside the scope's cooldown");
        let started = self.now();
        let mut until = cooldown;
        loop {
            if !self.hold_until(until) {
                return self.end_hold(evidence);
            }
            let reconsidered = if self.gate.link_state() == LinkState::Connected {
                self.reconsider(until).await
            } else {
                None
            };
            let (wake, asking) = match reconsidered {
                Some(Slot::At(at)) => {
                    evidence.slot = Some(at);
                    until = until.max(at);
                    (until, false)
                }
                Some(Slot::AskAgain(at)) => {
                    evidence.asked_again = evidence.asked_again.saturating_add(1);
                    let at = self.ask_again_at(at);
                    // Nothing starts before the instant to ask again.
                    until = until.max(at);
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
                    until = self.alone(&mut evidence, started, until);
                    (until, false)
                }
            };
            if !self.hold_until(until) {
                return self.end_hold(evidence);
            }
            if !asking {
                evidence.planned_start = wake;
            }
            if !self.pause(wake, completion).await {
                return self.end_hold(evidence);
            }
            evidence.policy_version_at_wake =
                self.gate.inner.cache.view(&self.scope).policy_version;
            if !asking {
                break;
            }
        }
        // At the held start, cancellation and the deadline are checked again
        // against the current time, as at a retry's wake-up.
        let now = self.now();
        if self.cancel.is_cancelled() {
            self.cancel_at(now);
            return self.end_hold(evidence);
        }
        if !self.hold_until(now) {
            return self.end_hold(evidence);
        }
        self.held = Some(evidence);
        Held::StartAt(now)
    }

    /// Holds the engine's first start until `until`; false if the intent
    /// ended (a start then cannot fit the deadline).
    fn hold_until(&mut self, until: Duration) -> bool {
        let now = self.now();
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
