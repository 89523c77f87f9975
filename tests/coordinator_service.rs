//! End-to-end tests of the Budget service around the coordinator's
//! decisions: invalid input named by field, caller tokens, Watch, health and
//! the drain at shutdown. A real server on loopback, real tonic clients, a
//! manual clock.

mod support;

use std::sync::Arc;

use support::{
    Coordinator, ROUTE, T0, TENANT_A_TOKEN, TENANT_A_TOKEN_TOML, config, lease, rate_limited,
    reconsider, scope, with_token,
};
use tokio::sync::Notify;
use tollgate::budget::{GrantAsk, LeaseEnd};
use tollgate::pacing::cursor::SlotAsk;
use tollgate::policy::Policy;
use tollgate::scope::{RouteKey, ScopeKey};
use tollgate::store::{
    LeaseOutcome, MemoryStore, ReportBatch, Reported, RouteView, ScopeDetail, ScopeFilter,
    ScopePage, Slotted, Store, StoreFuture,
};
use tollgate_proto::v1::{self, Priority, ScopeCertainty, ScopeEventKind};
use tonic::Code;

#[tokio::test]
async fn bad_input_is_invalid_argument_naming_the_field() {
    let coordinator = Coordinator::open().await;
    let mut client = coordinator.client().await;
    let good = scope("tenant-a", ROUTE, Priority::Normal);
    let expect_field = |result: Result<_, tonic::Status>, field: &str| {
        let status = result.expect_err(field);
        assert_eq!(status.code(), Code::InvalidArgument, "{field}: {status:?}");
        assert!(
            status.message().starts_with(field),
            "{field}: {}",
            status.message()
        );
    };

    expect_field(client.lease(lease(None, "w", 1)).await.map(|_| ()), "scope");
    let long_route = scope("tenant-a", &"x".repeat(300), Priority::Normal);
    expect_field(
        client.lease(lease(long_route, "w", 1)).await.map(|_| ()),
        "scope.route",
    );
    let mut bad_priority = good.clone();
    if let Some(s) = bad_priority.as_mut() {
        s.priority = 9;
    }
    expect_field(
        client.lease(lease(bad_priority, "w", 1)).await.map(|_| ()),
        "scope.priority",
    );
    expect_field(
        client.lease(lease(good.clone(), "w", 0)).await.map(|_| ()),
        "want",
    );
    expect_field(
        client.lease(lease(good.clone(), "", 1)).await.map(|_| ()),
        "worker_id",
    );

    let mut huge_hint = rate_limited(good.clone(), "w", "30", ScopeCertainty::Known);
    huge_hint.evidence[0].retry_after = "9".repeat(300);
    expect_field(
        client.report(huge_hint).await.map(|_| ()),
        "evidence[0].retry_after",
    );
    let mut many = rate_limited(good.clone(), "w", "30", ScopeCertainty::Known);
    many.evidence = vec![many.evidence[0].clone(); 65];
    expect_field(client.report(many).await.map(|_| ()), "evidence");
    let mut aged = rate_limited(good.clone(), "w", "30", ScopeCertainty::Known);
    aged.counts_age_ms = u64::MAX;
    expect_field(client.report(aged).await.map(|_| ()), "counts_age_ms");
    let mut status = rate_limited(good.clone(), "w", "30", ScopeCertainty::Known);
    status.evidence[0].http_status = 42;
    expect_field(
        client.report(status).await.map(|_| ()),
        "evidence[0].http_status",
    );

    let mut no_deadline = reconsider(good.clone(), "i");
    no_deadline.deadline_unix_ms = 0;
    expect_field(
        client.reconsider(no_deadline).await.map(|_| ()),
        "deadline_unix_ms",
    );
    let mut no_intent = reconsider(good.clone(), "");
    no_intent.deadline_unix_ms = T0 + 1000;
    expect_field(client.reconsider(no_intent).await.map(|_| ()), "intent_id");
    let mut retry_arriving = reconsider(good.clone(), "i");
    retry_arriving.arriving = true;
    expect_field(
        client.reconsider(retry_arriving).await.map(|_| ()),
        "arriving",
    );

    let watch = v1::WatchRequest {
        scopes: vec![],
        worker_id: "w".into(),
    };
    expect_field(client.watch(watch).await.map(|_| ()), "scopes");
    // A fresh lease of two tokens, released with these counts.
    let mut release_of_two = async |spent, retry_successes| {
        let lease_id = client
            .lease(lease(good.clone(), "w", 2))
            .await
            .expect("lease")
            .into_inner()
            .lease_id;
        let release = v1::ReleaseRequest {
            scope: good.clone(),
            worker_id: "w".into(),
            lease_id,
            spent,
            retry_successes,
        };
        client.release(release).await.map(|_| ())
    };
    expect_field(release_of_two(3, 0).await, "spent");
    expect_field(release_of_two(1, 2).await, "retry_successes");
    coordinator.stop().await;
}

