//! Bounds on every field a peer sends. Each check names the field on failure;
//! nothing here panics on any input.

use tollgate_proto::v1;
use tollgate_vocab::ratelimit::{self, StatedField};

use crate::pacing::Asker;
use crate::scope::{Priority, RetryClass, RouteKey, ScopeKey};

use super::error::ServiceError;

/// Longest caller scope, in bytes.
pub const MAX_CALLER_SCOPE: usize = 128;
/// Longest route, in bytes.
pub const MAX_ROUTE: usize = 256;
/// Longest worker, intent or lease id, in bytes.
pub const MAX_ID: usize = 128;
/// Most tokens one lease may want.
pub const MAX_WANT: u32 = 10_000;
/// Most evidence items in one report.
pub const MAX_EVIDENCE: usize = 64;
/// Most first attempts or successes one report may carry.
pub const MAX_REPORTED_COUNT: u32 = 1_000_000;
/// Longest raw `Retry-After` text.
pub const MAX_RETRY_AFTER: usize = 256;
/// Longest raw `grpc-retry-pushback-ms` text.
pub const MAX_PUSHBACK: usize = 64;
/// Longest attempt reserve, in milliseconds (one hour).
pub const MAX_ATTEMPT_RESERVE_MS: u64 = 3_600_000;
/// Most scopes one Watch may name.
pub const MAX_WATCH_SCOPES: usize = 64;
/// Latest instant accepted in a `*_unix_ms` field (year 2200): anything later
/// is a unit mistake (seconds vs. microseconds), not a plan.
const MAX_UNIX_MS: i64 = 7_258_118_400_000;

type Result<T> = std::result::Result<T, ServiceError>;

/// A bounded, printable-ASCII name (spaces allowed inside, as in `GET /x`).
pub fn name(field: &str, value: &str, max: usize) -> Result<()> {
    name_fault(value, max).map_err(|reason| ServiceError::invalid(field, reason))
}

/// What is wrong with a name, if anything. Apart from [`name`] so that a
/// nested field's path (`scope.route`) is only built for a name at fault.
fn name_fault(value: &str, max: usize) -> std::result::Result<(), String> {
    if value.is_empty() {
        return Err("is required".to_owned());
    }
    if value.len() > max {
        return Err(format!("is longer than {max} bytes"));
    }
    if !value.bytes().all(|b| (0x20..=0x7e).contains(&b)) {
        return Err("must be printable ASCII".to_owned());
    }
    Ok(())
}

/// An optional bounded name (empty allowed).
pub fn optional_name(field: &str, value: &str, max: usize) -> Result<()> {
    if value.is_empty() {
        Ok(())
    } else {
        name(field, value, max)
    }
}

/// A scope message, taken apart: its names become the key's without a copy.
pub fn scope(field: &str, scope: Option<v1::Scope>) -> Result<ScopeKey> {
    let scope = scope.ok_or_else(|| ServiceError::invalid(field, "is required"))?;
    name_fault(&scope.caller_scope, MAX_CALLER_SCOPE)
        .map_err(|reason| ServiceError::invalid(format!("{field}.caller_scope"), reason))?;
    name_fault(&scope.route, MAX_ROUTE)
        .map_err(|reason| ServiceError::invalid(format!("{field}.route"), reason))?;
    let priority = match v1::Priority::try_from(scope.priority) {
        Ok(v1::Priority::Unspecified | v1::Priority::Normal) => Priority::Normal,
        Ok(v1::Priority::Critical) => Priority::Critical,
        Ok(v1::Priority::Bulk) => Priority::Bulk,
        Err(_) => {
            return Err(ServiceError::invalid(
                format!("{field}.priority"),
                "unknown priority",
            ));
        }
    };
    Ok(ScopeKey {
        route: RouteKey {
            caller_scope: scope.caller_scope,
            route: scope.route,
        },
        priority,
    })
}

/// A worker id.
pub fn worker_id(value: &str) -> Result<()> {
    name("worker_id", value, MAX_ID)
}

/// A lease's `want`.
pub fn want(value: u32) -> Result<u32> {
    if (1..=MAX_WANT).contains(&value) {
        Ok(value)
    } else {
        Err(ServiceError::invalid(
            "want",
            format!("must be 1..={MAX_WANT}"),
        ))
    }
}

/// A retry class.
pub fn retry_class(value: i32) -> Result<RetryClass> {
    match v1::RetryClass::try_from(value) {
        Ok(v1::RetryClass::Unspecified | v1::RetryClass::Transient) => Ok(RetryClass::Transient),
        Ok(v1::RetryClass::Throttled) => Ok(RetryClass::Throttled),
        Err(_) => Err(ServiceError::invalid("retry_class", "unknown retry class")),
    }
}

