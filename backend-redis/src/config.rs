//! Connection settings, parsed from URLs (the crate docs' "URLs" section has the same).
//!
//! - Single instance: `redis://[user:password@]host[:port][/db][?params]`, or `rediss://`
//!   for TLS (`#insecure` skips certificate verification: test servers only, and only
//!   with the `tls-insecure` cargo feature).
//! - Redlock: `redlock://[user:password@]host1:port1,host2:port2,…[/db][?params]`
//!   (`redlocks://` for TLS), or a comma-separated list of full node URLs
//!   (`redis://a:6379,redis://b:6379,…`) when the nodes differ in credentials or database.
//!
//! Parameters: `prefix` (key prefix, default `anylock`), `timeout_ms` (per call; per node
//! under Redlock), `connect_timeout_ms`, `protocol` (`resp2`/`resp3`, passed to the
//! client), and on TLS URLs `ca`, `cert` and `key` (refused on plaintext schemes). Unknown parameters are rejected, so a typo cannot silently change behaviour.
//!
//! `Debug` and `Display` replace the password with `***`; no error message contains it.

use std::fmt;
use std::time::Duration;

use lockcore::Result;

use crate::node_url::{
    NodeUrl, Params, REDIS, Schemes, expand_hosts, invalid, parse_node, validate_prefix,
    validate_timeout, with_params,
};

const REDLOCK: Schemes = ("redlock", "redlocks");

/// The key prefix used unless a URL or [`RedisConfig::with_prefix`] says otherwise.
pub const DEFAULT_PREFIX: &str = "anylock";
/// The single-instance per-call timeout (a reply must arrive within it).
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(1);
/// The Redlock per-node timeout: small against the TTL, as the Redlock page ("Distributed
/// Locks with Valkey") asks (5–50 ms for a 10 s TTL), so one slow node cannot hold an
/// acquisition up.
pub const DEFAULT_NODE_TIMEOUT: Duration = Duration::from_millis(50);
/// How long one connection attempt (TCP, TLS, AUTH, SELECT) may take.
pub const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(1);
/// The longest key prefix accepted, in bytes.
pub const MAX_PREFIX_LEN: usize = 128;

/// Settings for [`RedisBackend`](crate::RedisBackend): one Redis server.
///
/// ```
/// use std::time::Duration;
/// use backend_redis::RedisConfig;
/// let config = RedisConfig::from_url("redis://app:s3cret@127.0.0.1:6379/2?prefix=jobs")?
///     .with_timeout(Duration::from_millis(500));
/// assert_eq!(config.prefix(), "jobs");
/// assert!(!config.to_string().contains("s3cret"));
/// # Ok::<(), lockcore::Error>(())
/// ```
#[derive(Clone)]
pub struct RedisConfig {
    node: NodeUrl,
    prefix: String,
    timeout: Duration,
    connect_timeout: Duration,
}

impl RedisConfig {
    /// Parses a `redis://` or `rediss://` URL (see [URLs](crate#urls) for the parameters).
    ///
    /// # Errors
    /// [`InvalidInput`](lockcore::ErrorKind::InvalidInput) for a malformed URL, an unknown
    /// parameter, a bad prefix or a Redlock node list; [`Config`](lockcore::ErrorKind::Config)
    /// for `rediss://` without the `tls` feature.
    pub fn from_url(url: &str) -> Result<Self> {
        // Read as one URL, a node list puts the later nodes' passwords in the query or
        // fragment, where they would be echoed or displayed.
        if url.contains(",redis://") || url.contains(",rediss://") {
            return Err(invalid(
                "a comma-separated list of node URLs is a Redlock configuration; \
                 use RedlockConfig or a redlock:// URL",
            ));
        }
        let (node, params) = parse_node(url, REDIS)?;
        let config = Self {
            node,
            prefix: params.prefix.unwrap_or_else(|| DEFAULT_PREFIX.to_owned()),
            timeout: params.timeout.unwrap_or(DEFAULT_TIMEOUT),
            connect_timeout: params.connect_timeout.unwrap_or(DEFAULT_CONNECT_TIMEOUT),
        };
        config.validate()?;
        Ok(config)
    }

