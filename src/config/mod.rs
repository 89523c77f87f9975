//! The policy file: server limits, default policy, rules and tokens.
//!
//! ```toml
//! [server]                      # every key optional; defaults shown
//! request_timeout = "5s"        # per-request timeout (tower layer)
//! max_concurrent_requests = 1024
//! grace_period = "10s"          # drain time on SIGINT/SIGTERM
//! max_scopes = 1000000          # routes + caller scopes kept in memory (~0.6 GiB all live)
//! scope_idle_ttl = "10m"        # idle scopes are evicted after this
//! watch_buffer = 256            # events buffered per Watch stream
//! # rng_seed = 42               # fixes slot jitter, for reproducible runs
//!
//! [defaults]                    # the policy of scopes no rule matches
//! window = "10s"
//! min_retries_per_sec = 10
//! retry_ratio = 0.2
//!
//! [[rule]]
//! route = "GET /users/*"        # exact, `prefix*` or `*`
//! caller_scope = "tenant-a"     # optional, default `*`
//! policy_version = 3
//! retry_ratio = 0.1
//! max_hint = "60s"
//!
//! [[token]]
//! token_env = "TOLLGATE_TOKEN_TENANT_A"   # or `token = "…"` (keep files secret-free),
//!                               # or token_file = "/etc/tollgate/tokens/tenant-a"
//!                               # (a mounted Secret: re-read on change and SIGHUP)
//! caller_scopes = ["tenant-a", "shared-*"]
//! name = "tenant-a"             # optional, default token-<N>: how metrics and
//!                               # `tollgate scopes` name what it holds
//! # max_scopes = 500000         # its scope quota; default max_scopes / tokens
//! # max_concurrent_requests = 512   # its calls in flight; default the same share
//!
//! [[admin_token]]               # may call the Admin API; never a caller token
//! name = "sre-oncall"           # recorded in the audit log (the token never is)
//! token_env = "TOLLGATE_ADMIN_TOKEN_ONCALL"
//! ```
//!
//! Only `[defaults]` and `[[rule]]` change at runtime (live reload, `tollgate
//! policy apply`); `[server]` and the token entries are read at start, the
//! values of `token_file` tokens and the TLS certificate are re-read while
//! the server runs. Two entries holding one token, or an admin token that
//! is also a caller token, are refused here and on every token file reload
//! ([`Authenticator::try_new`]). The transport keys of `[server]` (TLS,
//! connection and stream limits) are described in [`Transport`]. Errors
//! name the place and, where it can be found, the line.
//!
//! A rule's policy is its own keys over `[defaults]` over the built-in
//! defaults ([`crate::policy::PolicySpec::builtin`]). With no file at all the
//! coordinator runs on the built-in defaults in open dev mode.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

mod transport;

use transport::TransportSpec;
pub use transport::{TlsFiles, Transport};

use crate::auth::{AdminEntry, Authenticator, TokenEntry};
use crate::policy::{Pattern, Policy, PolicyError, PolicyRule, PolicySet, PolicySpec};

/// Why a policy file was refused.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The file could not be read.
    #[error("reading {path}: {source}")]
    Read {
        /// The file.
        path: PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
    /// The file is not valid TOML or has unknown keys (the message has the line).
    #[error("parsing policy file: {0}")]
    Parse(#[from] toml::de::Error),
    /// A policy in the file is invalid.
    #[error("{place}: {source}")]
    Policy {
        /// `[defaults]` or `rule #N`, with the line when it is known.
        place: String,
        /// What was wrong.
        source: PolicyError,
    },
    /// A server limit is out of range, or a token entry is incomplete.
    #[error("{place}: {reason}")]
    Invalid {
        /// Where in the file.
        place: String,
        /// What was wrong.
        reason: String,
    },
}

/// Bounds and timings of the server itself.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServerLimits {
    /// Requests running longer are cancelled.
    pub request_timeout: Duration,
    /// Requests in flight across the server; more are shed at once
    /// (RESOURCE_EXHAUSTED) instead of queueing behind a slow store.
    pub max_concurrent_requests: usize,
    /// How long a shutdown waits for in-flight requests.
    pub grace_period: Duration,
    /// Routes plus caller scopes kept.
    pub max_scopes: usize,
    /// Idle scopes are evicted after this.
    pub scope_idle_ttl: Duration,
    /// Events buffered per Watch stream before the consumer is cut off.
    pub watch_buffer: usize,
    /// Seeds slot jitter; `None` seeds from the OS.
    pub rng_seed: Option<u64>,
}

