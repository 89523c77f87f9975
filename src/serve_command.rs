//! `tollgate serve`: runs the coordinator from its command-line flags.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;

use std::time::Duration;

use anyhow::Context;
use tokio::net::TcpListener;
use tollgate_vocab::clock::{Clock, SystemClock};

use crate::config::Config;
use crate::server::relay::EventRelay;
use crate::store::redis::{RedisClock, RedisOptions, RedisStore, RedisTarget};
use crate::store::{MemoryStore, Store, StoreError};
use crate::telemetry::{self, TelemetryConfig};
use crate::{server, signal};

/// `tollgate serve`: run the coordinator.
#[derive(Debug, clap::Args)]
pub struct ServeArgs {
    /// Address to listen on.
    #[arg(long, env = "TOLLGATE_LISTEN", default_value = "127.0.0.1:50051")]
    pub listen: SocketAddr,
    /// TOML policy file (rules, tokens, server limits); without one the
    /// documented defaults apply, in open dev mode.
    #[arg(long)]
    pub config: Option<PathBuf>,
    /// Where runtime changes (Admin API) are kept across restarts, with the
    /// memory store. Default: `<config>.state.json` beside the policy file;
    /// without a policy file and without this flag, runtime changes last
    /// until the process ends. With a Redis store they live in Redis,
    /// shared by the replicas, and this file is not used.
    #[arg(long, value_name = "FILE")]
    pub state: Option<PathBuf>,
    /// The audit log (JSON lines, rotated at 4 MiB). Default with the
    /// memory store: `<config>.audit.jsonl` beside the policy file. With a
    /// Redis store the audit lives in Redis (bounded, newest first) and no
    /// file is written unless this flag asks for a local copy.
    #[arg(long, value_name = "FILE")]
    pub audit_log: Option<PathBuf>,
    /// How often the policy file is checked for changes (it is also
    /// reloaded on SIGHUP).
    #[arg(long, default_value = "1s", value_parser = humantime::parse_duration)]
    pub reload_interval: std::time::Duration,
    /// Serve Prometheus metrics on `http://ADDR/metrics` (off by default;
    /// `https://` when TLS is configured). Off loopback without TLS it
    /// needs --allow-plaintext-metrics: the page names every caller scope
    /// and route. Traces and OTLP metrics follow the standard `OTEL_*`
    /// variables.
    #[arg(long, env = "TOLLGATE_METRICS_LISTEN", value_name = "ADDR")]
    pub metrics_listen: Option<SocketAddr>,
    /// Where scope state lives: `memory` (one coordinator), or
    /// `redis://HOST:PORT[/DB]` / `redis+cluster://HOST:PORT[,HOST:PORT…]` /
    /// `redis+sentinel://HOST:PORT[,HOST:PORT…]/SERVICE` (a primary that
    /// Sentinels fail over) shared by stateless replicas. Read from the environment so a
    /// password in the URL stays off the command line.
    #[arg(
        long,
        env = "TOLLGATE_STORE",
        default_value = "memory",
        hide_env_values = true
    )]
    pub store: String,
    /// Prefix of every Redis key and of the Watch channel.
    #[arg(long, default_value = "tollgate")]
    pub redis_prefix: String,
    /// With a Redis store: `redis` follows the Redis server's TIME (so
    /// replicas with skewed clocks agree), `local` trusts this host's clock.
    #[arg(long, value_enum, default_value_t = TimeSource::Redis)]
    pub time_source: TimeSource,
    /// Serve TLS with this PEM certificate chain (and --tls-key); the files
    /// are re-read when they change and on SIGHUP. Overrides `[server]
    /// tls_cert`.
    #[arg(
        long,
        env = "TOLLGATE_TLS_CERT",
        value_name = "FILE",
        requires = "tls_key"
    )]
    pub tls_cert: Option<PathBuf>,
    /// The certificate's PEM private key.
    #[arg(
        long,
        env = "TOLLGATE_TLS_KEY",
        value_name = "FILE",
        requires = "tls_cert"
    )]
    pub tls_key: Option<PathBuf>,
    /// Require client certificates signed by this PEM CA (mTLS); bearer
    /// tokens still apply.
    #[arg(long, env = "TOLLGATE_CLIENT_CA", value_name = "FILE")]
    pub client_ca: Option<PathBuf>,
    /// Serve plaintext on a non-loopback address. Without TLS and without
    /// this flag, only loopback addresses are served: tokens would
    /// otherwise cross the network in clear.
    #[arg(long, env = "TOLLGATE_ALLOW_PLAINTEXT")]
    pub allow_plaintext: bool,
    /// Serve `/metrics` in plaintext on a non-loopback --metrics-listen
    /// address. Restrict who can reach that port (a network policy): the
    /// page names every caller scope and route and needs no token.
    #[arg(long, env = "TOLLGATE_ALLOW_PLAINTEXT_METRICS")]
    pub allow_plaintext_metrics: bool,
    /// Also serve `grpc.health.v1` alone, in plaintext, on this address:
    /// for probes that cannot speak TLS (Kubernetes gRPC probes).
    #[arg(long, env = "TOLLGATE_HEALTH_LISTEN", value_name = "ADDR")]
    pub health_listen: Option<SocketAddr>,
}

