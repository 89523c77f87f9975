//! The coordinator's metrics, recorded through the OpenTelemetry API and
//! exported by whatever the global meter provider has (OTLP, the Prometheus
//! reader behind `/metrics`, or nothing: the no-op provider costs a branch).
//!
//! # Bounded cardinality
//! No instrument is labelled by scope except `tollgate.budget.lowest`, which
//! carries the [`LOWEST_BALANCES`] scopes nearest to exhaustion at each
//! collection — the ones an SRE needs to see — so the number of series at any
//! time is fixed whatever the fleet does. Everything else is labelled only by
//! small enums: priority class, decision, reason, hint form and validity.
//!
//! Gauges the service cannot read from one request (tokens outstanding,
//! balances, active cooldowns) come from small bounded books kept here and
//! read at collection time; the store is not scanned. Freezes are the
//! exception to the bounded-label rule: they are operator actions, few by
//! nature, and an alert needs to name the scope (see [`super::freezes`]).
//!
//! # Counted on the Lease path without the SDK
//! Every Lease (and Release) counts. A synchronous OpenTelemetry counter
//! builds, sorts and hashes an attribute set per `add`; the lease counters'
//! attribute sets are few and known up front, so they are plain atomics
//! (`Tally`) read by an observable counter at collection: the same metric
//! for every exporter (a monotonic cumulative sum), at one atomic add per
//! call. The books behind the gauges (`Book`, `LeaseLog`) compare and
//! clone no key on a call. Like the gauges, the tallies are per
//! [`CoordinatorMetrics`]: one coordinator per meter provider.

use std::collections::hash_map::RandomState;
use std::collections::{HashMap, HashSet};
use std::hash::BuildHasher as _;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use opentelemetry::KeyValue;
use opentelemetry::metrics::{Counter, Histogram, Meter};
use tollgate_vocab::clock::{Clock, to_unix_ms};
use tollgate_vocab::telemetry::caller_scope_attr;

use crate::budget::{Grant, GrantLimit};
use crate::pacing::PacingView;
use crate::scope::{Priority, RouteKey, ScopeKey};

use super::book::{Book, lock};
use super::pacing::PacingBook;

/// Scopes shown by `tollgate.budget.lowest`.
pub const LOWEST_BALANCES: usize = 5;
/// Entries kept per book; beyond it new entries are not tracked (and the
/// gauges undercount), so a flood of scopes cannot grow memory.
const MAX_BOOK_ENTRIES: usize = 100_000;
/// A balance not refreshed by a lease for this long is forgotten.
const BALANCE_TTL_MS: i64 = 10 * 60 * 1000;

/// Every grant limit, in the order of [`limit_index`].
const LIMITS: [GrantLimit; 4] = [
    GrantLimit::None,
    GrantLimit::BudgetExhausted,
    GrantLimit::FairShare,
    GrantLimit::Frozen,
];

fn limit_index(limit: GrantLimit) -> usize {
    match limit {
        GrantLimit::None => 0,
        GrantLimit::BudgetExhausted => 1,
        GrantLimit::FairShare => 2,
        GrantLimit::Frozen => 3,
    }
}

/// A counter over a fixed list of attribute sets: one atomic per set,
/// observed at collection by an observable counter of the same name.
/// Sets never counted are not reported, as with a synchronous counter.
struct Tally {
    counts: Arc<[AtomicU64]>,
}

impl Tally {
    /// Registers `name` on `meter` over `sets`; [`Tally::add`] takes an
    /// index into `sets`.
    fn register(
        meter: &Meter,
        name: &'static str,
        description: &'static str,
        unit: Option<&'static str>,
        sets: Vec<Vec<KeyValue>>,
    ) -> Self {
        let counts: Arc<[AtomicU64]> = sets.iter().map(|_| AtomicU64::new(0)).collect();
        let read = Arc::clone(&counts);
        let builder = meter
            .u64_observable_counter(name)
            .with_description(description);
        let builder = match unit {
            Some(unit) => builder.with_unit(unit),
            None => builder,
        };
        builder
            .with_callback(move |observer| {
                for (count, set) in read.iter().zip(&sets) {
                    let count = count.load(Ordering::Relaxed);
                    if count > 0 {
                        observer.observe(count, set);
                    }
                }
            })
            .build();
        Tally { counts }
    }

    /// Adds `n` to the set at `index` (an index past the sets is a
    /// programmer error, ignored rather than panicking on the request path).
    fn add(&self, index: usize, n: u64) {
        if let Some(count) = self.counts.get(index) {
            count.fetch_add(n, Ordering::Relaxed);
        }
    }
}

