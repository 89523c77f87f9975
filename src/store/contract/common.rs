//! What the contract cases share: the instant every case starts at, the
//! request builders, and reports that deposit first attempts or merge one
//! hint.

use crate::budget::{GrantAsk, LeaseEnd};
use crate::hints::{Assessment, EvidenceInput, Merge, assess};
use crate::pacing::Asker;
use crate::pacing::cursor::SlotAsk;
use crate::policy::Policy;
use crate::scope::{EvidenceLevel, Priority, RetryClass, ScopeKey};
use crate::store::{LevelHint, ReportBatch, Store, StoreError, Tenant};

pub(super) const T0: i64 = 1_700_000_000_000;

pub(super) fn scope(caller: &str, route: &str) -> ScopeKey {
    ScopeKey::new(caller, route, Priority::Critical)
}

pub(super) fn ask(worker: &str, want: u32, now_ms: i64) -> GrantAsk<'_> {
    GrantAsk {
        worker_id: worker,
        priority: Priority::Critical,
        retry_class: RetryClass::Transient,
        want,
        now_ms,
        tenant: Tenant::NONE,
    }
}

/// Ends lease `id` of `worker` with `spent` tokens spent, none of
/// whose retries succeeded.
pub(super) fn end<'a>(worker: &'a str, id: &'a str, spent: u32, now_ms: i64) -> LeaseEnd<'a> {
    LeaseEnd {
        worker_id: worker,
        lease_id: id,
        spent,
        retry_successes: 0,
        now_ms,
    }
}

/// A report of counts only, at `now_ms`.
pub(super) async fn deposit(
    s: &dyn Store,
    key: &ScopeKey,
    worker: &str,
    first_attempts: u32,
    successes: u32,
    p: &Policy,
    now_ms: i64,
) -> Result<(), StoreError> {
    let batch = ReportBatch {
        first_attempts,
        successes,
        ..ReportBatch::empty(worker, now_ms)
    };
    s.report(key, batch, p).await.map(drop)
}

/// Reports one assessed hint at `level` (by worker `w` on a route
/// of that level, at `T0`) and returns its merge.
pub(super) async fn merge(
    s: &dyn Store,
    level: &EvidenceLevel,
    a: &Assessment,
    p: &Policy,
) -> Merge {
    let key = match level {
        EvidenceLevel::Route(route) => ScopeKey {
            route: route.clone(),
            priority: Priority::Critical,
        },
        EvidenceLevel::Caller(caller) => scope(caller, "r"),
    };
    let hints = [LevelHint {
        caller_wide: matches!(level, EvidenceLevel::Caller(_)),
        assessment: a.clone(),
    }];
    let batch = ReportBatch {
        worker_id: "w",
        first_attempts: 0,
        successes: 0,
        rejections: 0,
        counts_age_ms: 0,
        hints: &hints,
        now_ms: T0,
        tenant: Tenant::NONE,
        stated: None,
    };
    let reported = s.report(&key, batch, p).await.expect("report");
    reported.merges[0]
}

/// Merges a 429 with `Retry-After: hint`, received at `T0`, at `level`.
pub(super) async fn merge_429(
    s: &dyn Store,
    level: EvidenceLevel,
    hint: &str,
    p: &Policy,
) -> Merge {
    let input = EvidenceInput {
        http_status: 429,
        retry_after: Some(hint),
        receipt_ms: T0,
        ..EvidenceInput::default()
    };
    merge(s, &level, &assess(&input, p, T0), p).await
}

pub(super) fn slot_ask(intent: &str, now_ms: i64) -> SlotAsk<'_> {
    SlotAsk {
        intent_id: intent,
        floor_ms: 0,
        deadline_ms: i64::MAX,
        reserve_ms: 0,
        now_ms,
        jitter_ppm: 0,
        asker: Asker::Retry,
        tenant: Tenant::NONE,
        may_call_back: false,
    }
}
