//! `tollgate bench memory`: resident memory of the in-memory store with N
//! scopes.
//!
//! Fills a [`MemoryStore`] with one Lease per scope (default [`Policy`]),
//! the operation a worker's first retry makes, so each scope holds what a
//! live one holds: its budget ledger, one lease and one worker's share. The
//! growth of VmRSS (`/proc/self/status`, Linux only) over the fill, divided
//! by N, is the cost of a scope including the map's own overhead and the
//! allocator's slack; that is what an operator sizing `max_scopes` needs.

use std::io::Write;
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use anyhow::{Context as _, bail};

use crate::budget::GrantAsk;
use crate::policy::Policy;
use crate::scope::{Priority, RetryClass, ScopeKey};
use crate::store::{MemoryStore, Store};

/// Command-line arguments of `tollgate bench memory`.
#[derive(Debug, Clone, clap::Args)]
pub struct MemoryArgs {
    /// Scopes to create.
    #[arg(long, default_value_t = 1_000_000)]
    pub scopes: u32,
}

/// The result of `tollgate bench memory`.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct MemoryReport {
    /// Scopes created.
    pub scopes: u32,
    /// VmRSS before the store was created, bytes.
    pub rss_before: u64,
    /// VmRSS with every scope in the store, bytes.
    pub rss_after: u64,
    /// `(rss_after - rss_before) / scopes`.
    pub bytes_per_scope: f64,
    /// How long the fill took, seconds.
    pub fill_s: f64,
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

/// Fills a store with `args.scopes` scopes and writes the report to `out`.
pub fn run(args: &MemoryArgs, out: &mut dyn Write) -> anyhow::Result<MemoryReport> {
    if args.scopes == 0 {
        bail!("--scopes must be at least 1");
    }
    // A current-thread runtime: MemoryStore's futures are ready at once, and
    // worker threads would only add their stacks to the measurement.
    let runtime = tokio::runtime::Builder::new_current_thread()
        .build()
        .context("building the tokio runtime")?;
    let policy = Policy::default();
    let now_ms = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX));
    let rss_before = resident_bytes()?;
    let started = Instant::now();
    // Room for every scope plus the one caller scope: the bound must not
    // be what stops the fill.
    let store = MemoryStore::new(args.scopes as usize + 16);
    runtime.block_on(async {
        for i in 0..args.scopes {
            let key = ScopeKey::new("bench", &format!("GET /bench/{i}"), Priority::Normal);
            let ask = GrantAsk {
                worker_id: "bench-worker",
                priority: Priority::Normal,
                retry_class: RetryClass::Transient,
                want: 1,
                now_ms,
            };
            store
                .lease(&key, ask, &policy)
                .await
                .with_context(|| format!("lease on scope {i}"))?;
        }
        anyhow::Ok(())
    })?;
    let fill_s = started.elapsed().as_secs_f64();
    let rss_after = resident_bytes()?;
    let report = MemoryReport {
        scopes: args.scopes,
        rss_before,
        rss_after,
        bytes_per_scope: rss_after.saturating_sub(rss_before) as f64 / f64::from(args.scopes),
        fill_s,
    };
    // Keep the store alive until after the measurement.
    drop(store);
    write_report(&report, out).context("writing the report")?;
    Ok(report)
}

fn mib(bytes: u64) -> f64 {
    bytes as f64 / (1024.0 * 1024.0)
}

fn write_report(r: &MemoryReport, out: &mut dyn Write) -> std::io::Result<()> {
    writeln!(
        out,
        "tollgate bench memory: {} scopes in MemoryStore (one Lease each, default policy), filled in {:.2} s",
        r.scopes, r.fill_s
    )?;
    writeln!(out, "rss_before: {:.1} MiB", mib(r.rss_before))?;
    writeln!(out, "rss_after: {:.1} MiB", mib(r.rss_after))?;
    writeln!(
        out,
        "growth: {:.1} MiB",
        mib(r.rss_after.saturating_sub(r.rss_before))
    )?;
    writeln!(out, "bytes_per_scope: {:.0}", r.bytes_per_scope)?;
    let projected = r.bytes_per_scope * 1_000_000.0 / (1024.0 * 1024.0 * 1024.0);
    writeln!(
        out,
        "projected for 1 000 000 scopes: {projected:.3} GiB (target < 1 GiB)"
    )
}
