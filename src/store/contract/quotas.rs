//! Each caller token's quota of scopes, on a store made with two tokens
//! ("a" and "b") of [`QUOTA`] scopes each in a table far larger: a token
//! at its quota makes room among its own scopes only, cooled-down ones
//! included, is refused when every one is busy, and never takes or holds
//! out another token's; what each holds is counted and listed. And where
//! both share a caller scope, one token's reported counts do not raise the
//! other's budget (`crate::budget`, "Counts of several tokens").

use crate::budget::GrantAsk;
use crate::hints::{EvidenceInput, assess};
use crate::pacing::cursor::SlotAsk;
use crate::policy::Policy;
use crate::scope::ScopeKey;
use crate::store::{LeaseOutcome, LevelHint, ReportBatch, ScopeFilter, Store, StoreError, Tenant};
use crate::tenancy::Owner;

use super::common::{T0, ask, scope};

/// Each token's quota in the stores these cases run on.
pub(crate) const QUOTA: usize = 3;

/// The limits these cases' stores are made with.
pub(crate) fn limits() -> crate::tenancy::TenantLimits {
    crate::tenancy::TenantLimits {
        names: vec!["a".into(), "b".into()],
        scopes: vec![QUOTA, QUOTA],
        requests: vec![64, 64],
    }
}

fn tenant(i: usize) -> Tenant {
    Tenant {
        owner: Owner::token(i),
        tokens: 1,
    }
}

fn held(s: &dyn Store, i: usize) -> usize {
    s.owner_counts()[i].held
}

async fn lease(
    s: &dyn Store,
    who: usize,
    key: &ScopeKey,
    now_ms: i64,
) -> Result<LeaseOutcome, StoreError> {
    let ask = GrantAsk {
        tenant: tenant(who),
        ..ask("w", 1, now_ms)
    };
    s.lease(key, ask, &Policy::default()).await
}

async fn deposit(s: &dyn Store, who: usize, key: &ScopeKey, now_ms: i64) -> Result<(), StoreError> {
    let batch = ReportBatch {
        first_attempts: 1,
        tenant: tenant(who),
        ..ReportBatch::empty("w", now_ms)
    };
    s.report(key, batch, &Policy::default()).await.map(drop)
}

/// A report carrying a 429 with `Retry-After: 300`: five minutes of
/// cooldown, which must not keep the scope from its owner's own eviction.
async fn cool_down(
    s: &dyn Store,
    who: usize,
    key: &ScopeKey,
    now_ms: i64,
) -> Result<(), StoreError> {
    let p = Policy::default();
    let input = EvidenceInput {
        http_status: 429,
        retry_after: Some("300"),
        receipt_ms: now_ms,
        ..EvidenceInput::default()
    };
    let hints = [LevelHint {
        caller_wide: false,
        assessment: assess(&input, &p, now_ms),
    }];
    let batch = ReportBatch {
        first_attempts: 1,
        rejections: 1,
        hints: &hints,
        tenant: tenant(who),
        ..ReportBatch::empty("w", now_ms)
    };
    s.report(key, batch, &p).await.map(drop)
}

async fn exists(s: &dyn Store, key: &ScopeKey, now_ms: i64) -> bool {
    s.scope_detail(&key.route, &Policy::default(), now_ms)
        .await
        .expect("detail")
        .is_some()
}

pub(crate) async fn a_token_at_its_quota_evicts_its_own_cooled_down_scopes_never_anothers(
    s: &dyn Store,
) {
    let a = |i: usize| scope("a", &format!("r{i}"));
    let b = |i: usize| scope("b", &format!("r{i}"));
    // B's first scope is busy with a lease, its second only cold.
    lease(s, 1, &b(0), T0).await.expect("b's lease");
    deposit(s, 1, &b(1), T0).await.expect("b's report");
    // A fills its quota with scopes it cooled down itself.
    for i in 0..QUOTA {
        cool_down(s, 0, &a(i), T0 + 1 + i as i64)
            .await
            .expect("a's quota");
    }
    assert_eq!(held(s, 0), QUOTA);
    // Ten more: each evicts A's own coldest, cooldown or not.
    for i in QUOTA..QUOTA + 10 {
        cool_down(s, 0, &a(i), T0 + 100 + i as i64)
            .await
            .expect("room among a's own scopes");
        assert!(held(s, 0) <= QUOTA, "{} held", held(s, 0));
    }
    let now = T0 + 200;
    assert!(exists(s, &b(0), now).await, "b's busy scope kept");
    assert!(exists(s, &b(1), now).await, "b's cold scope kept");
    assert!(!exists(s, &a(0), now).await, "a's coldest went");
    assert!(exists(s, &a(QUOTA + 9), now).await, "a's newest kept");
    // B is under its quota: a new scope of its own is admitted.
    lease(s, 1, &b(2), now).await.expect("b's room");
    assert_eq!(held(s, 1), 3);
    let counts = s.owner_counts();
    assert_eq!((counts[0].held, counts[0].quota), (QUOTA, QUOTA));
    assert_eq!(counts[0].refused, 0);
}

