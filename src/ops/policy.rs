//! `tollgate policy …`: read and change rules, apply a file, find drift.

use std::path::Path;

use serde_json::{Value, json};
use tollgate_proto::v1;
use tonic::Code;

use super::args::{PolicyCommand, RuleRef};
use super::render::{emit, enum_name, or_dash, print_table};
use super::{Client, EXIT_DRIFT, EXIT_OK, Failure, Outcome};
use crate::config::PolicyDoc;
use crate::policy::PolicySpec;
use crate::policy_wire::{fields_of, spec_of};

/// The policy file a command sends, read and validated before dialling.
pub(super) fn local_file(command: &PolicyCommand) -> Result<Option<String>, Failure> {
    match command {
        PolicyCommand::Apply { file, .. }
        | PolicyCommand::Diff {
            file: Some(file), ..
        } => read_policy_file(file).map(Some),
        _ => Ok(None),
    }
}

fn read_policy_file(file: &Path) -> Result<String, Failure> {
    let text = std::fs::read_to_string(file)
        .map_err(|e| Failure::invalid(format!("{}: {e}", file.display())))?;
    PolicyDoc::from_toml(&text).map_err(|e| {
        Failure::invalid(format!("{}: {}", file.display(), one_line(&e.to_string())))
    })?;
    Ok(text)
}

/// How a rule is named to an operator: `caller_scope|route`, or just
/// `[defaults]` (which the Admin API answers with empty patterns).
fn rule_name(caller_scope: &str, route: &str) -> String {
    if route.is_empty() {
        crate::control::overrides::DEFAULTS.to_owned()
    } else if route == crate::control::overrides::DEFAULTS {
        route.to_owned()
    } else {
        format!("{caller_scope}|{route}")
    }
}

