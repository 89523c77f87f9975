//! The gate against the real coordinator: on loopback (real sockets, real
//! time, every wait scaled down to milliseconds), and over the in-memory
//! pipes when the coordinator must die at a chosen instant (paused time; see
//! `support::pipes`).

#![allow(clippy::unwrap_used)]

#[path = "../../tests/support/mod.rs"]
mod support;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use support::{Coordinator, ms, pipes};
use tokio::time::Instant;
use tollgate_client::backoff::{Backoff, Jitter};
use tollgate_client::engine::{DEFAULT_BACKOFF, DEFAULT_MAX_HINT, IntentPolicy, Observation};
use tollgate_client::gate::{
    Attempt, Gate, GateConfig, GateIntent, IntentResult, Reply, TokenSource,
};
use tollgate_client::lease::{LeaseCache, LeaseCacheConfig, Take};
use tollgate_client::link::{CoordinatorLink, LinkConfig, LinkState};
use tollgate_client::outcome::Outcome;
use tollgate_client::scope::Scope;
use tollgate_proto::v1::RetryClass;

const RPC_TIMEOUT: Duration = Duration::from_millis(200);
const LOCAL_SPREAD: Duration = Duration::from_millis(50);

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
    let config = GateConfig {
        local_spread: LOCAL_SPREAD,
        seed: Some(5),
        ..GateConfig::default()
    };
    let link = CoordinatorLink::new(&link).unwrap();
    support::gate(link, coordinator.clock.clone(), 3, config)
}

/// An upstream answering `first` once and then succeeding. Returns the
/// intent's result and its attempts' start times.
async fn once_then_ok(
    gate: &Gate,
    id: &str,
    first: Observation,
) -> (IntentResult<u32>, Vec<Instant>) {
    let starts = Arc::new(Mutex::new(Vec::new()));
    let log = starts.clone();
    let intent = GateIntent::new(id, Scope::new("tenant-a", "GET /orders/{id}"), policy());
    let result = gate
        .run(intent, move |attempt: Attempt| {
            log.lock().unwrap().push(Instant::now());
            let first = first.clone();
            async move {
                let observation = if attempt.number == 1 {
                    first
                } else {
                    Observation::http(200, None)
                };
                Reply::new(observation, attempt.number)
            }
        })
        .await;
    let starts = starts.lock().unwrap().clone();
    (result, starts)
}

/// [`once_then_ok`] with a hintless 502 first (transient; the adaptive
/// throttle sees it as accepted, so only the budget decides).
async fn flaky_once(gate: &Gate, id: &str) -> (IntentResult<u32>, Vec<Instant>) {
    once_then_ok(gate, id, Observation::http(502, None)).await
}

