//! `tollgate scopes …`: list and inspect scopes, freeze, unfreeze, reset
//! (mute and unmute are in `evidence`).

use serde_json::{Value, json};
use tollgate_proto::v1;

use super::args::{ScopeRef, ScopesCommand};
use super::render::{emit, enum_name, print_table, time};
use super::{Client, EXIT_OK, Failure, Outcome, evidence, stated};

/// Runs one `scopes` command.
pub(super) async fn run(client: &mut Client, command: ScopesCommand) -> Outcome {
    match command {
        ScopesCommand::List {
            caller_scope,
            route,
            frozen,
            tenant,
            limit,
        } => {
            let filter = Listing {
                caller_scope,
                route,
                frozen,
                tenant: tenant.unwrap_or_default(),
            };
            list(client, filter, limit).await
        }
        ScopesCommand::Show(scope) => {
            let req = client.request(v1::GetScopeRequest {
                caller_scope: scope.caller_scope,
                route: scope.route,
            })?;
            let s = client
                .inner
                .get_scope(req)
                .await
                .map_err(|s| Failure::status("reading the scope", &s))?
                .into_inner();
            emit(client.output, || scope_json(&s), || print_scope(&s));
            Ok(EXIT_OK)
        }
        ScopesCommand::Freeze {
            scope,
            reason,
            duration,
        } => {
            let req = client.request(v1::FreezeScopeRequest {
                caller_scope: scope.caller_scope.clone(),
                route: scope.route.clone(),
                reason,
                duration_ms: duration
                    .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX)),
            })?;
            let f = client
                .inner
                .freeze_scope(req)
                .await
                .map_err(|s| Failure::status("freezing the scope", &s))?
                .into_inner();
            emit(
                client.output,
                || freeze_json(&f),
                || {
                    outln!(
                        "frozen {}|{} until {}",
                        scope.caller_scope,
                        scope.route,
                        until(f.expires_at_unix_ms)
                    );
                },
            );
            Ok(EXIT_OK)
        }
        ScopesCommand::Unfreeze { scope, reason } => {
            let req = client.request(v1::UnfreezeScopeRequest {
                caller_scope: scope.caller_scope.clone(),
                route: scope.route.clone(),
                reason,
            })?;
            client
                .inner
                .unfreeze_scope(req)
                .await
                .map_err(|s| Failure::status("unfreezing the scope", &s))?;
            emit(
                client.output,
                || json!({"frozen": false}),
                || outln!("unfrozen {}|{}", scope.caller_scope, scope.route),
            );
            Ok(EXIT_OK)
        }
        ScopesCommand::Mute {
            scope,
            worker,
            reason,
            duration,
        } => evidence::mute(client, scope, worker, reason, duration).await,
        ScopesCommand::Unmute {
            scope,
            worker,
            reason,
        } => evidence::unmute(client, scope, worker, reason).await,
        ScopesCommand::Reset { scope, reason } => reset(client, scope, reason).await,
    }
}

/// Which scopes `scopes list` asks for.
struct Listing {
    caller_scope: String,
    route: String,
    frozen: bool,
    /// A `[[token]]` entry's name; empty: any.
    tenant: String,
}

