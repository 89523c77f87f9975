//! Server wait hints: `Retry-After` and `grpc-retry-pushback-ms`.
//!
//! This is the one parser the whole project uses: the decision engine, the
//! async gate and the coordinator all read hints through [`read_retry_after`]
//! and [`read_pushback_ms`], so a worker and the coordinator never disagree on
//! what a header meant.
//!
//! Reading a hint has two steps, kept apart on purpose:
//! 1. [`parse_retry_after`] is pure syntax (RFC 9110 §10.2.3): delay-seconds,
//!    an HTTP-date in any of the three forms a recipient must accept, or
//!    invalid. It needs no clock.
//! 2. [`read_retry_after`] converts a date *once*, against the response's
//!    receipt wall time, applies the clock-trust rule and the cap, and returns
//!    a [`HintReading`] that keeps the raw text as evidence whatever happened.
//!
//! Nothing here ever turns a bad hint into permission to retry now: an
//! invalid hint is [`HintVerdict::Invalid`] (the caller applies its fallback
//! backoff), an enormous one saturates and then exceeds any cap, and a past
//! date is a zero delay that the caller still floors with its own minimum wait.

use std::time::{Duration, SystemTime};

use serde::Serialize;

/// Raw hint text kept as evidence is cut to this many bytes, so a hostile
/// header cannot make an evidence record (or a coordinator's memory) large.
pub const MAX_RAW_HINT_BYTES: usize = 256;

/// What a `Retry-After` value is, syntactically.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RetryAfter {
    /// delay-seconds. A number too large for `u64` saturates to `u64::MAX`
    /// seconds: the server asked for an enormous wait, and reading that as
    /// invalid would let the caller's short fallback retry far too early.
    Delay(Duration),
    /// An absolute HTTP-date, not yet converted to a delay.
    Date(SystemTime),
    /// Neither form; the reason says which rule it broke.
    Invalid(InvalidHint),
}

/// Why a hint was not usable as a wait boundary.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum InvalidHint {
    /// The value is empty or only whitespace.
    Empty,
    /// A number with a sign, a fraction or an exponent: delay-seconds is
    /// `1*DIGIT` only.
    NotAnInteger,
    /// Neither delay-seconds nor an HTTP-date.
    Malformed,
}

impl InvalidHint {
    /// A short description for messages and spans.
    pub fn describe(self) -> &'static str {
        match self {
            InvalidHint::Empty => "empty value",
            InvalidHint::NotAnInteger => "not a non-negative integer number of seconds",
            InvalidHint::Malformed => "neither delay-seconds nor an HTTP-date",
        }
    }
}

/// Parses a `Retry-After` value (RFC 9110 §10.2.3) without any clock.
///
/// Leading and trailing spaces and tabs are ignored, as they are not part of a
/// field value (RFC 9110 §5.5). Dates are case-sensitive (§5.6.7), so a
/// lowercase date is invalid.
pub fn parse_retry_after(raw: &str) -> RetryAfter {
    match non_negative_integer(raw) {
        Ok(secs) => RetryAfter::Delay(Duration::from_secs(secs)),
        // Only a value with no number-like shape can be a date.
        Err(InvalidHint::Malformed) => {
            match httpdate::parse_http_date(raw.trim_matches([' ', '\t'])) {
                Ok(date) => RetryAfter::Date(date),
                Err(_) => RetryAfter::Invalid(InvalidHint::Malformed),
            }
        }
        Err(why) => RetryAfter::Invalid(why),
    }
}

/// Reads `1*DIGIT` — the one integer rule of every hint and stated limit
/// that is not a structured field: delay-seconds, pushback milliseconds,
/// `X-RateLimit-*` counts and resets.
///
/// Spaces and tabs around the value are ignored (RFC 9110 §5.5). A number
/// too large for `u64` saturates to `u64::MAX`: an upstream that states an
/// enormous value meant "a lot", and reading it as invalid would let a
/// caller fall back to something far smaller.
pub(crate) fn non_negative_integer(raw: &str) -> Result<u64, InvalidHint> {
    let value = raw.trim_matches([' ', '\t']);
    if value.is_empty() {
        return Err(InvalidHint::Empty);
    }
    if value.bytes().all(|b| b.is_ascii_digit()) {
        // All digits: the only failure left is overflow, which saturates.
        return Ok(value.parse::<u64>().unwrap_or(u64::MAX));
    }
    if looks_numeric(value) {
        Err(InvalidHint::NotAnInteger)
    } else {
        Err(InvalidHint::Malformed)
    }
}

