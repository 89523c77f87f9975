//! `tollgate simulate`: runs the client's decision engine on scenario files
//! with a virtual clock and a seeded RNG, as `examples/scenarios/README.md`
//! specifies.
//!
//! ```text
//! file text ──load──▶ ScenarioInput (serde, unknown fields refused)
//!           ──validate──▶ Scenario (IntentPolicy, IntentSpec, Script, seed)
//!           ──simulate──▶ tollgate_client::script::run(engine) ──▶ Report
//!           ──▶ one JSON line (--json) or a readable table
//! ```
//! There is no decision logic here: classification, hint reading, backoff,
//! the deadline gate and the wake re-check are all the engine's, driven by
//! the engine crate's scripted driver. This module only turns JSON into
//! engine inputs and engine evidence into output.
//!
//! Choices the scenario README leaves open, made here:
//! - The scenario operation is repeat-safe and this layer owns retries: a
//!   scenario has no field for either.
//! - `retry_statuses` replaces the classification table's retryable set
//!   ([`classify_http_listed`]), so a listed 500 is retried like any listed
//!   status, up to the attempt cap.
//! - Full jitter randomises only the local backoff; a valid server delay is
//!   never drawn down (README semantics step 4 says it is never shortened).

use std::fmt::{self, Write as _};
use std::io::{self, Read, Write};
use std::time::Duration;

use rand::SeedableRng;
use rand::rngs::StdRng;
use serde::{Deserialize, Serialize, Serializer};
use serde_json::Value;
use thiserror::Error;
use tollgate_client::backoff::{Backoff, Jitter};
use tollgate_client::classify::classify_http_listed;
use tollgate_client::engine::{
    Intent, IntentPolicy, IntentSpec, Observation, RepetitionKind, RetryOwner,
};
use tollgate_client::hint::{HintForm, HintReading, HintVerdict};
use tollgate_client::outcome::{AttemptRecord, Outcome, RecordDecision, ResponseStatus};
use tollgate_client::script::{self, Script, ScriptError, ScriptedResponse};

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
    name: String,
    spec: IntentSpec,
    policy: IntentPolicy,
    script: Script,
    seed: u64,
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

/// A duration printed as seconds: a JSON integer when whole (`14`, not
/// `14.0`, since expected results compare JSON values), else a decimal.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Secs(pub Duration);

impl Serialize for Secs {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        if self.0.subsec_nanos() == 0 {
            serializer.serialize_u64(self.0.as_secs())
        } else {
            serializer.serialize_f64(self.0.as_secs_f64())
        }
    }
}

impl fmt::Display for Secs {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.0.subsec_nanos() == 0 {
            write!(f, "{}", self.0.as_secs())
        } else {
            write!(f, "{}", self.0.as_secs_f64())
        }
    }
}

/// The result of one scenario, field for field as the README's `--json`.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Report {
    /// The scenario's name.
    pub name: String,
    /// The terminal outcome.
    pub outcome: Outcome,
    /// When the intent ended.
    pub ended_at_s: Secs,
    /// Attempts started.
    pub attempts: u32,
    /// Elapsed time in attempts.
    pub request_s: Secs,
    /// Elapsed time actually waited.
    pub waited_s: Secs,
    /// The last response received, reported apart from the outcome.
    pub last_status: Option<u16>,
    /// One entry per attempt.
    pub timeline: Vec<Entry>,
    /// What a person is shown.
    pub message: String,
}

/// One attempt in a [`Report`]. Fields that did not apply are left out.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Entry {
    /// 1 for the first attempt.
    pub attempt: u32,
    /// When it started.
    pub start_s: Secs,
    /// When its response arrived (absent if cancelled in flight).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub receipt_s: Option<Secs>,
    /// The status received (null if none was).
    pub status: Option<u16>,
    /// The hint, when the response was one to retry.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub hint: Option<HintEntry>,
    /// The wait chosen.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub wait_s: Option<Secs>,
    /// The earliest reconsideration time.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub next_start_s: Option<Secs>,
    /// Budget left at receipt.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub remaining_s: Option<Secs>,
    /// When the scheduler woke, present only when it woke late.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub woke_s: Option<Secs>,
    /// `wait` or the outcome.
    pub decision: &'static str,
    /// Present (true) when cancellation discarded this attempt's response.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub response_discarded: bool,
}

/// A hint as received and read.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct HintEntry {
    /// The raw header text, or null.
    pub raw: Option<String>,
    /// `delay`, `date`, `absent` or `invalid`.
    pub form: HintForm,
    /// Whether it was a usable wait boundary (above a cap still counts).
    pub valid: bool,
    /// The delay it asked for.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub delay_s: Option<Secs>,
    /// The cap it exceeded.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cap_s: Option<Secs>,
    /// A date already past at receipt.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub past: bool,
    /// Why it was not usable.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub problem: Option<&'static str>,
}

