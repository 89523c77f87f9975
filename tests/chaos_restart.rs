//! A coordinator that comes back without its memory (the in-memory store
//! after a crash, a SIGKILL, a redeploy) must not hand a fleet whose spend
//! it forgot a whole window's budget: it comes back in learning mode, the
//! allowance at the policy's floor and growing only as reports of first
//! attempts arrive again. What it keeps is its state file: the runtime
//! changes an operator made before the crash.
//!
//! Both tests run the shipped binary: `tollgate serve` SIGKILLed and
//! started again on the same policy file and `--state` file.

#[path = "support/process.rs"]
mod process;
mod support;

use std::path::Path;
use std::process::Command;

use process::{Front, Served};
use tollgate_client::LinkState;
use tollgate_client::link::{CoordinatorLink, LinkConfig, LinkError};
use tollgate_proto::v1::{self, Priority, admin_client::AdminClient, budget_client::BudgetClient};

/// Floor 1 retry/s over a 10 s window (10 tokens), plus half the first
/// attempts reported in the window.
const POLICY: &str = "[defaults]\nmin_retries_per_sec = 1\nretry_ratio = 0.5\nwindow = \"10s\"\n";

/// `tollgate serve` on `dir`'s policy file and state file, on a port of
/// its own choosing, SERVING; its log is `dir/{run}.log`.
async fn serve(dir: &Path, run: &str) -> Served {
    let mut command = Command::new(process::BIN);
    command
        .args(["serve", "--listen", "127.0.0.1:0", "--config"])
        .arg(dir.join("policy.toml"))
        .arg("--state")
        .arg(dir.join("state.json"))
        .env_remove("TOLLGATE_STORE")
        .env_remove("TOLLGATE_LISTEN");
    let mut served = Served::spawn(command, &dir.join(format!("{run}.log")));
    served.until_serving().await;
    served
}

async fn budget(served: &Served) -> BudgetClient<tonic::transport::Channel> {
    BudgetClient::connect(served.url()).await.expect("connect")
}

async fn busy_report(served: &Served, scope: &Option<v1::Scope>) {
    budget(served)
        .await
        .report(v1::ReportRequest {
            scope: scope.clone(),
            worker_id: "worker-a".into(),
            first_attempts: 1000,
            successes: 1000,
            rejections: 0,
            counts_age_ms: 0,
            evidence: Vec::new(),
            stated_limit: None,
        })
        .await
        .expect("report");
}

async fn lease_all(served: &Served, scope: &Option<v1::Scope>) -> u32 {
    budget(served)
        .await
        .lease(support::lease(scope.clone(), "worker-a", 10_000))
        .await
        .expect("lease")
        .into_inner()
        .granted
}

