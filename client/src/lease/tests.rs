//! The bookkeeping of refunds and rejections, without a coordinator.

use std::time::{Duration, SystemTime};

use super::*;

fn lease(id: &str, granted: u32) -> HeldLease {
    HeldLease::new(
        id.into(),
        granted,
        SystemTime::UNIX_EPOCH + Duration::from_secs(60),
    )
}

#[test]
fn a_retired_lease_still_counts_retry_successes_up_to_what_it_spent() {
    let mut tokens = ScopeTokens::default();
    let mut spent = lease("spent", 2);
    spent.remaining = 0;
    tokens.retired.push(spent);
    let mut held = lease("held", 3);
    held.remaining = 2;
    tokens.leases.push_back(held);

    assert!(tokens.retry_succeeded("spent"));
    assert!(tokens.retry_succeeded("spent"));
    assert!(tokens.retry_succeeded("spent"), "counted, but capped");
    assert!(tokens.retry_succeeded("held"));
    assert!(!tokens.retry_succeeded("released-already"));

    let retired = &tokens.retired[0];
    assert_eq!((retired.spent(), retired.refunds()), (2, 2));
    assert!(
        retired.worth_releasing(),
        "spent, but with a refund to claim"
    );
    let held = &tokens.leases[0];
    assert_eq!((held.spent(), held.refunds()), (1, 1));

    let mut nothing_back = lease("nothing", 1);
    nothing_back.remaining = 0;
    assert!(
        !nothing_back.worth_releasing(),
        "spent without a success: left to expire, as the coordinator counts it spent"
    );
}

#[test]
fn rejections_merge_and_keep_a_report_non_empty() {
    let mut report = PendingReport {
        rejections: 70,
        ..PendingReport::default()
    };
    assert!(!report.is_empty(), "a count alone is worth sending");
    report.merge(PendingReport {
        rejections: 30,
        first_attempts: 1,
        ..PendingReport::default()
    });
    assert_eq!(report.rejections, 100);
    assert_eq!(
        crate::wire::report_request(&Scope::new("tenant-a", "GET /x"), &report).rejections,
        100
    );
}

#[test]
fn a_retired_lease_is_released_once_its_refund_settles() {
    let mut partly = lease("partly", 3);
    partly.remaining = 0;
    assert!(!partly.refund_settled(), "nothing to give back yet");
    partly.retry_successes = 1;
    assert!(
        !partly.refund_settled(),
        "a success just came: more may follow"
    );
    assert!(partly.refund_settled(), "none since the last pass: settled");
    let mut full = lease("full", 2);
    full.remaining = 0;
    full.retry_successes = 2;
    assert!(
        full.refund_settled(),
        "every spent token refunded: nothing more can come"
    );
}

#[test]
fn a_report_keeps_the_latest_stated_limit_only() {
    let stated = |receipt_unix_ms| tollgate_proto::v1::StatedLimit {
        receipt_unix_ms,
        ..tollgate_proto::v1::StatedLimit::default()
    };
    let mut report = PendingReport::default();
    report.keep_latest_stated(Some(stated(2_000)));
    report.keep_latest_stated(Some(stated(1_000)));
    assert_eq!(
        report.stated.as_ref().map(|s| s.receipt_unix_ms),
        Some(2_000)
    );
    assert!(!report.is_empty(), "a statement alone is worth a report");
    // A report merged back after a failed send keeps the newer statement.
    report.merge(PendingReport {
        stated: Some(stated(3_000)),
        ..PendingReport::default()
    });
    assert_eq!(
        report.stated.as_ref().map(|s| s.receipt_unix_ms),
        Some(3_000)
    );
}
