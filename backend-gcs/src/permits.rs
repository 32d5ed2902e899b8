//! Semaphores (permits): one slot object per permit, one list per attempt (`docs/gcs.md`,
//! "Semaphores"; the names are [`PermitNames`]'s).
//!
//! A slot is a lock object (the lock's metadata, staleness and refresh rules) with one more
//! metadata key: the limit it was taken with. Its fence token is its generation, as a
//! lock's is its object's: set by GCS when the write that makes the grant lands, and higher
//! for every later write of any object (GCS generations are the server's clock in µs; the
//! test server keeps them strictly rising), after a delete too. A permit's lease is pinned
//! to its slot object's generation and metageneration, so refresh and release act on
//! exactly that grant, as a lock's do on the lock object
//! ([`Target`](crate::permit_names::Target)).

use std::time::SystemTime;

use lockcore::{
    Acquire, AcquireRequest, Error, ErrorKind, FenceToken, HolderInfo, Identity, Lease, Permits,
    Result, limit_conflict,
};
use serde_json::{Value, json};

use crate::backend::GcsBackend;
use crate::client::Preconditions;
use crate::error::{no_bucket, protocol};
use crate::object::{self, LockObject};
use crate::permit_names::{Part, PermitNames, permit_grant};
use crate::reply::Reply;

/// Slot metadata key: the limit (number of permits) the permit was taken with.
const KEY_PERMITS: &str = "permits";

/// One slot object as a list showed it, judged at its page's `Date`.
#[derive(Debug)]
struct Slot {
    index: u32,
    obj: LockObject,
    limit: u32,
    token: u64,
    date: SystemTime,
}

impl Slot {
    /// Reads a list item. Anything a slot must carry and does not (a planted object, a
    /// damaged one) is a `Protocol` error: guessing could admit one holder too many.
    fn from_item(index: u32, item: &Value, date: SystemTime) -> Result<Self> {
        let bad = |what: &str| {
            protocol(format!(
                "permit slot {index} of the semaphore has no valid {what}; delete the \
                 object if anylock did not write it"
            ))
        };
        let obj = LockObject::from_json(item)
            .map_err(|_| bad("`generation`, `metageneration` or `updated`"))?;
        let meta = |key: &str| {
            item.get("metadata")
                .and_then(|m| m.get(key))
                .and_then(Value::as_str)
        };
        if obj.identity.as_deref().is_none_or(str::is_empty) {
            return Err(bad("`identity` metadata"));
        }
        if obj.ttl.is_none() {
            return Err(bad("`ttl_ms` metadata"));
        }
        let limit = meta(KEY_PERMITS)
            .and_then(|v| v.parse().ok())
            .filter(|n| Permits::new(*n).is_ok())
            .ok_or_else(|| bad("`permits` metadata"))?;
        let token = obj.generation;
        Ok(Self {
            index,
            obj,
            limit,
            token,
            date,
        })
    }

    /// Not stale on the server's clock, as the lock judges its object.
    fn is_live(&self) -> bool {
        !self.obj.is_stale(self.date)
    }

    fn holder(&self) -> HolderInfo {
        self.obj
            .holder(Some(self.date))
            .with_token(FenceToken::new(self.token))
    }

    /// A write that succeeds only on exactly this object as listed.
    fn exact(&self) -> Preconditions {
        Preconditions::exact(self.obj.generation, self.obj.metageneration)
    }
}

/// The slots of a semaphore as one list (all its pages) showed them, by index, each once.
#[derive(Debug, Default)]
struct Seen {
    slots: Vec<Slot>,
}

impl Seen {
    fn add(&mut self, names: &PermitNames, item: &Value, date: SystemTime) -> Result<()> {
        let Some(object) = item.get("name").and_then(Value::as_str) else {
            return Err(protocol("a list item has no `name`"));
        };
        // A fence object (written by versions that drew tokens from one) is not a slot.
        if let Some(Part::Slot(index)) = names.part(object) {
            self.slots.push(Slot::from_item(index, item, date)?);
        }
        Ok(())
    }

