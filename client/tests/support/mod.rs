//! A scriptable fake coordinator, served over an in-memory transport so the
//! gate's tests run on paused tokio time without real sockets (auto-advance
//! would otherwise fire RPC timeouts while socket IO is pending).
//!
//! It exists only for the one row the real coordinator cannot produce yet
//! (an operator rotating a scope's policy while an intent waits); every
//! other row runs against the real coordinator in the root package's
//! `tests/gate_matrix.rs`. Delete it when the Admin API lands.

#![allow(dead_code, unreachable_pub, missing_docs, clippy::unwrap_used)]

use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use tokio::sync::{broadcast, mpsc};
use tokio_stream::StreamExt;
use tokio_stream::wrappers::{BroadcastStream, ReceiverStream};
use tollgate_client::backoff::{Backoff, Jitter};
use tollgate_client::clock::{Clock, ManualClock, to_unix_ms};
use tollgate_client::engine::Policy;
use tollgate_client::gate::{Gate, GateConfig};
use tollgate_client::lease::{LeaseCache, LeaseCacheConfig};
use tollgate_client::link::{CoordinatorLink, LinkConfig};
use tollgate_client::scope::Scope;
use tollgate_proto::v1::budget_server::{Budget, BudgetServer};
use tollgate_proto::v1::{
    LeaseLimit, LeaseRequest, LeaseResponse, ReconsiderDecision, ReconsiderRequest,
    ReconsiderResponse, ReleaseRequest, ReleaseResponse, ReportRequest, ReportResponse, ScopeEvent,
    ScopeEventKind, WatchRequest,
};
use tonic::transport::{Channel, Endpoint, Server};
use tonic::{Request, Response, Status};

/// Noon, 1 January 2024: every test's wall clock starts here.
pub fn noon() -> SystemTime {
    httpdate::parse_http_date("Mon, 01 Jan 2024 12:00:00 GMT").expect("date")
}

#[derive(Debug)]
pub struct FleetState {
    /// Tokens the fleet budget still has, across all leases.
    pub tokens: u32,
    pub policy_version: u64,
    pub frozen: bool,
    /// A slot is `not_before + slot_delay`.
    pub slot_delay: Duration,
    pub leases: u32,
    pub reports: Vec<ReportRequest>,
    pub reconsiders: Vec<(ReconsiderRequest, u64)>,
}

impl Default for FleetState {
    fn default() -> Self {
        FleetState {
            tokens: 1_000,
            policy_version: 1,
            frozen: false,
            slot_delay: Duration::ZERO,
            leases: 0,
            reports: Vec::new(),
            reconsiders: Vec::new(),
        }
    }
}

#[derive(Clone)]
pub struct Fleet {
    pub state: Arc<Mutex<FleetState>>,
    events: broadcast::Sender<ScopeEvent>,
    clock: Arc<ManualClock>,
}

impl Fleet {
    pub fn set(&self, update: impl FnOnce(&mut FleetState)) {
        update(&mut self.state.lock().unwrap());
    }

    pub fn get<T>(&self, read: impl FnOnce(&FleetState) -> T) -> T {
        read(&self.state.lock().unwrap())
    }

    /// An operator changes the scope's policy: a new version on the Watch stream.
    pub fn rotate_policy(&self, scope: &Scope, slot_delay: Duration) -> u64 {
        let version = {
            let mut state = self.state.lock().unwrap();
            state.policy_version += 1;
            state.slot_delay = slot_delay;
            state.policy_version
        };
        let _ = self.events.send(ScopeEvent {
            scope: Some(scope.to_wire()),
            kind: ScopeEventKind::PolicyChanged as i32,
            cooldown_until_unix_ms: 0,
            policy_version: version,
            frozen: false,
            reason: String::new(),
        });
        version
    }
}

#[tonic::async_trait]
impl Budget for Fleet {
    async fn lease(
        &self,
        request: Request<LeaseRequest>,
    ) -> Result<Response<LeaseResponse>, Status> {
        let want = request.into_inner().want;
        let now = self.clock.now();
        let mut state = self.state.lock().unwrap();
        state.leases += 1;
        let granted = if state.frozen {
            0
        } else {
            want.min(state.tokens)
        };
        state.tokens -= granted;
        let limit = if state.frozen {
            LeaseLimit::Frozen
        } else if granted < want {
            LeaseLimit::BudgetExhausted
        } else {
            LeaseLimit::None
        };
        Ok(Response::new(LeaseResponse {
            lease_id: if granted > 0 {
                format!("lease-{}", state.leases)
            } else {
                String::new()
            },
            granted,
            expires_at_unix_ms: to_unix_ms(now + Duration::from_secs(3600)),
            policy_version: state.policy_version,
            cooldown_until_unix_ms: 0,
            limit: limit as i32,
            remaining: u64::from(state.tokens),
        }))
    }

    async fn release(
        &self,
        request: Request<ReleaseRequest>,
    ) -> Result<Response<ReleaseResponse>, Status> {
        let _ = request;
        Ok(Response::new(ReleaseResponse { returned: 0 }))
    }

    async fn report(
        &self,
        request: Request<ReportRequest>,
    ) -> Result<Response<ReportResponse>, Status> {
        let mut state = self.state.lock().unwrap();
        state.reports.push(request.into_inner());
        Ok(Response::new(ReportResponse {
            cooldown_until_unix_ms: 0,
            policy_version: state.policy_version,
            verdicts: Vec::new(),
            backoff_ms: 0,
        }))
    }

