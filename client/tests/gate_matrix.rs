//! The gate against the failure-shaped test matrix, one named test per
//! client-side row, every row against the real coordinator: the real
//! `BudgetService` behind the real server setup, reached by real tonic
//! clients over in-memory pipes so the rows run on paused tokio time (see
//! `support::pipes`). The fleet's answers come from its policy file, from what
//! workers report and lease, and from what an SRE changes through the real
//! Admin API, never from a scripted fake.

#![allow(clippy::unwrap_used)]

mod common;
#[path = "../../tests/support/mod.rs"]
mod support;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::{Upstream, http};
use support::pipes::*;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tollgate_client::classify::{Effect, TransportFailure};
use tollgate_client::clock::{Clock, to_unix_ms};
use tollgate_client::engine::Observation;
use tollgate_client::gate::{
    Attempt, GateConfig, GateIntent, IntentResult, Reconciled, Repetition, Reply, TokenSource,
};
use tollgate_client::hint::{HintForm, HintVerdict};
use tollgate_client::link::{LinkConfig, LinkState};
use tollgate_client::outcome::{Outcome, RecordDecision};
use tollgate_proto::v1::{GetPolicyRequest, PolicyFields, ReconsiderRequest, SetPolicyRequest};

fn intent(id: &str, policy: tollgate_client::engine::IntentPolicy) -> GateIntent {
    GateIntent::new(id, scope(), policy)
}

fn decisions<T>(result: &IntentResult<T>) -> Vec<Option<RecordDecision>> {
    result.attempts.iter().map(|a| a.record.decision).collect()
}

#[tokio::test(start_paused = true)]
async fn valid_hint_but_deadline_infeasible_stops_at_receipt() {
    let h = harness();
    let upstream = Upstream::new(vec![http(429, Some("10"))]);
    let began = Instant::now();
    // 12 s left, a 3 s reserve: 10 s of hint plus 3 s cannot fit.
    let result = h
        .gate
        .run(
            intent("i-deadline", policy(secs(12), 5, secs(3), None)),
            upstream.attempt(),
        )
        .await;
    assert_eq!(result.outcome, Outcome::DeadlineInfeasible);
    assert_eq!(upstream.calls(), 1);
    assert!(
        began.elapsed() < secs(1),
        "stopped at receipt, not after a pointless wait"
    );
    let record = &result.attempts[0].record;
    assert_eq!(
        record.wait,
        Some(secs(10)),
        "the infeasibility calculation is kept"
    );
    assert_eq!(
        result.last_status(),
        Some(tollgate_client::outcome::ResponseStatus::Http(429))
    );
    assert_eq!(result.value, Some(1), "the last response is handed back");
}

#[tokio::test(start_paused = true)]
async fn http_date_with_clock_skew_is_bounded_or_refused() {
    // The server's clock runs an hour ahead: its date asks for an hour.
    let h = harness();
    let ahead = httpdate::fmt_http_date(h.clock.now() + secs(3600));
    let upstream = Upstream::new(vec![http(429, Some(&ahead))]);
    let result = h
        .gate
        .run(
            intent("i-skew-ahead", policy(secs(60), 3, secs(5), Some(secs(30)))),
            upstream.attempt(),
        )
        .await;
    assert_eq!(
        result.outcome,
        Outcome::HintExceedsCap,
        "bounded visibly, not slept on"
    );
    let hint = result.attempts[0].record.hint.clone().unwrap();
    assert_eq!(hint.form, HintForm::Date);
    assert_eq!(hint.raw.as_deref(), Some(ahead.as_str()));

    // The server's clock runs behind: its date is already past. That is not
    // permission to retry at once; the floors still apply.
    let behind = httpdate::fmt_http_date(h.clock.now() - secs(120));
    let upstream = Upstream::new(vec![http(429, Some(&behind)), http(200, None)]);
    let result = h
        .gate
        .run(
            intent(
                "i-skew-behind",
                policy(secs(60), 3, secs(5), Some(secs(30))),
            ),
            upstream.attempt(),
        )
        .await;
    assert_eq!(result.outcome, Outcome::Succeeded);
    assert_eq!(
        result.attempts[0].record.hint.as_ref().unwrap().verdict,
        HintVerdict::Valid {
            delay: Duration::ZERO,
            past: true
        }
    );
    let starts = upstream.starts();
    assert!(
        starts[1] - starts[0] >= ms(20) + ms(100),
        "the policy floor still applies"
    );

    // A host whose clock is not trusted refuses to convert a date at all.
    let h = harness_with(GateConfig {
        clock_trusted: false,
        ..gate_config()
    });
    let upstream = Upstream::new(vec![http(429, Some(&ahead))]);
    let result = h
        .gate
        .run(
            intent("i-untrusted", policy(secs(60), 3, secs(5), None)),
            upstream.attempt(),
        )
        .await;
    assert_eq!(result.outcome, Outcome::ClockUntrusted);
    assert_eq!(upstream.calls(), 1);
}

