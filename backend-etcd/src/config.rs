//! Configuration: endpoints, key prefix, credentials, TLS and timeouts, from a URL or
//! built by hand.

use std::fmt;
use std::path::PathBuf;

use anylock_tls::{TlsFiles, TlsMaterial};
use std::time::Duration;

use lockcore::Error;

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

    /// Parses an `etcd://` or `etcds://` URL (see the type docs).
    ///
    /// # Errors
    /// [`ErrorKind::InvalidInput`](lockcore::ErrorKind::InvalidInput) for another scheme, a
    /// malformed host, an unknown option or a bad option value. Messages never contain the
    /// password.
    pub fn from_url(url: &str) -> Result<Self, Error> {
        let (tls, rest) = if let Some(rest) = url.strip_prefix("etcds://") {
            (true, rest)
        } else if let Some(rest) = url.strip_prefix("etcd://") {
            (false, rest)
        } else {
            let scheme = url.split_once("://").map_or("", |(s, _)| s);
            return Err(Error::invalid_input(format!(
                "not an etcd URL (scheme {scheme:?}; expected {SCHEME}:// or {TLS_SCHEME}://)"
            )));
        };
        let (rest, query) = rest.split_once('?').unwrap_or((rest, ""));
        let (authority, path) = rest.split_once('/').unwrap_or((rest, ""));
        let (userinfo, hosts) = match authority.split_once('@') {
            Some((userinfo, hosts)) => (Some(userinfo), hosts),
            None => (None, authority),
        };
        if hosts.contains('@') {
            // Never echo the authority: it holds passwords.
            return Err(Error::invalid_input(
                "etcd URL credentials go once, before the first host \
                 (etcd://user:password@h1,h2); percent-encode '@' as %40",
            ));
        }
        let endpoints = Self::new(hosts.split(',')).map_err(|err| {
            // A raw '/' or '?' in a password ends the host list before its '@' (`u:pa/ss@h`):
            // then the "host" holds part of the password and must not be echoed.
            if userinfo.is_none() && (path.contains('@') || query.contains('@')) {
                Error::invalid_input(
                    "malformed etcd URL host list; percent-encode '/', '?', '#' and '@' \
                     in a password (%2F, %3F, %23, %40)",
                )
            } else {
                err
            }
        })?;
        let mut config = endpoints.with_prefix(&decode(path, "prefix")?);
        config.tls = tls;
        if let Some(userinfo) = userinfo {
            let (user, password) = userinfo.split_once(':').unwrap_or((userinfo, ""));
            config.user = Some(decode(user, "user name")?);
            config.password = Some(decode(password, "password")?);
        }
        for pair in query.split('&').filter(|p| !p.is_empty()) {
            let (option, value) = pair.split_once('=').unwrap_or((pair, ""));
            config.apply_option(option, &decode(value, option)?)?;
        }
        if tls && !config.tls {
            return Err(Error::new(
                lockcore::ErrorKind::Config,
                "`tls=false` on an `etcds://` URL asks for TLS and plaintext at once; use \
                 `etcd://` for plaintext",
            ));
        }
        if !config.tls {
            config.tls_files.refuse_on_plaintext(SCHEME, TLS_SCHEME)?;
        }
        Ok(config)
    }

    /// Reads the URL from `ANYLOCK_ETCD_URL`.
    ///
    /// # Errors
    /// [`ErrorKind::Config`](lockcore::ErrorKind::Config) when the variable is unset; as
    /// [`from_url`](Self::from_url) otherwise.
    pub fn from_env() -> Result<Self, Error> {
        match std::env::var(URL_ENV) {
            Ok(url) if !url.trim().is_empty() => Self::from_url(url.trim()),
            _ => Err(Error::new(
                lockcore::ErrorKind::Config,
                format!("{URL_ENV} is not set (expected an etcd:// URL)"),
            )),
        }
    }

    fn apply_option(&mut self, option: &str, value: &str) -> Result<(), Error> {
        match option {
            "tls" => self.tls = parse_bool(value)?,
            "timeout" => self.request_timeout = parse_duration(option, value)?,
            "connect_timeout" => self.connect_timeout = parse_duration(option, value)?,
            _ if self.tls_files.take_param(option, value)? => {}
            // An option with '@' is most likely the end of a password with a raw '?'.
            other if other.contains('@') => {
                return Err(Error::invalid_input(
                    "unknown etcd URL parameter (not shown: it holds '@'; percent-encode '?' \
                     and '@' in a password as %3F and %40)",
                ));
            }
            other => {
                return Err(Error::invalid_input(format!(
                    "unknown etcd URL parameter {other:?} (known: tls, timeout, connect_timeout, \
                     ca, cert, key)"
                )));
            }
        }
        Ok(())
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
        self.tls_files.load().map_err(|e| e.with_backend("etcd"))
    }

    /// The per-request timeout.
    pub fn request_timeout(&self) -> Duration {
        self.request_timeout
    }

    /// The connect timeout.
    pub fn connect_timeout(&self) -> Duration {
        self.connect_timeout
    }

    fn options_for_display(&self) -> Vec<String> {
        let mut options = Vec::new();
        let default = Self::new(["x"]).expect("a literal endpoint is valid");
        if self.request_timeout != default.request_timeout {
            options.push(format!("timeout={}", show_duration(self.request_timeout)));
        }
        if self.connect_timeout != default.connect_timeout {
            options.push(format!(
                "connect_timeout={}",
                show_duration(self.connect_timeout)
            ));
        }
        for (name, path) in self.tls_files.params() {
            options.push(format!("{name}={}", escape(&path, "&?")));
        }
        options
    }
}

