//! The waiting side of [`Locker`](crate::Locker)'s acquire loop: the deadline, backoff,
//! release notifications and the backend's waiter queue.

use std::sync::Arc;
use std::time::Duration;

use futures_util::StreamExt;
use tokio::sync::oneshot;
use tokio::time::{Instant, sleep_until, timeout_at};

use crate::backend::{LockBackend, QueueTicket, ReleaseEvents};
use crate::error::{Error, ErrorKind, Result};
use crate::options::{LockOptions, WaitMode};
use crate::permit_count::Permits;
use crate::types::{AcquireRequest, HolderInfo};

/// The `Held` error of a `TryOnce` attempt, naming the holder, its note and its expiry.
pub(crate) fn held_error(holder: HolderInfo, permits: Option<Permits>) -> Error {
    let mut message = format!("{} {}", held_by(permits), holder.owner());
    if let Some(note) = holder.note() {
        message.push_str(&format!(" ({note})"));
    }
    if let Some(left) = holder.expires_in() {
        message.push_str(&format!(", expires in {left:?} unless refreshed"));
    }
    Error::new(ErrorKind::Held, message).with_holder(holder)
}

/// "held by" for a lock; for a semaphore, which of its holders the message names.
fn held_by(permits: Option<Permits>) -> String {
    match permits {
        None => "held by".to_owned(),
        Some(n) => format!("all {n} permits are held; the first to end is held by"),
    }
}

/// The waiting side of the acquire loop: deadline, backoff, notifications.
pub(crate) struct Wait {
    started: Instant,
    pub(crate) deadline: Option<Instant>,
    events: Option<ReleaseEvents>,
    /// [`subscribe`](Self::subscribe) ran (whatever it got).
    subscribed: bool,
    attempt: u32,
    backoff: crate::backoff::Backoff,
    /// Bounds each backend call the wait makes itself (joining the queue).
    attempt_timeout: Duration,
    /// The last holder that refused us, for the timeout's message.
    holder: Option<HolderInfo>,
    /// When that holder's lease ends by the backend's reading, taken when it was read:
    /// the wait never sleeps past it, and once it has passed (a failed attempt read no
    /// newer one) it caps nothing.
    holder_expiry: Option<Instant>,
    /// `holder_expiry` was read by the attempt just made: the next pause is cut to it even
    /// when it has already passed (a lease shorter than the reply took, such as a key in
    /// its last millisecond), so the next attempt comes 1 ms later, not after the backoff,
    /// unless `passed_cut` says that was done already. Cleared by that pause and by a
    /// failed attempt, so failures are paced by the backoff.
    expiry_fresh: bool,
    /// A pause was cut to the 1 ms floor by an expiry already passed when it was read:
    /// another such reading gets the backoff, until a reading of an expiry still ahead
    /// (a backend whose reading does not move, such as GCS's whole-second `Date`, could
    /// otherwise be tried every millisecond until the holder is really gone).
    passed_cut: bool,
    last_error: Option<Error>,
    /// Our place in the backend's FIFO queue; dropped (leaving the queue) with `Wait`.
    ticket: Option<QueueTicket>,
    /// `events` came from the ticket: their end means the place was lost.
    events_from_ticket: bool,
    queue_tried: bool,
    /// `Some(n)` while waiting for a permit of a semaphore of `n`.
    permits: Option<Permits>,
}

impl Wait {
    /// The wait of one acquisition; nothing is asked of the backend until an attempt
    /// finds the lock held ([`subscribe`](Self::subscribe), [`join_queue`](Self::join_queue)).
    pub(crate) fn start(options: &LockOptions, permits: Option<Permits>) -> Self {
        let started = Instant::now();
        let deadline = match options.wait() {
            WaitMode::Timeout(d) => Some(started + d),
            WaitMode::TryOnce | WaitMode::Forever => None,
        };
        Self {
            started,
            deadline,
            events: None,
            subscribed: false,
            attempt: 0,
            backoff: options.backoff().clone(),
            attempt_timeout: options.acquire_timeout(),
            holder: None,
            holder_expiry: None,
            expiry_fresh: false,
            passed_cut: false,
            last_error: None,
            ticket: None,
            events_from_ticket: false,
            queue_tried: false,
            permits,
        }
    }

