//! [`RedisBackend`]: the lock on one Redis server, with fencing tokens.

use std::collections::BTreeMap;
use std::fmt;
use std::sync::Arc;

use async_trait::async_trait;
use lockcore::{
    Acquire, AcquireRequest, ConnectionSecurity, Durability, Error, ErrorKind, Exclusion,
    ExpiryClock, Fairness, Fencing, Guarantees, HeldLock, HolderInfo, Lease, LockBackend, LockName,
    Note, ReleaseEvents, Result, Semaphores, Waiting,
};

use crate::client::{Node, REFRESH_BATCH_LIMIT, RefreshItem};
use crate::config::RedisConfig;
use crate::error::{Call, malformed};
use crate::eviction;
use crate::keys::{self, Found, LockKeys, PermitKeys, StoredValue};
use crate::permits;
use crate::pipeline::{Batch, Queue};
use crate::replies::{AcquireReply, RefreshReply, decode_refresh};

const NOTES: &str = "One Redis node keeps the lock in memory: a crash or restart without \
    appendfsync=always, or a failover to an asynchronously replicated replica, can forget a \
    held lock and grant it twice. Every fence token is max(counter + 1, server clock in \
    microseconds), written back to a counter key that is never deleted, so tokens keep \
    rising across anything that takes the counter back while the server clock keeps going \
    (a restart that forgot the counter or loaded an older snapshot, a failover to a replica \
    that missed the latest grants), and a resource that checks them rejects the forgotten \
    holder. Caveats: a rollback together with a server clock stepped back (or a promoted \
    replica whose clock is behind) can repeat tokens; tokens are microsecond timestamps, \
    so they leave large gaps. A server whose maxmemory-policy may evict keys (allkeys-* or \
    volatile-* with a maxmemory limit) is refused at connect, because eviction deletes held \
    locks. Expiry is decided by the server's clock. Semaphore permits live in a sorted set \
    per name (expiry scores from the server clock) with the same node, expiry and fencing \
    rules, a fence counter of their own and no key shared with the lock of the same name. \
    Good for efficiency locks; for correctness locks, have the protected resource check the \
    fence token.";

/// The lock on one Redis server (the single-instance algorithm of the Redlock page,
/// "Distributed Locks with Valkey", plus fencing).
///
/// - `acquire`: one script (`EVALSHA`): `SET key value NX PX ttl`, and the fence counter
///   set to max(counter + 1, server `TIME` in µs), or a retake when the stored owner is the
///   requester.
/// - `refresh`: one script: compare the value, then `PEXPIRE`. `refresh_many` sends the
///   same script for up to [`refresh_batch_limit`](LockBackend::refresh_batch_limit)
///   (1,000) leases in one pipeline: one round trip for all of them, one `EVALSHA` each,
///   and each lease's result is what its own `refresh` would return.
/// - `release`: one script: compare the value, then `DEL` and `PUBLISH` to wake waiters.
/// - `break_lock`: one script: `DEL` whatever grant is there and `PUBLISH`; the fence
///   counter is kept, so the next grant's token is still greater.
/// - `list`: `SCAN MATCH` (the prefix glob-escaped) in pages, each followed by one
///   read-only script reading the candidates' values, `PTTL`s and notes.
/// - A note is stored with the grant, by the acquire script, in the note key (see
///   [`LockKeys`]).
/// - Semaphores ([`acquire_permit`](LockBackend::acquire_permit),
///   [`inspect_permits`](LockBackend::inspect_permits)): one script per operation on the
///   keys of [`PermitKeys`]: a sorted set of permits scored by their expiry on the server
///   clock, a hash of records (owner index, limit, note) and a fence counter of their own.
///   `refresh`, `release` and `refresh_many` route a permit's lease (marked with
///   [`Lease::permits`]) to the permit scripts; a batch may mix locks and permits and is
///   still one pipeline.
///
/// Cheap to clone; clones share the connections.
#[derive(Clone)]
pub struct RedisBackend {
    inner: Arc<Inner>,
}

struct Inner {
    node: Node,
    config: RedisConfig,
}

impl fmt::Debug for RedisBackend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisBackend")
            .field("config", &self.inner.config)
            .finish()
    }
}

