//! Response classification: what one response or transport outcome says
//! about retrying, before any hint, budget or deadline is considered.
//!
//! A classification answers two questions the decision order keeps apart
//! (seed, steps 2 and 3):
//! - [`ResponseClass`]: may this kind of failure succeed on a later attempt,
//!   and how often is it worth trying?
//! - [`Effect`]: is it known that the attempt did *not* take effect, or could
//!   the upstream have applied it? Only the second question decides whether a
//!   non-repeatable operation may be sent again.
//!
//! The tables follow `a-429-is-not-an-error.md` and
//! `rate-limited-alert-delivery.txt`; each row says why. Nothing here reads a
//! hint: a throttled response's hint is read by [`crate::hint`] in the engine.

use serde::Serialize;

/// How a response bears on retrying.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ResponseClass {
    /// Done: authoritative completion evidence.
    Success,
    /// The upstream refused for capacity (429, 503, `RESOURCE_EXHAUSTED`); a
    /// wait hint may bound the earliest reconsideration time.
    Throttled,
    /// A condition that commonly clears on its own (408, 502, 504,
    /// `UNAVAILABLE`, a refused connection, a timeout).
    Transient,
    /// A server fault that may be a passing glitch or a bug that fails every
    /// time (500, `INTERNAL`, `UNKNOWN`): worth one more try, not a loop.
    RetryOnce,
    /// The request itself is wrong or refused for good; repeating it proves
    /// nothing new.
    NonRetryable,
}

impl ResponseClass {
    /// Its name, as serialized and in metrics.
    pub fn as_str(self) -> &'static str {
        match self {
            ResponseClass::Success => "success",
            ResponseClass::Throttled => "throttled",
            ResponseClass::Transient => "transient",
            ResponseClass::RetryOnce => "retry_once",
            ResponseClass::NonRetryable => "non_retryable",
        }
    }

    /// Whether a later attempt could get a different answer at all.
    pub fn is_retryable(self) -> bool {
        matches!(
            self,
            ResponseClass::Throttled | ResponseClass::Transient | ResponseClass::RetryOnce
        )
    }
}

/// What is known about the attempt's effect on the upstream.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Effect {
    /// The upstream did not apply the request: it refused it, or it was never
    /// sent. Sending it again is a first performance, not a repeat.
    Absent,
    /// The upstream may have applied it (the response was lost, or a gateway
    /// could not tell). Repeating needs a repeat-safe operation or a
    /// reconciliation first.
    Unknown,
    /// The upstream applied it (a 2xx).
    Applied,
}

/// The classification of one response or transport outcome.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Classification {
    /// How the response bears on retrying.
    pub class: ResponseClass,
    /// What is known about the attempt's effect.
    pub effect: Effect,
}

const fn class(class: ResponseClass, effect: Effect) -> Classification {
    Classification { class, effect }
}

/// Classifies an HTTP status.
///
/// | status | class | effect | why |
/// |---|---|---|---|
/// | 2xx | success | applied | |
/// | 429 | throttled | absent | the server refused the request for capacity and said so (RFC 6585 §4) |
/// | 503 | throttled | unknown | overload, so it feeds the budget as throttling evidence (RFC 9110 §15.6.4); but a gateway or load balancer may answer 503 after its upstream acted, so only a repeat-safe operation is sent again |
/// | 408 | transient | absent | the server gave up *waiting for the request*, so it never ran |
/// | 502, 504 | transient | unknown | a gateway cannot tell whether the upstream acted before the failure |
/// | 500 | retry once | unknown | a glitch clears on one retry; a bug fails every time, so more retries only add load |
/// | 409 and other 4xx | non-retryable | absent | the request is wrong (or conflicts) and will be refused again: re-read, fix, send once |
/// | other 1xx/3xx/5xx | non-retryable | unknown | nothing says a repeat would help, and nothing says the effect is absent |
pub fn classify_http(status: u16) -> Classification {
    use Effect::*;
    use ResponseClass::*;
    match status {
        200..=299 => class(Success, Applied),
        429 => class(Throttled, Absent),
        503 => class(Throttled, Unknown),
        408 => class(Transient, Absent),
        502 | 504 => class(Transient, Unknown),
        500 => class(RetryOnce, Unknown),
        400..=499 => class(NonRetryable, Absent),
        _ => class(NonRetryable, Unknown),
    }
}

