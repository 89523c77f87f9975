//! Subcommands of the `tollgate` binary (the binary itself only dispatches).

use std::io::IsTerminal;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;

use std::time::Duration;

use anyhow::Context;
use tokio::net::TcpListener;
use tollgate_client::clock::{Clock, SystemClock};

use crate::config::Config;
use crate::store::redis::{EventRelay, RedisClock, RedisOptions, RedisStore, RedisTarget};
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
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal())
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .init();
    let config = match &args.config {
        Some(path) => {
            Config::load(path).with_context(|| format!("policy file {}", path.display()))?
        }
        None => Config::default(),
    };
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("starting the tokio runtime")?;
    runtime.block_on(async {
        let listener = TcpListener::bind(args.listen)
            .await
            .with_context(|| format!("binding {}", args.listen))?;
        if args.store == "memory" {
            server::run(listener, signal::shutdown(), config, Arc::new(SystemClock)).await?;
            return Ok(());
        }
        // Never echo the URL: it may carry a password.
        let target = RedisTarget::parse(&args.store).context("--store")?;
        let options = RedisOptions {
            prefix: args.redis_prefix.clone(),
            idle_ttl: config.limits.scope_idle_ttl,
            ..RedisOptions::default()
        };
        let store = RedisStore::connect(target.clone(), options)
            .await
            .context("connecting to the Redis store")?;
        let relay = EventRelay::new(&target, &args.redis_prefix).context("Watch relay")?;
        let (clock, calibrating): (Arc<dyn Clock>, _) = match args.time_source {
            TimeSource::Local => (Arc::new(SystemClock), None),
            TimeSource::Redis => {
                let clock = RedisClock::default();
                let client = store.clock_client().context("Redis clock")?;
                // A first measurement before serving, when Redis is up; the
                // loop below keeps it fresh (and retries if not).
                let _ =
                    tokio::time::timeout(Duration::from_secs(2), clock.calibrate(&client)).await;
                let task = clock.clone().keep_calibrated(client, CLOCK_SYNC_EVERY);
                (Arc::new(clock), Some(task))
            }
        };
        let calibrating = async move {
            match calibrating {
                Some(task) => task.await,
                None => std::future::pending().await,
            }
        };
        let serving = server::run_replica(
            listener,
            signal::shutdown(),
            config,
            clock,
            Arc::new(store),
            Some(relay),
        );
        // The calibration loop never ends; it stops with the server.
        tokio::select! {
            result = serving => result?,
            () = calibrating => {}
        }
        Ok(())
    })
}
