//! `tollgate-bench memory`: resident memory of the in-memory store per
//! scope, and what reaching `max_scopes` does to traffic.
//!
//! Two cases, each in its own store, both kept alive until the end so one
//! case never reuses memory the other freed (which would hide its growth):
//! - **live**: every scope gets one Lease (want 1) and one Report (one first
//!   attempt, one success) at the same instant — what a scope in use holds:
//!   its budget ledger with one lease, one worker and one second of counts;
//! - **idle**: the same traffic, then the sweeper's pass a window later
//!   (`Store::evict_idle` with an idle TTL that evicts nothing), in chunks so
//!   the memory compaction frees is reused by the next chunk: a scope with
//!   no activity in its window, as most of a large fleet's scopes are.
//!
//! The growth of VmRSS (`/proc/self/status`, Linux only) over each fill,
//! divided by N, is the cost of a scope including the map's own overhead and
//! the allocator's slack; that is what an operator sizing `max_scopes` needs.
//!
//! With `--traffic`, it instead drives Lease/Report traffic over `--scopes`
//! routes against a store bounded at `--max-scopes`, on a virtual clock with
//! the server's sweeper cadence, and counts what was refused and evicted:
//! the behaviour at the limit, without a network in the measurement.

use std::io::Write;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::{Context as _, bail};
use rand::{RngExt as _, SeedableRng as _};

use tollgate::budget::GrantAsk;
use tollgate::policy::Policy;
use tollgate::scope::{Priority, RetryClass, ScopeKey};
use tollgate::store::{MemoryStore, ReportBatch, ScopeCounts, Store, StoreError, Tenant};

/// Command-line arguments of `tollgate-bench memory`.
#[derive(Debug, Clone, clap::Args)]
pub struct MemoryArgs {
    /// Scopes to create (with `--traffic`: routes the traffic spreads over).
    #[arg(long, default_value_t = 1_000_000)]
    pub scopes: u32,
    /// Run traffic at the scope limit for this long (virtual time), e.g.
    /// `60s`, instead of measuring memory.
    #[arg(long, value_parser = humantime::parse_duration)]
    pub traffic: Option<Duration>,
    /// With `--traffic`: the store's bound.
    #[arg(long, default_value_t = 50_000)]
    pub max_scopes: usize,
    /// With `--traffic`: Lease and Report calls per virtual second, half each.
    #[arg(long, default_value_t = 30_000)]
    pub rate: u32,
}

/// Resident growth of one case.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct CaseReport {
    /// VmRSS before the case's store was created, bytes.
    pub rss_before: u64,
    /// VmRSS with every scope of the case in its store, bytes.
    pub rss_after: u64,
    /// `(rss_after - rss_before) / scopes`.
    pub bytes_per_scope: f64,
    /// How long the fill took, seconds.
    pub fill_s: f64,
}

/// The result of `tollgate-bench memory`.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct MemoryReport {
    /// Scopes created per case.
    pub scopes: u32,
    /// Scopes with a lease and a report in their window.
    pub live: CaseReport,
    /// Scopes with no activity in their window.
    pub idle: CaseReport,
}

/// The result of `tollgate-bench memory --traffic`.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct TrafficReport {
    /// Lease and Report calls made.
    pub calls: u64,
    /// Calls refused with `ScopeLimit`.
    pub refused: u64,
    /// The store's counts at the end.
    pub counts: ScopeCounts,
}

/// VmRSS of this process in bytes, from `/proc/self/status`.
pub fn resident_bytes() -> anyhow::Result<u64> {
    let status =
        std::fs::read_to_string("/proc/self/status").context("reading /proc/self/status")?;
    let line = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .context("no VmRSS line in /proc/self/status")?;
    let kib: u64 = line
        .trim()
        .trim_end_matches("kB")
        .trim()
        .parse()
        .context("parsing VmRSS")?;
    Ok(kib * 1024)
}

fn wall_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
}

fn scope(i: u32) -> ScopeKey {
    ScopeKey::new("bench", &format!("GET /bench/{i}"), Priority::Normal)
}

