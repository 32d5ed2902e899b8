//! A held lease's state, shared by its [`LockGuard`](crate::LockGuard) and its locker's
//! [keeper](crate::keeper), and the ways a held lease ends: released, left to expire, or
//! abandoned by a dropped guard.
//!
//! The keeper refreshes; everything that ends a lease runs in the task that asks for it
//! (the caller of [`LockGuard::release`](crate::LockGuard::release), or a task spawned for
//! a dropped guard), after telling the keeper to stop. A refresh the keeper had already
//! sent may still land after the release: every backend refreshes only the exact grant it
//! is given and never re-creates a lock, so that refresh finds nothing and changes nothing.

use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{Context, Poll};
use std::time::Duration;

use futures_util::FutureExt;
use tokio::sync::watch;
use tokio::time::{Instant, timeout};
use tokio_util::sync::CancellationToken;

use crate::attempt::Slot;
use crate::backend::LockBackend;
use crate::clock::Clock;
use crate::error::{Error, ErrorKind, Result, RetryStatus};
use crate::options::LockOptions;
use crate::state::{Event, Health, LostReason, transition};
use crate::ttl::Ttl;
use crate::types::Lease;

/// Ids of held leases, unique in this process (the keeper's key).
static NEXT_ID: AtomicU64 = AtomicU64::new(1);

/// One held lease: what the guard reads and the keeper writes.
#[derive(Debug)]
pub(crate) struct Held {
    pub(crate) id: u64,
    /// The lease and its validity deadline (on `clock`'s time line), changed together.
    state: Mutex<(Lease, Instant)>,
    pub(crate) clock: Clock,
    pub(crate) cancel: CancellationToken,
    /// The health's sender, dropped once the lease has ended (so watchers see the
    /// channel close, as they did when each guard had a task of its own).
    health: Mutex<Option<watch::Sender<Health>>>,
    /// The health, readable after the sender is gone.
    watch: watch::Receiver<Health>,
    pub(crate) backend: Arc<dyn LockBackend>,
    pub(crate) options: LockOptions,
    /// The owner's slot for this lock: while it lives, no other attempt by this owner for
    /// this lock starts in this process. Dropped once the lease has ended (after its
    /// release), or with the last reference to this.
    slot: Mutex<Option<Slot>>,
}

impl Held {
    pub(crate) fn new(
        lease: Lease,
        validity: Instant,
        clock: Clock,
        backend: Arc<dyn LockBackend>,
        options: LockOptions,
        slot: Slot,
    ) -> Self {
        let (health, watch) = watch::channel(Health::Healthy);
        Self {
            id: NEXT_ID.fetch_add(1, Ordering::Relaxed),
            state: Mutex::new((lease, validity)),
            clock,
            cancel: CancellationToken::new(),
            health: Mutex::new(Some(health)),
            watch,
            backend,
            options,
            slot: Mutex::new(Some(slot)),
        }
    }

    pub(crate) fn lease(&self) -> Lease {
        self.state
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .0
            .clone()
    }

    pub(crate) fn validity(&self) -> Instant {
        self.state.lock().unwrap_or_else(PoisonError::into_inner).1
    }

    pub(crate) fn update(&self, lease: Lease, validity: Instant) {
        *self.state.lock().unwrap_or_else(PoisonError::into_inner) = (lease, validity);
    }

    pub(crate) fn current(&self) -> Health {
        self.watch.borrow().clone()
    }

    /// A watch of the health.
    pub(crate) fn subscribe(&self) -> watch::Receiver<Health> {
        self.watch.clone()
    }

    /// Applies `event` to the health; returns the health it had before. Atomic, so the
    /// keeper and the guard's caller never overwrite each other's terminal state.
    pub(crate) fn apply(&self, event: Event) -> Health {
        let mut before = self.current();
        let max = self.options.max_refresh_failures();
        let sender = self.health.lock().unwrap_or_else(PoisonError::into_inner);
        let Some(sender) = sender.as_ref() else {
            return before;
        };
        sender.send_if_modified(|health| {
            before = health.clone();
            let next = transition(health, event, max);
            if next == *health {
                return false;
            }
            if let Health::Lost(reason) = &next {
                tracing::warn!(lock = %self.lease().name(), %reason, "lease lost");
            }
            *health = next;
            true
        });
        before
    }

    /// Nothing refreshes this lease any more (its keeper stopped): `Lost(RefresherStopped)`
    /// unless it already ended, and the cancellation token fires.
    pub(crate) fn stopped(&self) {
        let sender = self.health.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(sender) = sender.as_ref() {
            sender.send_if_modified(|health| {
                let live = !health.is_terminal();
                if live {
                    *health = Health::Lost(LostReason::RefresherStopped);
                }
                live
            });
        }
        drop(sender);
        self.cancel.cancel();
    }

