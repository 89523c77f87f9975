//! The policy file: server limits, default policy, rules and tokens.
//!
//! ```toml
//! [server]                      # every key optional; defaults shown
//! request_timeout = "5s"        # per-request timeout (tower layer)
//! max_concurrent_requests = 1024
//! grace_period = "10s"          # drain time on SIGINT/SIGTERM
//! max_scopes = 50000            # routes + caller scopes kept in memory
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
//! token_env = "TOLLGATE_TOKEN_TENANT_A"   # or `token = "…"` (keep files secret-free)
//! caller_scopes = ["tenant-a", "shared-*"]
//! ```
//!
//! A rule's policy is its own keys over `[defaults]` over the built-in
//! defaults ([`crate::policy::PolicySpec::builtin`]). With no file at all the
//! coordinator runs on the built-in defaults in open dev mode.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use crate::auth::{Authenticator, TokenEntry};
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
        /// `[defaults]` or `rule #N`.
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
            max_scopes: 50_000,
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
    /// Tokens; empty means open dev mode.
    pub auth: Authenticator,
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
}

#[derive(Debug, serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct TokenSpec {
    token: Option<String>,
    token_env: Option<String>,
    caller_scopes: Vec<String>,
}

impl Config {
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
        let file: FileFormat = toml::from_str(text)?;
        let limits = server_limits(file.server.unwrap_or_default())?;

        let builtin = PolicySpec::builtin();
        let defaults = file.defaults.unwrap_or_default().over(&builtin);
        let default_policy = Policy::try_new(&defaults).map_err(|source| ConfigError::Policy {
            place: "[defaults]".into(),
            source,
        })?;
        let mut rules = Vec::with_capacity(file.rule.len());
        for (i, mut table) in file.rule.into_iter().enumerate() {
            let place = format!("rule #{}", i + 1);
            let route =
                take_string(&mut table, "route", &place)?.ok_or_else(|| ConfigError::Invalid {
                    place: place.clone(),
                    reason: "route is required (use \"*\" for every route)".into(),
                })?;
            let caller =
                take_string(&mut table, "caller_scope", &place)?.unwrap_or_else(|| "*".into());
            let spec: PolicySpec = toml::Value::Table(table).try_into()?;
            let policy = Policy::try_new(&spec.over(&defaults))
                .map_err(|source| ConfigError::Policy { place, source })?;
            rules.push(PolicyRule {
                caller_scope: Pattern::parse(&caller),
                route: Pattern::parse(&route),
                policy: Arc::new(policy),
            });
        }
        let policies =
            PolicySet::try_new(default_policy, rules).map_err(|source| ConfigError::Policy {
                place: "[[rule]]".into(),
                source,
            })?;

        let mut entries = Vec::with_capacity(file.token.len());
        for (i, spec) in file.token.into_iter().enumerate() {
            let place = format!("token #{}", i + 1);
            let invalid = |reason: String| ConfigError::Invalid {
                place: place.clone(),
                reason,
            };
            let token = match (spec.token, spec.token_env) {
                (Some(token), None) => token,
                (None, Some(var)) => env(&var)
                    .ok_or_else(|| invalid(format!("environment variable {var} is not set")))?,
                _ => return Err(invalid("set exactly one of token or token_env".into())),
            };
            if token.trim().len() < 8 {
                return Err(invalid("token must be at least 8 characters".into()));
            }
            if spec.caller_scopes.is_empty() {
                return Err(invalid("caller_scopes must name at least one scope".into()));
            }
            entries.push(TokenEntry::new(token.trim(), &spec.caller_scopes));
        }
        Ok(Config {
            limits,
            policies,
            auth: Authenticator::new(entries),
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
    fn errors_name_the_place() {
        let bad_rule = "[[rule]]\nroute = \"*\"\nretry_ratio = 2000.0\n";
        let err = Config::from_toml(bad_rule, |_| None).expect_err("out of range");
        assert!(err.to_string().contains("rule #1: retry_ratio"), "{err}");
        let unknown = "[[rule]]\nroute = \"*\"\nretry_ration = 0.1\n";
        let err = Config::from_toml(unknown, |_| None).expect_err("unknown key");
        assert!(err.to_string().contains("retry_ration"), "{err}");
        let missing_env = "[[token]]\ntoken_env = \"NOPE\"\ncaller_scopes = [\"a\"]\n";
        let err = Config::from_toml(missing_env, |_| None).expect_err("unset env");
        assert!(err.to_string().contains("token #1"), "{err}");
        let bad_server = "[server]\nwatch_buffer = 1\n";
        let err = Config::from_toml(bad_server, |_| None).expect_err("too small");
        assert!(err.to_string().contains("watch_buffer"), "{err}");
        let typo = "[server]\ntimeout = \"1s\"\n";
        let err = Config::from_toml(typo, |_| None).expect_err("unknown");
        assert!(err.to_string().contains("line 2"), "{err}");
    }
}
