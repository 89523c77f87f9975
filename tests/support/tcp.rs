//! The loopback transport: a coordinator on `127.0.0.1:0` with a manual
//! clock, and tonic clients to it. Real sockets, so a test here must not
//! pause tokio time (auto-advance would fire RPC timeouts while the kernel
//! still delivers bytes); the coordinator's decisions run on the manual
//! clock, so nothing sleeps for time to pass.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use tokio::net::TcpListener;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;
use tollgate::config::Config;
use tollgate::server::relay::EventRelay;
use tollgate::server::{self, ServeError};
use tollgate::store::{MemoryStore, Store};
use tollgate_client::clock::{Clock, ManualClock, from_unix_ms};
use tollgate_client::gate::{Gate, GateConfig};
use tollgate_client::lease::{LeaseCache, LeaseCacheConfig};
use tollgate_client::link::{CoordinatorLink, LinkConfig};
use tollgate_proto::v1::{self, admin_client::AdminClient, budget_client::BudgetClient};
use tonic::transport::Channel;

use super::T0;

/// Starts the real coordinator on `listener` until the returned sender fires
/// or drops. Every loopback coordinator of the suite starts here.
pub(crate) fn spawn_server(
    listener: TcpListener,
    config: Config,
    clock: Arc<dyn Clock>,
    store: Arc<dyn Store>,
    relay: Option<EventRelay>,
) -> (oneshot::Sender<()>, JoinHandle<Result<(), ServeError>>) {
    let setup = server::Setup::new(config)
        .clock(clock)
        .store(store)
        .relay(relay);
    spawn_setup(listener, setup)
}

/// [`spawn_server`] with a whole `Setup` (TLS and file-reload tests set
/// how often secrets are re-read).
pub(crate) fn spawn_setup(
    listener: TcpListener,
    setup: server::Setup,
) -> (oneshot::Sender<()>, JoinHandle<Result<(), ServeError>>) {
    let (stop, stopped) = oneshot::channel::<()>();
    let shutdown = async {
        let _ = stopped.await;
    };
    let task = tokio::spawn(server::run_tcp(listener, shutdown, setup));
    (stop, task)
}

pub(crate) struct Coordinator {
    pub(crate) addr: SocketAddr,
    pub(crate) clock: Arc<ManualClock>,
    stop: Option<oneshot::Sender<()>>,
    pub(crate) task: JoinHandle<Result<(), ServeError>>,
}

impl Coordinator {
    pub(crate) async fn start(config: Config) -> Coordinator {
        // The store `tollgate serve` makes: the bound and each token's quota.
        let store = Arc::new(MemoryStore::for_config(&config));
        Coordinator::start_with_store(config, store).await
    }

    /// The coordinator `tollgate serve --store URL` makes for `config`: a
    /// Redis store with each token's quota, its prefix claimed. Several
    /// started on one URL are replicas sharing their scopes.
    #[allow(dead_code)]
    pub(crate) async fn start_on_redis(config: Config, url: &str) -> Coordinator {
        use tollgate::store::redis::{RedisOptions, RedisStore, RedisTarget};
        let options = RedisOptions {
            tenants: config.tenant_limits(),
            ..RedisOptions::default()
        };
        let target = RedisTarget::parse(url).expect("redis url");
        let store = RedisStore::connect(target, options).await.expect("connect");
        store.claim_format().await.expect("an empty prefix");
        Coordinator::start_with_store(config, Arc::new(store)).await
    }

    pub(crate) async fn start_with_store(config: Config, store: Arc<dyn Store>) -> Coordinator {
        let clock = Arc::new(ManualClock::new(from_unix_ms(T0)));
        Coordinator::start_replica(config, store, None, clock.clone(), clock).await
    }

    /// One of several replicas sharing `store`, relaying Watch through
    /// `relay`. The server reads `server_clock`; `clock` is the manual clock
    /// the test advances (the same one, or the one `server_clock` follows).
    pub(crate) async fn start_replica(
        config: Config,
        store: Arc<dyn Store>,
        relay: Option<EventRelay>,
        clock: Arc<ManualClock>,
        server_clock: Arc<dyn Clock>,
    ) -> Coordinator {
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind loopback");
        let addr = listener.local_addr().expect("local addr");
        let (stop, task) = spawn_server(listener, config, server_clock, store, relay);
        Coordinator {
            addr,
            clock,
            stop: Some(stop),
            task,
        }
    }

