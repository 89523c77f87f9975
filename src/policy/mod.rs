//! Policies: the rules for a scope, validated once and matched by specificity.
//!
//! A [`Policy`] holds only integers (milli-tokens, permille, milliseconds), so
//! the budget math in [`crate::budget`] is exact: `0.2 × first attempts` is
//! `200` milli-tokens per first attempt, never a float rounding.
//!
//! Policies come from rules ([`PolicyRule`]) that match a scope's route and
//! caller scope by pattern: exact beats prefix (`GET /users*`) beats wildcard
//! (`*`). The route decides first (policies are about upstream routes), then
//! the caller scope; between two prefixes the longer one wins. Two rules with
//! the same patterns are refused when the set is built, so a match is never a
//! coin toss. A scope no rule matches gets the default policy.

use std::sync::Arc;
use std::time::Duration;

use crate::pacing::PacingPolicy;
use crate::scope::{Priority, RetryClass, RouteKey};

mod pacing;

pub use pacing::{MAX_WAKE_RATE, WakeRate, parse_rate};

/// The target a [`crate::control::Change`] names for `[defaults]`: a policy
/// file's rule may not use it as a route, so it lives with the rules both
/// the file and runtime control check it against.
pub const DEFAULTS: &str = "[defaults]";

/// Milli-tokens per token: budgets are counted ×1000 so ratios are exact.
pub const MILLI: u64 = 1000;

/// Why a policy or a rule set was refused.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum PolicyError {
    /// A field is outside its valid range.
    #[error("{field}: {reason}")]
    OutOfRange {
        /// The field, as named in the policy file.
        field: &'static str,
        /// What the valid range is.
        reason: String,
    },
    /// A duration field could not be read.
    #[error("{field}: {reason}")]
    BadDuration {
        /// The field, as named in the policy file.
        field: &'static str,
        /// The parser's complaint.
        reason: String,
    },
    /// Two rules have the same patterns, so neither is more specific.
    #[error(
        "rules {first} and {second} match the same scopes (caller_scope {caller_scope:?}, route {route:?})"
    )]
    DuplicateRule {
        /// Index of the first rule in the file.
        first: usize,
        /// Index of the second rule in the file.
        second: usize,
        /// The shared caller-scope pattern.
        caller_scope: String,
        /// The shared route pattern.
        route: String,
    },
}

/// The validated rules for one scope.
///
/// Built only through [`Policy::try_new`] (from a [`PolicySpec`]), so every
/// field is inside its documented range and the budget math cannot overflow.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Policy {
    /// Stamped on every reply so a worker can tell which rules it was given.
    pub policy_version: u64,
    /// Length of the sliding window, whole seconds in 1..=60: the budget keeps
    /// per-second buckets and the longest window bounds their number.
    pub window_secs: u32,
    /// `min_retries_per_sec × 1000`: the floor that lets a quiet scope retry.
    pub floor_milli_per_sec: u64,
    /// `retry_ratio × 1000`: milli-tokens earned by each reported first attempt.
    pub ratio_milli: u64,
    /// Optional hard ceiling on retries per window, whatever the traffic.
    pub ceiling_per_window: Option<u64>,
    /// Milli-tokens one retry costs, by class (`[transient, throttled]`).
    pub cost_milli: [u64; 2],
    /// Each priority class's share of the budget in permille; sums to 1000.
    /// A class spends its own share and the unspent shares of the classes
    /// below it, never those above it (`crate::budget`).
    pub shares_permille: [u64; 3],
    /// How long a lease's tokens may be held before they count as spent.
    pub lease_ttl_ms: u64,
    /// The longest hint honoured; a longer one is capped here and the reply
    /// says so.
    pub max_hint_ms: u64,
    /// Worker and coordinator clocks further apart than this are recorded as
    /// `clock_skew`, and the worker's timestamps are not trusted for placing
    /// a cooldown.
    pub skew_tolerance_ms: u64,
    /// The first step of the scope-wide backoff that hintless rejections
    /// widen, a step for each rejection received after the backoff before
    /// it ended (a round), not for each rejection.
    pub backoff_base_ms: u64,
    /// The widest the backoff gets.
    pub backoff_max_ms: u64,
    /// How fast waiting intents are woken: learned per route unless pinned
    /// (`wake_rate`), under a known upstream limit, between a floor and a
    /// ceiling ([`crate::pacing`]).
    pub pacing: PacingPolicy,
    /// Whether first attempts wait for a slot instead of going to an
    /// upstream that is known to refuse them: inside a cooldown that closes
    /// the route, and while first attempts alone overflow it (learned pacing
    /// is saturated).
    pub hold_first_attempts: bool,
    /// Distinct workers whose hints must agree before a cooldown longer
    /// than `uncorroborated_cap_ms` holds the whole fleet (fewer when the
    /// route has fewer workers): one faulty worker must not stall a tenant.
    pub corroborate_workers: u32,
    /// The part of the route's active workers that must agree, in permille,
    /// when more than `corroborate_workers`: a few percent of a large fleet
    /// lying identically must not corroborate each other.
    pub corroborate_permille: u32,
    /// How far one worker's uncorroborated hint moves the fleet's cooldown
    /// at most: the route's typical recent hint when that is shorter
    /// ([`crate::hints::corroboration::Rules::within_typical`]).
    pub uncorroborated_cap_ms: u64,
    /// Shadow mode (`mode = "shadow"`): every decision is made and counted as
    /// usual, but what it would have refused or delayed is let through, so
    /// a new policy can be rolled out and watched before it bites.
    pub shadow: bool,
}

