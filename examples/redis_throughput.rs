//! Lease throughput over loopback, in-memory store vs Redis store, in one
//! run with the same load: `cargo run --release --example redis_throughput`
//! (needs `redis-server` on PATH; it starts a private one).
//!
//! Both stores' coordinators get the same CPUs. With two or more CPUs the
//! private Redis gets the last one to itself and the example (coordinator
//! and load) the rest, in both phases: Redis runs beside the coordinator as
//! on its own host, rather than taking its CPU from the coordinator it
//! serves, which would measure how the machine splits its cores, not the
//! store. `-- --shared-cpus` leaves every process on every CPU.
//!
//! `-- --scratch-redis URL` uses a Redis started apart instead, which the
//! run FLUSHES: point it at a scratch server only, and pin it and the
//! example yourself (`taskset`) to split the CPUs the same way.
//!
//! Each store gets a fresh coordinator on `127.0.0.1:0`; `CONCURRENCY`
//! tasks over `CHANNELS` HTTP/2 connections call Lease (want 1) for `RUN`
//! after a warm-up, and the run prints calls/s and latency percentiles per
//! store, then the ratio. Two shapes: [`Shape::SPREAD`], `ROUTES` routes
//! each leased by one worker (the route's value is small, so this
//! measures the script's fixed cost), and [`Shape::FLEET`], a fleet of
//! workers sharing a few routes (every grant weighs every worker's share,
//! so this measures what the route's value costs as the fleet grows). The policy's floor
//! is high so grants never run out (every call does the full grant path),
//! and leases expire after 1 s so no route fills up with them.

use std::sync::Arc;
use std::time::{Duration, Instant};

use nix::sched::{CpuSet, sched_getaffinity, sched_setaffinity};
use nix::unistd::Pid;
use tokio::net::TcpListener;
use tokio::sync::oneshot;
use tollgate::config::Config;
use tollgate::server;
use tollgate::store::{MemoryStore, RedisOptions, RedisStore, RedisTarget, Store};
use tollgate_proto::v1::{self, budget_client::BudgetClient};
use tollgate_testkit::RedisServer;
use tonic::transport::Channel;

const CONCURRENCY: usize = 32;
const CHANNELS: usize = 4;
const ROUTES: usize = 64;
const WARMUP: Duration = Duration::from_millis(500);
const RUN: Duration = Duration::from_secs(3);

const POLICY: &str = r#"
[server]
max_concurrent_requests = 4096
[defaults]
min_retries_per_sec = 1000000
lease_ttl = "1s"
"#;

/// Which route and worker each call names.
#[derive(Clone, Copy)]
struct Shape {
    name: &'static str,
    routes: usize,
    /// 0: each task is one worker; otherwise calls cycle through this many.
    workers: usize,
}

impl Shape {
    const SPREAD: Shape = Shape {
        name: "one worker per route",
        routes: ROUTES,
        workers: 0,
    };
    const FLEET: Shape = Shape {
        name: "a fleet on few routes",
        // Enough that the leases of the last second (one per call) stay
        // under the per-route bound on either store.
        routes: 16,
        workers: 128,
    };

    /// The `i`th call of task `t`: its route and worker.
    fn call(self, i: usize, t: usize) -> (usize, usize) {
        match i.checked_div(self.workers) {
            None => (i % self.routes, t),
            Some(round) => (round % self.routes, i % self.workers),
        }
    }
}

struct Result {
    /// Calls answered OK within the measured time (the rate counts these).
    calls: usize,
    /// Calls answered with an error: a shape that trips a limit (leases
    /// per route) would otherwise look fast.
    failed: usize,
    latencies_us: Vec<u64>,
}

async fn load(store: Arc<dyn Store>, shape: Shape) -> anyhow::Result<Result> {
    let config = Config::from_toml(POLICY, |_| None)?;
    let listener = TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    let (stop, stopped) = oneshot::channel::<()>();
    let serving = tokio::spawn(server::run_tcp(
        listener,
        async {
            let _ = stopped.await;
        },
        server::Setup::new(config).store(store),
    ));
    let mut channels = Vec::new();
    for _ in 0..CHANNELS {
        channels.push(
            Channel::from_shared(format!("http://{addr}"))?
                .connect()
                .await?,
        );
    }
    let start = Instant::now();
    let measure_from = start + WARMUP;
    let end = measure_from + RUN;
    let mut tasks = Vec::new();
    for t in 0..CONCURRENCY {
        let mut client = BudgetClient::new(channels[t % CHANNELS].clone());
        tasks.push(tokio::spawn(async move {
            let (mut latencies, mut failed) = (Vec::new(), 0usize);
            let mut i = t;
            loop {
                let now = Instant::now();
                if now >= end {
                    break;
                }
                let (route, worker) = shape.call(i, t);
                let request = v1::LeaseRequest {
                    scope: Some(v1::Scope {
                        caller_scope: "bench".into(),
                        route: format!("r{route}"),
                        priority: v1::Priority::Normal.into(),
                    }),
                    worker_id: format!("w{worker}"),
                    want: 1,
                    retry_class: v1::RetryClass::Transient.into(),
                };
                let ok = client.lease(request).await.is_ok();
                if now >= measure_from {
                    if ok {
                        latencies
                            .push(u64::try_from(now.elapsed().as_micros()).unwrap_or(u64::MAX));
                    } else {
                        failed += 1;
                    }
                }
                i += CONCURRENCY;
            }
            (latencies, failed)
        }));
    }
    let (mut latencies_us, mut failed) = (Vec::new(), 0);
    for task in tasks {
        let (latencies, f) = task.await?;
        latencies_us.extend(latencies);
        failed += f;
    }
    let _ = stop.send(());
    serving.await??;
    latencies_us.sort_unstable();
    Ok(Result {
        calls: latencies_us.len(),
        failed,
        latencies_us,
    })
}