/// The attribute sets of a per-priority tally, in [`Priority::index`] order.
fn per_priority() -> Vec<Vec<KeyValue>> {
    Priority::ALL.iter().map(|&p| vec![priority(p)]).collect()
}

/// The instruments, and the books behind the gauges.
pub struct CoordinatorMetrics {
    /// By decision (denied, granted), then [`LIMITS`], then priority.
    leases: Tally,
    tokens_granted: Tally,
    tokens_returned: Tally,
    hints: Counter<u64>,
    claims: Counter<u64>,
    slots: Counter<u64>,
    slot_delay: Histogram<f64>,
    shadow: Counter<u64>,
    books: Arc<Books>,
    pacing: Arc<PacingBook>,
    clock: Arc<dyn Clock>,
}

impl std::fmt::Debug for CoordinatorMetrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CoordinatorMetrics").finish_non_exhaustive()
    }
}

#[derive(Default)]
struct Books {
    /// Tokens outstanding.
    leases: Mutex<LeaseLog>,
    /// scope → (remaining, seen at): the budget balance per scope.
    balances: Mutex<Book<ScopeKey, (u64, i64)>>,
    /// cooldown level → until.
    cooldowns: Mutex<HashMap<String, i64>>,
}

/// The grants and releases behind `tollgate.tokens.outstanding`, as two
/// logs settled at collection: a Lease appends its grant and a Release its
/// lease id's hash. A map of live leases cost each Lease a probe at a
/// random place of a table of up to [`MAX_BOOK_ENTRIES`] entries, a cache
/// miss on a busy coordinator; an append writes where the last one did.
/// Each log stops growing at [`MAX_BOOK_ENTRIES`] (the gauge then
/// undercounts) until a collection settles it.
#[derive(Default)]
struct LeaseLog {
    /// SipHash under this process's random keys: a Release naming an id
    /// it was not given cannot aim at another lease.
    hash: RandomState,
    /// (id hash, priority, granted, expires at), in grant order; kept
    /// across collections while the lease is live.
    granted: Vec<(u64, Priority, u64, i64)>,
    /// Id hashes released since the last collection.
    released: Vec<u64>,
}

impl LeaseLog {
    fn grant(&mut self, id: &str, priority: Priority, granted: u64, expires_at_ms: i64) {
        if self.granted.len() < MAX_BOOK_ENTRIES {
            let id = self.hash.hash_one(id);
            self.granted.push((id, priority, granted, expires_at_ms));
        }
    }

    fn release(&mut self, id: &str) {
        if self.released.len() < MAX_BOOK_ENTRIES {
            let id = self.hash.hash_one(id);
            self.released.push(id);
        }
    }

    /// Tokens outstanding per priority at `now_ms`; forgets the leases
    /// that expired or were released, and the releases.
    fn settle(&mut self, now_ms: i64) -> [u64; 3] {
        let released: HashSet<u64> = self.released.drain(..).collect();
        self.granted
            .retain(|(id, _, _, expires)| *expires > now_ms && !released.contains(id));
        let mut sums = [0u64; 3];
        for (_, p, granted, _) in &self.granted {
            sums[p.index()] += granted;
        }
        sums
    }
}

fn priority(p: Priority) -> KeyValue {
    KeyValue::new("tollgate.priority", p.as_str())
}

