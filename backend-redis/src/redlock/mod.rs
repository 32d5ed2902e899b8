//! [`RedlockBackend`]: Redlock ("Distributed Locks with Valkey") over N independent Redis
//! nodes.

mod config;
pub(crate) mod quorum;
mod refresh;
mod round;

pub use self::config::RedlockConfig;

use std::collections::BTreeMap;
use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use futures_util::future::join_all;
use lockcore::{
    Acquire, AcquireRequest, ConnectionSecurity, Durability, Error, Exclusion, ExpiryClock,
    Fairness, FenceToken, Fencing, Guarantees, HeldLock, HolderInfo, Lease, LockBackend, LockName,
    ReleaseEvents, Result, Semaphores, Waiting,
};
use tokio::time::Instant;

use self::quorum::{Vote, Votes};
use self::refresh::{decode_grant, encode_grant, refresh_batch};
use self::round::{acquire_vote, check_eviction, gather, quorum_holder, tally_found, undecided};
use crate::backend::{note_arg, only};
use crate::client::{Node, REFRESH_BATCH_LIMIT};
use crate::keys::{self, Found, LockKeys};
use crate::pipeline::Queue;

const BACKEND: &str = "redlock";

const NOTES: &str = "Mutual exclusion holds only while clock drift, network delay and \
    process pauses stay small against the TTL: a node whose clock jumps, or a client paused \
    past its validity, lets two clients hold the lock (Kleppmann, \"How to do distributed \
    locking\"). There is no fencing token, so the protected resource cannot reject a stale \
    holder: use Redlock for efficiency locks only, and a fenced backend for correctness. \
    Nodes keep locks in memory: without appendfsync=always, keep a crashed node down for \
    longer than the longest TTL before it rejoins (the delayed restart of the Redlock page, \
    \"Distributed Locks with Valkey\"). A node that may evict keys (maxmemory-policy \
    other than noeviction, with a maxmemory limit) is refused at connect. Each node's clock \
    decides its key's expiry; the client's validity is the TTL minus the time the quorum \
    took and a drift allowance.";

/// Why Redlock grants no permits (its `guarantees().semaphores`).
const NO_SEMAPHORES: &str = "a count of holders kept on independent nodes has no single \
    point where it is decided: a grant needs only a majority, so grants land on different \
    majorities (a node that timed out, restarted or expired a permit early) and the nodes' \
    counts disagree; more than N clients can then each find a majority with a free place \
    (N = 2 on 5 nodes: A holds on nodes 1-3, B on 3-5, and a third client finds room on 1, \
    2, 4 and 5). Two majorities overlapping in one node excludes a second holder only for \
    N = 1, the lock; and without fencing nothing would catch the excess";

/// Redlock over N independent Redis nodes ("Distributed Locks with Valkey").
///
/// - `acquire` sends one script (`SET key value NX PX ttl`, or a retake of our own key) to
///   every node at once, each bounded by the per-node timeout, and returns as soon as N/2+1
///   nodes granted it. The lease's TTL is the validity left: TTL − elapsed − drift, where
///   drift is TTL × 1% + 2 ms. Without a quorum, or with no validity left, it releases on
///   every node, including those that did not answer, and reports the holder (or the
///   failures).
/// - `refresh` extends on every node and needs a quorum again; `Lost` when a majority says
///   the key is no longer ours. `refresh_many` sends up to
///   [`refresh_batch_limit`](LockBackend::refresh_batch_limit) (1,000) leases to each node
///   as one pipeline, all nodes at once, and decides each lease by the same rule: one round
///   trip per node for the whole batch.
/// - `break_lock` deletes whatever grant is on every node; it needs a quorum of answers.
/// - A note is stored on every node with the grant, by the same acquire script, and shown
///   from the nodes that hold the reported grant.
/// - `list` lists every node (`SCAN` in pages, as [`RedisBackend`](crate::RedisBackend))
///   at once and reports a name only when a majority holds the same grant, as `inspect`
///   would: a snapshot per node, not one linearizable read.
/// - No fencing: [`fence_token`](LockBackend::fence_token) is always `None` (Kleppmann,
///   "How to do distributed locking").
/// - No semaphores: [`acquire_permit`](LockBackend::acquire_permit) is `Unsupported`, and
///   [`guarantees`] says why (a count kept on independent nodes has no single point where
///   it is decided).
///
/// Cheap to clone; clones share the connections.
#[derive(Clone)]
pub struct RedlockBackend {
    inner: Arc<Inner>,
}

