//! End-to-end tests of the coordinator's decisions through the Budget RPCs:
//! hints and cooldowns, slots at the wake rate, leases and their shares. A
//! real server on loopback, real tonic clients, a manual clock (no sleeps for
//! time to pass). `coordinator_service.rs` covers the service around them.

mod support;

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use support::{Coordinator, ROUTE, T0, config, lease, rate_limited, reconsider, scope};
use tokio::task::JoinSet;
use tollgate_proto::v1::budget_client::BudgetClient;
use tollgate_proto::v1::{self, LeaseLimit, Priority, ReconsiderDecision, ScopeCertainty};
use tonic::Code;
use tonic::transport::Channel;

/// A pinned wake rate: the fixed-rate cursor, slots at any distance.
const PINNED_50: &str = "[defaults]\nwake_rate = 50\n";

/// One worker's `Reconsider` for `intent`, answered.
async fn ask(
    client: &mut BudgetClient<Channel>,
    s: Option<v1::Scope>,
    intent: &str,
) -> v1::ReconsiderResponse {
    client
        .reconsider(reconsider(s, intent))
        .await
        .expect("reconsider")
        .into_inner()
}

/// A coordinator at [`PINNED_50`], a client, and tenant-a's normal scope
/// on [`ROUTE`] after worker-a reported a known `Retry-After: hint`.
async fn pinned_after_hint(hint: &str) -> (Coordinator, BudgetClient<Channel>, Option<v1::Scope>) {
    let coordinator = Coordinator::start(config(PINNED_50)).await;
    let mut client = coordinator.client().await;
    let s = scope("tenant-a", ROUTE, Priority::Normal);
    client
        .report(rate_limited(
            s.clone(),
            "worker-a",
            hint,
            ScopeCertainty::Known,
        ))
        .await
        .expect("report");
    (coordinator, client, s)
}

#[tokio::test]
async fn a_delay_hint_seen_by_one_worker_holds_back_another() {
    let coordinator = Coordinator::open().await;
    let mut worker_a = coordinator.client().await;
    let mut worker_b = coordinator.client().await;
    let s = scope("tenant-a", ROUTE, Priority::Normal);

    let report = worker_a
        .report(rate_limited(
            s.clone(),
            "worker-a",
            "30",
            ScopeCertainty::Known,
        ))
        .await
        .expect("report")
        .into_inner();
    assert_eq!(report.cooldown_until_unix_ms, T0 + 30_000);
    assert!(report.verdicts[0].valid);
    assert_eq!(report.verdicts[0].form, "delay");

    // A slot 30 s ahead is not given at once: worker b is told to ask
    // again (never past the cooldown) until its slot is near.
    let (answer, asked) = coordinator
        .reconsider_until_answered(&mut worker_b, reconsider(s, "intent-1"))
        .await;
    assert!(asked > 0, "a far slot is ask-again under learned pacing");
    assert_eq!(answer.decision(), ReconsiderDecision::Slot);
    assert!(
        answer.slot_unix_ms >= T0 + 30_000,
        "slot {}",
        answer.slot_unix_ms
    );
    assert_eq!(answer.cooldown_until_unix_ms, T0 + 30_000);
    assert!(!answer.reserves_token, "a slot never reserves a token");
    coordinator.stop().await;
}

/// A calm route lets a worker hold its counts for a window; a cooldown
/// wants every report at once, from every worker.
#[tokio::test]
async fn counts_may_wait_a_window_until_a_cooldown_starts() {
    let coordinator = Coordinator::open().await;
    let mut client = coordinator.client().await;
    let s = scope("tenant-a", ROUTE, Priority::Normal);
    let counts = |worker: &str| v1::ReportRequest {
        scope: s.clone(),
        worker_id: worker.into(),
        first_attempts: 5,
        successes: 5,
        ..v1::ReportRequest::default()
    };
    let hold = |r: v1::ReportResponse| r.counts_hold_ms;
    let calm = client.report(counts("worker-a")).await.expect("report");
    assert_eq!(hold(calm.into_inner()), 1_000);

    let refused = rate_limited(s.clone(), "worker-a", "30", ScopeCertainty::Known);
    let refused = client.report(refused).await.expect("report").into_inner();
    assert!(refused.cooldown_until_unix_ms > T0);
    assert_eq!(hold(refused), 0, "the worker that saw the 429");
    let other = client.report(counts("worker-b")).await.expect("report");
    assert_eq!(hold(other.into_inner()), 0, "and every other worker");
    coordinator.stop().await;
}

