//! Scope-table gauges: how full the store's bounded scope table is, and
//! what reaching the bound did — `tollgate.scopes.live`,
//! `tollgate.scopes.limit`, `tollgate.scopes.evicted` (by reason: `idle`,
//! swept after the idle TTL; `room`, the coldest evicted at the limit to
//! admit a new scope) and `tollgate.scopes.refused` (operations refused
//! because every scope was live); and per caller token, labelled
//! `tollgate.tenant` with the `name` of its `[[token]]` entry (never the
//! token): `tollgate.scopes.held` (scopes charged to it now),
//! `tollgate.scopes.quota` (its quota) and `tollgate.scopes.quota_refused`
//! (new scopes refused to it at its quota).
//!
//! Read from [`Store::counts`] and [`Store::owner_counts`] at collection,
//! so nothing is counted twice; a store without a bound of its own (Redis)
//! exports only the per-token ones, as it keeps each token's quota. The
//! callbacks hold the store weakly: the meter provider is process-wide and
//! outlives a server stopped in a test.

use std::sync::{Arc, Weak};

use opentelemetry::KeyValue;
use opentelemetry::metrics::Meter;

use crate::store::{ScopeCounts, Store};

fn counts(store: &Weak<dyn Store>) -> Option<ScopeCounts> {
    store.upgrade().and_then(|s| s.counts())
}

/// Registers the scope-table instruments on `meter`, reading `store`;
/// `tenants` names the caller token entries, in order.
pub(crate) fn register(meter: &Meter, store: &Arc<dyn Store>, tenants: Vec<String>) {
    let weak = Arc::downgrade(store);
    register_tenants(meter, &weak, Arc::new(tenants));
    if store.counts().is_none() {
        return;
    }
    let live = weak.clone();
    meter
        .u64_observable_gauge("tollgate.scopes.live")
        .with_description("Routes and caller scopes the store holds now")
        .with_callback(move |observer| {
            if let Some(c) = counts(&live) {
                observer.observe(c.live as u64, &[]);
            }
        })
        .build();
    let limit = weak.clone();
    meter
        .u64_observable_gauge("tollgate.scopes.limit")
        .with_description("The store's bound on scopes (max_scopes)")
        .with_callback(move |observer| {
            if let Some(c) = counts(&limit) {
                observer.observe(c.limit as u64, &[]);
            }
        })
        .build();
    let evicted = weak.clone();
    meter
        .u64_observable_counter("tollgate.scopes.evicted")
        .with_description(
            "Scopes evicted: idle (swept after the idle TTL) or room (coldest, to admit a new scope at the limit)",
        )
        .with_callback(move |observer| {
            if let Some(c) = counts(&evicted) {
                observer.observe(c.evicted_idle, &[KeyValue::new("tollgate.reason", "idle")]);
                observer.observe(
                    c.evicted_for_room,
                    &[KeyValue::new("tollgate.reason", "room")],
                );
            }
        })
        .build();
    meter
        .u64_observable_counter("tollgate.scopes.refused")
        .with_description("Operations refused at the scope limit because every scope was live")
        .with_callback(move |observer| {
            if let Some(c) = counts(&weak) {
                observer.observe(c.refused, &[]);
            }
        })
        .build();
}

/// The per-tenant gauges and counter, each labelled with the entry's name.
fn register_tenants(meter: &Meter, store: &Weak<dyn Store>, tenants: Arc<Vec<String>>) {
    if tenants.is_empty() {
        return;
    }
    let each = |store: &Weak<dyn Store>, tenants: &Arc<Vec<String>>| {
        let (store, tenants) = (store.clone(), Arc::clone(tenants));
        move |f: &mut dyn FnMut(crate::store::OwnerCounts, [KeyValue; 1])| {
            let Some(store) = store.upgrade() else {
                return;
            };
            for c in store.owner_counts() {
                let name = c.owner.index().and_then(|i| tenants.get(i));
                if let Some(name) = name {
                    f(c, [KeyValue::new("tollgate.tenant", name.clone())]);
                }
            }
        }
    };
    let held = each(store, &tenants);
    meter
        .u64_observable_gauge("tollgate.scopes.held")
        .with_description("Routes and caller scopes charged to a caller token now")
        .with_callback(move |observer| {
            held(&mut |c, label| observer.observe(c.held as u64, &label));
        })
        .build();
    let quota = each(store, &tenants);
    meter
        .u64_observable_gauge("tollgate.scopes.quota")
        .with_description("A caller token's quota of scopes (max_scopes of its [[token]] entry)")
        .with_callback(move |observer| {
            quota(&mut |c, label| observer.observe(c.quota as u64, &label));
        })
        .build();
    let refused = each(store, &tenants);
    meter
        .u64_observable_counter("tollgate.scopes.quota_refused")
        .with_description(
            "New scopes refused to a caller token at its quota, every one of its scopes busy",
        )
        .with_callback(move |observer| {
            refused(&mut |c, label| observer.observe(c.refused, &label));
        })
        .build();
}
