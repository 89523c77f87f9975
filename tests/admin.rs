//! End-to-end tests of the Admin service: a real server on loopback, real
//! tonic clients, a manual clock.

mod support;

use std::time::Duration;

use support::{
    ADMIN_TOKEN, Coordinator, POLICY_WITH_TOKENS, T0, TENANT_A_TOKEN, config, lease, rate_limited,
    scope, with_token,
};
use tollgate_proto::v1::{self, LeaseLimit, Priority, ScopeCertainty, ScopeEventKind};
use tonic::Code;

use support::ROUTE;

fn set(caller: &str, route: &str, expected: u64, ratio: f64, patch: bool) -> v1::SetPolicyRequest {
    v1::SetPolicyRequest {
        caller_scope: caller.into(),
        route: route.into(),
        expected_version: expected,
        fields: Some(v1::PolicyFields {
            retry_ratio: Some(ratio),
            ..v1::PolicyFields::default()
        }),
        patch,
        reason: "test".into(),
    }
}

#[tokio::test]
async fn admin_refuses_unknown_or_missing_tokens_as_unauthenticated_and_caller_tokens_as_denied() {
    let coordinator = Coordinator::start(config(POLICY_WITH_TOKENS)).await;
    let mut admin = coordinator.admin().await;
    for (token, code) in [
        (Some(TENANT_A_TOKEN), Code::PermissionDenied),
        (Some("nope-nope-nope"), Code::Unauthenticated),
        (None, Code::Unauthenticated),
    ] {
        let request = v1::ListPoliciesRequest {};
        let result = match token {
            Some(t) => admin.list_policies(with_token(request, t)).await,
            None => admin.list_policies(request).await,
        };
        let status = result.expect_err("refused");
        assert_eq!(status.code(), code, "{token:?}: {status}");
        assert!(
            !status.message().contains("token-of"),
            "tokens never echoed"
        );
    }
    let ok = admin
        .list_policies(with_token(v1::ListPoliciesRequest {}, ADMIN_TOKEN))
        .await
        .expect("admin token works")
        .into_inner();
    assert_eq!(ok.rules.len(), 1);
    // And an admin token is not a caller token.
    let mut budget = coordinator.client().await;
    let status = budget
        .lease(with_token(
            lease(scope("tenant-a", ROUTE, Priority::Normal), "w", 1),
            ADMIN_TOKEN,
        ))
        .await
        .expect_err("not a caller token");
    assert_eq!(status.code(), Code::Unauthenticated);
    coordinator.stop().await;
}

#[tokio::test]
async fn a_stale_version_is_failed_precondition_and_changes_nothing() {
    let coordinator = Coordinator::open().await; // open dev mode: loopback admin
    let mut admin = coordinator.admin().await;
    let created = admin
        .set_policy(set("tenant-a", "GET /users/*", 0, 0.1, false))
        .await
        .expect("create")
        .into_inner();
    assert!(created.policy_version > 1);
    let again = admin
        .set_policy(set("tenant-a", "GET /users/*", 0, 0.3, false))
        .await
        .expect_err("exists");
    assert_eq!(again.code(), Code::FailedPrecondition);
    let updated = admin
        .set_policy(set(
            "tenant-a",
            "GET /users/*",
            created.policy_version,
            0.05,
            true,
        ))
        .await
        .expect("fresh version")
        .into_inner();
    assert!(updated.policy_version > created.policy_version);
    let stale = admin
        .set_policy(set(
            "tenant-a",
            "GET /users/*",
            created.policy_version,
            0.9,
            true,
        ))
        .await
        .expect_err("stale");
    assert_eq!(stale.code(), Code::FailedPrecondition);
    assert!(
        stale.message().contains("read it again"),
        "{}",
        stale.message()
    );
    let now = admin
        .get_policy(v1::GetPolicyRequest {
            caller_scope: "tenant-a".into(),
            route: "GET /users/*".into(),
        })
        .await
        .expect("get")
        .into_inner();
    assert_eq!(now.fields.expect("fields").retry_ratio, Some(0.05));
    let delete_stale = admin
        .delete_policy(v1::DeletePolicyRequest {
            caller_scope: "tenant-a".into(),
            route: "GET /users/*".into(),
            expected_version: created.policy_version,
            reason: String::new(),
            clear: false,
        })
        .await
        .expect_err("stale delete");
    assert_eq!(delete_stale.code(), Code::FailedPrecondition);
    coordinator.stop().await;
}

