//! [`LockGuard`]: a held lease, refreshed in the background, with its health.

use std::fmt;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use crate::error::{Error, Result};
use crate::held::{self, Ending, Finishing, Held};
use crate::mailbox::KeeperHandle;
use crate::name::LockName;
use crate::state::{Event, Health, LostReason};
use crate::types::{FenceToken, Lease};

/// A held lock. Its locker's keeper (one background task per locker and runtime, for all
/// its guards) refreshes the lease every refresh interval and tracks its [`Health`]; check
/// it between steps of your critical section (Lai's GCS locking post,
/// "Lock usage").
///
/// Dropping the guard releases the lease best-effort in the background; it never blocks
/// and never panics, not even outside a runtime (the lease then expires by its TTL). Call
/// [`release`](LockGuard::release) to learn whether the release worked.
///
/// ```no_run
/// # async fn demo(locker: lockcore::Locker) -> Result<(), lockcore::Error> {
/// let guard = locker.acquire("nightly-report").await?;
/// tokio::select! {
///     reason = guard.lost() => eprintln!("stopping: {reason}"),
///     () = async { /* the critical section */ } => {}
/// }
/// guard.release().await?;
/// # Ok(()) }
/// ```
pub struct LockGuard {
    name: LockName,
    token: Option<FenceToken>,
    shared: Arc<Held>,
    health: watch::Receiver<Health>,
    /// The keeper refreshing this lease.
    keeper: KeeperHandle,
    /// Released, left or handed over: nothing left for `Drop` to do.
    ended: bool,
}

impl LockGuard {
    pub(crate) fn new(shared: Arc<Held>, keeper: KeeperHandle) -> Self {
        let lease = shared.lease();
        Self {
            name: lease.name().clone(),
            token: lease.token(),
            health: shared.subscribe(),
            shared,
            keeper,
            ended: false,
        }
    }

    /// The lock's name.
    pub fn name(&self) -> &LockName {
        &self.name
    }

    /// The fencing token of this grant; pass it to the protected resource with every
    /// write. `None` for backends without fencing.
    pub fn fence_token(&self) -> Option<FenceToken> {
        self.token
    }

    /// The current lease (its grant state changes as refreshes succeed).
    pub fn lease(&self) -> Lease {
        self.shared.lease()
    }

    /// A watch of the lease's health, to await changes.
    pub fn health(&self) -> watch::Receiver<Health> {
        self.health.clone()
    }

    /// The health right now, honest even when the refresher task cannot run: a live state
    /// reads as `Lost(ValidityExpired)` once the local validity deadline has passed (the
    /// keeper may be starved by blocking work on the runtime), and as
    /// `Lost(RefresherStopped)` if the keeper has stopped (its runtime shut down).
    pub fn state(&self) -> Health {
        let health = self.health.borrow().clone();
        if !health.is_held() {
            return health;
        }
        if self.keeper.is_closed() {
            return Health::Lost(LostReason::RefresherStopped);
        }
        if self.shared.clock.now() >= self.shared.validity() {
            // Lost for good: recorded, so that no refresh answer the keeper handles later
            // brings the lease back; sub-tasks holding the cancellation token hear it too.
            self.shared.apply(Event::ValidityExpired);
            self.shared.cancel.cancel();
            return Health::Lost(LostReason::ValidityExpired);
        }
        health
    }

    /// `true` while the lease is believed to be ours (`Healthy` or `Degraded`) and its
    /// local validity has not run out: the check to make between steps of a critical
    /// section. Same as `self.state().is_held()`.
    pub fn is_held(&self) -> bool {
        self.state().is_held()
    }

    /// How long the lease is still valid by the locker's [`Clock`](crate::Clock) (which
    /// counts a machine suspend, unlike the runtime's clock): counted from when
    /// the last successful acquire or refresh request was *sent*, minus the drift
    /// allowance. Zero once the lease is lost or released.
    pub fn remaining_validity(&self) -> Duration {
        if !self.state().is_held() {
            return Duration::ZERO;
        }
        self.shared
            .validity()
            .saturating_duration_since(self.shared.clock.now())
    }

    /// A handle to this lease's local validity deadline, for code that must act at that
    /// deadline from outside the async runtime (`anylock run`'s watchdog thread). Unlike
    /// [`remaining_validity`](Self::remaining_validity), it ignores the health: a lost
    /// lease keeps its last deadline, past which the server may have let someone else in.
    pub fn deadline(&self) -> Deadline {
        Deadline {
            shared: Arc::downgrade(&self.shared),
        }
    }