#[tokio::test]
async fn an_http_date_hint_works_the_same() {
    let coordinator = Coordinator::open().await;
    let mut client = coordinator.client().await;
    let s = scope("tenant-a", ROUTE, Priority::Normal);
    let report = client
        .report(rate_limited(
            s.clone(),
            "worker-a",
            "Mon, 01 Jan 2024 12:00:30 GMT",
            ScopeCertainty::Known,
        ))
        .await
        .expect("report")
        .into_inner();
    assert_eq!(report.verdicts[0].form, "date");
    let (answer, _) = coordinator
        .reconsider_until_answered(&mut client, reconsider(s, "intent-1"))
        .await;
    assert_eq!(answer.decision(), ReconsiderDecision::Slot);
    assert!(answer.slot_unix_ms >= T0 + 30_000);
    coordinator.stop().await;
}

#[tokio::test]
async fn an_enormous_hint_is_capped_and_says_so() {
    let coordinator = Coordinator::open().await;
    let mut client = coordinator.client().await;
    let s = scope("tenant-a", ROUTE, Priority::Normal);
    let report = client
        .report(rate_limited(s, "worker-a", "86400", ScopeCertainty::Known))
        .await
        .expect("report")
        .into_inner();
    assert!(report.verdicts[0].valid && report.verdicts[0].capped);
    assert_eq!(report.cooldown_until_unix_ms, T0 + 300_000);
    coordinator.stop().await;
}

#[tokio::test]
async fn uncertain_evidence_holds_back_the_whole_caller_scope() {
    let coordinator = Coordinator::open().await;
    let mut client = coordinator.client().await;
    client
        .report(rate_limited(
            scope("tenant-a", "POST /orders", Priority::Normal),
            "worker-a",
            "20",
            ScopeCertainty::Uncertain,
        ))
        .await
        .expect("report");
    let other_caller = ask(&mut client, scope("tenant-b", ROUTE, Priority::Bulk), "i").await;
    assert_eq!(other_caller.decision(), ReconsiderDecision::Slot);
    assert!(
        other_caller.slot_unix_ms < T0 + 20_000,
        "other callers are not held back"
    );
    let (other_route, _) = coordinator
        .reconsider_until_answered(
            &mut client,
            reconsider(scope("tenant-a", ROUTE, Priority::Bulk), "i"),
        )
        .await;
    assert_eq!(other_route.decision(), ReconsiderDecision::Slot);
    assert!(other_route.slot_unix_ms >= T0 + 20_000);
    coordinator.stop().await;
}

#[tokio::test]
async fn a_thousand_waiting_intents_wake_at_the_wake_rate() {
    // A pinned rate: every intent gets its slot at once, however far.
    let (coordinator, client, s) = pinned_after_hint("30").await;

    let mut tasks = JoinSet::new();
    for i in 0..1000 {
        let mut client = client.clone();
        let s = s.clone();
        tasks.spawn(async move { ask(&mut client, s, &format!("intent-{i}")).await });
    }
    let mut slots = Vec::with_capacity(1000);
    while let Some(answer) = tasks.join_next().await {
        let answer = answer.expect("task");
        assert_eq!(answer.decision(), ReconsiderDecision::Slot);
        slots.push(answer.slot_unix_ms);
    }
    slots.sort_unstable();
    // 50/s is one slot per 20 ms interval from the cooldown's end: the k-th
    // slot lies in the k-th interval, so every interval wakes exactly one
    // intent (a fleet woken in bursts, even at the right average, fails).
    let interval_ms = 1000 / 50;
    let cooldown_end = T0 + 30_000;
    for (k, &slot) in slots.iter().enumerate() {
        let k = i64::try_from(k).expect("k");
        assert_eq!(
            (slot - cooldown_end).div_euclid(interval_ms),
            k,
            "slot {k} at +{} ms is outside its interval",
            slot - cooldown_end
        );
    }
    let busiest = slots
        .iter()
        .map(|&s| slots.partition_point(|&t| t < s + 1000) - slots.partition_point(|&t| t < s))
        .max()
        .expect("slots");
    assert!(busiest <= 51, "busiest second holds {busiest}");
    coordinator.stop().await;
}

#[tokio::test]
async fn reconsider_is_idempotent_and_refuses_infeasible_deadlines() {
    let (coordinator, mut client, s) = pinned_after_hint("10").await;
    // 12 s left, a 3 s attempt reserve, a 10 s hint: infeasible.
    let mut tight = reconsider(s.clone(), "tight");
    tight.deadline_unix_ms = T0 + 12_000;
    tight.attempt_reserve_ms = 3_000;
    let refused = client.reconsider(tight).await.expect("call").into_inner();
    assert_eq!(refused.decision(), ReconsiderDecision::DeadlineInfeasible);

    let first = ask(&mut client, s.clone(), "same").await;
    let again = ask(&mut client, s, "same").await;
    assert_eq!(first.slot_unix_ms, again.slot_unix_ms);
    coordinator.stop().await;
}

