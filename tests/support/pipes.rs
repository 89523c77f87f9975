//! The in-memory transport: the real coordinator (the real `BudgetService`
//! behind the real server setup) served over in-memory pipes, and a gate
//! connected to it, for tests on paused tokio time.
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
//! A [`Switchboard`] stands where the network would, relaying every
//! connection to the running coordinator, so a test can kill the
//! coordinator's host mid-conversation (every connection goes silent) and
//! bring a fresh one back.

use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use tokio::io::DuplexStream;
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tokio_stream::StreamExt;
use tokio_stream::wrappers::ReceiverStream;
use tokio_util::sync::CancellationToken;
use tollgate::config::Config;
use tollgate::server::{self, ServeError};
use tollgate_client::backoff::{Backoff, Jitter};
use tollgate_client::clock::{Clock, TokioClock};
use tollgate_client::engine::IntentPolicy;
use tollgate_client::gate::{Gate, GateConfig};
use tollgate_client::link::{CoordinatorLink, LinkConfig};
use tollgate_client::scope::Scope;
use tollgate_proto::v1::admin_client::AdminClient;
use tollgate_proto::v1::budget_client::BudgetClient;
use tonic::transport::{Channel, Endpoint};

// The shared helpers, so `use support::pipes::*` is all a pipe test needs.
pub(crate) use super::{config, ms, secs, with_token};

/// The gate's bound on one coordinator RPC.
pub(crate) const RPC_TIMEOUT: Duration = Duration::from_millis(250);

/// Noon, 1 January 2024: every test's wall clock starts here.
pub(crate) fn noon() -> SystemTime {
    httpdate::parse_http_date("Mon, 01 Jan 2024 12:00:00 GMT").expect("date")
}

/// The coordinator's configuration for most rows: the built-in policy and a
/// fixed slot-jitter seed.
pub(crate) fn coordinator_config() -> Config {
    super::config(
        r#"
[server]
rng_seed = 7
"#,
    )
}

/// Starts the real coordinator (empty in-memory store) on the pipe ends
/// sent to the returned sender, until the task is aborted (a killed host
/// does not drain). Every in-memory coordinator of the suite starts here.
pub(crate) fn spawn_server(
    config: Config,
    clock: Arc<dyn Clock>,
) -> (
    mpsc::Sender<DuplexStream>,
    JoinHandle<Result<(), ServeError>>,
) {
    let (conns, incoming) = mpsc::channel::<DuplexStream>(8);
    let task = tokio::spawn(server::run(
        ReceiverStream::new(incoming).map(Ok::<_, std::io::Error>),
        std::future::pending::<()>(),
        server::Setup::new(config).clock(clock),
    ));
    (conns, task)
}

/// What the switchboard knows; one lock, held only to read or swap.
struct Board {
    /// The running coordinator's incoming connections; `None` while it is
    /// down.
    up: Option<mpsc::Sender<DuplexStream>>,
    /// Cancelled when the coordinator's host dies: every relay of the
    /// current connections stops forwarding at once.
    silence: CancellationToken,
    /// Pipe ends of dead connections, held open so their peers hear nothing,
    /// not even a close, until the host comes back.
    held: Vec<DuplexStream>,
}

/// Stands where the network would, between clients and the coordinator:
/// every connection is a pair of pipes with a relay between them, so the
/// coordinator's host can die mid-conversation.
#[derive(Clone)]
pub(crate) struct Switchboard {
    board: Arc<Mutex<Board>>,
}

impl Switchboard {
    fn board(&self) -> std::sync::MutexGuard<'_, Board> {
        self.board.lock().expect("switchboard lock")
    }

    /// A channel that connects (lazily, and again after a failure) through
    /// the switchboard, with tonic's default settings.
    pub(crate) fn channel(&self) -> Channel {
        self.channel_through(&Endpoint::from_static("http://coordinator.invalid"))
    }

    /// Like [`channel`](Self::channel), with `endpoint`'s settings (timeouts,
    /// HTTP/2 keepalive); its address is not used.
    pub(crate) fn channel_through(&self, endpoint: &Endpoint) -> Channel {
        let switchboard = self.clone();
        endpoint.connect_with_connector_lazy(tower::service_fn(move |_| {
            let switchboard = switchboard.clone();
            async move {
                let (client, client_far) = tokio::io::duplex(64 * 1024);
                let (server_near, server) = tokio::io::duplex(64 * 1024);
                let (up, silence) = {
                    let board = switchboard.board();
                    (board.up.clone(), board.silence.clone())
                };
                let Some(up) = up else {
                    // The host is dead: the connection is accepted by
                    // nobody and never answered.
                    switchboard.board().held.push(client_far);
                    return Ok(hyper_util::rt::TokioIo::new(client));
                };
                up.send(server)
                    .await
                    .map_err(|_| std::io::Error::from(std::io::ErrorKind::ConnectionRefused))?;
                tokio::spawn(relay(client_far, server_near, silence, switchboard));
                Ok::<_, std::io::Error>(hyper_util::rt::TokioIo::new(client))
            }
        }))
    }
}

