//! Baselines (a)–(d): one retry loop ([`Baseline`]), differing only in
//! the [`WaitRule`], the attempt cap and an optional per-worker
//! [`LocalBudget`].

use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use rand::SeedableRng;
use rand::rngs::StdRng;
use tokio::time::Instant;
use tollgate_client::backoff::{Backoff, Jitter};
use tollgate_client::clock::Clock;
use tollgate_client::fallback::LocalBudget;
use tollgate_client::hint::{HintRules, read_retry_after};
use tollgate_client::outcome::Outcome;

use super::runner::{Answer, IntentFuture, IntentIo, Strategy, WorkerIdentity, WorkerRunner};

/// (c)'s backoff: 1 s base (2 s ceiling after the first attempt), 20 s cap.
pub(super) const JITTER_BACKOFF: Backoff = Backoff {
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
pub(super) const BUDGET_FLOOR_PER_SEC: f64 = 1.0;

/// When a baseline retries after a 429.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum WaitRule {
    /// At once; the hint is not even read.
    Immediate,
    /// Exactly the hint.
    Hint,
    /// `max(hint, jittered backoff)`.
    HintOrJitter(Backoff),
}

/// Strategies (a)–(d): one loop, parameterised.
#[derive(Debug, Clone)]
pub(super) struct Baseline {
    wait: WaitRule,
    max_attempts: u32,
    /// `Some(floor per second)` gives each worker a [`LocalBudget`].
    budget_floor: Option<f64>,
    attempt_timeout: Duration,
}

impl Baseline {
    /// A baseline waiting by `wait`, stopping after `max_attempts`, with a
    /// local budget of `budget_floor` retries/s per worker when given.
    pub(super) fn new(
        wait: WaitRule,
        max_attempts: u32,
        budget_floor: Option<f64>,
        attempt_timeout: Duration,
    ) -> Self {
        Baseline {
            wait,
            max_attempts,
            budget_floor,
            attempt_timeout,
        }
    }
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
