//! Stated limits: what an upstream says about its quota before it refuses.
//!
//! [`hint`](crate::hint) reads what an upstream says *after* refusing
//! (`Retry-After`); this module reads what it states on any response, in
//! the forms upstreams use:
//!
//! | family | fields | example |
//! |---|---|---|
//! | IETF draft (`draft-ietf-httpapi-ratelimit-headers`) | `RateLimit-Policy`, `RateLimit` | `RateLimit-Policy: "default";q=100;w=60`, `RateLimit: "default";r=50;t=30` |
//! | `X-RateLimit-*` | `-Limit`, `-Remaining`, `-Reset`, `-Reset-After` | GitHub: `X-RateLimit-Reset: 1704110430` (epoch); Envoy: `X-RateLimit-Limit: 10, 10;w=1` and `X-RateLimit-Reset: 1` (seconds left) |
//! | `X-Rate-Limit-*` | the same four | Okta, Twitter/X: `X-Rate-Limit-Reset` in epoch seconds |
//!
//! When a response carries several families, the draft is read, else
//! `X-RateLimit-*`, else `X-Rate-Limit-*`; the others are ignored, even when
//! the one read is invalid, so a broken statement is never replaced by a
//! more permissive one sent beside it.
//!
//! # Two steps, as for `Retry-After`
//! 1. [`parse_rate_limit`] is pure syntax: the fields → a
//!    [`RateLimitStatement`] of [`QuotaPolicy`]s (quota, unit, window,
//!    name, partition key) and [`ServiceLimit`]s (remaining, reset), or why
//!    none could be formed ([`Unreadable`]). It needs no clock. The draft's
//!    fields are RFC 9651 structured-field Lists and are read as such (an
//!    Integer has at most 15 digits, the policy name is a String, `pk` a
//!    Byte Sequence), except that a count with a minus sign is refused even
//!    as `-0`, as `Retry-After` refuses it. The `X-…` values are `1*DIGIT`,
//!    saturating like delay-seconds. An `X-…-Reset` stays
//!    [`StatedReset::Undecided`]: its text does not say whether it is a date
//!    or a delay.
//! 2. [`read_rate_limit`] judges the statement once, against the response's
//!    receipt wall time: it decides each `Reset`'s form, converts every
//!    reset to a delay, checks the statement against itself and against
//!    [`RateLimitRules`], and returns a [`RateLimitReading`] that keeps the
//!    raw fields as evidence whatever the verdict.
//!
//! # Epoch or seconds left
//! `X-RateLimit-Reset` is epoch seconds at GitHub, Okta and Twitter/X and
//! seconds left at Envoy and others, with nothing in the text to tell them
//! apart. A value of at least [`EPOCH_THRESHOLD_SECS`] (10⁹, 2001-09-09)
//! is read as an epoch, a smaller one as seconds left. The line sits far
//! from both: seconds left that reach it would be a window of 31 years,
//! which no API states, and every epoch time since September 2001 is above
//! it.
//! An epoch is believed only when it lies within the clock-trust bound of
//! the receipt time: no more than [`RateLimitRules::max_skew`] before it
//! (read as "now") and no more than [`RateLimitRules::max_reset`] after it.
//! A millisecond epoch (13 digits) thus lands millennia out and is
//! [`Absurdity::ResetBeyondCap`]; an epoch under an untrusted clock is
//! [`RateLimitVerdict::ClockUntrusted`], as an HTTP-date is for
//! `Retry-After`. `t` and `-Reset-After` are always seconds left.
//!
//! # Verdicts
//! - **Invalid**: a field is not in its syntax (a sign or a fraction where a
//!   count is required, a malformed structured field, `q` or `r` missing,
//!   `w=0`, a name or key too long).
//! - **Contradictory**: the statement disagrees with itself (remaining above
//!   the quota, which includes any remaining under a quota of 0; a reset
//!   longer than its window; one field or policy given two values; a
//!   `RateLimit` item's partition key not its policy's; `-Reset` and
//!   `-Reset-After` further apart than the skew and a second of rounding).
//! - **Absurd**: readable and consistent, but not believable against the
//!   receipt time and the rules (an epoch reset already past, a reset
//!   beyond the cap, more than [`MAX_POLICIES`] policies).
//! - **Usable**: none of these; the [`StatedLimits`] hold the policies and
//!   each current state with its reset as a delay from receipt.
//!
//! The first problem found is the verdict; the raw fields keep the rest.
//! Only a usable verdict carries numbers: an invalid, contradictory or
//! absurd statement never says that more may be sent, and never that the
//! quota is back. As the draft says, a usable remaining count is not a
//! promise either. `Retry-After`, which the draft says takes precedence
//! over a reset, is read apart
//! ([`read_retry_after`](crate::hint::read_retry_after)).
//!
//! # Bounds
//! A field is read up to [`MAX_FIELD_BYTES`] (repeated lines joined), at most
//! [`MAX_POLICIES`] policies or states per field, names up to
//! [`MAX_NAME_BYTES`], partition keys up to [`MAX_PARTITION_KEY_BYTES`];
//! raw evidence is cut to
//! [`MAX_RAW_HINT_BYTES`](crate::hint::MAX_RAW_HINT_BYTES) per field. An
//! `X-…` number too large for `u64` saturates, and time arithmetic is done
//! in [`Duration`]s since the epoch, so no value overflows or panics.

