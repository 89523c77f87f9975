//! Rows about repeating an operation safely: three nested gates with
//! exactly one retry owner, and a response lost after a possible write,
//! reconciled before any replay.

use std::sync::{Arc, Mutex};

use tollgate_client::classify::{Effect, TransportFailure};
use tollgate_client::engine::Observation;
use tollgate_client::gate::{Attempt, Reconciled, Repetition, Reply};
use tollgate_client::outcome::Outcome;

use super::intent;
use crate::common::{Upstream, http};
use crate::support::pipes::*;

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