async fn list(client: &mut Client, filter: Listing, limit: usize) -> Outcome {
    let mut all = Vec::new();
    let mut token = String::new();
    while all.len() < limit {
        let req = client.request(v1::ListScopesRequest {
            caller_scope: filter.caller_scope.clone(),
            route: filter.route.clone(),
            frozen_only: filter.frozen,
            page_size: u32::try_from((limit - all.len()).min(500)).unwrap_or(500),
            page_token: token.clone(),
            tenant: filter.tenant.clone(),
        })?;
        let page = client
            .inner
            .list_scopes(req)
            .await
            .map_err(|s| Failure::status("listing scopes", &s))?
            .into_inner();
        all.extend(page.scopes);
        if page.next_page_token.is_empty() {
            break;
        }
        token = page.next_page_token;
    }
    emit(
        client.output,
        || {
            Value::Array(
                all.iter()
                    .map(|s| {
                        json!({
                            "caller_scope": s.caller_scope, "route": s.route,
                            "frozen": s.frozen, "cooldown_until_unix_ms": s.cooldown_until_unix_ms,
                            "leases_outstanding": s.leases_outstanding, "slot_backlog": s.slot_backlog,
                            "policy_version": s.policy_version, "last_touched_unix_ms": s.last_touched_unix_ms,
                            "tenant": s.tenant,
                        })
                    })
                    .collect(),
            )
        },
        || {
            let rows: Vec<Vec<String>> = all
                .iter()
                .map(|s| {
                    vec![
                        s.caller_scope.clone(),
                        s.route.clone(),
                        if s.frozen { "FROZEN" } else { "-" }.into(),
                        time(s.cooldown_until_unix_ms),
                        s.leases_outstanding.to_string(),
                        s.slot_backlog.to_string(),
                        s.policy_version.to_string(),
                        if s.tenant.is_empty() { "-" } else { &s.tenant }.into(),
                    ]
                })
                .collect();
            print_table(
                &[
                    "CALLER_SCOPE",
                    "ROUTE",
                    "FROZEN",
                    "COOLDOWN_UNTIL",
                    "LEASES",
                    "WAITING",
                    "VERSION",
                    "TENANT",
                ],
                &rows,
            );
        },
    );
    Ok(EXIT_OK)
}

async fn reset(client: &mut Client, scope: ScopeRef, reason: String) -> Outcome {
    let req = client.request(v1::ResetScopeRequest {
        caller_scope: scope.caller_scope.clone(),
        route: scope.route.clone(),
        reason,
    })?;
    let r = client
        .inner
        .reset_scope(req)
        .await
        .map_err(|s| Failure::status("resetting the scope", &s))?
        .into_inner();
    emit(
        client.output,
        || json!({"existed": r.existed}),
        || {
            if r.existed {
                outln!("reset {}|{}", scope.caller_scope, scope.route);
            } else {
                outln!("{}|{}: no state to reset", scope.caller_scope, scope.route);
            }
        },
    );
    Ok(EXIT_OK)
}

/// When a freeze ends: its expiry, or "unfrozen" for one without.
fn until(expires_at_unix_ms: i64) -> String {
    if expires_at_unix_ms > 0 {
        time(expires_at_unix_ms)
    } else {
        "unfrozen".into()
    }
}

fn freeze_json(f: &v1::FreezeState) -> Value {
    json!({
        "frozen": f.frozen, "reason": f.reason, "by": f.by,
        "since_unix_ms": f.since_unix_ms, "expires_at_unix_ms": f.expires_at_unix_ms,
    })
}

fn hint_json(h: &v1::HintRecord) -> Value {
    json!({
        "at_unix_ms": h.at_unix_ms, "raw": h.raw, "form": h.form, "valid": h.valid,
        "capped": h.capped, "clock_skew": h.clock_skew,
        "cooldown_until_unix_ms": h.cooldown_until_unix_ms, "level": h.level,
    })
}

fn priority(c: &v1::ClassBalance) -> String {
    enum_name(c.priority().as_str_name(), "PRIORITY_")
}

fn scope_json(s: &v1::ScopeState) -> Value {
    json!({
        "caller_scope": s.caller_scope, "route": s.route, "known": s.known,
        "policy_version": s.policy_version, "policy_rule": s.policy_rule,
        "first_attempts_in_window": s.first_attempts_in_window, "allowance": s.allowance,
        "classes": s.classes.iter().map(|c| {
            json!({"priority": priority(c), "allowance": c.allowance, "spent": c.spent,
                   "available": c.available, "active_workers": c.active_workers})
        }).collect::<Vec<_>>(),
        "leases_outstanding": s.leases_outstanding, "tokens_outstanding": s.tokens_outstanding,
        "cooldown_until_unix_ms": s.cooldown_until_unix_ms,
        "cooldown_source": s.cooldown_source.as_ref().map(hint_json),
        "floor_unix_ms": s.floor_unix_ms, "backoff_step": s.backoff_step,
        "slot_backlog": s.slot_backlog,
        "recent_hints": s.recent_hints.iter().map(hint_json).collect::<Vec<_>>(),
        "freeze": s.freeze.as_ref().map(freeze_json),
        "last_touched_unix_ms": s.last_touched_unix_ms,
        "route_evidence": evidence::evidence_json(s.route_evidence.as_ref()),
        "caller_evidence": evidence::evidence_json(s.caller_evidence.as_ref()),
        "pacing": s.pacing.as_ref().map(|p| json!({
            "state": p.state, "wake_rate": p.wake_rate,
            "capacity_estimate": p.capacity_estimate,
            "first_attempt_rate": p.first_attempt_rate,
            "spare_capacity": p.spare_capacity,
            "penalty_until_unix_ms": p.penalty_until_unix_ms, "asking": p.asking,
            "capacity_measured": p.capacity_measured,
            "burst_estimate": p.burst_estimate, "phase": p.phase,
            "stated": stated::stated_json(p.stated.as_ref()),
        })),
    })
}

