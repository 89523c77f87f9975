//! `tollgate-bench soak`: does the coordinator stay flat over time?
//!
//! An in-process coordinator takes an open-loop Lease/Report/Reconsider mix
//! at a fixed rate (default: half of what a short `bench rpc` measures on
//! this machine) for a long time, over scopes that churn: the set of live
//! scope ids slides forward every second, so scopes are created all the
//! time and idle ones are left for the sweeper. Every `--sample-every` the
//! process's resident memory, its open file descriptors and the p99 latency
//! of that interval are sampled.
//!
//! The coordinator evicts idle scopes after `--scope-idle-ttl` (30 s here,
//! 10 min by default in `serve`), so churn reaches a steady state — as many
//! scopes evicted as created — within the `--warmup`; samples before it are
//! shown but not judged. A leak shows as growth, so the verdict compares the
//! median of the last third of the judged samples with the median of the
//! first third (medians, because a shared machine's p99 has spikes that say
//! nothing about the coordinator): each must be within `--tolerance` (10 %)
//! — PASS or FAIL per metric and overall. Shrinking is never a failure.

use std::io::Write;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};
use hdrhistogram::Histogram;
use tokio::net::TcpListener;
use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;
use tollgate_proto::v1::{self, budget_client::BudgetClient};
use tonic::transport::Channel;

use super::memory::resident_bytes;
use super::rpc::{self, RpcArgs};

/// Longest soak accepted.
pub const MAX_DURATION: Duration = Duration::from_secs(24 * 3600);
/// Requests in flight at most: an open-loop generator must not queue
/// without bound when the server slows, or it measures its own backlog.
const MAX_IN_FLIGHT: usize = 512;
const MAX_LATENCY_US: u64 = 60_000_000;

/// Command-line arguments of `tollgate-bench soak`.
#[derive(Debug, Clone, clap::Args)]
pub struct SoakArgs {
    /// How long to run, e.g. `10m`.
    #[arg(long, default_value = "10m", value_parser = humantime::parse_duration)]
    pub duration: Duration,
    /// Requests per second; omitted: half of a 5 s `bench rpc` measurement.
    #[arg(long)]
    pub rate: Option<f64>,
    /// How often RSS, file descriptors and p99 are sampled.
    #[arg(long, default_value = "10s", value_parser = humantime::parse_duration)]
    pub sample_every: Duration,
    /// Scopes live at any instant.
    #[arg(long, default_value_t = 1000)]
    pub scopes: u32,
    /// New scope ids per second (the window of live ids slides by this).
    #[arg(long, default_value_t = 50)]
    pub churn: u32,
    /// Idle scopes are evicted after this (the coordinator sweeps every 30 s).
    #[arg(long, default_value = "30s", value_parser = humantime::parse_duration)]
    pub scope_idle_ttl: Duration,
    /// Samples taken before this are shown but not judged: the scope set is
    /// still filling up to its steady state.
    #[arg(long, default_value = "90s", value_parser = humantime::parse_duration)]
    pub warmup: Duration,
    /// Growth allowed between the first and the last third of the samples.
    #[arg(long, default_value_t = 0.10)]
    pub tolerance: f64,
    /// Also write the report as JSON here.
    #[arg(long)]
    pub json: Option<std::path::PathBuf>,
}

/// One sample.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Sample {
    /// Seconds since the start.
    pub at_s: f64,
    /// Resident memory of the process (coordinator and load generator).
    pub rss_bytes: u64,
    /// Open file descriptors of the process.
    pub open_fds: u64,
    /// p99 latency of the calls answered in this interval, µs.
    pub p99_us: u64,
    /// Calls answered OK in this interval.
    pub ok: u64,
    /// Calls answered with an error status in this interval (their codes
    /// are counted in [`SoakReport::errors_by_code`]).
    pub errors: u64,
    /// Calls not offered in this interval because `MAX_IN_FLIGHT` calls
    /// were already waiting: the server fell behind the offered rate.
    pub not_offered: u64,
}

