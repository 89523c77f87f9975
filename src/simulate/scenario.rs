//! Scenario files: read (serde, unknown fields refused), bounded and
//! validated into engine inputs, each error naming the scenario and field.

use std::time::Duration;

use super::driver::{Script, ScriptedResponse};
use serde::Deserialize;
use serde_json::Value;
use thiserror::Error;
use tollgate_client::backoff::{Backoff, Jitter};
use tollgate_client::engine::{IntentPolicy, IntentSpec, Observation, RepetitionKind, RetryOwner};
use tollgate_vocab::classify::classify_http_listed;

use super::Secs;

/// The largest number of seconds accepted anywhere in a scenario (about 31
/// years): far beyond any real budget, small enough that no sum overflows.
pub const MAX_SECONDS: f64 = 1e9;
/// The most attempts a scenario may allow.
pub const MAX_ATTEMPTS: u32 = 10_000;
/// The longest scenario name, in bytes.
pub const MAX_NAME_BYTES: usize = 256;

/// A scenario or file that cannot be run. The message names the scenario
/// (or file) and the field.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum SimulateError {
    /// The file could not be read or is not a scenario object or array.
    #[error("{file}: {problem}")]
    File {
        /// The file as named on the command line.
        file: String,
        /// What is wrong.
        problem: String,
    },
    /// One scenario is invalid; others in the same file may still run.
    #[error("scenario {scenario:?}: {field}: {problem}")]
    Scenario {
        /// The scenario's name, or its position if it has none.
        scenario: String,
        /// The field at fault, as a path (`policy.attempt_cap_s`).
        field: String,
        /// What is wrong.
        problem: String,
    },
}

