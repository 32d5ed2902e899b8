//! The TLS settings every anylock network backend reads the same way.
//!
//! - [`TlsFiles`]: the URL parameters `ca`, `cert` and `key` (file paths), identical on
//!   every backend. Without `ca` the OS trust store is used; with it, only that file's CAs
//!   are trusted (as libpq's `sslrootcert` does).
//! - [`TlsFiles::load`] reads and checks the files before any connection, so a missing file,
//!   a file that is not PEM or a certificate without its key is a
//!   [`Config`](lockcore::ErrorKind::Config) error naming the parameter and the path.
//! - [`client_config`] builds the rustls configuration those settings mean, for a backend
//!   that connects through rustls itself and for [`probe`].
//! - [`probe`] makes one TLS handshake to report the negotiated version and cipher suite
//!   (`anylock check`).
//! - [`diagnose`] finds a TLS failure in an error chain and words it for a person: an
//!   untrusted or misnamed server certificate, a client certificate the server wanted or
//!   refused. Those are [`PermissionDenied`](lockcore::ErrorKind::PermissionDenied): the
//!   peers did not authenticate each other, so retrying cannot help.
//!
//! ```
//! let mut files = anylock_tls::TlsFiles::default();
//! assert!(files.take_param("ca", "/etc/anylock/ca.pem")?);
//! assert!(!files.take_param("prefix", "x")?);
//! assert_eq!(files.ca().map(|p| p.display().to_string()).as_deref(), Some("/etc/anylock/ca.pem"));
//! # Ok::<(), lockcore::Error>(())
//! ```

use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use lockcore::{Error, ErrorKind, Result, Verification};
use rustls::client::WebPkiServerVerifier;
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName, UnixTime};
use rustls::{ClientConfig, DigitallySignedStruct, RootCertStore, SignatureScheme};

/// The URL parameters [`TlsFiles::take_param`] reads, for "known parameters" messages.
pub const PARAMS: &str = "ca, cert, key";

/// Paths from the `ca`, `cert` and `key` URL parameters.
#[derive(Clone, Default, PartialEq, Eq)]
pub struct TlsFiles {
    ca: Option<PathBuf>,
    cert: Option<PathBuf>,
    key: Option<PathBuf>,
}

impl TlsFiles {
    /// Takes the URL parameter `name=value` when it is one of `ca`, `cert`, `key`.
    ///
    /// # Errors
    /// [`InvalidInput`](ErrorKind::InvalidInput) for an empty path or a parameter given
    /// twice.
    pub fn take_param(&mut self, name: &str, value: &str) -> Result<bool> {
        let slot = match name {
            "ca" => &mut self.ca,
            "cert" => &mut self.cert,
            "key" => &mut self.key,
            _ => return Ok(false),
        };
        if value.is_empty() {
            return Err(Error::invalid_input(format!(
                "URL parameter `{name}` needs a file path"
            )));
        }
        if slot.is_some() {
            return Err(Error::invalid_input(format!(
                "URL parameter `{name}` is given twice"
            )));
        }
        *slot = Some(PathBuf::from(value));
        Ok(true)
    }

    /// Sets the CA file (builder style, for code that does not start from a URL).
    #[must_use]
    pub fn with_ca(mut self, path: impl Into<PathBuf>) -> Self {
        self.ca = Some(path.into());
        self
    }

    /// Sets the client certificate and its key.
    #[must_use]
    pub fn with_client_cert(mut self, cert: impl Into<PathBuf>, key: impl Into<PathBuf>) -> Self {
        self.cert = Some(cert.into());
        self.key = Some(key.into());
        self
    }

    /// The CA file, when given.
    pub fn ca(&self) -> Option<&Path> {
        self.ca.as_deref()
    }

    /// The client certificate file, when given.
    pub fn cert(&self) -> Option<&Path> {
        self.cert.as_deref()
    }

    /// The client key file, when given.
    pub fn key(&self) -> Option<&Path> {
        self.key.as_deref()
    }