    /// Resolves when the lease is lost, with the reason.
    ///
    /// # Cancel safety
    /// Cancel safe: it only watches the health state.
    pub async fn lost(&self) -> LostReason {
        let mut rx = self.health.clone();
        loop {
            if let Health::Lost(reason) = &*rx.borrow_and_update() {
                return reason.clone();
            }
            tokio::select! {
                changed = rx.changed() => {
                    if changed.is_err() {
                        return LostReason::RefresherStopped;
                    }
                }
                () = self.keeper.closed() => return LostReason::RefresherStopped,
            }
        }
    }

    /// A token cancelled when the lease ends (lost, released or dropped), for `select!`
    /// or to hand to sub-tasks of the critical section.
    pub fn cancellation_token(&self) -> CancellationToken {
        self.shared.cancel.clone()
    }

    /// Stops refreshing and releases the lease (compare-and-delete).
    ///
    /// # Errors
    /// [`ErrorKind::Lost`](crate::ErrorKind::Lost) when the lease had been lost (your
    /// critical section was not protected to the end); the backend's error when the
    /// release call failed (the lease then expires by its TTL).
    ///
    /// The release runs in the calling task (the keeper only stops refreshing), so it
    /// costs one backend call and no hand-off between tasks.
    ///
    /// # Cancel safety
    /// Dropping the future does not stop the release: the rest of it moves to a task of
    /// its own.
    pub async fn release(mut self) -> Result<()> {
        self.ended = true;
        let keeper_gone = !self.keeper.forget(self.shared.id);
        let shared = Arc::clone(&self.shared);
        self.end(held::release(shared, Ending::Release, keeper_gone))
            .await
    }

    /// Stops refreshing and leaves the lease to expire `ttl` from now, without releasing
    /// it: the lock stays held after this guard, and this process, are gone. For a lock
    /// that must outlive its holder (held across several CI steps) or be held for at least
    /// a while (ShedLock's `lockAtLeastFor`: a job that finished early still keeps a late
    /// run elsewhere from starting it again).
    ///
    /// # Contract
    /// - Sends one refresh whose TTL is `ttl` (at least [`MIN_TTL`](crate::MIN_TTL)), then
    ///   [`LockBackend::detach`](crate::LockBackend::detach); never releases, whatever
    ///   happens.
    /// - `Ok(lease)` only when both succeeded: the lease, as the server set it, expires no
    ///   earlier than `ttl` after this call began, on the server's clock. It may last
    ///   longer where the backend's TTL has a coarser granularity (etcd renews its lease's
    ///   granted TTL, in whole seconds); a backend that set a shorter TTL than asked is an
    ///   error. `ttl` may be shorter or longer than the TTL the lease had.
    /// - The health becomes [`Health::Released`](crate::Health::Released) on success; the
    ///   cancellation token is cancelled either way.
    /// - On error the lease is not released: it expires by the TTL it had before (or by
    ///   `ttl` if the refresh took effect but its reply was lost), so it may end earlier
    ///   than asked. Do not assume it is still held.
    ///
    /// # Errors
    /// [`ErrorKind::Lost`](crate::ErrorKind::Lost) when the lease had been lost, or the
    /// refresh found it gone; [`ErrorKind::InvalidInput`](crate::ErrorKind::InvalidInput)
    /// when `ttl` is above [`MAX_TTL`](crate::MAX_TTL); the backend's error when the refresh
    /// or the detach failed, [`ErrorKind::OutcomeUnknown`](crate::ErrorKind::OutcomeUnknown)
    /// when either got no reply within the refresh timeout.
    ///
    /// # Cancel safety
    /// Dropping the future does not stop it: the rest of it moves to a task of its own.
    pub async fn leave_for(self, ttl: Duration) -> Result<Lease> {
        if ttl > crate::MAX_TTL {
            // Dropping `self` now releases the lease best-effort, as any dropped guard.
            return Err(Error::invalid_input(format!(
                "leave_for: TTL {ttl:?} is above the maximum {:?}",
                crate::MAX_TTL
            ))
            .with_lock(&self.name));
        }
        self.leave(Some(ttl.max(crate::MIN_TTL))).await
    }

