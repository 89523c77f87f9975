//! Shadow mode end to end: a scope whose policy says `mode = "shadow"` gets
//! what enforcing would refuse or delay, each answer says what enforcing
//! would have done, the `tollgate.shadow` counter moves, and patching the
//! rule to `enforce` refuses it again. (The gate's side is in
//! `shadow_gate.rs`: its own process, so its counts stay out of these.)

mod support;

use std::collections::HashMap;
use std::net::SocketAddr;

use support::metrics::{MetricsEndpoint, scrape};
use support::{Coordinator, T0, config, rate_limited, reconsider, scope};
use tollgate_proto::v1::{self, Priority, ShadowDecision};

/// No budget at all on `GET /x`, in shadow mode.
const SHADOW_POLICY: &str = r#"
[[rule]]
route = "GET /x"
min_retries_per_sec = 0.0
retry_ratio = 0.0
mode = "shadow"
"#;

/// `tollgate_shadow_total` series by their labels.
async fn shadow_counts(addr: SocketAddr) -> HashMap<String, f64> {
    scrape(addr)
        .await
        .lines()
        .filter(|l| l.starts_with("tollgate_shadow_total{"))
        .filter_map(|l| l.rsplit_once(' '))
        .map(|(k, v)| (k.to_owned(), v.parse().expect("a number")))
        .collect()
}

fn count(counts: &HashMap<String, f64>, rpc: &str, decision: &str) -> f64 {
    counts
        .iter()
        .filter(|(k, _)| {
            k.contains(&format!("tollgate_rpc=\"{rpc}\""))
                && k.contains(&format!("tollgate_decision=\"{decision}\""))
        })
        .map(|(_, v)| v)
        .sum()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shadow_scope_lets_through_what_enforce_refuses() {
    let endpoint = MetricsEndpoint::start().await;
    let metrics = endpoint.addr;

    let coordinator = Coordinator::start(config(SHADOW_POLICY)).await;
    let mut client = coordinator.client().await;
    let x = scope("tenant-a", "GET /x", Priority::Normal);
    let lease = || support::lease(x.clone(), "w1", 1);

    // Shadow: the empty budget would refuse; the token is let through.
    let shadowed = client.lease(lease()).await.expect("lease").into_inner();
    assert_eq!(shadowed.granted, 1);
    assert_eq!(shadowed.limit(), v1::LeaseLimit::None);
    assert_eq!(shadowed.shadowed(), ShadowDecision::WouldRefuse);
    // A cooldown would delay the intent 30 s; the slot is now.
    let reported = client
        .report(rate_limited(
            x.clone(),
            "w1",
            "30",
            v1::ScopeCertainty::Known,
        ))
        .await
        .expect("report")
        .into_inner();
    assert!(reported.shadow, "the worker is told the scope is in shadow");
    let slot = client
        .reconsider(reconsider(x.clone(), "intent-1"))
        .await
        .expect("reconsider")
        .into_inner();
    assert_eq!(slot.decision(), v1::ReconsiderDecision::Slot);
    assert_eq!(slot.slot_unix_ms, T0);
    assert_eq!(slot.shadowed(), ShadowDecision::WouldDelay);
    let counts = shadow_counts(metrics).await;
    assert_eq!(count(&counts, "lease", "would_refuse"), 1.0, "{counts:?}");
    assert_eq!(
        count(&counts, "reconsider", "would_delay"),
        1.0,
        "{counts:?}"
    );

    // `tollgate policy set 'GET /x' mode=enforce`, as the CLI sends it.
    let mut admin = coordinator.admin().await;
    let rule = admin
        .get_policy(v1::GetPolicyRequest {
            caller_scope: "*".into(),
            route: "GET /x".into(),
        })
        .await
        .expect("get policy")
        .into_inner();
    let enforced = admin
        .set_policy(v1::SetPolicyRequest {
            caller_scope: "*".into(),
            route: "GET /x".into(),
            expected_version: rule.policy_version,
            fields: Some(v1::PolicyFields {
                mode: Some("enforce".into()),
                ..v1::PolicyFields::default()
            }),
            patch: true,
            reason: "shadow looked right".into(),
        })
        .await
        .expect("set policy")
        .into_inner();

    let refused = client.lease(lease()).await.expect("lease").into_inner();
    assert_eq!(refused.granted, 0);
    assert_eq!(refused.limit(), v1::LeaseLimit::BudgetExhausted);
    assert_eq!(refused.shadowed(), ShadowDecision::Unspecified);
    // Enforced: asked to ask again until the slot, after the cooldown.
    let (delayed, _) = coordinator
        .reconsider_until_answered(&mut client, reconsider(x.clone(), "intent-2"))
        .await;
    assert_eq!(delayed.decision(), v1::ReconsiderDecision::Slot);
    assert!(delayed.slot_unix_ms >= T0 + 30_000, "{delayed:?}");
    let counts = shadow_counts(metrics).await;
    assert_eq!(
        count(&counts, "lease", "would_refuse"),
        1.0,
        "enforced: not counted"
    );

    // A mode the coordinator does not know is refused, naming the field.
    let bad = admin
        .set_policy(v1::SetPolicyRequest {
            caller_scope: "*".into(),
            route: "GET /x".into(),
            expected_version: enforced.policy_version,
            fields: Some(v1::PolicyFields {
                mode: Some("observe".into()),
                ..v1::PolicyFields::default()
            }),
            patch: true,
            reason: String::new(),
        })
        .await
        .expect_err("unknown mode");
    assert!(bad.message().contains("mode"), "{bad:?}");

    coordinator.stop().await;
    endpoint.stop().await;
}
