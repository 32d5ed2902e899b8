//! Connection security: the transport check made before the first RPC (so a wrong CA, a
//! refused client certificate or a closed port fails within the connect timeout, with a
//! message naming the cause), who we are to etcd, and the report for `anylock check`.
//! The wording of refusals and TLS failures is in `error.rs`.

use std::sync::Arc;
use std::time::Duration;

use anylock_tls::TlsMaterial;
use lockcore::{ConnectionSecurity, Error, ErrorKind, Result, TlsDetails, Transport, Verification};
use rustls::ClientConfig;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::error::tls_failure;

/// The HTTP/2 client preface and an empty SETTINGS frame: the server answers with its own
/// SETTINGS, so one byte read proves the server accepted the connection.
const H2_PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\x00\x00\x00\x04\x00\x00\x00\x00\x00";

/// `host:port` split for connecting: the host without IPv6 brackets, and the port.
pub(crate) fn split_host(host_port: &str) -> (String, u16) {
    let (host, port) = host_port.rsplit_once(':').unwrap_or((host_port, "2379"));
    let host = host.trim_start_matches('[').trim_end_matches(']');
    (host.to_owned(), port.parse().unwrap_or(crate::DEFAULT_PORT))
}

/// The rustls configuration the TLS check and the probe use: the `ca` file or the OS trust
/// store, full verification, the client certificate, HTTP/2 (gRPC) offered by ALPN.
pub(crate) fn rustls_config(material: &TlsMaterial) -> Result<ClientConfig> {
    let mut config = anylock_tls::client_config(material, Verification::Full)?;
    config.alpn_protocols = vec![b"h2".to_vec()];
    Ok(config)
}

/// Connects to `host_port` and, with `tls`, completes a TLS handshake and reads the
/// server's first HTTP/2 bytes. The read matters: with TLS 1.3 a server refuses a missing
/// or untrusted client certificate only after the client's side of the handshake is done.
///
/// # Errors
/// [`PermissionDenied`](ErrorKind::PermissionDenied) for a TLS failure (worded by
/// [`anylock_tls::diagnose`]), [`Unavailable`](ErrorKind::Unavailable) when the member
/// cannot be reached. The caller bounds the time.
pub(crate) async fn check_transport(
    host_port: &str,
    tls: Option<(Arc<ClientConfig>, bool)>,
) -> Result<()> {
    let (host, port) = split_host(host_port);
    let tcp = TcpStream::connect((host.as_str(), port))
        .await
        .map_err(|e| {
            Error::unavailable(format!("cannot connect to etcd at {host_port}: {e}")).with_source(e)
        })?;
    let Some((config, presented)) = tls else {
        return Ok(());
    };
    let name = rustls::pki_types::ServerName::try_from(host.clone()).map_err(|e| {
        Error::new(
            ErrorKind::Config,
            format!("`{host}` is not a TLS server name: {e}"),
        )
    })?;
    let failed = |e: std::io::Error| tls_failure(host_port, presented, e);
    let mut stream = tokio_rustls::TlsConnector::from(config)
        .connect(name, tcp)
        .await
        .map_err(failed)?;
    stream.write_all(H2_PREFACE).await.map_err(failed)?;
    stream.flush().await.map_err(failed)?;
    let mut first = [0u8; 1];
    match stream.read(&mut first).await.map_err(failed)? {
        0 => Err(Error::unavailable(format!(
            "etcd at {host_port} closed the connection right after the TLS handshake (does it \
             want a client certificate, URL parameters `cert` and `key`?)"
        ))),
        _ => Ok(()),
    }
}

/// Who we are to etcd, as far as the config tells: the URL's user, else the client
/// certificate's common name (etcd's user name with `--client-cert-auth`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Who {
    User(String),
    Certificate(Option<String>),
    Nobody,
}

impl Who {
    pub(crate) fn new(user: Option<&str>, material: &TlsMaterial) -> Self {
        match (user, material.client()) {
            (Some(user), _) => Self::User(user.to_owned()),
            (None, Some(client)) => Self::Certificate(common_name(client.cert_pem())),
            (None, None) => Self::Nobody,
        }
    }

    /// The user name for messages: the URL's user or the certificate's common name.
    pub(crate) fn user(&self) -> &str {
        match self {
            Self::User(user) | Self::Certificate(Some(user)) => user,
            _ => "<user>",
        }
    }

    /// For `anylock check`; `None` when nothing identifies us.
    pub(crate) fn describe(&self) -> Option<String> {
        match self {
            Self::User(user) => Some(format!("user \"{user}\" (password)")),
            Self::Certificate(Some(cn)) => Some(format!("client certificate CN={cn}")),
            Self::Certificate(None) => Some("client certificate (no common name)".to_owned()),
            Self::Nobody => None,
        }
    }
}

