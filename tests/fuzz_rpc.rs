//! Property-based fuzzing of every Budget and Admin RPC through the real
//! server on loopback, with arbitrary field values (strings of any length
//! and character, huge and negative counts, unknown enum values, oversized
//! repeated fields) through real tonic clients. `tests/fuzz_raw.rs` sends
//! arbitrary bytes instead; the harness is `tests/support/fuzz.rs`.
//!
//! Whatever arrives, the coordinator answers a status (never a reset
//! connection, never INTERNAL or UNKNOWN, which is what a panicking handler
//! turns into), an INVALID_ARGUMENT names the field, and a canary scope
//! owned by another caller token keeps its exact state.
//!
//! A default run is short (64 cases per property); `TOLLGATE_FUZZ_CASES=N`
//! runs N. A failing case is shrunk by proptest and printed.

mod support;

use proptest::prelude::*;
use proptest::test_runner::TestCaseError;
use tollgate_proto::v1;
use tonic::Code;

use support::fuzz::*;
use support::{Coordinator, with_token};

// ---- Budget ------------------------------------------------------------

fn scope() -> impl Strategy<Value = Option<v1::Scope>> {
    prop::option::weighted(
        0.9,
        (caller(), route(), any_enum()).prop_map(|(caller_scope, route, priority)| v1::Scope {
            caller_scope,
            route,
            priority,
        }),
    )
}

fn evidence() -> impl Strategy<Value = v1::Evidence> {
    (
        (any_u32(), any_u32(), any::<bool>(), any_text()),
        (any::<bool>(), any_text(), any_i64(), any_i64()),
        (any_enum(), any_text()),
    )
        .prop_map(
            |(
                (http_status, grpc_code, has_retry_after, retry_after),
                (has_pushback, pushback_ms, receipt_unix_ms, sent_unix_ms),
                (certainty, intent_id),
            )| v1::Evidence {
                http_status,
                grpc_code,
                has_retry_after,
                retry_after,
                has_pushback,
                pushback_ms,
                receipt_unix_ms,
                sent_unix_ms,
                certainty,
                intent_id,
            },
        )
}

#[derive(Debug, Clone)]
enum BudgetCall {
    Lease(v1::LeaseRequest),
    Release(v1::ReleaseRequest),
    Report(v1::ReportRequest),
    Reconsider(v1::ReconsiderRequest),
    Watch(v1::WatchRequest),
}

fn budget_call() -> impl Strategy<Value = BudgetCall> {
    prop_oneof![
        (scope(), any_text(), any_u32(), any_enum()).prop_map(|(scope, worker_id, want, rc)| {
            BudgetCall::Lease(v1::LeaseRequest {
                scope,
                worker_id,
                want,
                retry_class: rc,
            })
        }),
        (scope(), any_text(), any_text(), any_u32(), any_u32()).prop_map(
            |(scope, worker_id, lease_id, spent, retry_successes)| {
                BudgetCall::Release(v1::ReleaseRequest {
                    scope,
                    worker_id,
                    lease_id,
                    spent,
                    retry_successes,
                })
            }
        ),
        (
            scope(),
            any_text(),
            (any_u32(), any_u32(), any_u32(), any::<u64>()),
            // Past MAX_EVIDENCE, so the repeated-field bound is exercised.
            prop::collection::vec(evidence(), 0..80)
        )
            .prop_map(
                |(scope, worker_id, (first_attempts, successes, rejections, age), evidence)| {
                    BudgetCall::Report(v1::ReportRequest {
                        scope,
                        worker_id,
                        first_attempts,
                        successes,
                        rejections,
                        counts_age_ms: age,
                        evidence,
                        stated_limit: None,
                    })
                }
            ),
        (
            scope(),
            (any_text(), any_text()),
            (any_i64(), any_i64(), any::<u64>())
        )
            .prop_map(
                |(scope, (worker_id, intent_id), (not_before, deadline, reserve))| {
                    BudgetCall::Reconsider(v1::ReconsiderRequest {
                        scope,
                        worker_id,
                        intent_id,
                        not_before_unix_ms: not_before,
                        deadline_unix_ms: deadline,
                        attempt_reserve_ms: reserve,
                        // Either kind of ask, from the fuzzed bits.
                        first_attempt: reserve % 2 == 1,
                        arriving: reserve % 4 == 1,
                    })
                }
            ),
        (prop::collection::vec(scope(), 0..80), any_text()).prop_map(|(scopes, worker_id)| {
            BudgetCall::Watch(v1::WatchRequest {
                scopes: scopes.into_iter().flatten().collect(),
                worker_id,
            })
        }),
    ]
}

