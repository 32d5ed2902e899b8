//! The keeper: one task per [`Locker`](crate::Locker) and runtime that refreshes every
//! lease the locker's guards hold on that runtime, from one timer queue.
//!
//! Each held lease is an entry with two deadlines on the locker's [`Clock`]: its next
//! refresh (or, while a refresh is in flight, that refresh's timeout) and its validity.
//! The queue holds one timer per entry, at the earlier of the two. When timers fall due,
//! the keeper checks validity first (past it, the lease is `Lost`), then answers timed-out
//! refreshes and sends the refreshes due: every backend call runs inside the keeper
//! (no task per guard, none per call), and each answer becomes an
//! [`Event`](crate::state::Event) for the pure [`transition`](crate::state::transition).
//!
//! **Grouped refreshes.** When the backend takes batches
//! ([`LockBackend::refresh_batch_limit`] > 1) and a guard refreshes at most every
//! [`MIN_BATCHED_INTERVAL`], its schedule snaps to a grid: the next refresh moves *earlier*
//! to the last multiple of a quarter of its refresh interval counted from the keeper's
//! origin, so guards with the same options fall due at the same instants however their
//! acquisitions were spread, and the refreshes due together go out in one
//! [`LockBackend::refresh_many`] call per `limit` leases. A refresh is up to a quarter
//! interval early, never late.
//!
//! Nothing about safety depends on the grouping: a refresh's validity counts from when it
//! was sent; an answer that arrives after the validity passed still loses the lease; a
//! batch answered with the wrong number of results, or with another lock's lease, is an
//! unknown outcome for each lease asked, never another guard's lease. Ending a lease
//! happens in the task that asks (`held.rs`); guards reach the keeper through its
//! `mailbox.rs`. Each runtime gets its own keeper: one nobody drives holds up only its own
//! guards, which read `Lost(RefresherStopped)` once it stopped.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap};
use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::pin::Pin;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use futures_util::FutureExt;
use futures_util::stream::{FuturesUnordered, StreamExt};
use tokio::sync::{mpsc, oneshot};

use crate::mailbox::{KeeperHandle, Mailbox, Msg, Post};
use tokio::time::Instant;

use crate::backend::LockBackend;
use crate::clock::Clock;
use crate::error::{Error, ErrorKind, Result};
use crate::grid::{failed, same_grant, snap};
use crate::held::Held;
use crate::state::Event;
use crate::types::Lease;

/// Guards refreshing more often than this refresh on their own schedule, one call each:
/// snapping to a grid would move their refreshes by a large share of a short interval,
/// and nobody holds thousands of leases that short.
pub(crate) const MIN_BATCHED_INTERVAL: Duration = Duration::from_millis(100);

/// A locker's keepers, one per runtime its guards were made on, started with the first
/// guard on that runtime and shared by the locker's clones.
#[derive(Debug, Default)]
pub(crate) struct Keepers {
    handles: Mutex<HashMap<tokio::runtime::Id, KeeperHandle>>,
}

impl Keepers {
    /// The way to the current runtime's keeper (started, or restarted when it ended).
    /// Called from an acquire, which runs on a tokio runtime.
    pub(crate) fn handle(&self, backend: &Arc<dyn LockBackend>, clock: &Clock) -> KeeperHandle {
        let runtime = tokio::runtime::Handle::current();
        let mut handles = self.handles.lock().unwrap_or_else(PoisonError::into_inner);
        handles.retain(|_, handle| !handle.is_closed());
        let handle = handles.entry(runtime.id()).or_insert_with(|| {
            let (inbox, messages) = mpsc::unbounded_channel();
            let mailbox = Arc::new(Mailbox::new(clock.now()));
            let keeper = Keeper::new(Arc::clone(backend), clock.clone(), messages, &mailbox);
            drop(runtime.spawn(keeper.run()));
            KeeperHandle {
                inbox,
                mailbox,
                runtime: runtime.clone(),
            }
        });
        handle.clone()
    }

    /// A figure summed over this locker's keepers, for tests: `|_| 1` counts them (stopped
    /// ones are dropped at the next [`handle`](Self::handle)), or a mailbox's wakes or timers.
    #[cfg(test)]
    pub(crate) fn sum(&self, figure: impl Fn(&Mailbox) -> u64) -> u64 {
        let handles = self.handles.lock().unwrap_or_else(PoisonError::into_inner);
        handles.values().map(|handle| figure(&handle.mailbox)).sum()
    }
}

