//! The operator commands: `tollgate policy …`, `tollgate scopes …`,
//! `tollgate audit`, thin clients of the Admin API.
//!
//! Output is a readable table by default, `-o json` for scripts. Errors are
//! one line on stderr naming the problem. Exit codes (stable, for scripts):
//!
//! | code | meaning |
//! |------|---------|
//! | 0 | done |
//! | 1 | any other failure |
//! | 2 | invalid input: arguments, a policy file, INVALID_ARGUMENT |
//! | 3 | coordinator unreachable or unavailable |
//! | 4 | not allowed: PERMISSION_DENIED / UNAUTHENTICATED |
//! | 5 | no such rule (NOT_FOUND) |
//! | 6 | conflict: the rule changed since it was read (FAILED_PRECONDITION) |
//! | 7 | `policy diff`: the running policy differs from the file |

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use serde_json::{Value, json};
use tollgate_proto::v1::{self, admin_client::AdminClient};
use tonic::transport::Channel;
use tonic::{Code, Request, Status};

mod evidence;

use crate::config::PolicyDoc;
use crate::policy::PolicySpec;
use crate::service::admin::{fields_of, spec_of};

/// Exit: done.
pub const EXIT_OK: u8 = 0;
/// Exit: any other failure.
pub const EXIT_FAILURE: u8 = 1;
/// Exit: invalid input.
pub const EXIT_INVALID: u8 = 2;
/// Exit: coordinator unreachable.
pub const EXIT_UNAVAILABLE: u8 = 3;
/// Exit: not allowed.
pub const EXIT_DENIED: u8 = 4;
/// Exit: no such rule.
pub const EXIT_NOT_FOUND: u8 = 5;
/// Exit: stale version.
pub const EXIT_CONFLICT: u8 = 6;
/// Exit: drift found by `policy diff`.
pub const EXIT_DRIFT: u8 = 7;

/// How to reach the coordinator and how to print.
#[derive(Debug, Clone, clap::Args)]
pub struct Connect {
    /// The coordinator (`host:port` or `http://host:port`).
    #[arg(
        long,
        env = "TOLLGATE_SERVER",
        default_value = "127.0.0.1:50051",
        global = true
    )]
    pub server: String,
    /// An admin token (never a caller token). Prefer the environment
    /// variable: a flag shows in `ps`.
    #[arg(
        long,
        env = "TOLLGATE_ADMIN_TOKEN",
        hide_env_values = true,
        global = true
    )]
    pub token: Option<String>,
    /// Output format.
    #[arg(short = 'o', long, value_enum, default_value = "table", global = true)]
    pub output: Output,
}

/// Output format.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Output {
    /// Aligned columns for people.
    Table,
    /// JSON for scripts.
    Json,
}

/// A rule's patterns: the route is positional, the caller scope a flag
/// (most rules cover every caller scope).
#[derive(Debug, Clone, clap::Args)]
pub struct RuleRef {
    /// Route pattern (`exact`, `prefix*`, `*`).
    pub route: String,
    /// Caller-scope pattern.
    #[arg(long, default_value = "*")]
    pub caller_scope: String,
}

/// A scope: a route of a caller scope.
#[derive(Debug, Clone, clap::Args)]
pub struct ScopeRef {
    /// The caller scope.
    pub caller_scope: String,
    /// The route.
    pub route: String,
}