impl Default for ServerLimits {
    fn default() -> Self {
        ServerLimits {
            request_timeout: Duration::from_secs(5),
            max_concurrent_requests: 1024,
            grace_period: Duration::from_secs(10),
            max_scopes: 1_000_000,
            scope_idle_ttl: Duration::from_secs(600),
            watch_buffer: 256,
            rng_seed: None,
        }
    }
}

/// Everything the coordinator is configured with.
#[derive(Debug, Clone, Default)]
pub struct Config {
    /// Server bounds and timings.
    pub limits: ServerLimits,
    /// Policies by rule.
    pub policies: PolicySet,
    /// The rules as written, kept so the Admin API can show, patch and diff
    /// them (a built [`PolicySet`] has lost what the file left out).
    pub doc: PolicyDoc,
    /// Tokens; empty means open dev mode.
    pub auth: Authenticator,
    /// TLS and the exhaustion limits (`[server]`, see [`Transport`]).
    pub transport: Transport,
}

/// Most rules a policy document may hold: every lookup scans them.
pub const MAX_RULES: usize = 4096;

/// One rule as written: its patterns and only the keys it sets.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct RuleSpec {
    /// Caller-scope pattern (`exact`, `prefix*`, `*`).
    pub caller_scope: String,
    /// Route pattern.
    pub route: String,
    /// The keys the rule sets; the rest come from `[defaults]`.
    pub policy: PolicySpec,
}

impl RuleSpec {
    /// `caller_scope|route`, how rules are named in diffs and the audit log.
    pub fn id(&self) -> String {
        format!("{}|{}", self.caller_scope, self.route)
    }
}

/// The runtime-changeable part of a policy file: `[defaults]` and the rules.
///
/// This, not [`PolicySet`], is what the Admin API edits and persists; a
/// [`PolicySet`] is always built from it by [`PolicyDoc::build`], so the
/// file, `apply -f` and the state file share one validation.
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct PolicyDoc {
    /// `[defaults]` as written.
    pub defaults: PolicySpec,
    /// `[[rule]]`s in file order.
    pub rules: Vec<RuleSpec>,
}

impl PolicyDoc {
    /// Reads the policy part of policy-file text (the whole file is parsed,
    /// so unknown keys anywhere are still refused, but tokens are not
    /// resolved: `apply -f` and reloads must not depend on the server's
    /// environment). Errors carry the line where it can be found.
    pub fn from_toml(text: &str) -> Result<PolicyDoc, ConfigError> {
        let file: FileFormat = toml::from_str(text)?;
        let doc = Self::from_file(file).map_err(|e| with_line(e, text))?;
        doc.build().map_err(|e| with_line(e, text))?;
        Ok(doc)
    }

