//! `tollgate bench storm`: does a fleet recover from a rate-limit storm
//! without hammering the upstream?
//!
//! # Layout
//! - [`arrivals`](self) (private): the intent stream, generated once from the
//!   seed and replayed unchanged for every strategy.
//! - [`upstream`](self) (private): the in-process upstream: a token bucket of
//!   capacity C requests/s with an outage window, answering 429 with a
//!   `Retry-After` (delay or HTTP-date) when over capacity; every 429 costs
//!   a fraction of a request's capacity. It counts what it is offered.
//! - [`strategy`]: how one worker runs one intent: the [`Strategy`] and
//!   [`WorkerRunner`] traits (the extension point for strategy (e)), the
//!   [`IntentIo`] a runner sends attempts through, and baselines (a)–(d).
//! - [`report`]: metrics, the markdown table, the SVG chart, the JSON.
//!
//! # How one run goes
//! ```text
//! StormArgs ──validate──▶ StormConfig ──arrivals::generate(seed)──▶ [Arrival] (shared)
//! for each strategy, on a fresh current-thread runtime (paused clock or real):
//!   W worker tasks, each: sleep_until(arrival) → spawn intent → runner.run_intent(IntentIo)
//!   IntentIo::send ──▶ Upstream::offer (counts load, deadline/cancel violations)
//!   every intent's outcome and end time ──▶ report::StrategyResult
//! StormReport ──▶ table (stdout, storm.md), chart (storm.svg), data (storm.json)
//! ```
//!
//! Every strategy starts from elapsed zero on its own runtime, so the
//! arrival stream, the worker seeds and the upstream are identical; in
//! paused mode (`tokio::time::pause`, auto-advancing) a run is exactly
//! reproducible and takes seconds for thousands of workers.

mod arrivals;
mod coordinated;
pub mod report;
pub mod strategy;
mod upstream;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde::Serialize;
use thiserror::Error;
use tokio::task::JoinSet;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tollgate_client::evidence::Outcome;

pub use report::{StormReport, StrategyResult};
pub use strategy::{IntentIo, Strategy, StrategyKind, VirtualWall, WorkerIdentity, WorkerRunner};

use arrivals::Arrival;
use upstream::Upstream;

/// Wall time at elapsed zero of every run: a fixed instant, so HTTP-date
/// hints (and so the whole run) do not depend on when the benchmark is run.
/// 2026-01-01T00:00:00Z, a whole second, so a date hint for the end of an
/// outage that starts and lasts whole seconds is exact.
const WALL_AT_START_UNIX_S: u64 = 1_767_225_600;

/// An intent still running this long after its deadline is abandoned and
/// counted as unfinished: a runner must end every intent by its deadline,
/// and the harness must end even when one does not.
const GRACE_AFTER_DEADLINE: Duration = Duration::from_secs(5);

/// Which form the upstream's `Retry-After` takes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, clap::ValueEnum)]
#[serde(rename_all = "snake_case")]
pub enum HintStyle {
    /// delay-seconds, rounded up to a whole second.
    Delay,
    /// An HTTP-date, rounded up to a whole second of the virtual wall clock.
    Date,
}

/// How time passes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, clap::ValueEnum)]
#[serde(rename_all = "snake_case")]
pub enum Mode {
    /// `tokio::time::pause` on a current-thread runtime: time jumps to the
    /// next timer when every task waits, so large fleets run fast and every
    /// run is identical.
    Paused,
    /// Real time: the run lasts as long as it says. Use a smaller fleet.
    Realtime,
}