/// Shows the config as a URL with the password replaced by `***`; with the password put
/// back, it parses to the same config.
impl fmt::Display for EtcdConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let scheme = if self.tls { TLS_SCHEME } else { SCHEME };
        write!(f, "{scheme}://")?;
        if let Some(user) = &self.user {
            f.write_str(&escape(user, "@:/?"))?;
            if self.password.as_deref().is_some_and(|p| !p.is_empty()) {
                f.write_str(":***")?;
            }
            f.write_str("@")?;
        }
        write!(f, "{}/{}", self.hosts.join(","), escape(&self.prefix, "?"))?;
        let options = self.options_for_display();
        if !options.is_empty() {
            write!(f, "?{}", options.join("&"))?;
        }
        Ok(())
    }
}

impl fmt::Debug for EtcdConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("EtcdConfig")
            .field("endpoints", &self.endpoints())
            .field("prefix", &self.prefix)
            .field("user", &self.user)
            .field("password", &self.password.as_ref().map(|_| "***"))
            .field("tls", &self.tls)
            .field("tls_files", &self.tls_files)
            .field("request_timeout", &self.request_timeout)
            .field("connect_timeout", &self.connect_timeout)
            .finish()
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

fn parse_bool(value: &str) -> Result<bool, Error> {
    match value {
        "true" | "1" | "yes" | "" => Ok(true),
        "false" | "0" | "no" => Ok(false),
        other => Err(Error::invalid_input(format!(
            "tls must be true or false, got {other:?}"
        ))),
    }
}

/// `250ms`, `5s`, `2m`, or a plain number of seconds.
fn parse_duration(option: &str, value: &str) -> Result<Duration, Error> {
    let bad = || {
        Error::invalid_input(format!(
            "{option} must be a positive duration like 500ms, 5s or 1m, got {value:?}"
        ))
    };
    let split = value
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(value.len());
    let (number, unit) = value.split_at(split);
    let number: u64 = number.parse().map_err(|_| bad())?;
    let duration = match unit {
        "ms" => Duration::from_millis(number),
        "s" | "" => Duration::from_secs(number),
        "m" => Duration::from_secs(number.saturating_mul(60)),
        _ => return Err(bad()),
    };
    if duration.is_zero() {
        return Err(bad());
    }
    Ok(duration)
}

fn show_duration(d: Duration) -> String {
    if d.subsec_millis() == 0 {
        format!("{}s", d.as_secs())
    } else {
        format!("{}ms", d.as_millis())
    }
}

/// Percent-encodes `%` and the `special` (ASCII) characters of a URL component, so that
/// [`decode`] gives `text` back.
fn escape(text: &str, special: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for ch in text.chars() {
        if ch == '%' || special.contains(ch) {
            out.push_str(&format!("%{:02X}", u32::from(ch)));
        } else {
            out.push(ch);
        }
    }
    out
}

