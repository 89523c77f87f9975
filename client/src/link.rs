//! The worker's connection to the coordinator, and whether it is healthy.
//!
//! Every RPC goes through [`CoordinatorLink`], which bounds it with a short
//! timeout and keeps one piece of state: [`LinkState::Connected`] or
//! [`LinkState::Degraded`]. A failed or slow RPC flips the link to degraded
//! (one log line, a counter); the next RPC that succeeds flips it back (one
//! log line). The lease cache reads the state to decide whether tokens come
//! from the fleet budget or from the conservative local fallback, so a dead
//! coordinator costs a worker one RPC timeout, never a hang.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, SystemTime};

use tollgate_proto::v1::budget_client::BudgetClient;
use tollgate_proto::v1::{
    LeaseRequest, LeaseResponse, ReconsiderRequest, ReconsiderResponse, ReleaseRequest,
    ReleaseResponse, ReportRequest, ReportResponse, ScopeEvent, WatchRequest,
};
use tonic::Request;
use tonic::metadata::MetadataValue;
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Endpoint, Identity};

/// Default bound on one coordinator RPC. Short on purpose: the coordinator
/// answers from memory, so a slow answer means it is overloaded or gone, and
/// a worker waiting on it would spend its own deadline.
pub const DEFAULT_RPC_TIMEOUT: Duration = Duration::from_millis(250);

/// Default interval between HTTP/2 PINGs on the coordinator connection.
///
/// Without them a connection whose peer vanished without a reset (power
/// loss, a partition, a dropped NAT entry) looks open forever: every RPC on
/// it times out, the Watch stream never ends, and the worker would stay on
/// the local fallback even after the coordinator is back elsewhere.
pub const DEFAULT_KEEP_ALIVE_INTERVAL: Duration = Duration::from_secs(5);

/// Default time to wait for a PING's acknowledgement before the connection
/// is declared dead and closed (the channel then reconnects on the next
/// RPC). The coordinator answers PINGs from its HTTP/2 layer, so even a busy
/// one acknowledges well within this.
pub const DEFAULT_KEEP_ALIVE_TIMEOUT: Duration = Duration::from_secs(2);

/// How often a link whose TLS came from files ([`LinkTls::from_files`])
/// looks at them for a change, while its RPCs succeed; while they fail (a
/// rotated server certificate from a new CA, an expired client
/// certificate), at most every [`TLS_RECHECK_DEGRADED`].
pub const TLS_RECHECK: Duration = Duration::from_secs(10);

/// How often a degraded link looks at its TLS files.
pub const TLS_RECHECK_DEGRADED: Duration = Duration::from_secs(1);

/// Whether the coordinator is currently usable.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LinkState {
    /// RPCs succeed; tokens and slots come from the fleet.
    Connected,
    /// The last RPC failed or timed out; the local fallback budget applies.
    Degraded,
}

/// Why a coordinator RPC did not produce an answer.
#[derive(Debug, thiserror::Error)]
pub enum LinkError {
    /// The RPC did not finish within the link's timeout.
    #[error("coordinator did not answer within {0:?}")]
    Timeout(Duration),
    /// The coordinator (or the transport) returned an error status.
    #[error("coordinator returned {}: {}", .0.code(), .0.message())]
    Status(#[from] tonic::Status),
}

impl LinkError {
    /// Whether the request may have reached the coordinator and been
    /// applied although no answer came back: it timed out, or was cancelled
    /// or ran out of time on the way.
    pub fn may_have_arrived(&self) -> bool {
        match self {
            LinkError::Timeout(_) => true,
            LinkError::Status(status) => matches!(
                status.code(),
                tonic::Code::DeadlineExceeded | tonic::Code::Cancelled
            ),
        }
    }

