//! One listener: accepts a service's connections (HTTP/1.1 and HTTP/2),
//! runs each request as an intent through the client crate's
//! [`TollgateLayer`](tollgate_client::TollgateLayer), and answers with the
//! upstream's final response, streamed, plus the gate's headers — or, when
//! the gate ends with no response, a `429`/`503`/`502`/`504` that says why.
//!
//! Cancellation starts with the handler's future being dropped: hyper
//! drops it when the service's connection closes (HTTP/1.1) or it resets
//! the stream (HTTP/2). The intent itself runs in a task of its own, and
//! the handler holds a guard that cancels the intent's token when dropped:
//! the gate then ends the intent through its own cancellation path — no
//! attempt starts after that, a wait for a slot or cooldown ends at once —
//! and records it `cancelled` in metrics and spans, which an intent dropped
//! mid-flight never is.

use std::convert::Infallible;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use bytes::Bytes;
use http::{HeaderValue, Request, Response, StatusCode};
use http_body_util::{Either, Full};
use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;
use tokio::net::TcpListener;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;
use tollgate_client::layer::{
    BoxError, GateError, GateReport, LayerConfig, TollgateService, http_repetition,
    keyed_or_non_repeatable,
};
use tollgate_client::outcome::{Outcome, ResponseStatus};
use tollgate_client::{LinkState, Repetition, Scope, Tollgate, TransportFailure};
use tower::ServiceExt as _;

use super::body::ProxyBody;
use super::config::ListenerConfig;
use super::intake::{Intake, PRIORITY_HEADER, is_grpc};
use super::route::Repeat;
use super::upstream::{self, UpstreamClient};

/// The terminal outcome (`succeeded`, `deadline_infeasible`, …).
pub const OUTCOME_HEADER: &str = "tollgate-outcome";
/// Attempts sent upstream for this request.
pub const ATTEMPTS_HEADER: &str = "tollgate-attempts";
/// Milliseconds the request spent waiting (cooldown, slot, backoff), not
/// in attempts.
pub const WAITED_HEADER: &str = "tollgate-waited-ms";
/// `connected`, or `unreachable` when the coordinator could not be asked
/// and the local fallback budget decided.
pub const COORDINATOR_HEADER: &str = "tollgate-coordinator";

/// What the service gets back.
pub type ResponseBody = Either<Incoming, Full<Bytes>>;

/// A listener's state shared by its connections.
pub(super) struct Listener {
    config: ListenerConfig,
    tollgate: Tollgate,
    http: TollgateService<UpstreamClient>,
    grpc: TollgateService<UpstreamClient>,
}

impl Listener {
    pub(super) fn new(
        config: ListenerConfig,
        tollgate: Tollgate,
    ) -> Result<Self, upstream::UpstreamError> {
        let client = upstream::client(&config)?;
        // What a request that states nothing runs under; every request
        // brings its own through its Intake, so the layer's own policy is
        // only the type's default.
        let policy = Intake::read(&config, &http::Request::new(()).into_parts().0)
            .map_err(|bad| upstream::UpstreamError::Policy(bad.to_string()))?
            .policy;
        let layer = |base: LayerConfig| {
            tower::Layer::layer(
                &tollgate.layer(
                    base.policy_per_request(move |parts| {
                        parts
                            .extensions
                            .get::<Intake>()
                            .map_or(policy, |i| i.policy)
                    })
                    .buffer_limit(config.buffer_limit),
                ),
                client.clone(),
            )
        };
        let scope = |parts: &http::request::Parts| {
            parts
                .extensions
                .get::<Intake>()
                .map_or_else(|| Scope::new("unknown", "OTHER other"), |i| i.scope.clone())
        };
        let http = layer(
            LayerConfig::http(policy, scope)
                .repetition(|parts| repeat_rule(parts, http_repetition)),
        );
        let grpc = layer(
            LayerConfig::grpc(policy, scope)
                .repetition(|parts| repeat_rule(parts, keyed_or_non_repeatable)),
        );
        Ok(Listener {
            config,
            tollgate,
            http,
            grpc,
        })
    }