/// Every token in the critical class: the formula is the whole budget.
const ALL_CRITICAL: &str = "[defaults]\nshares = { critical = 1.0, normal = 0.0, bulk = 0.0 }\n";

#[tokio::test]
async fn fifty_concurrent_workers_never_get_more_than_the_formula() {
    let coordinator = Coordinator::start(config(ALL_CRITICAL)).await;
    let mut client = coordinator.client().await;
    let s = scope("tenant-a", ROUTE, Priority::Critical);
    client
        .report(v1::ReportRequest {
            scope: s.clone(),
            worker_id: "reporter".into(),
            first_attempts: 500,
            ..v1::ReportRequest::default()
        })
        .await
        .expect("report");
    // 10/s × 10 s + 0.2 × 500 = 200 retries.
    let formula = 200;

    let total = Arc::new(AtomicU32::new(0));
    let mut tasks = JoinSet::new();
    for w in 0..50 {
        let mut client = client.clone();
        let s = s.clone();
        let total = Arc::clone(&total);
        tasks.spawn(async move {
            for _ in 0..20 {
                let got = client
                    .lease(lease(s.clone(), &format!("w{w}"), 3))
                    .await
                    .expect("lease")
                    .into_inner();
                total.fetch_add(got.granted, Ordering::Relaxed);
                if got.limit() == LeaseLimit::BudgetExhausted && got.granted == 0 {
                    break;
                }
            }
        });
    }
    while tasks.join_next().await.is_some() {}
    let total = total.load(Ordering::Relaxed);
    assert!(total <= formula, "granted {total} > {formula}");
    assert!(total >= formula / 2, "granted only {total}");
    coordinator.stop().await;
}

#[tokio::test]
async fn release_returns_tokens_and_expiry_counts_them_spent() {
    let coordinator = Coordinator::start(config(&format!(
        "{ALL_CRITICAL}window = \"60s\"\nlease_ttl = \"10s\"\nmin_retries_per_sec = 1\n"
    )))
    .await;
    let mut client = coordinator.client().await;
    let s = scope("tenant-a", ROUTE, Priority::Critical);

    let all = client
        .lease(lease(s.clone(), "w", 100))
        .await
        .expect("lease")
        .into_inner();
    assert_eq!(all.granted, 60); // 1/s × 60 s
    assert_eq!(all.expires_at_unix_ms, T0 + 10_000);
    let none = client
        .lease(lease(s.clone(), "w", 1))
        .await
        .expect("lease")
        .into_inner();
    assert_eq!(
        (none.granted, none.limit()),
        (0, LeaseLimit::BudgetExhausted)
    );

    let released = client
        .release(v1::ReleaseRequest {
            scope: s.clone(),
            worker_id: "w".into(),
            lease_id: all.lease_id.clone(),
            spent: 20,
            retry_successes: 0,
        })
        .await
        .expect("release")
        .into_inner();
    assert_eq!(released.returned, 40);
    let back = client
        .lease(lease(s.clone(), "w", 100))
        .await
        .expect("lease")
        .into_inner();
    assert_eq!(back.granted, 40);

    // `back` is never reported: after its expiry it cannot be released and
    // its tokens stay spent until they slide out of the window.
    coordinator.advance(Duration::from_secs(11));
    let late = client
        .release(v1::ReleaseRequest {
            scope: s.clone(),
            worker_id: "w".into(),
            lease_id: back.lease_id.clone(),
            spent: 0,
            retry_successes: 0,
        })
        .await
        .expect_err("expired");
    assert_eq!(late.code(), Code::NotFound);
    let still = client
        .lease(lease(s.clone(), "w", 1))
        .await
        .expect("lease")
        .into_inner();
    assert_eq!(still.granted, 0);
    coordinator.advance(Duration::from_secs(60));
    let slid = client
        .lease(lease(s, "w", 100))
        .await
        .expect("lease")
        .into_inner();
    assert_eq!(slid.granted, 60);
    coordinator.stop().await;
}