    /// Whether the failure says the coordinator is unusable (as opposed to a
    /// refusal of this particular request, such as a permission error).
    pub fn is_unreachable(&self) -> bool {
        match self {
            LinkError::Timeout(_) => true,
            LinkError::Status(status) => matches!(
                status.code(),
                tonic::Code::Unavailable
                    | tonic::Code::DeadlineExceeded
                    | tonic::Code::Unknown
                    | tonic::Code::Internal
                    | tonic::Code::ResourceExhausted
                    | tonic::Code::Cancelled
            ),
        }
    }
}

/// How to reach the coordinator.
#[derive(Clone)]
pub struct LinkConfig {
    /// The coordinator's address, e.g. `http://127.0.0.1:50051`.
    pub endpoint: String,
    /// This worker's stable id; fair shares are computed per worker.
    pub worker_id: String,
    /// The bearer token mapping this worker to its caller scopes, if the
    /// coordinator requires one. Never logged.
    pub bearer_token: Option<String>,
    /// The bound on each RPC.
    pub rpc_timeout: Duration,
    /// How often an HTTP/2 PING checks that the connection is alive, also
    /// while no RPC is in flight (a worker between retries holds only its
    /// Watch stream). Default [`DEFAULT_KEEP_ALIVE_INTERVAL`].
    pub keep_alive_interval: Duration,
    /// How long a PING may go unacknowledged before the connection is
    /// dropped and the next RPC reconnects. Default
    /// [`DEFAULT_KEEP_ALIVE_TIMEOUT`]. A silently dead coordinator is thus
    /// noticed within `keep_alive_interval + keep_alive_timeout`.
    pub keep_alive_timeout: Duration,
    /// TLS towards the coordinator. `None` with an `https://` endpoint:
    /// TLS verified against the system roots.
    pub tls: Option<LinkTls>,
}

/// How the worker verifies the coordinator, and proves itself for mTLS.
#[derive(Clone, Default)]
pub struct LinkTls {
    /// PEM CA certificates the coordinator's certificate must chain to;
    /// `None`: the system's roots.
    pub ca_pem: Option<Vec<u8>>,
    /// PEM client certificate chain and private key, for a coordinator
    /// that requires client certificates.
    pub identity_pem: Option<(Vec<u8>, Vec<u8>)>,
    /// The name the coordinator's certificate must carry, when it differs
    /// from the endpoint's host (an IP address, a tunnel).
    pub domain: Option<String>,
    /// The files the PEMs were read from ([`LinkTls::from_files`]): a
    /// [`CoordinatorLink`] reads them again when they change, so rotated
    /// certificates need no restart.
    pub files: Option<LinkTlsFiles>,
}

/// Where a [`LinkTls`] was read from.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LinkTlsFiles {
    /// The CA certificates' file.
    pub ca: Option<PathBuf>,
    /// The client certificate chain's file.
    pub cert: Option<PathBuf>,
    /// The client key's file.
    pub key: Option<PathBuf>,
}

impl LinkTlsFiles {
    fn paths(&self) -> impl Iterator<Item = &Path> {
        [&self.ca, &self.cert, &self.key]
            .into_iter()
            .flatten()
            .map(PathBuf::as_path)
    }

    /// Each file's modification time and length, to tell a rewrite.
    fn stamps(&self) -> Vec<Option<(SystemTime, u64)>> {
        self.paths()
            .map(|p| {
                let meta = std::fs::metadata(p).ok()?;
                Some((meta.modified().ok()?, meta.len()))
            })
            .collect()
    }
}

impl std::fmt::Debug for LinkTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The private key never reaches a log line.
        f.debug_struct("LinkTls")
            .field("ca", &self.ca_pem.is_some())
            .field("client_certificate", &self.identity_pem.is_some())
            .field("domain", &self.domain)
            .field("files", &self.files)
            .finish()
    }
}

