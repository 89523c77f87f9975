//! `tollgate-bench limiter`: the worker fleet against a rate limiter nobody
//! here wrote, nginx's `limit_req`, through an outage made by reloading
//! nginx's configuration; once with a real `tollgate serve`, once with the
//! same workers deciding alone.
//!
//! nginx's `limit_req` is a leaky bucket: requests drain at R per second
//! (one every 1/R s, tracked to the millisecond), up to B may wait in the
//! bucket beyond that, and with `nodelay` (the default here; `--delay`
//! leaves it out) those B are served at once rather than spaced out;
//! anything beyond is refused with
//! `limit_req_status` (429 here). So nginx serves R/s sustained and at most
//! B more in any instant; it sends no `Retry-After` of its own, so the
//! configuration adds `Retry-After: 1` to its 429s.
//!
//! # Layout
//! - [`config`]: the limiter and outage configurations, as text.
//! - [`nginx`]: finding the binary, one running master and its reloads.
//! - [`access_log`]: nginx's access log read back, and counts per second.
//! - `children` (private): `tollgate serve` and the `tollgate-bench worker`
//!   processes; [`WorkerSummary`], what a worker printed last.
//! - [`figures`]: one run's figures, the two runs compared, the markdown.
//!
//! # How one run goes
//! ```text
//! LimiterArgs ──validate──▶ Plan
//! for coordinated, then alone, in a folder of its own:
//!   nginx (limit.conf) ── answers its nonce on a free loopback port
//!   [tollgate serve --store memory]          (coordinated only)
//!   N × tollgate-bench worker [--coordinator URL | --alone]
//!     at outage-start: outage.conf + SIGHUP; at its end: limit.conf + SIGHUP
//!     (coordinated: `tollgate scopes show` every second ──▶ scope.jsonl)
//!   workers exit ──▶ WorkerSummary; nginx stopped ──▶ access.log ──▶ RunFigures
//! Comparison ──▶ markdown (stdout, OUT/limiter.md), JSON (OUT/limiter.json)
//! ```

pub mod access_log;
pub(crate) mod children;
pub mod config;
pub mod figures;
pub mod nginx;

use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use anyhow::Context as _;
use tokio::time::Instant;
use tollgate_client::clock::to_unix_ms;

pub use children::WorkerSummary;
use children::{Coordinator, Worker, free_port};
use config::{Phase, Site};
use figures::{Comparison, RunFigures, Window};
use nginx::{Nginx, NginxError};

/// A worker still running this long after its last intent's deadline is a
/// failed run (the gate ends every intent by its deadline; the worker adds
/// 5 s of grace and a flush).
const WORKER_EXIT_MARGIN: Duration = Duration::from_secs(15);

/// nginx is started again on another port this many times when it exits at
/// start (another process took the free port first).
const NGINX_START_TRIES: usize = 3;

/// `tollgate-bench limiter` arguments.
#[derive(Debug, Clone, clap::Args)]
pub struct LimiterArgs {
    /// R: nginx's `limit_req` rate, requests per second.
    #[arg(long, default_value_t = 200)]
    pub limit: u32,
    /// B: `limit_req`'s burst (served at once: `nodelay`); 0 leaves it
    /// out, nginx's default: requests spaced at least 1/R apart.
    #[arg(long, default_value_t = 20)]
    pub burst: u32,
    /// Without `nodelay`: nginx holds requests over the rate (up to the
    /// burst) and lets them through 1/R apart, refusing only past it.
    #[arg(long)]
    pub delay: bool,
    /// Worker processes.
    #[arg(long, default_value_t = 8)]
    pub workers: u32,
    /// The fleet's first attempts per second, × R: above 1, as the
    /// upstreams users put Tollgate in front of are.
    #[arg(long, default_value_t = 1.2)]
    pub demand: f64,
    /// How long intents keep arriving; a run ends when the last has ended.
    #[arg(long, default_value = "30s", value_parser = humantime::parse_duration)]
    pub duration: Duration,
    /// Each intent's end-to-end deadline.
    #[arg(long, default_value = "10s", value_parser = humantime::parse_duration)]
    pub deadline: Duration,
    /// Attempts per intent, in all.
    #[arg(long, default_value_t = 6)]
    pub max_attempts: u32,
    /// When the outage starts, from the run's start.
    #[arg(long, default_value = "10s", value_parser = humantime::parse_duration)]
    pub outage_start: Duration,
    /// How long nginx refuses everything (0s: no outage).
    #[arg(long, default_value = "3s", value_parser = humantime::parse_duration)]
    pub outage: Duration,
    /// The nginx binary (default: `nginx` on PATH, else /usr/sbin/nginx).
    #[arg(long, value_name = "PATH")]
    pub nginx: Option<PathBuf>,
    /// The `tollgate` binary (default: beside this one).
    #[arg(long, value_name = "PATH")]
    pub coordinator_bin: Option<PathBuf>,
    /// Where `limiter.md`, `limiter.json`, both access logs and the
    /// coordinator's scope samples go.
    #[arg(long, default_value = "results")]
    pub out: PathBuf,
}

