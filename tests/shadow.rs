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

fn release(
    scope: Option<v1::Scope>,
    worker: &str,
    lease_id: &str,
    spent: u32,
    retry_successes: u32,
) -> v1::ReleaseRequest {
    v1::ReleaseRequest {
        scope,
        worker_id: worker.into(),
        lease_id: lease_id.into(),
        spent,
        retry_successes,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shadow_grant_of_nothing_has_a_lease_id_and_releases_like_any() {
    let coordinator = Coordinator::start(config(SHADOW_POLICY)).await;
    let mut client = coordinator.client().await;
    let x = scope("tenant-a", "GET /x", Priority::Normal);

    let lease = client
        .lease(support::lease(x.clone(), "w1", 5))
        .await
        .expect("lease")
        .into_inner();
    assert_eq!(lease.granted, 5);
    assert_eq!(lease.shadowed(), ShadowDecision::WouldRefuse);
    assert!(!lease.lease_id.is_empty(), "{lease:?}");
    assert!(lease.expires_at_unix_ms > T0, "{lease:?}");
    // Enforcing granted nothing: the store holds no lease.
    let state = coordinator.scope_state("tenant-a", "GET /x").await;
    assert_eq!(state.tokens_outstanding, 0, "{state:?}");

    // Checked against the 5 the Lease answered, as any lease.
    let over = client
        .release(release(x.clone(), "w1", &lease.lease_id, 6, 0))
        .await
        .expect_err("spent more than granted");
    assert_eq!(over.code(), tonic::Code::InvalidArgument, "{over:?}");
    assert!(over.message().starts_with("spent"), "{over:?}");
    let released = client
        .release(release(x.clone(), "w1", &lease.lease_id, 2, 1))
        .await
        .expect("release")
        .into_inner();
    assert_eq!(released.returned, 5 - 2 + 1);

    // Expired, it is gone like any lease.
    let late = client
        .lease(support::lease(x.clone(), "w1", 5))
        .await
        .expect("lease")
        .into_inner();
    coordinator.advance(support::ms(
        u64::try_from(late.expires_at_unix_ms - T0).expect("after T0"),
    ));
    let gone = client
        .release(release(x.clone(), "w1", &late.lease_id, 0, 0))
        .await
        .expect_err("expired");
    assert_eq!(gone.code(), tonic::Code::NotFound, "{gone:?}");
    coordinator.stop().await;
}

/// 2.5 retries per 10 s window in shadow mode, 2 of them in the normal
/// class's share: a Lease for 5 is granted 2 by the budget and 5 by the
/// shadow.
const PARTIAL_SHADOW_POLICY: &str = r#"
[[rule]]
route = "GET /x"
min_retries_per_sec = 0.25
retry_ratio = 0.0
window = "10s"
mode = "shadow"
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_partial_shadow_grant_refunds_the_budget_only_what_it_charged() {
    let coordinator = Coordinator::start(config(PARTIAL_SHADOW_POLICY)).await;
    let mut client = coordinator.client().await;
    let x = scope("tenant-a", "GET /x", Priority::Normal);

    let lease = client
        .lease(support::lease(x.clone(), "w1", 5))
        .await
        .expect("lease")
        .into_inner();
    assert_eq!(lease.granted, 5);
    assert_eq!(lease.shadowed(), ShadowDecision::WouldRefuse);
    let state = coordinator.scope_state("tenant-a", "GET /x").await;
    assert_eq!(
        (state.leases_outstanding, state.tokens_outstanding),
        (1, 2),
        "the budget's part: {state:?}"
    );

    // Another worker cannot end it.
    let theirs = client
        .release(release(x.clone(), "w2", &lease.lease_id, 1, 0))
        .await
        .expect_err("another worker's lease");
    assert_eq!(theirs.code(), tonic::Code::NotFound, "{theirs:?}");

    // Spent one of the five: four come back, as for any lease of five.
    let released = client
        .release(release(x.clone(), "w1", &lease.lease_id, 1, 0))
        .await
        .expect("release")
        .into_inner();
    assert_eq!(released.returned, 4);
    let state = coordinator.scope_state("tenant-a", "GET /x").await;
    assert_eq!(state.leases_outstanding, 0, "{state:?}");
    // The budget got back one of its two: the next Lease holds one token
    // of the store's, still short of five.
    let next = client
        .lease(support::lease(x.clone(), "w1", 5))
        .await
        .expect("lease")
        .into_inner();
    assert_eq!(next.shadowed(), ShadowDecision::WouldRefuse);
    let state = coordinator.scope_state("tenant-a", "GET /x").await;
    assert_eq!(state.tokens_outstanding, 1, "{state:?}");

    // A release is once: the store's lease is gone.
    let again = client
        .release(release(x.clone(), "w1", &lease.lease_id, 1, 0))
        .await
        .expect_err("released twice");
    assert_eq!(again.code(), tonic::Code::NotFound, "{again:?}");
    coordinator.stop().await;
}
