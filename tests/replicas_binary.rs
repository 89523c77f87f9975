//! Three `tollgate serve` processes on one Redis (the test's own
//! `redis-server`), the `tollgate` CLI against one or another of them, a
//! worker on each: the fleet behaves as one coordinator — one budget, one
//! cooldown, Watch across replicas, and an SRE's policy change, freeze and
//! audit the same whichever replica the Service picked. Then Redis is lost
//! and comes back, and no replica is restarted.
//!
//! Real processes and real time (the replicas follow Redis's `TIME`), so
//! every wait is a poll under a generous bound that only a hang reaches:
//! how fast a change spreads is not asserted (a loaded machine would fail
//! it), only that it does.

#[path = "support/process.rs"]
mod process;
mod support;

use std::net::SocketAddr;
use std::path::Path;
use std::process::{Command, Output};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use process::{BIN, Served};
use support::{lease, scope, with_token};
use tokio::task::JoinSet;
use tollgate_proto::v1::{
    self, LeaseLimit, Priority, ScopeCertainty, ScopeEventKind, budget_client::BudgetClient,
};
use tollgate_testkit::RedisServer;
use tonic::Code;
use tonic::transport::Channel;
use tonic_health::pb::health_check_response::ServingStatus;

const ADMIN: &str = support::ADMIN_TOKEN;
const CALLER: &str = support::TENANT_A_TOKEN;
/// How long a change may take to be in force on every replica before the
/// poll gives up: a guard against a hang, far beyond any propagation, not
/// a latency bound.
const EVERYWHERE: Duration = Duration::from_secs(30);

struct Fleet {
    redis: RedisServer,
    replicas: Vec<Served>,
}

fn policy() -> String {
    format!(
        "{}\n[[rule]]\nroute = \"GET /budget\"\nwindow = \"60s\"\nmin_retries_per_sec = 1\nretry_ratio = 0.1\n",
        support::POLICY_WITH_TOKENS
    )
}

fn now_ms() -> i64 {
    i64::try_from(
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .expect("after 1970")
            .as_millis(),
    )
    .expect("ms")
}

impl Fleet {
    async fn start(dir: &Path) -> Option<Fleet> {
        let redis = RedisServer::start()?;
        std::fs::write(dir.join("policy.toml"), policy()).expect("policy file");
        let mut replicas = Vec::new();
        for i in 0..3 {
            let mut command = Command::new(BIN);
            command
                .args(["serve", "--listen", "127.0.0.1:0"])
                .arg("--config")
                .arg(dir.join("policy.toml"))
                .args(["--store", &redis.url(), "--reload-interval", "50ms"])
                .env_remove("TOLLGATE_STORE")
                .env_remove("TOLLGATE_LISTEN")
                .env("RUST_LOG", "info");
            let log = dir.join(format!("replica-{i}.log"));
            replicas.push(Served::spawn(command, &log));
        }
        for replica in &mut replicas {
            replica.until_serving().await;
        }
        Some(Fleet { redis, replicas })
    }

    async fn worker(&self, i: usize) -> BudgetClient<Channel> {
        BudgetClient::connect(self.replicas[i].url())
            .await
            .expect("connect")
    }

    /// The CLI binary against replica `i`.
    fn cli(&self, i: usize, args: &[&str]) -> Output {
        cli_at(self.replicas[i].addr, args)
    }
}

fn cli_at(addr: SocketAddr, args: &[&str]) -> Output {
    Command::new(BIN)
        .args(args)
        .env("TOLLGATE_SERVER", addr.to_string())
        .env("TOLLGATE_ADMIN_TOKEN", ADMIN)
        .output()
        .expect("run the cli")
}

