//! `tollgate-bench rpc`: how fast does the coordinator answer, and how close
//! is that to what the same server can do at all?
//!
//! N tasks share a few HTTP/2 connections (real tonic clients) and issue a
//! Lease/Report/Reconsider mix over many scopes for a fixed time; then the
//! same tasks on the same connections call `grpc.health.v1.Health/Check`
//! (served by the same process) for the same time. Health/Check does no
//! store work, so it is the ceiling the transport, tonic and the tower layers
//! allow: reporting coordinator ÷ ceiling from one run makes the number
//! comparable across machines and loads.
//!
//! Every phase is bounded both in time (`--duration`, at most
//! [`MAX_DURATION`]) and in count (`--max-requests`), and only loopback
//! addresses are accepted, so the command cannot become a load generator
//! against someone else's server.

use std::fmt;
use std::io::Write;
use std::net::SocketAddr;
use std::str::FromStr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::{Context as _, bail};
use hdrhistogram::Histogram;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use tollgate_proto::v1::{
    self, LeaseRequest, ReconsiderRequest, ReportRequest, budget_client::BudgetClient,
};
use tonic::metadata::{Ascii, MetadataValue};
use tonic::transport::Channel;
use tonic_health::pb::{HealthCheckRequest, health_client::HealthClient};

use super::cpu::Threads;

/// Longest phase accepted: a benchmark, not a soak test.
pub const MAX_DURATION: Duration = Duration::from_secs(300);
/// Slowest latency the histograms hold (µs); slower calls are clamped to it.
const MAX_LATENCY_US: u64 = 60_000_000;
/// The product's target for coordinator ÷ ceiling requests/s (and CPU per
/// call), measured with the server pinned to one core.
pub const TARGET_RATIO: f64 = 0.9;
/// The product's bound on the coordinator's p99 latency ÷ the ceiling's.
pub const TARGET_P99_RATIO: f64 = 1.5;
/// The service whose health the ceiling phase asks for: the coordinator
/// registers it, so the answer is a map lookup and no store work.
const HEALTH_SERVICE: &str = "tollgate.v1.Budget";

/// Command-line arguments of `tollgate-bench rpc`.
#[derive(Debug, Clone, clap::Args)]
pub struct RpcArgs {
    /// A running coordinator (loopback only); omitted: one is started in
    /// this process on 127.0.0.1:0 with the default config.
    #[arg(long)]
    pub addr: Option<SocketAddr>,
    /// Tasks issuing requests, each waiting for its answer before the next.
    #[arg(long, default_value_t = 32)]
    pub concurrency: usize,
    /// HTTP/2 connections the tasks share (round-robin).
    #[arg(long, default_value_t = 4)]
    pub connections: usize,
    /// How long each phase (coordinator, then ceiling) runs, e.g. `5s`.
    #[arg(long, default_value = "5s", value_parser = humantime::parse_duration)]
    pub duration: Duration,
    /// Relative weights of the coordinator's RPCs.
    #[arg(long, default_value = "lease=60,report=20,reconsider=20")]
    pub mix: Mix,
    /// Distinct scopes the requests are spread over (stay under the
    /// server's `max_scopes`, 1 000 000 by default).
    #[arg(long, default_value_t = 1000)]
    pub scopes: u32,
    /// Requests per phase at most, whatever the duration.
    #[arg(long, default_value_t = 50_000_000)]
    pub max_requests: u64,
    /// With `--addr`: the server's process id, so its CPU time per call is
    /// read from `/proc` (an in-process server's always is).
    #[arg(long, requires = "addr")]
    pub server_pid: Option<u32>,
    /// A caller token for caller scope `bench`, sent as `authorization:
    /// Bearer …` with every coordinator call. With no `--addr` the
    /// in-process coordinator gets it as its one `[[token]]`, so the same
    /// command with and without it gives the per-call cost of the token
    /// path (authentication, per-token request counts, scope quotas, ids
    /// owned by the token).
    #[arg(long)]
    pub token: Option<String>,
}

