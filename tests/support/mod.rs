//! The one test harness of the workspace: the real coordinator on either
//! transport, and the request builders every end-to-end test shares.
//!
//! - [`tcp`] (re-exported here): a coordinator on `127.0.0.1:0` with a
//!   [`ManualClock`](tollgate_client::clock::ManualClock); real sockets, real
//!   time for IO, virtual time for the coordinator's decisions.
//! - [`pipes`]: a coordinator over in-memory pipes on paused tokio time,
//!   behind a [`pipes::Switchboard`] that can kill its host mid-conversation.
//!
//! Every coordinator the suite starts goes through [`tcp::spawn_server`] or
//! [`pipes::spawn_server`], so a change to the server's entry point is a
//! change to those two functions. Used by `tests/*.rs` as `mod support;` and
//! by `client/tests/*.rs` through `#[path]`, never copied.

// Each test binary uses a different subset, re-exports included.
#![allow(dead_code, unused_imports)]

pub(crate) mod fuzz;
pub(crate) mod metrics;
pub(crate) mod pipes;
pub(crate) mod tcp;

use std::sync::Arc;
use std::time::Duration;

use tollgate::config::Config;
use tollgate_client::backoff::{Backoff, Jitter};
use tollgate_client::clock::Clock;
use tollgate_client::engine::IntentPolicy;
use tollgate_client::gate::{Gate, GateConfig};
use tollgate_client::lease::{LeaseCache, LeaseCacheConfig};
use tollgate_client::link::CoordinatorLink;
use tollgate_proto::v1::{self, budget_client::BudgetClient};
use tonic::transport::Channel;

pub(crate) use tcp::Coordinator;

/// Replaces `path` the way a config push or a Secret mount does (a whole
/// new file renamed into place): a server that polls the file may read it
/// at any moment, and a write in place can be read half done.
pub(crate) fn replace_file(path: &std::path::Path, contents: &str) {
    let mut next = path.as_os_str().to_owned();
    next.push(".next");
    std::fs::write(&next, contents).expect("write");
    std::fs::rename(&next, path).expect("rename into place");
}

/// Mon, 01 Jan 2024 12:00:00 GMT: HTTP-dates in tests are easy to write.
pub(crate) const T0: i64 = 1_704_110_400_000;

/// A route for tests that need one and do not care which.
pub(crate) const ROUTE: &str = "GET /users/{id}";

/// The caller token of `tenant-a`, and the policy-file entry that makes the
/// coordinator require it (add it to a file to turn authentication on).
pub(crate) const TENANT_A_TOKEN: &str = "token-of-tenant-a";
pub(crate) const TENANT_A_TOKEN_TOML: &str =
    "[[token]]\ntoken = \"token-of-tenant-a\"\ncaller_scopes = [\"tenant-a\"]\n";

/// The on-call SRE's admin token in [`POLICY_WITH_TOKENS`].
pub(crate) const ADMIN_TOKEN: &str = "admin-token-123";
/// A policy file with authentication on: one rule (`GET /users/*` may
/// retry half its first attempts), `tenant-a`'s caller token
/// ([`TENANT_A_TOKEN`]) and the on-call admin token ([`ADMIN_TOKEN`]).
pub(crate) const POLICY_WITH_TOKENS: &str = r#"
[[rule]]
route = "GET /users/*"
retry_ratio = 0.5

[[token]]
token = "token-of-tenant-a"
caller_scopes = ["tenant-a"]

[[admin_token]]
name = "oncall"
token = "admin-token-123"
"#;

/// How long a test waits for something pushed (a Watch event, a stream's
/// end) before it fails: far beyond any latency, so only a missing event
/// fails it, never a loaded machine.
pub(crate) const PUSH_BOUND: Duration = Duration::from_secs(5);

/// A policy file, validated by the real parser.
pub(crate) fn config(text: &str) -> Config {
    Config::from_toml(text, |_| None).expect("valid test config")
}

pub(crate) fn secs(s: u64) -> Duration {
    Duration::from_secs(s)
}

pub(crate) fn ms(m: u64) -> Duration {
    Duration::from_millis(m)
}

/// An intent's policy for a worker on a loopback coordinator: `total` end
/// to end, `attempts` in all, 500 ms per attempt, a 10 ms floor, backoff
/// from 20 ms up to `backoff_cap` without jitter, no hint cap.
pub(crate) fn loopback_policy(
    total: Duration,
    attempts: u32,
    backoff_cap: Duration,
) -> IntentPolicy {
    let backoff = Backoff {
        base: ms(20),
        cap: backoff_cap,
        jitter: Jitter::None,
    };
    IntentPolicy::try_new(total, attempts, ms(500), ms(10), backoff, None).expect("policy")
}

/// A worker's gate on `link`: its lease cache seeded with `cache_seed` (so
/// runs repeat), both reading `clock`, tuned by `config`.
pub(crate) fn gate(
    link: CoordinatorLink,
    clock: Arc<dyn Clock>,
    cache_seed: u64,
    config: GateConfig,
) -> Gate {
    let cache = LeaseCache::start(
        link,
        LeaseCacheConfig {
            seed: Some(cache_seed),
            ..LeaseCacheConfig::default()
        },
        clock.clone(),
    );
    Gate::new(cache, clock, config)
}