mod judge;
mod sf;
mod statement;

use std::time::{Duration, SystemTime};

pub use statement::{
    ParsedRateLimit, QuotaPolicy, QuotaUnit, RATELIMIT, RATELIMIT_POLICY, RateLimitFamily,
    RateLimitStatement, RawField, ServiceLimit, StatedReset, Unreadable, parse_rate_limit,
};

/// Policies (or current states) read from one field. Upstreams state one
/// to three; more than this is refused as absurd rather than cut, because
/// the policy left out might be the one that binds.
pub const MAX_POLICIES: usize = 8;

/// A field's value (repeated lines joined) is read up to this many bytes:
/// eight policies with names and partition keys fit with room to spare.
pub const MAX_FIELD_BYTES: usize = 2048;

/// A policy name longer than this is invalid (not cut, so that two names
/// never merge).
pub const MAX_NAME_BYTES: usize = 64;

/// A partition key's base64 text longer than this is invalid; 128
/// characters hold a 96-byte key, room for a SHA-512 digest (88).
pub const MAX_PARTITION_KEY_BYTES: usize = 128;

/// An `X-…-Reset` at or above this many seconds is an epoch time, below it
/// seconds left (see the module docs for why the line is here).
pub const EPOCH_THRESHOLD_SECS: u64 = 1_000_000_000;

/// Why a field could not be read in its form's syntax.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum InvalidStatement {
    /// The field is empty or only whitespace.
    Empty,
    /// A number with a sign, a fraction or an exponent where a
    /// non-negative integer is required.
    NotAnInteger,
    /// Not the field's syntax at all.
    Malformed,
    /// A parameter (or the item itself, `name`) of the wrong type: the draft
    /// wants the policy name as a String, `pk` as a Byte Sequence.
    WrongType {
        /// The parameter, as sent (`name` for the item).
        parameter: &'static str,
    },
    /// A required parameter is missing (`q` in a policy, `r` in a state, `w`
    /// in Envoy's policy form).
    MissingParameter {
        /// The parameter.
        parameter: &'static str,
    },
    /// A reset was sent without the remaining count it is the reset of.
    MissingField,
    /// `w=0`: the draft requires a window of at least one second.
    ZeroWindow,
    /// The field, a name, a partition key or the parameter list is longer
    /// than this module reads.
    TooLong,
}

impl InvalidStatement {
    /// A short description for messages and spans.
    pub fn describe(self) -> &'static str {
        match self {
            InvalidStatement::Empty => "empty value",
            InvalidStatement::NotAnInteger => "not a non-negative integer",
            InvalidStatement::Malformed => "not the field's syntax",
            InvalidStatement::WrongType { .. } => "a parameter of the wrong type",
            InvalidStatement::MissingParameter { .. } => "a required parameter is missing",
            InvalidStatement::MissingField => "a reset without a remaining count",
            InvalidStatement::ZeroWindow => "a window of zero seconds",
            InvalidStatement::TooLong => "longer than read",
        }
    }
}

/// How a statement disagrees with itself.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Contradiction {
    /// One field, policy or parameter was sent with two different values.
    ConflictingValues {
        /// The field, lowercase.
        field: &'static str,
    },
    /// More remaining than the quota allows (any remaining under a quota of
    /// zero).
    RemainingAboveQuota {
        /// The policy, if named.
        policy: Option<String>,
        /// Units stated as left.
        remaining: u64,
        /// The quota stated.
        quota: u64,
    },
    /// The quota comes back later than its own window ends.
    ResetBeyondWindow {
        /// The policy, if named.
        policy: Option<String>,
        /// The reset, from receipt.
        reset: Duration,
        /// The policy's window.
        window: Duration,
    },
    /// A `RateLimit` item's partition key is not its policy's.
    PartitionKeyMismatch {
        /// The policy.
        policy: Option<String>,
    },
    /// `X-…-Reset` and `X-…-Reset-After` name instants further apart than
    /// the skew allowed plus a second of rounding.
    ResetsDisagree {
        /// `X-…-Reset`, read and converted.
        reset: Duration,
        /// `X-…-Reset-After`.
        reset_after: Duration,
    },
}

