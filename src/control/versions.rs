//! Policy versions: every rule's version explicit in the running document,
//! a new one for each effective change, and the policy file's own
//! `policy_version` honoured when it can be.

use crate::config::{PolicyDoc, RuleSpec};

use super::commit::State;
use super::overrides::{DEFAULTS, Overrides};
use super::plan::{Change, ChangeKind, plan};
use super::{ControlError, check_size};

/// Every version in `doc` made explicit, so the document alone says what
/// workers are told (and survives a reload of the state file unchanged).
pub(super) fn pin_versions(doc: &mut PolicyDoc) -> Result<(), ControlError> {
    let set = doc.build()?;
    let default_version = set.default_policy().policy_version;
    doc.defaults.policy_version = Some(default_version);
    for i in 0..doc.rules.len() {
        let version = doc
            .rule_policy(&doc.rules[i])
            .map(|p| p.policy_version)
            .unwrap_or(default_version);
        doc.rules[i].policy.policy_version = Some(version);
    }
    Ok(())
}

/// The highest version in use in `doc`.
pub(super) fn max_version(doc: &PolicyDoc) -> u64 {
    doc.rules
        .iter()
        .filter_map(|r| r.policy.policy_version)
        .chain(doc.defaults.policy_version)
        .max()
        .unwrap_or(1)
}

/// The `policy_version` a policy file writes for `id` (a rule id or
/// `[defaults]`), if it writes one.
pub(super) fn named_version(file: &PolicyDoc, id: &str) -> Option<u64> {
    if id == DEFAULTS {
        return file.defaults.policy_version;
    }
    file.rules
        .iter()
        .find(|r| r.id() == id)
        .and_then(|r| r.policy.policy_version)
}

/// Rules (and `[defaults]`) whose written `policy_version` differs between
/// two files: the file's author changed the rule's version, if nothing else.
pub(super) fn version_edits(old: &PolicyDoc, new: &PolicyDoc) -> Vec<String> {
    ids(new)
        .into_iter()
        .filter(|id| {
            let now = named_version(new, id);
            now.is_some() && now != named_version(old, id)
        })
        .collect()
}

fn version_of(doc: &PolicyDoc, id: &str) -> Option<u64> {
    if id == DEFAULTS {
        return doc.defaults.policy_version;
    }
    doc.rules
        .iter()
        .find(|r| r.id() == id)
        .and_then(|r| r.policy.policy_version)
}

/// `[defaults]` and every rule of `doc`, by id.
fn ids(doc: &PolicyDoc) -> Vec<String> {
    std::iter::once(DEFAULTS.to_owned())
        .chain(doc.rules.iter().map(RuleSpec::id))
        .collect()
}

fn set_version(doc: &mut PolicyDoc, id: &str, version: u64) {
    if id == DEFAULTS {
        doc.defaults.policy_version = Some(version);
    } else if let Some(rule) = doc.rules.iter_mut().find(|r| r.id() == id) {
        rule.policy.policy_version = Some(version);
    }
}

/// The state that runs `overrides` over `file`: the plan from the running
/// document, each changed rule (and each in `forced`) at a new version —
/// the one `named` gives it when that is above every version in use, else
/// the next one — and the others at theirs. Returns the state, the changes
/// and the highest version given (0: none).
pub(super) fn relayer(
    st: &State,
    file: PolicyDoc,
    overrides: Overrides,
    forced: &[String],
    named: impl Fn(&str) -> Option<u64>,
) -> Result<(State, Vec<Change>, u64), ControlError> {
    let mut target = overrides.compose(&file);
    target.build()?;
    check_size(&target)?;
    let in_use = max_version(&st.doc);
    let mut changes = plan(&st.doc, &target);
    for id in ids(&target) {
        let listed = changes.iter().any(|c| c.target == id);
        let renamed = named(&id).is_some_and(|n| n > in_use);
        if !listed && (renamed || forced.contains(&id)) {
            let before = version_of(&st.doc, &id).unwrap_or(0).to_string();
            changes.push(Change {
                target: id,
                kind: ChangeKind::Changed,
                fields: vec![("policy_version".into(), before, String::new())],
            });
        }
    }
    let next_version = in_use + 1;
    let mut top = 0;
    // Unchanged rules keep the version they run at.
    for id in ids(&target) {
        let changed = changes.iter().any(|c| c.target == id);
        let version = if changed {
            let version = match named(&id) {
                Some(n) if n > in_use => n,
                Some(n) => {
                    tracing::warn!(rule = %id, named = n, served = next_version,
                        "the policy file names a version at or below one already served; serving the next version instead");
                    next_version
                }
                None => next_version,
            };
            top = top.max(version);
            version
        } else {
            version_of(&st.doc, &id).unwrap_or(next_version)
        };
        set_version(&mut target, &id, version);
    }
    for c in &mut changes {
        if let Some((_, _, after)) = c.fields.iter_mut().find(|(f, _, _)| f == "policy_version") {
            *after = version_of(&target, &c.target).unwrap_or(0).to_string();
        }
    }
    // The file layer runs at the versions served, so a rule handed back to
    // it later is compared with what workers were told.
    let mut file = file;
    for id in ids(&file) {
        let version = if overrides.covers(&id) {
            version_of(&file, &id).or(version_of(&st.file_doc, &id))
        } else {
            version_of(&target, &id)
        };
        set_version(&mut file, &id, version.unwrap_or(1));
    }
    let mut next = st.clone();
    next.doc = target;
    next.file_doc = file;
    next.overrides = overrides;
    Ok((next, changes, top))
}