#[tokio::test]
async fn a_freeze_reaches_a_watching_worker_and_stops_its_leases() {
    let coordinator = Coordinator::open().await;
    let mut worker = coordinator.client().await;
    let mut admin = coordinator.admin().await;
    let s = scope("tenant-a", ROUTE, Priority::Normal);
    let (mut events, _) = support::watch(&mut worker, &s, "w").await;
    admin
        .freeze_scope(v1::FreezeScopeRequest {
            caller_scope: "tenant-a".into(),
            route: ROUTE.into(),
            reason: "upstream incident".into(),
            duration_ms: 60_000,
        })
        .await
        .expect("freeze");
    let event = support::next_event(&mut events, "within the watch latency").await;
    assert_eq!(event.kind(), ScopeEventKind::Frozen);
    assert_eq!(event.reason, "upstream incident");
    let refused = worker
        .lease(lease(s.clone(), "w", 5))
        .await
        .expect("lease")
        .into_inner();
    assert_eq!(refused.granted, 0);
    assert_eq!(refused.limit(), LeaseLimit::Frozen);
    // The freeze expires on the coordinator's clock.
    coordinator.advance(Duration::from_secs(61));
    let event = support::next_event(&mut events, "expiry within its tick").await;
    assert_eq!(event.kind(), ScopeEventKind::Unfrozen);
    let granted = worker
        .lease(lease(s, "w", 5))
        .await
        .expect("lease")
        .into_inner();
    assert_eq!(granted.granted, 5);
    let audit = admin
        .list_audit(v1::ListAuditRequest::default())
        .await
        .expect("audit")
        .into_inner();
    let actions: Vec<(&str, &str)> = audit
        .records
        .iter()
        .map(|r| (r.action.as_str(), r.who.as_str()))
        .collect();
    assert_eq!(
        actions,
        [
            ("scope.unfreeze", "expiry"),
            ("scope.freeze", "dev-loopback")
        ]
    );
    coordinator.stop().await;
}

#[tokio::test]
async fn a_policy_change_is_pushed_and_rescales_without_refilling() {
    let coordinator = Coordinator::start(config(
        "[defaults]\nmin_retries_per_sec = 1\n[[rule]]\nroute = \"GET /users/*\"\nretry_ratio = 0.5\n",
    ))
    .await;
    let mut worker = coordinator.client().await;
    let mut admin = coordinator.admin().await;
    let s = scope("tenant-a", ROUTE, Priority::Critical);
    let (mut events, snapshot) = support::watch(&mut worker, &s, "w").await;
    worker
        .report(v1::ReportRequest {
            scope: s.clone(),
            worker_id: "w".into(),
            first_attempts: 100,
            successes: 0,
            rejections: 0,
            counts_age_ms: 0,
            evidence: vec![],
            stated_limit: None,
        })
        .await
        .expect("report");
    // Allowance 10 + 50 = 60 tokens, all of which critical may reach
    // (it borrows the unspent shares below it); spend 20.
    let got = worker
        .lease(lease(s.clone(), "w", 20))
        .await
        .expect("lease");
    assert_eq!(got.into_inner().granted, 20);
    let rule = admin
        .get_policy(v1::GetPolicyRequest {
            caller_scope: "*".into(),
            route: "GET /users/*".into(),
        })
        .await
        .expect("get")
        .into_inner();
    admin
        .set_policy(set("*", "GET /users/*", rule.policy_version, 0.1, true))
        .await
        .expect("tighten");
    let event = support::next_event(&mut events, "pushed").await;
    assert_eq!(event.kind(), ScopeEventKind::PolicyChanged);
    assert!(event.policy_version > snapshot.policy_version);
    // Now 10 + 10 = 20, all spent: nothing left, and no refill.
    let state = coordinator.scope_state("tenant-a", ROUTE).await;
    let critical = &state.classes[0];
    assert_eq!(critical.spent, 20.0);
    assert_eq!(critical.allowance, 20.0);
    assert_eq!(critical.available, 0.0);
    assert_eq!(
        state.leases_outstanding, 1,
        "outstanding leases are honoured"
    );
    let refused = worker.lease(lease(s, "w", 1)).await.expect("lease");
    let refused = refused.into_inner();
    assert_eq!(refused.granted, 0);
    assert_eq!(refused.policy_version, event.policy_version);
    coordinator.stop().await;
}

