//! A policy's fields in the Admin API's messages: the one translation of
//! [`PolicySpec`] to and from `v1::PolicyFields`. The Admin service answers
//! and reads with it, and so does the operator CLI, which is a client of
//! that service and may not import the service's code; so the translation
//! sits below both. Checking the fields is the service's, not this module's.

use tollgate_proto::v1;

use crate::policy::{PolicySpec, Shares, WakeRate};

/// The wire's policy fields as a spec, texts as they came: the Admin
/// service bounds them first ([`crate::service`]), the operator CLI reads
/// what a coordinator already checked.
pub fn spec_of(f: v1::PolicyFields) -> PolicySpec {
    PolicySpec {
        policy_version: None,
        window: f.window,
        min_retries_per_sec: f.min_retries_per_sec,
        retry_ratio: f.retry_ratio,
        max_retries_per_window: f.max_retries_per_window,
        cost_transient: f.cost_transient,
        cost_throttled: f.cost_throttled,
        shares: f.shares.map(|s| Shares {
            critical: s.critical,
            normal: s.normal,
            bulk: s.bulk,
        }),
        lease_ttl: f.lease_ttl,
        max_hint: f.max_hint,
        clock_skew_tolerance: f.clock_skew_tolerance,
        backoff_base: f.backoff_base,
        backoff_max: f.backoff_max,
        wake_rate: f.wake_rate.map(WakeRate::from_wire),
        upstream_limit: f.upstream_limit,
        upstream_share: f.upstream_share,
        stated_margin: f.stated_margin,
        wake_floor: f.wake_floor,
        wake_ceiling: f.wake_ceiling,
        reconsider_horizon: f.reconsider_horizon,
        hold_first_attempts: f.hold_first_attempts,
        corroborate_workers: f.corroborate_workers,
        corroborate_fraction: f.corroborate_fraction,
        uncorroborated_cap: f.uncorroborated_cap,
        mode: f.mode,
    }
}

/// A spec as the wire's policy fields.
pub fn fields_of(s: &PolicySpec) -> v1::PolicyFields {
    v1::PolicyFields {
        window: s.window.clone(),
        min_retries_per_sec: s.min_retries_per_sec,
        retry_ratio: s.retry_ratio,
        max_retries_per_window: s.max_retries_per_window,
        cost_transient: s.cost_transient,
        cost_throttled: s.cost_throttled,
        shares: s.shares.as_ref().map(|s| v1::Shares {
            critical: s.critical,
            normal: s.normal,
            bulk: s.bulk,
        }),
        lease_ttl: s.lease_ttl.clone(),
        max_hint: s.max_hint.clone(),
        clock_skew_tolerance: s.clock_skew_tolerance.clone(),
        backoff_base: s.backoff_base.clone(),
        backoff_max: s.backoff_max.clone(),
        wake_rate: s.wake_rate.map(WakeRate::to_wire),
        upstream_limit: s.upstream_limit.clone(),
        upstream_share: s.upstream_share,
        stated_margin: s.stated_margin,
        wake_floor: s.wake_floor,
        wake_ceiling: s.wake_ceiling,
        reconsider_horizon: s.reconsider_horizon.clone(),
        hold_first_attempts: s.hold_first_attempts,
        corroborate_workers: s.corroborate_workers,
        corroborate_fraction: s.corroborate_fraction,
        uncorroborated_cap: s.uncorroborated_cap.clone(),
        mode: s.mode.clone(),
    }
}