fn ok(output: &Output) -> String {
    assert!(
        output.status.success(),
        "{}\n{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8_lossy(&output.stdout).into_owned()
}

async fn lease_as(
    client: &mut BudgetClient<Channel>,
    route: &str,
    worker: &str,
    want: u32,
) -> Result<v1::LeaseResponse, tonic::Status> {
    let s = scope("tenant-a", route, Priority::Normal);
    client
        .lease(with_token(lease(s, worker, want), CALLER))
        .await
        .map(tonic::Response::into_inner)
}

/// Polls every worker until `check` holds for each one's lease answer.
async fn on_every_replica(
    workers: &[BudgetClient<Channel>],
    route: &str,
    what: &str,
    check: impl Fn(&v1::LeaseResponse) -> bool,
) -> Vec<v1::LeaseResponse> {
    let mut answers = Vec::new();
    for (i, worker) in workers.iter().enumerate() {
        let give_up = tokio::time::Instant::now() + EVERYWHERE;
        loop {
            let answer = lease_as(&mut worker.clone(), route, &format!("probe{i}"), 1)
                .await
                .expect("lease");
            if check(&answer) {
                answers.push(answer);
                break;
            }
            assert!(
                tokio::time::Instant::now() < give_up,
                "replica {i}: {what} not within {EVERYWHERE:?} (a hang): {answer:?}"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
    answers
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_serve_processes_on_one_redis_are_one_coordinator() {
    let dir = process::temp_dir("replicas-binary");
    let Some(mut fleet) = Fleet::start(&dir).await else {
        return;
    };
    let mut workers = Vec::new();
    for i in 0..3 {
        workers.push(fleet.worker(i).await);
    }
    // The start-up log says the state is in Redis and names no
    // `max_scopes`: that bounds only the in-memory store.
    for replica in &fleet.replicas {
        let log = replica.log();
        assert!(log.contains("scope state in Redis"), "{log}");
        assert!(!log.contains("max_scopes"), "{log}");
    }

    one_budget(&workers).await;
    one_cooldown_watched_across_replicas(&workers).await;
    let version = policy_and_freeze_through_any_replica(&fleet, &workers).await;
    stale_changes_refused_and_audit_complete(&fleet).await;
    redis_lost_and_back(&mut fleet, &workers, version).await;
    file_edits_keep_runtime_changes_until_cleared(&fleet, &dir, &workers).await;
    drop(fleet);
    let _ = std::fs::remove_dir_all(&dir);
}

/// Workers on three replicas report first attempts, then lease at once:
/// the grants add up to no more than the one formula.
async fn one_budget(workers: &[BudgetClient<Channel>]) {
    let s = scope("tenant-a", "GET /budget", Priority::Normal);
    for (i, worker) in workers.iter().enumerate() {
        let report = v1::ReportRequest {
            scope: s.clone(),
            worker_id: format!("w{i}"),
            first_attempts: 100,
            successes: 0,
            rejections: 0,
            counts_age_ms: 0,
            evidence: Vec::new(),
            stated_limit: None,
        };
        worker
            .clone()
            .report(with_token(report, CALLER))
            .await
            .expect("report");
    }
    let mut leases = JoinSet::new();
    for (i, worker) in workers.iter().enumerate() {
        let mut worker = worker.clone();
        leases.spawn(async move {
            let mut total = 0;
            for _ in 0..100 {
                let answer = lease_as(&mut worker, "GET /budget", &format!("w{i}"), 2)
                    .await
                    .expect("lease");
                if answer.granted == 0 {
                    break;
                }
                total += answer.granted;
            }
            total
        });
    }
    let granted: u32 = leases.join_all().await.into_iter().sum();
    // normal reaches its 0.6 share and bulk's 0.2:
    // 0.8 × (1/s × 60 s + 0.1 × 300 first attempts) = 72
    assert!(granted <= 72, "granted {granted} > 72 across replicas");
    assert!(
        granted >= 69,
        "granted {granted}: the fleet uses its one budget"
    );
}

/// A 429 reported on replica 1 is the cooldown a Lease on replica 2
/// answers with, and a Watch on replica 3 is told.
async fn one_cooldown_watched_across_replicas(workers: &[BudgetClient<Channel>]) {
    let route = "GET /users/{id}";
    let s = scope("tenant-a", route, Priority::Normal);
    let mut watcher = workers[2].clone();
    let mut stream = watcher
        .watch(with_token(
            v1::WatchRequest {
                scopes: vec![s.clone().expect("scope")],
                worker_id: "watcher".into(),
            },
            CALLER,
        ))
        .await
        .expect("watch")
        .into_inner();
    let snapshot = support::next_event(&mut stream, "the snapshot").await;
    assert_eq!(snapshot.kind(), ScopeEventKind::Snapshot);
    let at = now_ms();
    let report = support::rate_limited_at(s.clone(), "worker-a", "30", ScopeCertainty::Known, at);
    workers[0]
        .clone()
        .report(with_token(report, CALLER))
        .await
        .expect("report");
    let event = support::next_event(&mut stream, "the cooldown, across replicas").await;
    assert_eq!(event.kind(), ScopeEventKind::CooldownStarted);
    assert!(event.cooldown_until_unix_ms >= at + 29_000, "{event:?}");
    let answer = lease_as(&mut workers[1].clone(), route, "worker-b", 1)
        .await
        .expect("lease");
    assert_eq!(answer.cooldown_until_unix_ms, event.cooldown_until_unix_ms);
}

/// `policy set` through replica 1 and `scopes freeze` through replica 2
/// are in force on all three, with one `policy_version`.
async fn policy_and_freeze_through_any_replica(
    fleet: &Fleet,
    workers: &[BudgetClient<Channel>],
) -> u64 {
    ok(&fleet.cli(
        0,
        &[
            "policy",
            "set",
            "GET /sre",
            "min_retries_per_sec=100",
            "--reason",
            "INC-1",
        ],
    ));
    let set = lease_as(&mut workers[0].clone(), "GET /sre", "sre", 1)
        .await
        .expect("lease");
    assert!(set.policy_version >= 2, "{set:?}");
    let answers = on_every_replica(workers, "GET /sre", "the new policy", |a| {
        a.policy_version == set.policy_version
    })
    .await;
    // The new formula is the one every replica grants under: 0.3 × 100/s × 10 s.
    for answer in &answers {
        assert!(answer.granted == 1 && answer.remaining > 100, "{answer:?}");
    }
    ok(&fleet.cli(
        1,
        &[
            "scopes", "freeze", "tenant-a", "GET /sre", "--reason", "INC-1", "--for", "10m",
        ],
    ));
    on_every_replica(workers, "GET /sre", "the freeze", |a| {
        a.limit() == LeaseLimit::Frozen && a.granted == 0
    })
    .await;
    // The freeze's record (who, expiry) is on every replica too.
    for i in 0..3 {
        let shown = ok(&fleet.cli(i, &["scopes", "-o", "json", "show", "tenant-a", "GET /sre"]));
        assert!(
            shown.contains("INC-1") && shown.contains("oncall"),
            "replica {i}: {shown}"
        );
    }
    set.policy_version
}

/// Two SREs on two replicas change the same rule from the same version:
/// one wins, the other is told it is stale. The audit read from any replica
/// is the whole fleet's.
async fn stale_changes_refused_and_audit_complete(fleet: &Fleet) {
    let get = ok(&fleet.cli(2, &["policy", "-o", "json", "get", "GET /sre"]));
    let read: serde_json::Value = serde_json::from_str(&get).expect("json");
    let version = read["policy_version"]
        .as_u64()
        .expect("policy_version")
        .to_string();
    let addrs = [fleet.replicas[0].addr, fleet.replicas[2].addr];
    let runs: Vec<_> = addrs
        .iter()
        .zip(["retry_ratio=0.3", "retry_ratio=0.4"])
        .map(|(&addr, change)| {
            let version = version.clone();
            std::thread::spawn(move || {
                cli_at(
                    addr,
                    &["policy", "set", "GET /sre", change, "--version", &version],
                )
            })
        })
        .collect();
    let codes: Vec<i32> = runs
        .into_iter()
        .map(|r| r.join().expect("cli").status.code().expect("exit code"))
        .collect();
    let mut sorted = codes.clone();
    sorted.sort_unstable();
    assert_eq!(sorted, [0, 6], "one wins, one is stale: {codes:?}");

    let audits: Vec<serde_json::Value> = (0..3)
        .map(|i| {
            let out = ok(&fleet.cli(i, &["audit", "-o", "json", "--limit", "50"]));
            serde_json::from_str(&out).expect("json")
        })
        .collect();
    assert_eq!(audits[0], audits[1]);
    assert_eq!(audits[1], audits[2]);
    let records = audits[0].as_array().expect("records");
    let actions: Vec<&str> = records
        .iter()
        .map(|r| r["action"].as_str().expect("action"))
        .collect();
    assert_eq!(
        actions,
        ["policy.patch", "scope.freeze", "policy.patch"],
        "newest first: {records:?}"
    );
    let seqs: Vec<u64> = records
        .iter()
        .map(|r| r["seq"].as_u64().expect("seq"))
        .collect();
    assert!(seqs.windows(2).all(|w| w[0] == w[1] + 1), "{seqs:?}");
}

/// Redis goes away: every replica answers UNAVAILABLE and reports
/// NOT_SERVING; it comes back (empty) and every replica serves again
/// without a restart, with the runtime policy it had.
async fn redis_lost_and_back(fleet: &mut Fleet, workers: &[BudgetClient<Channel>], version: u64) {
    fleet.redis.kill();
    for (i, worker) in workers.iter().enumerate() {
        // The store's own bound (`op_timeout`) answers UNAVAILABLE; a hang
        // would end as DEADLINE_EXCEEDED at this deadline instead, which
        // is generous so that only a hang reaches it.
        let mut request = with_token(
            lease(scope("tenant-a", "GET /x", Priority::Normal), "w", 1),
            CALLER,
        );
        request.set_timeout(Duration::from_secs(10));
        let status = worker.clone().lease(request).await.expect_err("no store");
        assert_eq!(status.code(), Code::Unavailable, "replica {i}: {status:?}");
    }
    for replica in &fleet.replicas {
        replica.until_health(ServingStatus::NotServing).await;
    }
    fleet.redis.restart();
    for replica in &fleet.replicas {
        replica.until_health(ServingStatus::Serving).await;
    }
    // Redis kept nothing, but the replicas did: the SRE's rule is still in
    // force, at a version no lower than before, the same on all three, and
    // so is the freeze (docs/deploying.md's failure table says so).
    let answers = on_every_replica(workers, "GET /sre", "serving again, frozen", |a| {
        a.policy_version >= version && a.limit() == LeaseLimit::Frozen
    })
    .await;
    assert!(
        answers
            .windows(2)
            .all(|w| w[0].policy_version == w[1].policy_version)
    );
}

/// The ConfigMap gains a rule: every replica serves it, and the SRE's
/// runtime rule stays in force (shown as drift) until `policy clear`.
async fn file_edits_keep_runtime_changes_until_cleared(
    fleet: &Fleet,
    dir: &Path,
    workers: &[BudgetClient<Channel>],
) {
    let before = lease_as(&mut workers[0].clone(), "GET /sre", "sre", 1)
        .await
        .expect("lease")
        .policy_version;
    let edited = format!(
        "{}\n[[rule]]\nroute = \"GET /added\"\npolicy_version = 40\n",
        policy()
    );
    std::fs::write(dir.join("policy.toml"), edited).expect("edit the policy file");
    on_every_replica(workers, "GET /added", "the file's new rule", |a| {
        a.policy_version == 40
    })
    .await;
    on_every_replica(workers, "GET /sre", "the runtime rule kept", |a| {
        a.policy_version == before
    })
    .await;
    let diff = fleet.cli(2, &["policy", "diff"]);
    assert_eq!(diff.status.code(), Some(7), "the runtime rule is drift");
    ok(&fleet.cli(
        1,
        &["policy", "clear", "GET /sre", "--reason", "back to Git"],
    ));
    let diff = fleet.cli(0, &["policy", "diff"]);
    assert_eq!(
        diff.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&diff.stdout)
    );
    let missing = fleet.cli(2, &["policy", "clear", "GET /sre"]);
    assert_eq!(missing.status.code(), Some(5), "nothing left to clear");
}

/// A Redis holding scope state that an older build wrote (keys under the
/// prefix, no store format named) is refused at start: `serve` exits 1
/// with one line saying what to delete, and claims nothing. Emptied, the
/// same Redis is claimed and served.
#[test]
fn serve_refuses_state_an_older_build_wrote() {
    let Some(redis) = RedisServer::start() else {
        return;
    };
    let mut conn = redis::Client::open(redis.url())
        .expect("client")
        .get_connection()
        .expect("connect");
    let route_key = "tollgate:{tenant-a|GET /users/*}:r";
    let _: () = redis::cmd("HSET")
        .arg(route_key)
        .arg("k")
        .arg("written by an older build")
        .query(&mut conn)
        .expect("HSET");
    let serve = |listen: &str| {
        let mut command = Command::new(BIN);
        command
            .args(["serve", "--listen", listen, "--store", &redis.url()])
            .env_remove("TOLLGATE_STORE")
            .env_remove("TOLLGATE_LISTEN")
            .env_remove("TOLLGATE_CONFIG");
        command
    };
    let refused = serve("127.0.0.1:0").output().expect("run serve");
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert_eq!(refused.status.code(), Some(1), "{stderr}");
    let line = stderr
        .lines()
        .find(|l| l.contains("older Tollgate"))
        .unwrap_or_else(|| panic!("no refusal in: {stderr}"));
    assert!(line.contains("delete the prefix's keys"), "{line}");
    let format: Option<String> = redis::cmd("GET")
        .arg("tollgate:format")
        .query(&mut conn)
        .expect("GET");
    assert_eq!(format, None, "a refused prefix is not claimed");

    let _: () = redis::cmd("DEL")
        .arg(route_key)
        .query(&mut conn)
        .expect("DEL");
    let command = serve("127.0.0.1:0");
    let dir = process::temp_dir("format");
    let mut served = Served::spawn(command, &dir.join("serve.log"));
    tokio::runtime::Runtime::new()
        .expect("runtime")
        .block_on(served.until_serving());
    let format: Option<String> = redis::cmd("GET")
        .arg("tollgate:format")
        .query(&mut conn)
        .expect("GET");
    assert_eq!(
        format,
        Some(tollgate::store::redis::STORE_FORMAT.to_string())
    );
    drop(served);
    let _ = std::fs::remove_dir_all(&dir);
}
