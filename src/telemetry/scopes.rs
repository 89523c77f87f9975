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
//! Read at collection through the two functions the Budget service passes
//! in ([`Store::counts`](crate::store::Store::counts) and `owner_counts`),
//! so nothing is counted twice; a store without a bound of its own (Redis)
//! exports only the per-token ones, as it keeps each token's quota. The
//! functions hold the store weakly: the meter provider is process-wide and
//! outlives a server stopped in a test. The counts are plain values defined
//! here, the shape these metrics need, so telemetry depends on no store.

use std::sync::Arc;

use opentelemetry::KeyValue;
use opentelemetry::metrics::Meter;

use crate::tenancy::Owner;

/// How full a store's bounded scope table is, for the `tollgate.scopes.*`
/// metrics (stores without a bound of their own have none).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize)]
pub struct ScopeCounts {
    /// Routes plus caller scopes held now.
    pub live: usize,
    /// `max_scopes`.
    pub limit: usize,
    /// Scopes the sweeper evicted for idleness, since start.
    pub evicted_idle: u64,
    /// Cold scopes evicted to make room for new ones at the limit.
    pub evicted_for_room: u64,
    /// Operations refused because every scope was live.
    pub refused: u64,
}

/// What one token holds of a bounded scope table, for the per-tenant
/// `tollgate.scopes.*` metrics.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OwnerCounts {
    /// The token.
    pub owner: Owner,
    /// Routes plus caller scopes charged to it now.
    pub held: usize,
    /// Its quota.
    pub quota: usize,
    /// New scopes refused to it at its quota, since start.
    pub refused: u64,
}

/// Reads the scope table's counts at collection; `None` when the store
/// keeps no bound of its own, or is gone.
pub type ReadCounts = Arc<dyn Fn() -> Option<ScopeCounts> + Send + Sync>;
/// Reads what each token with a quota holds at collection.
pub type ReadOwners = Arc<dyn Fn() -> Vec<OwnerCounts> + Send + Sync>;

/// Registers the scope-table instruments on `meter`, reading the table
/// through `counts` and `owners`; `tenants` names the caller token
/// entries, in order.
pub(crate) fn register(
    meter: &Meter,
    counts: ReadCounts,
    owners: ReadOwners,
    tenants: Vec<String>,
) {
    register_tenants(meter, owners, Arc::new(tenants));
    if counts().is_none() {
        return;
    }
    let live = Arc::clone(&counts);
    meter
        .u64_observable_gauge("tollgate.scopes.live")
        .with_description("Routes and caller scopes the store holds now")
        .with_callback(move |observer| {
            if let Some(c) = live() {
                observer.observe(c.live as u64, &[]);
            }
        })
        .build();
    let limit = Arc::clone(&counts);
    meter
        .u64_observable_gauge("tollgate.scopes.limit")
        .with_description("The store's bound on scopes (max_scopes)")
        .with_callback(move |observer| {
            if let Some(c) = limit() {
                observer.observe(c.limit as u64, &[]);
            }
        })
        .build();
    let evicted = Arc::clone(&counts);
    meter
        .u64_observable_counter("tollgate.scopes.evicted")
        .with_description(
            "Scopes evicted: idle (swept after the idle TTL) or room (coldest, to admit a new scope at the limit)",
        )
        .with_callback(move |observer| {
            if let Some(c) = evicted() {
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
            if let Some(c) = counts() {
                observer.observe(c.refused, &[]);
            }
        })
        .build();
}

/// The per-tenant gauges and counter, each labelled with the entry's name.
fn register_tenants(meter: &Meter, owners: ReadOwners, tenants: Arc<Vec<String>>) {
    if tenants.is_empty() {
        return;
    }
    let each = |owners: &ReadOwners, tenants: &Arc<Vec<String>>| {
        let (owners, tenants) = (Arc::clone(owners), Arc::clone(tenants));
        move |f: &mut dyn FnMut(OwnerCounts, [KeyValue; 1])| {
            for c in owners() {
                let name = c.owner.index().and_then(|i| tenants.get(i));
                if let Some(name) = name {
                    f(c, [KeyValue::new("tollgate.tenant", name.clone())]);
                }
            }
        }
    };
    let held = each(&owners, &tenants);
    meter
        .u64_observable_gauge("tollgate.scopes.held")
        .with_description("Routes and caller scopes charged to a caller token now")
        .with_callback(move |observer| {
            held(&mut |c, label| observer.observe(c.held as u64, &label));
        })
        .build();
    let quota = each(&owners, &tenants);
    meter
        .u64_observable_gauge("tollgate.scopes.quota")
        .with_description("A caller token's quota of scopes (max_scopes of its [[token]] entry)")
        .with_callback(move |observer| {
            quota(&mut |c, label| observer.observe(c.quota as u64, &label));
        })
        .build();
    let refused = each(&owners, &tenants);
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
