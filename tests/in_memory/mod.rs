//! The real coordinator (`tollgate::server::serve_with_incoming`, so the real
//! `BudgetService` behind the real layers) served over in-memory pipes, and a
//! gate connected to it, for tests on paused tokio time.
//!
//! Why pipes and not loopback: with `start_paused` tokio auto-advances the
//! clock whenever every task is idle, and a task waiting on socket IO counts
//! as idle, so RPC timeouts would fire while the kernel is still delivering
//! bytes. `tokio::io::duplex` pipes are driven by tokio itself, so the clock
//! only jumps when nothing can make progress.
//!
//! Both sides read one [`TokioClock`]: the coordinator's cooldowns and slots
//! and the gate's deadlines and HTTP-dates move with the paused clock.
//!
//! A [`Switchboard`] stands where the network would: it hands each new
//! connection to the running coordinator, refuses it (the coordinator is
//! gone), or accepts it and never answers (the coordinator's host hangs).

#![allow(dead_code)] // Each test binary uses a different subset.

use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use tokio::io::DuplexStream;
use tokio::sync::{mpsc, oneshot};
use tokio::task::JoinHandle;
use tokio_stream::StreamExt;
use tokio_stream::wrappers::ReceiverStream;
use tollgate::config::Config;
use tollgate::server::{self, ServeError};
use tollgate_client::backoff::{Backoff, Jitter};
use tollgate_client::clock::TokioClock;
use tollgate_client::engine::Policy;
use tollgate_client::gate::{Gate, GateConfig};
use tollgate_client::lease::{LeaseCache, LeaseCacheConfig};
use tollgate_client::link::{CoordinatorLink, LinkConfig};
use tollgate_client::scope::Scope;
use tollgate_proto::v1::budget_client::BudgetClient;
use tonic::transport::{Channel, Endpoint};

/// The gate's bound on one coordinator RPC.
pub(crate) const RPC_TIMEOUT: Duration = Duration::from_millis(250);

/// Noon, 1 January 2024: every test's wall clock starts here.
pub(crate) fn noon() -> SystemTime {
    httpdate::parse_http_date("Mon, 01 Jan 2024 12:00:00 GMT").expect("date")
}

/// The coordinator's configuration for most rows: the built-in policy, a
/// fixed slot-jitter seed, and a short drain so a stop is quick.
pub(crate) fn coordinator_config() -> Config {
    config(
        r#"
[server]
rng_seed = 7
grace_period = "1s"
"#,
    )
}

/// A policy file, validated by the real parser.
pub(crate) fn config(text: &str) -> Config {
    Config::from_toml(text, |_| None).expect("valid test policy file")
}

/// Where a new connection goes.
enum Route {
    /// To the running coordinator's incoming stream.
    Up(mpsc::Sender<DuplexStream>),
    /// Nowhere: connecting fails at once.
    Refused,
    /// Accepted and held, never read or answered.
    Hung(Vec<DuplexStream>),
}

/// Stands where the network would, between clients and the coordinator.
#[derive(Clone)]
pub(crate) struct Switchboard {
    route: Arc<Mutex<Route>>,
}

impl Switchboard {
    fn set(&self, route: Route) {
        *self.route.lock().expect("switchboard lock") = route;
    }

    /// A channel that connects (lazily, and again after a failure) through
    /// the switchboard, each connection a fresh pipe.
    pub(crate) fn channel(&self) -> Channel {
        let switchboard = self.clone();
        Endpoint::from_static("http://coordinator.invalid").connect_with_connector_lazy(
            tower::service_fn(move |_| {
                let switchboard = switchboard.clone();
                async move {
                    let (client, server) = tokio::io::duplex(64 * 1024);
                    let up = {
                        let mut route = switchboard.route.lock().expect("switchboard lock");
                        match &mut *route {
                            Route::Up(conns) => Some(conns.clone()),
                            Route::Refused => None,
                            Route::Hung(held) => {
                                held.push(server);
                                return Ok(hyper_util::rt::TokioIo::new(client));
                            }
                        }
                    };
                    let refused = || std::io::Error::from(std::io::ErrorKind::ConnectionRefused);
                    up.ok_or_else(refused)?
                        .send(server)
                        .await
                        .map_err(|_| refused())?;
                    Ok::<_, std::io::Error>(hyper_util::rt::TokioIo::new(client))
                }
            }),
        )
    }
}

/// The real coordinator, running on the switchboard.
pub(crate) struct Coordinator {
    pub(crate) switchboard: Switchboard,
    pub(crate) clock: Arc<TokioClock>,
    config: Config,
    running: Option<(oneshot::Sender<()>, JoinHandle<Result<(), ServeError>>)>,
}