impl LinkTls {
    /// Reads the CA and, when both are given, the client certificate and
    /// key from PEM files.
    pub fn from_files(
        ca: Option<&std::path::Path>,
        cert: Option<&std::path::Path>,
        key: Option<&std::path::Path>,
    ) -> Result<Self, LinkConfigError> {
        let read = |path: &std::path::Path| {
            std::fs::read(path)
                .map_err(|e| LinkConfigError::Tls(format!("{}: {e}", path.display())))
        };
        let identity_pem = match (cert, key) {
            (Some(cert), Some(key)) => Some((read(cert)?, read(key)?)),
            (None, None) => None,
            _ => {
                return Err(LinkConfigError::Tls(
                    "a client certificate needs its key, and a key its certificate".into(),
                ));
            }
        };
        Ok(LinkTls {
            ca_pem: ca.map(read).transpose()?,
            identity_pem,
            domain: None,
            files: Some(LinkTlsFiles {
                ca: ca.map(Path::to_owned),
                cert: cert.map(Path::to_owned),
                key: key.map(Path::to_owned),
            }),
        })
    }

    /// The same settings read again from [`LinkTls::files`].
    fn reread(&self) -> Result<Option<Self>, LinkConfigError> {
        let Some(files) = &self.files else {
            return Ok(None);
        };
        let mut fresh = Self::from_files(
            files.ca.as_deref(),
            files.cert.as_deref(),
            files.key.as_deref(),
        )?;
        fresh.domain.clone_from(&self.domain);
        // A file caught half-written must not replace working settings.
        let complete = |pem: &[u8]| pem.windows(9).any(|w| w == b"-----END ");
        let pems = fresh.ca_pem.iter().chain(
            fresh
                .identity_pem
                .iter()
                .flat_map(|(cert, key)| [cert, key]),
        );
        for pem in pems {
            if !complete(pem) {
                return Err(LinkConfigError::Tls("a PEM file is incomplete".into()));
            }
        }
        Ok(Some(fresh))
    }

    /// The tonic client TLS configuration.
    pub fn client_config(&self) -> ClientTlsConfig {
        let mut config = ClientTlsConfig::new();
        config = match &self.ca_pem {
            Some(ca) => config.ca_certificate(Certificate::from_pem(ca)),
            None => config.with_native_roots(),
        };
        if let Some((cert, key)) = &self.identity_pem {
            config = config.identity(Identity::from_pem(cert, key));
        }
        if let Some(domain) = &self.domain {
            config = config.domain_name(domain.clone());
        }
        config
    }
}

impl std::fmt::Debug for LinkConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The token grants this worker its caller scopes: whether one is
        // set, never its value.
        f.debug_struct("LinkConfig")
            .field("endpoint", &self.endpoint)
            .field("worker_id", &self.worker_id)
            .field(
                "bearer_token",
                &self.bearer_token.as_ref().map(|_| "<redacted>"),
            )
            .field("rpc_timeout", &self.rpc_timeout)
            .field("keep_alive_interval", &self.keep_alive_interval)
            .field("keep_alive_timeout", &self.keep_alive_timeout)
            .finish()
    }
}

impl LinkConfig {
    /// A configuration with the default timeout and no token.
    pub fn new(endpoint: impl Into<String>, worker_id: impl Into<String>) -> Self {
        LinkConfig {
            endpoint: endpoint.into(),
            worker_id: worker_id.into(),
            bearer_token: None,
            rpc_timeout: DEFAULT_RPC_TIMEOUT,
            keep_alive_interval: DEFAULT_KEEP_ALIVE_INTERVAL,
            keep_alive_timeout: DEFAULT_KEEP_ALIVE_TIMEOUT,
            tls: None,
        }
    }

    /// The endpoint [`CoordinatorLink::new`] connects through: `endpoint`,
    /// a connect timeout of one RPC timeout, and HTTP/2 keepalive.
    ///
    /// With [`LinkConfig::tls`] (or an `https://` endpoint) the endpoint
    /// speaks TLS. Callers that build their own channel (a custom
    /// connector) should start from this endpoint so they get the same
    /// keepalive and TLS; otherwise a coordinator that dies without
    /// resetting connections leaves the channel on a dead connection.
    pub fn endpoint(&self) -> Result<Endpoint, LinkConfigError> {
        let endpoint = Endpoint::from_shared(self.endpoint.clone())?
            .connect_timeout(self.rpc_timeout)
            .http2_keep_alive_interval(self.keep_alive_interval)
            .keep_alive_timeout(self.keep_alive_timeout)
            .keep_alive_while_idle(true);
        let tls = self
            .tls
            .clone()
            .or_else(|| self.endpoint.starts_with("https://").then(LinkTls::default));
        Ok(match tls {
            Some(tls) => endpoint.tls_config(tls.client_config())?,
            None => endpoint,
        })
    }
}