impl CoordinatorMetrics {
    /// Instruments from `meter`; gauges read `clock` at collection.
    pub fn new(meter: &Meter, clock: Arc<dyn Clock>) -> Self {
        let books = Arc::new(Books::default());
        {
            let (books, clock) = (Arc::clone(&books), Arc::clone(&clock));
            meter
                .u64_observable_gauge("tollgate.tokens.outstanding")
                .with_description("Tokens in leases neither released nor expired, per priority")
                .with_unit("{token}")
                .with_callback(move |observer| {
                    let now = to_unix_ms(clock.now());
                    let sums = lock(&books.leases).settle(now);
                    for p in Priority::ALL {
                        observer.observe(sums[p.index()], &[priority(p)]);
                    }
                })
                .build();
        }
        {
            let (books, clock) = (Arc::clone(&books), Arc::clone(&clock));
            meter
                .u64_observable_gauge("tollgate.budget.remaining")
                .with_description(
                    "Retry tokens scopes could still grant, summed per priority (last lease seen)",
                )
                .with_unit("{token}")
                .with_callback(move |observer| {
                    let now = to_unix_ms(clock.now());
                    let mut sums = [0u64; 3];
                    let mut balances = lock(&books.balances);
                    balances.retain(|_, (_, at)| now - *at < BALANCE_TTL_MS);
                    for (key, (remaining, _)) in balances.iter() {
                        sums[key.priority.index()] += remaining;
                    }
                    for p in Priority::ALL {
                        observer.observe(sums[p.index()], &[priority(p)]);
                    }
                })
                .build();
        }
        {
            let books = Arc::clone(&books);
            meter
                .u64_observable_gauge("tollgate.budget.lowest")
                .with_description("The scopes nearest to exhaustion and their balance")
                .with_unit("{token}")
                .with_callback(move |observer| {
                    let balances = lock(&books.balances);
                    let mut lowest: Vec<_> = balances.iter().collect();
                    lowest.sort_by(|(a, (ra, _)), (b, (rb, _))| {
                        (ra, &a.route, a.priority).cmp(&(rb, &b.route, b.priority))
                    });
                    for (key, (remaining, _)) in lowest.into_iter().take(LOWEST_BALANCES) {
                        observer.observe(
                            *remaining,
                            &[
                                KeyValue::new(
                                    "tollgate.caller_scope",
                                    caller_scope_attr(&key.route.caller_scope),
                                ),
                                KeyValue::new("tollgate.route", key.route.route.clone()),
                                priority(key.priority),
                            ],
                        );
                    }
                })
                .build();
        }
        {
            let (books, clock) = (Arc::clone(&books), Arc::clone(&clock));
            meter
                .u64_observable_gauge("tollgate.cooldowns.active")
                .with_description("Routes and caller scopes in a cooldown now")
                .with_callback(move |observer| {
                    let now = to_unix_ms(clock.now());
                    let mut cooldowns = lock(&books.cooldowns);
                    cooldowns.retain(|_, until| *until > now);
                    observer.observe(cooldowns.len() as u64, &[]);
                })
                .build();
        }
        super::freezes::register(meter);
        let pacing = Arc::new(PacingBook::default());
        PacingBook::register(&pacing, meter, &clock);
        let mut lease_sets = Vec::with_capacity(2 * LIMITS.len() * Priority::ALL.len());
        for decision in ["denied", "granted"] {
            for limit in LIMITS {
                for p in Priority::ALL {
                    lease_sets.push(vec![
                        KeyValue::new("tollgate.decision", decision),
                        KeyValue::new("tollgate.reason", limit_str(limit)),
                        priority(p),
                    ]);
                }
            }
        }
        CoordinatorMetrics {
            leases: Tally::register(
                meter,
                "tollgate.leases",
                "Lease decisions, by decision and the reason fewer were granted",
                None,
                lease_sets,
            ),
            tokens_granted: Tally::register(
                meter,
                "tollgate.tokens.granted",
                "Retry tokens leased out, per priority",
                Some("{token}"),
                per_priority(),
            ),
            tokens_returned: Tally::register(
                meter,
                "tollgate.tokens.returned",
                "Unspent tokens given back by Release",
                Some("{token}"),
                per_priority(),
            ),
            hints: meter
                .u64_counter("tollgate.hints")
                .with_description("Reported wait hints, by form and validity")
                .build(),
            claims: meter
                .u64_counter("tollgate.hints.claims")
                .with_description(
                    "Valid hints by how their claim stood against the fleet \
                     (agreed, outlier, uncorroborated, muted) and whether the \
                     reporter is now flagged noisy",
                )
                .build(),
            slots: meter
                .u64_counter("tollgate.slots")
                .with_description("Reconsider answers, by decision")
                .build(),
            slot_delay: meter
                .f64_histogram("tollgate.slot.delay")
                .with_description("How far after the request a slot was given")
                .with_unit("s")
                .with_boundaries(vec![
                    0.0, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0,
                ])
                .build(),
            shadow: meter
                .u64_counter("tollgate.shadow")
                .with_description(
                    "Decisions a shadow policy let through, by RPC and what enforcing would have done",
                )
                .build(),
            books,
            pacing,
            clock,
        }
    }

    /// What a Report or Reconsider left of `route`'s pacing.
    pub fn pacing(&self, route: &RouteKey, view: &PacingView) {
        self.pacing
            .record(route, view, to_unix_ms(self.clock.now()));
    }

    /// A decision a shadow policy let through; `rpc` is `lease` or
    /// `reconsider`.
    pub fn shadow(&self, rpc: &'static str, shadowed: tollgate_vocab::outcome::Shadowed) {
        self.shadow.add(
            1,
            &[
                KeyValue::new("tollgate.rpc", rpc),
                KeyValue::new("tollgate.decision", shadowed.as_str()),
            ],
        );
    }