impl Policy {
    /// The milli-token cost of one retry of `class`.
    pub fn cost(&self, class: RetryClass) -> u64 {
        match class {
            RetryClass::Transient => self.cost_milli[0],
            RetryClass::Throttled => self.cost_milli[1],
        }
    }

    /// The share of `priority` in permille.
    pub fn share(&self, priority: Priority) -> u64 {
        self.shares_permille[priority.index()]
    }

    /// The window in milliseconds.
    pub fn window_ms(&self) -> i64 {
        i64::from(self.window_secs) * 1000
    }

    /// Validates `spec` (fields left out take the documented defaults).
    pub fn try_new(spec: &PolicySpec) -> Result<Policy, PolicyError> {
        let d = PolicySpec::builtin();
        let pick = |a: &Option<String>, b: &Option<String>| a.clone().or_else(|| b.clone());

        let window = duration("window", pick(&spec.window, &d.window))?;
        let window_secs = whole_secs("window", window, 1, 60)?;
        let floor = spec
            .min_retries_per_sec
            .or(d.min_retries_per_sec)
            .unwrap_or_default();
        let ratio = spec.retry_ratio.or(d.retry_ratio).unwrap_or_default();
        let transient = spec.cost_transient.or(d.cost_transient).unwrap_or(1.0);
        let throttled = spec.cost_throttled.or(d.cost_throttled).unwrap_or(1.0);
        let shares = spec.shares.clone().or(d.shares.clone()).unwrap_or_default();
        let shares_permille = [
            milli("shares.critical", shares.critical, 0.0, 1.0)?,
            milli("shares.normal", shares.normal, 0.0, 1.0)?,
            milli("shares.bulk", shares.bulk, 0.0, 1.0)?,
        ];
        if shares_permille.iter().sum::<u64>() != 1000 {
            return Err(PolicyError::OutOfRange {
                field: "shares",
                reason: "critical + normal + bulk must add up to 1.0".into(),
            });
        }
        let backoff_base_ms = ms_in(
            "backoff_base",
            pick(&spec.backoff_base, &d.backoff_base),
            1,
            60_000,
        )?;
        let backoff_max_ms = ms_in(
            "backoff_max",
            pick(&spec.backoff_max, &d.backoff_max),
            1,
            3_600_000,
        )?;
        if backoff_max_ms < backoff_base_ms {
            return Err(PolicyError::OutOfRange {
                field: "backoff_max",
                reason: "must be at least backoff_base".into(),
            });
        }
        let pacing = pacing::pacing_of(spec, &d)?;
        let corroborate_workers = spec
            .corroborate_workers
            .or(d.corroborate_workers)
            .unwrap_or(1);
        if !(1..=1024).contains(&corroborate_workers) {
            return Err(PolicyError::OutOfRange {
                field: "corroborate_workers",
                reason: "must be 1..=1024".into(),
            });
        }
        let fraction = spec
            .corroborate_fraction
            .or(d.corroborate_fraction)
            .unwrap_or_default();
        let corroborate_permille = milli("corroborate_fraction", fraction, 0.0, 1.0)?;
        let shadow = match pick(&spec.mode, &d.mode).as_deref() {
            None | Some("enforce") => false,
            Some("shadow") => true,
            Some(_) => {
                return Err(PolicyError::OutOfRange {
                    field: "mode",
                    reason: "must be \"enforce\" or \"shadow\"".into(),
                });
            }
        };
        let policy_version = spec.policy_version.unwrap_or(1);
        if policy_version == 0 {
            return Err(PolicyError::OutOfRange {
                field: "policy_version",
                reason: "must be at least 1".into(),
            });
        }
        let ceiling = spec.max_retries_per_window.or(d.max_retries_per_window);
        if ceiling.is_some_and(|c| c > 100_000_000) {
            return Err(PolicyError::OutOfRange {
                field: "max_retries_per_window",
                reason: "must be at most 100000000".into(),
            });
        }
        Ok(Policy {
            policy_version,
            window_secs,
            floor_milli_per_sec: milli("min_retries_per_sec", floor, 0.0, 1_000_000.0)?,
            ratio_milli: milli("retry_ratio", ratio, 0.0, 100.0)?,
            ceiling_per_window: ceiling,
            cost_milli: [
                milli("cost_transient", transient, 0.001, 100.0)?,
                milli("cost_throttled", throttled, 0.001, 100.0)?,
            ],
            shares_permille,
            lease_ttl_ms: ms_in(
                "lease_ttl",
                pick(&spec.lease_ttl, &d.lease_ttl),
                1_000,
                300_000,
            )?,
            max_hint_ms: ms_in(
                "max_hint",
                pick(&spec.max_hint, &d.max_hint),
                1_000,
                86_400_000,
            )?,
            skew_tolerance_ms: ms_in(
                "clock_skew_tolerance",
                pick(&spec.clock_skew_tolerance, &d.clock_skew_tolerance),
                100,
                300_000,
            )?,
            backoff_base_ms,
            backoff_max_ms,
            pacing,
            hold_first_attempts: spec
                .hold_first_attempts
                .or(d.hold_first_attempts)
                .unwrap_or(true),
            corroborate_workers,
            // At most 1000 by the range check above.
            corroborate_permille: u32::try_from(corroborate_permille).unwrap_or(1000),
            uncorroborated_cap_ms: ms_in(
                "uncorroborated_cap",
                pick(&spec.uncorroborated_cap, &d.uncorroborated_cap),
                0,
                86_400_000,
            )?,
            shadow,
        })
    }
}

