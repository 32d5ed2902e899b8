//! [`EtcdBackend`]: the [`LockBackend`] implementation.

use std::collections::BTreeMap;
use std::collections::btree_map::Entry;
use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use anylock_etcd_proto::mvccpb::KeyValue;
use anylock_etcd_proto::mvccpb::event::EventType;
use async_trait::async_trait;
use futures_util::{StreamExt, TryStreamExt, stream};
use lockcore::{
    Acquire, AcquireRequest, ConnectionSecurity, Durability, Error, ErrorKind, Exclusion,
    ExpiryClock, Fairness, FenceToken, Fencing, Guarantees, HeldLock, HolderInfo, Lease,
    LockBackend, LockName, QueueTicket, ReleaseEvents, Result, Ttl, Waiting,
};

use crate::client::{Created, EtcdClient};
use crate::config::EtcdConfig;
use crate::keys::{self, Layout};
use crate::queue::{Claim, Queue};
use crate::requests;

/// Keys a listing reads per Range (keys only: about 100 bytes each).
const LIST_PAGE: i64 = 500;

/// Held locks whose value and lease TTL a listing reads at once.
const LIST_CONCURRENCY: usize = 16;

/// Locks in etcd, laid out like etcd's own `concurrency.Mutex` (see the crate docs).
///
/// Cheap to clone; clones share one gRPC client per etcd member.
#[derive(Clone)]
pub struct EtcdBackend {
    client: Arc<EtcdClient>,
    layout: Layout,
    config: Arc<EtcdConfig>,
    material: Arc<anylock_tls::TlsMaterial>,
    pub(crate) queue: Arc<Queue>,
}

impl EtcdBackend {
    /// A backend for the cluster in `config`, connected and checked: the TLS files are read
    /// first (before any network I/O), then every member is connected at once, each
    /// within the connect timeout (TCP, TLS handshake, authentication, one Range on the key
    /// prefix). One member that passes is enough; members that are down now are used once
    /// they come back.
    ///
    /// # Errors
    /// - [`ErrorKind::Config`]: a TLS file is missing, unreadable or not PEM (the message
    ///   names the URL parameter and the path); TLS parameters on a plaintext config; a TLS
    ///   URL when the crate was built without its `tls` feature.
    /// - [`ErrorKind::PermissionDenied`] when no member passes and one refused us: an
    ///   untrusted or misnamed server certificate, a missing or refused client
    ///   certificate, a wrong user name or password, a user without the RBAC permission on
    ///   the key prefix.
    /// - [`ErrorKind::Unavailable`] when no member answers within the connect timeout.
    ///
    /// # Cancel safety
    /// Cancel safe: dropping it drops the connections made so far.
    pub async fn connect(config: EtcdConfig) -> Result<Self> {
        let material = config.load_tls()?;
        let client = Arc::new(EtcdClient::new(&config, &material)?);
        client.verify().await?;
        let layout = Layout::new(config.prefix());
        Ok(Self {
            queue: Arc::new(Queue::new(Arc::clone(&client), layout.clone())),
            client,
            layout,
            config: Arc::new(config),
            material: Arc::new(material),
        })
    }

    /// Parses `url` (see [`EtcdConfig`]) and connects.
    ///
    /// # Errors
    /// [`ErrorKind::InvalidInput`] for a bad URL; as [`connect`](Self::connect) otherwise.
    ///
    /// # Cancel safety
    /// Cancel safe.
    pub async fn from_url(url: &str) -> Result<Self> {
        Self::connect(EtcdConfig::from_url(url)?).await
    }

    /// The wake-ups a queued waiter's ticket carries: a Watch on the lock's keys for
    /// delete events (1 RPC) that ends when the waiter's place is lost.
    pub(crate) async fn queue_events(
        &self,
        name: &LockName,
        ticket: &crate::queue::Ticket,
    ) -> Result<ReleaseEvents> {
        let prefix = self.layout.lock_prefix(name);
        let watch = self.client.watch_deletes(&prefix).await;
        Ok(ticket.events(watch.map_err(|e| e.with_lock(name))?))
    }

