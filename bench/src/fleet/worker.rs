//! `tollgate-bench worker`: one worker process of a fleet, sending intents
//! at a steady rate through `TollgateLayer` to an HTTP upstream (usually
//! `tollgate-bench upstream`), with retry budgets from a coordinator.
//!
//! It prints JSON lines: `{"link":"connected"|"degraded","at_unix_ms":t}`
//! whenever its coordinator link changes state (sampled every 10 ms; the
//! first line is the state at the start), and at the end
//! `{"worker":id,"intents":n,"outcomes":{"succeeded":n,..},"errors":n,
//! "unfinished":n,"attempts_per_s":{..}}`, where `attempts_per_s` counts
//! the attempts started in each second from the worker's start by what
//! released them: `first` (a first attempt sent at once), `coordinator` (a
//! retry woken at a coordinator's slot or answer), `alone` (a retry decided
//! without the coordinator), `paced_alone` (decided alone after the worker's
//! own pace held it back), and `held_coordinator`, `held_alone`,
//! `held_paced_alone` for first attempts a cooldown or the route's pacing
//! held, released the same ways (`at_once`: a retry with no wait before
//! it). Every attempt carries the intent's deadline in
//! `x-tollgate-deadline-unix-ms`, so the upstream can count late ones.
//!
//! With `--alone` the same worker decides alone: the same gate, policy and
//! backoff, but its coordinator link is a channel whose every connection is
//! refused, so the link is degraded from the first RPC on and every retry
//! is decided by the client crate's local path (its fallback budget,
//! throttle, pacer and local spread), as it would be with the coordinator
//! down. `tollgate-bench limiter` compares the two.

use std::collections::BTreeMap;
use std::io::Write;
use std::net::SocketAddr;
use std::time::{Duration, SystemTime};

use anyhow::Context as _;
use bytes::Bytes;
use http::Request;
use http_body_util::Full;
use hyper_util::client::legacy::Client;
use hyper_util::rt::{TokioExecutor, TokioIo};
use serde_json::json;
use tokio::net::TcpStream;
use tokio::task::JoinSet;
use tokio::time::{Instant, MissedTickBehavior};
use tollgate_client::clock::to_unix_ms;
use tollgate_client::{
    Backoff, GateError, GateReport, IntentPolicy, Jitter, LayerConfig, LinkState, Scope, Tollgate,
    WaitEvidence,
};
use tonic::transport::{Channel, Endpoint, Uri};
use tower::{ServiceBuilder, ServiceExt};

use super::{CALLER_SCOPE, DEADLINE_HEADER, ROUTE};

/// An intent still running this long after its deadline is counted as
/// unfinished: the gate must end every intent by its deadline, and the
/// process must end even if one does not.
const GRACE_AFTER_DEADLINE: Duration = Duration::from_secs(5);

/// How often the link's state is sampled for the state-change lines.
const LINK_SAMPLE: Duration = Duration::from_millis(10);

/// The gate's own backoff after a 429, as the storm's coordinated runners
/// use: the hint and the coordinator's slot do the spreading, so this only
/// floors the wait.
const BACKOFF: Backoff = Backoff {
    base: Duration::from_millis(500),
    cap: Duration::from_secs(5),
    jitter: Jitter::Full,
};

/// `tollgate-bench worker` arguments.
#[derive(Debug, Clone, clap::Args)]
pub struct WorkerArgs {
    /// The coordinator's URL.
    #[arg(long, default_value = "http://127.0.0.1:50051")]
    pub coordinator: String,
    /// The upstream's address (plain HTTP/1).
    #[arg(long)]
    pub upstream: SocketAddr,
    /// This worker's id, as the coordinator sees it.
    #[arg(long, default_value = "bench-worker")]
    pub worker_id: String,
    /// Intents started per second.
    #[arg(long, default_value_t = 20.0)]
    pub rate: f64,
    /// How long intents keep starting; the process ends when the last one
    /// has.
    #[arg(long, default_value = "10s", value_parser = humantime::parse_duration)]
    pub duration: Duration,
    /// Each intent's end-to-end deadline.
    #[arg(long, default_value = "6s", value_parser = humantime::parse_duration)]
    pub deadline: Duration,
    /// Attempts per intent, in all.
    #[arg(long, default_value_t = 6)]
    pub max_attempts: u32,
    /// The coordinator link's per-RPC timeout: how long a hung coordinator
    /// can hold a decision before the local budget takes over.
    #[arg(long, default_value = "500ms", value_parser = humantime::parse_duration)]
    pub rpc_timeout: Duration,
    /// Decide alone: no coordinator (`--coordinator` is not used); every
    /// decision comes from the client crate's local fallback path.
    #[arg(long)]
    pub alone: bool,
}

/// Runs the worker to the end and prints its lines to `out`.
pub fn run(args: &WorkerArgs, out: &mut dyn Write) -> anyhow::Result<()> {
    if !(args.rate.is_finite() && args.rate > 0.0 && args.rate <= 100_000.0) {
        anyhow::bail!("--rate: must be above 0 and at most 100000");
    }
    // The gate logs what it could not decide (an engine it misdrove, a
    // coordinator it gave up on) as warnings and errors: to stderr, so a
    // chaos run keeps them beside the figures (`RUST_LOG` for more).
    let _ = tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn")),
        )
        .with_writer(std::io::stderr)
        .try_init();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("building the tokio runtime")?;
    runtime.block_on(work(args, out))
}

/// What the intents came to.
#[derive(Debug, Default)]
struct Tally {
    intents: u64,
    outcomes: BTreeMap<&'static str, u64>,
    /// Ended with neither a response nor a gate report (a transport error
    /// the gate passed through without one).
    errors: u64,
    unfinished: u64,
    /// Attempts started per second since the worker's start, by what
    /// released them.
    released: BTreeMap<&'static str, Vec<u64>>,
}

