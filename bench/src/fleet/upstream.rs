//! `tollgate-bench upstream`: an HTTP/1 upstream stand-in with the storm
//! benchmark's capacity model, for worker *processes*.
//!
//! The model is `bench::storm`'s own `Upstream`, not a second one: a token
//! bucket refilled at C requests/s holding 100 ms of C, a full outage
//! between two instants (429 with `Retry-After` the time left in it, in
//! whole seconds, rounded up), `Retry-After: 1` when over capacity outside
//! it, and each 429 costing `--reject-cost` of a request. Times are from
//! the process's start.
//!
//! Every second it prints one JSON line for the second just ended:
//! `{"second":i,"offered":n,"served":n,"refused":n,"capacity":c,
//! "offered_per_100ms":[..10]}` (`capacity` is what the model earned in that
//! second), and after `--duration` a summary line
//! `{"summary":true,"offered":n,"served":n,"refused":n,"after_deadline":n}`,
//! then exits. An attempt carrying `x-tollgate-deadline-unix-ms` that
//! arrives at or after that instant counts as after its deadline.
//!
//! Once its listener is bound it writes one line to stderr,
//! `tollgate-bench upstream listening address=IP:PORT` ([`LISTENING`]), as
//! `tollgate serve` logs its own: given `--listen 127.0.0.1:0`, that line is
//! the only way a caller learns the port, and a port picked by binding and
//! releasing it first could be taken by another process in between.

use std::convert::Infallible;
use std::io::Write;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use anyhow::Context as _;
use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::Full;
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use serde_json::json;
use tokio::net::TcpListener;
use tokio::time::Instant;

use super::DEADLINE_HEADER;
use crate::storm::strategy::Answer;
use crate::storm::{
    BUCKET, HintStyle, Mode, StormArgs, StormConfig, StrategyKind, Truth, Upstream, VirtualWall,
};

/// What the upstream writes to stderr once bound, followed by
/// ` address=IP:PORT`, the same shape as `tollgate serve`'s line (so
/// `tests/support/process.rs` reads both).
pub const LISTENING: &str = "tollgate-bench upstream listening";

/// `tollgate-bench upstream` arguments. Seconds are decimals.
#[derive(Debug, Clone, clap::Args)]
pub struct UpstreamArgs {
    /// Where to listen (HTTP/1, plain); port 0 picks a free one, logged to
    /// stderr.
    #[arg(long, default_value = "127.0.0.1:8080")]
    pub listen: SocketAddr,
    /// Capacity C, in requests per second.
    #[arg(long, default_value_t = 200.0)]
    pub capacity: f64,
    /// When the full outage starts, from the process's start.
    #[arg(long, default_value_t = 5.0)]
    pub outage_start_s: f64,
    /// How long it lasts (0: no outage).
    #[arg(long, default_value_t = 0.0)]
    pub outage_s: f64,
    /// The fraction of a request's capacity each 429 consumes.
    #[arg(long, default_value_t = 0.3)]
    pub reject_cost: f64,
    /// How long to serve before printing the summary and exiting.
    #[arg(long, default_value = "60s", value_parser = humantime::parse_duration)]
    pub duration: Duration,
}

impl UpstreamArgs {
    /// The storm model's configuration for these arguments: only the
    /// upstream's fields matter; the rest are the storm's defaults.
    fn storm_config(&self) -> anyhow::Result<StormConfig> {
        let storm = StormArgs {
            workers: 1,
            capacity: self.capacity,
            arrival_rate: None,
            outage_start_s: self.outage_start_s,
            outage_s: self.outage_s,
            outage_capacity: 0.0,
            capacity_after: 1.0,
            penalty_extending: false,
            liar_fraction: 0.0,
            e_policy: None,
            deadline_s: 30.0,
            reject_cost: self.reject_cost,
            hint: HintStyle::Delay,
            duration_s: 60.0,
            seed: 1,
            mode: Mode::Realtime,
            out: PathBuf::from("results"),
            strategies: vec![StrategyKind::Tollgate],
            cancel_fraction: 0.0,
            max_attempts: 1,
            intents_csv: false,
        };
        Ok(StormConfig::try_new(&storm)?)
    }
}

/// Serves until `args.duration` has passed, printing one JSON line per
/// second to `out`, then the summary.
pub fn run(args: &UpstreamArgs, out: &mut dyn Write) -> anyhow::Result<()> {
    let config = args.storm_config()?;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("building the tokio runtime")?;
    runtime.block_on(serve(args, &config, out))
}

