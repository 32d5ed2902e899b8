//! The [`LockBackend`] trait every backend implements.

use std::fmt;
use std::pin::Pin;
use std::sync::Arc;

use async_trait::async_trait;
use futures_core::Stream;

use crate::error::Result;
use crate::guarantees::Guarantees;
use crate::name::LockName;
use crate::types::HeldLock;
use crate::types::{Acquire, AcquireRequest, FenceToken, HolderInfo, Lease};

/// A stream that yields an item whenever a lock *may* have been released.
///
/// Spurious items are allowed (waiters simply retry); missed items are tolerated because
/// waiters also poll with bounded backoff. The stream ending means notifications stopped
/// (connection lost); waiters then fall back to polling.
pub type ReleaseEvents = Pin<Box<dyn Stream<Item = ()> + Send + 'static>>;

/// A waiter's place in a backend's FIFO queue, from [`LockBackend::enqueue`].
///
/// The [`Locker`](crate::Locker) holds the ticket for the rest of the acquisition and drops it
/// when the acquisition ends (granted, timed out, failed or cancelled). Dropping the ticket
/// drops the backend's `place`, whose `Drop` leaves the queue unless the place already
/// became the grant.
pub struct QueueTicket {
    events: Option<ReleaseEvents>,
    _place: Box<dyn std::any::Any + Send + Sync>,
}

impl QueueTicket {
    /// A ticket owning `place`; `events` wake the waiter when its place may be first.
    pub fn new(place: impl std::any::Any + Send + Sync, events: Option<ReleaseEvents>) -> Self {
        Self {
            events,
            _place: Box::new(place),
        }
    }

    /// Takes the wake-up events, leaving the place held.
    pub(crate) fn take_events(&mut self) -> Option<ReleaseEvents> {
        self.events.take()
    }
}

impl fmt::Debug for QueueTicket {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("QueueTicket")
            .field("events", &self.events.is_some())
            .finish_non_exhaustive()
    }
}