/// Classifies an HTTP status against an operator's explicit list of
/// retryable statuses (`retry_statuses` in a scenario), which replaces the
/// table's notion of *whether* to retry but not its notion of the effect.
///
/// A 2xx is still success and a status outside the list is non-retryable. A
/// listed status keeps its table class when that class is retryable (so a
/// listed 429 is still throttled); a listed status the table would refuse or
/// retry only once is retried as transient, because the operator's list is
/// the more specific rule.
pub fn classify_http_listed(status: u16, retry_statuses: &[u16]) -> Classification {
    let table = classify_http(status);
    match table.class {
        ResponseClass::Success => table,
        _ if !retry_statuses.contains(&status) => class(ResponseClass::NonRetryable, table.effect),
        ResponseClass::Throttled | ResponseClass::Transient => table,
        ResponseClass::RetryOnce | ResponseClass::NonRetryable => {
            class(ResponseClass::Transient, table.effect)
        }
    }
}

/// gRPC status codes, numbered as on the wire, so this crate needs no tonic
/// dependency for classification (`tonic::Code as i32` converts).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
#[allow(missing_docs)] // The names are the gRPC specification's.
pub enum GrpcCode {
    Ok = 0,
    Cancelled = 1,
    Unknown = 2,
    InvalidArgument = 3,
    DeadlineExceeded = 4,
    NotFound = 5,
    AlreadyExists = 6,
    PermissionDenied = 7,
    ResourceExhausted = 8,
    FailedPrecondition = 9,
    Aborted = 10,
    OutOfRange = 11,
    Unimplemented = 12,
    Internal = 13,
    Unavailable = 14,
    DataLoss = 15,
    Unauthenticated = 16,
}

impl GrpcCode {
    /// The code for a wire number; unknown numbers are `UNKNOWN`, as the gRPC
    /// specification tells a client to treat them.
    pub fn from_i32(code: i32) -> GrpcCode {
        use GrpcCode::*;
        const ALL: [GrpcCode; 17] = [
            Ok,
            Cancelled,
            Unknown,
            InvalidArgument,
            DeadlineExceeded,
            NotFound,
            AlreadyExists,
            PermissionDenied,
            ResourceExhausted,
            FailedPrecondition,
            Aborted,
            OutOfRange,
            Unimplemented,
            Internal,
            Unavailable,
            DataLoss,
            Unauthenticated,
        ];
        usize::try_from(code)
            .ok()
            .and_then(|i| ALL.get(i).copied())
            .unwrap_or(Unknown)
    }
}

/// Whether the request had left the client when the failure happened; it
/// decides whether a deadline or reset could have hidden an applied effect.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Sent {
    /// The request never reached the wire.
    Before,
    /// The request was (at least partly) sent.
    After,
}

/// Classifies a gRPC status code.
///
/// | code | class | effect | why |
/// |---|---|---|---|
/// | `OK` | success | applied | |
/// | `RESOURCE_EXHAUSTED` | throttled | absent | the gRPC form of 429; `grpc-retry-pushback-ms` is its hint |
/// | `UNAVAILABLE` | transient | unknown | retryable by gRPC's own guidance, which also warns it is not always safe for non-idempotent calls |
/// | `DEADLINE_EXCEEDED` before send | transient | absent | nothing left the client |
/// | `DEADLINE_EXCEEDED` after send | transient | unknown | the server may have finished after the client stopped listening |
/// | `INTERNAL`, `UNKNOWN` | retry once | unknown | as HTTP 500 |
/// | all others | non-retryable | absent | the request is wrong or refused for good (`ABORTED` belongs to a higher-level transaction retry, not this one) |
pub fn classify_grpc(code: GrpcCode, sent: Sent) -> Classification {
    use Effect::*;
    use ResponseClass::*;
    match (code, sent) {
        (GrpcCode::Ok, _) => class(Success, Applied),
        (GrpcCode::ResourceExhausted, _) => class(Throttled, Absent),
        (GrpcCode::Unavailable, _) => class(Transient, Unknown),
        (GrpcCode::DeadlineExceeded, Sent::Before) => class(Transient, Absent),
        (GrpcCode::DeadlineExceeded, Sent::After) => class(Transient, Unknown),
        (GrpcCode::Internal | GrpcCode::Unknown, _) => class(RetryOnce, Unknown),
        _ => class(NonRetryable, Absent),
    }
}

