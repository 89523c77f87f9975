//! Planning a policy change: what differs, rule by rule, between the
//! running document and a target one (effective policies compared, versions
//! ignored) — for `apply`, dry runs, `diff` and the audit log.

use std::collections::BTreeMap;

use crate::config::PolicyDoc;
use crate::policy::{Policy, PolicySpec};

/// One rule's difference between two documents.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Change {
    /// `caller_scope|route`, or `[defaults]`.
    pub target: String,
    /// What kind.
    pub kind: ChangeKind,
    /// `(field, before, after)` of the effective policy; "" means unset.
    pub fields: Vec<(String, String, String)>,
}

/// Added, removed or changed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ChangeKind {
    /// Only in the new document.
    Added,
    /// Only in the running one.
    Removed,
    /// In both, effectively different.
    Changed,
}

/// The effective spec of a rule (or of `[defaults]` when `rule` is `None`)
/// as a field → value map, for diffs and the audit log. The version is left
/// out: it is not something a file and a running set disagree about.
fn effective_fields(doc: &PolicyDoc, rule: Option<&PolicySpec>) -> BTreeMap<String, String> {
    let defaults = doc.defaults.over(&PolicySpec::builtin());
    let spec = rule.map_or_else(|| defaults.clone(), |r| r.over(&defaults));
    spec_fields(&spec)
}

/// A spec's set fields as field → JSON value.
pub fn spec_fields(spec: &PolicySpec) -> BTreeMap<String, String> {
    let mut spec = spec.clone();
    spec.policy_version = None;
    match serde_json::to_value(&spec) {
        Ok(serde_json::Value::Object(map)) => map
            .into_iter()
            .map(|(k, v)| {
                let text = match v {
                    serde_json::Value::String(s) => s,
                    other => other.to_string(),
                };
                (k, text)
            })
            .collect(),
        _ => BTreeMap::new(),
    }
}

fn same_policy(a: Result<Policy, impl Sized>, b: Result<Policy, impl Sized>) -> bool {
    match (a, b) {
        (Ok(mut a), Ok(mut b)) => {
            a.policy_version = 0;
            b.policy_version = 0;
            a == b
        }
        _ => false,
    }
}

fn field_diff(
    before: &BTreeMap<String, String>,
    after: &BTreeMap<String, String>,
) -> Vec<(String, String, String)> {
    let mut keys: Vec<&String> = before.keys().chain(after.keys()).collect();
    keys.sort();
    keys.dedup();
    keys.into_iter()
        .filter_map(|k| {
            let b = before.get(k).cloned().unwrap_or_default();
            let a = after.get(k).cloned().unwrap_or_default();
            (b != a).then(|| (k.clone(), b, a))
        })
        .collect()
}

/// What changes when `running` becomes `target` (effective policies
/// compared; versions ignored). A changed rule lists the effective fields
/// that differ; an added or removed one lists the keys it sets itself (the
/// rest is `[defaults]`, shown once as its own change if it differs).
pub fn plan(running: &PolicyDoc, target: &PolicyDoc) -> Vec<Change> {
    let mut changes = Vec::new();
    let defaults_policy = |d: &PolicyDoc| Policy::try_new(&d.defaults.over(&PolicySpec::builtin()));
    if !same_policy(defaults_policy(running), defaults_policy(target)) {
        changes.push(Change {
            target: "[defaults]".into(),
            kind: ChangeKind::Changed,
            fields: field_diff(
                &effective_fields(running, None),
                &effective_fields(target, None),
            ),
        });
    }
    for rule in &target.rules {
        match running.find(&rule.caller_scope, &rule.route) {
            None => changes.push(Change {
                target: rule.id(),
                kind: ChangeKind::Added,
                fields: field_diff(&BTreeMap::new(), &spec_fields(&rule.policy)),
            }),
            Some(i) => {
                let old = &running.rules[i];
                if !same_policy(running.rule_policy(old), target.rule_policy(rule)) {
                    changes.push(Change {
                        target: rule.id(),
                        kind: ChangeKind::Changed,
                        fields: field_diff(
                            &effective_fields(running, Some(&old.policy)),
                            &effective_fields(target, Some(&rule.policy)),
                        ),
                    });
                }
            }
        }
    }
    for rule in &running.rules {
        if target.find(&rule.caller_scope, &rule.route).is_none() {
            changes.push(Change {
                target: rule.id(),
                kind: ChangeKind::Removed,
                fields: field_diff(&spec_fields(&rule.policy), &BTreeMap::new()),
            });
        }
    }
    changes
}