// ---------------------------------------------------------------------------
// Input
// ---------------------------------------------------------------------------

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, expecting = "a scenario object")]
struct ScenarioInput {
    name: String,
    policy: PolicyInput,
    clock: ClockInput,
    responses: Vec<ResponseInput>,
    cancel_at_s: Option<f64>,
    wake_late_s: Option<f64>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct PolicyInput {
    total_budget_s: f64,
    max_attempts: u32,
    attempt_cap_s: f64,
    retry_statuses: Vec<u16>,
    min_wait_s: f64,
    fallback: FallbackInput,
    max_hint_s: Option<f64>,
    #[serde(default)]
    jitter: JitterInput,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct FallbackInput {
    base_s: f64,
    cap_s: f64,
}

#[derive(Debug, Default, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case", deny_unknown_fields)]
enum JitterInput {
    #[default]
    None,
    Full {
        seed: u64,
    },
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ClockInput {
    wall_at_start: String,
    trusted: bool,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ResponseInput {
    duration_s: f64,
    status: u16,
    retry_after: Option<String>,
}

/// A validated scenario, ready to run.
#[derive(Debug, Clone)]
pub struct Scenario {
    pub(super) name: String,
    pub(super) spec: IntentSpec,
    pub(super) policy: IntentPolicy,
    pub(super) script: Script,
    pub(super) seed: u64,
}

impl Scenario {
    /// The scenario's name.
    pub fn name(&self) -> &str {
        &self.name
    }
}

/// Reads every scenario in one file's text. A file-level problem (not JSON,
/// not an object or array) is the outer error; each scenario is validated on
/// its own, so one bad scenario does not hide the others.
pub fn load(file: &str, text: &str) -> Result<Vec<Result<Scenario, SimulateError>>, SimulateError> {
    let file_error = |problem: String| SimulateError::File {
        file: file.to_owned(),
        problem,
    };
    let value: Value =
        serde_json::from_str(text).map_err(|e| file_error(format!("not valid JSON: {e}")))?;
    let items = match value {
        Value::Array(items) => items,
        object @ Value::Object(_) => vec![object],
        _ => {
            return Err(file_error(
                "expected a scenario object or an array of them".to_owned(),
            ));
        }
    };
    Ok(items
        .into_iter()
        .enumerate()
        .map(|(k, item)| {
            let label = item
                .get("name")
                .and_then(Value::as_str)
                .map_or_else(|| format!("#{} in {file}", k + 1), str::to_owned);
            parse(&label, item)
        })
        .collect())
}

fn parse(label: &str, item: Value) -> Result<Scenario, SimulateError> {
    let input: ScenarioInput = serde_path_to_error::deserialize(item).map_err(|e| {
        let path = e.path().to_string();
        let field = if path == "." {
            "(scenario)".to_owned()
        } else {
            path
        };
        SimulateError::Scenario {
            scenario: label.to_owned(),
            field,
            problem: e.into_inner().to_string(),
        }
    })?;
    validate(label, input)
}

/// Checks one scenario's fields, in the order they appear in the README.
fn validate(label: &str, input: ScenarioInput) -> Result<Scenario, SimulateError> {
    let bad = |field: &str, problem: String| SimulateError::Scenario {
        scenario: label.to_owned(),
        field: field.to_owned(),
        problem,
    };
    if input.name.trim().is_empty() || input.name.len() > MAX_NAME_BYTES {
        return Err(bad(
            "name",
            format!("must be 1 to {MAX_NAME_BYTES} bytes, not blank"),
        ));
    }
    let secs = |field: &str, value: f64| seconds(value).map_err(|p| bad(field, p));
    let p = &input.policy;
    let total_budget = secs("policy.total_budget_s", p.total_budget_s)?;
    if !(1..=MAX_ATTEMPTS).contains(&p.max_attempts) {
        return Err(bad(
            "policy.max_attempts",
            format!("must be 1 to {MAX_ATTEMPTS}"),
        ));
    }
    let attempt_cap = secs("policy.attempt_cap_s", p.attempt_cap_s)?;
    if attempt_cap.is_zero() {
        return Err(bad(
            "policy.attempt_cap_s",
            "must be greater than 0".to_owned(),
        ));
    }
    if attempt_cap > total_budget {
        return Err(bad(
            "policy.attempt_cap_s",
            format!(
                "{} s exceeds policy.total_budget_s ({} s): not even the first attempt fits",
                Secs(attempt_cap),
                Secs(total_budget)
            ),
        ));
    }
    for (k, &status) in p.retry_statuses.iter().enumerate() {
        check_status(status).map_err(|e| bad(&format!("policy.retry_statuses[{k}]"), e))?;
    }
    let min_wait = secs("policy.min_wait_s", p.min_wait_s)?;
    let backoff_base = secs("policy.fallback.base_s", p.fallback.base_s)?;
    let backoff_cap = secs("policy.fallback.cap_s", p.fallback.cap_s)?;
    let max_hint = p
        .max_hint_s
        .map(|v| secs("policy.max_hint_s", v))
        .transpose()?;
    let (jitter, seed) = match p.jitter {
        JitterInput::None => (Jitter::None, 0),
        JitterInput::Full { seed } => (Jitter::Full, seed),
    };
    let backoff = Backoff {
        base: backoff_base,
        cap: backoff_cap,
        jitter,
    };
    let policy = IntentPolicy::try_new(
        total_budget,
        p.max_attempts,
        attempt_cap,
        min_wait,
        backoff,
        max_hint,
    )
    .map_err(|e| bad("policy", e.to_string()))?;

    let wall_at_start = httpdate::parse_http_date(&input.clock.wall_at_start).map_err(|_| {
        bad(
            "clock.wall_at_start",
            format!("{:?} is not an HTTP-date", input.clock.wall_at_start),
        )
    })?;

    let mut responses = Vec::with_capacity(input.responses.len());
    for (k, r) in input.responses.iter().enumerate() {
        let duration = secs(&format!("responses[{k}].duration_s"), r.duration_s)?;
        if duration > attempt_cap {
            return Err(bad(
                &format!("responses[{k}].duration_s"),
                format!(
                    "{} s is longer than policy.attempt_cap_s ({} s)",
                    Secs(duration),
                    Secs(attempt_cap)
                ),
            ));
        }
        check_status(r.status).map_err(|e| bad(&format!("responses[{k}].status"), e))?;
        let observation = Observation::http(r.status, r.retry_after.as_deref())
            .classified_as(classify_http_listed(r.status, &p.retry_statuses));
        responses.push(ScriptedResponse {
            duration,
            observation,
        });
    }
    let cancel_at = input
        .cancel_at_s
        .map(|v| secs("cancel_at_s", v))
        .transpose()?;
    let wake_late = secs("wake_late_s", input.wake_late_s.unwrap_or(0.0))?;

    Ok(Scenario {
        spec: IntentSpec {
            intent_id: input.name.clone(),
            repetition: RepetitionKind::Safe,
            retry_owner: RetryOwner::Here,
            wall_at_start,
            clock_trusted: input.clock.trusted,
        },
        name: input.name,
        policy,
        script: Script {
            responses,
            cancel_at,
            wake_late,
        },
        seed,
    })
}

/// A JSON number of seconds as a [`Duration`]: finite, non-negative and at
/// most [`MAX_SECONDS`]. Rounded to the nanosecond, so `0.3` is exactly
/// 300 ms and sums of decimal inputs print as decimals.
fn seconds(value: f64) -> Result<Duration, String> {
    if !value.is_finite() || !(0.0..=MAX_SECONDS).contains(&value) {
        return Err(format!(
            "{value} is not a number of seconds from 0 to {MAX_SECONDS}"
        ));
    }
    // In range by the check above: at most 10^18 nanoseconds, below u64::MAX.
    #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
    let nanos = (value * 1e9).round() as u64;
    Ok(Duration::from_nanos(nanos))
}

fn check_status(status: u16) -> Result<(), String> {
    if (100..=599).contains(&status) {
        Ok(())
    } else {
        Err(format!("{status} is not an HTTP status (100 to 599)"))
    }
}

// ---------------------------------------------------------------------------
// Output
// ---------------------------------------------------------------------------

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decimal_seconds_round_to_the_nanosecond() {
        assert_eq!(seconds(0.3), Ok(Duration::from_millis(300)));
        assert_eq!(seconds(0.1), Ok(Duration::from_millis(100)));
        let sum = seconds(0.1).expect("ok") + seconds(0.2).expect("ok");
        assert_eq!(Secs(sum).to_string(), "0.3");
    }

    #[test]
    fn out_of_range_seconds_are_refused() {
        for v in [-1.0, -0.5, f64::NAN, f64::INFINITY, 2e9] {
            assert!(seconds(v).is_err(), "{v}");
        }
        assert!(seconds(MAX_SECONDS).is_ok());
    }
}
