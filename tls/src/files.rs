//! [`TlsFiles`]: the `ca`, `cert` and `key` URL parameters, and the checked reading of the
//! files they name into [`TlsMaterial`].

use std::fmt;
use std::path::{Path, PathBuf};

use lockcore::{Error, ErrorKind, Result};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};

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

/// Reads a regular file of at most [`MAX_FILE_LEN`] bytes.
fn read_file(param: &str, path: &Path) -> Result<Vec<u8>> {
    read_regular_file(path, MAX_FILE_LEN).map_err(|e| {
        Error::new(
            ErrorKind::Config,
            format!(
                "cannot read the file of URL parameter `{param}` ({}): {e}",
                path.display()
            ),
        )
    })
}

/// Reads `path` whole if it is a regular file of at most `limit` bytes: a FIFO would
/// block for ever and `/dev/zero` would fill memory. The file is opened without blocking
/// and judged on what was opened, so a path swapped for a FIFO after a check cannot hang
/// the read. The error (`InvalidData` for what is refused) names the limit.
///
/// # Errors
/// The open's or the read's, or a refusal: not a regular file, or longer than `limit`.
pub fn read_regular_file(path: &Path, limit: u64) -> std::io::Result<Vec<u8>> {
    use std::io::Read as _;
    let refuse = |why: String| std::io::Error::new(std::io::ErrorKind::InvalidData, why);
    let file = open_nonblocking(path)?;
    let meta = file.metadata()?;
    if !meta.is_file() {
        return Err(refuse("not a regular file".to_owned()));
    }
    if meta.len() > limit {
        return Err(refuse(format!(
            "{} bytes, more than the {limit} such a file may hold",
            meta.len()
        )));
    }
    let mut bytes = Vec::new();
    file.take(limit + 1).read_to_end(&mut bytes)?;
    if bytes.len() as u64 > limit {
        return Err(refuse(format!(
            "it grew past {limit} bytes while being read"
        )));
    }
    Ok(bytes)
}

#[cfg(unix)]
fn open_nonblocking(path: &Path) -> std::io::Result<std::fs::File> {
    use std::os::unix::fs::OpenOptionsExt as _;
    (std::fs::OpenOptions::new().read(true))
        .custom_flags(libc::O_NONBLOCK | libc::O_NOCTTY)
        .open(path)
}

#[cfg(not(unix))]
fn open_nonblocking(path: &Path) -> std::io::Result<std::fs::File> {
    std::fs::File::open(path)
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
