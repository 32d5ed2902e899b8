//! Configuration: endpoints, key prefix, credentials, TLS and timeouts, from a URL or
//! built by hand.

use std::path::PathBuf;
use std::time::Duration;

use anylock_tls::{TlsFiles, TlsMaterial};
use lockcore::Error;

mod display;
mod url;

/// The URL scheme of the etcd backend (plain HTTP/2).
pub(crate) const SCHEME: &str = "etcd";
/// The URL scheme of the etcd backend over TLS.
pub(crate) const TLS_SCHEME: &str = "etcds";
/// The port used when an endpoint names none.
pub const DEFAULT_PORT: u16 = 2379;
/// The environment variable [`EtcdConfig::from_env`] reads.
pub const URL_ENV: &str = "ANYLOCK_ETCD_URL";

/// Where the etcd backend connects and how.
///
/// The URL form is
/// `etcd://[user[:password]@]host[:port][,host[:port]…][/prefix][?option=value&…]`
/// (`etcds://` for TLS). Options: `tls=true|false`, `timeout=5s` (each request),
/// `connect_timeout=3s`, `ca=/path/ca.pem`, `cert=/path/client.pem`,
/// `key=/path/client-key.pem`. User, password, prefix and paths are percent-decoded
/// (write `@` in a password as `%40`).
///
/// The prefix is the path without its leading `/`; when it is not empty and does not end
/// in `/`, a `/` is appended. A lock named `N` then lives under `prefix + N + "/"`, so
/// `etcd://h:2379/locks` and `etcdctl lock locks/N` use the same keys (and with no path,
/// `etcdctl lock N` does). See the crate docs for the full layout.
///
/// ```
/// use backend_etcd::EtcdConfig;
/// let config = EtcdConfig::from_url("etcd://app:s3cret@10.0.0.1,10.0.0.2:2380/locks?timeout=2s")?;
/// assert_eq!(config.endpoints(), ["http://10.0.0.1:2379", "http://10.0.0.2:2380"]);
/// assert_eq!(config.prefix(), "locks/");
/// assert_eq!(config.to_string(), "etcd://app:***@10.0.0.1:2379,10.0.0.2:2380/locks/?timeout=2s");
/// # Ok::<(), lockcore::Error>(())
/// ```
#[derive(Clone, PartialEq, Eq)]
pub struct EtcdConfig {
    hosts: Vec<String>,
    prefix: String,
    user: Option<String>,
    password: Option<String>,
    tls: bool,
    tls_files: TlsFiles,
    request_timeout: Duration,
    connect_timeout: Duration,
}

impl EtcdConfig {
    /// A config for `endpoints` (`host:port`, or `http://host:port`), no prefix, no auth,
    /// no TLS, 5 s request timeout, 3 s connect timeout.
    ///
    /// # Errors
    /// [`ErrorKind::InvalidInput`](lockcore::ErrorKind::InvalidInput) when the list is
    /// empty or an endpoint is malformed.
    pub fn new<S: AsRef<str>>(endpoints: impl IntoIterator<Item = S>) -> Result<Self, Error> {
        let mut tls = false;
        let mut hosts = Vec::new();
        for endpoint in endpoints {
            let endpoint = endpoint.as_ref().trim();
            let host = if let Some(rest) = endpoint.strip_prefix("https://") {
                tls = true;
                rest
            } else {
                endpoint.strip_prefix("http://").unwrap_or(endpoint)
            };
            hosts.push(parse_host(host.trim_end_matches('/'))?);
        }
        if hosts.is_empty() {
            return Err(Error::invalid_input(
                "an etcd config needs at least one endpoint",
            ));
        }
        Ok(Self {
            hosts,
            prefix: String::new(),
            user: None,
            password: None,
            tls,
            tls_files: TlsFiles::default(),
            request_timeout: Duration::from_secs(5),
            connect_timeout: Duration::from_secs(3),
        })
    }

    /// Sets the key prefix. A non-empty prefix that does not end in `/` gets one appended.
    pub fn with_prefix(mut self, prefix: &str) -> Self {
        self.prefix = prefix.to_owned();
        if !self.prefix.is_empty() && !self.prefix.ends_with('/') {
            self.prefix.push('/');
        }
        self
    }

    /// Authenticates as `user` with `password`.
    pub fn with_user(mut self, user: impl Into<String>, password: impl Into<String>) -> Self {
        self.user = Some(user.into());
        self.password = Some(password.into());
        self
    }

    /// Uses TLS (the system's root certificates unless [`with_ca`](Self::with_ca) is set).
    pub fn with_tls(mut self, tls: bool) -> Self {
        self.tls = tls;
        self
    }