    /// No parameter was given.
    pub fn is_empty(&self) -> bool {
        self.ca.is_none() && self.cert.is_none() && self.key.is_none()
    }

    /// The given parameters as `name=path` pairs, for a URL's `Display`.
    pub fn params(&self) -> Vec<(&'static str, String)> {
        [("ca", &self.ca), ("cert", &self.cert), ("key", &self.key)]
            .into_iter()
            .filter_map(|(name, path)| Some((name, path.as_ref()?.display().to_string())))
            .collect()
    }

    /// Refuses TLS parameters on a plaintext URL: they would be ignored, and the user who
    /// wrote them expects an encrypted, verified connection.
    ///
    /// # Errors
    /// [`Config`](ErrorKind::Config) naming the parameters and the TLS scheme to use.
    pub fn refuse_on_plaintext(&self, scheme: &str, tls_scheme: &str) -> Result<()> {
        let given: Vec<&str> = self.params().into_iter().map(|(name, _)| name).collect();
        if given.is_empty() {
            return Ok(());
        }
        Err(Error::new(
            ErrorKind::Config,
            format!(
                "TLS parameter(s) {} given on a plaintext `{scheme}://` URL, which would send \
                 everything (credentials included) unencrypted; use `{tls_scheme}://` for TLS",
                given.join(", ")
            ),
        ))
    }

    /// Reads and checks the files: each exists and is readable, `ca` and `cert` hold PEM
    /// certificates, `key` holds one PEM private key, and `cert` and `key` come together.
    ///
    /// # Errors
    /// [`Config`](ErrorKind::Config) naming the parameter, the path and what is wrong.
    pub fn load(&self) -> Result<TlsMaterial> {
        if self.cert.is_some() != self.key.is_some() {
            return Err(Error::new(
                ErrorKind::Config,
                "a client certificate needs both URL parameters `cert` (the certificate) and \
                 `key` (its private key)",
            ));
        }
        let ca = match &self.ca {
            Some(path) => Some(read_certificates("ca", path)?),
            None => None,
        };
        let client = match (&self.cert, &self.key) {
            (Some(cert), Some(key)) => Some(ClientIdentity {
                cert_pem: read_certificates("cert", cert)?.pem,
                key_pem: read_key(key)?,
            }),
            _ => None,
        };
        Ok(TlsMaterial { ca, client })
    }
}

impl fmt::Debug for TlsFiles {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TlsFiles")
            .field("ca", &self.ca)
            .field("cert", &self.cert)
            .field("key", &self.key)
            .finish()
    }
}

/// PEM certificates read from a file, checked to parse.
#[derive(Clone)]
pub struct PemCertificates {
    pem: Vec<u8>,
    ders: Vec<CertificateDer<'static>>,
}

impl PemCertificates {
    /// The file's bytes (PEM), for drivers that take PEM.
    pub fn pem(&self) -> &[u8] {
        &self.pem
    }

    /// The certificates, DER encoded.
    pub fn ders(&self) -> &[CertificateDer<'static>] {
        &self.ders
    }
}

impl fmt::Debug for PemCertificates {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "PemCertificates({} certificates)", self.ders.len())
    }
}

/// A client certificate chain and its private key (PEM).
#[derive(Clone)]
pub struct ClientIdentity {
    cert_pem: Vec<u8>,
    key_pem: Vec<u8>,
}

impl ClientIdentity {
    /// The certificate chain, PEM.
    pub fn cert_pem(&self) -> &[u8] {
        &self.cert_pem
    }

    /// The private key, PEM. A secret: never log it.
    pub fn key_pem(&self) -> &[u8] {
        &self.key_pem
    }
}

impl fmt::Debug for ClientIdentity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("ClientIdentity { key: <redacted> }")
    }
}

/// What [`TlsFiles::load`] read: the CA certificates and the client identity, when given.
#[derive(Clone, Debug, Default)]
pub struct TlsMaterial {
    ca: Option<PemCertificates>,
    client: Option<ClientIdentity>,
}

impl TlsMaterial {
    /// The CA certificates from `ca`; `None` means the OS trust store.
    pub fn ca(&self) -> Option<&PemCertificates> {
        self.ca.as_ref()
    }

