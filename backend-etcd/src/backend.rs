//! [`EtcdBackend`]: the [`LockBackend`] implementation. The acquire paths are in
//! `backend/acquire.rs`, reading holders (inspect, list, break) in `backend/inspect.rs`,
//! refreshing (one lease or a batch) in `backend/refresh.rs`, and what a key or a lease
//! says in `backend/holder.rs`.

use std::fmt;
use std::sync::Arc;
use std::sync::atomic::AtomicUsize;
use std::time::Duration;

use anylock_etcd_proto::mvccpb::event::EventType;
use async_trait::async_trait;
use futures_util::stream;
use lockcore::{
    Acquire, AcquireRequest, ConnectionSecurity, Durability, Error, Exclusion, ExpiryClock,
    Fairness, Fencing, Guarantees, HeldLock, HolderInfo, Lease, LockBackend, LockName, QueueTicket,
    ReleaseEvents, Result, Semaphores, Waiting,
};

use crate::client::EtcdClient;
use crate::config::EtcdConfig;
use crate::keys::Layout;
use crate::queue::{Claim, Queue};
use crate::session::Sessions;

mod acquire;
mod detach;
mod grant;
mod holder;
mod inspect;
mod permits;
mod refresh;

#[cfg(test)]
pub(crate) use grant::{Grant, parse_grant};
use holder::holder_info;

/// etcd's default `--max-txn-ops`: the most Ranges one refresh check Txn carries.
pub(crate) const MAX_TXN_OPS: usize = 128;

/// How many leases one `refresh_many` takes. etcd renews one stream's keep-alives one
/// after another (on a follower, each is forwarded to the leader), 8 streams at once, so
/// a batch is kept to what stays well inside the request timeout; its check Txns are 4.
pub(crate) const REFRESH_BATCH_LIMIT: usize = 512;

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
    /// The session leases, one per TTL (see `session.rs`).
    sessions: Arc<Sessions>,
    /// How many Ranges a refresh's check Txn carries (see `backend/refresh.rs`).
    txn_ops: Arc<AtomicUsize>,
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
    /// [`ErrorKind::Config`]: lockcore::ErrorKind::Config
    /// [`ErrorKind::PermissionDenied`]: lockcore::ErrorKind::PermissionDenied
    /// [`ErrorKind::Unavailable`]: lockcore::ErrorKind::Unavailable
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
            sessions: Arc::new(Sessions::new(Arc::clone(&client))),
            client,
            layout,
            config: Arc::new(config),
            material: Arc::new(material),
            txn_ops: Arc::new(AtomicUsize::new(MAX_TXN_OPS)),
        })
    }

    /// Parses `url` (see [`EtcdConfig`]) and connects.
    ///
    /// # Errors
    /// [`ErrorKind::InvalidInput`] for a bad URL; as [`connect`](Self::connect) otherwise.
    ///
    /// [`ErrorKind::InvalidInput`]: lockcore::ErrorKind::InvalidInput
    ///
    /// # Cancel safety
    /// Cancel safe.
    pub async fn from_url(url: &str) -> Result<Self> {
        EtcdConfig::from_url(url)?.build().await
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
        Ok(ticket.events(watch?))
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

    /// The etcd keys of the semaphore `name` (its permits' slot keys) all start with this
    /// prefix: `prefix + "%sem/" + name + "/"`, with `%` and `/` in the name escaped as in
    /// [`lock_prefix`](Self::lock_prefix); a slot is `<permits>/<index>` after it. No key
    /// of any lock (anylock's, `etcdctl lock`'s, Go's) falls under it.
    pub fn semaphore_prefix(&self, name: &LockName) -> String {
        let prefix = self.layout.semaphore_prefix(name);
        String::from_utf8_lossy(&prefix).into_owned()
    }

    /// How many etcd RPCs this backend (and its clones) has started: for measuring what a
    /// lock operation costs, as etcd's `grpc_server_started_total` counts them. A watch
    /// counts one when it is created; each of the shared keep-alive streams (up to 8)
    /// counts one when it is opened (first use, and after it broke), and the keep-alives
    /// sent on them count none.
    pub fn rpcs_sent(&self) -> u64 {
        self.client.rpcs()
    }
}