fn one_line(text: &str) -> String {
    text.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// `KEY=VALUE` pairs read as TOML values (a bare word is a string), then as
/// a policy spec by the same deserializer as the file.
fn parse_assignments(pairs: &[String]) -> Result<PolicySpec, Failure> {
    let mut table = toml::Table::new();
    for pair in pairs {
        let (key, raw) = pair
            .split_once('=')
            .ok_or_else(|| Failure::invalid(format!("{pair:?}: expected KEY=VALUE")))?;
        let key = key.trim();
        let value = toml::from_str::<toml::Table>(&format!("v = {raw}"))
            .ok()
            .and_then(|mut t| t.remove("v"))
            .unwrap_or_else(|| toml::Value::String(raw.trim().to_owned()));
        if key == "policy_version" {
            return Err(Failure::invalid(
                "policy_version is assigned by the coordinator; use --version for the one you read",
            ));
        }
        table.insert(key.to_owned(), value);
    }
    toml::Value::Table(table)
        .try_into::<PolicySpec>()
        .map_err(|e| Failure::invalid(one_line(&e.to_string())))
}

fn spec_json(fields: Option<v1::PolicyFields>) -> Value {
    serde_json::to_value(spec_of(fields.unwrap_or_default())).unwrap_or(Value::Null)
}

fn fields_text(fields: Option<v1::PolicyFields>) -> String {
    crate::control::spec_fields(&spec_of(fields.unwrap_or_default()))
        .into_iter()
        .map(|(k, v)| format!("{k}={v}"))
        .collect::<Vec<_>>()
        .join(" ")
}

fn rule_json(r: &v1::PolicyRule) -> Value {
    json!({
        "caller_scope": r.caller_scope,
        "route": r.route,
        "policy_version": r.policy_version,
        "fields": spec_json(r.fields.clone()),
        "effective": spec_json(r.effective.clone()),
    })
}

async fn current_version(client: &mut Client, rule: &RuleRef) -> Result<u64, Failure> {
    let req = client.request(v1::GetPolicyRequest {
        caller_scope: rule.caller_scope.clone(),
        route: rule.route.clone(),
    })?;
    match client.inner.get_policy(req).await {
        Ok(r) => Ok(r.into_inner().policy_version),
        Err(s) if s.code() == Code::NotFound => Ok(0),
        Err(s) => Err(Failure::status("reading the rule", &s)),
    }
}

fn change_kind(c: &v1::PolicyChange) -> String {
    enum_name(c.kind().as_str_name(), "POLICY_CHANGE_KIND_")
}

fn changes_json(changes: &v1::PolicyChanges) -> Value {
    json!({
        "applied": changes.applied,
        "policy_version": changes.policy_version,
        "file": changes.file,
        "changes": changes.changes.iter().map(|c| json!({
            "target": c.target,
            "kind": change_kind(c),
            "fields": c.fields.iter()
                .map(|f| json!({"field": f.field, "before": f.before, "after": f.after}))
                .collect::<Vec<_>>(),
        })).collect::<Vec<_>>(),
    })
}

fn print_changes(client: &Client, changes: &v1::PolicyChanges, what: &str) {
    emit(
        client.output,
        || changes_json(changes),
        || {
            if changes.changes.is_empty() {
                outln!("{what}: no differences");
                return;
            }
            let mut rows = Vec::new();
            for c in &changes.changes {
                let kind = change_kind(c);
                // The rule and the kind of change head its first field only.
                for (i, f) in c.fields.iter().enumerate() {
                    let (t, k) = if i == 0 {
                        (c.target.clone(), kind.clone())
                    } else {
                        (String::new(), String::new())
                    };
                    rows.push(vec![
                        t,
                        k,
                        f.field.clone(),
                        or_dash(&f.before).to_owned(),
                        or_dash(&f.after).to_owned(),
                    ]);
                }
                if c.fields.is_empty() {
                    rows.push(vec![
                        c.target.clone(),
                        kind,
                        String::new(),
                        String::new(),
                        String::new(),
                    ]);
                }
            }
            print_table(&["RULE", "CHANGE", "FIELD", "RUNNING", "FILE"], &rows);
            if changes.applied {
                outln!("applied as policy_version {}", changes.policy_version);
            }
        },
    );
}

fn print_rule(client: &Client, r: &v1::PolicyRule) {
    emit(
        client.output,
        || rule_json(r),
        || {
            outln!("rule            {}", rule_name(&r.caller_scope, &r.route));
            outln!("policy_version  {}", r.policy_version);
            outln!("sets            {}", fields_text(r.fields.clone()));
            outln!("effective       {}", fields_text(r.effective.clone()));
        },
    );
}

/// Runs one `policy` command; `local` is the file `local_file` read.
pub(super) async fn run(
    client: &mut Client,
    command: PolicyCommand,
    local: Option<String>,
) -> Outcome {
    match command {
        PolicyCommand::List => list(client).await,
        PolicyCommand::Get(rule) => {
            let req = client.request(v1::GetPolicyRequest {
                caller_scope: rule.caller_scope.clone(),
                route: rule.route.clone(),
            })?;
            let r = client
                .inner
                .get_policy(req)
                .await
                .map_err(|s| Failure::status("reading the rule", &s))?
                .into_inner();
            print_rule(client, &r);
            Ok(EXIT_OK)
        }
        PolicyCommand::Set {
            rule,
            version,
            replace,
            reason,
            set,
        } => {
            let spec = parse_assignments(&set)?;
            let expected = match version {
                Some(v) => v,
                None => current_version(client, &rule).await?,
            };
            let req = client.request(v1::SetPolicyRequest {
                caller_scope: rule.caller_scope.clone(),
                route: rule.route.clone(),
                expected_version: expected,
                fields: Some(fields_of(&spec)),
                patch: !replace,
                reason,
            })?;
            let r = client
                .inner
                .set_policy(req)
                .await
                .map_err(|s| Failure::status("changing the rule", &s))?
                .into_inner();
            print_rule(client, &r);
            Ok(EXIT_OK)
        }
        PolicyCommand::Delete {
            rule,
            version,
            reason,
        } => delete(client, rule, version, reason).await,
        PolicyCommand::Clear { rule, reason } => clear(client, rule, reason).await,
        PolicyCommand::Apply {
            file,
            dry_run,
            reason,
        } => {
            let changes = apply(client, &file, local, dry_run, reason, "applying").await?;
            let what = if dry_run { "dry run" } else { "apply" };
            print_changes(client, &changes, what);
            Ok(EXIT_OK)
        }
        PolicyCommand::Diff { file } => {
            let changes = match file {
                // A file of the operator's: a dry-run apply is the diff.
                Some(file) => {
                    let mut c =
                        apply(client, &file, local, true, String::new(), "comparing").await?;
                    c.file = file.display().to_string();
                    c
                }
                None => {
                    let req = client.request(v1::DiffPoliciesRequest {})?;
                    client
                        .inner
                        .diff_policies(req)
                        .await
                        .map_err(|s| Failure::status("comparing with the server's file", &s))?
                        .into_inner()
                }
            };
            let drift = !changes.changes.is_empty();
            print_changes(client, &changes, &format!("diff {}", changes.file));
            Ok(if drift { EXIT_DRIFT } else { EXIT_OK })
        }
    }
}

async fn list(client: &mut Client) -> Outcome {
    let req = client.request(v1::ListPoliciesRequest {})?;
    let list = client
        .inner
        .list_policies(req)
        .await
        .map_err(|s| Failure::status("listing policies", &s))?
        .into_inner();
    emit(
        client.output,
        || {
            json!({
                "defaults": list.defaults.as_ref().map(rule_json),
                "rules": list.rules.iter().map(rule_json).collect::<Vec<_>>(),
            })
        },
        || {
            let mut rows = Vec::new();
            if let Some(d) = &list.defaults {
                rows.push(vec![
                    "[defaults]".into(),
                    String::new(),
                    d.policy_version.to_string(),
                    fields_text(d.fields.clone()),
                ]);
            }
            for r in &list.rules {
                rows.push(vec![
                    r.route.clone(),
                    r.caller_scope.clone(),
                    r.policy_version.to_string(),
                    fields_text(r.fields.clone()),
                ]);
            }
            print_table(&["ROUTE", "CALLER_SCOPE", "VERSION", "SETS"], &rows);
        },
    );
    Ok(EXIT_OK)
}

/// Drops a rule's runtime change: the rule follows the policy file again.
async fn clear(client: &mut Client, rule: RuleRef, reason: String) -> Outcome {
    let req = client.request(v1::DeletePolicyRequest {
        caller_scope: rule.caller_scope.clone(),
        route: rule.route.clone(),
        expected_version: 0,
        reason,
        clear: true,
    })?;
    let r = client
        .inner
        .delete_policy(req)
        .await
        .map_err(|s| Failure::status("clearing the runtime change", &s))?
        .into_inner();
    emit(
        client.output,
        || json!({"policy_version": r.policy_version}),
        || {
            outln!(
                "{} follows the policy file again (policy_version {})",
                rule_name(&rule.caller_scope, &rule.route),
                r.policy_version
            );
        },
    );
    Ok(EXIT_OK)
}

async fn delete(
    client: &mut Client,
    rule: RuleRef,
    version: Option<u64>,
    reason: String,
) -> Outcome {
    let expected = match version {
        Some(v) => v,
        None => current_version(client, &rule).await?,
    };
    let req = client.request(v1::DeletePolicyRequest {
        caller_scope: rule.caller_scope.clone(),
        route: rule.route.clone(),
        expected_version: expected,
        reason,
        clear: false,
    })?;
    let r = client
        .inner
        .delete_policy(req)
        .await
        .map_err(|s| Failure::status("deleting the rule", &s))?
        .into_inner();
    emit(
        client.output,
        || json!({"deleted_version": r.deleted_version}),
        || {
            outln!(
                "deleted {}|{} (was policy_version {})",
                rule.caller_scope,
                rule.route,
                r.deleted_version
            );
        },
    );
    Ok(EXIT_OK)
}

/// `ApplyPolicies` with the file's text; `what` starts the error message.
async fn apply(
    client: &mut Client,
    file: &Path,
    text: Option<String>,
    dry_run: bool,
    reason: String,
    what: &str,
) -> Result<v1::PolicyChanges, Failure> {
    let req = client.request(v1::ApplyPoliciesRequest {
        toml: text.unwrap_or_default(),
        dry_run,
        reason,
    })?;
    Ok(client
        .inner
        .apply_policies(req)
        .await
        .map_err(|s| Failure::status(&format!("{what} {}", file.display()), &s))?
        .into_inner())
}