    /// The client certificate and key from `cert` and `key`.
    pub fn client(&self) -> Option<&ClientIdentity> {
        self.client.as_ref()
    }
}

/// The largest certificate or key file read: a CA bundle of every public root is about
/// 250 KiB.
pub const MAX_FILE_LEN: u64 = 4 << 20;

/// Reads a regular file of at most [`MAX_FILE_LEN`] bytes: a FIFO would block forever and
/// `/dev/zero` would fill memory.
fn read_file(param: &str, path: &Path) -> Result<Vec<u8>> {
    use std::io::Read as _;
    let refuse = |why: String| {
        Error::new(
            ErrorKind::Config,
            format!(
                "cannot read the file of URL parameter `{param}` ({}): {why}",
                path.display()
            ),
        )
    };
    let meta = std::fs::metadata(path).map_err(|e| refuse(e.to_string()))?;
    if !meta.is_file() {
        return Err(refuse("not a regular file".to_owned()));
    }
    if meta.len() > MAX_FILE_LEN {
        return Err(refuse(format!(
            "{} bytes, more than a certificate file holds ({MAX_FILE_LEN} at most)",
            meta.len()
        )));
    }
    let mut bytes = Vec::new();
    std::fs::File::open(path)
        .and_then(|f| f.take(MAX_FILE_LEN + 1).read_to_end(&mut bytes))
        .map_err(|e| refuse(e.to_string()))?;
    if bytes.len() as u64 > MAX_FILE_LEN {
        return Err(refuse("it grew while being read".to_owned()));
    }
    Ok(bytes)
}

fn read_certificates(param: &str, path: &Path) -> Result<PemCertificates> {
    let pem = read_file(param, path)?;
    let ders = CertificateDer::pem_slice_iter(&pem)
        .collect::<std::result::Result<Vec<_>, _>>()
        .map_err(|e| not_pem(param, path, &e.to_string()))?;
    if ders.is_empty() {
        return Err(not_pem(
            param,
            path,
            "no `-----BEGIN CERTIFICATE-----` block",
        ));
    }
    for der in &ders {
        // Parse each one now: a truncated certificate fails here, not in a handshake.
        rustls::server::ParsedCertificate::try_from(der)
            .map_err(|e| not_pem(param, path, &format!("a certificate does not parse: {e}")))?;
    }
    Ok(PemCertificates { pem, ders })
}

fn read_key(path: &Path) -> Result<Vec<u8>> {
    let pem = read_file("key", path)?;
    PrivateKeyDer::from_pem_slice(&pem).map_err(|e| {
        not_pem(
            "key",
            path,
            &format!("no PEM private key (PKCS#8, PKCS#1 or SEC1): {e}"),
        )
    })?;
    Ok(pem)
}

fn not_pem(param: &str, path: &Path, what: &str) -> Error {
    Error::new(
        ErrorKind::Config,
        format!(
            "the file of URL parameter `{param}` ({}) is not usable PEM: {what}",
            path.display()
        ),
    )
}

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

/// Verifies the chain but not the name (`ChainOnly`), or nothing (`None`). Signatures over
/// the handshake are always checked, so the peer holds the certificate's key.
#[derive(Debug)]
struct LaxVerifier {
    inner: Arc<WebPkiServerVerifier>,
    check_chain: bool,
    provider: Arc<rustls::crypto::CryptoProvider>,
}

impl ServerCertVerifier for LaxVerifier {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp_response: &[u8],
        now: UnixTime,
    ) -> std::result::Result<ServerCertVerified, rustls::Error> {
        if !self.check_chain {
            return Ok(ServerCertVerified::assertion());
        }
        match self.inner.verify_server_cert(
            end_entity,
            intermediates,
            server_name,
            ocsp_response,
            now,
        ) {
            Err(rustls::Error::InvalidCertificate(rustls::CertificateError::NotValidForName))
            | Err(rustls::Error::InvalidCertificate(
                rustls::CertificateError::NotValidForNameContext { .. },
            )) => Ok(ServerCertVerified::assertion()),
            other => other,
        }
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> std::result::Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(
            message,
            cert,
            dss,
            &self.provider.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> std::result::Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(
            message,
            cert,
            dss,
            &self.provider.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.inner.supported_verify_schemes()
    }
}

/// Bytes a server expects before the TLS handshake on the same connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Preamble {
    /// TLS from the first byte (Redis, etcd, HTTPS).
    None,
    /// PostgreSQL's `SSLRequest`: the server answers `S` and the handshake follows.
    Postgres,
}

