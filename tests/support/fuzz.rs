//! The fuzzing harness `tests/fuzz_rpc.rs` and `tests/fuzz_raw.rs` share:
//! a policy with a canary caller, the fuzzer's caller and an admin token;
//! the case count (`TOLLGATE_FUZZ_CASES`); strategies for arbitrary field
//! values; the canary's planting and reading; and the check that a call was
//! answered with a status that names its field.

use proptest::prelude::*;
use proptest::test_runner::{Config as RunnerConfig, TestCaseError, TestRunner};
use tollgate_proto::v1;
use tonic::Code;

use super::{Coordinator, with_token};

/// The canary's owner; the fuzzer never holds this token.
pub(crate) const CANARY_TOKEN: &str = "token-of-the-canary";
pub(crate) const CANARY_CALLER: &str = "tenant-canary";
pub(crate) const CANARY_ROUTE: &str = "GET /canary";
/// The fuzzer's caller token: it may use caller scope `fuzz` only.
pub(crate) const FUZZ_TOKEN: &str = "token-of-the-fuzzer";
pub(crate) const ADMIN_TOKEN: &str = "admin-token-of-the-fuzzer";

pub(crate) const POLICY: &str = r#"
[[token]]
token = "token-of-the-canary"
caller_scopes = ["tenant-canary"]

[[token]]
token = "token-of-the-fuzzer"
caller_scopes = ["fuzz"]

[[admin_token]]
name = "fuzzer"
token = "admin-token-of-the-fuzzer"
"#;

/// Cases per property: 64 by default (a few seconds), `TOLLGATE_FUZZ_CASES`
/// for a long run.
pub(crate) fn cases() -> u32 {
    std::env::var("TOLLGATE_FUZZ_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(64)
}

pub(crate) fn runner() -> TestRunner {
    TestRunner::new(RunnerConfig {
        cases: cases(),
        // Each case is several RPCs; shrinking stays useful but bounded.
        max_shrink_iters: 256,
        failure_persistence: None,
        ..RunnerConfig::default()
    })
}

pub(crate) fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("tokio runtime")
}

// ---- strategies --------------------------------------------------------

/// Any string: empty, short printable, any Unicode (NUL and controls
/// included), or far longer than every bound.
pub(crate) fn any_text() -> impl Strategy<Value = String> {
    prop_oneof![
        Just(String::new()),
        "[ -~]{1,40}",
        prop::collection::vec(any::<char>(), 0..64).prop_map(String::from_iter),
        (1usize..5000).prop_map(|n| "x".repeat(n)),
        Just("\0".into()),
        Just("*".into()),
    ]
}

/// A caller scope: the fuzzer's own, the canary's (which its token may not
/// use), or anything.
pub(crate) fn caller() -> impl Strategy<Value = String> {
    prop_oneof![
        Just("fuzz".to_owned()),
        Just(CANARY_CALLER.to_owned()),
        any_text()
    ]
}

pub(crate) fn route() -> impl Strategy<Value = String> {
    prop_oneof![Just(CANARY_ROUTE.to_owned()), "GET /[a-z]{1,8}", any_text()]
}

/// An enum field: a known value or any other number.
pub(crate) fn any_enum() -> impl Strategy<Value = i32> {
    prop_oneof![0..4i32, any::<i32>()]
}

pub(crate) fn any_u32() -> impl Strategy<Value = u32> {
    prop_oneof![0..20u32, Just(u32::MAX), any::<u32>()]
}

pub(crate) fn any_i64() -> impl Strategy<Value = i64> {
    prop_oneof![
        Just(0i64),
        Just(super::T0),
        Just(i64::MIN),
        Just(i64::MAX),
        any::<i64>()
    ]
}

// ---- the canary and the checks -----------------------------------------

/// Gives the canary a state worth keeping: a lease outstanding, first
/// attempts counted, a cooldown from a valid hint.
pub(crate) async fn plant_canary(coordinator: &Coordinator) -> v1::ScopeState {
    let mut client = coordinator.client().await;
    let scope = super::scope(CANARY_CALLER, CANARY_ROUTE, v1::Priority::Normal);
    client
        .lease(with_token(
            super::lease(scope.clone(), "canary-worker", 3),
            CANARY_TOKEN,
        ))
        .await
        .expect("canary lease");
    let mut report = super::rate_limited(scope, "canary-worker", "30", v1::ScopeCertainty::Known);
    report.first_attempts = 10;
    client
        .report(with_token(report, CANARY_TOKEN))
        .await
        .expect("canary report");
    canary_state(coordinator).await
}

pub(crate) async fn canary_state(coordinator: &Coordinator) -> v1::ScopeState {
    coordinator
        .admin()
        .await
        .get_scope(with_token(
            v1::GetScopeRequest {
                caller_scope: CANARY_CALLER.into(),
                route: CANARY_ROUTE.into(),
            },
            ADMIN_TOKEN,
        ))
        .await
        .expect("the canary is readable: the server is alive")
        .into_inner()
}

/// The canary's state that only its own calls may change. Policy fields
/// (allowance, version, rule) are left out where the fuzzer holds an admin
/// token: changing policies for every scope is what an admin may do.
pub(crate) fn scope_state_only(mut state: v1::ScopeState) -> v1::ScopeState {
    state.policy_version = 0;
    state.policy_rule.clear();
    state.allowance = 0.0;
    for class in &mut state.classes {
        class.allowance = 0.0;
        class.available = 0.0;
    }
    state
}

/// The status of a call that was answered: never a transport failure or a
/// panic's INTERNAL/UNKNOWN, and an INVALID_ARGUMENT names its field
/// (`field: reason`, the field a path such as `evidence[3].retry_after`).
pub(crate) fn check_status(what: &str, status: &tonic::Status) -> Result<(), TestCaseError> {
    let allowed = [
        Code::InvalidArgument,
        Code::Unauthenticated,
        Code::PermissionDenied,
        Code::NotFound,
        Code::ResourceExhausted,
        Code::FailedPrecondition,
        Code::OutOfRange,
    ];
    prop_assert!(
        allowed.contains(&status.code()),
        "{what}: unexpected {:?}: {}",
        status.code(),
        status.message()
    );
    if status.code() == Code::InvalidArgument {
        let field = status.message().split(':').next().unwrap_or_default();
        prop_assert!(
            !field.is_empty()
                && field.len() < status.message().len()
                && field
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || "_.[]-* /".contains(c)),
            "{what}: INVALID_ARGUMENT does not name a field: {}",
            status.message()
        );
    }
    Ok(())
}

pub(crate) fn check<T>(
    what: &str,
    result: Result<tonic::Response<T>, tonic::Status>,
) -> Result<(), TestCaseError> {
    match result {
        Ok(_) => Ok(()),
        Err(status) => check_status(what, &status),
    }
}
