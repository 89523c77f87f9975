//! A coordinator on `127.0.0.1:0` with a manual clock, and helpers to talk to it.

#![allow(dead_code)] // Each test binary uses a different subset.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use tokio::net::TcpListener;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;
use tollgate::config::Config;
use tollgate::server::{self, ServeError};
use tollgate::store::redis::EventRelay;
use tollgate::store::{MemoryStore, Store};
use tollgate_client::clock::{ManualClock, from_unix_ms};
use tollgate_proto::v1::{self, admin_client::AdminClient, budget_client::BudgetClient};
use tonic::transport::Channel;

/// Mon, 01 Jan 2024 12:00:00 GMT: HTTP-dates in tests are easy to write.
pub(crate) const T0: i64 = 1_704_110_400_000;

pub(crate) struct Coordinator {
    pub(crate) addr: SocketAddr,
    pub(crate) clock: Arc<ManualClock>,
    stop: Option<oneshot::Sender<()>>,
    pub(crate) task: JoinHandle<Result<(), ServeError>>,
}

impl Coordinator {
    pub(crate) async fn start(config: Config) -> Coordinator {
        let store = Arc::new(MemoryStore::new(config.limits.max_scopes));
        Coordinator::start_with_store(config, store).await
    }

    pub(crate) async fn start_with_store(config: Config, store: Arc<dyn Store>) -> Coordinator {
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind loopback");
        let addr = listener.local_addr().expect("local addr");
        let clock = Arc::new(ManualClock::new(from_unix_ms(T0)));
        let (stop, stopped) = oneshot::channel::<()>();
        let task = tokio::spawn(server::run_tcp(
            listener,
            async {
                let _ = stopped.await;
            },
            server::Setup::new(config).clock(clock.clone()).store(store),
        ));
        Coordinator {
            addr,
            clock,
            stop: Some(stop),
            task,
        }
    }

    /// One of several replicas sharing `store` and `clock` (one time source,
    /// as `RedisClock` gives real replicas), relaying Watch through `relay`.
    pub(crate) async fn start_replica(
        config: Config,
        store: Arc<dyn Store>,
        relay: Option<EventRelay>,
        clock: Arc<ManualClock>,
    ) -> Coordinator {
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind loopback");
        let addr = listener.local_addr().expect("local addr");
        let (stop, stopped) = oneshot::channel::<()>();
        let task = tokio::spawn(server::run_tcp(
            listener,
            async {
                let _ = stopped.await;
            },
            server::Setup::new(config)
                .clock(clock.clone())
                .store(store)
                .relay(relay),
        ));
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
        Channel::from_shared(format!("http://{}", self.addr))
            .expect("valid uri")
            .connect()
            .await
            .expect("connect to the coordinator")
    }

    pub(crate) async fn client(&self) -> BudgetClient<Channel> {
        BudgetClient::new(self.channel().await)
    }

    pub(crate) async fn admin(&self) -> AdminClient<Channel> {
        AdminClient::new(self.channel().await)
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

pub(crate) fn config(text: &str) -> Config {
    Config::from_toml(text, |_| None).expect("valid test config")
}

pub(crate) fn scope(caller: &str, route: &str, priority: v1::Priority) -> Option<v1::Scope> {
    Some(v1::Scope {
        caller_scope: caller.into(),
        route: route.into(),
        priority: priority.into(),
    })
}

pub(crate) fn with_token<T>(message: T, token: &str) -> tonic::Request<T> {
    let mut request = tonic::Request::new(message);
    request.metadata_mut().insert(
        "authorization",
        format!("Bearer {token}").parse().expect("ascii token"),
    );
    request
}

pub(crate) fn lease(scope: Option<v1::Scope>, worker: &str, want: u32) -> v1::LeaseRequest {
    v1::LeaseRequest {
        scope,
        worker_id: worker.into(),
        want,
        retry_class: v1::RetryClass::Transient.into(),
    }
}

pub(crate) fn rate_limited(
    scope: Option<v1::Scope>,
    worker: &str,
    retry_after: &str,
    certainty: v1::ScopeCertainty,
) -> v1::ReportRequest {
    v1::ReportRequest {
        scope,
        worker_id: worker.into(),
        first_attempts: 1,
        successes: 0,
        evidence: vec![v1::Evidence {
            http_status: 429,
            has_retry_after: true,
            retry_after: retry_after.into(),
            receipt_unix_ms: T0,
            sent_unix_ms: T0 - 50,
            certainty: certainty.into(),
            ..v1::Evidence::default()
        }],
    }
}

pub(crate) fn reconsider(scope: Option<v1::Scope>, intent: &str) -> v1::ReconsiderRequest {
    v1::ReconsiderRequest {
        scope,
        worker_id: "worker-b".into(),
        intent_id: intent.into(),
        not_before_unix_ms: 0,
        deadline_unix_ms: T0 + 3_600_000,
        attempt_reserve_ms: 2_000,
    }
}

/// Opens a Watch on `scope` and returns the stream with its first event,
/// which must be the scope's snapshot.
pub(crate) async fn watch(
    client: &mut BudgetClient<Channel>,
    scope: &Option<v1::Scope>,
    worker: &str,
) -> (tonic::Streaming<v1::ScopeEvent>, v1::ScopeEvent) {
    let mut stream = client
        .watch(v1::WatchRequest {
            scopes: vec![scope.clone().expect("scope")],
            worker_id: worker.into(),
        })
        .await
        .expect("watch")
        .into_inner();
    let snapshot = stream.message().await.expect("stream").expect("snapshot");
    assert_eq!(snapshot.kind(), v1::ScopeEventKind::Snapshot);
    (stream, snapshot)
}