/// One lease-lock backend: single attempts against one coordination system.
///
/// A backend performs exactly one attempt per call: no loops, no sleeps, no retries.
/// [`Locker`](crate::Locker) owns waiting, backoff, deadlines, refresh cadence and health.
/// The trait is object safe; `Arc<dyn LockBackend>` is the currency.
///
/// Every method names the lock in its errors through
/// [`Error::with_lock`](crate::Error::with_lock) and the backend through
/// [`Error::with_backend`](crate::Error::with_backend) (the [`Locker`](crate::Locker) fills
/// in both when a backend forgets).
#[async_trait]
pub trait LockBackend: Send + Sync + fmt::Debug + 'static {
    /// A short lowercase backend name for messages: `"redis"`, `"postgres"`, `"memory"`.
    fn backend_name(&self) -> &str;

    /// Makes one attempt to take `request.name`.
    ///
    /// # Contract
    /// - Returns `Acquired` only if, at the server's linearization point, no other owner held
    ///   an unexpired lease on the name; the new lease expires `request.ttl` later on the
    ///   server's clock (or the client's, where
    ///   [`Guarantees::expiry_clock`](crate::Guarantees::expiry_clock) says so).
    /// - Returns `Held` with the holder's identity (and remaining TTL when known) otherwise.
    /// - If the stored owner equals `request.owner` and
    ///   [`Guarantees::same_owner_retake`](crate::Guarantees::same_owner_retake) is claimed,
    ///   takes the lock over at once with a new grant (and a new, greater fence token).
    /// - The lease reports the TTL actually set, never more than the server will honour.
    /// - When the request was sent but the reply was lost, returns
    ///   [`ErrorKind::OutcomeUnknown`](crate::ErrorKind::OutcomeUnknown); a later attempt with
    ///   the same owner must recognise the lock as its own.
    /// - One attempt: never loops or sleeps.
    /// - Returns within a bounded time (the backend's own request timeout). The
    ///   [`Locker`](crate::Locker) never races an unanswered attempt with a second one of
    ///   the same owner, so a call that never returns keeps that owner from the lock in
    ///   this process until the waiter's deadline.
    async fn acquire(&self, request: &AcquireRequest) -> Result<Acquire>;

    /// Extends `lease` by its TTL from now.
    ///
    /// # Contract
    /// - Succeeds only if the server still holds exactly this grant (same owner, same grant
    ///   state); returns the possibly updated lease.
    /// - Fails with [`ErrorKind::Lost`](crate::ErrorKind::Lost) when the lock was deleted,
    ///   expired and taken, or its owner changed. Never re-creates a deleted lock.
    /// - Fails with a temporary error on network problems, timeouts and 5xx/429.
    async fn refresh(&self, lease: &Lease) -> Result<Lease>;

    /// Refreshes several leases in as few round trips as the backend can, for the
    /// [`Locker`](crate::Locker)'s refresher, which groups the refreshes that fall due
    /// together (see [`refresh_batch_limit`](Self::refresh_batch_limit)).
    ///
    /// # Contract
    /// - Returns exactly one result per lease, in the order given; result `i` is what
    ///   [`refresh`](Self::refresh) of `leases[i]` would return: the same condition (the
    ///   server still holds exactly that grant), the same TTL, the same errors.
    /// - One lease's failure never fails another: a lease the server no longer holds is
    ///   [`ErrorKind::Lost`](crate::ErrorKind::Lost) alone. A failure of the whole call
    ///   fails every lease with the error a lone `refresh` would get from that failure
    ///   (temporary for a lost connection, a timeout or a reply that cannot be read), and
    ///   never with `Lost`.
    /// - Never re-creates a deleted lock, whatever the batch holds; the leases are distinct
    ///   grants and may name one lock more than once.
    /// - The default refreshes one lease after another.
    async fn refresh_many(&self, leases: &[Lease]) -> Vec<Result<Lease>> {
        let mut results = Vec::with_capacity(leases.len());
        for lease in leases {
            results.push(self.refresh(lease).await);
        }
        results
    }

    /// How many leases one [`refresh_many`](Self::refresh_many) call may take.
    ///
    /// # Contract
    /// - `1` (the default): the backend has no batch call; each guard refreshes on its
    ///   own schedule with [`refresh`](Self::refresh).
    /// - More than `1`: the [`Locker`](crate::Locker) schedules its guards' refreshes on a
    ///   shared grid (a refresh may come up to a quarter of the refresh interval early, never
    ///   late) and hands the ones due together to `refresh_many`, at most this many at a
    ///   time.
    fn refresh_batch_limit(&self) -> usize {
        1
    }

    /// Releases `lease`.
    ///
    /// # Contract
    /// - Compare-and-delete: removes the lock only if it still holds exactly this grant.
    ///   Never removes another owner's lock.
    /// - Releasing a lease that is already gone (expired, released, taken over) is `Ok`.
    /// - Wakes waiters where the backend supports notification.
    async fn release(&self, lease: &Lease) -> Result<()>;

    /// Lets `lease` outlive this process: its holder has stopped refreshing it and may
    /// exit, and the lease must last until it expires by its TTL
    /// ([`LockGuard::leave_for`](crate::LockGuard::leave_for) calls it after its refresh).
    ///
    /// # Contract
    /// - Never shortens, releases or re-creates the lease.
    /// - Afterwards nothing about this process (its exit included) ends the lease before
    ///   its TTL: a backend that lets contenders take over from a holder it sees dead (the
    ///   embedded one) unties the lease from this process.
    /// - `Ok(())` (the default) when the lease never depends on the process that holds it.
    /// - Fails with [`ErrorKind::Lost`](crate::ErrorKind::Lost) when the lock no longer
    ///   holds exactly this grant.
    async fn detach(&self, lease: &Lease) -> Result<()> {
        let _ = lease;
        Ok(())
    }

    /// The fencing token of `lease`.
    ///
    /// # Contract
    /// - Strictly greater than the token of every earlier grant of the same name, including
    ///   grants after expiry and after release.
    /// - `None` only for backends whose
    ///   [`Guarantees::fencing`](crate::Guarantees::fencing) is `Fencing::None`.
    fn fence_token(&self, lease: &Lease) -> Option<FenceToken> {
        lease.token()
    }

    /// Who holds `name` right now.
    ///
    /// # Contract
    /// - `None` when the name is free (never held, released, or expired).
    /// - Otherwise the holder's identity, and its token and remaining TTL where known.
    async fn inspect(&self, name: &LockName) -> Result<Option<HolderInfo>>;

    /// Makes one attempt to take a permit of the semaphore `request.name`, which admits
    /// `request.permits` holders at once (the [`Locker`](crate::Locker) calls it only with
    /// `permits` set).
    ///
    /// # Contract
    /// - Returns `Acquired` only if, at the server's linearization point, fewer than
    ///   `permits` *other* owners held an unexpired permit of the semaphore; the lease is
    ///   marked with [`Lease::with_permits`] and expires `request.ttl` later, as a lock's.
    /// - One permit per owner: when `request.owner` already holds a live permit, that
    ///   permit is taken over with a new grant (and, where fencing is claimed, a greater
    ///   token), never a second one. So a retry after
    ///   [`ErrorKind::OutcomeUnknown`](crate::ErrorKind::OutcomeUnknown) finds its own.
    /// - Returns `Held` with the live permit holder whose lease expires first (and its
    ///   remaining TTL) when all permits are taken.
    /// - A live permit taken with another limit fails the attempt with
    ///   [`limit_conflict`](crate::limit_conflict) (`InvalidInput`): mixed limits would admit
    ///   more holders than the smaller one allows. The attempt leaves nothing of its own
    ///   held: it writes nothing, or (a backend that can only find the conflict after its
    ///   write, GCS: a list after the slot write) deletes what it wrote before refusing.
    ///   A live permit of the same owner taken with another limit is left alone.
    /// - Fence tokens, where claimed, rise with every permit granted on the semaphore name
    ///   (across releases and expiries), as a lock's do.
    /// - Semaphore names are a namespace of their own: a permit of `x` does not exclude
    ///   the lock `x`, nor the other way round.
    /// - [`refresh`](Self::refresh), [`refresh_many`](Self::refresh_many),
    ///   [`release`](Self::release) and [`detach`](Self::detach) of a lease marked with
    ///   [`Lease::permits`] act on that one permit, under the same contract as for a lock
    ///   (release never frees another owner's permit; refresh never re-creates a permit).
    /// - [`subscribe`](Self::subscribe) of the name may wake on a permit's release too (a
    ///   spurious wake is allowed).
    /// - Backends without semaphores return
    ///   [`ErrorKind::Unsupported`](crate::ErrorKind::Unsupported) (the default), and say
    ///   so with [`Guarantees::semaphores`](crate::Guarantees::semaphores).
    async fn acquire_permit(&self, request: &AcquireRequest) -> Result<Acquire> {
        Err(crate::Error::new(
            crate::ErrorKind::Unsupported,
            format!(
                "the {} backend has no semaphores (permits)",
                self.backend_name()
            ),
        )
        .with_backend(self.backend_name().to_owned())
        .with_lock(&request.name))
    }

    /// The live permits of the semaphore `name`, earliest grant first: owner, token,
    /// remaining TTL and note where known. Empty when none is held.
    ///
    /// Backends without semaphores return
    /// [`ErrorKind::Unsupported`](crate::ErrorKind::Unsupported) (the default).
    async fn inspect_permits(&self, name: &LockName) -> Result<Vec<HolderInfo>> {
        Err(crate::Error::new(
            crate::ErrorKind::Unsupported,
            format!(
                "the {} backend has no semaphores (permits)",
                self.backend_name()
            ),
        )
        .with_backend(self.backend_name().to_owned())
        .with_lock(name))
    }

    /// What this backend promises. Every promise is checked by the conformance suite.
    fn guarantees(&self) -> Guarantees;

    /// Every lock held right now whose name starts with `prefix` (all of them for `""`),
    /// sorted by name (`anylock list`).
    ///
    /// # Contract
    /// - Each entry is what [`inspect`](Self::inspect) would report for its name: expired,
    ///   released and broken grants are left out, and a name appears at most once.
    /// - Matches the prefix byte for byte: no pattern characters (`*`, `%`, `_`, `?`,
    ///   `[`) are interpreted.
    /// - A snapshot read: a lock taken or released during the call may or may not appear,
    ///   but a lock held throughout the call does, and one free throughout does not.
    /// - A scan: its cost grows with what the backend must read to find the prefix's
    ///   locks, which on some backends is every key in the database or every row of the
    ///   table (each backend's docs say which); an operator's tool, not for hot paths.
    /// - Backends that cannot enumerate their locks return
    ///   [`ErrorKind::Unsupported`](crate::ErrorKind::Unsupported) (the default), and say
    ///   so with [`Guarantees::listing`](crate::Guarantees::listing) `false`.
    /// - The caller has checked `prefix` with [`validate_prefix`](crate::validate_prefix).
    async fn list(&self, prefix: &str) -> Result<Vec<HeldLock>> {
        let _ = prefix;
        Err(crate::Error::new(
            crate::ErrorKind::Unsupported,
            "this backend cannot list its locks",
        )
        .with_backend(self.backend_name().to_owned()))
    }

    /// Forcibly removes whoever holds `name`, as an operator would (`anylock break`), and
    /// returns the holder that was removed.
    ///
    /// # Contract
    /// - Removes the current grant whoever owns it; its holder's next refresh fails with
    ///   `Lost`.
    /// - Keeps fencing monotonic: the next grant's token is still greater.
    /// - `Ok(None)` when nobody held it.
    /// - Backends without an operator path return
    ///   [`ErrorKind::Unsupported`](crate::ErrorKind::Unsupported) (the default).
    async fn break_lock(&self, name: &LockName) -> Result<Option<HolderInfo>> {
        Err(crate::Error::new(
            crate::ErrorKind::Unsupported,
            "this backend cannot break locks",
        )
        .with_backend(self.backend_name().to_owned())
        .with_lock(name))
    }

    /// Joins the FIFO queue of waiters for `request.name`, where the backend has one.
    ///
    /// # Contract
    /// - `Ok(None)` (the default): no queue; waiters retry with backoff, woken by
    ///   [`subscribe`](Self::subscribe) events.
    /// - Called by a waiting acquire (never try-once) after an attempt for `request`
    ///   returned `Held`: once per acquisition, and again after the ticket's events ended
    ///   (the place may be lost); the caller then retries at once, and after that on the
    ///   ticket's events or its backoff. A new ticket replaces (drops) the old one; `Ok(None)`
    ///   on a rejoin keeps the old one.
    /// - End the ticket's events when the place is lost (its key deleted, its lease gone),
    ///   so the waiter joins again instead of waiting behind a place that no longer exists.
    /// - While the ticket lives, the backend keeps this waiter's place (keeping alive
    ///   whatever holds it), and `acquire(request)` for the same owner returns `Acquired`
    ///   only once the place is first, turning the place into the grant; later contenders
    ///   cannot jump ahead of it.
    /// - Dropping the ticket leaves the queue promptly unless the place became the grant;
    ///   if the process dies, the place expires with the request's TTL.
    async fn enqueue(&self, request: &AcquireRequest) -> Result<Option<QueueTicket>> {
        let _ = request;
        Ok(None)
    }

    /// Checks options against this backend's own limits, beyond
    /// [`LockOptions::validate`](crate::LockOptions::validate) (for example a store that
    /// accepts about one write per second per object needs a refresh interval of at least
    /// a second). [`Locker`](crate::Locker) calls it before every acquisition.
    ///
    /// # Contract
    /// - `Ok(())` (the default) when the backend has no extra limits.
    /// - No I/O; an [`ErrorKind::InvalidInput`](crate::ErrorKind::InvalidInput) error that
    ///   names the limit and how to meet it.
    fn check_options(&self, options: &crate::LockOptions) -> Result<()> {
        let _ = options;
        Ok(())
    }

    /// The server's current wall-clock time, where the backend exposes it, so tools can
    /// estimate clock skew (`anylock check`). Expiry never depends on this.
    ///
    /// # Contract
    /// - `Ok(None)` when the server has no clock to report (the default).
    /// - One round trip; the caller brackets it with its own clock readings.
    async fn server_time(&self) -> Result<Option<std::time::SystemTime>> {
        Ok(None)
    }

    /// How this handle reaches its servers: TLS or plaintext, what was verified, and who
    /// it authenticated as, one entry per server it talks to (`anylock check`).
    ///
    /// # Contract
    /// - `Ok(vec![])` (the default): the backend does not report it.
    /// - Reports what the live connections use, not what was asked for: a backend that can
    ///   fall back (PostgreSQL's `sslmode=prefer`) asks the server or probes.
    /// - No secret in any field: user names and certificate subjects only.
    async fn connection_security(&self) -> Result<Vec<crate::ConnectionSecurity>> {
        Ok(Vec::new())
    }

    /// Subscribes to release notifications for `name`.
    ///
    /// # Contract
    /// - `Ok(None)`: the backend has no notifications; waiters poll.
    /// - The stream yields after every release of `name` that happens after this call
    ///   returns (spurious extra items are allowed).
    /// - Must be called *before* the attempt it is meant to wake, so no release is missed.
    ///   [`Locker`](crate::Locker) subscribes after an attempt found the lock held and
    ///   then attempts once more before it waits (a lock found free costs no subscription).
    async fn subscribe(&self, name: &LockName) -> Result<Option<ReleaseEvents>> {
        let _ = name;
        Ok(None)
    }
}

