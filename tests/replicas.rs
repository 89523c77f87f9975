//! Three coordinator replicas on one Redis: one budget, one cooldown, Watch
//! across replicas, and what a Redis outage does. Each test starts its own
//! `redis-server` (skipped with a notice when it is not installed, unless
//! `TOLLGATE_REQUIRE_REDIS=1` or under CI). Time is one manual clock for
//! the fleet; each replica reads it directly, or through its host's skew
//! corrected by the shipped `RedisClock` against the Redis server's
//! `TIME`. Nothing sleeps for time to pass — waits are short polls under
//! an overall bound.

mod support;

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use support::{Coordinator, T0, lease, poll, rate_limited, rate_limited_at, reconsider, scope};
use tokio::task::JoinSet;
use tollgate::config::Config;
use tollgate::server::relay::EventRelay;
use tollgate::store::redis::{RedisClock, RedisOptions, RedisStore, RedisTarget};
use tollgate_client::clock::{Clock, ManualClock, from_unix_ms, to_unix_ms};
use tollgate_proto::v1::{self, Priority, ScopeCertainty, ScopeEventKind};
use tollgate_testkit::RedisServer;
use tonic::Code;
use tonic_health::pb::{
    HealthCheckRequest, health_check_response::ServingStatus, health_client::HealthClient,
};

use support::ROUTE;
const PREFIX: &str = "tollgate";

struct Fleet {
    redis: RedisServer,
    replicas: Vec<Coordinator>,
}

/// One replica host's own clock: the fleet's manual clock as this host
/// reads it, `skew_ms` off. The replica reads it through the shipped
/// [`RedisClock`], which corrects it by its measured offset to the Redis
/// server's `TIME`, as it corrects a real host's system clock.
#[derive(Debug)]
struct HostClock {
    fleet: Arc<ManualClock>,
    skew_ms: i64,
}

impl Clock for HostClock {
    fn now(&self) -> SystemTime {
        from_unix_ms(to_unix_ms(self.fleet.now()) + self.skew_ms)
    }
}

/// A skewed host: its own clock, and the `RedisClock` over it that its
/// replica reads.
struct SkewedHost {
    local: Arc<HostClock>,
    corrected: RedisClock,
}

impl SkewedHost {
    fn local_ms(&self) -> i64 {
        to_unix_ms(self.local.now())
    }

    fn now(&self) -> SystemTime {
        self.corrected.now()
    }
}

impl Fleet {
    /// Three replicas reading one manual clock, as if they shared a time
    /// source.
    async fn start() -> Option<Fleet> {
        let clock = Arc::new(ManualClock::new(from_unix_ms(T0)));
        Fleet::start_on(clock.clone(), [clock.clone(), clock.clone(), clock]).await
    }

    /// Three replicas whose hosts' clocks are `skews_ms` off the fleet's,
    /// each read through a `RedisClock` calibrated against the test's
    /// Redis; returns the hosts.
    async fn start_skewed(skews_ms: [i64; 3]) -> Option<(Fleet, [SkewedHost; 3])> {
        let fleet = Arc::new(ManualClock::new(from_unix_ms(T0)));
        let hosts = skews_ms.map(|skew_ms| {
            let local = Arc::new(HostClock {
                fleet: fleet.clone(),
                skew_ms,
            });
            SkewedHost {
                corrected: RedisClock::over(local.clone()),
                local,
            }
        });
        let clocks = [0, 1, 2].map(|i| Arc::new(hosts[i].corrected.clone()) as Arc<dyn Clock>);
        let started = Fleet::start_on(fleet, clocks).await?;
        let redis = redis::Client::open(started.redis.url()).expect("client");
        for host in &hosts {
            host.corrected.calibrate(&redis).await.expect("TIME");
        }
        Some((started, hosts))
    }

