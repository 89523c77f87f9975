//! The tower layer over HTTP services and a real tonic channel, with the
//! gate's tokens and slots from the real coordinator (see `support::pipes`).

#![allow(clippy::unwrap_used)]

mod common;
#[path = "../../tests/support/mod.rs"]
mod support;

use std::convert::Infallible;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::Full;
use support::pipes::*;
use tollgate_client::engine::IntentPolicy;
use tollgate_client::gate::Repetition;
use tollgate_client::layer::{GateError, GateReport, LayerConfig, ReplayBody, TollgateLayer};
use tollgate_client::outcome::Outcome;
use tollgate_client::owner::RETRY_OWNER_HEADER;
use tollgate_client::setup::Tollgate;
use tollgate_proto::v1::budget_client::BudgetClient;
use tollgate_proto::v1::budget_server::Budget;
use tollgate_proto::v1::{
    LeaseRequest, LeaseResponse, ReconsiderRequest, ReconsiderResponse, ReleaseRequest,
    ReleaseResponse, ReportRequest, ReportResponse, ScopeEvent, WatchRequest,
};
use tower::{ServiceBuilder, ServiceExt};

/// An HTTP upstream answering from a list (the last answer repeats),
/// counting calls and remembering whether each carried the owner mark.
fn upstream(
    answers: Vec<(u16, Option<&'static str>)>,
    calls: Arc<AtomicU32>,
) -> impl tower::Service<
    Request<Full<Bytes>>,
    Response = Response<Full<Bytes>>,
    Error = Infallible,
    Future = impl Send,
> + Clone
+ Send
+ 'static {
    tower::service_fn(move |request: Request<Full<Bytes>>| {
        let n = calls.fetch_add(1, Ordering::SeqCst) as usize;
        let (status, retry_after) = answers[n.min(answers.len() - 1)];
        assert!(
            request.headers().contains_key(RETRY_OWNER_HEADER),
            "every attempt is marked"
        );
        async move {
            let mut response = Response::builder().status(status);
            if let Some(value) = retry_after {
                response = response.header("retry-after", value);
            }
            Ok::<_, Infallible>(response.body(Full::new(Bytes::from_static(b"{}"))).unwrap())
        }
    })
}

fn http_layer(gate: &tollgate_client::gate::Gate) -> TollgateLayer {
    TollgateLayer::new(
        gate.clone(),
        LayerConfig::http(policy(secs(60), 3, secs(5), None), |parts| {
            scope_for(parts.method.as_str(), "/orders/{id}")
        }),
    )
}

fn scope_for(method: &str, route: &str) -> tollgate_client::scope::Scope {
    tollgate_client::scope::Scope::new("tenant-a", format!("{method} {route}"))
}

fn get() -> Request<Full<Bytes>> {
    Request::get("http://upstream.invalid/orders/7")
        .body(Full::new(Bytes::new()))
        .unwrap()
}

#[tokio::test(start_paused = true)]
async fn http_layer_retries_a_429_after_retry_after_and_returns_the_success() {
    let h = harness();
    let calls = Arc::new(AtomicU32::new(0));
    let service = ServiceBuilder::new()
        .layer(http_layer(&h.gate))
        .service(upstream(vec![(429, Some("2")), (200, None)], calls.clone()));
    let began = tokio::time::Instant::now();
    let response = service.oneshot(get()).await.unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    assert_eq!(calls.load(Ordering::SeqCst), 2);
    assert!(began.elapsed() >= secs(2), "the hint was honoured");
    let report = response.extensions().get::<GateReport>().unwrap();
    assert_eq!(report.outcome, Outcome::Succeeded);
    assert_eq!(report.attempts.len(), 2);
}