impl Tally {
    fn count(&mut self, report: &GateReport, began: Duration) {
        *self.outcomes.entry(report.outcome.as_str()).or_default() += 1;
        let mut waited = report.held.as_ref();
        for attempt in &report.attempts {
            let by = match (attempt.record.number, waited) {
                (1, None) => "first",
                (1, Some(held)) => released_by(held, true),
                (_, Some(wait)) => released_by(wait, false),
                // A retry with no wait before it: the gate retried at once.
                (_, None) => "at_once",
            };
            let second = (began + attempt.record.start).as_secs() as usize;
            let counts = self.released.entry(by).or_default();
            if counts.len() <= second {
                counts.resize(second + 1, 0);
            }
            counts[second] += 1;
            waited = attempt.wait.as_ref();
        }
    }
}

/// A coordinator channel whose every connection is refused at once, before
/// anything is sent: the link's first RPC fails as against a coordinator
/// that is down, without a port that something else might answer on.
fn refusing_channel() -> Channel {
    let refuse = tower::service_fn(|_: Uri| async {
        Err::<TokioIo<TcpStream>, _>(std::io::Error::new(
            std::io::ErrorKind::ConnectionRefused,
            "deciding alone: no coordinator",
        ))
    });
    Endpoint::from_static("http://127.0.0.1:9").connect_with_connector_lazy(refuse)
}

/// What released an attempt, from the wait before it; `held` for a first
/// attempt a cooldown or the route's pacing held.
fn released_by(wait: &WaitEvidence, held: bool) -> &'static str {
    let by_coordinator = wait.slot.is_some() || !wait.degraded;
    match (by_coordinator, wait.paced_alone > 0, held) {
        (true, _, false) => "coordinator",
        (true, _, true) => "held_coordinator",
        (false, true, false) => "paced_alone",
        (false, true, true) => "held_paced_alone",
        (false, false, false) => "alone",
        (false, false, true) => "held_alone",
    }
}

async fn work(args: &WorkerArgs, out: &mut dyn Write) -> anyhow::Result<()> {
    let mut builder = Tollgate::connect(args.coordinator.clone(), args.worker_id.clone())
        .rpc_timeout(args.rpc_timeout);
    if args.alone {
        builder = builder.channel(refusing_channel());
    }
    let tollgate = builder.build().context("building the gate")?;
    let policy = IntentPolicy::try_new(
        args.deadline,
        args.max_attempts,
        Duration::from_secs(1).min(args.deadline),
        Duration::from_millis(10),
        BACKOFF,
        None,
    )?;
    // One scope for the whole fleet: the storm hits one route.
    let layer = tollgate.layer(LayerConfig::http(policy, |_| {
        Scope::new(CALLER_SCOPE, ROUTE)
    }));
    let client = ServiceBuilder::new()
        .layer(layer)
        .service(Client::builder(TokioExecutor::new()).build_http::<Full<Bytes>>());

    let mut tally = Tally::default();
    let mut intents = JoinSet::new();
    let mut link = None;
    let mut sample = tokio::time::interval(LINK_SAMPLE);
    let mut arrivals = tokio::time::interval(Duration::from_secs_f64(1.0 / args.rate));
    // Behind after a stall (two cores, many processes): carry on at the
    // rate rather than send the missed intents at once.
    arrivals.set_missed_tick_behavior(MissedTickBehavior::Delay);
    let started = Instant::now();
    let stop_starting = started + args.duration;
    loop {
        let starting = Instant::now() < stop_starting;
        if !starting && intents.is_empty() {
            break;
        }
        tokio::select! {
            _ = sample.tick() => {
                let now = tollgate.link_state();
                if link != Some(now) {
                    link = Some(now);
                    let state = match now {
                        LinkState::Connected => "connected",
                        LinkState::Degraded => "degraded",
                    };
                    let at = to_unix_ms(SystemTime::now());
                    writeln!(out, "{}", json!({"link": state, "at_unix_ms": at}))?;
                    out.flush()?;
                }
            }
            _ = arrivals.tick(), if starting => {
                let n = tally.intents;
                tally.intents += 1;
                let deadline = to_unix_ms(SystemTime::now() + args.deadline);
                let request = Request::get(format!("http://{}/work/{n}", args.upstream))
                    .header(DEADLINE_HEADER, deadline.to_string())
                    .body(Full::new(Bytes::new()))?;
                let client = client.clone();
                let bound = args.deadline + GRACE_AFTER_DEADLINE;
                let began = started.elapsed();
                intents.spawn(async move {
                    (began, tokio::time::timeout(bound, client.oneshot(request)).await)
                });
            }
            Some(joined) = intents.join_next() => {
                let (began, ended) = joined.context("an intent task panicked")?;
                let report = match &ended {
                    Err(_) => {
                        tally.unfinished += 1;
                        continue;
                    }
                    Ok(Ok(response)) => response.extensions().get::<GateReport>(),
                    Ok(Err(err)) => err.downcast_ref::<GateError>().map(|error| &error.report),
                };
                match report {
                    Some(report) => tally.count(report, began),
                    None => tally.errors += 1,
                }
            }
        }
    }
    // A stopped or dead coordinator must not hold the summary hostage.
    let _ = tokio::time::timeout(args.rpc_timeout * 2, tollgate.flush()).await;
    let done = json!({
        "worker": args.worker_id,
        "intents": tally.intents,
        "outcomes": tally.outcomes,
        "errors": tally.errors,
        "unfinished": tally.unfinished,
        "attempts_per_s": tally.released,
    });
    writeln!(out, "{done}")?;
    out.flush()?;
    Ok(())
}
