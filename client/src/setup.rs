//! One-line setup: [`Tollgate::connect`] wires a [`CoordinatorLink`], a
//! [`LeaseCache`] and a [`Gate`] with defaults that suit a worker, and hands
//! back a [`Tollgate`] that gives the gate and, in one call each, a
//! [`TollgateLayer`] for an HTTP client or a tonic channel.
//!
//! Every part stays reachable for the cases the defaults do not cover: the
//! builder takes a clock, a whole [`LinkConfig`], [`LeaseCacheConfig`] or
//! [`GateConfig`], or a ready-made channel (TLS, a custom connector, an
//! in-memory transport).

use std::sync::Arc;
use std::time::Duration;

use http::request::Parts;
use tonic::transport::Channel;

use crate::clock::{Clock, SystemClock};
use crate::engine::IntentPolicy;
use crate::gate::{Gate, GateConfig};
use crate::layer::{LayerConfig, TollgateLayer};
use crate::lease::{LeaseCache, LeaseCacheConfig};
use crate::link::{CoordinatorLink, LinkConfig, LinkConfigError, LinkState};
use crate::scope::Scope;

/// A worker's connection to the fleet's retry budget: the [`Gate`] that runs
/// intents, and layers for HTTP and tonic clients. Cheap to clone; clones
/// share the gate, its leases and its capacity.
#[derive(Debug, Clone)]
pub struct Tollgate {
    gate: Gate,
}

/// Why [`TollgateBuilder::build`] failed.
#[derive(Debug, thiserror::Error)]
pub enum SetupError {
    /// The endpoint or the bearer token cannot be used.
    #[error(transparent)]
    Link(#[from] LinkConfigError),
    /// The lease cache runs a background task, so it needs a tokio runtime.
    #[error("Tollgate must be built inside a tokio runtime")]
    NoRuntime,
}

impl Tollgate {
    /// Starts configuring a worker that talks to the coordinator at
    /// `endpoint` (`http://host:port`) as `worker_id`. Nothing connects
    /// until the first RPC, so a worker starts even when the coordinator is
    /// down; it then runs on a conservative local budget, visibly.
    pub fn connect(endpoint: impl Into<String>, worker_id: impl Into<String>) -> TollgateBuilder {
        TollgateBuilder {
            link: LinkConfig::new(endpoint, worker_id),
            lease: LeaseCacheConfig::default(),
            gate: GateConfig::default(),
            clock: None,
            channel: None,
        }
    }

    /// The gate, for [`Gate::run`].
    pub fn gate(&self) -> &Gate {
        &self.gate
    }

    /// A tower layer that runs every request of a wrapped HTTP or tonic
    /// client through this gate, as `config` says.
    pub fn layer(&self, config: LayerConfig) -> TollgateLayer {
        TollgateLayer::new(self.gate.clone(), config)
    }

    /// A tower layer for an HTTP client, every request an intent under
    /// `policy` ([`LayerConfig::http`]): classified by status and
    /// `Retry-After`; the idempotent methods are safe to repeat, any other
    /// only with an `Idempotency-Key` header. `scope` names a request's
    /// scope from a route template, never the raw path with its ids.
    ///
    /// ```no_run
    /// # use std::time::Duration;
    /// # use tollgate_client::{IntentPolicy, Scope, Tollgate};
    /// # fn wrap(tollgate: &Tollgate) -> Result<(), tollgate_client::PolicyError> {
    /// let policy = IntentPolicy::builder(Duration::from_secs(30)).build()?;
    /// let layer = tollgate.http_layer(policy, |parts| {
    ///     Scope::new("tenant-a", format!("{} /orders/{{id}}", parts.method))
    /// });
    /// # Ok(())
    /// # }
    /// ```
    pub fn http_layer(
        &self,
        policy: IntentPolicy,
        scope: impl Fn(&Parts) -> Scope + Send + Sync + 'static,
    ) -> TollgateLayer {
        self.layer(LayerConfig::http(policy, scope))
    }

    /// A tower layer for a tonic channel, every call an intent under
    /// `policy` ([`LayerConfig::grpc`]): classified by `grpc-status` and
    /// `grpc-retry-pushback-ms`. The layer cannot know which calls are
    /// idempotent, and it buffers a tonic body for replay only for a call
    /// that may be repeated, so a call gets one attempt unless it carries an
    /// `idempotency-key` header; to declare (unary) methods safe to repeat,
    /// use [`layer`](Self::layer) with [`LayerConfig::repetition`]. `scope`
    /// usually maps the method path (`/pkg.Service/Method`) to a scope.
    pub fn grpc_layer(
        &self,
        policy: IntentPolicy,
        scope: impl Fn(&Parts) -> Scope + Send + Sync + 'static,
    ) -> TollgateLayer {
        self.layer(LayerConfig::grpc(policy, scope))
    }

    /// Whether the coordinator is usable right now.
    pub fn link_state(&self) -> LinkState {
        self.gate.link_state()
    }

