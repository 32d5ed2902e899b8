//! Semaphore permits: `acquire_permit` and `inspect_permits` on a semaphore's slot keys
//! (layout in `slots.rs`, RPCs in `client/slots.rs`). A permit's lease is refreshed,
//! released and detached by the lock paths (`refresh.rs`, `detach.rs`), which read its
//! grant (`grant.rs`: the slot, pinned by its mod revision) from the lease.
//!
//! An attempt is one `Range` over the semaphore's range and one `Txn`:
//! - a slot of another limit: `limit_conflict`, nothing written (the Range alone);
//! - our own slot (the value names our owner identity): retake it in place if it still
//!   has the mod revision read (a new grant: new value, the current session lease, a new
//!   mod revision, so a greater token);
//! - all `L` slots taken by others: `Held` (no Txn);
//! - else take the first free slot of the (at most 8) lowest free ones, in one Txn that
//!   also checks that no slot of another limit has appeared. A Txn that writes nothing
//!   read the semaphore in its failure branch, and that read answers (`Held`, or the
//!   conflict): one attempt, never a second Txn.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use futures_util::future::join_all;
use futures_util::{StreamExt, TryStreamExt, stream};
use lockcore::{
    Acquire, AcquireRequest, Error, ErrorKind, FenceToken, HolderInfo, Identity, LockName, Permits,
    Result, limit_conflict,
};

use super::EtcdBackend;
use super::grant::Grant;
use crate::client::Taken;
use crate::keys;
use crate::session::Session;
use crate::slots::{self, Slot};

/// The most free slots one take Txn tries, one after another (nested Txns).
const TAKE_CHAIN: usize = 8;

/// The most leases a `Held` answer reads the TTL of (concurrently) to find the holder
/// that expires first.
const HELD_TTL_READS: usize = 8;

/// Leases `inspect_permits` reads the TTL of at once.
const INSPECT_CONCURRENCY: usize = 16;

impl EtcdBackend {
    /// One attempt at a permit (see the module docs), on the session lease of the
    /// request's TTL. As for a lock, a put that etcd refuses because the session lease is
    /// gone drops the session and tries once more on a new one.
    pub(super) async fn acquire_permit_once(&self, request: &AcquireRequest) -> Result<Acquire> {
        let Some(permits) = request.permits else {
            return Err(Error::invalid_input(
                "a permit request without a number of permits",
            ));
        };
        let start = Instant::now();
        let ttl_secs = request.ttl.as_secs();
        let session = self.sessions.session(ttl_secs).await?;
        match self.permit_on(request, permits, session, start).await {
            Err(err) if err.kind() == ErrorKind::Lost => {
                tracing::debug!(lease = %format!("{:x}", session.id), "the session lease is gone; granting a new one");
                self.sessions.forget(session.id);
                let session = self.sessions.session(ttl_secs).await?;
                self.permit_on(request, permits, session, start)
                    .await
                    .map_err(|err| self.session_gone(err, session))
            }
            other => other,
        }
    }

    /// The Range and the Txn of one attempt on `session`; `Lost` only when etcd refused
    /// the put because the session lease is gone.
    async fn permit_on(
        &self,
        request: &AcquireRequest,
        permits: Permits,
        session: Session,
        start: Instant,
    ) -> Result<Acquire> {
        let (name, limit) = (&request.name, permits.get());
        let semaphore = self.layout.semaphore_prefix(name);
        let slots = slots::read(&semaphore, self.client.slots(&semaphore).await?)?;
        conflict(name, &slots, limit)?;
        let value = keys::encode_value(&request.owner, request.note.as_ref());
        let (offered, taken) = match slots.iter().find(|s| s.stored.owner == request.owner) {
            Some(own) => {
                let taken = self
                    .client
                    .retake_slot(&semaphore, &own.kv, &value, session.id);
                (vec![(own.index, own.kv.key.clone())], taken.await)
            }
            None if slots.len() >= limit as usize => {
                return Ok(Acquire::Held(
                    self.first_to_expire(&slots, &request.owner).await,
                ));
            }
            None => {
                let free = self.free_slots(name, limit, &slots);
                let keys: Vec<Vec<u8>> = free.iter().map(|(_, key)| key.clone()).collect();
                let ranges = (&semaphore[..], &self.layout.limit_prefix(name, limit)[..]);
                let taken = self.client.take_slot(ranges, &keys, &value, session.id);
                (free, taken.await)
            }
        };
        match taken {
            Ok(Taken::Won { revision, at }) => {
                let Some((index, _)) = offered.get(at) else {
                    return Err(Error::new(ErrorKind::Protocol, "a slot we did not offer"));
                };
                let left = session.left_at(start).min(session.ttl());
                let grant = Grant::permit_on_session(session.id, revision, *index, limit);
                match self.lease_for(request, &grant, left)? {
                    Acquire::Acquired(lease) => Ok(Acquire::Acquired(lease.with_permits(permits))),
                    held => Ok(held),
                }
            }
            Ok(Taken::Lost { kvs }) => {
                let slots = slots::read(&semaphore, kvs)?;
                conflict(name, &slots, limit)?;
                if slots.iter().all(|s| s.stored.owner == request.owner) {
                    return Err(Error::unavailable(
                        "the semaphore changed during the attempt; try again",
                    ));
                }
                Ok(Acquire::Held(
                    self.first_to_expire(&slots, &request.owner).await,
                ))
            }
            Err(err) => {
                if err.kind() != ErrorKind::Lost {
                    let keys = offered.into_iter().map(|(_, key)| key).collect();
                    self.clean_up_slots_in_background(keys, value);
                }
                Err(err)
            }
        }
    }