struct Inner {
    nodes: Vec<Node>,
    config: RedlockConfig,
}

impl fmt::Debug for RedlockBackend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedlockBackend")
            .field("config", &self.inner.config)
            .finish()
    }
}

impl RedlockConfig {
    /// Validates the settings and [connects](RedlockBackend::connect).
    ///
    /// # Errors
    /// As [`RedlockBackend::connect`].
    ///
    /// # Cancel safety
    /// Cancel safe.
    pub async fn build(self) -> Result<RedlockBackend> {
        RedlockBackend::connect(self).await
    }
}

/// What [`RedlockBackend`] promises, without connecting (for comparison tables). See
/// `docs/redis.md` for why each field has its value.
pub fn guarantees() -> Guarantees {
    Guarantees::new(
        Exclusion::TimingDependentQuorum,
        Fencing::None,
        ExpiryClock::Server,
    )
    .with_waiting(Waiting::Notified)
    .with_fairness(Fairness::None)
    .with_same_owner_retake(true)
    .with_durability(Durability::LostOnRestart)
    .with_listing(true)
    .with_semaphores(Semaphores::Unsupported(NO_SEMAPHORES))
    .with_notes(NOTES)
}

impl RedlockBackend {
    /// Connects to every node and checks them with one `PING` each, concurrently, then
    /// reads each answering node's memory settings (`CONFIG GET maxmemory*`) and refuses a
    /// node that may evict a held lock's key: it could drop its share of a quorum.
    ///
    /// Succeeds when a quorum answers; unreachable nodes are logged and retried on use
    /// (their memory settings are then not checked).
    ///
    /// # Errors
    /// [`ErrorKind::InvalidInput`](lockcore::ErrorKind::InvalidInput) for a bad configuration; the nodes' errors (for example
    /// [`ErrorKind::Unavailable`](lockcore::ErrorKind::Unavailable) or [`ErrorKind::PermissionDenied`](lockcore::ErrorKind::PermissionDenied)) when no quorum answers;
    /// [`ErrorKind::Config`](lockcore::ErrorKind::Config) when a node may evict lock keys.
    ///
    /// # Cancel safety
    /// Cancel safe: it holds no lock state; connection attempts may finish in the background.
    pub async fn connect(config: RedlockConfig) -> Result<Self> {
        let backend = Self::connect_lazy(config).await?;
        let pings = join_all(backend.inner.nodes.iter().map(Node::ping)).await;
        let mut votes: Votes<()> = Votes::new(pings.len());
        let mut answered = Vec::new();
        for (node, ping) in backend.inner.nodes.iter().zip(pings) {
            match &ping {
                Ok(()) => answered.push(node),
                Err(err) => {
                    tracing::warn!(node = node.label(), error = %err, "Redlock node unreachable")
                }
            }
            votes.record(ping.map_or_else(Vote::Failed, |()| Vote::Yes));
        }
        if !votes.has_quorum() {
            return Err(votes.failure("connect"));
        }
        check_eviction(&answered).await?;
        Ok(backend)
    }

    /// Parses `url` ([`RedlockConfig::from_url`]) and [connects](Self::connect).
    ///
    /// # Errors
    /// As [`RedlockConfig::from_url`] and [`connect`](Self::connect).
    ///
    /// # Cancel safety
    /// Cancel safe.
    pub async fn from_url(url: &str) -> Result<Self> {
        RedlockConfig::from_url(url)?.build().await
    }

    /// Builds the backend without contacting the nodes; the first call connects. Async
    /// only because it must run inside a Tokio runtime.
    ///
    /// # Errors
    /// [`ErrorKind::InvalidInput`](lockcore::ErrorKind::InvalidInput) for a bad configuration.
    ///
    /// # Cancel safety
    /// Cancel safe: it makes no network calls.
    pub async fn connect_lazy(config: RedlockConfig) -> Result<Self> {
        config.validate()?;
        // One count for every node: their replies are read by the same client.
        let queue = Queue::default();
        let (timeout, connect_timeout) = (config.node_timeout(), config.connect_timeout());
        let nodes = (config.node_urls().iter())
            .map(|url| Node::lazy(url, timeout, connect_timeout, queue.clone()))
            .collect::<Result<Vec<_>>>()?;
        Ok(Self {
            inner: Arc::new(Inner { nodes, config }),
        })
    }

