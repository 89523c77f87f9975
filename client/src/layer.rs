//! A tower [`Layer`] that puts HTTP and tonic clients behind a [`Gate`].
//!
//! `TollgateLayer` + `TollgateService<S>` wrap any `Service<http::Request<B>>`: a
//! hyper client, or a tonic `Channel` (gRPC is HTTP/2 underneath). Every
//! request becomes one intent run by the gate; the response handed back is
//! the last one received, with the gate's [`GateReport`] in its extensions.
//!
//! # What may be retried
//! Only a request whose body can be sent again: a body that clones
//! ([`ReplayBody::try_clone`], e.g. `Full<Bytes>`, `String`) or, when the
//! request is repeatable, one the layer may read into memory first
//! ([`ReplayBody::from_buffer`], e.g. tonic's unary bodies, up to
//! [`LayerConfig::buffer_limit`]). A body longer than the limit fails the
//! request, unless its type can be put back together from what was read
//! and the rest ([`ReplayBody::rejoin`]): then it is sent once, streamed,
//! and never held past the limit. Any other request gets exactly one
//! attempt and is non-repeatable.
//!
//! Whether a request is *safe* to repeat is a separate question, answered
//! per request by [`LayerConfig::repetition`]: by default the idempotent
//! HTTP methods are safe, a request carrying an `Idempotency-Key` header is
//! deduplicated by it, and every other request (including every gRPC call,
//! whose idempotency the layer cannot know) is non-repeatable.
//!
//! # Per request
//! The policy (its deadline above all) may be decided per request
//! ([`LayerConfig::policy_per_request`]), as the scope and the repetition
//! rule are. Dropping the future a call returns cancels its intent: no
//! attempt starts after it, and a wait (for a slot, a cooldown, a backoff)
//! ends at once; a server that drops its handler when its client goes away
//! gets this for nothing. A dropped intent records no outcome, though: to
//! have it end `cancelled` in metrics and spans, put a
//! [`CancellationToken`] in the request's extensions, cancel it, and let
//! the call run to its end (the gate's own cancellation path,
//! [`GateIntent::cancel_token`]).
//!
//! # Classification
//! HTTP: the status and `Retry-After`. gRPC: `grpc-status` and
//! `grpc-retry-pushback-ms` from a trailers-only response's headers (a
//! status sent in trailers after a streamed body is the caller's to read);
//! a non-200 HTTP status maps as gRPC's HTTP-to-status table says. Errors
//! from the inner service are a refused connection (nothing sent) when the
//! error chain says so, and otherwise a reset after send (effect unknown).
//!
//! # One owner
//! A request already marked with [`RETRY_OWNER_HEADER`](crate::owner::RETRY_OWNER_HEADER)
//! is owned above: one attempt, `owner_elsewhere`, evidence passed up. Every
//! request this layer sends carries the mark.

use std::error::Error as StdError;
use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::task::{Context, Poll};

use bytes::Bytes;
use http::request::Parts;
use http::{Method, Request, Response};
use http_body_util::{BodyExt, Empty, Full};
use tokio_util::sync::CancellationToken;
use tower::{Layer, Service, ServiceExt};

use crate::classify::{GrpcCode, Sent, TransportFailure};
use crate::engine::{IntentPolicy, Observation};
use crate::gate::{AttemptEvidence, BoxFuture, Gate, GateIntent, Repetition, WaitEvidence};
use crate::outcome::Outcome;
use crate::owner::OwnerMark;
use crate::scope::Scope;

/// The error type of a wrapped service: the inner service's error, or the
/// gate's [`GateError`] when it ended without one to hand back.
pub type BoxError = Box<dyn StdError + Send + Sync>;

/// The request header whose value deduplicates attempts upstream.
pub const IDEMPOTENCY_KEY_HEADER: &str = "idempotency-key";

/// The most request body buffered for replay by default: tonic's default
/// message size limit.
pub const DEFAULT_BUFFER_LIMIT: usize = 4 * 1024 * 1024;

/// A request body longer than [`LayerConfig::buffer_limit`], of a type that
/// cannot be sent once instead ([`ReplayBody::rejoin`]).
#[derive(Debug, thiserror::Error)]
#[error("request body longer than the {limit}-byte replay buffer")]
pub struct BodyTooLarge {
    /// The limit it exceeded.
    pub limit: usize,
}

