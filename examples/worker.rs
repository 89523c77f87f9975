//! A worker sending N intents through the gate to a small, easily overloaded
//! upstream, with retry budgets from a local coordinator.
//!
//! ```text
//! tollgate serve &                                   # listens on 127.0.0.1:50051
//! cargo run --example worker -- 127.0.0.1:50051 20   # coordinator address, intents
//! ```
//!
//! The fake upstream (hyper, on 127.0.0.1:0) serves at most four requests at
//! once and answers the rest `429 Too Many Requests` with `Retry-After: 1`.
//! The HTTP client is wrapped in `TollgateLayer`, so each 429 becomes a
//! decision: wait for the hint and a coordinator slot, take a leased token,
//! then try again — or stop and say why. With no coordinator running the
//! worker degrades to its local budget and says so.

use std::convert::Infallible;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::Full;
use hyper::body::Incoming;
use hyper_util::client::legacy::Client;
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::net::TcpListener;
use tollgate_client::{GateError, GateReport, IntentPolicy, Scope, Tollgate};
use tower::{ServiceBuilder, ServiceExt};

/// Requests the fake upstream serves at once before it sheds.
const UPSTREAM_CAPACITY: usize = 4;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let mut args = std::env::args().skip(1);
    let coordinator = args.next().unwrap_or_else(|| "127.0.0.1:50051".to_owned());
    let intents: usize = args.next().map_or(Ok(20), |n| n.parse())?;

    let upstream = fake_upstream().await?;
    println!("fake upstream on {upstream}, coordinator at {coordinator}, {intents} intents");

    let tollgate = Tollgate::connect(format!("http://{coordinator}"), "example-worker").build()?;
    // 10 s end to end, 4 attempts in all; each attempt's reserve (an even
    // share of the deadline), the backoff and the hint cap by default.
    let policy = IntentPolicy::builder(Duration::from_secs(10))
        .max_attempts(4)
        .build()?;
    let layer = tollgate.http_layer(policy, |parts| {
        // A route template, never the raw path with its ids.
        Scope::new("example-tenant", format!("{} /work/{{id}}", parts.method))
    });
    let client = ServiceBuilder::new()
        .layer(layer)
        .service(Client::builder(TokioExecutor::new()).build_http::<Full<Bytes>>());

    let mut tasks = tokio::task::JoinSet::new();
    for n in 0..intents {
        let client = client.clone();
        let uri = format!("http://{upstream}/work/{n}");
        tasks.spawn(async move {
            let request = Request::get(uri).body(Full::new(Bytes::new()))?;
            let line = match client.oneshot(request).await {
                Ok(response) => describe(n, Some(response.status()), response.extensions().get()),
                Err(err) => match err.downcast_ref::<GateError>() {
                    Some(gate_error) => describe(n, None, Some(&gate_error.report)),
                    None => format!("intent {n:>3}: error: {err}"),
                },
            };
            anyhow::Ok(line)
        });
    }
    while let Some(line) = tasks.join_next().await {
        println!("{}", line??);
    }
    println!("coordinator link: {:?}", tollgate.link_state());
    tollgate.flush().await;
    Ok(())
}

fn describe(n: usize, status: Option<StatusCode>, report: Option<&GateReport>) -> String {
    let status = status.map_or("none".to_owned(), |s| s.as_u16().to_string());
    match report {
        Some(report) => format!(
            "intent {n:>3}: {:<22} after {} attempt(s), last status {status}",
            report.outcome.as_str(),
            report.attempts.len(),
        ),
        None => format!("intent {n:>3}: last status {status} (no gate report)"),
    }
}

/// Serves until the process ends: 200 while under capacity, else 429.
async fn fake_upstream() -> anyhow::Result<std::net::SocketAddr> {
    let listener = TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    let in_flight = Arc::new(AtomicUsize::new(0));
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            let in_flight = in_flight.clone();
            tokio::spawn(async move {
                let service = hyper::service::service_fn(move |_: Request<Incoming>| {
                    let in_flight = in_flight.clone();
                    async move { Ok::<_, Infallible>(answer(&in_flight).await) }
                });
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(stream), service)
                    .await;
            });
        }
    });
    Ok(addr)
}

async fn answer(in_flight: &AtomicUsize) -> Response<Full<Bytes>> {
    if in_flight.fetch_add(1, Ordering::SeqCst) >= UPSTREAM_CAPACITY {
        in_flight.fetch_sub(1, Ordering::SeqCst);
        return Response::builder()
            .status(StatusCode::TOO_MANY_REQUESTS)
            .header("retry-after", "1")
            .body(Full::new(Bytes::from_static(b"busy")))
            .unwrap_or_default();
    }
    // The work itself.
    tokio::time::sleep(Duration::from_millis(150)).await;
    in_flight.fetch_sub(1, Ordering::SeqCst);
    Response::new(Full::new(Bytes::from_static(b"done")))
}