    /// Serves `listener` until `drain` is cancelled, then lets requests in
    /// flight finish for up to `grace`.
    pub(super) async fn serve(
        self: Arc<Self>,
        listener: TcpListener,
        drain: CancellationToken,
        grace: Duration,
    ) {
        let mut connections = JoinSet::new();
        loop {
            tokio::select! {
                () = drain.cancelled() => break,
                accepted = listener.accept() => {
                    let Ok((stream, _peer)) = accepted else { continue };
                    let _ = stream.set_nodelay(true);
                    let this = self.clone();
                    let drain = drain.clone();
                    connections.spawn(async move { this.connection(stream, drain).await });
                }
                Some(_) = connections.join_next(), if !connections.is_empty() => {}
            }
        }
        drop(listener);
        let drained = tokio::time::timeout(grace, async {
            while connections.join_next().await.is_some() {}
        })
        .await;
        if drained.is_err() {
            tracing::warn!(
                listener = %self.config.name,
                left = connections.len(),
                "drain grace over; closing the connections left"
            );
            connections.abort_all();
        }
    }

    async fn connection(self: Arc<Self>, stream: tokio::net::TcpStream, drain: CancellationToken) {
        let this = self.clone();
        let service = hyper::service::service_fn(move |request| {
            let this = this.clone();
            async move { Ok::<_, Infallible>(this.handle(request).await) }
        });
        let builder = auto::Builder::new(TokioExecutor::new());
        let connection = builder.serve_connection(TokioIo::new(stream), service);
        tokio::pin!(connection);
        tokio::select! {
            result = connection.as_mut() => {
                if let Err(err) = result {
                    tracing::debug!(cause = %err, "service connection ended");
                }
            }
            () = drain.cancelled() => {
                connection.as_mut().graceful_shutdown();
                let _ = connection.await;
            }
        }
    }

    async fn handle(&self, request: Request<Incoming>) -> Response<ResponseBody> {
        let (mut parts, body) = request.into_parts();
        let intake = match Intake::read(&self.config, &parts) {
            Ok(intake) => intake,
            Err(bad) => return plain(StatusCode::BAD_REQUEST, &bad.to_string(), None),
        };
        let grpc = is_grpc(&parts);
        upstream::readdress(&mut parts, &self.config.upstream);
        parts.headers.remove(PRIORITY_HEADER);
        let scope = intake.scope.clone();
        parts.extensions.insert(intake);
        let mut request = Request::from_parts(parts, ProxyBody::Stream(body));
        let service = if grpc { &self.grpc } else { &self.http };
        let began = Instant::now();
        let cancel = CancellationToken::new();
        request.extensions_mut().insert(cancel.clone());
        // Dropped with this future when the service goes away. The task
        // outlives the handler only until the gate sees the token, which
        // ends every wait and attempt at once: it has no owner to outlive.
        let _leaving = cancel.drop_guard();
        let result = match tokio::spawn(service.clone().oneshot(request)).await {
            Ok(result) => result,
            Err(err) => {
                tracing::error!(listener = %self.config.name, cause = %err, "intent task failed");
                return plain(
                    StatusCode::INTERNAL_SERVER_ERROR,
                    "tollgate: the proxy failed",
                    None,
                );
            }
        };
        let elapsed = began.elapsed();
        match result {
            Ok(mut response) => {
                let report = response.extensions_mut().remove::<GateReport>();
                let (mut parts, body) = response.into_parts();
                upstream::strip_hop_by_hop(&mut parts.headers);
                let mut response = Response::from_parts(parts, Either::Left(body));
                if let Some(report) = report {
                    self.stamp(&mut response, &report, elapsed);
                }
                response
            }
            Err(err) => self.refusal(&scope, &err, elapsed),
        }
    }

    /// The gate's headers on a response.
    fn stamp(&self, response: &mut Response<ResponseBody>, report: &GateReport, elapsed: Duration) {
        let headers = response.headers_mut();
        headers.insert(
            OUTCOME_HEADER,
            HeaderValue::from_static(report.outcome.as_str()),
        );
        headers.insert(ATTEMPTS_HEADER, HeaderValue::from(report.attempts.len()));
        let waited = waited(report, elapsed);
        headers.insert(
            WAITED_HEADER,
            HeaderValue::from(u64::try_from(waited.as_millis()).unwrap_or(u64::MAX)),
        );
        let alone = self.tollgate.link_state() == LinkState::Degraded
            || report.held.as_ref().is_some_and(|w| w.degraded)
            || report.attempts.iter().any(|a| {
                a.token == tollgate_client::gate::TokenSource::Fallback
                    || a.wait.as_ref().is_some_and(|w| w.degraded)
            });
        headers.insert(
            COORDINATOR_HEADER,
            HeaderValue::from_static(if alone { "unreachable" } else { "connected" }),
        );
    }