/// `message` with `authorization: Bearer <token>`.
pub(crate) fn with_token<T>(message: T, token: &str) -> tonic::Request<T> {
    let mut request = tonic::Request::new(message);
    request.metadata_mut().insert(
        "authorization",
        format!("Bearer {token}").parse().expect("ascii token"),
    );
    request
}

pub(crate) fn scope(caller: &str, route: &str, priority: v1::Priority) -> Option<v1::Scope> {
    Some(v1::Scope {
        caller_scope: caller.into(),
        route: route.into(),
        priority: priority.into(),
    })
}

pub(crate) fn lease(scope: Option<v1::Scope>, worker: &str, want: u32) -> v1::LeaseRequest {
    v1::LeaseRequest {
        scope,
        worker_id: worker.into(),
        want,
        retry_class: v1::RetryClass::Transient.into(),
    }
}

/// One 429 with `Retry-After: retry_after`, received at [`T0`].
pub(crate) fn rate_limited(
    scope: Option<v1::Scope>,
    worker: &str,
    retry_after: &str,
    certainty: v1::ScopeCertainty,
) -> v1::ReportRequest {
    rate_limited_at(scope, worker, retry_after, certainty, T0)
}

/// [`rate_limited`], received at `receipt_unix_ms` (for a clock not at
/// [`T0`]).
pub(crate) fn rate_limited_at(
    scope: Option<v1::Scope>,
    worker: &str,
    retry_after: &str,
    certainty: v1::ScopeCertainty,
    receipt_unix_ms: i64,
) -> v1::ReportRequest {
    v1::ReportRequest {
        scope,
        worker_id: worker.into(),
        first_attempts: 1,
        successes: 0,
        rejections: 1,
        counts_age_ms: 0,
        evidence: vec![v1::Evidence {
            http_status: 429,
            has_retry_after: true,
            retry_after: retry_after.into(),
            receipt_unix_ms,
            sent_unix_ms: receipt_unix_ms - 50,
            certainty: certainty.into(),
            ..v1::Evidence::default()
        }],
        stated_limit: None,
    }
}

pub(crate) fn reconsider(scope: Option<v1::Scope>, intent: &str) -> v1::ReconsiderRequest {
    v1::ReconsiderRequest {
        scope,
        worker_id: "worker-b".into(),
        intent_id: intent.into(),
        not_before_unix_ms: 0,
        deadline_unix_ms: T0 + 3_600_000,
        attempt_reserve_ms: 2_000,
        first_attempt: false,
        arriving: false,
    }
}

/// Opens a Watch on `scope` and returns the stream with its first event,
/// which must be the scope's snapshot.
pub(crate) async fn watch(
    client: &mut BudgetClient<Channel>,
    scope: &Option<v1::Scope>,
    worker: &str,
) -> (tonic::Streaming<v1::ScopeEvent>, v1::ScopeEvent) {
    let mut stream = client
        .watch(v1::WatchRequest {
            scopes: vec![scope.clone().expect("scope")],
            worker_id: worker.into(),
        })
        .await
        .expect("watch")
        .into_inner();
    let snapshot = stream.message().await.expect("stream").expect("snapshot");
    assert_eq!(snapshot.kind(), v1::ScopeEventKind::Snapshot);
    (stream, snapshot)
}

/// The next event on a Watch stream other than PACING_CHANGED (a refusal
/// that ends a calm route sends one before its cooldown's), waiting at
/// most [`PUSH_BOUND`]; `what` names the event in the failure.
pub(crate) async fn next_event(
    stream: &mut tonic::Streaming<v1::ScopeEvent>,
    what: &str,
) -> v1::ScopeEvent {
    loop {
        let event = tokio::time::timeout(PUSH_BOUND, stream.message())
            .await
            .unwrap_or_else(|_| panic!("{what}: no event within {PUSH_BOUND:?}"))
            .expect("the stream is healthy")
            .expect("the stream is open");
        if event.kind() != v1::ScopeEventKind::PacingChanged {
            return event;
        }
    }
}

/// Waits at most [`PUSH_BOUND`] for a Watch stream to end, as the drain
/// ends it: UNAVAILABLE, or a clean end.
pub(crate) async fn watch_ends(stream: &mut tonic::Streaming<v1::ScopeEvent>) {
    let end = tokio::time::timeout(PUSH_BOUND, stream.message())
        .await
        .expect("the Watch stream ends");
    assert!(
        matches!(end, Err(ref s) if s.code() == tonic::Code::Unavailable)
            || matches!(end, Ok(None)),
        "{end:?}"
    );
}

/// Polls `check` every 20 ms until it holds; panics after `bound`. For
/// waiting on something with no event to await (a health status, a
/// subscription): the bound is generous and never asserted as a latency.
pub(crate) async fn poll<F, Fut>(what: &str, bound: Duration, mut check: F)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    let give_up = tokio::time::Instant::now() + bound;
    while !check().await {
        assert!(
            tokio::time::Instant::now() < give_up,
            "{what}: not within {bound:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}