    /// Sets the key prefix (default [`DEFAULT_PREFIX`]); checked by [`validate`](Self::validate).
    pub fn with_prefix(mut self, prefix: impl Into<String>) -> Self {
        self.prefix = prefix.into();
        self
    }

    /// Sets the per-call timeout (default [`DEFAULT_TIMEOUT`]).
    pub fn with_timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    /// Sets the connection-attempt timeout (default [`DEFAULT_CONNECT_TIMEOUT`]).
    pub fn with_connect_timeout(mut self, timeout: Duration) -> Self {
        self.connect_timeout = timeout;
        self
    }

    /// The key prefix.
    pub fn prefix(&self) -> &str {
        &self.prefix
    }

    /// The per-call timeout.
    pub fn timeout(&self) -> Duration {
        self.timeout
    }

    /// The connection-attempt timeout.
    pub fn connect_timeout(&self) -> Duration {
        self.connect_timeout
    }

    /// The server URL with the password replaced by `***`.
    pub fn redacted_url(&self) -> String {
        self.node.redacted()
    }

    /// Checks the prefix and timeouts.
    ///
    /// # Errors
    /// [`InvalidInput`](lockcore::ErrorKind::InvalidInput) naming the bad setting.
    pub fn validate(&self) -> Result<()> {
        validate_prefix(&self.prefix)?;
        validate_timeout("timeout", self.timeout)?;
        validate_timeout("connect timeout", self.connect_timeout)
    }

    pub(crate) fn node(&self) -> &NodeUrl {
        &self.node
    }
}

impl fmt::Display for RedisConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let url = self.node.redacted_with_files();
        f.write_str(&with_params(
            url,
            &self.prefix,
            self.timeout,
            self.connect_timeout,
        ))
    }
}

impl fmt::Debug for RedisConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisConfig")
            .field("url", &self.node)
            .field("prefix", &self.prefix)
            .field("timeout", &self.timeout)
            .field("connect_timeout", &self.connect_timeout)
            .finish()
    }
}

/// Settings for [`RedlockBackend`](crate::RedlockBackend): N independent Redis servers.
///
/// ```
/// use backend_redis::RedlockConfig;
/// let url = "redlock://:pw@10.0.0.1:6379,10.0.0.2:6379,10.0.0.3:6379";
/// let config = RedlockConfig::from_url(url)?;
/// assert_eq!((config.nodes(), config.quorum()), (3, 2));
/// let list = RedlockConfig::from_url("redis://a:6379/1,redis://b:6380/1,redis://c:6381/1")?;
/// assert_eq!(list.nodes(), 3);
/// # Ok::<(), lockcore::Error>(())
/// ```
#[derive(Clone)]
pub struct RedlockConfig {
    nodes: Vec<NodeUrl>,
    prefix: String,
    node_timeout: Duration,
    connect_timeout: Duration,
}

impl RedlockConfig {
    /// Parses `redlock://…`/`redlocks://…` with several hosts, or a comma-separated list of
    /// `redis://`/`rediss://` node URLs (see [URLs](crate#urls)).
    ///
    /// # Errors
    /// [`InvalidInput`](lockcore::ErrorKind::InvalidInput) for a malformed URL, no nodes,
    /// the same node twice (it would count twice towards the quorum), nodes disagreeing on
    /// parameters, or a bad prefix; [`Config`](lockcore::ErrorKind::Config) for TLS without
    /// the `tls` feature.
    pub fn from_url(url: &str) -> Result<Self> {
        let url = url.trim();
        for (scheme, node_scheme) in [("redlock://", "redis"), ("redlocks://", "rediss")] {
            if let Some(rest) = url.strip_prefix(scheme) {
                return Self::parse_nodes(expand_hosts(rest, node_scheme)?, REDLOCK);
            }
        }
        Self::parse_nodes(url.split(','), REDIS)
    }

    /// Builds the configuration from one full URL per node. Parameters may appear on any
    /// node URL but must agree.
    ///
    /// # Errors
    /// As [`from_url`](Self::from_url).
    pub fn from_node_urls<I, S>(urls: I) -> Result<Self>
    where
        I: IntoIterator<Item = S>,
        S: AsRef<str>,
    {
        Self::parse_nodes(urls, REDIS)
    }

