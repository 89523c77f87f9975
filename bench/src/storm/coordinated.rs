//! Strategies (e) and (f): Tollgate, every retry through the real gate and
//! the real coordinator. This is the one file that uses the coordinator's
//! and the client library's APIs.
//!
//! The coordinator is the real server (`server::run`: the
//! real `BudgetService` and Admin service behind the real layers, a fresh
//! in-memory store), reached by real tonic clients over in-memory pipes
//! (see `pipes.rs`, which also counts the workers' RPCs by method).
//! Coordinator and gates read one [`TokioClock`] that reads the run's wall
//! time at elapsed zero, so cooldowns, slots and HTTP-date hints agree with
//! the upstream's [`VirtualWall`](super::VirtualWall).
//!
//! Each worker has its own `CoordinatorLink` (its own connection, its own
//! worker id), `LeaseCache` and `Gate`. The gate reports first attempts and
//! every 429 with its raw hint, leases a token for every retry, and asks
//! `Reconsider` for a slot before it.
//!
//! - (e) runs as shipped: the coordinator's default `[server]` limits and
//!   default policy (`tollgate serve` with no file), or `--e-policy FILE`;
//!   the client's default lease sizing and gate limits. Nothing in it is
//!   derived from the run's capacity, arrival rate or fleet size.
//! - (f) is told the answer: wake rate `C − λ`, ratio 0.5, every share to
//!   `normal`, a 429 costing one token, limits raised out of the way, leases
//!   of 4: how Tollgate does when the pacing is known, for comparison.
//!
//! Once a second a sampler reads the storm scope through the real Admin
//! `GetScope` ([`SCOPE_FIELDS`] says which fields, one line each).

use std::path::PathBuf;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use tokio::time::Instant;
use tokio_stream::StreamExt;
use tokio_stream::wrappers::ReceiverStream;
use tokio_util::sync::{CancellationToken, DropGuard};
use tollgate_client::backoff::{Backoff, Jitter};
use tollgate_client::clock::{Clock, TokioClock, to_unix_ms};
use tollgate_client::engine::{IntentPolicy, Observation};
use tollgate_client::gate::{Attempt, Gate, GateConfig, GateIntent, Reply};
use tollgate_client::lease::{LeaseCache, LeaseCacheConfig};
use tollgate_client::link::{CoordinatorLink, LinkConfig};
use tollgate_client::outcome::Outcome;
use tollgate_client::ratelimit::stated_fields;
use tollgate_client::scope::Scope;
use tollgate_proto::v1::admin_client::AdminClient;
use tollgate_proto::v1::{self, Evidence, GetScopeRequest, ScopeCertainty, ScopeState};
use tonic::transport::Endpoint;

use super::pipes::{Pipes, RpcCounts};
use super::runner::{
    Answer, CoordinatorRecord, IntentFuture, IntentIo, ScopeSeries, Strategy, WorkerIdentity,
    WorkerRunner,
};
use super::{StormConfig, StormError};
use tollgate::config::Config;
use tollgate::scope::RouteKey;

/// The scope every intent of the run belongs to.
const CALLER_SCOPE: &str = "storm";
const ROUTE: &str = "POST /storm";
/// (f)'s fleet budget: retries per reported first attempt.
const TOLD_RETRY_RATIO: f64 = 0.5;
/// The gate's own backoff after a 429: the hint and the coordinator's slot
/// do the spreading, so this only floors the wait.
const GATE_BACKOFF: Backoff = Backoff {
    base: Duration::from_millis(500),
    cap: Duration::from_secs(5),
    jitter: Jitter::Full,
};
/// What a lying worker reports on every 429.
const LIE: &str = "300";
/// How often the sampler reads the storm scope.
const SAMPLE_EVERY: Duration = Duration::from_secs(1);

