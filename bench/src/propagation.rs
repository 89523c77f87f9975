//! `tollgate-bench propagation`: how long an admin change made through one
//! replica takes to be in force on the others.
//!
//! A private `redis-server` (the test kit's) and `--replicas` real
//! `tollgate serve --store redis://…` processes on it, each started as an
//! operator starts it. Then `--changes` times: a `SetPolicy` patch of one
//! rule through one replica (each replica in turn), while the others are
//! asked for that rule (`GetPolicy`) every `--poll-interval` until they
//! answer with a `policy_version` above the one before the change.
//!
//! Why `GetPolicy`: a replica puts a policy document in force (the rules a
//! Lease is answered under) before it lets go of the lock `GetPolicy` reads
//! the document under, so the first `GetPolicy` answer carrying the new
//! version comes after the first Lease that could, and asking it takes no
//! budget and writes nothing to Redis.
//!
//! A replica's latency runs from the moment the change is sent (not from
//! its acknowledgement: the SRE's command has not returned yet, but the
//! change may already be in force elsewhere) until its first answer with
//! the new version is received, so it includes the commit, one `GetPolicy`
//! round trip and up to one poll interval of lateness. Figures are per
//! replica and over all of them: p50, p99 and max (nearest rank), and how
//! many took longer than a second. Nothing is judged unless `--max-ms` is
//! given; then a slower change makes the command fail.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};
use tokio::task::JoinSet;
use tollgate_proto::v1::{
    GetPolicyRequest, PolicyFields, SetPolicyRequest, admin_client::AdminClient,
};
use tollgate_testkit::RedisServer;
use tonic::transport::Channel;

use crate::fleet::limiter::children::{Coordinator, coordinator_bin};
use crate::storm::results::percentile;

/// The rule every change patches (`caller_scope` `*`).
const ROUTE: &str = "GET /propagation";
/// How long one replica may take before the run is an error: a replica
/// that never follows is a failure to report, not a figure.
const GIVE_UP: Duration = Duration::from_secs(30);
/// The claim the figures are counted against (README, docs/deploying.md).
const CLAIM: Duration = Duration::from_secs(1);

/// Command-line arguments of `tollgate-bench propagation`.
#[derive(Debug, Clone, clap::Args)]
pub struct PropagationArgs {
    /// Changes to make, through each replica in turn.
    #[arg(long, default_value_t = 50)]
    pub changes: u32,
    /// `tollgate serve` replicas on the one Redis, 2..=16.
    #[arg(long, default_value_t = 3)]
    pub replicas: usize,
    /// How often a replica that does not show the change yet is asked again.
    #[arg(long, default_value = "5ms", value_parser = humantime::parse_duration)]
    pub poll_interval: Duration,
    /// Fail (exit status 1) when any replica took longer than this many ms.
    #[arg(long)]
    pub max_ms: Option<f64>,
    /// Also write the report as JSON here.
    #[arg(long)]
    pub json: Option<PathBuf>,
    /// The `tollgate` binary (default: beside this one).
    #[arg(long, value_name = "PATH")]
    pub coordinator_bin: Option<PathBuf>,
}

/// One replica seeing one change.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Sighting {
    /// Which change (0-based).
    pub change: u32,
    /// The replica the change was made through.
    pub through: usize,
    /// The replica that showed it.
    pub replica: usize,
    /// From sending the change to that replica's first answer with it, ms.
    pub ms: f64,
}

/// Latency figures over a set of observations, ms.
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct Figures {
    /// Sightings counted.
    pub count: usize,
    /// Median.
    pub p50_ms: f64,
    /// 99th percentile (nearest rank: the largest but one of 100).
    pub p99_ms: f64,
    /// The slowest.
    pub max_ms: f64,
    /// Sightings slower than a second (the documented claim).
    pub over_1s: usize,
}

impl Figures {
    fn of(ms: impl Iterator<Item = f64>) -> Figures {
        let mut sorted: Vec<Duration> = ms.map(|m| Duration::from_secs_f64(m / 1e3)).collect();
        sorted.sort_unstable();
        let at = |p| percentile(&sorted, p).unwrap_or(0.0) * 1e3;
        Figures {
            count: sorted.len(),
            p50_ms: at(0.5),
            p99_ms: at(0.99),
            max_ms: at(1.0),
            over_1s: sorted.iter().filter(|d| **d > CLAIM).count(),
        }
    }
}

/// What `bench propagation` measured.
#[derive(Debug, Clone, serde::Serialize)]
pub struct PropagationReport {
    /// Changes made.
    pub changes: u32,
    /// Replicas running.
    pub replicas: usize,
    /// The poll interval, ms: the figures' resolution.
    pub poll_interval_ms: f64,
    /// How long the replica a change was made through took to acknowledge
    /// it (`SetPolicy` answered).
    pub commit: Figures,
    /// Per replica, its latency for the changes made through the others.
    pub per_replica: Vec<Figures>,
    /// Over every replica and change.
    pub all: Figures,
    /// Every observation, in order.
    pub observations: Vec<Sighting>,
}

