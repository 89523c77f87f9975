//! The way to one listener's upstream: a hyper client over TCP, with TLS
//! (rustls, ring) verified against the system roots or a given CA, HTTP/2
//! when ALPN or the configuration says so, and the rewriting of a request
//! the service addressed to the proxy into one for the upstream.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use http::header::{self, HeaderMap, HeaderName};
use http::{Uri, Version};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::{Connected, Connection};
use hyper_util::rt::{TokioExecutor, TokioIo};
use rustls::pki_types::ServerName;
use tokio::net::TcpStream;
use tokio_rustls::TlsConnector;
use tokio_rustls::client::TlsStream;
use tokio_util::either::Either;

use super::body::ProxyBody;
use super::config::ListenerConfig;
use crate::server::tls::TlsError;

/// The client one listener forwards with.
pub type UpstreamClient = Client<UpstreamConnector, ProxyBody>;

/// Why the upstream's client could not be built.
#[derive(Debug, thiserror::Error)]
pub enum UpstreamError {
    /// The CA file is unreadable or holds no certificate.
    #[error("upstream_ca_file {path}: {reason}")]
    Ca {
        /// The file.
        path: String,
        /// What was wrong.
        reason: String,
    },
    /// Neither a CA file nor any usable system root.
    #[error("no system root certificates found; set upstream_ca_file")]
    NoRoots,
    /// The host is not a name or address TLS can verify.
    #[error("upstream host {0:?} cannot be verified by TLS")]
    ServerName(String),
    /// The listener's own settings make no valid policy.
    #[error("policy: {0}")]
    Policy(String),
    /// rustls refused the configuration.
    #[error("TLS: {0}")]
    Tls(#[from] rustls::Error),
}

/// Connects to the one upstream of a listener, whatever URI the client
/// asks for (it only ever asks for that upstream's).
#[derive(Clone)]
pub struct UpstreamConnector {
    host: Arc<str>,
    port: u16,
    tls: Option<(TlsConnector, ServerName<'static>)>,
}

impl std::fmt::Debug for UpstreamConnector {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("UpstreamConnector")
            .field("host", &self.host)
            .field("port", &self.port)
            .field("tls", &self.tls.is_some())
            .finish()
    }
}

/// A connection to the upstream, plain or TLS.
#[derive(Debug)]
pub struct UpstreamIo {
    io: TokioIo<Either<TcpStream, TlsStream<TcpStream>>>,
    h2: bool,
}

impl Connection for UpstreamIo {
    fn connected(&self) -> Connected {
        let connected = Connected::new();
        if self.h2 {
            connected.negotiated_h2()
        } else {
            connected
        }
    }
}

impl hyper::rt::Read for UpstreamIo {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: hyper::rt::ReadBufCursor<'_>,
    ) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.io).poll_read(cx, buf)
    }
}

impl hyper::rt::Write for UpstreamIo {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.io).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.io).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.io).poll_shutdown(cx)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.io).poll_write_vectored(cx, bufs)
    }
}

impl tower::Service<Uri> for UpstreamConnector {
    type Response = UpstreamIo;
    type Error = std::io::Error;
    type Future = Pin<Box<dyn Future<Output = std::io::Result<UpstreamIo>> + Send>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, _uri: Uri) -> Self::Future {
        let this = self.clone();
        Box::pin(async move {
            let tcp = TcpStream::connect((&*this.host, this.port)).await?;
            // Requests are small and latency matters more than packing.
            let _ = tcp.set_nodelay(true);
            match this.tls {
                None => Ok(UpstreamIo {
                    io: TokioIo::new(Either::Left(tcp)),
                    h2: false,
                }),
                Some((connector, name)) => {
                    let tls = connector.connect(name, tcp).await?;
                    let h2 = tls.get_ref().1.alpn_protocol() == Some(b"h2");
                    Ok(UpstreamIo {
                        io: TokioIo::new(Either::Right(tls)),
                        h2,
                    })
                }
            }
        })
    }
}

/// The client for `listener`'s upstream.
pub fn client(listener: &ListenerConfig) -> Result<UpstreamClient, UpstreamError> {
    let host = listener
        .upstream
        .host()
        .unwrap_or_default()
        .trim_start_matches('[')
        .trim_end_matches(']')
        .to_owned();
    let https = listener.upstream.scheme_str() == Some("https");
    let port = listener
        .upstream
        .port_u16()
        .unwrap_or(if https { 443 } else { 80 });
    let tls = if https {
        let name = ServerName::try_from(host.clone())
            .map_err(|_| UpstreamError::ServerName(host.clone()))?;
        Some((tls_connector(listener.upstream_ca_file.as_deref())?, name))
    } else {
        None
    };
    let connector = UpstreamConnector {
        host: host.into(),
        port,
        tls,
    };
    let mut builder = Client::builder(TokioExecutor::new());
    builder.http2_only(listener.upstream_http2 && !https);
    Ok(builder.build(connector))
}