/// A cheaply clonable handle on the coordinator.
#[derive(Debug, Clone)]
pub struct CoordinatorLink {
    /// Replaced when the TLS files change (new connections use them; RPCs
    /// in flight finish on the old channel).
    client: Arc<RwLock<BudgetClient<Channel>>>,
    worker_id: Arc<str>,
    /// Shared by every clone and replaced whole when the caller's token is
    /// rotated ([`CoordinatorLink::set_bearer_token`]): the lease cache's
    /// background tasks hold clones, and must send the new one too.
    authorization: Arc<RwLock<Option<MetadataValue<tonic::metadata::Ascii>>>>,
    rpc_timeout: Duration,
    health: Arc<Health>,
    tls: Option<Arc<TlsFollow>>,
}

/// The `authorization` value for `token`, marked sensitive so that no
/// `Debug` of the link or a request prints it.
fn bearer(token: &str) -> Result<MetadataValue<tonic::metadata::Ascii>, LinkConfigError> {
    let mut value: MetadataValue<tonic::metadata::Ascii> = format!("Bearer {token}")
        .parse()
        .map_err(|_| LinkConfigError::Token)?;
    value.set_sensitive(true);
    Ok(value)
}

/// What a link whose TLS came from files needs to follow them.
#[derive(Debug)]
struct TlsFollow {
    config: LinkConfig,
    checked: Mutex<Checked>,
}

#[derive(Debug)]
struct Checked {
    /// When the files were last looked at.
    at: tokio::time::Instant,
    /// Their stamps when last read.
    stamps: Vec<Option<(SystemTime, u64)>>,
}

#[derive(Debug, Default)]
struct Health {
    degraded: AtomicBool,
    /// How many times the link went from connected to degraded; exported as
    /// a metric so a flapping coordinator is visible.
    degradations: AtomicU64,
}

/// The link configuration could not be used.
#[derive(Debug, thiserror::Error)]
pub enum LinkConfigError {
    /// The endpoint is not a valid URI.
    #[error("invalid coordinator endpoint: {0}")]
    Endpoint(#[from] tonic::transport::Error),
    /// The bearer token cannot be sent as gRPC metadata.
    #[error("the bearer token contains characters that cannot be sent as metadata")]
    Token,
    /// A TLS file could not be read, or the TLS options do not fit.
    #[error("tls: {0}")]
    Tls(String),
}

impl CoordinatorLink {
    /// Creates a link that connects lazily: building it never waits for the
    /// coordinator, so a worker starts even when the coordinator is down.
    ///
    /// The channel sends HTTP/2 keepalive PINGs (see
    /// [`LinkConfig::endpoint`]), so a coordinator host that dies without
    /// resetting its connections is noticed and the channel reconnects.
    ///
    /// TLS read with [`LinkTls::from_files`] is followed: the files are
    /// looked at every [`TLS_RECHECK`] (every [`TLS_RECHECK_DEGRADED`]
    /// while RPCs fail) and read again when they change; see
    /// [`CoordinatorLink::reload_tls`].
    pub fn new(config: &LinkConfig) -> Result<Self, LinkConfigError> {
        let channel = config.endpoint()?.connect_lazy();
        let mut link = Self::with_channel(channel, config)?;
        let files = config.tls.as_ref().and_then(|t| t.files.as_ref());
        link.tls = files.map(|files| {
            Arc::new(TlsFollow {
                config: config.clone(),
                checked: Mutex::new(Checked {
                    at: tokio::time::Instant::now(),
                    stamps: files.stamps(),
                }),
            })
        });
        Ok(link)
    }