    /// The configuration (its `Display` hides the password).
    pub fn config(&self) -> &EtcdConfig {
        &self.config
    }

    /// The etcd keys of lock `name` all start with this prefix: `prefix + name + "/"`, with
    /// `%` and `/` in the name escaped as `%25` and `%2F`. Pass it (without the trailing
    /// `/`) to `etcdctl lock` to take the same lock from the command line.
    pub fn lock_prefix(&self, name: &LockName) -> String {
        let prefix = self.layout.lock_prefix(name);
        String::from_utf8_lossy(&prefix).into_owned()
    }

    /// How many etcd RPCs this backend (and its clones) has started: for measuring what a
    /// lock operation costs. A keep-alive counts one (one request and one reply on a
    /// short-lived stream); a watch counts one when it is created.
    pub fn rpcs_sent(&self) -> u64 {
        self.client.rpcs()
    }

    /// The lease of a won attempt. Its TTL is the one asked for, or the shorter one etcd
    /// granted; a granted TTL too short to hold a lease at all is a protocol error.
    fn lease_for(
        &self,
        request: &AcquireRequest,
        lease: i64,
        granted: i64,
        rev: i64,
    ) -> Result<Acquire> {
        let granted = Duration::from_secs(u64::try_from(granted).unwrap_or(0));
        let ttl = if granted >= request.ttl.get() {
            request.ttl
        } else {
            Ttl::new(granted).map_err(|_| {
                Error::new(
                    ErrorKind::Protocol,
                    format!("etcd granted a lease of {granted:?}, too short to hold a lock"),
                )
            })?
        };
        let lease = Lease::new(
            request.name.clone(),
            request.owner.clone(),
            ttl,
            format!("{lease:x}:{rev}"),
        );
        Ok(Acquire::Acquired(lease.with_token(FenceToken::new(
            u64::try_from(rev).unwrap_or(0),
        ))))
    }

    /// Same-owner retake: our own abandoned key owns the lock. Replace it with `lease`'s
    /// key when it is the only key; otherwise it has been deleted (handing the lock to the
    /// next waiter, an `etcdctl lock` or Go client) and the lock is held by that waiter.
    async fn retake(
        &self,
        request: &AcquireRequest,
        lease: (i64, i64),
        head: KeyValue,
    ) -> Result<Acquire> {
        let prefix = self.layout.lock_prefix(&request.name);
        let key = self.layout.key(&request.name, lease.0);
        let value = keys::encode_value(&request.owner, request.note.as_ref());
        let retaken = self
            .client
            .retake(&prefix, &head, &key, &value, lease.0)
            .await;
        match retaken {
            Ok(Some(rev)) => self.lease_for(request, lease.0, lease.1, rev),
            Ok(None) => {
                self.discard(lease.0).await;
                match self.holder(&request.name).await? {
                    Some(holder) => Ok(Acquire::Held(holder)),
                    None => Err(Error::unavailable(
                        "the lock changed hands during a same-owner retake; try again",
                    )),
                }
            }
            Err(err) => {
                self.discard_in_background(lease.0);
                Err(err)
            }
        }
    }

    /// The attempt of a contender without a queue place: LeaseGrant, then one Txn that
    /// creates our key only if the lock has no key at all (2 RPCs). When held: revoke the
    /// unused lease and read the holder's TTL (2 more, concurrently).
    async fn acquire_unqueued(&self, request: &AcquireRequest) -> Result<Acquire> {
        let name = &request.name;
        let granted = self.client.grant(request.ttl.as_secs()).await;
        let (lease, granted) = granted.map_err(|e| e.with_lock(name))?;
        let prefix = self.layout.lock_prefix(name);
        let key = self.layout.key(name, lease);
        let value = keys::encode_value(&request.owner, request.note.as_ref());
        let created = match self
            .client
            .create_if_free(&prefix, &key, &value, lease)
            .await
        {
            Ok(created) => created,
            Err(err) => {
                self.discard_in_background(lease);
                return Err(err.with_lock(name));
            }
        };
        match created {
            Created::Won { revision } => self.lease_for(request, lease, granted, revision),
            Created::Held { head } if keys::is_owned_by(&head.value, &request.owner) => self
                .retake(request, (lease, granted), head)
                .await
                .map_err(|e| e.with_lock(name)),
            Created::Held { head } => {
                let (_, remaining) = tokio::join!(self.discard(lease), self.remaining(&head));
                Ok(Acquire::Held(holder_info(&head, remaining.ok().flatten())))
            }
        }
    }

