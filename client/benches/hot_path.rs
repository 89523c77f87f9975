//! The client's hot path, measured against tower's `TpsBudget` in the same
//! run so every result can be read as a ratio to a well-known baseline:
//!
//! - `tps_budget/deposit_withdraw`: tower's per-process budget, one deposit
//!   and one withdraw: the baseline.
//! - `local_budget/deposit_withdraw`: our own per-process fallback budget,
//!   the same two operations.
//! - `lease/try_take`: taking a token from a lease already held (one map
//!   lookup and one uncontended lock; no RPC). The lease is a real one: the
//!   coordinator of this repository, started through the tests' harness
//!   (`tests/support/`), grants it before each timed chunk.
//! - `engine/429_date_hint`: a full decision on a 429 whose `Retry-After` is
//!   an HTTP-date: classification, the one hint parser, the deadline gate and
//!   the evidence record.
//! - `parts/*`: two things `try_take` does on every call, measured alone to
//!   show what bounds it: cloning the scope into the map key (two `String`
//!   allocations) and reading the wall clock for lease expiry.
//!
//! Run with `cargo bench -p tollgate-client --bench hot_path`; see
//! `docs/benchmarks.md` for the settings used there.

#[path = "../../tests/support/mod.rs"]
mod support;

use std::hint::black_box;
use std::time::{Duration, Instant, SystemTime};

use criterion::{BatchSize, Criterion, criterion_group, criterion_main};
use rand::SeedableRng;
use rand::rngs::StdRng;
use tollgate_client::backoff::{Backoff, Jitter};
use tollgate_client::engine::{
    Intent, IntentPolicy, IntentSpec, Observation, RepetitionKind, RetryOwner,
};
use tollgate_client::fallback::LocalBudget;
use tollgate_client::lease::{LeaseCache, LeaseCacheConfig, Take};
use tollgate_client::link::{CoordinatorLink, LinkConfig};
use tollgate_client::scope::Scope;
use tollgate_proto::v1::RetryClass;
use tower::retry::budget::{Budget as _, TpsBudget};

fn budgets(c: &mut Criterion) {
    // tower's defaults (10 s window, 10 retries/s floor, 20 %), so the
    // baseline is the budget a tower user gets out of the box.
    let tps = TpsBudget::new(Duration::from_secs(10), 10, 0.2);
    c.bench_function("tps_budget/deposit_withdraw", |b| {
        b.iter(|| {
            tps.deposit();
            black_box(tps.withdraw())
        });
    });

    let mut local = LocalBudget::new(Duration::from_secs(10), 0.2, 10.0);
    let start = std::time::Instant::now();
    c.bench_function("local_budget/deposit_withdraw", |b| {
        b.iter(|| {
            // LocalBudget takes elapsed time as an argument; reading the
            // clock is part of what a caller pays, so it is measured too.
            let now = start.elapsed();
            local.deposit(now);
            black_box(local.withdraw(now))
        });
    });
}

/// Tokens asked for per lease: the most one `Lease` may want, so a chunk of
/// timed takes is as long as one lease allows.
const BATCH: u32 = tollgate::service::validate::MAX_WANT;

/// Takes timed per lease: `fresh_lease` took one, and one more is left, so
/// no timed take leaves the lease at the low-water mark (0) and queues a
/// refill: every one is the steady state of a lease with tokens to spare.
const CHUNK: u64 = BATCH as u64 - 2;

/// The bench's route. Its rule gives it the largest floor a policy allows,
/// a million retries a second whatever the traffic: ten million over the
/// 10 s window, of which the normal class may spend 0.8, at 2 per throttled
/// retry: four million tokens, so every lease of `BATCH` is granted in full.
const ROUTE: &str = "GET /items/{id}";
const POLICY: &str = r#"
[[rule]]
route = "GET /items/{id}"
window = "10s"
lease_ttl = "10s"
min_retries_per_sec = 1000000
"#;

/// How far the coordinator's clock moves before each lease: past the
/// window, so the budget no longer counts what earlier leases spent, and
/// past the lease TTL, so the route's earlier leases have expired (a route
/// keeps a bounded number outstanding).
const PAST_WINDOW: Duration = Duration::from_secs(11);

/// Untimed: spends what the cache still holds, gives the coordinator a fresh
/// budget, and waits for a new lease of `BATCH` tokens (one real `Lease`
/// RPC), one of which it takes. Panics rather than let the timed takes run
/// on anything but a held lease (the local fallback, an empty cache).
fn fresh_lease(
    runtime: &tokio::runtime::Runtime,
    coordinator: &support::Coordinator,
    cache: &LeaseCache,
    scope: &Scope,
    class: RetryClass,
) {
    while matches!(cache.try_take(scope, class), Take::Leased { .. }) {}
    coordinator.advance(PAST_WINDOW);
    // A take that outwaits the refill in flight answers `Exhausted`; the
    // refill still lands, and the next take finds it.
    let mut last = Take::Exhausted;
    for _ in 0..10 {
        last = runtime.block_on(cache.take(scope, class));
        if matches!(last, Take::Leased { .. }) {
            return;
        }
    }
    panic!("the coordinator granted no lease: the last take was {last:?}");
}