/// The outcome of one handshake: protocol version and cipher suite, as rustls names them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Negotiated {
    /// `TLSv1.3`.
    pub version: String,
    /// `TLS13_AES_256_GCM_SHA384`.
    pub cipher: String,
}

/// Makes one TLS handshake with `host:port` (checking the server as `config` says, under the
/// name `server_name`) and reports what was negotiated. No credentials are sent beyond the
/// client certificate, and the connection is closed straight away.
///
/// # Errors
/// [`Unavailable`](ErrorKind::Unavailable) when the server is unreachable or `timeout`
/// passes; a TLS failure as [`diagnose`] words it.
pub async fn probe(
    host: &str,
    port: u16,
    server_name: &str,
    config: ClientConfig,
    preamble: Preamble,
    timeout: Duration,
) -> Result<Negotiated> {
    let name = ServerName::try_from(server_name.to_owned()).map_err(|e| {
        Error::invalid_input(format!("`{server_name}` is not a TLS server name: {e}"))
    })?;
    let attempt = async {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let mut tcp = tokio::net::TcpStream::connect((host, port))
            .await
            .map_err(|e| {
                Error::unavailable(format!("cannot connect to {host}:{port}")).with_source(e)
            })?;
        if preamble == Preamble::Postgres {
            // Length 8, then the SSLRequest code 1234.5679.
            tcp.write_all(&[0, 0, 0, 8, 0x04, 0xd2, 0x16, 0x2f])
                .await
                .map_err(|e| Error::unavailable("SSLRequest not sent").with_source(e))?;
            let mut answer = [0u8; 1];
            tcp.read_exact(&mut answer)
                .await
                .map_err(|e| Error::unavailable("no answer to SSLRequest").with_source(e))?;
            if answer[0] != b'S' {
                return Err(Error::new(
                    ErrorKind::Config,
                    format!("{host}:{port} does not offer TLS (ssl = off on the server)"),
                ));
            }
        }
        let connector = tokio_rustls::TlsConnector::from(Arc::new(config));
        let stream = connector.connect(name, tcp).await.map_err(|e| {
            let wrapped = Error::unavailable(format!("TLS handshake with {host}:{port} failed"))
                .with_source(e);
            diagnose(&wrapped).unwrap_or(wrapped)
        })?;
        let (_, session) = stream.get_ref();
        Ok(Negotiated {
            version: session
                .protocol_version()
                .map_or_else(|| "unknown".to_owned(), version_name),
            cipher: session
                .negotiated_cipher_suite()
                .map_or_else(|| "unknown".to_owned(), |c| format!("{:?}", c.suite())),
        })
    };
    tokio::time::timeout(timeout, attempt)
        .await
        .unwrap_or_else(|_| {
            Err(Error::unavailable(format!(
                "no TLS handshake with {host}:{port} within {timeout:?}"
            )))
        })
}

/// `TLSv1.3` for rustls's `TLSv1_3`.
fn version_name(version: rustls::ProtocolVersion) -> String {
    format!("{version:?}").replace('_', ".")
}

/// Finds a TLS failure in `err`'s source chain and words it as a
/// [`PermissionDenied`](ErrorKind::PermissionDenied) error that names TLS, what failed and
/// what to do; `None` when the chain holds no TLS failure. Context (backend, lock) is not
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
        other => format!("{other}"),
    };
    Error::new(
        ErrorKind::PermissionDenied,
        format!("TLS handshake failed: {what}"),
    )
}

#[cfg(test)]
mod tests;