/// One worker's Lease then Report on `key`: what a scope in use sees.
async fn lease_and_report(
    store: &MemoryStore,
    key: &ScopeKey,
    policy: &Policy,
    now_ms: i64,
) -> [Result<(), StoreError>; 2] {
    let ask = GrantAsk {
        worker_id: "bench-worker",
        priority: key.priority,
        retry_class: RetryClass::Transient,
        want: 1,
        now_ms,
        tenant: Tenant::NONE,
    };
    let report = ReportBatch {
        rejections: 0,
        counts_age_ms: 0,
        worker_id: "bench-worker",
        first_attempts: 1,
        successes: 1,
        hints: &[],
        now_ms,
        tenant: Tenant::NONE,
        stated: None,
    };
    [
        store.lease(key, ask, policy).await.map(drop),
        store.report(key, report, policy).await.map(drop),
    ]
}

/// Fills a store with `scopes` scopes; with `idle`, compacts each chunk a
/// window later. Returns the store (kept alive by the caller) and its case.
fn fill(
    runtime: &tokio::runtime::Runtime,
    scopes: u32,
    idle: bool,
) -> anyhow::Result<(MemoryStore, CaseReport)> {
    const CHUNK: u32 = 50_000;
    let policy = Policy::default();
    let now_ms = wall_ms();
    let rss_before = resident_bytes()?;
    let started = Instant::now();
    // Room for every scope: the bound must not be what stops the fill.
    let store = MemoryStore::new(scopes as usize + 16);
    runtime.block_on(async {
        for i in 0..scopes {
            for result in lease_and_report(&store, &scope(i), &policy, now_ms).await {
                result.with_context(|| format!("scope {i}"))?;
            }
            if idle && (i % CHUNK == CHUNK - 1 || i == scopes - 1) {
                // The sweeper a window later, with an idle TTL that keeps
                // every scope: only the compaction happens.
                store.evict_idle(now_ms + 61_000, i64::MAX / 4).await?;
            }
        }
        anyhow::Ok(())
    })?;
    let fill_s = started.elapsed().as_secs_f64();
    let rss_after = resident_bytes()?;
    let case = CaseReport {
        rss_before,
        rss_after,
        bytes_per_scope: rss_after.saturating_sub(rss_before) as f64 / f64::from(scopes),
        fill_s,
    };
    Ok((store, case))
}

fn runtime() -> anyhow::Result<tokio::runtime::Runtime> {
    // A current-thread runtime: MemoryStore's futures are ready at once, and
    // worker threads would only add their stacks to the measurement.
    tokio::runtime::Builder::new_current_thread()
        .build()
        .context("building the tokio runtime")
}

/// Fills a store per case with `args.scopes` scopes and writes the report
/// to `out`.
pub fn run(args: &MemoryArgs, out: &mut dyn Write) -> anyhow::Result<MemoryReport> {
    if args.scopes == 0 {
        bail!("--scopes must be at least 1");
    }
    let runtime = runtime()?;
    let (live_store, live) = fill(&runtime, args.scopes, false)?;
    let (idle_store, idle) = fill(&runtime, args.scopes, true)?;
    let report = MemoryReport {
        scopes: args.scopes,
        live,
        idle,
    };
    // Keep both stores alive until after both measurements.
    drop((live_store, idle_store));
    write_report(&report, out).context("writing the report")?;
    Ok(report)
}

