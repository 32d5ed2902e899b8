//! One acquire attempt: a backend call run in the caller's task (moved to a task of its
//! own only if the caller stops waiting), with at most one in flight per lock name and
//! owner in this process.
//!
//! Why at most one: backends let an owner instantly retake a lock stored under its own
//! identity (that is how a lost reply is recovered). Two attempts of one owner in flight
//! would let the later-landing one retake the grant the other was given, and its own
//! unwanted grant would then be released: the lock free while a guard reports it held
//! (issue #14, item 1). So an attempt registers a slot before it is sent and frees it only
//! once its outcome is settled: answered and not a grant, or released (by the guard that
//! claimed it, when that guard is done, or here when nobody claimed it).
//!
//! The key is the lock name, the owner and whether it is the semaphore of that name, not
//! the backend: two `Arc`s over one store (two `anylock::connect` calls) are the same
//! store, and a lock name with one owner on two different stores only loses a little
//! concurrency.

use std::collections::HashMap;
use std::sync::{Arc, LazyLock, Mutex, PoisonError};
use std::time::Duration;

use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::pin::Pin;

use futures_util::FutureExt;
use tokio::sync::Notify;
use tokio::time::{Instant, timeout_at};

use crate::backend::LockBackend;
use crate::clock::Clock;
use crate::error::Result;
use crate::identity::Identity;
use crate::name::LockName;
use crate::types::{Acquire, AcquireRequest, HolderInfo, Lease};

/// Lock name and owner, and whether it is the semaphore of that name (a namespace of its
/// own: a permit guard never holds up the lock of its name, nor the other way round).
type Key = (bool, LockName, Identity);

/// Attempts in flight in this process, each with the wake-up its waiters share: created
/// by the first owner that has to wait, so an uncontended slot costs one insert and one
/// remove.
static IN_FLIGHT: LazyLock<Mutex<HashMap<Key, Option<Arc<Notify>>>>> =
    LazyLock::new(Mutex::default);

fn in_flight() -> std::sync::MutexGuard<'static, HashMap<Key, Option<Arc<Notify>>>> {
    IN_FLIGHT.lock().unwrap_or_else(PoisonError::into_inner)
}

/// An attempt's registration; dropping it lets the owner's next attempt start. A claimed
/// grant's slot moves into its guard's refresher and is dropped when that is done.
#[derive(Debug)]
pub(crate) struct Slot {
    key: Key,
}

impl Slot {
    /// Takes the slot for `key` once no other attempt or guard holds it; `None` if
    /// `limit` passes first.
    async fn take(key: Key, limit: Option<Instant>) -> Option<Slot> {
        loop {
            let notify: Arc<Notify>;
            let freed = {
                let mut map = in_flight();
                match map.get_mut(&key) {
                    Some(waiters) => notify = Arc::clone(waiters.get_or_insert_with(Arc::default)),
                    None => {
                        map.insert(key.clone(), None);
                        return Some(Slot { key });
                    }
                }
                // Created under the map's lock, while the entry is there: the slot's drop
                // removes the entry under that lock and then wakes every `Notified`
                // created so far, so it cannot be missed.
                notify.notified()
            };
            match limit {
                Some(limit) => timeout_at(limit, freed).await.ok()?,
                None => freed.await,
            };
        }
    }
}

impl Drop for Slot {
    /// The map holds an entry for `key` exactly while its one `Slot` lives, so the entry
    /// is ours. Removing it and then waking its waiters lets one of them take it.
    fn drop(&mut self) {
        let waiters = in_flight().remove(&self.key).flatten();
        if let Some(waiters) = waiters {
            waiters.notify_waiters();
        }
    }
}

/// An attempt's outcome on its way back to the acquire loop.
#[derive(Debug)]
pub(crate) enum Attempted {
    Acquired(Unclaimed),
    Held(HolderInfo),
}

impl Attempted {
    fn new(
        outcome: Acquire,
        backend: &Arc<dyn LockBackend>,
        slot: Slot,
        release_limit: Duration,
    ) -> Self {
        match outcome {
            Acquire::Acquired(lease) => Attempted::Acquired(Unclaimed {
                lease: Some(lease),
                backend: Arc::clone(backend),
                slot: Some(slot),
                release_limit,
            }),
            Acquire::Held(holder) => Attempted::Held(holder),
        }
    }
}

/// The attempt's work: the backend call, then the outcome with its slot.
type Work = Pin<Box<dyn Future<Output = Result<Attempted>> + Send>>;

/// An attempt in flight. It runs in the caller's task while the caller waits for it; if
/// the caller stops waiting before it is settled (the acquire future is dropped), the
/// rest of it moves to a task of its own ([`Drop`]), so a grant that lands afterwards is
/// still released and the owner's slot still freed only once it is settled.
pub(crate) struct InFlight {
    /// `None` once the outcome was taken.
    work: Option<Work>,
    /// When the request was handed to the backend, on the locker's clock: a grant's
    /// validity counts from here, never from the reply.
    pub(crate) sent: Instant,
    /// The runtime the attempt started on, where [`Drop`] finishes it (the future may be
    /// dropped outside any runtime).
    runtime: Option<tokio::runtime::Handle>,
}