/// A request body the layer may send more than once. `Unpin` because the
/// layer reads a body in place and may hand it on afterwards
/// ([`rejoin`](Self::rejoin)); every body type worth replaying (bytes, a
/// boxed stream) is.
pub trait ReplayBody: http_body::Body<Data = Bytes> + Sized + Send + Unpin + 'static {
    /// Whether [`from_buffer`](Self::from_buffer) works, so the layer may read
    /// the body into memory to replay it.
    const BUFFERABLE: bool = false;

    /// A copy for another attempt, or `None` if this body cannot be copied.
    fn try_clone(&self) -> Option<Self> {
        None
    }

    /// A body with these bytes, if the type can be built from them.
    fn from_buffer(bytes: Bytes) -> Option<Self> {
        let _ = bytes;
        None
    }

    /// A body that sends `prefix` (what the layer read while buffering)
    /// and then the rest of `rest`, if the type can be built so. Lets a
    /// body longer than the buffer limit be sent once instead of failing
    /// the request; `None` (the default) keeps the failure.
    fn rejoin(prefix: Bytes, rest: Self) -> Option<Self> {
        let _ = (prefix, rest);
        None
    }
}

impl ReplayBody for Full<Bytes> {
    fn try_clone(&self) -> Option<Self> {
        Some(self.clone())
    }
}

impl ReplayBody for Empty<Bytes> {
    fn try_clone(&self) -> Option<Self> {
        Some(Empty::new())
    }
}

impl ReplayBody for String {
    fn try_clone(&self) -> Option<Self> {
        Some(self.clone())
    }
}

impl ReplayBody for tonic::body::Body {
    // A tonic body is a stream; it is replayable only once read into memory,
    // which the layer does only for repeatable (unary) requests.
    const BUFFERABLE: bool = true;

    fn from_buffer(bytes: Bytes) -> Option<Self> {
        Some(tonic::body::Body::new(Full::new(bytes)))
    }
}

/// Which protocol the wrapped client speaks; it decides classification.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Protocol {
    /// HTTP status and `Retry-After`.
    Http,
    /// gRPC status and `grpc-retry-pushback-ms`.
    Grpc,
}

type PartsFn<T> = Arc<dyn Fn(&Parts) -> T + Send + Sync>;

/// How the layer turns a request into an intent.
#[derive(Clone)]
pub struct LayerConfig {
    protocol: Protocol,
    policy: IntentPolicy,
    /// Replaces `policy` when set: a deadline read from the request, an
    /// attempt count that depends on the route.
    policy_per_request: Option<PartsFn<IntentPolicy>>,
    scope: PartsFn<Scope>,
    repetition: PartsFn<Repetition>,
    buffer_limit: usize,
}

impl fmt::Debug for LayerConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LayerConfig")
            .field("protocol", &self.protocol)
            .field("policy", &self.policy)
            .field("policy_per_request", &self.policy_per_request.is_some())
            .field("buffer_limit", &self.buffer_limit)
            .finish_non_exhaustive()
    }
}

impl LayerConfig {
    /// For an HTTP client. `scope` names a request's scope: a route template
    /// or operation class, never the raw URL with ids in it.
    pub fn http(
        policy: IntentPolicy,
        scope: impl Fn(&Parts) -> Scope + Send + Sync + 'static,
    ) -> Self {
        LayerConfig {
            protocol: Protocol::Http,
            policy,
            policy_per_request: None,
            scope: Arc::new(scope),
            repetition: Arc::new(http_repetition),
            buffer_limit: DEFAULT_BUFFER_LIMIT,
        }
    }

    /// For a tonic channel. `scope` usually maps the method path
    /// (`/pkg.Service/Method`) to a scope.
    pub fn grpc(
        policy: IntentPolicy,
        scope: impl Fn(&Parts) -> Scope + Send + Sync + 'static,
    ) -> Self {
        LayerConfig {
            protocol: Protocol::Grpc,
            policy,
            policy_per_request: None,
            scope: Arc::new(scope),
            repetition: Arc::new(keyed_or_non_repeatable),
            buffer_limit: DEFAULT_BUFFER_LIMIT,
        }
    }

    /// Decides per request whether it may be repeated (mark only unary gRPC
    /// methods repeatable: their bodies are buffered to replay them).
    pub fn repetition(
        mut self,
        decide: impl Fn(&Parts) -> Repetition + Send + Sync + 'static,
    ) -> Self {
        self.repetition = Arc::new(decide);
        self
    }

