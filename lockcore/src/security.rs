//! How a backend reaches its servers: transport security and the identity it presented, as
//! [`LockBackend::connection_security`](crate::LockBackend::connection_security) reports it
//! for `anylock check`.
//!
//! Nothing here holds a secret: identities are user names and certificate subjects, never
//! passwords, tokens or keys.

use std::fmt;

/// What one connection (one server, one Redlock node, one etcd endpoint) is protected by.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct ConnectionSecurity {
    /// `host:port` (or a path for a local store), with no credentials.
    pub endpoint: String,
    /// How bytes travel to the server.
    pub transport: Transport,
    /// Who the server knows us as: `None` when we sent no credentials.
    pub identity: Option<String>,
}

impl ConnectionSecurity {
    /// A report for `endpoint` over `transport`, with no identity.
    pub fn new(endpoint: impl Into<String>, transport: Transport) -> Self {
        Self {
            endpoint: endpoint.into(),
            transport,
            identity: None,
        }
    }

    /// The same report naming who we authenticated as (`user "app" (password)`).
    #[must_use]
    pub fn with_identity(mut self, identity: impl Into<String>) -> Self {
        self.identity = Some(identity.into());
        self
    }
}

/// How bytes travel between this process and the server.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Transport {
    /// No network: an in-process or on-disk store.
    Local,
    /// Plain TCP: anyone on the path can read and change the traffic, credentials included.
    Plaintext,
    /// TLS, as negotiated.
    Tls(TlsDetails),
    /// No working connection to report on (a Redlock node that is down, or refused us):
    /// why, in words that name no secret.
    NotConnected(String),
}

/// A negotiated TLS session.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct TlsDetails {
    /// `TLSv1.3`, when known.
    pub version: Option<String>,
    /// The cipher suite, when known.
    pub cipher: Option<String>,
    /// What was checked about the server's certificate.
    pub verification: Verification,
    /// Whether we presented a client certificate.
    pub client_certificate: bool,
    /// Which CAs the server's certificate may chain to, when known: `the ca file only`,
    /// `the OS trust store`, or both.
    pub roots: Option<String>,
}

impl TlsDetails {
    /// A session whose server was checked as `verification` says.
    pub fn new(verification: Verification, client_certificate: bool) -> Self {
        Self {
            version: None,
            cipher: None,
            verification,
            client_certificate,
            roots: None,
        }
    }

    /// The same session, naming the CAs the server's certificate was checked against.
    #[must_use]
    pub fn with_roots(mut self, roots: impl Into<String>) -> Self {
        self.roots = Some(roots.into());
        self
    }

    /// The same session with the protocol version and cipher suite a handshake reported.
    #[must_use]
    pub fn with_negotiated(mut self, version: Option<String>, cipher: Option<String>) -> Self {
        self.version = version;
        self.cipher = cipher;
        self
    }
}

/// What the client checked about the server's certificate.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Verification {
    /// Chain to a trusted root and the host name: an impostor needs a trusted CA's help.
    Full,
    /// Chain to a trusted root only (PostgreSQL's `verify-ca`): any server holding a
    /// certificate from that CA is accepted.
    ChainOnly,
    /// Nothing checked (`#insecure`, PostgreSQL's `require` without a root certificate):
    /// encrypted, but an impostor on the path is not detected.
    None,
}

impl fmt::Display for Transport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Local => f.write_str("local (no network)"),
            Self::Plaintext => f.write_str("PLAINTEXT (not encrypted, server not verified)"),
            Self::Tls(tls) => tls.fmt(f),
            Self::NotConnected(why) => write!(f, "NOT CONNECTED ({why})"),
        }
    }
}

impl fmt::Display for TlsDetails {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.version.as_deref().unwrap_or("TLS"))?;
        if let Some(cipher) = &self.cipher {
            write!(f, " ({cipher})")?;
        }
        let against = |f: &mut fmt::Formatter<'_>| match &self.roots {
            Some(roots) => write!(f, " against {roots}"),
            None => Ok(()),
        };
        match self.verification {
            Verification::Full => {
                f.write_str(", server certificate and host name verified")?;
                against(f)?;
            }
            Verification::ChainOnly => {
                f.write_str(", server certificate chain verified")?;
                against(f)?;
                f.write_str(", host name NOT checked")?;
            }
            Verification::None => f.write_str(", server NOT verified")?,
        }
        if self.client_certificate {
            f.write_str(", client certificate presented")?;
        }
        Ok(())
    }
}

impl fmt::Display for ConnectionSecurity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.endpoint, self.transport)?;
        match &self.identity {
            Some(identity) => write!(f, "; authenticated as {identity}"),
            None if matches!(
                self.transport,
                Transport::Local | Transport::NotConnected(_)
            ) =>
            {
                Ok(())
            }
            None => f.write_str("; no credentials sent"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reports_read_as_sentences() {
        let tls = TlsDetails::new(Verification::Full, true).with_negotiated(
            Some("TLSv1.3".into()),
            Some("TLS13_AES_128_GCM_SHA256".into()),
        );
        let report = ConnectionSecurity::new("127.0.0.1:6380", Transport::Tls(tls))
            .with_identity("user \"app\" (password)");
        assert_eq!(
            report.to_string(),
            "127.0.0.1:6380: TLSv1.3 (TLS13_AES_128_GCM_SHA256), server certificate and host \
             name verified, client certificate presented; authenticated as user \"app\" \
             (password)"
        );
        let plain = ConnectionSecurity::new("db:5432", Transport::Plaintext);
        assert_eq!(
            plain.to_string(),
            "db:5432: PLAINTEXT (not encrypted, server not verified); no credentials sent"
        );
        assert_eq!(
            TlsDetails::new(Verification::Full, false)
                .with_roots("the OS trust store")
                .to_string(),
            "TLS, server certificate and host name verified against the OS trust store"
        );
        let chain = TlsDetails::new(Verification::ChainOnly, false);
        assert_eq!(
            chain.to_string(),
            "TLS, server certificate chain verified, host name NOT checked"
        );
        assert_eq!(
            TlsDetails::new(Verification::None, false).to_string(),
            "TLS, server NOT verified"
        );
        assert_eq!(
            ConnectionSecurity::new("h:1", Transport::NotConnected("refused".into())).to_string(),
            "h:1: NOT CONNECTED (refused)"
        );
        assert_eq!(
            ConnectionSecurity::new("/tmp/l.db", Transport::Local).to_string(),
            "/tmp/l.db: local (no network)"
        );
    }
}
