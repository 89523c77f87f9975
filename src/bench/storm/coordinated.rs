//! Strategy (e): Tollgate, every retry through the real gate and the real
//! coordinator.
//!
//! The coordinator is the real server (`server::run`: the
//! real `BudgetService` behind the real layers, a fresh in-memory store),
//! reached by real tonic clients over in-memory pipes instead of loopback
//! TCP. Pipes are driven by tokio itself, so under a paused clock time only
//! jumps when nothing can make progress: (e) runs in `--mode paused` like
//! the baselines, reproducibly (and over the same pipes in realtime mode).
//! Coordinator and gates read one [`TokioClock`] that reads the run's wall
//! time at elapsed zero, so cooldowns, slots and HTTP-date hints agree with
//! the upstream's [`VirtualWall`](super::VirtualWall).
//!
//! Each worker has its own `CoordinatorLink` (its own connection, its own
//! worker id), `LeaseCache` and `Gate`. The gate reports first attempts and
//! every 429 with its raw hint, leases a token for every retry, and asks
//! `Reconsider` for a slot before it; the route's `wake_rate` paces the
//! fleet's waking retries at the upstream's spare capacity.

use std::sync::Arc;
use std::time::Duration;

use tokio::io::DuplexStream;
use tokio::sync::mpsc;
use tokio::time::Instant;
use tokio_stream::StreamExt;
use tokio_stream::wrappers::ReceiverStream;
use tokio_util::sync::{CancellationToken, DropGuard};
use tollgate_client::backoff::{Backoff, Jitter};
use tollgate_client::clock::TokioClock;
use tollgate_client::engine::{IntentPolicy, Observation};
use tollgate_client::gate::{Attempt, Gate, GateConfig, GateIntent, Reply};
use tollgate_client::lease::{LeaseCache, LeaseCacheConfig};
use tollgate_client::link::{CoordinatorLink, LinkConfig};
use tollgate_client::outcome::Outcome;
use tollgate_client::scope::Scope;
use tonic::transport::{Channel, Endpoint};

use super::strategy::{Answer, IntentFuture, IntentIo, Strategy, WorkerIdentity, WorkerRunner};
use super::{StormConfig, StormError};
use crate::config::Config;

/// The scope every intent of the run belongs to.
const CALLER_SCOPE: &str = "storm";
const ROUTE: &str = "POST /storm";
/// The fleet budget earns this many retries per reported first attempt.
const RETRY_RATIO: f64 = 0.5;
/// Pipe buffer per direction of one connection.
const PIPE_BYTES: usize = 64 * 1024;
/// The gate's own backoff after a 429: the hint and the coordinator's slot
/// do the spreading, so this only floors the wait.
const GATE_BACKOFF: Backoff = Backoff {
    base: Duration::from_millis(500),
    cap: Duration::from_secs(5),
    jitter: Jitter::Full,
};

/// The policy (e) runs under, derived from the run.
#[derive(Debug, Clone, PartialEq)]
pub(super) struct FleetPolicy {
    /// Slots per second: the upstream's spare capacity, `C − λ`.
    pub(super) wake_rate: u32,
    /// Retries per second the budget earns from first attempts (all of it
    /// to the `normal` class, the only one in the run), floor aside.
    pub(super) retry_budget_per_sec: f64,
}

impl FleetPolicy {
    pub(super) fn for_run(config: &StormConfig) -> Self {
        let spare = (config.capacity - config.arrival_rate).floor();
        // At least one slot a second even when arrivals fill the capacity.
        let wake_rate = spare.clamp(1.0, 100_000.0) as u32;
        FleetPolicy {
            wake_rate,
            retry_budget_per_sec: config.arrival_rate * RETRY_RATIO,
        }
    }

    /// The coordinator's policy file for the run.
    fn policy_file(&self, seed: u64) -> String {
        // A 429 costs one token, like a transient failure: the wake rate,
        // not a doubled cost, is what keeps the upstream below capacity.
        format!(
            r#"
[server]
rng_seed = {seed}
max_concurrent_requests = 100000
request_timeout = "60s"

[defaults]
window = "10s"
retry_ratio = {RETRY_RATIO}
min_retries_per_sec = 10
cost_throttled = 1.0
cost_transient = 1.0
wake_rate = {wake}
max_hint = "60s"
lease_ttl = "10s"
shares = {{ critical = 0.0, normal = 1.0, bulk = 0.0 }}
"#,
            wake = self.wake_rate,
        )
    }
}

/// Strategy (e) for one run: the coordinator, and what every worker needs to
/// reach it.
pub(super) struct Coordinated {
    policy: FleetPolicy,
    clock: Arc<TokioClock>,
    connections: mpsc::Sender<DuplexStream>,
    max_attempts: u32,
    attempt_timeout: Duration,
    /// Ends the coordinator when the strategy is dropped.
    _shutdown: DropGuard,
    /// And aborts it, should it not drain at once.
    _server: AbortOnDrop,
}

struct AbortOnDrop(tokio::task::AbortHandle);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