impl HintEntry {
    fn from_reading(reading: &HintReading) -> Self {
        let (valid, delay, cap, past, problem) = match reading.verdict {
            HintVerdict::Absent => (false, None, None, false, None),
            HintVerdict::Valid { delay, past } => (true, Some(delay), None, past, None),
            HintVerdict::ExceedsCap { delay, cap } => (true, Some(delay), Some(cap), false, None),
            HintVerdict::Invalid(why) => (false, None, None, false, Some(why.describe())),
            HintVerdict::ClockUntrusted => (false, None, None, false, Some("clock untrusted")),
            HintVerdict::DoNotRetry => (false, None, None, false, Some("do not retry")),
        };
        HintEntry {
            raw: reading.raw.clone(),
            form: reading.form,
            valid,
            delay_s: delay.map(Secs),
            cap_s: cap.map(Secs),
            past,
            problem,
        }
    }
}

fn http_status(status: ResponseStatus) -> Option<u16> {
    match status {
        ResponseStatus::Http(code) => Some(code),
        ResponseStatus::Grpc(_) | ResponseStatus::Transport(_) => None,
    }
}

impl Entry {
    fn from_record(record: &AttemptRecord) -> Self {
        let late = record.woke.filter(|&woke| Some(woke) != record.next_start);
        Entry {
            attempt: record.number,
            start_s: Secs(record.start),
            receipt_s: record.receipt.map(Secs),
            status: record.status.and_then(http_status),
            hint: record.hint.as_ref().map(HintEntry::from_reading),
            wait_s: record.wait.map(Secs),
            next_start_s: record.next_start.map(Secs),
            remaining_s: record.remaining.map(Secs),
            woke_s: late.map(Secs),
            decision: record.decision.map_or("in_flight", RecordDecision::as_str),
            response_discarded: record.response_discarded,
        }
    }
}

/// Runs one scenario on the engine.
pub fn simulate(scenario: &Scenario) -> Result<Report, SimulateError> {
    let bad = |field: &str, problem: String| SimulateError::Scenario {
        scenario: scenario.name.clone(),
        field: field.to_owned(),
        problem,
    };
    let mut intent = Intent::new(scenario.spec.clone(), scenario.policy);
    let mut rng = StdRng::seed_from_u64(scenario.seed);
    script::run(&mut intent, &scenario.script, &mut rng).map_err(|e| match e {
        ScriptError::MissingResponse { attempt } => bad(
            "responses",
            format!(
                "attempt {attempt} starts but only {} responses are given",
                scenario.script.responses.len()
            ),
        ),
        ScriptError::Engine(e) => bad("(engine)", e.to_string()),
    })?;
    let Some((outcome, ended_at)) = intent.outcome() else {
        return Err(bad("(engine)", "the intent did not end".to_owned()));
    };
    let timeline: Vec<Entry> = intent.records().iter().map(Entry::from_record).collect();
    let message = message(&intent, outcome, ended_at);
    Ok(Report {
        name: scenario.name.clone(),
        outcome,
        ended_at_s: Secs(ended_at),
        attempts: intent.attempts_started(),
        request_s: Secs(intent.request_time()),
        waited_s: Secs(intent.waited_time()),
        last_status: intent.last_status().and_then(http_status),
        timeline,
        message,
    })
}

/// The outcome, then the last response apart from it, then what the hint
/// asked for and whether anything was left unsent.
fn message(intent: &Intent, outcome: Outcome, ended_at: Duration) -> String {
    let last_status = intent
        .last_status()
        .and_then(http_status)
        .map_or_else(|| "none".to_owned(), |s| s.to_string());
    let mut text = format!(
        "{}. Last response: {last_status}. Attempts: {} of {}. Elapsed: {} s.",
        outcome.describe(),
        intent.attempts_started(),
        intent.policy().max_attempts(),
        Secs(ended_at),
    );
    let last = intent.records().last();
    if let Some(reading) = last.and_then(|r| r.hint.as_ref()) {
        let raw = reading.raw.as_deref().unwrap_or_default();
        // Writing to a String cannot fail.
        let _ = match reading.verdict {
            HintVerdict::Valid { delay, .. } => {
                write!(text, " The service requested a {} s delay.", Secs(delay))
            }
            HintVerdict::ExceedsCap { delay, cap } => write!(
                text,
                " The service requested a {} s delay; policy allows at most {} s.",
                Secs(delay),
                Secs(cap)
            ),
            HintVerdict::ClockUntrusted => {
                write!(text, " The service asked to wait until {raw}.")
            }
            HintVerdict::Invalid(why) => write!(
                text,
                " The service's Retry-After {raw:?} was unusable ({}); local backoff applied.",
                why.describe()
            ),
            HintVerdict::DoNotRetry => write!(text, " The service asked not to retry."),
            HintVerdict::Absent => Ok(()),
        };
    }
    match (outcome, last) {
        (Outcome::Succeeded, _) => {}
        (Outcome::Cancelled, Some(r)) if r.response_discarded => {
            let _ = write!(text, " The response to attempt {} was discarded.", r.number);
        }
        (Outcome::Cancelled, Some(_)) => text.push_str(" The pending retry was dropped."),
        (_, Some(r)) if r.woke.is_some() => {
            let _ = write!(
                text,
                " Woke at {} s, too late to fit another attempt. No retry was sent.",
                Secs(ended_at)
            );
        }
        _ => text.push_str(" No retry was sent."),
    }
    text
}

