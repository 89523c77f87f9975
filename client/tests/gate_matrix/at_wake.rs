//! Rows about what a waiting intent finds when it wakes: the fleet's tokens
//! spent by another worker, local capacity full, and a policy an SRE rotated
//! through the Admin API while it waited.

use tokio::time::Instant;
use tollgate_client::clock::{Clock, to_unix_ms};
use tollgate_client::gate::{GateConfig, TokenSource};
use tollgate_client::link::LinkState;
use tollgate_client::outcome::Outcome;
use tollgate_proto::v1::{GetPolicyRequest, PolicyFields, ReconsiderRequest, SetPolicyRequest};

use super::intent;
use crate::common::{Upstream, http};
use crate::support::pipes::*;

/// A scope with a tiny fleet budget: 1 retry/s over a 10 s window and no
/// ratio, so first attempts earn nothing; normal priority reaches its 30 %
/// share (bulk has none to lend it) — 3 retries per window, each costing
/// one token.
const TINY_BUDGET: &str = r#"
[server]
rng_seed = 7

[[rule]]
route = "POST /orders"
caller_scope = "tenant-a"
min_retries_per_sec = 1.0
retry_ratio = 0.0
cost_throttled = 1.0
shares = { critical = 0.7, normal = 0.3, bulk = 0.0 }
"#;

