//! The one row of the gate's failure-shaped matrix that still runs against a
//! scriptable fake coordinator: "policy rotated while waiting".
//!
//! Every other row runs against the real coordinator in the root package's
//! `tests/gate_matrix.rs`. This one needs an operator to change a scope's
//! policy while an intent waits, and the real coordinator has no mechanism
//! for that yet: its policies are fixed when it starts and the Admin API has
//! not landed. Move this row there (and delete `support/`) once it has.

#![allow(clippy::unwrap_used)]

mod support;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use support::*;
use tokio::time::Instant;
use tollgate_client::engine::Observation;
use tollgate_client::evidence::Outcome;
use tollgate_client::gate::{Attempt, GateIntent, Reply};

/// An upstream that answers attempt `n` with `answers[n - 1]` (the last one
/// repeats) after `latency`, logging when each attempt started.
#[derive(Clone)]
struct Upstream {
    answers: Arc<Vec<Observation>>,
    latency: Duration,
    started: Arc<Mutex<Vec<(u32, Instant)>>>,
}

impl Upstream {
    fn new(answers: Vec<Observation>) -> Self {
        Upstream {
            answers: Arc::new(answers),
            latency: ms(20),
            started: Arc::default(),
        }
    }

    fn starts(&self) -> Vec<Instant> {
        self.started
            .lock()
            .unwrap()
            .iter()
            .map(|(_, at)| *at)
            .collect()
    }

    fn attempt(
        &self,
    ) -> impl FnMut(Attempt) -> std::pin::Pin<Box<dyn Future<Output = Reply<u32>> + Send>> + use<>
    {
        let this = self.clone();
        move |attempt: Attempt| {
            let this = this.clone();
            Box::pin(async move {
                this.started
                    .lock()
                    .unwrap()
                    .push((attempt.number, Instant::now()));
                tokio::time::sleep(this.latency).await;
                let index = usize::try_from(attempt.number - 1)
                    .unwrap()
                    .min(this.answers.len() - 1);
                Reply::new(this.answers[index].clone(), attempt.number)
            })
        }
    }
}

fn http(status: u16, retry_after: Option<&str>) -> Observation {
    Observation::http(status, retry_after)
}

fn intent(id: &str, policy: tollgate_client::engine::Policy) -> GateIntent {
    GateIntent::new(id, scope(), policy)
}

#[tokio::test(start_paused = true)]
async fn policy_rotated_while_waiting_is_re_evaluated_under_the_new_version() {
    let h = harness().await;
    let upstream = Upstream::new(vec![http(429, Some("3")), http(200, None)]);
    let fleet = h.fleet.clone();
    let rotate = async {
        // Let the first report and the Watch stream get going, then rotate.
        tokio::time::sleep(secs(1)).await;
        fleet.rotate_policy(&scope(), secs(2))
    };
    let (result, new_version) = tokio::join!(
        h.gate.run(
            intent("i-rotated", policy(secs(60), 3, secs(5), None)),
            upstream.attempt()
        ),
        rotate,
    );
    assert_eq!(result.outcome, Outcome::Succeeded);
    let wait = result.attempts[0].wait.clone().unwrap();
    assert_eq!(wait.policy_version_at_wait, 1);
    assert_eq!(wait.policy_version_at_wake, new_version);
    assert_eq!(wait.reevaluations, 1);
    assert_eq!(
        result.attempts[1].policy_version, new_version,
        "admitted under the named version"
    );
    let reconsiders = h
        .fleet
        .get(|s| s.reconsiders.iter().map(|(_, v)| *v).collect::<Vec<_>>());
    assert_eq!(
        reconsiders,
        [1, new_version],
        "a fresh slot under the new version"
    );
    // The new version's slot (2 s later) was honoured, not the stale timer.
    let starts = upstream.starts();
    assert!(
        starts[1] - starts[0] >= secs(5),
        "{:?}",
        starts[1] - starts[0]
    );
}
