//! The client's hot path, measured against tower's `TpsBudget` in the same
//! run so every result can be read as a ratio to a well-known baseline:
//!
//! - `tps_budget/deposit_withdraw`: tower's per-process budget, one deposit
//!   and one withdraw: the baseline.
//! - `local_budget/deposit_withdraw`: our own per-process fallback budget,
//!   the same two operations.
//! - `lease/try_take`: taking a token from a lease already held (one map
//!   lookup and one uncontended lock; no RPC).
//! - `engine/429_date_hint`: a full decision on a 429 whose `Retry-After` is
//!   an HTTP-date: classification, the one hint parser, the deadline gate and
//!   the evidence record.
//! - `parts/*`: two things `try_take` does on every call, measured alone to
//!   show what bounds it: cloning the scope into the map key (two `String`
//!   allocations) and reading the wall clock for lease expiry.
//!
//! Run with `cargo bench -p tollgate-client --bench hot_path` (the crate's
//! dev-dependency on itself turns on the `bench` feature that lets the bench
//! seed a held lease without a coordinator); see
//! `docs/benchmarks.md` for the settings used there.

use std::hint::black_box;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use criterion::{BatchSize, Criterion, criterion_group, criterion_main};
use rand::SeedableRng;
use rand::rngs::StdRng;
use tollgate_client::backoff::{Backoff, Jitter};
use tollgate_client::clock::SystemClock;
use tollgate_client::engine::{
    Intent, IntentPolicy, IntentSpec, Observation, RepetitionKind, RetryOwner,
};
use tollgate_client::fallback::LocalBudget;
use tollgate_client::lease::{LeaseCache, LeaseCacheConfig};
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

fn lease_take(c: &mut Criterion) {
    // The cache spawns its background task on start; it stays idle because
    // the seeded lease never falls to the low-water mark.
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a tokio runtime");
    let _guard = runtime.enter();
    // Nothing listens on the discard port; the link connects lazily and no
    // RPC is made while the seeded lease has tokens.
    let link = CoordinatorLink::new(&LinkConfig::new("http://127.0.0.1:9", "bench-worker"))
        .expect("a valid endpoint");
    let cache = LeaseCache::start(
        link,
        LeaseCacheConfig {
            seed: Some(7),
            ..LeaseCacheConfig::default()
        },
        Arc::new(SystemClock),
    );
    let scope = Scope::new("tenant-bench", "GET /items/{id}");
    let class = RetryClass::Throttled;
    // u32::MAX tokens outlast any measurement (billions of takes), so the
    // hot path never asks for a refill while it is being measured.
    let expires_at = SystemTime::now() + Duration::from_secs(24 * 3600);
    cache.seed_held_lease_for_bench(&scope, class, u32::MAX, expires_at);
    assert!(cache.try_take(&scope, class).admitted(), "seeded lease");
    c.bench_function("lease/try_take", |b| {
        b.iter(|| black_box(cache.try_take(black_box(&scope), class)));
    });
    c.bench_function("parts/scope_clone", |b| {
        b.iter(|| black_box((black_box(&scope).clone(), class)));
    });
    c.bench_function("parts/system_time_now", |b| {
        b.iter(|| black_box(SystemTime::now()));
    });
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