/// `tollgate policy …`
#[derive(Debug, clap::Subcommand)]
pub enum PolicyCommand {
    /// List `[defaults]` and every rule, most specific first.
    List,
    /// Show one rule.
    Get(RuleRef),
    /// Create or change one rule: `KEY=VALUE …` as in the policy file
    /// (`retry_ratio=0.1 window=5s`). Patches by default.
    Set {
        /// The rule.
        #[command(flatten)]
        rule: RuleRef,
        /// The version you read (optimistic concurrency); without it the
        /// rule is read now and that version is used.
        #[arg(long)]
        version: Option<u64>,
        /// Replace the rule's keys instead of patching them.
        #[arg(long)]
        replace: bool,
        /// Why, for the audit log.
        #[arg(long, default_value = "")]
        reason: String,
        /// The keys to set.
        #[arg(required = true, value_name = "KEY=VALUE")]
        set: Vec<String>,
    },
    /// Replace `[defaults]` and every rule with a policy file's.
    Apply {
        /// The policy file (same TOML as `serve --config`).
        #[arg(short = 'f', long = "file")]
        file: PathBuf,
        /// Only show what would change.
        #[arg(long)]
        dry_run: bool,
        /// Why, for the audit log.
        #[arg(long, default_value = "")]
        reason: String,
    },
    /// Delete one rule; its scopes fall back to the next match.
    Delete {
        /// The rule.
        #[command(flatten)]
        rule: RuleRef,
        /// The version you read; without it the current one is used.
        #[arg(long)]
        version: Option<u64>,
        /// Why, for the audit log.
        #[arg(long, default_value = "")]
        reason: String,
    },
    /// Where the running policy differs from a file (default: the server's
    /// own policy file). Exit 7 when it does.
    Diff {
        /// Compare with this file instead of the server's.
        #[arg(short = 'f', long = "file")]
        file: Option<PathBuf>,
    },
}

/// `tollgate scopes …`
#[derive(Debug, clap::Subcommand)]
pub enum ScopesCommand {
    /// List scopes the coordinator holds state for.
    List {
        /// Caller-scope pattern.
        #[arg(long, default_value = "*")]
        caller_scope: String,
        /// Route pattern.
        #[arg(long, default_value = "*")]
        route: String,
        /// Only frozen scopes.
        #[arg(long)]
        frozen: bool,
        /// At most this many.
        #[arg(long, default_value_t = 100)]
        limit: usize,
    },
    /// One scope's live state.
    Show(ScopeRef),
    /// No new leases or slots for the scope.
    Freeze {
        /// The scope.
        #[command(flatten)]
        scope: ScopeRef,
        /// Why (required; workers see it).
        #[arg(long)]
        reason: String,
        /// Lift it after this long (`15m`); default: until unfrozen.
        #[arg(long = "for", value_parser = humantime::parse_duration)]
        duration: Option<Duration>,
    },
    /// Lift a freeze.
    Unfreeze {
        /// The scope.
        #[command(flatten)]
        scope: ScopeRef,
        /// Why, for the audit log.
        #[arg(long, default_value = "")]
        reason: String,
    },
    /// Keep one worker's hints on the scope (and its caller scope) as
    /// evidence only: they move no cooldown until unmuted or expired.
    Mute {
        /// The scope.
        #[command(flatten)]
        scope: ScopeRef,
        /// The worker id (never a token).
        #[arg(long)]
        worker: String,
        /// Why (required; recorded in the audit log).
        #[arg(long)]
        reason: String,
        /// Lift it after this long (`1h`); default: until unmuted.
        #[arg(long = "for", value_parser = humantime::parse_duration)]
        duration: Option<Duration>,
    },
    /// Lift a worker's mute.
    Unmute {
        /// The scope.
        #[command(flatten)]
        scope: ScopeRef,
        /// The worker id.
        #[arg(long)]
        worker: String,
        /// Why, for the audit log.
        #[arg(long, default_value = "")]
        reason: String,
    },
    /// Forget the scope's budget window, leases, cooldown and slots.
    Reset {
        /// The scope.
        #[command(flatten)]
        scope: ScopeRef,
        /// Why, for the audit log.
        #[arg(long, default_value = "")]
        reason: String,
    },
}

/// The operator commands.
#[derive(Debug)]
pub enum Command {
    /// `policy …`
    Policy(PolicyCommand),
    /// `scopes …`
    Scopes(ScopesCommand),
    /// `audit`
    Audit {
        /// Records to show, newest first.
        limit: u32,
    },
}

/// A failure, with its exit code.
#[derive(Debug)]
struct Failure {
    code: u8,
    message: String,
}

impl Failure {
    fn invalid(message: impl Into<String>) -> Failure {
        Failure {
            code: EXIT_INVALID,
            message: message.into(),
        }
    }