/// What the sampler keeps of each `GetScope` answer, one series per entry:
/// a new field the coordinator learns (capacity, wake rate) is one line
/// here, and `storm.json` and the chart pick it up by name.
const SCOPE_FIELDS: &[(&str, ScopeReader)] = &[
    ("cooldown_left_s", |s, at| {
        Some((s.cooldown_until_unix_ms - at.now_unix_ms).max(0) as f64 / 1000.0)
    }),
    ("slot_backlog", |s, _| Some(f64::from(s.slot_backlog))),
    ("tokens_outstanding", |s, _| {
        Some(s.tokens_outstanding as f64)
    }),
    ("wake_rate_per_s", |s, _| pacing(s, |p| p.wake_rate)),
    ("capacity_per_s", |s, _| pacing(s, |p| p.capacity_estimate)),
    ("spare_per_s", |s, _| pacing(s, |p| p.spare_capacity)),
    ("first_attempt_rate_per_s", |s, _| {
        pacing(s, |p| p.first_attempt_rate)
    }),
    ("burst_estimate", |s, _| pacing(s, |p| p.burst_estimate)),
    ("asking", |s, _| pacing(s, |p| f64::from(p.asking))),
    ("saturated", |s, _| {
        pacing(s, |p| f64::from(u8::from(p.state == "saturated")))
    }),
];

/// A pacing field of a `GetScope` answer; `None` while the coordinator
/// holds nothing for the scope.
fn pacing(s: &ScopeState, read: impl Fn(&v1::PacingState) -> f64) -> Option<f64> {
    s.pacing.as_ref().map(read)
}

/// Reads one sampled value from a `GetScope` answer (`None`: not known).
type ScopeReader = fn(&ScopeState, &Sample) -> Option<f64>;

/// What a `SCOPE_FIELDS` reader may use besides the scope itself.
struct Sample {
    now_unix_ms: i64,
}

/// Where a coordinated strategy's policy comes from.
#[derive(Debug, Clone, PartialEq)]
pub(super) enum PolicySource {
    /// `tollgate serve` with no policy file.
    Defaults,
    /// A policy file, as `tollgate serve --config FILE` reads it.
    File(PathBuf),
    /// Told the upstream's spare capacity `C − λ` as the wake rate.
    ToldSpareCapacity,
}

/// Everything a coordinated strategy is configured with.
struct Tuning {
    config: Config,
    /// Lease sizing, seed aside.
    lease: LeaseCacheConfig,
    gate: GateConfig,
    /// The link's per-RPC timeout, when not the client's default.
    rpc_timeout: Option<Duration>,
    /// For the table.
    description: String,
}

impl Tuning {
    fn new(
        source: &PolicySource,
        config: &StormConfig,
        key: &'static str,
    ) -> Result<Self, StormError> {
        let refused = |problem: String| StormError::Strategy {
            strategy: key,
            problem,
        };
        let shipped = |config, description| Tuning {
            config,
            lease: LeaseCacheConfig::default(),
            gate: GateConfig::default(),
            rpc_timeout: None,
            description,
        };
        let mut tuning = match source {
            PolicySource::Defaults => shipped(
                Config::default(),
                "the coordinator's shipped defaults".to_owned(),
            ),
            PolicySource::File(path) => shipped(
                Config::load(path).map_err(|e| refused(e.to_string()))?,
                format!("policy file {}", path.display()),
            ),
            PolicySource::ToldSpareCapacity => {
                let wake = (config.capacity - config.arrival_rate)
                    .floor()
                    .clamp(1.0, 100_000.0) as u32;
                let text = told_policy(wake);
                Tuning {
                    config: Config::from_toml(&text, |_| None)
                        .map_err(|e| refused(e.to_string()))?,
                    // Small leases: 500 workers each holding 20 would hoard
                    // the fleet's budget.
                    lease: LeaseCacheConfig {
                        batch: 4,
                        low_water: 1,
                        ..LeaseCacheConfig::default()
                    },
                    gate: GateConfig {
                        max_in_flight: 100_000,
                        ..GateConfig::default()
                    },
                    rpc_timeout: Some(Duration::from_millis(250)),
                    description: format!(
                        "told C − λ: ratio {TOLD_RETRY_RATIO}, 429 costs 1, all to normal, \
                         leases of 4, limits raised"
                    ),
                }
            }
        };
        // Reproducible slot jitter; not a policy.
        tuning.config.limits.rng_seed.get_or_insert(config.seed);
        Ok(tuning)
    }
}

/// (f)'s policy file: today's tuned run, kept for comparison.
fn told_policy(wake: u32) -> String {
    // A 429 costs one token, like a transient failure: the wake rate, not a
    // doubled cost, is what keeps the upstream below capacity.
    format!(
        r#"
[server]
max_concurrent_requests = 100000
request_timeout = "60s"

[defaults]
window = "10s"
retry_ratio = {TOLD_RETRY_RATIO}
min_retries_per_sec = 10
cost_throttled = 1.0
cost_transient = 1.0
wake_rate = {wake}
max_hint = "60s"
lease_ttl = "10s"
shares = {{ critical = 0.0, normal = 1.0, bulk = 0.0 }}
"#
    )
}

