//! The coordinator server: Budget + Admin + `grpc.health.v1` + reflection behind
//! tower layers, run on a listener the caller binds, until a shutdown future
//! the caller chooses (mini-redis's `run(listener, shutdown)` shape, which is
//! what lets every test bind `127.0.0.1:0`): one entry point, [`run`], with
//! a [`Setup`] for everything else, and [`run_tcp`] for a bound listener.
//! Beside the services it runs the background tasks, among them the
//! [`relay`] that carries Watch changes between replicas over Redis pub/sub.
//!
//! # Shutdown
//! When `shutdown` completes the server drains: health turns NOT_SERVING,
//! Watch streams end with UNAVAILABLE, no new connection is accepted, and
//! in-flight calls finish. If they have not finished within the grace
//! period, the remaining connections are dropped and `run` returns anyway.
//!
//! # Health
//! The Budget service is SERVING only while its store is: the store's
//! `health` is checked every [`HEALTH_EVERY`], so a replica whose Redis is
//! down reports NOT_SERVING (and load balancers route around it) until it
//! reconnects by itself.
//!
//! # Transport
//! [`run_tcp`] terminates TLS itself ([`tls`]: the certificate is re-read
//! when its files change or on SIGHUP, mTLS with a client CA) and applies
//! the connection limits before a handshake ([`listen`]); it refuses to
//! serve plaintext on an address other peers can reach unless the
//! configuration allows it. Every transport gets the per-request guards
//! ([`guard`]: calls in flight for the idle timeout; [`gate`]: tokens
//! checked before a request slot is taken, slowed-down bad tokens, calls
//! without a token bounded per connection and peer, the body timeout),
//! the HTTP/2 stream and header limits, a decoding limit per service and
//! the Watch stream quota; the numbers are in
//! [`crate::config::Transport`]. The Prometheus endpoint
//! ([`metrics_http`]) is a listener of its own, accepting through [`listen`].

pub mod gate;
pub mod guard;
pub mod listen;
pub mod metrics_http;
pub mod relay;
pub mod tls;

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::TcpListener;
use tokio_stream::Stream;
use tokio_util::sync::CancellationToken;
use tollgate_proto::v1::{
    FILE_DESCRIPTOR_SET, admin_server::AdminServer, budget_server::BudgetServer,
};
use tollgate_vocab::clock::{Clock, SystemClock, to_unix_ms};
use tonic::transport::Server;
use tonic::transport::server::Connected;
use tower::ServiceBuilder;
use tower::limit::GlobalConcurrencyLimitLayer;
use tracing::{info, warn};

use crate::config::Config;
use crate::control::audit::AuditLog;
use crate::control::{Control, ControlError, Paths};
use crate::coordinator::{Coordinator, CoreParts};
use crate::events::EventHub;
use crate::policy::SharedPolicies;
use crate::service::BudgetService;
use crate::service::admin::{AdminService, MAX_TOML_BYTES};
use crate::signal::Hangups;
use crate::store::{MemoryStore, Store};
use relay::EventRelay;

/// Largest health or reflection request: a service name or a symbol.
const MAX_SMALL_MESSAGE_BYTES: usize = 16 * 1024;
/// How often token files and the TLS certificate are checked for changes.
pub const SECRETS_EVERY: Duration = Duration::from_secs(1);
/// How often idle scopes are looked for.
const SWEEP_EVERY: Duration = Duration::from_secs(30);
/// How often freezes are checked for expiry: the latency of an expiry.
const EXPIRE_EVERY: Duration = Duration::from_millis(250);