/// One held lease in the keeper.
struct Entry {
    held: Arc<Held>,
    /// Refreshed in batches, on the grid.
    batched: bool,
    /// The next refresh, while none is in flight.
    next: Instant,
    call: Option<Call>,
    /// The number of this entry's latest timer; older ones still queued are stale.
    timer: u64,
    /// Backend calls with this lease still running (one given up at its timeout on the
    /// locker's clock may still be running, and may still land).
    running: u32,
    /// Its guard is leaving it: dropped (which tells the guard) when its refresh in
    /// flight has settled; no refresh is sent after it.
    leaving: Option<oneshot::Sender<()>>,
}

/// A refresh in flight.
#[derive(Debug, Clone, Copy)]
struct Call {
    number: u64,
    /// On the locker's clock: the refreshed validity counts from here.
    sent: Instant,
    /// When it counts as unanswered.
    limit: Instant,
}

/// A backend call's answer: for each lease asked, its entry and call number.
struct Answers {
    asked: Vec<(u64, u64, Lease)>,
    results: Vec<Result<Lease>>,
}

type Pending = Pin<Box<dyn Future<Output = Answers> + Send>>;

struct Keeper {
    inbox: mpsc::UnboundedReceiver<Msg>,
    mailbox: Arc<Mailbox>,
    backend: Arc<dyn LockBackend>,
    clock: Clock,
    /// The backend's batch limit (1: no batches).
    limit: usize,
    /// The grid's origin.
    origin: Instant,
    entries: HashMap<u64, Entry>,
    /// `(when, entry, timer number)`, earliest first.
    timers: BinaryHeap<Reverse<(Instant, u64, u64)>>,
    calls: FuturesUnordered<Pending>,
    /// The last timer or call number handed out.
    numbers: u64,
}

impl Keeper {
    fn new(
        backend: Arc<dyn LockBackend>,
        clock: Clock,
        inbox: mpsc::UnboundedReceiver<Msg>,
        mailbox: &Arc<Mailbox>,
    ) -> Self {
        Self {
            inbox,
            mailbox: Arc::clone(mailbox),
            limit: backend.refresh_batch_limit().max(1),
            origin: clock.now(),
            backend,
            clock,
            entries: HashMap::new(),
            timers: BinaryHeap::new(),
            calls: FuturesUnordered::new(),
            numbers: 0,
        }
    }

    /// Runs until every guard and locker that could send it a lease is gone.
    async fn run(mut self) {
        loop {
            self.collect();
            self.on_due();
            self.compact();
            #[cfg(test)]
            self.mailbox.timers.store(
                self.timers.len() as u64,
                std::sync::atomic::Ordering::Relaxed,
            );
            let wake = self.timers.peek().map(|Reverse((at, ..))| *at);
            self.mailbox.plan(wake);
            // A lease added before the plan was published did not see it.
            if self.mailbox.has_added() {
                continue;
            }
            tokio::select! {
                biased;
                msg = self.inbox.recv() => {
                    let Some(msg) = msg else { return };
                    self.collect();
                    self.on_msg(msg);
                    while let Ok(msg) = self.inbox.try_recv() {
                        self.on_msg(msg);
                    }
                }
                () = self.mailbox.notify.notified() => {}
                Some(answers) = self.calls.next(), if !self.calls.is_empty() => {
                    self.on_answers(answers);
                }
                () = sleep(&self.clock, wake) => {}
            }
            #[cfg(test)]
            self.mailbox
                .wakes
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        }
    }

    /// Reads the mailbox: new leases join the queue, forgotten ones leave it.
    fn collect(&mut self) {
        let Post { added, forgotten } = self.mailbox.take();
        for (held, due) in added {
            let interval = held.options.refresh_interval();
            let batched = self.limit > 1 && interval >= MIN_BATCHED_INTERVAL;
            let id = held.id;
            let mut entry = Entry {
                held,
                batched,
                next: due,
                call: None,
                timer: 0,
                running: 0,
                leaving: None,
            };
            entry.next = schedule(self.origin, &entry, due);
            self.entries.insert(id, entry);
            self.arm(id);
        }
        for id in forgotten {
            self.entries.remove(&id);
        }
    }