pub(crate) async fn a_token_whose_scopes_are_all_busy_is_refused_at_its_quota_alone(s: &dyn Store) {
    let a = |i: usize| scope("a", &format!("r{i}"));
    for i in 0..QUOTA {
        lease(s, 0, &a(i), T0).await.expect("a's quota");
    }
    let refused = lease(s, 0, &a(QUOTA), T0 + 1).await;
    assert_eq!(refused, Err(StoreError::ScopeQuota { quota: QUOTA }));
    // Nothing was made for the refused call; a report or a Reconsider
    // that would make it is refused too.
    assert!(!exists(s, &a(QUOTA), T0 + 1).await);
    assert_eq!(
        deposit(s, 0, &a(QUOTA), T0 + 2).await,
        Err(StoreError::ScopeQuota { quota: QUOTA })
    );
    let slot = s
        .reconsider(
            &a(QUOTA).route,
            SlotAsk {
                tenant: tenant(0),
                may_call_back: false,
                ..super::common::slot_ask("i", T0 + 2)
            },
            &Policy::default(),
        )
        .await;
    assert_eq!(slot.map(drop), Err(StoreError::ScopeQuota { quota: QUOTA }));
    assert_eq!(s.owner_counts()[0].refused, 3);
    // B is not held out by A's full quota.
    lease(s, 1, &scope("b", "r0"), T0 + 1)
        .await
        .expect("b's room");
    // A's existing scopes still serve it.
    lease(s, 0, &a(0), T0 + 2).await.expect("a's own scope");
    // Once A's leases expire, its own coldest makes room.
    lease(s, 0, &a(QUOTA), T0 + 20_000)
        .await
        .expect("a's own room");
    assert_eq!(held(s, 0), QUOTA);
}

pub(crate) async fn scopes_are_charged_to_their_maker_and_listed_by_owner(s: &dyn Store) {
    let (a0, b0) = (scope("a", "r0"), scope("b", "r0"));
    deposit(s, 0, &a0, T0).await.expect("a's");
    deposit(s, 1, &b0, T0).await.expect("b's");
    // B using A's scope does not make it B's, nor charge B.
    deposit(s, 1, &a0, T0 + 1).await.expect("b on a's");
    lease(s, 1, &a0, T0 + 1).await.expect("b on a's");
    assert_eq!((held(s, 0), held(s, 1)), (1, 1));
    let of = |i| ScopeFilter {
        owner: Some(Owner::token(i)),
        ..ScopeFilter::default()
    };
    let page = s.list_scopes(&of(1), None, 10, T0 + 2).await.expect("list");
    let routes: Vec<_> = page
        .scopes
        .iter()
        .map(|x| (x.route.clone(), x.owner))
        .collect();
    assert_eq!(routes, vec![(b0.route.clone(), Owner::token(1))]);
    let page = s.list_scopes(&of(0), None, 10, T0 + 2).await.expect("list");
    let routes: Vec<_> = page
        .scopes
        .iter()
        .map(|x| (x.route.clone(), x.owner))
        .collect();
    assert_eq!(routes, vec![(a0.route.clone(), Owner::token(0))]);
    // An operator's scope is nobody's.
    let c0 = scope("c", "r0");
    s.set_freeze(&c0.route, Some("incident".into()), T0 + 3)
        .await
        .expect("freeze");
    let all = s
        .list_scopes(&ScopeFilter::default(), None, 10, T0 + 3)
        .await
        .expect("list");
    let owners: Vec<_> = all.scopes.iter().map(|x| x.owner).collect();
    assert_eq!(owners, vec![Owner::token(0), Owner::token(1), Owner::NONE]);
}