/// Everything [`run`] needs besides its connections and its shutdown. The
/// [`Default`] is what a test wants: the default config, the in-memory
/// store, the system clock, nothing kept on disk, no reload, no relay.
pub struct Setup {
    /// Limits, policies and tokens.
    pub config: Config,
    /// Scope state; `None`: the embedded in-memory store, bounded by
    /// `config.limits.max_scopes`.
    pub store: Option<Arc<dyn Store>>,
    /// The coordinator's clock (the authority for cooldowns and slots);
    /// tests inject a `ManualClock`, replicas a `RedisClock`.
    pub clock: Arc<dyn Clock>,
    /// The policy file and the state file.
    pub paths: Paths,
    /// The policy file's text as loaded, to tell later whether it changed.
    pub file_text: Option<String>,
    /// The audit file; `None` keeps the audit in memory only.
    pub audit_file: Option<std::path::PathBuf>,
    /// Poll the policy file this often (and reload on SIGHUP); `None`: never.
    pub reload_every: Option<Duration>,
    /// With a store shared by several replicas: carries Watch events
    /// between them. `None`: events stay in this process.
    pub relay: Option<EventRelay>,
    /// How often token files and the TLS certificate are re-read (they are
    /// also re-read on SIGHUP). Default [`SECRETS_EVERY`].
    pub secrets_every: Duration,
    /// A second listener serving only `grpc.health.v1`, in plaintext: for
    /// probes that cannot speak TLS (Kubernetes' gRPC probes). Health
    /// carries no token and changes nothing, so it needs no consent. Its
    /// connections are limited as [`listen::ConnLimits::probes`] says.
    pub health_listener: Option<TcpListener>,
    /// Prometheus `/metrics` on a listener of its own, served by
    /// [`run_tcp`] with the probe connection limits, over TLS when the
    /// gRPC port has it; in plaintext off loopback only with
    /// `allow_plaintext_metrics`.
    pub metrics: Option<MetricsListener>,
}

/// Where `/metrics` is served, and what from.
#[derive(Debug)]
pub struct MetricsListener {
    /// The bound listener.
    pub listener: TcpListener,
    /// The registry the OpenTelemetry Prometheus reader fills.
    pub registry: prometheus::Registry,
}

impl Default for Setup {
    fn default() -> Self {
        Setup::new(Config::default())
    }
}

impl std::fmt::Debug for Setup {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Setup")
            .field("paths", &self.paths)
            .field("reload_every", &self.reload_every)
            .field("secrets_every", &self.secrets_every)
            .finish_non_exhaustive()
    }
}

impl Setup {
    /// The defaults around `config`.
    pub fn new(config: Config) -> Self {
        Setup {
            config,
            store: None,
            clock: Arc::new(SystemClock),
            paths: Paths::default(),
            file_text: None,
            audit_file: None,
            reload_every: None,
            relay: None,
            secrets_every: SECRETS_EVERY,
            health_listener: None,
            metrics: None,
        }
    }

    /// Serves `store` instead of a fresh in-memory one.
    pub fn store(mut self, store: Arc<dyn Store>) -> Self {
        self.store = Some(store);
        self
    }

    /// Reads time from `clock`.
    pub fn clock(mut self, clock: Arc<dyn Clock>) -> Self {
        self.clock = clock;
        self
    }

    /// Relays Watch events to and from other replicas (`None`: none).
    pub fn relay(mut self, relay: Option<EventRelay>) -> Self {
        self.relay = relay;
        self
    }
}

/// How often the store's health is checked.
pub const HEALTH_EVERY: Duration = Duration::from_millis(250);