    fn live(&self) -> impl Iterator<Item = &Slot> {
        self.slots.iter().filter(|s| s.is_live())
    }

    /// The live holder whose permit lapses first, with its time left.
    fn first_to_expire(&self) -> Option<HolderInfo> {
        self.live()
            .min_by_key(|s| s.obj.expires_at())
            .map(Slot::holder)
    }

    /// Where `owner` may take a permit of `limit`, and the write's preconditions: its own
    /// live slot (a retake); else, when fewer than `limit` others hold a live one, an
    /// index below `limit` whose slot is missing (create-if-absent) or stale (exactly that
    /// object). `None` when full. Among the free indices the owner's hash picks one:
    /// contenders with one snapshot spread over the free slots (a lowest-first choice
    /// would send them all to one slot, admitting one grant at a time), while one owner
    /// asking twice with one snapshot picks the same slot twice (one write wins).
    fn place_for(&self, owner: &Identity, limit: u32) -> Option<(u32, Preconditions)> {
        if let Some(own) = self.live().find(|s| s.obj.is_owned_by(owner)) {
            return Some((own.index, own.exact()));
        }
        if self.live().count() >= limit as usize {
            return None;
        }
        let free: Vec<(u32, Preconditions)> = (0..limit)
            .filter_map(|i| match self.slots.binary_search_by_key(&i, |s| s.index) {
                Err(_) => Some((i, absent())),
                Ok(at) if !self.slots[at].is_live() => Some((i, self.slots[at].exact())),
                Ok(_) => None,
            })
            .collect();
        let pick = fnv1a(owner.as_str().as_bytes()) % (free.len().max(1) as u64);
        free.get(usize::try_from(pick).unwrap_or(0)).copied()
    }
}

/// FNV-1a, 64 bits: stable across processes and versions, so two processes of one
/// identity choose alike.
fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |hash, &b| {
        (hash ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    })
}

/// Create-if-absent.
fn absent() -> Preconditions {
    Preconditions {
        generation: Some(0),
        metageneration: None,
    }
}

/// A slot's metadata: the lock's (identity, TTL, expiry for people, note) plus the limit,
/// in the one conditional write that makes the grant.
fn slot_metadata(request: &AcquireRequest, limit: Permits) -> Value {
    let mut value = object::grant_metadata(&request.owner, request.ttl, request.note.as_ref());
    if let Value::Object(map) = &mut value {
        map.insert(KEY_PERMITS.into(), json!(limit.get().to_string()));
    }
    value
}

impl GcsBackend {
    /// One attempt at a permit of `limit` (no loop, no sleep): one list of the
    /// semaphore's objects; a limit conflict, or `Held` when full, writes nothing.
    /// Otherwise write the chosen slot under the preconditions listed; the written
    /// object's generation is the token. A 412 there means another contender moved first:
    /// `Held`, named by one more list, and no permit written.
    pub(crate) async fn try_acquire_permit(
        &self,
        names: &PermitNames,
        request: &AcquireRequest,
        limit: Permits,
    ) -> Result<Acquire> {
        let seen = self.permits_seen(names).await?;
        if let Some(other) = seen.live().find(|s| s.limit != limit.get()) {
            // Our own live permit of our limit beside another limit: an earlier attempt of
            // ours whose check could not finish (or, with one identity shared by several
            // processes, which is not supported, another's: docs/gcs.md). It goes too, so
            // the refusal leaves nothing of ours held. A permit of our identity taken with another limit is
            // not ours to judge (another process sharing the identity, whose limit may be
            // the right one): left alone, as the other backends leave it.
            let ours = |s: &&Slot| s.obj.is_owned_by(&request.owner) && s.limit == limit.get();
            if let Some(own) = seen.live().find(ours) {
                self.client
                    .delete(&names.slot(own.index), own.exact())
                    .await?;
            }
            let name = request.name.as_str();
            return Err(limit_conflict(name, other.limit, limit.get()));
        }
        let Some((slot, preconditions)) = seen.place_for(&request.owner, limit.get()) else {
            return held(seen.first_to_expire());
        };
        let metadata = slot_metadata(request, limit);
        let object = names.slot(slot);
        match self
            .client
            .insert(&object, metadata, preconditions)
            .await?
            .reply
        {
            Reply::Ok(Some(obj)) => {
                let grant = permit_grant(slot, &obj);
                let lease = Lease::new(
                    request.name.clone(),
                    request.owner.clone(),
                    request.ttl,
                    grant,
                );
                let lease = lease.with_token(FenceToken::new(obj.generation));
                let written = Preconditions::exact(obj.generation, obj.metageneration);
                self.check_limit(names, request, limit, (slot, written))
                    .await?;
                Ok(Acquire::Acquired(lease.with_permits(limit)))
            }
            Reply::Ok(None) => Err(protocol("the insert reply has no object")),
            Reply::NotFound => Err(no_bucket()),
            Reply::PreconditionFailed => self.lost_race(names).await,
        }
    }

