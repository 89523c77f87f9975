//! `tollgate-bench storm`: does a fleet recover from a rate-limit storm
//! without hammering the upstream?
//!
//! # Layout
//! Dependencies run one way, from the leaf up:
//! - `wall` (private): the run's virtual wall clock, for HTTP-date hints.
//! - `arrivals` (private): the intent stream, generated once from the
//!   seed and replayed unchanged for every strategy.
//! - `limiter` (private): the upstream's limiter as a pure state machine, in
//!   three shapes ([`LimiterShape`]: token bucket, fixed window, sliding
//!   window), scaled by the capacity in force (C; a fraction of it in the
//!   outage, 0 by default; a fraction after it).
//! - `upstream` (private): the in-process upstream: asks its limiter about
//!   each attempt, answers 429 with a `Retry-After` (delay or HTTP-date)
//!   when refused; every 429 costs a fraction of a request's capacity. It
//!   counts what it is offered, served and refused.
//! - `bound` (private): the clairvoyant bound, the most intents any
//!   scheduler could serve on the run's arrivals and limiter: an exactly
//!   solved relaxation above, a schedule the limiter admits below.
//! - `runner` (private, re-exported by [`strategy`]): the [`Strategy`] and
//!   [`WorkerRunner`] traits and the [`IntentIo`] a runner sends attempts
//!   through.
//! - `baseline` (private): (a)–(d), one parameterised retry loop.
//! - `pipes` (private): in-memory connections to the coordinator, and the
//!   wire-level counter of the workers' RPCs by method.
//! - `coordinated` (private): (e) and (f), the real gate per worker and the
//!   real coordinator; the one file using the server's and client's APIs.
//! - [`strategy`]: [`StrategyKind`], and building one for a run.
//! - [`results`] and `chart`: metrics, the markdown tables, the SVG chart
//!   (one panel per strategy), the JSON.
//!
//! # How one run goes
//! ```text
//! StormCommand ──validate──▶ StormConfig ──arrivals::generate(seed)──▶ [Arrival] (shared)
//! [Arrival] + limiter ──bound::bound──▶ Bound (once per run)
//! for each strategy, on a fresh current-thread runtime (paused clock or real):
//!   W worker tasks, each: sleep_until(arrival) → spawn intent → runner.run_intent(IntentIo)
//!   IntentIo::send ──▶ Upstream::offer (counts load, deadline/cancel violations)
//!   every intent's outcome and end time ──▶ results::StrategyResult
//! StormResults ──▶ table (stdout, storm.md), chart (storm.svg), data (storm.json)
//! ```
//!
//! Every strategy starts from elapsed zero on its own runtime, so the
//! arrival stream, the worker seeds and the upstream are identical; in
//! paused mode (`tokio::time::pause`, auto-advancing) a run is exactly
//! reproducible and takes seconds for thousands of workers.

mod arrivals;
mod baseline;
mod bound;
mod chart;
mod coordinated;
mod limiter;
mod pipes;
pub mod results;
mod runner;
pub mod stated;
pub mod strategy;
mod upstream;
mod wall;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde::Serialize;
use thiserror::Error;
use tokio::task::JoinSet;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tollgate_client::outcome::Outcome;

pub use bound::Bound;
pub use limiter::LimiterShape;
pub use results::{Checks, StormResults, StrategyResult};
pub use runner::{CoordinatorRecord, RpcSeries, ScopeSeries};
pub use strategy::{IntentIo, Strategy, StrategyKind, VirtualWall, WorkerIdentity, WorkerRunner};

use arrivals::Arrival;
// The fleet bench's upstream process serves this same model over HTTP.
pub(crate) use upstream::{BUCKET, Truth, Upstream};

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

/// `tollgate-bench storm` arguments: the run, and the upstream's limiter.
#[derive(Debug, Clone, PartialEq, clap::Args)]
pub struct StormCommand {
    /// The fleet, the workload, the outage and the output.
    #[command(flatten)]
    pub args: StormArgs,
    /// The upstream's limiter shape.
    #[command(flatten)]
    pub limiter: LimiterArgs,
}

