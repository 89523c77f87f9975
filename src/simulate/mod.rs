//! `tollgate simulate`: runs the client's decision engine on scenario files
//! with a virtual clock and a seeded RNG, as `examples/scenarios/README.md`
//! specifies.
//!
//! ```text
//! file text ──load──▶ ScenarioInput (serde, unknown fields refused)
//!           ──validate──▶ Scenario (IntentPolicy, IntentSpec, Script, seed)
//!           ──simulate──▶ driver::run(engine) ──▶ Report
//!           ──▶ one JSON line (--json) or a readable table
//! ```
//! There is no decision logic here: classification, hint reading, backoff,
//! the deadline gate and the wake re-check are all the engine's, driven by
//! the scripted driver ([`driver`]). This module only turns JSON into
//! engine inputs and engine evidence into output.
//!
//! Choices the scenario README leaves open, made here:
//! - The scenario operation is repeat-safe and this layer owns retries: a
//!   scenario has no field for either.
//! - `retry_statuses` replaces the classification table's retryable set
//!   ([`tollgate_vocab::classify::classify_http_listed`]), so a listed 500 is retried like any listed
//!   status, up to the attempt cap.
//! - Full jitter randomises only the local backoff; a valid server delay is
//!   never drawn down (the scenario format's semantics never shorten it).

use std::fmt::{self, Write as _};
use std::io::{self, Read, Write};
use std::time::Duration;

use rand::SeedableRng;
use rand::rngs::StdRng;
use serde::{Serialize, Serializer};
use tollgate_client::engine::Intent;
use tollgate_vocab::hint::{HintForm, HintReading, HintVerdict};
use tollgate_vocab::outcome::{AttemptRecord, Outcome, RecordDecision, ResponseStatus};

pub mod driver;
mod scenario;

use driver::ScriptError;

pub use scenario::{MAX_ATTEMPTS, MAX_NAME_BYTES, MAX_SECONDS, Scenario, SimulateError, load};

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
    driver::run(&mut intent, &scenario.script, &mut rng).map_err(|e| match e {
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
}
