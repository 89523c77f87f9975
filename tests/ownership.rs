//! A token owns the worker ids and intent ids it sends. Two tokens that
//! share a caller scope (`shared-*` in the README) reach the same scopes,
//! but the ids one of them names are not the other's: a real server on
//! loopback, real tonic clients, a manual clock.

mod support;

use support::{Coordinator, ROUTE, config, lease, rate_limited, reconsider, scope, with_token};
use tollgate_proto::v1::{self, Priority, ReconsiderDecision, ScopeCertainty};
use tonic::Code;

const ONE: &str = "token-of-team-one";
const TWO: &str = "token-of-team-two";

/// Two tokens sharing the caller scope `shared-x`, and a pinned wake rate
/// so that slots are booked at any distance.
const SHARED: &str = r#"
[defaults]
wake_rate = 50

[[token]]
token = "token-of-team-one"
caller_scopes = ["shared-x"]

[[token]]
token = "token-of-team-two"
caller_scopes = ["shared-x"]
"#;

fn release(s: Option<v1::Scope>, worker: &str, lease_id: &str) -> v1::ReleaseRequest {
    v1::ReleaseRequest {
        scope: s,
        worker_id: worker.into(),
        lease_id: lease_id.into(),
        spent: 0,
        retry_successes: 0,
    }
}

#[tokio::test]
async fn another_tokens_lease_is_not_found_even_with_its_worker_id() {
    let coordinator = Coordinator::start(config(SHARED)).await;
    let mut client = coordinator.client().await;
    let s = scope("shared-x", ROUTE, Priority::Normal);
    let granted = client
        .lease(with_token(lease(s.clone(), "worker-1", 5), ONE))
        .await
        .expect("lease")
        .into_inner();
    assert!(granted.granted > 0 && !granted.lease_id.is_empty());

    // Token two knows the lease id and the worker id: still not its lease.
    let stolen = client
        .release(with_token(
            release(s.clone(), "worker-1", &granted.lease_id),
            TWO,
        ))
        .await
        .expect_err("another token's lease");
    assert_eq!(stolen.code(), Code::NotFound, "{stolen:?}");

    // Its owner still holds it, untouched.
    let returned = client
        .release(with_token(release(s, "worker-1", &granted.lease_id), ONE))
        .await
        .expect("the owner's release")
        .into_inner();
    assert_eq!(returned.returned, granted.granted);
    coordinator.stop().await;
}

#[tokio::test]
async fn another_tokens_intent_id_does_not_take_its_slot() {
    let coordinator = Coordinator::start(config(SHARED)).await;
    let mut client = coordinator.client().await;
    let s = scope("shared-x", ROUTE, Priority::Normal);
    client
        .report(with_token(
            rate_limited(s.clone(), "worker-1", "10", ScopeCertainty::Known),
            ONE,
        ))
        .await
        .expect("report");
    let ask = |token: &'static str| {
        let request = with_token(reconsider(s.clone(), "intent-1"), token);
        let mut client = client.clone();
        async move {
            client
                .reconsider(request)
                .await
                .expect("reconsider")
                .into_inner()
        }
    };
    let owner = ask(ONE).await;
    assert_eq!(owner.decision(), ReconsiderDecision::Slot);
    let other = ask(TWO).await;
    assert_eq!(other.decision(), ReconsiderDecision::Slot);
    // Its own intent: a slot of its own, after the owner's (50/s: 20 ms on).
    assert!(
        other.slot_unix_ms > owner.slot_unix_ms,
        "{} vs {}",
        other.slot_unix_ms,
        owner.slot_unix_ms
    );
    // The owner's intent kept its slot.
    let again = ask(ONE).await;
    assert_eq!(again.slot_unix_ms, owner.slot_unix_ms);
    coordinator.stop().await;
}

/// The coordinator's answer to a 300 s `Retry-After` from each of
/// `workers` workers of `token` on `caller`'s scope: the fleet's cooldown.
async fn cooldown_after_claims(
    coordinator: &Coordinator,
    caller: &str,
    token: &str,
    workers: usize,
) -> i64 {
    let mut client = coordinator.client().await;
    let s = scope(caller, ROUTE, Priority::Normal);
    let mut until = 0;
    for w in 0..workers {
        until = client
            .report(with_token(
                rate_limited(
                    s.clone(),
                    &format!("invented-{w}"),
                    "300",
                    ScopeCertainty::Known,
                ),
                token,
            ))
            .await
            .expect("report")
            .into_inner()
            .cooldown_until_unix_ms;
    }
    until
}

#[tokio::test]
async fn one_tokens_workers_alone_hold_another_token_no_longer_than_an_uncorroborated_claim() {
    // Inside one token, its workers corroborate each other: five agreeing
    // on 300 s hold its scope 300 s.
    let alone = Coordinator::start(config(&format!(
        "{SHARED}\n[[token]]\ntoken = \"token-of-team-three\"\ncaller_scopes = [\"team-three\"]\n"
    )))
    .await;
    let own = cooldown_after_claims(&alone, "team-three", "token-of-team-three", 5).await;
    assert_eq!(own, support::T0 + 300_000);
    alone.stop().await;

    // Where two tokens may use the caller scope, the same five workers of
    // one token hold it only as far as an uncorroborated claim may (the
    // default cap, 5 s) ...
    let shared = Coordinator::start(config(SHARED)).await;
    let one_token = cooldown_after_claims(&shared, "shared-x", ONE, 5).await;
    assert_eq!(one_token, support::T0 + 5_000);
    // ... until a worker of the other token agrees.
    let mut client = shared.client().await;
    let agreed = client
        .report(with_token(
            rate_limited(
                scope("shared-x", ROUTE, Priority::Normal),
                "worker-of-two",
                "300",
                ScopeCertainty::Known,
            ),
            TWO,
        ))
        .await
        .expect("report")
        .into_inner();
    assert_eq!(agreed.cooldown_until_unix_ms, support::T0 + 300_000);
    shared.stop().await;
}

