//! `tollgate-bench proxy`: what putting `tollgate proxy` in front of an
//! upstream costs a request, against a direct call in the same run.
//!
//! An upstream (a hyper server answering `200` at once), a coordinator and
//! the proxy run in this process, each on a runtime of its own, so the
//! proxy's CPU time is read from its threads alone (`/proc`). Clients are
//! hyper HTTP/1.1 connections, one per task, each waiting for its answer
//! before the next request. Four phases of `--duration` each:
//!
//! 1. direct, one task: the upstream's own latency;
//! 2. proxied, one task: the same requests through the proxy — the
//!    difference of the two is the latency the proxy adds, with nothing
//!    queued behind anything;
//! 3. direct, `--concurrency` tasks: the load generator's and upstream's
//!    ceiling on this machine;
//! 4. proxied, `--concurrency` tasks: requests per second through the proxy,
//!    and the proxy's CPU per request, hence requests per second per core.
//!
//! Every request is a first attempt that succeeds: the gate's hot path on
//! a warm scope (no token needed, counts batched to the coordinator). The
//! route is a configured template, so the scope lookup is the real one.

use std::io::Write;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};
use bytes::Bytes;
use hdrhistogram::Histogram;
use http_body_util::{BodyExt as _, Empty, Full};
use hyper_util::rt::TokioIo;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use super::cpu::Threads;

/// Longest phase accepted: a benchmark, not a soak test.
pub const MAX_DURATION: Duration = Duration::from_secs(120);
/// The product's bound on the p50 latency the proxy adds.
pub const TARGET_ADDED_P50: Duration = Duration::from_micros(100);
/// The product's floor on requests per second per core of proxy CPU.
pub const TARGET_PER_CORE: f64 = 20_000.0;
/// Slowest latency the histograms hold (µs); slower calls are clamped.
const MAX_LATENCY_US: u64 = 60_000_000;
const PROXY_THREADS: &str = "tollgate-proxy";
const OTHER_THREADS: &str = "bench-servers";

/// Command-line arguments of `tollgate-bench proxy`.
#[derive(Debug, Clone, clap::Args)]
pub struct ProxyBenchArgs {
    /// Tasks in the throughput phases, each with its own connection.
    #[arg(long, default_value_t = 16)]
    pub concurrency: usize,
    /// Length of each of the four phases.
    #[arg(long, default_value = "3s", value_parser = humantime::parse_duration)]
    pub duration: Duration,
    /// Worker threads of the proxy's runtime (the cores it may use).
    #[arg(long, default_value_t = 1)]
    pub proxy_threads: usize,
}

/// One phase's numbers.
#[derive(Debug, Clone, Default)]
pub struct PhaseStats {
    /// Requests answered `200`.
    pub ok: u64,
    /// Requests that failed or were answered otherwise.
    pub errors: u64,
    /// `ok` per second of the phase.
    pub requests_per_s: f64,
    /// Median latency, µs.
    pub p50_us: u64,
    /// 99th percentile latency, µs.
    pub p99_us: u64,
}

/// The whole run.
#[derive(Debug, Clone)]
pub struct ProxyReport {
    /// Phase 1.
    pub direct_one: PhaseStats,
    /// Phase 2.
    pub proxied_one: PhaseStats,
    /// Phase 3.
    pub direct_many: PhaseStats,
    /// Phase 4.
    pub proxied_many: PhaseStats,
    /// Phase 2's p50 less phase 1's, µs (negative is noise).
    pub added_p50_us: i64,
    /// Phase 2's p99 less phase 1's, µs.
    pub added_p99_us: i64,
    /// Phase 4's requests/s ÷ phase 3's.
    pub throughput_ratio: f64,
    /// The proxy's CPU per request in phase 4, µs (`None` without `/proc`).
    pub proxy_cpu_us_per_request: Option<f64>,
    /// 1 s ÷ that: requests per second one core of proxy serves.
    pub per_core_requests_per_s: Option<f64>,
}

/// Runs the benchmark and writes its report to `out`.
pub fn run(args: &ProxyBenchArgs, out: &mut dyn Write) -> anyhow::Result<ProxyReport> {
    if args.concurrency == 0 || args.proxy_threads == 0 {
        bail!("--concurrency and --proxy-threads must be at least 1");
    }
    if args.duration.is_zero() || args.duration > MAX_DURATION {
        bail!(
            "--duration must be between 1ms and {}",
            humantime::format_duration(MAX_DURATION)
        );
    }
    let clients = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("building the clients' runtime")?;
    let servers = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .thread_name(OTHER_THREADS)
        .enable_all()
        .build()
        .context("building the servers' runtime")?;
    let proxy = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(args.proxy_threads)
        .thread_name(PROXY_THREADS)
        .enable_all()
        .build()
        .context("building the proxy's runtime")?;
    let stop = CancellationToken::new();
    let upstream = start_upstream(servers.handle(), stop.clone())?;
    let coordinator = start_coordinator(servers.handle(), stop.clone())?;
    let proxied = start_proxy(proxy.handle(), coordinator, upstream, stop.clone())?;
    let report = clients.block_on(measure(args, upstream, proxied));
    stop.cancel();
    let report = report?;
    write_report(&report, args, out).context("writing the report")?;
    Ok(report)
}

