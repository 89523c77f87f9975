//! Capacity belongs to tenants: the scope table is shared by every caller
//! token, and each has a quota of it. A real server on loopback, real
//! tonic clients, a manual clock; the attack is one tenant filling the
//! table with scopes it cooled down itself (its own 429s, 300 s each).

mod support;

use support::{ADMIN_TOKEN, Coordinator, config, lease, rate_limited, scope, with_token};
use tollgate_proto::v1::budget_client::BudgetClient;
use tollgate_proto::v1::{self, Priority, ScopeCertainty};
use tonic::transport::Channel;

const A: &str = "token-of-tenant-a";
const B: &str = "token-of-tenant-b";

/// A table of 8 scopes, two tenants (4 each by default), an admin.
const TWO_TENANTS: &str = r#"
[server]
max_scopes = 8

[[token]]
token = "token-of-tenant-a"
caller_scopes = ["tenant-a"]
name = "team-a"

[[token]]
token = "token-of-tenant-b"
caller_scopes = ["tenant-b"]
name = "team-b"

[[admin_token]]
name = "oncall"
token = "admin-token-123"
"#;

/// The routes the Admin API lists for `tenant` (a `[[token]]` name).
async fn held_by(coordinator: &Coordinator, tenant: &str) -> Vec<String> {
    let page = coordinator
        .admin()
        .await
        .list_scopes(with_token(
            v1::ListScopesRequest {
                tenant: tenant.into(),
                ..v1::ListScopesRequest::default()
            },
            ADMIN_TOKEN,
        ))
        .await
        .expect("list scopes")
        .into_inner();
    page.scopes
        .iter()
        .inspect(|s| assert_eq!(s.tenant, tenant))
        .map(|s| s.route.clone())
        .collect()
}

/// Tenant B reports fifty first attempts on `GET /orders`: its scope is
/// reported on, nothing live in it now, the coldest scope of the table.
async fn b_reports_on_its_scope(client: &mut BudgetClient<Channel>) {
    client
        .report(with_token(
            v1::ReportRequest {
                scope: scope("tenant-b", "GET /orders", Priority::Normal),
                worker_id: "b-1".into(),
                first_attempts: 50,
                ..v1::ReportRequest::default()
            },
            B,
        ))
        .await
        .expect("b's report");
}

/// Tenant A cools down forty invented routes with its own 429s (300 s
/// each), through each of `clients` in turn; what each report got.
async fn a_cools_down_forty_routes(
    clients: &mut [BudgetClient<Channel>],
) -> Vec<Result<(), tonic::Code>> {
    let mut flooded = Vec::new();
    for i in 0..40 {
        let s = scope("tenant-a", &format!("GET /invented/{i}"), Priority::Normal);
        let answer = clients[i % clients.len()]
            .report(with_token(
                rate_limited(s, "a-1", "300", ScopeCertainty::Known),
                A,
            ))
            .await;
        flooded.push(answer.map(drop).map_err(|s| s.code()));
    }
    flooded
}

#[tokio::test]
async fn a_tenant_filling_its_quota_with_cooled_down_scopes_evicts_only_its_own() {
    let coordinator = Coordinator::start(config(TWO_TENANTS)).await;
    let mut client = coordinator.client().await;
    // Before quotas, B's scope was the first to go.
    b_reports_on_its_scope(&mut client).await;
    let flooded = a_cools_down_forty_routes(std::slice::from_mut(&mut client)).await;
    // B's scope is still there, with its first attempts.
    assert_eq!(held_by(&coordinator, "team-b").await, ["GET /orders"]);
    let state = coordinator
        .admin()
        .await
        .get_scope(with_token(
            v1::GetScopeRequest {
                caller_scope: "tenant-b".into(),
                route: "GET /orders".into(),
            },
            ADMIN_TOKEN,
        ))
        .await
        .expect("b's scope")
        .into_inner();
    assert_eq!(state.first_attempts_in_window, 50);
    // B is not locked out of new scopes either: within its quota, a new
    // one is made at once (before, `scope limit reached` for 300 s).
    for route in ["GET /orders", "GET /payments", "GET /users"] {
        let leased = client
            .lease(with_token(
                lease(scope("tenant-b", route, Priority::Normal), "b-1", 1),
                B,
            ))
            .await
            .expect("b's lease");
        assert_eq!(leased.into_inner().granted, 1, "{route}");
    }
    assert_eq!(held_by(&coordinator, "team-b").await.len(), 3);
    // At its quota, A's own coldest scopes made room, cooldown or not: A
    // was served throughout and holds its quota.
    assert_eq!(flooded, vec![Ok(()); 40]);
    assert_eq!(held_by(&coordinator, "team-a").await.len(), 4);
    coordinator.stop().await;
}