    /// Revokes a lease we granted but will not use (it holds no key, or a key nobody will
    /// refresh). Failure is harmless: the lease expires by its TTL.
    async fn discard(&self, lease: i64) {
        if let Err(err) = self.client.revoke(lease).await {
            tracing::debug!(error = %err, lease = %format!("{lease:x}"), "revoking an unused lease failed");
        }
    }

    /// As [`discard`](Self::discard), without waiting: after a failed RPC, so a key that
    /// an RPC with an unknown outcome may have created does not block the lock for a TTL.
    fn discard_in_background(&self, lease: i64) {
        let backend = self.clone();
        tokio::spawn(async move { backend.discard(lease).await });
    }

    /// The owner key of `name` as a holder, with its lease's remaining TTL.
    async fn holder(&self, name: &LockName) -> Result<Option<HolderInfo>> {
        let prefix = self.layout.lock_prefix(name);
        let Some(head) = self.client.head(&prefix).await? else {
            return Ok(None);
        };
        let remaining = self.remaining(&head).await?;
        if remaining == Some(Duration::ZERO) {
            return Ok(None);
        }
        Ok(Some(holder_info(&head, remaining)))
    }

    /// The remaining TTL of `key`'s lease: `None` for a key without a lease, zero when the
    /// lease has just expired (etcd is deleting the key). etcd rounds the TTL down to whole
    /// seconds, so a live lease that reads 0 has up to a second left: reported as 1 s, not
    /// 0, which would make waiters poll without pause until the key goes.
    async fn remaining(&self, key: &KeyValue) -> Result<Option<Duration>> {
        if key.lease == 0 {
            return Ok(None);
        }
        let ttl = self.client.time_to_live(key.lease).await?;
        Ok(Some(match ttl {
            Some(left) if left.is_zero() => TTL_RESOLUTION,
            Some(left) => left,
            None => Duration::ZERO,
        }))
    }

    /// The owner key of every lock whose name starts with `prefix`, by name (so sorted):
    /// a keys-only scan of `P + escape(prefix)` in pages of [`LIST_PAGE`], each page
    /// starting after the last key of the one before; per lock, the key with the lowest
    /// create revision, the rule acquire and inspect use, so a waiter's queue key is never
    /// taken for the holder. Keys that belong to no nameable lock are skipped. Memory: one
    /// key (without its value) per lock plus one page.
    ///
    /// The pages are not pinned to one revision (a pinned read fails once etcd compacts
    /// that revision, which a long listing can meet): a key that exists throughout the
    /// scan is seen in whichever page covers its place, and a newer key never has a lower
    /// create revision than it, so a lock held throughout is found with its holder, and
    /// every key seen existed, so a lock free throughout is not (its expired leases are
    /// filtered by [`held`](Self::held)).
    async fn heads_under(&self, prefix: &str) -> Result<BTreeMap<LockName, KeyValue>> {
        let range = self.layout.list_prefix(prefix);
        let (mut from, end) = requests::prefix_range(&range);
        let mut heads = BTreeMap::new();
        loop {
            let (kvs, more) = self.client.keys_page(&from, &end, LIST_PAGE).await?;
            let Some(last) = kvs.last() else {
                break;
            };
            let mut next = last.key.clone();
            next.push(0);
            for kv in kvs {
                let Some(name) = self.layout.lock_of(&kv.key) else {
                    continue;
                };
                // Always true (see `Layout::list_prefix`); kept so a layout bug shows as
                // a missing entry rather than a foreign one.
                if !name.as_str().starts_with(prefix) {
                    continue;
                }
                match heads.entry(name) {
                    Entry::Vacant(slot) => {
                        slot.insert(kv);
                    }
                    Entry::Occupied(mut slot) => {
                        if kv.create_revision < slot.get().create_revision {
                            slot.insert(kv);
                        }
                    }
                }
            }
            if !more {
                break;
            }
            from = next;
        }
        Ok(heads)
    }

