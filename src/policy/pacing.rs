//! The policy keys of learned pacing, read into a [`PacingPolicy`].
//!
//! ```toml
//! wake_rate = "auto"          # default: learned per route (crate::pacing)
//! # wake_rate = 200           # a number pins it
//! upstream_limit = "600/min"  # optional: pace the fleet under a known limit
//! upstream_share = 0.5        # the part of that limit this fleet may use
//! stated_margin = 0.03        # the part of a stated pace left unspent
//! wake_floor = 10             # slots per second, never fewer (default:
//!                             # min_retries_per_sec, at least 1)
//! wake_ceiling = 100000       # never more
//! reconsider_horizon = "250ms" # a slot further ahead is "ask again"
//! hold_first_attempts = true  # first attempts wait for a slot in a closing
//!                             # cooldown and while they alone overflow
//! ```

use std::fmt;

use serde::de::{self, Visitor};
use serde::{Deserialize, Deserializer, Serialize, Serializer};

use super::{PolicyError, PolicySpec, milli, ms_in};
use crate::pacing::{MILLI, PINNED_HORIZON_MS, PacingPolicy, STATED_MARGIN_PERMILLE};

/// The most slots per second a route may be paced at, pinned or learned.
pub const MAX_WAKE_RATE: u32 = 100_000;

/// `wake_rate` as written: `"auto"` (learned) or a pinned number.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WakeRate {
    /// Learned from the route's reports.
    Auto,
    /// Obeyed as given, slots per second.
    Pinned(u32),
}

impl WakeRate {
    /// The wire form (`PolicyFields.wake_rate`): 0 is `auto`.
    pub fn to_wire(self) -> u32 {
        match self {
            WakeRate::Auto => 0,
            WakeRate::Pinned(n) => n,
        }
    }

    /// From the wire form: 0 is `auto`.
    pub fn from_wire(n: u32) -> Self {
        if n == 0 {
            WakeRate::Auto
        } else {
            WakeRate::Pinned(n)
        }
    }
}

impl Serialize for WakeRate {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self {
            WakeRate::Auto => s.serialize_str("auto"),
            WakeRate::Pinned(n) => s.serialize_u32(*n),
        }
    }
}

impl<'de> Deserialize<'de> for WakeRate {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl Visitor<'_> for V {
            type Value = WakeRate;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                write!(f, "\"auto\" or a whole number of slots per second")
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<WakeRate, E> {
                if v == "auto" {
                    Ok(WakeRate::Auto)
                } else {
                    Err(E::invalid_value(de::Unexpected::Str(v), &self))
                }
            }
            fn visit_u64<E: de::Error>(self, v: u64) -> Result<WakeRate, E> {
                u32::try_from(v)
                    .map(WakeRate::Pinned)
                    .map_err(|_| E::invalid_value(de::Unexpected::Unsigned(v), &self))
            }
            fn visit_i64<E: de::Error>(self, v: i64) -> Result<WakeRate, E> {
                u64::try_from(v)
                    .map_err(|_| E::invalid_value(de::Unexpected::Signed(v), &self))
                    .and_then(|v| self.visit_u64(v))
            }
        }
        d.deserialize_any(V)
    }
}

/// Reads `"600/min"`, `"10/s"`, `"36000/h"` (or a bare number: per second)
/// as milli-events per second.
pub fn parse_rate(raw: &str) -> Result<i64, String> {
    let (count, unit) = raw.split_once('/').unwrap_or((raw, "s"));
    let per_secs = match unit.trim() {
        "s" | "sec" | "second" => 1.0,
        "m" | "min" | "minute" => 60.0,
        "h" | "hour" => 3600.0,
        other => return Err(format!("unknown unit {other:?} (s, min or h)")),
    };
    let count: f64 = count
        .trim()
        .parse()
        .map_err(|_| format!("{:?} is not a number", count.trim()))?;
    let per_sec = count / per_secs;
    if !per_sec.is_finite() || per_sec <= 0.0 || per_sec > f64::from(MAX_WAKE_RATE) {
        return Err(format!("must be more than 0 and at most {MAX_WAKE_RATE}/s"));
    }
    // Positive and at most 1e8 milli: the cast is exact enough and in range.
    #[allow(clippy::cast_possible_truncation)]
    Ok(((per_sec * 1000.0).round() as i64).max(1))
}