impl RedisBackend {
    /// Connects and checks the server with one `PING`, then reads its memory settings with
    /// one `CONFIG GET maxmemory*` and refuses a server that may evict a held lock's key
    /// (an `allkeys-*` or `volatile-*` policy with a `maxmemory` limit). A server that does
    /// not allow `CONFIG GET` is accepted with a warning.
    ///
    /// # Errors
    /// [`ErrorKind::InvalidInput`] for a bad configuration; [`ErrorKind::Unavailable`] when
    /// the server cannot be reached in time; [`ErrorKind::PermissionDenied`] for rejected
    /// credentials; [`ErrorKind::Config`] for a server that may evict lock keys.
    ///
    /// # Cancel safety
    /// Cancel safe: it holds no lock state; a connection attempt may finish in the background.
    pub async fn connect(config: RedisConfig) -> Result<Self> {
        let backend = Self::connect_lazy(config).await?;
        backend.inner.node.ping().await?;
        eviction::check(&backend.inner.node).await?;
        Ok(backend)
    }

    /// Parses `url` ([`RedisConfig::from_url`]) and [connects](Self::connect).
    ///
    /// # Errors
    /// As [`RedisConfig::from_url`] and [`connect`](Self::connect).
    ///
    /// # Cancel safety
    /// Cancel safe.
    pub async fn from_url(url: &str) -> Result<Self> {
        RedisConfig::from_url(url)?.build().await
    }

    /// Builds the backend without contacting the server; the first call connects. Async
    /// only because it must run inside a Tokio runtime.
    ///
    /// # Errors
    /// [`ErrorKind::InvalidInput`] for a bad configuration.
    ///
    /// # Cancel safety
    /// Cancel safe: it makes no network calls.
    pub async fn connect_lazy(config: RedisConfig) -> Result<Self> {
        config.validate()?;
        let node = Node::lazy(
            config.node(),
            config.timeout(),
            config.connect_timeout(),
            Queue::default(),
        )?;
        Ok(Self {
            inner: Arc::new(Inner { node, config }),
        })
    }

    /// The configuration.
    pub fn config(&self) -> &RedisConfig {
        &self.inner.config
    }

    /// The Redis keys and channel of `name`.
    pub fn keys(&self, name: &LockName) -> LockKeys {
        LockKeys::new(self.inner.config.prefix(), name)
    }

    /// The Redis keys and channel of the semaphore `name` (apart from the lock's keys).
    pub fn permit_keys(&self, name: &LockName) -> PermitKeys {
        PermitKeys::new(self.inner.config.prefix(), name)
    }

    fn node(&self) -> &Node {
        &self.inner.node
    }
}

impl RedisConfig {
    /// Validates the settings and [connects](RedisBackend::connect).
    ///
    /// # Errors
    /// As [`RedisBackend::connect`].
    ///
    /// # Cancel safety
    /// Cancel safe.
    pub async fn build(self) -> Result<RedisBackend> {
        RedisBackend::connect(self).await
    }
}

/// What [`RedisBackend`] promises, without connecting (for comparison tables). See
/// `docs/redis.md` for why each field has its value.
pub fn guarantees() -> Guarantees {
    Guarantees::new(
        Exclusion::SingleNode,
        Fencing::Monotonic,
        ExpiryClock::Server,
    )
    .with_waiting(Waiting::Notified)
    .with_fairness(Fairness::None)
    .with_same_owner_retake(true)
    .with_durability(Durability::LostOnRestart)
    .with_listing(true)
    .with_semaphores(Semaphores::Supported)
    .with_notes(NOTES)
}

/// The one result of a batch of one lease (a single `refresh` is `refresh_many` of one,
/// so the two cannot drift apart).
pub(crate) fn only(results: Vec<Result<Lease>>) -> Result<Lease> {
    results.into_iter().next().unwrap_or_else(|| {
        Err(Error::new(
            ErrorKind::Protocol,
            "refresh: no result for the lease",
        ))
    })
}

/// The result of refreshing the lock `lease`, from its script reply.
fn lock_refreshed(lease: &Lease, reply: redis::Value, node: &Node) -> Result<Lease> {
    match decode_refresh(reply) {
        Some(RefreshReply::Extended) => Ok(lease.clone()),
        Some(RefreshReply::Missing) => Err(Error::lost("the lock key was deleted or expired")),
        Some(RefreshReply::Changed(value)) => Err(Error::lost(format!(
            "taken over by {}",
            keys::owner_of(&value)
        ))),
        None => Err(malformed(Call::Refresh, node.label())),
    }
}

/// The note argument of the acquire script: the request's note, or `""` for none.
pub(crate) fn note_arg(request: &AcquireRequest) -> &str {
    request.note.as_ref().map_or("", Note::as_str)
}

#[async_trait]
impl LockBackend for RedisBackend {
    fn backend_name(&self) -> &str {
        "redis"
    }

