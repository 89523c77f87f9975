//! A worker's round trip against a running coordinator, through the client:
//! one intent whose first attempt is refused `429` with `Retry-After: 1`.
//! The gate reports the refusal (with its raw hint), asks the coordinator
//! for a slot, takes a leased retry token and tries again.
//!
//! ```text
//! tollgate serve &                       # listens on 127.0.0.1:50051
//! cargo run --example round_trip -- 127.0.0.1:50051
//! ```
//!
//! With no coordinator running the same intent runs on the local fallback
//! budget, and the evidence says so (`token: Fallback`, `degraded: true`).

use std::time::Duration;

use tollgate_client::{GateIntent, IntentPolicy, Observation, Reply, Scope, Tollgate};

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let address = std::env::args()
        .nth(1)
        .unwrap_or_else(|| "127.0.0.1:50051".to_owned());
    let tollgate = Tollgate::connect(format!("http://{address}"), "example-worker").build()?;

    // 30 s end to end; the attempt cap (3), each attempt's reserve (an even
    // share of the deadline), the backoff and the hint cap by default.
    let policy = IntentPolicy::builder(Duration::from_secs(30)).build()?;
    let scope = Scope::new("example-tenant", "GET /users/{id}");
    let intent = GateIntent::new("order-42", scope, policy);
    let result = tollgate
        .gate()
        .run(intent, |attempt| async move {
            // Stands in for the upstream: refuses the first attempt for
            // capacity, accepts the second.
            let observation = match attempt.number {
                1 => Observation::http(429, Some("1")),
                _ => Observation::http(200, None),
            };
            Reply::new(observation, attempt.attempt_id)
        })
        .await;

    println!(
        "outcome: {} ({})",
        result.outcome,
        result.outcome.describe()
    );
    for evidence in &result.attempts {
        let record = &evidence.record;
        println!(
            "attempt {}: status {:?}, token {:?}, policy v{}, decision {:?}",
            record.number,
            record.status,
            evidence.token,
            evidence.policy_version,
            record.decision.map(|d| d.as_str()),
        );
        if let Some(wait) = &evidence.wait {
            println!(
                "  waited until {:?} (engine {:?}, slot {:?}, cooldown {:?}, degraded {})",
                wait.planned_start, wait.engine_next_start, wait.slot, wait.cooldown, wait.degraded
            );
        }
    }
    println!("coordinator link: {:?}", tollgate.link_state());
    // Sends the batched report (first attempt, success, the 429's evidence).
    tollgate.flush().await;
    Ok(())
}