fn start_upstream(
    runtime: &tokio::runtime::Handle,
    stop: CancellationToken,
) -> anyhow::Result<SocketAddr> {
    spawn_server(runtime, "the upstream", |listener| async move {
        let mut connections = tokio::task::JoinSet::new();
        loop {
            tokio::select! {
                () = stop.cancelled() => break,
                Ok((stream, _)) = listener.accept() => {
                    let _ = stream.set_nodelay(true);
                    connections.spawn(async move {
                        let service = hyper::service::service_fn(|_request| async {
                            Ok::<_, std::convert::Infallible>(hyper::Response::new(Full::new(
                                Bytes::from_static(b"ok\n"),
                            )))
                        });
                        let _ = hyper::server::conn::http1::Builder::new()
                            .serve_connection(TokioIo::new(stream), service)
                            .await;
                    });
                }
                Some(_) = connections.join_next(), if !connections.is_empty() => {}
            }
        }
    })
}

/// Binds `127.0.0.1:0` now, so the address is known before anything runs,
/// and serves it with `serve` on `runtime` (the listener is registered
/// there: a tokio listener belongs to the runtime that made it).
fn spawn_server<F, Fut>(
    runtime: &tokio::runtime::Handle,
    what: &str,
    serve: F,
) -> anyhow::Result<SocketAddr>
where
    F: FnOnce(TcpListener) -> Fut + Send + 'static,
    Fut: std::future::Future<Output = ()> + Send + 'static,
{
    let listener =
        std::net::TcpListener::bind("127.0.0.1:0").with_context(|| format!("binding {what}"))?;
    listener.set_nonblocking(true)?;
    let addr = listener.local_addr()?;
    runtime.spawn(async move {
        if let Ok(listener) = TcpListener::from_std(listener) {
            serve(listener).await;
        }
    });
    Ok(addr)
}

fn start_coordinator(
    runtime: &tokio::runtime::Handle,
    stop: CancellationToken,
) -> anyhow::Result<SocketAddr> {
    spawn_server(runtime, "the coordinator", |listener| async move {
        let config = tollgate::config::Config::default();
        let _ = tollgate::server::run_tcp(
            listener,
            stop.cancelled_owned(),
            tollgate::server::Setup::new(config),
        )
        .await;
    })
}

fn start_proxy(
    runtime: &tokio::runtime::Handle,
    coordinator: SocketAddr,
    upstream: SocketAddr,
    stop: CancellationToken,
) -> anyhow::Result<SocketAddr> {
    let config = tollgate::proxy::ProxyConfig::from_toml(&format!(
        r#"
[coordinator]
endpoint = "http://{coordinator}"
worker_id = "bench-proxy"

[[listener]]
name = "bench"
listen = "127.0.0.1:0"
upstream = "http://{upstream}"
caller_scope = "bench"

[[listener.route]]
route = "GET /bench/{{id}}"
"#
    ))
    .context("the proxy's file")?;
    spawn_server(runtime, "the proxy", |listener| async move {
        let setup = tollgate::proxy::Setup {
            config,
            listeners: vec![listener],
            admin: None,
            registry: None,
        };
        if let Err(err) = tollgate::proxy::run(setup, stop.cancelled_owned()).await {
            eprintln!("tollgate-bench proxy: the proxy failed: {err:#}");
        }
    })
}

async fn measure(
    args: &ProxyBenchArgs,
    upstream: SocketAddr,
    proxied: SocketAddr,
) -> anyhow::Result<ProxyReport> {
    let proxy_threads = Threads::OwnNamed(PROXY_THREADS);
    // Warm: connections, the proxy's upstream pool, the scope's view.
    phase(proxied, 2, Duration::from_millis(300), None).await?;
    let direct_one = phase(upstream, 1, args.duration, None).await?.0;
    let proxied_one = phase(proxied, 1, args.duration, None).await?.0;
    let direct_many = phase(upstream, args.concurrency, args.duration, None)
        .await?
        .0;
    let (proxied_many, cpu) = phase(
        proxied,
        args.concurrency,
        args.duration,
        Some(&proxy_threads),
    )
    .await?;
    let as_i64 = |v: u64| i64::try_from(v).unwrap_or(i64::MAX);
    let proxy_cpu_us_per_request = cpu
        .filter(|_| proxied_many.ok > 0)
        .map(|cpu| cpu.as_secs_f64() * 1e6 / proxied_many.ok as f64);
    Ok(ProxyReport {
        added_p50_us: as_i64(proxied_one.p50_us) - as_i64(direct_one.p50_us),
        added_p99_us: as_i64(proxied_one.p99_us) - as_i64(direct_one.p99_us),
        throughput_ratio: if direct_many.requests_per_s > 0.0 {
            proxied_many.requests_per_s / direct_many.requests_per_s
        } else {
            0.0
        },
        per_core_requests_per_s: proxy_cpu_us_per_request
            .filter(|us| *us > 0.0)
            .map(|us| 1e6 / us),
        proxy_cpu_us_per_request,
        direct_one,
        proxied_one,
        direct_many,
        proxied_many,
    })
}