    fn from_file(file: FileFormat) -> Result<PolicyDoc, ConfigError> {
        if file.rule.len() > MAX_RULES {
            return Err(ConfigError::Invalid {
                place: "[[rule]]".into(),
                reason: format!("at most {MAX_RULES} rules"),
            });
        }
        let mut rules = Vec::with_capacity(file.rule.len());
        for (i, mut table) in file.rule.into_iter().enumerate() {
            let place = format!("rule #{}", i + 1);
            let route =
                take_string(&mut table, "route", &place)?.ok_or_else(|| ConfigError::Invalid {
                    place: place.clone(),
                    reason: "route is required (use \"*\" for every route)".into(),
                })?;
            let caller_scope =
                take_string(&mut table, "caller_scope", &place)?.unwrap_or_else(|| "*".into());
            // `[defaults]` names the defaults wherever a rule is named (the
            // Admin API, `policy set`): a rule of that route could never be
            // told apart from them.
            if route == crate::policy::DEFAULTS {
                return Err(ConfigError::Invalid {
                    place,
                    reason: format!("route {route:?} is the name of the defaults, not a route"),
                });
            }
            // A key of the wrong type: converted from the table, toml's
            // error has lost the line, which `with_line` puts back.
            let policy: PolicySpec =
                toml::Value::Table(table)
                    .try_into()
                    .map_err(|e: toml::de::Error| ConfigError::Invalid {
                        place: place.clone(),
                        reason: e.message().trim().to_owned(),
                    })?;
            rules.push(RuleSpec {
                caller_scope,
                route,
                policy,
            });
        }
        Ok(PolicyDoc {
            defaults: file.defaults.unwrap_or_default(),
            rules,
        })
    }

    /// Validates every policy and builds the set that requests resolve
    /// against. A rule's policy is its keys over `[defaults]` over the
    /// built-in defaults.
    pub fn build(&self) -> Result<PolicySet, ConfigError> {
        let defaults = self.defaults.over(&PolicySpec::builtin());
        let default_policy = Policy::try_new(&defaults).map_err(|source| ConfigError::Policy {
            place: "[defaults]".into(),
            source,
        })?;
        let mut rules = Vec::with_capacity(self.rules.len());
        for (i, rule) in self.rules.iter().enumerate() {
            let policy = self
                .rule_policy(rule)
                .map_err(|source| ConfigError::Policy {
                    place: format!("rule #{}", i + 1),
                    source,
                })?;
            rules.push(PolicyRule {
                caller_scope: Pattern::parse(&rule.caller_scope),
                route: Pattern::parse(&rule.route),
                policy: Arc::new(policy),
            });
        }
        PolicySet::try_new(default_policy, rules).map_err(|source| ConfigError::Policy {
            place: "[[rule]]".into(),
            source,
        })
    }

    /// The validated policy `rule` gets under this document's defaults.
    pub fn rule_policy(&self, rule: &RuleSpec) -> Result<Policy, PolicyError> {
        let defaults = self.defaults.over(&PolicySpec::builtin());
        Policy::try_new(&rule.policy.over(&defaults))
    }

    /// The rule with exactly these patterns.
    pub fn find(&self, caller_scope: &str, route: &str) -> Option<usize> {
        self.rules
            .iter()
            .position(|r| r.caller_scope == caller_scope && r.route == route)
    }
}

/// Adds the line of the place an error names (`rule #3`, `[defaults]`, the
/// field) by scanning the text: toml's own errors have lines, but a policy
/// refused after parsing has lost them.
fn with_line(err: ConfigError, text: &str) -> ConfigError {
    let (place, source) = match err {
        ConfigError::Policy { place, source } => (place, source),
        ConfigError::Invalid { place, reason } => {
            let line = place
                .strip_prefix("rule #")
                .and_then(|n| n.parse().ok())
                .and_then(|n| section_line(text, "[[rule]]", n, None));
            return ConfigError::Invalid {
                place: match line {
                    Some(line) => format!("line {line}, {place}"),
                    None => place,
                },
                reason,
            };
        }
        other => return other,
    };
    let (section, nth) = if place == "[defaults]" {
        ("[defaults]", 1)
    } else if let Some(n) = place.strip_prefix("rule #") {
        ("[[rule]]", n.parse().unwrap_or(1))
    } else if let PolicyError::DuplicateRule { second, .. } = &source {
        ("[[rule]]", second + 1)
    } else {
        return ConfigError::Policy { place, source };
    };
    let field = match &source {
        PolicyError::OutOfRange { field, .. } | PolicyError::BadDuration { field, .. } => {
            Some(field.split('.').next().unwrap_or(field))
        }
        PolicyError::DuplicateRule { .. } => None,
    };
    let line = section_line(text, section, nth, field);
    let place = match line {
        Some(line) => format!("line {line}, {place}"),
        None => place,
    };
    ConfigError::Policy { place, source }
}

