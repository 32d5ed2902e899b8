//! [`LockGuard`]: a held lease, refreshed in the background, with its health.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{mpsc, oneshot, watch};
use tokio_util::sync::CancellationToken;

use crate::driver::{Command, Shared};
use crate::error::{Error, Result};
use crate::name::LockName;
use crate::state::{Health, LostReason};
use crate::types::{FenceToken, Lease};

/// A held lock. A background task refreshes the lease every refresh interval and tracks its
/// [`Health`]; check it between steps of your critical section (seed 000, "Lock usage").
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
    shared: Arc<Shared>,
    health: watch::Receiver<Health>,
    commands: mpsc::UnboundedSender<Command>,
    released: bool,
}

impl LockGuard {
    pub(crate) fn new(
        shared: Arc<Shared>,
        health: watch::Receiver<Health>,
        commands: mpsc::UnboundedSender<Command>,
    ) -> Self {
        let lease = shared.lease();
        Self {
            name: lease.name().clone(),
            token: lease.token(),
            shared,
            health,
            commands,
            released: false,
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
    /// refresher may be starved by blocking work on the runtime), and as
    /// `Lost(RefresherStopped)` if the refresher has stopped (its runtime shut down).
    pub fn state(&self) -> Health {
        let health = self.health.borrow().clone();
        if !health.is_held() {
            return health;
        }
        if self.health.has_changed().is_err() {
            return Health::Lost(LostReason::RefresherStopped);
        }
        if self.shared.clock.now() >= self.shared.validity() {
            // Tell sub-tasks holding the cancellation token too; the refresher will catch up.
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

    /// How long the lease is still valid by the locker's [`Clock`](crate::Clock) (the
    /// runtime's monotonic clock unless set otherwise): counted from when
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
            if rx.changed().await.is_err() {
                return LostReason::RefresherStopped;
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
    /// # Cancel safety
    /// Dropping the future does not stop the release: it is already handed to the
    /// refresher task.
    pub async fn release(mut self) -> Result<()> {
        self.released = true;
        let (reply, outcome) = oneshot::channel();
        if self.commands.send(Command::Release(reply)).is_err() {
            return Err(self.stopped());
        }
        outcome.await.unwrap_or_else(|_| Err(self.stopped()))
    }

    fn stopped(&self) -> Error {
        Error::lost(format!(
            "the lease was lost before release: {}",
            LostReason::RefresherStopped
        ))
        .with_lock(&self.name)
    }
}

impl Drop for LockGuard {
    fn drop(&mut self) {
        if !self.released {
            // An unbounded send is synchronous and never blocks or panics; if the refresher
            // is gone (runtime shut down) the lease simply expires by its TTL.
            let _ = self.commands.send(Command::Abandon);
        }
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