/// How a consistent statement is still not believable.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Absurdity {
    /// More than [`MAX_POLICIES`] policies or states in one field.
    TooManyPolicies {
        /// The field, lowercase.
        field: &'static str,
    },
    /// An epoch reset earlier than the receipt time by more than the skew
    /// allowed.
    ResetInPast {
        /// The policy, if named.
        policy: Option<String>,
        /// How far before the receipt time.
        by: Duration,
    },
    /// A reset further out than [`RateLimitRules::max_reset`].
    ResetBeyondCap {
        /// The policy, if named.
        policy: Option<String>,
        /// The reset, from receipt (saturated).
        reset: Duration,
        /// The cap.
        cap: Duration,
    },
}

/// The clock and cap rules a statement is read under.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RateLimitRules {
    /// Whether the reader's wall clock may be used to convert an epoch
    /// `Reset`; an untrusted clock refuses one rather than guessing.
    pub clock_trusted: bool,
    /// How far the upstream's clock may be behind the reader's: an epoch
    /// reset this much before the receipt time means "now", more is
    /// [`Absurdity::ResetInPast`]. It also widens the reset-within-window
    /// check for epoch resets, whose conversion carries the skew.
    pub max_skew: Duration,
    /// A reset further out is [`Absurdity::ResetBeyondCap`], never shortened.
    pub max_reset: Duration,
}

impl Default for RateLimitRules {
    /// A trusted clock, 5 s of skew (the coordinator's default
    /// `clock_skew_tolerance`), and a one-day cap: the longest window APIs
    /// commonly state is a day; a caller reading monthly quotas raises it.
    fn default() -> Self {
        RateLimitRules {
            clock_trusted: true,
            max_skew: Duration::from_secs(5),
            max_reset: Duration::from_secs(86_400),
        }
    }
}

/// Which form a reset was read in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ResetForm {
    /// Seconds left (`t`, `-Reset-After`, a small `-Reset`).
    Seconds,
    /// An epoch `-Reset`, converted against the receipt time.
    Epoch,
}

/// When quota comes back, as a delay from the receipt time.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ResetIn {
    /// The delay; zero for an epoch up to [`RateLimitRules::max_skew`] past.
    pub delay: Duration,
    /// The form it was stated in.
    pub form: ResetForm,
}

/// One policy's current state, resolved against the policies stated.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CurrentLimit {
    /// The policy, if named.
    pub policy: Option<String>,
    /// The quota the remaining count is out of, when stated (the named
    /// policy's `q`, or `X-…-Limit`). Never below `remaining`.
    pub quota: Option<u64>,
    /// The window of that quota, when stated.
    pub window: Option<Duration>,
    /// Units left.
    pub remaining: u64,
    /// When more comes back; within [`RateLimitRules::max_reset`] and the
    /// window.
    pub reset: Option<ResetIn>,
    /// The partition key (the state's, else its policy's).
    pub partition_key: Option<String>,
}

/// A statement that passed every check.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StatedLimits {
    /// The quota policies stated.
    pub policies: Vec<QuotaPolicy>,
    /// The current state of each policy a state was sent for.
    pub current: Vec<CurrentLimit>,
}

/// What a response's stated limits come to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RateLimitVerdict {
    /// No rate-limit field was sent.
    Absent,
    /// Every check passed.
    Usable(StatedLimits),
    /// A field is not in its syntax.
    Invalid {
        /// The field, lowercase.
        field: &'static str,
        /// Which rule it broke.
        why: InvalidStatement,
    },
    /// The statement disagrees with itself.
    Contradictory(Contradiction),
    /// The statement is not believable.
    Absurd(Absurdity),
    /// An epoch reset arrived while the wall clock is untrusted.
    ClockUntrusted,
}

impl RateLimitVerdict {
    /// The stated limits, if usable.
    pub fn usable(&self) -> Option<&StatedLimits> {
        match self {
            RateLimitVerdict::Usable(limits) => Some(limits),
            _ => None,
        }
    }

    /// The lowercase name of the verdict, for evidence and spans.
    pub fn as_str(&self) -> &'static str {
        match self {
            RateLimitVerdict::Absent => "absent",
            RateLimitVerdict::Usable(_) => "usable",
            RateLimitVerdict::Invalid { .. } => "invalid",
            RateLimitVerdict::Contradictory(_) => "contradictory",
            RateLimitVerdict::Absurd(_) => "absurd",
            RateLimitVerdict::ClockUntrusted => "clock_untrusted",
        }
    }
}