impl Coordinator {
    /// Starts a coordinator with `config` on `clock`.
    pub(crate) fn start(config: Config, clock: Arc<TokioClock>) -> Coordinator {
        let mut coordinator = Coordinator {
            switchboard: Switchboard {
                route: Arc::new(Mutex::new(Route::Refused)),
            },
            clock,
            config,
            running: None,
        };
        coordinator.restart();
        coordinator
    }

    /// Starts a fresh coordinator process (empty in-memory store, same
    /// configuration and clock) and routes new connections to it.
    pub(crate) fn restart(&mut self) {
        let (conns, incoming) = mpsc::channel::<DuplexStream>(8);
        let (stop, stopped) = oneshot::channel::<()>();
        let task = tokio::spawn(server::serve_with_incoming(
            ReceiverStream::new(incoming).map(Ok::<_, std::io::Error>),
            async {
                let _ = stopped.await;
            },
            self.config.clone(),
            self.clock.clone(),
        ));
        self.running = Some((stop, task));
        self.switchboard.set(Route::Up(conns));
    }

    /// Shuts the coordinator down (its connections drain and close) and
    /// refuses new connections: a coordinator that is gone.
    pub(crate) async fn stop(&mut self) {
        self.switchboard.set(Route::Refused);
        if let Some((stop, task)) = self.running.take() {
            let _ = stop.send(());
            task.await
                .expect("the server task did not panic")
                .expect("the server ran without error");
        }
    }

    /// Shuts the coordinator down and makes new connections hang: accepted,
    /// never answered, like a host that stopped responding.
    pub(crate) async fn hang(&mut self) {
        self.stop().await;
        self.switchboard.set(Route::Hung(Vec::new()));
    }

    /// Another worker of the fleet, talking to the coordinator directly.
    pub(crate) fn client(&self) -> BudgetClient<Channel> {
        BudgetClient::new(self.switchboard.channel())
    }
}

/// The real coordinator and a gate connected to it.
pub(crate) struct Harness {
    pub(crate) coordinator: Coordinator,
    pub(crate) gate: Gate,
    pub(crate) clock: Arc<TokioClock>,
}

/// The gate's tuning in these tests: a fixed seed and a visible local spread.
pub(crate) fn gate_config() -> GateConfig {
    GateConfig {
        max_in_flight: 16,
        min_wait: Duration::from_millis(10),
        local_spread: Duration::from_millis(100),
        clock_trusted: true,
        seed: Some(7),
    }
}

/// The default coordinator and gate.
pub(crate) fn harness() -> Harness {
    harness_on(coordinator_config(), gate_config())
}

/// The default coordinator and a gate tuned by `gate`.
pub(crate) fn harness_with(gate: GateConfig) -> Harness {
    harness_on(coordinator_config(), gate)
}

/// A coordinator configured by `config` and a gate tuned by `gate`.
pub(crate) fn harness_on(config: Config, gate: GateConfig) -> Harness {
    let clock = Arc::new(TokioClock::new(noon()));
    let coordinator = Coordinator::start(config, clock.clone());
    let mut link_config = LinkConfig::new("http://coordinator.invalid", "worker-1");
    link_config.rpc_timeout = RPC_TIMEOUT;
    let link = CoordinatorLink::with_channel(coordinator.switchboard.channel(), &link_config)
        .expect("link");
    let cache = LeaseCache::start(
        link,
        LeaseCacheConfig {
            seed: Some(11),
            ..LeaseCacheConfig::default()
        },
        clock.clone(),
    );
    let gate = Gate::new(cache, clock.clone(), gate);
    Harness {
        coordinator,
        gate,
        clock,
    }
}

pub(crate) fn scope() -> Scope {
    Scope::new("tenant-a", "POST /orders")
}

pub(crate) fn secs(s: u64) -> Duration {
    Duration::from_secs(s)
}

pub(crate) fn ms(m: u64) -> Duration {
    Duration::from_millis(m)
}

/// A policy: `total` end to end, `attempts` in all, `cap` per attempt, a
/// 100 ms floor, 1 s backoff base without jitter, and an optional hint cap.
pub(crate) fn policy(
    total: Duration,
    attempts: u32,
    cap: Duration,
    max_hint: Option<Duration>,
) -> Policy {
    Policy::try_new(
        total,
        attempts,
        cap,
        ms(100),
        Backoff {
            base: secs(1),
            cap: secs(8),
            jitter: Jitter::None,
        },
        max_hint,
    )
    .expect("valid policy")
}