impl EtcdConfig {
    /// Validates this config and connects: [`EtcdBackend::connect`].
    ///
    /// # Errors
    /// As [`EtcdBackend::connect`].
    ///
    /// # Cancel safety
    /// Cancel safe.
    pub async fn build(self) -> Result<EtcdBackend> {
        EtcdBackend::connect(self).await
    }
}

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
    .with_semaphores(Semaphores::Supported)
    .with_notes(
        "Leases expire on the etcd leader's clock (whole seconds, at least ~2 s); the \
         locks one backend takes with one TTL share one session lease (Go's Session \
         model): a crashed process's locks expire with it one TTL after the last keep-alive or \
         grant of their session (never before the TTL each lease reported), \
         and a session that expires or is revoked loses every lock on it. The \
         fence token is the key's create revision (cluster-wide, so tokens jump). FIFO: \
         a waiting acquire keeps a queue key (its create revision is its place) for the \
         whole wait, in one queue shared with etcdctl/Go waiters; a waiter whose queue key \
         is lost joins the back of the queue again. Semaphore permits are slot keys (one per \
         permit index) under a range of their own; their token is the slot's mod revision, and \
         their waiters do not queue. A snapshot restore rewinds revisions, so tokens can \
         repeat unless the restore bumps them (etcdutl 3.5.10+ --bump-revision).",
    )
}

#[async_trait]
impl LockBackend for EtcdBackend {
    fn backend_name(&self) -> &str {
        "etcd"
    }