/// A failure below the protocol: no status was received.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum TransportFailure {
    /// The connection was refused: the request was never sent.
    ConnectRefused,
    /// The name did not resolve: the request was never sent.
    Dns,
    /// No response within the attempt's cap, after the request was sent.
    Timeout,
    /// The connection was reset after the request was sent.
    Reset,
}

/// Classifies a transport failure.
///
/// A failure before send is safe to retry whatever the operation: the effect
/// is known to be absent. A timeout or reset after send leaves the effect
/// unknown, so only a repeat-safe operation may simply go again; the engine
/// turns the rest into `reconciliation_required` or `indeterminate`.
pub fn classify_transport(failure: TransportFailure) -> Classification {
    match failure {
        TransportFailure::ConnectRefused | TransportFailure::Dns => {
            class(ResponseClass::Transient, Effect::Absent)
        }
        TransportFailure::Timeout | TransportFailure::Reset => {
            class(ResponseClass::Transient, Effect::Unknown)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use Effect::*;
    use ResponseClass::*;

    #[test]
    fn http_table() {
        let rows: &[(u16, ResponseClass, Effect)] = &[
            (200, Success, Applied),
            (204, Success, Applied),
            (429, Throttled, Absent),
            (503, Throttled, Unknown),
            (408, Transient, Absent),
            (502, Transient, Unknown),
            (504, Transient, Unknown),
            (500, RetryOnce, Unknown),
            (409, NonRetryable, Absent),
            (400, NonRetryable, Absent),
            (401, NonRetryable, Absent),
            (403, NonRetryable, Absent),
            (404, NonRetryable, Absent),
            (422, NonRetryable, Absent),
            (501, NonRetryable, Unknown),
            (302, NonRetryable, Unknown),
        ];
        for &(status, class, effect) in rows {
            assert_eq!(
                classify_http(status),
                Classification { class, effect },
                "{status}"
            );
        }
    }

    #[test]
    fn an_explicit_list_decides_whether_but_not_the_effect() {
        let list = [429, 500, 409];
        assert_eq!(classify_http_listed(200, &list).class, Success);
        assert_eq!(classify_http_listed(429, &list).class, Throttled);
        assert_eq!(classify_http_listed(500, &list), class(Transient, Unknown));
        assert_eq!(classify_http_listed(409, &list), class(Transient, Absent));
        assert_eq!(classify_http_listed(503, &list).class, NonRetryable);
        assert_eq!(
            classify_http_listed(504, &list),
            class(NonRetryable, Unknown)
        );
    }

    #[test]
    fn grpc_table() {
        use GrpcCode as G;
        let rows: &[(GrpcCode, Sent, ResponseClass, Effect)] = &[
            (G::Ok, Sent::After, Success, Applied),
            (G::ResourceExhausted, Sent::After, Throttled, Absent),
            (G::Unavailable, Sent::After, Transient, Unknown),
            (G::DeadlineExceeded, Sent::Before, Transient, Absent),
            (G::DeadlineExceeded, Sent::After, Transient, Unknown),
            (G::Internal, Sent::After, RetryOnce, Unknown),
            (G::Unknown, Sent::After, RetryOnce, Unknown),
            (G::InvalidArgument, Sent::After, NonRetryable, Absent),
            (G::PermissionDenied, Sent::After, NonRetryable, Absent),
            (G::Aborted, Sent::After, NonRetryable, Absent),
            (G::Unauthenticated, Sent::After, NonRetryable, Absent),
        ];
        for &(code, sent, class, effect) in rows {
            assert_eq!(
                classify_grpc(code, sent),
                Classification { class, effect },
                "{code:?} {sent:?}"
            );
        }
    }

    #[test]
    fn grpc_codes_round_trip_and_unknown_numbers_are_unknown() {
        for n in 0..=16 {
            assert_eq!(GrpcCode::from_i32(n) as i32, n);
        }
        assert_eq!(GrpcCode::from_i32(17), GrpcCode::Unknown);
        assert_eq!(GrpcCode::from_i32(-1), GrpcCode::Unknown);
    }

    #[test]
    fn transport_before_send_is_absent_after_send_is_unknown() {
        use TransportFailure::*;
        assert_eq!(classify_transport(ConnectRefused), class(Transient, Absent));
        assert_eq!(classify_transport(Dns), class(Transient, Absent));
        assert_eq!(classify_transport(Timeout), class(Transient, Unknown));
        assert_eq!(classify_transport(Reset), class(Transient, Unknown));
    }
}