/// `tollgate bench storm` arguments. Seconds are decimals.
#[derive(Debug, Clone, PartialEq, Serialize, clap::Args)]
pub struct StormArgs {
    /// Workers in the fleet (W); each is a task with its own identity and RNG.
    #[arg(long, default_value_t = 500)]
    pub workers: u32,
    /// Upstream capacity C, in requests per second.
    #[arg(long, default_value_t = 1000.0)]
    pub capacity: f64,
    /// Intent arrivals per second (λ); 0.8 × capacity if not given.
    #[arg(long)]
    pub arrival_rate: Option<f64>,
    /// When the outage starts.
    #[arg(long, default_value_t = 10.0)]
    pub outage_start_s: f64,
    /// How long the upstream's capacity is zero (D).
    #[arg(long, default_value_t = 10.0)]
    pub outage_s: f64,
    /// Each intent's end-to-end deadline, from its arrival.
    #[arg(long, default_value_t = 30.0)]
    pub deadline_s: f64,
    /// The fraction of a request's capacity each 429 consumes.
    #[arg(long, default_value_t = 0.3)]
    pub reject_cost: f64,
    /// The form of the upstream's `Retry-After`.
    #[arg(long, value_enum, default_value_t = HintStyle::Delay)]
    pub hint: HintStyle,
    /// How long intents keep arriving; the run lasts until the last deadline.
    #[arg(long, default_value_t = 60.0)]
    pub duration_s: f64,
    /// Seeds the arrivals and every worker's RNG.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Paused (virtual, reproducible) or real time.
    #[arg(long, value_enum, default_value_t = Mode::Paused)]
    pub mode: Mode,
    /// Where the table, chart and data are written.
    #[arg(long, default_value = "results")]
    pub out: PathBuf,
    /// Strategies to run, in order.
    #[arg(long, value_enum, value_delimiter = ',', default_value = "a,b,c,d,e")]
    pub strategies: Vec<StrategyKind>,
    /// The fraction of intents their caller cancels, at a uniform time
    /// within the deadline.
    #[arg(long, default_value_t = 0.05)]
    pub cancel_fraction: f64,
    /// Attempts in all for (b), (c) and (d); (a) always stops at 3.
    #[arg(long, default_value_t = 10)]
    pub max_attempts: u32,
    /// The fraction of workers that lie: each 429 they see is passed to
    /// their runner with `Retry-After: 300`, whatever the upstream said
    /// (a buggy or compromised worker, for the corroboration of hints).
    #[arg(long, default_value_t = 0.0)]
    pub liar_fraction: f64,
}

