//! The Admin API's wire translation: policy fields, rules, changes,
//! freezes and hints to and from their protobuf messages, and the opaque
//! page tokens of `ListScopes`.

use tollgate_proto::v1;

use crate::config::{PolicyDoc, RuleSpec};
use crate::control::persist::FreezeRecord;
use crate::control::{Change, ChangeKind};
use crate::hints::HintRecord;
use crate::policy::PolicySpec;
use crate::policy_wire;
use crate::scope::RouteKey;
use crate::service::error::ServiceError;
use crate::service::validate::{self, MAX_CALLER_SCOPE, MAX_ROUTE};

use super::{MAX_DURATION_TEXT, Result};

/// The wire's policy fields as a spec, the bounded texts checked first
/// (`mode` is a short word, bounded like the duration texts).
pub(super) fn spec_of(fields: Option<v1::PolicyFields>) -> Result<PolicySpec> {
    let f = fields.unwrap_or_default();
    for (field, text) in [
        ("window", &f.window),
        ("lease_ttl", &f.lease_ttl),
        ("max_hint", &f.max_hint),
        ("clock_skew_tolerance", &f.clock_skew_tolerance),
        ("backoff_base", &f.backoff_base),
        ("backoff_max", &f.backoff_max),
        ("upstream_limit", &f.upstream_limit),
        ("reconsider_horizon", &f.reconsider_horizon),
        ("uncorroborated_cap", &f.uncorroborated_cap),
        ("mode", &f.mode),
    ] {
        if let Some(v) = text {
            validate::name(&format!("fields.{field}"), v, MAX_DURATION_TEXT)?;
        }
    }
    Ok(policy_wire::spec_of(f))
}

pub(super) fn rule_of(doc: &PolicyDoc, rule: Option<&RuleSpec>) -> v1::PolicyRule {
    let defaults = doc.defaults.over(&PolicySpec::builtin());
    match rule {
        Some(r) => v1::PolicyRule {
            caller_scope: r.caller_scope.clone(),
            route: r.route.clone(),
            policy_version: r.policy.policy_version.unwrap_or(0),
            fields: Some(policy_wire::fields_of(&r.policy)),
            effective: Some(policy_wire::fields_of(&r.policy.over(&defaults))),
        },
        None => v1::PolicyRule {
            caller_scope: String::new(),
            route: String::new(),
            policy_version: doc.defaults.policy_version.unwrap_or(0),
            fields: Some(policy_wire::fields_of(&doc.defaults)),
            effective: Some(policy_wire::fields_of(&defaults)),
        },
    }
}

pub(super) fn changes_of(
    changes: Vec<Change>,
    applied: bool,
    version: u64,
    file: String,
) -> v1::PolicyChanges {
    v1::PolicyChanges {
        changes: changes
            .into_iter()
            .map(|c| v1::PolicyChange {
                target: c.target,
                kind: match c.kind {
                    ChangeKind::Added => v1::PolicyChangeKind::Added,
                    ChangeKind::Removed => v1::PolicyChangeKind::Removed,
                    ChangeKind::Changed => v1::PolicyChangeKind::Changed,
                }
                .into(),
                fields: c
                    .fields
                    .into_iter()
                    .map(|(field, before, after)| v1::FieldChange {
                        field,
                        before,
                        after,
                    })
                    .collect(),
            })
            .collect(),
        applied,
        policy_version: version,
        file,
    }
}

pub(super) fn freeze_of(f: Option<FreezeRecord>) -> v1::FreezeState {
    match f {
        Some(f) => v1::FreezeState {
            frozen: true,
            reason: f.reason,
            by: f.by,
            since_unix_ms: f.since_ms,
            expires_at_unix_ms: f.expires_at_ms.unwrap_or(0),
        },
        None => v1::FreezeState::default(),
    }
}

pub(super) fn hint_of(h: &HintRecord, level: &str) -> v1::HintRecord {
    v1::HintRecord {
        at_unix_ms: h.at_ms,
        raw: h.raw.clone().unwrap_or_default(),
        form: h.form.as_str().to_owned(),
        valid: h.valid,
        capped: h.capped,
        clock_skew: h.clock_skew,
        cooldown_until_unix_ms: h.cooldown_until_ms.unwrap_or(0),
        level: level.to_owned(),
    }
}

/// Page tokens are the last key of the page, hex-encoded so they stay
/// printable and opaque whatever the names hold.
pub(super) fn page_token(key: &RouteKey) -> String {
    format!("{}\u{1f}{}", key.caller_scope, key.route)
        .bytes()
        .map(|b| format!("{b:02x}"))
        .collect()
}

pub(super) fn parse_page_token(token: &str) -> Result<Option<RouteKey>> {
    if token.is_empty() {
        return Ok(None);
    }
    let bad = || ServiceError::invalid("page_token", "is not a token this server issued");
    if token.len() > 2 * (MAX_CALLER_SCOPE + MAX_ROUTE + 1) || !token.len().is_multiple_of(2) {
        return Err(bad());
    }
    let bytes = (0..token.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(token.get(i..i + 2).unwrap_or("zz"), 16))
        .collect::<std::result::Result<Vec<u8>, _>>()
        .map_err(|_| bad())?;
    let text = String::from_utf8(bytes).map_err(|_| bad())?;
    let (caller_scope, route) = text.split_once('\u{1f}').ok_or_else(bad)?;
    Ok(Some(RouteKey {
        caller_scope: caller_scope.to_owned(),
        route: route.to_owned(),
    }))
}

pub(super) fn tokens(milli: u64) -> f64 {
    // Milli-tokens are integers below 2^53 for any validated policy.
    #[allow(clippy::cast_precision_loss)]
    let t = milli as f64 / 1000.0;
    t
}

pub(super) fn count(n: usize) -> u32 {
    u32::try_from(n).unwrap_or(u32::MAX)
}
