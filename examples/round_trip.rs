//! A worker's round trip against a running coordinator: lease retry tokens,
//! report a 429 with `Retry-After: 30`, ask when to reconsider.
//!
//! ```text
//! tollgate serve &                       # listens on 127.0.0.1:50051
//! cargo run --example round_trip -- 127.0.0.1:50051
//! ```

use std::time::SystemTime;

use tollgate_client::clock::to_unix_ms;
use tollgate_proto::v1::{
    Evidence, LeaseRequest, Priority, ReconsiderRequest, ReportRequest, RetryClass, Scope,
    ScopeCertainty, budget_client::BudgetClient,
};

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let address = std::env::args()
        .nth(1)
        .unwrap_or_else(|| "127.0.0.1:50051".to_owned());
    let mut budget = BudgetClient::connect(format!("http://{address}")).await?;
    let scope = Some(Scope {
        caller_scope: "example-tenant".into(),
        route: "GET /users/{id}".into(),
        priority: Priority::Normal.into(),
    });
    let now = to_unix_ms(SystemTime::now());

    let lease = budget
        .lease(LeaseRequest {
            scope: scope.clone(),
            worker_id: "example-worker".into(),
            want: 5,
            retry_class: RetryClass::Throttled.into(),
        })
        .await?
        .into_inner();
    println!(
        "lease: granted {} of 5 (limit {:?}), expires at {}, policy v{}, {} left",
        lease.granted,
        lease.limit(),
        lease.expires_at_unix_ms,
        lease.policy_version,
        lease.remaining
    );

    let report = budget
        .report(ReportRequest {
            scope: scope.clone(),
            worker_id: "example-worker".into(),
            first_attempts: 1,
            successes: 0,
            evidence: vec![Evidence {
                http_status: 429,
                has_retry_after: true,
                retry_after: "30".into(),
                receipt_unix_ms: now,
                sent_unix_ms: now - 40,
                certainty: ScopeCertainty::Known.into(),
                intent_id: "order-42".into(),
                ..Evidence::default()
            }],
        })
        .await?
        .into_inner();
    for verdict in &report.verdicts {
        println!(
            "report: hint form {} valid {} delay {} ms capped {} clock_skew {} {}",
            verdict.form,
            verdict.valid,
            verdict.delay_ms,
            verdict.capped,
            verdict.clock_skew,
            verdict.reason
        );
    }
    println!(
        "report: scope cooldown until {} ({} ms from now)",
        report.cooldown_until_unix_ms,
        report.cooldown_until_unix_ms - now
    );

    let slot = budget
        .reconsider(ReconsiderRequest {
            scope,
            worker_id: "example-worker".into(),
            intent_id: "order-42".into(),
            not_before_unix_ms: 0,
            deadline_unix_ms: now + 120_000,
            attempt_reserve_ms: 5_000,
        })
        .await?
        .into_inner();
    println!(
        "reconsider: {:?} at {} ({} ms from now); reserves a token: {}",
        slot.decision(),
        slot.slot_unix_ms,
        slot.slot_unix_ms - now,
        slot.reserves_token
    );
    Ok(())
}
