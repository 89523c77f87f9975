//! Certificates made at run time with rcgen, for the tests that speak TLS
//! (the coordinator's listener, the proxy's upstreams and coordinator
//! link): no key is ever checked in, and each test makes its own CAs.
//!
//! Not a module of `support` itself: the client crate's tests share that
//! harness and do not depend on rcgen. A test of this package includes it
//! as `#[path = "support/tls.rs"] mod tls;`.

// Each test binary uses a different subset.
#![allow(dead_code)]

use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, Issuer, KeyPair};

/// A CA and what it signs.
pub(crate) struct Ca {
    issuer: Issuer<'static, KeyPair>,
    /// The CA's certificate, PEM: what a client is given to trust.
    pub(crate) pem: String,
}

impl Ca {
    /// A fresh self-signed CA named `name`.
    pub(crate) fn new(name: &str) -> Ca {
        let key = KeyPair::generate().expect("CA key");
        let mut params = CertificateParams::new(Vec::<String>::new()).expect("params");
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.distinguished_name.push(DnType::CommonName, name);
        let cert = params.self_signed(&key).expect("self-signed");
        Ca {
            pem: cert.pem(),
            issuer: Issuer::new(params, key),
        }
    }

    /// A leaf for `names` (the server's `localhost`/`127.0.0.1`, or a
    /// client's name): (certificate PEM, key PEM).
    pub(crate) fn leaf(&self, names: &[&str]) -> (String, String) {
        let key = KeyPair::generate().expect("leaf key");
        let names: Vec<String> = names.iter().map(|n| (*n).to_owned()).collect();
        let mut params = CertificateParams::new(names).expect("params");
        params
            .distinguished_name
            .push(DnType::CommonName, "tollgate test");
        let cert = params.signed_by(&key, &self.issuer).expect("signed");
        (cert.pem(), key.serialize_pem())
    }
}