/// Drives `args.traffic` of Lease/Report traffic at the scope limit and
/// writes what was refused and evicted to `out`.
pub fn run_traffic(args: &MemoryArgs, out: &mut dyn Write) -> anyhow::Result<TrafficReport> {
    let duration = args.traffic.context("--traffic is required")?;
    if args.scopes == 0 || args.rate < 2 || args.max_scopes == 0 {
        bail!("--scopes, --max-scopes must be at least 1 and --rate at least 2");
    }
    // The server's sweeper cadence and default idle TTL.
    const SWEEP_EVERY_S: u64 = 30;
    const IDLE_TTL_MS: i64 = 600_000;
    let runtime = runtime()?;
    let policy = Policy::default();
    let store = MemoryStore::new(args.max_scopes);
    let mut rng = rand::rngs::StdRng::seed_from_u64(7);
    let t0 = wall_ms();
    let (mut calls, mut refused) = (0u64, 0u64);
    runtime.block_on(async {
        for second in 0..duration.as_secs() {
            let pairs = args.rate / 2;
            for k in 0..pairs {
                let now_ms =
                    t0 + i64::try_from(second * 1000).unwrap_or(0) + i64::from(k * 1000 / pairs);
                let key = scope(rng.random_range(0..args.scopes));
                for result in lease_and_report(&store, &key, &policy, now_ms).await {
                    calls += 1;
                    match result {
                        Ok(()) => {}
                        Err(StoreError::ScopeLimit { .. }) => refused += 1,
                        Err(err) => return Err(err),
                    }
                }
            }
            if (second + 1) % SWEEP_EVERY_S == 0 {
                let now_ms = t0 + i64::try_from((second + 1) * 1000).unwrap_or(0);
                store.evict_idle(now_ms, IDLE_TTL_MS).await?;
            }
        }
        Ok(())
    })?;
    let report = TrafficReport {
        calls,
        refused,
        counts: store.counts(),
    };
    writeln!(
        out,
        "tollgate-bench memory --traffic: {:?} of Lease+Report at {}/s over {} routes, max_scopes {}",
        duration, args.rate, args.scopes, args.max_scopes
    )?;
    writeln!(out, "calls: {}", report.calls)?;
    writeln!(
        out,
        "refused (scope limit): {} ({:.2} %)",
        report.refused,
        100.0 * report.refused as f64 / report.calls.max(1) as f64
    )?;
    let c = report.counts;
    writeln!(out, "scopes live at the end: {} of {}", c.live, c.limit)?;
    writeln!(out, "evicted to make room: {}", c.evicted_for_room)?;
    writeln!(out, "evicted idle: {}", c.evicted_idle)?;
    Ok(report)
}

fn mib(bytes: u64) -> f64 {
    bytes as f64 / (1024.0 * 1024.0)
}

fn write_case(name: &str, c: &CaseReport, out: &mut dyn Write) -> std::io::Result<()> {
    writeln!(
        out,
        "{name}: rss_before {:.1} MiB, rss_after {:.1} MiB, growth {:.1} MiB, filled in {:.2} s",
        mib(c.rss_before),
        mib(c.rss_after),
        mib(c.rss_after.saturating_sub(c.rss_before)),
        c.fill_s
    )?;
    writeln!(out, "{name} bytes_per_scope: {:.0}", c.bytes_per_scope)?;
    let projected = c.bytes_per_scope * 1_000_000.0 / (1024.0 * 1024.0 * 1024.0);
    writeln!(
        out,
        "{name} projected for 1 000 000 scopes: {projected:.3} GiB"
    )
}

/// The count the per-scope targets are stated at (the default `max_scopes`).
const TARGET_SCOPES: u64 = 1_000_000;

fn write_report(r: &MemoryReport, out: &mut dyn Write) -> std::io::Result<()> {
    writeln!(
        out,
        "tollgate-bench memory: {} scopes per case in MemoryStore (default policy, one worker)",
        r.scopes
    )?;
    if u64::from(r.scopes) < TARGET_SCOPES {
        // The hash table's buckets and the allocator's arenas come in
        // steps, so at a smaller count each scope carries more of them:
        // idle at 20 000 scopes measures about three times its figure at
        // a million (docs/benchmarks.md, Memory per scope).
        writeln!(
            out,
            "note: the targets hold at {TARGET_SCOPES} scopes; with fewer, fixed and half-empty \
             table space weighs on each scope and the figures (the idle one most) read high"
        )?;
    }
    writeln!(
        out,
        "live = one Lease and one Report in the window (target <= 1024 B per scope)"
    )?;
    write_case("live", &r.live, out)?;
    writeln!(
        out,
        "idle = no activity in the window, after the sweeper's pass (target <= 256 B per scope)"
    )?;
    write_case("idle", &r.idle, out)
}
