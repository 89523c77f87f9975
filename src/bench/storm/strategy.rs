//! Retry strategies: how one worker carries one intent to its end.
//!
//! # The extension point
//! The harness knows two traits and nothing else about a strategy:
//! - [`Strategy`]: built once per run by [`StrategyKind::start`] (async, inside
//!   the run's runtime) and asked for one [`WorkerRunner`] per worker;
//! - [`WorkerRunner::run_intent`]: runs one intent, sending attempts only
//!   through [`IntentIo::send`], and returns its [`Outcome`].
//!
//! The harness owns the clock, the arrivals, cancellation and all counting:
//! attempts are counted at the upstream's door against each intent's real
//! deadline and cancellation time, so a runner cannot misreport them.
//!
//! **Strategy (e), Tollgate with a real coordinator**, lives in
//! `coordinated.rs`: [`StrategyKind::start`] starts the real coordinator
//! (`server::run`) over in-memory pipes with the run's
//! policy (its wake rate is reported by [`Strategy::describe`]); each worker
//! gets its own `CoordinatorLink`, `LeaseCache` and gate, and
//! [`WorkerRunner::run_intent`] runs the gate with attempts that only call
//! [`IntentIo::send`]. Pipes, not loopback: a paused clock auto-advances
//! while a task waits on a socket, but not while tokio can still move bytes
//! through a pipe, so (e) runs in `--mode paused` too.
//!
//! # The baselines
//! (a)–(d) share one loop ([`Baseline`]) and differ only in their
//! [`WaitRule`], attempt cap and optional [`LocalBudget`]:
//! - (a) naive: retry at once, 3 attempts in all, hints ignored;
//! - (b) sleep exactly the `Retry-After`, then retry;
//! - (c) capped exponential backoff with full jitter, never earlier than the
//!   hint: `max(hint, U[0, min(cap, base·2^n)])`;
//! - (d) (c) plus a per-worker [`LocalBudget`] (ratio 0.2 plus a floor): the
//!   tower `TpsBudget` shape.
//!
//! Each reads hints with the one parser, [`read_retry_after`], against the
//! run's [`VirtualWall`].

use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, SystemTime};

use rand::SeedableRng;
use rand::rngs::StdRng;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tollgate_client::backoff::{Backoff, Jitter};
use tollgate_client::clock::Clock;
use tollgate_client::evidence::Outcome;
use tollgate_client::fallback::LocalBudget;
use tollgate_client::hint::{HintRules, read_retry_after};

use super::coordinated::Coordinated;
pub use super::upstream::Answer;
use super::upstream::{Truth, Upstream};
use super::{StormConfig, StormError};

/// A wall clock derived from `tokio::time`: `wall_at_start` plus the tokio
/// time elapsed since the run started. Under a paused runtime it moves only
/// with virtual time, so HTTP-date hints are exact and reproducible; no
/// logic here ever reads `SystemTime::now()`.
#[derive(Debug, Clone)]
pub struct VirtualWall {
    wall_at_start: SystemTime,
    start: Instant,
}

impl VirtualWall {
    /// A clock reading `wall_at_start` at the tokio instant `start`.
    pub fn new(wall_at_start: SystemTime, start: Instant) -> Self {
        VirtualWall {
            wall_at_start,
            start,
        }
    }
}

impl Clock for VirtualWall {
    fn now(&self) -> SystemTime {
        self.wall_at_start + self.start.elapsed()
    }
}

/// Who a worker is: its index, the id it would give a coordinator, and the
/// seed of its own RNG.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WorkerIdentity {
    /// 0-based, in creation order.
    pub index: usize,
    /// A stable name (`worker-0007`), what a coordinator would share fairly by.
    pub worker_id: String,
    /// Derived from the run seed and the index, so each worker draws its own
    /// jitter and a run repeats exactly.
    pub seed: u64,
}

impl WorkerIdentity {
    /// The identity of worker `index` in a run seeded with `run_seed`.
    pub fn new(index: usize, run_seed: u64) -> Self {
        WorkerIdentity {
            index,
            worker_id: format!("worker-{index:04}"),
            seed: splitmix64(run_seed ^ splitmix64(index as u64)),
        }
    }
}