/// The upstream's limiter on the command line. Apart from [`StormArgs`] so
/// that code building a `StormArgs` field by field (the fleet bench's
/// upstream process) keeps today's token bucket without naming it.
#[derive(Debug, Clone, Default, PartialEq, clap::Args)]
pub struct LimiterArgs {
    /// The upstream's limiter shape (`upstream.rs` describes each).
    #[arg(long, value_enum, default_value_t = LimiterKind::TokenBucket)]
    pub limiter: LimiterKind,
    /// Token bucket: how many seconds of the capacity in force the bucket
    /// holds [default: 0.1].
    #[arg(long = "burst", value_name = "S")]
    pub burst_s: Option<f64>,
    /// Fixed or sliding window: the window's length in seconds; its quota
    /// is the capacity in force × S [default: 1].
    #[arg(long = "window", value_name = "S")]
    pub window_s: Option<f64>,
    /// The upstream states its limit on every answer, in this header style
    /// (`stated.rs` says what each shape states); unstated by default.
    #[arg(long = "states-limit", value_enum)]
    pub states_limit: Option<stated::StatedStyle>,
}

/// `--limiter`: which shape the upstream's limiter has.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum LimiterKind {
    /// A steady refill plus a burst allowance (`--burst`).
    #[default]
    TokenBucket,
    /// A quota per window aligned to the start, reset at each boundary
    /// (`--window`).
    FixedWindow,
    /// A quota in any trailing window (`--window`).
    SlidingWindow,
}

/// `--window` when not given, seconds.
const DEFAULT_WINDOW_S: f64 = 1.0;

/// The run's arguments, apart from the limiter. Seconds are decimals.
#[derive(Debug, Clone, PartialEq, Serialize, clap::Args)]
pub struct StormArgs {
    /// Workers in the fleet (W); each is a task with its own identity and RNG.
    #[arg(long, default_value_t = 500)]
    pub workers: u32,
    /// Upstream capacity C, in requests per second.
    #[arg(long, default_value_t = 1000.0)]
    pub capacity: f64,
    /// Intent arrivals per second (λ); 0.8 × capacity if not given. Above
    /// the capacity, first attempts alone overflow the upstream.
    #[arg(long)]
    pub arrival_rate: Option<f64>,
    /// When the outage starts.
    #[arg(long, default_value_t = 10.0)]
    pub outage_start_s: f64,
    /// How long the outage lasts (D).
    #[arg(long, default_value_t = 10.0)]
    pub outage_s: f64,
    /// Capacity during the outage, as a fraction of C: above 0, a brownout
    /// answering 429 with short hints; 0, a full outage.
    #[arg(long, default_value_t = 0.0)]
    pub outage_capacity: f64,
    /// Capacity after the outage, as a fraction of C.
    #[arg(long, default_value_t = 1.0)]
    pub capacity_after: f64,
    /// A 429 during the outage asks for the outage's whole length again, as
    /// limiters that restart the penalty window on every rejected attempt
    /// do: successive hints stop counting down.
    #[arg(long)]
    pub penalty_extending: bool,
    /// The fraction of (e)/(f) workers that report a 300 s Retry-After to
    /// the coordinator on every 429, whatever the upstream said (and, with
    /// `--states-limit`, one request left for 30 s on every answer).
    #[arg(long, default_value_t = 0.0)]
    pub liar_fraction: f64,
    /// A policy file for (e) instead of the coordinator's shipped defaults.
    #[arg(long)]
    pub e_policy: Option<PathBuf>,
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
    #[arg(long, value_enum, value_delimiter = ',', default_value = "a,b,c,d,e,f")]
    pub strategies: Vec<StrategyKind>,
    /// The fraction of intents their caller cancels, at a uniform time
    /// within the deadline.
    #[arg(long, default_value_t = 0.05)]
    pub cancel_fraction: f64,
    /// Attempts in all for (b), (c) and (d); (a) always stops at 3.
    #[arg(long, default_value_t = 10)]
    pub max_attempts: u32,
    /// Also write every intent of each strategy, one line each (arrival,
    /// end, outcome, cancellation, worker), to `intents-<strategy>.csv` in
    /// `--out`: which intents were lost, when, and at which worker.
    #[arg(long)]
    pub intents_csv: bool,
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
    /// Capacity during the outage, as a fraction of `capacity`.
    pub outage_capacity: f64,
    /// Capacity after the outage, as a fraction of `capacity`.
    pub capacity_after: f64,
    /// Whether a 429 in the outage restarts the penalty.
    pub penalty_extending: bool,
    /// The fraction of (e)/(f) workers reporting a 300 s hint on every 429.
    pub liar_fraction: f64,
    /// (e)'s policy file, when not the shipped defaults.
    pub e_policy: Option<PathBuf>,
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
    /// The upstream's limiter.
    pub limiter: LimiterShape,
    /// The header style the upstream states its limit in, if it does.
    pub states_limit: Option<stated::StatedStyle>,
}