#[tokio::test]
async fn a_scope_in_a_storm_shows_its_cooldown_source_and_lists_in_pages() {
    let coordinator = Coordinator::open().await;
    let mut worker = coordinator.client().await;
    let mut admin = coordinator.admin().await;
    for route in ["a", "b", "c"] {
        worker
            .report(rate_limited(
                scope("tenant-a", route, Priority::Normal),
                "w",
                "30",
                ScopeCertainty::Known,
            ))
            .await
            .expect("report");
    }
    let first = admin
        .list_scopes(v1::ListScopesRequest {
            caller_scope: "tenant-*".into(),
            page_size: 2,
            ..v1::ListScopesRequest::default()
        })
        .await
        .expect("list")
        .into_inner();
    assert_eq!(first.scopes.len(), 2);
    let second = admin
        .list_scopes(v1::ListScopesRequest {
            caller_scope: "tenant-*".into(),
            page_size: 2,
            page_token: first.next_page_token.clone(),
            ..v1::ListScopesRequest::default()
        })
        .await
        .expect("list")
        .into_inner();
    assert_eq!(second.scopes.len(), 1);
    assert!(second.next_page_token.is_empty());
    let state = coordinator.scope_state("tenant-a", "b").await;
    assert!(state.known);
    assert_eq!(state.cooldown_until_unix_ms, T0 + 30_000);
    let source = state.cooldown_source.expect("a source hint");
    assert_eq!(source.raw, "30");
    assert!(source.valid);
    assert_eq!(state.recent_hints.len(), 1);
    assert_eq!(state.policy_rule, "[defaults]");
    let reset = admin
        .reset_scope(v1::ResetScopeRequest {
            caller_scope: "tenant-a".into(),
            route: "b".into(),
            reason: "stuck cooldown".into(),
        })
        .await
        .expect("reset")
        .into_inner();
    assert!(reset.existed);
    let bad = admin
        .list_scopes(v1::ListScopesRequest {
            page_token: "zz".into(),
            ..v1::ListScopesRequest::default()
        })
        .await
        .expect_err("bad token");
    assert_eq!(bad.code(), Code::InvalidArgument);
    coordinator.stop().await;
}

#[tokio::test]
async fn apply_dry_run_shows_changes_and_an_invalid_file_names_its_line() {
    let coordinator = Coordinator::open().await;
    let mut admin = coordinator.admin().await;
    let file = "[defaults]\nretry_ratio = 0.3\n\n[[rule]]\nroute = \"GET /x\"\nwake_rate = 10\n";
    let dry = admin
        .apply_policies(v1::ApplyPoliciesRequest {
            toml: file.into(),
            dry_run: true,
            reason: String::new(),
        })
        .await
        .expect("dry run")
        .into_inner();
    assert!(!dry.applied);
    assert_eq!(dry.changes.len(), 2, "{:?}", dry.changes);
    let listed = admin
        .list_policies(v1::ListPoliciesRequest {})
        .await
        .expect("list")
        .into_inner();
    assert!(listed.rules.is_empty(), "a dry run changes nothing");
    let applied = admin
        .apply_policies(v1::ApplyPoliciesRequest {
            toml: file.into(),
            dry_run: false,
            reason: "rollout".into(),
        })
        .await
        .expect("apply")
        .into_inner();
    assert!(applied.applied);
    let bad = admin
        .apply_policies(v1::ApplyPoliciesRequest {
            toml: "[[rule]]\nroute = \"*\"\n\nretry_ratio = 500.0\n".into(),
            dry_run: false,
            reason: String::new(),
        })
        .await
        .expect_err("invalid");
    assert_eq!(bad.code(), Code::InvalidArgument);
    assert!(bad.message().contains("line 4"), "{}", bad.message());
    let audit = admin
        .list_audit(v1::ListAuditRequest::default())
        .await
        .expect("audit")
        .into_inner();
    assert_eq!(audit.records.len(), 2, "one record per changed rule");
    assert!(audit.records.iter().all(|r| r.action == "policy.apply"));
    coordinator.stop().await;
}

/// A reset clears the route's cooldown for a watching worker too: without an
/// event its `max`-merged cooldown would outlive the operator's reset. The
/// caller scope's cooldown, which a route reset leaves alone, is announced
/// again after the end.
#[tokio::test]
async fn a_reset_ends_a_watching_workers_cooldown() {
    let coordinator = Coordinator::open().await;
    let mut worker = coordinator.client().await;
    let mut admin = coordinator.admin().await;
    let s = scope("tenant-a", ROUTE, Priority::Normal);
    let (mut events, _) = support::watch(&mut worker, &s, "w").await;
    for (hint, certainty) in [
        ("10", ScopeCertainty::Uncertain),
        ("30", ScopeCertainty::Known),
    ] {
        worker
            .report(rate_limited(s.clone(), "w", hint, certainty))
            .await
            .expect("report");
        assert_eq!(
            support::next_event(&mut events, "the reset's watch")
                .await
                .kind(),
            ScopeEventKind::CooldownStarted
        );
    }
    let reset = admin
        .reset_scope(v1::ResetScopeRequest {
            caller_scope: "tenant-a".into(),
            route: ROUTE.into(),
            reason: "stuck cooldown".into(),
        })
        .await
        .expect("reset")
        .into_inner();
    assert!(reset.existed);
    let ended = support::next_event(&mut events, "the reset's watch").await;
    assert_eq!(ended.kind(), ScopeEventKind::CooldownEnded);
    assert_eq!(ended.cooldown_until_unix_ms, T0 + 10_000);
    let caller_wide = support::next_event(&mut events, "the reset's watch").await;
    assert_eq!(caller_wide.kind(), ScopeEventKind::CooldownStarted);
    assert_eq!(caller_wide.cooldown_until_unix_ms, T0 + 10_000);
    coordinator.stop().await;
}
