//! Shadow mode in a worker's gate: the scope's cooldown would hold a retry;
//! under `mode = "shadow"` the gate lets it through and its evidence says
//! what enforcing would have done. A real coordinator on loopback, a real
//! gate and lease cache, the coordinator's manual clock.

mod support;

use std::time::Duration;

use support::{Coordinator, config, loopback_policy, rate_limited, scope};
use tollgate_client::engine::Observation;
use tollgate_client::gate::{Attempt, GateIntent, Reply, Shadowed};
use tollgate_client::scope::Scope;
use tollgate_proto::v1::{self, Priority};

const SHADOW_POLICY: &str = r#"
[[rule]]
route = "GET /x"
mode = "shadow"
"#;

/// The gate under a shadow policy: the scope's cooldown (another worker's
/// 429) would hold a retry; the retry goes at once, and its wait says
/// what enforcing would have done.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gate_lets_through_what_a_shadow_cooldown_would_hold() {
    let ms = Duration::from_millis;
    let coordinator = Coordinator::start(config(SHADOW_POLICY)).await;
    let mut client = coordinator.client().await;
    let x = scope("tenant-a", "GET /x", Priority::Normal);
    client
        .report(rate_limited(x, "w1", "30", v1::ScopeCertainty::Known))
        .await
        .expect("report");

    let gate = coordinator.worker_gate("worker-g");
    let policy = loopback_policy(ms(60_000), 3, ms(100));
    let route = Scope::new("tenant-a", "GET /x");
    // A first intent's report teaches the worker the scope's state.
    let first = gate
        .run(GateIntent::new("i-0", route.clone(), policy), |_| async {
            Reply::new(Observation::http(200, None), ())
        })
        .await;
    assert!(first.succeeded(), "{first:?}");
    gate.cache().flush().await;
    let view = gate.cache().view(&route);
    assert!(view.shadow && view.cooldown_until.is_some(), "{view:?}");

    // The clock never moves: a retry held for the cooldown would never run.
    let run = gate.run(
        GateIntent::new("i-1", route, policy),
        |attempt: Attempt| async move {
            let status = if attempt.number == 1 { 429 } else { 200 };
            Reply::new(Observation::http(status, Some("0")), ())
        },
    );
    let result = tokio::time::timeout(Duration::from_secs(10), run)
        .await
        .expect("not held for the cooldown");
    assert!(result.succeeded(), "{result:?}");
    let wait = result.attempts[0]
        .wait
        .as_ref()
        .expect("the wait before the retry");
    assert_eq!(wait.shadowed, Some(Shadowed::WouldDelay), "{wait:?}");
    assert_eq!(wait.cooldown, None, "not waited for");
}
