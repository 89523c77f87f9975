//! Three coordinator replicas on one Redis: one budget, one cooldown, Watch
//! across replicas, and what a Redis outage does. Each test starts its own
//! `redis-server` (skipped with a notice when it is not installed, unless
//! `TOLLGATE_REQUIRE_REDIS=1`). Time is one manual clock shared by the
//! replicas, as `RedisClock` gives real ones; nothing sleeps for time to
//! pass — waits are short polls under an overall bound.

mod common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use common::{Coordinator, T0, lease, rate_limited, reconsider, scope};
use tokio::task::JoinSet;
use tollgate::config::Config;
use tollgate::store::redis::{EventRelay, RedisOptions, RedisStore, RedisTarget};
use tollgate::testing::RedisServer;
use tollgate_client::clock::{ManualClock, from_unix_ms};
use tollgate_proto::v1::{self, Priority, ScopeCertainty, ScopeEventKind};
use tonic::Code;
use tonic_health::pb::{
    HealthCheckRequest, health_check_response::ServingStatus, health_client::HealthClient,
};

const ROUTE: &str = "GET /users/{id}";
const PREFIX: &str = "tollgate";

struct Fleet {
    redis: RedisServer,
    replicas: Vec<Coordinator>,
}

impl Fleet {
    async fn start() -> Option<Fleet> {
        let redis = RedisServer::start()?;
        let clock = Arc::new(ManualClock::new(from_unix_ms(T0)));
        let target = RedisTarget::parse(&redis.url()).expect("url");
        let mut replicas = Vec::new();
        for _ in 0..3 {
            let store = RedisStore::connect(target.clone(), RedisOptions::default())
                .await
                .expect("connect");
            let relay = EventRelay::new(&target, PREFIX).expect("relay");
            replicas.push(
                Coordinator::start_replica(
                    Config::default(),
                    Arc::new(store),
                    Some(relay),
                    clock.clone(),
                )
                .await,
            );
        }
        let fleet = Fleet { redis, replicas };
        fleet.wait_for_relays().await;
        Some(fleet)
    }

    /// Until every replica's relay is subscribed (after a start or a Redis
    /// restart), so a change published now reaches all of them.
    async fn wait_for_relays(&self) {
        let client = redis::Client::open(self.redis.url()).expect("client");
        poll(
            "every relay subscribed",
            Duration::from_secs(10),
            || async {
                let Ok(mut conn) = client.get_multiplexed_async_connection().await else {
                    return false;
                };
                let counts: redis::RedisResult<(String, i64)> = redis::cmd("PUBSUB")
                    .arg("NUMSUB")
                    .arg(format!("{PREFIX}:events"))
                    .query_async(&mut conn)
                    .await;
                matches!(counts, Ok((_, n)) if n >= 3)
            },
        )
        .await;
    }

    async fn stop(self) {
        for replica in self.replicas {
            replica.stop().await;
        }
    }
}