impl Default for Policy {
    /// The documented defaults (see [`PolicySpec::builtin`]).
    fn default() -> Self {
        Policy::try_new(&PolicySpec::default()).expect("the built-in defaults are valid")
    }
}

/// A policy as written in the policy file: every field optional, so a rule
/// names only what it changes. Durations are humantime strings (`"10s"`).
#[derive(Debug, Clone, Default, PartialEq, serde::Deserialize, serde::Serialize)]
#[serde(deny_unknown_fields)]
pub struct PolicySpec {
    /// Stamped on replies; raise it whenever the rule changes. Default 1.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub policy_version: Option<u64>,
    /// Sliding window, whole seconds in 1..=60. Default `"10s"`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub window: Option<String>,
    /// Retries per second every scope may make regardless of traffic. Default 10.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub min_retries_per_sec: Option<f64>,
    /// Retries earned per first attempt. Default 0.2.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub retry_ratio: Option<f64>,
    /// Optional hard ceiling on retries per window. Default none.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_retries_per_window: Option<u64>,
    /// Tokens one transient retry costs. Default 1.0.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cost_transient: Option<f64>,
    /// Tokens one throttled retry costs. Default 2.0: the upstream said it is
    /// at capacity, so each retry there weighs double.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cost_throttled: Option<f64>,
    /// Shares of the budget by priority class. Default 0.2 / 0.6 / 0.2: a
    /// class also borrows the unspent shares of the classes below it, so
    /// critical's 0.2 is a reserve no lower class touches, while a fleet
    /// sending only normal work may use 0.8 of the budget.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub shares: Option<Shares>,
    /// Lease lifetime, 1 s..=300 s. Default `"10s"`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub lease_ttl: Option<String>,
    /// Longest honoured hint, 1 s..=24 h. Default `"300s"`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_hint: Option<String>,
    /// Clock disagreement recorded as skew, 100 ms..=300 s. Default `"5s"`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub clock_skew_tolerance: Option<String>,
    /// First backoff step for hintless rejections. Default `"500ms"`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub backoff_base: Option<String>,
    /// Widest backoff. Default `"30s"`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub backoff_max: Option<String>,
    /// Intents woken per second after a cooldown: `"auto"` (the default,
    /// learned per route) or a number 1..=100000 that pins it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub wake_rate: Option<WakeRate>,
    /// The upstream's published limit, `"600/min"`, `"10/s"` or `"36000/h"`:
    /// the fleet's attempts are paced under `upstream_share` of it from the
    /// start. None by default.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub upstream_limit: Option<String>,
    /// The part of `upstream_limit` this fleet may use, 0.001..=1. Default 0.5.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub upstream_share: Option<f64>,
    /// The part of a pace the upstream states (`RateLimit`,
    /// `X-RateLimit-*`) the fleet leaves unspent, 0..=0.9. Default 0.03:
    /// the stated remaining already shows what others spend.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub stated_margin: Option<f64>,
    /// The slowest a learned wake rate goes, slots per second. Default: the
    /// scope's `min_retries_per_sec` (at least 1), the retries its budget
    /// lets through whatever the traffic.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub wake_floor: Option<f64>,
    /// The fastest a learned wake rate goes, slots per second. Default 100000.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub wake_ceiling: Option<f64>,
    /// A slot further ahead than this is not given: the intent is told to
    /// ask again, so a rate learned meanwhile applies. 100 ms..=60 s.
    /// Default `"250ms"`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reconsider_horizon: Option<String>,
    /// Whether first attempts wait out a known cooldown for a slot. Default
    /// true.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub hold_first_attempts: Option<bool>,
    /// Distinct workers that must agree before a long cooldown holds the
    /// fleet, 1..=1024 (fewer when the route has fewer workers). Default 3.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub corroborate_workers: Option<u32>,
    /// The part of the route's active workers that must agree when that is
    /// more, 0..=1. Default 0.1.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub corroborate_fraction: Option<f64>,
    /// How far one worker's uncorroborated hint moves the fleet's cooldown,
    /// 0..=24 h. Default `"5s"`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub uncorroborated_cap: Option<String>,
    /// `"enforce"` (default) or `"shadow"`: decide and record, but let
    /// through what would have been refused or delayed.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub mode: Option<String>,
}

