//! The proxy's TOML file: what each listener forwards where, how its
//! requests become intents, and how the proxy reaches its coordinator.
//! Validated whole at start; every error is one line naming the key
//! (`listener[0].upstream: …`) and, when the parser knows it, the line.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Deserialize;

use super::route::{RouteError, RouteFile, RouteTable};

/// Listeners one proxy runs: one per upstream, and a sidecar fronts few.
pub const MAX_LISTENERS: usize = 64;
/// Caller scopes a header may name on one listener.
pub const MAX_CALLER_SCOPES: usize = 256;
/// The longest name (caller scope, listener, header) the file may hold.
pub const MAX_NAME: usize = 128;
/// The largest body a listener may buffer for replay: bounds the proxy's
/// memory to `max_in_flight × buffer_limit`.
pub const MAX_BUFFER_LIMIT: usize = 16 * 1024 * 1024;
/// The default buffer bound: enough for the JSON requests retries are
/// usually for, small enough that a thousand in flight cost 64 MiB.
pub const DEFAULT_BUFFER_LIMIT: usize = 64 * 1024;
/// The deadline when neither the request nor the listener gives one.
pub const DEFAULT_DEADLINE: Duration = Duration::from_secs(30);
/// The longest deadline a request header may ask for, by default.
pub const DEFAULT_MAX_DEADLINE: Duration = Duration::from_secs(300);
/// How long a draining proxy lets requests in flight finish, by default.
pub const DEFAULT_DRAIN: Duration = Duration::from_secs(10);

/// Why the file was refused, in one line.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct ConfigError(String);

impl ConfigError {
    fn at(key: &str, reason: impl std::fmt::Display) -> Self {
        ConfigError(format!("{key}: {reason}"))
    }
}

/// The whole file, validated.
#[derive(Debug, Clone)]
pub struct ProxyConfig {
    /// How the gate reaches the fleet.
    pub coordinator: CoordinatorConfig,
    /// `/healthz`, `/readyz` and `/metrics`, when set.
    pub admin_listen: Option<SocketAddr>,
    /// How long a drain waits for requests in flight.
    pub drain: Duration,
    /// Attempts in flight through the proxy at once (the gate's capacity).
    pub max_in_flight: usize,
    /// One per upstream.
    pub listeners: Vec<ListenerConfig>,
}

/// The coordinator link.
#[derive(Debug, Clone)]
pub struct CoordinatorConfig {
    /// `http://` or `https://` address.
    pub endpoint: String,
    /// This proxy's worker id (fair shares are per worker).
    pub worker_id: String,
    /// A file holding the bearer token; read at start and followed (a
    /// mounted Secret rotates under the process), never logged.
    pub token_file: Option<PathBuf>,
    /// PEM CA for a TLS coordinator; `https://` without it uses the
    /// system roots.
    pub ca_file: Option<PathBuf>,
    /// The bound on each coordinator RPC.
    pub rpc_timeout: Duration,
}

/// One listener: a local address forwarding to one upstream.
#[derive(Debug, Clone)]
pub struct ListenerConfig {
    /// For logs and metrics.
    pub name: String,
    /// Where the service sends its requests.
    pub listen: SocketAddr,
    /// The upstream's base URL.
    pub upstream: http::Uri,
    /// PEM CA the upstream's certificate must chain to; system roots when
    /// unset.
    pub upstream_ca_file: Option<PathBuf>,
    /// Speak HTTP/2 with prior knowledge to a plaintext upstream (gRPC);
    /// a TLS upstream negotiates it.
    pub upstream_http2: bool,
    /// The caller scope of every request, unless the header names another.
    pub caller_scope: String,
    /// A request header that may name the caller scope, among
    /// `caller_scopes` only (the set stays bounded).
    pub caller_scope_header: Option<http::HeaderName>,
    /// The caller scopes the header may name.
    pub caller_scopes: Vec<String>,
    /// The deadline of a request that states none.
    pub deadline: Duration,
    /// The longest deadline a request may state.
    pub max_deadline: Duration,
    /// Attempts in all per request.
    pub max_attempts: u32,
    /// One attempt's reserve; the deadline's even share when unset.
    pub attempt_timeout: Option<Duration>,
    /// The longest valid hint waited out.
    pub max_hint: Duration,
    /// Request bodies up to this many bytes are buffered for replay;
    /// longer ones are sent once, streamed.
    pub buffer_limit: usize,
    /// Route templates to scope names, priorities and repetition rules.
    pub routes: RouteTable,
}