fn print_scope(s: &v1::ScopeState) {
    outln!("scope           {}|{}", s.caller_scope, s.route);
    outln!(
        "policy          version {} from {}",
        s.policy_version,
        s.policy_rule
    );
    match s.freeze.as_ref().filter(|f| f.frozen) {
        Some(f) => outln!(
            "frozen          yes, by {} since {}: {} (until {})",
            f.by,
            time(f.since_unix_ms),
            f.reason,
            until(f.expires_at_unix_ms)
        ),
        None => outln!("frozen          no"),
    }
    if !s.known {
        outln!("state           none held (no traffic seen, or evicted as idle)");
        return;
    }
    outln!("cooldown until  {}", time(s.cooldown_until_unix_ms));
    if let Some(h) = &s.cooldown_source {
        outln!(
            "  from hint     {:?} ({}, {} level, seen {})",
            h.raw,
            h.form,
            h.level,
            time(h.at_unix_ms)
        );
    }
    outln!(
        "floor           {} (backoff step {})",
        time(s.floor_unix_ms),
        s.backoff_step
    );
    evidence::print_evidence(s);
    outln!("slot backlog    {} waiting intents", s.slot_backlog);
    if let Some(p) = &s.pacing {
        outln!(
            "pacing          {}: wake rate {:.1}/s, capacity {:.1}/s, first attempts {:.1}/s, spare {:.1}/s, {} asking again",
            p.state,
            p.wake_rate,
            p.capacity_estimate,
            p.first_attempt_rate,
            p.spare_capacity,
            p.asking
        );
        if !p.phase.is_empty() {
            outln!(
                "  model         {}: capacity {}, burst {:.0} seen",
                p.phase,
                if p.capacity_measured {
                    "measured"
                } else {
                    "what it served without refusing"
                },
                p.burst_estimate
            );
        }
        stated::print_stated(p.stated.as_ref());
        if p.penalty_until_unix_ms > 0 {
            outln!(
                "  penalty       the upstream re-arms its window: closed until {}",
                time(p.penalty_until_unix_ms)
            );
        }
    }
    outln!(
        "leases          {} outstanding, {} tokens",
        s.leases_outstanding,
        s.tokens_outstanding
    );
    outln!(
        "window          {} first attempts, allowance {:.3} tokens",
        s.first_attempts_in_window,
        s.allowance
    );
    let rows: Vec<Vec<String>> = s
        .classes
        .iter()
        .map(|c| {
            vec![
                priority(c),
                format!("{:.3}", c.available),
                format!("{:.3}", c.spent),
                format!("{:.3}", c.allowance),
                c.active_workers.to_string(),
            ]
        })
        .collect();
    print_table(
        &["PRIORITY", "AVAILABLE", "SPENT", "ALLOWANCE", "WORKERS"],
        &rows,
    );
    if !s.recent_hints.is_empty() {
        outln!();
        let rows: Vec<Vec<String>> = s
            .recent_hints
            .iter()
            .map(|h| {
                vec![
                    time(h.at_unix_ms),
                    h.level.clone(),
                    h.form.clone(),
                    if h.valid { "valid" } else { "INVALID" }.into(),
                    if h.capped { "capped" } else { "-" }.into(),
                    format!("{:?}", h.raw),
                ]
            })
            .collect();
        print_table(
            &["SEEN", "LEVEL", "FORM", "VALIDITY", "CAPPED", "RAW"],
            &rows,
        );
    }
}
