//! Refreshing leases, one or many through the same code: a keep-alive for every distinct
//! etcd lease on the client's shared keep-alive streams (each lease always on the same
//! one of 8; the locks on one session lease share its one keep-alive), and, concurrently,
//! a keys-only Range for every lease's key, in `Txn`s of at most `--max-txn-ops` Ranges.
//! Any batch takes one round trip: 0 to 8 RPCs for the keep-alives (one per stream that
//! must be opened) and `ceil(n / 128)` Txns. A refresh asking for more time than its
//! etcd lease gives (`LockGuard::leave_for` with a longer TTL) then moves its key to a
//! lease of its own (`LeaseGrant` + `Txn`, see `backend/detach.rs`).

use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use anylock_etcd_proto::mvccpb::KeyValue;
use futures_util::future::join_all;
use lockcore::{Error, ErrorKind, Lease, Result, RetryStatus, Ttl};

use super::EtcdBackend;
use super::grant::{Grant, parse_grant};
use crate::requests::Pin;

impl EtcdBackend {
    /// The one refresh path, for `refresh` (a batch of one) and `refresh_many`.
    pub(super) async fn refresh_leases(&self, leases: &[Lease]) -> Vec<Result<Lease>> {
        let grants: Vec<Result<Grant>> = leases.iter().map(parse_grant).collect();
        let mut ids: Vec<i64> = Vec::new();
        let mut index: HashMap<i64, usize> = HashMap::new();
        let mut keys: Vec<Vec<u8>> = Vec::new();
        for (lease, grant) in leases.iter().zip(&grants) {
            let Ok(grant) = grant else {
                continue;
            };
            index.entry(grant.lease).or_insert_with(|| {
                ids.push(grant.lease);
                ids.len() - 1
            });
            keys.push(grant.key(&self.layout, lease.name()));
        }
        let sent = Instant::now();
        let (alive, stored) =
            tokio::join!(self.client.keep_alive_many(&ids), self.check_keys(&keys));
        if let Ok(ttls) = &alive {
            for (id, ttl) in ids.iter().zip(ttls) {
                self.sessions.confirm(*id, sent, *ttl);
            }
            self.sessions.stragglers.sweep();
        }
        let mut alive = per_lease(alive, &grants, &index, keys.len()).into_iter();
        let mut stored = stored.into_iter();
        let mut results = Vec::with_capacity(leases.len());
        let mut longer = Vec::new();
        for (at, (lease, grant)) in leases.iter().zip(grants).enumerate() {
            let result = grant.and_then(|grant| {
                let (Some(alive), Some(stored)) = (alive.next(), stored.next()) else {
                    return Err(Error::unavailable("refresh: a reply went missing"));
                };
                let ttl = alive.as_ref().ok().copied();
                let refreshed = verdict(lease, (grant.lease, grant.pin()), alive, stored)?;
                match ttl {
                    Some(ttl) if refreshed.ttl().as_secs() > ttl => {
                        longer.push((at, grant));
                        Ok(refreshed)
                    }
                    Some(ttl) => Ok(at_most(refreshed, ttl)),
                    None => Ok(refreshed),
                }
            });
            results.push(result);
        }
        // Leases asking for more than their etcd lease gives: each moved to its own.
        let moved = join_all(longer.iter().map(|(at, grant)| {
            let lease = &leases[*at];
            self.move_key(lease, grant, lease.ttl())
        }))
        .await;
        for ((at, _), result) in longer.into_iter().zip(moved) {
            results[at] = result;
        }
        results
    }

    /// Each key as read, in order: one Txn per `txn_ops` keys (at first `MAX_TXN_OPS`,
    /// halved each time etcd refuses a Txn as too large), concurrently.
    async fn check_keys(&self, keys: &[Vec<u8>]) -> Vec<Result<Option<KeyValue>>> {
        let size = self.txn_ops.load(Ordering::Relaxed).max(1);
        let chunks: Vec<&[Vec<u8>]> = keys.chunks(size).collect();
        let reads = join_all(chunks.iter().map(|chunk| self.client.check_keys(chunk))).await;
        let mut stored = Vec::with_capacity(keys.len());
        for (chunk, read) in chunks.iter().zip(reads) {
            match read {
                Ok(kvs) => stored.extend(kvs.into_iter().map(Ok)),
                Err(err) => {
                    let err = self.txn_too_large(err, size);
                    stored.extend(spread::<Option<KeyValue>>(Err(err), chunk.len()));
                }
            }
        }
        stored
    }

    /// etcd refuses a Txn with more operations than its `--max-txn-ops`: smaller Txns from
    /// now on, and this time a temporary error (the leases are not at fault).
    fn txn_too_large(&self, err: Error, size: usize) -> Error {
        let refused = err.kind() == ErrorKind::InvalidInput
            && err.message().contains("too many operations in txn request");
        if !refused {
            return err;
        }
        let smaller = (size / 2).max(1);
        let _ = self
            .txn_ops
            .compare_exchange(size, smaller, Ordering::Relaxed, Ordering::Relaxed);
        tracing::warn!(
            size,
            smaller,
            "etcd refused a Txn of {size} Ranges (--max-txn-ops is lower): {smaller} from now on"
        );
        Error::new(
            ErrorKind::Unavailable,
            format!(
                "{} (the cluster's --max-txn-ops is below {size}; the next refresh sends at most {smaller} per Txn)",
                err.message()
            ),
        )
        .with_status(RetryStatus::Temporary)
    }
}