/// A reported count.
pub fn count(field: &str, value: u32) -> Result<u32> {
    if value <= MAX_REPORTED_COUNT {
        Ok(value)
    } else {
        Err(ServiceError::invalid(
            field,
            format!("must be at most {MAX_REPORTED_COUNT}"),
        ))
    }
}

/// The most a report's counts may be aged: a day. Older counts say
/// nothing about any window still open.
pub const MAX_COUNTS_AGE_MS: u64 = 86_400_000;

/// A report's `counts_age_ms`.
pub fn counts_age_ms(value: u64) -> Result<i64> {
    millis_at_most("counts_age_ms", value, MAX_COUNTS_AGE_MS)
}

/// A wall-clock instant; `required` refuses 0.
pub fn unix_ms(field: &str, value: i64, required: bool) -> Result<i64> {
    if value == 0 && !required {
        return Ok(0);
    }
    if value <= 0 || value > MAX_UNIX_MS {
        let reason = if value == 0 {
            "is required".to_owned()
        } else {
            format!("must be Unix milliseconds in 1..={MAX_UNIX_MS}")
        };
        return Err(ServiceError::invalid(field, reason));
    }
    Ok(value)
}

/// Who asks for a slot: `arriving` marks a held first attempt's first ask,
/// so it is refused on a retry's.
pub fn asker(first_attempt: bool, arriving: bool) -> Result<Asker> {
    match (first_attempt, arriving) {
        (false, false) => Ok(Asker::Retry),
        (true, arriving) => Ok(Asker::FirstAttempt { arriving }),
        (false, true) => Err(ServiceError::invalid(
            "arriving",
            "only a held first attempt arrives (set first_attempt)",
        )),
    }
}

/// An attempt reserve.
pub fn attempt_reserve(value: u64) -> Result<i64> {
    millis_at_most("attempt_reserve_ms", value, MAX_ATTEMPT_RESERVE_MS)
}

/// A span in milliseconds, at most `max` (which fits an `i64`).
fn millis_at_most(field: &str, value: u64, max: u64) -> Result<i64> {
    if value <= max {
        Ok(i64::try_from(value).unwrap_or(i64::MAX))
    } else {
        Err(ServiceError::invalid(
            field,
            format!("must be at most {max}"),
        ))
    }
}

/// Most fields in one stated limit: the draft's two and both `X-…`
/// families' four.
pub const MAX_STATED_FIELDS: usize = 10;

/// A report's stated limit, as the reader takes it: every field a known
/// name, named once, bounded; the receipt time required.
pub fn stated_limit(field: &str, s: &v1::StatedLimit) -> Result<Vec<StatedField>> {
    if s.fields.is_empty() || s.fields.len() > MAX_STATED_FIELDS {
        return Err(ServiceError::invalid(
            format!("{field}.fields"),
            format!("must hold 1..={MAX_STATED_FIELDS} items"),
        ));
    }
    let mut out: Vec<StatedField> = Vec::with_capacity(s.fields.len());
    for (i, f) in s.fields.iter().enumerate() {
        let at = format!("{field}.fields[{i}]");
        let Some(name) = ratelimit::known_field(&f.name) else {
            return Err(ServiceError::invalid(
                format!("{at}.name"),
                "is not a stated-limit field (ratelimit, ratelimit-policy, x-ratelimit-*, x-rate-limit-*)",
            ));
        };
        if out.iter().any(|o| o.name == name) {
            return Err(ServiceError::invalid(
                format!("{at}.name"),
                "names a field already sent: join its lines into one value",
            ));
        }
        if f.value.len() > ratelimit::MAX_FIELD_BYTES {
            return Err(ServiceError::invalid(
                format!("{at}.value"),
                format!("is longer than {} bytes", ratelimit::MAX_FIELD_BYTES),
            ));
        }
        out.push(StatedField {
            name,
            value: f.value.clone(),
            truncated: f.truncated,
        });
    }
    if s.http_status != 0 && !(100..=599).contains(&s.http_status) {
        return Err(ServiceError::invalid(
            format!("{field}.http_status"),
            "must be 0 or 100..=599",
        ));
    }
    unix_ms(&format!("{field}.receipt_unix_ms"), s.receipt_unix_ms, true)?;
    Ok(out)
}