/// The flatness verdict of one metric.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Verdict {
    /// `rss_bytes`, `open_fds` or `p99_us`.
    pub metric: &'static str,
    /// Median over the first third of the judged samples.
    pub first: f64,
    /// Median over the last third.
    pub last: f64,
    /// `last / first - 1`.
    pub growth: f64,
    /// `growth <= tolerance`.
    pub pass: bool,
}

/// What `bench soak` measured.
#[derive(Debug, Clone, serde::Serialize)]
pub struct SoakReport {
    /// The offered rate, requests per second.
    pub rate: f64,
    /// Where the rate came from (`--rate`, or half the measured maximum).
    pub rate_source: String,
    /// The samples, in order.
    pub samples: Vec<Sample>,
    /// One verdict per metric.
    pub verdicts: Vec<Verdict>,
    /// Every verdict passed.
    pub pass: bool,
    /// The error statuses of the whole run, by gRPC code: what the `errors`
    /// column counted.
    pub errors_by_code: std::collections::BTreeMap<String, u64>,
}

/// Runs the soak and writes the table (and the JSON, with `--json`).
pub fn run(args: &SoakArgs, out: &mut dyn Write) -> anyhow::Result<SoakReport> {
    if args.duration.is_zero() || args.duration > MAX_DURATION {
        bail!("--duration must be between 1ms and 24h");
    }
    if args.sample_every.is_zero() || args.scopes == 0 {
        bail!("--sample-every and --scopes must be positive");
    }
    let (rate, rate_source) = match args.rate {
        Some(r) if r.is_finite() && r > 0.0 => (r, "--rate".to_owned()),
        Some(r) => bail!("--rate must be a positive number, got {r}"),
        None => {
            let measured = rpc::run(
                &RpcArgs {
                    addr: None,
                    concurrency: 32,
                    connections: 4,
                    duration: Duration::from_secs(5),
                    mix: "lease=60,report=20,reconsider=20"
                        .parse()
                        .map_err(anyhow::Error::msg)?,
                    scopes: 1000,
                    max_requests: 50_000_000,
                    server_pid: None,
                    token: None,
                },
                &mut std::io::sink(),
            )?;
            let max = measured.coordinator.total.requests_per_s;
            (max / 2.0, format!("half of bench rpc's {max:.0}/s"))
        }
    };
    writeln!(
        out,
        "soak: {rate:.0} requests/s ({rate_source}) for {}",
        humantime::format_duration(args.duration)
    )?;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("building the tokio runtime")?;
    let (samples, errors_by_code) = runtime.block_on(soak(args, rate))?;
    let judged: Vec<Sample> = samples
        .iter()
        .filter(|s| s.at_s >= args.warmup.as_secs_f64())
        .cloned()
        .collect();
    let verdicts = verdicts(&judged, args.tolerance);
    let report = SoakReport {
        rate,
        rate_source,
        pass: !verdicts.is_empty() && verdicts.iter().all(|v| v.pass),
        samples,
        verdicts,
        errors_by_code,
    };
    write_report(&report, out)?;
    if let Some(path) = &args.json {
        std::fs::write(path, serde_json::to_vec_pretty(&report)?)
            .with_context(|| format!("writing {}", path.display()))?;
    }
    Ok(report)
}

/// Open file descriptors of this process.
pub fn open_fds() -> anyhow::Result<u64> {
    Ok(std::fs::read_dir("/proc/self/fd")
        .context("reading /proc/self/fd")?
        .count() as u64)
}

/// The error codes answered, by name.
type Codes = std::sync::Mutex<std::collections::BTreeMap<String, u64>>;

