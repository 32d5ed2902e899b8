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
//! client), and on TLS URLs `ca`, `cert` and `key` (refused on plaintext schemes). Unknown
//! parameters are rejected, so a typo cannot silently change behaviour.
//! [`RedlockConfig`](crate::RedlockConfig) is in `redlock/config.rs`.
//!
//! `Debug` and `Display` replace the password with `***`; no error message contains it.

use std::fmt;
use std::time::Duration;

use lockcore::Result;

use crate::node_url::{NodeUrl, REDIS, invalid, parse_node};

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
        if params.allow_mixed_tls {
            return Err(invalid(
                "allow_mixed_tls is a Redlock parameter (a node list mixing rediss:// and \
                 redis:// nodes); remove it from a single-server URL",
            ));
        }
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

/// Checks a key prefix: 1 to [`MAX_PREFIX_LEN`] bytes, no braces (they would break the
/// `{…}` hash tag), no control characters.
pub(crate) fn validate_prefix(prefix: &str) -> Result<()> {
    if prefix.is_empty() || prefix.len() > MAX_PREFIX_LEN {
        return Err(invalid(format!(
            "key prefix must be 1 to {MAX_PREFIX_LEN} bytes, got {}",
            prefix.len()
        )));
    }
    if prefix.contains(['{', '}']) || prefix.chars().any(char::is_control) {
        return Err(invalid(
            "key prefix must not contain braces or control characters",
        ));
    }
    Ok(())
}

pub(crate) fn validate_timeout(what: &str, timeout: Duration) -> Result<()> {
    if timeout.is_zero() {
        return Err(invalid(format!("{what} must be positive")));
    }
    Ok(())
}

/// Our parameters appended to a redacted URL, so `Display` output parses back.
pub(crate) fn with_params(
    url: String,
    prefix: &str,
    timeout: Duration,
    connect: Duration,
) -> String {
    let sep = if url.contains('?') { '&' } else { '?' };
    let prefix = lockcore::url::percent_encode(prefix, crate::node_url::QUERY_SPECIAL);
    format!(
        "{url}{sep}prefix={prefix}&timeout_ms={}&connect_timeout_ms={}",
        timeout.as_millis(),
        connect.as_millis()
    )
}