    /// The lease has ended for this process: its health watch closes and the owner's slot
    /// is free.
    fn ended(&self) {
        drop(
            self.health
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .take(),
        );
        drop(
            self.slot
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .take(),
        );
    }

    /// Validity from a grant or refresh `lease` sent at `sent`.
    pub(crate) fn validity_from(&self, sent: Instant, lease: &Lease) -> Instant {
        let ttl = lease.ttl().get().min(self.options.ttl());
        (sent + ttl)
            .checked_sub(self.options.drift())
            .unwrap_or(sent)
    }

    /// `err` named with this lease's backend and lock.
    fn context(&self, err: Error) -> Error {
        err.in_context(self.backend.backend_name(), self.lease().name())
    }
}

/// How a guard ends its lease.
#[derive(Debug)]
pub(crate) enum Ending {
    /// [`LockGuard::release`](crate::LockGuard::release).
    Release,
    /// The guard was dropped: release best-effort.
    Abandon,
}

/// Releases `held` (or, once lost, releases only if it may still be ours and says it was
/// lost). `keeper_gone`: the keeper stopped (its runtime shut down) before the lease ended.
pub(crate) async fn release(held: Arc<Held>, ending: Ending, keeper_gone: bool) -> Result<()> {
    let result = release_once(&held, keeper_gone).await;
    held.ended();
    if matches!(ending, Ending::Abandon)
        && let Err(err) = &result
    {
        tracing::debug!(error = %err, "best-effort release on drop failed");
    }
    result
}

async fn release_once(held: &Held, keeper_gone: bool) -> Result<()> {
    if let Health::Lost(reason) = held.current() {
        return after_lost(held, &reason, "release").await;
    }
    if keeper_gone {
        return after_lost(held, &LostReason::RefresherStopped, "release").await;
    }
    // A starved task may get here only after the validity ran out: then the critical
    // section was not protected to the end, and release says so.
    if held.clock.now() >= held.validity() {
        held.apply(Event::ValidityExpired);
        return after_lost(held, &LostReason::ValidityExpired, "release").await;
    }
    if let Health::Lost(reason) = held.apply(Event::Released) {
        // The keeper found it lost just now.
        return after_lost(held, &reason, "release").await;
    }
    held.cancel.cancel();
    release_bounded(held).await
}

/// After `Lost`, releases only when the lease may still be ours (a compare-and-delete,
/// safe even if someone else holds the lock by now), and reports the loss. The keeper
/// never releases on the holder's behalf: the application may still be finishing a step
/// it started while `is_held()` said yes (the reliability harness caught exactly that
/// after a client clock jump).
async fn after_lost(held: &Held, reason: &LostReason, before: &str) -> Result<()> {
    held.cancel.cancel();
    if reason.may_still_be_held()
        && let Err(err) = release_bounded(held).await
    {
        tracing::debug!(error = %err, "release after a lost lease failed; it expires by its TTL");
    }
    Err(lost(held, reason, before))
}

fn lost(held: &Held, reason: &LostReason, before: &str) -> Error {
    let err = held.context(Error::lost(format!(
        "the lease was lost before {before}: {reason}"
    )));
    if matches!(reason, LostReason::TooManyFailures { .. }) {
        err.with_status(RetryStatus::Persistent)
    } else {
        err
    }
}

async fn release_bounded(held: &Held) -> Result<()> {
    let limit = held.options.acquire_timeout().min(Duration::from_secs(30));
    let lease = held.lease();
    match timeout(limit, unwound(held.backend.release(&lease), "release")).await {
        Ok(result) => result.map_err(|e| held.context(e)),
        Err(_) => Err(held.context(Error::new(
            ErrorKind::OutcomeUnknown,
            format!("release got no reply within {limit:?}; the lease expires by its TTL"),
        ))),
    }
}

/// [`LockGuard::leave_for`](crate::LockGuard::leave_for): one refresh with `ttl`, raced
/// against the validity deadline and bounded like every refresh, then the backend's
/// [`detach`](LockBackend::detach); never releases. [`LockGuard::detach`](crate::LockGuard::detach):
/// the same without the refresh.
pub(crate) async fn leave(
    held: Arc<Held>,
    ttl: Option<Duration>,
    keeper_gone: bool,
) -> Result<Lease> {
    let result = leave_once(&held, ttl, keeper_gone).await;
    let result = result.map_err(|e| held.context(e));
    if result.is_ok() {
        held.apply(Event::Released);
    }
    held.cancel.cancel();
    held.ended();
    result
}

