//! Stated limits end to end: a real HTTP upstream states its quota on every
//! response (`RateLimit-Policy` / `RateLimit`, or `X-RateLimit-*`), workers
//! read the headers through the tower layer and report the latest with its
//! receipt time, and the real coordinator paces the route at the quota
//! corroborated by enough workers, shows it in `GetScope`, and lets one
//! lying worker change nothing.

#![allow(clippy::unwrap_used)]

mod support;

use std::convert::Infallible;
use std::net::SocketAddr;

use bytes::Bytes;
use http::{Request, Response};
use http_body_util::Full;
use hyper::body::Incoming;
use hyper_util::client::legacy::Client;
use hyper_util::rt::{TokioExecutor, TokioIo};
use support::tcp::Coordinator;
use support::{loopback_policy, secs};
use tokio::net::TcpListener;
use tollgate::ops::top::{Model, Source};
use tollgate_client::gate::Gate;
use tollgate_client::layer::{LayerConfig, TollgateLayer};
use tollgate_client::scope::Scope;
use tollgate_proto::v1;
use tower::{ServiceBuilder, ServiceExt};

const ROUTE: &str = "GET /items/{id}";

/// An HTTP upstream on loopback answering 200 with `headers` on every
/// response, for as long as the test runs.
async fn upstream(headers: &'static [(&'static str, &'static str)]) -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            tokio::spawn(async move {
                let service = hyper::service::service_fn(move |_: Request<Incoming>| async move {
                    let mut response = Response::builder().status(200);
                    for (name, value) in headers {
                        response = response.header(*name, *value);
                    }
                    Ok::<_, Infallible>(
                        response.body(Full::new(Bytes::from_static(b"{}"))).unwrap(),
                    )
                });
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(stream), service)
                    .await;
            });
        }
    });
    addr
}

/// `n` requests by `gate` to the upstream at `addr` through the layer, then
/// the worker's report sent.
async fn work(gate: &Gate, addr: SocketAddr, n: usize) {
    let layer = TollgateLayer::new(
        gate.clone(),
        LayerConfig::http(loopback_policy(secs(5), 3, secs(1)), |_| {
            Scope::new("tenant-a", ROUTE)
        }),
    );
    let client = ServiceBuilder::new()
        .layer(layer)
        .service(Client::builder(TokioExecutor::new()).build_http::<Full<Bytes>>());
    for i in 0..n {
        let request = Request::get(format!("http://{addr}/items/{i}"))
            .body(Full::new(Bytes::new()))
            .unwrap();
        let response = client.clone().oneshot(request).await.unwrap();
        assert_eq!(response.status(), 200);
    }
    gate.cache().flush().await;
}

async fn stated(c: &Coordinator) -> (v1::StatedLimitState, v1::PacingState) {
    let mut admin = v1::admin_client::AdminClient::new(c.channel().await);
    let scope = admin
        .get_scope(v1::GetScopeRequest {
            caller_scope: "tenant-a".into(),
            route: ROUTE.into(),
        })
        .await
        .unwrap()
        .into_inner();
    let pacing = scope.pacing.unwrap();
    (pacing.stated.clone().unwrap(), pacing)
}

#[tokio::test]
async fn a_stated_quota_paces_the_fleet_and_a_liar_changes_nothing() {
    let c = Coordinator::open().await;
    let honest = upstream(&[
        ("ratelimit-policy", "\"default\";q=100;w=1"),
        ("ratelimit", "\"default\";r=60;t=1"),
    ])
    .await;
    // Another client of the same quota would see the same remaining; this
    // one lies (or its proxy mangles the header) with a tiny remaining.
    let lying = upstream(&[
        ("x-ratelimit-limit", "100"),
        ("x-ratelimit-remaining", "1"),
        ("x-ratelimit-reset", "2"),
    ])
    .await;
    let workers: Vec<Gate> = ["w1", "w2", "w3"]
        .iter()
        .map(|w| c.worker_gate(w))
        .collect();
    for gate in &workers {
        work(gate, honest, 3).await;
    }
    let (s, pacing) = stated(&c).await;
    assert_eq!(s.state, "corroborated", "{s:?}");
    // The whole fleet is paced at it from the start: no search.
    assert_eq!(pacing.state, "stated_limit");
    assert!((pacing.wake_rate - 97.0).abs() < 1e-9, "{pacing:?}");
    // 60 left of 100 a second, the reset within the next second: the
    // window's 100/s, less the 3 % margin.
    assert!((s.pace - 97.0).abs() < 1e-9, "{s:?}");
    assert_eq!((s.limit, s.window_secs, s.remaining), (100, 1, 60));
    assert_eq!(s.workers, 3);
    let last = s.recent.last().unwrap();
    assert_eq!(last.verdict, "usable");
    assert!(last.raw.contains("r=60"), "{last:?}");

    // `tollgate top` shows it while a scope has one in force: remaining of
    // the quota, time to the reset, pace.
    let source = Source::new(c.channel().await, None, 100).unwrap();
    let mut model = Model::new(c.clock.clone());
    let frame = source
        .frame_text(&mut model, "127.0.0.1", 160)
        .await
        .unwrap();
    assert!(frame.contains("STATED LEFT/RESET"), "{frame}");
    assert!(frame.contains("60/100 1.0s 97"), "{frame}");

    let liar = c.worker_gate("liar");
    work(&liar, lying, 2).await;
    let (after, _) = stated(&c).await;
    assert_eq!(after.state, "corroborated");
    assert!(
        (after.pace - 97.0).abs() < 1e-9,
        "the liar moved the pace: {after:?}"
    );
    assert!(after.recent.iter().any(|r| r.worker_id.ends_with("liar")));
}