#[test]
fn the_policy_defaults_follow_the_coordinators_built_in_policy() {
    // The reasons `engine::DEFAULT_BACKOFF` and `DEFAULT_MAX_HINT` give for
    // their values hold only while the coordinator keeps its own.
    let spec = tollgate::policy::PolicySpec::builtin();
    let builtin = tollgate::policy::Policy::try_new(&spec).unwrap();
    assert_eq!(DEFAULT_MAX_HINT, ms(builtin.max_hint_ms));
    // The engine waits up to base · 2ⁿ after n attempts; the coordinator's
    // first hintless step is its base.
    assert_eq!(DEFAULT_BACKOFF.ceiling(1), ms(builtin.backoff_base_ms));
    assert_eq!(DEFAULT_BACKOFF.cap, ms(builtin.backoff_max_ms));
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

/// A lease whose last token a retry took is given back, with that retry's
/// success, at the cache's next pass: its refund must reach the fleet's
/// budget before this worker's next Lease, or a worker whose fair share is
/// one retry is refused it while the budget sits unspent.
#[tokio::test]
async fn a_spent_lease_is_refunded_at_the_next_pass_not_the_next_take() {
    let coordinator = Coordinator::open().await;
    let mut link = LinkConfig::new(format!("http://{}", coordinator.addr), "worker-refund");
    link.rpc_timeout = RPC_TIMEOUT;
    let cache = LeaseCache::start(
        CoordinatorLink::new(&link).unwrap(),
        LeaseCacheConfig {
            batch: 1,
            low_water: 0,
            seed: Some(5),
            ..LeaseCacheConfig::default()
        },
        coordinator.clock.clone(),
    );
    let scope = Scope::new("tenant-a", "GET /orders/{id}");
    let Take::Leased { lease_id, .. } = cache.take(&scope, RetryClass::Transient).await else {
        panic!("the coordinator grants a token");
    };
    assert!(cache.record_retry_success(&scope, &lease_id));
    let leases = || async {
        coordinator
            .scope_state("tenant-a", "GET /orders/{id}")
            .await
            .leases_outstanding
    };
    // The take left the cache empty, so it leases a second token at once.
    support::poll("the refill leased", support::PUSH_BOUND, || async {
        leases().await == 2
    })
    .await;
    // No other take, and the clocks stand still: only the cache's own pass
    // can give the spent lease back (the other one is far from expiry).
    support::poll("the spent lease released", support::PUSH_BOUND, || async {
        leases().await == 1
    })
    .await;
    coordinator.stop().await;
}

/// Intents waiting out a fleet cooldown on the coordinator's slots when its
/// host dies: each wakes, cannot reach it, and goes on the local fallback
/// budget after at most one RPC timeout; the gate reconnects by itself when
/// the host comes back.
#[tokio::test(start_paused = true)]
async fn coordinator_killed_while_intents_wait_for_slots_falls_back_and_recovers() {
    let mut h = pipes::harness();
    let gate = h.gate.clone();
    let (before, _) = flaky_once(&gate, "before").await;
    assert!(matches!(
        before.attempts[1].token,
        TokenSource::Leased { .. }
    ));

    // Three intents get a 429 with `Retry-After: 1`, report it, and are
    // given slots after the cooldown; the host dies while they wait.
    let waiting = ["wait-1", "wait-2", "wait-3"].map(|id| {
        let gate = gate.clone();
        tokio::spawn(
            async move { once_then_ok(&gate, id, Observation::http(429, Some("1"))).await },
        )
    });
    tokio::time::sleep(ms(500)).await;
    assert!(
        waiting.iter().all(|task| !task.is_finished()),
        "every intent is still waiting when the host dies"
    );
    h.coordinator.kill();

    for task in waiting {
        let (during, starts) = task.await.unwrap();
        assert_eq!(during.outcome, Outcome::Succeeded, "{during:?}");
        let wait = during.attempts[0].wait.clone().unwrap();
        // A slot further off than the coordinator's reconsider horizon is
        // not given yet: the intent is told to ask again, and the host may
        // die before it does. Either way it never goes before the hint.
        let slot = match wait.slot {
            Some(slot) => slot,
            None => {
                assert!(wait.asked_again > 0 && wait.degraded, "{wait:?}");
                wait.planned_start
            }
        };
        assert!(slot >= Duration::from_secs(1), "the wait follows the hint");
        assert_eq!(
            during.attempts[1].token,
            TokenSource::Fallback,
            "woke to a dead coordinator: the local budget admits"
        );
        // Woken at the slot, the token costs at most one RPC timeout to find
        // the coordinator gone (and the gate's local spread, if it adds one).
        let gap = starts[1] - starts[0];
        assert!(gap >= slot, "{gap:?} < {slot:?}: not before its slot");
        let bound = wait.planned_start + pipes::RPC_TIMEOUT + pipes::gate_config().local_spread;
        assert!(gap <= bound, "{gap:?} > {bound:?}");
    }
    assert_eq!(gate.link_state(), LinkState::Degraded);
    assert_eq!(
        gate.cache().link().degradations(),
        1,
        "degraded once, visibly"
    );

    // The host comes back with a fresh coordinator; the cache probes once
    // a second.
    h.coordinator.restart();
    support::poll("recovered by itself", Duration::from_secs(10), || async {
        gate.link_state() == LinkState::Connected
    })
    .await;
    let (after, _) = flaky_once(&gate, "after").await;
    assert_eq!(after.outcome, Outcome::Succeeded);
    assert!(!after.attempts[0].wait.clone().unwrap().degraded);
    assert!(matches!(
        after.attempts[1].token,
        TokenSource::Leased { .. }
    ));
}