/// The weights of Lease, Report and Reconsider, as `lease=60,report=20,reconsider=20`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Mix {
    /// Weight of Lease.
    pub lease: u32,
    /// Weight of Report.
    pub report: u32,
    /// Weight of Reconsider.
    pub reconsider: u32,
}

impl FromStr for Mix {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let mut mix = Mix {
            lease: 0,
            report: 0,
            reconsider: 0,
        };
        for part in s.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            let (name, weight) = part
                .split_once('=')
                .ok_or_else(|| format!("`{part}`: expected name=weight"))?;
            let weight: u32 = weight
                .trim()
                .parse()
                .map_err(|e| format!("`{part}`: weight: {e}"))?;
            match name.trim() {
                "lease" => mix.lease = weight,
                "report" => mix.report = weight,
                "reconsider" => mix.reconsider = weight,
                other => {
                    return Err(format!("unknown RPC `{other}` (lease, report, reconsider)"));
                }
            }
        }
        let total = u64::from(mix.lease) + u64::from(mix.report) + u64::from(mix.reconsider);
        if total == 0 || total > u64::from(u32::MAX) {
            return Err("the weights must add up to between 1 and 2^32-1".to_owned());
        }
        Ok(mix)
    }
}

impl fmt::Display for Mix {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "lease={},report={},reconsider={}",
            self.lease, self.report, self.reconsider
        )
    }
}

impl Mix {
    fn total(self) -> u32 {
        self.lease + self.report + self.reconsider
    }

    /// Which RPC a uniform draw in `0..total` picks.
    fn pick(self, draw: u32) -> Op {
        if draw < self.lease {
            Op::Lease
        } else if draw < self.lease + self.report {
            Op::Report
        } else {
            Op::Reconsider
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Op {
    Lease,
    Report,
    Reconsider,
    Health,
}

impl Op {
    const COORDINATOR: [Op; 3] = [Op::Lease, Op::Report, Op::Reconsider];

    fn index(self) -> usize {
        match self {
            Op::Lease => 0,
            Op::Report => 1,
            Op::Reconsider => 2,
            Op::Health => 3,
        }
    }

    fn name(self) -> &'static str {
        match self {
            Op::Lease => "Lease",
            Op::Report => "Report",
            Op::Reconsider => "Reconsider",
            Op::Health => "Health/Check",
        }
    }
}

/// Counts and latency of one RPC (or of a whole phase).
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct OpStats {
    /// What was called.
    pub name: String,
    /// Calls answered OK.
    pub ok: u64,
    /// Calls answered with an error status (latency still recorded).
    pub errors: u64,
    /// `(ok + errors) / elapsed`.
    pub requests_per_s: f64,
    /// Latency percentiles, microseconds.
    pub p50_us: u64,
    /// 99th percentile, µs.
    pub p99_us: u64,
    /// 99.9th percentile, µs.
    pub p999_us: u64,
}

/// One phase: all its calls, then each RPC alone.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct PhaseStats {
    /// All calls of the phase.
    pub total: OpStats,
    /// Per RPC (coordinator phase only; empty for the ceiling).
    pub per_op: Vec<OpStats>,
    /// Wall time the phase ran, seconds.
    pub elapsed_s: f64,
    /// The server's CPU time (user + system, all its threads) over the
    /// phase divided by its calls, µs; `None` when it cannot be read.
    pub server_cpu_us_per_call: Option<f64>,
}

/// The result of `tollgate-bench rpc`.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct RpcReport {
    /// Where the coordinator was.
    pub addr: String,
    /// Whether it ran in this process.
    pub in_process: bool,
    /// Tasks issuing requests.
    pub concurrency: usize,
    /// HTTP/2 connections they shared.
    pub connections: usize,
    /// The Lease/Report/Reconsider mix.
    pub mix: String,
    /// The coordinator's RPCs.
    pub coordinator: PhaseStats,
    /// `grpc.health.v1.Health/Check` on the same server and connections.
    pub ceiling: PhaseStats,
    /// Coordinator requests/s ÷ ceiling requests/s.
    pub ratio: f64,
    /// Ceiling CPU per call ÷ coordinator CPU per call: how close a
    /// coordinator call is to a bare one in what it costs the server, the
    /// figure a noisy machine moves least.
    pub cpu_ratio: Option<f64>,
}