    /// After our slot write: one more list. Two attempts with different limits that both
    /// listed before either wrote each find the other here, so they never both keep a
    /// permit: of two live slots with different limits, the one written later was written
    /// before the later writer's check, which sees it. A conflict deletes our slot (exactly
    /// the object written) and refuses with [`limit_conflict`]. A check that cannot be made
    /// deletes it too and answers `Unavailable` (a retry starts afresh). Only when that
    /// delete fails is the answer `OutcomeUnknown`: the permit may be held, and a retry
    /// (same owner) finds it and checks again, or drops it on a conflict.
    async fn check_limit(
        &self,
        names: &PermitNames,
        request: &AcquireRequest,
        limit: Permits,
        (slot, written): (u32, Preconditions),
    ) -> Result<()> {
        let refusal = match self.permits_seen(names).await {
            Err(err) => Error::new(
                ErrorKind::Unavailable,
                format!(
                    "the permit written could not be checked against other limits, so it was \
                     deleted: {err}"
                ),
            ),
            Ok(seen) => match seen.live().find(|s| s.limit != limit.get()) {
                None => return Ok(()),
                Some(other) => limit_conflict(request.name.as_str(), other.limit, limit.get()),
            },
        };
        // Any answer but a transport error means the slot is no longer ours: deleted now,
        // or already gone or taken over (404, 412).
        match self.client.delete(&names.slot(slot), written).await {
            Ok(_) => Err(refusal),
            Err(err) => Err(Error::new(
                ErrorKind::OutcomeUnknown,
                format!(
                    "a permit was written and then had to be refused ({}), but deleting it \
                     failed, so it may be held until its TTL or a retry: {err}",
                    refusal.message()
                ),
            )),
        }
    }

    /// The live permits, earliest grant (lowest token) first.
    pub(crate) async fn try_inspect_permits(&self, names: &PermitNames) -> Result<Vec<HolderInfo>> {
        let seen = self.permits_seen(names).await?;
        let mut live: Vec<&Slot> = seen.live().collect();
        live.sort_by_key(|s| s.token);
        Ok(live.into_iter().map(Slot::holder).collect())
    }

    /// After the slot write's 412 (another contender took that slot first, or the slot
    /// changed since the list): `Held`, naming the live holder that lapses first.
    async fn lost_race(&self, names: &PermitNames) -> Result<Acquire> {
        match self.permits_seen(names).await?.first_to_expire() {
            Some(holder) => Ok(Acquire::Held(holder)),
            None => Err(Error::unavailable(
                "the semaphore changed during the attempt; retry",
            )),
        }
    }

    /// The semaphore's objects: `objects.list` under its prefix, every page (at most the
    /// slots of the largest limit ever used, plus a fence object earlier versions wrote).
    async fn permits_seen(&self, names: &PermitNames) -> Result<Seen> {
        let mut seen = Seen::default();
        let mut token: Option<String> = None;
        loop {
            let page = self.client.list(names.prefix(), token.as_deref()).await?;
            for item in &page.items {
                seen.add(names, item, page.date)?;
            }
            match page.next_page_token {
                None => break,
                Some(next) if token.as_deref() == Some(next.as_str()) => {
                    return Err(protocol("GCS answered the same list page token twice"));
                }
                next => token = next,
            }
        }
        seen.slots.sort_by_key(|s| s.index);
        seen.slots.dedup_by_key(|s| s.index);
        Ok(seen)
    }
}