    /// Decides per request the policy it runs under (a deadline a request
    /// header states, within bounds the caller sets); the constructor's
    /// policy is then unused.
    pub fn policy_per_request(
        mut self,
        decide: impl Fn(&Parts) -> IntentPolicy + Send + Sync + 'static,
    ) -> Self {
        self.policy_per_request = Some(Arc::new(decide));
        self
    }

    /// The largest body read into memory for replay; a larger one fails
    /// the request rather than growing memory, or is sent once when its
    /// type can be rejoined ([`ReplayBody::rejoin`]).
    pub fn buffer_limit(mut self, limit: usize) -> Self {
        self.buffer_limit = limit;
        self
    }
}

/// The HTTP rule [`LayerConfig::http`] applies by default: the idempotent
/// methods of RFC 9110 §9.2.2 are safe to repeat, any other request is
/// deduplicated by its `Idempotency-Key` or not repeated at all. Public so
/// a caller that overrides some requests keeps it for the rest.
pub fn http_repetition(parts: &Parts) -> Repetition {
    let idempotent = [
        Method::GET,
        Method::HEAD,
        Method::OPTIONS,
        Method::TRACE,
        Method::PUT,
        Method::DELETE,
    ];
    if idempotent.contains(&parts.method) {
        Repetition::Safe
    } else {
        keyed_or_non_repeatable(parts)
    }
}

/// The gRPC rule [`LayerConfig::grpc`] applies by default: deduplicated by
/// an `idempotency-key` header, or not repeated at all.
pub fn keyed_or_non_repeatable(parts: &Parts) -> Repetition {
    match parts
        .headers
        .get(IDEMPOTENCY_KEY_HEADER)
        .and_then(|v| v.to_str().ok())
    {
        Some(key) if !key.is_empty() => Repetition::IdempotencyKey(key.into()),
        _ => Repetition::NonRepeatable,
    }
}

/// What the gate did with a request, in the response's extensions (or in
/// the [`GateError`]).
#[derive(Debug, Clone)]
pub struct GateReport {
    /// The terminal outcome.
    pub outcome: Outcome,
    /// One record per attempt this layer made.
    pub attempts: Vec<AttemptEvidence>,
    /// The wait before the first attempt, when a cooldown or the route's
    /// pacing held it (as [`IntentResult::held`](crate::IntentResult)).
    pub held: Option<WaitEvidence>,
    /// The report of a gate below that found this layer's mark, from the
    /// last response.
    pub inner: Option<Box<GateReport>>,
    /// When the intent began; the evidence's elapsed times count from it
    /// (as [`IntentResult::began`](crate::IntentResult)).
    pub began: tokio::time::Instant,
}

/// The gate ended a request with no response to hand back, or with the inner
/// service's error as the last reply.
#[derive(Debug, thiserror::Error)]
#[error("{}", .report.outcome.describe())]
pub struct GateError {
    /// What happened.
    pub report: GateReport,
    /// The inner service's last error, if the last reply was one.
    #[source]
    pub source: Option<BoxError>,
}

/// Wraps services in [`TollgateService`].
#[derive(Debug, Clone)]
pub struct TollgateLayer {
    gate: Gate,
    config: LayerConfig,
    next_id: Arc<AtomicU64>,
}

impl TollgateLayer {
    /// A layer running every request through `gate`.
    pub fn new(gate: Gate, config: LayerConfig) -> Self {
        TollgateLayer {
            gate,
            config,
            next_id: Arc::default(),
        }
    }
}

impl<S> Layer<S> for TollgateLayer {
    type Service = TollgateService<S>;

    fn layer(&self, inner: S) -> TollgateService<S> {
        TollgateService {
            inner,
            gate: self.gate.clone(),
            config: self.config.clone(),
            next_id: self.next_id.clone(),
        }
    }
}

/// A service whose requests are run as intents by a [`Gate`].
#[derive(Debug, Clone)]
pub struct TollgateService<S> {
    inner: S,
    gate: Gate,
    config: LayerConfig,
    next_id: Arc<AtomicU64>,
}

