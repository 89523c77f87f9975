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
    /// Serve Prometheus metrics on `http://ADDR/metrics` (off by default).
    /// Traces and OTLP metrics follow the standard `OTEL_*` variables.
    #[arg(long, env = "TOLLGATE_METRICS_LISTEN", value_name = "ADDR")]
    pub metrics_listen: Option<SocketAddr>,
}

/// Runs the coordinator until SIGINT or SIGTERM.
pub fn serve(args: ServeArgs) -> anyhow::Result<()> {
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
    // Logs, spans and metrics; declared after the runtime so it is dropped
    // (flushing) while the runtime still runs.
    let telemetry = {
        let _runtime = runtime.enter();
        telemetry::init(&TelemetryConfig::from_env(args.metrics_listen.is_some()))
            .context("starting telemetry")?
    };
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
        server::run(listener, signal::shutdown(), config, Arc::new(SystemClock)).await?;
        Ok(())
    })
}
