//! [`client_config`]: the rustls configuration TLS material and a verification level mean.

use std::fmt;
use std::sync::Arc;

use lockcore::{Error, ErrorKind, Result, Verification};
use rustls::client::WebPkiServerVerifier;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::{ClientConfig, RootCertStore};

use crate::files::TlsMaterial;
use crate::verifier::LaxVerifier;

/// How [`client_config`] (and every driver that follows these rules) chooses the CAs a
/// server's certificate may chain to, in words for a report.
pub fn roots_description(material: &TlsMaterial) -> &'static str {
    if material.ca().is_some() {
        "the `ca` file only"
    } else {
        "the OS trust store"
    }
}

/// The rustls configuration `material` and `verification` mean: the `ca` file's CAs or else
/// the OS trust store, the client certificate when given.
///
/// # Errors
/// [`Config`](ErrorKind::Config) when the OS trust store is empty or a certificate or key is
/// rejected by rustls.
pub fn client_config(material: &TlsMaterial, verification: Verification) -> Result<ClientConfig> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let roots = Arc::new(root_store(material)?);
    let builder = ClientConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .map_err(|e| config_error("TLS protocol versions", e))?;
    let builder = match verification {
        Verification::Full => builder.with_root_certificates(roots),
        other => {
            let inner = WebPkiServerVerifier::builder_with_provider(roots, provider.clone())
                .build()
                .map_err(|e| config_error("TLS certificate verifier", e))?;
            let lax = LaxVerifier {
                inner,
                check_chain: other == Verification::ChainOnly,
                provider,
            };
            builder
                .dangerous()
                .with_custom_certificate_verifier(Arc::new(lax))
        }
    };
    let config = match material.client() {
        None => builder.with_no_client_auth(),
        Some(client) => {
            let chain = CertificateDer::pem_slice_iter(client.cert_pem())
                .collect::<std::result::Result<Vec<_>, _>>()
                .map_err(|e| config_error("client certificate", e))?;
            let key = PrivateKeyDer::from_pem_slice(client.key_pem())
                .map_err(|e| config_error("client key", e))?;
            builder
                .with_client_auth_cert(chain, key)
                .map_err(|e| config_error("client certificate and key", e))?
        }
    };
    Ok(config)
}

fn config_error(what: &str, e: impl fmt::Display) -> Error {
    Error::new(ErrorKind::Config, format!("{what}: {e}"))
}

fn root_store(material: &TlsMaterial) -> Result<RootCertStore> {
    let mut roots = RootCertStore::empty();
    if let Some(ca) = material.ca() {
        let (_, ignored) = roots.add_parsable_certificates(ca.ders().iter().cloned());
        if roots.is_empty() {
            return Err(Error::new(
                ErrorKind::Config,
                format!("the `ca` file holds {ignored} certificate(s), none usable as a CA"),
            ));
        }
        return Ok(roots);
    }
    let native = rustls_native_certs::load_native_certs();
    roots.add_parsable_certificates(native.certs);
    if roots.is_empty() {
        return Err(Error::new(
            ErrorKind::Config,
            "the OS trust store has no CA certificates (install ca-certificates, or set \
             SSL_CERT_FILE); or pass the server's CA with the URL parameter `ca`",
        ));
    }
    Ok(roots)
}