async fn soak(
    args: &SoakArgs,
    rate: f64,
) -> anyhow::Result<(Vec<Sample>, std::collections::BTreeMap<String, u64>)> {
    let listener = TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    let stop = CancellationToken::new();
    let mut config = tollgate::config::Config::default();
    config.limits.scope_idle_ttl = args.scope_idle_ttl;
    let server = tokio::spawn(tollgate::server::run_tcp(
        listener,
        stop.clone().cancelled_owned(),
        tollgate::server::Setup::new(config),
    ));
    let channel = Channel::from_shared(format!("http://{addr}"))?
        .timeout(Duration::from_secs(10))
        .connect()
        .await
        .with_context(|| format!("connecting to {addr}"))?;
    let hist = Arc::new(std::sync::Mutex::new(Histogram::<u64>::new_with_bounds(
        1,
        MAX_LATENCY_US,
        3,
    )?));
    let (ok, errors) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
    let not_offered = AtomicU64::new(0);
    let codes = Arc::new(Codes::default());
    let in_flight = Arc::new(Semaphore::new(MAX_IN_FLIGHT));
    let start = Instant::now();
    let mut samples = Vec::new();
    let mut next_sample = start + args.sample_every;
    // Issue in 1 ms batches: a timer per request would cost more than the RPC.
    let mut tick = tokio::time::interval(Duration::from_millis(1));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Burst);
    let mut issued: u64 = 0;
    while start.elapsed() < args.duration {
        tick.tick().await;
        let due = (start.elapsed().as_secs_f64() * rate) as u64;
        while issued < due {
            let Ok(permit) = Arc::clone(&in_flight).try_acquire_owned() else {
                // Saturated: this request is not offered.
                not_offered.fetch_add(1, Ordering::Relaxed);
                issued += 1;
                continue;
            };
            let scope = scope_id(issued, start.elapsed(), args);
            let mut client = BudgetClient::new(channel.clone());
            let (hist, ok, errors) = (Arc::clone(&hist), Arc::clone(&ok), Arc::clone(&errors));
            let codes = Arc::clone(&codes);
            let n = issued;
            tokio::spawn(async move {
                let began = Instant::now();
                let answered = call(&mut client, n, scope).await;
                let us = u64::try_from(began.elapsed().as_micros()).unwrap_or(u64::MAX);
                if let Ok(mut h) = hist.lock() {
                    h.saturating_record(us.clamp(1, MAX_LATENCY_US));
                }
                match answered {
                    Ok(()) => ok.fetch_add(1, Ordering::Relaxed),
                    Err(code) => {
                        if let Ok(mut codes) = codes.lock() {
                            *codes.entry(format!("{code:?}")).or_default() += 1;
                        }
                        errors.fetch_add(1, Ordering::Relaxed)
                    }
                };
                drop(permit);
            });
            issued += 1;
        }
        if Instant::now() >= next_sample {
            next_sample += args.sample_every;
            let p99 = hist.lock().map_or(0, |mut h| {
                let p = h.value_at_quantile(0.99);
                h.reset();
                p
            });
            samples.push(Sample {
                at_s: start.elapsed().as_secs_f64(),
                rss_bytes: resident_bytes()?,
                open_fds: open_fds()?,
                p99_us: p99,
                ok: ok.swap(0, Ordering::Relaxed),
                errors: errors.swap(0, Ordering::Relaxed),
                not_offered: not_offered.swap(0, Ordering::Relaxed),
            });
        }
    }
    // Every call sent is answered before the coordinator stops: stopping
    // first would cancel the calls still in flight and count them as
    // errors of the coordinator's (a Cancelled or two at the end of a
    // short soak). Each call holds a permit until it is answered.
    let _all = in_flight
        .acquire_many(u32::try_from(MAX_IN_FLIGHT).unwrap_or(u32::MAX))
        .await
        .context("the in-flight semaphore closed")?;
    stop.cancel();
    server
        .await
        .context("the in-process coordinator panicked")?
        .context("the in-process coordinator failed")?;
    let codes = codes.lock().map(|c| c.clone()).unwrap_or_default();
    Ok((samples, codes))
}

/// The scope of request `n`: one of `args.scopes` live ids, the window of
/// ids sliding forward by `args.churn` per second.
fn scope_id(n: u64, elapsed: Duration, args: &SoakArgs) -> u64 {
    elapsed.as_secs() * u64::from(args.churn) + n % u64::from(args.scopes)
}