/// Strategy (e) or (f) for one run: the coordinator, and what every worker
/// needs to reach it.
pub(super) struct Coordinated {
    tuning: Tuning,
    /// The resolved policy's pinned wake rate, for the table; `None`:
    /// learned.
    wake_rate: Option<u32>,
    clock: Arc<TokioClock>,
    pipes: Pipes,
    counts: Arc<RpcCounts>,
    samples: Arc<Mutex<ScopeSeries>>,
    max_attempts: u32,
    attempt_timeout: Duration,
    /// Workers with an index below this report [`LIE`] on every 429.
    liars: usize,
    /// Ends the coordinator and the sampler when the strategy is dropped.
    _shutdown: DropGuard,
    /// And aborts them, should they not end at once.
    _tasks: [AbortOnDrop; 2],
}

struct AbortOnDrop(tokio::task::AbortHandle);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

impl Coordinated {
    pub(super) fn start(
        config: &StormConfig,
        key: &'static str,
        source: PolicySource,
    ) -> Result<Self, StormError> {
        let tuning = Tuning::new(&source, config, key)?;
        let route = RouteKey {
            caller_scope: CALLER_SCOPE.to_owned(),
            route: ROUTE.to_owned(),
        };
        let wake_rate = tuning
            .config
            .policies
            .resolve(&route)
            .pacing
            .pinned_m
            .map(|m| u32::try_from(m / 1000).unwrap_or(u32::MAX));
        let clock = Arc::new(TokioClock::new(config.wall_at_start));
        let (pipes, incoming) = Pipes::new();
        let shutdown = CancellationToken::new();
        let server = tokio::spawn(tollgate::server::run(
            ReceiverStream::new(incoming).map(Ok::<_, std::io::Error>),
            shutdown.clone().cancelled_owned(),
            tollgate::server::Setup::new(tuning.config.clone()).clock(clock.clone()),
        ));
        let samples = Arc::new(Mutex::new(ScopeSeries::new()));
        let sampler = tokio::spawn(sample_scope(
            pipes.clone(),
            clock.clone(),
            samples.clone(),
            shutdown.clone(),
        ));
        let liars = (config.liar_fraction * config.workers as f64).round() as usize;
        Ok(Coordinated {
            tuning,
            wake_rate,
            clock,
            pipes,
            counts: Arc::new(RpcCounts::new(Instant::now())),
            samples,
            max_attempts: config.max_attempts,
            attempt_timeout: config.attempt_timeout,
            liars,
            _shutdown: shutdown.drop_guard(),
            _tasks: [
                AbortOnDrop(server.abort_handle()),
                AbortOnDrop(sampler.abort_handle()),
            ],
        })
    }
}

/// Reads the storm scope through the Admin API once a second, from elapsed
/// zero, until `stop`. A failed read is recorded as `None` (null in
/// `storm.json`), so every series stays aligned with the seconds.
async fn sample_scope(
    pipes: Pipes,
    clock: Arc<TokioClock>,
    samples: Arc<Mutex<ScopeSeries>>,
    stop: CancellationToken,
) {
    let endpoint = Endpoint::from_static("http://coordinator.invalid");
    let mut admin = AdminClient::new(pipes.channel(&endpoint));
    let mut ticks = tokio::time::interval(SAMPLE_EVERY);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            () = stop.cancelled() => return,
            _ = ticks.tick() => {}
        }
        let request = GetScopeRequest {
            caller_scope: CALLER_SCOPE.to_owned(),
            route: ROUTE.to_owned(),
        };
        let state = admin.get_scope(request).await.ok().map(|r| r.into_inner());
        let at = Sample {
            now_unix_ms: to_unix_ms(clock.now()),
        };
        let mut samples = samples.lock().unwrap_or_else(PoisonError::into_inner);
        for (name, read) in SCOPE_FIELDS {
            let value = state.as_ref().and_then(|s| read(s, &at));
            samples.entry(name).or_default().push(value);
        }
    }
}