/// Why the server could not run.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    /// Reading the listener's address failed.
    #[error("listener: {0}")]
    Listener(#[from] std::io::Error),
    /// The reflection service could not be built from the descriptor sets.
    #[error("reflection: {0}")]
    Reflection(#[from] tonic_reflection::server::Error),
    /// The gRPC transport failed.
    #[error("transport: {0}")]
    Transport(#[from] tonic::transport::Error),
    /// The certificate, key or client CA could not be loaded.
    #[error("{0}")]
    Tls(#[from] tls::TlsError),
    /// Plaintext on an address other hosts can reach, without consent.
    #[error(
        "refusing to serve plaintext on {0}: tokens would cross the network in clear; \
         configure TLS (--tls-cert/--tls-key) or pass --allow-plaintext"
    )]
    Plaintext(std::net::SocketAddr),
    /// `/metrics` in plaintext on an address other hosts can reach,
    /// without consent.
    #[error(
        "refusing to serve /metrics in plaintext on {0}: it names every caller scope and route; \
         configure TLS (--tls-cert/--tls-key), listen on loopback, or pass --allow-plaintext-metrics"
    )]
    PlaintextMetrics(std::net::SocketAddr),
    /// The saved runtime state could not be restored.
    #[error("restoring runtime state: {0}")]
    Control(#[from] ControlError),
    /// The audit file could not be opened.
    #[error("audit file {path}: {source}")]
    Audit {
        /// The file.
        path: std::path::PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
}

/// [`run`] on a bound TCP listener, logging its address: TLS when the
/// configuration names a certificate (re-read every `secrets_every` and
/// on SIGHUP), the connection limits, and no plaintext off loopback
/// without `allow_plaintext`; and `/metrics` when [`Setup::metrics`] asks,
/// under the same rules (`allow_plaintext_metrics`).
pub async fn run_tcp(
    listener: TcpListener,
    shutdown: impl Future<Output = ()> + Send,
    mut setup: Setup,
) -> Result<(), ServeError> {
    let address = listener.local_addr()?;
    let transport = setup.config.transport.clone();
    let metrics = setup.metrics.take();
    if let Some(metrics) = &metrics {
        let at = metrics.listener.local_addr()?;
        if listen::needs_plaintext_consent(at)
            && transport.tls.is_none()
            && !transport.allow_plaintext_metrics
        {
            return Err(ServeError::PlaintextMetrics(at));
        }
    }
    let tls = match &transport.tls {
        Some(files) => Some(Arc::new(tls::ServerTls::load(files)?)),
        None if listen::needs_plaintext_consent(address) && !transport.allow_plaintext => {
            return Err(ServeError::Plaintext(address));
        }
        None if listen::needs_plaintext_consent(address) => {
            warn!(%address, "serving PLAINTEXT on a non-loopback address (allow_plaintext): tokens cross the network in clear");
            None
        }
        None => None,
    };
    let security = match &tls {
        Some(tls) if tls.mutual() => "mtls",
        Some(_) => "tls",
        None => "plaintext",
    };
    // `max_scopes` bounds the embedded store only; a caller that gives its
    // own store says what bounds it (`tollgate serve` does).
    let max_scopes = setup
        .store
        .is_none()
        .then_some(setup.config.limits.max_scopes);
    info!(%address, security, max_scopes, "tollgate coordinator listening");
    let every = setup.secrets_every;
    let incoming = listen::incoming(listener, listen::ConnLimits::grpc(&transport), tls.clone());
    let scraped = serve_metrics(metrics, &transport, tls.clone());
    let following = async move {
        match tls {
            Some(tls) => crate::signal::follow_files(every, || tls.reload_logged()).await,
            None => std::future::pending().await,
        }
    };
    tokio::select! {
        result = run(incoming, shutdown, setup) => result,
        // Never complete; they stop with the server.
        () = following => Ok(()),
        () = scraped => Ok(()),
    }
}

/// Serves `/metrics` as [`Setup::metrics`] says, with the probe limits and
/// `tls` if any; runs as long as it is polled.
fn serve_metrics(
    metrics: Option<MetricsListener>,
    transport: &crate::config::Transport,
    tls: Option<Arc<tls::ServerTls>>,
) -> impl Future<Output = ()> + use<> {
    let header_timeout = transport.probe_header_timeout;
    let limits = listen::ConnLimits::probes(transport);
    async move {
        if let Some(MetricsListener { listener, registry }) = metrics {
            if let Ok(address) = listener.local_addr() {
                let scheme = if tls.is_some() { "https" } else { "http" };
                info!(%address, scheme, "serving Prometheus metrics on /metrics");
            }
            let incoming = listen::incoming(listener, limits, tls);
            metrics_http::serve_incoming(
                incoming,
                registry,
                header_timeout,
                std::future::pending(),
            )
            .await;
        }
        std::future::pending().await
    }
}

/// Serves the coordinator on `incoming` until `shutdown` completes, then
/// drains. `incoming` is any stream of byte pipes: a TCP listener's (see
/// [`run_tcp`]), or the server halves of `tokio::io::duplex` pairs, which
/// lets tests run the real coordinator on paused tokio time where loopback
/// sockets would race the auto-advancing clock.
///
/// Builds the core (store, policies, hub, clock, RNG, runtime control),
/// the Budget and Admin services over it, health (following the store's)
/// and reflection behind the shared layers, and runs beside them the Watch
/// relay between replicas, the sweeper and the policy file follower.
pub async fn run<I, IO, IE>(
    incoming: I,
    shutdown: impl Future<Output = ()> + Send,
    setup: Setup,
) -> Result<(), ServeError>
where
    I: Stream<Item = Result<IO, IE>> + Send + 'static,
    IO: AsyncRead + AsyncWrite + Connected + Unpin + Send + 'static,
    IO::ConnectInfo: Clone + Send + Sync + 'static,
    IE: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    let Setup {
        config,
        store,
        clock,
        paths,
        file_text,
        audit_file,
        reload_every,
        relay,
        secrets_every,
        health_listener,
        metrics: _,
    } = setup;
    let transport = config.transport.clone();
    let limits = config.limits.clone();
    let store = store.unwrap_or_else(|| Arc::new(MemoryStore::for_config(&config)));
    let drain = CancellationToken::new();
    let (hub, relaying) = start_relay(relay, &drain);
    let runtime = RuntimeFiles {
        paths,
        file_text,
        audit_file,
    };
    let core = start_core(
        &config,
        Arc::clone(&store),
        Arc::clone(&clock),
        hub,
        runtime,
    )
    .await?;
    let (health, health_service) = tonic_health::server::health_reporter();
    health.set_serving::<BudgetServer<BudgetService>>().await;
    let routes = routes(
        &config,
        Arc::clone(&core),
        health_service.clone(),
        drain.clone(),
    )?;
    let following_tokens = follow_tokens(config.auth.clone(), secrets_every);

    let gate = gate::GateLayer::new(config.auth.clone(), &transport, config.tenant_limits());
    let health_only = serve_health_only(
        health_listener,
        &transport,
        gate.clone(),
        health_service.clone(),
        drain.clone(),
    );
    let serve = Server::builder()
        .max_concurrent_streams(transport.max_concurrent_streams)
        .http2_max_header_list_size(transport.max_header_list_size)
        // tonic's own timeout layer (it also honours the client's
        // grpc-timeout) answers with a status instead of an opaque error.
        .timeout(limits.request_timeout)
        // Shed instead of queueing once the server-wide limit is reached:
        // a retry coordinator that answers late is worse than one that says
        // RESOURCE_EXHAUSTED at once and lets the client fall back.
        .layer(
            ServiceBuilder::new()
                .layer(guard::ConnLayer)
                // Before the server-wide limit: a call without a valid token
                // is refused (and a held-back refusal held) without taking a
                // request slot; calls without a token are bounded per peer.
                .layer(gate)
                // The caller's W3C trace context parents each RPC's span.
                .layer(crate::telemetry::TraceContextLayer)
                .layer(crate::telemetry::RpcMetricsLayer::coordinator())
                .load_shed()
                .layer(GlobalConcurrencyLimitLayer::new(
                    limits.max_concurrent_requests,
                ))
                .into_inner(),
        )
        .add_routes(routes)
        .serve_with_incoming_shutdown(incoming, drain.clone().cancelled_owned());
    tokio::pin!(serve);

    warn_about_auth(&config);

    tokio::select! {
        result = &mut serve => return result.map_err(ServeError::from),
        () = shutdown => {}
        // These never complete; they stop when this select is left.
        () = sweep(Arc::clone(&store), Arc::clone(&clock), limits.scope_idle_ttl) => {}
        () = follow(Arc::clone(&core), reload_every) => {}
        // With replicas, changes made through the others. Its own branch:
        // it holds the runtime state's lock while it reads the store, so it
        // must keep being polled while `follow` waits for that lock.
        () = core.control().follow_shared() => {}
        () = watch_health(Arc::clone(&store), health.clone()) => {}
        () = relaying => {}
        () = following_tokens => {}
        () = health_only => {}
    }

    info!(grace_period = ?limits.grace_period, "draining");
    health
        .set_not_serving::<BudgetServer<BudgetService>>()
        .await;
    drain.cancel();
    match tokio::time::timeout(limits.grace_period, serve).await {
        Ok(result) => result?,
        Err(_) => warn!("grace period over; dropping the remaining connections"),
    }
    info!("stopped");
    Ok(())
}

