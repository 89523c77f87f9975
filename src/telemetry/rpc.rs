//! The standard OpenTelemetry RPC server metric, `rpc.server.duration`, as a
//! tower layer over the whole tonic server, so the usual gRPC dashboards
//! (request rate, error ratio and latency per method and status) work on
//! Tollgate without knowing anything about it.
//!
//! # What is measured
//! One histogram sample per call, in milliseconds, from the request reaching
//! the layer to the end of the response: the trailers of a unary call, the
//! end of a Watch stream (so Watch samples are stream lifetimes, and latency
//! panels leave `rpc.method="Watch"` out). Attributes follow the semantic
//! conventions: `rpc.system="grpc"`, `rpc.service`, `rpc.method`,
//! `rpc.grpc.status_code` (the number). Prometheus shows it as
//! `rpc_server_duration_milliseconds`.
//!
//! # Where the status comes from
//! - a handler's error, and anything the router or tonic rejects before the
//!   handler (unknown method, malformed or oversized message), is a
//!   trailers-only response: `grpc-status` in the headers;
//! - a success, or an error in the middle of a stream: `grpc-status` in the
//!   trailers;
//! - a layer below this one failing (load shedding) is an error tonic turns
//!   into a status above us: mapped here the way tonic maps it;
//! - a call dropped before it finished (the client went away, tonic's own
//!   request timeout, which sits above every user layer, fired): CANCELLED,
//!   which is what tonic answers for its timeout.
//!
//! # Bounded cardinality
//! `rpc.service` and `rpc.method` come from the request path, which a peer
//! chooses. Only paths of methods this server implements (read from the
//! services' descriptor sets) are labelled by name; any other path counts
//! as `_OTHER`, the semantic conventions' word for it.

use std::collections::HashSet;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, ready};

use http_body::{Body, Frame, SizeHint};
use opentelemetry::KeyValue;
use opentelemetry::metrics::{Histogram, Meter};
use pin_project_lite::pin_project;
use prost::Message as _;
use tokio::time::Instant;
use tower::{Layer, Service};

/// The label of a service or method this server does not implement.
pub const OTHER: &str = "_OTHER";

/// `grpc-status` CANCELLED: a call dropped before it finished.
const CANCELLED: i64 = 1;
/// `grpc-status` UNKNOWN: an error with no status, or a stream that ended
/// without one.
const UNKNOWN: i64 = 2;
/// `grpc-status` RESOURCE_EXHAUSTED: what tonic answers for a load-shed call.
const RESOURCE_EXHAUSTED: i64 = 8;

/// Histogram boundaries in ms: loopback calls take well under a millisecond,
/// the request timeout is seconds.
const BOUNDARIES_MS: [f64; 16] = [
    0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 25.0, 50.0, 100.0, 250.0, 500.0, 1000.0, 2500.0, 5000.0,
    10000.0,
];

/// Records `rpc.server.duration` for every call through it.
#[derive(Debug, Clone)]
pub struct RpcMetricsLayer {
    shared: Arc<Shared>,
}

struct Shared {
    duration: Histogram<f64>,
    /// `/package.Service/Method` of every method served: the paths that
    /// may become labels.
    known: HashSet<String>,
}

impl std::fmt::Debug for Shared {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Shared")
            .field("known", &self.known.len())
            .finish_non_exhaustive()
    }
}

impl RpcMetricsLayer {
    /// The coordinator's layer: the global meter provider's `tollgate`
    /// meter (install the provider first), and the methods of Budget, Admin,
    /// health and reflection.
    pub fn coordinator() -> Self {
        Self::new(
            &opentelemetry::global::meter("tollgate"),
            &[
                tollgate_proto::v1::FILE_DESCRIPTOR_SET,
                tonic_health::pb::FILE_DESCRIPTOR_SET,
                tonic_reflection::pb::v1::FILE_DESCRIPTOR_SET,
            ],
        )
    }