async fn call_budget(
    client: &mut v1::budget_client::BudgetClient<tonic::transport::Channel>,
    call: BudgetCall,
) -> Result<(), TestCaseError> {
    match call {
        BudgetCall::Lease(r) => check("Lease", client.lease(with_token(r, FUZZ_TOKEN)).await),
        BudgetCall::Release(r) => check("Release", client.release(with_token(r, FUZZ_TOKEN)).await),
        BudgetCall::Report(r) => check("Report", client.report(with_token(r, FUZZ_TOKEN)).await),
        BudgetCall::Reconsider(r) => check(
            "Reconsider",
            client.reconsider(with_token(r, FUZZ_TOKEN)).await,
        ),
        BudgetCall::Watch(r) => match client.watch(with_token(r, FUZZ_TOKEN)).await {
            // An accepted Watch opens with a snapshot per scope, or ends.
            Ok(stream) => {
                let first =
                    tokio::time::timeout(support::PUSH_BOUND, stream.into_inner().message())
                        .await
                        .map_err(|_| TestCaseError::fail("Watch: no snapshot"))?;
                match first {
                    Ok(_) => Ok(()),
                    Err(status) => check_status("Watch stream", &status),
                }
            }
            Err(status) => check_status("Watch", &status),
        },
    }
}

/// Every Budget RPC with arbitrary fields under the fuzzer's token: each
/// call is answered, and the canary's state is exactly as it was.
#[test]
fn budget_rpcs_answer_every_input_and_keep_the_canary() {
    let rt = runtime();
    let (coordinator, canary) = rt.block_on(async {
        let coordinator = Coordinator::start(support::config(POLICY)).await;
        let canary = plant_canary(&coordinator).await;
        (coordinator, canary)
    });
    let client = rt.block_on(coordinator.client());
    let calls = prop::collection::vec(budget_call(), 1..6);
    runner()
        .run(&calls, |calls| {
            // A tonic client is a cheap handle; the runner's closure is `Fn`.
            let mut client = client.clone();
            rt.block_on(async {
                for call in calls {
                    call_budget(&mut client, call).await?;
                }
                prop_assert_eq!(&canary_state(&coordinator).await, &canary);
                Ok(())
            })
        })
        .expect("the property holds");
    rt.block_on(coordinator.stop());
}

// ---- Admin -------------------------------------------------------------

/// A duration key: well-formed, negative, enormous, or not one at all.
fn duration_text() -> impl Strategy<Value = String> {
    prop_oneof![
        "[0-9]{1,3}(ms|s|m|h)",
        Just("-1s".to_owned()),
        Just("18446744073709551615s".to_owned()),
        Just("99999999999999h".to_owned()),
        any_text(),
    ]
}

fn any_f64() -> impl Strategy<Value = f64> {
    prop_oneof![
        0.0..2.0f64,
        Just(f64::NAN),
        Just(f64::INFINITY),
        Just(-1.0),
        Just(f64::MAX),
        any::<f64>()
    ]
}