    fn parse_nodes<I, S>(urls: I, schemes: Schemes) -> Result<Self>
    where
        I: IntoIterator<Item = S>,
        S: AsRef<str>,
    {
        let mut nodes = Vec::new();
        let mut params: Option<Params> = None;
        for raw in urls {
            let (node, these) = parse_node(raw.as_ref(), schemes)?;
            match &params {
                Some(seen) if *seen != these => {
                    return Err(invalid(
                        "Redlock node URLs disagree on prefix, timeout_ms, connect_timeout_ms, \
                         ca, cert or key: give every node the same parameters",
                    ));
                }
                _ => params = Some(these),
            }
            nodes.push(node);
        }
        let params = params.unwrap_or_default();
        let config = Self {
            nodes,
            prefix: params.prefix.unwrap_or_else(|| DEFAULT_PREFIX.to_owned()),
            node_timeout: params.timeout.unwrap_or(DEFAULT_NODE_TIMEOUT),
            connect_timeout: params.connect_timeout.unwrap_or(DEFAULT_CONNECT_TIMEOUT),
        };
        config.validate()?;
        Ok(config)
    }

    /// Sets the key prefix (default [`DEFAULT_PREFIX`]).
    pub fn with_prefix(mut self, prefix: impl Into<String>) -> Self {
        self.prefix = prefix.into();
        self
    }

    /// Sets the per-node timeout (default [`DEFAULT_NODE_TIMEOUT`]).
    pub fn with_node_timeout(mut self, timeout: Duration) -> Self {
        self.node_timeout = timeout;
        self
    }

    /// Sets the connection-attempt timeout (default [`DEFAULT_CONNECT_TIMEOUT`]).
    pub fn with_connect_timeout(mut self, timeout: Duration) -> Self {
        self.connect_timeout = timeout;
        self
    }

    /// The number of nodes, N.
    pub fn nodes(&self) -> usize {
        self.nodes.len()
    }

    /// The quorum, N/2 + 1.
    pub fn quorum(&self) -> usize {
        self.nodes.len() / 2 + 1
    }

    /// The key prefix.
    pub fn prefix(&self) -> &str {
        &self.prefix
    }

    /// The per-node timeout.
    pub fn node_timeout(&self) -> Duration {
        self.node_timeout
    }

    /// The connection-attempt timeout.
    pub fn connect_timeout(&self) -> Duration {
        self.connect_timeout
    }

    /// The node URLs with passwords replaced by `***`.
    pub fn redacted_urls(&self) -> Vec<String> {
        self.nodes.iter().map(NodeUrl::redacted).collect()
    }

    /// Checks the node list, prefix and timeouts.
    ///
    /// # Errors
    /// [`InvalidInput`](lockcore::ErrorKind::InvalidInput) naming the bad setting.
    pub fn validate(&self) -> Result<()> {
        if self.nodes.is_empty() {
            return Err(invalid("Redlock needs at least one node URL"));
        }
        let mut seen = std::collections::HashMap::new();
        for node in &self.nodes {
            if let Some(first) = seen.insert(node.server_key(), node.address()) {
                return Err(invalid(format!(
                    "Redlock node {} is listed twice (also as {first}); it would count twice \
                     towards the quorum: list each server once",
                    node.address()
                )));
            }
        }
        validate_prefix(&self.prefix)?;
        validate_timeout("node timeout", self.node_timeout)?;
        validate_timeout("connect timeout", self.connect_timeout)
    }

    pub(crate) fn node_urls(&self) -> &[NodeUrl] {
        &self.nodes
    }
}

impl fmt::Display for RedlockConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let urls: Vec<String> = self
            .nodes
            .iter()
            .map(|node| {
                with_params(
                    node.redacted_with_files(),
                    &self.prefix,
                    self.node_timeout,
                    self.connect_timeout,
                )
            })
            .collect();
        f.write_str(&urls.join(","))
    }
}

