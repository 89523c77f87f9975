//! Rows where the coordinator dies mid-run: the gate falls back within one
//! RPC timeout and recovers by itself, even when the dead connections are
//! found only by HTTP/2 keepalive.

use tollgate_client::engine::Observation;
use tollgate_client::gate::{Gate, TokenSource};
use tollgate_client::link::{LinkConfig, LinkState};
use tollgate_client::outcome::Outcome;
use tollgate_proto::v1::ReconsiderRequest;

use super::intent;
use crate::common::{Upstream, http};
use crate::support::pipes::*;

#[tokio::test(start_paused = true)]
async fn coordinator_killed_mid_run_falls_back_within_one_rpc_timeout_and_recovers() {
    let h = harness();
    // 502s: transient, so the adaptive throttle sees the upstream accepting
    // and only the budget decides.
    let answers = vec![http(502, None), http(200, None)];
    let up = h
        .gate
        .run(
            intent("i-before", policy(secs(60), 3, secs(5), None)),
            Upstream::new(answers.clone()).attempt(),
        )
        .await;
    assert_eq!(up.outcome, Outcome::Succeeded);
    assert!(matches!(up.attempts[1].token, TokenSource::Leased { .. }));
    assert_eq!(h.gate.link_state(), LinkState::Connected);

    // Mid-run, while the first attempt is in flight, the coordinator's host
    // dies: its connections and any new one go silent.
    let mut h = h;
    let upstream = Upstream::new(answers.clone());
    let (gate, coordinator) = (&h.gate, &mut h.coordinator);
    let (down, ()) = tokio::join!(
        gate.run(
            intent("i-during", policy(secs(60), 3, secs(5), None)),
            upstream.attempt(),
        ),
        async {
            tokio::time::sleep(ms(5)).await;
            coordinator.kill();
        },
    );
    assert_eq!(down.outcome, Outcome::Succeeded);
    assert_eq!(h.gate.link_state(), LinkState::Degraded);
    assert_eq!(
        h.gate.cache().link().degradations(),
        1,
        "degraded once, visibly"
    );
    assert_eq!(down.attempts[1].token, TokenSource::Fallback);
    let wait = down.attempts[0].wait.clone().unwrap();
    assert!(wait.degraded, "no slot: the coordinator could not be asked");
    assert_eq!(wait.slot, None);
    // The wait is the engine's backoff (2 s), at most one RPC timeout to find
    // the coordinator gone, and the local spread.
    let starts = upstream.starts();
    let gap = starts[1] - starts[0];
    let bound = ms(20) + secs(2) + RPC_TIMEOUT + gate_config().local_spread + ms(10);
    assert!(gap >= secs(2) && gap <= bound, "{gap:?} > {bound:?}");

    // The host comes back with a fresh coordinator.
    h.coordinator.restart();
    // The cache probes once a second; give it a few.
    tokio::time::sleep(secs(3)).await;
    assert_eq!(
        h.gate.link_state(),
        LinkState::Connected,
        "recovered by itself"
    );
    retries_on_fleet_tokens_again(&h.gate, answers).await;
}

#[tokio::test(start_paused = true)]
async fn coordinator_back_without_resetting_dead_connections_is_found_by_keepalive() {
    let mut h = harness();
    let answers = vec![http(502, None), http(200, None)];
    let before = h
        .gate
        .run(
            intent("i-before", policy(secs(60), 3, secs(5), None)),
            Upstream::new(answers.clone()).attempt(),
        )
        .await;
    assert!(matches!(
        before.attempts[1].token,
        TokenSource::Leased { .. }
    ));
    assert_eq!(h.gate.link_state(), LinkState::Connected);

    // The coordinator's host dies without a word: its connections go silent.
    h.coordinator.kill();
    let down = h
        .gate
        .run(
            intent("i-during", policy(secs(60), 3, secs(5), None)),
            Upstream::new(answers.clone()).attempt(),
        )
        .await;
    assert_eq!(down.outcome, Outcome::Succeeded);
    assert_eq!(down.attempts[1].token, TokenSource::Fallback);
    assert_eq!(h.gate.link_state(), LinkState::Degraded);

    // A fresh coordinator takes over, but nothing resets the old
    // connections: they stay open and silent. Every RPC on them would time
    // out forever; only an HTTP/2 PING that goes unanswered shows they are
    // dead, and then the channel reconnects (to the new coordinator).
    h.coordinator.restart_leaving_dead_connections();
    let link = LinkConfig::new("http://coordinator.invalid", "worker-1");
    // One keepalive interval and timeout to drop the dead connection, the
    // cache's 1 s probe to reconnect, and a second of slack.
    tokio::time::sleep(link.keep_alive_interval + link.keep_alive_timeout + secs(2)).await;
    assert_eq!(
        h.gate.link_state(),
        LinkState::Connected,
        "recovered by itself, with no reset to help"
    );
    assert_eq!(h.gate.cache().link().degradations(), 1);
    retries_on_fleet_tokens_again(&h.gate, answers).await;
}

#[tokio::test(start_paused = true)]
async fn a_worker_that_never_leased_finds_the_coordinator_back_by_itself() {
    let mut h = harness();
    // Every first attempt served: the worker reports, and never leases.
    let served = h
        .gate
        .run(
            intent("i-served", policy(secs(60), 3, secs(5), None)),
            Upstream::new(vec![http(200, None)]).attempt(),
        )
        .await;
    assert_eq!(served.outcome, Outcome::Succeeded);
    h.gate.cache().flush().await;
    assert_eq!(h.gate.link_state(), LinkState::Connected);

    // The coordinator dies and the worker's last call fails; then nothing
    // of its own calls again (its intents wait out a cooldown alone, say).
    h.coordinator.kill();
    let failed = h
        .gate
        .cache()
        .link()
        .reconsider(ReconsiderRequest::default())
        .await;
    assert!(failed.is_err());
    assert_eq!(h.gate.link_state(), LinkState::Degraded);

    // A fresh coordinator: the cache's probe (once a second) finds it, on
    // the scope the worker reported on.
    h.coordinator.restart();
    tokio::time::sleep(secs(3)).await;
    assert_eq!(
        h.gate.link_state(),
        LinkState::Connected,
        "recovered by itself, holding no tokens"
    );
}

/// Back on the coordinator: an intent whose first attempt fails waits for a
/// slot it was given (not degraded) and retries on a leased token.
async fn retries_on_fleet_tokens_again(gate: &Gate, answers: Vec<Observation>) {
    let after = gate
        .run(
            intent("i-after", policy(secs(60), 3, secs(5), None)),
            Upstream::new(answers).attempt(),
        )
        .await;
    assert_eq!(after.outcome, Outcome::Succeeded);
    assert!(!after.attempts[0].wait.clone().unwrap().degraded);
    assert!(matches!(
        after.attempts[1].token,
        TokenSource::Leased { .. }
    ));
}