#[tokio::test]
async fn a_tenant_whose_scopes_are_all_busy_is_refused_naming_its_quota() {
    let coordinator = Coordinator::start(config(TWO_TENANTS)).await;
    let mut client = coordinator.client().await;
    // Four leases hold A's four scopes.
    for i in 0..4 {
        client
            .lease(with_token(
                lease(
                    scope("tenant-a", &format!("GET /{i}"), Priority::Normal),
                    "a",
                    1,
                ),
                A,
            ))
            .await
            .expect("a's quota");
    }
    let refused = client
        .lease(with_token(
            lease(scope("tenant-a", "GET /5", Priority::Normal), "a", 1),
            A,
        ))
        .await
        .expect_err("past a's quota");
    assert_eq!(refused.code(), tonic::Code::ResourceExhausted);
    assert!(refused.message().contains("max_scopes"), "{refused:?}");
    // B is served, its first scope made.
    client
        .lease(with_token(
            lease(scope("tenant-b", "GET /5", Priority::Normal), "b", 1),
            B,
        ))
        .await
        .expect("b's lease");
    // An unknown tenant name is refused, naming the field.
    let unknown = coordinator
        .admin()
        .await
        .list_scopes(with_token(
            v1::ListScopesRequest {
                tenant: "team-z".into(),
                ..v1::ListScopesRequest::default()
            },
            ADMIN_TOKEN,
        ))
        .await
        .expect_err("no such tenant");
    assert_eq!(unknown.code(), tonic::Code::InvalidArgument);
    assert!(unknown.message().contains("tenant"), "{unknown:?}");
    coordinator.stop().await;
}

/// The same attacks on two replicas sharing one Redis: each token's quota
/// is counted in Redis, so it holds whichever replica a call reaches.
mod on_redis {
    use super::*;
    use tollgate_testkit::RedisServer;

    /// Two replicas of the two-tenant coordinator on one fresh Redis; `None`
    /// (the test skips) where no redis-server is installed.
    async fn replicas() -> Option<(RedisServer, [Coordinator; 2])> {
        let redis = RedisServer::start()?;
        let one = Coordinator::start_on_redis(config(TWO_TENANTS), &redis.url()).await;
        let two = Coordinator::start_on_redis(config(TWO_TENANTS), &redis.url()).await;
        Some((redis, [one, two]))
    }

    #[tokio::test]
    async fn a_tenant_filling_its_quota_through_two_replicas_evicts_only_its_own() {
        let Some((_redis, [one, two])) = replicas().await else {
            return;
        };
        let mut clients = [one.client().await, two.client().await];
        b_reports_on_its_scope(&mut clients[0]).await;
        // A's reports alternate replicas.
        let flooded = a_cools_down_forty_routes(&mut clients).await;
        assert_eq!(flooded, vec![Ok(()); 40]);
        // Either replica lists what each tenant holds (no FAILED_PRECONDITION).
        assert_eq!(held_by(&two, "team-b").await, ["GET /orders"]);
        assert_eq!(held_by(&one, "team-a").await.len(), 4);
        assert_eq!(held_by(&two, "team-a").await.len(), 4);
        // B is not locked out of new scopes.
        for (i, route) in ["GET /payments", "GET /users"].into_iter().enumerate() {
            let leased = clients[i % 2]
                .lease(with_token(
                    lease(scope("tenant-b", route, Priority::Normal), "b-1", 1),
                    B,
                ))
                .await
                .expect("b's lease");
            assert_eq!(leased.into_inner().granted, 1, "{route}");
        }
        assert_eq!(held_by(&one, "team-b").await.len(), 3);
        one.stop().await;
        two.stop().await;
    }

    #[tokio::test]
    async fn a_tenant_whose_scopes_are_all_busy_is_refused_on_every_replica() {
        let Some((_redis, [one, two])) = replicas().await else {
            return;
        };
        let mut clients = [one.client().await, two.client().await];
        // Four leases, two through each replica, hold A's four scopes.
        for i in 0..4 {
            clients[i % 2]
                .lease(with_token(
                    lease(
                        scope("tenant-a", &format!("GET /{i}"), Priority::Normal),
                        "a",
                        1,
                    ),
                    A,
                ))
                .await
                .expect("a's quota");
        }
        for client in &mut clients {
            let refused = client
                .lease(with_token(
                    lease(scope("tenant-a", "GET /5", Priority::Normal), "a", 1),
                    A,
                ))
                .await
                .expect_err("past a's quota");
            assert_eq!(refused.code(), tonic::Code::ResourceExhausted);
            assert!(refused.message().contains("max_scopes"), "{refused:?}");
        }
        // B is served on both.
        for (i, client) in clients.iter_mut().enumerate() {
            client
                .lease(with_token(
                    lease(
                        scope("tenant-b", &format!("GET /{i}"), Priority::Normal),
                        "b",
                        1,
                    ),
                    B,
                ))
                .await
                .expect("b's lease");
        }
        one.stop().await;
        two.stop().await;
    }
}