impl fmt::Debug for RedlockConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedlockConfig")
            .field("nodes", &self.nodes)
            .field("quorum", &self.quorum())
            .field("prefix", &self.prefix)
            .field("node_timeout", &self.node_timeout)
            .field("connect_timeout", &self.connect_timeout)
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use lockcore::ErrorKind;

    /// A raw `?` or `#` in a password makes the rest of it look like a parameter or a
    /// fragment; neither may be echoed.
    #[test]
    fn the_rest_of_a_password_with_a_raw_question_mark_or_hash_is_not_echoed() {
        for url in [
            "redis://app:1234?topsecretpw@127.0.0.1:6379",
            "rediss://app:1234#topsecretpw@127.0.0.1:6380",
            "redis://app:1234#topsecretpw@127.0.0.1:6379/0",
        ] {
            let err = RedisConfig::from_url(url).expect_err("not a usable URL");
            assert_eq!(err.kind(), ErrorKind::InvalidInput, "{url}");
            let shown = format!("{err} {err:?}");
            assert!(!shown.contains("topsecret"), "{url}: {shown}");
        }
    }

    #[test]
    fn single_url_with_credentials_db_and_params() {
        let url = "redis://app:s3cr%2Fet@127.0.0.1:7000/3?prefix=jobs&timeout_ms=250";
        let config = RedisConfig::from_url(url).expect("valid");
        assert_eq!(config.prefix(), "jobs");
        assert_eq!(config.timeout(), Duration::from_millis(250));
        assert_eq!(config.connect_timeout(), DEFAULT_CONNECT_TIMEOUT);
        assert_eq!(config.redacted_url(), "redis://app:***@127.0.0.1:7000/3");
        for shown in [format!("{config}"), format!("{config:?}")] {
            assert!(!shown.contains("s3cr"), "{shown}");
            assert!(shown.contains("***"), "{shown}");
        }
        let again = RedisConfig::from_url(&config.to_string()).expect("Display parses back");
        assert_eq!(again.prefix(), "jobs");
        assert_eq!(again.timeout(), Duration::from_millis(250));
    }

    #[test]
    fn defaults_apply() {
        let config = RedisConfig::from_url("redis://localhost").expect("valid");
        assert_eq!(config.prefix(), DEFAULT_PREFIX);
        assert_eq!(config.timeout(), DEFAULT_TIMEOUT);
        assert!(config.node().client().is_ok());
    }

    #[test]
    fn protocol_passes_through_and_unknown_params_fail() {
        let config = RedisConfig::from_url("redis://h:1/0?protocol=resp3&prefix=p").expect("ok");
        assert_eq!(config.redacted_url(), "redis://h:1/0?protocol=resp3");
        let err = RedisConfig::from_url("redis://h:1/0?prefx=p").expect_err("typo");
        assert_eq!(err.kind(), ErrorKind::InvalidInput);
        assert!(err.to_string().contains("prefx"), "{err}");
    }

    #[test]
    fn bad_urls_are_invalid_input_without_the_password() {
        for bad in [
            "http://u:hunter2@h:1",
            "redis://u:hunter2@h:1/notadb",
            "redis://u:hunter2@h:1/0?timeout_ms=0",
            "redis://u:hunter2@h:1/0?prefix=%7Bx%7D",
            "redis://u:hunter2@h:1/0?prefix=",
            "not a url hunter2",
            "redis://u:hunter2@/0",
        ] {
            let err = RedisConfig::from_url(bad).expect_err(bad);
            assert_eq!(err.kind(), ErrorKind::InvalidInput, "{bad}: {err}");
            assert!(!format!("{err} {err:?}").contains("hunter2"), "{err:?}");
        }
    }

    #[test]
    fn redlock_host_list_form() {
        let url = "redlock://:pw@h1:1,h2:2,h3:3/1?prefix=x&timeout_ms=20";
        let config = RedlockConfig::from_url(url).expect("valid");
        assert_eq!(config.nodes(), 3);
        assert_eq!(config.quorum(), 2);
        assert_eq!(config.prefix(), "x");
        assert_eq!(config.node_timeout(), Duration::from_millis(20));
        assert_eq!(
            config.redacted_urls(),
            [
                "redis://:***@h1:1/1",
                "redis://:***@h2:2/1",
                "redis://:***@h3:3/1"
            ]
        );
        assert!(!format!("{config} {config:?}").contains("pw"));
        let again = RedlockConfig::from_url(&config.to_string()).expect("Display parses back");
        assert_eq!(again.nodes(), 3);
        assert_eq!(again.node_timeout(), Duration::from_millis(20));
    }

    #[test]
    fn redlock_node_list_form_and_its_checks() {
        let list = "redis://a:1,redis://b:2,redis://c:3,redis://d:4,redis://e:5";
        let config = RedlockConfig::from_url(list).expect("valid");
        assert_eq!((config.nodes(), config.quorum()), (5, 3));
        assert_eq!(config.node_timeout(), DEFAULT_NODE_TIMEOUT);
        let twice = RedlockConfig::from_url("redis://a:1,redis://a:1/2").expect_err("dup");
        assert!(twice.to_string().contains("twice"), "{twice}");
        let disagree = RedlockConfig::from_url("redis://a:1?prefix=x,redis://b:1?prefix=y");
        assert_eq!(
            disagree.expect_err("disagree").kind(),
            ErrorKind::InvalidInput
        );
        assert!(RedlockConfig::from_url("redlock://h1:1,,h3:3").is_err());
        assert!(RedlockConfig::from_node_urls(Vec::<String>::new()).is_err());
    }

    /// One server listed twice under two spellings would count twice towards the quorum
    /// (issue #14): `localhost`, `127.0.0.1` and `[::1]` on one port are one server.
    #[test]
    fn the_same_node_under_another_spelling_is_listed_twice() {
        for list in [
            "redlock://localhost:7000,127.0.0.1:7000,b:1",
            "redlock://127.0.0.1,[::1]:6379,b:1",
            "redis://LOCALHOST.:1,redis://127.0.0.1:1/3",
            "redlock://[::ffff:127.0.0.1]:5,localhost:5,b:1",
            "redlock://Host.Example:1,host.example.:1,b:1",
            "redlock://[0:0:0:0:0:0:0:1]:2,127.0.0.1:2,b:1",
        ] {
            let err = RedlockConfig::from_url(list).expect_err(list);
            assert_eq!(err.kind(), ErrorKind::InvalidInput, "{list}");
            assert!(err.to_string().contains("listed twice"), "{list}: {err}");
        }
        let distinct = RedlockConfig::from_url("redlock://localhost:1,127.0.0.1:2,[::1]:3");
        assert_eq!(distinct.expect("distinct ports").nodes(), 3);
    }

    #[test]
    fn even_node_counts_need_a_strict_majority() {
        let config = RedlockConfig::from_url("redlock://a:1,b:1,c:1,d:1").expect("valid");
        assert_eq!(config.quorum(), 3);
    }

    #[cfg(not(feature = "tls"))]
    #[test]
    fn tls_urls_need_the_tls_feature() {
        let err = RedisConfig::from_url("rediss://h:6380/0").expect_err("no TLS built in");
        assert_eq!(err.kind(), ErrorKind::Config, "{err}");
        let err = RedlockConfig::from_url("redlocks://h1:1,h2:2,h3:3").expect_err("no TLS");
        assert_eq!(err.kind(), ErrorKind::Config, "{err}");
    }

    /// A self-signed certificate and key (PEM) in a fresh directory, made by `openssl`.
    #[cfg(feature = "tls")]
    fn pem_files() -> (std::path::PathBuf, String, String) {
        let dir =
            std::env::temp_dir().join(format!("anylock-redis-pem-{:x}", rand::random::<u64>()));
        std::fs::create_dir_all(&dir).expect("temp dir");
        let status = std::process::Command::new("openssl")
            .args([
                "req",
                "-x509",
                "-newkey",
                "ec",
                "-pkeyopt",
                "ec_paramgen_curve:prime256v1",
            ])
            .args(["-nodes", "-days", "1", "-subj", "/CN=localhost"])
            .args(["-keyout", "key.pem", "-out", "cert.pem"])
            .current_dir(&dir)
            .stderr(std::process::Stdio::null())
            .status()
            .expect("openssl must be installed");
        assert!(status.success());
        let cert = dir.join("cert.pem").display().to_string();
        let key = dir.join("key.pem").display().to_string();
        (dir, cert, key)
    }

    /// `ca`, `cert` and `key` are read at parse time, shown (paths, not contents) by Display
    /// and Debug, and parse back; Redlock gives every node the same files.
    #[cfg(feature = "tls")]
    #[test]
    fn tls_files_are_loaded_and_shown_as_paths() {
        let (dir, cert, key) = pem_files();
        let url = format!("rediss://u:hunter2@h:1/0?ca={cert}&cert={cert}&key={key}");
        let config = RedisConfig::from_url(&url).expect("valid");
        let material = config.node().tls_material().expect("loaded");
        assert!(material.ca().is_some() && material.client().is_some());
        let shown = format!("{config} {config:?}");
        assert!(shown.contains(&format!("ca={cert}")), "{shown}");
        assert!(
            !shown.contains("hunter2") && !shown.contains("PRIVATE KEY"),
            "{shown}"
        );
        let again = RedisConfig::from_url(&config.to_string()).expect("Display parses back");
        assert_eq!(again.to_string(), config.to_string());
        let redlock = format!("redlocks://:pw@h1:1,h2:2,h3:3/0?ca={cert}");
        let config = RedlockConfig::from_url(&redlock).expect("valid");
        assert!(
            config
                .node_urls()
                .iter()
                .all(|n| n.tls_material().is_some_and(|m| m.ca().is_some()))
        );
        let again = RedlockConfig::from_url(&config.to_string()).expect("Display parses back");
        assert_eq!(again.to_string(), config.to_string());
        // Node lists: the files must agree, like every other parameter.
        let list = format!("rediss://a:1?ca={cert},rediss://b:2,rediss://c:3?ca={cert}");
        let err = RedlockConfig::from_url(&list).expect_err("disagree");
        assert_eq!(err.kind(), ErrorKind::InvalidInput, "{err}");
        assert!(err.to_string().contains("ca, cert or key"), "{err}");
        let _ = std::fs::remove_dir_all(dir);
    }

    /// TLS parameters on a plaintext scheme are refused (Config), naming the TLS scheme the
    /// user should write; files are checked before any connection.
    #[test]
    fn tls_parameters_need_a_tls_scheme_and_usable_files() {
        let cases = [
            ("redis://u:hunter2@h:1/0?ca=/etc/ca.pem", "`rediss://`"),
            (
                "redlock://:hunter2@h1:1,h2:2?cert=/c.pem&key=/k.pem",
                "`redlocks://`",
            ),
            ("redis://a:1?ca=/x.pem,redis://b:2", "`rediss://`"),
        ];
        for (url, fix) in cases {
            let err = match url.starts_with("redis://") && !url.contains(',') {
                true => RedisConfig::from_url(url).map(|_| ()),
                false => RedlockConfig::from_url(url).map(|_| ()),
            }
            .expect_err(url);
            assert_eq!(err.kind(), ErrorKind::Config, "{url}: {err}");
            assert!(err.to_string().contains(fix), "{url}: {err}");
            assert!(!format!("{err} {err:?}").contains("hunter2"), "{err:?}");
        }
        if cfg!(feature = "tls") {
            let err = RedisConfig::from_url("rediss://h:1/0?ca=/no/such/ca.pem").expect_err("x");
            assert_eq!(err.kind(), ErrorKind::Config, "{err}");
            assert!(err.to_string().contains("`ca` (/no/such/ca.pem)"), "{err}");
            let err = RedisConfig::from_url("rediss://h:1/0?cert=/c.pem").expect_err("no key");
            assert_eq!(err.kind(), ErrorKind::Config, "{err}");
            let err = RedisConfig::from_url("rediss://h:1/0?ca=").expect_err("empty");
            assert_eq!(err.kind(), ErrorKind::InvalidInput, "{err}");
        }
    }

    #[cfg(feature = "tls")]
    #[test]
    fn tls_urls_are_accepted() {
        let single = RedisConfig::from_url("rediss://h:6380/0#insecure").expect("valid");
        assert!(single.node().is_tls());
        let redlock = RedlockConfig::from_url("redlocks://h1:1,h2:2,h3:3").expect("valid");
        assert!(redlock.node_urls().iter().all(NodeUrl::is_tls));
    }
}
