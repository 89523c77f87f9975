//! The coordinator server: Budget + `grpc.health.v1` + reflection behind
//! tower layers, run on a listener the caller binds, until a shutdown future
//! the caller chooses (mini-redis's `run(listener, shutdown)` shape, which is
//! what lets every test bind `127.0.0.1:0`).
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

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use tokio::net::TcpListener;
use tokio_stream::wrappers::TcpListenerStream;
use tokio_util::sync::CancellationToken;
use tollgate_client::clock::{Clock, to_unix_ms};
use tollgate_proto::v1::{FILE_DESCRIPTOR_SET, budget_server::BudgetServer};
use tonic::transport::Server;
use tower::ServiceBuilder;
use tower::limit::GlobalConcurrencyLimitLayer;
use tracing::{info, warn};

use crate::config::Config;
use crate::service::BudgetService;
use crate::service::watch::EventHub;
use crate::store::redis::EventRelay;
use crate::store::{MemoryStore, Store};

/// Largest request accepted: the biggest valid message (64 evidence items
/// with bounded strings) fits well inside it.
const MAX_MESSAGE_BYTES: usize = 64 * 1024;
/// How often idle scopes are looked for.
const SWEEP_EVERY: Duration = Duration::from_secs(30);
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
}

/// Serves on `listener` with the embedded in-memory store until `shutdown`.
pub async fn run(
    listener: TcpListener,
    shutdown: impl Future<Output = ()> + Send,
    config: Config,
    clock: Arc<dyn Clock>,
) -> Result<(), ServeError> {
    let store = Arc::new(MemoryStore::new(config.limits.max_scopes));
    run_with_store(listener, shutdown, config, clock, store).await
}

/// [`run`] over a given store (another backend, or a test double).
pub async fn run_with_store(
    listener: TcpListener,
    shutdown: impl Future<Output = ()> + Send,
    config: Config,
    clock: Arc<dyn Clock>,
    store: Arc<dyn Store>,
) -> Result<(), ServeError> {
    run_replica(listener, shutdown, config, clock, store, None).await
}

/// [`run_with_store`] as one of several replicas sharing a store: Watch
/// events travel between replicas through `relay`.
pub async fn run_replica(
    listener: TcpListener,
    shutdown: impl Future<Output = ()> + Send,
    config: Config,
    clock: Arc<dyn Clock>,
    store: Arc<dyn Store>,
    relay: Option<EventRelay>,
) -> Result<(), ServeError> {
    let address = listener.local_addr()?;
    let limits = config.limits.clone();
    let drain = CancellationToken::new();
    // The relay stops with the drain, like the Watch streams it feeds.
    let (hub, relaying) = match relay {
        Some(relay) => {
            let (hub, task) = relay.start(drain.clone());
            (hub, Some(task))
        }
        None => (EventHub::default(), None),
    };
    let relaying = async move {
        match relaying {
            Some(task) => task.await,
            None => std::future::pending().await,
        }
    };
    let budget = BudgetService::with_hub(
        Arc::clone(&store),
        &config,
        Arc::clone(&clock),
        drain.clone(),
        hub,
    );

    let (health, health_service) = tonic_health::server::health_reporter();
    health.set_serving::<BudgetServer<BudgetService>>().await;
    let reflection = tonic_reflection::server::Builder::configure()
        .register_encoded_file_descriptor_set(FILE_DESCRIPTOR_SET)
        .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET)
        .build_v1()?;

    let serve = Server::builder()
        // tonic's own timeout layer (it also honours the client's
        // grpc-timeout) answers with a status instead of an opaque error.
        .timeout(limits.request_timeout)
        // Shed instead of queueing once the server-wide limit is reached:
        // a retry coordinator that answers late is worse than one that says
        // RESOURCE_EXHAUSTED at once and lets the client fall back.
        .layer(
            ServiceBuilder::new()
                .load_shed()
                .layer(GlobalConcurrencyLimitLayer::new(
                    limits.max_concurrent_requests,
                ))
                .into_inner(),
        )
        .add_service(health_service)
        .add_service(reflection)
        .add_service(BudgetServer::new(budget).max_decoding_message_size(MAX_MESSAGE_BYTES))
        .serve_with_incoming_shutdown(
            TcpListenerStream::new(listener),
            drain.clone().cancelled_owned(),
        );
    tokio::pin!(serve);

    if config.auth.is_open() {
        warn!(%address, "no tokens configured: open dev mode, any caller may use any caller scope");
    }
    info!(%address, max_scopes = limits.max_scopes, "tollgate coordinator listening");

    tokio::select! {
        result = &mut serve => return result.map_err(ServeError::from),
        () = shutdown => {}
        // These never complete; they stop when this select is left.
        () = sweep(Arc::clone(&store), Arc::clone(&clock), limits.scope_idle_ttl) => {}
        () = watch_health(Arc::clone(&store), health.clone()) => {}
        () = relaying => {}
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
