//! What a proxied request asks of the gate, read from its headers and the
//! listener's configuration: its scope (caller scope, route name, priority
//! class), its deadline and how it may be repeated. Pure: no I/O, no clock.
//!
//! A header the service sets wrongly is refused with a `400` naming it,
//! never guessed around: a typo in a deadline silently replaced by the
//! default would be found only in an incident.

use std::time::Duration;

use http::request::Parts;
use tollgate_client::engine::IntentPolicy;
use tollgate_client::{Priority, Scope};

use super::config::ListenerConfig;
use super::route::{PriorityName, Repeat};

/// The request's deadline in seconds (`2`, `0.25`), for HTTP requests.
pub const DEADLINE_HEADER: &str = "request-timeout";
/// gRPC's own deadline header, read for gRPC requests.
pub const GRPC_TIMEOUT_HEADER: &str = "grpc-timeout";
/// The priority class: `critical`, `normal` or `bulk`.
pub const PRIORITY_HEADER: &str = "tollgate-priority";

/// A request's intent, before the gate runs it (in its extensions, where
/// the layer's per-request hooks read it).
#[derive(Debug, Clone)]
pub struct Intake {
    /// `(caller_scope, route)` plus the priority class.
    pub scope: Scope,
    /// The policy, with the request's deadline.
    pub policy: IntentPolicy,
    /// The route's repetition rule.
    pub repeat: Repeat,
}

/// A header the request got wrong: a `400` with this line.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{header}: {reason}")]
pub struct BadHeader {
    /// The header.
    pub header: &'static str,
    /// What is wrong with it.
    pub reason: &'static str,
}

impl Intake {
    /// Reads `parts` under `listener`'s rules.
    pub fn read(listener: &ListenerConfig, parts: &Parts) -> Result<Intake, BadHeader> {
        let route = listener.routes.route(&parts.method, parts.uri.path());
        let caller_scope = caller_scope(listener, parts)?;
        let priority = match header(parts, PRIORITY_HEADER) {
            Some(text) => priority(text)?,
            None => route.priority.unwrap_or(Priority::Normal),
        };
        let deadline = deadline(listener, parts)?;
        let mut policy = IntentPolicy::builder(deadline)
            .max_attempts(listener.max_attempts)
            .max_hint(listener.max_hint);
        if let Some(cap) = listener.attempt_timeout {
            policy = policy.attempt_cap(cap.min(deadline));
        }
        let policy = policy.build().map_err(|_| BadHeader {
            // Validation keeps every configured value buildable; only a
            // request's own deadline can make it fail.
            header: DEADLINE_HEADER,
            reason: "no policy can run under this deadline",
        })?;
        Ok(Intake {
            scope: Scope::new(caller_scope, route.name).with_priority(priority),
            policy,
            repeat: route.repeat,
        })
    }
}

/// Whether the request is gRPC (classified by `grpc-status`).
pub fn is_grpc(parts: &Parts) -> bool {
    header(parts, http::header::CONTENT_TYPE.as_str())
        .is_some_and(|ct| ct.starts_with("application/grpc"))
}

fn header<'p>(parts: &'p Parts, name: &str) -> Option<&'p str> {
    parts.headers.get(name).and_then(|v| v.to_str().ok())
}

fn caller_scope(listener: &ListenerConfig, parts: &Parts) -> Result<String, BadHeader> {
    let Some(name) = &listener.caller_scope_header else {
        return Ok(listener.caller_scope.clone());
    };
    match parts.headers.get(name).map(|v| v.to_str()) {
        None => Ok(listener.caller_scope.clone()),
        Some(Ok(value)) if listener.caller_scopes.iter().any(|s| s == value) => {
            Ok(value.to_owned())
        }
        // The allowed list keeps the set of scopes bounded: an unknown
        // value is refused, not made a scope.
        Some(_) => Err(BadHeader {
            header: "caller scope header",
            reason: "names a caller scope this listener does not allow",
        }),
    }
}

/// The header names a class as the file does: one list of names, the
/// file's.
fn priority(text: &str) -> Result<Priority, BadHeader> {
    use serde::Deserialize as _;
    use serde::de::value::{Error, StrDeserializer};
    let lower = text.trim().to_ascii_lowercase();
    PriorityName::deserialize(StrDeserializer::<Error>::new(&lower))
        .map(PriorityName::priority)
        .map_err(|_| BadHeader {
            header: PRIORITY_HEADER,
            reason: "must be critical, normal or bulk",
        })
}

fn deadline(listener: &ListenerConfig, parts: &Parts) -> Result<Duration, BadHeader> {
    let stated = if is_grpc(parts) {
        header(parts, GRPC_TIMEOUT_HEADER)
            .map(|text| {
                grpc_timeout(text).ok_or(BadHeader {
                    header: GRPC_TIMEOUT_HEADER,
                    reason: "must be 1 to 8 digits and a unit (H, M, S, m, u, n)",
                })
            })
            .transpose()?
    } else {
        None
    };
    let stated = match (stated, header(parts, DEADLINE_HEADER)) {
        (Some(d), _) => Some(d),
        (None, Some(text)) => Some(seconds(text).ok_or(BadHeader {
            header: DEADLINE_HEADER,
            reason: "must be seconds above zero (2, 0.25)",
        })?),
        (None, None) => None,
    };
    // A request may shorten its deadline freely and lengthen it only up
    // to the listener's bound.
    Ok(stated.map_or(listener.deadline, |d| d.min(listener.max_deadline)))
}

