//! What the harness hands a strategy: who a worker is ([`WorkerIdentity`]),
//! what one intent may do ([`IntentIo`]), and the two traits a strategy
//! implements ([`Strategy`], [`WorkerRunner`]). Depends only on the
//! upstream, so the strategies (baselines, coordinated) depend on this and
//! never on each other.

use std::collections::BTreeMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tollgate_client::outcome::Outcome;

pub use super::pipes::RpcSeries;
pub use super::upstream::Answer;
use super::upstream::{Truth, Upstream};
pub use super::wall::VirtualWall;

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
}

impl IntentIo {
    pub(super) fn new(
        id: u64,
        deadline: Instant,
        cancel: CancellationToken,
        cancel_at: Option<Instant>,
        upstream: Arc<Upstream>,
        wall: Arc<VirtualWall>,
    ) -> Self {
        IntentIo {
            id,
            deadline,
            cancel,
            cancel_at,
            upstream,
            wall,
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
        self.upstream.call(truth).await
    }

    /// [`send`](Self::send), with the header fields the upstream stated its
    /// limit in (none unless `--states-limit`).
    pub async fn send_stated(&self) -> (Answer, Vec<(&'static str, String)>) {
        let truth = Truth {
            deadline: self.deadline,
            cancel_at: self.cancel_at,
            token_cancelled: self.cancel.is_cancelled(),
        };
        self.upstream.call_stated(truth).await
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
    /// One line for the table: what it does, with its parameters (for (e)
    /// and (f), the coordinator's wake rate).
    fn describe(&self) -> String;
    /// The runner of one worker; called once per worker, in the runtime.
    fn worker(&self, identity: &WorkerIdentity) -> Arc<dyn WorkerRunner>;
    /// What the strategy's coordinator was seen doing, once every worker
    /// has finished; `None` for strategies without one.
    fn coordinator(&self) -> Option<CoordinatorRecord> {
        None
    }
}

/// Samples of the storm scope: one series per field, by name, one value a
/// second; `None` where the read failed.
pub type ScopeSeries = BTreeMap<&'static str, Vec<Option<f64>>>;

/// A coordinated strategy's coordinator, seen from outside during the run.
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize)]
pub struct CoordinatorRecord {
    /// The storm scope as the Admin API showed it, sampled once a second
    /// from elapsed zero: one series per field, by name; `None` where the
    /// read failed.
    pub scope_per_s: ScopeSeries,
    /// The workers' RPCs to the coordinator, by method and second.
    pub rpcs: RpcSeries,
}
