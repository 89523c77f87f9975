//! The `[server]` keys about the transport: TLS files and the limits that
//! keep one peer from exhausting the coordinator.
//!
//! ```toml
//! [server]
//! tls_cert = "/etc/tollgate/tls/tls.crt"   # with tls_key: serve TLS
//! tls_key = "/etc/tollgate/tls/tls.key"
//! client_ca = "/etc/tollgate/tls/ca.crt"   # optional: require client certs (mTLS)
//! allow_plaintext = false       # needed to serve plaintext off loopback
//! max_connections = 10000       # open connections, all peers
//! max_connections_per_ip = 256  # open connections from one peer address
//! max_concurrent_streams = 128  # HTTP/2 streams per connection
//! max_header_list_size = "16KiB"
//! max_budget_message = "64KiB"  # decoded Budget request; Admin has its own
//! handshake_timeout = "10s"     # TLS handshake, per connection
//! idle_timeout = "5m"           # a connection with no open call is closed
//! body_timeout = "1s"           # a request's message must arrive this soon
//! max_unauthenticated_calls_per_connection = 8   # calls without a token
//! max_unauthenticated_calls_per_ip = 32           # (health, reflection)
//! probe_max_connections = 64    # --metrics-listen and --health-listen, each
//! probe_max_connections_per_ip = 8
//! probe_idle_timeout = "30s"
//! probe_header_timeout = "5s"   # a request's headers must arrive this soon
//! allow_plaintext_metrics = false  # needed to serve /metrics in clear off loopback
//! max_watch_streams = 20000     # Watch streams, all callers
//! max_watch_streams_per_token = 2000
//! ```

use std::path::PathBuf;
use std::time::Duration;

use super::ConfigError;

/// Where the server's certificate, key and (for mTLS) client CA are.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TlsFiles {
    /// PEM certificate chain, leaf first.
    pub cert: PathBuf,
    /// PEM private key (PKCS#8, PKCS#1 or SEC1).
    pub key: PathBuf,
    /// PEM CA certificates that sign client certificates; set: mTLS.
    pub client_ca: Option<PathBuf>,
}

/// TLS and the exhaustion limits.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Transport {
    /// `None`: plaintext.
    pub tls: Option<TlsFiles>,
    /// Plaintext on a non-loopback address is refused without this: a
    /// token sent in clear is a token given away.
    pub allow_plaintext: bool,
    /// Connections open at once; more are closed on accept.
    pub max_connections: usize,
    /// Connections from one peer address; one worker needs one (its
    /// channel multiplexes), a node of workers a few dozen. Behind a proxy
    /// that hides peer addresses this is a limit on the proxy: raise it.
    pub max_connections_per_ip: usize,
    /// HTTP/2 SETTINGS_MAX_CONCURRENT_STREAMS: calls in flight per
    /// connection; a client beyond it queues on its side.
    pub max_concurrent_streams: u32,
    /// HTTP/2 SETTINGS_MAX_HEADER_LIST_SIZE: bounds the metadata a request
    /// may make the server decode and hold.
    pub max_header_list_size: u32,
    /// Largest decoded Budget request; the biggest valid one (64 evidence
    /// items of bounded strings) is far smaller.
    pub max_budget_message: usize,
    /// A TLS handshake not done by then is dropped (slow or stalled peers
    /// would otherwise hold a connection slot for free).
    pub handshake_timeout: Duration,
    /// A connection with no call in flight for this long is closed; an open
    /// Watch stream is a call in flight.
    pub idle_timeout: Duration,
    /// A request whose message has not arrived this long after its headers
    /// ends (DEADLINE_EXCEEDED): a peer that sends headers and never a body
    /// would otherwise hold a request slot for the whole request timeout.
    /// Reflection streams, which send requests as they go, are exempt.
    pub body_timeout: Duration,
    /// Calls in flight on one connection that carry no token to check
    /// (health, reflection, unknown methods, Admin in open dev mode): they
    /// are answered without credentials, so they are bounded by where they
    /// come from. More are refused (RESOURCE_EXHAUSTED).
    pub max_unauthenticated_calls_per_connection: usize,
    /// The same, across all connections of one peer address. Behind a
    /// proxy that hides peer addresses this is a limit on the proxy.
    pub max_unauthenticated_calls_per_ip: usize,
    /// Connections open at once on each probe listener (`/metrics`, the
    /// plaintext health listener): a scraper or a probe needs one or two,
    /// and without a bound a peer holding thousands ran the whole process
    /// out of file descriptors, the gRPC listener's included.
    pub probe_max_connections: usize,
    /// The same, from one peer address.
    pub probe_max_connections_per_ip: usize,
    /// A probe connection with no request in flight this long is closed.
    pub probe_idle_timeout: Duration,
    /// A probe connection's request headers must arrive whole within this
    /// (the first request's counted from the connection's start).
    pub probe_header_timeout: Duration,
    /// `/metrics` names every caller scope and route: in plaintext on an
    /// address other hosts can reach it is served only with this (with
    /// TLS configured it is served over TLS, like the gRPC port).
    pub allow_plaintext_metrics: bool,
    /// Watch streams open at once across all callers.
    pub max_watch_streams: usize,
    /// Watch streams open at once per caller token (a fleet sharing one
    /// token shares this).
    pub max_watch_streams_per_token: usize,
}