    /// The coordinator of `setup` (its clock must be `clock`, which the
    /// test advances).
    pub(crate) async fn start_setup(setup: server::Setup, clock: Arc<ManualClock>) -> Coordinator {
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind loopback");
        let addr = listener.local_addr().expect("local addr");
        let (stop, task) = spawn_setup(listener, setup.clock(clock.clone()));
        Coordinator {
            addr,
            clock,
            stop: Some(stop),
            task,
        }
    }

    pub(crate) async fn open() -> Coordinator {
        Coordinator::start(Config::default()).await
    }

    pub(crate) async fn channel(&self) -> Channel {
        self.connect(None).await
    }

    /// A channel whose connection comes from `source`, any address of
    /// 127/8 on Linux: a peer of its own to the coordinator's per-peer
    /// limits (the bad-token slow-down).
    #[allow(dead_code)]
    pub(crate) async fn channel_from(&self, source: std::net::IpAddr) -> Channel {
        self.connect(Some(source)).await
    }

    async fn connect(&self, source: Option<std::net::IpAddr>) -> Channel {
        Channel::from_shared(format!("http://{}", self.addr))
            .expect("valid uri")
            .local_address(source)
            .connect()
            .await
            .expect("connect to the coordinator")
    }

    pub(crate) async fn client(&self) -> BudgetClient<Channel> {
        BudgetClient::new(self.channel().await)
    }

    /// A worker's gate on this coordinator, on its manual clock, with the
    /// default lease cache and gate tuning. Its RPC bound is generous: a
    /// loaded machine must not degrade the link into the local fallback.
    pub(crate) fn worker_gate(&self, worker_id: &str) -> Gate {
        let mut link_config = LinkConfig::new(format!("http://{}", self.addr), worker_id);
        link_config.rpc_timeout = Duration::from_secs(2);
        let link = CoordinatorLink::new(&link_config).expect("link");
        let clock: Arc<dyn Clock> = self.clock.clone();
        let cache = LeaseCache::start(link, LeaseCacheConfig::default(), clock.clone());
        Gate::new(cache, clock, GateConfig::default())
    }

    /// Asks `request` as a worker would: on ASK_AGAIN the manual clock
    /// moves to the instant named and the same intent asks again. Returns
    /// the first other answer and how many times it was told to ask again.
    #[allow(dead_code)]
    pub(crate) async fn reconsider_until_answered(
        &self,
        client: &mut BudgetClient<Channel>,
        request: v1::ReconsiderRequest,
    ) -> (v1::ReconsiderResponse, u32) {
        for asked in 0..64 {
            let answer = client
                .reconsider(request.clone())
                .await
                .expect("reconsider")
                .into_inner();
            if answer.decision() != v1::ReconsiderDecision::AskAgain {
                return (answer, asked);
            }
            let now = tollgate_client::clock::to_unix_ms(self.clock.now());
            assert!(
                answer.ask_again_unix_ms > now,
                "asked to ask again at {} at {now}",
                answer.ask_again_unix_ms
            );
            self.clock.set(from_unix_ms(answer.ask_again_unix_ms));
        }
        panic!("still asked to ask again after 64 asks");
    }

    pub(crate) async fn admin(&self) -> AdminClient<Channel> {
        AdminClient::new(self.channel().await)
    }

    /// What the Admin API shows of one route (`GetScope`).
    pub(crate) async fn scope_state(&self, caller_scope: &str, route: &str) -> v1::ScopeState {
        self.admin()
            .await
            .get_scope(v1::GetScopeRequest {
                caller_scope: caller_scope.into(),
                route: route.into(),
            })
            .await
            .expect("get scope")
            .into_inner()
    }

    pub(crate) fn advance(&self, by: Duration) {
        self.clock.advance(by);
    }

    /// Starts the drain without waiting for it.
    pub(crate) fn begin_shutdown(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
    }

    pub(crate) async fn stop(mut self) {
        self.begin_shutdown();
        tokio::time::timeout(Duration::from_secs(10), self.task)
            .await
            .expect("the server stops")
            .expect("the server task did not panic")
            .expect("the server ran without error");
    }
}