/// A token in the request's extensions cancels the intent through the
/// gate: the wait for the retry ends at once, and the call ends with the
/// outcome `cancelled` (not a dropped future, which records none).
#[tokio::test(start_paused = true)]
async fn a_cancellation_token_in_the_extensions_ends_the_intent_cancelled() {
    let h = harness();
    let calls = Arc::new(AtomicU32::new(0));
    let service = ServiceBuilder::new()
        .layer(http_layer(&h.gate))
        .service(upstream(vec![(429, Some("5")), (200, None)], calls.clone()));
    let cancel = tokio_util::sync::CancellationToken::new();
    let mut request = get();
    request.extensions_mut().insert(cancel.clone());
    let began = tokio::time::Instant::now();
    let call = tokio::spawn(service.oneshot(request));
    tokio::time::sleep(secs(1)).await;
    cancel.cancel();
    let response = call.await.unwrap().unwrap();
    assert!(began.elapsed() < secs(5), "the wait ended at cancellation");
    assert_eq!(calls.load(Ordering::SeqCst), 1, "no attempt after it");
    let report = response.extensions().get::<GateReport>().unwrap();
    assert_eq!(report.outcome, Outcome::Cancelled);
}

#[tokio::test(start_paused = true)]
async fn three_tower_layers_exactly_one_owner_repeats() {
    let h = harness();
    let calls = Arc::new(AtomicU32::new(0));
    let service = ServiceBuilder::new()
        .layer(http_layer(&h.gate)) // client
        .layer(http_layer(&h.gate)) // queue worker
        .layer(http_layer(&h.gate)) // transport
        .service(upstream(vec![(503, Some("1"))], calls.clone()));
    let response = service.oneshot(get()).await.unwrap();
    assert_eq!(
        response.status(),
        StatusCode::SERVICE_UNAVAILABLE,
        "the last response"
    );
    assert_eq!(calls.load(Ordering::SeqCst), 3, "3 attempts, not 27");
    let outer = response.extensions().get::<GateReport>().unwrap();
    assert_eq!(outer.outcome, Outcome::AttemptCap);
    let middle = outer.inner.as_ref().expect("evidence passed up");
    assert_eq!(middle.outcome, Outcome::OwnerElsewhere);
    assert_eq!(middle.attempts.len(), 1);
    let innermost = middle.inner.as_ref().expect("evidence passed up");
    assert_eq!(innermost.outcome, Outcome::OwnerElsewhere);
}

/// A gRPC upstream that answers in trailers-only responses (HTTP 200, the
/// status in the headers) from a list of codes (the last repeats), the
/// refusals with a 300 ms pushback.
fn grpc_upstream(
    codes: Vec<u16>,
    calls: Arc<AtomicU32>,
) -> impl tower::Service<
    Request<Full<Bytes>>,
    Response = Response<Full<Bytes>>,
    Error = Infallible,
    Future = impl Send,
> + Clone
+ Send
+ 'static {
    tower::service_fn(move |_: Request<Full<Bytes>>| {
        let n = calls.fetch_add(1, Ordering::SeqCst) as usize;
        let code = codes[n.min(codes.len() - 1)];
        let mut response = Response::builder().header("grpc-status", code);
        if code != 0 {
            response = response.header("grpc-retry-pushback-ms", "300");
        }
        let response = response.body(Full::new(Bytes::new())).unwrap();
        async move { Ok::<_, Infallible>(response) }
    })
}

#[tokio::test(start_paused = true)]
async fn a_tollgate_gives_each_protocol_its_layer_in_one_line() {
    let h = harness();
    let tollgate = Tollgate::connect("http://coordinator.invalid", "worker-1")
        .channel(h.coordinator.switchboard.channel())
        .clock(h.clock.clone())
        .gate_config(gate_config())
        .build()
        .unwrap();
    let policy = IntentPolicy::builder(secs(60)).build().unwrap();

    // Read as HTTP: a 429 and its Retry-After.
    let calls = Arc::new(AtomicU32::new(0));
    let http = ServiceBuilder::new()
        .layer(tollgate.http_layer(policy, |parts| {
            scope_for(parts.method.as_str(), "/orders/{id}")
        }))
        .service(upstream(vec![(429, Some("2")), (200, None)], calls.clone()));
    let response = http.oneshot(get()).await.unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    assert_eq!(calls.load(Ordering::SeqCst), 2, "the 429 was retried");

    // Read as gRPC: HTTP would take the 200 for a success; the layer reads
    // RESOURCE_EXHAUSTED and its pushback, and retries (the body clones).
    let calls = Arc::new(AtomicU32::new(0));
    let grpc = ServiceBuilder::new()
        .layer(tollgate.grpc_layer(policy, |parts| scope_for("grpc", parts.uri.path())))
        .service(grpc_upstream(vec![8, 0], calls.clone()));
    let began = tokio::time::Instant::now();
    let response = grpc.oneshot(get()).await.unwrap();
    assert_eq!(calls.load(Ordering::SeqCst), 2, "the refusal was retried");
    assert!(began.elapsed() >= ms(300), "after its pushback");
    let report = response.extensions().get::<GateReport>().unwrap();
    assert_eq!(report.outcome, Outcome::Succeeded);
}