/// The threads an in-process server runs on, named so their CPU time can
/// be told from the load generator's.
const SERVER_THREADS: &str = "tollgate-serve";

/// Runs the benchmark on its own runtime and writes the report to `out`.
///
/// An in-process coordinator runs on a runtime of its own
/// (threads named `tollgate-serve`), so what it costs per call is measured apart from
/// the load generator.
pub fn run(args: &RpcArgs, out: &mut dyn Write) -> anyhow::Result<RpcReport> {
    validate(args)?;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("building the tokio runtime")?;
    let server = match args.addr {
        Some(_) => None,
        None => Some(
            tokio::runtime::Builder::new_multi_thread()
                .thread_name(SERVER_THREADS)
                .enable_all()
                .build()
                .context("building the server's runtime")?,
        ),
    };
    let report = runtime.block_on(run_async(args, server.as_ref().map(|s| s.handle())))?;
    write_report(&report, args, out).context("writing the report")?;
    Ok(report)
}

fn validate(args: &RpcArgs) -> anyhow::Result<()> {
    if args.concurrency == 0 || args.connections == 0 || args.scopes == 0 {
        bail!("--concurrency, --connections and --scopes must be at least 1");
    }
    if args.duration.is_zero() || args.duration > MAX_DURATION {
        bail!(
            "--duration must be between 1ms and {}",
            humantime::format_duration(MAX_DURATION)
        );
    }
    if let Some(addr) = args.addr
        && !addr.ip().is_loopback()
    {
        // A load generator must not be pointed at someone else's server.
        bail!("--addr must be a loopback address, got {addr}");
    }
    Ok(())
}

async fn run_async(
    args: &RpcArgs,
    server_runtime: Option<&tokio::runtime::Handle>,
) -> anyhow::Result<RpcReport> {
    let stop = CancellationToken::new();
    let (addr, server, threads) = match (args.addr, server_runtime) {
        (Some(addr), _) => (addr, None, args.server_pid.map(Threads::Process)),
        (None, None) => bail!("an in-process coordinator needs its runtime"),
        (None, Some(runtime)) => {
            // Bound here, registered with the server's runtime there.
            let listener =
                std::net::TcpListener::bind("127.0.0.1:0").context("binding 127.0.0.1:0")?;
            listener.set_nonblocking(true)?;
            let addr = listener.local_addr()?;
            let shutdown = stop.clone().cancelled_owned();
            // The ceiling's health checks carry no token, and the server
            // bounds such calls per connection and per peer; all of the
            // bench's come from one address, so lift the bound to the
            // concurrency or the ceiling would measure the bound.
            let mut config = match &args.token {
                None => tollgate::config::Config::default(),
                Some(token) => tollgate::config::Config::from_toml(
                    &format!("[[token]]\ntoken = {token:?}\ncaller_scopes = [\"bench\"]\n"),
                    |_| None,
                )
                .context("--token as the in-process coordinator's [[token]]")?,
            };
            let transport = &mut config.transport;
            transport.max_unauthenticated_calls_per_connection = transport
                .max_unauthenticated_calls_per_connection
                .max(args.concurrency);
            transport.max_unauthenticated_calls_per_ip = transport
                .max_unauthenticated_calls_per_ip
                .max(args.concurrency);
            let task = runtime.spawn(async move {
                let listener = TcpListener::from_std(listener)?;
                tollgate::server::run_tcp(listener, shutdown, tollgate::server::Setup::new(config))
                    .await
                    .map_err(anyhow::Error::from)
            });
            (addr, Some(task), Some(Threads::OwnNamed(SERVER_THREADS)))
        }
    };
    let result = measure(args, addr, threads.as_ref()).await;
    stop.cancel();
    if let Some(task) = server {
        task.await
            .context("the in-process coordinator panicked")?
            .context("the in-process coordinator failed")?;
    }
    let (coordinator, ceiling) = result?;
    let ratio = if ceiling.total.requests_per_s > 0.0 {
        coordinator.total.requests_per_s / ceiling.total.requests_per_s
    } else {
        0.0
    };
    let cpu_ratio = match (
        ceiling.server_cpu_us_per_call,
        coordinator.server_cpu_us_per_call,
    ) {
        (Some(bare), Some(call)) if call > 0.0 => Some(bare / call),
        _ => None,
    };
    Ok(RpcReport {
        addr: addr.to_string(),
        in_process: args.addr.is_none(),
        concurrency: args.concurrency,
        connections: args.connections,
        mix: args.mix.to_string(),
        coordinator,
        ceiling,
        ratio,
        cpu_ratio,
    })
}

