//! [`RedlockConfig`]: the settings of a Redlock backend, parsed from a `redlock://` URL
//! or a list of node URLs (see [URLs](crate#urls)).

use std::fmt;
use std::time::Duration;

use lockcore::Result;

use crate::config::{
    DEFAULT_CONNECT_TIMEOUT, DEFAULT_NODE_TIMEOUT, DEFAULT_PREFIX, validate_prefix,
    validate_timeout, with_params,
};
use anylock_tls::TlsFiles;

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
    /// Set by `allow_mixed_tls=true`: TLS and plaintext nodes in one list.
    allow_mixed_tls: bool,
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
        // The TLS files of the first TLS node: plaintext nodes have none (they are
        // refused there), so only TLS nodes are compared on them.
        let mut tls_files: Option<TlsFiles> = None;
        for raw in urls {
            let (node, these) = parse_node(raw.as_ref(), schemes)?;
            let files_differ =
                node.is_tls() && *tls_files.get_or_insert(these.tls.clone()) != these.tls;
            if files_differ
                || params
                    .as_ref()
                    .is_some_and(|seen| !same_settings(seen, &these))
            {
                return Err(invalid(
                    "Redlock node URLs disagree on prefix, timeout_ms, connect_timeout_ms, \
                     allow_mixed_tls, ca, cert or key: give every node the same parameters",
                ));
            }
            params.get_or_insert(these);
            nodes.push(node);
        }
        let params = params.unwrap_or_default();
        refuse_mixed_tls(&nodes, params.allow_mixed_tls)?;
        let config = Self {
            nodes,
            prefix: params.prefix.unwrap_or_else(|| DEFAULT_PREFIX.to_owned()),
            node_timeout: params.timeout.unwrap_or(DEFAULT_NODE_TIMEOUT),
            connect_timeout: params.connect_timeout.unwrap_or(DEFAULT_CONNECT_TIMEOUT),
            allow_mixed_tls: params.allow_mixed_tls,
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
                let url = with_params(
                    node.redacted_with_files(),
                    &self.prefix,
                    self.node_timeout,
                    self.connect_timeout,
                );
                match self.allow_mixed_tls {
                    true => format!("{url}&allow_mixed_tls=true"),
                    false => url,
                }
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
            .field("allow_mixed_tls", &self.allow_mixed_tls)
            .finish()
    }
}

/// Whether two nodes' parameters agree on everything but the TLS files.
fn same_settings(a: &Params, b: &Params) -> bool {
    (&a.prefix, a.timeout, a.connect_timeout, a.allow_mixed_tls)
        == (&b.prefix, b.timeout, b.connect_timeout, b.allow_mixed_tls)
}

/// Refuses a node list that mixes TLS and plaintext nodes unless `allowed`: the password
/// would go unencrypted to the plaintext nodes, which may be a quorum, while the TLS
/// nodes suggest the deployment is encrypted.
fn refuse_mixed_tls(nodes: &[NodeUrl], allowed: bool) -> Result<()> {
    let tls = nodes.iter().filter(|node| node.is_tls()).count();
    if allowed || tls == 0 || tls == nodes.len() {
        return Ok(());
    }
    Err(invalid(format!(
        "the Redlock node list mixes {tls} TLS (rediss://) and {} plaintext (redis://) \
         node(s): credentials and lock traffic would go unencrypted to the plaintext ones. \
         Use rediss:// for every node (or redis:// for every node on a trusted network); to \
         accept the mix anyway, add allow_mixed_tls=true to every node URL",
        nodes.len() - tls
    )))
}
