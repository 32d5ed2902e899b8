//! Reading holders: the owner key of one lock with its lease's remaining TTL (inspect,
//! a held attempt, break), and the paged scan behind `list`.

use std::collections::BTreeMap;
use std::collections::btree_map::Entry;
use std::time::Duration;

use anylock_etcd_proto::mvccpb::KeyValue;
use futures_util::{StreamExt, TryStreamExt, stream};
use lockcore::{HeldLock, HolderInfo, LockName, Result};

use super::EtcdBackend;
use super::holder::holder_info;
use crate::requests;

/// Keys a listing reads per Range (keys only: about 100 bytes each).
const LIST_PAGE: i64 = 500;

/// Held locks whose value and lease TTL a listing reads at once.
const LIST_CONCURRENCY: usize = 16;

/// The resolution of the TTLs etcd reports (whole seconds, rounded down).
const TTL_RESOLUTION: Duration = Duration::from_secs(1);

impl EtcdBackend {
    /// The owner key of `name` as a holder, with its lease's remaining TTL.
    pub(super) async fn holder(&self, name: &LockName) -> Result<Option<HolderInfo>> {
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
    pub(super) async fn remaining(&self, key: &KeyValue) -> Result<Option<Duration>> {
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
        let Some(stored) = stored? else {
            return Ok(None);
        };
        if stored.create_revision != head.create_revision || stored.lease != head.lease {
            return Ok(None);
        }
        let remaining = remaining?;
        if remaining == Some(Duration::ZERO) {
            return Ok(None);
        }
        let holder = holder_info(&stored, remaining);
        Ok(Some(HeldLock::new(name, holder)))
    }

    /// Every lock held now whose name starts with `prefix` (see `LockBackend::list`): the
    /// owner keys from [`heads_under`](Self::heads_under), then [`held`](Self::held) for
    /// each, [`LIST_CONCURRENCY`] at a time.
    pub(super) async fn held_under(&self, prefix: &str) -> Result<Vec<HeldLock>> {
        let heads = self.heads_under(prefix).await?;
        let entries = stream::iter(heads)
            .map(|(name, head)| self.held(name, head))
            .buffered(LIST_CONCURRENCY);
        let found: Vec<Option<HeldLock>> = entries.try_collect().await?;
        Ok(found.into_iter().flatten().collect())
    }

    /// Deletes the owner key of `name` (Range + LeaseTimeToLive + DeleteRange); who held it.
    pub(super) async fn break_holder(&self, name: &LockName) -> Result<Option<HolderInfo>> {
        let prefix = self.layout.lock_prefix(name);
        let Some(head) = self.client.head(&prefix).await? else {
            return Ok(None);
        };
        let remaining = self.remaining(&head).await.ok().flatten();
        let deleted = self.client.delete(&head.key).await?;
        Ok(deleted.then(|| holder_info(&head, remaining)))
    }
}
