//! Subcommands of the `tollgate` binary (the binary itself only dispatches).

use std::io::IsTerminal;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;

use anyhow::Context;
use tokio::net::TcpListener;
use tollgate_client::clock::SystemClock;

use crate::config::Config;
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
}

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
        server::run(listener, signal::shutdown(), config, Arc::new(SystemClock)).await?;
        Ok(())
    })
}