    /// The configuration.
    pub fn config(&self) -> &RedlockConfig {
        &self.inner.config
    }

    /// The Redis keys and channel of `name` (the same on every node).
    pub fn keys(&self, name: &LockName) -> LockKeys {
        LockKeys::new(self.inner.config.prefix(), name)
    }

    /// Compare-and-delete on every node at once; each node's outcome.
    async fn release_everywhere(&self, keys: &LockKeys, value: &str) -> Vec<Result<bool>> {
        join_all(
            self.inner
                .nodes
                .iter()
                .map(|node| node.release(keys, value)),
        )
        .await
    }

    /// After a failed acquisition: release everywhere, then say why it failed.
    async fn abandon(
        &self,
        keys: &LockKeys,
        value: &str,
        votes: Votes<Found>,
        elapsed: Duration,
    ) -> Result<Acquire> {
        for outcome in self.release_everywhere(keys, value).await {
            if let Err(err) = outcome {
                tracing::debug!(error = %err, "releasing a failed Redlock acquisition");
            }
        }
        if votes.has_quorum() {
            return Err(Error::unavailable(format!(
                "a quorum took {elapsed:?}, leaving no validity; released on every node"
            )));
        }
        match quorum::best_holder(&votes.no) {
            Some(holder) => Ok(Acquire::Held(holder)),
            None => Err(votes.failure("acquire")),
        }
    }
}

#[async_trait]
impl LockBackend for RedlockBackend {
    fn backend_name(&self) -> &str {
        BACKEND
    }

    async fn acquire(&self, request: &AcquireRequest) -> Result<Acquire> {
        let name = &request.name;
        let ttl_ms = request.ttl.as_millis();
        let keys = self.keys(name);
        let owner = request.owner.as_str();
        let note = note_arg(request);
        let value = format!(
            "0{}",
            keys::value_suffix(&keys::new_nonce(), &request.owner)
        );
        let started = Instant::now();
        let nodes = &self.inner.nodes;
        let requests = nodes
            .iter()
            .map(|node| acquire_vote(node, &keys, ttl_ms, owner, &value, note))
            .collect();
        let votes = gather(requests, |v| v.has_quorum() || v.quorum_impossible()).await;
        let elapsed = started.elapsed();
        if let Some(validity) =
            quorum::validity(request.ttl.get(), elapsed).filter(|_| votes.has_quorum())
        {
            let grant = encode_grant(ttl_ms, &value);
            let lease = Lease::new(name.clone(), request.owner.clone(), validity, grant);
            return Ok(Acquire::Acquired(lease));
        }
        self.abandon(&keys, &value, votes, elapsed).await
    }

    async fn refresh(&self, lease: &Lease) -> Result<Lease> {
        only(self.refresh_many(std::slice::from_ref(lease)).await)
    }

    async fn refresh_many(&self, leases: &[Lease]) -> Vec<Result<Lease>> {
        let (nodes, prefix) = (&self.inner.nodes, self.inner.config.prefix());
        let mut results = Vec::with_capacity(leases.len());
        for chunk in leases.chunks(REFRESH_BATCH_LIMIT) {
            results.extend(refresh_batch(nodes, prefix, chunk).await);
        }
        results
    }

    fn refresh_batch_limit(&self) -> usize {
        REFRESH_BATCH_LIMIT
    }

    async fn release(&self, lease: &Lease) -> Result<()> {
        let name = lease.name();
        let (_, value) = decode_grant(lease)?;
        let outcomes = self.release_everywhere(&self.keys(name), value).await;
        let mut votes: Votes<()> = Votes::new(outcomes.len());
        for outcome in outcomes {
            votes.record(outcome.map_or_else(Vote::Failed, |_| Vote::Yes));
        }
        // Keys left on a minority expire by their TTL and cannot block a quorum.
        if votes.has_quorum() {
            return Ok(());
        }
        Err(votes.failure("release"))
    }

    fn fence_token(&self, _lease: &Lease) -> Option<FenceToken> {
        None
    }