/// Budget shares of the priority classes; they must add up to 1.0.
#[derive(Debug, Clone, PartialEq, serde::Deserialize, serde::Serialize)]
#[serde(deny_unknown_fields)]
pub struct Shares {
    /// Share of critical work.
    pub critical: f64,
    /// Share of normal work.
    pub normal: f64,
    /// Share of bulk work.
    pub bulk: f64,
}

impl Default for Shares {
    fn default() -> Self {
        Shares {
            critical: 0.2,
            normal: 0.6,
            bulk: 0.2,
        }
    }
}

impl PolicySpec {
    /// The built-in defaults, the bottom layer under `[defaults]` and rules.
    pub fn builtin() -> PolicySpec {
        PolicySpec {
            policy_version: Some(1),
            window: Some("10s".into()),
            min_retries_per_sec: Some(10.0),
            retry_ratio: Some(0.2),
            max_retries_per_window: None,
            cost_transient: Some(1.0),
            cost_throttled: Some(2.0),
            shares: Some(Shares::default()),
            lease_ttl: Some("10s".into()),
            max_hint: Some("300s".into()),
            clock_skew_tolerance: Some("5s".into()),
            backoff_base: Some("500ms".into()),
            backoff_max: Some("30s".into()),
            wake_rate: Some(WakeRate::Auto),
            upstream_limit: None,
            upstream_share: Some(0.5),
            stated_margin: Some(0.03),
            // Unset: the scope's min_retries_per_sec (see pacing_of).
            wake_floor: None,
            wake_ceiling: Some(f64::from(MAX_WAKE_RATE)),
            reconsider_horizon: Some("250ms".into()),
            hold_first_attempts: Some(true),
            corroborate_workers: Some(3),
            corroborate_fraction: Some(0.1),
            uncorroborated_cap: Some("5s".into()),
            mode: Some("enforce".into()),
        }
    }

