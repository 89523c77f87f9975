//! Contract cases for leases and the retry budget: tokens taken and given
//! back, the allowance first attempts earn, fair shares, retry classes and
//! priority classes, on every backend alike.

use super::common::{T0, ask, deposit, end, scope};
use crate::budget::{BudgetError, GrantAsk, GrantLimit, LeaseEnd};
use crate::policy::Policy;
use crate::scope::{Priority, RetryClass, ScopeKey};
use crate::store::{Store, StoreError};

pub(crate) async fn leases_take_tokens_and_release_returns_them(s: &dyn Store) {
    let p = Policy::default();
    let key = scope("c", "r");
    // Critical alone may spend the whole allowance: 100 tokens.
    let first = s.lease(&key, ask("w", 80, T0), &p).await.expect("lease");
    assert_eq!(first.grant.granted, 80);
    let id = first.lease_id.expect("an id when granted");
    let second = s.lease(&key, ask("w", 40, T0), &p).await.expect("lease");
    assert_eq!(second.grant.granted, 20);
    assert_eq!(s.release(&key, end("w", &id, 15, T0)).await, Ok(65));
    assert!(matches!(
        s.release(&key, end("w", &id, 0, T0)).await,
        Err(StoreError::Budget(_))
    ));
}

/// Lease ids are unguessable: a worker told one cannot name the next
/// (its own or another's) from it, nor learn how many were granted.
pub(crate) async fn lease_ids_reveal_no_counter(s: &dyn Store) {
    let p = Policy::default();
    let key = scope("c", "r");
    let mut ids = Vec::new();
    for _ in 0..4 {
        let lease = s.lease(&key, ask("w", 1, T0), &p).await.expect("lease");
        ids.push(lease.lease_id.expect("an id when granted"));
    }
    for pair in ids.windows(2) {
        // Past a shared start (none is expected), the ids differ in at
        // least 24 of the 32 random hex digits: no counter ticks at the end.
        let same_start = pair[0]
            .chars()
            .zip(pair[1].chars())
            .take_while(|(a, b)| a == b)
            .count();
        assert!(same_start < 8, "{pair:?}");
        assert!(
            pair[0][..32].bytes().all(|b| b.is_ascii_hexdigit()),
            "{pair:?}"
        );
    }
}

pub(crate) async fn first_attempts_grow_the_allowance_and_slide_out(s: &dyn Store) {
    let p = Policy::default(); // 10/s × 10 s floor, ratio 0.2
    let key = scope("c", "r");
    deposit(s, &key, "w", 250, 0, &p, T0)
        .await
        .expect("deposit");
    // critical alone reaches the whole allowance: 100 + 0.2 × 250
    let g = s.lease(&key, ask("w", 1000, T0), &p).await.expect("lease");
    assert_eq!(g.grant.granted, 150);
    assert_eq!(g.grant.limit, GrantLimit::BudgetExhausted);
    assert_eq!(g.grant.remaining, 0);
    assert_eq!(g.grant.expires_at_ms, T0 + p.lease_ttl_ms as i64);
    // A window later the deposit and the charge have slid out.
    let later = T0 + 10_000;
    let g = s
        .lease(&key, ask("w", 1000, later), &p)
        .await
        .expect("lease");
    assert_eq!(g.grant.granted, 100);
}

pub(crate) async fn leases_are_fair_and_expired_ones_keep_their_charge(s: &dyn Store) {
    let p = Policy::default(); // 100 tokens critical may reach
    let key = scope("c", "r");
    for i in 0..9 {
        deposit(s, &key, &format!("m{i}"), 0, 0, &p, T0)
            .await
            .expect("deposit");
    }
    let greedy = s
        .lease(&key, ask("greedy", 1000, T0), &p)
        .await
        .expect("lease");
    assert_eq!(greedy.grant.granted, 10, "an equal share of 100 among 10");
    assert_eq!(greedy.grant.limit, GrantLimit::FairShare);
    let id = greedy.lease_id.expect("id");
    assert!(matches!(
        s.release(&key, end("someone-else", &id, 0, T0)).await,
        Err(StoreError::Budget(_))
    ));
    assert!(matches!(
        s.release(&key, end("greedy", &id, 11, T0)).await,
        Err(StoreError::Budget(BudgetError::SpentExceedsGrant {
            spent: 11,
            granted: 10
        }))
    ));
    let expired = T0 + p.lease_ttl_ms as i64;
    assert!(matches!(
        s.release(&key, end("greedy", &id, 0, expired)).await,
        Err(StoreError::Budget(_))
    ));
    assert!(matches!(
        s.release(&scope("c", "unknown"), end("w", "nope", 0, T0))
            .await,
        Err(StoreError::Budget(_))
    ));
}