#[tokio::test]
async fn a_greedy_worker_cannot_starve_nine_modest_ones() {
    let coordinator = Coordinator::start(config(ALL_CRITICAL)).await; // 100 tokens
    let mut client = coordinator.client().await;
    let s = scope("tenant-a", ROUTE, Priority::Critical);
    for i in 0..9 {
        client
            .report(v1::ReportRequest {
                scope: s.clone(),
                worker_id: format!("modest-{i}"),
                ..v1::ReportRequest::default()
            })
            .await
            .expect("report");
    }
    let greedy = client
        .lease(lease(s.clone(), "greedy", 10_000))
        .await
        .expect("lease")
        .into_inner();
    assert_eq!(greedy.granted, 10);
    assert_eq!(greedy.limit(), LeaseLimit::FairShare);
    let greedy = client
        .lease(lease(s.clone(), "greedy", 10_000))
        .await
        .expect("lease")
        .into_inner();
    assert_eq!(
        greedy.granted, 0,
        "no more than its share while others are active"
    );
    for i in 0..9 {
        let modest = client
            .lease(lease(s.clone(), &format!("modest-{i}"), 8))
            .await
            .expect("lease")
            .into_inner();
        assert_eq!(modest.granted, 8, "modest-{i}");
    }
    coordinator.stop().await;
}

#[tokio::test]
async fn exhausting_bulk_leaves_critical_untouched() {
    let coordinator = Coordinator::open().await; // 100 tokens: 50 / 30 / 20
    let mut client = coordinator.client().await;
    let bulk = scope("tenant-a", ROUTE, Priority::Bulk);
    let mut taken = 0;
    loop {
        let got = client
            .lease(lease(bulk.clone(), "batch", 7))
            .await
            .expect("lease")
            .into_inner();
        taken += got.granted;
        if got.granted == 0 {
            assert_eq!(got.limit(), LeaseLimit::BudgetExhausted);
            break;
        }
    }
    assert_eq!(taken, 20);
    let critical = client
        .lease(lease(
            scope("tenant-a", ROUTE, Priority::Critical),
            "api",
            50,
        ))
        .await
        .expect("lease")
        .into_inner();
    assert_eq!(critical.granted, 50);
    coordinator.stop().await;
}

#[tokio::test]
async fn a_known_upstream_limit_paces_the_fleet_from_the_start() {
    // 600/min is 10/s; the fleet may use half of it by default.
    let coordinator =
        Coordinator::start(config("[defaults]\nupstream_limit = \"600/min\"\n")).await;
    let mut client = coordinator.client().await;
    let s = scope("tenant-a", ROUTE, Priority::Normal);
    client
        .report(v1::ReportRequest {
            scope: s.clone(),
            worker_id: "worker-a".into(),
            ..v1::ReportRequest::default()
        })
        .await
        .expect("report");
    let state = coordinator.scope_state("tenant-a", ROUTE).await;
    let pacing = state.pacing.expect("pacing");
    assert_eq!(pacing.state, "known_limit");
    assert!((pacing.wake_rate - 5.0).abs() < 1e-9, "{pacing:?}");
    assert!((pacing.capacity_estimate - 5.0).abs() < 1e-9, "{pacing:?}");
    // Slots one 200 ms interval apart, nothing learned by being rejected.
    let first = ask(&mut client, s.clone(), "intent-1").await;
    let second = ask(&mut client, s, "intent-2").await;
    assert_eq!(first.decision(), ReconsiderDecision::Slot);
    assert_eq!(second.decision(), ReconsiderDecision::Slot);
    assert!(first.slot_unix_ms < T0 + 200, "{first:?}");
    assert!(second.slot_unix_ms >= T0 + 200, "{second:?}");
    assert!((second.wake_rate - 5.0).abs() < 1e-9, "{second:?}");
    coordinator.stop().await;
}

#[tokio::test]
async fn get_scope_shows_the_limiter_model_a_route_learned() {
    let coordinator = Coordinator::start(config("")).await;
    let mut client = coordinator.client().await;
    let report = |first, ok, rejected| counted("worker-a", (first, ok, rejected));
    let pacing = async || {
        let state = coordinator.scope_state("tenant-a", ROUTE).await;
        state.pacing.expect("pacing")
    };
    // A clean second: nothing measured, the capacity is what was served.
    client.report(report(50, 100, 0)).await.expect("report");
    coordinator.clock.advance(Duration::from_secs(1));
    client.report(report(0, 0, 0)).await.expect("report");
    let learned = pacing().await;
    assert_eq!(learned.phase, "startup", "{learned:?}");
    assert!(!learned.capacity_measured);
    assert!(
        (learned.capacity_estimate - 100.0).abs() < 1e-9,
        "{learned:?}"
    );
    // Refused, and refused again 400 ms later with 40 served in between:
    // the limiter was kept empty, and serves 100/s.
    client.report(report(50, 50, 10)).await.expect("report");
    coordinator.clock.advance(Duration::from_millis(400));
    client.report(report(20, 40, 10)).await.expect("report");
    let learned = pacing().await;
    assert_eq!(learned.phase, "drain", "{learned:?}");
    assert_eq!(learned.state, "backing_off");
    assert!(learned.capacity_measured);
    assert!(
        (learned.capacity_estimate - 100.0).abs() < 1e-9,
        "{learned:?}"
    );
    coordinator.stop().await;
}