/// Polls `check` every 20 ms until it holds; panics after `bound`.
async fn poll<F, Fut>(what: &str, bound: Duration, mut check: F)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    let start = Instant::now();
    while !check().await {
        assert!(start.elapsed() < bound, "{what}: not within {bound:?}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

async fn health(replica: &Coordinator) -> Option<ServingStatus> {
    let mut client = HealthClient::new(replica.channel().await);
    let answer = client
        .check(HealthCheckRequest {
            service: "tollgate.v1.Budget".into(),
        })
        .await
        .ok()?;
    Some(answer.into_inner().status())
}

fn first_attempts(s: Option<v1::Scope>, worker: &str, n: u32) -> v1::ReportRequest {
    v1::ReportRequest {
        scope: s,
        worker_id: worker.into(),
        first_attempts: n,
        successes: 0,
        evidence: Vec::new(),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn thirty_workers_on_three_replicas_share_one_budget() {
    let Some(fleet) = Fleet::start().await else {
        return;
    };
    let s = scope("tenant-a", ROUTE, Priority::Normal);
    let mut clients = Vec::new();
    for i in 0..30 {
        clients.push(fleet.replicas[i % 3].client().await);
    }
    // Every worker reports 100 first attempts, on its own replica.
    let mut reports = JoinSet::new();
    for (i, client) in clients.iter().enumerate() {
        let mut client = client.clone();
        let s = s.clone();
        reports.spawn(async move {
            client
                .report(first_attempts(s, &format!("w{i}"), 100))
                .await
                .expect("report");
        });
    }
    reports.join_all().await;

    // Then all of them lease concurrently until refused.
    let mut leases = JoinSet::new();
    for (i, client) in clients.into_iter().enumerate() {
        let mut client = client;
        let s = s.clone();
        leases.spawn(async move {
            let mut total = 0;
            for _ in 0..100 {
                let answer = client
                    .lease(lease(s.clone(), &format!("w{i}"), 5))
                    .await
                    .expect("lease")
                    .into_inner();
                if answer.granted == 0 {
                    break;
                }
                total += answer.granted;
            }
            total
        });
    }
    let granted: u32 = leases.join_all().await.into_iter().sum();
    // normal share 0.3 × (10/s × 10 s + 0.2 × 30 × 100 first attempts)
    let formula = 3 * (10 * 10 + 2 * 30 * 100 / 10) / 10;
    assert_eq!(formula, 210);
    assert!(granted <= formula, "granted {granted} > {formula}");
    assert!(
        granted >= formula - 30,
        "granted {granted}: the fleet should use its budget (at most one token each lost to rounding)"
    );
    fleet.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hint_reported_to_replica_1_holds_back_a_worker_on_replica_3() {
    let Some(fleet) = Fleet::start().await else {
        return;
    };
    let s = scope("tenant-a", ROUTE, Priority::Normal);
    let mut reporter = fleet.replicas[0].client().await;
    let mut waiter = fleet.replicas[2].client().await;
    let (mut stream, snapshot) = common::watch(&mut waiter, &s, "worker-c").await;
    assert_eq!(snapshot.cooldown_until_unix_ms, 0);

    reporter
        .report(rate_limited(
            s.clone(),
            "worker-a",
            "30",
            ScopeCertainty::Known,
        ))
        .await
        .expect("report");

    // Via Watch: pushed across replicas through Redis pub/sub.
    let event = tokio::time::timeout(Duration::from_secs(5), stream.message())
        .await
        .expect("an event in time")
        .expect("stream")
        .expect("event");
    assert_eq!(event.kind(), ScopeEventKind::CooldownStarted);
    assert_eq!(event.cooldown_until_unix_ms, T0 + 30_000);

    // Via Reconsider: read from the shared store.
    let answer = waiter
        .reconsider(reconsider(s, "intent-1"))
        .await
        .expect("reconsider")
        .into_inner();
    assert_eq!(answer.cooldown_until_unix_ms, T0 + 30_000);
    assert!(answer.slot_unix_ms >= T0 + 30_000);
    fleet.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn losing_redis_answers_unavailable_fast_and_recovery_needs_no_restart() {
    let Some(mut fleet) = Fleet::start().await else {
        return;
    };
    let s = scope("tenant-a", ROUTE, Priority::Normal);
    let mut clients = Vec::new();
    for replica in &fleet.replicas {
        clients.push(replica.client().await);
    }
    let granted = clients[1]
        .lease(lease(s.clone(), "w", 5))
        .await
        .expect("lease while Redis is up")
        .into_inner()
        .granted;
    assert_eq!(granted, 5);

    fleet.redis.kill();

    // Every call ends well inside its deadline, as UNAVAILABLE (the
    // client's fallback budget takes over), never hangs.
    let deadline = Duration::from_secs(3);
    let mut calls = JoinSet::new();
    for i in 0..12 {
        let mut client = clients[i % 3].clone();
        let s = s.clone();
        calls.spawn(async move {
            let mut request = tonic::Request::new(lease(s, &format!("w{i}"), 1));
            request.set_timeout(deadline);
            let start = Instant::now();
            let result = client.lease(request).await;
            (start.elapsed(), result.map(|r| r.into_inner().granted))
        });
    }
    for (took, result) in calls.join_all().await {
        let status = result.expect_err("no store, no grant");
        assert_eq!(status.code(), Code::Unavailable, "{status:?}");
        assert!(took < Duration::from_millis(1500), "took {took:?}");
    }
    for replica in &fleet.replicas {
        poll("health NOT_SERVING", Duration::from_secs(5), || async {
            health(replica).await == Some(ServingStatus::NotServing)
        })
        .await;
    }

    // Redis comes back (empty: it keeps nothing on disk). No replica is
    // restarted; each reconnects by itself.
    fleet.redis.restart();
    for (i, client) in clients.iter().enumerate() {
        poll("leases again", Duration::from_secs(10), || {
            let mut client = client.clone();
            let s = s.clone();
            async move {
                client
                    .lease(lease(s, &format!("probe{i}"), 1))
                    .await
                    .is_ok()
            }
        })
        .await;
    }
    for replica in &fleet.replicas {
        poll("health SERVING", Duration::from_secs(5), || async {
            health(replica).await == Some(ServingStatus::Serving)
        })
        .await;
    }
    // What was lost is what docs/deploying.md says: the window's state.
    // The budget restarts from the floor, so a restart can never grant
    // more than one window's floor allowance (normal 0.3 × 100) anew.
    let after = clients[0]
        .lease(lease(s.clone(), "greedy", 1000))
        .await
        .expect("lease")
        .into_inner();
    assert!(after.granted <= 30, "granted {}", after.granted);

    // Watch relays resubscribed too: a hint on replica 1 reaches replica 3.
    fleet.wait_for_relays().await;
    let (mut stream, snapshot) = common::watch(&mut clients[2], &s, "worker-c").await;
    assert_eq!(
        snapshot.cooldown_until_unix_ms, 0,
        "cooldowns are lost with Redis"
    );
    clients[0]
        .report(rate_limited(s, "worker-a", "30", ScopeCertainty::Known))
        .await
        .expect("report");
    let event = tokio::time::timeout(Duration::from_secs(5), stream.message())
        .await
        .expect("an event in time")
        .expect("stream")
        .expect("event");
    assert_eq!(event.cooldown_until_unix_ms, T0 + 30_000);
    fleet.stop().await;
}