    /// Creates a link over a channel the caller built (a custom connector,
    /// or an in-memory transport in tests); `config.endpoint` and the
    /// keepalive settings are not used, so build the channel from
    /// [`LinkConfig::endpoint`] to keep them.
    pub fn with_channel(channel: Channel, config: &LinkConfig) -> Result<Self, LinkConfigError> {
        let authorization = config.bearer_token.as_deref().map(bearer).transpose()?;
        Ok(CoordinatorLink {
            client: Arc::new(RwLock::new(BudgetClient::new(channel))),
            worker_id: config.worker_id.as_str().into(),
            authorization: Arc::new(RwLock::new(authorization)),
            rpc_timeout: config.rpc_timeout,
            health: Arc::default(),
            tls: None,
        })
    }

    /// Replaces the bearer token every later call carries, on this link and
    /// all its clones (`None`: no token): a rotated token file, read again.
    /// A Watch stream already open stays open; it was authenticated when
    /// it opened.
    pub fn set_bearer_token(&self, token: Option<&str>) -> Result<(), LinkConfigError> {
        let value = token.map(bearer).transpose()?;
        *self
            .authorization
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = value;
        Ok(())
    }

    fn authorize<T>(&self, request: &mut Request<T>) {
        let value = self
            .authorization
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone();
        if let Some(value) = value {
            request.metadata_mut().insert("authorization", value);
        }
    }

    /// Reads the TLS files again if any changed since they were last read,
    /// and sends new connections through what they hold now; whether it
    /// did. The link does this by itself (see [`CoordinatorLink::new`]);
    /// call it to follow a rotation at once (on SIGHUP, say). Files that
    /// cannot be read, or are caught half-written, leave the last settings
    /// in force and are tried again.
    pub fn reload_tls(&self) -> Result<bool, LinkConfigError> {
        let Some(follow) = &self.tls else {
            return Ok(false);
        };
        let Some(tls) = &follow.config.tls else {
            return Ok(false);
        };
        let Some(files) = &tls.files else {
            return Ok(false);
        };
        let stamps = files.stamps();
        if stamps == crate::lock(&follow.checked).stamps {
            return Ok(false);
        }
        let Some(fresh) = tls.reread()? else {
            return Ok(false);
        };
        let config = LinkConfig {
            tls: Some(fresh),
            ..follow.config.clone()
        };
        let channel = config.endpoint()?.connect_lazy();
        *self
            .client
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = BudgetClient::new(channel);
        crate::lock(&follow.checked).stamps = stamps;
        tracing::info!("coordinator TLS files changed; new connections use them");
        Ok(true)
    }

    /// The client to call through, after looking at the TLS files when it
    /// is time to.
    fn client(&self) -> BudgetClient<Channel> {
        if let Some(follow) = &self.tls {
            let every = match self.state() {
                LinkState::Connected => TLS_RECHECK,
                LinkState::Degraded => TLS_RECHECK_DEGRADED,
            };
            let due = {
                let mut checked = crate::lock(&follow.checked);
                let now = tokio::time::Instant::now();
                let due = now.duration_since(checked.at) >= every;
                if due {
                    checked.at = now;
                }
                due
            };
            if due && let Err(err) = self.reload_tls() {
                tracing::warn!(cause = %err, "coordinator TLS files unusable; keeping the last ones");
            }
        }
        self.client
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }

    /// This worker's id, as sent in every request.
    pub fn worker_id(&self) -> &str {
        &self.worker_id
    }

    /// The bound on each RPC.
    pub fn rpc_timeout(&self) -> Duration {
        self.rpc_timeout
    }

    /// Whether the last RPC succeeded.
    pub fn state(&self) -> LinkState {
        if self.health.degraded.load(Ordering::Relaxed) {
            LinkState::Degraded
        } else {
            LinkState::Connected
        }
    }