/// The line (1-based) of the `nth` `section` header in `text`, or of
/// `field`'s line inside that section when it is there.
fn section_line(text: &str, section: &str, nth: usize, field: Option<&str>) -> Option<usize> {
    let lines: Vec<&str> = text.lines().collect();
    let header = lines
        .iter()
        .enumerate()
        .filter(|(_, l)| l.trim_start().starts_with(section))
        .nth(nth.saturating_sub(1))
        .map(|(i, _)| i);
    header.map(|h| {
        let next = lines
            .iter()
            .enumerate()
            .skip(h + 1)
            .find(|(_, l)| l.trim_start().starts_with('['))
            .map_or(lines.len(), |(i, _)| i);
        field
            .and_then(|f| {
                (h + 1..next).find(|&i| {
                    lines[i]
                        .trim_start()
                        .strip_prefix(f)
                        .is_some_and(|rest| rest.trim_start().starts_with('='))
                })
            })
            .unwrap_or(h)
            + 1
    })
}

#[derive(Debug, Default, serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct FileFormat {
    server: Option<ServerSpec>,
    defaults: Option<PolicySpec>,
    #[serde(default)]
    rule: Vec<toml::Table>,
    #[serde(default)]
    token: Vec<TokenSpec>,
    #[serde(default)]
    admin_token: Vec<AdminTokenSpec>,
}

#[derive(Debug, serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct AdminTokenSpec {
    name: String,
    token: Option<String>,
    token_env: Option<String>,
    token_file: Option<PathBuf>,
}

#[derive(Debug, Default, serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct ServerSpec {
    request_timeout: Option<String>,
    max_concurrent_requests: Option<usize>,
    grace_period: Option<String>,
    max_scopes: Option<usize>,
    scope_idle_ttl: Option<String>,
    watch_buffer: Option<usize>,
    rng_seed: Option<u64>,
    // The transport keys, validated in `transport` (kept in this struct so
    // a typo is refused with its line).
    tls_cert: Option<PathBuf>,
    tls_key: Option<PathBuf>,
    client_ca: Option<PathBuf>,
    allow_plaintext: Option<bool>,
    max_connections: Option<usize>,
    max_connections_per_ip: Option<usize>,
    max_concurrent_streams: Option<u32>,
    max_header_list_size: Option<String>,
    max_budget_message: Option<String>,
    handshake_timeout: Option<String>,
    idle_timeout: Option<String>,
    body_timeout: Option<String>,
    max_unauthenticated_calls_per_connection: Option<usize>,
    max_unauthenticated_calls_per_ip: Option<usize>,
    probe_max_connections: Option<usize>,
    probe_max_connections_per_ip: Option<usize>,
    probe_idle_timeout: Option<String>,
    probe_header_timeout: Option<String>,
    allow_plaintext_metrics: Option<bool>,
    max_watch_streams: Option<usize>,
    max_watch_streams_per_token: Option<usize>,
}

#[derive(Debug, serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct TokenSpec {
    token: Option<String>,
    token_env: Option<String>,
    token_file: Option<PathBuf>,
    caller_scopes: Vec<String>,
    name: Option<String>,
    max_scopes: Option<usize>,
    max_concurrent_requests: Option<usize>,
}

/// Whether `name` may name a token entry: it becomes a metric label and an
/// audit field, so short and plain.
fn valid_entry_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 64
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"-_.@".contains(&b))
}