/// `-1`, `+3`, `1.5`, `1e3`: numbers that are not delay-seconds. Told apart
/// from other garbage only so the evidence says why.
fn looks_numeric(value: &str) -> bool {
    let unsigned = value.strip_prefix(['+', '-']).unwrap_or(value);
    !unsigned.is_empty()
        && unsigned.bytes().any(|b| b.is_ascii_digit())
        && unsigned
            .bytes()
            .all(|b| b.is_ascii_digit() || matches!(b, b'.' | b'e' | b'E' | b'+' | b'-'))
}

/// The clock and cap rules a hint is read under.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HintRules {
    /// Whether the reader's wall clock may be used to convert an HTTP-date.
    /// An untrusted clock refuses a date rather than guessing its delay.
    pub clock_trusted: bool,
    /// A valid hint above this is [`HintVerdict::ExceedsCap`]: never silently
    /// shortened, because a shortened wait is an early retry.
    pub max_hint: Option<Duration>,
}

impl Default for HintRules {
    fn default() -> Self {
        HintRules {
            clock_trusted: true,
            max_hint: None,
        }
    }
}

/// Which form a hint took, as recorded in evidence.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum HintForm {
    /// `Retry-After: <delay-seconds>`.
    Delay,
    /// `Retry-After: <HTTP-date>`.
    Date,
    /// `grpc-retry-pushback-ms`.
    Pushback,
    /// No hint was sent.
    Absent,
    /// A hint was sent but could not be read.
    Invalid,
}

impl HintForm {
    /// The lowercase name used on the wire, in JSON and in spans.
    pub fn as_str(self) -> &'static str {
        match self {
            HintForm::Delay => "delay",
            HintForm::Date => "date",
            HintForm::Pushback => "pushback",
            HintForm::Absent => "absent",
            HintForm::Invalid => "invalid",
        }
    }
}

/// What a hint means for the earliest reconsideration time.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HintVerdict {
    /// No hint: the caller's fallback backoff applies.
    Absent,
    /// A usable wait boundary. `past` marks a date already behind the receipt
    /// time (the delay is then zero and the caller's floor still applies).
    Valid {
        /// The delay from the receipt time.
        delay: Duration,
        /// The date was already past when the response was received.
        past: bool,
    },
    /// Sent but unreadable: the caller's fallback backoff applies, never zero.
    Invalid(InvalidHint),
    /// A date arrived while the wall clock is untrusted; the date is not
    /// reinterpreted as zero or as a guess.
    ClockUntrusted,
    /// Valid, but above the cap: the caller must stop rather than wait less.
    ExceedsCap {
        /// The server's delay.
        delay: Duration,
        /// The cap it exceeded.
        cap: Duration,
    },
    /// `grpc-retry-pushback-ms` said not to retry (gRFC A6: a negative or
    /// unparseable value).
    DoNotRetry,
}

impl HintVerdict {
    /// The delay a valid hint imposes, if any.
    pub fn valid_delay(&self) -> Option<Duration> {
        match self {
            HintVerdict::Valid { delay, .. } => Some(*delay),
            _ => None,
        }
    }
}

/// One hint as received and as read: the raw text is kept whatever the verdict.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HintReading {
    /// The raw header text (cut to [`MAX_RAW_HINT_BYTES`]), or `None` if absent.
    pub raw: Option<String>,
    /// The form it took.
    pub form: HintForm,
    /// What it means for the earliest reconsideration time.
    pub verdict: HintVerdict,
}

impl HintReading {
    /// The reading of a response that carried no hint.
    pub fn absent() -> Self {
        HintReading {
            raw: None,
            form: HintForm::Absent,
            verdict: HintVerdict::Absent,
        }
    }
}

/// Reads an optional `Retry-After` value received at `receipt` (wall time).
///
/// A date is converted once, against `receipt`: the caller's later wake-ups
/// never re-read it against a newer clock.
pub fn read_retry_after(raw: Option<&str>, receipt: SystemTime, rules: HintRules) -> HintReading {
    let Some(raw) = raw else {
        return HintReading::absent();
    };
    let (form, verdict) = match parse_retry_after(raw) {
        RetryAfter::Invalid(why) => (HintForm::Invalid, HintVerdict::Invalid(why)),
        RetryAfter::Delay(delay) => (HintForm::Delay, capped(delay, false, rules)),
        RetryAfter::Date(_) if !rules.clock_trusted => {
            (HintForm::Date, HintVerdict::ClockUntrusted)
        }
        RetryAfter::Date(date) => {
            let (delay, past) = match date.duration_since(receipt) {
                Ok(delay) => (delay, false),
                Err(_) => (Duration::ZERO, true),
            };
            (HintForm::Date, capped(delay, past, rules))
        }
    };
    HintReading {
        raw: Some(bounded_raw(raw)),
        form,
        verdict,
    }
}

