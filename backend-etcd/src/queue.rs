//! FIFO waiting: a waiter's key in the lock's queue, kept for the whole acquisition.
//!
//! [`Queue::join`] (lockcore's `enqueue`) grants a lease with the request's TTL and puts
//! the waiter's key `P + escape(N) + "/" + <lease hex>` bound to it, as Go's
//! `concurrency.Mutex` does: the key's create revision is the waiter's place, shared with
//! etcdctl and Go waiters. A task keeps the lease alive every third of its TTL while the
//! place waits. The [`Ticket`] (owned by lockcore's `QueueTicket`) leaves the queue when
//! dropped: it stops the keep-alive and revokes the lease, which deletes the key.
//!
//! [`Queue::claim`] is the queued waiter's attempt: one Txn that, if our key still has its
//! create revision and no key under the prefix has a lower one, rewrites its value with the
//! acquisition time (same key, same lease, same create revision), sent together with one
//! keep-alive, so the lease runs a full TTL from this attempt on. The place becomes the grant: the
//! keep-alive task stops and lockcore's refresher takes over the lease.
//!
//! A place can be lost while it waits: an operator deletes the key, or the lease expires
//! (the keep-alive could not reach etcd for a TTL). Then the ticket's wake-up stream
//! ([`Ticket::events`]) ends and the place leaves the registry, so the owner can queue
//! again (lockcore re-enqueues when a ticket's events end; until it does, the waiter
//! polls without a place).

use std::collections::HashMap;
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use anylock_etcd_proto::etcdserverpb::compare::CompareResult;
use anylock_etcd_proto::etcdserverpb::response_op::Response;
use anylock_etcd_proto::mvccpb::KeyValue;
use anylock_etcd_proto::mvccpb::event::EventType;
use futures_util::stream;
use lockcore::{AcquireRequest, Error, ErrorKind, ReleaseEvents, Result};
use tokio::sync::watch;
use tokio::task::JoinHandle;

use crate::client::{EtcdClient, revision_of, txn_rpc};
use crate::error::{Op, malformed};
use crate::grpc::WatchStream;
use crate::keys::{self, Layout};
use crate::requests;

/// A place's state: waiting, turned into the grant, or gone (left or vanished).
const WAITING: u8 = 0;
const GRANTED: u8 = 1;
const LEFT: u8 = 2;

/// A queued waiter: its lock's prefix and its owner identity.
type Slot = (Vec<u8>, String);

/// The places of the waiters queued through one backend (and its clones).
pub(crate) struct Queue {
    client: Arc<EtcdClient>,
    layout: Layout,
    places: Mutex<HashMap<Slot, Arc<Place>>>,
}

/// One waiter's key in a lock's queue.
pub(crate) struct Place {
    /// The lease the key is bound to; it becomes the grant's lease.
    pub(crate) lease: i64,
    /// The TTL etcd granted the lease, in seconds.
    pub(crate) granted_ttl: i64,
    /// The key's create revision: the place in the queue, and the grant's fence token.
    pub(crate) revision: i64,
    key: Vec<u8>,
    state: AtomicU8,
    keep_alive: JoinHandle<()>,
    /// Turns `true` once the place is known lost (key gone, lease expired).
    lost: Arc<watch::Sender<bool>>,
}

/// What a queued attempt found.
pub(crate) enum Claim {
    /// Our key was first: the place is now the grant.
    Won(Arc<Place>),
    /// Our key waits behind `head`, the key with the lowest create revision.
    Behind(KeyValue),
    /// No usable place (not queued, or our key vanished): take the normal path.
    NotQueued,
}

/// A queued waiter's place as lockcore's `QueueTicket` owns it: dropping it leaves the
/// queue unless the place became the grant.
pub(crate) struct Ticket {
    queue: Arc<Queue>,
    slot: Slot,
    place: Arc<Place>,
}