/// Percent-decodes a URL component.
fn decode(text: &str, what: &str) -> Result<String, Error> {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let hex = text.get(i + 1..i + 3).filter(|h| h.len() == 2);
            let byte = hex.and_then(|h| u8::from_str_radix(h, 16).ok());
            let byte = byte.ok_or_else(|| {
                Error::invalid_input(format!("bad percent-encoding in the etcd URL's {what}"))
            })?;
            out.push(byte);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8(out)
        .map_err(|_| Error::invalid_input(format!("the etcd URL's {what} is not UTF-8")))
}

#[cfg(test)]
mod tests {
    use super::*;
    use lockcore::ErrorKind;

    #[test]
    fn parses_endpoints_prefix_and_defaults() {
        let c = EtcdConfig::from_url("etcd://h1:2379,h2,[::1]:2380").expect("ok");
        assert_eq!(
            c.endpoints(),
            ["http://h1:2379", "http://h2:2379", "http://[::1]:2380"]
        );
        assert_eq!(c.prefix(), "");
        assert!(!c.tls());
        assert_eq!(c.request_timeout(), Duration::from_secs(5));
        assert_eq!(c.credentials(), None);
        assert_eq!(EtcdConfig::from_url("etcd://h/").expect("ok").prefix(), "");
        assert_eq!(
            EtcdConfig::from_url("etcd://h/a/b").expect("ok").prefix(),
            "a/b/"
        );
        assert_eq!(
            EtcdConfig::from_url("etcd://h/a/").expect("ok").prefix(),
            "a/"
        );
        assert_eq!(
            EtcdConfig::from_url("etcd://h/a%20b").expect("ok").prefix(),
            "a b/"
        );
    }

    #[test]
    fn parses_tls_auth_and_options() {
        let c = EtcdConfig::from_url(
            "etcds://u%40corp:p%3Ass@h:1/x?timeout=250ms&connect_timeout=2&ca=/etc/ca.pem",
        )
        .expect("ok");
        assert!(c.tls());
        assert_eq!(c.endpoints(), ["https://h:1"]);
        assert_eq!(c.credentials(), Some(("u@corp", "p:ss")));
        assert_eq!(c.request_timeout(), Duration::from_millis(250));
        assert_eq!(c.connect_timeout(), Duration::from_secs(2));
        assert_eq!(c.ca(), Some(std::path::Path::new("/etc/ca.pem")));
        let c = EtcdConfig::from_url("etcd://h?tls=true&cert=/c&key=/k").expect("ok");
        assert!(c.tls());
        assert!(c.client_cert().is_some());
        let c = EtcdConfig::new(["https://h:9"]).expect("ok");
        assert!(c.tls());
    }

    #[test]
    fn tls_parameters_on_a_plaintext_url_are_refused() {
        for url in [
            "etcd://u:hunter2@h?ca=/etc/ca.pem",
            "etcd://u:hunter2@h?cert=/c.pem&key=/k.pem",
            "etcd://u:hunter2@h?key=/k.pem",
            "etcd://u:hunter2@h?ca=/etc/ca.pem&tls=false",
            "etcds://u:hunter2@h?ca=/etc/ca.pem&tls=false",
            "etcds://u:hunter2@h?tls=false",
        ] {
            let err = EtcdConfig::from_url(url).expect_err(url);
            assert_eq!(err.kind(), ErrorKind::Config, "{url}: {err}");
            assert!(err.message().contains("etcd"), "{url}: {err}");
            assert!(!err.to_string().contains("hunter2"), "{err}");
        }
        let err = EtcdConfig::from_url("etcd://h?ca=/etc/ca.pem").expect_err("plaintext");
        assert!(err.message().contains("`etcds://`"), "{err}");
        assert!(err.message().contains("ca"), "{err}");
        // An explicit `tls=true` asks for TLS: the files are used, nothing is downgraded.
        let c = EtcdConfig::from_url("etcd://h?ca=/etc/ca.pem&tls=true").expect("explicit tls");
        assert!(c.tls());
        assert_eq!(c.endpoints(), ["https://h:2379"]);
        assert_eq!(c.to_string(), "etcds://h:2379/?ca=/etc/ca.pem");
        // Built by hand: files imply TLS, and turning TLS off again is refused at load.
        let c = EtcdConfig::new(["h"])
            .expect("ok")
            .with_ca("/x")
            .with_tls(false);
        assert_eq!(
            c.load_tls().expect_err("plaintext").kind(),
            ErrorKind::Config
        );
    }

