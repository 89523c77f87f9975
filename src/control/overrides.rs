//! Runtime over file, the way Envoy layers its runtime: the running policy
//! is the policy file with the SREs' runtime changes laid over it.
//!
//! A runtime change (`policy set`, `policy delete`, `policy apply -f`) is
//! recorded as an override of its one rule (or of `[defaults]`). A reload
//! of the file replaces the file layer and keeps every override except
//! those of rules the file itself changed: an unrelated edit to the file
//! never undoes an SRE's change, and an edit to the same rule means the
//! file's author decided again, so the file wins there. `policy clear`
//! drops an override and the rule is the file's again. While an override
//! is in force, `policy diff` shows it as drift from the file.

use crate::config::{PolicyDoc, RuleSpec};
use crate::policy::PolicySpec;

/// One rule changed at runtime.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct RuleOverride {
    /// The rule's caller-scope pattern.
    pub caller_scope: String,
    /// The rule's route pattern.
    pub route: String,
    /// The rule as set at runtime; `None`: deleted at runtime.
    pub rule: Option<RuleSpec>,
}

/// The runtime layer over the policy file.
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Overrides {
    /// `[defaults]` as set at runtime.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub defaults: Option<PolicySpec>,
    /// Rules set or deleted at runtime, in the order first changed.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub rules: Vec<RuleOverride>,
}

pub use crate::policy::DEFAULTS;

impl Overrides {
    /// Records `rule` (`None`: deleted) as the runtime version of
    /// `caller_scope|route`.
    pub fn set(&mut self, caller_scope: &str, route: &str, rule: Option<RuleSpec>) {
        let entry = RuleOverride {
            caller_scope: caller_scope.to_owned(),
            route: route.to_owned(),
            rule,
        };
        match self.position(caller_scope, route) {
            Some(i) => self.rules[i] = entry,
            None => self.rules.push(entry),
        }
    }

    fn position(&self, caller_scope: &str, route: &str) -> Option<usize> {
        self.rules
            .iter()
            .position(|o| o.caller_scope == caller_scope && o.route == route)
    }

    /// Drops the override of `target` (a rule id or [`DEFAULTS`]); returns
    /// whether there was one.
    pub fn clear(&mut self, target: &str) -> bool {
        if target == DEFAULTS {
            return self.defaults.take().is_some();
        }
        let before = self.rules.len();
        self.rules
            .retain(|o| format!("{}|{}", o.caller_scope, o.route) != target);
        self.rules.len() != before
    }

    /// Whether `target` (a rule id or [`DEFAULTS`]) is overridden.
    pub fn covers(&self, target: &str) -> bool {
        if target == DEFAULTS {
            return self.defaults.is_some();
        }
        self.rules
            .iter()
            .any(|o| format!("{}|{}", o.caller_scope, o.route) == target)
    }

    /// The running document: `file` with every override laid over it.
    pub fn compose(&self, file: &PolicyDoc) -> PolicyDoc {
        let mut doc = file.clone();
        if let Some(defaults) = &self.defaults {
            doc.defaults = defaults.clone();
        }
        for o in &self.rules {
            match (doc.find(&o.caller_scope, &o.route), &o.rule) {
                (Some(i), Some(rule)) => doc.rules[i] = rule.clone(),
                (Some(i), None) => {
                    doc.rules.remove(i);
                }
                (None, Some(rule)) => doc.rules.push(rule.clone()),
                (None, None) => {}
            }
        }
        doc
    }

    /// Records every difference between `running` and `target` named in
    /// `targets` as an override (a whole-document `apply` at runtime).
    pub fn record(&mut self, target: &PolicyDoc, targets: &[String]) {
        for id in targets {
            if id == DEFAULTS {
                self.defaults = Some(target.defaults.clone());
                continue;
            }
            let (caller_scope, route) = id.split_once('|').unwrap_or(("*", id));
            let rule = target
                .find(caller_scope, route)
                .map(|i| target.rules[i].clone());
            self.set(caller_scope, route, rule);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn doc(text: &str) -> PolicyDoc {
        PolicyDoc::from_toml(text).expect("valid")
    }

    #[test]
    fn overrides_survive_a_new_file_layer_and_clear_back_to_it() {
        let file = doc("[[rule]]\nroute = \"GET /a\"\nretry_ratio = 0.1\n");
        let mut ov = Overrides::default();
        let mut sre = file.rules[0].clone();
        sre.policy.retry_ratio = Some(0.5);
        ov.set("*", "GET /a", Some(sre.clone()));
        // The file gains an unrelated rule: the SRE's change stays.
        let file2 = doc("[[rule]]\nroute = \"GET /a\"\nretry_ratio = 0.1\n\
             [[rule]]\nroute = \"GET /b\"\nretry_ratio = 0.3\n");
        let running = ov.compose(&file2);
        assert_eq!(running.rules.len(), 2);
        assert_eq!(running.rules[0], sre);
        assert!(ov.covers("*|GET /a"));
        assert!(ov.clear("*|GET /a"));
        assert_eq!(ov.compose(&file2), file2);
        ov.set("*", "GET /b", None);
        assert_eq!(ov.compose(&file2).rules.len(), 1, "deleted at runtime");
    }
}