/// The readable form: a heading, the timeline as a table, and the message.
pub fn render_table(report: &Report) -> String {
    let mut out = format!(
        "{}: {} at {} s ({} attempts; request {} s; waited {} s)\n",
        report.name,
        report.outcome,
        report.ended_at_s,
        report.attempts,
        report.request_s,
        report.waited_s,
    );
    let opt = |v: Option<Secs>| v.map_or_else(|| "-".to_owned(), |s| s.to_string());
    let _ = writeln!(
        out,
        "  {:>7}  {:>7}  {:>7}  {:>6}  {:<24}  {:>6}  {:>10}  {:>9}  decision",
        "attempt", "start", "receipt", "status", "hint", "wait", "next start", "remaining"
    );
    for e in &report.timeline {
        let hint = e.hint.as_ref().map_or_else(String::new, |h| match &h.raw {
            Some(raw) => format!("{} {raw:?}", h.form.as_str()),
            None => h.form.as_str().to_owned(),
        });
        let mut decision = e.decision.to_owned();
        if let Some(woke) = e.woke_s {
            let _ = write!(decision, " (woke late at {woke})");
        }
        if e.response_discarded {
            decision.push_str(" (response discarded)");
        }
        let _ = writeln!(
            out,
            "  {:>7}  {:>7}  {:>7}  {:>6}  {:<24}  {:>6}  {:>10}  {:>9}  {decision}",
            e.attempt,
            e.start_s.to_string(),
            opt(e.receipt_s),
            e.status.map_or_else(|| "-".to_owned(), |s| s.to_string()),
            hint,
            opt(e.wait_s),
            opt(e.next_start_s),
            opt(e.remaining_s),
        );
    }
    let _ = writeln!(out, "  {}", report.message);
    out
}

/// Runs every scenario in `files` (`-` is `stdin`), printing results to `out`
/// in input order and problems to `err`. Returns whether every file and
/// scenario was valid; a bad one prints no result of its own.
pub fn run(
    files: &[String],
    json: bool,
    stdin: &mut dyn Read,
    out: &mut dyn Write,
    err: &mut dyn Write,
) -> io::Result<bool> {
    let mut all_valid = true;
    for file in files {
        let text = if file == "-" {
            let mut text = String::new();
            stdin.read_to_string(&mut text).map(|_| text)
        } else {
            std::fs::read_to_string(file)
        };
        let scenarios = text
            .map_err(|e| SimulateError::File {
                file: file.clone(),
                problem: format!("cannot read: {e}"),
            })
            .and_then(|text| load(file, &text));
        let scenarios = match scenarios {
            Ok(scenarios) => scenarios,
            Err(e) => {
                writeln!(err, "error: {e}")?;
                all_valid = false;
                continue;
            }
        };
        for scenario in scenarios {
            match scenario.and_then(|s| simulate(&s)) {
                Ok(report) if json => {
                    serde_json::to_writer(&mut *out, &report)?;
                    writeln!(out)?;
                }
                Ok(report) => writeln!(out, "{}", render_table(&report))?,
                Err(e) => {
                    writeln!(err, "error: {e}")?;
                    all_valid = false;
                }
            }
        }
    }
    Ok(all_valid)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn whole_seconds_are_json_integers_and_fractions_are_decimals() {
        let json = |d| serde_json::to_string(&Secs(d)).expect("serialize");
        assert_eq!(json(Duration::from_secs(14)), "14");
        assert_eq!(json(Duration::from_millis(1500)), "1.5");
        assert_eq!(json(Duration::ZERO), "0");
    }

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
