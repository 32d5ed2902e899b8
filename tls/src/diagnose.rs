//! [`diagnose`]: a TLS failure found in an error chain, worded for a person.

use lockcore::{Error, ErrorKind};

/// Finds a TLS failure in `err`'s source chain and words it as an error that names TLS,
/// what failed and what to do: [`Unavailable`](ErrorKind::Unavailable) for what another
/// attempt may not meet (a corrupted record, an unexpected message), else
/// [`PermissionDenied`](ErrorKind::PermissionDenied) (a refused certificate, either side's;
/// no common protocol); `None` when the chain holds no TLS failure. Context (backend, lock) is not
/// copied: add it as for any other error.
pub fn diagnose(err: &(dyn std::error::Error + 'static)) -> Option<Error> {
    let mut next = Some(err);
    while let Some(e) = next {
        if let Some(tls) = as_rustls(e) {
            return Some(explain(tls));
        }
        next = e.source();
    }
    None
}

fn as_rustls<'a>(e: &'a (dyn std::error::Error + 'static)) -> Option<&'a rustls::Error> {
    if let Some(tls) = e.downcast_ref::<rustls::Error>() {
        return Some(tls);
    }
    e.downcast_ref::<std::io::Error>()?
        .get_ref()?
        .downcast_ref::<rustls::Error>()
}

fn explain(err: &rustls::Error) -> Error {
    use rustls::{AlertDescription as Alert, CertificateError as Cert};
    let what = match err {
        rustls::Error::InvalidCertificate(cert) => match cert {
            Cert::UnknownIssuer => {
                "the server's certificate is not signed by a CA we trust (check the URL \
                 parameter `ca`: without it the OS trust store is used)"
                    .to_owned()
            }
            Cert::NotValidForName | Cert::NotValidForNameContext { .. } => {
                "the server's certificate is not valid for the host name in the URL (connect \
                 by a name the certificate lists)"
                    .to_owned()
            }
            Cert::Expired | Cert::ExpiredContext { .. } => {
                "the server's certificate has expired".to_owned()
            }
            Cert::NotValidYet | Cert::NotValidYetContext { .. } => {
                "the server's certificate is not valid yet (check both clocks)".to_owned()
            }
            Cert::Revoked => "the server's certificate is revoked".to_owned(),
            other => format!("the server's certificate was rejected: {other:?}"),
        },
        rustls::Error::AlertReceived(Alert::CertificateRequired) => {
            "the server requires a client certificate (URL parameters `cert` and `key`)".to_owned()
        }
        rustls::Error::AlertReceived(
            Alert::BadCertificate | Alert::UnknownCA | Alert::CertificateUnknown,
        ) => "the server rejected our client certificate (is it signed by a CA the server \
              trusts?)"
            .to_owned(),
        rustls::Error::AlertReceived(Alert::HandshakeFailure) => {
            "the server ended the handshake (often: it requires a client certificate, or no \
             common protocol version or cipher)"
                .to_owned()
        }
        // A corrupted record, a middlebox's garbage, a peer that misbehaved once: nothing
        // about who the server or client is, so worth another attempt (and a refresh that
        // meets it degrades the lease rather than losing it).
        rustls::Error::DecryptError
        | rustls::Error::InvalidMessage(_)
        | rustls::Error::PeerMisbehaved(_)
        | rustls::Error::AlertReceived(Alert::BadRecordMac | Alert::DecodeError) => {
            return Error::new(ErrorKind::Unavailable, format!("TLS failed: {err}"));
        }
        // A certificate refused by alert, no common version or protocol, a local setting:
        // another attempt meets the same.
        other => format!("{other}"),
    };
    Error::new(
        ErrorKind::PermissionDenied,
        format!("TLS handshake failed: {what}"),
    )
}