/// The validated arguments.
#[derive(Debug, Clone)]
struct Plan {
    args: LimiterArgs,
    /// Intents per second per worker.
    rate: f64,
    window: Window,
}

impl Plan {
    fn try_new(args: &LimiterArgs) -> anyhow::Result<Plan> {
        anyhow::ensure!(
            (1..=100_000).contains(&args.limit),
            "--limit: from 1 to 100000 requests/s"
        );
        anyhow::ensure!(args.burst <= 100_000, "--burst: at most 100000");
        anyhow::ensure!(
            (1..=256).contains(&args.workers),
            "--workers: from 1 to 256"
        );
        anyhow::ensure!(
            args.demand.is_finite() && args.demand > 0.0 && args.demand <= 20.0,
            "--demand: above 0 and at most 20 (× the limit)"
        );
        anyhow::ensure!(
            args.duration >= Duration::from_secs(2) && args.duration <= Duration::from_secs(3600),
            "--duration: from 2s to 1h"
        );
        anyhow::ensure!(
            args.deadline >= Duration::from_millis(100)
                && args.deadline <= Duration::from_secs(600),
            "--deadline: from 100ms to 10m"
        );
        anyhow::ensure!(
            args.outage.is_zero() || args.outage_start + args.outage <= args.duration,
            "--outage-start + --outage: within --duration"
        );
        anyhow::ensure!(
            (1..=100).contains(&args.max_attempts),
            "--max-attempts: from 1 to 100"
        );
        Ok(Plan {
            args: args.clone(),
            rate: args.demand * f64::from(args.limit) / f64::from(args.workers),
            window: Window {
                limit: args.limit,
                intents_for: args.duration,
                outage_start: args.outage_start,
                outage: args.outage,
            },
        })
    }

    /// What runs, in a line: the limiter's directive as nginx is given it
    /// ([`config::limit_req`]) and the fleet.
    fn setup(&self) -> String {
        let a = &self.args;
        let outage = if a.outage.is_zero() {
            "no outage".to_owned()
        } else {
            format!(
                "outage at {} for {}",
                humantime::format_duration(a.outage_start),
                humantime::format_duration(a.outage)
            )
        };
        format!(
            "nginx `{}` at {} r/s; {} workers; first attempts at {} × R for {}; \
             deadline {}; {outage}; at most {} attempts an intent",
            config::limit_req(a.burst, a.delay),
            a.limit,
            a.workers,
            a.demand,
            humantime::format_duration(a.duration),
            humantime::format_duration(a.deadline),
            a.max_attempts,
        )
    }

    /// The outage's `Retry-After`: its length in whole seconds, rounded up.
    fn outage_retry_after_s(&self) -> u64 {
        self.args.outage.as_millis().div_ceil(1000).max(1) as u64
    }
}

/// How the workers of a run decide.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Decided {
    Coordinated,
    Alone,
}

impl Decided {
    fn as_str(self) -> &'static str {
        match self {
            Decided::Coordinated => "coordinated",
            Decided::Alone => "alone",
        }
    }
}

/// The binaries a run starts.
#[derive(Debug)]
struct Bins {
    nginx: PathBuf,
    nginx_temp_paths: Vec<&'static str>,
    coordinator: PathBuf,
    /// This binary, for `worker`.
    bench: PathBuf,
}