/// SplitMix64's finaliser: neighbouring indices get unrelated seeds.
fn splitmix64(x: u64) -> u64 {
    let mut z = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// What a runner may do with one intent: read its deadline and cancellation,
/// read the run's wall clock, and send attempts. Nothing else reaches the
/// upstream.
#[derive(Debug)]
pub struct IntentIo {
    id: u64,
    deadline: Instant,
    cancel: CancellationToken,
    /// The caller's real cancellation time, for the upstream's count only:
    /// a runner learns of cancellation through the token, as in production.
    cancel_at: Option<Instant>,
    upstream: Arc<Upstream>,
    wall: Arc<VirtualWall>,
    /// The worker lies about every 429's hint (`--liar-fraction`).
    liar: bool,
}

/// The hint a lying worker reports on every 429: five minutes, the default
/// `max_hint`.
pub const LIAR_HINT: &str = "300";

impl IntentIo {
    pub(super) fn new(
        id: u64,
        deadline: Instant,
        cancel: CancellationToken,
        cancel_at: Option<Instant>,
        upstream: Arc<Upstream>,
        wall: Arc<VirtualWall>,
        liar: bool,
    ) -> Self {
        IntentIo {
            id,
            deadline,
            cancel,
            cancel_at,
            upstream,
            wall,
            liar,
        }
    }

    /// The intent's stable id (arrival order).
    pub fn intent_id(&self) -> u64 {
        self.id
    }

    /// The end-to-end deadline: no attempt may start at or after it.
    pub fn deadline(&self) -> Instant {
        self.deadline
    }

    /// Cancelled when the caller withdraws the intent.
    pub fn cancellation(&self) -> &CancellationToken {
        &self.cancel
    }

    /// The run's wall clock, for converting HTTP-date hints.
    pub fn wall(&self) -> Arc<VirtualWall> {
        self.wall.clone()
    }

    /// Sends one attempt and waits for its answer (the upstream's service
    /// time). The attempt counts from the first poll, even if the caller
    /// stops waiting for the answer.
    pub async fn send(&self) -> Answer {
        let truth = Truth {
            deadline: self.deadline,
            cancel_at: self.cancel_at,
            token_cancelled: self.cancel.is_cancelled(),
        };
        match self.upstream.call(truth).await {
            Answer::TooManyRequests { .. } if self.liar => Answer::TooManyRequests {
                retry_after: LIAR_HINT.to_owned(),
            },
            answer => answer,
        }
    }
}

/// The future of one intent: its outcome, in the engine's vocabulary.
pub type IntentFuture = Pin<Box<dyn Future<Output = Outcome> + Send>>;

/// One worker's way of running intents; shared by the worker's concurrent
/// intents, so any per-worker state (RNG, budget, lease cache) lives inside.
pub trait WorkerRunner: Send + Sync {
    /// Runs `io`'s intent to its end. Must start no attempt at or after the
    /// deadline or once cancelled, and should return by the deadline (the
    /// harness abandons it a grace period later and counts it unfinished).
    fn run_intent(self: Arc<Self>, io: IntentIo) -> IntentFuture;
}

/// A retry strategy under test. Lives for one run; dropping it ends
/// anything it started for the run.
pub trait Strategy: Send + Sync {
    /// One line for the table: what it does, with its parameters (for (e),
    /// the coordinator's wake rate).
    fn describe(&self) -> String;
    /// The runner of one worker; called once per worker, in the runtime.
    fn worker(&self, identity: &WorkerIdentity) -> Arc<dyn WorkerRunner>;
}

/// The strategies the command line can name.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, serde::Serialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum StrategyKind {
    /// Naive: retry at once, 3 attempts in all.
    #[value(name = "a", alias = "naive")]
    A,
    /// Sleep exactly the `Retry-After`, then retry.
    #[value(name = "b", alias = "sleep-hint")]
    B,
    /// Capped exponential backoff with full jitter, never before the hint.
    #[value(name = "c", alias = "full-jitter")]
    C,
    /// (c) with a per-worker local budget (ratio 0.2 plus a floor).
    #[value(name = "d", alias = "local-budget")]
    D,
    /// Tollgate: every retry through a gate and the real coordinator, paced
    /// at the upstream's spare capacity.
    #[value(name = "e", alias = "tollgate")]
    E,
}

