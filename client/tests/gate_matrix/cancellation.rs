//! Rows where something other than the timer ends a wait: cancellation
//! while waiting or while a reply is on its way, and completion evidence
//! that stops the pending retry of one intent and no other.

use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tollgate_client::outcome::Outcome;

use super::intent;
use crate::common::{Upstream, http};
use crate::support::pipes::*;

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
