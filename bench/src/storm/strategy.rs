//! Retry strategies: how one worker carries one intent to its end.
//!
//! # The extension point
//! The harness knows two traits and nothing else about a strategy:
//! - [`Strategy`]: built once per run by [`StrategyKind::start`] (async, inside
//!   the run's runtime) and asked for one [`WorkerRunner`] per worker;
//! - [`WorkerRunner::run_intent`]: runs one intent, sending attempts only
//!   through [`IntentIo::send`], and returns its [`Outcome`](tollgate_client::outcome::Outcome).
//!
//! The harness owns the clock, the arrivals, cancellation and all counting:
//! attempts are counted at the upstream's door against each intent's real
//! deadline and cancellation time, so a runner cannot misreport them.
//!
//! **Strategies (e) and (f), Tollgate with a real coordinator**, live in
//! `coordinated.rs`: [`StrategyKind::start`] starts the real coordinator over
//! in-memory pipes; each worker gets its own link, lease cache and gate, and
//! [`WorkerRunner::run_intent`] runs the gate with attempts that only call
//! [`IntentIo::send`]. (e) runs under the coordinator's shipped defaults
//! (or `--e-policy`); (f) is told the upstream's spare capacity `C − λ` as
//! its wake rate, for comparison. Pipes, not loopback: a paused clock
//! auto-advances while a task waits on a socket, but not while tokio can
//! still move bytes through a pipe, so (e) and (f) run in `--mode paused` too.
//!
//! Module dependencies run one way: `wall` ← `upstream` ← `runner` ←
//! {`baseline`, `coordinated`} ← `strategy`.
//!
//! # The baselines
//! (a)–(d) share one loop (`baseline.rs`) and differ only in their wait
//! rule, attempt cap and optional local budget:
//! - (a) naive: retry at once, 3 attempts in all, hints ignored;
//! - (b) sleep exactly the `Retry-After`, then retry;
//! - (c) capped exponential backoff with full jitter, never earlier than the
//!   hint: `max(hint, U[0, min(cap, base·2^n)])`;
//! - (d) (c) plus a per-worker [`LocalBudget`](tollgate_client::fallback::LocalBudget) (ratio 0.2 plus a floor): the
//!   tower `TpsBudget` shape.
//!
//! Each reads hints with the one parser, `tollgate_client::hint::read_retry_after`,
//! against the run's [`VirtualWall`].
use super::baseline::{BUDGET_FLOOR_PER_SEC, Baseline, JITTER_BACKOFF, WaitRule};
use super::coordinated::{Coordinated, PolicySource};
pub use super::runner::{
    Answer, IntentFuture, IntentIo, Strategy, VirtualWall, WorkerIdentity, WorkerRunner,
};
use super::{StormConfig, StormError};

/// The strategies the command line can name.
///
/// Each is named for what it does; the letters (a)–(f) that the command
/// line, the report's JSON and the docs use stay its key, so
/// `--strategies a,e` and the published reports read as before.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, serde::Serialize, clap::ValueEnum)]
pub enum StrategyKind {
    /// Naive: retry at once, 3 attempts in all.
    #[value(name = "a", alias = "naive")]
    #[serde(rename = "a")]
    Naive,
    /// Sleep exactly the `Retry-After`, then retry.
    #[value(name = "b", alias = "sleep-hint")]
    #[serde(rename = "b")]
    SleepHint,
    /// Capped exponential backoff with full jitter, never before the hint.
    #[value(name = "c", alias = "full-jitter")]
    #[serde(rename = "c")]
    FullJitter,
    /// (c) with a per-worker local budget (ratio 0.2 plus a floor).
    #[value(name = "d", alias = "local-budget")]
    #[serde(rename = "d")]
    LocalBudget,
    /// Tollgate: every retry through a gate and the real coordinator, under
    /// the coordinator's shipped defaults (or `--e-policy`).
    #[value(name = "e", alias = "tollgate")]
    #[serde(rename = "e")]
    Tollgate,
    /// Tollgate told the upstream's spare capacity: wake rate `C − λ`.
    #[value(name = "f", alias = "tollgate-told")]
    #[serde(rename = "f")]
    TollgateTold,
}

impl StrategyKind {
    /// The key, as on the command line.
    pub fn key(self) -> &'static str {
        match self {
            StrategyKind::Naive => "a",
            StrategyKind::SleepHint => "b",
            StrategyKind::FullJitter => "c",
            StrategyKind::LocalBudget => "d",
            StrategyKind::Tollgate => "e",
            StrategyKind::TollgateTold => "f",
        }
    }

    /// A few words for the chart's legend.
    pub fn label(self) -> &'static str {
        match self {
            StrategyKind::Naive => "naive, 3 attempts",
            StrategyKind::SleepHint => "sleep Retry-After",
            StrategyKind::FullJitter => "full jitter ≥ hint",
            StrategyKind::LocalBudget => "full jitter + local budget",
            StrategyKind::Tollgate => "Tollgate, default policy",
            StrategyKind::TollgateTold => "Tollgate, wake rate told C − λ",
        }
    }

    /// Whether this is a per-process baseline, (a)–(d): what a Tollgate
    /// strategy's lost intents are compared with.
    pub fn is_baseline(self) -> bool {
        !self.is_coordinated()
    }

    /// Whether this runs through the real coordinator, (e) or (f).
    pub fn is_coordinated(self) -> bool {
        matches!(self, StrategyKind::Tollgate | StrategyKind::TollgateTold)
    }

    /// Builds the strategy for one run, inside the run's runtime; async so
    /// that a strategy needing a server (the coordinator, for (e)) can start
    /// it here.
    pub async fn start(self, config: &StormConfig) -> Result<Box<dyn Strategy>, StormError> {
        let (wait, max_attempts, budget_floor) = match self {
            StrategyKind::Naive => (WaitRule::Immediate, 3, None),
            StrategyKind::SleepHint => (WaitRule::Hint, config.max_attempts, None),
            StrategyKind::FullJitter => (
                WaitRule::HintOrJitter(JITTER_BACKOFF),
                config.max_attempts,
                None,
            ),
            StrategyKind::LocalBudget => (
                WaitRule::HintOrJitter(JITTER_BACKOFF),
                config.max_attempts,
                Some(BUDGET_FLOOR_PER_SEC),
            ),
            StrategyKind::Tollgate => {
                let source = match &config.e_policy {
                    Some(path) => PolicySource::File(path.clone()),
                    None => PolicySource::Defaults,
                };
                return Ok(Box::new(Coordinated::start(config, self.key(), source)?));
            }
            StrategyKind::TollgateTold => {
                let source = PolicySource::ToldSpareCapacity;
                return Ok(Box::new(Coordinated::start(config, self.key(), source)?));
            }
        };
        Ok(Box::new(Baseline::new(
            wait,
            max_attempts,
            budget_floor,
            config.attempt_timeout,
        )))
    }
}