/// (c)'s backoff: 1 s base (2 s ceiling after the first attempt), 20 s cap.
const JITTER_BACKOFF: Backoff = Backoff {
    base: Duration::from_secs(1),
    cap: Duration::from_secs(20),
    jitter: Jitter::Full,
};
/// The wait when a 429 carries no usable hint (never happens with this
/// upstream; here so a bad hint is never read as "retry now").
const NO_HINT_WAIT: Duration = Duration::from_secs(1);
/// (d)'s budget: tower's `TpsBudget` defaults for the window and ratio.
const BUDGET_WINDOW: Duration = Duration::from_secs(10);
const BUDGET_RATIO: f64 = 0.2;
/// (d)'s floor per worker. tower's default is 10/s; one tenth of that is
/// already 0.5 × capacity across 500 workers, so this favours the baseline.
const BUDGET_FLOOR_PER_SEC: f64 = 1.0;

impl StrategyKind {
    /// The key, as on the command line.
    pub fn key(self) -> &'static str {
        match self {
            StrategyKind::A => "a",
            StrategyKind::B => "b",
            StrategyKind::C => "c",
            StrategyKind::D => "d",
            StrategyKind::E => "e",
        }
    }

    /// A few words for the chart's legend.
    pub fn label(self) -> &'static str {
        match self {
            StrategyKind::A => "naive, 3 attempts",
            StrategyKind::B => "sleep Retry-After",
            StrategyKind::C => "full jitter ≥ hint",
            StrategyKind::D => "full jitter + local budget",
            StrategyKind::E => "Tollgate (coordinator pacing)",
        }
    }

    /// Builds the strategy for one run, inside the run's runtime; async so
    /// that a strategy needing a server (the coordinator, for (e)) can start
    /// it here.
    pub async fn start(self, config: &StormConfig) -> Result<Box<dyn Strategy>, StormError> {
        let (wait, max_attempts, budget_floor) = match self {
            StrategyKind::A => (WaitRule::Immediate, 3, None),
            StrategyKind::B => (WaitRule::Hint, config.max_attempts, None),
            StrategyKind::C => (
                WaitRule::HintOrJitter(JITTER_BACKOFF),
                config.max_attempts,
                None,
            ),
            StrategyKind::D => (
                WaitRule::HintOrJitter(JITTER_BACKOFF),
                config.max_attempts,
                Some(BUDGET_FLOOR_PER_SEC),
            ),
            StrategyKind::E => return Ok(Box::new(Coordinated::start(config)?)),
        };
        Ok(Box::new(Baseline {
            wait,
            max_attempts,
            budget_floor,
            attempt_timeout: config.attempt_timeout,
        }))
    }
}

/// When a baseline retries after a 429.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WaitRule {
    /// At once; the hint is not even read.
    Immediate,
    /// Exactly the hint.
    Hint,
    /// `max(hint, jittered backoff)`.
    HintOrJitter(Backoff),
}

/// Strategies (a)–(d): one loop, parameterised.
#[derive(Debug, Clone)]
pub struct Baseline {
    wait: WaitRule,
    max_attempts: u32,
    /// `Some(floor per second)` gives each worker a [`LocalBudget`].
    budget_floor: Option<f64>,
    attempt_timeout: Duration,
}

impl Strategy for Baseline {
    fn describe(&self) -> String {
        let wait = match self.wait {
            WaitRule::Immediate => "retry at once".to_owned(),
            WaitRule::Hint => "sleep exactly Retry-After".to_owned(),
            WaitRule::HintOrJitter(b) => format!(
                "max(Retry-After, full jitter {}s·2^n capped {}s)",
                b.base.as_secs_f64(),
                b.cap.as_secs_f64()
            ),
        };
        let budget = self.budget_floor.map_or_else(String::new, |floor| {
            format!(
                " + local budget {BUDGET_RATIO} of first attempts + {floor}/s per worker over {}s",
                BUDGET_WINDOW.as_secs()
            )
        });
        format!(
            "{wait}{budget}; {} attempts max; wake rate: uncoordinated",
            self.max_attempts
        )
    }