#[tokio::test(start_paused = true)]
async fn malformed_negative_and_enormous_hints_fall_back_visibly_never_immediately() {
    let h = harness();
    for raw in ["soon", "-1", "1.5", ""] {
        let upstream = Upstream::new(vec![http(429, Some(raw)), http(200, None)]);
        let result = h
            .gate
            .run(
                intent(&format!("i-bad-{raw}"), policy(secs(60), 3, secs(5), None)),
                upstream.attempt(),
            )
            .await;
        assert_eq!(result.outcome, Outcome::Succeeded, "{raw:?}");
        let record = &result.attempts[0].record;
        let hint = record.hint.clone().unwrap();
        assert_eq!(hint.form, HintForm::Invalid, "{raw:?}");
        assert!(matches!(hint.verdict, HintVerdict::Invalid(_)), "{raw:?}");
        assert_eq!(hint.raw.as_deref(), Some(raw), "raw text kept as evidence");
        // The fallback is the policy's backoff (2 s after one attempt); the
        // coordinator's slot may only put it later, by at most one slot
        // interval (1 s: a new route's learned wake rate starts at its
        // floor, one a second).
        let waited = result.attempts[0].wait.clone().unwrap();
        assert_eq!(
            waited.engine_next_start - record.receipt.unwrap(),
            secs(2),
            "{raw:?}"
        );
        assert!(record.wait >= Some(secs(2)), "{raw:?}");
        let slot = waited.slot.expect("a slot from the coordinator");
        assert!(
            slot >= waited.engine_next_start && slot <= waited.engine_next_start + secs(1),
            "{raw:?}: {slot:?}"
        );
        let starts = upstream.starts();
        assert!(starts[1] - starts[0] >= secs(2), "{raw:?}: never immediate");
    }

    // Enormous: saturates, then exceeds any cap; without a cap it cannot fit
    // the deadline. Either way the intent stops instead of retrying early.
    let enormous = "99999999999999999999999";
    let upstream = Upstream::new(vec![http(429, Some(enormous))]);
    let capped = h
        .gate
        .run(
            intent(
                "i-huge-capped",
                policy(secs(60), 3, secs(5), Some(secs(30))),
            ),
            upstream.attempt(),
        )
        .await;
    assert_eq!(capped.outcome, Outcome::HintExceedsCap);
    let uncapped = h
        .gate
        .run(
            intent("i-huge", policy(secs(60), 3, secs(5), None)),
            upstream.attempt(),
        )
        .await;
    assert_eq!(uncapped.outcome, Outcome::DeadlineInfeasible);
    assert_eq!(upstream.calls(), 2);
}

#[tokio::test(start_paused = true)]
async fn cancel_during_the_wait_removes_the_work() {
    let h = harness();
    let upstream = Upstream::new(vec![http(429, Some("5")), http(200, None)]);
    let cancel = CancellationToken::new();
    let canceller = cancel.clone();
    tokio::spawn(async move {
        tokio::time::sleep(secs(1)).await;
        canceller.cancel();
    });
    let began = Instant::now();
    let result = h
        .gate
        .run(
            intent("i-cancel", policy(secs(60), 3, secs(5), None)).cancel_token(cancel),
            upstream.attempt(),
        )
        .await;
    assert_eq!(result.outcome, Outcome::Cancelled);
    let took = began.elapsed();
    assert!(
        took >= secs(1) && took < ms(1100),
        "ended at the cancellation, not the timer: {took:?}"
    );
    // Nothing revives it later.
    tokio::time::sleep(secs(30)).await;
    assert_eq!(upstream.calls(), 1);
    assert_eq!(
        h.gate.available_capacity(),
        gate_config().max_in_flight,
        "no permit held"
    );
}

#[tokio::test(start_paused = true)]
async fn a_reply_after_cancellation_is_discarded_and_recorded() {
    let h = harness();
    let mut upstream = Upstream::new(vec![http(200, None)]);
    upstream.latency = secs(2);
    let cancel = CancellationToken::new();
    let canceller = cancel.clone();
    tokio::spawn(async move {
        tokio::time::sleep(secs(1)).await;
        canceller.cancel();
    });
    let result = h
        .gate
        .run(
            intent("i-late", policy(secs(60), 3, secs(5), None)).cancel_token(cancel),
            upstream.attempt(),
        )
        .await;
    assert_eq!(result.outcome, Outcome::Cancelled);
    assert_eq!(result.value, None, "the reply is not kept");
    assert!(result.attempts[0].record.response_discarded);
}

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