    async fn acquire(&self, request: &AcquireRequest) -> Result<Acquire> {
        let name = &request.name;
        let ttl_ms = request.ttl.as_millis();
        let keys = self.keys(name);
        let owner = request.owner.as_str();
        let suffix = keys::value_suffix(&keys::new_nonce(), &request.owner);
        let reply = self
            .node()
            .acquire(&keys, true, ttl_ms, owner, &suffix, note_arg(request))
            .await?;
        match reply {
            AcquireReply::Granted(value) => {
                let token = StoredValue::parse(&value).and_then(|v| v.fence_token());
                let token = token.ok_or_else(|| {
                    Error::new(ErrorKind::Protocol, "the grant carries no fence token")
                })?;
                let lease = Lease::new(name.clone(), request.owner.clone(), request.ttl, value);
                Ok(Acquire::Acquired(lease.with_token(token)))
            }
            AcquireReply::Held(found) => Ok(Acquire::Held(keys::holder_info(&found))),
        }
    }

    async fn refresh(&self, lease: &Lease) -> Result<Lease> {
        only(self.refresh_many(std::slice::from_ref(lease)).await)
    }

    async fn refresh_many(&self, leases: &[Lease]) -> Vec<Result<Lease>> {
        let (node, prefix) = (self.node(), self.inner.config.prefix());
        let mut results = Vec::with_capacity(leases.len());
        for chunk in leases.chunks(REFRESH_BATCH_LIMIT) {
            // One pipeline per chunk: each lease's call is its kind's refresh script.
            let mut batch = Batch::default();
            for lease in chunk {
                match lease.permits() {
                    Some(_) => permits::push_refresh(&mut batch, prefix, lease),
                    None => RefreshItem {
                        keys: self.keys(lease.name()),
                        value: lease.grant(),
                        ttl_ms: lease.ttl().as_millis(),
                    }
                    .push_to(&mut batch),
                }
            }
            let replies = node.run_batch(Call::Refresh, &batch).await;
            results.extend(chunk.iter().zip(replies).map(|(lease, reply)| {
                let reply = reply?;
                match lease.permits() {
                    Some(_) => permits::refreshed(lease, &reply, node),
                    None => lock_refreshed(lease, reply, node),
                }
            }));
        }
        results
    }

    fn refresh_batch_limit(&self) -> usize {
        REFRESH_BATCH_LIMIT
    }

    async fn release(&self, lease: &Lease) -> Result<()> {
        if lease.permits().is_some() {
            return permits::release(self.node(), self.inner.config.prefix(), lease).await;
        }
        let name = lease.name();
        let released = self.node().release(&self.keys(name), lease.grant()).await?;
        if !released {
            tracing::debug!(lock = %name, "release: the lease was already gone");
        }
        Ok(())
    }

    async fn server_time(&self) -> Result<Option<std::time::SystemTime>> {
        self.node().time().await.map(Some)
    }

    async fn inspect(&self, name: &LockName) -> Result<Option<HolderInfo>> {
        let found = self.node().inspect(&self.keys(name)).await?;
        Ok(found.as_ref().map(keys::holder_info))
    }

    async fn list(&self, prefix: &str) -> Result<Vec<HeldLock>> {
        let found = self.node().list(self.inner.config.prefix(), prefix).await?;
        // `SCAN` may return a key twice; both reads describe the same grant or a newer one.
        let by_name: BTreeMap<LockName, Found> = found.into_iter().collect();
        Ok(by_name
            .into_iter()
            .map(|(name, found)| HeldLock::new(name, keys::holder_info(&found)))
            .collect())
    }

    async fn break_lock(&self, name: &LockName) -> Result<Option<HolderInfo>> {
        let removed = self.node().break_lock(&self.keys(name)).await?;
        Ok(removed.as_ref().map(keys::holder_info))
    }

    async fn acquire_permit(&self, request: &AcquireRequest) -> Result<Acquire> {
        permits::acquire(self.node(), self.inner.config.prefix(), request).await
    }

    async fn inspect_permits(&self, name: &LockName) -> Result<Vec<HolderInfo>> {
        permits::inspect(self.node(), self.inner.config.prefix(), name).await
    }

    fn guarantees(&self) -> Guarantees {
        guarantees()
    }

    async fn connection_security(&self) -> Result<Vec<ConnectionSecurity>> {
        Ok(vec![self.node().security().await])
    }

    async fn subscribe(&self, name: &LockName) -> Result<Option<ReleaseEvents>> {
        let events = self.node().subscribe(&self.keys(name)).await?;
        Ok(Some(events))
    }
}