    fn worker(&self, identity: &WorkerIdentity) -> Arc<dyn WorkerRunner> {
        Arc::new(BaselineWorker {
            rules: self.clone(),
            epoch: Instant::now(),
            state: Mutex::new(WorkerState {
                rng: StdRng::seed_from_u64(identity.seed),
                budget: self
                    .budget_floor
                    .map(|floor| LocalBudget::new(BUDGET_WINDOW, BUDGET_RATIO, floor)),
            }),
        })
    }
}

/// One worker's baseline state; its intents run concurrently and take the
/// lock only for a draw or a budget update, never across an await.
#[derive(Debug)]
struct BaselineWorker {
    rules: Baseline,
    /// Elapsed zero for the budget, which counts in elapsed time.
    epoch: Instant,
    state: Mutex<WorkerState>,
}

#[derive(Debug)]
struct WorkerState {
    rng: StdRng,
    budget: Option<LocalBudget>,
}

impl WorkerRunner for BaselineWorker {
    fn run_intent(self: Arc<Self>, io: IntentIo) -> IntentFuture {
        Box::pin(async move { self.run(io).await })
    }
}

impl BaselineWorker {
    fn state(&self) -> std::sync::MutexGuard<'_, WorkerState> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Whether an attempt started now could end, timeout included, by the
    /// deadline.
    fn fits(&self, start: Instant, io: &IntentIo) -> bool {
        start + self.rules.attempt_timeout <= io.deadline()
    }

    async fn run(&self, io: IntentIo) -> Outcome {
        let cancel = io.cancellation().clone();
        let mut attempts = 0u32;
        loop {
            // Gates before every start: cancellation first, then the deadline.
            if cancel.is_cancelled() {
                return Outcome::Cancelled;
            }
            if !self.fits(Instant::now(), &io) {
                return Outcome::DeadlineInfeasible;
            }
            attempts += 1;
            if attempts == 1 {
                let now = self.epoch.elapsed();
                if let Some(budget) = self.state().budget.as_mut() {
                    budget.deposit(now);
                }
            }
            let answer = tokio::select! {
                biased;
                () = cancel.cancelled() => return Outcome::Cancelled,
                answer = tokio::time::timeout(self.rules.attempt_timeout, io.send()) => answer,
            };
            let retry_after = match answer {
                Ok(Answer::Ok) => return Outcome::Succeeded,
                Ok(Answer::TooManyRequests { retry_after }) => Some(retry_after),
                // A timeout is transient and carries no hint.
                Err(_) => None,
            };
            if attempts >= self.rules.max_attempts {
                return Outcome::AttemptCap;
            }
            let next = Instant::now() + self.wait(attempts, retry_after.as_deref(), &io);
            // Decided at receipt: a retry that cannot fit is not waited for.
            if !self.fits(next, &io) {
                return Outcome::DeadlineInfeasible;
            }
            let now = self.epoch.elapsed();
            if let Some(budget) = self.state().budget.as_mut()
                && !budget.withdraw(now)
            {
                return Outcome::BudgetExhausted;
            }
            tokio::select! {
                biased;
                () = cancel.cancelled() => return Outcome::Cancelled,
                () = tokio::time::sleep_until(next) => {}
            }
        }
    }

    fn wait(&self, completed: u32, retry_after: Option<&str>, io: &IntentIo) -> Duration {
        let hint = || {
            read_retry_after(retry_after, io.wall().now(), HintRules::default())
                .verdict
                .valid_delay()
                .unwrap_or(NO_HINT_WAIT)
        };
        match self.rules.wait {
            WaitRule::Immediate => Duration::ZERO,
            WaitRule::Hint => hint(),
            WaitRule::HintOrJitter(backoff) => {
                let jitter = backoff.delay(completed, &mut self.state().rng);
                hint().max(jitter)
            }
        }
    }
}
