//! The command-line shape of the operator commands: the global connection
//! and output flags, and the `policy` / `scopes` subcommands with their
//! `Examples:` sections.

use std::path::PathBuf;
use std::time::Duration;

/// How to reach the coordinator and how to print. Flattened into the
/// top-level command with `global = true`, so each flag is accepted before or
/// after the subcommand (`tollgate -o json policy list` and `tollgate policy
/// list -o json` are the same).
#[derive(Debug, Clone, clap::Args)]
pub struct Connect {
    /// The coordinator to manage (`host:port` or `http://host:port`); used
    /// by `policy`, `scopes` and `audit`.
    #[arg(
        long,
        env = "TOLLGATE_SERVER",
        default_value = "127.0.0.1:50051",
        global = true
    )]
    pub server: String,
    /// An admin token (never a caller token) for `policy`, `scopes` and
    /// `audit`. Prefer the environment variable: a flag shows in `ps`.
    #[arg(
        long,
        env = "TOLLGATE_ADMIN_TOKEN",
        hide_env_values = true,
        global = true
    )]
    pub token: Option<String>,
    /// PEM CA that signed the coordinator's certificate: connect with TLS
    /// (also implied by an `https://` server, then with the system roots).
    #[arg(long, env = "TOLLGATE_CA", value_name = "FILE", global = true)]
    pub ca: Option<std::path::PathBuf>,
    /// PEM client certificate, for a coordinator that requires mTLS.
    #[arg(
        long,
        env = "TOLLGATE_CLIENT_CERT",
        value_name = "FILE",
        global = true,
        requires = "key"
    )]
    pub cert: Option<std::path::PathBuf>,
    /// The client certificate's PEM private key.
    #[arg(
        long,
        env = "TOLLGATE_CLIENT_KEY",
        value_name = "FILE",
        global = true,
        requires = "cert"
    )]
    pub key: Option<std::path::PathBuf>,
    /// Output format (`simulate`: table or json).
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
    /// YAML, the same fields as JSON.
    Yaml,
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
    #[command(after_help = "Examples:
  tollgate policy list
  tollgate policy list -o yaml")]
    List,
    /// Show one rule; the route `[defaults]` shows `[defaults]`.
    #[command(after_help = "Examples:
  tollgate policy get 'GET /users/*'
  tollgate policy get '[defaults]'
  tollgate policy get '*' --caller-scope tenant-a -o json")]
    Get(RuleRef),
    /// Create or change one rule: `KEY=VALUE …` as in the policy file
    /// (`retry_ratio=0.1 window=5s`). Patches by default. The route
    /// `[defaults]` changes `[defaults]`.
    #[command(after_help = "Examples:
  tollgate policy set 'GET /users/*' retry_ratio=0.05 --reason INC-123
  tollgate policy set '[defaults]' retry_ratio=0.3
  tollgate policy set 'GET /users/*' --caller-scope tenant-a window=5s max_hint=60s
  tollgate policy set 'POST /orders' --version 4 --replace retry_ratio=0.1")]
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
    #[command(after_help = "Examples:
  tollgate policy apply -f policy.toml --dry-run
  tollgate policy apply -f policy.toml --reason 'roll out the new ratios'")]
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
    #[command(after_help = "Examples:
  tollgate policy delete 'GET /users/*' --reason 'incident over'
  tollgate policy delete 'POST /orders' --caller-scope tenant-a --version 7")]
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
    /// Drop a rule's runtime change (set, patch, delete, apply): the rule
    /// is the policy file's again. The route `[defaults]` names `[defaults]`.
    /// Exit 5 when the rule has no runtime change.
    #[command(after_help = "Examples:
  tollgate policy clear 'GET /users/*' --reason 'incident over, back to Git'
  tollgate policy clear '[defaults]'")]
    Clear {
        /// The rule.
        #[command(flatten)]
        rule: RuleRef,
        /// Why, for the audit log.
        #[arg(long, default_value = "")]
        reason: String,
    },
    /// Where the running policy differs from a file (default: the server's
    /// own policy file). Exit 7 when it does.
    #[command(after_help = "Examples:
  tollgate policy diff                      # against the server's own policy file
  tollgate policy diff -f policy.toml -o json")]
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
    #[command(after_help = "Examples:
  tollgate scopes list --caller-scope 'tenant-a*'
  tollgate scopes list --tenant team-one
  tollgate scopes list --frozen -o json")]
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
        /// Only the scopes charged to this caller token, by the `name` of
        /// its `[[token]]` entry.
        #[arg(long)]
        tenant: Option<String>,
        /// At most this many.
        #[arg(long, default_value_t = 100)]
        limit: usize,
    },
    /// One scope's live state.
    #[command(after_help = "Examples:
  tollgate scopes show tenant-a 'GET /users/{id}'
  tollgate scopes show tenant-a 'GET /users/{id}' -o yaml")]
    Show(ScopeRef),
    /// No new leases or slots for the scope.
    #[command(after_help = "Examples:
  tollgate scopes freeze tenant-a 'GET /users/{id}' --reason 'upstream down' --for 15m
  tollgate scopes freeze tenant-a 'POST /orders' --reason 'INC-123: until unfrozen'")]
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
    #[command(after_help = "Examples:
  tollgate scopes unfreeze tenant-a 'GET /users/{id}' --reason 'upstream back'")]
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
    #[command(after_help = "Examples:
  tollgate scopes mute tenant-a 'GET /users/{id}' --worker worker-17 --reason 'INC-123: 300 s on every 429' --for 2h")]
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
        /// Lift it after this long (`2h`); default: until unmuted.
        #[arg(long = "for", value_parser = humantime::parse_duration)]
        duration: Option<Duration>,
    },
    /// Lift a worker's mute.
    #[command(after_help = "Examples:
  tollgate scopes unmute tenant-a 'GET /users/{id}' --worker worker-17 --reason 'fixed in 1.4.2'")]
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
    #[command(after_help = "Examples:
  tollgate scopes reset tenant-a 'GET /users/{id}' --reason 'stale cooldown after the fix'")]
    Reset {
        /// The scope.
        #[command(flatten)]
        scope: ScopeRef,
        /// Why, for the audit log.
        #[arg(long, default_value = "")]
        reason: String,
    },
}