impl<S, B, ResBody> Service<Request<B>> for TollgateService<S>
where
    S: Service<Request<B>, Response = Response<ResBody>> + Clone + Send + 'static,
    S::Future: Send,
    S::Error: Into<BoxError>,
    B: ReplayBody,
    B::Error: Into<BoxError>,
    ResBody: Send + 'static,
{
    type Response = Response<ResBody>;
    type Error = BoxError;
    type Future = BoxFuture<Result<Response<ResBody>, BoxError>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        // Each attempt drives readiness on its own clone of the inner
        // service, inside its reserved cap: readiness reserved now would be
        // stale by the time a retry is admitted.
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: Request<B>) -> Self::Future {
        let inner = self.inner.clone();
        let gate = self.gate.clone();
        let config = self.config.clone();
        let number = self.next_id.fetch_add(1, Ordering::Relaxed);
        Box::pin(async move {
            let intent_id = format!("{}-{number}", gate.cache().link().worker_id());
            run(gate, config, inner, intent_id, request).await
        })
    }
}

/// Where each attempt's body comes from.
enum Bodies<B> {
    Clones(B),
    Buffered(Bytes),
    Once(Option<B>),
}

impl<B: ReplayBody> Bodies<B> {
    async fn prepare(body: B, repeatable: bool, limit: usize) -> Result<Self, BoxError>
    where
        B::Error: Into<BoxError>,
    {
        if body.try_clone().is_some() {
            return Ok(Bodies::Clones(body));
        }
        if repeatable && B::BUFFERABLE {
            return Self::buffer(body, limit).await;
        }
        Ok(Bodies::Once(Some(body)))
    }

    /// Reads `body` into memory up to `limit`. Past it, the body is sent
    /// once when it can be rejoined, and the request fails otherwise;
    /// either way no more than `limit` plus one frame is ever held.
    /// Trailers are not kept: a buffered body is its data.
    async fn buffer(mut body: B, limit: usize) -> Result<Self, BoxError>
    where
        B::Error: Into<BoxError>,
    {
        let mut held = bytes::BytesMut::new();
        while let Some(frame) = body.frame().await {
            let Ok(data) = frame.map_err(Into::into)?.into_data() else {
                continue;
            };
            held.extend_from_slice(&data);
            if held.len() > limit {
                return match B::rejoin(held.freeze(), body) {
                    Some(whole) => Ok(Bodies::Once(Some(whole))),
                    None => Err(Box::new(BodyTooLarge { limit })),
                };
            }
        }
        Ok(Bodies::Buffered(held.freeze()))
    }

    fn replayable(&self) -> bool {
        !matches!(self, Bodies::Once(_))
    }

    fn next(&mut self) -> Option<B> {
        match self {
            Bodies::Clones(body) => body.try_clone(),
            Bodies::Buffered(bytes) => B::from_buffer(bytes.clone()),
            Bodies::Once(body) => body.take(),
        }
    }
}

async fn run<S, B, ResBody>(
    gate: Gate,
    config: LayerConfig,
    inner: S,
    intent_id: String,
    request: Request<B>,
) -> Result<Response<ResBody>, BoxError>
where
    S: Service<Request<B>, Response = Response<ResBody>> + Clone + Send + 'static,
    S::Future: Send,
    S::Error: Into<BoxError>,
    B: ReplayBody,
    B::Error: Into<BoxError>,
{
    let (parts, body) = request.into_parts();
    let owned_by = OwnerMark::from_headers(&parts.headers);
    let mut repetition = (config.repetition)(&parts);
    let repeatable = !matches!(repetition, Repetition::NonRepeatable);
    let mut bodies = Bodies::prepare(body, repeatable, config.buffer_limit).await?;
    let mut policy = match &config.policy_per_request {
        Some(decide) => decide(&parts),
        None => config.policy,
    };
    if !bodies.replayable() {
        // The body can be sent once, physically: one attempt, whatever the
        // response says.
        repetition = Repetition::NonRepeatable;
        policy = single_attempt(policy);
    }
    let mut intent = GateIntent::new(intent_id, (config.scope)(&parts), policy)
        .repetition(repetition)
        .owned_by(owned_by);
    if let Some(cancel) = parts.extensions.get::<CancellationToken>() {
        intent = intent.cancel_token(cancel.clone());
    }
    let protocol = config.protocol;
    let result = gate
        .run(intent, move |attempt| {
            let mut parts = parts.clone();
            attempt.owner_mark.apply(&mut parts.headers);
            if let Some(key) = &attempt.idempotency_key
                && let Ok(value) = http::HeaderValue::from_str(key)
            {
                parts.headers.insert(IDEMPOTENCY_KEY_HEADER, value);
            }
            let body = bodies.next();
            let mut service = inner.clone();
            async move {
                let Some(body) = body else {
                    // Unreachable with one attempt per unreplayable body;
                    // if it happens, nothing was sent.
                    return crate::gate::Reply::failed(Observation::transport(
                        TransportFailure::ConnectRefused,
                    ));
                };
                let request = Request::from_parts(parts, body);
                let answer: Result<Response<ResBody>, BoxError> = async {
                    let ready = service.ready().await.map_err(Into::into)?;
                    ready.call(request).await.map_err(Into::into)
                }
                .await;
                match answer {
                    Ok(response) => {
                        let observation = classify_response(protocol, &response);
                        crate::gate::Reply::new(observation, Ok(response))
                    }
                    Err(err) => {
                        let observation = classify_error(protocol, &*err);
                        crate::gate::Reply::new(observation, Err(err))
                    }
                }
            }
        })
        .await;
    let report = |inner| GateReport {
        outcome: result.outcome,
        attempts: result.attempts.clone(),
        held: result.held.clone(),
        inner,
        began: result.began,
    };
    match result.value {
        Some(Ok(mut response)) => {
            let inner = response
                .extensions_mut()
                .remove::<GateReport>()
                .map(Box::new);
            response.extensions_mut().insert(report(inner));
            Ok(response)
        }
        Some(Err(err)) => {
            let inner = err
                .downcast_ref::<GateError>()
                .map(|e| Box::new(e.report.clone()));
            Err(Box::new(GateError {
                report: report(inner),
                source: Some(err),
            }))
        }
        None => Err(Box::new(GateError {
            report: report(None),
            source: None,
        })),
    }
}