    /// The lowest free slots of `name` with `limit` (at most [`TAKE_CHAIN`]), and keys.
    fn free_slots(&self, name: &LockName, limit: u32, slots: &[Slot]) -> Vec<(u32, Vec<u8>)> {
        let taken: std::collections::HashSet<u32> = slots.iter().map(|s| s.index).collect();
        (0..limit)
            .filter(|index| !taken.contains(index))
            .take(TAKE_CHAIN)
            .map(|index| (index, self.layout.slot_key(name, limit, index)))
            .collect()
    }

    /// Of the slots not `owner`'s, the one whose lease expires first: the TTLs of at most
    /// [`HELD_TTL_READS`] distinct leases (the oldest grants' first), read concurrently
    /// (one round trip). A holder whose TTL was not read (beyond that number, or the read
    /// failed) has no `expires_in` and comes after those read; among them, the oldest
    /// grant. The caller makes sure there is such a slot.
    async fn first_to_expire(&self, slots: &[Slot], owner: &Identity) -> HolderInfo {
        let mut others: Vec<&Slot> = slots.iter().filter(|s| s.stored.owner != *owner).collect();
        others.sort_by_key(|s| s.kv.mod_revision);
        let mut reads = Vec::new();
        for slot in &others {
            if reads.len() < HELD_TTL_READS
                && !reads.iter().any(|s: &&Slot| s.kv.lease == slot.kv.lease)
            {
                reads.push(*slot);
            }
        }
        let ttls = join_all(reads.iter().map(|s| self.remaining(&s.kv))).await;
        let known: HashMap<i64, Duration> = reads
            .iter()
            .zip(ttls)
            .filter_map(|(slot, ttl)| Some((slot.kv.lease, ttl.ok().flatten()?)))
            .collect();
        let first = others
            .iter()
            .min_by_key(|s| known.get(&s.kv.lease).copied().unwrap_or(Duration::MAX));
        match first {
            Some(slot) => holder(slot, known.get(&slot.kv.lease).copied()),
            None => HolderInfo::new(owner.clone()),
        }
    }

    /// `inspect_permits`: the live permits of `name`, earliest grant (lowest token) first:
    /// one Range, then each distinct lease's TTL, [`INSPECT_CONCURRENCY`] at a time; a
    /// permit whose lease has expired (etcd is deleting its key) is left out.
    pub(super) async fn permit_holders(&self, name: &LockName) -> Result<Vec<HolderInfo>> {
        let semaphore = self.layout.semaphore_prefix(name);
        let mut slots = slots::read(&semaphore, self.client.slots(&semaphore).await?)?;
        slots.sort_by_key(|s| s.kv.mod_revision);
        let mut leases: Vec<anylock_etcd_proto::mvccpb::KeyValue> = Vec::new();
        for slot in &slots {
            if !leases.iter().any(|kv| kv.lease == slot.kv.lease) {
                leases.push(slot.kv.clone());
            }
        }
        let ttls: Vec<(i64, Option<Duration>)> = stream::iter(leases)
            .map(|kv| self.lease_left(kv))
            .buffered(INSPECT_CONCURRENCY)
            .try_collect()
            .await?;
        let ttls: HashMap<i64, Option<Duration>> = ttls.into_iter().collect();
        Ok(slots
            .iter()
            .filter_map(|slot| {
                let left = ttls.get(&slot.kv.lease).copied().flatten();
                (left != Some(Duration::ZERO)).then(|| holder(slot, left))
            })
            .collect())
    }

    /// The remaining TTL of `kv`'s lease, with the lease.
    async fn lease_left(
        &self,
        kv: anylock_etcd_proto::mvccpb::KeyValue,
    ) -> Result<(i64, Option<Duration>)> {
        Ok((kv.lease, self.remaining(&kv).await?))
    }

    /// After a take or retake Txn whose outcome is unknown: deletes whichever of `keys`
    /// holds exactly `value` (the slot that Txn may have written), now and once more a
    /// request timeout later, as the lock's clean-up does. On a session lease such a slot
    /// would otherwise hold a permit for as long as the session lives.
    fn clean_up_slots_in_background(&self, keys: Vec<Vec<u8>>, value: Vec<u8>) {
        let client = std::sync::Arc::clone(&self.client);
        let later = self.config.request_timeout();
        tokio::spawn(async move {
            for pause in [Duration::ZERO, later] {
                tokio::time::sleep(pause).await;
                if let Err(err) = client.delete_any_with_value(&keys, &value).await {
                    tracing::debug!(error = %err, "cleaning up after an unknown permit grant failed");
                }
            }
        });
    }
}

/// `limit_conflict` when a slot was taken with another limit than `limit`.
fn conflict(name: &LockName, slots: &[Slot], limit: u32) -> Result<()> {
    match slots.iter().find(|s| s.limit != limit) {
        Some(other) => Err(limit_conflict(name.as_str(), other.limit, limit)),
        None => Ok(()),
    }
}

/// The holder a slot names: owner, note and time from its value, its mod revision (the
/// grant's write) as the token, and its lease's `remaining` TTL.
fn holder(slot: &Slot, remaining: Option<Duration>) -> HolderInfo {
    let stored = &slot.stored;
    let mut holder = HolderInfo::new(stored.owner.clone()).with_note(stored.note.clone());
    if let Ok(rev) = u64::try_from(slot.kv.mod_revision) {
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