// ---- the file as written -------------------------------------------------

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct FileFormat {
    coordinator: CoordinatorFile,
    admin: Option<AdminFile>,
    drain: Option<String>,
    max_in_flight: Option<usize>,
    #[serde(default)]
    listener: Vec<ListenerFile>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct CoordinatorFile {
    endpoint: String,
    worker_id: Option<String>,
    token_file: Option<PathBuf>,
    ca_file: Option<PathBuf>,
    rpc_timeout: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct AdminFile {
    listen: String,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ListenerFile {
    name: String,
    listen: String,
    upstream: String,
    upstream_ca_file: Option<PathBuf>,
    #[serde(default)]
    upstream_http2: bool,
    caller_scope: String,
    caller_scope_header: Option<String>,
    #[serde(default)]
    caller_scopes: Vec<String>,
    deadline: Option<String>,
    max_deadline: Option<String>,
    max_attempts: Option<u32>,
    attempt_timeout: Option<String>,
    max_hint: Option<String>,
    buffer_limit: Option<usize>,
    #[serde(default)]
    route: Vec<RouteFile>,
}

impl ProxyConfig {
    /// Reads and validates `path`.
    pub fn load(path: &Path) -> Result<ProxyConfig, ConfigError> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| ConfigError(format!("reading {}: {e}", path.display())))?;
        Self::from_toml(&text)
    }

    /// Parses and validates the file's text.
    pub fn from_toml(text: &str) -> Result<ProxyConfig, ConfigError> {
        let deserializer =
            toml::de::Deserializer::parse(text).map_err(|e| parse_error(text, &e))?;
        let file: FileFormat = serde_path_to_error::deserialize(deserializer).map_err(|e| {
            let key = e.path().to_string();
            let inner = e.into_inner();
            let line = inner.span().map(|s| line_of(text, s.start));
            let message = inner.message().replace('\n', " ");
            match line {
                Some(line) => ConfigError(format!("line {line}, {key}: {message}")),
                None => ConfigError::at(&key, message),
            }
        })?;
        validate(file)
    }
}

fn parse_error(text: &str, err: &toml::de::Error) -> ConfigError {
    let message = err.message().replace('\n', " ");
    match err.span() {
        Some(span) => ConfigError(format!("line {}: {message}", line_of(text, span.start))),
        None => ConfigError(message),
    }
}

fn line_of(text: &str, offset: usize) -> usize {
    text.get(..offset).map_or(0, |t| t.matches('\n').count()) + 1
}

fn duration(key: &str, value: Option<&str>, default: Duration) -> Result<Duration, ConfigError> {
    match value {
        None => Ok(default),
        Some(text) => humantime::parse_duration(text)
            .map_err(|e| ConfigError::at(key, format!("{text:?} is not a duration ({e})"))),
    }
}

fn name(key: &str, value: &str) -> Result<(), ConfigError> {
    if value.is_empty() || value.len() > MAX_NAME || value.chars().any(char::is_control) {
        return Err(ConfigError::at(
            key,
            format!("must be 1 to {MAX_NAME} characters, no control characters"),
        ));
    }
    Ok(())
}

fn validate(file: FileFormat) -> Result<ProxyConfig, ConfigError> {
    let coordinator = validate_coordinator(file.coordinator)?;
    let admin_listen = match file.admin {
        Some(admin) => Some(admin.listen.parse().map_err(|e| {
            ConfigError::at(
                "admin.listen",
                format!("{:?} is not IP:PORT ({e})", admin.listen),
            )
        })?),
        None => None,
    };
    let drain = duration("drain", file.drain.as_deref(), DEFAULT_DRAIN)?;
    let max_in_flight = file.max_in_flight.unwrap_or(1024);
    if !(1..=1_000_000).contains(&max_in_flight) {
        return Err(ConfigError::at("max_in_flight", "must be 1 to 1000000"));
    }
    if file.listener.is_empty() {
        return Err(ConfigError::at(
            "listener",
            "at least one [[listener]] is needed",
        ));
    }
    if file.listener.len() > MAX_LISTENERS {
        return Err(ConfigError::at(
            "listener",
            format!("at most {MAX_LISTENERS} listeners"),
        ));
    }
    let mut listeners = Vec::with_capacity(file.listener.len());
    for (i, listener) in file.listener.into_iter().enumerate() {
        let validated = validate_listener(&format!("listener[{i}]"), listener)?;
        if listeners
            .iter()
            .any(|l: &ListenerConfig| l.name == validated.name)
        {
            return Err(ConfigError::at(
                &format!("listener[{i}].name"),
                format!("{:?} is used by another listener", validated.name),
            ));
        }
        listeners.push(validated);
    }
    Ok(ProxyConfig {
        coordinator,
        admin_listen,
        drain,
        max_in_flight,
        listeners,
    })
}

fn validate_coordinator(file: CoordinatorFile) -> Result<CoordinatorConfig, ConfigError> {
    let uri: http::Uri = file.endpoint.parse().map_err(|e| {
        ConfigError::at(
            "coordinator.endpoint",
            format!("{:?} is not a URL ({e})", file.endpoint),
        )
    })?;
    if !matches!(uri.scheme_str(), Some("http" | "https")) || uri.host().is_none() {
        return Err(ConfigError::at(
            "coordinator.endpoint",
            "must be http://HOST:PORT or https://HOST:PORT",
        ));
    }
    let worker_id = match file.worker_id {
        Some(id) => id,
        // A pod's name is unique in its namespace: the natural worker id.
        None => std::env::var("HOSTNAME").unwrap_or_else(|_| "tollgate-proxy".into()),
    };
    name("coordinator.worker_id", &worker_id)?;
    Ok(CoordinatorConfig {
        endpoint: file.endpoint,
        worker_id,
        token_file: file.token_file,
        ca_file: file.ca_file,
        rpc_timeout: duration(
            "coordinator.rpc_timeout",
            file.rpc_timeout.as_deref(),
            tollgate_client::link::DEFAULT_RPC_TIMEOUT,
        )?,
    })
}

fn validate_listener(at: &str, file: ListenerFile) -> Result<ListenerConfig, ConfigError> {
    let key = |k: &str| format!("{at}.{k}");
    name(&key("name"), &file.name)?;
    let listen = file.listen.parse().map_err(|e| {
        ConfigError::at(
            &key("listen"),
            format!("{:?} is not IP:PORT ({e})", file.listen),
        )
    })?;
    let upstream: http::Uri = file.upstream.parse().map_err(|e| {
        ConfigError::at(
            &key("upstream"),
            format!("{:?} is not a URL ({e})", file.upstream),
        )
    })?;
    if !matches!(upstream.scheme_str(), Some("http" | "https")) || upstream.host().is_none() {
        return Err(ConfigError::at(
            &key("upstream"),
            "must be http://HOST[:PORT][/PATH] or https://…",
        ));
    }
    if upstream.query().is_some() {
        return Err(ConfigError::at(&key("upstream"), "must not have a query"));
    }
    if upstream.scheme_str() == Some("http") && file.upstream_ca_file.is_some() {
        return Err(ConfigError::at(
            &key("upstream_ca_file"),
            "is for an https:// upstream",
        ));
    }
    name(&key("caller_scope"), &file.caller_scope)?;
    let caller_scope_header = match &file.caller_scope_header {
        Some(header) => Some(http::HeaderName::try_from(header.as_str()).map_err(|_| {
            ConfigError::at(
                &key("caller_scope_header"),
                format!("{header:?} is not a header name"),
            )
        })?),
        None => None,
    };
    if caller_scope_header.is_some() && file.caller_scopes.is_empty() {
        return Err(ConfigError::at(
            &key("caller_scopes"),
            "list the caller scopes caller_scope_header may name",
        ));
    }
    if file.caller_scopes.len() > MAX_CALLER_SCOPES {
        return Err(ConfigError::at(
            &key("caller_scopes"),
            format!("at most {MAX_CALLER_SCOPES}"),
        ));
    }
    for (i, scope) in file.caller_scopes.iter().enumerate() {
        name(&format!("{at}.caller_scopes[{i}]"), scope)?;
    }
    let deadline = duration(&key("deadline"), file.deadline.as_deref(), DEFAULT_DEADLINE)?;
    let max_deadline = duration(
        &key("max_deadline"),
        file.max_deadline.as_deref(),
        DEFAULT_MAX_DEADLINE.max(deadline),
    )?;
    if deadline.is_zero() || deadline > max_deadline {
        return Err(ConfigError::at(
            &key("deadline"),
            "must be above zero and at most max_deadline",
        ));
    }
    let max_attempts = file
        .max_attempts
        .unwrap_or(tollgate_client::engine::DEFAULT_MAX_ATTEMPTS);
    if !(1..=10).contains(&max_attempts) {
        return Err(ConfigError::at(&key("max_attempts"), "must be 1 to 10"));
    }
    let attempt_timeout = match file.attempt_timeout.as_deref() {
        Some(text) => Some(duration(&key("attempt_timeout"), Some(text), deadline)?),
        None => None,
    };
    if attempt_timeout.is_some_and(|t| t.is_zero()) {
        return Err(ConfigError::at(
            &key("attempt_timeout"),
            "must be above zero",
        ));
    }
    let max_hint = duration(
        &key("max_hint"),
        file.max_hint.as_deref(),
        tollgate_client::engine::DEFAULT_MAX_HINT,
    )?;
    let buffer_limit = file.buffer_limit.unwrap_or(DEFAULT_BUFFER_LIMIT);
    if buffer_limit > MAX_BUFFER_LIMIT {
        return Err(ConfigError::at(
            &key("buffer_limit"),
            format!("at most {MAX_BUFFER_LIMIT} bytes"),
        ));
    }
    let routes = RouteTable::try_new(&file.route).map_err(|RouteError { index, reason }| {
        ConfigError::at(&format!("{at}.route[{index}].route"), reason)
    })?;
    Ok(ListenerConfig {
        name: file.name,
        listen,
        upstream,
        upstream_ca_file: file.upstream_ca_file,
        upstream_http2: file.upstream_http2,
        caller_scope: file.caller_scope,
        caller_scope_header,
        caller_scopes: file.caller_scopes,
        deadline,
        max_deadline,
        max_attempts,
        attempt_timeout,
        max_hint,
        buffer_limit,
        routes,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const MINIMAL: &str = r#"
[coordinator]
endpoint = "http://127.0.0.1:50051"
worker_id = "checkout-1"

[[listener]]
name = "users"
listen = "127.0.0.1:8081"
upstream = "https://api.example.com"
caller_scope = "checkout"

[[listener.route]]
route = "GET /users/{id}"
priority = "critical"
"#;

    fn refused(text: &str) -> String {
        let err = ProxyConfig::from_toml(text).expect_err("refused");
        let line = err.to_string();
        assert!(!line.contains('\n'), "one line: {line}");
        line
    }

    #[test]
    fn a_minimal_file_is_read_with_its_defaults() {
        let config = ProxyConfig::from_toml(MINIMAL).expect("valid");
        let listener = &config.listeners[0];
        assert_eq!(listener.deadline, DEFAULT_DEADLINE);
        assert_eq!(listener.buffer_limit, DEFAULT_BUFFER_LIMIT);
        assert_eq!(listener.upstream.host(), Some("api.example.com"));
        assert_eq!(config.coordinator.worker_id, "checkout-1");
    }

    #[test]
    fn an_unknown_key_is_named_with_its_place() {
        let line = refused(&MINIMAL.replace("caller_scope =", "caller_scop ="));
        assert!(
            line.contains("listener[0]") || line.contains("caller_scop"),
            "{line}"
        );
        let line = refused(&format!("{MINIMAL}\nbogus = 1\n"));
        assert!(line.contains("bogus"), "{line}");
    }

    #[test]
    fn bad_values_name_their_key() {
        let cases = [
            (
                MINIMAL.replace("https://api.example.com", "ftp://x"),
                "listener[0].upstream",
            ),
            (
                MINIMAL.replace("127.0.0.1:8081", "localhost"),
                "listener[0].listen",
            ),
            (
                MINIMAL.replace("GET /users/{id}", "/users/{id}"),
                "listener[0].route[0].route",
            ),
            (
                MINIMAL.replace(
                    "caller_scope = \"checkout\"",
                    "caller_scope = \"checkout\"\ncaller_scope_header = \"x-caller\"",
                ),
                "listener[0].caller_scopes",
            ),
            (
                MINIMAL.replace(
                    "caller_scope = \"checkout\"",
                    "caller_scope = \"checkout\"\ndeadline = \"soon\"",
                ),
                "listener[0].deadline",
            ),
            (
                MINIMAL.replace("http://127.0.0.1:50051", "127.0.0.1:50051"),
                "coordinator.endpoint",
            ),
        ];
        for (text, key) in cases {
            let line = refused(&text);
            assert!(line.contains(key), "{key}: {line}");
        }
    }

    #[test]
    fn a_file_without_listeners_is_refused() {
        let line = refused("[coordinator]\nendpoint = \"http://127.0.0.1:1\"\n");
        assert!(line.starts_with("listener:"), "{line}");
    }
}