/// A report of `first_attempts` first attempts by `worker` of `token`.
fn counts(s: Option<v1::Scope>, worker: &str, first_attempts: u32) -> v1::ReportRequest {
    v1::ReportRequest {
        scope: s,
        worker_id: worker.into(),
        first_attempts,
        ..v1::ReportRequest::default()
    }
}

#[tokio::test]
async fn a_huge_report_from_one_token_does_not_raise_another_tokens_budget() {
    huge_report(Coordinator::start(config(SHARED)).await).await;
}

/// The same with the Redis store, where each token's counts are kept
/// apart in the route's hash.
#[tokio::test]
async fn a_huge_report_from_one_token_does_not_raise_another_tokens_budget_on_redis() {
    let Some(redis) = tollgate_testkit::RedisServer::start() else {
        return;
    };
    huge_report(Coordinator::start_on_redis(config(SHARED), &redis.url()).await).await;
}

async fn huge_report(coordinator: Coordinator) {
    let mut client = coordinator.client().await;
    let s = scope("shared-x", ROUTE, Priority::Normal);
    // Token one's own traffic: a hundred first attempts. Alone they earn
    // it the default floor (10/s over 10 s) plus 0.2 × 100: 120 tokens.
    client
        .report(with_token(counts(s.clone(), "worker-1", 100), ONE))
        .await
        .expect("report");
    // Token two claims a million, the most one report may carry.
    client
        .report(with_token(counts(s.clone(), "worker-2", 1_000_000), TWO))
        .await
        .expect("report");
    let bound = 10 * 10 + 100 / 5;
    let leased = client
        .lease(with_token(lease(s.clone(), "worker-1", 10_000), ONE))
        .await
        .expect("lease")
        .into_inner();
    // Before, the claim lifted token one's lease to all 10 000 asked for.
    assert!(
        leased.granted > 0 && leased.granted <= bound,
        "granted {} > {bound}",
        leased.granted
    );
    assert_eq!(leased.remaining, 0);
    // Many more such reports change nothing for token one.
    for _ in 0..5 {
        client
            .report(with_token(counts(s.clone(), "worker-2", 1_000_000), TWO))
            .await
            .expect("report");
    }
    let again = client
        .lease(with_token(lease(s.clone(), "worker-1", 10_000), ONE))
        .await
        .expect("lease")
        .into_inner();
    assert_eq!(again.granted, 0, "token one's own budget is spent");
    // The claiming token's own retries are what its claim earns it.
    let theirs = client
        .lease(with_token(lease(s, "worker-2", 10_000), TWO))
        .await
        .expect("lease")
        .into_inner();
    assert_eq!(theirs.granted, 10_000);
    coordinator.stop().await;
}

/// A report by `worker` whose upstream stated 100 requests a second with
/// `remaining` left, received at the coordinator's now.
fn stated(s: Option<v1::Scope>, worker: &str, remaining: u32) -> v1::ReportRequest {
    let field = |name: &str, value: String| v1::StatedField {
        name: name.into(),
        value,
        truncated: false,
    };
    v1::ReportRequest {
        scope: s,
        worker_id: worker.into(),
        successes: 1,
        stated_limit: Some(v1::StatedLimit {
            fields: vec![
                field("ratelimit-policy", "\"default\";q=100;w=1".into()),
                field("ratelimit", format!("\"default\";r={remaining};t=1")),
            ],
            receipt_unix_ms: support::T0,
            http_status: 200,
        }),
        ..v1::ReportRequest::default()
    }
}

/// How the route's stated limits weigh now, read by the on-call admin.
async fn stated_state(coordinator: &Coordinator, caller: &str) -> v1::StatedLimitState {
    let scope = coordinator
        .admin()
        .await
        .get_scope(with_token(
            v1::GetScopeRequest {
                caller_scope: caller.into(),
                route: ROUTE.into(),
            },
            "admin-of-the-test",
        ))
        .await
        .expect("get scope")
        .into_inner();
    scope.pacing.and_then(|p| p.stated).expect("stated state")
}

#[tokio::test]
async fn one_tokens_workers_alone_cannot_set_another_tokens_stated_pace() {
    let admin = "\n[[admin_token]]\nname = \"oncall\"\ntoken = \"admin-of-the-test\"\n";
    let coordinator = Coordinator::start(config(&format!("{SHARED}{admin}"))).await;
    let mut client = coordinator.client().await;
    let s = scope("shared-x", ROUTE, Priority::Normal);
    // Five workers of token one say one request is left this second.
    for w in 0..5 {
        client
            .report(with_token(
                stated(s.clone(), &format!("invented-{w}"), 1),
                ONE,
            ))
            .await
            .expect("report");
    }
    let lie = stated_state(&coordinator, "shared-x").await;
    assert_eq!(lie.state, "uncorroborated", "{lie:?}");
    // A worker of token two states what it sees: both tokens' workers now
    // agree on its pace, the lowest both allow.
    client
        .report(with_token(stated(s, "worker-of-two", 60), TWO))
        .await
        .expect("report");
    let agreed = stated_state(&coordinator, "shared-x").await;
    assert_eq!(agreed.state, "corroborated", "{agreed:?}");
    assert_eq!(agreed.remaining, 60, "{agreed:?}");
    coordinator.stop().await;
}