/// The event hub, and the task relaying its events to and from other
/// replicas (with a relay; otherwise a future that never completes). The
/// relay stops with the drain, like the Watch streams it feeds.
fn start_relay(
    relay: Option<EventRelay>,
    drain: &CancellationToken,
) -> (EventHub, impl Future<Output = ()> + use<>) {
    let (hub, task) = match relay {
        Some(relay) => {
            let (hub, task) = relay.start(drain.clone());
            (hub, Some(task))
        }
        None => (EventHub::default(), None),
    };
    let relaying = async move {
        match task {
            Some(task) => task.await,
            None => std::future::pending().await,
        }
    };
    (hub, relaying)
}

/// The services behind the shared layers: Budget (with its Watch quota)
/// and Admin over `core`, `health`, and both reflection versions, each
/// with its own decoding limit.
fn routes<H: tonic_health::pb::health_server::Health>(
    config: &Config,
    core: Arc<Coordinator>,
    health: tonic_health::pb::health_server::HealthServer<H>,
    drain: CancellationToken,
) -> Result<tonic::service::Routes, ServeError> {
    let transport = &config.transport;
    let auth = Arc::new(config.auth.clone());
    let budget = BudgetService::new(
        Arc::clone(&core),
        Arc::clone(&auth),
        config.limits.watch_buffer,
        drain,
    )
    .with_watch_limits(
        transport.max_watch_streams,
        transport.max_watch_streams_per_token,
    );
    let admin = AdminService::new(core, auth);
    // Both reflection versions: grpcurl and Postman speak v1, grpcio's
    // reflection client and older tools v1alpha.
    let reflection = || {
        tonic_reflection::server::Builder::configure()
            .register_encoded_file_descriptor_set(FILE_DESCRIPTOR_SET)
            .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET)
    };
    let mut routes = tonic::service::Routes::builder();
    routes
        .add_service(health.max_decoding_message_size(MAX_SMALL_MESSAGE_BYTES))
        .add_service(
            reflection()
                .build_v1()?
                .max_decoding_message_size(MAX_SMALL_MESSAGE_BYTES),
        )
        .add_service(
            reflection()
                .build_v1alpha()?
                .max_decoding_message_size(MAX_SMALL_MESSAGE_BYTES),
        )
        .add_service(
            BudgetServer::new(budget).max_decoding_message_size(transport.max_budget_message),
        )
        // Room for a whole policy file in ApplyPolicies.
        .add_service(AdminServer::new(admin).max_decoding_message_size(MAX_TOML_BYTES + 4096));
    Ok(routes.routes())
}