fn policy_fields() -> impl Strategy<Value = v1::PolicyFields> {
    use prop::option::of;
    (
        (
            of(duration_text()),
            of(any_f64()),
            of(any_f64()),
            of(any::<u64>()),
        ),
        (
            of(any_f64()),
            of(any_f64()),
            of((any_f64(), any_f64(), any_f64())),
        ),
        (
            of(duration_text()),
            of(duration_text()),
            of(duration_text()),
        ),
        (of(duration_text()), of(duration_text()), of(any_u32())),
        (
            of(any_u32()),
            of(any_f64()),
            of(duration_text()),
            of(any_text()),
        ),
        (
            of(any_text()),
            of(any_f64()),
            of(any_f64()),
            of(any_f64()),
            of(duration_text()),
            of(any::<bool>()),
        ),
    )
        .prop_map(
            |(
                (window, min_retries_per_sec, retry_ratio, max_retries_per_window),
                (cost_transient, cost_throttled, shares),
                (lease_ttl, max_hint, clock_skew_tolerance),
                (backoff_base, backoff_max, wake_rate),
                (corroborate_workers, corroborate_fraction, uncorroborated_cap, mode),
                (
                    upstream_limit,
                    upstream_share,
                    wake_floor,
                    wake_ceiling,
                    reconsider_horizon,
                    hold_first_attempts,
                ),
            )| v1::PolicyFields {
                window,
                min_retries_per_sec,
                retry_ratio,
                max_retries_per_window,
                cost_transient,
                cost_throttled,
                shares: shares.map(|(critical, normal, bulk)| v1::Shares {
                    critical,
                    normal,
                    bulk,
                }),
                lease_ttl,
                max_hint,
                clock_skew_tolerance,
                backoff_base,
                backoff_max,
                wake_rate,
                corroborate_workers,
                corroborate_fraction,
                uncorroborated_cap,
                mode,
                upstream_limit,
                upstream_share,
                wake_floor,
                wake_ceiling,
                reconsider_horizon,
                hold_first_attempts,
                stated_margin: None,
            },
        )
}

/// A policy document: plausible TOML with arbitrary values, or any text.
fn policy_toml() -> impl Strategy<Value = String> {
    prop_oneof![
        (any_text(), duration_text(), any_f64(), any::<i64>()).prop_map(
            |(route, window, ratio, cap)| format!(
                "[defaults]\nwindow = {window:?}\n[[rule]]\nroute = {route:?}\n\
                 retry_ratio = {ratio:?}\nmax_retries_per_window = {cap}\n"
            )
        ),
        any_text(),
    ]
}

#[derive(Debug, Clone)]
enum AdminCall {
    ListPolicies,
    GetPolicy(v1::GetPolicyRequest),
    // Boxed: the largest request by far.
    SetPolicy(Box<v1::SetPolicyRequest>),
    DeletePolicy(v1::DeletePolicyRequest),
    ApplyPolicies(v1::ApplyPoliciesRequest),
    DiffPolicies,
    ListScopes(v1::ListScopesRequest),
    GetScope(v1::GetScopeRequest),
    Freeze(v1::FreezeScopeRequest),
    Unfreeze(v1::UnfreezeScopeRequest),
    Reset(v1::ResetScopeRequest),
    ListAudit(v1::ListAuditRequest),
}

/// A freeze, unfreeze or reset names one scope; an admin may legitimately
/// do that to the canary, so the fuzzer's target is moved off it.
fn off_canary(caller: String) -> String {
    if caller == CANARY_CALLER || caller.contains('*') {
        "fuzz".into()
    } else {
        caller
    }
}

/// The scope an Admin call names.
fn target() -> impl Strategy<Value = (String, String)> {
    (caller(), route())
}

