//! Reading a worker's stated limit: the raw `RateLimit` / `X-RateLimit-*`
//! fields it reported, read with the client crate's parser
//! ([`tollgate_vocab::ratelimit`]) under the policy's clock rules, into
//! the [`Statement`] pacing weighs ([`crate::pacing::stated`]). Pure.
//!
//! A worker sends the fields, not numbers of its own reading, so the one
//! parser reads them once, here, under one set of rules: a worker on an old
//! build or with a skewed clock cannot make a statement mean more than it
//! says.
//!
//! # Placing a statement on the coordinator's clock
//! As for a hint ([`crate::hints`]): a reset in seconds runs from the
//! worker's receipt time when that agrees with the coordinator's clock
//! within the policy's skew tolerance, and from the coordinator's `now`
//! otherwise; an epoch reset is converted against the worker's own receipt
//! time, the clock it was meant to be read against.
//!
//! # Which quota binds
//! A statement may carry several policies (a burst and a daily quota). Each
//! request quota sets a pace alone ([`Statement::pace_of`]); the lowest
//! binds. Quotas of another unit (bytes, concurrency) pace nothing here.

use std::time::Duration;

use tollgate_vocab::clock::from_unix_ms;
use tollgate_vocab::hint::bounded_to;
use tollgate_vocab::ratelimit::{
    QuotaUnit, RateLimitRules, RateLimitVerdict, StatedField, StatedLimits, read_stated_fields,
};

use crate::hints::corroboration::Rules;
use crate::pacing::stated::{MAX_STATED_RAW, StatedVerdict, Statement, Weighing};
use crate::policy::Policy;

/// The longest reset believed, as the parser's default: the longest window
/// APIs commonly state is a day.
const MAX_RESET: Duration = Duration::from_secs(86_400);

/// One statement as a worker reported it, validated.
#[derive(Debug, Clone, Copy)]
pub struct StatedInput<'a> {
    /// The fields, each named once.
    pub fields: &'a [StatedField],
    /// The worker's wall clock at receipt; 0 when unknown.
    pub receipt_ms: i64,
}

/// Reads `worker`'s statement under `policy` at coordinator time `now_ms`.
pub fn read_statement(
    input: &StatedInput<'_>,
    worker: &str,
    policy: &Policy,
    now_ms: i64,
) -> Statement {
    let known = input.receipt_ms != 0;
    let skewed = known && input.receipt_ms.abs_diff(now_ms) > policy.skew_tolerance_ms;
    let received_ms = if known && !skewed {
        input.receipt_ms
    } else {
        now_ms
    };
    let wall = if known { input.receipt_ms } else { now_ms };
    let rules = RateLimitRules {
        clock_trusted: true,
        max_skew: Duration::from_millis(policy.skew_tolerance_ms),
        max_reset: MAX_RESET,
    };
    let reading = read_stated_fields(input.fields, from_unix_ms(wall), rules);
    let raw = input
        .fields
        .iter()
        .map(|f| format!("{}: {}", f.name, f.value))
        .collect::<Vec<_>>()
        .join("; ");
    let mut statement = Statement {
        worker: worker.to_owned(),
        received_ms,
        raw: bounded_to(&raw, MAX_STATED_RAW),
        ..Statement::default()
    };
    statement.verdict = match &reading.verdict {
        RateLimitVerdict::Usable(limits) => match binding(limits) {
            Some(b) => {
                statement.quota = b.quota;
                statement.window_ms = b.window_ms;
                statement.remaining = b.remaining;
                statement.reset_ms = b.reset_ms;
                statement.pace_m = Some(b.pace_m);
                StatedVerdict::Usable
            }
            None => StatedVerdict::Unsupported,
        },
        // Absent cannot happen for fields the service checked; it paces
        // nothing either way.
        RateLimitVerdict::Absent => StatedVerdict::Unsupported,
        RateLimitVerdict::Invalid { .. } => StatedVerdict::Invalid,
        RateLimitVerdict::Contradictory(_) => StatedVerdict::Contradictory,
        RateLimitVerdict::Absurd(_) => StatedVerdict::Absurd,
        RateLimitVerdict::ClockUntrusted => StatedVerdict::ClockUntrusted,
    };
    statement
}

/// How statements are weighed on a route with `active` workers, whose
/// caller scope `tokens` caller tokens may use: as hints are
/// ([`Rules::needed`], `uncorroborated_cap`, [`Rules::shared_by`]).
pub fn weighing(policy: &Policy, active: usize, tokens: usize) -> Weighing {
    let rules = Rules::of(policy).shared_by(tokens);
    Weighing {
        needed: i64::try_from(rules.needed(active)).unwrap_or(i64::MAX),
        cap_ms: rules.cap_ms,
        min_owners: i64::try_from(rules.min_owners).unwrap_or(i64::MAX),
    }
}

/// The quota whose pace is lowest.
struct Binding {
    quota: i64,
    window_ms: i64,
    remaining: i64,
    reset_ms: i64,
    pace_m: i64,
}

