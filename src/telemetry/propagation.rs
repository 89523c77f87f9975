//! W3C trace context across the gRPC hop, and the scope attributes.
//!
//! [`TraceContextLayer`] wraps the whole tonic server: for each request it
//! reads `traceparent` / `tracestate` from the HTTP/2 headers (gRPC metadata)
//! and makes that remote context current while the handler runs. The
//! handler's `#[instrument]` span — the one span per RPC, named
//! `tollgate.lease`, `tollgate.report`, … — is created with no tracing parent,
//! so tracing-opentelemetry parents it on the current OpenTelemetry context:
//! the worker's span that made the call. A request without `traceparent`
//! starts a new trace. Nothing else of the request is read.

use std::task::{Context, Poll};

use opentelemetry::context::FutureExt as _;
use opentelemetry::propagation::{Extractor, TextMapPropagator};
use opentelemetry_sdk::propagation::TraceContextPropagator;
use tollgate_vocab::telemetry::caller_scope_attr;
use tower::{Layer, Service};

use crate::scope::ScopeKey;

/// Makes each request's remote trace context current for its handler.
#[derive(Debug, Clone, Copy, Default)]
pub struct TraceContextLayer;

impl<S> Layer<S> for TraceContextLayer {
    type Service = TraceContext<S>;

    fn layer(&self, inner: S) -> TraceContext<S> {
        TraceContext { inner }
    }
}

/// The service [`TraceContextLayer`] makes.
#[derive(Debug, Clone)]
pub struct TraceContext<S> {
    inner: S,
}

impl<S, B> Service<http::Request<B>> for TraceContext<S>
where
    S: Service<http::Request<B>>,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = opentelemetry::context::WithContext<S::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: http::Request<B>) -> Self::Future {
        let remote = TraceContextPropagator::new().extract(&Headers(request.headers()));
        let future = {
            let _current = remote.clone().attach();
            self.inner.call(request)
        };
        future.with_context(remote)
    }
}

struct Headers<'a>(&'a http::HeaderMap);

impl Extractor for Headers<'_> {
    fn get(&self, key: &str) -> Option<&str> {
        self.0.get(key).and_then(|v| v.to_str().ok())
    }

    fn keys(&self) -> Vec<&str> {
        self.0.keys().map(http::HeaderName::as_str).collect()
    }
}

/// Records `tollgate.caller_scope` (hashed when configured, see
/// [`caller_scope_attr`]), `tollgate.route` and `tollgate.priority` on `span`.
pub fn record_scope(span: &tracing::Span, key: &ScopeKey) {
    // No layer wants the span (nothing exports them): skip building the
    // attribute, which allocates.
    if span.is_disabled() {
        return;
    }
    span.record(
        "tollgate.caller_scope",
        caller_scope_attr(&key.route.caller_scope).as_str(),
    );
    span.record("tollgate.route", key.route.route.as_str());
    span.record("tollgate.priority", key.priority.as_str());
}
