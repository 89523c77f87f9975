//! The endpoints a platform polls, on the listener of the proxy file's
//! `[admin]` table: `/healthz` (the process answers),
//! `/readyz` (it accepts requests: 503 once draining, so a pod leaves its
//! Service before its listeners close) and `/metrics` (the gate's
//! instruments, Prometheus text). The coordinator's state is reported, not
//! judged: a proxy whose coordinator is unreachable still serves, on its
//! local budget, so it stays ready.

use std::convert::Infallible;

use bytes::Bytes;
use http_body_util::Full;
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use tokio::net::TcpListener;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;
use tollgate_client::{LinkState, Tollgate};

pub(super) async fn serve(
    listener: TcpListener,
    tollgate: Tollgate,
    registry: Option<prometheus::Registry>,
    drain: CancellationToken,
    stop: CancellationToken,
) {
    let mut connections = JoinSet::new();
    loop {
        tokio::select! {
            // Probes keep answering (503 on /readyz) while the listeners
            // drain: `stop` comes after them.
            () = stop.cancelled() => break,
            accepted = listener.accept() => {
                let Ok((stream, _)) = accepted else { continue };
                let tollgate = tollgate.clone();
                let registry = registry.clone();
                let drain = drain.clone();
                connections.spawn(async move {
                    let service = hyper::service::service_fn(move |request| {
                        let answer = respond(&request, &tollgate, registry.as_ref(), &drain);
                        async move { Ok::<_, Infallible>(answer) }
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
}

fn respond(
    request: &http::Request<Incoming>,
    tollgate: &Tollgate,
    registry: Option<&prometheus::Registry>,
    drain: &CancellationToken,
) -> http::Response<Full<Bytes>> {
    let text = |status: http::StatusCode, body: String| {
        let mut response = http::Response::new(Full::new(Bytes::from(body)));
        *response.status_mut() = status;
        response
    };
    let link = match tollgate.link_state() {
        LinkState::Connected => "connected",
        LinkState::Degraded => "unreachable",
    };
    match (request.method(), request.uri().path()) {
        (&http::Method::GET, "/healthz") => {
            text(http::StatusCode::OK, format!("ok coordinator={link}\n"))
        }
        (&http::Method::GET, "/readyz") if drain.is_cancelled() => text(
            http::StatusCode::SERVICE_UNAVAILABLE,
            "draining\n".to_owned(),
        ),
        (&http::Method::GET, "/readyz") => {
            text(http::StatusCode::OK, format!("ready coordinator={link}\n"))
        }
        (&http::Method::GET, "/metrics") => match registry {
            Some(registry) => crate::server::metrics_http::respond(request, registry),
            None => text(http::StatusCode::NOT_FOUND, "no metrics registry\n".into()),
        },
        _ => text(
            http::StatusCode::NOT_FOUND,
            "GET /healthz, /readyz or /metrics\n".into(),
        ),
    }
}