async fn measure(
    args: &RpcArgs,
    addr: SocketAddr,
    server: Option<&Threads>,
) -> anyhow::Result<(PhaseStats, PhaseStats)> {
    let endpoint = Channel::from_shared(format!("http://{addr}"))
        .context("the coordinator's address")?
        .connect_timeout(Duration::from_secs(5))
        .timeout(Duration::from_secs(10));
    let mut channels = Vec::with_capacity(args.connections);
    for _ in 0..args.connections {
        // One `connect` per channel: each is its own HTTP/2 connection.
        let channel = endpoint
            .connect()
            .await
            .with_context(|| format!("connecting to {addr}"))?;
        channels.push(channel);
    }
    let coordinator = phase(args, &channels, false, server).await?;
    let ceiling = phase(args, &channels, true, server).await?;
    Ok((coordinator, ceiling))
}

/// What one task saw in one phase: a histogram and counts per [`Op`].
struct TaskTally {
    hist: Vec<Histogram<u64>>,
    ok: [u64; 4],
    errors: [u64; 4],
}

fn histogram() -> anyhow::Result<Histogram<u64>> {
    Histogram::new_with_bounds(1, MAX_LATENCY_US, 3).context("building a histogram")
}

impl TaskTally {
    fn new() -> anyhow::Result<Self> {
        Ok(TaskTally {
            hist: (0..4).map(|_| histogram()).collect::<Result<_, _>>()?,
            ok: [0; 4],
            errors: [0; 4],
        })
    }
}