/// The same policy with one attempt.
fn single_attempt(policy: IntentPolicy) -> IntentPolicy {
    IntentPolicy::try_new(
        policy.total_budget(),
        1,
        policy.attempt_cap(),
        policy.min_wait(),
        policy.backoff(),
        policy.max_hint(),
    )
    // Only max_attempts changed, and 1 is valid.
    .unwrap_or(policy)
}

/// Classifies a response of the given protocol.
pub fn classify_response<B>(protocol: Protocol, response: &Response<B>) -> Observation {
    match protocol {
        Protocol::Http => classify_http_response(response),
        Protocol::Grpc => classify_grpc_response(response),
    }
}

/// An HTTP response: its status, raw `Retry-After` and stated limit.
pub fn classify_http_response<B>(response: &Response<B>) -> Observation {
    let hint = header_text(response.headers(), http::header::RETRY_AFTER.as_str());
    Observation::http(response.status().as_u16(), hint.as_deref())
        .with_stated(stated_limit(response.headers()))
}

/// A gRPC response, from its headers (a trailers-only response carries its
/// status there).
pub fn classify_grpc_response<B>(response: &Response<B>) -> Observation {
    let headers = response.headers();
    let pushback = header_text(headers, "grpc-retry-pushback-ms");
    let code = match header_text(headers, "grpc-status") {
        Some(code) => GrpcCode::from_i32(code.trim().parse().unwrap_or(GrpcCode::Unknown as i32)),
        None => grpc_code_for_http(response.status().as_u16()),
    };
    Observation::grpc(code, Sent::After, pushback.as_deref()).with_stated(stated_limit(headers))
}

/// The stated-limit fields among `headers`, read on every response (a
/// success states the quota as well as a refusal does). Values that are not
/// text are kept lossily, as hints are.
fn stated_limit(headers: &http::HeaderMap) -> Vec<crate::ratelimit::StatedField> {
    let text: Vec<(&str, String)> = headers
        .iter()
        .filter(|(name, _)| {
            let name = name.as_str();
            name.starts_with("ratelimit") || name.starts_with("x-rate")
        })
        .map(|(name, value)| {
            (
                name.as_str(),
                String::from_utf8_lossy(value.as_bytes()).into_owned(),
            )
        })
        .collect();
    crate::ratelimit::stated_fields(text.iter().map(|(n, v)| (*n, v.as_str())))
}

/// gRPC's HTTP-to-status mapping, for a response that has no `grpc-status`
/// (a proxy answered, not the server).
fn grpc_code_for_http(status: u16) -> GrpcCode {
    match status {
        200 => GrpcCode::Ok,
        400 => GrpcCode::Internal,
        401 => GrpcCode::Unauthenticated,
        403 => GrpcCode::PermissionDenied,
        404 => GrpcCode::Unimplemented,
        429 | 502 | 503 | 504 => GrpcCode::Unavailable,
        _ => GrpcCode::Unknown,
    }
}

