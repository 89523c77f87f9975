//! The gate against the real coordinator on loopback.
//!
//! Real sockets and paused tokio time do not mix (auto-advance fires RPC
//! timeouts while IO is pending), so these run on real time with every wait
//! scaled down to milliseconds.

#![allow(clippy::unwrap_used)]

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::Coordinator;
use tokio::net::TcpListener;
use tokio::time::Instant;
use tollgate::config::Config;
use tollgate_client::backoff::{Backoff, Jitter};
use tollgate_client::engine::{IntentPolicy, Observation};
use tollgate_client::gate::{Attempt, Gate, GateConfig, GateIntent, Reply, TokenSource};
use tollgate_client::lease::{LeaseCache, LeaseCacheConfig};
use tollgate_client::link::{CoordinatorLink, LinkConfig, LinkState};
use tollgate_client::outcome::Outcome;
use tollgate_client::scope::Scope;

const RPC_TIMEOUT: Duration = Duration::from_millis(200);
const LOCAL_SPREAD: Duration = Duration::from_millis(50);

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

/// 5 s end to end, 3 attempts, 500 ms each, backoff 20 ms · 2ⁿ.
fn policy() -> IntentPolicy {
    let backoff = Backoff {
        base: ms(20),
        cap: ms(200),
        jitter: Jitter::None,
    };
    IntentPolicy::try_new(ms(5_000), 3, ms(500), ms(10), backoff, None).unwrap()
}

fn gate_for(coordinator: &Coordinator) -> Gate {
    let mut link = LinkConfig::new(format!("http://{}", coordinator.addr), "worker-gate");
    link.rpc_timeout = RPC_TIMEOUT;
    let link = CoordinatorLink::new(&link).unwrap();
    let cache = LeaseCache::start(
        link,
        LeaseCacheConfig {
            seed: Some(3),
            ..LeaseCacheConfig::default()
        },
        coordinator.clock.clone(),
    );
    let config = GateConfig {
        local_spread: LOCAL_SPREAD,
        seed: Some(5),
        ..GateConfig::default()
    };
    Gate::new(cache, coordinator.clock.clone(), config)
}

/// An upstream failing once with a hintless 502 (transient; the adaptive
/// throttle sees it as accepted) and then succeeding. Returns its start times.
async fn flaky_once(
    gate: &Gate,
    id: &str,
) -> (tollgate_client::gate::IntentResult<u32>, Vec<Instant>) {
    let starts = Arc::new(std::sync::Mutex::new(Vec::new()));
    let log = starts.clone();
    let intent = GateIntent::new(id, Scope::new("tenant-a", "GET /orders/{id}"), policy());
    let result = gate
        .run(intent, move |attempt: Attempt| {
            log.lock().unwrap().push(Instant::now());
            async move {
                let status = if attempt.number == 1 { 502 } else { 200 };
                Reply::new(Observation::http(status, None), attempt.number)
            }
        })
        .await;
    let starts = starts.lock().unwrap().clone();
    (result, starts)
}

#[tokio::test]
async fn a_retry_takes_a_leased_token_and_a_slot_from_the_real_coordinator() {
    let coordinator = Coordinator::open().await;
    let gate = gate_for(&coordinator);
    let (result, starts) = flaky_once(&gate, "order-1").await;
    assert_eq!(result.outcome, Outcome::Succeeded);
    assert_eq!(starts.len(), 2);
    assert!(matches!(
        result.attempts[1].token,
        TokenSource::Leased { .. }
    ));
    let wait = result.attempts[0].wait.clone().unwrap();
    assert!(!wait.degraded);
    assert!(wait.slot.is_some(), "the coordinator gave a slot");
    assert_eq!(gate.link_state(), LinkState::Connected);
    coordinator.stop().await;
}

#[tokio::test]
async fn coordinator_killed_mid_run_falls_back_within_one_rpc_timeout_and_recovers() {
    let coordinator = Coordinator::open().await;
    let addr = coordinator.addr;
    let clock = coordinator.clock.clone();
    let gate = gate_for(&coordinator);
    let (before, _) = flaky_once(&gate, "before").await;
    assert!(matches!(
        before.attempts[1].token,
        TokenSource::Leased { .. }
    ));

    coordinator.stop().await;
    let (during, starts) = flaky_once(&gate, "during").await;
    assert_eq!(
        during.outcome,
        Outcome::Succeeded,
        "local fallback keeps working"
    );
    assert_eq!(during.attempts[1].token, TokenSource::Fallback);
    assert!(during.attempts[0].wait.clone().unwrap().degraded);
    assert_eq!(gate.link_state(), LinkState::Degraded);
    // The backoff (40 ms), at most one RPC timeout to find the coordinator
    // gone, the local spread, and scheduling slack.
    let gap = starts[1] - starts[0];
    let bound = ms(40) + RPC_TIMEOUT + LOCAL_SPREAD + ms(100);
    assert!(gap >= ms(40) && gap <= bound, "{gap:?} > {bound:?}");

    // The coordinator comes back on the same address.
    let listener = TcpListener::bind(addr).await.unwrap();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let server = tokio::spawn(tollgate::server::run(
        listener,
        async {
            let _ = stopped.await;
        },
        Config::default(),
        clock,
    ));
    let deadline = Instant::now() + Duration::from_secs(5);
    while gate.link_state() != LinkState::Connected && Instant::now() < deadline {
        tokio::time::sleep(ms(50)).await;
    }
    assert_eq!(
        gate.link_state(),
        LinkState::Connected,
        "recovered by itself"
    );
    let (after, _) = flaky_once(&gate, "after").await;
    assert_eq!(after.outcome, Outcome::Succeeded);
    assert!(matches!(
        after.attempts[1].token,
        TokenSource::Leased { .. }
    ));
    let _ = stop.send(());
    let _ = server.await;
}