    fn status(what: &str, status: &Status) -> Failure {
        let code = match status.code() {
            Code::InvalidArgument => EXIT_INVALID,
            Code::Unavailable | Code::DeadlineExceeded => EXIT_UNAVAILABLE,
            Code::PermissionDenied | Code::Unauthenticated => EXIT_DENIED,
            Code::NotFound => EXIT_NOT_FOUND,
            Code::FailedPrecondition => EXIT_CONFLICT,
            _ => EXIT_FAILURE,
        };
        Failure {
            code,
            message: format!("{what}: {}", status.message()),
        }
    }
}

type Outcome = Result<u8, Failure>;

/// Runs one operator command; prints results to stdout, one-line errors to
/// stderr, and returns the exit code.
pub fn run(connect: &Connect, command: Command) -> ExitCode {
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(r) => r,
        Err(err) => {
            eprintln!("tollgate: starting the runtime: {err}");
            return ExitCode::from(EXIT_FAILURE);
        }
    };
    match runtime.block_on(dispatch(connect, command)) {
        Ok(code) => ExitCode::from(code),
        Err(failure) => {
            eprintln!("tollgate: {}", failure.message);
            ExitCode::from(failure.code)
        }
    }
}

struct Client {
    inner: AdminClient<Channel>,
    token: Option<String>,
    output: Output,
}

impl Client {
    fn request<T>(&self, message: T) -> Result<Request<T>, Failure> {
        let mut request = Request::new(message);
        request.set_timeout(Duration::from_secs(10));
        if let Some(token) = &self.token {
            let value = format!("Bearer {token}")
                .parse()
                .map_err(|_| Failure::invalid("--token: not a valid header value"))?;
            request.metadata_mut().insert("authorization", value);
        }
        Ok(request)
    }
}

async fn connect(c: &Connect) -> Result<Client, Failure> {
    let uri = if c.server.contains("://") {
        c.server.clone()
    } else {
        format!("http://{}", c.server)
    };
    let endpoint = Channel::from_shared(uri.clone())
        .map_err(|e| Failure::invalid(format!("--server {uri}: {e}")))?
        .connect_timeout(Duration::from_secs(5));
    let channel = endpoint.connect().await.map_err(|e| Failure {
        code: EXIT_UNAVAILABLE,
        message: format!("cannot reach the coordinator at {uri}: {e}"),
    })?;
    Ok(Client {
        inner: AdminClient::new(channel),
        token: c.token.clone(),
        output: c.output,
    })
}

async fn dispatch(c: &Connect, command: Command) -> Outcome {
    // Check local input before dialling, so a bad file fails fast and offline.
    let local_doc = match &command {
        Command::Policy(PolicyCommand::Apply { file, .. })
        | Command::Policy(PolicyCommand::Diff {
            file: Some(file), ..
        }) => Some(read_policy_file(file)?),
        _ => None,
    };
    let mut client = connect(c).await?;
    match command {
        Command::Policy(p) => policy(&mut client, p, local_doc).await,
        Command::Scopes(s) => scopes(&mut client, s).await,
        Command::Audit { limit } => audit(&mut client, limit).await,
    }
}

fn read_policy_file(file: &PathBuf) -> Result<String, Failure> {
    let text = std::fs::read_to_string(file)
        .map_err(|e| Failure::invalid(format!("{}: {e}", file.display())))?;
    PolicyDoc::from_toml(&text).map_err(|e| {
        Failure::invalid(format!("{}: {}", file.display(), one_line(&e.to_string())))
    })?;
    Ok(text)
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
    spec_of(fields)
        .ok()
        .and_then(|s| serde_json::to_value(s).ok())
        .unwrap_or(Value::Null)
}