async fn phase(
    args: &RpcArgs,
    channels: &[Channel],
    ceiling: bool,
    server: Option<&Threads>,
) -> anyhow::Result<PhaseStats> {
    let issued = Arc::new(AtomicU64::new(0));
    let bearer: Option<MetadataValue<Ascii>> = args
        .token
        .as_ref()
        .map(|t| format!("Bearer {t}").parse())
        .transpose()
        .context("--token must be printable ASCII")?;
    let cpu_before = server.and_then(Threads::cpu);
    let start = Instant::now();
    let end = start + args.duration;
    let mut tasks = tokio::task::JoinSet::new();
    for task in 0..args.concurrency {
        let channel = channels[task % channels.len()].clone();
        let issued = Arc::clone(&issued);
        let (mix, scopes, max) = (args.mix, args.scopes, args.max_requests);
        let bearer = bearer.clone();
        tasks.spawn(async move {
            let mut tally = TaskTally::new()?;
            let mut budget = BudgetClient::new(channel.clone());
            let bearer = bearer.clone();
            let mut health = HealthClient::new(channel);
            // A per-task xorshift: spreads ops and scopes without sharing
            // an RNG between tasks (which would serialise them).
            let mut rng = 0x9E37_79B9_7F4A_7C15_u64 ^ ((task as u64 + 1) << 17);
            let worker_id = format!("bench-{task}");
            while Instant::now() < end && issued.fetch_add(1, Ordering::Relaxed) < max {
                rng ^= rng << 13;
                rng ^= rng >> 7;
                rng ^= rng << 17;
                let op = if ceiling {
                    Op::Health
                } else {
                    mix.pick((rng % u64::from(mix.total())) as u32)
                };
                let scope = ((rng >> 32) % u64::from(scopes)) as u32;
                let began = Instant::now();
                let ok = call(
                    op,
                    scope,
                    &worker_id,
                    bearer.as_ref(),
                    &mut budget,
                    &mut health,
                )
                .await;
                let us = u64::try_from(began.elapsed().as_micros()).unwrap_or(u64::MAX);
                tally.hist[op.index()].saturating_record(us.clamp(1, MAX_LATENCY_US));
                if ok {
                    tally.ok[op.index()] += 1;
                } else {
                    tally.errors[op.index()] += 1;
                }
            }
            anyhow::Ok(tally)
        });
    }
    let mut merged = TaskTally::new()?;
    while let Some(joined) = tasks.join_next().await {
        let tally = joined.context("a load task panicked")??;
        for i in 0..4 {
            merged.hist[i]
                .add(&tally.hist[i])
                .context("merging histograms")?;
            merged.ok[i] += tally.ok[i];
            merged.errors[i] += tally.errors[i];
        }
    }
    let elapsed = start.elapsed().as_secs_f64();
    // Every task has its answers: the server's work for the phase is done.
    let cpu_after = server.and_then(Threads::cpu);
    let stats = |name: &str, hist: &Histogram<u64>, ok: u64, errors: u64| OpStats {
        name: name.to_owned(),
        ok,
        errors,
        requests_per_s: (ok + errors) as f64 / elapsed,
        p50_us: hist.value_at_quantile(0.50),
        p99_us: hist.value_at_quantile(0.99),
        p999_us: hist.value_at_quantile(0.999),
    };
    let ops: &[Op] = if ceiling {
        &[Op::Health]
    } else {
        &Op::COORDINATOR
    };
    let mut all = histogram()?;
    let (mut ok, mut errors) = (0, 0);
    let mut per_op = Vec::new();
    for &op in ops {
        let i = op.index();
        all.add(&merged.hist[i]).context("merging histograms")?;
        ok += merged.ok[i];
        errors += merged.errors[i];
        if !ceiling {
            per_op.push(stats(
                op.name(),
                &merged.hist[i],
                merged.ok[i],
                merged.errors[i],
            ));
        }
    }
    let name = if ceiling {
        "grpc.health.v1.Health/Check (ceiling)"
    } else {
        "coordinator (Lease/Report/Reconsider)"
    };
    let server_cpu_us_per_call = match (cpu_before, cpu_after) {
        (Some(before), Some(after)) if ok + errors > 0 => {
            Some(after.saturating_sub(before).as_secs_f64() * 1e6 / (ok + errors) as f64)
        }
        _ => None,
    };
    Ok(PhaseStats {
        total: stats(name, &all, ok, errors),
        per_op,
        elapsed_s: elapsed,
        server_cpu_us_per_call,
    })
}

fn scope_of(scope: u32) -> Option<v1::Scope> {
    Some(v1::Scope {
        caller_scope: "bench".to_owned(),
        route: format!("GET /bench/{scope}"),
        priority: v1::Priority::Normal.into(),
    })
}

pub(crate) fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
}

/// `message` as a request, carrying `bearer` when there is one.
fn bearing<T>(message: T, bearer: Option<&MetadataValue<Ascii>>) -> tonic::Request<T> {
    let mut request = tonic::Request::new(message);
    if let Some(bearer) = bearer {
        request
            .metadata_mut()
            .insert("authorization", bearer.clone());
    }
    request
}

/// Issues one call; whether it was answered OK.
async fn call(
    op: Op,
    scope: u32,
    worker_id: &str,
    bearer: Option<&MetadataValue<Ascii>>,
    budget: &mut BudgetClient<Channel>,
    health: &mut HealthClient<Channel>,
) -> bool {
    match op {
        Op::Lease => budget
            .lease(bearing(
                LeaseRequest {
                    scope: scope_of(scope),
                    worker_id: worker_id.to_owned(),
                    want: 1,
                    retry_class: v1::RetryClass::Transient.into(),
                },
                bearer,
            ))
            .await
            .is_ok(),
        Op::Report => budget
            .report(bearing(
                ReportRequest {
                    rejections: 0,
                    counts_age_ms: 0,
                    scope: scope_of(scope),
                    worker_id: worker_id.to_owned(),
                    first_attempts: 10,
                    successes: 9,
                    evidence: Vec::new(),
                    stated_limit: None,
                },
                bearer,
            ))
            .await
            .is_ok(),
        Op::Reconsider => {
            let now = now_ms();
            budget
                .reconsider(bearing(
                    ReconsiderRequest {
                        scope: scope_of(scope),
                        worker_id: worker_id.to_owned(),
                        intent_id: format!("{worker_id}-{now}"),
                        not_before_unix_ms: now,
                        deadline_unix_ms: now + 30_000,
                        attempt_reserve_ms: 100,
                        first_attempt: false,
                        arriving: false,
                    },
                    bearer,
                ))
                .await
                .is_ok()
        }
        Op::Health => health
            .check(HealthCheckRequest {
                service: HEALTH_SERVICE.to_owned(),
            })
            .await
            .is_ok(),
    }
}