    #[test]
    fn tls_files_are_loaded_before_connecting_and_named_when_bad() {
        let dir = std::env::temp_dir().join(format!("anylock-etcd-cfg-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("tmp");
        let missing = dir.join("missing.pem");
        let junk = dir.join("junk.pem");
        std::fs::write(&junk, "not a certificate").expect("write");
        for (url, param, path) in [
            (
                format!("etcds://h?ca={}", missing.display()),
                "`ca`",
                &missing,
            ),
            (format!("etcds://h?ca={}", junk.display()), "`ca`", &junk),
            (
                format!("etcds://h?cert={}&key={}", junk.display(), junk.display()),
                "`cert`",
                &junk,
            ),
        ] {
            let config = EtcdConfig::from_url(&url).expect("parses");
            let err = config.load_tls().expect_err(&url);
            assert_eq!(err.kind(), ErrorKind::Config, "{url}: {err}");
            assert!(err.message().contains(param), "{url}: {err}");
            let shown = path.display().to_string();
            assert!(err.message().contains(&shown), "{url}: {err}");
        }
        let half = EtcdConfig::from_url(&format!("etcds://h?cert={}", junk.display()));
        let err = half
            .expect("parses")
            .load_tls()
            .expect_err("cert without key");
        assert_eq!(err.kind(), ErrorKind::Config, "{err}");
        std::fs::remove_dir_all(&dir).ok();
    }

    #[test]
    fn rejects_bad_urls_with_typed_errors() {
        for bad in [
            "redis://h",
            "etcd://",
            "etcd://h:99999",
            "etcd://h:port",
            "etcd://h1,,h2",
            "etcd://h?tls=maybe",
            "etcd://h?timeout=0s",
            "etcd://h?timeout=5h",
            "etcd://h?colour=blue",
            "etcd://h/%zz",
            "etcd://[::1/",
            "etcds://h?ca=",
            "etcds://h?ca=/a&ca=/b",
        ] {
            let err = EtcdConfig::from_url(bad).expect_err(bad);
            assert_eq!(err.kind(), ErrorKind::InvalidInput, "{bad}: {err}");
        }
        assert!(EtcdConfig::new(Vec::<String>::new()).is_err());
    }

    #[test]
    fn display_and_debug_redact_the_password() {
        let c =
            EtcdConfig::from_url("etcd://root:hunter2@h1,h2:2380/locks?timeout=2s").expect("ok");
        let shown = c.to_string();
        assert_eq!(shown, "etcd://root:***@h1:2379,h2:2380/locks/?timeout=2s");
        let debug = format!("{c:?}");
        assert!(!debug.contains("hunter2"), "{debug}");
        assert!(debug.contains("***"), "{debug}");
        for bad in [
            "etcd://root:hunter2@h?bogus=1",
            "etcd://root:hunter1@h1,root:hunter2@h2/x",
            "etcd://root:hunter2@h1:port",
        ] {
            let err = EtcdConfig::from_url(bad).expect_err(bad);
            assert_eq!(err.kind(), ErrorKind::InvalidInput);
            assert!(!err.to_string().contains("hunter"), "{err}");
        }
        let reparsed = EtcdConfig::from_url(&shown.replace("***", "hunter2")).expect("ok");
        assert_eq!(reparsed, c);
        let url = "etcds://root:hunter2@h/l?ca=/s/ca.pem&cert=/s/c.pem&key=/s/k.pem";
        let c = EtcdConfig::from_url(url).expect("ok");
        let (shown, debug) = (c.to_string(), format!("{c:?}"));
        assert_eq!(
            shown,
            "etcds://root:***@h:2379/l/?ca=/s/ca.pem&cert=/s/c.pem&key=/s/k.pem"
        );
        assert!(
            debug.contains("/s/k.pem") && !debug.contains("hunter2"),
            "{debug}"
        );
        let reparsed = EtcdConfig::from_url(&shown.replace("***", "hunter2")).expect("ok");
        assert_eq!(reparsed, c);
    }
}