    /// A layer recording on `meter`, naming the methods of the services in
    /// `descriptor_sets` (encoded `FileDescriptorSet`s; one that does not
    /// decode names nothing).
    pub fn new(meter: &Meter, descriptor_sets: &[&[u8]]) -> Self {
        let duration = meter
            .f64_histogram("rpc.server.duration")
            .with_description("Duration of inbound RPCs, to the end of the response")
            .with_unit("ms")
            .with_boundaries(BOUNDARIES_MS.to_vec())
            .build();
        let known = descriptor_sets
            .iter()
            .filter_map(|bytes| prost_types::FileDescriptorSet::decode(*bytes).ok())
            .flat_map(|set| set.file)
            .flat_map(|file| {
                let package = file.package().to_owned();
                file.service.into_iter().flat_map(move |service| {
                    let prefix = if package.is_empty() {
                        service.name().to_owned()
                    } else {
                        format!("{package}.{}", service.name())
                    };
                    service
                        .method
                        .into_iter()
                        .map(move |m| format!("/{prefix}/{}", m.name()))
                })
            })
            .collect();
        RpcMetricsLayer {
            shared: Arc::new(Shared { duration, known }),
        }
    }
}

impl<S> Layer<S> for RpcMetricsLayer {
    type Service = RecordRpc<S>;

    fn layer(&self, inner: S) -> RecordRpc<S> {
        RecordRpc {
            inner,
            shared: Arc::clone(&self.shared),
        }
    }
}

/// The service [`RpcMetricsLayer`] makes.
#[derive(Debug, Clone)]
pub struct RecordRpc<S> {
    inner: S,
    shared: Arc<Shared>,
}

impl<S, B, ResBody> Service<http::Request<B>> for RecordRpc<S>
where
    S: Service<http::Request<B>, Response = http::Response<ResBody>>,
    S::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    type Response = http::Response<RecordBody<ResBody>>;
    type Error = Box<dyn std::error::Error + Send + Sync>;
    type Future = RecordFuture<S::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx).map_err(Into::into)
    }

    fn call(&mut self, request: http::Request<B>) -> Self::Future {
        let recorder = Recorder::start(Arc::clone(&self.shared), request.uri().path());
        RecordFuture {
            inner: self.inner.call(request),
            recorder: Some(recorder),
        }
    }
}

/// Records one call once: with the status it ended with, or CANCELLED if
/// it is dropped first.
struct Recorder {
    shared: Arc<Shared>,
    service: KeyValue,
    method: KeyValue,
    start: Instant,
    done: bool,
}

impl Recorder {
    fn start(shared: Arc<Shared>, path: &str) -> Self {
        let (service, method) = match path.strip_prefix('/').and_then(|p| p.split_once('/')) {
            Some((service, method)) if shared.known.contains(path) => {
                (service.to_owned(), method.to_owned())
            }
            _ => (OTHER.to_owned(), OTHER.to_owned()),
        };
        Recorder {
            shared,
            service: KeyValue::new("rpc.service", service),
            method: KeyValue::new("rpc.method", method),
            start: Instant::now(),
            done: false,
        }
    }

    fn finish(&mut self, code: i64) {
        if std::mem::replace(&mut self.done, true) {
            return;
        }
        let ms = self.start.elapsed().as_secs_f64() * 1000.0;
        self.shared.duration.record(
            ms,
            &[
                KeyValue::new("rpc.system", "grpc"),
                self.service.clone(),
                self.method.clone(),
                KeyValue::new("rpc.grpc.status_code", code),
            ],
        );
    }
}

impl Drop for Recorder {
    fn drop(&mut self) {
        self.finish(CANCELLED);
    }
}

/// The `grpc-status` in `headers`, if there is one; a value that is not a
/// number is UNKNOWN (a peer's bytes never panic here).
fn grpc_status(headers: &http::HeaderMap) -> Option<i64> {
    headers.get("grpc-status").map(|value| {
        value
            .to_str()
            .ok()
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or(UNKNOWN)
    })
}