/// The keep-alive reply of each lease whose grant parsed, in order: its etcd lease's TTL
/// (`index` maps a lease id to its place in the keep-alive call), or a copy of the whole
/// call's error.
fn per_lease(
    alive: Result<Vec<i64>>,
    grants: &[Result<Grant>],
    index: &HashMap<i64, usize>,
    n: usize,
) -> Vec<Result<i64>> {
    match alive {
        Ok(ttls) => grants
            .iter()
            .flatten()
            .map(|grant| {
                ttls.get(index[&grant.lease])
                    .copied()
                    .ok_or_else(|| Error::unavailable("refresh: a keep-alive reply went missing"))
            })
            .collect(),
        Err(err) => err.copies(n).into_iter().map(Err).collect(),
    }
}

/// `lease` with its TTL cut to the `granted` seconds its etcd lease was renewed to: a
/// refresh never reports more than the server gives.
fn at_most(lease: Lease, granted: i64) -> Lease {
    let granted = Duration::from_secs(u64::try_from(granted).unwrap_or(0));
    match Ttl::new(granted) {
        Ok(ttl) if granted < lease.ttl().get() => lease.with_ttl(ttl),
        _ => lease,
    }
}

/// A whole call's result, one per lease: the values, or a copy of its error for each.
fn spread<T>(result: Result<Vec<T>>, n: usize) -> Vec<Result<T>> {
    match result {
        Ok(values) => values.into_iter().map(Ok).collect(),
        Err(err) => err.copies(n).into_iter().map(Err).collect(),
    }
}

/// What refreshing one lease says, from its keep-alive reply (`alive`: the TTL etcd
/// answered) and its key as read (`stored`):
/// - TTL `<= 0`: the lease is gone (and took the key with it): `Lost`;
/// - the key read, and missing, or with another revision (`pin`: a lock key's create
///   revision, a permit's slot's mod revision) or lease: `Lost`;
/// - otherwise the keep-alive's error, then the read's error, else the lease.
///
/// A lease is never `Lost` for a failed call: only a reply about that lease makes it so.
pub(crate) fn verdict(
    lease: &Lease,
    (id, pin): (i64, Pin),
    alive: Result<i64>,
    stored: Result<Option<KeyValue>>,
) -> Result<Lease> {
    if matches!(alive, Ok(ttl) if ttl <= 0) {
        return Err(Error::lost(
            "our etcd lease expired (and took our key with it)",
        ));
    }
    if let Ok(stored) = &stored {
        let ours = stored
            .as_ref()
            .is_some_and(|kv| pin.holds(kv) && kv.lease == id);
        if !ours {
            return Err(Error::lost("our lock key was deleted or replaced"));
        }
    }
    alive?;
    stored?;
    Ok(lease.clone())
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use lockcore::{Identity, LockName, Ttl};

    fn lease() -> Lease {
        let name = LockName::new("x").expect("valid");
        let ttl = Ttl::new(Duration::from_secs(10)).expect("valid TTL");
        Lease::new(name, Identity::unique(), ttl, "1f:42")
    }

    fn key(revision: i64, lease: i64) -> Option<KeyValue> {
        Some(KeyValue {
            create_revision: revision,
            mod_revision: revision + 7,
            lease,
            ..KeyValue::default()
        })
    }

    fn failed<T>(kind: ErrorKind) -> Result<T> {
        Err(Error::new(kind, "failed"))
    }

    /// Every combination of keep-alive reply and key read, as the single refresh always
    /// decided it: Lost only on a reply about this lease or its key.
    #[test]
    fn the_verdict_is_lost_only_on_evidence_about_this_lease() {
        use ErrorKind::{Lost, Unavailable};
        let grant = (0x1f, Pin::Created(42));
        let kind = |alive, stored| verdict(&lease(), grant, alive, stored).map_err(|e| e.kind());
        assert!(kind(Ok(10), Ok(key(42, 0x1f))).is_ok());
        assert_eq!(kind(Ok(0), Ok(key(42, 0x1f))), Err(Lost));
        assert_eq!(kind(Ok(-1), failed(Unavailable)), Err(Lost));
        assert_eq!(kind(Ok(10), Ok(None)), Err(Lost));
        assert_eq!(kind(Ok(10), Ok(key(43, 0x1f))), Err(Lost), "recreated");
        assert_eq!(kind(Ok(10), Ok(key(42, 0x20))), Err(Lost), "other lease");
        assert_eq!(kind(failed(Unavailable), Ok(None)), Err(Lost));
        assert_eq!(
            kind(failed(Unavailable), Ok(key(42, 0x1f))),
            Err(Unavailable)
        );
        assert_eq!(kind(Ok(10), failed(Unavailable)), Err(Unavailable));
        assert_eq!(
            kind(failed(Unavailable), failed(ErrorKind::OutcomeUnknown)),
            Err(Unavailable)
        );
        // A permit is pinned by its slot's mod revision: a retake rewrote the slot in
        // place (same create revision, new mod revision), so the old grant is Lost.
        let permit = (0x1f, Pin::Modified(49));
        let kind = |stored| verdict(&lease(), permit, Ok(10), stored).map_err(|e| e.kind());
        assert!(kind(Ok(key(42, 0x1f))).is_ok());
        assert_eq!(kind(Ok(key(43, 0x1f))), Err(Lost), "rewritten");
        assert_eq!(kind(Ok(key(42, 0x20))), Err(Lost), "other lease");
    }

    #[test]
    fn a_failed_call_fails_every_lease_alike_and_temporarily() {
        let spread = spread::<i64>(Err(Error::unavailable("down")), 3);
        assert_eq!(spread.len(), 3);
        for result in spread {
            let err = result.expect_err("failed");
            assert_eq!(err.kind(), ErrorKind::Unavailable);
            assert!(err.is_temporary());
            assert_eq!(err.message(), "down");
        }
    }
}