#[tokio::test(start_paused = true)]
async fn tokens_exhausted_before_wake_are_not_admitted() {
    let h = harness_on(config(TINY_BUDGET), gate_config());
    // Another worker of the fleet leases the window's whole budget.
    let mut other = h.coordinator.client();
    let lease = other
        .lease(tollgate_proto::v1::LeaseRequest {
            scope: Some(scope().to_wire()),
            worker_id: "worker-2".into(),
            want: 3,
            retry_class: tollgate_proto::v1::RetryClass::Throttled.into(),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        (lease.granted, lease.remaining),
        (3, 0),
        "the budget is spent"
    );

    let upstream = Upstream::new(vec![http(429, Some("1")), http(200, None)]);
    let result = h
        .gate
        .run(
            intent("i-no-token", policy(secs(60), 3, secs(5), None)),
            upstream.attempt(),
        )
        .await;
    assert_eq!(result.outcome, Outcome::BudgetExhausted);
    assert_eq!(upstream.calls(), 1, "sleeping reserved nothing");
    let wait = result.attempts[0].wait.clone().unwrap();
    assert!(!wait.degraded, "the fleet said no, not a dead link");
    assert!(wait.slot.is_some(), "the coordinator was asked for a slot");
    assert_eq!(h.gate.link_state(), LinkState::Connected);

    // The other worker gives its tokens back: the same intent shape is
    // admitted on a leased token, so it was the budget that said no.
    let returned = other
        .release(tollgate_proto::v1::ReleaseRequest {
            scope: Some(scope().to_wire()),
            worker_id: "worker-2".into(),
            lease_id: lease.lease_id,
            spent: 0,
            retry_successes: 0,
        })
        .await
        .unwrap()
        .into_inner()
        .returned;
    assert_eq!(returned, 3);
    let upstream = Upstream::new(vec![http(429, Some("1")), http(200, None)]);
    let result = h
        .gate
        .run(
            intent("i-token-back", policy(secs(60), 3, secs(5), None)),
            upstream.attempt(),
        )
        .await;
    assert_eq!(result.outcome, Outcome::Succeeded);
    assert!(matches!(
        result.attempts[1].token,
        TokenSource::Leased { .. }
    ));
}

#[tokio::test(start_paused = true)]
async fn local_capacity_full_at_wake_is_not_admitted() {
    let h = harness_with(GateConfig {
        max_in_flight: 1,
        ..gate_config()
    });
    let waiting = Upstream::new(vec![http(429, Some("1")), http(200, None)]);
    let mut busy = Upstream::new(vec![http(200, None)]);
    busy.latency = secs(4);
    let gate = h.gate.clone();
    let first = h.gate.run(
        intent("i-waits", policy(secs(60), 3, secs(5), None)),
        waiting.attempt(),
    );
    let second = async {
        // Starts while the first is waiting and holds the only permit
        // across its wake-up.
        tokio::time::sleep(ms(500)).await;
        gate.run(
            intent("i-busy", policy(secs(60), 3, secs(5), None)),
            busy.attempt(),
        )
        .await
    };
    let (first, second) = tokio::join!(first, second);
    assert_eq!(
        first.outcome,
        Outcome::CapacityUnavailable,
        "elapsed time is not capacity"
    );
    assert_eq!(waiting.calls(), 1);
    assert_eq!(second.outcome, Outcome::Succeeded);
}

/// The admin token of the rotation row's SRE.
const SRE_TOKEN: &str = "sre-token-for-tests";

/// A scope with a rule an SRE can change at runtime. Admin needs an admin
/// token here: in-memory pipes have no peer address, and open dev mode only
/// lets loopback peers in. With no `[[token]]` the Budget side stays open.
const ROTATABLE: &str = r#"
[server]
rng_seed = 7

[[rule]]
caller_scope = "tenant-a"
route = "POST /orders"
wake_rate = 50

[[admin_token]]
name = "sre-oncall"
token = "sre-token-for-tests"
"#;

#[tokio::test(start_paused = true)]
async fn policy_rotated_while_waiting_is_re_evaluated_under_the_new_version() {
    let h = harness_on(config(ROTATABLE), gate_config());
    let mut admin = h.coordinator.admin();
    let rule = |caller_scope: &str, route: &str| GetPolicyRequest {
        caller_scope: caller_scope.into(),
        route: route.into(),
    };
    let old_version = admin
        .get_policy(with_token(rule("tenant-a", "POST /orders"), SRE_TOKEN))
        .await
        .expect("the SRE reads the rule")
        .into_inner()
        .policy_version;

    // The worker has been serving the scope: its reports taught it the
    // policy version, and it watches the scope. (A scope first heard of
    // during a wait would count as a version change by itself.)
    let warm = h
        .gate
        .run(
            intent("i-warm", policy(secs(60), 3, secs(5), None)),
            Upstream::new(vec![http(200, None)]).attempt(),
        )
        .await;
    assert_eq!(warm.outcome, Outcome::Succeeded);
    tokio::time::sleep(ms(300)).await;
    assert_eq!(h.gate.cache().view(&scope()).policy_version, old_version);

    // 429 with Retry-After: 3: the intent reports it, gets a slot ~3 s out
    // under the old policy (50 wake-ups a second) and waits.
    let upstream = Upstream::new(vec![http(429, Some("3")), http(200, None)]);
    let mut fleet = h.coordinator.client();
    let gate = h.gate.clone();
    let sre = async {
        tokio::time::sleep(secs(1)).await;
        // The fleet stampedes at every cooldown's end; the SRE spreads the
        // scope's wake-ups to one a second.
        let changed = admin
            .set_policy(with_token(
                SetPolicyRequest {
                    caller_scope: "tenant-a".into(),
                    route: "POST /orders".into(),
                    expected_version: old_version,
                    fields: Some(PolicyFields {
                        wake_rate: Some(1),
                        ..PolicyFields::default()
                    }),
                    patch: true,
                    reason: "spread wake-ups after cooldowns".into(),
                },
                SRE_TOKEN,
            ))
            .await
            .expect("the SRE changes the rule")
            .into_inner();
        // The coordinator pushes POLICY_CHANGED over Watch; no other RPC
        // runs while the intent waits, so the push is how the worker knows.
        tokio::time::sleep(ms(100)).await;
        assert_eq!(
            gate.cache().view(&scope()).policy_version,
            changed.policy_version,
            "pushed to the worker well before the intent wakes"
        );
        // Three intents of another worker wait for the same cooldown: under
        // the new rate they are spread one a second, after the old slot.
        let mut slots = Vec::new();
        for i in 0..3 {
            let answer = fleet
                .reconsider(ReconsiderRequest {
                    scope: Some(scope().to_wire()),
                    worker_id: "worker-2".into(),
                    intent_id: format!("i-other-{i}"),
                    not_before_unix_ms: to_unix_ms(noon() + secs(3)),
                    deadline_unix_ms: to_unix_ms(noon() + secs(60)),
                    attempt_reserve_ms: 5_000,
                    first_attempt: false,
                    arriving: false,
                })
                .await
                .expect("reconsider")
                .into_inner();
            assert_eq!(answer.policy_version, changed.policy_version);
            slots.push(answer.slot_unix_ms);
        }
        (changed.policy_version, slots)
    };
    let began = Instant::now();
    let (result, (new_version, others)) = tokio::join!(
        h.gate.run(
            intent("i-rotated", policy(secs(60), 3, secs(5), None)),
            upstream.attempt()
        ),
        sre,
    );
    assert!(new_version > old_version);
    assert_eq!(result.outcome, Outcome::Succeeded);
    let wait = result.attempts[0].wait.clone().unwrap();
    assert_eq!(wait.policy_version_at_wait, old_version);
    assert_eq!(wait.policy_version_at_wake, new_version);
    assert_eq!(
        wait.reevaluations, 1,
        "re-planned once, under the new version"
    );
    assert_eq!(
        result.attempts[1].policy_version, new_version,
        "admitted under the new version"
    );
    // The re-evaluation asked the coordinator again, and its new slot (after
    // the other worker's three, one a second) was honoured, not the stale
    // timer set under the old version (~3 s, one 20 ms interval).
    assert!(others[2] - others[0] > 1_000, "one a second: {others:?}");
    let slot = wait.slot.expect("a slot from the coordinator");
    assert_eq!(wait.planned_start, slot, "the slot decided the start");
    let slot_wall = to_unix_ms(h.clock.now() - began.elapsed() + slot);
    assert!(
        others.iter().all(|&other| slot_wall > other),
        "{slot_wall} after {others:?}"
    );
    let starts = upstream.starts();
    assert!(
        starts[1] - starts[0] >= secs(6),
        "{:?}",
        starts[1] - starts[0]
    );
}