    /// `self` with the fields it leaves out taken from `under`.
    pub fn over(&self, under: &PolicySpec) -> PolicySpec {
        PolicySpec {
            policy_version: self.policy_version.or(under.policy_version),
            window: self.window.clone().or_else(|| under.window.clone()),
            min_retries_per_sec: self.min_retries_per_sec.or(under.min_retries_per_sec),
            retry_ratio: self.retry_ratio.or(under.retry_ratio),
            max_retries_per_window: self.max_retries_per_window.or(under.max_retries_per_window),
            cost_transient: self.cost_transient.or(under.cost_transient),
            cost_throttled: self.cost_throttled.or(under.cost_throttled),
            shares: self.shares.clone().or_else(|| under.shares.clone()),
            lease_ttl: self.lease_ttl.clone().or_else(|| under.lease_ttl.clone()),
            max_hint: self.max_hint.clone().or_else(|| under.max_hint.clone()),
            clock_skew_tolerance: self
                .clock_skew_tolerance
                .clone()
                .or_else(|| under.clock_skew_tolerance.clone()),
            backoff_base: self
                .backoff_base
                .clone()
                .or_else(|| under.backoff_base.clone()),
            backoff_max: self
                .backoff_max
                .clone()
                .or_else(|| under.backoff_max.clone()),
            wake_rate: self.wake_rate.or(under.wake_rate),
            upstream_limit: self
                .upstream_limit
                .clone()
                .or_else(|| under.upstream_limit.clone()),
            upstream_share: self.upstream_share.or(under.upstream_share),
            stated_margin: self.stated_margin.or(under.stated_margin),
            wake_floor: self.wake_floor.or(under.wake_floor),
            wake_ceiling: self.wake_ceiling.or(under.wake_ceiling),
            reconsider_horizon: self
                .reconsider_horizon
                .clone()
                .or_else(|| under.reconsider_horizon.clone()),
            hold_first_attempts: self.hold_first_attempts.or(under.hold_first_attempts),
            corroborate_workers: self.corroborate_workers.or(under.corroborate_workers),
            corroborate_fraction: self.corroborate_fraction.or(under.corroborate_fraction),
            uncorroborated_cap: self
                .uncorroborated_cap
                .clone()
                .or_else(|| under.uncorroborated_cap.clone()),
            mode: self.mode.clone().or_else(|| under.mode.clone()),
        }
    }
}

fn duration(field: &'static str, raw: Option<String>) -> Result<Duration, PolicyError> {
    let raw = raw.unwrap_or_default();
    humantime::parse_duration(&raw).map_err(|e| PolicyError::BadDuration {
        field,
        reason: format!("{raw:?}: {e}"),
    })
}

fn ms_in(field: &'static str, raw: Option<String>, min: u64, max: u64) -> Result<u64, PolicyError> {
    let ms = u64::try_from(duration(field, raw)?.as_millis()).unwrap_or(u64::MAX);
    if (min..=max).contains(&ms) {
        Ok(ms)
    } else {
        Err(PolicyError::OutOfRange {
            field,
            reason: format!("must be {min} ms..={max} ms"),
        })
    }
}

fn whole_secs(field: &'static str, d: Duration, min: u32, max: u32) -> Result<u32, PolicyError> {
    let secs = u32::try_from(d.as_secs()).unwrap_or(u32::MAX);
    if d.subsec_nanos() != 0 || !(min..=max).contains(&secs) {
        return Err(PolicyError::OutOfRange {
            field,
            reason: format!("must be whole seconds in {min}..={max}"),
        });
    }
    Ok(secs)
}

/// A decimal number of tokens as milli-tokens; more than three decimals are
/// refused rather than rounded, so the file means exactly what it says.
fn milli(field: &'static str, value: f64, min: f64, max: f64) -> Result<u64, PolicyError> {
    let out_of_range = || PolicyError::OutOfRange {
        field,
        reason: format!("must be a number in {min}..={max} with at most 3 decimals"),
    };
    if !value.is_finite() || value < min || value > max {
        return Err(out_of_range());
    }
    let scaled = value * 1000.0;
    if (scaled - scaled.round()).abs() > 1e-6 {
        return Err(out_of_range());
    }
    // In range and integral: the cast is exact.
    #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
    Ok(scaled.round() as u64)
}

/// A caller-scope or route pattern: `exact`, `prefix*` or `*`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Pattern {
    /// Matches one value.
    Exact(String),
    /// Matches values starting with the prefix.
    Prefix(String),
    /// Matches everything.
    Any,
}

impl Pattern {
    /// Reads `*`, `prefix*` or an exact value.
    pub fn parse(raw: &str) -> Pattern {
        if raw == "*" {
            Pattern::Any
        } else if let Some(prefix) = raw.strip_suffix('*') {
            Pattern::Prefix(prefix.to_owned())
        } else {
            Pattern::Exact(raw.to_owned())
        }
    }