    /// A `Lease` decision.
    pub fn lease(&self, scope: &ScopeKey, grant: &Grant, lease_id: Option<&str>, now_ms: i64) {
        let granted = usize::from(grant.granted > 0);
        let set = (granted * LIMITS.len() + limit_index(grant.limit)) * Priority::ALL.len()
            + scope.priority.index();
        self.leases.add(set, 1);
        if grant.granted > 0 {
            self.tokens_granted
                .add(scope.priority.index(), u64::from(grant.granted));
        }
        if let Some(id) = lease_id.filter(|_| grant.granted > 0) {
            lock(&self.books.leases).grant(
                id,
                scope.priority,
                u64::from(grant.granted),
                grant.expires_at_ms,
            );
        }
        lock(&self.books.balances).set(
            scope,
            || scope.clone(),
            (grant.remaining, now_ms),
            MAX_BOOK_ENTRIES,
        );
    }

    /// A `Release` that gave `returned` tokens back.
    pub fn release(&self, scope: &ScopeKey, lease_id: &str, returned: u32) {
        lock(&self.books.leases).release(lease_id);
        if returned > 0 {
            self.tokens_returned
                .add(scope.priority.index(), u64::from(returned));
        }
    }

    /// A reported hint, as the coordinator read it.
    pub fn hint(&self, form: &'static str, valid: bool) {
        self.hints.add(
            1,
            &[
                KeyValue::new("tollgate.hint.form", form),
                KeyValue::new("tollgate.hint.valid", valid),
            ],
        );
    }

    /// A valid hint's claim as judged against the fleet. Labelled by the
    /// verdict only, never by worker: GetScope names the noisy workers.
    pub fn claim(&self, claim: &'static str, noisy: bool) {
        self.claims.add(
            1,
            &[
                KeyValue::new("tollgate.hint.claim", claim),
                KeyValue::new("tollgate.worker.noisy", noisy),
            ],
        );
    }

    /// A cooldown raised on `level` until `until_ms`.
    pub fn cooldown(&self, level: String, until_ms: i64) {
        let mut cooldowns = lock(&self.books.cooldowns);
        if cooldowns.len() < MAX_BOOK_ENTRIES || cooldowns.contains_key(&level) {
            let until = cooldowns.entry(level).or_default();
            *until = (*until).max(until_ms);
        }
    }

    /// A `Reconsider` answer; `delay_ms` from now to the slot, if any.
    pub fn slot(&self, decision: &'static str, delay_ms: Option<i64>) {
        let attrs = [KeyValue::new("tollgate.decision", decision)];
        self.slots.add(1, &attrs);
        if let Some(delay) = delay_ms {
            self.slot_delay.record(delay.max(0) as f64 / 1000.0, &attrs);
        }
    }
}

/// The reason label of a grant.
pub fn limit_str(limit: GrantLimit) -> &'static str {
    match limit {
        GrantLimit::None => "none",
        GrantLimit::BudgetExhausted => "budget_exhausted",
        GrantLimit::FairShare => "fair_share",
        GrantLimit::Frozen => "frozen",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn outstanding_tokens_leave_when_released_or_expired() {
        let mut log = LeaseLog::default();
        log.grant("a-1", Priority::Normal, 3, 1_000);
        log.grant("a-2", Priority::Normal, 5, 2_000);
        log.grant("a-3", Priority::Critical, 7, 2_000);
        log.release("a-2");
        // A release of a lease never granted (or already gone) is dropped.
        log.release("a-9");
        assert_eq!(log.settle(500), [7, 3, 0]);
        // Settled releases stay settled; expiry is read at each collection.
        assert_eq!(log.settle(1_500), [7, 0, 0]);
        log.release("a-3");
        assert_eq!(log.settle(1_500), [0, 0, 0]);
        assert!(log.granted.is_empty() && log.released.is_empty());
    }

    #[test]
    fn a_book_keeps_the_first_key_and_the_last_value() {
        let mut book: Book<String, u64> = Book::default();
        for (value, key) in ["x", "y", "x"].into_iter().enumerate() {
            book.set(key, || key.to_owned(), value as u64, 10);
        }
        let mut entries: Vec<_> = book.iter().map(|(k, v)| (k.clone(), *v)).collect();
        entries.sort();
        assert_eq!(entries, [("x".to_owned(), 2), ("y".to_owned(), 1)]);
        // Full: a new key is not tracked, a known one still moves.
        book.set("z", || "z".to_owned(), 9, 2);
        book.set("y", || "y".to_owned(), 8, 2);
        assert_eq!(book.iter().count(), 2);
        assert!(book.iter().any(|(k, v)| k == "y" && *v == 8));
        book.retain(|k, _| k == "x");
        assert_eq!(book.iter().count(), 1);
    }
}