impl Coordinated {
    pub(super) fn start(config: &StormConfig) -> Result<Self, StormError> {
        let policy = FleetPolicy::for_run(config);
        let file = Config::from_toml(&policy.policy_file(config.seed), |_| None).map_err(|e| {
            StormError::Strategy {
                strategy: "e",
                problem: e.to_string(),
            }
        })?;
        let clock = Arc::new(TokioClock::new(config.wall_at_start));
        let (connections, incoming) = mpsc::channel::<DuplexStream>(64);
        let shutdown = CancellationToken::new();
        let server = tokio::spawn(crate::server::run(
            ReceiverStream::new(incoming).map(Ok::<_, std::io::Error>),
            shutdown.clone().cancelled_owned(),
            crate::server::Setup::new(file).clock(clock.clone()),
        ));
        Ok(Coordinated {
            policy,
            clock,
            connections,
            max_attempts: config.max_attempts,
            attempt_timeout: config.attempt_timeout,
            _shutdown: shutdown.drop_guard(),
            _server: AbortOnDrop(server.abort_handle()),
        })
    }

    /// A channel whose every connection is a fresh pair of pipes handed to
    /// the coordinator.
    fn channel(&self, endpoint: &Endpoint) -> Channel {
        let connections = self.connections.clone();
        endpoint.connect_with_connector_lazy(tower::service_fn(move |_| {
            let connections = connections.clone();
            async move {
                let (client, server) = tokio::io::duplex(PIPE_BYTES);
                connections
                    .send(server)
                    .await
                    .map_err(|_| std::io::Error::from(std::io::ErrorKind::ConnectionRefused))?;
                Ok::<_, std::io::Error>(hyper_util::rt::TokioIo::new(client))
            }
        }))
    }
}

impl Strategy for Coordinated {
    fn describe(&self) -> String {
        format!(
            "Tollgate gate per worker, real coordinator over in-memory pipes; \
             wake rate: {} slots/s (C − λ); budget {RETRY_RATIO} of first attempts \
             (= {:.0}/s) + 10/s floor, 429 costs 1 token; {} attempts max",
            self.policy.wake_rate, self.policy.retry_budget_per_sec, self.max_attempts
        )
    }

    fn worker(&self, identity: &WorkerIdentity) -> Arc<dyn WorkerRunner> {
        let mut link_config = LinkConfig::new("http://coordinator.invalid", &identity.worker_id);
        link_config.rpc_timeout = Duration::from_millis(250);
        // The link's own endpoint settings (timeouts, keepalive), over pipes.
        let endpoint = link_config
            .endpoint()
            .unwrap_or_else(|_| Endpoint::from_static("http://coordinator.invalid"));
        let link = CoordinatorLink::with_channel(self.channel(&endpoint), &link_config);
        let link = match link {
            Ok(link) => link,
            // Only a malformed endpoint fails, and this one is fixed.
            Err(err) => unreachable!("fixed link configuration refused: {err}"),
        };
        let cache = LeaseCache::start(
            link,
            LeaseCacheConfig {
                // Small leases: 500 workers each holding 20 would hoard
                // the fleet's budget.
                batch: 4,
                low_water: 1,
                seed: Some(identity.seed),
                ..LeaseCacheConfig::default()
            },
            self.clock.clone(),
        );
        let gate = Gate::new(
            cache,
            self.clock.clone(),
            GateConfig {
                max_in_flight: 100_000,
                min_wait: Duration::from_millis(10),
                local_spread: Duration::from_secs(1),
                clock_trusted: true,
                seed: Some(identity.seed),
            },
        );
        Arc::new(CoordinatedWorker {
            gate,
            scope: Scope::new(CALLER_SCOPE, ROUTE),
            max_attempts: self.max_attempts,
            attempt_timeout: self.attempt_timeout,
        })
    }
}

/// One worker's gate.
struct CoordinatedWorker {
    gate: Gate,
    scope: Scope,
    max_attempts: u32,
    attempt_timeout: Duration,
}

impl WorkerRunner for CoordinatedWorker {
    fn run_intent(self: Arc<Self>, io: IntentIo) -> IntentFuture {
        Box::pin(async move { self.run(io).await })
    }
}

impl CoordinatedWorker {
    async fn run(&self, io: IntentIo) -> Outcome {
        let left = io.deadline().saturating_duration_since(Instant::now());
        if left < self.attempt_timeout {
            return Outcome::DeadlineInfeasible;
        }
        let policy = match IntentPolicy::try_new(
            left,
            self.max_attempts,
            self.attempt_timeout,
            Duration::from_millis(10),
            GATE_BACKOFF,
            None,
        ) {
            Ok(policy) => policy,
            Err(_) => return Outcome::DeadlineInfeasible,
        };
        let intent = GateIntent::new(
            format!("intent-{}", io.intent_id()),
            self.scope.clone(),
            policy,
        )
        .cancel_token(io.cancellation().clone());
        let io = &io;
        let result = self
            .gate
            .run(intent, move |_attempt: Attempt| async move {
                match io.send().await {
                    Answer::Ok => Reply::new(Observation::http(200, None), ()),
                    Answer::TooManyRequests { retry_after } => {
                        Reply::new(Observation::http(429, Some(&retry_after)), ())
                    }
                }
            })
            .await;
        result.outcome
    }
}