fn lease_take(c: &mut Criterion) {
    // One thread, and the coordinator, the link and the cache's background
    // task all run on it only inside `block_on`: nothing else runs while a
    // chunk is timed.
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a tokio runtime");
    let (coordinator, cache) = runtime.block_on(async {
        let coordinator = support::Coordinator::start(support::config(POLICY)).await;
        let mut link = LinkConfig::new(format!("http://{}", coordinator.addr), "bench-worker");
        // Generous, as the harness's workers: a loaded machine must not
        // degrade the link into the local fallback.
        link.rpc_timeout = Duration::from_secs(2);
        let link = CoordinatorLink::new(&link).expect("a valid endpoint");
        // The coordinator's clock, so the cache and the coordinator agree
        // on when a lease expires. A low-water mark of 0 asks for nothing
        // while the lease has a token left.
        let cache = LeaseCache::start(
            link,
            LeaseCacheConfig {
                batch: BATCH,
                low_water: 0,
                seed: Some(7),
                ..LeaseCacheConfig::default()
            },
            coordinator.clock.clone(),
        );
        (coordinator, cache)
    });
    let scope = Scope::new("tenant-bench", ROUTE);
    let class = RetryClass::Throttled;
    c.bench_function("lease/try_take", |b| {
        b.iter_custom(|iters| {
            let mut timed = Duration::ZERO;
            let mut left = iters;
            while left > 0 {
                fresh_lease(&runtime, &coordinator, &cache, &scope, class);
                let n = left.min(CHUNK);
                let start = Instant::now();
                for _ in 1..n {
                    black_box(cache.try_take(black_box(&scope), class));
                }
                let last = cache.try_take(black_box(&scope), class);
                timed += start.elapsed();
                // A lease only runs out, and nothing adds one while the
                // chunk runs: the last take from it means every take was.
                assert!(
                    matches!(last, Take::Leased { .. }),
                    "a timed take found no held lease ({last:?}): the coordinator \
                     granted fewer than the {} tokens of a chunk",
                    n + 1
                );
                left -= n;
            }
            timed
        });
    });
    c.bench_function("parts/scope_clone", |b| {
        b.iter(|| black_box((black_box(&scope).clone(), class)));
    });
    c.bench_function("parts/system_time_now", |b| {
        b.iter(|| black_box(SystemTime::now()));
    });
    drop(cache);
    runtime.block_on(coordinator.stop());
}

fn engine_decision(c: &mut Criterion) {
    let wall_at_start =
        httpdate::parse_http_date("Mon, 01 Jan 2024 12:00:00 GMT").expect("a constant date");
    let backoff = Backoff {
        base: Duration::from_millis(500),
        cap: Duration::from_secs(20),
        jitter: Jitter::Full,
    };
    let policy = IntentPolicy::try_new(
        Duration::from_secs(30),
        5,
        Duration::from_secs(2),
        Duration::from_millis(100),
        backoff,
        Some(Duration::from_secs(60)),
    )
    .expect("a constant policy");
    let spec = IntentSpec {
        intent_id: "intent-bench".to_owned(),
        repetition: RepetitionKind::Safe,
        retry_owner: RetryOwner::Here,
        wall_at_start,
        clock_trusted: true,
    };
    let template = Intent::new(spec, policy);
    // Received 200 ms in; the date asks for 5 s after the start.
    let receipt = Duration::from_millis(200);
    let observation = Observation::http(429, Some("Mon, 01 Jan 2024 12:00:05 GMT"));
    let mut rng = StdRng::seed_from_u64(7);
    c.bench_function("engine/429_date_hint", |b| {
        b.iter_batched(
            || {
                // Setup (not measured): an intent with its first attempt
                // in flight, and the response to feed it.
                let mut intent = template.clone();
                let started = intent.start_attempt(Duration::ZERO);
                debug_assert!(started.is_ok());
                (intent, observation.clone())
            },
            |(mut intent, observation)| {
                let decision = intent.on_response(receipt, observation, &mut rng);
                // Returned with the intent so its drop is not measured.
                (decision, intent)
            },
            BatchSize::SmallInput,
        );
    });
}

criterion_group!(hot_path, budgets, lease_take, engine_decision);
criterion_main!(hot_path);
