//! Contract cases for what an operator sees and changes: freezes, scope
//! listings and details, resets, idle eviction and the store's health.

use super::common::{T0, ask, deposit, end, merge_429, scope, slot_ask};
use crate::budget::GrantLimit;
use crate::policy::Policy;
use crate::scope::EvidenceLevel;
use crate::store::{Reconsidered, Store};

pub(crate) async fn a_frozen_scope_grants_nothing_and_gives_no_slot(s: &dyn Store) {
    let p = Policy::default();
    let key = scope("c", "r");
    s.set_freeze(&key.route, Some("incident".into()), T0)
        .await
        .expect("freeze");
    let leased = s.lease(&key, ask("w", 5, T0), &p).await.expect("lease");
    assert_eq!(leased.grant.granted, 0);
    assert_eq!(leased.grant.limit, GrantLimit::Frozen);
    let r = s
        .reconsider(&key.route, slot_ask("i", T0), &p)
        .await
        .expect("slot")
        .decided;
    assert_eq!(r, Reconsidered::Frozen);
}

pub(crate) async fn scopes_are_listed_in_pages_and_filtered(s: &dyn Store) {
    use crate::policy::Pattern;
    use crate::store::ScopeFilter;
    let p = Policy::default();
    for route in ["r1", "r2", "r3"] {
        deposit(s, &scope("c", route), "w", 1, 0, &p, T0)
            .await
            .expect("deposit");
    }
    deposit(s, &scope("d", "r1"), "w", 1, 0, &p, T0)
        .await
        .expect("deposit");
    let all = ScopeFilter::default();
    let first = s.list_scopes(&all, None, 3, T0).await.expect("list");
    assert_eq!(first.scopes.len(), 3);
    let next = first.next.expect("a second page");
    let second = s.list_scopes(&all, Some(&next), 3, T0).await.expect("list");
    assert_eq!(second.scopes.len(), 1);
    assert_eq!(second.next, None);
    assert_eq!(second.scopes[0].route.caller_scope, "d");
    let only_c = ScopeFilter {
        caller_scope: Pattern::parse("c"),
        route: Pattern::parse("r*"),
        frozen_only: false,
        owner: None,
    };
    let page = s.list_scopes(&only_c, None, 10, T0).await.expect("list");
    assert_eq!(page.scopes.len(), 3);
    s.set_freeze(&scope("c", "r2").route, Some("x".into()), T0)
        .await
        .expect("freeze");
    let frozen = ScopeFilter {
        frozen_only: true,
        ..ScopeFilter::default()
    };
    let page = s.list_scopes(&frozen, None, 10, T0).await.expect("list");
    assert_eq!(page.scopes.len(), 1);
    assert_eq!(page.scopes[0].route.route, "r2");
}

pub(crate) async fn scope_detail_shows_balance_leases_and_the_cooldown_hint(s: &dyn Store) {
    let p = Policy::default();
    let key = scope("c", "r");
    assert_eq!(
        s.scope_detail(&key.route, &p, T0).await.expect("detail"),
        None
    );
    s.lease(&key, ask("w", 30, T0), &p).await.expect("lease");
    merge_429(s, EvidenceLevel::Route(key.route.clone()), "30", &p).await;
    let d = s
        .scope_detail(&key.route, &p, T0)
        .await
        .expect("detail")
        .expect("known");
    assert_eq!(d.summary.leases_outstanding, 1);
    assert_eq!(d.budget.tokens_outstanding, 30);
    assert_eq!(d.budget.classes[0].active_workers, 1);
    assert_eq!(d.budget.classes[0].allowance_milli, 100_000);
    assert_eq!(d.budget.classes[0].available_milli, 100_000 - 30_000);
    // Normal may not touch critical's 0.2 reserve, and critical's
    // lease came out of the normal and bulk shares first.
    assert_eq!(d.budget.classes[1].allowance_milli, 80_000);
    assert_eq!(d.budget.classes[1].available_milli, 70_000);
    assert_eq!(d.budget.classes[2].available_milli, 20_000);
    assert_eq!(d.route_cooldown_until_ms, T0 + 30_000);
    assert_eq!(d.route_hints.len(), 1);
    assert_eq!(d.route_hints[0].cooldown_until_ms, Some(T0 + 30_000));
}

pub(crate) async fn reset_forgets_budget_and_cooldown_but_keeps_a_freeze(s: &dyn Store) {
    let p = Policy::default();
    let key = scope("c", "r");
    let lease = s.lease(&key, ask("w", 50, T0), &p).await.expect("lease");
    merge_429(s, EvidenceLevel::Route(key.route.clone()), "30", &p).await;
    s.set_freeze(&key.route, Some("incident".into()), T0)
        .await
        .expect("freeze");
    assert_eq!(s.reset_scope(&key.route, T0).await, Ok(true));
    let view = s.view(&key.route, T0).await.expect("view");
    assert_eq!(view.cooldown_until_ms, 0);
    assert_eq!(view.frozen.as_deref(), Some("incident"));
    let id = lease.lease_id.expect("granted");
    assert!(s.release(&key, end("w", &id, 0, T0)).await.is_err());
    s.set_freeze(&key.route, None, T0).await.expect("unfreeze");
    let again = s.lease(&key, ask("w", 50, T0), &p).await.expect("lease");
    assert_eq!(again.grant.granted, 50, "the window starts over");
    let unknown = scope("c", "never");
    assert_eq!(s.reset_scope(&unknown.route, T0).await, Ok(false));
}

pub(crate) async fn idle_scopes_are_evicted_and_live_ones_kept(s: &dyn Store) {
    let p = Policy::default();
    for i in 0..3 {
        deposit(s, &scope("c", &format!("r{i}")), "w", 1, 0, &p, T0)
            .await
            .expect("deposit");
    }
    let frozen = scope("c", "frozen");
    s.set_freeze(&frozen.route, Some("incident".into()), T0)
        .await
        .expect("freeze");
    let cooling = scope("c", "cooling");
    merge_429(s, EvidenceLevel::Route(cooling.route.clone()), "120", &p).await;
    assert_eq!(
        s.evict_idle(T0 + 1_000, 60_000).await,
        Ok(0),
        "not idle yet"
    );
    assert_eq!(s.evict_idle(T0 + 61_000, 60_000).await, Ok(3));
    assert_eq!(
        s.view(&cooling.route, T0 + 61_000)
            .await
            .expect("view")
            .cooldown_until_ms,
        T0 + 120_000,
        "a cooldown still running keeps its scope"
    );
    let view = s.view(&frozen.route, T0 + 61_000).await.expect("view");
    assert_eq!(view.frozen.as_deref(), Some("incident"));
    assert_eq!(s.evict_idle(T0 + 200_000, 60_000).await, Ok(1));
}

/// The half of health every store shares: one that has just served a
/// lease and a listing says it is healthy. The other half, a store that
/// cannot serve saying so, needs a backend that can fail: the Redis
/// store's cases in `store/redis/format.rs` and `tests/replicas.rs`.
pub(crate) async fn a_store_that_serves_reports_itself_healthy(s: &dyn Store) {
    let p = Policy::default();
    let key = scope("c", "r");
    let leased = s.lease(&key, ask("w", 1, T0), &p).await.expect("lease");
    assert_eq!(leased.grant.granted, 1, "{leased:?}");
    let listed = s
        .list_scopes(&crate::store::ScopeFilter::default(), None, 10, T0)
        .await
        .expect("list");
    assert_eq!(listed.scopes.len(), 1, "{listed:?}");
    assert_eq!(s.health().await, Ok(()));
}