/// One evidence item; `field` is its path (`evidence[3]`).
pub fn evidence(field: &str, e: &v1::Evidence) -> Result<()> {
    if e.http_status != 0 && !(100..=599).contains(&e.http_status) {
        return Err(ServiceError::invalid(
            format!("{field}.http_status"),
            "must be 0 or 100..=599",
        ));
    }
    if e.grpc_code > 16 {
        return Err(ServiceError::invalid(
            format!("{field}.grpc_code"),
            "must be 0..=16",
        ));
    }
    // Raw hint text is evidence and may be garbage, but not unbounded.
    if e.retry_after.len() > MAX_RETRY_AFTER {
        return Err(ServiceError::invalid(
            format!("{field}.retry_after"),
            format!("is longer than {MAX_RETRY_AFTER} bytes"),
        ));
    }
    if e.pushback_ms.len() > MAX_PUSHBACK {
        return Err(ServiceError::invalid(
            format!("{field}.pushback_ms"),
            format!("is longer than {MAX_PUSHBACK} bytes"),
        ));
    }
    unix_ms(
        &format!("{field}.receipt_unix_ms"),
        e.receipt_unix_ms,
        false,
    )?;
    unix_ms(&format!("{field}.sent_unix_ms"), e.sent_unix_ms, false)?;
    if v1::ScopeCertainty::try_from(e.certainty).is_err() {
        return Err(ServiceError::invalid(
            format!("{field}.certainty"),
            "unknown certainty",
        ));
    }
    optional_name(&format!("{field}.intent_id"), &e.intent_id, MAX_ID)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn field_of(err: ServiceError) -> String {
        match err {
            ServiceError::InvalidArgument { field, .. } => field,
            other => panic!("expected InvalidArgument, got {other:?}"),
        }
    }

    #[test]
    fn a_stated_limit_is_bounded_and_each_violation_named() {
        let field = |name: &str, value: &str| v1::StatedField {
            name: name.into(),
            value: value.into(),
            truncated: false,
        };
        let ok = v1::StatedLimit {
            fields: vec![field("RateLimit", "\"d\";r=1;t=1")],
            receipt_unix_ms: 1_700_000_000_000,
            http_status: 200,
        };
        let read = stated_limit("stated_limit", &ok).expect("valid");
        assert_eq!(read[0].name, "ratelimit", "names are the reader's own");
        let cases: [(v1::StatedLimit, &str); 6] = [
            (
                v1::StatedLimit {
                    fields: vec![],
                    ..ok.clone()
                },
                "stated_limit.fields",
            ),
            (
                v1::StatedLimit {
                    fields: vec![field("ratelimit", "x"); MAX_STATED_FIELDS + 1],
                    ..ok.clone()
                },
                "stated_limit.fields",
            ),
            (
                v1::StatedLimit {
                    fields: vec![field("x-secret-token", "x")],
                    ..ok.clone()
                },
                "stated_limit.fields[0].name",
            ),
            (
                v1::StatedLimit {
                    fields: vec![field("ratelimit", "a"), field("RATELIMIT", "b")],
                    ..ok.clone()
                },
                "stated_limit.fields[1].name",
            ),
            (
                v1::StatedLimit {
                    fields: vec![field(
                        "ratelimit",
                        &"x".repeat(ratelimit::MAX_FIELD_BYTES + 1),
                    )],
                    ..ok.clone()
                },
                "stated_limit.fields[0].value",
            ),
            (
                v1::StatedLimit {
                    receipt_unix_ms: 0,
                    ..ok.clone()
                },
                "stated_limit.receipt_unix_ms",
            ),
        ];
        for (limit, named) in cases {
            assert_eq!(
                field_of(stated_limit("stated_limit", &limit).expect_err(named)),
                named
            );
        }
        let status = v1::StatedLimit {
            http_status: 600,
            ..ok
        };
        assert_eq!(
            field_of(stated_limit("stated_limit", &status).expect_err("status")),
            "stated_limit.http_status"
        );
    }

    #[test]
    fn violations_name_the_field() {
        let long = "x".repeat(MAX_ROUTE + 1);
        let s = v1::Scope {
            caller_scope: "c".into(),
            route: long,
            priority: 0,
        };
        assert_eq!(
            field_of(scope("scope", Some(s)).expect_err("long")),
            "scope.route"
        );
        let s = v1::Scope {
            caller_scope: "c\n".into(),
            route: "r".into(),
            priority: 0,
        };
        assert_eq!(
            field_of(scope("scope", Some(s)).expect_err("ctl")),
            "scope.caller_scope"
        );
        let s = v1::Scope {
            caller_scope: "c".into(),
            route: "r".into(),
            priority: 42,
        };
        assert_eq!(
            field_of(scope("scope", Some(s)).expect_err("prio")),
            "scope.priority"
        );
        assert_eq!(
            field_of(scope("scope", None).expect_err("missing")),
            "scope"
        );
        assert_eq!(field_of(want(0).expect_err("zero")), "want");
        assert_eq!(
            field_of(unix_ms("deadline_unix_ms", -5, true).expect_err("neg")),
            "deadline_unix_ms"
        );
        let e = v1::Evidence {
            http_status: 42,
            ..v1::Evidence::default()
        };
        assert_eq!(
            field_of(evidence("evidence[0]", &e).expect_err("status")),
            "evidence[0].http_status"
        );
    }
}