impl Default for Transport {
    fn default() -> Self {
        Transport {
            tls: None,
            allow_plaintext: false,
            max_connections: 10_000,
            max_connections_per_ip: 256,
            max_concurrent_streams: 128,
            max_header_list_size: 16 * 1024,
            max_budget_message: 64 * 1024,
            handshake_timeout: Duration::from_secs(10),
            idle_timeout: Duration::from_secs(300),
            body_timeout: Duration::from_secs(1),
            max_unauthenticated_calls_per_connection: 8,
            max_unauthenticated_calls_per_ip: 32,
            probe_max_connections: 64,
            probe_max_connections_per_ip: 8,
            probe_idle_timeout: Duration::from_secs(30),
            probe_header_timeout: Duration::from_secs(5),
            allow_plaintext_metrics: false,
            max_watch_streams: 20_000,
            max_watch_streams_per_token: 2_000,
        }
    }
}

/// The transport keys of `[server]` as written (parsed as part of the
/// `[server]` table, which refuses unknown keys).
#[derive(Debug, Default)]
pub(super) struct TransportSpec {
    pub(super) tls_cert: Option<PathBuf>,
    pub(super) tls_key: Option<PathBuf>,
    pub(super) client_ca: Option<PathBuf>,
    pub(super) allow_plaintext: Option<bool>,
    pub(super) max_connections: Option<usize>,
    pub(super) max_connections_per_ip: Option<usize>,
    pub(super) max_concurrent_streams: Option<u32>,
    pub(super) max_header_list_size: Option<String>,
    pub(super) max_budget_message: Option<String>,
    pub(super) handshake_timeout: Option<String>,
    pub(super) idle_timeout: Option<String>,
    pub(super) body_timeout: Option<String>,
    pub(super) max_unauthenticated_calls_per_connection: Option<usize>,
    pub(super) max_unauthenticated_calls_per_ip: Option<usize>,
    pub(super) probe_max_connections: Option<usize>,
    pub(super) probe_max_connections_per_ip: Option<usize>,
    pub(super) probe_idle_timeout: Option<String>,
    pub(super) probe_header_timeout: Option<String>,
    pub(super) allow_plaintext_metrics: Option<bool>,
    pub(super) max_watch_streams: Option<usize>,
    pub(super) max_watch_streams_per_token: Option<usize>,
}

fn invalid(key: &str, reason: impl Into<String>) -> ConfigError {
    ConfigError::Invalid {
        place: format!("[server] {key}"),
        reason: reason.into(),
    }
}

/// `"16KiB"`, `"64KB"`, `"1MiB"` or a plain byte count.
fn bytes(key: &str, raw: Option<String>, default: usize, max: usize) -> Result<usize, ConfigError> {
    let Some(raw) = raw else {
        return Ok(default);
    };
    let text = raw.trim();
    let split = text
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(text.len());
    let (digits, unit) = text.split_at(split);
    let scale = match unit.trim() {
        "" | "B" => 1,
        "KiB" | "KB" | "K" => 1024,
        "MiB" | "MB" | "M" => 1024 * 1024,
        other => {
            return Err(invalid(
                key,
                format!("unknown unit {other:?} (B, KiB, MiB)"),
            ));
        }
    };
    let value = digits
        .parse::<usize>()
        .ok()
        .and_then(|n| n.checked_mul(scale))
        .ok_or_else(|| invalid(key, format!("{raw:?} is not a size")))?;
    if !(1024..=max).contains(&value) {
        return Err(invalid(key, format!("must be 1KiB..={max} bytes")));
    }
    Ok(value)
}

fn duration(key: &str, raw: Option<String>, default: Duration) -> Result<Duration, ConfigError> {
    let value = match raw {
        None => default,
        Some(raw) => {
            humantime::parse_duration(&raw).map_err(|e| invalid(key, format!("{raw:?}: {e}")))?
        }
    };
    if !(Duration::from_millis(100)..=Duration::from_secs(86_400)).contains(&value) {
        return Err(invalid(key, "must be 100ms..=24h"));
    }
    Ok(value)
}