    /// The owner key `head` (read without its value) as `inspect` reports it: its value
    /// read now and its lease's TTL, concurrently (Range + LeaseTimeToLive). Left out when
    /// the key is gone or is no longer the same key (released or taken over during the
    /// listing), or its lease has expired.
    async fn held(&self, name: LockName, head: KeyValue) -> Result<Option<HeldLock>> {
        let (stored, remaining) = tokio::join!(self.client.get(&head.key), self.remaining(&head));
        let context = |e: Error| e.with_lock(&name);
        let Some(stored) = stored.map_err(context)? else {
            return Ok(None);
        };
        if stored.create_revision != head.create_revision || stored.lease != head.lease {
            return Ok(None);
        }
        let remaining = remaining.map_err(context)?;
        if remaining == Some(Duration::ZERO) {
            return Ok(None);
        }
        let holder = holder_info(&stored, remaining);
        Ok(Some(HeldLock::new(name, holder)))
    }
}

/// The resolution of the TTLs etcd reports (whole seconds, rounded down).
const TTL_RESOLUTION: Duration = Duration::from_secs(1);

/// What the etcd backend promises, without connecting (for comparison tables). See
/// `docs/etcd.md` for why each field has its value, and how FIFO waiting works.
pub fn guarantees() -> Guarantees {
    Guarantees::new(
        Exclusion::Consensus,
        Fencing::Monotonic,
        ExpiryClock::Server,
    )
    .with_waiting(Waiting::Notified)
    .with_fairness(Fairness::Fifo)
    .with_same_owner_retake(true)
    .with_listing(true)
    .with_durability(Durability::SurvivesRestart)
    .with_notes(
        "Leases expire on the etcd leader's clock (whole seconds, at least ~2 s); the \
         fence token is the key's create revision (cluster-wide, so tokens jump). FIFO: \
         a waiting acquire keeps a queue key (its create revision is its place) for the \
         whole wait, in one queue shared with etcdctl/Go waiters; a waiter whose queue key \
         is lost joins the back of the queue again. A snapshot restore rewinds revisions, so tokens can \
         repeat unless the restore bumps them (etcdutl 3.5.10+ --bump-revision).",
    )
}

fn holder_info(head: &KeyValue, remaining: Option<Duration>) -> HolderInfo {
    let stored = keys::decode_value(&head.value, head.lease);
    let mut holder = HolderInfo::new(stored.owner).with_note(stored.note);
    if let Ok(rev) = u64::try_from(head.create_revision) {
        holder = holder.with_token(FenceToken::new(rev));
    }
    if let Some(at) = stored.acquired_at {
        holder = holder.with_acquired_at(at);
    }
    if let Some(left) = remaining {
        holder = holder.with_expires_in(left);
    }
    holder
}

/// The lease id and create revision stored in a lease's grant (`"<lease hex>:<rev>"`).
pub(crate) fn parse_grant(lease: &Lease) -> Result<(i64, i64)> {
    let parsed = lease
        .grant()
        .split_once(':')
        .and_then(|(id, rev)| Some((i64::from_str_radix(id, 16).ok()?, rev.parse::<i64>().ok()?)));
    parsed.ok_or_else(|| {
        Error::invalid_input("the lease was not issued by the etcd backend")
            .with_backend("etcd")
            .with_lock(lease.name())
    })
}

#[async_trait]
impl LockBackend for EtcdBackend {
    fn backend_name(&self) -> &str {
        "etcd"
    }