pub(crate) async fn a_caller_scope_is_charged_and_idle_scopes_give_their_places_back(
    s: &dyn Store,
) {
    let p = Policy::default();
    let input = EvidenceInput {
        http_status: 429,
        retry_after: Some("1"),
        receipt_ms: T0,
        ..EvidenceInput::default()
    };
    // Uncertain evidence lands on the whole caller scope, which is made
    // for the reporting token: the route and its caller scope, two places.
    let hints = [LevelHint {
        caller_wide: true,
        assessment: assess(&input, &p, T0),
    }];
    let batch = ReportBatch {
        first_attempts: 1,
        rejections: 1,
        hints: &hints,
        tenant: tenant(0),
        ..ReportBatch::empty("w", T0)
    };
    s.report(&scope("a", "r0"), batch, &p)
        .await
        .expect("a's report");
    assert_eq!(held(s, 0), 2);
    deposit(s, 0, &scope("a", "r1"), T0)
        .await
        .expect("a's third");
    assert_eq!(held(s, 0), QUOTA);
    // Once idle, the sweep forgets them and the quota is free again.
    let later = T0 + 1_000_000;
    assert_eq!(s.evict_idle(later, 60_000).await, Ok(3));
    assert_eq!(held(s, 0), 0);
    for i in 0..QUOTA {
        lease(s, 0, &scope("a", &format!("n{i}")), later)
            .await
            .expect("a's places back");
    }
    assert_eq!(held(s, 0), QUOTA);
}

pub(crate) async fn a_huge_report_from_one_token_does_not_raise_anothers_budget(s: &dyn Store) {
    let p = Policy::default();
    let shared = |i: usize| Tenant {
        owner: Owner::token(i),
        tokens: 2,
    };
    let key = scope("shared", "r");
    let report = |who, worker, first_attempts| ReportBatch {
        first_attempts,
        tenant: shared(who),
        ..ReportBatch::empty(worker, T0)
    };
    s.report(&key, report(0, "one:w", 100), &p)
        .await
        .expect("one's report");
    s.report(&key, report(1, "two:w", 1_000_000), &p)
        .await
        .expect("two's claim");
    // Alone, a hundred first attempts earn the floor (10/s over 10 s)
    // plus 0.2 × 100: 120 tokens, whatever the other token claims.
    let bound = 10 * 10 + 100 / 5;
    let mine = s
        .lease(
            &key,
            GrantAsk {
                tenant: shared(0),
                ..ask("one:w", 10_000, T0)
            },
            &p,
        )
        .await
        .expect("one's lease");
    assert_eq!((mine.grant.granted, mine.grant.remaining), (bound, 0));
    let again = s
        .lease(
            &key,
            GrantAsk {
                tenant: shared(0),
                ..ask("one:w", 10_000, T0 + 1)
            },
            &p,
        )
        .await
        .expect("one's lease");
    assert_eq!(again.grant.granted, 0, "one's own budget is spent");
    // What it did not spend comes back to its own budget too.
    let id = mine.lease_id.expect("a lease");
    s.release(&key, super::common::end("one:w", &id, 20, T0 + 2))
        .await
        .expect("release");
    let refunded = s
        .lease(
            &key,
            GrantAsk {
                tenant: shared(0),
                ..ask("one:w", 10_000, T0 + 3)
            },
            &p,
        )
        .await
        .expect("one's lease");
    assert_eq!(refunded.grant.granted, bound - 20);
    // The claiming token's own retries are what its claim earns it.
    let theirs = s
        .lease(
            &key,
            GrantAsk {
                tenant: shared(1),
                ..ask("two:w", 10_000, T0 + 3)
            },
            &p,
        )
        .await
        .expect("two's lease");
    assert_eq!(theirs.grant.granted, 10_000);
}

/// The quota cases, for a backend that makes a store with [`limits`]:
/// `quota_tests!(make)`, `make` an `async fn() -> Option<Fixture>`.
macro_rules! quota_tests {
    ($make:path) => {
        crate::store::contract::quotas::quota_tests!(@each $make;
            a_token_at_its_quota_evicts_its_own_cooled_down_scopes_never_anothers,
            a_token_whose_scopes_are_all_busy_is_refused_at_its_quota_alone,
            scopes_are_charged_to_their_maker_and_listed_by_owner,
            a_caller_scope_is_charged_and_idle_scopes_give_their_places_back,
            a_huge_report_from_one_token_does_not_raise_anothers_budget);
    };
    (@each $make:path; $($name:ident),*) => {
        $(
            #[tokio::test]
            async fn $name() {
                let Some(f) = $make().await else { return };
                crate::store::contract::quotas::$name(&*f.store).await;
            }
        )*
    };
}
pub(crate) use quota_tests;
