//! A scripted driver: runs the client's [`Intent`] against a fixed list of
//! responses on a virtual clock. `tollgate simulate` and the client's
//! property tests both use it, so there is one driver loop and one engine,
//! and no second copy of either. It lives here, not in the client crate,
//! because no worker runs it: it needs only the engine's public API.
//!
//! The driver only plays time forward and carries out decisions; every
//! decision is the engine's. Its tie rules, chosen so that evidence wins a
//! tie and cancellation wins everything after it:
//! - a response received at the instant of cancellation is still processed
//!   (completion evidence is not thrown away), then the cancellation applies;
//! - a cancellation at or before an attempt's start prevents that attempt.

use std::time::Duration;

use rand::Rng;
use thiserror::Error;

use tollgate_client::engine::{
    Decision, EngineError, Intent, Observation, WakeCheck, WakeDecision,
};

/// What one attempt will get.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ScriptedResponse {
    /// From the attempt's start to the receipt of its response.
    pub duration: Duration,
    /// The response.
    pub observation: Observation,
}

/// The world an intent runs in.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Script {
    /// `responses[k]` answers attempt `k + 1`.
    pub responses: Vec<ScriptedResponse>,
    /// When the owner withdraws the intent, if ever.
    pub cancel_at: Option<Duration>,
    /// How late the scheduler wakes after every planned start.
    pub wake_late: Duration,
}

/// Why a script could not be run to the end.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum ScriptError {
    /// The engine started an attempt the script has no response for.
    #[error("attempt {attempt} started but the script has no response for it")]
    MissingResponse {
        /// The attempt number (1-based).
        attempt: u32,
    },
    /// The driver misused the engine (a bug, or an attempt longer than its cap).
    #[error(transparent)]
    Engine(#[from] EngineError),
}

/// Runs `intent` to its end under `script`, drawing jitter from `rng`.
pub fn run<R: Rng + ?Sized>(
    intent: &mut Intent,
    script: &Script,
    rng: &mut R,
) -> Result<(), ScriptError> {
    let cancelled_by = |t: Duration| script.cancel_at.filter(|&c| c <= t);
    if let Some(at) = cancelled_by(Duration::ZERO) {
        intent.cancel(at)?;
        return Ok(());
    }
    let mut attempt = intent.start_attempt(Duration::ZERO)?;
    loop {
        let response = usize::try_from(attempt.number - 1)
            .ok()
            .and_then(|k| script.responses.get(k))
            .ok_or(ScriptError::MissingResponse {
                attempt: attempt.number,
            })?;
        let receipt = attempt.at.saturating_add(response.duration);
        if let Some(at) = script.cancel_at.filter(|&c| c < receipt) {
            intent.cancel(at)?;
            return Ok(());
        }
        let next_start = match intent.on_response(receipt, response.observation.clone(), rng)? {
            Decision::Stop(_) => return Ok(()),
            Decision::Wait { next_start, .. } => next_start,
        };
        let wake = next_start.saturating_add(script.wake_late);
        if let Some(at) = script.cancel_at.filter(|&c| c < wake) {
            intent.cancel(at)?;
            return Ok(());
        }
        let check = WakeCheck {
            cancelled: cancelled_by(wake).is_some(),
        };
        match intent.on_wake(wake, check)? {
            WakeDecision::Stop(_) => return Ok(()),
            WakeDecision::Start => attempt = intent.start_attempt(wake)?,
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::SystemTime;

    use rand::SeedableRng;
    use rand::rngs::StdRng;

    use super::*;
    use tollgate_client::backoff::{Backoff, Jitter};
    use tollgate_client::engine::{IntentPolicy, IntentSpec, RepetitionKind, RetryOwner};
    use tollgate_client::outcome::Outcome;

    fn s(secs: u64) -> Duration {
        Duration::from_secs(secs)
    }

    fn run_script(script: &Script) -> (Result<(), ScriptError>, Intent) {
        let backoff = Backoff {
            base: s(1),
            cap: s(60),
            jitter: Jitter::None,
        };
        let policy = IntentPolicy::try_new(s(20), 3, s(4), s(1), backoff, None).expect("policy");
        let spec = IntentSpec {
            intent_id: "script".to_owned(),
            repetition: RepetitionKind::Safe,
            retry_owner: RetryOwner::Here,
            wall_at_start: SystemTime::UNIX_EPOCH,
            clock_trusted: true,
        };
        let mut intent = Intent::new(spec, policy);
        let result = run(&mut intent, script, &mut StdRng::seed_from_u64(0));
        (result, intent)
    }

    fn respond(secs: u64, status: u16, hint: Option<&str>) -> ScriptedResponse {
        ScriptedResponse {
            duration: s(secs),
            observation: Observation::http(status, hint),
        }
    }

    #[test]
    fn a_response_at_the_instant_of_cancellation_is_still_evidence() {
        let script = Script {
            responses: vec![respond(2, 200, None)],
            cancel_at: Some(s(2)),
            wake_late: Duration::ZERO,
        };
        let (result, intent) = run_script(&script);
        assert_eq!(result, Ok(()));
        assert_eq!(intent.outcome(), Some((Outcome::Succeeded, s(2))));
    }

    #[test]
    fn cancellation_at_the_wake_instant_prevents_the_start() {
        let script = Script {
            responses: vec![respond(2, 429, Some("3")), respond(1, 200, None)],
            cancel_at: Some(s(5)),
            wake_late: Duration::ZERO,
        };
        let (_, intent) = run_script(&script);
        assert_eq!(intent.outcome(), Some((Outcome::Cancelled, s(5))));
        assert_eq!(intent.attempts_started(), 1);
    }

    #[test]
    fn a_missing_response_is_reported_with_its_attempt() {
        let script = Script {
            responses: vec![respond(2, 429, Some("3"))],
            ..Script::default()
        };
        let (result, _) = run_script(&script);
        assert_eq!(result, Err(ScriptError::MissingResponse { attempt: 2 }));
    }
}