    /// For a queued waiter (see [`enqueue`](Self::enqueue)): one Txn that turns our queue
    /// key into the grant if it is first, plus a keep-alive (2 RPCs); else the head's TTL
    /// (2 RPCs). Otherwise LeaseGrant, then one Txn that creates our key only if the lock
    /// has no key at all (2 RPCs); when held, revoke the unused lease and read the
    /// holder's TTL (2 more, concurrently). Never creates a key it does not own, so a
    /// try-once attempt leaves nothing behind, and newcomers queue behind waiters.
    async fn acquire(&self, request: &AcquireRequest) -> Result<Acquire> {
        let claimed = self.queue.claim(request).await;
        match claimed.map_err(|e| e.with_lock(&request.name))? {
            Claim::Won(place) => {
                self.lease_for(request, place.lease, place.granted_ttl, place.revision)
            }
            Claim::Behind(head) => {
                let remaining = self.remaining(&head).await.ok().flatten();
                Ok(Acquire::Held(holder_info(&head, remaining)))
            }
            Claim::NotQueued => self.acquire_unqueued(request).await,
        }
    }

    /// A LeaseGrant and a key in the lock's FIFO queue (a Txn), kept alive until the
    /// ticket is dropped or the key becomes the grant; the ticket's events are a watch
    /// (1 more RPC) like [`subscribe`](Self::subscribe)'s, which also ends when the
    /// waiter's key is lost, so lockcore can queue it again.
    async fn enqueue(&self, request: &AcquireRequest) -> Result<Option<QueueTicket>> {
        let joined = self.queue.join(request, request.ttl.as_secs()).await;
        let Some(place) = joined.map_err(|e| e.with_lock(&request.name))? else {
            return Ok(None);
        };
        let events = match self.queue_events(&request.name, &place).await {
            Ok(events) => Some(events),
            Err(err) => {
                tracing::debug!(error = %err, "no watch for a queued waiter; it polls");
                None
            }
        };
        Ok(Some(QueueTicket::new(place, events)))
    }

    /// LeaseKeepAlive and a Range on our key, concurrently (2 RPCs, one round trip).
    async fn refresh(&self, lease: &Lease) -> Result<Lease> {
        let (id, revision) = parse_grant(lease)?;
        let key = self.layout.key(lease.name(), id);
        let (alive, stored) = tokio::join!(self.client.keep_alive(id), self.client.get(&key));
        let context = |e: Error| e.with_backend("etcd").with_lock(lease.name());
        if matches!(&alive, Err(e) if e.kind() == ErrorKind::Lost) {
            return Err(context(Error::lost(
                "our etcd lease expired (and took our key with it)",
            )));
        }
        if let Ok(stored) = &stored {
            let ours = stored
                .as_ref()
                .is_some_and(|kv| kv.create_revision == revision && kv.lease == id);
            if !ours {
                return Err(context(Error::lost("our lock key was deleted or replaced")));
            }
        }
        alive.map_err(context)?;
        stored.map_err(context)?;
        Ok(lease.clone())
    }

    /// LeaseRevoke (1 RPC): etcd deletes the keys bound to our lease, which is exactly our
    /// lock key, so this is a compare-and-delete on the lease id. A lease already gone
    /// (expired, revoked) is `Ok`.
    async fn release(&self, lease: &Lease) -> Result<()> {
        let (id, _) = parse_grant(lease)?;
        self.client
            .revoke(id)
            .await
            .map_err(|e| e.with_lock(lease.name()))
    }

    /// A Range for the owner key, then its lease's TTL (2 RPCs).
    async fn inspect(&self, name: &LockName) -> Result<Option<HolderInfo>> {
        self.holder(name).await.map_err(|e| e.with_lock(name))
    }