    async fn reconsider(
        &self,
        request: Request<ReconsiderRequest>,
    ) -> Result<Response<ReconsiderResponse>, Status> {
        let request = request.into_inner();
        let mut state = self.state.lock().unwrap();
        let delay_ms = i64::try_from(state.slot_delay.as_millis()).unwrap();
        let slot = request.not_before_unix_ms + delay_ms;
        let reserve = i64::try_from(request.attempt_reserve_ms).unwrap();
        let decision = if state.frozen {
            ReconsiderDecision::Frozen
        } else if slot + reserve > request.deadline_unix_ms {
            ReconsiderDecision::DeadlineInfeasible
        } else {
            ReconsiderDecision::Slot
        };
        let version = state.policy_version;
        state.reconsiders.push((request, version));
        Ok(Response::new(ReconsiderResponse {
            decision: decision as i32,
            slot_unix_ms: slot,
            cooldown_until_unix_ms: 0,
            policy_version: version,
            reserves_token: false,
        }))
    }

    type WatchStream =
        std::pin::Pin<Box<dyn tokio_stream::Stream<Item = Result<ScopeEvent, Status>> + Send>>;

    async fn watch(
        &self,
        request: Request<WatchRequest>,
    ) -> Result<Response<Self::WatchStream>, Status> {
        let version = self.get(|s| s.policy_version);
        let snapshots: Vec<Result<ScopeEvent, Status>> = request
            .into_inner()
            .scopes
            .into_iter()
            .map(|scope| {
                Ok(ScopeEvent {
                    scope: Some(scope),
                    kind: ScopeEventKind::Snapshot as i32,
                    cooldown_until_unix_ms: 0,
                    policy_version: version,
                    frozen: false,
                    reason: String::new(),
                })
            })
            .collect();
        let live =
            BroadcastStream::new(self.events.subscribe()).filter_map(|event| event.ok().map(Ok));
        Ok(Response::new(Box::pin(
            tokio_stream::iter(snapshots).chain(live),
        )))
    }
}

/// A fake fleet and a gate connected to it over an in-memory transport.
pub struct Harness {
    pub fleet: Fleet,
    pub gate: Gate,
    pub clock: Arc<ManualClock>,
}

pub const RPC_TIMEOUT: Duration = Duration::from_millis(250);

pub fn gate_config() -> GateConfig {
    GateConfig {
        max_in_flight: 16,
        min_wait: Duration::from_millis(10),
        local_spread: Duration::from_millis(100),
        clock_trusted: true,
        seed: Some(7),
    }
}

pub async fn harness() -> Harness {
    harness_with(gate_config()).await
}

pub async fn harness_with(config: GateConfig) -> Harness {
    let clock = Arc::new(ManualClock::new(noon()));
    let (events, _) = broadcast::channel(64);
    let fleet = Fleet {
        state: Arc::default(),
        events,
        clock: clock.clone(),
    };
    let channel = serve_in_memory(fleet.clone());
    let mut link_config = LinkConfig::new("http://fleet.invalid", "worker-1");
    link_config.rpc_timeout = RPC_TIMEOUT;
    let link = CoordinatorLink::with_channel(channel, &link_config).expect("link");
    let cache = LeaseCache::start(
        link,
        LeaseCacheConfig {
            seed: Some(11),
            ..LeaseCacheConfig::default()
        },
        clock.clone(),
    );
    let gate = Gate::new(cache, clock.clone(), config);
    Harness { fleet, gate, clock }
}

/// Serves a `Budget` implementation over in-memory pipes and returns a
/// channel to it. Each connection is a fresh pipe whose server half is
/// handed to the server's incoming stream.
pub fn serve_in_memory<B: Budget>(service: B) -> Channel {
    let (conns, incoming) = mpsc::channel::<tokio::io::DuplexStream>(8);
    let server = Server::builder()
        .add_service(BudgetServer::new(service))
        .serve_with_incoming(ReceiverStream::new(incoming).map(Ok::<_, std::io::Error>));
    tokio::spawn(server);
    Endpoint::from_static("http://fleet.invalid").connect_with_connector_lazy(tower::service_fn(
        move |_| {
            let conns = conns.clone();
            async move {
                let (client, server) = tokio::io::duplex(64 * 1024);
                conns
                    .send(server)
                    .await
                    .map_err(|_| std::io::Error::from(std::io::ErrorKind::ConnectionRefused))?;
                Ok::<_, std::io::Error>(hyper_util::rt::TokioIo::new(client))
            }
        },
    ))
}

pub fn scope() -> Scope {
    Scope::new("tenant-a", "POST /orders")
}

pub fn secs(s: u64) -> Duration {
    Duration::from_secs(s)
}

pub fn ms(m: u64) -> Duration {
    Duration::from_millis(m)
}

/// A policy: `total` end to end, `attempts` in all, `cap` per attempt, a
/// 100 ms floor, 1 s backoff base without jitter, and an optional hint cap.
pub fn policy(total: Duration, attempts: u32, cap: Duration, max_hint: Option<Duration>) -> Policy {
    Policy::try_new(
        total,
        attempts,
        cap,
        ms(100),
        Backoff {
            base: secs(1),
            cap: secs(8),
            jitter: Jitter::None,
        },
        max_hint,
    )
    .expect("valid policy")
}