impl std::fmt::Debug for InFlight {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("InFlight")
            .field("settled", &self.work.is_none())
            .field("sent", &self.sent)
            .finish()
    }
}

impl InFlight {
    /// Starts an attempt for `request` on `backend` once no earlier attempt or guard of
    /// the same owner for the same lock is live in this process; `None` if `limit` passes
    /// while one still is. An unclaimed grant's release is bounded by `release_limit`.
    pub(crate) async fn start(
        backend: &Arc<dyn LockBackend>,
        request: &AcquireRequest,
        clock: &Clock,
        limit: Option<Instant>,
        release_limit: Duration,
    ) -> Option<InFlight> {
        let key = (
            request.permits.is_some(),
            request.name.clone(),
            request.owner.clone(),
        );
        let slot = Slot::take(key, limit).await?;
        let backend = Arc::clone(backend);
        let request = request.clone();
        let sent = clock.now();
        let call = async move {
            let outcome = match request.permits {
                Some(_) => backend.acquire_permit(&request).await,
                None => backend.acquire(&request).await,
            };
            // From here the grant is `Unclaimed`: dropped unclaimed, it is released
            // before the slot is freed.
            outcome.map(|o| Attempted::new(o, &backend, slot, release_limit))
        };
        // A backend that panics fails this attempt (a temporary error the loop may retry),
        // not the caller's task; the slot goes with the call when `work` is dropped.
        let work = Box::pin(async move {
            match AssertUnwindSafe(call).catch_unwind().await {
                Ok(outcome) => outcome,
                Err(_) => Err(crate::Error::unavailable(
                    "the backend panicked during an acquire attempt",
                )),
            }
        });
        Some(InFlight {
            work: Some(work),
            sent,
            runtime: tokio::runtime::Handle::try_current().ok(),
        })
    }

    /// Drives the attempt until `limit`; `None` if it passes first (the attempt stays in
    /// flight and can be waited for again).
    pub(crate) async fn outcome(&mut self, limit: Option<Instant>) -> Option<Result<Attempted>> {
        let Some(work) = self.work.as_mut() else {
            return Some(Err(crate::Error::unavailable(
                "the acquire attempt's outcome was already taken",
            )));
        };
        let outcome = match limit {
            Some(limit) => timeout_at(limit, work).await.ok()?,
            None => work.await,
        };
        self.work = None;
        Some(outcome)
    }
}

impl Drop for InFlight {
    /// The caller stopped waiting before the attempt settled: finish it in a task, where
    /// an `Acquired` outcome is dropped unclaimed and so released.
    fn drop(&mut self) {
        let Some(work) = self.work.take() else {
            return;
        };
        let runtime = self.runtime.take();
        match runtime.or_else(|| tokio::runtime::Handle::try_current().ok()) {
            // On the attempt's own runtime, even when dropped outside it; a runtime that
            // has shut down drops the task, as it drops every other.
            Some(runtime) => drop(runtime.spawn(async move { drop(work.await) })),
            // No runtime to finish it: the request may still land, and then it expires by
            // its TTL; dropping `work` frees the slot.
            None => tracing::debug!("no runtime to finish an abandoned acquire attempt"),
        }
    }
}

/// A granted lease nobody has taken responsibility for yet: dropping it releases the lease
/// (in a task on the current runtime), so a grant lost between the attempt task and its
/// caller never stays held until its TTL. Until it is claimed or released, the owner's
/// next attempt for the lock waits, so that release can only remove this grant.
#[derive(Debug)]
pub(crate) struct Unclaimed {
    lease: Option<Lease>,
    backend: Arc<dyn LockBackend>,
    slot: Option<Slot>,
    release_limit: Duration,
}

impl Unclaimed {
    /// Takes responsibility for the lease and its slot (a guard now owns both; its
    /// refresher drops the slot once the lease is released or given up).
    pub(crate) fn claim(mut self) -> (Lease, Slot) {
        let lease = self.lease.take();
        let slot = self.slot.take();
        match (lease, slot) {
            (Some(lease), Some(slot)) => (lease, slot),
            _ => unreachable!("claimed once"),
        }
    }

    /// The granted lease, before it is claimed.
    pub(crate) fn lease(&self) -> &Lease {
        self.lease
            .as_ref()
            .unwrap_or_else(|| unreachable!("read before the claim"))
    }
}

impl Drop for Unclaimed {
    fn drop(&mut self) {
        let Some(lease) = self.lease.take() else {
            return;
        };
        let slot = self.slot.take();
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            tracing::debug!(lock = %lease.name(), "no runtime to release an unclaimed grant; it expires by its TTL");
            return;
        };
        let backend = Arc::clone(&self.backend);
        let limit = self.release_limit;
        runtime.spawn(async move {
            // Bounded, so a hung release cannot keep the owner out of the lock for ever; a
            // release that lands later still compares the grant, so it removes this grant
            // or nothing.
            match tokio::time::timeout(limit, backend.release(&lease)).await {
                Ok(Ok(())) => {}
                Ok(Err(err)) => {
                    tracing::debug!(error = %err, "releasing an unclaimed grant failed")
                }
                Err(_) => tracing::debug!(
                    "releasing an unclaimed grant got no reply; it expires by its TTL"
                ),
            }
            drop(slot);
        });
    }
}