#[tokio::test(start_paused = true)]
async fn three_layers_configured_exactly_one_owner_repeats() {
    // Client, queue worker and transport each wrap the call in a gate; only
    // the outermost owns retries, the inner ones see its mark.
    let h = harness();
    let upstream = Upstream::new(vec![http(503, Some("1"))]);
    let inner_outcomes = Arc::new(Mutex::new(Vec::new()));
    let gate = h.gate.clone();
    let outcomes = inner_outcomes.clone();
    let upstream_attempt = upstream.attempt();
    let upstream_attempt = Arc::new(tokio::sync::Mutex::new(upstream_attempt));
    let result = h
        .gate
        .run(
            intent("i-owner", policy(secs(60), 3, secs(5), None)),
            move |outer: Attempt| {
                let gate = gate.clone();
                let outcomes = outcomes.clone();
                let upstream_attempt = upstream_attempt.clone();
                async move {
                    let middle_intent = intent("i-owner", policy(secs(60), 3, secs(5), None))
                        .owned_by(Some(outer.owner_mark.clone()));
                    let gate2 = gate.clone();
                    let outcomes2 = outcomes.clone();
                    let outer_mark = outer.owner_mark.clone();
                    let middle = gate
                        .run(middle_intent, move |mid: Attempt| {
                            let gate = gate2.clone();
                            let outcomes = outcomes2.clone();
                            let upstream_attempt = upstream_attempt.clone();
                            let outer_mark = outer_mark.clone();
                            async move {
                                assert_eq!(mid.owner_mark, outer_mark, "the mark is passed on");
                                let transport =
                                    intent("i-owner", policy(secs(60), 3, secs(5), None))
                                        .owned_by(Some(mid.owner_mark.clone()));
                                let innermost = gate
                                    .run(transport, |a: Attempt| {
                                        let upstream_attempt = upstream_attempt.clone();
                                        async move { (upstream_attempt.lock().await)(a).await }
                                    })
                                    .await;
                                outcomes.lock().unwrap().push(innermost.outcome);
                                Reply {
                                    observation: innermost.last_response.unwrap(),
                                    value: innermost.value,
                                }
                            }
                        })
                        .await;
                    outcomes.lock().unwrap().push(middle.outcome);
                    Reply {
                        observation: middle.last_response.unwrap(),
                        value: middle.value,
                    }
                }
            },
        )
        .await;
    assert_eq!(result.outcome, Outcome::AttemptCap);
    assert_eq!(result.attempts.len(), 3);
    assert_eq!(upstream.calls(), 3, "3 attempts, not 3 × 3 × 3");
    let inner = inner_outcomes.lock().unwrap();
    assert_eq!(inner.len(), 6);
    assert!(
        inner.iter().all(|o| *o == Outcome::OwnerElsewhere),
        "{inner:?}"
    );
}

#[tokio::test(start_paused = true)]
async fn lost_response_after_a_possible_write_reconciles_before_replay() {
    let h = harness();
    let log = Arc::new(Mutex::new(Vec::<String>::new()));
    let lost = Observation::transport(TransportFailure::Timeout);

    // The lookup says the write did not happen: replaying is a first
    // performance, and the lookup came before it.
    let upstream = Upstream::new(vec![lost.clone(), http(201, None)]);
    let hook_log = log.clone();
    let repetition = Repetition::reconcile(move |query| {
        let log = hook_log.clone();
        async move {
            log.lock()
                .unwrap()
                .push(format!("lookup {}", query.attempt_id));
            Reconciled::Absent
        }
    });
    let attempt_log = log.clone();
    let mut send = upstream.attempt();
    let result = h
        .gate
        .run(
            intent("i-lost", policy(secs(60), 3, secs(5), None)).repetition(repetition),
            move |a: Attempt| {
                attempt_log
                    .lock()
                    .unwrap()
                    .push(format!("attempt {}", a.number));
                send(a)
            },
        )
        .await;
    assert_eq!(result.outcome, Outcome::Succeeded);
    assert_eq!(
        *log.lock().unwrap(),
        ["attempt 1", "lookup i-lost#1", "attempt 2"]
    );
    assert_eq!(result.attempts[0].reconciled, Some(Reconciled::Absent));

    // The lookup finds the effect: done, with no replay.
    let upstream = Upstream::new(vec![lost.clone(), http(201, None)]);
    let result = h
        .gate
        .run(
            intent("i-applied", policy(secs(60), 3, secs(5), None))
                .repetition(Repetition::reconcile(|_| async { Reconciled::Applied })),
            upstream.attempt(),
        )
        .await;
    assert_eq!(result.outcome, Outcome::Succeeded);
    assert_eq!(upstream.calls(), 1);

    // The lookup cannot tell: reconciliation is required, never a replay.
    let upstream = Upstream::new(vec![lost.clone(), http(201, None)]);
    let result = h
        .gate
        .run(
            intent("i-unknown", policy(secs(60), 3, secs(5), None))
                .repetition(Repetition::reconcile(|_| async { Reconciled::Unknown })),
            upstream.attempt(),
        )
        .await;
    assert_eq!(result.outcome, Outcome::ReconciliationRequired);
    assert_eq!(upstream.calls(), 1);

    // No lookup at all: indeterminate, preserved rather than called a failure.
    let mut upstream = Upstream::new(vec![http(201, None)]);
    upstream.latency = secs(10); // longer than the cap: a timeout after send
    let result = h
        .gate
        .run(
            intent("i-blind", policy(secs(60), 3, secs(5), None))
                .repetition(Repetition::NonRepeatable),
            upstream.attempt(),
        )
        .await;
    assert_eq!(result.outcome, Outcome::Indeterminate);
    let record = &result.attempts[0].record;
    assert_eq!(record.classification.unwrap().effect, Effect::Unknown);
    assert_eq!(
        record.receipt,
        Some(secs(5)),
        "abandoned at its reserved cap"
    );
}

