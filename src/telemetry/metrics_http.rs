//! The Prometheus `/metrics` endpoint, on its own listener (off by default;
//! `tollgate serve --metrics-listen ADDR`).
//!
//! Served with hyper directly: one route, text format 0.0.4 rendered by the
//! `prometheus` crate from the registry the OpenTelemetry Prometheus reader
//! fills, so Prometheus and OTLP see the same instruments. A separate port
//! keeps scrapes off the gRPC listener and its concurrency limit.

use std::convert::Infallible;
use std::future::Future;

use bytes::Bytes;
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use prometheus::{Encoder as _, Registry, TextEncoder};
use tokio::net::TcpListener;
use tokio::task::JoinSet;

/// Serves `GET /metrics` from `registry` on `listener` until `shutdown`;
/// connections still open then are dropped.
pub async fn serve(
    listener: TcpListener,
    registry: Registry,
    shutdown: impl Future<Output = ()> + Send,
) -> std::io::Result<()> {
    tokio::pin!(shutdown);
    let mut connections = JoinSet::new();
    loop {
        tokio::select! {
            () = &mut shutdown => break,
            accepted = listener.accept() => {
                let (stream, _) = match accepted {
                    Ok(accepted) => accepted,
                    Err(err) => {
                        // A failed accept (fd limit, reset) is not fatal.
                        tracing::debug!(cause = %err, "metrics accept failed");
                        continue;
                    }
                };
                let registry = registry.clone();
                connections.spawn(async move {
                    let service = service_fn(move |request| {
                        let registry = registry.clone();
                        async move { Ok::<_, Infallible>(respond(&request, &registry)) }
                    });
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(TokioIo::new(stream), service)
                        .await;
                });
            }
            Some(_) = connections.join_next(), if !connections.is_empty() => {}
        }
    }
    connections.abort_all();
    Ok(())
}

fn respond(request: &http::Request<Incoming>, registry: &Registry) -> http::Response<Full<Bytes>> {
    let reply = |status: http::StatusCode, content_type: &str, body: Vec<u8>| {
        let mut response = http::Response::new(Full::new(Bytes::from(body)));
        *response.status_mut() = status;
        if let Ok(value) = http::HeaderValue::from_str(content_type) {
            response
                .headers_mut()
                .insert(http::header::CONTENT_TYPE, value);
        }
        response
    };
    if request.method() != http::Method::GET || request.uri().path() != "/metrics" {
        return reply(
            http::StatusCode::NOT_FOUND,
            "text/plain",
            b"only GET /metrics\n".to_vec(),
        );
    }
    let encoder = TextEncoder::new();
    let mut body = Vec::new();
    match encoder.encode(&registry.gather(), &mut body) {
        Ok(()) => reply(http::StatusCode::OK, encoder.format_type(), body),
        Err(err) => reply(
            http::StatusCode::INTERNAL_SERVER_ERROR,
            "text/plain",
            format!("encoding metrics: {err}\n").into_bytes(),
        ),
    }
}