    fn on_msg(&mut self, msg: Msg) {
        match msg {
            Msg::Leave(id, settled) => match self.entries.get_mut(&id) {
                Some(entry) if entry.running > 0 => {
                    entry.leaving = Some(settled);
                    self.arm(id);
                }
                _ => drop(self.entries.remove(&id)),
            },
        }
    }

    /// Drops stale timers once they outnumber the live ones (leases released at a high
    /// rate leave one each behind until it would have fired).
    fn compact(&mut self) {
        if self.timers.len() <= 2 * self.entries.len() + 1024 {
            return;
        }
        let entries = &self.entries;
        self.timers
            .retain(|Reverse((_, id, number))| entries.get(id).is_some_and(|e| e.timer == *number));
    }

    /// Queues the entry's timer at the earlier of its validity and its next refresh (or
    /// its call's timeout).
    fn arm(&mut self, id: u64) {
        let Some(entry) = self.entries.get_mut(&id) else {
            return;
        };
        let due = match (&entry.leaving, entry.call) {
            // Only its validity still matters: no refresh is sent for a leaving lease.
            (Some(_), _) => entry.held.validity(),
            (None, Some(call)) => call.limit,
            (None, None) => entry.next,
        };
        let at = due.min(entry.held.validity());
        self.numbers += 1;
        entry.timer = self.numbers;
        self.timers.push(Reverse((at, id, entry.timer)));
    }

    /// Handles every timer due now, then sends the refreshes that fell due.
    fn on_due(&mut self) {
        let now = self.clock.now();
        let mut batch = Vec::new();
        while let Some(&Reverse((at, id, number))) = self.timers.peek() {
            if at > now {
                break;
            }
            self.timers.pop();
            let Some(entry) = self.entries.get_mut(&id) else {
                continue;
            };
            if entry.timer != number {
                continue;
            }
            let held = Arc::clone(&entry.held);
            if now >= held.validity() {
                held.apply(Event::ValidityExpired);
                self.end(id);
                continue;
            }
            match entry.call {
                Some(call) if now >= call.limit => {
                    let waited = held.options.refresh_timeout();
                    let err = Error::new(
                        ErrorKind::OutcomeUnknown,
                        format!("refresh got no reply within {waited:?}"),
                    );
                    self.on_refreshed(id, call.sent, Err(err));
                }
                None if now >= entry.next && entry.leaving.is_none() => {
                    let waited = held.options.refresh_timeout();
                    self.numbers += 1;
                    let number = self.numbers;
                    entry.running += 1;
                    entry.call = Some(Call {
                        number,
                        sent: now,
                        limit: now + waited,
                    });
                    let asked = (id, number, held.lease());
                    if entry.batched {
                        batch.push((asked, waited));
                    } else {
                        let call = self.call(vec![asked], waited, false);
                        self.calls.push(call);
                    }
                    self.arm(id);
                }
                _ => self.arm(id),
            }
        }
        for chunk in batch.chunks(self.limit) {
            let waited = chunk.iter().map(|(_, t)| *t).max().unwrap_or_default();
            let asked = chunk.iter().map(|(asked, _)| asked.clone()).collect();
            self.calls.push(self.call(asked, waited, true));
        }
    }

    /// One backend call for `asked` (`refresh_many` for a batch, even of one; `refresh`
    /// otherwise), dropped after `waited` (each lease has timed out by then) and kept from
    /// unwinding into the keeper.
    fn call(&self, asked: Vec<(u64, u64, Lease)>, waited: Duration, batch: bool) -> Pending {
        let backend = Arc::clone(&self.backend);
        Box::pin(async move {
            let leases: Vec<Lease> = asked.iter().map(|(.., lease)| lease.clone()).collect();
            let work = async {
                match leases.as_slice() {
                    [lease] if !batch => vec![backend.refresh(lease).await],
                    leases => backend.refresh_many(leases).await,
                }
            };
            let outcome = tokio::time::timeout(waited, AssertUnwindSafe(work).catch_unwind());
            let results = match outcome.await {
                Ok(Ok(results)) => results,
                Ok(Err(_)) => failed(
                    Error::unavailable("the backend panicked during a refresh"),
                    asked.len(),
                ),
                Err(_) => failed(
                    Error::new(
                        ErrorKind::OutcomeUnknown,
                        format!("refresh got no reply within {waited:?}"),
                    ),
                    asked.len(),
                ),
            };
            Answers { asked, results }
        })
    }