    /// Stops refreshing without releasing: the lease expires by the TTL of its last grant
    /// or refresh. [`leave_for`](Self::leave_for) without the refresh (one call less, for
    /// a lease just granted with the TTL wanted).
    ///
    /// # Contract
    /// As [`leave_for`](Self::leave_for), except that no refresh is sent: `Ok(lease)`
    /// once [`LockBackend::detach`](crate::LockBackend::detach) succeeded, the lease
    /// expiring `lease.ttl()` after its last grant or refresh was sent.
    ///
    /// # Errors
    /// [`ErrorKind::Lost`](crate::ErrorKind::Lost) when the lease had been lost; the
    /// backend's error when the detach failed.
    ///
    /// # Cancel safety
    /// As [`leave_for`](Self::leave_for).
    pub async fn detach(self) -> Result<Lease> {
        self.leave(None).await
    }

    async fn leave(mut self, ttl: Option<Duration>) -> Result<Lease> {
        self.ended = true;
        // Wait for a refresh the keeper has in flight: it must not land after ours.
        let in_flight = self.keeper.leave(self.shared.id);
        let shared = Arc::clone(&self.shared);
        self.end(async move {
            let keeper_gone = in_flight.is_none();
            if let Some(in_flight) = in_flight {
                // The keeper drops the sender once nothing of this lease is in flight.
                let _ = in_flight.await;
            }
            held::leave(shared, ttl, keeper_gone).await
        })
        .await
    }

    /// Runs `work`, which ends the lease, in this task (finished in a task of its own if
    /// this future is dropped halfway). Awaited outside any tokio runtime (from another
    /// executor), it runs on the keeper's runtime instead: its timeouts need tokio's timer.
    async fn end<T: Send + 'static>(
        &self,
        work: impl Future<Output = Result<T>> + Send + 'static,
    ) -> Result<T> {
        if tokio::runtime::Handle::try_current().is_ok() {
            return Finishing::new(work).await;
        }
        match self.keeper.runtime.spawn(work).await {
            Ok(result) => result,
            Err(_) => Err(Error::lost(format!(
                "the lease was lost before it ended: {}",
                LostReason::RefresherStopped
            ))
            .with_lock(&self.name)),
        }
    }
}

impl Drop for LockGuard {
    /// Releases best-effort in a task on the keeper's runtime (the current one if the
    /// keeper's is gone). Never blocks or panics; with no runtime left at all the lease
    /// expires by its TTL.
    fn drop(&mut self) {
        if self.ended {
            return;
        }
        let shared = Arc::clone(&self.shared);
        let keeper_gone = !self.keeper.forget(shared.id);
        // On the keeper's runtime, which outlives a short-lived one the guard may be
        // dropped on; with the keeper gone, on the current one.
        let runtime = match keeper_gone {
            false => Some(self.keeper.runtime.clone()),
            true => tokio::runtime::Handle::try_current().ok(),
        };
        match runtime {
            Some(runtime) => {
                drop(runtime.spawn(held::release(shared, Ending::Abandon, keeper_gone)))
            }
            None => {
                tracing::debug!(lock = %self.name, "no runtime to release a dropped guard; it expires by its TTL")
            }
        }
    }
}

/// A lease's local validity deadline, readable from any thread ([`LockGuard::deadline`]).
/// It holds nothing of the lease alive.
#[derive(Clone)]
pub struct Deadline {
    shared: std::sync::Weak<Held>,
}

impl Deadline {
    /// How long until the lease's local validity deadline, on the locker's
    /// [`Clock`](crate::Clock), whatever its health: a refresh moves it later; zero once
    /// it has passed, and once the lease has ended for this process.
    pub fn left(&self) -> Duration {
        let Some(shared) = self.shared.upgrade() else {
            return Duration::ZERO;
        };
        // Released (or left) here: no longer this process's lease, whoever still holds
        // the record of it.
        if matches!(shared.current(), Health::Released) {
            return Duration::ZERO;
        }
        shared
            .validity()
            .saturating_duration_since(shared.clock.now())
    }
}

impl fmt::Debug for Deadline {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Deadline")
            .field("left", &self.left())
            .finish()
    }
}

impl fmt::Debug for LockGuard {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LockGuard")
            .field("name", &self.name)
            .field("fence_token", &self.token)
            .field("health", &self.state())
            .field("remaining_validity", &self.remaining_validity())
            .finish()
    }
}