pub(crate) async fn a_fleet_larger_than_the_budget_still_gets_one_token_each(s: &dyn Store) {
    let p = Policy::default(); // 100 tokens critical may reach
    let key = scope("c", "r");
    // 300 workers reporting: an equal share is a third of a token.
    for i in 0..300 {
        deposit(s, &key, &format!("m{i}"), 0, 0, &p, T0)
            .await
            .expect("deposit");
    }
    let one = s.lease(&key, ask("w", 5, T0), &p).await.expect("lease");
    assert_eq!(
        one.grant.granted, 1,
        "one token, not a share rounded to none"
    );
    assert_eq!(one.grant.limit, GrantLimit::FairShare);
    let again = s.lease(&key, ask("w", 5, T0), &p).await.expect("lease");
    assert_eq!(again.grant.granted, 0, "it holds a token's worth already");
    // The budget still bounds the fleet: 100 tokens, one each.
    let mut granted = 1;
    for i in 0..150 {
        granted += s
            .lease(&key, ask(&format!("m{i}"), 5, T0), &p)
            .await
            .expect("lease")
            .grant
            .granted;
    }
    assert_eq!(granted, 100);
}

pub(crate) async fn throttled_retries_cost_more_and_classes_do_not_share(s: &dyn Store) {
    let p = Policy::default();
    let key = scope("c", "r");
    // 30 throttled retries cost 60 of the 100 tokens.
    let g = s
        .lease(
            &key,
            GrantAsk {
                retry_class: RetryClass::Throttled,
                ..ask("w", 30, T0)
            },
            &p,
        )
        .await
        .expect("lease");
    assert_eq!(g.grant.granted, 30);
    assert_eq!(g.grant.remaining, 20, "40 tokens left, 2 a retry");
    let bulk = ScopeKey::new("c", "r", Priority::Bulk);
    let g = s
        .lease(
            &bulk,
            GrantAsk {
                priority: Priority::Bulk,
                ..ask("w", 100, T0)
            },
            &p,
        )
        .await
        .expect("lease");
    assert_eq!(g.grant.granted, 20, "bulk's own 0.2 share");
}

/// Shares borrow down, never up: a fleet sending only normal work
/// reaches everything but critical's reserve.
pub(crate) async fn a_normal_only_fleet_uses_most_of_the_budget(s: &dyn Store) {
    let p = Policy::default(); // 100 tokens; critical's reserve 0.2
    let normal = ScopeKey::new("c", "r", Priority::Normal);
    let g = s
        .lease(
            &normal,
            GrantAsk {
                priority: Priority::Normal,
                ..ask("w", 1000, T0)
            },
            &p,
        )
        .await
        .expect("lease");
    assert_eq!(g.grant.granted, 80, "at least 80 % of the formula");
    assert_eq!(g.grant.limit, GrantLimit::BudgetExhausted);
    let critical = s
        .lease(&scope("c", "r"), ask("w", 1000, T0), &p)
        .await
        .expect("lease");
    assert_eq!(critical.grant.granted, 20, "critical's reserve is intact");
}

/// Neither an exhausting bulk class nor a greedy normal one can
/// take critical's reserve, whichever asks first.
pub(crate) async fn lower_classes_never_take_criticals_reserve(s: &dyn Store) {
    let p = &Policy::default();
    let lease = |route: &'static str, priority: Priority| async move {
        let key = ScopeKey::new("c", route, priority);
        s.lease(
            &key,
            GrantAsk {
                priority,
                ..ask("w", 1000, T0)
            },
            p,
        )
        .await
        .expect("lease")
        .grant
        .granted
    };
    // Bulk first: its own 0.2; normal then the rest but critical's.
    assert_eq!(lease("a", Priority::Bulk).await, 20);
    assert_eq!(lease("a", Priority::Normal).await, 60);
    assert_eq!(lease("a", Priority::Critical).await, 20);
    // Greedy normal first: bulk finds its share borrowed, and
    // critical still finds its reserve.
    assert_eq!(lease("b", Priority::Normal).await, 80);
    assert_eq!(lease("b", Priority::Bulk).await, 0);
    assert_eq!(lease("b", Priority::Critical).await, 20);
}

/// A retry that succeeded earns its token back (the budget bounds
/// failing retries); successes beyond what was spent are refused.
pub(crate) async fn a_retry_that_succeeded_earns_its_token_back(s: &dyn Store) {
    let p = Policy::default();
    let key = scope("c", "r");
    let g = s.lease(&key, ask("w", 100, T0), &p).await.expect("lease");
    assert_eq!(g.grant.granted, 100);
    let id = g.lease_id.expect("id");
    let too_many = LeaseEnd {
        retry_successes: 11,
        ..end("w", &id, 10, T0)
    };
    assert!(matches!(
        s.release(&key, too_many).await,
        Err(StoreError::Budget(BudgetError::SuccessesExceedSpent {
            successes: 11,
            spent: 10
        }))
    ));
    let ok = LeaseEnd {
        retry_successes: 4,
        ..end("w", &id, 10, T0)
    };
    assert_eq!(
        s.release(&key, ok).await,
        Ok(94),
        "90 unspent + 4 that succeeded"
    );
    let again = s.lease(&key, ask("w", 1000, T0), &p).await.expect("lease");
    assert_eq!(
        again.grant.granted, 94,
        "only the 6 failed retries stay spent"
    );
}