#[tokio::test]
async fn another_callers_scope_is_permission_denied() {
    let coordinator = Coordinator::start(config(TENANT_A_TOKEN_TOML)).await;
    let mut client = coordinator.client().await;
    let own = scope("tenant-a", ROUTE, Priority::Normal);
    let other = scope("tenant-b", ROUTE, Priority::Normal);

    let ok = client
        .lease(with_token(lease(own.clone(), "w", 1), TENANT_A_TOKEN))
        .await;
    assert!(ok.is_ok(), "{ok:?}");
    let denied = client
        .lease(with_token(lease(other.clone(), "w", 1), TENANT_A_TOKEN))
        .await
        .expect_err("another caller's scope");
    assert_eq!(denied.code(), Code::PermissionDenied);
    let watch = v1::WatchRequest {
        scopes: vec![own.clone().expect("scope"), other.expect("scope")],
        worker_id: "w".into(),
    };
    let denied = client
        .watch(with_token(watch, TENANT_A_TOKEN))
        .await
        .expect_err("watching another caller's scope");
    assert_eq!(denied.code(), Code::PermissionDenied);
    let anonymous = client
        .lease(lease(own.clone(), "w", 1))
        .await
        .expect_err("no token");
    assert_eq!(anonymous.code(), Code::Unauthenticated);
    let wrong = client
        .lease(with_token(lease(own, "w", 1), "not-a-known-token"))
        .await
        .expect_err("unknown token");
    assert_eq!(wrong.code(), Code::Unauthenticated);
    coordinator.stop().await;
}

#[tokio::test]
async fn watch_delivers_a_cooldown_event() {
    let coordinator = Coordinator::open().await;
    let mut watcher = coordinator.client().await;
    let mut reporter = coordinator.client().await;
    let s = scope("tenant-a", ROUTE, Priority::Normal);
    let (mut stream, snapshot) = support::watch(&mut watcher, &s, "watcher").await;
    assert_eq!(snapshot.cooldown_until_unix_ms, 0);

    reporter
        .report(rate_limited(s, "worker-a", "30", ScopeCertainty::Known))
        .await
        .expect("report");
    let event = support::next_event(&mut stream, "an event in time").await;
    assert_eq!(event.kind(), ScopeEventKind::CooldownStarted);
    assert_eq!(event.cooldown_until_unix_ms, T0 + 30_000);

    // Shutdown ends the stream with a status instead of hanging the drain.
    let mut coordinator = coordinator;
    coordinator.begin_shutdown();
    support::watch_ends(&mut stream).await;
    coordinator.stop().await;
}

#[tokio::test]
async fn health_reports_the_budget_service_serving() {
    use tonic_health::pb::{
        HealthCheckRequest, health_check_response::ServingStatus, health_client::HealthClient,
    };
    let coordinator = Coordinator::open().await;
    let mut health = HealthClient::new(coordinator.channel().await);
    let answer = health
        .check(HealthCheckRequest {
            service: "tollgate.v1.Budget".into(),
        })
        .await
        .expect("health check")
        .into_inner();
    assert_eq!(answer.status(), ServingStatus::Serving);
    coordinator.stop().await;
}

/// A store whose `lease` waits at a gate, so a call can be held in flight.
struct GatedStore {
    inner: MemoryStore,
    entered: Notify,
    open: Notify,
}