impl Strategy for Coordinated {
    fn describe(&self) -> String {
        format!(
            "Tollgate gate per worker, real coordinator over in-memory pipes, {}; \
             wake rate: {}; leases of {}; {} attempts max{}",
            self.tuning.description,
            self.wake_rate
                .map_or_else(|| "learned".to_owned(), |r| format!("{r} slots/s")),
            self.tuning.lease.batch,
            self.max_attempts,
            if self.liars > 0 {
                format!(
                    "; {} workers report a {LIE} s hint on every 429",
                    self.liars
                )
            } else {
                String::new()
            }
        )
    }

    fn worker(&self, identity: &WorkerIdentity) -> Arc<dyn WorkerRunner> {
        let mut link_config = LinkConfig::new("http://coordinator.invalid", &identity.worker_id);
        if let Some(timeout) = self.tuning.rpc_timeout {
            link_config.rpc_timeout = timeout;
        }
        // The link's own endpoint settings (timeouts, keepalive), over pipes.
        let endpoint = link_config
            .endpoint()
            .unwrap_or_else(|_| Endpoint::from_static("http://coordinator.invalid"));
        let channel = self.pipes.counted_channel(&endpoint, &self.counts);
        let link = match CoordinatorLink::with_channel(channel, &link_config) {
            Ok(link) => link,
            // Only a malformed endpoint fails, and this one is fixed.
            Err(err) => unreachable!("fixed link configuration refused: {err}"),
        };
        let cache = LeaseCache::start(
            link,
            LeaseCacheConfig {
                seed: Some(identity.seed),
                ..self.tuning.lease.clone()
            },
            self.clock.clone(),
        );
        let gate = Gate::new(
            cache,
            self.clock.clone(),
            GateConfig {
                seed: Some(identity.seed),
                ..self.tuning.gate.clone()
            },
        );
        Arc::new(CoordinatedWorker {
            gate,
            clock: self.clock.clone(),
            scope: Scope::new(CALLER_SCOPE, ROUTE),
            max_attempts: self.max_attempts,
            attempt_timeout: self.attempt_timeout,
            liar: identity.index < self.liars,
        })
    }

    fn coordinator(&self) -> Option<CoordinatorRecord> {
        let samples = self.samples.lock().unwrap_or_else(PoisonError::into_inner);
        Some(CoordinatorRecord {
            scope_per_s: samples.clone(),
            rpcs: self.counts.series(),
        })
    }
}

/// One worker's gate.
struct CoordinatedWorker {
    gate: Gate,
    clock: Arc<TokioClock>,
    scope: Scope,
    max_attempts: u32,
    attempt_timeout: Duration,
    /// Reports [`LIE`] to the coordinator on every 429, and with
    /// `--states-limit` [`STATED_LIE`] on every answer.
    liar: bool,
}

/// What a lying worker says the upstream stated: one request left of its
/// quota for the next half minute. Consistent (no window for the reset to
/// outlast), so it reads as usable and must be outweighed, not refused.
const STATED_LIE: [(&str, &str); 3] = [
    ("x-ratelimit-limit", "1000"),
    ("x-ratelimit-remaining", "1"),
    ("x-ratelimit-reset", "30"),
];

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
                let (answer, headers) = io.send_stated().await;
                // What a layer reads off every response: the stated limit
                // (a liar's, a tiny remaining, whenever one is stated).
                let stated = if self.liar && !headers.is_empty() {
                    stated_fields(STATED_LIE)
                } else {
                    stated_fields(headers.iter().map(|(n, v)| (*n, v.as_str())))
                };
                match answer {
                    Answer::Ok => Reply::new(Observation::http(200, None).with_stated(stated), ()),
                    Answer::TooManyRequests { retry_after } => {
                        if self.liar {
                            self.lie(io.intent_id());
                        }
                        Reply::new(
                            Observation::http(429, Some(&retry_after)).with_stated(stated),
                            (),
                        )
                    }
                }
            })
            .await;
        result.outcome
    }

    /// A faulty reporter: besides the true evidence the gate reports (and
    /// waits by), the coordinator gets a 429 asking for [`LIE`] seconds.
    fn lie(&self, intent_id: u64) {
        let now = to_unix_ms(self.clock.now());
        self.gate.cache().record_evidence(
            &self.scope,
            Evidence {
                http_status: 429,
                has_retry_after: true,
                retry_after: LIE.to_owned(),
                receipt_unix_ms: now,
                sent_unix_ms: now,
                certainty: ScopeCertainty::Known as i32,
                intent_id: format!("intent-{intent_id}"),
                ..Evidence::default()
            },
        );
    }
}