    /// The answer when the gate ended with no upstream response to give.
    fn refusal(&self, scope: &Scope, err: &BoxError, elapsed: Duration) -> Response<ResponseBody> {
        let Some(gate) = err.downcast_ref::<GateError>() else {
            // The layer failed before the gate ran: the body could not be
            // read from the service.
            return plain(StatusCode::BAD_REQUEST, "request body: read failed", None);
        };
        let report = &gate.report;
        // Why the upstream could not be reached (a refused connection, a
        // certificate no configured root vouches for): the one thing the
        // service's developer and the operator need to fix it, so it is
        // both logged and in the answer's text.
        let cause = gate.source.as_deref().map(|err| chain(err));
        let (status, retry_after) = answer(report, tokio::time::Instant::now(), || {
            self.cooldown_left(scope)
        });
        if status == StatusCode::BAD_GATEWAY {
            tracing::warn!(
                listener = %self.config.name,
                upstream = %self.config.upstream,
                outcome = report.outcome.as_str(),
                attempts = report.attempts.len(),
                cause = cause.as_deref().unwrap_or("unknown"),
                "upstream unreachable"
            );
        }
        let text = match &cause {
            Some(cause) => format!("tollgate: {}; upstream: {cause}", report.outcome.describe()),
            None => format!("tollgate: {}", report.outcome.describe()),
        };
        let mut response = plain(status, &text, retry_after);
        self.stamp(&mut response, report, elapsed);
        response
    }

    fn cooldown_left(&self, scope: &Scope) -> Option<Duration> {
        // Wall time, as the gate's default clock reads it: the value only
        // tells the service when to come back; the gate decides nothing
        // from it.
        let until = self.tollgate.gate().cache().view(scope).cooldown_until?;
        until
            .duration_since(SystemTime::now())
            .ok()
            .filter(|d| !d.is_zero())
    }
}

/// The status and `Retry-After` of the proxy's own answer when the gate
/// ended with no upstream response, decided from the gate's report alone
/// (`now` on the gate's clock): the proxy never judges a second time.
fn answer(
    report: &GateReport,
    now: tokio::time::Instant,
    cooldown_left: impl FnOnce() -> Option<Duration>,
) -> (StatusCode, Option<Duration>) {
    let last = report.attempts.last().and_then(|a| a.record.status);
    match (report.outcome, last) {
        // Full here, not upstream: soon is as good a guess as any.
        (Outcome::CapacityUnavailable, _) => (
            StatusCode::SERVICE_UNAVAILABLE,
            Some(Duration::from_secs(1)),
        ),
        (_, Some(ResponseStatus::Transport(TransportFailure::Timeout))) => {
            (StatusCode::GATEWAY_TIMEOUT, None)
        }
        (_, Some(ResponseStatus::Transport(_))) => (StatusCode::BAD_GATEWAY, None),
        // No attempt was made: a cooldown, a slot or the budget held it.
        // The fleet knows the upstream is limiting: 429, at the instant
        // the gate would have let the request go, else the cooldown's end.
        _ => match next_start_in(report, now).or_else(cooldown_left) {
            Some(left) => (StatusCode::TOO_MANY_REQUESTS, Some(left)),
            None => (
                StatusCode::SERVICE_UNAVAILABLE,
                Some(Duration::from_secs(1)),
            ),
        },
    }
}

/// How far from `now` the gate's own next start was, when it ended
/// waiting for one: the coordinator's `Reconsider` slot, else the start
/// its wait planned, else the scope's cooldown end as the wait saw it.
/// These are what the gate decided on; the lease cache read later may
/// have moved on, and knows no slot.
fn next_start_in(report: &GateReport, now: tokio::time::Instant) -> Option<Duration> {
    let wait = report
        .held
        .as_ref()
        .or_else(|| report.attempts.last()?.wait.as_ref())?;
    let planned = Some(wait.planned_start).filter(|d| !d.is_zero());
    let at = wait.slot.or(planned).or(wait.cooldown)?;
    Some((report.began + at).saturating_duration_since(now)).filter(|d| !d.is_zero())
}

/// How long the request waited: its time in the gate less its attempts'.
fn waited(report: &GateReport, elapsed: Duration) -> Duration {
    let in_attempts: Duration = report
        .attempts
        .iter()
        .filter_map(|a| Some(a.record.receipt?.saturating_sub(a.record.start)))
        .sum();
    elapsed.saturating_sub(in_attempts)
}

