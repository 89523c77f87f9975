//! A coordinator that comes back without its memory (the in-memory store
//! after a crash, a SIGKILL, a redeploy) must not hand a fleet whose spend
//! it forgot a whole window's budget: it comes back in learning mode, the
//! allowance at the policy's floor and growing only as reports of first
//! attempts arrive again.

#[path = "support/process.rs"]
mod process;
mod support;

use process::Served;
use tollgate_proto::v1::{self, Priority};

use support::Coordinator;

/// Floor 1 retry/s over a 10 s window (10 tokens), plus half the first
/// attempts reported in the window.
const POLICY: &str = "[defaults]\nmin_retries_per_sec = 1\nretry_ratio = 0.5\nwindow = \"10s\"\n";

async fn busy_report(coordinator: &Coordinator, scope: &Option<v1::Scope>) {
    coordinator
        .client()
        .await
        .report(v1::ReportRequest {
            scope: scope.clone(),
            worker_id: "worker-a".into(),
            first_attempts: 1000,
            successes: 1000,
            rejections: 0,
            counts_age_ms: 0,
            evidence: Vec::new(),
        })
        .await
        .expect("report");
}

async fn lease_all(coordinator: &Coordinator, scope: &Option<v1::Scope>) -> u32 {
    coordinator
        .client()
        .await
        .lease(support::lease(scope.clone(), "worker-a", 10_000))
        .await
        .expect("lease")
        .into_inner()
        .granted
}

#[tokio::test]
async fn a_restarted_coordinator_grants_the_floor_until_reports_arrive() {
    let scope = support::scope("tenant-a", "GET /busy", Priority::Normal);

    let before = Coordinator::start(support::config(POLICY)).await;
    busy_report(&before, &scope).await;
    let granted_before = lease_all(&before, &scope).await;
    assert!(
        granted_before > 100,
        "a busy scope's budget: {granted_before}"
    );
    before.stop().await;

    // The same fleet, a coordinator that remembers nothing of it.
    let after = Coordinator::start(support::config(POLICY)).await;
    let granted_after = lease_all(&after, &scope).await;
    assert!(
        granted_after <= 10,
        "at most the floor (1/s × 10 s) before any report: {granted_after}"
    );

    // Reports come back: the budget is learned again from them.
    busy_report(&after, &scope).await;
    let granted_later = lease_all(&after, &scope).await;
    assert!(granted_later > 100, "learned again: {granted_later}");
    after.stop().await;
}

/// A real `tollgate serve` listening on `port`, SERVING.
async fn serve(port: u16, log: &str) -> Served {
    let mut command = std::process::Command::new(process::BIN);
    command
        .args(["serve", "--listen", &format!("127.0.0.1:{port}")])
        .env_remove("TOLLGATE_STORE")
        .env_remove("TOLLGATE_LISTEN");
    let dir = process::temp_dir("chaos-restart");
    let mut served = Served::spawn(command, port, &dir.join(log));
    served.until_serving().await;
    served
}

/// Workers calling Lease every 20 ms; returns, per worker, how long after
/// `fault` its link first went `Degraded` (None: it never did before `until`).
async fn time_to_fallback(
    links: &[std::sync::Arc<tollgate_client::link::CoordinatorLink>],
    fault: tokio::time::Instant,
    until: tokio::time::Instant,
) -> Vec<Option<std::time::Duration>> {
    let scope = support::scope("tenant-a", "GET /chaos", Priority::Normal);
    // Collected, so every worker starts now rather than when awaited.
    let tasks: Vec<_> = links
        .iter()
        .map(|link| {
            let (link, scope) = (std::sync::Arc::clone(link), scope.clone());
            tokio::spawn(async move {
                while tokio::time::Instant::now() < until {
                    let _ = link
                        .lease(support::lease(scope.clone(), link.worker_id(), 1))
                        .await;
                    if link.state() == tollgate_client::LinkState::Degraded {
                        return Some(fault.elapsed());
                    }
                    tokio::time::sleep(support::ms(20)).await;
                }
                None
            })
        })
        .collect();
    let mut out = Vec::new();
    for task in tasks {
        out.push(task.await.expect("worker task"));
    }
    out
}

/// Chaos against a real coordinator process: SIGKILL, restart, SIGSTOP for
/// 5 s, SIGCONT. Each worker's link falls back within one RPC timeout of
/// the fault (plus its 20 ms call spacing), comes back when the coordinator
/// does, and the restarted coordinator grants a busy scope only the floor.
#[tokio::test(flavor = "multi_thread")]
#[ignore = "real processes and seconds of real time: cargo test --test chaos_restart -- --ignored"]
async fn chaos_kill_stop_restart_workers_fall_back_within_one_rpc_timeout() {
    use tollgate_client::link::{CoordinatorLink, LinkConfig};
    const RPC_TIMEOUT: std::time::Duration = std::time::Duration::from_millis(500);
    let port = process::free_port();
    let mut coordinator = serve(port, "serve-1.log").await;
    let links: Vec<_> = (0..8)
        .map(|i| {
            let mut config = LinkConfig::new(coordinator.url(), format!("worker-{i}"));
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
        })
        .await
        .expect("report");
    let before = links[0]
        .lease(support::lease(scope.clone(), "worker-0", 10_000))
        .await
        .expect("lease")
        .granted;

    // SIGKILL: connections reset; each worker's next call fails.
    coordinator.kill();
    let fault = tokio::time::Instant::now();
    let killed = time_to_fallback(&links, fault, fault + support::secs(5)).await;
    eprintln!("SIGKILL: time to fallback per worker: {killed:?}");
    for t in &killed {
        let t = t.expect("every worker falls back");
        assert!(t <= RPC_TIMEOUT + support::ms(250), "{t:?}");
    }

    // Restart: learning mode, then SIGSTOP for 5 s: calls time out.
    coordinator = serve(port, "serve-2.log").await;
    support::poll("workers reconnect", support::secs(10), || async {
        links[0]
            .lease(support::lease(scope.clone(), "worker-0", 1))
            .await
            .is_ok()
    })
    .await;
    let after = links[1]
        .lease(support::lease(scope.clone(), "worker-1", 10_000))
        .await
        .expect("lease after restart")
        .granted;
    eprintln!("busy scope: granted {before} before the SIGKILL, {after} after the restart");
    assert!(
        after <= 100 && after < before,
        "learning mode: {after} vs {before}"
    );

    coordinator.signal("STOP");
    let fault = tokio::time::Instant::now();
    let stopped = time_to_fallback(&links, fault, fault + support::secs(5)).await;
    // Held stopped for the whole 5 s: a hung host, not a blip.
    tokio::time::sleep_until(fault + support::secs(5)).await;
    coordinator.signal("CONT");
    eprintln!("SIGSTOP: time to fallback per worker: {stopped:?}");
    for t in &stopped {
        let t = t.expect("every worker falls back");
        assert!(t <= RPC_TIMEOUT + support::ms(250), "{t:?}");
    }
    support::poll(
        "workers reconnect after SIGCONT",
        support::secs(10),
        || async {
            links[2]
                .lease(support::lease(scope.clone(), "worker-2", 1))
                .await
                .is_ok()
        },
    )
    .await;
}