impl ServeArgs {
    /// The transport flags over the policy file's `[server]` keys.
    fn apply_transport(&self, transport: &mut crate::config::Transport) -> anyhow::Result<()> {
        if let (Some(cert), Some(key)) = (&self.tls_cert, &self.tls_key) {
            transport.tls = Some(crate::config::TlsFiles {
                cert: cert.clone(),
                key: key.clone(),
                client_ca: transport.tls.as_ref().and_then(|t| t.client_ca.clone()),
            });
        }
        if let Some(ca) = &self.client_ca {
            match &mut transport.tls {
                Some(tls) => tls.client_ca = Some(ca.clone()),
                None => anyhow::bail!("--client-ca needs TLS (--tls-cert and --tls-key)"),
            }
        }
        transport.allow_plaintext |= self.allow_plaintext;
        transport.allow_plaintext_metrics |= self.allow_plaintext_metrics;
        Ok(())
    }
}

/// `<config><suffix>`: where the state file and audit log go by default.
fn beside(config: &std::path::Path, suffix: &str) -> PathBuf {
    let mut name = config.as_os_str().to_owned();
    name.push(suffix);
    PathBuf::from(name)
}

/// Which clock a replica of a shared store reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum TimeSource {
    /// The Redis server's `TIME`, through a measured offset.
    Redis,
    /// This host's wall clock (keep replicas on NTP).
    Local,
}

/// How often a replica re-measures its offset to Redis's clock.
const CLOCK_SYNC_EVERY: Duration = Duration::from_secs(30);

/// The runtime a long-running subcommand (`serve`, `proxy`) runs on, and
/// telemetry started inside it (its exporters spawn onto it); `metrics`:
/// a Prometheus registry is wanted; `service`: the service name unless
/// `OTEL_SERVICE_NAME` gives one. Bind them in this order, `let
/// (runtime, telemetry) = …`: the telemetry is then dropped (flushing)
/// while the runtime still runs.
pub(crate) fn start_runtime(
    metrics: bool,
    service: &str,
) -> anyhow::Result<(tokio::runtime::Runtime, telemetry::Telemetry)> {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("starting the tokio runtime")?;
    let telemetry = {
        let _runtime = runtime.enter();
        telemetry::init(&TelemetryConfig::from_env(metrics, service))
            .context("starting telemetry")?
    };
    Ok((runtime, telemetry))
}