/// A worker that starts watching a route already saturated (first attempts
/// alone overflow its upstream) is told to hold first attempts in its first
/// event, and again with the cooldown that follows: the watch reads the
/// route's pacing when it opens, not only the changes after it.
#[tokio::test]
async fn a_watch_opened_on_a_saturated_route_holds_first_attempts() {
    let coordinator = Coordinator::start(config("[defaults]\ncorroborate_workers = 1\n")).await;
    let mut client = coordinator.client().await;
    let route = || scope("tenant-a", ROUTE, Priority::Normal);
    let fleet = |first, ok, rejected| counted("worker-fleet", (first, ok, rejected));
    // 100 first attempts a second, all served; then refused, and refused
    // again 400 ms later with 20 served between: the upstream serves 50/s,
    // half what first attempts alone ask.
    client.report(fleet(100, 100, 0)).await.expect("report");
    coordinator.clock.advance(Duration::from_secs(1));
    client.report(fleet(50, 50, 10)).await.expect("report");
    coordinator.clock.advance(Duration::from_millis(400));
    client.report(fleet(40, 20, 30)).await.expect("report");
    let pacing = coordinator
        .scope_state("tenant-a", ROUTE)
        .await
        .pacing
        .expect("pacing");
    assert_eq!(pacing.state, "saturated", "{pacing:?}");

    let mut events = watch(&mut client, route(), "worker-late").await;
    let first = opened(&mut events).await;
    assert!(first.hold_first_attempts, "{first:?}");
    // Another worker's 429 starts a short cooldown: still saturated, first
    // attempts still held.
    let mut hinted = rate_limited(route(), "worker-fleet", "2", ScopeCertainty::Known);
    hinted.evidence[0].receipt_unix_ms = T0 + 1_400;
    client.report(hinted).await.expect("report");
    let started = events.message().await.expect("event").expect("open");
    assert_eq!(started.kind(), v1::ScopeEventKind::CooldownStarted);
    assert!(started.hold_first_attempts, "{started:?}");
    coordinator.stop().await;
}

/// So is one that starts watching inside a cooldown the fleet corroborated
/// and that closes the route (an outage): its first event holds first
/// attempts, as the Report answers of the workers already there do.
#[tokio::test]
async fn a_watch_opened_in_a_corroborated_outage_holds_first_attempts() {
    let coordinator = Coordinator::start(config("[defaults]\ncorroborate_workers = 1\n")).await;
    let mut client = coordinator.client().await;
    let route = || scope("tenant-a", ROUTE, Priority::Normal);
    let refused = rate_limited(route(), "worker-a", "30", ScopeCertainty::Known);
    client.report(refused).await.expect("report");
    let mut events = watch(&mut client, route(), "worker-late").await;
    let first = opened(&mut events).await;
    assert!(first.cooldown_corroborated, "{first:?}");
    assert!(first.hold_first_attempts, "{first:?}");
    coordinator.stop().await;
}

/// `worker`'s report of counts alone on tenant-a's [`ROUTE`]: first
/// attempts, successes, rejections.
fn counted(
    worker: &str,
    (first_attempts, successes, rejections): (u32, u32, u32),
) -> v1::ReportRequest {
    v1::ReportRequest {
        scope: scope("tenant-a", ROUTE, Priority::Normal),
        worker_id: worker.into(),
        first_attempts,
        successes,
        rejections,
        ..v1::ReportRequest::default()
    }
}

/// `worker`'s Watch of `scope`.
async fn watch(
    client: &mut BudgetClient<Channel>,
    scope: Option<v1::Scope>,
    worker: &str,
) -> tonic::Streaming<v1::ScopeEvent> {
    client
        .watch(v1::WatchRequest {
            scopes: vec![scope.expect("scope")],
            worker_id: worker.into(),
        })
        .await
        .expect("watch")
        .into_inner()
}

/// A watch's first event, its snapshot.
async fn opened(events: &mut tonic::Streaming<v1::ScopeEvent>) -> v1::ScopeEvent {
    let first = events.message().await.expect("event").expect("open");
    assert_eq!(first.kind(), v1::ScopeEventKind::Snapshot);
    first
}
