//! Parsing one node URL: this crate's parameters split off, the rest for the `redis` client.
//! A [`NodeUrl`] holds the password, so it is only ever printed redacted.

use std::fmt;
use std::net::IpAddr;
use std::sync::Arc;
use std::time::Duration;

use anylock_tls::{TlsFiles, TlsMaterial};
use lockcore::url::{Query, percent_decode, percent_encode};
use lockcore::{Error, ErrorKind, Result, Verification};
use url::Url;

use crate::error::bad_client_url;
use crate::link::Connector;

/// The URL parameters this crate reads (`protocol` is passed on to the client).
const KNOWN: &[&str] = &[
    "prefix",
    "timeout_ms",
    "connect_timeout_ms",
    "protocol",
    "ca",
    "cert",
    "key",
    "allow_mixed_tls",
];

/// The ASCII characters percent-encoded in the query values `Display` writes (a prefix, a
/// TLS file path): those a query, a form decoder (`+`) or a Redlock node list (`,`) would
/// read as syntax.
pub(crate) const QUERY_SPECIAL: &str = "\t\n\r !\"#$&'()*+,:;<=>?@[\\]^`{|}";

/// The scheme pair a URL was written with, for messages: `("redis", "rediss")` or
/// `("redlock", "redlocks")`.
pub(crate) type Schemes = (&'static str, &'static str);

/// The single-instance schemes.
pub(crate) const REDIS: Schemes = ("redis", "rediss");

/// One Redis server: address, credentials, database and TLS. Never printed unredacted.
#[derive(Clone)]
pub(crate) struct NodeUrl {
    url: Url,
    /// The `ca`, `cert` and `key` parameters (paths).
    files: TlsFiles,
    /// What those files hold, read and checked at parse time (TLS URLs only).
    material: Option<Arc<TlsMaterial>>,
}

impl PartialEq for NodeUrl {
    fn eq(&self, other: &Self) -> bool {
        // The material follows from the files.
        self.url == other.url && self.files == other.files
    }
}

impl Eq for NodeUrl {}

impl NodeUrl {
    /// The URL with the password replaced by `***` (without the TLS file parameters: a
    /// label for messages).
    pub(crate) fn redacted(&self) -> String {
        let mut url = self.url.clone();
        if url.password().is_some() {
            // Only fails for URLs without a host, which parsing rejected.
            let _ = url.set_password(Some("***"));
        }
        url.to_string()
    }

    /// [`redacted`](Self::redacted) with the `ca`, `cert` and `key` parameters, so it parses
    /// back to the same node.
    pub(crate) fn redacted_with_files(&self) -> String {
        let url = self.redacted();
        let params = self.files.params();
        if params.is_empty() {
            return url;
        }
        let (url, fragment) = match url.split_once('#') {
            Some((url, fragment)) => (url.to_owned(), format!("#{fragment}")),
            None => (url, String::new()),
        };
        let sep = if url.contains('?') { '&' } else { '?' };
        let query: Vec<String> = params
            .into_iter()
            .map(|(name, path)| format!("{name}={}", percent_encode(&path, QUERY_SPECIAL)))
            .collect();
        format!("{url}{sep}{}{fragment}", query.join("&"))
    }

    /// `host:port` for reports: no credentials, no database.
    pub(crate) fn endpoint(&self) -> String {
        self.address()
    }

    /// The host as written in the URL (brackets stripped from IPv6), for TLS server names.
    pub(crate) fn host(&self) -> String {
        let host = self.url.host_str().unwrap_or_default();
        host.trim_start_matches('[')
            .trim_end_matches(']')
            .to_owned()
    }

    /// The port (6379 when omitted).
    pub(crate) fn port(&self) -> u16 {
        self.url.port().unwrap_or(6379)
    }

    /// The ACL user name in the URL; `default` (Redis's name for it) when none is given.
    pub(crate) fn user(&self) -> String {
        match self.url.username() {
            "" => "default".to_owned(),
            user => percent_decode(user, "user name").unwrap_or_else(|_| user.to_owned()),
        }
    }

    /// Whether the URL carries a password.
    pub(crate) fn has_password(&self) -> bool {
        self.url.password().is_some()
    }

    /// What the client checks about the server's certificate: nothing under `#insecure`.
    pub(crate) fn verification(&self) -> Verification {
        match self.url.fragment() {
            Some("insecure") => Verification::None,
            _ => Verification::Full,
        }
    }

    /// The CA file and client certificate, read and checked (TLS URLs only).
    pub(crate) fn tls_material(&self) -> Option<&TlsMaterial> {
        self.material.as_deref()
    }