async fn serve(
    args: &UpstreamArgs,
    config: &StormConfig,
    out: &mut dyn Write,
) -> anyhow::Result<()> {
    let listener = TcpListener::bind(args.listen)
        .await
        .with_context(|| format!("binding {}", args.listen))?;
    let address = listener.local_addr().context("reading the bound address")?;
    // The clock starts as the address is told: a caller that waits for this
    // line knows the upstream's second 0 to within its own reading of it.
    let start = Instant::now();
    let mut stderr = std::io::stderr().lock();
    writeln!(stderr, "{LISTENING} address={address}")?;
    stderr.flush()?;
    drop(stderr);
    // Real time here: the wall clock only ever matters for HTTP-date hints,
    // which this stand-in does not send.
    let wall = Arc::new(VirtualWall::new(SystemTime::now(), start));
    let upstream = Arc::new(Upstream::new(config, start, wall));
    let accept = tokio::spawn(accept_loop(listener, upstream.clone()));

    let end = start + args.duration;
    let seconds = args.duration.as_secs() + u64::from(args.duration.subsec_nanos() > 0);
    let buckets_per_second = (Duration::from_secs(1).as_millis() / BUCKET.as_millis()) as usize;
    for second in 0..seconds {
        // Printed once the second is over, so its counts are final.
        tokio::time::sleep_until((start + Duration::from_secs(second + 1)).min(end)).await;
        let observed = upstream.observed();
        let from = second as usize * buckets_per_second;
        let slice = |series: &[u32]| -> Vec<u32> {
            (from..from + buckets_per_second)
                .map(|i| series.get(i).copied().unwrap_or(0))
                .collect()
        };
        let offered = slice(&observed.offered);
        let at = Duration::from_secs(second);
        let line = json!({
            "second": second,
            "offered": offered.iter().sum::<u32>(),
            "served": slice(&observed.served).iter().sum::<u32>(),
            "refused": slice(&observed.refused).iter().sum::<u32>(),
            "capacity": config.capacity_earned(at, at + Duration::from_secs(1)),
            "offered_per_100ms": offered,
        });
        writeln!(out, "{line}")?;
        out.flush()?;
    }
    accept.abort();
    let observed = upstream.observed();
    let total = |series: &[u32]| series.iter().map(|&n| u64::from(n)).sum::<u64>();
    let summary = json!({
        "summary": true,
        "offered": total(&observed.offered),
        "served": total(&observed.served),
        "refused": total(&observed.refused),
        "after_deadline": observed.after_deadline,
    });
    writeln!(out, "{summary}")?;
    out.flush()?;
    Ok(())
}

async fn accept_loop(listener: TcpListener, upstream: Arc<Upstream>) {
    while let Ok((stream, _)) = listener.accept().await {
        let upstream = upstream.clone();
        tokio::spawn(async move {
            let service = hyper::service::service_fn(move |request: Request<Incoming>| {
                let upstream = upstream.clone();
                async move { Ok::<_, Infallible>(answer(&upstream, &request).await) }
            });
            // A worker that goes away mid-request is not the upstream's error.
            let _ = hyper::server::conn::http1::Builder::new()
                .serve_connection(TokioIo::new(stream), service)
                .await;
        });
    }
}

async fn answer(upstream: &Upstream, request: &Request<Incoming>) -> Response<Full<Bytes>> {
    let truth = Truth {
        deadline: deadline(request),
        cancel_at: None,
        token_cancelled: false,
    };
    let response = match upstream.call(truth).await {
        Answer::Ok => Response::builder().status(StatusCode::OK),
        Answer::TooManyRequests { retry_after } => Response::builder()
            .status(StatusCode::TOO_MANY_REQUESTS)
            .header(http::header::RETRY_AFTER, retry_after),
    };
    response
        .body(Full::new(Bytes::new()))
        .unwrap_or_else(|_| Response::new(Full::new(Bytes::new())))
}

/// The intent's deadline as a tokio instant; far away when the attempt
/// does not say (a caller that is not one of the bench's workers).
fn deadline(request: &Request<Incoming>) -> Instant {
    let far = Instant::now() + Duration::from_secs(86_400);
    let Some(unix_ms) = request
        .headers()
        .get(DEADLINE_HEADER)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok())
    else {
        return far;
    };
    let deadline = UNIX_EPOCH + Duration::from_millis(unix_ms);
    let (now, wall) = (Instant::now(), SystemTime::now());
    match deadline.duration_since(wall) {
        Ok(left) => now + left,
        // Already past: at or before now, so the attempt counts as late.
        Err(late) => now.checked_sub(late.duration()).unwrap_or(now),
    }
}