/// Runs the benchmark and writes the table (and the JSON, with `--json`).
pub fn run(args: &PropagationArgs, out: &mut dyn Write) -> anyhow::Result<PropagationReport> {
    if args.changes == 0 || !(2..=16).contains(&args.replicas) {
        bail!("--changes must be positive and --replicas in 2..=16");
    }
    if args.poll_interval.is_zero() {
        bail!("--poll-interval must be positive");
    }
    let bin = coordinator_bin(args.coordinator_bin.as_deref())?;
    let dir = std::env::temp_dir().join(format!("tollgate-propagation-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("building the tokio runtime")?;
    let measured = runtime.block_on(measure(args, &bin, &dir));
    if measured.is_ok() {
        let _ = std::fs::remove_dir_all(&dir);
    }
    let (commits, observations) =
        measured.with_context(|| format!("the replicas' logs are in {}", dir.display()))?;
    let report = PropagationReport {
        changes: args.changes,
        replicas: args.replicas,
        poll_interval_ms: args.poll_interval.as_secs_f64() * 1e3,
        commit: Figures::of(commits.into_iter()),
        per_replica: (0..args.replicas)
            .map(|r| Figures::of(observations.iter().filter(|o| o.replica == r).map(|o| o.ms)))
            .collect(),
        all: Figures::of(observations.iter().map(|o| o.ms)),
        observations,
    };
    write_report(&report, out)?;
    if let Some(path) = &args.json {
        std::fs::write(path, serde_json::to_vec_pretty(&report)?)
            .with_context(|| format!("writing {}", path.display()))?;
    }
    Ok(report)
}

/// Starts Redis and the replicas, makes the changes; the commit times and
/// the observations.
async fn measure(
    args: &PropagationArgs,
    bin: &Path,
    dir: &Path,
) -> anyhow::Result<(Vec<f64>, Vec<Sighting>)> {
    let redis = RedisServer::start()
        .context("redis-server is not on PATH (apt-get install redis-server)")?;
    let config = dir.join("policy.toml");
    // No tokens: open dev mode, where loopback peers may call Admin.
    std::fs::write(
        &config,
        format!("[[rule]]\nroute = \"{ROUTE}\"\nretry_ratio = 0.1\n"),
    )
    .with_context(|| format!("writing {}", config.display()))?;
    let mut replicas = Vec::new();
    let mut admins = Vec::new();
    for i in 0..args.replicas {
        let log = dir.join(format!("replica-{i}.log"));
        let replica = Coordinator::start(bin, &redis.url(), Some(&config), &log).await?;
        let channel = Channel::from_shared(replica.url())?
            .timeout(Duration::from_secs(10))
            .connect()
            .await
            .with_context(|| format!("connecting to replica {i}"))?;
        admins.push(AdminClient::new(channel));
        replicas.push(replica);
    }
    let mut version = version_at(&mut admins[0].clone()).await?;
    let (mut commits, mut observations) = (Vec::new(), Vec::new());
    for change in 0..args.changes {
        let through = change as usize % args.replicas;
        let start = Instant::now();
        let mut followers = JoinSet::new();
        for (replica, admin) in admins.iter().enumerate().filter(|(r, _)| *r != through) {
            let (admin, poll, before) = (admin.clone(), args.poll_interval, version);
            followers.spawn(async move {
                let seen = until_above(admin, before, poll, start).await;
                (replica, seen)
            });
        }
        let set = SetPolicyRequest {
            caller_scope: "*".into(),
            route: ROUTE.into(),
            expected_version: version,
            fields: Some(PolicyFields {
                // Alternating, so that every change changes something.
                retry_ratio: Some(if change % 2 == 0 { 0.2 } else { 0.1 }),
                ..PolicyFields::default()
            }),
            patch: true,
            reason: format!("tollgate-bench propagation, change {change}"),
        };
        let committed = admins[through]
            .set_policy(set)
            .await
            .with_context(|| format!("change {change} through replica {through}"))?
            .into_inner();
        commits.push(start.elapsed().as_secs_f64() * 1e3);
        version = committed.policy_version;
        for (replica, seen) in followers.join_all().await {
            let (seen, after) = seen.with_context(|| format!("replica {replica}"))?;
            if seen != version {
                bail!(
                    "replica {replica} showed version {seen} for change {change}, committed as {version}"
                );
            }
            observations.push(Sighting {
                change,
                through,
                replica,
                ms: after.as_secs_f64() * 1e3,
            });
        }
    }
    drop(replicas);
    Ok((commits, observations))
}

/// The rule's `policy_version` as `admin`'s replica answers it.
async fn version_at(admin: &mut AdminClient<Channel>) -> anyhow::Result<u64> {
    let rule = admin
        .get_policy(GetPolicyRequest {
            caller_scope: "*".into(),
            route: ROUTE.into(),
        })
        .await
        .context("GetPolicy")?
        .into_inner();
    Ok(rule.policy_version)
}

/// Asks `admin` every `poll` until its version is above `before`: that
/// version, and when its answer came (since `start`).
async fn until_above(
    mut admin: AdminClient<Channel>,
    before: u64,
    poll: Duration,
    start: Instant,
) -> anyhow::Result<(u64, Duration)> {
    let mut tick = tokio::time::interval(poll);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        let seen = version_at(&mut admin).await?;
        let after = start.elapsed();
        if seen > before {
            return Ok((seen, after));
        }
        if after > GIVE_UP {
            bail!("still at version {seen} after {GIVE_UP:?}");
        }
    }
}

fn write_report(report: &PropagationReport, out: &mut dyn Write) -> anyhow::Result<()> {
    writeln!(
        out,
        "propagation: {} changes through {} replicas in turn, each replica polled every {} ms",
        report.changes, report.replicas, report.poll_interval_ms
    )?;
    writeln!(
        out,
        "{:<10} {:>7} {:>9} {:>9} {:>9} {:>8}",
        "", "changes", "p50 ms", "p99 ms", "max ms", "over 1s"
    )?;
    let mut row = |name: &str, f: &Figures| {
        writeln!(
            out,
            "{name:<10} {:>7} {:>9.1} {:>9.1} {:>9.1} {:>8}",
            f.count, f.p50_ms, f.p99_ms, f.max_ms, f.over_1s
        )
    };
    row("commit", &report.commit)?;
    for (i, figures) in report.per_replica.iter().enumerate() {
        row(&format!("replica {i}"), figures)?;
    }
    row("all", &report.all)?;
    Ok(())
}