impl StormConfig {
    /// Checks every argument, with today's limiter ([`LimiterShape::DEFAULT`]):
    /// what the fleet bench's upstream process runs.
    pub fn try_new(args: &StormArgs) -> Result<Self, StormError> {
        Self::try_with_limiter(args, &LimiterArgs::default())
    }

    /// Checks every argument of a storm command.
    pub fn try_from_command(command: &StormCommand) -> Result<Self, StormError> {
        Self::try_with_limiter(&command.args, &command.limiter)
    }

    fn try_with_limiter(args: &StormArgs, limiter: &LimiterArgs) -> Result<Self, StormError> {
        let limiter_args = limiter;
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
        let fraction = |field, value: f64| {
            if value.is_finite() && (0.0..=1.0).contains(&value) {
                Ok(value)
            } else {
                Err(invalid(field, "must be 0 to 1"))
            }
        };
        fraction("cancel-fraction", args.cancel_fraction)?;
        fraction("outage-capacity", args.outage_capacity)?;
        fraction("liar-fraction", args.liar_fraction)?;
        if !(args.capacity_after.is_finite() && (0.0..=10.0).contains(&args.capacity_after)) {
            return Err(invalid("capacity-after", "must be 0 to 10"));
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
        let limiter = match limiter.limiter {
            LimiterKind::TokenBucket => {
                if limiter.window_s.is_some() {
                    return Err(invalid("window", "applies to the window limiters"));
                }
                let burst_s = limiter.burst_s.unwrap_or(limiter::DEFAULT_BURST_S);
                secs("burst", burst_s)?;
                LimiterShape::TokenBucket { burst_s }
            }
            kind @ (LimiterKind::FixedWindow | LimiterKind::SlidingWindow) => {
                if limiter.burst_s.is_some() {
                    return Err(invalid("burst", "applies to the token bucket"));
                }
                let window_s = limiter.window_s.unwrap_or(DEFAULT_WINDOW_S);
                if !(window_s.is_finite() && (0.001..=86_400.0).contains(&window_s)) {
                    return Err(invalid("window", "must be 0.001 to 86400 seconds"));
                }
                // Every capacity in force above 0 must admit something, or
                // the quota is never met and that phase serves nothing.
                let fractions = [1.0, args.outage_capacity, args.capacity_after];
                if fractions
                    .iter()
                    .any(|&f| f > 0.0 && args.capacity * f * window_s + limiter::QUOTA_SLACK < 1.0)
                {
                    return Err(invalid(
                        "window",
                        "must hold at least one request at every capacity in force above 0",
                    ));
                }
                if kind == LimiterKind::FixedWindow {
                    LimiterShape::FixedWindow { window_s }
                } else {
                    LimiterShape::SlidingWindow { window_s }
                }
            }
        };
        Ok(StormConfig {
            workers: args.workers as usize,
            capacity: args.capacity,
            arrival_rate,
            outage_start,
            outage_end: outage_start + outage,
            outage_capacity: args.outage_capacity,
            capacity_after: args.capacity_after,
            penalty_extending: args.penalty_extending,
            liar_fraction: args.liar_fraction,
            e_policy: args.e_policy.clone(),
            deadline,
            reject_cost: args.reject_cost,
            hint: args.hint,
            duration,
            seed: args.seed,
            mode: args.mode,
            strategies: args.strategies.clone(),
            cancel_fraction: args.cancel_fraction,
            max_attempts: args.max_attempts,
            service_time: Duration::from_millis(10),
            attempt_timeout,
            wall_at_start: UNIX_EPOCH + Duration::from_secs(WALL_AT_START_UNIX_S),
            limiter,
            states_limit: limiter_args.states_limit,
        })
    }
}

impl StormConfig {
    /// The upstream's capacity in force at `t` since the start, requests/s.
    pub fn capacity_at(&self, t: Duration) -> f64 {
        self.capacity
            * if t < self.outage_start {
                1.0
            } else if t < self.outage_end {
                self.outage_capacity
            } else {
                self.capacity_after
            }
    }

    /// Requests of capacity in force over `[from, to)`: the integral of
    /// [`capacity_at`](Self::capacity_at), piece by piece.
    pub fn capacity_earned(&self, from: Duration, to: Duration) -> f64 {
        let overlap = |lo: Duration, hi: Duration| to.min(hi).saturating_sub(from.max(lo));
        let pieces = [
            (Duration::ZERO, self.outage_start, 1.0),
            (self.outage_start, self.outage_end, self.outage_capacity),
            (self.outage_end, Duration::MAX, self.capacity_after),
        ];
        pieces
            .iter()
            .map(|&(lo, hi, fraction)| overlap(lo, hi).as_secs_f64() * fraction * self.capacity)
            .sum()
    }