/// One call of the mix (60 % Lease, 20 % Report, 20 % Reconsider, as
/// `bench rpc`'s default): answered OK, or the error's code.
async fn call(client: &mut BudgetClient<Channel>, n: u64, scope: u64) -> Result<(), tonic::Code> {
    let scope = Some(v1::Scope {
        caller_scope: "soak".to_owned(),
        route: format!("GET /soak/{scope}"),
        priority: v1::Priority::Normal.into(),
    });
    let worker_id = format!("soak-{}", n % 64);
    match n % 5 {
        0..=2 => client
            .lease(v1::LeaseRequest {
                scope,
                worker_id,
                want: 1,
                retry_class: v1::RetryClass::Transient.into(),
            })
            .await
            .map(drop)
            .map_err(|s| s.code()),
        3 => client
            .report(v1::ReportRequest {
                rejections: 0,
                counts_age_ms: 0,
                scope,
                worker_id,
                first_attempts: 10,
                successes: 9,
                evidence: Vec::new(),
                stated_limit: None,
            })
            .await
            .map(drop)
            .map_err(|s| s.code()),
        _ => {
            let now = rpc::now_ms();
            client
                .reconsider(v1::ReconsiderRequest {
                    scope,
                    worker_id,
                    intent_id: format!("soak-intent-{n}"),
                    not_before_unix_ms: now,
                    deadline_unix_ms: now + 30_000,
                    attempt_reserve_ms: 100,
                    first_attempt: false,
                    arriving: false,
                })
                .await
                .map(drop)
                .map_err(|s| s.code())
        }
    }
}

/// Reads one metric of a sample.
type Metric = fn(&Sample) -> u64;

/// The first third of `steady` against its last third.
pub fn verdicts(steady: &[Sample], tolerance: f64) -> Vec<Verdict> {
    let third = steady.len() / 3;
    if third == 0 {
        return Vec::new();
    }
    let median = |xs: &[Sample], f: Metric| {
        let mut v: Vec<u64> = xs.iter().map(f).collect();
        v.sort_unstable();
        v[v.len() / 2] as f64
    };
    let metrics: [(&'static str, Metric); 3] = [
        ("rss_bytes", |s| s.rss_bytes),
        ("open_fds", |s| s.open_fds),
        ("p99_us", |s| s.p99_us),
    ];
    metrics
        .into_iter()
        .map(|(metric, f)| {
            let first = median(&steady[..third], f);
            let last = median(&steady[steady.len() - third..], f);
            let growth = if first > 0.0 { last / first - 1.0 } else { 0.0 };
            Verdict {
                metric,
                first,
                last,
                growth,
                pass: growth <= tolerance,
            }
        })
        .collect()
}

fn write_report(r: &SoakReport, out: &mut dyn Write) -> std::io::Result<()> {
    writeln!(
        out,
        "{:>8} {:>10} {:>6} {:>9} {:>9} {:>7} {:>11}",
        "at_s", "rss_MiB", "fds", "p99_us", "ok", "errors", "not_offered"
    )?;
    for s in &r.samples {
        writeln!(
            out,
            "{:>8.0} {:>10.1} {:>6} {:>9} {:>9} {:>7} {:>11}",
            s.at_s,
            s.rss_bytes as f64 / (1024.0 * 1024.0),
            s.open_fds,
            s.p99_us,
            s.ok,
            s.errors,
            s.not_offered
        )?;
    }
    if !r.errors_by_code.is_empty() {
        let codes: Vec<String> = r
            .errors_by_code
            .iter()
            .map(|(code, n)| format!("{code} {n}"))
            .collect();
        writeln!(out, "errors by status: {}", codes.join(", "))?;
    }
    for v in &r.verdicts {
        writeln!(
            out,
            "{:<10} first {:>12.1} last {:>12.1} growth {:>+6.1}% {}",
            v.metric,
            v.first,
            v.last,
            v.growth * 100.0,
            if v.pass { "PASS" } else { "FAIL" }
        )?;
    }
    if r.verdicts.is_empty() {
        writeln!(
            out,
            "too few samples after the warm-up for a verdict (need 3): FAIL"
        )?;
    }
    writeln!(out, "soak: {}", if r.pass { "PASS" } else { "FAIL" })
}
