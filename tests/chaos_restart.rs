//! A coordinator that comes back without its memory (the in-memory store
//! after a crash, a SIGKILL, a redeploy) must not hand a fleet whose spend
//! it forgot a whole window's budget: it comes back in learning mode, the
//! allowance at the policy's floor and growing only as reports of first
//! attempts arrive again.

mod support;

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