fn admin_call() -> impl Strategy<Value = AdminCall> {
    prop_oneof![
        Just(AdminCall::ListPolicies),
        Just(AdminCall::DiffPolicies),
        target().prop_map(
            |(caller_scope, route)| AdminCall::GetPolicy(v1::GetPolicyRequest {
                caller_scope,
                route
            })
        ),
        (
            target(),
            any::<u64>(),
            policy_fields(),
            any::<bool>(),
            any_text()
        )
            .prop_map(
                |((caller_scope, route), expected_version, fields, patch, reason)| {
                    AdminCall::SetPolicy(Box::new(v1::SetPolicyRequest {
                        caller_scope,
                        route,
                        expected_version,
                        fields: Some(fields),
                        patch,
                        reason,
                    }))
                }
            ),
        (target(), any::<u64>(), any_text(), any::<bool>()).prop_map(
            |((caller_scope, route), expected_version, reason, clear)| {
                AdminCall::DeletePolicy(v1::DeletePolicyRequest {
                    caller_scope,
                    route,
                    expected_version,
                    reason,
                    clear,
                })
            }
        ),
        (policy_toml(), any::<bool>(), any_text()).prop_map(|(toml, dry_run, reason)| {
            AdminCall::ApplyPolicies(v1::ApplyPoliciesRequest {
                toml,
                dry_run,
                reason,
            })
        }),
        (target(), any::<bool>(), any_u32(), any_text(), any_text()).prop_map(
            |((caller_scope, route), frozen_only, page_size, page_token, tenant)| {
                AdminCall::ListScopes(v1::ListScopesRequest {
                    caller_scope,
                    route,
                    frozen_only,
                    page_size,
                    page_token,
                    tenant,
                })
            }
        ),
        target().prop_map(
            |(caller_scope, route)| AdminCall::GetScope(v1::GetScopeRequest {
                caller_scope,
                route
            })
        ),
        (target(), any_text(), any::<u64>()).prop_map(
            |((caller_scope, route), reason, duration_ms)| AdminCall::Freeze(
                v1::FreezeScopeRequest {
                    caller_scope: off_canary(caller_scope),
                    route,
                    reason,
                    duration_ms,
                }
            )
        ),
        (target(), any_text()).prop_map(|((caller_scope, route), reason)| {
            AdminCall::Unfreeze(v1::UnfreezeScopeRequest {
                caller_scope: off_canary(caller_scope),
                route,
                reason,
            })
        }),
        (target(), any_text()).prop_map(|((caller_scope, route), reason)| {
            AdminCall::Reset(v1::ResetScopeRequest {
                caller_scope: off_canary(caller_scope),
                route,
                reason,
            })
        }),
        (any_u32(), any::<u64>()).prop_map(|(limit, before_seq)| AdminCall::ListAudit(
            v1::ListAuditRequest { limit, before_seq }
        )),
    ]
}

/// Which credential a call carries: the admin's, a caller token (never
/// enough for Admin), a made-up one, or none.
fn credential() -> impl Strategy<Value = Option<String>> {
    prop_oneof![
        4 => Just(Some(ADMIN_TOKEN.to_owned())),
        1 => Just(Some(FUZZ_TOKEN.to_owned())),
        1 => "[ -~]{0,40}".prop_map(Some),
        1 => Just(None),
    ]
}

fn authorized<T>(message: T, token: &Option<String>) -> tonic::Request<T> {
    let mut request = tonic::Request::new(message);
    if let Some(value) = token
        .as_ref()
        .and_then(|t| format!("Bearer {t}").parse().ok())
    {
        request.metadata_mut().insert("authorization", value);
    }
    request
}