    /// The instants at which the capacity in force changes, in order, each
    /// with the capacity before and after (a change at elapsed zero is
    /// measured against C, what the upstream ran at before the run).
    pub fn capacity_steps(&self) -> Vec<(Duration, f64, f64)> {
        let mut points = vec![self.outage_start, self.outage_end];
        points.dedup();
        points
            .into_iter()
            .map(|p| {
                let before = p
                    .checked_sub(Duration::from_nanos(1))
                    .map_or(self.capacity, |b| self.capacity_at(b));
                (p, before, self.capacity_at(p))
            })
            .filter(|&(_, before, after)| before != after)
            .collect()
    }
}

/// Runs every strategy in `command` on the same arrivals and returns the
/// results, with the clairvoyant bound. Builds its own runtimes, so call it
/// from synchronous code.
pub fn run(command: &StormCommand) -> Result<StormResults, StormError> {
    let config = StormConfig::try_from_command(command)?;
    let arrivals = arrivals::generate(&config);
    let jobs: Vec<_> = arrivals
        .iter()
        .map(|a| bound::Job::new(a, config.deadline))
        .collect();
    let bound = bound::bound(&config, &jobs);
    let per_worker = arrivals::per_worker(&arrivals, config.workers);
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
    Ok(StormResults::new(
        command.args.clone(),
        &config,
        results,
        bound,
    ))
}

/// Runs, prints the table to `stdout` and writes `storm.md`, `storm.svg`
/// and `storm.json` to `--out`. Returns the results and the files written.
pub fn run_and_write(
    command: &StormCommand,
    stdout: &mut dyn std::io::Write,
) -> Result<(StormResults, Vec<PathBuf>), StormError> {
    let results = run(command)?;
    let table = results.markdown();
    let out = &command.args.out;
    let write_err = |path: &Path| {
        let path = path.to_owned();
        move |source| StormError::Write { path, source }
    };
    stdout
        .write_all(table.as_bytes())
        .map_err(write_err(Path::new("<stdout>")))?;
    std::fs::create_dir_all(out).map_err(write_err(out))?;
    let mut files = vec![
        (out.join("storm.md"), table),
        (out.join("storm.svg"), chart::svg(&results)?),
        (out.join("storm.json"), results.json()),
    ];
    if command.args.intents_csv {
        for r in &results.results {
            let name = format!("intents-{}.csv", r.strategy.key());
            files.push((out.join(name), r.intents_csv()));
        }
    }
    let mut written = Vec::with_capacity(files.len());
    for (path, text) in files {
        std::fs::write(&path, text).map_err(write_err(&path))?;
        written.push(path);
    }
    Ok((results, written))
}

/// The harness's record of one intent: what its runner returned, and when.
#[derive(Debug, Clone, Copy, PartialEq)]
struct IntentRecord {
    arrived: Duration,
    ended: Duration,
    outcome: Outcome,
    /// When its caller withdrew it, if it did: the report counts an intent
    /// as waiting only until then.
    cancel_at: Option<Duration>,
    /// The worker it arrived at.
    worker: usize,
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
    let coordinator = strategy.coordinator();
    // Dropping the strategy ends whatever it started for the run.
    drop(strategy);
    let intents: u64 = per_worker.iter().map(|a| a.len() as u64).sum();
    Ok(results::StrategyResult::new(
        kind,
        description,
        config,
        results::Measured {
            intents,
            records: &records,
            unfinished,
            observed: upstream.observed(),
            coordinator,
        },
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
            );
            let runner = self.runner.clone();
            let start = self.start;
            let worker = arrival.worker;
            tasks.spawn(async move {
                let outcome = runner.run_intent(io).await;
                Some(IntentRecord {
                    arrived: arrived - start,
                    ended: Instant::now() - start,
                    outcome,
                    cancel_at: cancel_at.map(|at| at - start),
                    worker,
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

/// A validated configuration from the words after `storm` on a command
/// line, for the unit tests of the modules below.
#[cfg(test)]
pub(crate) fn test_config(words: &[&str]) -> StormConfig {
    use clap::Parser as _;
    #[derive(clap::Parser)]
    struct Cli {
        #[command(flatten)]
        command: StormCommand,
    }
    let argv = std::iter::once("storm").chain(words.iter().copied());
    StormConfig::try_from_command(&Cli::parse_from(argv).command)
        .expect("a valid test configuration")
}
