//! How the backend reaches its endpoint: the check `connect` makes (a TCP connection, and
//! for `https` a TLS handshake verified against the OS trust store, the roots and verifier
//! reqwest uses on Linux), and what `anylock check` reports from the same check: the
//! transport, the negotiated TLS version and cipher, and who GCS knows us as.
//!
//! Nothing is sent over the checking connection, credentials least of all: the first lock
//! call is the first request.

use std::time::Duration;

use lockcore::{Error, Result, Transport};

use crate::auth::GcsAuth;
use crate::config::GcsConfig;
use crate::error::host_port;

/// Connects to the endpoint as `connect` does, within the request timeout (each step):
/// TCP, then for `https` one TLS handshake. [`Transport::Tls`] only when that handshake
/// verified the server's certificate and host name.
///
/// # Errors
/// [`Unavailable`](lockcore::ErrorKind::Unavailable) (temporary) when the endpoint cannot
/// be reached (refused, timed out, a name that does not resolve);
/// [`PermissionDenied`](lockcore::ErrorKind::PermissionDenied) (permanent) when the TLS
/// handshake fails (an untrusted, expired or misnamed certificate);
/// [`Config`](lockcore::ErrorKind::Config) for an `https` endpoint in a build without the
/// `tls` feature or with an empty OS trust store.
pub(crate) async fn reach(config: &GcsConfig) -> Result<Transport> {
    let endpoint = url::Url::parse(config.endpoint())
        .map_err(|e| Error::invalid_input(format!("bad GCS endpoint: {e}")))?;
    let host = endpoint.host_str().unwrap_or_default().to_owned();
    let port = endpoint.port_or_known_default().unwrap_or(443);
    let at = host_port(&endpoint);
    tcp(&host, port, &at, config.timeout()).await?;
    if endpoint.scheme() != "https" {
        return Ok(Transport::Plaintext);
    }
    handshake(&host, port, &at, config.timeout())
        .await
        .map(Transport::Tls)
}

/// One report for the endpoint: [`reach`]'s transport, or why it could not be reached.
pub(crate) async fn report(config: &GcsConfig) -> Result<Vec<lockcore::ConnectionSecurity>> {
    let endpoint = url::Url::parse(config.endpoint())
        .map_err(|e| Error::invalid_input(format!("bad GCS endpoint: {e}")))?;
    let transport = match reach(config).await {
        Ok(transport) => transport,
        Err(e) if e.kind() == lockcore::ErrorKind::InvalidInput => return Err(e),
        Err(e) => Transport::NotConnected(e.message().to_owned()),
    };
    let report = lockcore::ConnectionSecurity::new(host_port(&endpoint), transport);
    Ok(vec![match identity(config.auth()) {
        Some(identity) => report.with_identity(identity),
        None => report,
    }])
}

/// A TCP connection to `host:port` within `timeout`, closed at once.
async fn tcp(host: &str, port: u16, at: &str, timeout: Duration) -> Result<()> {
    let cannot = |why: String| Error::unavailable(format!("cannot connect to GCS at {at} ({why})"));
    match tokio::time::timeout(timeout, tokio::net::TcpStream::connect((host, port))).await {
        Ok(Ok(_)) => Ok(()),
        Ok(Err(e)) if e.kind() == std::io::ErrorKind::ConnectionRefused => {
            Err(cannot("connection refused".to_owned()).with_source(e))
        }
        Ok(Err(e)) => Err(cannot(e.to_string()).with_source(e)),
        Err(_) => Err(cannot(format!("timed out after {timeout:?}"))),
    }
}

/// One TLS handshake with `host:port`, verified against the OS trust store.
#[cfg(feature = "tls")]
async fn handshake(
    host: &str,
    port: u16,
    at: &str,
    timeout: Duration,
) -> Result<lockcore::TlsDetails> {
    let verification = lockcore::Verification::Full;
    let tls = anylock_tls::TlsFiles::default()
        .load()
        .and_then(|m| anylock_tls::client_config(&m, verification))?;
    let preamble = anylock_tls::Preamble::None;
    match anylock_tls::probe(host, port, host, tls, preamble, timeout).await {
        Ok(n) => Ok(lockcore::TlsDetails::new(verification, false)
            .with_roots("the OS trust store")
            .with_negotiated(Some(n.version), Some(n.cipher))),
        // anylock-tls words a failed handshake as `PermissionDenied`.
        Err(e) if e.kind() == lockcore::ErrorKind::PermissionDenied => Err(
            crate::error::tls_refused(&format!("GCS at {at}"), e.message()),
        ),
        Err(e) => Err(e),
    }
}

/// Without the `tls` feature an `https` endpoint cannot be used at all.
#[cfg(not(feature = "tls"))]
async fn handshake(_: &str, _: u16, at: &str, _: Duration) -> Result<lockcore::TlsDetails> {
    Err(Error::new(
        lockcore::ErrorKind::Config,
        format!(
            "GCS at {at} is https, and this build has no TLS (backend-gcs's feature `tls`, \
             on by default)"
        ),
    ))
}

/// Who GCS knows us as, in words that name no secret.
fn identity(auth: &GcsAuth) -> Option<String> {
    match auth {
        GcsAuth::None => None,
        GcsAuth::AccessToken(_) => Some("an OAuth access token (bearer)".to_owned()),
        GcsAuth::Google => Some("Google application-default credentials".to_owned()),
        GcsAuth::ServiceAccountKey(path) => Some(format!(
            "the credentials in {} (a service-account key or workload identity federation; \
             OAuth)",
            path.display()
        )),
        GcsAuth::TokenCommand(_) => {
            Some("an OAuth access token from GCS_TOKEN_COMMAND (bearer, renewed)".to_owned())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn identities_name_no_secret() {
        let token = GcsAuth::AccessToken("ya29.secret-token".to_owned());
        let said = identity(&token).expect("a bearer token is an identity");
        assert!(!said.contains("secret-token"), "{said}");
        assert_eq!(identity(&GcsAuth::None), None);
    }
}