/// An error and its sources on one line, each said once: hyper's client
/// error says only "client error (Connect)", the cause (a TLS alert, an
/// unknown issuer, a refused connection) is further down.
fn chain(err: &(dyn std::error::Error + 'static)) -> String {
    let mut text = err.to_string();
    let mut next = err.source();
    while let Some(err) = next {
        let part = err.to_string();
        // An io::Error wrapping another displays as that error.
        if !text.ends_with(&part) {
            text.push_str(": ");
            text.push_str(&part);
        }
        next = err.source();
    }
    text
}

/// The route's rule over the method's.
fn repeat_rule(
    parts: &http::request::Parts,
    by_method: fn(&http::request::Parts) -> Repetition,
) -> Repetition {
    match parts.extensions.get::<Intake>().map(|i| i.repeat) {
        Some(Repeat::Safe) => Repetition::Safe,
        Some(Repeat::Never) => Repetition::NonRepeatable,
        Some(Repeat::Method) | None => by_method(parts),
    }
}

/// A short text answer of the proxy's own.
fn plain(status: StatusCode, text: &str, retry_after: Option<Duration>) -> Response<ResponseBody> {
    let mut response = Response::new(Either::Right(Full::new(Bytes::from(format!("{text}\n")))));
    *response.status_mut() = status;
    response.headers_mut().insert(
        http::header::CONTENT_TYPE,
        HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    if let Some(after) = retry_after {
        // Whole seconds, rounded up: an early retry would only be refused.
        let secs = after.as_secs() + u64::from(after.subsec_nanos() > 0);
        response
            .headers_mut()
            .insert(http::header::RETRY_AFTER, HeaderValue::from(secs.max(1)));
    }
    response
}

#[cfg(test)]
mod tests {
    use tollgate_client::gate::WaitEvidence;

    use super::*;

    fn secs(s: u64) -> Duration {
        Duration::from_secs(s)
    }

    /// A report of an intent that began at `began` and ended `outcome`
    /// while held, with what the hold knew.
    fn held(began: tokio::time::Instant, outcome: Outcome, wait: WaitEvidence) -> GateReport {
        GateReport {
            outcome,
            attempts: Vec::new(),
            held: Some(wait),
            inner: None,
            began,
        }
    }

    #[test]
    fn retry_after_is_the_slot_the_gate_was_given_not_the_cooldown() {
        let began = tokio::time::Instant::now();
        let now = began + secs(1);
        // The coordinator's slot is 7 s after the intent began, past the
        // cooldown's end at 3 s: the service is told 6 s from now.
        let report = held(
            began,
            Outcome::DeadlineInfeasible,
            WaitEvidence {
                cooldown: Some(secs(3)),
                slot: Some(secs(7)),
                ..WaitEvidence::default()
            },
        );
        assert_eq!(
            answer(&report, now, || Some(secs(2))),
            (StatusCode::TOO_MANY_REQUESTS, Some(secs(6)))
        );
        // Deciding alone, the start its own wait planned.
        let report = held(
            began,
            Outcome::DeadlineInfeasible,
            WaitEvidence {
                cooldown: Some(secs(3)),
                planned_start: secs(4),
                degraded: true,
                ..WaitEvidence::default()
            },
        );
        assert_eq!(
            answer(&report, now, || None),
            (StatusCode::TOO_MANY_REQUESTS, Some(secs(3)))
        );
    }

    #[test]
    fn without_a_slot_the_cooldown_then_a_guess_answer() {
        let began = tokio::time::Instant::now();
        let now = began + secs(1);
        let cooling = held(
            began,
            Outcome::DeadlineInfeasible,
            WaitEvidence {
                cooldown: Some(secs(5)),
                ..WaitEvidence::default()
            },
        );
        assert_eq!(
            answer(&cooling, now, || None),
            (StatusCode::TOO_MANY_REQUESTS, Some(secs(4)))
        );
        // A slot already past says nothing about when to come back.
        let past = held(
            began,
            Outcome::BudgetExhausted,
            WaitEvidence {
                slot: Some(Duration::from_millis(500)),
                ..WaitEvidence::default()
            },
        );
        assert_eq!(
            answer(&past, now, || Some(secs(2))),
            (StatusCode::TOO_MANY_REQUESTS, Some(secs(2)))
        );
        assert_eq!(
            answer(&past, now, || None),
            (StatusCode::SERVICE_UNAVAILABLE, Some(secs(1)))
        );
        let full = held(began, Outcome::CapacityUnavailable, WaitEvidence::default());
        assert_eq!(
            answer(&full, now, || Some(secs(9))),
            (StatusCode::SERVICE_UNAVAILABLE, Some(secs(1)))
        );
    }
}
