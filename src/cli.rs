//! Subcommands of the `tollgate` binary (the binary itself only dispatches).

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;

use anyhow::Context;
use tokio::net::TcpListener;
use tollgate_client::clock::SystemClock;

use crate::config::Config;
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
}

/// `<config><suffix>`: where the state file and audit log go by default.
fn beside(config: &std::path::Path, suffix: &str) -> PathBuf {
    let mut name = config.as_os_str().to_owned();
    name.push(suffix);
    PathBuf::from(name)
}

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
    let kept = server::Runtime {
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
        let store = Arc::new(crate::store::MemoryStore::new(config.limits.max_scopes));
        server::run_with(
            listener,
            signal::shutdown(),
            config,
            Arc::new(SystemClock),
            store,
            kept,
        )
        .await?;
        Ok(())
    })
}