/// `Held` by `holder`; a full semaphore always has one.
fn held(holder: Option<HolderInfo>) -> Result<Acquire> {
    holder
        .map(Acquire::Held)
        .ok_or_else(|| protocol("a full semaphore without a live permit"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn item(name: &str, metadata: Value) -> Value {
        json!({"name": name, "generation": "7", "metageneration": "1",
            "updated": "2026-01-01T00:00:00Z", "metadata": metadata})
    }

    fn date(secs: u64) -> SystemTime {
        object::parse_rfc3339("2026-01-01T00:00:00Z").expect("time") + Duration::from_secs(secs)
    }

    #[test]
    fn a_slot_without_what_a_permit_needs_is_a_protocol_error() {
        let good = json!({"identity": "a", "ttl_ms": "3000", "permits": "2"});
        let slot = Slot::from_item(0, &item("x", good.clone()), date(0)).expect("slot");
        assert_eq!(
            (slot.limit, slot.token),
            (2, slot.obj.generation),
            "the token is the generation"
        );
        for (key, value) in [
            ("identity", json!("")),
            ("ttl_ms", json!("soon")),
            ("permits", json!("0")),
            ("permits", json!("10001")),
            ("permits", json!(2)),
        ] {
            let mut metadata = good.clone();
            metadata[key] = value;
            let err = Slot::from_item(0, &item("x", metadata), date(0)).expect_err(key);
            assert_eq!(err.kind(), lockcore::ErrorKind::Protocol, "{key}");
            assert!(err.to_string().contains(key), "{err}");
        }
        let no_metadata = json!({"generation": "7", "metageneration": "1", "updated": "x"});
        assert!(Slot::from_item(0, &no_metadata, date(0)).is_err());
    }

    #[test]
    fn a_place_is_the_own_slot_else_the_lowest_free_or_stale_one() {
        let slot = |index: u32, owner: &str, ttl_ms: u64| {
            let metadata = json!({"identity": owner, "ttl_ms": ttl_ms.to_string(),
                "permits": "3"});
            Slot::from_item(index, &item("x", metadata), date(10)).expect("slot")
        };
        let me = Identity::from_stored("me");
        let seen = Seen {
            slots: vec![
                slot(0, "a", 60_000),
                slot(1, "b", 1_000),
                slot(2, "c", 60_000),
            ],
        };
        let (index, pre) = seen.place_for(&me, 3).expect("slot 1 is stale");
        assert_eq!(
            (index, pre.generation, pre.metageneration),
            (1, Some(7), Some(1))
        );
        let full = Seen {
            slots: vec![slot(0, "a", 60_000), slot(2, "c", 60_000)],
        };
        assert_eq!(
            full.place_for(&me, 3).map(|p| p.0),
            Some(1),
            "a missing slot"
        );
        assert!(full.place_for(&me, 2).is_none(), "full at 2");
        let mine = Seen {
            slots: vec![slot(0, "a", 60_000), slot(1, "me", 60_000)],
        };
        assert_eq!(mine.place_for(&me, 2).map(|p| p.0), Some(1), "a retake");
        let empty = Seen::default();
        let picks: std::collections::HashSet<u32> = (0..32)
            .filter_map(|_| empty.place_for(&Identity::unique(), 8).map(|p| p.0))
            .collect();
        assert!(
            picks.len() > 2,
            "contenders spread over the free slots: {picks:?}"
        );
        assert!(picks.iter().all(|&i| i < 8));
        let twice = (empty.place_for(&me, 8), empty.place_for(&me, 8));
        assert_eq!(
            twice.0.map(|p| p.0),
            twice.1.map(|p| p.0),
            "one owner, one choice"
        );
        assert_eq!(
            full.first_to_expire()
                .map(|h| h.owner().as_str().to_owned()),
            Some("a".into())
        );
    }
}