    async fn inspect(&self, name: &LockName) -> Result<Option<HolderInfo>> {
        let keys = self.keys(name);
        let replies = join_all(self.inner.nodes.iter().map(|node| node.inspect(&keys))).await;
        let (votes, seen) = tally_found(replies);
        let (_, count) = quorum::leading_grant(&seen);
        // Free unless the nodes that did not answer could complete someone's quorum.
        if undecided(count, votes.failed.len(), votes.quorum()) {
            return Err(votes.failure("inspect"));
        }
        Ok(quorum_holder(&seen, votes.quorum()))
    }

    async fn list(&self, prefix: &str) -> Result<Vec<HeldLock>> {
        let key_prefix = self.inner.config.prefix();
        let nodes = &self.inner.nodes;
        let listed = join_all(nodes.iter().map(|node| node.list(key_prefix, prefix))).await;
        let mut votes: Votes<()> = Votes::new(listed.len());
        // Each name's grants, one per node that holds a key for it.
        let mut by_name: BTreeMap<LockName, Vec<Found>> = BTreeMap::new();
        for outcome in listed {
            match outcome {
                Ok(found) => {
                    votes.record(Vote::Yes);
                    // One entry per node and name (`SCAN` may repeat a key).
                    let once: BTreeMap<LockName, Found> = found.into_iter().collect();
                    for (name, found) in once {
                        by_name.entry(name).or_default().push(found);
                    }
                }
                Err(err) => votes.record(Vote::Failed(err)),
            }
        }
        // A name on no answering node could still be held on the silent ones.
        if undecided(0, votes.failed.len(), votes.quorum()) {
            return Err(votes.failure("list"));
        }
        let mut held = Vec::new();
        for (name, seen) in by_name {
            let (_, count) = quorum::leading_grant(&seen);
            if undecided(count, votes.failed.len(), votes.quorum()) {
                // A listing concerns many locks: the message names the one undecided.
                return Err(votes.failure(&format!("list, lock {name:?}")));
            }
            held.extend(quorum_holder(&seen, votes.quorum()).map(|h| HeldLock::new(name, h)));
        }
        Ok(held)
    }

    async fn break_lock(&self, name: &LockName) -> Result<Option<HolderInfo>> {
        let keys = self.keys(name);
        let nodes = &self.inner.nodes;
        let removed = join_all(nodes.iter().map(|node| node.break_lock(&keys))).await;
        let (votes, seen) = tally_found(removed);
        if !votes.has_quorum() {
            // The holder may keep a majority on the nodes that did not answer.
            return Err(votes.failure("break"));
        }
        Ok(quorum_holder(&seen, votes.quorum()))
    }

    fn guarantees(&self) -> Guarantees {
        guarantees()
    }

    async fn connection_security(&self) -> Result<Vec<ConnectionSecurity>> {
        Ok(join_all(self.inner.nodes.iter().map(Node::security)).await)
    }

    async fn subscribe(&self, name: &LockName) -> Result<Option<ReleaseEvents>> {
        let keys = self.keys(name);
        let subscribed = join_all(self.inner.nodes.iter().map(|node| node.subscribe(&keys))).await;
        let mut streams = Vec::new();
        let mut first_error = None;
        for outcome in subscribed {
            match outcome {
                Ok(events) => streams.push(events),
                Err(err) => first_error = first_error.or(Some(err)),
            }
        }
        match first_error {
            Some(err) if streams.is_empty() => Err(err),
            _ => Ok(Some(Box::pin(futures_util::stream::select_all(streams)))),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use lockcore::{ErrorKind, Identity};

    #[test]
    fn grants_round_trip() {
        let name = LockName::new("x").expect("valid");
        let value = "0:1700000000000:abcd:host/1/ff:task";
        let lease = Lease::new(
            name.clone(),
            Identity::unique(),
            lockcore::Ttl::new(Duration::from_secs(1)).expect("valid TTL"),
            encode_grant(1500, value),
        );
        assert_eq!(decode_grant(&lease).expect("ours"), (1500, value));
        let foreign = Lease::new(
            name,
            Identity::unique(),
            lockcore::Ttl::new(Duration::from_secs(1)).expect("valid TTL"),
            "7",
        );
        let err = decode_grant(&foreign).expect_err("not ours");
        assert_eq!(err.kind(), ErrorKind::InvalidInput);
    }
}
