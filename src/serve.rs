//! `tollgate serve`: runs the coordinator from its command-line flags.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;

use std::time::Duration;

use anyhow::Context;
use tokio::net::TcpListener;
use tollgate_client::clock::{Clock, SystemClock};

use crate::config::Config;
use crate::store::redis::{EventRelay, RedisClock, RedisOptions, RedisStore, RedisTarget};
use crate::store::{MemoryStore, Store};
use crate::telemetry::{self, TelemetryConfig, metrics_http};
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
    /// Where runtime changes (Admin API) are kept across restarts. Default:
    /// `<config>.state.json` beside the policy file; without a policy file
    /// and without this flag, runtime changes last until the process ends.
    #[arg(long, value_name = "FILE")]
    pub state: Option<PathBuf>,
    /// The audit log (JSON lines, rotated at 4 MiB). Default:
    /// `<config>.audit.jsonl` beside the policy file.
    #[arg(long, value_name = "FILE")]
    pub audit_log: Option<PathBuf>,
    /// How often the policy file is checked for changes (it is also
    /// reloaded on SIGHUP).
    #[arg(long, default_value = "1s", value_parser = humantime::parse_duration)]
    pub reload_interval: std::time::Duration,
    /// Serve Prometheus metrics on `http://ADDR/metrics` (off by default).
    /// Traces and OTLP metrics follow the standard `OTEL_*` variables.
    #[arg(long, env = "TOLLGATE_METRICS_LISTEN", value_name = "ADDR")]
    pub metrics_listen: Option<SocketAddr>,
    /// Where scope state lives: `memory` (one coordinator), or
    /// `redis://HOST:PORT[/DB]` / `redis+cluster://HOST:PORT[,HOST:PORT…]`
    /// shared by stateless replicas. Read from the environment so a
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

/// Runs the coordinator until SIGINT or SIGTERM.
pub fn serve(args: ServeArgs) -> anyhow::Result<()> {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("starting the tokio runtime")?;
    // Logs, spans and metrics, first so that nothing below logs into the
    // void; declared after the runtime so it is dropped (flushing) while the
    // runtime still runs.
    let telemetry = {
        let _runtime = runtime.enter();
        telemetry::init(&TelemetryConfig::from_env(args.metrics_listen.is_some()))
            .context("starting telemetry")?
    };
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
    let kept = server::Setup {
        paths: crate::admin::Paths {
            policy_file: args.config.clone(),
            state_file: args
                .state
                .clone()
                .or_else(|| args.config.as_deref().map(|c| beside(c, ".state.json"))),
        },
        file_text,
        audit_file: args
            .audit_log
            .clone()
            .or_else(|| args.config.as_deref().map(|c| beside(c, ".audit.jsonl"))),
        reload_every: args.config.is_some().then_some(
            args.reload_interval
                .max(std::time::Duration::from_millis(50)),
        ),
        ..server::Setup::new(config)
    };
    if kept.paths.state_file.is_none() {
        tracing::warn!(
            "no policy file and no --state: runtime changes last only until the process ends"
        );
    }
    runtime.block_on(async {
        let metrics_stop = tokio_util::sync::CancellationToken::new();
        if let (Some(addr), Some(registry)) = (args.metrics_listen, telemetry.registry()) {
            let listener = TcpListener::bind(addr)
                .await
                .with_context(|| format!("binding metrics listener {addr}"))?;
            tracing::info!(%addr, "serving Prometheus metrics on /metrics");
            let stop = metrics_stop.clone().cancelled_owned();
            tokio::spawn(metrics_http::serve(listener, registry.clone(), stop));
        }
        let _stop_metrics = metrics_stop.drop_guard();
        let listener = TcpListener::bind(args.listen)
            .await
            .with_context(|| format!("binding {}", args.listen))?;
        let mut kept = kept;
        let (store, clock, calibrating): (Arc<dyn Store>, Arc<dyn Clock>, _) = if args.store
            == "memory"
        {
            let store = Arc::new(MemoryStore::new(kept.config.limits.max_scopes));
            (store, Arc::new(SystemClock), None)
        } else {
            // Never echo the URL: it may carry a password.
            let target = RedisTarget::parse(&args.store).context("--store")?;
            let options = RedisOptions {
                prefix: args.redis_prefix.clone(),
                idle_ttl: kept.config.limits.scope_idle_ttl,
                ..RedisOptions::default()
            };
            let store = RedisStore::connect(target.clone(), options)
                .await
                .context("connecting to the Redis store")?;
            kept.relay = Some(EventRelay::new(&target, &args.redis_prefix).context("Watch relay")?);
            match args.time_source {
                TimeSource::Local => (Arc::new(store), Arc::new(SystemClock), None),
                TimeSource::Redis => {
                    let clock = RedisClock::default();
                    let client = store.clock_client().context("Redis clock")?;
                    // A first measurement before serving, when Redis is
                    // up; the loop below keeps it fresh (and retries if
                    // not).
                    let _ = tokio::time::timeout(Duration::from_secs(2), clock.calibrate(&client))
                        .await;
                    let task = clock.clone().keep_calibrated(client, CLOCK_SYNC_EVERY);
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
            result = serving => result?,
            () = calibrating => {}
        }
        Ok(())
    })
}