/// The status tonic will answer for an error from the layers below: the
/// same mapping as `tonic::Status::from_error`, read without consuming it.
fn error_status(err: &(dyn std::error::Error + 'static)) -> i64 {
    if err.is::<tower::load_shed::error::Overloaded>() {
        return RESOURCE_EXHAUSTED;
    }
    let mut source = Some(err);
    while let Some(err) = source {
        if let Some(status) = err.downcast_ref::<tonic::Status>() {
            return status.code() as i64;
        }
        source = err.source();
    }
    UNKNOWN
}

pin_project! {
    /// The future of a [`RecordRpc`] call.
    pub struct RecordFuture<F> {
        #[pin]
        inner: F,
        recorder: Option<Recorder>,
    }
}

impl<F, ResBody, E> Future for RecordFuture<F>
where
    F: Future<Output = Result<http::Response<ResBody>, E>>,
    E: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    type Output =
        Result<http::Response<RecordBody<ResBody>>, Box<dyn std::error::Error + Send + Sync>>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.project();
        let result = ready!(this.inner.poll(cx));
        let Some(mut recorder) = this.recorder.take() else {
            return Poll::Ready(Err("polled after completion".into()));
        };
        Poll::Ready(match result {
            Ok(response) => {
                // Trailers-only: the call ended in the headers.
                let recorder = match grpc_status(response.headers()) {
                    Some(code) => {
                        recorder.finish(code);
                        None
                    }
                    None => Some(recorder),
                };
                Ok(response.map(|inner| RecordBody { inner, recorder }))
            }
            Err(err) => {
                let err = err.into();
                recorder.finish(error_status(&*err));
                Err(err)
            }
        })
    }
}

pin_project! {
    /// A response body that records its call when the trailers pass.
    pub struct RecordBody<B> {
        #[pin]
        inner: B,
        recorder: Option<Recorder>,
    }
}

impl<B: Body> Body for RecordBody<B> {
    type Data = B::Data;
    type Error = B::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Self::Data>, Self::Error>>> {
        let this = self.project();
        let frame = ready!(this.inner.poll_frame(cx));
        if let Some(recorder) = this.recorder.as_mut() {
            match &frame {
                Some(Ok(frame)) => {
                    if let Some(code) = frame.trailers_ref().and_then(grpc_status) {
                        recorder.finish(code);
                    }
                }
                // The stream broke, or ended with no status at all.
                Some(Err(_)) | None => recorder.finish(UNKNOWN),
            }
        }
        Poll::Ready(frame)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_status_is_read_from_headers_and_garbage_is_unknown() {
        let mut headers = http::HeaderMap::new();
        assert_eq!(grpc_status(&headers), None);
        headers.insert("grpc-status", http::HeaderValue::from_static("3"));
        assert_eq!(grpc_status(&headers), Some(3));
        headers.insert("grpc-status", http::HeaderValue::from_static("three"));
        assert_eq!(grpc_status(&headers), Some(UNKNOWN));
    }

    #[test]
    fn errors_below_the_layer_map_as_tonic_maps_them() {
        let shed: Box<dyn std::error::Error + Send + Sync> =
            Box::new(tower::load_shed::error::Overloaded::new());
        assert_eq!(error_status(&*shed), RESOURCE_EXHAUSTED);
        let status: Box<dyn std::error::Error + Send + Sync> =
            Box::new(tonic::Status::unavailable("store down"));
        assert_eq!(error_status(&*status), 14);
        let other: Box<dyn std::error::Error + Send + Sync> = "broken".into();
        assert_eq!(error_status(&*other), UNKNOWN);
    }

    #[test]
    fn only_served_methods_become_labels() {
        let layer = RpcMetricsLayer::new(
            &opentelemetry::global::meter("test"),
            &[
                tollgate_proto::v1::FILE_DESCRIPTOR_SET,
                b"not a descriptor set",
            ],
        );
        let known = |path: &str| {
            let recorder = Recorder::start(Arc::clone(&layer.shared), path);
            (
                recorder.service.value.to_string(),
                recorder.method.value.to_string(),
            )
        };
        assert_eq!(
            known("/tollgate.v1.Budget/Lease"),
            ("tollgate.v1.Budget".into(), "Lease".into())
        );
        assert_eq!(
            known("/tollgate.v1.Admin/FreezeScope"),
            ("tollgate.v1.Admin".into(), "FreezeScope".into())
        );
        for path in ["/tollgate.v1.Budget/Invented", "/x/y/z", "", "/"] {
            assert_eq!(known(path), (OTHER.into(), OTHER.into()), "{path}");
        }
    }
}