/// `2`, `0.25`: seconds above zero, at most a day, millisecond-precise.
fn seconds(text: &str) -> Option<Duration> {
    let text = text.trim();
    if text.is_empty() || text.len() > 16 || !text.bytes().all(|b| b.is_ascii_digit() || b == b'.')
    {
        return None;
    }
    let value: f64 = text.parse().ok()?;
    if !(0.001..=86_400.0).contains(&value) {
        return None;
    }
    Some(Duration::from_millis((value * 1000.0).round() as u64))
}

/// gRPC's `TimeoutValue TimeoutUnit`: at most 8 digits, then one of
/// `H M S m u n`.
fn grpc_timeout(text: &str) -> Option<Duration> {
    let (digits, unit) = text.split_at_checked(text.len().checked_sub(1)?)?;
    if digits.is_empty() || digits.len() > 8 || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let n: u64 = digits.parse().ok()?;
    let d = match unit {
        "H" => Duration::from_secs(n.checked_mul(3600)?),
        "M" => Duration::from_secs(n.checked_mul(60)?),
        "S" => Duration::from_secs(n),
        "m" => Duration::from_millis(n),
        "u" => Duration::from_micros(n),
        "n" => Duration::from_nanos(n),
        _ => return None,
    };
    (!d.is_zero()).then_some(d)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::proxy::config::ProxyConfig;

    fn listener(extra: &str) -> ListenerConfig {
        let text = format!(
            r#"
[coordinator]
endpoint = "http://127.0.0.1:50051"
worker_id = "w"
[[listener]]
name = "api"
listen = "127.0.0.1:0"
upstream = "http://127.0.0.1:9"
caller_scope = "checkout"
deadline = "10s"
max_deadline = "20s"
{extra}
[[listener.route]]
route = "GET /users/{{id}}"
priority = "bulk"
"#
        );
        ProxyConfig::from_toml(&text)
            .expect("valid")
            .listeners
            .remove(0)
    }

    fn parts(method: &str, path: &str, headers: &[(&str, &str)]) -> Parts {
        let mut request = http::Request::builder().method(method).uri(path);
        for (k, v) in headers {
            request = request.header(*k, *v);
        }
        request.body(()).expect("request").into_parts().0
    }

    #[test]
    fn the_route_and_listener_decide_when_headers_say_nothing() {
        let intake = Intake::read(&listener(""), &parts("GET", "/users/7", &[])).expect("read");
        assert_eq!(intake.scope.caller_scope, "checkout");
        assert_eq!(intake.scope.route, "GET /users/{id}");
        assert_eq!(intake.scope.priority, Priority::Bulk);
        assert_eq!(intake.policy.total_budget(), Duration::from_secs(10));
    }

    #[test]
    fn headers_set_the_deadline_priority_and_caller_within_bounds() {
        let l = listener("caller_scope_header = \"x-caller\"\ncaller_scopes = [\"batch\"]");
        let p = parts(
            "GET",
            "/users/7",
            &[
                ("request-timeout", "0.25"),
                ("tollgate-priority", "critical"),
                ("x-caller", "batch"),
            ],
        );
        let intake = Intake::read(&l, &p).expect("read");
        assert_eq!(intake.policy.total_budget(), Duration::from_millis(250));
        assert_eq!(intake.scope.priority, Priority::Critical);
        assert_eq!(intake.scope.caller_scope, "batch");
        let long = parts("GET", "/", &[("request-timeout", "3600")]);
        assert_eq!(
            Intake::read(&l, &long).expect("read").policy.total_budget(),
            Duration::from_secs(20),
            "capped at max_deadline"
        );
        let grpc = parts(
            "POST",
            "/pkg.Svc/Get",
            &[
                ("content-type", "application/grpc"),
                ("grpc-timeout", "150m"),
            ],
        );
        assert_eq!(
            Intake::read(&l, &grpc).expect("read").policy.total_budget(),
            Duration::from_millis(150)
        );
    }

    #[test]
    fn a_bad_header_is_refused_by_name() {
        let l = listener("caller_scope_header = \"x-caller\"\ncaller_scopes = [\"batch\"]");
        for (name, value) in [
            ("request-timeout", "soon"),
            ("request-timeout", "0"),
            ("request-timeout", "-1"),
            ("tollgate-priority", "urgent"),
            ("x-caller", "someone-else"),
        ] {
            let err = Intake::read(&l, &parts("GET", "/", &[(name, value)])).expect_err(value);
            assert!(!err.to_string().is_empty());
        }
        assert_eq!(grpc_timeout("123456789S"), None);
        assert_eq!(grpc_timeout("5x"), None);
        assert_eq!(grpc_timeout(""), None);
    }
}