    /// `host:port`, to spot the same server listed twice.
    pub(crate) fn address(&self) -> String {
        let host = self.url.host_str().unwrap_or_default();
        format!("{host}:{}", self.url.port().unwrap_or(6379))
    }

    /// The server as a comparable key: [`canonical_host`] and the port (6379 when
    /// omitted). The database is left out: two databases of one server are one server.
    pub(crate) fn server_key(&self) -> String {
        let host = canonical_host(self.url.host_str().unwrap_or_default());
        format!("{host}:{}", self.url.port().unwrap_or(6379))
    }

    /// Whether the connection uses TLS.
    pub(crate) fn is_tls(&self) -> bool {
        self.url.scheme() == "rediss"
    }

    /// What the `redis` client reads from the URL: credentials, database, protocol (no
    /// I/O; checks the URL as the client would, wildcard addresses refused).
    fn client_info(&self) -> Result<redis::RedisConnectionInfo> {
        let client = redis::Client::open(self.url.as_str())
            .map_err(|err| bad_client_url(&err, &self.redacted()))?;
        Ok(client.get_connection_info().redis_settings().clone())
    }

    /// How to open connections to this server, each bounded by `timeout` (TCP, TLS and the
    /// handshake). The `ca` file, when given, replaces the OS trust store; `cert` and `key`
    /// are presented when the server asks for a client certificate.
    ///
    /// # Errors
    /// [`Config`](ErrorKind::Config) for TLS settings rustls refuses, an empty OS trust
    /// store, or `#insecure` without the `tls-insecure` cargo feature.
    pub(crate) fn connector(&self, timeout: Duration) -> Result<Connector> {
        let info = self.client_info()?;
        let at = (self.host(), self.port());
        #[cfg(feature = "tls")]
        let tls = match &self.material {
            Some(material) => Some(Arc::new(self.tls_config(material)?)),
            None => None,
        };
        #[cfg(feature = "tls")]
        return Ok(Connector::new(at, info, tls, timeout));
        #[cfg(not(feature = "tls"))]
        Ok(Connector::new(at, info, timeout))
    }

    #[cfg(feature = "tls")]
    fn tls_config(&self, material: &TlsMaterial) -> Result<rustls::ClientConfig> {
        let verification = self.verification();
        if verification == Verification::None && !cfg!(feature = "tls-insecure") {
            return Err(Error::new(
                ErrorKind::Config,
                "`#insecure` (no certificate verification) needs backend-redis built with \
                 its `tls-insecure` feature, for test servers only; otherwise pass the \
                 server's CA with the `ca` parameter",
            ));
        }
        anylock_tls::client_config(material, verification)
    }
}

/// A host spelled one way for every spelling of the same address, without DNS (parsing
/// does no I/O): case and a trailing dot are dropped; IP addresses are parsed and printed
/// back (IPv4-mapped IPv6 as IPv4); every loopback spelling (`localhost`, `*.localhost`,
/// `127.0.0.0/8`, `::1`) becomes `127.0.0.1`. Two names that resolve to one server are not
/// recognised.
pub(crate) fn canonical_host(host: &str) -> String {
    let host = host.trim_end_matches('.').to_ascii_lowercase();
    let bare = host.trim_start_matches('[').trim_end_matches(']');
    let ip = match bare.parse::<IpAddr>() {
        Ok(IpAddr::V6(v6)) => v6.to_ipv4_mapped().map_or(IpAddr::V6(v6), IpAddr::V4),
        Ok(ip) => ip,
        Err(_) if host == "localhost" || host.ends_with(".localhost") => return LOOPBACK.into(),
        Err(_) => return host,
    };
    match ip.is_loopback() {
        true => LOOPBACK.into(),
        false => ip.to_string(),
    }
}

const LOOPBACK: &str = "127.0.0.1";

impl fmt::Debug for NodeUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&self.redacted_with_files(), f)
    }
}

/// This crate's own URL parameters, removed before the URL reaches the client.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Params {
    pub(crate) prefix: Option<String>,
    pub(crate) timeout: Option<Duration>,
    pub(crate) connect_timeout: Option<Duration>,
    /// `ca`, `cert` and `key`.
    pub(crate) tls: TlsFiles,
    /// `allow_mixed_tls`: a Redlock node list may mix TLS and plaintext nodes.
    pub(crate) allow_mixed_tls: bool,
}