/// The freeze of `tenant-a`/`route` as the coordinator shows it.
async fn freeze_of(served: &Served, route: &str) -> Option<v1::FreezeState> {
    AdminClient::connect(served.url())
        .await
        .expect("connect")
        .get_scope(v1::GetScopeRequest {
            caller_scope: "tenant-a".into(),
            route: route.into(),
        })
        .await
        .expect("get scope")
        .into_inner()
        .freeze
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restarted_coordinator_grants_the_floor_until_reports_arrive() {
    let dir = process::temp_dir("chaos-restart-floor");
    std::fs::write(dir.join("policy.toml"), POLICY).expect("policy file");
    let scope = support::scope("tenant-a", "GET /busy", Priority::Normal);

    let mut before = serve(&dir, "before").await;
    // An operator's change, which the state file must carry across.
    AdminClient::connect(before.url())
        .await
        .expect("connect")
        .freeze_scope(v1::FreezeScopeRequest {
            caller_scope: "tenant-a".into(),
            route: "GET /frozen".into(),
            reason: "kept across the restart".into(),
            duration_ms: 0,
        })
        .await
        .expect("freeze");
    busy_report(&before, &scope).await;
    let granted_before = lease_all(&before, &scope).await;
    assert!(
        granted_before > 100,
        "a busy scope's budget: {granted_before}"
    );
    before.kill();

    // The same coordinator, started again on its state file: it remembers
    // the operator's freeze and nothing of the fleet's spend.
    let after = serve(&dir, "after").await;
    let freeze = freeze_of(&after, "GET /frozen")
        .await
        .expect("the freeze came back from the state file");
    assert!(freeze.frozen, "{freeze:?}");
    assert_eq!(freeze.reason, "kept across the restart");
    let granted_after = lease_all(&after, &scope).await;
    assert!(
        granted_after <= 10,
        "at most the floor (1/s × 10 s) before any report: {granted_after}"
    );

    // Reports come back: the budget is learned again from them.
    busy_report(&after, &scope).await;
    let granted_later = lease_all(&after, &scope).await;
    assert!(granted_later > 100, "learned again: {granted_later}");
    drop(after);
    let _ = std::fs::remove_dir_all(&dir);
}

/// How long anything in the chaos test may take before it counts as a
/// hang: a guard, not a measurement.
const HANG: std::time::Duration = std::time::Duration::from_secs(30);

/// Each worker calls Lease every 20 ms until its link goes `Degraded`;
/// returns, per worker, the failures it saw until then, in order. Panics
/// when a worker is not degraded within [`HANG`].
async fn until_every_link_falls_back(
    links: &[std::sync::Arc<CoordinatorLink>],
) -> Vec<Vec<String>> {
    let scope = support::scope("tenant-a", "GET /chaos", Priority::Normal);
    // Collected, so every worker starts now rather than when awaited.
    let tasks: Vec<_> = links
        .iter()
        .map(|link| {
            let (link, scope) = (std::sync::Arc::clone(link), scope.clone());
            tokio::spawn(async move {
                let give_up = tokio::time::Instant::now() + HANG;
                let mut failures = Vec::new();
                loop {
                    if let Err(err) = link
                        .lease(support::lease(scope.clone(), link.worker_id(), 1))
                        .await
                    {
                        failures.push(describe(&err));
                    }
                    if link.state() == LinkState::Degraded {
                        return failures;
                    }
                    assert!(
                        tokio::time::Instant::now() < give_up,
                        "{} not degraded within {HANG:?}: {failures:?}",
                        link.worker_id()
                    );
                    tokio::time::sleep(support::ms(20)).await;
                }
            })
        })
        .collect();
    let mut out = Vec::new();
    for task in tasks {
        out.push(task.await.expect("worker task"));
    }
    out
}

/// A link failure as `no answer` (it timed out, on the link's own bound or
/// on the deadline it sent with the call: the coordinator may have been
/// reached) or the status code's name.
fn describe(err: &LinkError) -> String {
    match err {
        err if err.may_have_arrived() => "no answer".into(),
        LinkError::Status(status) => format!("{:?}", status.code()),
        LinkError::Timeout(_) => unreachable!("a timeout may have arrived"),
    }
}

/// Until every link's calls succeed again (on a scope of their own, so the
/// probes spend nothing of the busy scope's budget).
async fn until_every_link_is_back(links: &[std::sync::Arc<CoordinatorLink>], what: &str) {
    let probe = support::scope("tenant-a", "GET /probe", Priority::Normal);
    for link in links {
        support::poll(what, HANG, || async {
            link.lease(support::lease(probe.clone(), link.worker_id(), 1))
                .await
                .is_ok()
        })
        .await;
        assert_eq!(link.state(), LinkState::Connected);
    }
}

/// Chaos against a real coordinator process behind a fixed address (as a
/// Service in front of a pod): SIGKILL, restart, SIGSTOP until every
/// worker has fallen back, SIGCONT. Each worker's link falls back at its
/// first failed call — a closed connection after the kill, a call timed
/// out on its deadline against the stopped process, so never later than
/// one RPC timeout — comes back when the coordinator does, and the
/// restarted coordinator grants a busy scope only the floor. No duration of real
/// time is asserted: the link's own timeout is what bounds the fallback,
/// and every wait is a poll that only a hang fails.
#[tokio::test(flavor = "multi_thread")]
#[ignore = "real processes and seconds of real time: cargo test --test chaos_restart -- --ignored"]
async fn chaos_kill_stop_restart_workers_fall_back_at_their_first_failed_call() {
    const RPC_TIMEOUT: std::time::Duration = std::time::Duration::from_millis(500);
    let dir = process::temp_dir("chaos-restart");
    std::fs::write(dir.join("policy.toml"), POLICY).expect("policy file");
    let mut coordinator = serve(&dir, "serve-1").await;
    let front = Front::to(coordinator.addr).await;
    let links: Vec<_> = (0..8)
        .map(|i| {
            let mut config = LinkConfig::new(front.url(), format!("worker-{i}"));
            config.rpc_timeout = RPC_TIMEOUT;
            std::sync::Arc::new(CoordinatorLink::new(&config).expect("link"))
        })
        .collect();
    let scope = support::scope("tenant-a", "GET /busy", Priority::Normal);
    links[0]
        .report(v1::ReportRequest {
            scope: scope.clone(),
            worker_id: "worker-0".into(),
            first_attempts: 1000,
            successes: 1000,
            rejections: 0,
            counts_age_ms: 0,
            evidence: Vec::new(),
            stated_limit: None,
        })
        .await
        .expect("report");
    let before = links[0]
        .lease(support::lease(scope.clone(), "worker-0", 10_000))
        .await
        .expect("lease")
        .granted;

    // SIGKILL: connections reset; each worker's next call fails at once.
    coordinator.kill();
    let killed = until_every_link_falls_back(&links).await;
    eprintln!("SIGKILL: failures per worker until its fallback: {killed:?}");
    for failures in &killed {
        assert_eq!(failures.len(), 1, "the first failure degrades: {killed:?}");
    }

    // Restart behind the same address: learning mode.
    coordinator = serve(&dir, "serve-2").await;
    front.point_at(coordinator.addr);
    until_every_link_is_back(&links, "every worker reconnects").await;
    let after = links[1]
        .lease(support::lease(scope.clone(), "worker-1", 10_000))
        .await
        .expect("lease after restart")
        .granted;
    eprintln!("busy scope: granted {before} before the SIGKILL, {after} after the restart");
    assert!(
        after <= 10 && after < before,
        "learning mode, at most the floor (1/s × 10 s): {after} vs {before}"
    );

    // SIGSTOP: a hung host. Calls time out on the link's own bound; the
    // process stays stopped until every worker has fallen back.
    coordinator.signal("STOP");
    let stopped = until_every_link_falls_back(&links).await;
    coordinator.signal("CONT");
    eprintln!("SIGSTOP: failures per worker until its fallback: {stopped:?}");
    for failures in &stopped {
        assert_eq!(
            failures,
            &["no answer"],
            "the first call to time out degrades: {stopped:?}"
        );
    }
    until_every_link_is_back(&links, "every worker reconnects after SIGCONT").await;
    drop(coordinator);
    let _ = std::fs::remove_dir_all(&dir);
}