fn capped(delay: Duration, past: bool, rules: HintRules) -> HintVerdict {
    match rules.max_hint {
        Some(cap) if delay > cap => HintVerdict::ExceedsCap { delay, cap },
        _ => HintVerdict::Valid { delay, past },
    }
}

/// Reads an optional `grpc-retry-pushback-ms` value (gRFC A6).
///
/// A non-negative decimal integer is a delay in milliseconds; a negative or
/// unparseable value means "do not retry" — A6 makes the server's refusal
/// explicit, so it is never read as a fallback. The cap applies as for
/// `Retry-After`.
pub fn read_pushback_ms(raw: Option<&str>, rules: HintRules) -> HintReading {
    let Some(raw) = raw else {
        return HintReading::absent();
    };
    let verdict = match non_negative_integer(raw) {
        Ok(millis) => capped(Duration::from_millis(millis), false, rules),
        Err(_) => HintVerdict::DoNotRetry,
    };
    HintReading {
        raw: Some(bounded_raw(raw)),
        form: HintForm::Pushback,
        verdict,
    }
}

/// Cuts raw hint text to [`MAX_RAW_HINT_BYTES`] on a character boundary.
fn bounded_raw(raw: &str) -> String {
    bounded_to(raw, MAX_RAW_HINT_BYTES)
}