/// The pacing part of a validated policy.
pub(super) fn pacing_of(spec: &PolicySpec, d: &PolicySpec) -> Result<PacingPolicy, PolicyError> {
    let out_of_range =
        |field: &'static str, reason: String| PolicyError::OutOfRange { field, reason };
    let pinned_m = match spec.wake_rate.or(d.wake_rate).unwrap_or(WakeRate::Auto) {
        WakeRate::Auto => None,
        WakeRate::Pinned(n) if (1..=MAX_WAKE_RATE).contains(&n) => Some(i64::from(n) * MILLI),
        WakeRate::Pinned(_) => {
            return Err(out_of_range(
                "wake_rate",
                format!("must be \"auto\" or 1..={MAX_WAKE_RATE} per second"),
            ));
        }
    };
    let share = spec.upstream_share.or(d.upstream_share).unwrap_or(0.5);
    let share_permille = milli("upstream_share", share, 0.001, 1.0)?;
    let known_limit_m = match spec.upstream_limit.as_ref().or(d.upstream_limit.as_ref()) {
        None => None,
        Some(raw) => {
            let limit = parse_rate(raw).map_err(|e| out_of_range("upstream_limit", e))?;
            // The share is at most 1000 permille: no overflow below 1e8.
            Some((limit * i64::try_from(share_permille).unwrap_or(1000) / 1000).max(1))
        }
    };
    let margin = spec
        .stated_margin
        .or(d.stated_margin)
        .unwrap_or(STATED_MARGIN_PERMILLE as f64 / 1000.0);
    let stated_margin_permille =
        i64::try_from(milli("stated_margin", margin, 0.0, 0.9)?).unwrap_or(0);
    let max = f64::from(MAX_WAKE_RATE);
    // Waking fewer intents a second than the budget lets retry whatever the
    // traffic (min_retries_per_sec) would only leave budget unused.
    let floor = spec.wake_floor.or(d.wake_floor).unwrap_or_else(|| {
        spec.min_retries_per_sec
            .or(d.min_retries_per_sec)
            .unwrap_or(1.0)
            .clamp(1.0, max)
    });
    let floor_m = i64::try_from(milli("wake_floor", floor, 0.001, max)?).unwrap_or(MILLI);
    // A known limit is the fleet's whole allowance: the default floor (the
    // budget's retries a second) must not pace above it.
    let floor_m = match known_limit_m {
        Some(limit) if spec.wake_floor.or(d.wake_floor).is_none() => floor_m.min(limit),
        _ => floor_m,
    };
    let ceiling = spec.wake_ceiling.or(d.wake_ceiling).unwrap_or(max);
    let ceiling_m = i64::try_from(milli("wake_ceiling", ceiling, 0.001, max)?).unwrap_or(MILLI);
    if ceiling_m < floor_m {
        return Err(out_of_range(
            "wake_ceiling",
            "must be at least wake_floor".into(),
        ));
    }
    let horizon = spec
        .reconsider_horizon
        .clone()
        .or_else(|| d.reconsider_horizon.clone());
    let horizon_ms = ms_in("reconsider_horizon", horizon, 100, 60_000)?;
    // A pinned rate is obeyed as given: nobody is asked to ask again.
    let horizon_ms = match pinned_m {
        Some(_) => PINNED_HORIZON_MS,
        None => i64::try_from(horizon_ms).unwrap_or(1000),
    };
    Ok(PacingPolicy {
        pinned_m,
        known_limit_m,
        floor_m,
        ceiling_m,
        horizon_ms,
        stated_margin_permille,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rates_read_with_their_unit() {
        assert_eq!(parse_rate("600/min"), Ok(10_000));
        assert_eq!(parse_rate("10/s"), Ok(10_000));
        assert_eq!(parse_rate("7"), Ok(7_000));
        assert_eq!(parse_rate("36000/h"), Ok(10_000));
        assert!(parse_rate("0/s").is_err());
        assert!(parse_rate("-3/s").is_err());
        assert!(parse_rate("1/fortnight").is_err());
        assert!(parse_rate("lots").is_err());
        assert!(parse_rate("1e12/s").is_err());
    }

    #[test]
    fn wake_rate_is_auto_or_a_number() {
        let auto: PolicySpec = toml::from_str("wake_rate = \"auto\"").expect("auto");
        assert_eq!(auto.wake_rate, Some(WakeRate::Auto));
        let pinned: PolicySpec = toml::from_str("wake_rate = 200").expect("pinned");
        assert_eq!(pinned.wake_rate, Some(WakeRate::Pinned(200)));
        assert!(toml::from_str::<PolicySpec>("wake_rate = \"fast\"").is_err());
        assert!(toml::from_str::<PolicySpec>("wake_rate = -1").is_err());
        let json = serde_json::to_value(&auto).expect("json");
        assert_eq!(json["wake_rate"], "auto");
    }

    #[test]
    fn the_default_learns_and_a_number_pins() {
        let d = PolicySpec::builtin();
        let learned = pacing_of(&PolicySpec::default(), &d).expect("defaults");
        assert_eq!(learned.pinned_m, None);
        assert_eq!(learned.known_limit_m, None);
        let spec = PolicySpec {
            wake_rate: Some(WakeRate::Pinned(200)),
            upstream_limit: Some("600/min".into()),
            ..PolicySpec::default()
        };
        let p = pacing_of(&spec, &d).expect("valid");
        assert_eq!(p.pinned_m, Some(200_000));
        // Half of 10/s by default, and the default floor (10/s) under it.
        assert_eq!(p.known_limit_m, Some(5_000));
        assert_eq!(p.floor_m, 5_000);
        let bad = PolicySpec {
            wake_floor: Some(10.0),
            wake_ceiling: Some(5.0),
            ..PolicySpec::default()
        };
        assert!(matches!(
            pacing_of(&bad, &d),
            Err(PolicyError::OutOfRange {
                field: "wake_ceiling",
                ..
            })
        ));
    }
}