async fn leave_once(held: &Held, ttl: Option<Duration>, keeper_gone: bool) -> Result<Lease> {
    let reason = match held.current() {
        Health::Lost(reason) => Some(reason),
        _ if keeper_gone => Some(LostReason::RefresherStopped),
        _ if held.clock.now() >= held.validity() => {
            held.apply(Event::ValidityExpired);
            Some(LostReason::ValidityExpired)
        }
        _ => None,
    };
    if let Some(reason) = reason {
        return Err(lost(held, &reason, "it could be left to expire"));
    }
    let lease = match ttl {
        Some(ttl) => refresh_with(held, ttl).await?,
        None => held.lease(),
    };
    let detach = unwound(held.backend.detach(&lease), "detach");
    let detach = timeout(held.options.refresh_timeout(), detach).await;
    match detach {
        Ok(result) => result.map(|()| lease),
        Err(_) => Err(Error::new(
            ErrorKind::OutcomeUnknown,
            "detach got no reply in time; the lease may end when this process exits",
        )),
    }
}

/// One refresh of the held lease with `ttl`; the lease as the server set it.
async fn refresh_with(held: &Held, ttl: Duration) -> Result<Lease> {
    let (old, validity) = (held.lease(), held.validity());
    let clock = held.clock.clone();
    let sent = clock.now();
    let limit = sent + held.options.refresh_timeout();
    let asked = old.clone().with_ttl(Ttl::new(ttl)?);
    let result = tokio::select! {
        biased;
        () = clock.sleep_until(validity) => Err(Error::lost(format!(
            "the lease was lost while leaving it: {}",
            LostReason::ValidityExpired
        ))),
        result = unwound(held.backend.refresh(&asked), "refresh") => result,
        () = clock.sleep_until(limit) => Err(Error::new(
            ErrorKind::OutcomeUnknown,
            format!("refresh got no reply within {:?}", held.options.refresh_timeout()),
        )),
    };
    let lease = match result {
        Ok(lease) if lease.token() != old.token() => {
            held.apply(Event::PermanentFailure(
                "backend changed the fence token".into(),
            ));
            return Err(Error::lost(
                "the backend changed the fence token on refresh",
            ));
        }
        Ok(lease) => lease,
        Err(err) => {
            if err.kind() == ErrorKind::Lost {
                held.apply(Event::from_refresh_error(&err));
            }
            return Err(err);
        }
    };
    if lease.ttl().get() < ttl {
        return Err(Error::new(
            ErrorKind::Unsupported,
            format!(
                "the backend set a TTL of {:?}, shorter than the {ttl:?} asked; the lease \
                 expires then",
                lease.ttl()
            ),
        ));
    }
    let validity = (sent + lease.ttl().get())
        .checked_sub(held.options.drift())
        .unwrap_or(sent);
    held.update(lease.clone(), validity);
    Ok(lease)
}

/// `call`'s result, or a temporary error if the backend panicked in it: a backend bug fails
/// the call, never the caller's task.
async fn unwound<T>(call: impl Future<Output = Result<T>>, what: &str) -> Result<T> {
    match AssertUnwindSafe(call).catch_unwind().await {
        Ok(result) => result,
        Err(_) => Err(Error::unavailable(format!(
            "the backend panicked during {what}"
        ))),
    }
}

/// Work that must finish once begun: it runs in the awaiting task, and if that task drops
/// it before it is done, the rest runs in a task of its own (on the runtime it began on,
/// else the current one; with neither, it is dropped and the lease expires by its TTL).
pub(crate) struct Finishing<T: Send + 'static> {
    work: Option<Pin<Box<dyn Future<Output = T> + Send>>>,
    runtime: Option<tokio::runtime::Handle>,
}

impl<T: Send + 'static> Finishing<T> {
    pub(crate) fn new(work: impl Future<Output = T> + Send + 'static) -> Self {
        Self {
            work: Some(Box::pin(work)),
            runtime: tokio::runtime::Handle::try_current().ok(),
        }
    }
}

impl<T: Send + 'static> Future for Finishing<T> {
    type Output = T;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<T> {
        // Out of `self` while it runs: if it panics, `Drop` finds nothing to finish.
        let Some(mut work) = self.work.take() else {
            return Poll::Pending;
        };
        let poll = work.as_mut().poll(cx);
        if poll.is_pending() {
            self.work = Some(work);
        }
        poll
    }
}

impl<T: Send + 'static> Drop for Finishing<T> {
    fn drop(&mut self) {
        let Some(work) = self.work.take() else {
            return;
        };
        match self
            .runtime
            .take()
            .or_else(|| tokio::runtime::Handle::try_current().ok())
        {
            Some(runtime) => drop(runtime.spawn(async move {
                drop(work.await);
            })),
            None => tracing::debug!("no runtime to finish ending a lease; it expires by its TTL"),
        }
    }
}