#[tokio::test(start_paused = true)]
async fn repeated_429s_terminate_at_the_caps() {
    let h = harness();
    let upstream = Upstream::new(vec![http(429, Some("1"))]);
    let result = h
        .gate
        .run(
            intent("i-429s", policy(secs(60), 4, secs(2), None)),
            upstream.attempt(),
        )
        .await;
    assert_eq!(result.outcome, Outcome::AttemptCap);
    assert_eq!(upstream.calls(), 4);
    assert!(
        result.attempts[1..]
            .iter()
            .all(|a| matches!(a.token, TokenSource::Leased { .. }))
    );

    // A tighter deadline ends the sequence first.
    let upstream = Upstream::new(vec![http(429, Some("1"))]);
    let result = h
        .gate
        .run(
            intent("i-429s-deadline", policy(secs(5), 10, secs(2), None)),
            upstream.attempt(),
        )
        .await;
    assert_eq!(result.outcome, Outcome::DeadlineInfeasible);
    assert!(upstream.calls() < 10);
    assert!(
        decisions(&result).iter().all(Option::is_some),
        "every attempt has its decision"
    );
}

#[tokio::test(start_paused = true)]
async fn hint_beyond_the_local_max_stops_explicitly() {
    let h = harness();
    let upstream = Upstream::new(vec![http(429, Some("120")), http(200, None)]);
    let began = Instant::now();
    let result = h
        .gate
        .run(
            intent("i-long-hint", policy(secs(600), 3, secs(5), Some(secs(30)))),
            upstream.attempt(),
        )
        .await;
    assert_eq!(result.outcome, Outcome::HintExceedsCap);
    assert_eq!(upstream.calls(), 1, "no silently shortened wait");
    assert!(began.elapsed() < secs(1));
    assert_eq!(
        result.attempts[0].record.hint.as_ref().unwrap().verdict,
        HintVerdict::ExceedsCap {
            delay: secs(120),
            cap: secs(30)
        }
    );
}

#[tokio::test(start_paused = true)]
async fn completion_evidence_while_waiting_cancels_the_pending_retry() {
    let h = harness();
    let upstream = Upstream::new(vec![http(503, Some("5")), http(200, None)]);
    let other = Upstream::new(vec![http(503, Some("2")), http(200, None)]);
    let gate = h.gate.clone();
    let evidence = tokio::spawn(async move {
        tokio::time::sleep(secs(1)).await;
        (
            gate.complete("i-done-elsewhere"),
            gate.complete("i-not-running"),
        )
    });
    let began = Instant::now();
    let (done, unrelated) = tokio::join!(
        h.gate.run(
            intent("i-done-elsewhere", policy(secs(60), 3, secs(5), None)),
            upstream.attempt()
        ),
        h.gate.run(
            intent("i-unrelated", policy(secs(60), 3, secs(5), None)),
            other.attempt()
        ),
    );
    assert_eq!(done.outcome, Outcome::Succeeded);
    assert_eq!(upstream.calls(), 1, "the completed intent did not repeat");
    assert!(began.elapsed() >= secs(1));
    assert_eq!(unrelated.outcome, Outcome::Succeeded);
    assert_eq!(other.calls(), 2, "only the exact intent was stopped");
    assert_eq!(
        evidence.await.unwrap(),
        (true, false),
        "completion reaches a running intent, and only one"
    );
}

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
    let after = h
        .gate
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
    let after = h
        .gate
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