fn fields_text(fields: Option<v1::PolicyFields>) -> String {
    match spec_of(fields) {
        Ok(spec) => crate::admin::spec_fields(&spec)
            .into_iter()
            .map(|(k, v)| format!("{k}={v}"))
            .collect::<Vec<_>>()
            .join(" "),
        Err(_) => String::new(),
    }
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

fn print_table(header: &[&str], rows: &[Vec<String>]) {
    let mut widths: Vec<usize> = header.iter().map(|h| h.len()).collect();
    for row in rows {
        for (i, cell) in row.iter().enumerate() {
            if let Some(w) = widths.get_mut(i) {
                *w = (*w).max(cell.chars().count());
            }
        }
    }
    let line = |cells: Vec<String>| {
        let mut out = String::new();
        for (i, cell) in cells.iter().enumerate() {
            if i + 1 == cells.len() {
                out.push_str(cell);
            } else {
                out.push_str(&format!("{cell:<w$}  ", w = widths[i]));
            }
        }
        println!("{}", out.trim_end());
    };
    line(header.iter().map(|h| (*h).to_owned()).collect());
    for row in rows {
        line(row.clone());
    }
}

fn print_json(value: &Value) {
    println!(
        "{}",
        serde_json::to_string_pretty(value).unwrap_or_default()
    );
}

fn time(unix_ms: i64) -> String {
    if unix_ms <= 0 {
        return "-".into();
    }
    let at = std::time::UNIX_EPOCH + Duration::from_millis(u64::try_from(unix_ms).unwrap_or(0));
    humantime::format_rfc3339_millis(at).to_string()
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

fn print_changes(client: &Client, changes: &v1::PolicyChanges, what: &str) {
    if client.output == Output::Json {
        print_json(&json!({
            "applied": changes.applied,
            "policy_version": changes.policy_version,
            "file": changes.file,
            "changes": changes.changes.iter().map(|c| json!({
                "target": c.target,
                "kind": c.kind().as_str_name().trim_start_matches("POLICY_CHANGE_KIND_").to_lowercase(),
                "fields": c.fields.iter().map(|f| json!({"field": f.field, "before": f.before, "after": f.after})).collect::<Vec<_>>(),
            })).collect::<Vec<_>>(),
        }));
        return;
    }
    if changes.changes.is_empty() {
        println!("{what}: no differences");
        return;
    }
    let mut rows = Vec::new();
    for c in &changes.changes {
        let kind = c
            .kind()
            .as_str_name()
            .trim_start_matches("POLICY_CHANGE_KIND_")
            .to_lowercase();
        for (i, f) in c.fields.iter().enumerate() {
            let (t, k) = if i == 0 {
                (c.target.clone(), kind.clone())
            } else {
                (String::new(), String::new())
            };
            let or_dash = |s: &str| {
                if s.is_empty() {
                    "-".to_owned()
                } else {
                    s.to_owned()
                }
            };
            rows.push(vec![
                t,
                k,
                f.field.clone(),
                or_dash(&f.before),
                or_dash(&f.after),
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
        println!("applied as policy_version {}", changes.policy_version);
    }
}

async fn policy(client: &mut Client, command: PolicyCommand, local: Option<String>) -> Outcome {
    match command {
        PolicyCommand::List => {
            let req = client.request(v1::ListPoliciesRequest {})?;
            let list = client
                .inner
                .list_policies(req)
                .await
                .map_err(|s| Failure::status("listing policies", &s))?
                .into_inner();
            if client.output == Output::Json {
                print_json(&json!({
                    "defaults": list.defaults.as_ref().map(rule_json),
                    "rules": list.rules.iter().map(rule_json).collect::<Vec<_>>(),
                }));
            } else {
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
            }
            Ok(EXIT_OK)
        }
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
        } => {
            let expected = match version {
                Some(v) => v,
                None => current_version(client, &rule).await?,
            };
            let req = client.request(v1::DeletePolicyRequest {
                caller_scope: rule.caller_scope.clone(),
                route: rule.route.clone(),
                expected_version: expected,
                reason,
            })?;
            let r = client
                .inner
                .delete_policy(req)
                .await
                .map_err(|s| Failure::status("deleting the rule", &s))?
                .into_inner();
            if client.output == Output::Json {
                print_json(&json!({"deleted_version": r.deleted_version}));
            } else {
                println!(
                    "deleted {}|{} (was policy_version {})",
                    rule.caller_scope, rule.route, r.deleted_version
                );
            }
            Ok(EXIT_OK)
        }
        PolicyCommand::Apply {
            file,
            dry_run,
            reason,
        } => {
            let req = client.request(v1::ApplyPoliciesRequest {
                toml: local.unwrap_or_default(),
                dry_run,
                reason,
            })?;
            let changes = client
                .inner
                .apply_policies(req)
                .await
                .map_err(|s| Failure::status(&format!("applying {}", file.display()), &s))?
                .into_inner();
            let what = if dry_run { "dry run" } else { "apply" };
            print_changes(client, &changes, what);
            Ok(EXIT_OK)
        }
        PolicyCommand::Diff { file } => {
            let changes = match (file, local) {
                (Some(file), Some(text)) => {
                    let req = client.request(v1::ApplyPoliciesRequest {
                        toml: text,
                        dry_run: true,
                        reason: String::new(),
                    })?;
                    let mut c = client
                        .inner
                        .apply_policies(req)
                        .await
                        .map_err(|s| Failure::status(&format!("comparing {}", file.display()), &s))?
                        .into_inner();
                    c.file = file.display().to_string();
                    c
                }
                _ => {
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

fn print_rule(client: &Client, r: &v1::PolicyRule) {
    if client.output == Output::Json {
        print_json(&rule_json(r));
        return;
    }
    println!("rule            {}|{}", r.caller_scope, r.route);
    println!("policy_version  {}", r.policy_version);
    println!("sets            {}", fields_text(r.fields.clone()));
    println!("effective       {}", fields_text(r.effective.clone()));
}

async fn scopes(client: &mut Client, command: ScopesCommand) -> Outcome {
    match command {
        ScopesCommand::List {
            caller_scope,
            route,
            frozen,
            limit,
        } => {
            let mut all = Vec::new();
            let mut token = String::new();
            while all.len() < limit {
                let req = client.request(v1::ListScopesRequest {
                    caller_scope: caller_scope.clone(),
                    route: route.clone(),
                    frozen_only: frozen,
                    page_size: u32::try_from((limit - all.len()).min(500)).unwrap_or(500),
                    page_token: token.clone(),
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
            if client.output == Output::Json {
                print_json(&Value::Array(
                    all.iter()
                        .map(|s| {
                            json!({
                                "caller_scope": s.caller_scope, "route": s.route,
                                "frozen": s.frozen, "cooldown_until_unix_ms": s.cooldown_until_unix_ms,
                                "leases_outstanding": s.leases_outstanding, "slot_backlog": s.slot_backlog,
                                "policy_version": s.policy_version, "last_touched_unix_ms": s.last_touched_unix_ms,
                            })
                        })
                        .collect(),
                ));
            } else {
                let rows: Vec<Vec<String>> = all
                    .iter()
                    .map(|s| {
                        vec![
                            s.caller_scope.clone(),
                            s.route.clone(),
                            if s.frozen {
                                "FROZEN".into()
                            } else {
                                "-".into()
                            },
                            time(s.cooldown_until_unix_ms),
                            s.leases_outstanding.to_string(),
                            s.slot_backlog.to_string(),
                            s.policy_version.to_string(),
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
                    ],
                    &rows,
                );
            }
            Ok(EXIT_OK)
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
            print_scope(client, &s);
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
            if client.output == Output::Json {
                print_json(&freeze_json(&f));
            } else {
                println!(
                    "frozen {}|{} until {}",
                    scope.caller_scope,
                    scope.route,
                    if f.expires_at_unix_ms > 0 {
                        time(f.expires_at_unix_ms)
                    } else {
                        "unfrozen".into()
                    }
                );
            }
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
            if client.output == Output::Json {
                print_json(&json!({"frozen": false}));
            } else {
                println!("unfrozen {}|{}", scope.caller_scope, scope.route);
            }
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
        ScopesCommand::Reset { scope, reason } => {
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
            if client.output == Output::Json {
                print_json(&json!({"existed": r.existed}));
            } else if r.existed {
                println!("reset {}|{}", scope.caller_scope, scope.route);
            } else {
                println!("{}|{}: no state to reset", scope.caller_scope, scope.route);
            }
            Ok(EXIT_OK)
        }
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

fn print_scope(client: &Client, s: &v1::ScopeState) {
    fn classes(c: &v1::ClassBalance) -> (String, &v1::ClassBalance) {
        (
            c.priority()
                .as_str_name()
                .trim_start_matches("PRIORITY_")
                .to_lowercase(),
            c,
        )
    }
    if client.output == Output::Json {
        print_json(&json!({
            "caller_scope": s.caller_scope, "route": s.route, "known": s.known,
            "policy_version": s.policy_version, "policy_rule": s.policy_rule,
            "first_attempts_in_window": s.first_attempts_in_window, "allowance": s.allowance,
            "classes": s.classes.iter().map(|c| {
                let (name, c) = classes(c);
                json!({"priority": name, "allowance": c.allowance, "spent": c.spent,
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
        }));
        return;
    }
    println!("scope           {}|{}", s.caller_scope, s.route);
    println!(
        "policy          version {} from {}",
        s.policy_version, s.policy_rule
    );
    match s.freeze.as_ref().filter(|f| f.frozen) {
        Some(f) => println!(
            "frozen          yes, by {} since {}: {} (until {})",
            f.by,
            time(f.since_unix_ms),
            f.reason,
            if f.expires_at_unix_ms > 0 {
                time(f.expires_at_unix_ms)
            } else {
                "unfrozen".into()
            }
        ),
        None => println!("frozen          no"),
    }
    if !s.known {
        println!("state           none held (no traffic seen, or evicted as idle)");
        return;
    }
    println!("cooldown until  {}", time(s.cooldown_until_unix_ms));
    if let Some(h) = &s.cooldown_source {
        println!(
            "  from hint     {:?} ({}, {} level, seen {})",
            h.raw,
            h.form,
            h.level,
            time(h.at_unix_ms)
        );
    }
    println!(
        "floor           {} (backoff step {})",
        time(s.floor_unix_ms),
        s.backoff_step
    );
    evidence::print_evidence(s);
    println!("slot backlog    {} waiting intents", s.slot_backlog);
    println!(
        "leases          {} outstanding, {} tokens",
        s.leases_outstanding, s.tokens_outstanding
    );
    println!(
        "window          {} first attempts, allowance {:.3} tokens",
        s.first_attempts_in_window, s.allowance
    );
    let rows: Vec<Vec<String>> = s
        .classes
        .iter()
        .map(|c| {
            let (name, c) = classes(c);
            vec![
                name,
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
        println!();
        let rows: Vec<Vec<String>> = s
            .recent_hints
            .iter()
            .map(|h| {
                vec![
                    time(h.at_unix_ms),
                    h.level.clone(),
                    h.form.clone(),
                    if h.valid {
                        "valid".into()
                    } else {
                        "INVALID".into()
                    },
                    if h.capped {
                        "capped".into()
                    } else {
                        "-".into()
                    },
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

async fn audit(client: &mut Client, limit: u32) -> Outcome {
    let req = client.request(v1::ListAuditRequest {
        limit,
        before_seq: 0,
    })?;
    let records = client
        .inner
        .list_audit(req)
        .await
        .map_err(|s| Failure::status("reading the audit log", &s))?
        .into_inner()
        .records;
    if client.output == Output::Json {
        print_json(&Value::Array(
            records
                .iter()
                .map(|r| {
                    json!({
                        "seq": r.seq, "at_unix_ms": r.at_unix_ms, "who": r.who, "action": r.action,
                        "target": r.target, "before": r.before, "after": r.after,
                        "policy_version": r.policy_version, "reason": r.reason,
                    })
                })
                .collect(),
        ));
    } else {
        let rows: Vec<Vec<String>> = records
            .iter()
            .map(|r| {
                vec![
                    r.seq.to_string(),
                    time(r.at_unix_ms),
                    r.who.clone(),
                    r.action.clone(),
                    r.target.clone(),
                    r.policy_version.to_string(),
                    format!("{} -> {}", or_dash(&r.before), or_dash(&r.after)),
                    r.reason.clone(),
                ]
            })
            .collect();
        print_table(
            &[
                "SEQ",
                "WHEN",
                "WHO",
                "ACTION",
                "TARGET",
                "VERSION",
                "BEFORE -> AFTER",
                "REASON",
            ],
            &rows,
        );
    }
    Ok(EXIT_OK)
}

fn or_dash(s: &str) -> &str {
    if s.is_empty() { "-" } else { s }
}