async fn call_admin(
    admin: &mut v1::admin_client::AdminClient<tonic::transport::Channel>,
    call: AdminCall,
    token: &Option<String>,
) -> Result<(), TestCaseError> {
    let t = token;
    match call {
        AdminCall::ListPolicies => check(
            "ListPolicies",
            admin
                .list_policies(authorized(v1::ListPoliciesRequest {}, t))
                .await,
        ),
        AdminCall::DiffPolicies => check(
            "DiffPolicies",
            admin
                .diff_policies(authorized(v1::DiffPoliciesRequest {}, t))
                .await,
        ),
        AdminCall::GetPolicy(r) => check("GetPolicy", admin.get_policy(authorized(r, t)).await),
        AdminCall::SetPolicy(r) => check("SetPolicy", admin.set_policy(authorized(*r, t)).await),
        AdminCall::DeletePolicy(r) => {
            check("DeletePolicy", admin.delete_policy(authorized(r, t)).await)
        }
        AdminCall::ApplyPolicies(r) => check(
            "ApplyPolicies",
            admin.apply_policies(authorized(r, t)).await,
        ),
        AdminCall::ListScopes(r) => check("ListScopes", admin.list_scopes(authorized(r, t)).await),
        AdminCall::GetScope(r) => check("GetScope", admin.get_scope(authorized(r, t)).await),
        AdminCall::Freeze(r) => check("FreezeScope", admin.freeze_scope(authorized(r, t)).await),
        AdminCall::Unfreeze(r) => check(
            "UnfreezeScope",
            admin.unfreeze_scope(authorized(r, t)).await,
        ),
        AdminCall::Reset(r) => check("ResetScope", admin.reset_scope(authorized(r, t)).await),
        AdminCall::ListAudit(r) => check("ListAudit", admin.list_audit(authorized(r, t)).await),
    }
}

/// Every Admin RPC with arbitrary fields and credentials: each call is
/// answered, and the canary's scope state (not its policy, which an admin
/// may change for everyone) is exactly as it was.
#[test]
fn admin_rpcs_answer_every_input_and_keep_the_canary() {
    // The Admin calls' futures are large in a debug build and are polled on
    // this thread by `block_on`: the default test-thread stack overflows.
    let property = std::thread::Builder::new()
        .stack_size(64 << 20)
        .spawn(admin_property)
        .expect("spawn the property's thread");
    if let Err(panic) = property.join() {
        std::panic::resume_unwind(panic);
    }
}

fn admin_property() {
    let rt = runtime();
    let (coordinator, canary) = rt.block_on(async {
        let coordinator = Coordinator::start(support::config(POLICY)).await;
        let canary = plant_canary(&coordinator).await;
        (coordinator, scope_state_only(canary))
    });
    // Each case calls from a loopback address of its own: bad credentials
    // are part of the input, and the coordinator holds a peer's repeated
    // refusals up to 2 s each (`auth::throttle`), which would make the
    // property measure that hold instead of the answers.
    let case = std::sync::atomic::AtomicU32::new(0);
    let calls = prop::collection::vec((admin_call(), credential()), 1..6);
    runner()
        .run(&calls, |calls| {
            let case = case.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            let source =
                std::net::Ipv4Addr::new(127, 1, (case / 254) as u8, (case % 254 + 1) as u8);
            rt.block_on(async {
                let mut admin = v1::admin_client::AdminClient::new(
                    coordinator.channel_from(source.into()).await,
                );
                for (call, token) in calls {
                    call_admin(&mut admin, call, &token).await?;
                }
                let now = scope_state_only(canary_state(&coordinator).await);
                prop_assert_eq!(&now, &canary);
                Ok(())
            })
        })
        .expect("the property holds");
    rt.block_on(coordinator.stop());
}

/// Found by the admin property: a TOML error quotes the offending line and
/// puts a caret under it, so a long line made a status message past the
/// client's header limit — an HTTP/2 protocol error, not INVALID_ARGUMENT.
#[test]
fn a_long_invalid_policy_document_is_invalid_argument_naming_toml() {
    let rt = runtime();
    rt.block_on(async {
        let coordinator = Coordinator::start(support::config(POLICY)).await;
        let status = coordinator
            .admin()
            .await
            .apply_policies(with_token(
                v1::ApplyPoliciesRequest {
                    toml: "x".repeat(4100),
                    dry_run: false,
                    reason: String::new(),
                },
                ADMIN_TOKEN,
            ))
            .await
            .expect_err("not a policy document");
        assert_eq!(status.code(), Code::InvalidArgument, "{status:?}");
        assert!(
            status.message().starts_with("toml: "),
            "{}",
            status.message()
        );
        coordinator.stop().await;
    });
}
