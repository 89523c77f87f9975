//! TLS for Budget and Admin: rustls (ring) with a certificate that can be
//! replaced while the server runs.
//!
//! The coordinator terminates TLS itself instead of through tonic's
//! `tls_config`, for two reasons: the certificate is served by a
//! [`ResolvesServerCert`] whose key [`ServerTls::reload`] swaps (so a renewed
//! certificate — cert-manager rewriting a mounted Secret — reaches every new
//! connection without a restart, while open connections keep theirs), and
//! the per-peer connection limits run before a handshake costs anything.
//! With a client CA, every connection must present a certificate it signed
//! (mTLS); bearer tokens still apply on top.

use std::path::Path;
use std::sync::{Arc, Mutex, RwLock};

use rustls::crypto::CryptoProvider;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::{ClientHello, ResolvesServerCert, WebPkiClientVerifier};
use rustls::sign::CertifiedKey;
use tokio_rustls::TlsAcceptor;

use crate::config::TlsFiles;

/// Why TLS could not be set up or reloaded. Never contains key material.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    /// A file could not be read.
    #[error("reading {path}: {source}")]
    Read {
        /// The file.
        path: std::path::PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
    /// A file holds no usable PEM item of the kind expected.
    #[error("{path}: {reason}")]
    Pem {
        /// The file.
        path: std::path::PathBuf,
        /// What was wrong.
        reason: String,
    },
    /// rustls refused the key, the certificate or the CA.
    #[error("tls: {0}")]
    Rustls(String),
}

/// The server's TLS state: the rustls configuration new connections are
/// accepted with, and the certificate it serves.
pub struct ServerTls {
    files: TlsFiles,
    provider: Arc<CryptoProvider>,
    resolver: Arc<Resolver>,
    acceptor: TlsAcceptor,
    /// The certificate and key files' bytes as last loaded, to tell whether
    /// a poll found anything new.
    loaded: Mutex<(Vec<u8>, Vec<u8>)>,
}

impl std::fmt::Debug for ServerTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ServerTls")
            .field("files", &self.files)
            .finish_non_exhaustive()
    }
}

/// Serves whatever certificate was loaded last.
#[derive(Debug)]
struct Resolver {
    current: RwLock<Arc<CertifiedKey>>,
}

impl ResolvesServerCert for Resolver {
    fn resolve(&self, _hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        Some(Arc::clone(
            &self.current.read().unwrap_or_else(|p| p.into_inner()),
        ))
    }
}

impl ServerTls {
    /// Loads the certificate, key and optional client CA, and builds the
    /// configuration (TLS 1.2 and 1.3, ALPN `h2`).
    pub fn load(files: &TlsFiles) -> Result<ServerTls, TlsError> {
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let (cert_pem, key_pem) = (read(&files.cert)?, read(&files.key)?);
        let key = certified_key(files, &cert_pem, &key_pem, &provider)?;
        let resolver = Arc::new(Resolver {
            current: RwLock::new(Arc::new(key)),
        });
        let builder = rustls::ServerConfig::builder_with_provider(Arc::clone(&provider))
            .with_safe_default_protocol_versions()
            .map_err(|e| TlsError::Rustls(e.to_string()))?;
        let builder = match &files.client_ca {
            Some(ca) => {
                let mut roots = rustls::RootCertStore::empty();
                for cert in certificates(ca, &read(ca)?)? {
                    roots
                        .add(cert)
                        .map_err(|e| TlsError::Rustls(format!("client CA: {e}")))?;
                }
                let verifier = WebPkiClientVerifier::builder_with_provider(
                    Arc::new(roots),
                    Arc::clone(&provider),
                )
                .build()
                .map_err(|e| TlsError::Rustls(format!("client CA: {e}")))?;
                builder.with_client_cert_verifier(verifier)
            }
            None => builder.with_no_client_auth(),
        };
        let mut config = builder.with_cert_resolver(Arc::clone(&resolver) as _);
        // gRPC is HTTP/2 only; without ALPN some clients (grpcio) refuse.
        config.alpn_protocols = vec![b"h2".to_vec()];
        Ok(ServerTls {
            files: files.clone(),
            provider,
            resolver,
            acceptor: TlsAcceptor::from(Arc::new(config)),
            loaded: Mutex::new((cert_pem, key_pem)),
        })
    }

    /// Whether a client certificate is required.
    pub fn mutual(&self) -> bool {
        self.files.client_ca.is_some()
    }

    /// Accepts new connections with the current certificate.
    pub fn acceptor(&self) -> &TlsAcceptor {
        &self.acceptor
    }

    /// Re-reads the certificate and key; when they changed and are valid,
    /// new connections get them. Returns whether the certificate changed;
    /// on an error the previous certificate stays in use.
    pub fn reload(&self) -> Result<bool, TlsError> {
        let (cert_pem, key_pem) = (read(&self.files.cert)?, read(&self.files.key)?);
        let mut loaded = self.loaded.lock().unwrap_or_else(|p| p.into_inner());
        if loaded.0 == cert_pem && loaded.1 == key_pem {
            return Ok(false);
        }
        let key = certified_key(&self.files, &cert_pem, &key_pem, &self.provider)?;
        *self
            .resolver
            .current
            .write()
            .unwrap_or_else(|p| p.into_inner()) = Arc::new(key);
        *loaded = (cert_pem, key_pem);
        Ok(true)
    }

    /// [`ServerTls::reload`], logged; for the file follower.
    pub fn reload_logged(&self) {
        match self.reload() {
            Ok(true) => tracing::info!(
                cert = %self.files.cert.display(),
                "TLS certificate reloaded: new connections use it"
            ),
            Ok(false) => {}
            Err(err) => tracing::warn!(
                cause = %err,
                "TLS certificate not reloaded; the previous one stays in use"
            ),
        }
    }
}

fn read(path: &Path) -> Result<Vec<u8>, TlsError> {
    std::fs::read(path).map_err(|source| TlsError::Read {
        path: path.to_owned(),
        source,
    })
}

/// The certificates in the PEM file at `path`, at least one: the one reader
/// of certificate files, for the server's chain and CAs and the proxy's
/// upstream CA.
pub(crate) fn certificates_in(path: &Path) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    certificates(path, &read(path)?)
}

fn certificates(path: &Path, pem: &[u8]) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let certs = CertificateDer::pem_slice_iter(pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| TlsError::Pem {
            path: path.to_owned(),
            reason: e.to_string(),
        })?;
    if certs.is_empty() {
        return Err(TlsError::Pem {
            path: path.to_owned(),
            reason: "no CERTIFICATE in the file".into(),
        });
    }
    Ok(certs)
}

/// The chain and key, checked to belong together (a half-rotated pair —
/// the new certificate with the old key — is refused, not served).
fn certified_key(
    files: &TlsFiles,
    cert_pem: &[u8],
    key_pem: &[u8],
    provider: &CryptoProvider,
) -> Result<CertifiedKey, TlsError> {
    let chain = certificates(&files.cert, cert_pem)?;
    let key = PrivateKeyDer::from_pem_slice(key_pem).map_err(|e| TlsError::Pem {
        path: files.key.clone(),
        reason: format!("no usable private key: {e}"),
    })?;
    let signing = provider
        .key_provider
        .load_private_key(key)
        .map_err(|e| TlsError::Rustls(format!("private key: {e}")))?;
    let certified = CertifiedKey::new(chain, signing);
    certified
        .keys_match()
        .map_err(|e| TlsError::Rustls(format!("certificate and key: {e}")))?;
    Ok(certified)
}