/// The report for one endpoint: TLS (with the version and cipher of a fresh handshake;
/// not connected when that handshake fails) or plaintext, and who we are.
pub(crate) async fn report(
    host_port: &str,
    tls: Option<(&TlsMaterial, ClientConfig)>,
    who: &Who,
    timeout: Duration,
) -> ConnectionSecurity {
    let transport = match tls {
        None => Transport::Plaintext,
        Some((material, config)) => {
            let (host, port) = split_host(host_port);
            let preamble = anylock_tls::Preamble::None;
            let probe = anylock_tls::probe(&host, port, &host, config, preamble, timeout).await;
            let details = TlsDetails::new(Verification::Full, material.client().is_some())
                .with_roots(anylock_tls::roots_description(material));
            match probe {
                Ok(n) => Transport::Tls(details.with_negotiated(Some(n.version), Some(n.cipher))),
                // The driver's connection to this member uses the same settings: it fails
                // the same way, so nothing was verified here.
                Err(err) => {
                    tracing::debug!(error = %err, endpoint = host_port, "TLS probe failed");
                    return ConnectionSecurity::new(
                        host_port,
                        Transport::NotConnected(err.message().to_owned()),
                    );
                }
            }
        }
    };
    let report = ConnectionSecurity::new(host_port, transport);
    match who.describe() {
        Some(identity) => report.with_identity(identity),
        None => report,
    }
}

/// The subject common name of the first certificate in `pem`, by a minimal DER walk
/// (Certificate → TBSCertificate → subject); `None` when absent or unparsable.
pub(crate) fn common_name(pem: &[u8]) -> Option<String> {
    use rustls::pki_types::CertificateDer;
    use rustls::pki_types::pem::PemObject;
    let der = CertificateDer::pem_slice_iter(pem).next()?.ok()?;
    let (_, cert, _) = der_tlv(&der)?;
    let (_, tbs, _) = der_tlv(cert)?;
    let mut rest = tbs;
    let mut fields = Vec::new();
    while !rest.is_empty() {
        let (tag, value, after) = der_tlv(rest)?;
        fields.push((tag, value));
        rest = after;
    }
    // [0] version is optional; then serial, signature, issuer, validity, subject.
    let skip = usize::from(fields.first()?.0 == 0xa0);
    let (_, subject) = *fields.get(skip + 4)?;
    let mut names = subject;
    let mut found = None;
    while !names.is_empty() {
        let (_, set, after) = der_tlv(names)?;
        let (_, attribute, _) = der_tlv(set)?;
        let (_, oid, value) = der_tlv(attribute)?;
        if oid == [0x55, 0x04, 0x03] {
            let (_, text, _) = der_tlv(value)?;
            found = Some(String::from_utf8_lossy(text).into_owned());
        }
        names = after;
    }
    found
}

/// One DER tag-length-value: (tag, value, the bytes after it).
fn der_tlv(bytes: &[u8]) -> Option<(u8, &[u8], &[u8])> {
    let tag = *bytes.first()?;
    let first = *bytes.get(1)?;
    let (len, header) = if first < 0x80 {
        (usize::from(first), 2)
    } else {
        let count = usize::from(first & 0x7f);
        if count == 0 || count > 4 {
            return None;
        }
        let len = bytes
            .get(2..2 + count)?
            .iter()
            .fold(0usize, |acc, b| (acc << 8) | usize::from(*b));
        (len, 2 + count)
    };
    let value = bytes.get(header..header.checked_add(len)?)?;
    Some((tag, value, &bytes[header + len..]))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn splits_hosts_for_connecting() {
        assert_eq!(split_host("h:1"), ("h".to_owned(), 1));
        assert_eq!(split_host("[::1]:2380"), ("::1".to_owned(), 2380));
    }

    #[test]
    fn who_we_are_is_described_without_a_password() {
        let who = Who::User("anylock".to_owned());
        assert_eq!(who.user(), "anylock");
        assert_eq!(Who::Nobody.describe(), None);
        assert_eq!(
            who.describe().as_deref(),
            Some("user \"anylock\" (password)")
        );
    }

    #[test]
    fn garbage_is_no_common_name() {
        assert_eq!(common_name(b"not pem"), None);
        assert_eq!(der_tlv(&[0x30, 0x85, 1, 1, 1, 1, 1]), None);
        assert_eq!(der_tlv(&[0x30, 0x05, 1]), None);
    }
}