/// A body that can only be sent once (a stream, say).
struct OneShot(Full<Bytes>);

impl http_body::Body for OneShot {
    type Data = Bytes;
    type Error = Infallible;
    fn poll_frame(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<http_body::Frame<Bytes>, Infallible>>> {
        std::pin::Pin::new(&mut self.get_mut().0).poll_frame(cx)
    }
}

impl ReplayBody for OneShot {}

#[tokio::test(start_paused = true)]
async fn a_body_that_cannot_be_replayed_gets_one_attempt() {
    let h = harness();
    let calls = Arc::new(AtomicU32::new(0));
    let counter = calls.clone();
    let inner = tower::service_fn(move |_: Request<OneShot>| {
        counter.fetch_add(1, Ordering::SeqCst);
        async {
            // A 429 (effect known absent): only the body stops a retry. A
            // 503's effect is unknown, which would stop it on its own.
            Ok::<_, Infallible>(
                Response::builder()
                    .status(429)
                    .body(Full::new(Bytes::new()))
                    .unwrap(),
            )
        }
    });
    let service = ServiceBuilder::new()
        .layer(http_layer(&h.gate))
        .service(inner);
    let request = Request::put("http://upstream.invalid/orders/7")
        .body(OneShot(Full::new(Bytes::from_static(b"{}"))))
        .unwrap();
    let response = service.oneshot(request).await.unwrap();
    assert_eq!(response.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(
        calls.load(Ordering::SeqCst),
        1,
        "a PUT is safe, but its body is gone"
    );
    let report = response.extensions().get::<GateReport>().unwrap();
    assert_eq!(report.outcome, Outcome::AttemptCap);
}

#[tokio::test(start_paused = true)]
async fn a_post_without_a_key_is_not_replayed_after_an_unknown_effect() {
    let h = harness();
    let calls = Arc::new(AtomicU32::new(0));
    let service = ServiceBuilder::new()
        .layer(http_layer(&h.gate))
        .service(upstream(
            vec![(502, None), (502, None), (200, None)],
            calls.clone(),
        ));
    let request = Request::post("http://upstream.invalid/orders")
        .body(Full::new(Bytes::from_static(b"{}")))
        .unwrap();
    let response = service.clone().oneshot(request).await.unwrap();
    assert_eq!(calls.load(Ordering::SeqCst), 1);
    let report = response.extensions().get::<GateReport>().unwrap();
    assert_eq!(report.outcome, Outcome::Indeterminate);

    // With an idempotency key the same POST is repeated, key attached.
    let request = Request::post("http://upstream.invalid/orders")
        .header("idempotency-key", "order-7")
        .body(Full::new(Bytes::from_static(b"{}")))
        .unwrap();
    let response = service.oneshot(request).await.unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    assert_eq!(calls.load(Ordering::SeqCst), 3);
}

/// A gRPC upstream (any service will do; this one reuses the Budget API)
/// that is out of capacity for its first `refusals` calls.
#[derive(Clone)]
struct Busy {
    calls: Arc<AtomicU32>,
    refusals: u32,
}

#[tonic::async_trait]
impl Budget for Busy {
    async fn lease(
        &self,
        _: tonic::Request<LeaseRequest>,
    ) -> Result<tonic::Response<LeaseResponse>, tonic::Status> {
        if self.calls.fetch_add(1, Ordering::SeqCst) < self.refusals {
            let mut status = tonic::Status::resource_exhausted("busy");
            status
                .metadata_mut()
                .insert("grpc-retry-pushback-ms", "300".parse().unwrap());
            return Err(status);
        }
        Ok(tonic::Response::new(LeaseResponse {
            granted: 1,
            ..LeaseResponse::default()
        }))
    }
    async fn release(
        &self,
        _: tonic::Request<ReleaseRequest>,
    ) -> Result<tonic::Response<ReleaseResponse>, tonic::Status> {
        Err(tonic::Status::unimplemented("release"))
    }
    async fn report(
        &self,
        _: tonic::Request<ReportRequest>,
    ) -> Result<tonic::Response<ReportResponse>, tonic::Status> {
        Err(tonic::Status::unimplemented("report"))
    }
    async fn reconsider(
        &self,
        _: tonic::Request<ReconsiderRequest>,
    ) -> Result<tonic::Response<ReconsiderResponse>, tonic::Status> {
        Err(tonic::Status::unimplemented("reconsider"))
    }
    type WatchStream = tokio_stream::Empty<Result<ScopeEvent, tonic::Status>>;
    async fn watch(
        &self,
        _: tonic::Request<WatchRequest>,
    ) -> Result<tonic::Response<Self::WatchStream>, tonic::Status> {
        Err(tonic::Status::unimplemented("watch"))
    }
}

fn grpc_layer(gate: &tollgate_client::gate::Gate, repetition: Repetition) -> TollgateLayer {
    TollgateLayer::new(
        gate.clone(),
        LayerConfig::grpc(policy(secs(60), 3, secs(5), None), |parts| {
            scope_for("grpc", parts.uri.path())
        })
        .repetition(move |_| repetition.clone()),
    )
}

#[tokio::test(start_paused = true)]
async fn tonic_channel_retries_resource_exhausted_after_its_pushback() {
    let h = harness();
    let calls = Arc::new(AtomicU32::new(0));
    let channel = common::serve_budget(Busy {
        calls: calls.clone(),
        refusals: 1,
    });
    let service = ServiceBuilder::new()
        .layer(grpc_layer(&h.gate, Repetition::Safe))
        .service(channel);
    let mut client = BudgetClient::new(service);
    let began = tokio::time::Instant::now();
    let answer = client.lease(LeaseRequest::default()).await.unwrap();
    assert_eq!(answer.get_ref().granted, 1);
    assert_eq!(calls.load(Ordering::SeqCst), 2);
    assert!(began.elapsed() >= ms(300), "the pushback was honoured");
}

#[tokio::test(start_paused = true)]
async fn tonic_calls_are_not_repeated_unless_declared_repeatable() {
    let h = harness();
    let calls = Arc::new(AtomicU32::new(0));
    let channel = common::serve_budget(Busy {
        calls: calls.clone(),
        refusals: 5,
    });
    let service = ServiceBuilder::new()
        .layer(grpc_layer(&h.gate, Repetition::NonRepeatable))
        .service(channel);
    let mut client = BudgetClient::new(service);
    let status = client.lease(LeaseRequest::default()).await.unwrap_err();
    assert_eq!(
        status.code(),
        tonic::Code::ResourceExhausted,
        "the last status is handed back"
    );
    assert_eq!(
        calls.load(Ordering::SeqCst),
        1,
        "a stream body is not buffered for replay"
    );
}

#[tokio::test(start_paused = true)]
async fn an_error_with_no_response_is_a_gate_error_carrying_the_evidence() {
    let h = harness();
    let inner = tower::service_fn(|_: Request<Full<Bytes>>| async {
        Err::<Response<Full<Bytes>>, _>(std::io::Error::from(std::io::ErrorKind::ConnectionRefused))
    });
    let service = ServiceBuilder::new()
        .layer(http_layer(&h.gate))
        .service(inner);
    let err = service.oneshot(get()).await.unwrap_err();
    let gate_error = err.downcast_ref::<GateError>().expect("a gate error");
    assert_eq!(gate_error.report.outcome, Outcome::AttemptCap);
    assert_eq!(
        gate_error.report.attempts.len(),
        3,
        "refused before send: safe to retry"
    );
}
