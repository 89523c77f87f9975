//! Corroborated evidence end to end: one faulty worker must not stall a
//! tenant. A real coordinator on loopback, real tonic clients, the manual
//! clock (nothing sleeps for time to pass).

mod support;

use support::{Coordinator, T0, rate_limited, reconsider, scope};
use tollgate_proto::v1::{
    self, Priority, ReconsiderDecision, ScopeCertainty, ScopeEventKind, budget_client::BudgetClient,
};
use tonic::transport::Channel;

use support::ROUTE;

fn route() -> Option<v1::Scope> {
    scope("tenant-a", ROUTE, Priority::Normal)
}

/// Workers `w0..wN` report first attempts only: active, no evidence.
async fn quiet_fleet(client: &mut BudgetClient<Channel>, n: usize) {
    for i in 0..n {
        client
            .report(v1::ReportRequest {
                scope: route(),
                worker_id: format!("w{i}"),
                first_attempts: 1,
                ..v1::ReportRequest::default()
            })
            .await
            .expect("report");
    }
}

async fn hint(
    client: &mut BudgetClient<Channel>,
    worker: &str,
    retry_after: &str,
    certainty: ScopeCertainty,
) -> i64 {
    client
        .report(rate_limited(route(), worker, retry_after, certainty))
        .await
        .expect("report")
        .into_inner()
        .cooldown_until_unix_ms
}

#[tokio::test]
async fn one_workers_enormous_hint_holds_ten_quiet_workers_only_to_the_cap() {
    let coordinator = Coordinator::open().await;
    let mut client = coordinator.client().await;
    let (mut stream, _) = support::watch(&mut client, &route(), "watcher").await;
    quiet_fleet(&mut client, 11).await;

    let cooldown = hint(&mut client, "w0", "999999999", ScopeCertainty::Known).await;
    assert_eq!(cooldown, T0 + 5_000, "the uncorroborated cap, not 300 s");
    let event = support::next_event(&mut stream, "the capped cooldown").await;
    assert_eq!(event.kind(), ScopeEventKind::CooldownStarted);
    assert!(!event.cooldown_corroborated);
    assert_eq!(event.cooldown_workers, 1);

    // Another worker's intent waits the cap, not 300 s (plus at most a
    // second of slot pacing).
    let (answer, _) = coordinator
        .reconsider_until_answered(&mut client, reconsider(route(), "intent-1"))
        .await;
    assert_eq!(answer.decision(), ReconsiderDecision::Slot);
    assert!(answer.slot_unix_ms < T0 + 6_000, "{}", answer.slot_unix_ms);

    let state = coordinator.scope_state("tenant-a", ROUTE).await;
    let e = state.route_evidence.expect("evidence");
    assert_eq!((e.corroborated, e.reporters, e.needed), (false, 1, 3));
    assert_eq!(e.disagreeing[0].worker_id, "w0");
    assert_eq!(e.disagreeing[0].uncorroborated, 1);
    coordinator.stop().await;
}

#[tokio::test]
async fn three_agreeing_workers_set_the_full_cooldown() {
    let coordinator = Coordinator::open().await;
    let mut client = coordinator.client().await;
    let (mut stream, _) = support::watch(&mut client, &route(), "watcher").await;
    quiet_fleet(&mut client, 11).await;
    hint(&mut client, "w0", "60", ScopeCertainty::Known).await;
    support::next_event(&mut stream, "the capped cooldown").await;
    hint(&mut client, "w1", "60", ScopeCertainty::Known).await;
    let cooldown = hint(&mut client, "w2", "60", ScopeCertainty::Known).await;
    assert_eq!(cooldown, T0 + 60_000);
    let event = support::next_event(&mut stream, "the corroborated cooldown").await;
    assert_eq!(event.cooldown_until_unix_ms, T0 + 60_000);
    assert!(event.cooldown_corroborated);
    assert_eq!(event.cooldown_workers, 3);
    coordinator.stop().await;
}

/// Workers agreeing on a cooldown under the cap do not move its end, but
/// watchers hear that it is corroborated now (first attempts may wait).
#[tokio::test]
async fn a_cooldown_that_becomes_corroborated_without_moving_is_announced() {
    let coordinator = Coordinator::open().await;
    let mut client = coordinator.client().await;
    let (mut stream, _) = support::watch(&mut client, &route(), "watcher").await;
    quiet_fleet(&mut client, 11).await;
    for worker in ["w0", "w1", "w2"] {
        assert_eq!(
            hint(&mut client, worker, "3", ScopeCertainty::Known).await,
            T0 + 3_000,
            "{worker}: the same end"
        );
    }
    let started = support::next_event(&mut stream, "the cooldown").await;
    assert_eq!(started.kind(), ScopeEventKind::CooldownStarted);
    assert!(!started.cooldown_corroborated);
    let supported = support::next_event(&mut stream, "its corroboration").await;
    assert_eq!(supported.kind(), ScopeEventKind::CooldownSupportChanged);
    assert_eq!(supported.cooldown_until_unix_ms, T0 + 3_000);
    assert!(supported.cooldown_corroborated);
    assert_eq!(supported.cooldown_workers, 3);
    coordinator.stop().await;
}