    /// Trusts only the PEM CA certificates at `path` instead of the OS trust store
    /// (implies TLS).
    pub fn with_ca(mut self, path: impl Into<PathBuf>) -> Self {
        self.tls_files = self.tls_files.with_ca(path);
        self.tls = true;
        self
    }

    /// Presents the PEM client certificate and key at these paths (mutual TLS; implies TLS).
    pub fn with_client_cert(mut self, cert: impl Into<PathBuf>, key: impl Into<PathBuf>) -> Self {
        self.tls_files = self.tls_files.with_client_cert(cert, key);
        self.tls = true;
        self
    }

    /// Bounds every request (default 5 s). A write that times out is
    /// [`OutcomeUnknown`](lockcore::ErrorKind::OutcomeUnknown).
    pub fn with_request_timeout(mut self, timeout: Duration) -> Self {
        self.request_timeout = timeout;
        self
    }

    /// Bounds connection set-up (default 3 s).
    pub fn with_connect_timeout(mut self, timeout: Duration) -> Self {
        self.connect_timeout = timeout;
        self
    }

    /// The endpoint URLs the client connects to (`http://` or `https://`).
    pub fn endpoints(&self) -> Vec<String> {
        let scheme = if self.tls { "https" } else { "http" };
        self.hosts
            .iter()
            .map(|host| format!("{scheme}://{host}"))
            .collect()
    }

    /// The members as `host:port`.
    pub fn hosts(&self) -> &[String] {
        &self.hosts
    }

    /// The key prefix: empty or ending in `/`.
    pub fn prefix(&self) -> &str {
        &self.prefix
    }

    /// The user name and password, when set.
    pub fn credentials(&self) -> Option<(&str, &str)> {
        let user = self.user.as_deref()?;
        Some((user, self.password.as_deref().unwrap_or("")))
    }

    /// Whether TLS is used.
    pub fn tls(&self) -> bool {
        self.tls
    }

    /// The CA certificate path, when set.
    pub fn ca(&self) -> Option<&std::path::Path> {
        self.tls_files.ca()
    }

    /// The client certificate and key paths, when set.
    pub fn client_cert(&self) -> Option<(&std::path::Path, &std::path::Path)> {
        Some((self.tls_files.cert()?, self.tls_files.key()?))
    }

    /// The `ca`, `cert` and `key` files.
    pub fn tls_files(&self) -> &TlsFiles {
        &self.tls_files
    }

    /// Reads and checks the TLS files (see [`TlsFiles::load`]); empty material without TLS.
    ///
    /// # Errors
    /// [`ErrorKind::Config`](lockcore::ErrorKind::Config) naming the URL parameter and the
    /// path of a missing or unreadable file, a file that is not PEM, or a certificate
    /// without its key.
    pub fn load_tls(&self) -> Result<TlsMaterial, Error> {
        if !self.tls {
            // Builders cannot put files on a plaintext config; a URL is refused earlier.
            self.tls_files.refuse_on_plaintext(SCHEME, TLS_SCHEME)?;
            return Ok(TlsMaterial::default());
        }
        self.tls_files.load()
    }

    /// The per-request timeout.
    pub fn request_timeout(&self) -> Duration {
        self.request_timeout
    }

    /// The connect timeout.
    pub fn connect_timeout(&self) -> Duration {
        self.connect_timeout
    }
}

/// Validates `host[:port]` (IPv6 in brackets) and adds the default port.
fn parse_host(host: &str) -> Result<String, Error> {
    let bad = |why: &str| Error::invalid_input(format!("bad etcd endpoint {host:?}: {why}"));
    if host.is_empty() {
        return Err(bad("empty host"));
    }
    if host.contains(['@', '/', '?', '#', ' ']) {
        return Err(bad("unexpected character"));
    }
    let (name, port) = if let Some(rest) = host.strip_prefix('[') {
        let (ip, after) = rest.split_once(']').ok_or_else(|| bad("unclosed '['"))?;
        (format!("[{ip}]"), after.strip_prefix(':'))
    } else {
        match host.rsplit_once(':') {
            Some((name, port)) => (name.to_owned(), Some(port)),
            None => (host.to_owned(), None),
        }
    };
    if name.is_empty() || name.contains(':') && !name.starts_with('[') {
        return Err(bad("malformed host name"));
    }
    let port = match port {
        Some(p) => p
            .parse::<u16>()
            .map_err(|_| bad("port is not a number 0-65535"))?,
        None => DEFAULT_PORT,
    };
    Ok(format!("{name}:{port}"))
}

#[cfg(test)]
mod config_tests;