/// Re-reads token files every `every` and on SIGHUP, when there are any;
/// runs as long as it is polled.
async fn follow_tokens(tokens: crate::auth::Authenticator, every: Duration) {
    if tokens.has_files() {
        crate::signal::follow_files(every, || {
            tokens.reload_files();
        })
        .await;
    }
    std::future::pending().await
}

/// Serves `health` alone on `listener` until `drain`, with the probe
/// connection limits and the gRPC port's `gate` (calls without a token
/// bounded per peer, the body timeout); runs as long as it is polled
/// (without a listener, or after an error it has logged, it waits).
fn serve_health_only<H: tonic_health::pb::health_server::Health>(
    listener: Option<TcpListener>,
    transport: &crate::config::Transport,
    gate: gate::GateLayer,
    health: tonic_health::pb::health_server::HealthServer<H>,
    drain: CancellationToken,
) -> impl Future<Output = ()> + use<H> {
    let limits = listen::ConnLimits::probes(transport);
    let streams = transport.max_concurrent_streams;
    let header_list = transport.max_header_list_size;
    async move {
        if let Some(listener) = listener {
            if let Ok(address) = listener.local_addr() {
                info!(%address, "serving grpc.health.v1 alone, in plaintext");
            }
            let incoming = listen::incoming(listener, limits, None);
            if let Err(err) = Server::builder()
                .max_concurrent_streams(streams)
                .http2_max_header_list_size(header_list)
                .layer(
                    ServiceBuilder::new()
                        .layer(guard::ConnLayer)
                        .layer(gate)
                        .into_inner(),
                )
                .add_service(health.max_decoding_message_size(MAX_SMALL_MESSAGE_BYTES))
                .serve_with_incoming_shutdown(incoming, drain.cancelled_owned())
                .await
            {
                warn!(cause = %err, "the health listener failed");
            }
        }
        std::future::pending().await
    }
}

/// Where runtime state is kept, as [`Setup`] names it.
struct RuntimeFiles {
    paths: Paths,
    file_text: Option<String>,
    audit_file: Option<std::path::PathBuf>,
}