/// `tasks` connections to `addr`, each sending `GET /bench/N` back to back
/// for `duration`; the CPU `threads` used meanwhile.
async fn phase(
    addr: SocketAddr,
    tasks: usize,
    duration: Duration,
    threads: Option<&Threads>,
) -> anyhow::Result<(PhaseStats, Option<Duration>)> {
    let cpu_before = threads.and_then(Threads::cpu);
    let start = Instant::now();
    let end = start + duration;
    let mut set = tokio::task::JoinSet::new();
    for task in 0..tasks {
        set.spawn(async move {
            let mut hist = Histogram::<u64>::new_with_bounds(1, MAX_LATENCY_US, 3)?;
            let (mut ok, mut errors) = (0u64, 0u64);
            let stream = tokio::net::TcpStream::connect(addr).await?;
            stream.set_nodelay(true)?;
            let (mut sender, connection) =
                hyper::client::conn::http1::handshake(TokioIo::new(stream)).await?;
            let driver = tokio::spawn(connection);
            let uri = format!("http://{addr}/bench/{task}");
            while Instant::now() < end {
                let request = http::Request::get(&uri)
                    .header(http::header::HOST, addr.to_string())
                    .body(Empty::<Bytes>::new())?;
                let sent = Instant::now();
                let answer = async {
                    sender.ready().await?;
                    let response = sender.send_request(request).await?;
                    let status = response.status();
                    response.into_body().collect().await?;
                    Ok::<_, hyper::Error>(status)
                }
                .await;
                match answer {
                    Ok(status) if status.is_success() => {
                        ok += 1;
                        let us = u64::try_from(sent.elapsed().as_micros()).unwrap_or(u64::MAX);
                        hist.record(us.clamp(1, MAX_LATENCY_US))?;
                    }
                    Ok(_) => errors += 1,
                    Err(_) => {
                        errors += 1;
                        break;
                    }
                }
            }
            driver.abort();
            Ok::<_, anyhow::Error>((hist, ok, errors))
        });
    }
    let mut hist = Histogram::<u64>::new_with_bounds(1, MAX_LATENCY_US, 3)?;
    let (mut ok, mut errors) = (0u64, 0u64);
    while let Some(joined) = set.join_next().await {
        let (h, o, e) = joined.context("a client task panicked")??;
        hist.add(&h)?;
        ok += o;
        errors += e;
    }
    let elapsed = start.elapsed();
    let cpu = match (cpu_before, threads.and_then(Threads::cpu)) {
        (Some(before), Some(after)) => Some(after.saturating_sub(before)),
        _ => None,
    };
    Ok((
        PhaseStats {
            ok,
            errors,
            requests_per_s: ok as f64 / elapsed.as_secs_f64(),
            p50_us: hist.value_at_quantile(0.5),
            p99_us: hist.value_at_quantile(0.99),
        },
        cpu,
    ))
}

fn write_report(
    r: &ProxyReport,
    args: &ProxyBenchArgs,
    out: &mut dyn Write,
) -> std::io::Result<()> {
    writeln!(
        out,
        "tollgate-bench proxy: {} per phase, {} task(s) in the throughput phases, proxy on {} thread(s)",
        humantime::format_duration(args.duration),
        args.concurrency,
        args.proxy_threads
    )?;
    writeln!(
        out,
        "{:<22} {:>10} {:>8} {:>12} {:>9} {:>9}",
        "phase", "ok", "errors", "req/s", "p50 µs", "p99 µs"
    )?;
    for (name, p) in [
        ("direct, 1 task", &r.direct_one),
        ("proxied, 1 task", &r.proxied_one),
        ("direct, N tasks", &r.direct_many),
        ("proxied, N tasks", &r.proxied_many),
    ] {
        writeln!(
            out,
            "{name:<22} {:>10} {:>8} {:>12.0} {:>9} {:>9}",
            p.ok, p.errors, p.requests_per_s, p.p50_us, p.p99_us
        )?;
    }
    let target_p50 = TARGET_ADDED_P50.as_micros();
    writeln!(
        out,
        "added latency: p50 {} µs (target ≤ {target_p50} µs: {}), p99 {} µs",
        r.added_p50_us,
        if r.added_p50_us <= i64::try_from(target_p50).unwrap_or(i64::MAX) {
            "met"
        } else {
            "missed"
        },
        r.added_p99_us
    )?;
    writeln!(
        out,
        "throughput: proxied ÷ direct = {:.2}",
        r.throughput_ratio
    )?;
    match (r.proxy_cpu_us_per_request, r.per_core_requests_per_s) {
        (Some(cpu), Some(per_core)) => writeln!(
            out,
            "proxy CPU: {cpu:.1} µs per request = {per_core:.0} req/s per core (target ≥ {TARGET_PER_CORE:.0}: {})",
            if per_core >= TARGET_PER_CORE {
                "met"
            } else {
                "missed"
            }
        )?,
        _ => writeln!(out, "proxy CPU: not measured (no /proc)")?,
    }
    Ok(())
}