impl Config {
    /// Each caller token's name and quotas of this configuration's pools
    /// (`max_scopes`, `max_concurrent_requests`).
    pub fn tenant_limits(&self) -> crate::tenancy::TenantLimits {
        crate::tenancy::TenantLimits::of(
            &self.auth.tenants(),
            self.limits.max_scopes,
            self.limits.max_concurrent_requests,
        )
    }

    /// Reads and validates a policy file, taking `token_env` values from the
    /// process environment.
    pub fn load(path: &Path) -> Result<Config, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            path: path.to_owned(),
            source,
        })?;
        Config::from_toml(&text, |name| std::env::var(name).ok())
    }

    /// Validates policy-file text; `env` resolves `token_env` names.
    pub fn from_toml(
        text: &str,
        env: impl Fn(&str) -> Option<String>,
    ) -> Result<Config, ConfigError> {
        let mut file: FileFormat = toml::from_str(text)?;
        let mut server = file.server.take().unwrap_or_default();
        let transport = transport::transport(TransportSpec {
            tls_cert: server.tls_cert.take(),
            tls_key: server.tls_key.take(),
            client_ca: server.client_ca.take(),
            allow_plaintext: server.allow_plaintext.take(),
            max_connections: server.max_connections.take(),
            max_connections_per_ip: server.max_connections_per_ip.take(),
            max_concurrent_streams: server.max_concurrent_streams.take(),
            max_header_list_size: server.max_header_list_size.take(),
            max_budget_message: server.max_budget_message.take(),
            handshake_timeout: server.handshake_timeout.take(),
            idle_timeout: server.idle_timeout.take(),
            body_timeout: server.body_timeout.take(),
            max_unauthenticated_calls_per_connection: server
                .max_unauthenticated_calls_per_connection
                .take(),
            max_unauthenticated_calls_per_ip: server.max_unauthenticated_calls_per_ip.take(),
            probe_max_connections: server.probe_max_connections.take(),
            probe_max_connections_per_ip: server.probe_max_connections_per_ip.take(),
            probe_idle_timeout: server.probe_idle_timeout.take(),
            probe_header_timeout: server.probe_header_timeout.take(),
            allow_plaintext_metrics: server.allow_plaintext_metrics.take(),
            max_watch_streams: server.max_watch_streams.take(),
            max_watch_streams_per_token: server.max_watch_streams_per_token.take(),
        })?;
        let limits = server_limits(server)?;
        let tokens = std::mem::take(&mut file.token);
        let admin_tokens = std::mem::take(&mut file.admin_token);
        let doc = PolicyDoc::from_file(file).map_err(|e| with_line(e, text))?;
        let policies = doc.build().map_err(|e| with_line(e, text))?;

        // The token's value now, and the file it is re-read from, if any.
        let secret =
            |place: &str, token: Option<String>, var: Option<String>, file: Option<PathBuf>| {
                let invalid = |reason: String| ConfigError::Invalid {
                    place: place.to_owned(),
                    reason,
                };
                let token = match (token, var, &file) {
                    (Some(token), None, None) => token,
                    (None, Some(var), None) => env(&var)
                        .ok_or_else(|| invalid(format!("environment variable {var} is not set")))?,
                    (None, None, Some(path)) => crate::auth::read_token_file(path)
                        .map(|t| String::from_utf8_lossy(&t).into_owned())
                        .map_err(|e| invalid(format!("{}: {e}", path.display())))?,
                    _ => {
                        return Err(invalid(
                            "set exactly one of token, token_env or token_file".into(),
                        ));
                    }
                };
                if token.trim().len() < crate::auth::MIN_TOKEN_LEN {
                    return Err(invalid("token must be at least 8 characters".into()));
                }
                Ok((token.trim().to_owned(), file))
            };
        let mut entries = Vec::with_capacity(tokens.len());
        let mut names = std::collections::HashSet::new();
        for (i, spec) in tokens.into_iter().enumerate() {
            let place = format!("token #{}", i + 1);
            let (token, file) = secret(&place, spec.token, spec.token_env, spec.token_file)?;
            let invalid = |reason: &str| ConfigError::Invalid {
                place: place.clone(),
                reason: reason.to_owned(),
            };
            if spec.caller_scopes.is_empty() {
                return Err(invalid("caller_scopes must name at least one scope"));
            }
            // Unnamed entries are `token-<N>`; a name must not take another
            // entry's, given or default, or two tenants' holdings would be
            // shown as one.
            let name = match spec.name.as_deref().map(str::trim) {
                Some(name) if !valid_entry_name(name) => {
                    return Err(invalid(
                        "name must be 1..=64 characters of [A-Za-z0-9-_.@] (it names the token's holdings in metrics)",
                    ));
                }
                Some(name) => name.to_owned(),
                None => format!("token-{}", i + 1),
            };
            if !names.insert(name.clone()) {
                return Err(invalid(&format!(
                    "name {name:?} is taken by another [[token]]"
                )));
            }
            if spec.max_scopes == Some(0) || spec.max_concurrent_requests == Some(0) {
                return Err(invalid(
                    "max_scopes and max_concurrent_requests must be at least 1",
                ));
            }
            let entry = match file {
                Some(path) => TokenEntry::from_file(&path, &spec.caller_scopes)
                    .map_err(|reason| invalid(&reason))?,
                None => TokenEntry::new(&token, &spec.caller_scopes),
            };
            entries.push(
                entry
                    .named(&name)
                    .with_quotas(spec.max_scopes, spec.max_concurrent_requests),
            );
        }
        let mut admins = Vec::with_capacity(admin_tokens.len());
        for (i, spec) in admin_tokens.into_iter().enumerate() {
            let place = format!("admin_token #{}", i + 1);
            let (token, file) = secret(&place, spec.token, spec.token_env, spec.token_file)?;
            let invalid = |reason: &str| ConfigError::Invalid {
                place: place.clone(),
                reason: reason.to_owned(),
            };
            let name = spec.name.trim();
            if !valid_entry_name(name) {
                return Err(invalid(
                    "name must be 1..=64 characters of [A-Za-z0-9-_.@] (it goes in the audit log)",
                ));
            }
            admins.push(match file {
                Some(path) => AdminEntry::from_file(name, &path).map_err(|r| invalid(&r))?,
                None => AdminEntry::new(name, &token),
            });
        }
        // Two entries with one token, or an admin token that is also a
        // caller token (a leaked caller token must never be an admin
        // credential): refused here, and on every token file reload.
        let auth = Authenticator::try_new(entries, admins).map_err(|e| ConfigError::Invalid {
            place: "tokens".into(),
            reason: e.to_string(),
        })?;
        Ok(Config {
            limits,
            policies,
            doc,
            auth,
            transport,
        })
    }
}

