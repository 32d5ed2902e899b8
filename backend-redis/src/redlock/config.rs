//! [`RedlockConfig`]: the settings of a Redlock backend, parsed from a `redlock://` URL
//! or a list of node URLs (see [URLs](crate#urls)).

use std::fmt;
use std::time::Duration;

use lockcore::Result;

use crate::config::{
    DEFAULT_CONNECT_TIMEOUT, DEFAULT_NODE_TIMEOUT, DEFAULT_PREFIX, validate_prefix,
    validate_timeout, with_params,
};
use crate::node_url::{NodeUrl, Params, REDIS, Schemes, expand_hosts, invalid, parse_node};

const REDLOCK: Schemes = ("redlock", "redlocks");

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