fn pct(sorted: &[u64], p: f64) -> u64 {
    if sorted.is_empty() {
        return 0;
    }
    let i = ((sorted.len() - 1) as f64 * p).round() as usize;
    sorted[i]
}

fn report(name: &str, r: &Result) -> f64 {
    let rate = r.calls as f64 / RUN.as_secs_f64();
    println!(
        "{name:<7} {rate:>9.0} calls/s   p50 {:>6} us   p99 {:>6} us   failed {}",
        pct(&r.latencies_us, 0.5),
        pct(&r.latencies_us, 0.99),
        r.failed
    );
    rate
}

/// Where the Redis comes from.
enum Redis {
    /// A private `redis-server`, on a CPU of its own unless `shared_cpus`.
    Private { shared_cpus: bool },
    /// `--scratch-redis URL`: started apart, flushed by the run.
    Scratch(String),
}

fn parse_args() -> anyhow::Result<Redis> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match args.iter().map(String::as_str).collect::<Vec<_>>()[..] {
        [] => Ok(Redis::Private { shared_cpus: false }),
        ["--shared-cpus"] => Ok(Redis::Private { shared_cpus: true }),
        ["--scratch-redis", url] => Ok(Redis::Scratch(url.to_owned())),
        _ => anyhow::bail!(
            "usage: redis_throughput [--shared-cpus | --scratch-redis URL (that Redis is flushed)]"
        ),
    }
}

/// The CPUs this thread may run on.
fn allowed_cpus() -> anyhow::Result<Vec<usize>> {
    let set = sched_getaffinity(Pid::from_raw(0))?;
    Ok((0..CpuSet::count())
        .filter(|&cpu| set.is_set(cpu).unwrap_or(false))
        .collect())
}

/// Pins this thread, and the threads and processes it starts from now on,
/// to `cpus`.
fn pin_to(cpus: &[usize]) -> anyhow::Result<()> {
    let mut set = CpuSet::new();
    for &cpu in cpus {
        set.set(cpu)?;
    }
    sched_setaffinity(Pid::from_raw(0), &set)?;
    Ok(())
}

/// Starts the private Redis; with `split`, on the last allowed CPU alone,
/// the example then pinned to the others. Called before the runtime's
/// threads exist, so they inherit the example's CPUs.
fn start_private(split: bool) -> anyhow::Result<RedisServer> {
    let cpus = allowed_cpus()?;
    let split = split && cpus.len() >= 2;
    if split {
        pin_to(&cpus[cpus.len() - 1..])?;
    }
    let Some(server) = RedisServer::start() else {
        anyhow::bail!("redis-server is not on PATH");
    };
    if split {
        let (mine, redis) = cpus.split_at(cpus.len() - 1);
        pin_to(mine)?;
        println!("CPUs: coordinator and load {mine:?}, Redis {redis:?}");
    } else {
        println!("CPUs: every process on {cpus:?}");
    }
    Ok(server)
}

fn main() -> anyhow::Result<()> {
    // A private server lives until the run ends.
    let (url, _private) = match parse_args()? {
        Redis::Scratch(url) => (url, None),
        Redis::Private { shared_cpus } => {
            let server = start_private(!shared_cpus)?;
            (server.url(), Some(server))
        }
    };
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    runtime.block_on(async {
        println!(
            "Lease over loopback: {CONCURRENCY} concurrent calls on {CHANNELS} connections, \
             {RUN:?} after {WARMUP:?} warm-up"
        );
        let client = redis::Client::open(url.as_str())?;
        let mut conn = client.get_multiplexed_async_connection().await?;
        for shape in [Shape::SPREAD, Shape::FLEET] {
            let memory = load(Arc::new(MemoryStore::new(100_000)), shape).await?;
            let redis_store =
                RedisStore::connect(RedisTarget::parse(&url)?, RedisOptions::default()).await?;
            let _: () = redis::cmd("FLUSHALL").query_async(&mut conn).await?;
            let _: () = redis::cmd("CONFIG")
                .arg("RESETSTAT")
                .query_async(&mut conn)
                .await?;
            let shared = load(Arc::new(redis_store), shape).await?;
            let workers = if shape.workers == 0 {
                (CONCURRENCY / shape.routes).max(1)
            } else {
                shape.workers
            };
            println!(
                "{}: {} routes, {} workers per route",
                shape.name, shape.routes, workers
            );
            let m = report("memory", &memory);
            let r = report("redis", &shared);
            println!("redis / memory throughput: {:.2}", r / m);
            // What one busy route costs Redis: its value (budget, workers,
            // evidence, pacing) and its live leases, kept beside it.
            let mut usage = Vec::new();
            for part in ["r", "e"] {
                let bytes: Option<u64> = redis::cmd("MEMORY")
                    .arg("USAGE")
                    .arg(format!("tollgate:{{bench|r0}}:{part}"))
                    .query_async(&mut conn)
                    .await?;
                usage.push(bytes.unwrap_or(0));
            }
            println!(
                "one route after the run (leases of the last second): \
                 value {} bytes, leases {} bytes",
                usage[0], usage[1]
            );
            // Where a call's time goes: Redis's own time per script or
            // function call.
            let stats: String = redis::cmd("INFO")
                .arg("commandstats")
                .query_async(&mut conn)
                .await?;
            for line in stats
                .lines()
                .filter(|l| l.starts_with("cmdstat_evalsha") || l.starts_with("cmdstat_fcall"))
            {
                println!("redis {line}");
            }
        }
        Ok(())
    })
}
