//! How guards reach their keeper without waking it on every acquire and release.
//!
//! A new lease's first refresh is an interval away, and a released lease only needs to
//! leave the keeper's queue before its next refresh would go out. So both go into the
//! keeper's [`Mailbox`], read whenever the keeper wakes, and the keeper is woken only when
//! it must be: a lease due before the keeper's planned wake-up, or a full mailbox (which
//! bounds what a forgotten lease keeps alive). A lease that was forgotten is never
//! refreshed again: the keeper reads the mailbox before it sends anything. What must be
//! answered (`leave_for` waits for the refresh in flight) goes through the keeper's
//! channel, which also tells a guard that its keeper stopped.

#[cfg(test)]
use std::sync::atomic::AtomicU64;
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use tokio::sync::{Notify, mpsc, oneshot};
use tokio::time::Instant;

use crate::held::Held;

/// Mail that wakes the keeper once this many leases are waiting in it.
const BUNDLE: usize = 128;

/// What must reach the keeper at once.
#[derive(Debug)]
pub(crate) enum Msg {
    /// The guard of this lease is leaving it: stop refreshing, and drop the sender once no
    /// refresh of it is in flight any more (answered, or given up at its timeout), so a
    /// refresh the keeper sent cannot land after the guard's own and undo its TTL.
    Leave(u64, oneshot::Sender<()>),
}

/// Leases handed to the keeper and leases to forget, read when it wakes.
#[derive(Debug, Default)]
pub(crate) struct Post {
    pub(crate) added: Vec<(Arc<Held>, Instant)>,
    pub(crate) forgotten: Vec<u64>,
}

/// A keeper's mailbox, shared with its guards.
#[derive(Debug)]
pub(crate) struct Mailbox {
    post: Mutex<Post>,
    pub(crate) notify: Notify,
    /// When the keeper will wake next, in nanoseconds from `base` on the locker's clock
    /// (negative before it: the clock can be set back); `i64::MAX` when nothing is planned.
    planned: AtomicI64,
    base: Instant,
    /// How many times the keeper woke (tests read it).
    #[cfg(test)]
    pub(crate) wakes: AtomicU64,
    /// How many timers the keeper had queued when it last went to sleep (tests read it).
    #[cfg(test)]
    pub(crate) timers: AtomicU64,
}

impl Mailbox {
    pub(crate) fn new(base: Instant) -> Self {
        Self {
            post: Mutex::default(),
            notify: Notify::new(),
            planned: AtomicI64::new(i64::MAX),
            base,
            #[cfg(test)]
            wakes: AtomicU64::new(0),
            #[cfg(test)]
            timers: AtomicU64::new(0),
        }
    }

    fn post(&self) -> MutexGuard<'_, Post> {
        self.post.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Everything posted so far.
    pub(crate) fn take(&self) -> Post {
        std::mem::take(&mut *self.post())
    }

    /// Whether leases were added since the last [`take`](Self::take).
    pub(crate) fn has_added(&self) -> bool {
        !self.post().added.is_empty()
    }

    /// The keeper will wake at `at` (`None`: not before it is told). Published *before*
    /// the keeper looks at the mailbox a last time and sleeps: a lease added after that
    /// look sees this plan and wakes the keeper if it is due earlier.
    pub(crate) fn plan(&self, at: Option<Instant>) {
        let at = at.map_or(i64::MAX, |at| self.nanos(at));
        self.planned.store(at, Ordering::SeqCst);
    }

    /// `at` in nanoseconds from `base`, below `i64::MAX` (which means "not planned").
    fn nanos(&self, at: Instant) -> i64 {
        let far = i64::MAX - 1;
        match at.checked_duration_since(self.base) {
            Some(after) => i64::try_from(after.as_nanos()).unwrap_or(far),
            None => -i64::try_from((self.base - at).as_nanos()).unwrap_or(far),
        }
    }

    /// Posts `held`; the keeper must look at it by `by` (its first refresh, or its
    /// validity if that ends sooner).
    fn add(&self, held: Arc<Held>, due: Instant, by: Instant) {
        let waiting = {
            let mut post = self.post();
            post.added.push((held, due));
            post.added.len()
        };
        if waiting >= BUNDLE || self.nanos(by) < self.planned.load(Ordering::SeqCst) {
            self.notify.notify_one();
        }
    }

    fn forget(&self, id: u64) {
        let waiting = {
            let mut post = self.post();
            post.forgotten.push(id);
            post.forgotten.len()
        };
        if waiting >= BUNDLE {
            self.notify.notify_one();
        }
    }
}

/// A guard's way to its keeper.
#[derive(Debug, Clone)]
pub(crate) struct KeeperHandle {
    pub(crate) inbox: mpsc::UnboundedSender<Msg>,
    pub(crate) mailbox: Arc<Mailbox>,
    /// The keeper's runtime, where a dropped guard's release runs.
    pub(crate) runtime: tokio::runtime::Handle,
}

impl KeeperHandle {
    /// Hands a new lease to the keeper; its first refresh is due at `due`.
    pub(crate) fn keep(&self, held: Arc<Held>, due: Instant) {
        let by = due.min(held.validity());
        self.mailbox.add(Arc::clone(&held), due, by);
        // The keeper closes its channel before its last look at the mailbox: either it
        // saw this lease, or this sees it gone.
        if self.inbox.is_closed() {
            held.stopped();
        }
    }

    /// The keeper stops refreshing lease `id`. `false` if the keeper has stopped.
    pub(crate) fn forget(&self, id: u64) -> bool {
        self.mailbox.forget(id);
        !self.inbox.is_closed()
    }

    /// The keeper stops refreshing lease `id` once its refresh in flight has settled,
    /// which the receiver learns; `None` if the keeper has stopped.
    pub(crate) fn leave(&self, id: u64) -> Option<oneshot::Receiver<()>> {
        let (settled, in_flight) = oneshot::channel();
        self.inbox.send(Msg::Leave(id, settled)).ok()?;
        Some(in_flight)
    }

    /// The keeper has stopped (its runtime shut down).
    pub(crate) fn is_closed(&self) -> bool {
        self.inbox.is_closed()
    }

    /// Resolves once the keeper has stopped.
    pub(crate) async fn closed(&self) {
        self.inbox.closed().await;
    }
}