/// What the claim Txn saw.
enum Seen {
    First,
    Behind(KeyValue),
    Vanished,
}

impl Queue {
    /// An empty queue registry.
    pub(crate) fn new(client: Arc<EtcdClient>, layout: Layout) -> Self {
        Self {
            client,
            layout,
            places: Mutex::new(HashMap::new()),
        }
    }

    fn places(&self) -> MutexGuard<'_, HashMap<Slot, Arc<Place>>> {
        self.places.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn slot(&self, request: &AcquireRequest) -> Slot {
        let prefix = self.layout.lock_prefix(&request.name);
        (prefix, request.owner.as_str().to_owned())
    }

    /// Joins the queue of `request.name` (LeaseGrant + Txn). `None` when this owner already
    /// waits there (two acquisitions sharing one identity): that one keeps the place.
    pub(crate) async fn join(
        self: &Arc<Self>,
        request: &AcquireRequest,
        ttl_secs: i64,
    ) -> Result<Option<Ticket>> {
        let slot = self.slot(request);
        if self.places().contains_key(&slot) {
            return Ok(None);
        }
        let (lease, granted_ttl) = self.client.grant(ttl_secs).await?;
        let key = self.layout.key(&request.name, lease);
        let value = keys::encode_queued_value(&request.owner, request.note.as_ref());
        let revision = match self.put_place(&key, &value, lease).await {
            Ok(revision) => revision,
            Err(err) => {
                revoke_in_background(&self.client, lease);
                return Err(err);
            }
        };
        let lost = Arc::new(watch::Sender::new(false));
        let keep_alive = spawn_keep_alive(
            Arc::clone(&self.client),
            lease,
            granted_ttl,
            Arc::clone(&lost),
        );
        let place = Arc::new(Place {
            lease,
            granted_ttl,
            revision,
            key,
            state: AtomicU8::new(WAITING),
            keep_alive,
            lost,
        });
        let mut places = self.places();
        if places.contains_key(&slot) {
            drop(places);
            place.leave(&self.client);
            return Ok(None);
        }
        places.insert(slot.clone(), Arc::clone(&place));
        let queue = Arc::clone(self);
        Ok(Some(Ticket { queue, slot, place }))
    }

    /// One Txn: put our key bound to `lease` unless it exists; its create revision.
    async fn put_place(&self, key: &[u8], value: &[u8], lease: i64) -> Result<i64> {
        let absent = requests::create_revision(key, Vec::new(), CompareResult::Equal, 0);
        let put = requests::put(key, value, lease);
        let txn = requests::txn(vec![absent], vec![put], Vec::new());
        let resp = self.client.call(Op::Enqueue, txn, txn_rpc).await?;
        if !resp.succeeded {
            return Err(malformed(Op::Enqueue, "a fresh lease's key already exists"));
        }
        revision_of(resp.header.as_ref(), Op::Enqueue)
    }

    /// The queued attempt of `request`'s owner, if it waits in the queue: `Won` only when
    /// its key is first, `Behind` otherwise. Never creates a key or a lease.
    ///
    /// The claim's Txn and a keep-alive of the place's lease go out together (one round
    /// trip, not two: the keep-alive after the Txn was 7 % of a handoff, measured): the
    /// grant's validity counts from before both were sent, and etcd extends the lease from
    /// when it handles the keep-alive, so the validity stays a lower bound whichever lands
    /// first. A claim that finds itself behind has kept its waiting place alive once more,
    /// which its own keep-alive task does anyway.
    pub(crate) async fn claim(&self, request: &AcquireRequest) -> Result<Claim> {
        let slot = self.slot(request);
        let Some(place) = self.places().get(&slot).cloned() else {
            return Ok(Claim::NotQueued);
        };
        let value = keys::encode_value(&request.owner, request.note.as_ref());
        let (seen, kept) = tokio::join!(
            self.claim_txn(&slot.0, &place, &value),
            self.client.keep_alive(place.lease)
        );
        match seen? {
            Seen::Behind(head) => return Ok(Claim::Behind(head)),
            Seen::Vanished => return Ok(self.forget(&slot, &place)),
            Seen::First => {}
        }
        match kept {
            Err(err) if err.kind() == ErrorKind::Lost => return Ok(self.forget(&slot, &place)),
            other => other?,
        }
        let granted =
            place
                .state
                .compare_exchange(WAITING, GRANTED, Ordering::AcqRel, Ordering::Acquire);
        if granted.is_err() {
            return Err(Error::unavailable(
                "the waiter left the queue while its place was being claimed",
            ));
        }
        place.keep_alive.abort();
        self.remove(&slot, &place);
        Ok(Claim::Won(place))
    }

