//! What `anylock check` reports about the connection: the transport the endpoint's scheme
//! decides, the negotiated TLS version and cipher, and who GCS knows us as.

use lockcore::{Error, Result};

use crate::auth::GcsAuth;
use crate::config::GcsConfig;

/// The endpoint's scheme decides the transport; an `https` endpoint gets one probe
/// handshake for the version and cipher (verified against the OS trust store, as reqwest
/// does).
pub(crate) async fn report(config: &GcsConfig) -> Result<Vec<lockcore::ConnectionSecurity>> {
    let endpoint = url::Url::parse(config.endpoint())
        .map_err(|e| Error::invalid_input(format!("bad GCS endpoint: {e}")))?;
    let host = endpoint.host_str().unwrap_or_default().to_owned();
    let port = endpoint.port_or_known_default().unwrap_or(443);
    let transport = if endpoint.scheme() == "https" {
        lockcore::Transport::Tls(tls_details(&host, port, config.timeout()).await)
    } else {
        lockcore::Transport::Plaintext
    };
    let report = lockcore::ConnectionSecurity::new(format!("{host}:{port}"), transport);
    Ok(vec![match identity(config.auth()) {
        Some(identity) => report.with_identity(identity),
        None => report,
    }])
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

#[cfg(feature = "tls")]
async fn tls_details(host: &str, port: u16, timeout: std::time::Duration) -> lockcore::TlsDetails {
    let details = lockcore::TlsDetails::new(lockcore::Verification::Full, false)
        .with_roots("the OS trust store");
    let config = anylock_tls::TlsFiles::default()
        .load()
        .and_then(|m| anylock_tls::client_config(&m, lockcore::Verification::Full));
    let Ok(config) = config else { return details };
    match anylock_tls::probe(
        host,
        port,
        host,
        config,
        anylock_tls::Preamble::None,
        timeout,
    )
    .await
    {
        Ok(n) => details.with_negotiated(Some(n.version), Some(n.cipher)),
        Err(_) => details,
    }
}

#[cfg(not(feature = "tls"))]
async fn tls_details(_: &str, _: u16, _: std::time::Duration) -> lockcore::TlsDetails {
    lockcore::TlsDetails::new(lockcore::Verification::Full, false)
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
