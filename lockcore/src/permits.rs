//! Semaphores: [`Permits`] (the N of "at most N holders") and the [`Locker`] methods that
//! take one permit of a named semaphore.
//!
//! A permit is a lease like a lock's: the same [`LockGuard`], refresher, health signals,
//! `Lost` and cancellation rules. What differs is the grant condition (fewer than N other
//! live permits) and that the backend keeps one permit per owner identity: a retry by the
//! same owner after a lost reply finds its own permit instead of taking a second one.
//! Semaphore names are a namespace of their own: a semaphore `jobs` and a lock `jobs` do
//! not exclude each other.

use crate::ErrorKind;
use crate::error::Result;
use crate::guard::LockGuard;
use crate::locker::Locker;
use crate::options::{LockOptions, WaitMode};
use crate::permit_count::Permits;
use crate::types::HolderInfo;

impl Locker {
    /// Takes one permit of the semaphore `name` of `permits` permits, with the locker's
    /// options (by default waiting for ever).
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> lockcore::Result<()> {
    /// use std::sync::Arc;
    /// use lockcore::{Locker, MemoryBackend};
    /// let locker = Locker::new(Arc::new(MemoryBackend::new()));
    /// let a = locker.acquire_permit("workers", 2).await?;
    /// let b = locker.acquire_permit("workers", 2).await?;
    /// assert!(locker.try_acquire_permit("workers", 2).await?.is_none());
    /// assert_eq!(locker.inspect_permits("workers").await?.len(), 2);
    /// a.release().await?;
    /// assert!(locker.try_acquire_permit("workers", 2).await?.is_some());
    /// # drop(b); Ok(()) }
    /// ```
    ///
    /// # Errors
    /// As [`acquire_permit_with`](Self::acquire_permit_with).
    pub async fn acquire_permit(&self, name: impl AsRef<str>, permits: u32) -> Result<LockGuard> {
        self.acquire_permit_with(name, permits, &self.options).await
    }

    /// One attempt at a permit: `Ok(None)` when all `permits` are held by others.
    ///
    /// # Errors
    /// As [`acquire_permit_with`](Self::acquire_permit_with), except that a full
    /// semaphore is `Ok(None)`.
    pub async fn try_acquire_permit(
        &self,
        name: impl AsRef<str>,
        permits: u32,
    ) -> Result<Option<LockGuard>> {
        let options = self.options.clone().with_wait(WaitMode::TryOnce);
        match self.acquire_permit_with(name, permits, &options).await {
            Ok(guard) => Ok(Some(guard)),
            Err(err) if err.kind() == ErrorKind::Held => Ok(None),
            Err(err) => Err(err),
        }
    }

    /// Takes one permit of the semaphore `name` of `permits` permits with `options`: the
    /// same loop as [`acquire_with`](Self::acquire_with) (backoff bounded by the
    /// soonest-expiring holder's TTL, woken by release notifications where the backend
    /// sends them, one attempt per owner in flight, cancel-safe), and the same guard.
    ///
    /// The guard's [`fence_token`](LockGuard::fence_token), where the backend fences,
    /// rises with every permit granted on this semaphore: it orders grants, but with more
    /// than one permit an older token may still be held, so a resource cannot reject "any
    /// token below the highest seen" as it would for a lock.
    ///
    /// # Errors
    /// - [`ErrorKind::InvalidInput`] for a bad name, options, or `permits` outside 1 to
    ///   [`MAX_PERMITS`](crate::MAX_PERMITS), and when live permits of `name` were taken with another limit;
    /// - [`ErrorKind::Unsupported`] when the backend has no semaphores (see
    ///   [`Guarantees::semaphores`](crate::Guarantees::semaphores));
    /// - [`ErrorKind::Held`] in `TryOnce` mode, [`ErrorKind::Timeout`] at the deadline,
    ///   and the backend's errors, as for a lock.
    pub async fn acquire_permit_with(
        &self,
        name: impl AsRef<str>,
        permits: u32,
        options: &LockOptions,
    ) -> Result<LockGuard> {
        let name = self.lock_name(name)?;
        let permits = Permits::new(permits).map_err(|e| self.context(&name)(e.into()))?;
        self.acquire_named(name, Some(permits), options).await
    }

    /// The live permits of the semaphore `name`, earliest grant first.
    ///
    /// # Errors
    /// [`ErrorKind::InvalidInput`] for a bad name; [`ErrorKind::Unsupported`] when the
    /// backend has no semaphores; the backend's error otherwise.
    pub async fn inspect_permits(&self, name: impl AsRef<str>) -> Result<Vec<HolderInfo>> {
        let name = self.lock_name(name)?;
        self.backend
            .inspect_permits(&name)
            .await
            .map_err(self.context(&name))
    }
}

/// The error a backend returns when a live permit of the semaphore was taken with another
/// limit: mixing limits would let more holders in than the smaller one allows.
pub fn limit_conflict(name: &str, held: u32, asked: u32) -> crate::Error {
    crate::Error::new(
        ErrorKind::InvalidInput,
        format!(
            "semaphore {name} is held with a limit of {held} permits; this request asked for \
             {asked}: every holder of a semaphore must use the same limit"
        ),
    )
}
