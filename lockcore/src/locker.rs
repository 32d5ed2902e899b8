//! [`Locker`]: the shared acquire loop over any [`LockBackend`].

use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use tokio::time::Instant;

use crate::attempt::{Attempted, InFlight, Unclaimed};
use crate::backend::LockBackend;
use crate::backoff::JitterRng;
use crate::clock::Clock;
use crate::error::{Error, ErrorKind, Result};
use crate::guard::LockGuard;
use crate::held::Held;
use crate::identity::Identity;
use crate::keeper::Keepers;
use crate::name::LockName;
use crate::options::{LockOptions, WaitMode};
use crate::permit_count::Permits;
use crate::types::HeldLock;
use crate::types::{AcquireRequest, HolderInfo};
use crate::wait::{Wait, held_error};

/// Acquires locks on one backend and hands out [`LockGuard`]s.
///
/// Cheap to clone; clones share the backend and the jitter generator.
///
/// ```
/// use std::{sync::Arc, time::Duration};
/// use lockcore::{Locker, LockOptions, MemoryBackend, WaitMode};
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), lockcore::Error> {
/// let locker = Locker::new(Arc::new(MemoryBackend::new()))
///     .with_options(LockOptions::new(Duration::from_secs(10)));
/// let guard = locker.acquire("report").await?;
/// assert!(locker.try_acquire("report").await?.is_none(), "held by the guard");
/// guard.release().await?;
/// # Ok(()) }
/// ```
#[derive(Debug, Clone)]
pub struct Locker {
    pub(crate) backend: Arc<dyn LockBackend>,
    pub(crate) identity: Option<Identity>,
    pub(crate) options: LockOptions,
    rng: Arc<Mutex<JitterRng>>,
    clock: Clock,
    /// The tasks that refresh this locker's leases, one per runtime.
    keepers: Arc<Keepers>,
}

impl Locker {
    /// A locker on `backend` with default [`LockOptions`]. Each acquisition gets its own
    /// identity ([`Identity::unique`]), so tasks of one process exclude each other.
    pub fn new(backend: Arc<dyn LockBackend>) -> Self {
        Self {
            backend,
            identity: None,
            options: LockOptions::default(),
            rng: Arc::new(Mutex::new(JitterRng::from_entropy())),
            clock: Clock::system(),
            keepers: Arc::default(),
        }
    }

    /// Sets the options [`acquire`](Self::acquire) uses.
    pub fn with_options(mut self, options: LockOptions) -> Self {
        self.options = options;
        self
    }

    /// Uses one fixed identity for every acquisition. Where the backend supports it, a lock
    /// still stored under this identity (abandoned by a crash of this same owner) is retaken
    /// at once instead of waiting for its TTL. Share an identity only between code paths
    /// that never run the critical section concurrently: two holders with one identity can
    /// both "retake" the lock. Within one process this is guarded: while a guard or an
    /// unanswered attempt of this identity for a lock lives, another acquisition of that
    /// lock with this identity waits for it (`TryOnce`: [`ErrorKind::OutcomeUnknown`]), so
    /// re-acquiring a lock you already hold with the same identity waits for yourself.
    pub fn with_identity(mut self, identity: Identity) -> Self {
        self.identity = Some(identity);
        self
    }

    /// Seeds the backoff jitter, for reproducible tests.
    pub fn with_jitter_seed(self, seed: u64) -> Self {
        *self.rng.lock().unwrap_or_else(PoisonError::into_inner) = JitterRng::seeded(seed);
        self
    }

    /// Sets the clock guards follow for lease validity and refresh timing (by default
    /// [`Clock::system`], the runtime's clock plus the time the machine is suspended).
    /// Acquire waits and timeouts keep the runtime's clock. An adjustable clock replays
    /// client clock faults; see [`Clock`].
    pub fn with_clock(mut self, clock: Clock) -> Self {
        self.clock = clock;
        // Keepers follow one clock: a locker with another clock gets its own.
        self.keepers = Arc::default();
        self
    }

    /// The clock this locker's guards follow: judge a deadline derived from a guard's
    /// [`remaining_validity`](crate::LockGuard::remaining_validity) on it, never on the
    /// runtime's clock (which does not count a suspend).
    pub fn clock(&self) -> &Clock {
        &self.clock
    }

    /// How many keepers this locker knows of.
    #[cfg(test)]
    pub(crate) fn keepers_known(&self) -> u64 {
        self.keepers.sum(|_| 1)
    }

    /// How many times this locker's keepers woke (tests of the mailbox read it).
    #[cfg(test)]
    pub(crate) fn keeper_wakes(&self) -> u64 {
        self.keepers
            .sum(|mailbox| mailbox.wakes.load(std::sync::atomic::Ordering::Relaxed))
    }

    /// How many timers this locker's keepers had queued when they last went to sleep.
    #[cfg(test)]
    pub(crate) fn keeper_timers(&self) -> u64 {
        self.keepers
            .sum(|mailbox| mailbox.timers.load(std::sync::atomic::Ordering::Relaxed))
    }

    /// The backend.
    pub fn backend(&self) -> &Arc<dyn LockBackend> {
        &self.backend
    }

    /// The default options.
    pub fn options(&self) -> &LockOptions {
        &self.options
    }

    /// Acquires `name` with the locker's options (by default waiting forever).
    ///
    /// # Errors
    /// See [`acquire_with`](Self::acquire_with).
    ///
    /// # Cancel safety
    /// See [`acquire_with`](Self::acquire_with).
    pub async fn acquire(&self, name: impl AsRef<str>) -> Result<LockGuard> {
        self.acquire_with(name, &self.options).await
    }

    /// One attempt: `Ok(None)` when someone else holds `name`.
    ///
    /// # Errors
    /// As [`acquire_with`](Self::acquire_with), except that a held lock is `Ok(None)`.
    pub async fn try_acquire(&self, name: impl AsRef<str>) -> Result<Option<LockGuard>> {
        let options = self.options.clone().with_wait(WaitMode::TryOnce);
        match self.acquire_with(name, &options).await {
            Ok(guard) => Ok(Some(guard)),
            Err(err) if err.kind() == ErrorKind::Held => Ok(None),
            Err(err) => Err(err),
        }
    }

    /// Acquires `name` with `options`: one attempt, then (unless
    /// [`WaitMode::TryOnce`]) bounded exponential backoff with jitter, never sleeping past
    /// the holder's reported remaining TTL, woken early by the backend's release
    /// notification, until the lock is ours or the deadline passes. Transient backend
    /// errors are retried while waiting.
    ///
    /// The first attempt always completes (bounded by the attempt timeout, see
    /// [`LockOptions::with_attempt_timeout`]), so `WaitMode::Timeout(Duration::ZERO)` is one
    /// real try; an attempt after the first that is still in flight at the deadline is
    /// abandoned (and released if it later succeeds).
    ///
    /// One owner never has two attempts on one lock in flight in this process: an attempt
    /// that has not answered within the attempt timeout is waited for (up to the deadline,
    /// or for ever), not raced by a second one whose grant it could retake; in `TryOnce`
    /// mode the call returns [`ErrorKind::OutcomeUnknown`] instead. A later acquisition
    /// with the same fixed identity waits for such an attempt to settle first.
    ///
    /// # Errors
    /// - [`ErrorKind::InvalidInput`] for a bad name or options, including options outside
    ///   the backend's own limits ([`LockBackend::check_options`]); never retried;
    /// - [`ErrorKind::Held`] with the holder in `TryOnce` mode;
    /// - [`ErrorKind::Timeout`] with the last holder when the deadline passes;
    /// - the backend's error when it is permanent, or in `TryOnce` mode.
    ///
    /// # Cancel safety
    /// Dropping the future never leaves a lock held by nobody: an attempt runs in the
    /// caller's task while the caller waits, moves to a task of its own if the future is
    /// dropped before the attempt settles, and a lease it obtains after the caller has gone
    /// is released at once.
    pub async fn acquire_with(
        &self,
        name: impl AsRef<str>,
        options: &LockOptions,
    ) -> Result<LockGuard> {
        let name = self.lock_name(name)?;
        self.acquire_named(name, None, options).await
    }

    /// The lock `name`, or with `permits` a permit of the semaphore `name`, with
    /// `options`: checks the options, builds the request, runs the loop.
    pub(crate) async fn acquire_named(
        &self,
        name: LockName,
        permits: Option<Permits>,
        options: &LockOptions,
    ) -> Result<LockGuard> {
        options
            .validate()
            .and_then(|()| self.backend.check_options(options))
            .map_err(self.context(&name))?;
        let owner = self.identity.clone().unwrap_or_else(Identity::unique);
        let ttl = options.lease_ttl().map_err(self.context(&name))?;
        let mut request = AcquireRequest::new(name, owner, ttl).with_note(options.note().cloned());
        request.permits = permits;
        self.acquire_loop(&request, options)
            .await
            .map_err(self.context(&request.name))
    }

    /// Who holds `name` right now.
    ///
    /// # Errors
    /// [`ErrorKind::InvalidInput`] for a bad name; the backend's error otherwise.
    pub async fn inspect(&self, name: impl AsRef<str>) -> Result<Option<HolderInfo>> {
        let name = self.lock_name(name)?;
        self.backend
            .inspect(&name)
            .await
            .map_err(self.context(&name))
    }

    /// Removes `name`'s lease whoever holds it, as an operator would
    /// ([`LockBackend::break_lock`]), and returns who held it.
    ///
    /// # Errors
    /// [`ErrorKind::InvalidInput`] for a bad name; the backend's error otherwise.
    pub async fn break_lock(&self, name: impl AsRef<str>) -> Result<Option<HolderInfo>> {
        let name = self.lock_name(name)?;
        self.backend
            .break_lock(&name)
            .await
            .map_err(self.context(&name))
    }

    /// Every lock held right now whose name starts with `prefix` (`""` for all), sorted
    /// by name, as [`LockBackend::list`] reports it.
    ///
    /// # Errors
    /// [`ErrorKind::InvalidInput`] for a bad prefix; [`ErrorKind::Unsupported`] when the
    /// backend cannot list (see [`Guarantees::listing`](crate::Guarantees::listing)); the
    /// backend's error otherwise.
    pub async fn list(&self, prefix: &str) -> Result<Vec<HeldLock>> {
        let backend = self.backend.backend_name();
        crate::validate_prefix(prefix).map_err(|e| Error::from(e).in_backend(backend))?;
        let mut held = (self.backend.list(prefix).await).map_err(|e| e.in_backend(backend))?;
        held.sort_by(|a, b| a.name().cmp(b.name()));
        Ok(held)
    }

    /// `name` as a [`LockName`]; a bad one is an error naming this locker's backend.
    pub(crate) fn lock_name(&self, name: impl AsRef<str>) -> Result<LockName> {
        let backend = self.backend.backend_name();
        LockName::new(name).map_err(|e| Error::from(e).in_backend(backend))
    }

    /// Names this locker's backend and `name` on an error that does not name them yet: the
    /// one place, with the keeper and `held.rs`, that errors get their context.
    pub(crate) fn context<'a>(&'a self, name: &'a LockName) -> impl Fn(Error) -> Error + 'a {
        move |e| e.in_context(self.backend.backend_name(), name)
    }

    pub(crate) async fn acquire_loop(
        &self,
        request: &AcquireRequest,
        options: &LockOptions,
    ) -> Result<LockGuard> {
        let mut wait = Wait::start(options, request.permits);
        // The first attempt always runs to completion (bounded by the attempt timeout), so
        // a zero or tiny wait still means "one real try"; later ones stop at the deadline.
        let mut first = true;
        loop {
            // When this attempt left, on the runtime's clock (the one the wait sleeps on).
            let sent_at = Instant::now();
            let outcome = self.attempt(request, options, first, wait.deadline).await;
            first = false;
            match outcome {
                Ok((sent, Attempted::Acquired(grant))) => {
                    if let Some(guard) = self.start_guard(grant, sent, options) {
                        return Ok(guard);
                    }
                    if options.wait() == WaitMode::TryOnce {
                        return Err(Error::new(
                            ErrorKind::OutcomeUnknown,
                            "the grant arrived with no validity left and was released",
                        ));
                    }
                    wait.no_holder();
                }
                Ok((_, Attempted::Held(holder))) if options.wait() == WaitMode::TryOnce => {
                    return Err(held_error(holder, request.permits));
                }
                Ok((_, Attempted::Held(holder))) => {
                    wait.held_by(holder, sent_at);
                    // Our place may already be first, and a release just before the
                    // subscription notifies no one: either way, try again before sleeping.
                    let queued = wait.join_queue(&self.backend, request).await;
                    let subscribed = wait.subscribe(&self.backend, request).await;
                    if queued || subscribed {
                        continue;
                    }
                }
                Err(err) if err.kind() == ErrorKind::Timeout => {
                    return Err(wait.timed_out(Some(err)));
                }
                Err(err) if err.is_temporary() && options.wait() != WaitMode::TryOnce => {
                    tracing::debug!(error = %err, "acquire attempt failed; retrying");
                    wait.attempt_failed(err);
                }
                Err(err) => return Err(err),
            }
            let unit = self
                .rng
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .next_unit();
            wait.pause(unit).await?;
        }
    }

    /// One backend attempt ([`InFlight`], in this task unless abandoned), with the time it was sent on
    /// the locker's clock. Never two in flight for one owner and lock: an attempt that has
    /// not answered within the attempt timeout is waited for, not raced by another, up to
    /// the wait deadline (forever when waiting forever). In `TryOnce` mode the call gives
    /// up at the attempt timeout with [`ErrorKind::OutcomeUnknown`]; a grant that arrives
    /// later is released before this owner's next attempt on the lock may start.
    async fn attempt(
        &self,
        request: &AcquireRequest,
        options: &LockOptions,
        first: bool,
        deadline: Option<Instant>,
    ) -> Result<(Instant, Attempted)> {
        let slot_limit = Instant::now() + options.acquire_timeout();
        let limit = match deadline {
            _ if options.wait() == WaitMode::TryOnce => Some(slot_limit),
            Some(deadline) if first => Some(deadline.max(slot_limit)),
            deadline => deadline,
        };
        let release_limit = options.acquire_timeout().min(Duration::from_secs(30));
        let Some(mut in_flight) =
            InFlight::start(&self.backend, request, &self.clock, limit, release_limit).await
        else {
            return Err(still_in_flight(options));
        };
        let sent = in_flight.sent;
        // The attempt's own timeout counts from when it was sent, not from when this call
        // began waiting for the owner's slot.
        let own_limit = Instant::now() + options.acquire_timeout();
        // A try-once attempt is always a first one: its limit becomes its own.
        let limit = match limit {
            Some(limit) if first => Some(limit.max(own_limit)),
            limit => limit,
        };
        if limit.is_none_or(|limit| limit > own_limit) {
            if let Some(outcome) = in_flight.outcome(Some(own_limit)).await {
                return outcome.map(|o| (sent, o));
            }
            tracing::debug!(
                timeout = ?options.acquire_timeout(),
                "acquire attempt still unanswered; waiting for its outcome instead of sending another"
            );
        }
        match in_flight.outcome(limit).await {
            Some(outcome) => outcome.map(|o| (sent, o)),
            None if options.wait() == WaitMode::TryOnce => Err(Error::new(
                ErrorKind::OutcomeUnknown,
                format!(
                    "acquire got no reply within {:?}",
                    options.acquire_timeout()
                ),
            )),
            None => Err(Error::new(
                ErrorKind::Timeout,
                "the wait deadline passed while an attempt was in flight",
            )),
        }
    }

    /// Wraps a fresh grant in a guard and starts its refresher, unless its validity is
    /// already gone (the reply was too slow), in which case it is released.
    fn start_guard(
        &self,
        grant: Unclaimed,
        sent: Instant,
        options: &LockOptions,
    ) -> Option<LockGuard> {
        let ttl = grant.lease().ttl().get().min(options.ttl());
        let validity = (sent + ttl).checked_sub(options.drift()).unwrap_or(sent);
        if validity <= self.clock.now() {
            tracing::debug!(lock = %grant.lease().name(), "lease arrived with no validity left; releasing");
            drop(grant); // releases itself
            return None;
        }
        let (lease, slot) = grant.claim();
        let backend = Arc::clone(&self.backend);
        let held = Held::new(
            lease,
            validity,
            self.clock.clone(),
            backend,
            options.clone(),
            slot,
        );
        let held = Arc::new(held);
        let keeper = self.keepers.handle(&self.backend, &self.clock);
        // A keeper that is gone already shows in the guard as `Lost(RefresherStopped)`.
        keeper.keep(Arc::clone(&held), sent + options.refresh_interval());
        Some(LockGuard::new(held, keeper))
    }
}

/// An earlier attempt of this owner for this lock had not settled (or its guard was still
/// live) when we gave up waiting for it: sending another could race it.
fn still_in_flight(options: &LockOptions) -> Error {
    let message = "an earlier acquire attempt by this owner for this lock is still in flight, \
                   or its guard still holds the lock in this process";
    match options.wait() {
        WaitMode::TryOnce => Error::new(ErrorKind::OutcomeUnknown, message),
        _ => Error::new(ErrorKind::Timeout, message),
    }
}