/// Runs both runs, prints the markdown to `out` and writes the files;
/// returns the comparison and the files written. What it is doing, and
/// where, goes to `progress` as it goes (the CLI gives it stderr).
pub fn run(
    args: &LimiterArgs,
    out: &mut dyn Write,
    progress: &mut dyn Write,
) -> anyhow::Result<(Comparison, Vec<PathBuf>)> {
    let plan = Plan::try_new(args)?;
    let nginx = nginx::find(args.nginx.as_deref())?;
    let bench = std::env::current_exe().context("finding this binary")?;
    let coordinator = children::coordinator_bin(args.coordinator_bin.as_deref())?;
    let bins = Bins {
        nginx_temp_paths: config::temp_paths(&nginx::version_text(&nginx)?),
        nginx,
        coordinator,
        bench,
    };
    let base = std::env::temp_dir().join(format!("tollgate-limiter-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&base);
    std::fs::create_dir_all(&base).with_context(|| format!("creating {}", base.display()))?;
    writeln!(progress, "limiter: working in {}", base.display())?;

    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .context("building the tokio runtime")?;
    let comparison = runtime.block_on(async {
        let coordinated = run_once(&plan, &bins, &base, Decided::Coordinated, progress).await?;
        let alone = run_once(&plan, &bins, &base, Decided::Alone, progress).await?;
        anyhow::Ok(Comparison::new(
            plan.setup(),
            plan.window,
            coordinated,
            alone,
        ))
    })?;

    let table = comparison.markdown();
    out.write_all(table.as_bytes())?;
    let dir = &args.out;
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    let mut written = Vec::new();
    let mut write = |name: &str, bytes: &[u8]| -> anyhow::Result<()> {
        let path = dir.join(name);
        std::fs::write(&path, bytes).with_context(|| format!("writing {}", path.display()))?;
        written.push(path);
        Ok(())
    };
    write("limiter.md", table.as_bytes())?;
    write(
        "limiter.json",
        serde_json::to_string_pretty(&comparison)?.as_bytes(),
    )?;
    let copies = [
        (Decided::Coordinated, "access.log"),
        (Decided::Alone, "access.log"),
        (Decided::Coordinated, "scope.jsonl"),
    ];
    for (decided, file) in copies {
        let from = base.join(decided.as_str()).join(file);
        let bytes = std::fs::read(&from).with_context(|| format!("reading {}", from.display()))?;
        write(&format!("limiter-{}-{file}", decided.as_str()), &bytes)?;
    }
    // Kept on failure (the `?`s above return first), for its logs.
    let _ = std::fs::remove_dir_all(&base);
    Ok((comparison, written))
}

/// One run in `base/<decided>`: nginx, the coordinator if any, the
/// workers, the outage's two reloads; its figures.
async fn run_once(
    plan: &Plan,
    bins: &Bins,
    base: &Path,
    decided: Decided,
    progress: &mut dyn Write,
) -> anyhow::Result<RunFigures> {
    let dir = base.join(decided.as_str());
    let mut nginx = start_nginx(plan, bins, &dir, progress).await?;
    let coordinator = match decided {
        Decided::Coordinated => Some(
            Coordinator::start(&bins.coordinator, "memory", None, &dir.join("serve.log")).await?,
        ),
        Decided::Alone => None,
    };
    let args = &plan.args;
    let start_unix_ms = to_unix_ms(SystemTime::now());
    let started = Instant::now();
    let mut workers = Vec::new();
    for i in 0..args.workers {
        let mut worker_args = vec![
            "--upstream".to_owned(),
            format!("127.0.0.1:{}", nginx.port()),
            "--worker-id".to_owned(),
            format!("limiter-{}-{i}", decided.as_str()),
            "--rate".to_owned(),
            plan.rate.to_string(),
            "--duration".to_owned(),
            format!("{}ms", args.duration.as_millis()),
            "--deadline".to_owned(),
            format!("{}ms", args.deadline.as_millis()),
            "--max-attempts".to_owned(),
            args.max_attempts.to_string(),
        ];
        match &coordinator {
            Some(coordinator) => {
                worker_args.extend(["--coordinator".to_owned(), coordinator.url()])
            }
            None => worker_args.push("--alone".to_owned()),
        }
        let out = dir.join(format!("worker-{i}.jsonl"));
        workers.push(Worker::spawn(&bins.bench, &worker_args, out)?);
    }
    writeln!(
        progress,
        "limiter: {} run: nginx on port {}, {} workers at {:.2} intents/s each",
        decided.as_str(),
        nginx.port(),
        args.workers,
        plan.rate
    )?;

    let samples = coordinator
        .as_ref()
        .map(|c| c.sample_scope(&bins.coordinator, dir.join("scope.jsonl"), started));

    let mut reloads = Vec::new();
    if !args.outage.is_zero() {
        tokio::time::sleep_until(started + args.outage_start).await;
        reloads.push(nginx.switch(Phase::Outage).await?);
        tokio::time::sleep_until(started + args.outage_start + args.outage).await;
        reloads.push(nginx.switch(Phase::Limit).await?);
    }
    let give_up = started + args.duration + args.deadline + WORKER_EXIT_MARGIN;
    let mut summaries = Vec::new();
    for worker in workers {
        summaries.push(worker.finish(give_up).await?);
    }
    drop(samples);
    drop(coordinator);
    let log = nginx.access_log();
    nginx.stop().await;
    let text =
        std::fs::read_to_string(&log).with_context(|| format!("reading {}", log.display()))?;
    let lines = access_log::parse(&text)?;
    Ok(RunFigures::new(
        decided.as_str(),
        &plan.window,
        &lines,
        start_unix_ms,
        &summaries,
        &reloads,
    ))
}

/// nginx on a free port; on another if it exits at start (the port was
/// taken between finding it and nginx binding it).
async fn start_nginx(
    plan: &Plan,
    bins: &Bins,
    dir: &Path,
    progress: &mut dyn Write,
) -> anyhow::Result<Nginx> {
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    // Whoever created the folder is who runs nginx.
    let as_root = {
        use std::os::unix::fs::MetadataExt as _;
        std::fs::metadata(dir)?.uid() == 0
    };
    let mut tries = 0;
    loop {
        tries += 1;
        let site = Site {
            dir: dir.to_owned(),
            port: free_port()?,
            rate: plan.args.limit,
            burst: plan.args.burst,
            delay: plan.args.delay,
            outage_retry_after_s: plan.outage_retry_after_s(),
            nonce: rand::random(),
            as_root,
            temp_paths: bins.nginx_temp_paths.clone(),
        };
        match Nginx::start(&bins.nginx, site).await {
            Err(NginxError::NotReady { why, .. }) if tries < NGINX_START_TRIES => {
                writeln!(
                    progress,
                    "limiter: nginx did not start ({why}); another port"
                )?;
            }
            started => return Ok(started?),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Debug, Parser)]
    struct Cli {
        #[command(flatten)]
        args: LimiterArgs,
    }

    fn plan(extra: &[&str]) -> anyhow::Result<Plan> {
        let argv = std::iter::once("limiter").chain(extra.iter().copied());
        Plan::try_new(&Cli::try_parse_from(argv)?.args)
    }

    #[test]
    fn the_defaults_are_the_documented_run() {
        let plan = plan(&[]).expect("defaults");
        // 1.2 × 200 r/s over 8 workers.
        assert!((plan.rate - 30.0).abs() < 1e-9, "{}", plan.rate);
        assert_eq!(plan.args.deadline, Duration::from_secs(10));
        assert_eq!(plan.outage_retry_after_s(), 3);
        assert_eq!(plan.window.outage_start, Duration::from_secs(10));
    }

    #[test]
    fn a_part_second_outage_hints_the_whole_second_after() {
        let plan = plan(&["--outage", "2500ms"]).expect("valid");
        assert_eq!(plan.outage_retry_after_s(), 3);
    }

    #[test]
    fn arguments_that_cannot_describe_a_run_are_refused() {
        for bad in [
            &["--limit", "0"][..],
            &["--workers", "0"],
            &["--demand", "0"],
            &["--demand", "NaN"],
            &["--duration", "1s"],
            &["--outage-start", "29s", "--outage", "3s"],
            &["--max-attempts", "0"],
        ] {
            assert!(plan(bad).is_err(), "{bad:?}");
        }
        assert!(plan(&["--outage-start", "29s", "--outage", "0s"]).is_ok());
    }
}
