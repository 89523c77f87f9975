//! The Prometheus `/metrics` endpoint, on its own listener (off by default;
//! `tollgate serve --metrics-listen ADDR`).
//!
//! Served with hyper directly: one route, text format 0.0.4 rendered by the
//! `prometheus` crate from the registry the OpenTelemetry Prometheus reader
//! fills, so Prometheus and OTLP see the same instruments. A separate port
//! keeps scrapes off the gRPC listener and its concurrency limit. It lives
//! with the server because it is a listener (it accepts through
//! [`listen`]); telemetry only fills the registry it renders.

use std::convert::Infallible;
use std::future::Future;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::{TokioIo, TokioTimer};
use prometheus::{Encoder as _, Registry, TextEncoder};
use tokio::net::TcpListener;
use tokio::task::JoinSet;
use tokio_stream::{Stream, StreamExt as _};
use tonic::transport::server::Connected as _;

use super::listen::{self, Conn, ConnLimits};
use crate::config::Transport;

/// Serves `GET /metrics` from `registry` on `listener`, in plaintext with
/// the default probe limits, until `shutdown`; connections still open then
/// are dropped.
pub async fn serve(
    listener: TcpListener,
    registry: Registry,
    shutdown: impl Future<Output = ()> + Send,
) -> std::io::Result<()> {
    let transport = Transport::default();
    let incoming = listen::incoming(listener, ConnLimits::probes(&transport), None);
    serve_incoming(incoming, registry, transport.probe_header_timeout, shutdown).await;
    Ok(())
}

/// Serves `GET /metrics` from `registry` on the connections of `incoming`
/// (accepted and limited by [`listen::incoming`]) until `shutdown`; a
/// request's headers must arrive within `header_timeout`.
pub async fn serve_incoming(
    incoming: impl Stream<Item = std::io::Result<Conn>>,
    registry: Registry,
    header_timeout: Duration,
    shutdown: impl Future<Output = ()> + Send,
) {
    tokio::pin!(shutdown);
    tokio::pin!(incoming);
    let mut connections = JoinSet::new();
    loop {
        tokio::select! {
            () = &mut shutdown => break,
            accepted = incoming.next() => {
                let conn = match accepted {
                    Some(Ok(conn)) => conn,
                    Some(Err(err)) => {
                        tracing::debug!(cause = %err, "metrics accept failed");
                        continue;
                    }
                    None => break,
                };
                let registry = registry.clone();
                let activity = conn.connect_info().activity;
                connections.spawn(async move {
                    let service = service_fn(move |request| {
                        // In flight (for the idle timeout) while answered.
                        let call = activity.start();
                        let registry = registry.clone();
                        async move {
                            let _call = call;
                            Ok::<_, Infallible>(respond(&request, &registry))
                        }
                    });
                    let _ = hyper::server::conn::http1::Builder::new()
                        .timer(TokioTimer::new())
                        .header_read_timeout(header_timeout)
                        .serve_connection(TokioIo::new(conn), service)
                        .await;
                });
            }
            Some(_) = connections.join_next(), if !connections.is_empty() => {}
        }
    }
    connections.abort_all();
}

pub(crate) fn respond(
    request: &http::Request<Incoming>,
    registry: &Registry,
) -> http::Response<Full<Bytes>> {
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