/// The core over `store`: the policies from `config`, the runtime control
/// restored from the state file, the audit log opened.
async fn start_core(
    config: &Config,
    store: Arc<dyn Store>,
    clock: Arc<dyn Clock>,
    hub: EventHub,
    files: RuntimeFiles,
) -> Result<Arc<Coordinator>, ServeError> {
    let audit = match &files.audit_file {
        Some(path) => AuditLog::open(path).map_err(|source| ServeError::Audit {
            path: path.clone(),
            source,
        })?,
        None => AuditLog::in_memory(),
    };
    let policies = SharedPolicies::new(config.policies.clone());
    let control = Control::start(
        config.doc.clone(),
        files.file_text.as_deref(),
        policies.clone(),
        Arc::clone(&store),
        hub.clone(),
        audit,
        Arc::clone(&clock),
        files.paths,
    )
    .await?;
    Ok(Arc::new(Coordinator::new(CoreParts {
        store,
        policies,
        hub,
        clock,
        rng_seed: config.limits.rng_seed,
        control,
    })))
}

/// Says at start how open the coordinator is, so a missing token file is
/// noticed before a worker is.
fn warn_about_auth(config: &Config) {
    if config.auth.is_open() {
        warn!("no tokens configured: open dev mode, any caller may use any caller scope");
    }
    let limits = &config.limits;
    if let Some(pool) = config
        .tenant_limits()
        .oversubscribed(limits.max_scopes, limits.max_concurrent_requests)
    {
        warn!(
            pool,
            "the tokens' quotas add up to more than {pool}: a full pool may refuse a token still under its quota"
        );
    }
    if config.auth.admin_is_open() {
        warn!("no tokens configured: the Admin API answers loopback peers only");
    } else if !config.auth.has_admins() {
        warn!("no [[admin_token]] configured: the Admin API refuses every call");
    }
}

/// Lifts expired freezes, and reloads the policy file when its content
/// changes (polled every `reload_every`) or on SIGHUP; runs as long as it
/// is polled.
async fn follow(core: Arc<Coordinator>, reload_every: Option<Duration>) {
    let control = core.control();
    let mut expire = tokio::time::interval(EXPIRE_EVERY);
    expire.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut poll = tokio::time::interval(reload_every.unwrap_or(Duration::from_secs(3600)));
    poll.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut hangups = reload_every.map(|_| Hangups::listen());
    loop {
        tokio::select! {
            _ = expire.tick() => control.expire_freezes().await,
            _ = poll.tick(), if reload_every.is_some() => {
                control.reload_file(false).await;
            }
            () = async {
                match &mut hangups {
                    Some(h) => h.next().await,
                    None => std::future::pending().await,
                }
            } => {
                info!(signal = "SIGHUP", "reloading the policy file");
                control.reload_file(true).await;
            }
        }
    }
}

/// Mirrors the store's health into the Budget service's serving status;
/// runs as long as it is polled.
async fn watch_health(store: Arc<dyn Store>, health: tonic_health::server::HealthReporter) {
    let mut serving = true;
    let mut every = tokio::time::interval(HEALTH_EVERY);
    every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        every.tick().await;
        let ok = match store.health().await {
            Ok(()) => true,
            Err(err) => {
                if serving {
                    warn!(cause = %err, "store unavailable: health is NOT_SERVING");
                }
                false
            }
        };
        if ok != serving {
            serving = ok;
            if ok {
                info!("store reachable again: health is SERVING");
                health.set_serving::<BudgetServer<BudgetService>>().await;
            } else {
                health
                    .set_not_serving::<BudgetServer<BudgetService>>()
                    .await;
            }
        }
    }
}

/// Evicts idle scopes every [`SWEEP_EVERY`]; runs as long as it is polled.
async fn sweep(store: Arc<dyn Store>, clock: Arc<dyn Clock>, idle: Duration) {
    let idle_ms = i64::try_from(idle.as_millis()).unwrap_or(i64::MAX);
    let mut every = tokio::time::interval(SWEEP_EVERY);
    every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        every.tick().await;
        match store.evict_idle(to_unix_ms(clock.now()), idle_ms).await {
            Ok(0) => {}
            Ok(evicted) => info!(evicted, "evicted idle scopes"),
            Err(err) => warn!(cause = %err, "evicting idle scopes failed"),
        }
    }
}