pub(crate) fn invalid(message: impl Into<String>) -> Error {
    Error::invalid_input(message.into())
}
/// Parses one `redis://` or `rediss://` URL and splits off this crate's parameters. TLS
/// parameters on `redis://` are refused (naming `schemes`, the pair the user wrote); on
/// `rediss://` their files are read and checked here, before any connection.
pub(crate) fn parse_node(raw: &str, schemes: Schemes) -> Result<(NodeUrl, Params)> {
    // url::ParseError never echoes the input, so the password cannot leak through it.
    let mut url = Url::parse(raw.trim()).map_err(|e| invalid(format!("not a URL: {e}")))?;
    match url.scheme() {
        "redis" => {}
        "rediss" if cfg!(feature = "tls") => {}
        "rediss" => {
            return Err(Error::new(
                ErrorKind::Config,
                "rediss:// needs backend-redis built with its `tls` feature",
            ));
        }
        other => {
            return Err(invalid(format!(
                "unsupported scheme `{other}`; expected redis or rediss"
            )));
        }
    }
    if url.host_str().is_none_or(str::is_empty) {
        return Err(invalid("the URL names no host"));
    }
    let db = url.path().trim_matches('/');
    if !db.is_empty() && db.parse::<u16>().is_err() {
        return Err(invalid("the URL path must be a database number, like /0"));
    }
    match url.fragment() {
        None | Some("insecure") => {}
        // Not echoed: most likely the rest of a password with a raw '#'.
        Some(_) => {
            return Err(invalid(
                "unknown URL fragment (not shown; the only one is `#insecure`); \
                 percent-encode '#', '?' and '@' in a password as %23, %3F and %40",
            ));
        }
    }
    let params = split_params(&mut url, schemes.0)?;
    let material = match url.scheme() {
        "rediss" => Some(Arc::new(params.tls.load()?)),
        _ => {
            params.tls.refuse_on_plaintext(schemes.0, schemes.1)?;
            refuse_insecure_on_plaintext(&url, schemes)?;
            None
        }
    };
    let node = NodeUrl {
        url,
        files: params.tls.clone(),
        material,
    };
    Ok((node, params))
}

/// Refuses `#insecure` on a plaintext URL: it would be ignored (there is no certificate to
/// skip), and the user who wrote it expects a TLS connection.
fn refuse_insecure_on_plaintext(url: &Url, (scheme, tls_scheme): Schemes) -> Result<()> {
    if url.fragment() != Some("insecure") {
        return Ok(());
    }
    Err(Error::new(
        ErrorKind::Config,
        format!(
            "`#insecure` given on a plaintext `{scheme}://` URL, where there is no TLS \
             certificate to skip and everything (credentials included) goes unencrypted; \
             use `{tls_scheme}://` for TLS"
        ),
    ))
}

/// Removes this crate's parameters from the query (read through [`Query`], which refuses
/// unknown ones, naming `backend`); keeps `protocol` for the client.
pub(crate) fn split_params(url: &mut Url, backend: &'static str) -> Result<Params> {
    let mut query = Query::parse(backend, url.query().unwrap_or(""))?;
    let mut params = Params::default();
    for key in ["ca", "cert", "key"] {
        if let Some(value) = query.take(key) {
            params.tls.take_param(key, &value)?;
        }
    }
    params.prefix = query.take("prefix");
    params.timeout = query.take_millis("timeout_ms")?;
    params.connect_timeout = query.take_millis("connect_timeout_ms")?;
    params.allow_mixed_tls = query.take_flag("allow_mixed_tls")?.unwrap_or(false);
    let protocol = query.take("protocol");
    query.finish(KNOWN)?;
    match protocol {
        Some(protocol) => {
            url.query_pairs_mut()
                .clear()
                .append_pair("protocol", &protocol);
        }
        None => url.set_query(None),
    }
    Ok(params)
}

/// `[user:pw@]h1:p1,h2:p2/db?q#f` → one `scheme://[user:pw@]hN:pN/db?q#f` per host.
pub(crate) fn expand_hosts(rest: &str, scheme: &str) -> Result<Vec<String>> {
    let end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
    let (authority, tail) = rest.split_at(end);
    let (userinfo, hosts) = match authority.rsplit_once('@') {
        Some((userinfo, hosts)) => (format!("{userinfo}@"), hosts),
        None => (String::new(), authority),
    };
    let hosts: Vec<&str> = hosts.split(',').map(str::trim).collect();
    if hosts.iter().any(|h| h.is_empty()) {
        return Err(invalid(
            "the Redlock URL has an empty host in its host list",
        ));
    }
    Ok(hosts
        .into_iter()
        .map(|host| format!("{scheme}://{userinfo}{host}{tail}"))
        .collect())
}
