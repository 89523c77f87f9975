//! `tollgate proxy`: the gate for services in any language, as a sidecar.
//!
//! A service points its base URL at a local listener (`http://127.0.0.1:8081`)
//! instead of its upstream (`https://api.example.com`); every request it
//! sends becomes one intent run through the client crate's gate and
//! [`TollgateLayer`](tollgate_client::TollgateLayer) — the same rules, the
//! same code as a Rust worker's, none written twice.
//!
//! # Layout
//! - `config`: the TOML file, validated whole at start, one-line errors.
//! - `route`: route templates to the bounded set of route names scopes
//!   carry (a documented fallback per method, never a raw path).
//! - `intake`: a request's scope, deadline, priority and repetition rule
//!   from its headers and the listener's configuration (pure).
//! - `body`: the request body that can be buffered for replay, or sent
//!   once past the bound.
//! - `upstream`: the hyper client to one upstream (TLS, HTTP/2) and the
//!   request's readdressing.
//! - `listener`: the accept loop, the handler, the gate's response headers
//!   and the answers when the gate ends with no response.
//! - `probes`: `/healthz`, `/readyz` and `/metrics`, on the listener the
//!   file's `[admin]` table opens.
//! - `token`: the coordinator token file, read at start and followed.
//!
//! A request flows listener → intake → layer (gate: hold, attempts,
//! waits) → upstream, and its response back, streamed.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use tollgate_client::gate::GateConfig;
use tollgate_client::link::LinkTls;
use tollgate_client::{LinkConfig, Tollgate};

pub mod body;
pub mod config;
pub mod intake;
pub mod listener;
mod probes;
pub mod route;
pub mod token;
pub mod upstream;

pub use config::ProxyConfig;

/// What each listener logs once bound, followed by `listener=NAME
/// address=IP:PORT`: tests and operators read the bound port from it.
pub const LISTENING: &str = "tollgate proxy listening";
/// The same for the admin listener.
pub const ADMIN_LISTENING: &str = "tollgate proxy admin listening";
/// What a SIGHUP logs when there is no `coordinator.token_file` to read.
pub const NOTHING_TO_RELOAD: &str = "SIGHUP: nothing to reload without coordinator.token_file";

/// `tollgate proxy`: run the sidecar.
#[derive(Debug, clap::Args)]
pub struct ProxyArgs {
    /// The proxy's TOML file (listeners, upstreams, routes, coordinator).
    #[arg(long, env = "TOLLGATE_PROXY_CONFIG", value_name = "FILE")]
    pub config: PathBuf,
    /// Check the file and exit: 0 when it is valid.
    #[arg(long)]
    pub check: bool,
}

/// Runs the proxy until SIGINT or SIGTERM, then drains.
pub fn proxy(args: ProxyArgs) -> anyhow::Result<()> {
    let config = ProxyConfig::load(&args.config)
        .with_context(|| format!("proxy file {}", args.config.display()))?;
    if args.check {
        return Ok(());
    }
    let (runtime, telemetry) = crate::serve_command::start_runtime(
        config.admin_listen.is_some(),
        crate::telemetry::PROXY_SERVICE_NAME,
    )?;
    let registry = telemetry.registry().cloned();
    runtime.block_on(async move {
        let mut bound = Vec::with_capacity(config.listeners.len());
        for listener in &config.listeners {
            let socket = TcpListener::bind(listener.listen).await.with_context(|| {
                format!("listener {}: binding {}", listener.name, listener.listen)
            })?;
            bound.push(socket);
        }
        let admin = match config.admin_listen {
            Some(addr) => Some(
                TcpListener::bind(addr)
                    .await
                    .with_context(|| format!("admin.listen: binding {addr}"))?,
            ),
            None => None,
        };
        run(
            Setup {
                config,
                listeners: bound,
                admin,
                registry,
            },
            crate::signal::shutdown(),
        )
        .await
    })?;
    drop(telemetry);
    Ok(())
}