/// Runs the coordinator until SIGINT or SIGTERM.
pub fn serve(args: ServeArgs) -> anyhow::Result<()> {
    // Logs, spans and metrics, first so that nothing below logs into the
    // void.
    let (runtime, telemetry) = start_runtime(
        args.metrics_listen.is_some(),
        telemetry::DEFAULT_SERVICE_NAME,
    )?;
    let (config, file_text) = match &args.config {
        Some(path) => {
            let text = std::fs::read_to_string(path)
                .with_context(|| format!("reading policy file {}", path.display()))?;
            let config = Config::from_toml(&text, |name| std::env::var(name).ok())
                .with_context(|| format!("policy file {}", path.display()))?;
            (config, Some(text))
        }
        None => (Config::default(), None),
    };
    let mut config = config;
    args.apply_transport(&mut config.transport)?;
    // With a shared store the runtime state and the audit live in it, so a
    // replica needs no writable file (a read-only root and config mount).
    let local = args.store == "memory";
    let kept = server::Setup {
        paths: crate::control::Paths {
            policy_file: args.config.clone(),
            state_file: args.state.clone().or_else(|| {
                let config = args.config.as_deref().filter(|_| local)?;
                Some(beside(config, ".state.json"))
            }),
        },
        file_text,
        audit_file: args.audit_log.clone().or_else(|| {
            let config = args.config.as_deref().filter(|_| local)?;
            Some(beside(config, ".audit.jsonl"))
        }),
        reload_every: args.config.is_some().then_some(
            args.reload_interval
                .max(std::time::Duration::from_millis(50)),
        ),
        ..server::Setup::new(config)
    };
    if kept.paths.state_file.is_none() && local {
        tracing::warn!(
            "no policy file and no --state: runtime changes last only until the process ends"
        );
    }
    runtime.block_on(async {
        let mut kept = kept;
        if let (Some(addr), Some(registry)) = (args.metrics_listen, telemetry.registry()) {
            let listener = TcpListener::bind(addr)
                .await
                .with_context(|| format!("binding metrics listener {addr}"))?;
            kept.metrics = Some(server::MetricsListener {
                listener,
                registry: registry.clone(),
            });
        }
        let listener = TcpListener::bind(args.listen)
            .await
            .with_context(|| format!("binding {}", args.listen))?;
        if let Some(addr) = args.health_listen {
            kept.health_listener = Some(
                TcpListener::bind(addr)
                    .await
                    .with_context(|| format!("binding health listener {addr}"))?,
            );
        }
        let (store, clock, calibrating): (Arc<dyn Store>, Arc<dyn Clock>, _) = if args.store
            == "memory"
        {
            let max_scopes = kept.config.limits.max_scopes;
            tracing::info!(max_scopes, "scope state in memory");
            let store = Arc::new(MemoryStore::for_config(&kept.config));
            (store, Arc::new(SystemClock), None)
        } else {
            // Never echo the URL: it may carry a password.
            let target = RedisTarget::parse(&args.store).context("--store")?;
            let options = RedisOptions {
                prefix: args.redis_prefix.clone(),
                idle_ttl: kept.config.limits.scope_idle_ttl,
                tenants: kept.config.tenant_limits(),
                ..RedisOptions::default()
            };
            let store = RedisStore::connect(target.clone(), options)
                .await
                .context("connecting to the Redis store")?;
            // State another build wrote is refused before serving; a Redis
            // that cannot be asked now is checked once it answers (health).
            match tokio::time::timeout(Duration::from_secs(2), store.claim_format()).await {
                Ok(Err(StoreError::Unavailable(reason))) if store.refusal().is_some() => {
                    anyhow::bail!("{reason}")
                }
                Ok(Err(err)) => tracing::warn!(error = %err, "redis store format not checked yet"),
                Err(_) => {
                    tracing::warn!("redis store format not checked yet: redis did not answer")
                }
                Ok(Ok(())) => {}
            }
            // `max_scopes` bounds the in-memory store as a whole; on Redis
            // it sizes each token's quota, and the table is what Redis's
            // memory holds.
            tracing::info!(prefix = %args.redis_prefix, "scope state in Redis");
            kept.relay = Some(EventRelay::new(&target, &args.redis_prefix).context("Watch relay")?);
            match args.time_source {
                TimeSource::Local => (Arc::new(store), Arc::new(SystemClock), None),
                TimeSource::Redis => {
                    let clock = RedisClock::default();
                    // A first measurement before serving, when Redis is
                    // up; the loop below keeps it fresh (and retries if
                    // not), following the primary through a failover.
                    let _ = tokio::time::timeout(
                        Duration::from_secs(2),
                        clock.calibrate_primary(&target),
                    )
                    .await;
                    let task = clock.clone().keep_calibrated(target, CLOCK_SYNC_EVERY);
                    (Arc::new(store), Arc::new(clock), Some(task))
                }
            }
        };
        let calibrating = async move {
            match calibrating {
                Some(task) => task.await,
                None => std::future::pending().await,
            }
        };
        let serving = server::run_tcp(listener, signal::shutdown(), kept.store(store).clock(clock));
        // The calibration loop never ends; it stops with the server.
        tokio::select! {
            result = serving => result.map_err(with_hint)?,
            () = calibrating => {}
        }
        Ok(())
    })
}

/// A start-up error in one line, naming the flag that moves a file the
/// process could not write (a read-only mount is the usual cause).
fn with_hint(err: server::ServeError) -> anyhow::Error {
    use crate::control::{ControlError, persist::PersistError};
    let hint = match &err {
        server::ServeError::Audit { .. } => {
            " (--audit-log moves it; with a Redis store no audit file is needed)"
        }
        server::ServeError::Control(ControlError::Persist(PersistError::Io { .. })) => {
            " (--state moves it; with a Redis store no state file is needed)"
        }
        _ => "",
    };
    anyhow::anyhow!("{err}{hint}")
}