fn take_string(
    table: &mut toml::Table,
    key: &str,
    place: &str,
) -> Result<Option<String>, ConfigError> {
    match table.remove(key) {
        None => Ok(None),
        Some(toml::Value::String(s)) if !s.is_empty() => Ok(Some(s)),
        Some(_) => Err(ConfigError::Invalid {
            place: place.to_owned(),
            reason: format!("{key} must be a non-empty string"),
        }),
    }
}

fn server_limits(spec: ServerSpec) -> Result<ServerLimits, ConfigError> {
    let d = ServerLimits::default();
    let dur = |key: &str, raw: Option<String>, default: Duration, min: Duration, max: Duration| {
        let value = match raw {
            None => default,
            Some(raw) => humantime::parse_duration(&raw).map_err(|e| ConfigError::Invalid {
                place: format!("[server] {key}"),
                reason: format!("{raw:?}: {e}"),
            })?,
        };
        if value < min || value > max {
            return Err(ConfigError::Invalid {
                place: format!("[server] {key}"),
                reason: format!("must be {min:?}..={max:?}"),
            });
        }
        Ok(value)
    };
    let count = |key: &str, raw: Option<usize>, default: usize, min: usize, max: usize| {
        let value = raw.unwrap_or(default);
        if !(min..=max).contains(&value) {
            return Err(ConfigError::Invalid {
                place: format!("[server] {key}"),
                reason: format!("must be {min}..={max}"),
            });
        }
        Ok(value)
    };
    let s = Duration::from_secs;
    Ok(ServerLimits {
        request_timeout: dur(
            "request_timeout",
            spec.request_timeout,
            d.request_timeout,
            Duration::from_millis(10),
            s(300),
        )?,
        max_concurrent_requests: count(
            "max_concurrent_requests",
            spec.max_concurrent_requests,
            d.max_concurrent_requests,
            1,
            1_000_000,
        )?,
        grace_period: dur(
            "grace_period",
            spec.grace_period,
            d.grace_period,
            Duration::ZERO,
            s(600),
        )?,
        max_scopes: count("max_scopes", spec.max_scopes, d.max_scopes, 1, 10_000_000)?,
        scope_idle_ttl: dur(
            "scope_idle_ttl",
            spec.scope_idle_ttl,
            d.scope_idle_ttl,
            s(60),
            s(86_400),
        )?,
        // At least one snapshot per watchable scope, plus room to move.
        watch_buffer: count(
            "watch_buffer",
            spec.watch_buffer,
            d.watch_buffer,
            72,
            65_536,
        )?,
        rng_seed: spec.rng_seed,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::scope::RouteKey;

    const EXAMPLE: &str = r#"
[server]
max_scopes = 100
rng_seed = 7

[defaults]
retry_ratio = 0.5

[[rule]]
route = "GET /users/*"
caller_scope = "tenant-a"
policy_version = 3
max_hint = "60s"

[[token]]
token_env = "TOKEN_A"
caller_scopes = ["tenant-a"]
"#;

    fn key(caller: &str, route: &str) -> RouteKey {
        RouteKey {
            caller_scope: caller.into(),
            route: route.into(),
        }
    }

    #[test]
    fn the_documented_example_loads() {
        let config =
            Config::from_toml(EXAMPLE, |v| (v == "TOKEN_A").then(|| "secret-a-123".into()))
                .expect("valid");
        assert_eq!(config.limits.max_scopes, 100);
        assert_eq!(config.limits.rng_seed, Some(7));
        let rule = config.policies.resolve(&key("tenant-a", "GET /users/{id}"));
        assert_eq!(rule.policy_version, 3);
        assert_eq!(rule.max_hint_ms, 60_000);
        assert_eq!(rule.ratio_milli, 500, "inherits [defaults]");
        let other = config.policies.resolve(&key("tenant-b", "GET /users/{id}"));
        assert_eq!(other.policy_version, 1);
        assert!(!config.auth.is_open());
    }

    #[test]
    fn no_file_means_defaults_and_open_mode() {
        let config = Config::from_toml("", |_| None).expect("empty is valid");
        assert!(config.auth.is_open());
        assert_eq!(config.limits, ServerLimits::default());
    }

    #[test]
    fn repeated_or_crossed_tokens_are_refused() {
        let refused = [
            "[[token]]\ntoken = \"token-one\"\ncaller_scopes = [\"a\"]\n\
             [[token]]\ntoken = \" token-one\"\ncaller_scopes = [\"b\"]\n",
            "[[admin_token]]\nname = \"x\"\ntoken = \"admin-one\"\n\
             [[admin_token]]\nname = \"y\"\ntoken = \"admin-one\"\n",
            "[[token]]\ntoken = \"token-one\"\ncaller_scopes = [\"a\"]\n\
             [[admin_token]]\nname = \"x\"\ntoken = \"token-one\"\n",
        ];
        for text in refused {
            let err = Config::from_toml(text, |_| None).expect_err("refused");
            assert!(err.to_string().contains("holds the same token"), "{err}");
            assert!(!err.to_string().contains("-one"), "no value in {err}");
        }
    }

    #[test]
    fn token_entries_are_named_and_get_a_fair_share_unless_they_set_their_own() {
        let text = "[server]\nmax_scopes = 900\nmax_concurrent_requests = 90\n\
             [[token]]\ntoken = \"token-one\"\ncaller_scopes = [\"a\"]\nname = \"team-one\"\n\
             [[token]]\ntoken = \"token-two\"\ncaller_scopes = [\"b\"]\nmax_scopes = 50\n\
             [[token]]\ntoken = \"token-three\"\ncaller_scopes = [\"c\"]\nmax_concurrent_requests = 7\n";
        let limits = Config::from_toml(text, |_| None)
            .expect("valid")
            .tenant_limits();
        assert_eq!(limits.names, ["team-one", "token-2", "token-3"]);
        assert_eq!(limits.scopes, [300, 50, 300]);
        assert_eq!(limits.requests, [30, 30, 7]);
        // A name taking another entry's default is refused at that entry.
        for (bad, says, place) in [
            ("name = \"a b\"\n", "name must be", "token #1"),
            ("name = \"token-2\"\n", "is taken", "token #2"),
            ("max_scopes = 0\n", "at least 1", "token #1"),
        ] {
            let text = format!(
                "[[token]]\ntoken = \"token-one\"\ncaller_scopes = [\"a\"]\n{bad}\
                 [[token]]\ntoken = \"token-two\"\ncaller_scopes = [\"b\"]\n"
            );
            let err = Config::from_toml(&text, |_| None).expect_err(bad);
            assert!(err.to_string().contains(says), "{err}");
            assert!(err.to_string().contains(place), "{err}");
        }
    }

    #[test]
    fn errors_name_the_place() {
        let bad_rule = "[[rule]]\nroute = \"*\"\nretry_ratio = 2000.0\n";
        let err = Config::from_toml(bad_rule, |_| None).expect_err("out of range");
        assert!(err.to_string().contains("rule #1: retry_ratio"), "{err}");
        // A key of the wrong type names its rule's line, as `apply
        // --dry-run` shows it.
        let typed = "[defaults]\nretry_ratio = 0.1\n\n[[rule]]\nroute = \"a\"\n\n[[rule]]\nroute = \"*\"\nretry_ratio = \"lots\"\n";
        for err in [
            PolicyDoc::from_toml(typed).expect_err("a string ratio"),
            Config::from_toml(typed, |_| None).expect_err("a string ratio"),
        ] {
            let shown = err.to_string();
            assert!(shown.contains("line 7, rule #2"), "{shown}");
            assert!(
                shown.contains("retry_ratio") || shown.contains("invalid type"),
                "{shown}"
            );
        }
        let unknown = "[[rule]]\nroute = \"*\"\nretry_ration = 0.1\n";
        let err = Config::from_toml(unknown, |_| None).expect_err("unknown key");
        assert!(err.to_string().contains("retry_ration"), "{err}");
        let missing_env = "[[token]]\ntoken_env = \"NOPE\"\ncaller_scopes = [\"a\"]\n";
        let err = Config::from_toml(missing_env, |_| None).expect_err("unset env");
        assert!(err.to_string().contains("token #1"), "{err}");
        let bad_server = "[server]\nwatch_buffer = 1\n";
        let err = Config::from_toml(bad_server, |_| None).expect_err("too small");
        assert!(err.to_string().contains("watch_buffer"), "{err}");
        let named = "[[rule]]\nroute = \"[defaults]\"\nretry_ratio = 0.2\n";
        let err = PolicyDoc::from_toml(named).expect_err("a rule named like the defaults");
        assert!(err.to_string().contains("line 1, rule #1"), "{err}");
        assert!(err.to_string().contains("name of the defaults"), "{err}");
        let typo = "[server]\ntimeout = \"1s\"\n";
        let err = Config::from_toml(typo, |_| None).expect_err("unknown");
        assert!(err.to_string().contains("line 2"), "{err}");
    }
}