    /// An attempt sent at `sent` found the lock held by `holder`. Its time left counts
    /// from the sending (the backend read it after that), so the wait never sleeps past
    /// the lease's end however long the reply took; a time left too large for the clock
    /// caps nothing.
    pub(crate) fn held_by(&mut self, holder: HolderInfo, sent: Instant) {
        self.holder_expiry = (holder.expires_in())
            .filter(|left| !left.is_zero())
            .and_then(|left| sent.checked_add(left));
        self.expiry_fresh = self.holder_expiry.is_some();
        if self.holder_expiry.is_some_and(|at| at > Instant::now()) {
            // A reading of an expiry still ahead: the next one that has passed in transit
            // earns the 1 ms floor again.
            self.passed_cut = false;
        }
        self.holder = Some(holder);
    }

    /// An attempt's grant came too late to use: nobody is known to hold the lock.
    pub(crate) fn no_holder(&mut self) {
        self.holder = None;
        self.holder_expiry = None;
        self.expiry_fresh = false;
        self.passed_cut = false;
    }

    /// An attempt failed with a temporary `err`: kept for the timeout's message; the pause
    /// after it is paced by the backoff, whatever an earlier refusal read.
    pub(crate) fn attempt_failed(&mut self, err: Error) {
        self.last_error = Some(err);
        self.expiry_fresh = false;
    }

    /// Subscribes to the lock's release notifications, once per acquisition, after the
    /// first attempt that found it held: an acquisition that finds the lock free never
    /// pays for a subscription (a statement, a watch, a `SUBSCRIBE`). `true` when
    /// notifications now flow: the caller must attempt once more before it waits, since
    /// a release between its last attempt and the subscription is in no notification.
    /// Not when the queue place already brings its own, nor past the deadline; bounded
    /// like an attempt.
    pub(crate) async fn subscribe(
        &mut self,
        backend: &Arc<dyn LockBackend>,
        request: &AcquireRequest,
    ) -> bool {
        if std::mem::replace(&mut self.subscribed, true) || self.events.is_some() {
            return false;
        }
        let now = Instant::now();
        if self.deadline.is_some_and(|deadline| now >= deadline) {
            return false;
        }
        let own_limit = now + self.attempt_timeout;
        let limit = self.deadline.map_or(own_limit, |d| d.min(own_limit));
        match timeout_at(limit, backend.subscribe(&request.name)).await {
            Ok(Ok(Some(events))) => {
                self.events = Some(events);
                true
            }
            Ok(Ok(None)) => false,
            Ok(Err(err)) => {
                tracing::debug!(error = %err, "release notifications unavailable; polling");
                false
            }
            Err(_) => {
                tracing::debug!("subscribing to release notifications timed out; polling");
                false
            }
        }
    }