/// Arguments that cannot describe a run.
#[derive(Debug, Error)]
pub enum StormError {
    /// One argument is out of range.
    #[error("--{field}: {problem}")]
    Invalid {
        /// The argument, as on the command line.
        field: &'static str,
        /// What is wrong with it.
        problem: String,
    },
    /// The runtime could not be built.
    #[error("cannot build the tokio runtime: {0}")]
    Runtime(#[source] std::io::Error),
    /// A strategy could not start (a coordinator it needs, for instance).
    #[error("strategy {strategy} could not start: {problem}")]
    Strategy {
        /// The strategy's key.
        strategy: &'static str,
        /// Why.
        problem: String,
    },
    /// The chart could not be drawn.
    #[error("drawing the chart: {0}")]
    Chart(String),
    /// An output file could not be written.
    #[error("writing {path}: {source}")]
    Write {
        /// The file.
        path: PathBuf,
        /// The error.
        #[source]
        source: std::io::Error,
    },
}

/// A validated run description: what every module below reads.
#[derive(Debug, Clone)]
pub struct StormConfig {
    /// Workers in the fleet.
    pub workers: usize,
    /// Requests per second the upstream serves outside the outage.
    pub capacity: f64,
    /// Intent arrivals per second.
    pub arrival_rate: f64,
    /// When capacity drops to zero.
    pub outage_start: Duration,
    /// When it comes back.
    pub outage_end: Duration,
    /// End-to-end deadline of each intent, from its arrival.
    pub deadline: Duration,
    /// Capacity consumed by one 429, as a fraction of one request.
    pub reject_cost: f64,
    /// The form of `Retry-After`.
    pub hint: HintStyle,
    /// How long intents arrive.
    pub duration: Duration,
    /// The run's seed.
    pub seed: u64,
    /// Virtual or real time.
    pub mode: Mode,
    /// The strategies, in order.
    pub strategies: Vec<StrategyKind>,
    /// The fraction of intents cancelled by their caller.
    pub cancel_fraction: f64,
    /// The fraction of workers whose 429s carry a 300 s hint, spread evenly
    /// over the fleet's indices.
    pub liar_fraction: f64,
    /// Attempts in all for the patient baselines.
    pub max_attempts: u32,
    /// How long the upstream takes to answer: long enough that attempts
    /// overlap, short enough not to matter next to a 1 s hint.
    pub service_time: Duration,
    /// Each attempt's timeout, and the reserve a runner keeps before its
    /// deadline: an attempt is started only if it can end by the deadline.
    pub attempt_timeout: Duration,
    /// Wall time at elapsed zero, for HTTP-date hints.
    pub wall_at_start: SystemTime,
}

impl StormConfig {
    /// Checks every argument.
    pub fn try_new(args: &StormArgs) -> Result<Self, StormError> {
        let invalid = |field, problem: &str| StormError::Invalid {
            field,
            problem: problem.to_owned(),
        };
        let secs = |field, value: f64| {
            // Up to a day: beyond that a run is a mistake, not a benchmark.
            if value.is_finite() && (0.0..=86_400.0).contains(&value) {
                Ok(Duration::from_secs_f64(value))
            } else {
                Err(invalid(field, "must be 0 to 86400 seconds"))
            }
        };
        if args.workers == 0 || args.workers > 1_000_000 {
            return Err(invalid("workers", "must be 1 to 1000000"));
        }
        if !(args.capacity.is_finite() && args.capacity >= 1.0) {
            return Err(invalid("capacity", "must be at least 1 request/s"));
        }
        let arrival_rate = args.arrival_rate.unwrap_or(0.8 * args.capacity);
        if !(arrival_rate.is_finite() && arrival_rate > 0.0 && arrival_rate <= 1e7) {
            return Err(invalid("arrival-rate", "must be above 0 and at most 1e7"));
        }
        if !(args.reject_cost.is_finite() && (0.0..=1.0).contains(&args.reject_cost)) {
            return Err(invalid("reject-cost", "must be 0 to 1"));
        }
        if !(args.liar_fraction.is_finite() && (0.0..=1.0).contains(&args.liar_fraction)) {
            return Err(invalid("liar-fraction", "must be in 0..=1"));
        }
        if !(args.cancel_fraction.is_finite() && (0.0..=1.0).contains(&args.cancel_fraction)) {
            return Err(invalid("cancel-fraction", "must be 0 to 1"));
        }
        if args.max_attempts == 0 {
            return Err(invalid("max-attempts", "must be at least 1"));
        }
        if args.strategies.is_empty() {
            return Err(invalid("strategies", "name at least one"));
        }
        let attempt_timeout = Duration::from_secs(1);
        let deadline = secs("deadline-s", args.deadline_s)?;
        if deadline < attempt_timeout {
            return Err(invalid(
                "deadline-s",
                "must leave room for one attempt (1 s timeout)",
            ));
        }
        let duration = secs("duration-s", args.duration_s)?;
        if duration.is_zero() {
            return Err(invalid("duration-s", "must be above 0"));
        }
        let outage_start = secs("outage-start-s", args.outage_start_s)?;
        let outage = secs("outage-s", args.outage_s)?;
        Ok(StormConfig {
            workers: args.workers as usize,
            capacity: args.capacity,
            arrival_rate,
            outage_start,
            outage_end: outage_start + outage,
            deadline,
            reject_cost: args.reject_cost,
            hint: args.hint,
            duration,
            seed: args.seed,
            mode: args.mode,
            strategies: args.strategies.clone(),
            cancel_fraction: args.cancel_fraction,
            liar_fraction: args.liar_fraction,
            max_attempts: args.max_attempts,
            service_time: Duration::from_millis(10),
            attempt_timeout,
            wall_at_start: UNIX_EPOCH + Duration::from_secs(WALL_AT_START_UNIX_S),
        })
    }
}

/// Runs every strategy in `args` on the same arrivals and returns the
/// report. Builds its own runtimes, so call it from synchronous code.
pub fn run(args: &StormArgs) -> Result<StormReport, StormError> {
    let config = StormConfig::try_new(args)?;
    let per_worker = arrivals::per_worker(&arrivals::generate(&config), config.workers);
    let mut results = Vec::with_capacity(config.strategies.len());
    for &kind in &config.strategies {
        // A fresh runtime per strategy: each starts at elapsed zero with an
        // empty timer wheel, so no strategy inherits another's clock.
        let mut builder = tokio::runtime::Builder::new_current_thread();
        builder.enable_all();
        if config.mode == Mode::Paused {
            builder.start_paused(true);
        }
        let runtime = builder.build().map_err(StormError::Runtime)?;
        results.push(runtime.block_on(run_strategy(&config, &per_worker, kind))?);
    }
    Ok(StormReport::new(args.clone(), &config, results))
}

/// Runs, prints the table to `stdout` and writes `storm.md`, `storm.svg`
/// and `storm.json` to `args.out`. Returns the report and the files written.
pub fn run_and_write(
    args: &StormArgs,
    stdout: &mut dyn std::io::Write,
) -> Result<(StormReport, Vec<PathBuf>), StormError> {
    let report = run(args)?;
    let table = report.markdown();
    let out = &args.out;
    let write_err = |path: &Path| {
        let path = path.to_owned();
        move |source| StormError::Write { path, source }
    };
    stdout
        .write_all(table.as_bytes())
        .map_err(write_err(Path::new("<stdout>")))?;
    std::fs::create_dir_all(out).map_err(write_err(out))?;
    let files = [
        (out.join("storm.md"), table),
        (out.join("storm.svg"), report.svg()?),
        (out.join("storm.json"), report.json()),
    ];
    let mut written = Vec::with_capacity(files.len());
    for (path, text) in files {
        std::fs::write(&path, text).map_err(write_err(&path))?;
        written.push(path);
    }
    Ok((report, written))
}

/// The harness's record of one intent: what its runner returned, and when.
#[derive(Debug, Clone, Copy)]
struct IntentRecord {
    arrived: Duration,
    ended: Duration,
    outcome: Outcome,
}

/// One strategy on the shared arrivals, inside the current runtime.
async fn run_strategy(
    config: &StormConfig,
    per_worker: &[Vec<Arrival>],
    kind: StrategyKind,
) -> Result<StrategyResult, StormError> {
    let start = Instant::now();
    let wall = Arc::new(VirtualWall::new(config.wall_at_start, start));
    let upstream = Arc::new(Upstream::new(config, start, wall.clone()));
    let strategy = kind.start(config).await?;
    let description = strategy.describe();
    let mut workers = JoinSet::new();
    for (index, arrivals) in per_worker.iter().enumerate() {
        let identity = WorkerIdentity::new(index, config.seed);
        let runner = strategy.worker(&identity);
        let worker = Worker {
            runner,
            upstream: upstream.clone(),
            wall: wall.clone(),
            start,
            deadline: config.deadline,
            liar: is_liar(index, config.liar_fraction),
        };
        workers.spawn(worker.run(arrivals.clone()));
    }
    let mut records = Vec::new();
    let mut unfinished = 0;
    while let Some(joined) = workers.join_next().await {
        // A worker task only fails if it panicked; its intents are then
        // unaccounted for, which the report shows as unfinished.
        match joined {
            Ok(worker) => {
                records.extend(worker.records);
                unfinished += worker.unfinished;
            }
            Err(_) => unfinished += 1,
        }
    }
    // Dropping the strategy ends whatever it started for the run.
    drop(strategy);
    let intents: u64 = per_worker.iter().map(|a| a.len() as u64).sum();
    Ok(report::StrategyResult::new(
        kind,
        description,
        config,
        intents,
        &records,
        unfinished,
        upstream.observed(),
    ))
}

/// One worker: receives its intents at their arrival times and runs each
/// concurrently through its runner, as a real worker serves many requests.
struct Worker {
    runner: Arc<dyn WorkerRunner>,
    upstream: Arc<Upstream>,
    wall: Arc<VirtualWall>,
    start: Instant,
    deadline: Duration,
    /// Its 429s reach its runner with a 300 s hint (`--liar-fraction`).
    liar: bool,
}

/// Whether worker `index` lies, for `fraction` of the fleet: one whenever
/// `index × fraction` crosses a whole number, so liars are spread evenly
/// over the indices (and over the seeds derived from them).
fn is_liar(index: usize, fraction: f64) -> bool {
    let at = |i: usize| (i as f64 * fraction).floor();
    fraction > 0.0 && at(index + 1) > at(index)
}

/// What one worker task hands back.
struct WorkerDone {
    records: Vec<IntentRecord>,
    unfinished: u64,
}

impl Worker {
    async fn run(self, arrivals: Vec<Arrival>) -> WorkerDone {
        // Intents and their cancellers live in this set, so they end with
        // the worker (dropping a JoinSet aborts what is left in it).
        let mut tasks: JoinSet<Option<IntentRecord>> = JoinSet::new();
        let mut spawned = 0u64;
        let end_by = arrivals
            .last()
            .map_or(self.start, |a| self.start + a.at + self.deadline)
            + GRACE_AFTER_DEADLINE;
        for arrival in arrivals {
            tokio::time::sleep_until(self.start + arrival.at).await;
            let arrived = Instant::now();
            let deadline = arrived + self.deadline;
            let cancel = CancellationToken::new();
            let cancel_at = arrival.cancel_after.map(|after| arrived + after);
            if let Some(at) = cancel_at {
                // The caller withdraws the intent from outside, as a real
                // caller would; the runner only sees the token.
                let cancel = cancel.clone();
                tasks.spawn(async move {
                    tokio::time::sleep_until(at).await;
                    cancel.cancel();
                    None
                });
            }
            let io = IntentIo::new(
                arrival.id,
                deadline,
                cancel,
                cancel_at,
                self.upstream.clone(),
                self.wall.clone(),
                self.liar,
            );
            let runner = self.runner.clone();
            let start = self.start;
            tasks.spawn(async move {
                let outcome = runner.run_intent(io).await;
                Some(IntentRecord {
                    arrived: arrived - start,
                    ended: Instant::now() - start,
                    outcome,
                })
            });
            spawned += 1;
        }
        let mut records = Vec::with_capacity(usize::try_from(spawned).unwrap_or(0));
        loop {
            match tokio::time::timeout_at(end_by, tasks.join_next()).await {
                Ok(Some(Ok(Some(record)))) => records.push(record),
                // A canceller, or an intent task that panicked (counted
                // below as unfinished).
                Ok(Some(_)) => {}
                Ok(None) | Err(_) => break,
            }
        }
        let unfinished = spawned - records.len() as u64;
        WorkerDone {
            records,
            unfinished,
        }
    }
}