#[async_trait]
impl<T: LockBackend + ?Sized> LockBackend for Arc<T> {
    fn backend_name(&self) -> &str {
        (**self).backend_name()
    }
    async fn acquire(&self, request: &AcquireRequest) -> Result<Acquire> {
        (**self).acquire(request).await
    }
    async fn refresh(&self, lease: &Lease) -> Result<Lease> {
        (**self).refresh(lease).await
    }
    async fn release(&self, lease: &Lease) -> Result<()> {
        (**self).release(lease).await
    }
    async fn refresh_many(&self, leases: &[Lease]) -> Vec<Result<Lease>> {
        (**self).refresh_many(leases).await
    }
    fn refresh_batch_limit(&self) -> usize {
        (**self).refresh_batch_limit()
    }
    async fn detach(&self, lease: &Lease) -> Result<()> {
        (**self).detach(lease).await
    }
    fn fence_token(&self, lease: &Lease) -> Option<FenceToken> {
        (**self).fence_token(lease)
    }
    async fn inspect(&self, name: &LockName) -> Result<Option<HolderInfo>> {
        (**self).inspect(name).await
    }
    async fn acquire_permit(&self, request: &AcquireRequest) -> Result<Acquire> {
        (**self).acquire_permit(request).await
    }
    async fn inspect_permits(&self, name: &LockName) -> Result<Vec<HolderInfo>> {
        (**self).inspect_permits(name).await
    }
    fn guarantees(&self) -> Guarantees {
        (**self).guarantees()
    }
    async fn list(&self, prefix: &str) -> Result<Vec<HeldLock>> {
        (**self).list(prefix).await
    }
    async fn break_lock(&self, name: &LockName) -> Result<Option<HolderInfo>> {
        (**self).break_lock(name).await
    }
    async fn enqueue(&self, request: &AcquireRequest) -> Result<Option<QueueTicket>> {
        (**self).enqueue(request).await
    }
    fn check_options(&self, options: &crate::LockOptions) -> Result<()> {
        (**self).check_options(options)
    }
    async fn server_time(&self) -> Result<Option<std::time::SystemTime>> {
        (**self).server_time().await
    }
    async fn subscribe(&self, name: &LockName) -> Result<Option<ReleaseEvents>> {
        (**self).subscribe(name).await
    }
    async fn connection_security(&self) -> Result<Vec<crate::ConnectionSecurity>> {
        (**self).connection_security().await
    }
}

/// Compile-time guard: `LockBackend` must stay object safe.
const _: fn(&dyn LockBackend) = |_| {};