/// Cuts `raw` to at most `max` bytes on a character boundary; the gate uses
/// it for the proto's tighter limits (64 bytes of pushback text), the
/// coordinator for the evidence it keeps.
pub fn bounded_to(raw: &str, max: usize) -> String {
    if raw.len() <= max {
        return raw.to_owned();
    }
    let mut end = max;
    while !raw.is_char_boundary(end) {
        end -= 1;
    }
    raw[..end].to_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(date: &str) -> SystemTime {
        httpdate::parse_http_date(date).expect("test date")
    }

    const NOON: &str = "Mon, 01 Jan 2024 12:00:00 GMT";

    fn read(raw: &str) -> HintReading {
        read_retry_after(Some(raw), at(NOON), HintRules::default())
    }

    #[test]
    fn delay_seconds_is_a_non_negative_integer() {
        assert_eq!(parse_retry_after("0"), RetryAfter::Delay(Duration::ZERO));
        assert_eq!(
            parse_retry_after("30"),
            RetryAfter::Delay(Duration::from_secs(30))
        );
        assert_eq!(
            parse_retry_after("007"),
            RetryAfter::Delay(Duration::from_secs(7))
        );
    }

    #[test]
    fn surrounding_whitespace_is_not_part_of_the_value() {
        assert_eq!(
            parse_retry_after(" 3\t"),
            RetryAfter::Delay(Duration::from_secs(3))
        );
        assert_eq!(
            parse_retry_after("   "),
            RetryAfter::Invalid(InvalidHint::Empty)
        );
        // Inner whitespace is not tolerated.
        assert_eq!(
            parse_retry_after("1 0"),
            RetryAfter::Invalid(InvalidHint::Malformed)
        );
    }

    #[test]
    fn signs_fractions_and_exponents_are_invalid() {
        for raw in ["+3", "-1", "1.5", "1e3", "-0", "+0", ".5"] {
            assert_eq!(
                parse_retry_after(raw),
                RetryAfter::Invalid(InvalidHint::NotAnInteger),
                "{raw}"
            );
        }
    }

    #[test]
    fn empty_and_garbage_are_invalid() {
        assert_eq!(
            parse_retry_after(""),
            RetryAfter::Invalid(InvalidHint::Empty)
        );
        for raw in ["NaN", "tomorrow", "inf", "3s", "0x10", "soon"] {
            assert_eq!(
                parse_retry_after(raw),
                RetryAfter::Invalid(InvalidHint::Malformed),
                "{raw}"
            );
        }
    }

    #[test]
    fn a_number_that_overflows_u64_saturates_instead_of_becoming_invalid() {
        let raw = "18446744073709551616"; // u64::MAX + 1
        assert_eq!(
            parse_retry_after(raw),
            RetryAfter::Delay(Duration::from_secs(u64::MAX))
        );
        let capped = read_retry_after(
            Some(raw),
            at(NOON),
            HintRules {
                max_hint: Some(Duration::from_secs(300)),
                ..HintRules::default()
            },
        );
        assert!(matches!(capped.verdict, HintVerdict::ExceedsCap { .. }));
    }

    #[test]
    fn all_three_http_date_forms_are_accepted() {
        let expected = at("Mon, 01 Jan 2024 12:00:30 GMT");
        for raw in [
            "Mon, 01 Jan 2024 12:00:30 GMT",  // IMF-fixdate
            "Monday, 01-Jan-24 12:00:30 GMT", // RFC 850
            "Mon Jan  1 12:00:30 2024",       // asctime
        ] {
            assert_eq!(parse_retry_after(raw), RetryAfter::Date(expected), "{raw}");
            let reading = read(raw);
            assert_eq!(reading.form, HintForm::Date);
            assert_eq!(
                reading.verdict,
                HintVerdict::Valid {
                    delay: Duration::from_secs(30),
                    past: false
                }
            );
        }
    }

    #[test]
    fn lowercase_and_malformed_dates_are_invalid() {
        for raw in [
            "mon, 01 jan 2024 12:00:30 gmt",
            "Mon, 32 Jan 2024 12:00:30 GMT",
            "Mon, 01 Jan 2024 12:00:30",
            "2024-01-01T12:00:30Z",
        ] {
            assert_eq!(
                read(raw).verdict,
                HintVerdict::Invalid(InvalidHint::Malformed),
                "{raw}"
            );
            assert_eq!(read(raw).raw.as_deref(), Some(raw), "raw text is kept");
        }
    }

    #[test]
    fn a_past_date_is_a_zero_delay_marked_past() {
        let reading = read("Mon, 01 Jan 2024 11:59:00 GMT");
        assert_eq!(
            reading.verdict,
            HintVerdict::Valid {
                delay: Duration::ZERO,
                past: true
            }
        );
    }

    #[test]
    fn a_date_a_century_out_exceeds_the_cap() {
        let rules = HintRules {
            max_hint: Some(Duration::from_secs(300)),
            ..HintRules::default()
        };
        let reading = read_retry_after(Some("Sat, 01 Jan 2124 12:00:00 GMT"), at(NOON), rules);
        match reading.verdict {
            HintVerdict::ExceedsCap { delay, cap } => {
                assert!(delay > Duration::from_secs(99 * 365 * 86_400));
                assert_eq!(cap, Duration::from_secs(300));
            }
            other => panic!("expected ExceedsCap, got {other:?}"),
        }
    }

    #[test]
    fn an_untrusted_clock_refuses_a_date_but_not_a_delay() {
        let rules = HintRules {
            clock_trusted: false,
            max_hint: None,
        };
        let date = read_retry_after(Some("Mon, 01 Jan 2024 12:00:30 GMT"), at(NOON), rules);
        assert_eq!(date.verdict, HintVerdict::ClockUntrusted);
        let delay = read_retry_after(Some("30"), at(NOON), rules);
        assert_eq!(delay.verdict.valid_delay(), Some(Duration::from_secs(30)));
    }

    #[test]
    fn a_delay_at_the_cap_is_valid_and_above_it_is_not() {
        let rules = HintRules {
            max_hint: Some(Duration::from_secs(30)),
            ..HintRules::default()
        };
        let at_cap = read_retry_after(Some("30"), at(NOON), rules);
        assert_eq!(at_cap.verdict.valid_delay(), Some(Duration::from_secs(30)));
        let above = read_retry_after(Some("31"), at(NOON), rules);
        assert_eq!(
            above.verdict,
            HintVerdict::ExceedsCap {
                delay: Duration::from_secs(31),
                cap: Duration::from_secs(30)
            }
        );
    }

    #[test]
    fn absent_is_its_own_form() {
        let reading = read_retry_after(None, at(NOON), HintRules::default());
        assert_eq!(reading, HintReading::absent());
    }

    #[test]
    fn raw_text_is_bounded_on_a_char_boundary() {
        let raw = "é".repeat(MAX_RAW_HINT_BYTES);
        let reading = read(&raw);
        let kept = reading.raw.expect("raw kept");
        assert!(kept.len() <= MAX_RAW_HINT_BYTES);
        assert!(raw.starts_with(&kept));
    }

    #[test]
    fn pushback_follows_grfc_a6() {
        let rules = HintRules::default();
        assert_eq!(
            read_pushback_ms(Some("250"), rules).verdict.valid_delay(),
            Some(Duration::from_millis(250))
        );
        for raw in ["-1", "abc", "", "1.5"] {
            assert_eq!(
                read_pushback_ms(Some(raw), rules).verdict,
                HintVerdict::DoNotRetry,
                "{raw}"
            );
        }
        assert_eq!(read_pushback_ms(None, rules), HintReading::absent());
    }
}