    /// One Txn: if our key is unchanged and no key under `prefix` was created before it,
    /// rewrite its value (same lease, same create revision); else read the head and ours.
    async fn claim_txn(&self, prefix: &[u8], place: &Place, value: &[u8]) -> Result<Seen> {
        let key = place.key.as_slice();
        let ours = requests::create_revision(key, Vec::new(), CompareResult::Equal, place.revision);
        let first =
            requests::create_revision_of_prefix(prefix, CompareResult::Greater, place.revision - 1);
        let txn = requests::txn(
            vec![ours, first],
            vec![requests::put(key, value, place.lease)],
            vec![
                requests::range_op(requests::first_created(prefix)),
                requests::range_op(requests::get(key)),
            ],
        );
        let resp = self.client.call(Op::Claim, txn, txn_rpc).await?;
        if resp.succeeded {
            return Ok(Seen::First);
        }
        let mut gets = resp
            .responses
            .into_iter()
            .filter_map(|op| match op.response {
                Some(Response::ResponseRange(get)) => Some(get.kvs),
                _ => None,
            });
        let (head, ours) = (gets.next(), gets.next());
        let (Some(head), Some(ours)) = (head, ours) else {
            return Err(malformed(Op::Claim, "no reads in the failure branch"));
        };
        let still_ours = ours
            .first()
            .is_some_and(|kv| kv.create_revision == place.revision && kv.lease == place.lease);
        match head.into_iter().next() {
            Some(head) if still_ours => Ok(Seen::Behind(head)),
            _ => Ok(Seen::Vanished),
        }
    }

    /// Our key vanished (lease expired, key deleted by an operator): drop the place.
    fn forget(&self, slot: &Slot, place: &Arc<Place>) -> Claim {
        self.lose(slot, place);
        Claim::NotQueued
    }

    /// The place is lost: out of the registry (so the owner may queue again), keep-alive
    /// stopped, lease revoked, and the ticket's wake-ups ended.
    fn lose(&self, slot: &Slot, place: &Arc<Place>) {
        tracing::debug!(lease = %format!("{:x}", place.lease), "our queue key vanished; the waiter has no place");
        self.remove(slot, place);
        place.leave(&self.client);
        place.lost.send_replace(true);
    }

    /// Removes `slot`'s entry if it is still `place`.
    fn remove(&self, slot: &Slot, place: &Arc<Place>) {
        let mut places = self.places();
        if places.get(slot).is_some_and(|p| Arc::ptr_eq(p, place)) {
            places.remove(slot);
        }
    }
}

impl Place {
    /// Leaves the queue unless the place became the grant: stops the keep-alive and
    /// revokes the lease (deleting the key) in the background.
    fn leave(&self, client: &Arc<EtcdClient>) {
        let left = self
            .state
            .compare_exchange(WAITING, LEFT, Ordering::AcqRel, Ordering::Acquire);
        if left.is_ok() {
            self.keep_alive.abort();
            revoke_in_background(client, self.lease);
        }
    }
}

impl Ticket {
    /// Our queue key.
    #[cfg(test)]
    pub(crate) fn key(&self) -> &[u8] {
        &self.place.key
    }