/// One response's stated limits as received and as read: the raw fields are
/// kept whatever the verdict.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RateLimitReading {
    /// The family read, or `None` if none was sent.
    pub family: Option<RateLimitFamily>,
    /// That family's fields as received, each cut to [`MAX_RAW_HINT_BYTES`](crate::hint::MAX_RAW_HINT_BYTES).
    pub raw: Vec<RawField>,
    /// What they come to.
    pub verdict: RateLimitVerdict,
}

impl RateLimitReading {
    /// The reading of a response that stated no limits.
    pub fn absent() -> Self {
        RateLimitReading {
            family: None,
            raw: Vec::new(),
            verdict: RateLimitVerdict::Absent,
        }
    }
}

/// One stated-limit field as a response carried it, collected to be sent
/// on (a worker reports it; the coordinator reads it with
/// [`read_rate_limit`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StatedField {
    /// The field name, lowercase.
    pub name: &'static str,
    /// Its lines joined with `", "`, at most [`MAX_FIELD_BYTES`].
    pub value: String,
    /// The value was longer than [`MAX_FIELD_BYTES`] and `value` is its
    /// start: it must be read as too long, never as the part kept, or a cut
    /// `q=1000` would read as `q=10`.
    pub truncated: bool,
}

/// The field name among those this module reads, as it names it
/// (lowercase), or `None`.
pub fn known_field(name: &str) -> Option<&'static str> {
    statement::FIELDS
        .iter()
        .find(|f| f.eq_ignore_ascii_case(name))
        .copied()
}

/// Every stated-limit field among `headers` (names compared
/// case-insensitively, repeated lines joined), of every family: the reader
/// picks the family, so a worker never decides which statement counts.
/// Empty when the response stated nothing.
pub fn stated_fields<'a>(
    headers: impl IntoIterator<Item = (&'a str, &'a str)>,
) -> Vec<StatedField> {
    let mut out: Vec<StatedField> = Vec::new();
    for (name, value) in headers {
        let Some(known) = known_field(name) else {
            continue;
        };
        let at = match out.iter().position(|f| f.name == known) {
            Some(at) => at,
            None => {
                out.push(StatedField {
                    name: known,
                    value: String::new(),
                    truncated: false,
                });
                out.len() - 1
            }
        };
        let field = &mut out[at];
        if field.truncated {
            continue;
        }
        let sep = if field.value.is_empty() { "" } else { ", " };
        if field.value.len() + sep.len() + value.len() <= MAX_FIELD_BYTES {
            field.value.push_str(sep);
            field.value.push_str(value);
        } else {
            field.value.push_str(sep);
            field.value.push_str(value);
            field.value = crate::hint::bounded_to(&field.value, MAX_FIELD_BYTES);
            field.truncated = true;
        }
    }
    out
}

/// Reads [`stated_fields`] as [`read_rate_limit`] reads headers: a field
/// sent truncated is read as longer than this module reads.
pub fn read_stated_fields(
    fields: &[StatedField],
    received: SystemTime,
    rules: RateLimitRules,
) -> RateLimitReading {
    // A truncated field is given back longer than the bound, so the parser
    // calls it too long exactly as it would the whole value.
    let padded: Vec<(&str, String)> = fields
        .iter()
        .map(|f| {
            let mut value = f.value.clone();
            if f.truncated {
                value.push_str(&" ".repeat(MAX_FIELD_BYTES + 1 - value.len().min(MAX_FIELD_BYTES)));
            }
            (f.name, value)
        })
        .collect();
    read_rate_limit(
        padded.iter().map(|(n, v)| (*n, v.as_str())),
        received,
        rules,
    )
}

/// Reads the stated limits among a response's `headers`, received at
/// `received` (wall time).
///
/// Resets are converted once, against `received`: a later reader never
/// re-reads them against a newer clock.
pub fn read_rate_limit<'a>(
    headers: impl IntoIterator<Item = (&'a str, &'a str)>,
    received: SystemTime,
    rules: RateLimitRules,
) -> RateLimitReading {
    let Some(parsed) = parse_rate_limit(headers) else {
        return RateLimitReading::absent();
    };
    let verdict = match parsed.statement {
        Ok(statement) => match judge::judge(statement, received, rules) {
            Ok(limits) => RateLimitVerdict::Usable(limits),
            Err(verdict) => verdict,
        },
        Err(Unreadable::Invalid { field, why }) => RateLimitVerdict::Invalid { field, why },
        Err(Unreadable::Conflicting { field }) => {
            RateLimitVerdict::Contradictory(Contradiction::ConflictingValues { field })
        }
        Err(Unreadable::TooMany { field }) => {
            RateLimitVerdict::Absurd(Absurdity::TooManyPolicies { field })
        }
    };
    RateLimitReading {
        family: Some(parsed.family),
        raw: parsed.raw,
        verdict,
    }
}

#[cfg(test)]
mod tests;