    /// How many times the link has degraded since it was created.
    pub fn degradations(&self) -> u64 {
        self.health.degradations.load(Ordering::Relaxed)
    }

    fn request<T>(&self, message: T) -> Request<T> {
        let mut request = Request::new(message);
        request.set_timeout(self.rpc_timeout);
        self.authorize(&mut request);
        crate::telemetry::inject(request.metadata_mut());
        request
    }

    /// Records the result of an RPC in the link state.
    fn observe<T>(&self, result: Result<T, LinkError>) -> Result<T, LinkError> {
        match &result {
            Ok(_) => {
                if self.health.degraded.swap(false, Ordering::Relaxed) {
                    crate::telemetry::record_fallback(false);
                    tracing::info!("coordinator reachable again; using the fleet budget");
                }
            }
            Err(err) if err.is_unreachable() => {
                if !self.health.degraded.swap(true, Ordering::Relaxed) {
                    self.health.degradations.fetch_add(1, Ordering::Relaxed);
                    crate::telemetry::record_fallback(true);
                    tracing::warn!(
                        cause = %err,
                        "coordinator unreachable; using the local fallback budget"
                    );
                }
            }
            Err(_) => {}
        }
        result
    }

    async fn call<T, F, Fut>(&self, message: T, rpc: F) -> Result<Fut::Output, LinkError>
    where
        F: FnOnce(BudgetClient<Channel>, Request<T>) -> Fut,
        Fut: std::future::Future,
    {
        // The request timeout travels as grpc-timeout; this one also covers
        // connecting, which the server-side deadline cannot.
        let call = rpc(self.client(), self.request(message));
        tokio::time::timeout(self.rpc_timeout, call)
            .await
            .map_err(|_| LinkError::Timeout(self.rpc_timeout))
    }

    /// `Budget.Lease`.
    pub async fn lease(&self, mut message: LeaseRequest) -> Result<LeaseResponse, LinkError> {
        message.worker_id = self.worker_id.to_string();
        let result = self
            .call(message, |mut c, r| async move { c.lease(r).await })
            .await;
        self.observe(flatten(result))
    }

    /// `Budget.Release`.
    pub async fn release(&self, mut message: ReleaseRequest) -> Result<ReleaseResponse, LinkError> {
        message.worker_id = self.worker_id.to_string();
        let result = self
            .call(message, |mut c, r| async move { c.release(r).await })
            .await;
        self.observe(flatten(result))
    }

    /// `Budget.Report`.
    pub async fn report(&self, mut message: ReportRequest) -> Result<ReportResponse, LinkError> {
        message.worker_id = self.worker_id.to_string();
        let result = self
            .call(message, |mut c, r| async move { c.report(r).await })
            .await;
        self.observe(flatten(result))
    }

    /// `Budget.Reconsider`.
    pub async fn reconsider(
        &self,
        mut message: ReconsiderRequest,
    ) -> Result<ReconsiderResponse, LinkError> {
        message.worker_id = self.worker_id.to_string();
        let result = self
            .call(message, |mut c, r| async move { c.reconsider(r).await })
            .await;
        self.observe(flatten(result))
    }

    /// `Budget.Watch`: opens the stream (the open is bounded by the timeout,
    /// the stream itself is not).
    pub async fn watch(
        &self,
        mut message: WatchRequest,
    ) -> Result<tonic::Streaming<ScopeEvent>, LinkError> {
        message.worker_id = self.worker_id.to_string();
        let mut request = Request::new(message);
        self.authorize(&mut request);
        let mut client = self.client();
        let result = tokio::time::timeout(self.rpc_timeout, client.watch(request))
            .await
            .map_err(|_| LinkError::Timeout(self.rpc_timeout));
        self.observe(flatten(result))
    }
}

fn flatten<T>(
    result: Result<Result<tonic::Response<T>, tonic::Status>, LinkError>,
) -> Result<T, LinkError> {
    Ok(result??.into_inner())
}