fn binding(limits: &StatedLimits) -> Option<Binding> {
    let count = |n: u64| i64::try_from(n).unwrap_or(i64::MAX);
    let ms = |d: Duration| i64::try_from(d.as_millis()).unwrap_or(i64::MAX);
    let unit_of = |name: &Option<String>| {
        limits
            .policies
            .iter()
            .find(|p| &p.name == name)
            .map_or(QuotaUnit::Requests, |p| p.unit)
    };
    let current = limits
        .current
        .iter()
        .filter(|c| unit_of(&c.policy) == QuotaUnit::Requests)
        .map(|c| {
            let window_ms = c.window.map_or(0, ms);
            // Without a quota stated beside it, the remaining count alone
            // says nothing of a rate over the window.
            let quota = c.quota.map_or(0, count);
            let cap_window = if c.quota.is_some() { window_ms } else { 0 };
            (
                quota,
                window_ms,
                count(c.remaining),
                c.reset.map_or(0, |r| ms(r.delay)),
                cap_window,
            )
        });
    // A policy stated with no current state paces at its rate alone.
    let stated_only = limits
        .policies
        .iter()
        .filter(|p| p.unit == QuotaUnit::Requests)
        .filter(|p| !limits.current.iter().any(|c| c.policy == p.name))
        .map(|p| {
            let window_ms = p.window.map_or(0, ms);
            (count(p.quota), window_ms, count(p.quota), 0, window_ms)
        });
    current
        .chain(stated_only)
        .filter_map(|(quota, window_ms, remaining, reset_ms, cap_window)| {
            Statement::pace_of(quota, cap_window, remaining, reset_ms).map(|pace_m| Binding {
                quota,
                window_ms,
                remaining,
                reset_ms,
                pace_m,
            })
        })
        .min_by_key(|b| b.pace_m)
}

#[cfg(test)]
mod tests {
    use super::*;

    const NOW: i64 = 1_700_000_000_000;

    fn field(name: &'static str, value: &str) -> StatedField {
        StatedField {
            name,
            value: value.to_owned(),
            truncated: false,
        }
    }

    fn read(fields: &[StatedField], receipt_ms: i64) -> Statement {
        read_statement(
            &StatedInput { fields, receipt_ms },
            "w1",
            &Policy::default(),
            NOW,
        )
    }

    #[test]
    fn the_draft_paces_what_remains_until_the_reset() {
        let s = read(
            &[
                field("ratelimit-policy", "\"default\";q=100;w=10"),
                field("ratelimit", "\"default\";r=30;t=5"),
            ],
            NOW - 100,
        );
        assert_eq!(s.verdict, StatedVerdict::Usable);
        assert_eq!(
            (s.quota, s.window_ms, s.remaining, s.reset_ms),
            (100, 10_000, 30, 5_000)
        );
        assert_eq!(s.received_ms, NOW - 100);
        // 30 over the 4 to 5 s left is 7.5/s, under the 10/s the window
        // allows.
        assert_eq!(s.pace_m, Some(7_500));
    }

    #[test]
    fn the_x_family_and_the_lowest_quota_binds() {
        let s = read(
            &[
                field("x-ratelimit-limit", "1000"),
                field("x-ratelimit-remaining", "900"),
                field("x-ratelimit-reset", "3"),
            ],
            NOW,
        );
        // Nothing states the window: the remaining over the reset.
        assert_eq!(s.pace_m, Some(450_000));
        let s = read(
            &[
                field(
                    "ratelimit-policy",
                    "\"burst\";q=100;w=1, \"day\";q=1000;w=86400",
                ),
                field("ratelimit", "\"burst\";r=100;t=1, \"day\";r=10;t=3600"),
            ],
            NOW,
        );
        assert_eq!((s.quota, s.remaining), (1000, 10), "the day's quota binds");
    }

    #[test]
    fn a_bad_statement_is_evidence_without_a_pace() {
        let absurd = read(
            &[
                field("x-ratelimit-remaining", "1"),
                field("x-ratelimit-reset", "99999999999"),
            ],
            NOW,
        );
        assert_eq!(absurd.verdict, StatedVerdict::Absurd);
        assert_eq!(absurd.pace_m, None);
        assert!(absurd.raw.contains("99999999999"));
        let mut long = field("ratelimit", "\"d\";r=10;t=1");
        long.truncated = true;
        assert_eq!(read(&[long], NOW).verdict, StatedVerdict::Invalid);
        let bytes = read(
            &[
                field("ratelimit-policy", "\"b\";q=100;w=1;qu=\"content-bytes\""),
                field("ratelimit", "\"b\";r=1;t=1"),
            ],
            NOW,
        );
        assert_eq!(bytes.verdict, StatedVerdict::Unsupported);
    }

    #[test]
    fn a_skewed_receipt_runs_from_the_coordinators_now() {
        let s = read(&[field("ratelimit", "\"d\";r=10;t=1")], NOW - 60_000);
        assert_eq!(s.received_ms, NOW);
    }
}