    /// For a queued waiter (see [`enqueue`](Self::enqueue)): one Txn that turns our queue
    /// key into the grant if it is first, plus a keep-alive (2 RPCs); else the head's TTL
    /// (2 RPCs). Otherwise one Txn that creates our key on the session lease of the
    /// request's TTL only if the lock has no key at all (1 RPC; a `LeaseGrant` first when
    /// there is no live session, a keep-alive first when an eighth of its TTL has passed);
    /// when held, the holder's TTL (1 more). Never creates a key it does not own, so a
    /// try-once attempt leaves nothing behind, and newcomers queue behind waiters. The
    /// lease reports at most what the session has left from the start of the call.
    async fn acquire(&self, request: &AcquireRequest) -> Result<Acquire> {
        match self.queue.claim(request).await? {
            Claim::Won(place) => {
                let granted = u64::try_from(place.granted_ttl).unwrap_or(0);
                let grant = grant::Grant::own(place.lease, place.revision);
                self.lease_for(request, &grant, Duration::from_secs(granted))
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
        let Some(place) = joined? else {
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

    /// A keep-alive on the lease's shared keep-alive stream and a keys-only Range of our
    /// key in a `Txn`, concurrently (one round trip; 1 RPC, 2 when the stream must be
    /// opened): a
    /// batch of one for [`refresh_many`](Self::refresh_many), so the two cannot differ.
    /// `Lost` when etcd answers the keep-alive with TTL 0 (the lease expired and took our
    /// key), or when our key is gone or is no longer ours (create revision and lease).
    async fn refresh(&self, lease: &Lease) -> Result<Lease> {
        let mut results = self.refresh_leases(std::slice::from_ref(lease)).await;
        results
            .pop()
            .unwrap_or_else(|| Err(Error::unavailable("refresh: no result")))
    }

    /// As [`refresh`](Self::refresh) for every lease, in one round trip: one keep-alive
    /// each, on the shared streams (each lease on its own of 8), and the keys checked by
    /// one `Txn` of keys-only Ranges per 128 leases (etcd's default `--max-txn-ops`),
    /// concurrently: `ceil(n / 128)` RPCs (one more per stream it opens), against `2n` for
    /// `n` single refreshes. A failed Txn or a broken stream fails the leases it carried
    /// with a temporary error, never `Lost`.
    async fn refresh_many(&self, leases: &[Lease]) -> Vec<Result<Lease>> {
        self.refresh_leases(leases).await
    }

    /// 512: etcd renews one stream's keep-alives one after another (8 streams at once, see
    /// `keepalive.rs`), so a batch stays well inside the request timeout (4 check Txns).
    fn refresh_batch_limit(&self) -> usize {
        REFRESH_BATCH_LIMIT
    }

    /// A lock on the session lease: one `Txn` that deletes our key if it still has its
    /// create revision (a compare-and-delete on the grant; the session lives on for the
    /// backend's other locks and is never revoked). A lock on a lease of its own (a queued
    /// waiter's grant, a detached lock): `LeaseRevoke`, which deletes exactly its key.
    /// Either is 1 RPC; a grant already gone (expired, released, taken over) is `Ok`.
    async fn release(&self, lease: &Lease) -> Result<()> {
        self.release_lease(lease).await
    }

    /// A lock on the session lease moves to a lease of its own (`LeaseGrant` + `Txn`: the
    /// same key, value and create revision, so the same fence token), which nothing keeps
    /// alive: it ends by its TTL even while the backend's other locks keep the session
    /// alive. A lock on a lease of its own needs nothing (`Ok`, no RPC). `Lost` when the
    /// key is gone or no longer this grant's.
    async fn detach(&self, lease: &Lease) -> Result<()> {
        self.detach_lease(lease).await
    }

    /// A Range for the owner key, then its lease's TTL (2 RPCs).
    async fn inspect(&self, name: &LockName) -> Result<Option<HolderInfo>> {
        self.holder(name).await
    }

    /// A permit is a slot key `P + "%sem/" + escape(N) + "/" + <permits> + "/" + <index>`
    /// on the session lease of the request's TTL, apart from the lock `N`'s keys. One
    /// Range over the semaphore's slots, then one Txn: retake our own slot in place, or
    /// take a free one only while no slot of another limit exists (2 RPCs; `LeaseGrant`
    /// or a keep-alive first as for a lock). All taken: `Held` after the Range, with the
    /// TTLs of up to 8 holders' leases read at once (1 + up to 8 RPCs, 2 round trips).
    /// The fence token is the slot's mod revision.
    async fn acquire_permit(&self, request: &AcquireRequest) -> Result<Acquire> {
        self.acquire_permit_once(request).await
    }

    /// One Range over the semaphore's slots, then each distinct lease's TTL (16 at once):
    /// `1 + leases` RPCs.
    async fn inspect_permits(&self, name: &LockName) -> Result<Vec<HolderInfo>> {
        self.permit_holders(name).await
    }

    /// A keys-only Range over `P + escape(prefix)` per 500 keys, then per
    /// held lock a Range for the owner key's value and a LeaseTimeToLive, concurrently,
    /// 16 locks at a time: `pages + 2 × locks` RPCs. Each entry is what `inspect` reports.
    async fn list(&self, prefix: &str) -> Result<Vec<HeldLock>> {
        self.held_under(prefix).await
    }

    /// Deletes the owner key, as `etcdctl del` would (Range + LeaseTimeToLive + DeleteRange).
    /// The holder's lease is left alone: for an etcdctl or Go holder it is a session lease
    /// that may hold other locks. An anylock holder's next refresh finds its key gone and
    /// turns Lost; the next grant creates a new key, so its token is greater.
    async fn break_lock(&self, name: &LockName) -> Result<Option<HolderInfo>> {
        self.break_holder(name).await
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

    /// A Watch (1 RPC) for delete events on the lock's keys and on the semaphore of the
    /// same name's slot keys (two watches on one stream, both confirmed before
    /// returning): a lock waiter also wakes on a permit's release, and the other way
    /// round (spurious wakes, allowed).
    async fn subscribe(&self, name: &LockName) -> Result<Option<ReleaseEvents>> {
        let lock = self.layout.lock_prefix(name);
        let semaphore = self.layout.semaphore_prefix(name);
        let watch = self
            .client
            .watch_deletes_under(&[&lock, &semaphore])
            .await?;
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