fn write_row(out: &mut dyn Write, s: &OpStats) -> std::io::Result<()> {
    writeln!(
        out,
        "| {} | {} | {} | {:.0} | {} | {} | {} |",
        s.name, s.ok, s.errors, s.requests_per_s, s.p50_us, s.p99_us, s.p999_us
    )
}

fn write_report(r: &RpcReport, args: &RpcArgs, out: &mut dyn Write) -> std::io::Result<()> {
    writeln!(
        out,
        "tollgate-bench rpc: {} ({}), concurrency {} over {} HTTP/2 connections, {} per phase, {} scopes, mix {}",
        r.addr,
        match (r.in_process, args.token.is_some()) {
            (true, false) => "in-process coordinator, default config",
            (true, true) => "in-process coordinator, default config and one caller token",
            (false, false) => "external coordinator",
            (false, true) => "external coordinator, with a caller token",
        },
        r.concurrency,
        r.connections,
        humantime::format_duration(args.duration),
        args.scopes,
        r.mix
    )?;
    writeln!(
        out,
        "ceiling: grpc.health.v1.Health/Check (service \"{HEALTH_SERVICE}\") on the same server and connections, same concurrency and duration"
    )?;
    writeln!(out)?;
    writeln!(
        out,
        "| rpc | ok | errors | requests/s | p50 µs | p99 µs | p999 µs |"
    )?;
    writeln!(out, "|---|---:|---:|---:|---:|---:|---:|")?;
    write_row(out, &r.coordinator.total)?;
    for op in &r.coordinator.per_op {
        write_row(out, op)?;
    }
    write_row(out, &r.ceiling.total)?;
    writeln!(out)?;
    writeln!(
        out,
        "ratio coordinator/ceiling: {:.3} (target >= {TARGET_RATIO})",
        r.ratio
    )?;
    if r.ceiling.total.p99_us > 0 {
        writeln!(
            out,
            "p99 coordinator/ceiling: {:.2} (target <= {TARGET_P99_RATIO})",
            r.coordinator.total.p99_us as f64 / r.ceiling.total.p99_us as f64
        )?;
    }
    match (
        r.coordinator.server_cpu_us_per_call,
        r.ceiling.server_cpu_us_per_call,
    ) {
        (Some(call), Some(bare)) => writeln!(
            out,
            "server CPU per call: coordinator {call:.1} µs, ceiling {bare:.1} µs; ceiling/coordinator {}",
            r.cpu_ratio.map_or_else(
                || "— (too short to count)".to_owned(),
                |q| format!("{q:.3}")
            )
        ),
        _ => writeln!(
            out,
            "server CPU per call: not measured (an external server needs --server-pid)"
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mix_parses_and_picks_by_weight() {
        let mix: Mix = "lease=60,report=20,reconsider=20".parse().expect("valid");
        assert_eq!(mix.total(), 100);
        assert_eq!(mix.pick(0), Op::Lease);
        assert_eq!(mix.pick(59), Op::Lease);
        assert_eq!(mix.pick(60), Op::Report);
        assert_eq!(mix.pick(80), Op::Reconsider);
        assert_eq!(mix.to_string(), "lease=60,report=20,reconsider=20");
        assert!("lease=0".parse::<Mix>().is_err());
        assert!("watch=1".parse::<Mix>().is_err());
    }
}