    /// Whether `value` matches.
    pub fn matches(&self, value: &str) -> bool {
        match self {
            Pattern::Exact(exact) => exact == value,
            Pattern::Prefix(prefix) => value.starts_with(prefix.as_str()),
            Pattern::Any => true,
        }
    }

    /// Higher is more specific: exact > longer prefix > shorter prefix > any.
    fn specificity(&self) -> (u8, usize) {
        match self {
            Pattern::Exact(_) => (2, 0),
            Pattern::Prefix(prefix) => (1, prefix.len()),
            Pattern::Any => (0, 0),
        }
    }

    /// The pattern as written in the policy file.
    pub fn text(&self) -> String {
        match self {
            Pattern::Exact(exact) => exact.clone(),
            Pattern::Prefix(prefix) => format!("{prefix}*"),
            Pattern::Any => "*".into(),
        }
    }
}

/// One rule: patterns and the policy for the scopes they match.
#[derive(Debug, Clone)]
pub struct PolicyRule {
    /// Which caller scopes the rule covers.
    pub caller_scope: Pattern,
    /// Which routes the rule covers.
    pub route: Pattern,
    /// The policy those scopes get.
    pub policy: Arc<Policy>,
}

/// Every rule plus the default, ordered so the first match is the most specific.
#[derive(Debug, Clone)]
pub struct PolicySet {
    rules: Vec<PolicyRule>,
    default: Arc<Policy>,
}

impl Default for PolicySet {
    fn default() -> Self {
        PolicySet {
            rules: Vec::new(),
            default: Arc::new(Policy::default()),
        }
    }
}

impl PolicySet {
    /// Orders `rules` by specificity; refuses two rules with the same patterns.
    pub fn try_new(default: Policy, rules: Vec<PolicyRule>) -> Result<PolicySet, PolicyError> {
        for (i, a) in rules.iter().enumerate() {
            for (j, b) in rules.iter().enumerate().skip(i + 1) {
                if a.caller_scope == b.caller_scope && a.route == b.route {
                    return Err(PolicyError::DuplicateRule {
                        first: i,
                        second: j,
                        caller_scope: a.caller_scope.text(),
                        route: a.route.text(),
                    });
                }
            }
        }
        let mut rules = rules;
        // Route first, then caller scope; a stable sort keeps file order for
        // the (impossible after the check above) equal keys.
        rules.sort_by_key(|r| {
            std::cmp::Reverse((r.route.specificity(), r.caller_scope.specificity()))
        });
        Ok(PolicySet {
            rules,
            default: Arc::new(default),
        })
    }

    /// The policy of the most specific rule matching `key`, or the default.
    pub fn resolve(&self, key: &RouteKey) -> Arc<Policy> {
        self.resolve_rule(key)
            .map_or_else(|| Arc::clone(&self.default), |r| Arc::clone(&r.policy))
    }

    /// The rule `key` resolves to; `None` means the default policy.
    pub fn resolve_rule(&self, key: &RouteKey) -> Option<&PolicyRule> {
        self.rules
            .iter()
            .find(|r| r.route.matches(&key.route) && r.caller_scope.matches(&key.caller_scope))
    }

    /// The default policy, for scopes no rule matches (and for evidence kept
    /// at the caller level, which has no route to match).
    pub fn default_policy(&self) -> Arc<Policy> {
        Arc::clone(&self.default)
    }
}

/// The running policy set, read by every request and swapped whole by the
/// Admin API and reloads. A request resolves against one snapshot
/// (`current()`), so it never sees half of a change.
#[derive(Debug, Clone, Default)]
pub struct SharedPolicies(Arc<std::sync::RwLock<Arc<PolicySet>>>);

impl SharedPolicies {
    /// Starts with `set`.
    pub fn new(set: PolicySet) -> Self {
        SharedPolicies(Arc::new(std::sync::RwLock::new(Arc::new(set))))
    }

    /// The set in force now.
    pub fn current(&self) -> Arc<PolicySet> {
        // A poisoned lock still holds a whole set: the swap is one store.
        Arc::clone(&self.0.read().unwrap_or_else(|e| e.into_inner()))
    }

    /// Puts `set` in force.
    pub fn replace(&self, set: PolicySet) {
        *self.0.write().unwrap_or_else(|e| e.into_inner()) = Arc::new(set);
    }
}

impl PolicySet {
    /// The rules, most specific first.
    pub fn rules(&self) -> &[PolicyRule] {
        &self.rules
    }
}

#[cfg(test)]
mod tests;