/// Everything [`run`] needs, bound already (tests bind port 0).
#[derive(Debug)]
pub struct Setup {
    /// The validated file.
    pub config: ProxyConfig,
    /// One bound socket per `config.listeners`, in order.
    pub listeners: Vec<TcpListener>,
    /// The admin socket, if any.
    pub admin: Option<TcpListener>,
    /// Where `/metrics` reads from.
    pub registry: Option<prometheus::Registry>,
}

/// Serves every listener until `shutdown`, then drains: listeners stop
/// accepting, `/readyz` turns 503, requests in flight get the configured
/// grace, and the gate's last reports are sent.
pub async fn run(
    setup: Setup,
    shutdown: impl std::future::Future<Output = ()>,
) -> anyhow::Result<()> {
    let Setup {
        config,
        listeners,
        admin,
        registry,
    } = setup;
    let (tollgate, token) = connect(&config).context("coordinator")?;
    let drain = CancellationToken::new();
    let mut tasks = tokio::task::JoinSet::new();
    for (listener_config, socket) in config.listeners.iter().zip(listeners) {
        let addr: SocketAddr = socket.local_addr().context("a bound listener's address")?;
        let name = listener_config.name.clone();
        let upstream = listener_config.upstream.to_string();
        let listener = listener::Listener::new(listener_config.clone(), tollgate.clone())
            .with_context(|| format!("listener {name}"))?;
        tracing::info!(listener = %name, %upstream, address = %addr, "{LISTENING}");
        tasks.spawn(Arc::new(listener).serve(socket, drain.clone(), config.drain));
    }
    let stop_admin = CancellationToken::new();
    let admin = match admin {
        Some(socket) => {
            let addr = socket
                .local_addr()
                .context("the admin listener's address")?;
            tracing::info!(address = %addr, "{ADMIN_LISTENING}");
            Some(tokio::spawn(probes::serve(
                socket,
                tollgate.clone(),
                registry,
                drain.clone(),
                stop_admin.clone(),
            )))
        }
        None => None,
    };
    // Followed while the proxy serves; a drain needs no new token.
    let follow_token = async {
        match (&config.coordinator.token_file, token) {
            (Some(path), Some(current)) => {
                token::follow(
                    path.clone(),
                    tollgate.gate().cache().link().clone(),
                    current,
                )
                .await;
            }
            // SIGHUP's default action ends a process: an operator's
            // "reload" must not stop a proxy that has nothing to reload.
            _ => {
                let mut hangups = crate::signal::Hangups::listen();
                loop {
                    hangups.next().await;
                    tracing::info!("{NOTHING_TO_RELOAD}");
                }
            }
        }
    };
    tokio::select! {
        () = shutdown => {}
        () = follow_token => {}
    }
    tracing::info!(grace = ?config.drain, "draining");
    drain.cancel();
    while tasks.join_next().await.is_some() {}
    stop_admin.cancel();
    if let Some(admin) = admin {
        let _ = admin.await;
    }
    // Bounded: a coordinator that does not answer must not hold the exit.
    let _ = tokio::time::timeout(Duration::from_secs(2), tollgate.flush()).await;
    tracing::info!("drained");
    Ok(())
}

/// The gate every listener shares: one worker, one lease cache, one
/// capacity; and the token it was built with, to follow.
fn connect(config: &ProxyConfig) -> anyhow::Result<(Tollgate, Option<String>)> {
    let c = &config.coordinator;
    let mut link = LinkConfig::new(c.endpoint.clone(), c.worker_id.clone());
    link.rpc_timeout = c.rpc_timeout;
    if let Some(path) = &c.token_file {
        link.bearer_token = Some(token::read(path)?);
    }
    if let Some(ca) = &c.ca_file {
        link.tls = Some(LinkTls::from_files(Some(ca), None, None).context("coordinator.ca_file")?);
    }
    let gate = GateConfig {
        max_in_flight: config.max_in_flight,
        ..GateConfig::default()
    };
    let token = link.bearer_token.clone();
    let tollgate = Tollgate::connect(c.endpoint.clone(), c.worker_id.clone())
        .link_config(link)
        .gate_config(gate)
        .build()
        .context("building the gate")?;
    Ok((tollgate, token))
}