    async fn start_on(fleet: Arc<ManualClock>, clocks: [Arc<dyn Clock>; 3]) -> Option<Fleet> {
        let redis = RedisServer::start()?;
        let target = RedisTarget::parse(&redis.url()).expect("url");
        let mut replicas = Vec::new();
        for clock in clocks {
            let store = RedisStore::connect(target.clone(), RedisOptions::default())
                .await
                .expect("connect");
            let relay = EventRelay::new(&target, PREFIX).expect("relay");
            replicas.push(
                Coordinator::start_replica(
                    Config::default(),
                    Arc::new(store),
                    Some(relay),
                    fleet.clone(),
                    clock,
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
        rejections: 0,
        counts_age_ms: 0,
        evidence: Vec::new(),
        stated_limit: None,
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
    // normal reaches its 0.6 share plus bulk's unspent 0.2:
    // 0.8 × (10/s × 10 s + 0.2 × 30 × 100 first attempts)
    let formula = 8 * (10 * 10 + 2 * 30 * 100 / 10) / 10;
    assert_eq!(formula, 560);
    assert!(granted <= formula, "granted {granted} > {formula}");
    assert!(
        granted >= formula - 30,
        "granted {granted}: the fleet should use its budget (at most one token each lost to rounding)"
    );
    fleet.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hint_on_replica_1_holds_back_replica_3_until_a_reset_on_replica_2() {
    let Some(fleet) = Fleet::start().await else {
        return;
    };
    let s = scope("tenant-a", ROUTE, Priority::Normal);
    let mut reporter = fleet.replicas[0].client().await;
    let mut waiter = fleet.replicas[2].client().await;
    let (mut stream, snapshot) = support::watch(&mut waiter, &s, "worker-c").await;
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
    let event = support::next_event(&mut stream, "an event in time").await;
    assert_eq!(event.kind(), ScopeEventKind::CooldownStarted);
    assert_eq!(event.cooldown_until_unix_ms, T0 + 30_000);

    // Via Reconsider: read from the shared store.
    // A slot that far off is not given yet: ask again, within the horizon
    // (1 s) of the cooldown's end at the earliest.
    let answer = waiter
        .reconsider(reconsider(s, "intent-1"))
        .await
        .expect("reconsider")
        .into_inner();
    assert_eq!(answer.cooldown_until_unix_ms, T0 + 30_000);
    assert_eq!(answer.decision(), v1::ReconsiderDecision::AskAgain);
    assert!(answer.ask_again_unix_ms >= T0 + 29_000, "{answer:?}");

    // An operator's reset on replica 2 ends the cooldown on replica 3's
    // Watch too (relayed like every other change).
    let mut admin = fleet.replicas[1].admin().await;
    admin
        .reset_scope(v1::ResetScopeRequest {
            caller_scope: "tenant-a".into(),
            route: ROUTE.into(),
            reason: "stuck cooldown".into(),
        })
        .await
        .expect("reset");
    let event = tokio::time::timeout(Duration::from_secs(5), stream.message())
        .await
        .expect("an event in time")
        .expect("stream")
        .expect("event");
    assert_eq!(event.kind(), ScopeEventKind::CooldownEnded);
    assert_eq!(event.cooldown_until_unix_ms, 0);
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
            client.lease(request).await.map(|r| r.into_inner().granted)
        });
    }
    // UNAVAILABLE is the store's own bound (`op_timeout`) firing; a call
    // that hung would end as DEADLINE_EXCEEDED (or CANCELLED) at the
    // client's deadline instead. So the code alone says "fast", with no
    // stopwatch a loaded machine could break.
    for result in calls.join_all().await {
        let status = result.expect_err("no store, no grant");
        assert_eq!(status.code(), Code::Unavailable, "{status:?}");
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
    // more than one window's floor allowance anew (normal reaches 0.8 of
    // 100: its share and bulk's).
    let after = clients[0]
        .lease(lease(s.clone(), "greedy", 1000))
        .await
        .expect("lease")
        .into_inner();
    assert!(after.granted <= 80, "granted {}", after.granted);

    // Watch relays resubscribed too: a hint on replica 1 reaches replica 3.
    fleet.wait_for_relays().await;
    let (mut stream, snapshot) = support::watch(&mut clients[2], &s, "worker-c").await;
    assert_eq!(
        snapshot.cooldown_until_unix_ms, 0,
        "cooldowns are lost with Redis"
    );
    clients[0]
        .report(rate_limited(s, "worker-a", "30", ScopeCertainty::Known))
        .await
        .expect("report");
    let event = support::next_event(&mut stream, "an event in time").await;
    // The probes and the greedy worker are active too: one worker's 30 s
    // is uncorroborated, so the fleet holds only to the 5 s cap.
    assert_eq!(event.cooldown_until_unix_ms, T0 + 5_000);
    fleet.stop().await;
}

/// A Reconsider on the corrected clock's day (the helper's deadline is
/// [`T0`]-based): `intent` with an hour left.
fn reconsider_at(s: Option<v1::Scope>, intent: &str, now_ms: i64) -> v1::ReconsiderRequest {
    v1::ReconsiderRequest {
        deadline_unix_ms: now_ms + 3_600_000,
        ..reconsider(s, intent)
    }
}

/// One lease of one token from every replica in turn; returns what each
/// saw remaining after its grant.
async fn remaining_on_each(fleet: &Fleet, s: &Option<v1::Scope>, round: &str) -> Vec<u64> {
    let mut remaining = Vec::new();
    for (i, replica) in fleet.replicas.iter().enumerate() {
        let answer = replica
            .client()
            .await
            .lease(lease(s.clone(), &format!("{round}-w{i}"), 1))
            .await
            .expect("lease")
            .into_inner();
        assert_eq!(answer.granted, 1, "{round}: replica {i} granted nothing");
        remaining.push(answer.remaining);
    }
    remaining
}

/// Replicas on hosts whose clocks are seconds apart, each following the
/// Redis server's `TIME`: they keep one window and end one cooldown
/// together. Uncorrected, the host 7 s ahead would drop the window's
/// first attempts and end the cooldown early, the one 4 s behind late.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replicas_with_skewed_clocks_agree_on_budget_and_cooldown_through_redis_time() {
    let Some((fleet, hosts)) = Fleet::start_skewed([-4_000, 0, 7_000]).await else {
        return;
    };
    let local: Vec<i64> = hosts.iter().map(|h| h.local_ms()).collect();
    assert_eq!(
        (local[1] - local[0], local[2] - local[1]),
        (4_000, 7_000),
        "the hosts' own clocks disagree"
    );
    // The corrected clocks agree to within the calibrations' round trips;
    // start mid-second so that gap never straddles a budget bucket.
    let now = |i: usize| to_unix_ms(hosts[i].now());
    fleet.replicas[0].advance(Duration::from_millis(
        u64::try_from((1_500 - now(0).rem_euclid(1_000)) % 1_000).expect("ms"),
    ));
    for i in 1..3 {
        let apart = (now(i) - now(0)).abs();
        assert!(apart < 200, "replica {i} is {apart} ms from replica 0");
    }

    // Budget: one window of first attempts, reported to replica 0.
    let s = scope("tenant-a", ROUTE, Priority::Normal);
    fleet.replicas[0]
        .client()
        .await
        .report(first_attempts(s.clone(), "reporter", 100))
        .await
        .expect("report");
    let fresh = remaining_on_each(&fleet, &s, "fresh").await;
    // 9 s on, the reports are still in every replica's 10 s window.
    fleet.replicas[0].advance(Duration::from_secs(9));
    let later = remaining_on_each(&fleet, &s, "later").await;
    // 11 s on, they have left every replica's window.
    fleet.replicas[0].advance(Duration::from_secs(2));
    let expired = remaining_on_each(&fleet, &s, "expired").await;
    for (round, seen) in [("fresh", &fresh), ("later", &later), ("expired", &expired)] {
        assert_eq!(
            seen.clone(),
            vec![seen[0], seen[0] - 1, seen[0] - 2],
            "{round}: one ledger, one grant after another"
        );
    }
    assert_eq!(later[0], fresh[2] - 1, "the reports still count at 9 s");
    assert!(
        expired[0] < later[2] - 1,
        "the reports left the window at 11 s: {expired:?} after {later:?}"
    );

    // Cooldown: a 30 s hint received by replica 0's worker.
    let c = scope("tenant-a", "GET /cooldown", Priority::Normal);
    let received = now(0);
    fleet.replicas[0]
        .client()
        .await
        .report(rate_limited_at(
            c.clone(),
            "worker-a",
            "30",
            ScopeCertainty::Known,
            received,
        ))
        .await
        .expect("report");
    // 29.5 s on, every replica still holds intents to the cooldown's end
    // (near enough for a slot: within the 1 s reconsider horizon, whatever
    // the calibrations' gap); 31 s on, every replica has ended it.
    for (round, by) in [("during", 29_500), ("after", 1_500)] {
        fleet.replicas[0].advance(Duration::from_millis(by));
        let fleet_now = now(0);
        for (i, replica) in fleet.replicas.iter().enumerate() {
            let answer = replica
                .client()
                .await
                .reconsider(reconsider_at(c.clone(), &format!("{round}-{i}"), fleet_now))
                .await
                .expect("reconsider")
                .into_inner();
            let expected = if round == "during" {
                assert_eq!(
                    answer.cooldown_until_unix_ms,
                    received + 30_000,
                    "replica {i} holds intents to the cooldown's end"
                );
                received + 30_000
            } else {
                fleet_now
            };
            // A slot, or ask again within a second: during, the intents of
            // the other replicas queue too; after, the cooldown is over on
            // every replica and the intents left waiting during it (earlier
            // deadlines) take the first slots.
            let held = match answer.decision() {
                v1::ReconsiderDecision::Slot => {
                    (expected..expected + 1_000).contains(&answer.slot_unix_ms)
                }
                v1::ReconsiderDecision::AskAgain => {
                    // After, up to five intents are ahead at the 10/s
                    // floor, and an ask-again is spread over a quarter
                    // more of its wait.
                    let (earliest, latest) = if round == "during" {
                        (expected - 1_000, expected + 1_000)
                    } else {
                        (expected, expected + 2_000)
                    };
                    (round == "during" || answer.cooldown_until_unix_ms <= fleet_now)
                        && (earliest..latest).contains(&answer.ask_again_unix_ms)
                }
                _ => false,
            };
            assert!(
                held,
                "{round}: replica {i} answered {answer:?} for {expected}"
            );
        }
    }
    fleet.stop().await;
}