/// `worker` was refused with no `Retry-After`, received at `at_unix_ms`.
async fn refused_without_hint(
    client: &mut BudgetClient<Channel>,
    worker: &str,
    at_unix_ms: i64,
) -> i64 {
    client
        .report(v1::ReportRequest {
            scope: route(),
            worker_id: worker.into(),
            rejections: 1,
            evidence: vec![v1::Evidence {
                http_status: 429,
                receipt_unix_ms: at_unix_ms,
                sent_unix_ms: at_unix_ms - 50,
                ..v1::Evidence::default()
            }],
            ..v1::ReportRequest::default()
        })
        .await
        .expect("report")
        .into_inner()
        .cooldown_until_unix_ms
}

#[tokio::test]
async fn refusals_without_hints_corroborate_a_claim_only_as_far_as_they_reach() {
    let coordinator = Coordinator::open().await;
    let mut client = coordinator.client().await;
    let (mut stream, _) = support::watch(&mut client, &route(), "watcher").await;
    quiet_fleet(&mut client, 11).await;
    assert_eq!(
        hint(&mut client, "w0", "300", ScopeCertainty::Known).await,
        T0 + 5_000
    );
    let event = support::next_event(&mut stream, "the capped cooldown").await;
    assert!(!event.cooldown_corroborated);
    // Two other workers refused 2 s and 3 s in, without a hint: the
    // upstream itself says it is refusing, for their refusals plus the cap.
    coordinator.advance(std::time::Duration::from_secs(2));
    let cooldown = refused_without_hint(&mut client, "w1", T0 + 2_000).await;
    assert_eq!(
        cooldown,
        T0 + 7_000,
        "one worker refused reaches its own cap"
    );
    let event = support::next_event(&mut stream, "one refusal's reach").await;
    assert!(!event.cooldown_corroborated);
    coordinator.advance(std::time::Duration::from_secs(1));
    let cooldown = refused_without_hint(&mut client, "w2", T0 + 3_000).await;
    assert_eq!(
        cooldown,
        T0 + 8_000,
        "rolled on to the refusals + 5 s, not 300 s"
    );
    let event = support::next_event(&mut stream, "the corroborated cooldown").await;
    assert_eq!(event.cooldown_until_unix_ms, T0 + 8_000);
    assert!(event.cooldown_corroborated);
    coordinator.stop().await;
}

#[tokio::test]
async fn one_outlier_among_twenty_gets_the_robust_cooldown_and_is_counted() {
    let coordinator = Coordinator::open().await;
    let mut client = coordinator.client().await;
    quiet_fleet(&mut client, 21).await;
    hint(&mut client, "w0", "300", ScopeCertainty::Known).await;
    for i in 1..=20 {
        hint(&mut client, &format!("w{i}"), "5", ScopeCertainty::Known).await;
    }
    let cooldown = hint(&mut client, "w0", "300", ScopeCertainty::Known).await;
    assert_eq!(cooldown, T0 + 5_000);
    let e = coordinator
        .scope_state("tenant-a", ROUTE)
        .await
        .route_evidence
        .expect("evidence");
    assert!(e.corroborated);
    assert_eq!(e.reporters, 21);
    assert_eq!(e.disagreeing.len(), 1);
    assert_eq!(e.disagreeing[0].worker_id, "w0");
    assert_eq!(e.disagreeing[0].outliers, 1);
    coordinator.stop().await;
}

#[tokio::test]
async fn uncertain_evidence_from_one_worker_does_not_broaden() {
    let coordinator = Coordinator::open().await;
    let mut client = coordinator.client().await;
    quiet_fleet(&mut client, 10).await;
    let other = scope("tenant-a", "POST /orders", Priority::Normal);
    hint(&mut client, "w0", "120", ScopeCertainty::Uncertain).await;
    let answer = client
        .reconsider(reconsider(other.clone(), "intent-1"))
        .await
        .expect("reconsider")
        .into_inner();
    assert_eq!(answer.cooldown_until_unix_ms, T0 + 5_000);
    hint(&mut client, "w1", "120", ScopeCertainty::Uncertain).await;
    hint(&mut client, "w2", "120", ScopeCertainty::Uncertain).await;
    let answer = client
        .reconsider(reconsider(other, "intent-2"))
        .await
        .expect("reconsider")
        .into_inner();
    assert_eq!(answer.cooldown_until_unix_ms, T0 + 120_000, "corroborated");
    coordinator.stop().await;
}

#[tokio::test]
async fn a_worker_that_keeps_disagreeing_is_flagged_noisy() {
    let coordinator = Coordinator::open().await;
    let mut client = coordinator.client().await;
    quiet_fleet(&mut client, 11).await;
    for _ in 0..5 {
        hint(&mut client, "w7", "300", ScopeCertainty::Known).await;
    }
    hint(&mut client, "w1", "2", ScopeCertainty::Known).await;
    let e = coordinator
        .scope_state("tenant-a", ROUTE)
        .await
        .route_evidence
        .expect("evidence");
    assert_eq!(e.noisy_workers, 1);
    assert_eq!(e.disagreeing.len(), 1);
    assert_eq!(e.disagreeing[0].worker_id, "w7");
    assert!(e.disagreeing[0].noisy);
    assert_eq!(e.disagreeing[0].hints, 5);
    coordinator.stop().await;
}