/// Forwards bytes both ways until either side closes, or until the host dies;
/// then parks both ends on the board, open and silent.
async fn relay(
    mut client: DuplexStream,
    mut server: DuplexStream,
    silence: CancellationToken,
    switchboard: Switchboard,
) {
    let died = tokio::select! {
        _ = tokio::io::copy_bidirectional(&mut client, &mut server) => false,
        () = silence.cancelled() => true,
    };
    if died {
        switchboard.board().held.extend([client, server]);
    }
}

/// The real coordinator, running behind the switchboard.
pub(crate) struct Coordinator {
    pub(crate) switchboard: Switchboard,
    pub(crate) clock: Arc<TokioClock>,
    config: Config,
    server: Option<JoinHandle<Result<(), ServeError>>>,
}

impl Coordinator {
    /// Starts a coordinator with `config` on `clock`.
    pub(crate) fn start(config: Config, clock: Arc<TokioClock>) -> Coordinator {
        let mut coordinator = Coordinator {
            switchboard: Switchboard {
                board: Arc::new(Mutex::new(Board {
                    up: None,
                    silence: CancellationToken::new(),
                    held: Vec::new(),
                })),
            },
            clock,
            config,
            server: None,
        };
        coordinator.restart();
        coordinator
    }

    /// Brings the host back with a fresh coordinator process (empty
    /// in-memory store, same configuration and clock). The dead host's
    /// connections are reset, as a rebooted host resets them, so clients
    /// reconnect to the new one.
    pub(crate) fn restart(&mut self) {
        self.start_server();
        self.switchboard.board().held.clear();
    }

    /// Brings a fresh coordinator up for new connections while the dead
    /// host's connections stay open and silent, never reset: the coordinator
    /// came back elsewhere (failover behind the same address, a healed
    /// partition whose old flows were lost) and nobody tells the clients
    /// their old connections are gone. Only the clients' own keepalive can
    /// find that out.
    pub(crate) fn restart_leaving_dead_connections(&mut self) {
        self.start_server();
    }

    fn start_server(&mut self) {
        let (conns, task) = spawn_server(self.config.clone(), self.clock.clone());
        self.server = Some(task);
        self.switchboard.board().up = Some(conns);
    }

    /// Kills the coordinator's host: the process is gone, and every
    /// connection to it, open or new, goes silent (no answer, no reset), the
    /// slowest way for a coordinator to fail.
    pub(crate) fn kill(&mut self) {
        {
            let mut board = self.switchboard.board();
            board.up = None;
            board.silence.cancel();
            board.silence = CancellationToken::new();
        }
        if let Some(server) = self.server.take() {
            server.abort();
        }
    }

    /// Another worker of the fleet, talking to the coordinator directly.
    pub(crate) fn client(&self) -> BudgetClient<Channel> {
        BudgetClient::new(self.switchboard.channel())
    }

    /// An SRE's Admin client. Every request must carry an admin bearer
    /// token (see [`with_token`](super::with_token)): in-memory pipes have no peer address, so
    /// open dev mode's loopback-only Admin would refuse them.
    pub(crate) fn admin(&self) -> AdminClient<Channel> {
        AdminClient::new(self.switchboard.channel())
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
    // The production endpoint settings (connect timeout, HTTP/2 keepalive),
    // over the switchboard instead of TCP.
    let endpoint = link_config.endpoint().expect("endpoint");
    let link = CoordinatorLink::with_channel(
        coordinator.switchboard.channel_through(&endpoint),
        &link_config,
    )
    .expect("link");
    let gate = super::gate(link, clock.clone(), 11, gate);
    Harness {
        coordinator,
        gate,
        clock,
    }
}

pub(crate) fn scope() -> Scope {
    Scope::new("tenant-a", "POST /orders")
}

/// A policy: `total` end to end, `attempts` in all, `cap` per attempt, a
/// 100 ms floor, 1 s backoff base without jitter, and an optional hint cap.
pub(crate) fn policy(
    total: Duration,
    attempts: u32,
    cap: Duration,
    max_hint: Option<Duration>,
) -> IntentPolicy {
    IntentPolicy::try_new(
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