    /// The waiter's wake-ups from `watch` (deletes under the lock's prefix): one item per
    /// reply that deletes another key, so the waiter retries; the stream ends when the
    /// watch does, or when our own key is deleted or the place is otherwise lost, after
    /// dropping the place so that the owner can queue again.
    pub(crate) fn events(&self, watch: WatchStream) -> ReleaseEvents {
        let wake = Wake {
            watch,
            lost: self.place.lost.subscribe(),
            queue: Arc::clone(&self.queue),
            slot: self.slot.clone(),
            place: Arc::clone(&self.place),
        };
        Box::pin(stream::unfold(wake, |mut wake| async move {
            let woken = wake.next().await;
            woken.then_some(((), wake))
        }))
    }
}

/// The state behind a ticket's wake-up stream.
struct Wake {
    watch: WatchStream,
    lost: watch::Receiver<bool>,
    queue: Arc<Queue>,
    slot: Slot,
    place: Arc<Place>,
}

impl Wake {
    /// `true` for a wake-up, `false` when the stream ends.
    async fn next(&mut self) -> bool {
        loop {
            let reply = tokio::select! {
                lost = self.lost.wait_for(|lost| *lost) => {
                    drop(lost);
                    self.queue.lose(&self.slot, &self.place);
                    return false;
                }
                reply = self.watch.message() => reply,
            };
            let resp = match reply {
                Ok(Some(resp)) if !resp.canceled => resp,
                Ok(_) | Err(_) => return false,
            };
            let mut deleted = resp
                .events
                .iter()
                .filter(|e| e.r#type() == EventType::Delete)
                .filter_map(|e| e.kv.as_ref().map(|kv: &KeyValue| kv.key.as_slice()))
                .peekable();
            if deleted.peek().is_none() {
                continue;
            }
            let ours = deleted.any(|key| key == self.place.key.as_slice());
            if ours && self.place.state.load(Ordering::Acquire) == WAITING {
                self.queue.lose(&self.slot, &self.place);
                return false;
            }
            return true;
        }
    }
}

impl Drop for Ticket {
    fn drop(&mut self) {
        self.queue.remove(&self.slot, &self.place);
        self.place.leave(&self.queue.client);
    }
}

/// Revokes `lease` on the current runtime without waiting; without a runtime (or if the
/// revoke fails), the lease expires by its TTL.
fn revoke_in_background(client: &Arc<EtcdClient>, lease: i64) {
    let Ok(runtime) = tokio::runtime::Handle::try_current() else {
        tracing::debug!(lease = %format!("{lease:x}"), "no runtime to revoke a queue lease; it expires by its TTL");
        return;
    };
    let client = Arc::clone(client);
    runtime.spawn(async move {
        if let Err(err) = client.revoke(lease).await {
            tracing::debug!(error = %err, lease = %format!("{lease:x}"), "revoking a queue lease failed");
        }
    });
}

/// Keeps `lease` alive every third of its TTL until aborted or the lease is gone (then
/// says so on `lost`).
fn spawn_keep_alive(
    client: Arc<EtcdClient>,
    lease: i64,
    ttl_secs: i64,
    lost: Arc<watch::Sender<bool>>,
) -> JoinHandle<()> {
    tokio::spawn(async move {
        let ttl = Duration::from_secs(u64::try_from(ttl_secs).unwrap_or(1).max(1));
        let mut ticks = tokio::time::interval_at(tokio::time::Instant::now() + ttl / 3, ttl / 3);
        ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            ticks.tick().await;
            match client.keep_alive(lease).await {
                Err(err) if err.kind() == ErrorKind::Lost => {
                    lost.send_replace(true);
                    return;
                }
                Err(err) => tracing::debug!(error = %err, "keeping a queue lease alive failed"),
                Ok(()) => {}
            }
        }
    })
}