    fn on_answers(&mut self, answers: Answers) {
        let Answers { asked, mut results } = answers;
        if results.len() != asked.len() {
            let (got, sent) = (results.len(), asked.len());
            results = failed(
                Error::new(
                    ErrorKind::OutcomeUnknown,
                    format!("the backend answered a batch of {sent} refreshes with {got} results"),
                ),
                sent,
            );
        }
        for ((id, number, lease), result) in asked.into_iter().zip(results) {
            let Some(entry) = self.entries.get_mut(&id) else {
                continue;
            };
            entry.running = entry.running.saturating_sub(1);
            match entry.call {
                Some(call) if call.number == number => {
                    let result = result.and_then(|refreshed| same_grant(&lease, refreshed));
                    self.on_refreshed(id, call.sent, result);
                }
                // A call given up earlier has ended: a leaving guard may go on.
                _ if entry.leaving.is_some() && entry.running == 0 => self.end(id),
                _ => {}
            }
        }
    }

    /// Applies a refresh's outcome and schedules the next one.
    fn on_refreshed(&mut self, id: u64, sent: Instant, result: Result<Lease>) {
        let Some(entry) = self.entries.get_mut(&id) else {
            return;
        };
        entry.call = None;
        let held = Arc::clone(&entry.held);
        let old = held.lease();
        let event = if held.clock.now() >= held.validity() {
            // The answer came after the validity ran out: the lease may have expired on
            // the server and been granted again in between.
            Event::ValidityExpired
        } else {
            match result {
                Ok(lease) if lease.token() != old.token() => Event::PermanentFailure(format!(
                    "backend changed the fence token on refresh ({:?} -> {:?})",
                    old.token(),
                    lease.token()
                )),
                Ok(lease) => {
                    held.update(lease.clone(), held.validity_from(sent, &lease));
                    Event::Refreshed
                }
                Err(err) => {
                    let err = err.in_context(self.backend.backend_name(), old.name());
                    tracing::debug!(error = %err, "lease refresh failed");
                    Event::from_refresh_error(&err)
                }
            }
        };
        held.apply(event);
        let Some(entry) = self.entries.get(&id) else {
            return;
        };
        if held.current().is_terminal() || (entry.leaving.is_some() && entry.running == 0) {
            return self.end(id);
        }
        if entry.leaving.is_some() {
            // Its call was given up but is still running: wait for it to end.
            return self.arm(id);
        }
        let due = sent + held.options.refresh_interval();
        let (origin, entries) = (self.origin, &mut self.entries);
        if let Some(entry) = entries.get_mut(&id) {
            entry.next = schedule(origin, entry, due);
        }
        self.arm(id);
    }

    /// Stops refreshing a lease that was lost (its guard's cancellation token fires;
    /// releasing is left to the guard) or that its guard is leaving.
    fn end(&mut self, id: u64) {
        if let Some(entry) = self.entries.remove(&id)
            && entry.leaving.is_none()
        {
            entry.held.cancel.cancel();
        }
    }
}

impl Drop for Keeper {
    /// The keeper's runtime shut down (or it panicked): nothing refreshes these leases any
    /// more. Their guards learn it at once, with `Lost(RefresherStopped)` and their
    /// cancellation tokens, instead of at the validity deadline.
    fn drop(&mut self) {
        // Closed first: a lease posted after the last look below sees the keeper gone
        // (`KeeperHandle::keep`).
        self.inbox.close();
        let mut held: Vec<Arc<Held>> = self.entries.drain().map(|(_, e)| e.held).collect();
        // Leases handed over but not yet read (the runtime stopped before the keeper ran).
        let Post { added, forgotten } = self.mailbox.take();
        let added = added.into_iter().map(|(lease, _)| lease);
        held.extend(added.filter(|lease| !forgotten.contains(&lease.id)));
        for held in held {
            held.stopped();
        }
    }
}

/// When an entry due at `due` refreshes: then, or on the grid up to a quarter of its
/// interval earlier.
fn schedule(origin: Instant, entry: &Entry, due: Instant) -> Instant {
    if !entry.batched {
        return due;
    }
    snap(origin, due, entry.held.options.refresh_interval() / 4)
}

/// Sleeps until `wake` on `clock`, or for ever.
async fn sleep(clock: &Clock, wake: Option<Instant>) {
    match wake {
        Some(at) => clock.sleep_until(at).await,
        None => std::future::pending().await,
    }
}