    /// Sends every pending report now, before a planned shutdown.
    pub async fn flush(&self) {
        self.gate.cache().flush().await;
    }
}

impl From<Tollgate> for Gate {
    fn from(tollgate: Tollgate) -> Gate {
        tollgate.gate
    }
}

/// Configures a [`Tollgate`]; every setting has a default.
pub struct TollgateBuilder {
    link: LinkConfig,
    lease: LeaseCacheConfig,
    gate: GateConfig,
    /// `None` is the system clock; tests pass a manual or tokio clock so
    /// HTTP-date hints and lease expiry follow virtual time.
    clock: Option<Arc<dyn Clock>>,
    /// A caller-built channel replaces the lazy one built from `link`.
    channel: Option<Channel>,
}

impl std::fmt::Debug for TollgateBuilder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The clock and channel are trait objects without Debug.
        f.debug_struct("TollgateBuilder")
            .field("link", &self.link)
            .field("lease", &self.lease)
            .field("gate", &self.gate)
            .field("custom_clock", &self.clock.is_some())
            .field("custom_channel", &self.channel.is_some())
            .finish_non_exhaustive()
    }
}

impl TollgateBuilder {
    /// Sends `Authorization: Bearer <token>` with every coordinator RPC.
    pub fn bearer_token(mut self, token: impl Into<String>) -> Self {
        self.link.bearer_token = Some(token.into());
        self
    }

    /// Bounds every coordinator RPC (default
    /// [`DEFAULT_RPC_TIMEOUT`](crate::link::DEFAULT_RPC_TIMEOUT)).
    pub fn rpc_timeout(mut self, timeout: Duration) -> Self {
        self.link.rpc_timeout = timeout;
        self
    }

    /// Replaces the whole link configuration (endpoint and worker id
    /// included).
    pub fn link_config(mut self, config: LinkConfig) -> Self {
        self.link = config;
        self
    }

    /// Sets lease batching, reporting and the local fallback budget.
    pub fn lease_config(mut self, config: LeaseCacheConfig) -> Self {
        self.lease = config;
        self
    }

    /// Sets the gate's capacity, wait floor and local spread.
    pub fn gate_config(mut self, config: GateConfig) -> Self {
        self.gate = config;
        self
    }

    /// Reads wall time from `clock` instead of the system clock.
    pub fn clock(mut self, clock: Arc<dyn Clock>) -> Self {
        self.clock = Some(clock);
        self
    }

    /// Talks to the coordinator over `channel` (TLS, a custom connector, an
    /// in-memory transport) instead of a lazy channel to the endpoint.
    pub fn channel(mut self, channel: Channel) -> Self {
        self.channel = Some(channel);
        self
    }

    /// Builds the link, starts the lease cache's background task on the
    /// current tokio runtime, and returns the ready handle. The task ends,
    /// after a last flush, when the last clone of the handle is dropped.
    pub fn build(self) -> Result<Tollgate, SetupError> {
        // Checked up front: both the lazy channel and the cache spawn tasks,
        // and spawning outside a runtime would panic.
        if tokio::runtime::Handle::try_current().is_err() {
            return Err(SetupError::NoRuntime);
        }
        let link = match self.channel {
            Some(channel) => CoordinatorLink::with_channel(channel, &self.link)?,
            None => CoordinatorLink::new(&self.link)?,
        };
        let clock = self.clock.unwrap_or_else(|| Arc::new(SystemClock));
        let cache = LeaseCache::start(link, self.lease, clock.clone());
        Ok(Tollgate {
            gate: Gate::new(cache, clock, self.gate),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn building_outside_a_runtime_is_an_error_not_a_panic() {
        let built = Tollgate::connect("http://127.0.0.1:50051", "worker-1").build();
        assert!(matches!(built, Err(SetupError::NoRuntime)));
    }

    #[tokio::test]
    async fn a_bad_endpoint_or_token_is_refused() {
        let bad_endpoint = Tollgate::connect("not a uri", "worker-1").build();
        assert!(matches!(bad_endpoint, Err(SetupError::Link(_))));
        let bad_token = Tollgate::connect("http://127.0.0.1:50051", "worker-1")
            .bearer_token("line\nbreak")
            .build();
        assert!(matches!(
            bad_token,
            Err(SetupError::Link(LinkConfigError::Token))
        ));
    }

    #[test]
    fn debug_output_never_shows_the_token() {
        let builder =
            Tollgate::connect("http://127.0.0.1:50051", "worker-1").bearer_token("s3cret");
        let shown = format!("{builder:?}");
        assert!(!shown.contains("s3cret"), "{shown}");
        assert!(shown.contains("redacted"), "{shown}");
    }

    #[tokio::test]
    async fn connect_is_lazy_and_ready_at_once() {
        // Nothing listens on port 9 of loopback: building must not wait.
        let tollgate = Tollgate::connect("http://127.0.0.1:9", "worker-1")
            .build()
            .expect("lazy connect");
        assert_eq!(tollgate.link_state(), LinkState::Connected);
        assert_eq!(
            tollgate.gate().available_capacity(),
            GateConfig::default().max_in_flight
        );
    }
}