fn tls_connector(ca_file: Option<&std::path::Path>) -> Result<TlsConnector, UpstreamError> {
    let mut roots = rustls::RootCertStore::empty();
    match ca_file {
        Some(path) => {
            let ca_error = |reason: String| UpstreamError::Ca {
                path: path.display().to_string(),
                reason,
            };
            let certs = crate::server::tls::certificates_in(path).map_err(|e| {
                ca_error(match e {
                    TlsError::Read { source, .. } => source.to_string(),
                    TlsError::Pem { reason, .. } => reason,
                    TlsError::Rustls(reason) => reason,
                })
            })?;
            for cert in certs {
                roots.add(cert).map_err(|e| ca_error(e.to_string()))?;
            }
        }
        None => {
            let found = rustls_native_certs::load_native_certs();
            for cert in found.certs {
                // One unusable system certificate must not stop the rest.
                let _ = roots.add(cert);
            }
            if roots.is_empty() {
                return Err(UpstreamError::NoRoots);
            }
        }
    }
    let mut config = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()?
    .with_root_certificates(roots)
    .with_no_client_auth();
    config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    Ok(TlsConnector::from(Arc::new(config)))
}

/// Headers that describe one connection, not the message (RFC 9110
/// §7.6.1): never forwarded in either direction.
const HOP_BY_HOP: [HeaderName; 7] = [
    header::CONNECTION,
    HeaderName::from_static("keep-alive"),
    HeaderName::from_static("proxy-connection"),
    header::PROXY_AUTHENTICATE,
    header::PROXY_AUTHORIZATION,
    header::TRANSFER_ENCODING,
    header::UPGRADE,
];

/// Drops the hop-by-hop headers, those the `Connection` header names
/// included; `TE: trailers` is kept, as gRPC needs it.
pub fn strip_hop_by_hop(headers: &mut HeaderMap) {
    let named: Vec<HeaderName> = headers
        .get_all(header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .filter_map(|name| HeaderName::try_from(name.trim()).ok())
        .take(16)
        .collect();
    for name in HOP_BY_HOP.iter().chain(&named) {
        headers.remove(name);
    }
    let te_trailers = headers
        .get(header::TE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| {
            v.split(',')
                .any(|t| t.trim().eq_ignore_ascii_case("trailers"))
        });
    headers.remove(header::TE);
    if te_trailers {
        headers.insert(header::TE, http::HeaderValue::from_static("trailers"));
    }
}

/// Readdresses a request the service sent to the proxy to the upstream:
/// the upstream's scheme and authority, its base path before the
/// request's path, HTTP/1.1 framing for the client to upgrade as the
/// connection allows, no hop-by-hop headers, and no `Host` (the client
/// sets the upstream's).
pub fn readdress(parts: &mut http::request::Parts, upstream: &Uri) {
    let base = upstream.path().trim_end_matches('/');
    let path_and_query = parts
        .uri
        .path_and_query()
        .map_or("/", http::uri::PathAndQuery::as_str);
    let mut builder = Uri::builder().path_and_query(format!("{base}{path_and_query}"));
    if let Some(scheme) = upstream.scheme() {
        builder = builder.scheme(scheme.clone());
    }
    if let Some(authority) = upstream.authority() {
        builder = builder.authority(authority.clone());
    }
    if let Ok(uri) = builder.build() {
        parts.uri = uri;
    }
    parts.version = Version::HTTP_11;
    strip_hop_by_hop(&mut parts.headers);
    parts.headers.remove(header::HOST);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_request_is_readdressed_under_the_upstream_base_path() {
        let (mut parts, ()) = http::Request::get("/users/42?full=1")
            .header("host", "127.0.0.1:8081")
            .header("connection", "close, x-private")
            .header("x-private", "1")
            .header("te", "trailers, deflate")
            .header("x-kept", "1")
            .body(())
            .expect("request")
            .into_parts();
        let upstream: Uri = "https://api.example.com/v2/".parse().expect("uri");
        readdress(&mut parts, &upstream);
        assert_eq!(
            parts.uri.to_string(),
            "https://api.example.com/v2/users/42?full=1"
        );
        assert!(parts.headers.get("host").is_none());
        assert!(parts.headers.get("x-private").is_none());
        assert!(parts.headers.get("connection").is_none());
        assert_eq!(parts.headers["te"], "trailers");
        assert_eq!(parts.headers["x-kept"], "1");
    }
}