    /// Joins the backend's waiter queue, once per acquisition and again after losing the
    /// place (see [`pause`](Self::pause)); `true` when newly queued.
    /// The call runs in its own task, so a ticket that arrives after this future was
    /// dropped is dropped there, leaving the queue.
    pub(crate) async fn join_queue(
        &mut self,
        backend: &Arc<dyn LockBackend>,
        request: &AcquireRequest,
    ) -> bool {
        // A backend's queue (etcd's) is a lock's; a semaphore's waiters poll or are notified.
        if std::mem::replace(&mut self.queue_tried, true) || request.permits.is_some() {
            return false;
        }
        // Past the deadline nothing will wait in the queue: no place is taken (on etcd a
        // lease, a key ahead of newcomers and a watch).
        if self
            .deadline
            .is_some_and(|deadline| Instant::now() >= deadline)
        {
            return false;
        }
        let (tx, rx) = oneshot::channel();
        let (backend, req) = (Arc::clone(backend), request.clone());
        tokio::spawn(async move {
            let _ = tx.send(backend.enqueue(&req).await);
        });
        // Bounded like an attempt: a hung enqueue must not stall a waiter without a deadline.
        let own_limit = Instant::now() + self.attempt_timeout;
        let limit = self.deadline.map_or(own_limit, |d| d.min(own_limit));
        match timeout_at(limit, rx).await {
            Ok(Ok(Ok(Some(mut ticket)))) => {
                if let Some(events) = ticket.take_events() {
                    self.events = Some(events);
                    self.events_from_ticket = true;
                }
                // Replaces (and so leaves) a place whose events had ended.
                self.ticket = Some(ticket);
                true
            }
            Ok(Ok(Err(err))) => {
                tracing::debug!(error = %err, "could not join the waiters' queue; retrying without it");
                false
            }
            _ => false,
        }
    }

    /// Sleeps before the next attempt: the jittered backoff delay, cut to the holder's
    /// remaining TTL and the deadline, and cut short by a release notification.
    pub(crate) async fn pause(&mut self, unit: f64) -> Result<()> {
        let mut delay = self.backoff.delay(self.attempt, unit);
        self.attempt = self.attempt.saturating_add(1);
        // Never sleep past the holder's expiry as read, and when it passed while the reply
        // travelled, try again after the 1 ms floor, once (until a reading of an expiry
        // still ahead). A holder already at zero (expired by the backend's clock, not yet
        // removed) gets the plain backoff, not a 1 ms poll, and so does one whose expiry
        // passed before a failed attempt (a server down at the lease's end is not retried
        // every millisecond).
        let fresh = std::mem::take(&mut self.expiry_fresh);
        if let Some(at) = self.holder_expiry {
            let left = at.saturating_duration_since(Instant::now());
            if !left.is_zero() {
                delay = delay.min(left);
            } else if fresh && !std::mem::replace(&mut self.passed_cut, true) {
                delay = Duration::ZERO;
            }
        }
        let now = Instant::now();
        let mut wake = now + delay.max(Duration::from_millis(1));
        if let Some(deadline) = self.deadline {
            if now >= deadline {
                return Err(self.timed_out(None));
            }
            wake = wake.min(deadline);
        }
        let Some(events) = self.events.as_mut() else {
            sleep_until(wake).await;
            return Ok(());
        };
        tokio::select! {
            () = sleep_until(wake) => {}
            item = events.next() => if item.is_none() {
                // Still sleep the full delay: a stream that keeps ending must not spin.
                self.events_ended();
                sleep_until(wake).await;
            },
        }
        Ok(())
    }

    /// The wake-up stream ended. If it was our queue place's, the place may be gone (etcd:
    /// its key was deleted or its lease ran out): join again after the next `Held`. The
    /// old ticket is kept until a new one replaces it, since the backend may answer that
    /// the place is still valid (no new ticket) when only its watch broke.
    fn events_ended(&mut self) {
        self.events = None;
        if std::mem::take(&mut self.events_from_ticket) {
            tracing::debug!("our place in the waiters' queue stopped waking us; joining again");
            self.queue_tried = false;
        } else {
            tracing::debug!("release notifications ended; polling");
        }
    }

    pub(crate) fn timed_out(&mut self, cause: Option<Error>) -> Error {
        let waited = self.started.elapsed();
        let mut message = format!("gave up after {waited:?}");
        if let Some(holder) = &self.holder {
            message.push_str(&format!("; {} {}", held_by(self.permits), holder.owner()));
            if let Some(note) = holder.note() {
                message.push_str(&format!(" ({note})"));
            }
        }
        let mut err = Error::new(ErrorKind::Timeout, message);
        if let Some(holder) = self.holder.take() {
            err = err.with_holder(holder);
        }
        match cause.or_else(|| self.last_error.take()) {
            Some(cause) => err.with_source(cause),
            None => err,
        }
    }
}