    /// A keys-only Range over `P + escape(prefix)` per 500 keys, then per
    /// held lock a Range for the owner key's value and a LeaseTimeToLive, concurrently,
    /// 16 locks at a time: `pages + 2 × locks` RPCs. Each entry is what `inspect` reports.
    async fn list(&self, prefix: &str) -> Result<Vec<HeldLock>> {
        let heads = self.heads_under(prefix).await?;
        let entries = stream::iter(heads)
            .map(|(name, head)| self.held(name, head))
            .buffered(LIST_CONCURRENCY);
        let found: Vec<Option<HeldLock>> = entries.try_collect().await?;
        Ok(found.into_iter().flatten().collect())
    }

    /// Deletes the owner key, as `etcdctl del` would (Range + LeaseTimeToLive + DeleteRange).
    /// The holder's lease is left alone: for an etcdctl or Go holder it is a session lease
    /// that may hold other locks. An anylock holder's next refresh finds its key gone and
    /// turns Lost; the next grant creates a new key, so its token is greater.
    async fn break_lock(&self, name: &LockName) -> Result<Option<HolderInfo>> {
        let prefix = self.layout.lock_prefix(name);
        let context = |e: Error| e.with_lock(name);
        let Some(head) = self.client.head(&prefix).await.map_err(context)? else {
            return Ok(None);
        };
        let remaining = self.remaining(&head).await.ok().flatten();
        let deleted = self.client.delete(&head.key).await.map_err(context)?;
        Ok(deleted.then(|| holder_info(&head, remaining)))
    }

    fn guarantees(&self) -> Guarantees {
        guarantees()
    }

    /// Per member: TLS (always with full verification; version and cipher from a fresh
    /// handshake, left out when it fails) or plaintext, and who we are: the URL's user,
    /// else the client certificate's common name (etcd's user with `--client-cert-auth`).
    async fn connection_security(&self) -> Result<Vec<ConnectionSecurity>> {
        let timeout = self.config.connect_timeout().min(Duration::from_secs(2));
        let tls = if self.config.tls() {
            Some(crate::secure::rustls_config(&self.material)?)
        } else {
            None
        };
        let who = self.client.who();
        let reports = self.config.hosts().iter().map(|host| {
            let tls = tls.clone().map(|config| (self.material.as_ref(), config));
            crate::secure::report(host, tls, who, timeout)
        });
        Ok(futures_util::future::join_all(reports).await)
    }

    /// A Watch on the lock's keys for delete events (1 RPC), confirmed before returning.
    async fn subscribe(&self, name: &LockName) -> Result<Option<ReleaseEvents>> {
        let prefix = self.layout.lock_prefix(name);
        let watch = self
            .client
            .watch_deletes(&prefix)
            .await
            .map_err(|e| e.with_lock(name))?;
        let events = stream::unfold(watch, |mut watch| async move {
            loop {
                match watch.message().await {
                    Ok(Some(resp)) if resp.canceled => return None,
                    Ok(Some(resp)) => {
                        let deleted = resp.events.iter().any(|e| e.r#type() == EventType::Delete);
                        if deleted {
                            return Some(((), watch));
                        }
                    }
                    Ok(None) | Err(_) => return None,
                }
            }
        });
        Ok(Some(Box::pin(events)))
    }
}

impl fmt::Debug for EtcdBackend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("EtcdBackend")
            .field("config", &self.config)
            .finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use lockcore::Identity;

    #[test]
    fn grants_parse_and_foreign_grants_are_rejected() {
        let name = LockName::new("x").expect("valid");
        let lease = Lease::new(
            name.clone(),
            Identity::unique(),
            lockcore::Ttl::new(Duration::from_secs(1)).expect("valid TTL"),
            "1f:42",
        );
        assert_eq!(parse_grant(&lease).expect("ours"), (0x1f, 42));
        for bad in ["", "42", "zz:1", "1f:", "1f:x"] {
            let lease = Lease::new(
                name.clone(),
                Identity::unique(),
                lockcore::Ttl::new(Duration::from_secs(1)).expect("valid TTL"),
                bad,
            );
            let err = parse_grant(&lease).expect_err(bad);
            assert_eq!(err.kind(), ErrorKind::InvalidInput);
        }
    }
}