fn count(key: &str, raw: Option<usize>, default: usize) -> Result<usize, ConfigError> {
    let value = raw.unwrap_or(default);
    if !(1..=10_000_000).contains(&value) {
        return Err(invalid(key, "must be 1..=10000000"));
    }
    Ok(value)
}

/// Validates the transport keys.
pub(super) fn transport(spec: TransportSpec) -> Result<Transport, ConfigError> {
    let d = Transport::default();
    let tls = match (spec.tls_cert, spec.tls_key) {
        (Some(cert), Some(key)) => Some(TlsFiles {
            cert,
            key,
            client_ca: spec.client_ca,
        }),
        (None, None) if spec.client_ca.is_none() => None,
        (None, None) => return Err(invalid("client_ca", "needs tls_cert and tls_key")),
        _ => return Err(invalid("tls_cert", "set both tls_cert and tls_key")),
    };
    let streams = spec
        .max_concurrent_streams
        .unwrap_or(d.max_concurrent_streams);
    if !(1..=10_000).contains(&streams) {
        return Err(invalid("max_concurrent_streams", "must be 1..=10000"));
    }
    let header = bytes(
        "max_header_list_size",
        spec.max_header_list_size,
        d.max_header_list_size as usize,
        1024 * 1024,
    )?;
    Ok(Transport {
        tls,
        allow_plaintext: spec.allow_plaintext.unwrap_or(false),
        max_connections: count("max_connections", spec.max_connections, d.max_connections)?,
        max_connections_per_ip: count(
            "max_connections_per_ip",
            spec.max_connections_per_ip,
            d.max_connections_per_ip,
        )?,
        max_concurrent_streams: streams,
        max_header_list_size: u32::try_from(header).unwrap_or(u32::MAX),
        max_budget_message: bytes(
            "max_budget_message",
            spec.max_budget_message,
            d.max_budget_message,
            4 * 1024 * 1024,
        )?,
        handshake_timeout: duration(
            "handshake_timeout",
            spec.handshake_timeout,
            d.handshake_timeout,
        )?,
        idle_timeout: duration("idle_timeout", spec.idle_timeout, d.idle_timeout)?,
        body_timeout: duration("body_timeout", spec.body_timeout, d.body_timeout)?,
        max_unauthenticated_calls_per_connection: count(
            "max_unauthenticated_calls_per_connection",
            spec.max_unauthenticated_calls_per_connection,
            d.max_unauthenticated_calls_per_connection,
        )?,
        max_unauthenticated_calls_per_ip: count(
            "max_unauthenticated_calls_per_ip",
            spec.max_unauthenticated_calls_per_ip,
            d.max_unauthenticated_calls_per_ip,
        )?,
        probe_max_connections: count(
            "probe_max_connections",
            spec.probe_max_connections,
            d.probe_max_connections,
        )?,
        probe_max_connections_per_ip: count(
            "probe_max_connections_per_ip",
            spec.probe_max_connections_per_ip,
            d.probe_max_connections_per_ip,
        )?,
        probe_idle_timeout: duration(
            "probe_idle_timeout",
            spec.probe_idle_timeout,
            d.probe_idle_timeout,
        )?,
        probe_header_timeout: duration(
            "probe_header_timeout",
            spec.probe_header_timeout,
            d.probe_header_timeout,
        )?,
        allow_plaintext_metrics: spec.allow_plaintext_metrics.unwrap_or(false),
        max_watch_streams: count(
            "max_watch_streams",
            spec.max_watch_streams,
            d.max_watch_streams,
        )?,
        max_watch_streams_per_token: count(
            "max_watch_streams_per_token",
            spec.max_watch_streams_per_token,
            d.max_watch_streams_per_token,
        )?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_and_tls_pairs_are_checked() {
        assert_eq!(
            bytes("k", Some("16KiB".into()), 0, 1 << 20).ok(),
            Some(16384)
        );
        assert_eq!(bytes("k", Some("2048".into()), 0, 1 << 20).ok(), Some(2048));
        assert!(bytes("k", Some("16XB".into()), 0, 1 << 20).is_err());
        assert!(bytes("k", Some("8MiB".into()), 0, 1 << 20).is_err());
        let half = TransportSpec {
            tls_cert: Some("c".into()),
            ..TransportSpec::default()
        };
        assert!(transport(half).is_err());
        assert_eq!(
            transport(TransportSpec::default()).ok(),
            Some(Transport::default())
        );
    }
}