impl Store for GatedStore {
    fn lease<'a>(
        &'a self,
        scope: &'a ScopeKey,
        ask: GrantAsk<'a>,
        policy: &'a Policy,
    ) -> StoreFuture<'a, LeaseOutcome> {
        Box::pin(async move {
            self.entered.notify_one();
            self.open.notified().await;
            self.inner.lease(scope, ask, policy).await
        })
    }
    fn release<'a>(&'a self, scope: &'a ScopeKey, end: LeaseEnd<'a>) -> StoreFuture<'a, u32> {
        self.inner.release(scope, end)
    }
    fn report<'a>(
        &'a self,
        scope: &'a ScopeKey,
        report: ReportBatch<'a>,
        policy: &'a Policy,
    ) -> StoreFuture<'a, Reported> {
        self.inner.report(scope, report, policy)
    }
    fn reconsider<'a>(
        &'a self,
        route: &'a RouteKey,
        ask: SlotAsk<'a>,
        policy: &'a Policy,
    ) -> StoreFuture<'a, Slotted> {
        self.inner.reconsider(route, ask, policy)
    }
    fn view<'a>(&'a self, route: &'a RouteKey, now_ms: i64) -> StoreFuture<'a, RouteView> {
        self.inner.view(route, now_ms)
    }
    fn set_freeze<'a>(
        &'a self,
        route: &'a RouteKey,
        reason: Option<String>,
        now_ms: i64,
    ) -> StoreFuture<'a, ()> {
        self.inner.set_freeze(route, reason, now_ms)
    }
    fn set_mute<'a>(
        &'a self,
        route: &'a RouteKey,
        worker_id: &'a str,
        until_ms: Option<i64>,
        now_ms: i64,
    ) -> StoreFuture<'a, bool> {
        self.inner.set_mute(route, worker_id, until_ms, now_ms)
    }
    fn list_scopes<'a>(
        &'a self,
        filter: &'a ScopeFilter,
        after: Option<&'a RouteKey>,
        limit: usize,
        now_ms: i64,
    ) -> StoreFuture<'a, ScopePage> {
        self.inner.list_scopes(filter, after, limit, now_ms)
    }
    fn scope_detail<'a>(
        &'a self,
        route: &'a RouteKey,
        policy: &'a Policy,
        now_ms: i64,
    ) -> StoreFuture<'a, Option<ScopeDetail>> {
        self.inner.scope_detail(route, policy, now_ms)
    }
    fn reset_scope<'a>(&'a self, route: &'a RouteKey, now_ms: i64) -> StoreFuture<'a, bool> {
        self.inner.reset_scope(route, now_ms)
    }
    fn evict_idle(&self, now_ms: i64, idle_ms: i64) -> StoreFuture<'_, usize> {
        self.inner.evict_idle(now_ms, idle_ms)
    }
}

#[tokio::test]
async fn shutdown_lets_an_in_flight_call_finish_then_stops() {
    let store = Arc::new(GatedStore {
        inner: MemoryStore::new(100),
        entered: Notify::new(),
        open: Notify::new(),
    });
    let mut coordinator =
        Coordinator::start_with_store(tollgate::config::Config::default(), store.clone()).await;
    let mut client = coordinator.client().await;
    let mut watcher = coordinator.client().await;
    let s = scope("tenant-a", ROUTE, Priority::Normal);
    let (mut stream, _) = support::watch(&mut watcher, &s, "watcher").await;
    let in_flight = tokio::spawn(async move { client.lease(lease(s, "w", 5)).await });
    store.entered.notified().await;

    coordinator.begin_shutdown();
    // The drain has begun once Watch streams end; the in-flight call keeps
    // the server running past that point.
    support::watch_ends(&mut stream).await;
    assert!(
        !coordinator.task.is_finished(),
        "the server waits for the in-flight call"
    );

    store.open.notify_one();
    let answer = in_flight
        .await
        .expect("task")
        .expect("the call completes")
        .into_inner();
    assert_eq!(answer.granted, 5);
    coordinator.stop().await;
}