/// Classifies an error from the inner service: a refused connection was
/// never sent; a gRPC status is classified by its code (and pushback); any
/// other failure may have happened after the request left.
pub fn classify_error(protocol: Protocol, error: &(dyn StdError + 'static)) -> Observation {
    let mut cause: Option<&(dyn StdError + 'static)> = Some(error);
    while let Some(err) = cause {
        if let Some(io) = err.downcast_ref::<std::io::Error>()
            && io.kind() == std::io::ErrorKind::ConnectionRefused
        {
            return Observation::transport(TransportFailure::ConnectRefused);
        }
        if protocol == Protocol::Grpc
            && let Some(status) = err.downcast_ref::<tonic::Status>()
        {
            let pushback = status
                .metadata()
                .get("grpc-retry-pushback-ms")
                .and_then(|v| v.to_str().ok());
            return Observation::grpc(
                GrpcCode::from_i32(status.code() as i32),
                Sent::After,
                pushback,
            );
        }
        cause = err.source();
    }
    Observation::transport(TransportFailure::Reset)
}

/// A header as text; bytes that are not UTF-8 are kept lossily, so a
/// malformed hint is still evidence (and is read as invalid, never as zero).
fn header_text(headers: &http::HeaderMap, name: &str) -> Option<String> {
    headers
        .get(name)
        .map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned())
}

#[cfg(test)]
mod tests {
    use std::collections::VecDeque;
    use std::pin::Pin;
    use std::task::{Context, Poll};

    use bytes::Bytes;
    use http_body::Frame;

    use super::*;

    /// A stream of chunks that cannot be cloned, counting what was pulled
    /// from it, and rejoinable when `rejoins`.
    struct Chunks {
        ahead: Option<Bytes>,
        chunks: VecDeque<Bytes>,
        rejoins: bool,
    }

    impl http_body::Body for Chunks {
        type Data = Bytes;
        type Error = std::convert::Infallible;

        fn poll_frame(
            self: Pin<&mut Self>,
            _cx: &mut Context<'_>,
        ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
            let this = self.get_mut();
            let next = this.ahead.take().or_else(|| this.chunks.pop_front());
            Poll::Ready(next.map(|b| Ok(Frame::data(b))))
        }
    }

    impl ReplayBody for Chunks {
        const BUFFERABLE: bool = true;

        fn from_buffer(bytes: Bytes) -> Option<Self> {
            Some(Chunks {
                ahead: Some(bytes),
                chunks: VecDeque::new(),
                rejoins: false,
            })
        }

        fn rejoin(prefix: Bytes, rest: Self) -> Option<Self> {
            rest.rejoins.then_some(Chunks {
                ahead: Some(prefix),
                ..rest
            })
        }
    }

    fn chunks(sizes: &[usize], rejoins: bool) -> Chunks {
        Chunks {
            ahead: None,
            chunks: sizes.iter().map(|&n| Bytes::from(vec![b'x'; n])).collect(),
            rejoins,
        }
    }

    async fn collect(body: Chunks) -> usize {
        body.collect()
            .await
            .map(|c| c.to_bytes().len())
            .unwrap_or(0)
    }

    #[tokio::test]
    async fn a_body_within_the_limit_is_buffered_for_replay() {
        let mut bodies = Bodies::prepare(chunks(&[4, 4], true), true, 8)
            .await
            .expect("buffered");
        assert!(bodies.replayable());
        for _ in 0..3 {
            let body = bodies.next().expect("a replay");
            assert_eq!(collect(body).await, 8);
        }
    }

    #[tokio::test]
    async fn a_longer_body_is_sent_once_whole_and_read_no_further_than_the_limit() {
        let mut bodies = Bodies::prepare(chunks(&[4, 4, 4, 100], true), true, 8)
            .await
            .expect("sent once");
        assert!(!bodies.replayable());
        let Bodies::Once(Some(body)) = &bodies else {
            panic!("one attempt's body");
        };
        // Read up to the first chunk past the limit, the rest left in the
        // stream for the attempt to send.
        assert_eq!(body.chunks.len(), 1, "never held past the limit");
        let body = bodies.next().expect("the one body");
        assert_eq!(collect(body).await, 112);
        assert!(bodies.next().is_none(), "no second attempt's body");
    }

    #[tokio::test]
    async fn a_longer_body_that_cannot_be_rejoined_fails_the_request() {
        let err = Bodies::prepare(chunks(&[4, 4, 4], false), true, 8)
            .await
            .err()
            .expect("refused");
        assert!(err.downcast_ref::<BodyTooLarge>().is_some(), "{err}");
    }
}
