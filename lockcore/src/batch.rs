//! Grouped refreshes: how a [`Locker`](crate::Locker)'s guards share
//! [`LockBackend::refresh_many`] calls.
//!
//! Each guard's refresher keeps its own timers, health and commands (see `driver.rs`); only
//! the backend call is shared. When the backend takes batches
//! ([`LockBackend::refresh_batch_limit`] > 1) and the guard refreshes at most every
//! [`MIN_BATCHED_INTERVAL`], two things change for it:
//! - **Its schedule snaps to a grid.** The next refresh is moved *earlier* to the last
//!   multiple of a quarter of its refresh interval (counted from the grid's origin), so
//!   guards with the same options fall due at the same instants however their
//!   acquisitions were spread. A refresh falls due up to a quarter interval early, never
//!   late; the call itself may leave up to [`GATHER`] after that (its validity still counts
//!   from when the guard asked).
//! - **Its refresh is a job on a queue.** One task per locker collects the jobs that
//!   arrive together (for at most [`GATHER`], less for short intervals), hands up to the
//!   limit of them to one `refresh_many` call in a task of its own, and answers each job.
//!
//! Nothing about safety moves: a refresh's validity still counts from the moment its
//! guard asked (before the gathering wait), each guard still races its job against its
//! own validity deadline, refresh timeout and commands, and a job whose guard stopped
//! waiting is dropped before the call. Each runtime a locker's guards run on gets its own
//! queue task, so a runtime nobody drives any more holds up only its own guards; a guard
//! whose queue task is gone (its runtime shut down) refreshes its lease on its own.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use tokio::sync::{mpsc, oneshot};
use tokio::time::Instant;

use crate::backend::LockBackend;
use crate::error::{Error, ErrorKind, Result};
use crate::types::Lease;

/// The longest a job waits for others to join its batch.
pub(crate) const GATHER: Duration = Duration::from_millis(5);

/// How a guard's refresh reaches the backend.
#[derive(Debug, Clone)]
pub(crate) enum Refresher {
    /// One [`LockBackend::refresh`] per lease, on the guard's own schedule.
    Direct(Arc<dyn LockBackend>),
    /// Jobs on a [`Batches`] queue, on the grid.
    Batched {
        backend: Arc<dyn LockBackend>,
        queue: mpsc::UnboundedSender<Job>,
        origin: Instant,
    },
}

/// One lease to refresh, and where its result goes.
#[derive(Debug)]
pub(crate) struct Job {
    lease: Lease,
    /// How long this job may wait for others to join its batch.
    patience: Duration,
    reply: oneshot::Sender<Result<Lease>>,
}

impl Refresher {
    /// Refreshes `lease`, which its guard refreshes every `interval`.
    pub(crate) async fn refresh(&self, lease: &Lease, interval: Duration) -> Result<Lease> {
        let (backend, queue) = match self {
            Refresher::Direct(backend) => return backend.refresh(lease).await,
            Refresher::Batched { backend, queue, .. } => (backend, queue),
        };
        let (reply, answer) = oneshot::channel();
        let job = Job {
            lease: lease.clone(),
            patience: GATHER.min(interval / 8),
            reply,
        };
        if queue.send(job).is_err() {
            return backend.refresh(lease).await;
        }
        answer.await.unwrap_or_else(|_| {
            Err(Error::new(
                ErrorKind::OutcomeUnknown,
                "the refresh batch ended without a result for this lease",
            ))
        })
    }

    /// When a guard that is due at `due` and refreshes every `interval` should refresh:
    /// `due` itself, or on the grid, up to a quarter interval earlier.
    pub(crate) fn schedule(&self, due: Instant, interval: Duration) -> Instant {
        let Refresher::Batched { origin, .. } = self else {
            return due;
        };
        snap(*origin, due, interval / 4)
    }
}

/// The last multiple of `step` after `origin` that is not after `due`; `due` when the grid
/// does not reach it (a step under a millisecond, or `due` before the origin).
pub(crate) fn snap(origin: Instant, due: Instant, step: Duration) -> Instant {
    let step_ns = step.as_nanos();
    if step < Duration::from_millis(1) || due < origin {
        return due;
    }
    let since = (due - origin).as_nanos();
    let back = since % step_ns;
    // `back < step`, which fits a `Duration`.
    due - Duration::from_nanos(u64::try_from(back).unwrap_or(0))
}

/// Guards refreshing more often than this refresh on their own: the gathering wait and
/// the queue's task hops would eat most of their refresh timeout (the interval), and
/// nobody holds thousands of leases that short.
pub(crate) const MIN_BATCHED_INTERVAL: Duration = Duration::from_millis(100);

/// A locker's batch queues, one per runtime its guards run on (a queue task lives on one
/// runtime and is only as live as that runtime is driven), started with the first
/// batched guard on that runtime and shared by the locker's clones.
#[derive(Debug, Default)]
pub(crate) struct Batches {
    queues: Mutex<HashMap<tokio::runtime::Id, (mpsc::UnboundedSender<Job>, Instant)>>,
}

impl Batches {
    /// How a guard of `backend` that refreshes every `interval` refreshes: batched when
    /// the backend takes batches and the interval is not too short, through the queue of
    /// the current runtime (started, or restarted when its task ended).
    pub(crate) fn refresher(
        &self,
        backend: &Arc<dyn LockBackend>,
        now: Instant,
        interval: Duration,
    ) -> Refresher {
        let limit = backend.refresh_batch_limit();
        let runtime = tokio::runtime::Handle::try_current();
        let (true, Ok(runtime)) = (limit > 1 && interval >= MIN_BATCHED_INTERVAL, runtime) else {
            return Refresher::Direct(Arc::clone(backend));
        };
        let mut queues = self.queues.lock().unwrap_or_else(PoisonError::into_inner);
        queues.retain(|_, (tx, _)| !tx.is_closed());
        let (tx, origin) = queues.entry(runtime.id()).or_insert_with(|| {
            let (tx, rx) = mpsc::unbounded_channel();
            runtime.spawn(collect(Arc::clone(backend), rx, limit));
            (tx, now)
        });
        Refresher::Batched {
            backend: Arc::clone(backend),
            queue: tx.clone(),
            origin: *origin,
        }
    }
}

/// The queue task: gathers jobs into batches of at most `limit` and sends each batch in a
/// task of its own, so a slow batch never holds up the next. Ends when every sender (the
/// locker's [`Batches`] and each guard's [`Refresher`]) is gone.
async fn collect(
    backend: Arc<dyn LockBackend>,
    mut jobs: mpsc::UnboundedReceiver<Job>,
    limit: usize,
) {
    while let Some(first) = jobs.recv().await {
        let mut until = Instant::now() + first.patience;
        let mut batch = vec![first];
        while batch.len() < limit {
            let job = match jobs.try_recv() {
                Ok(job) => Some(job),
                Err(mpsc::error::TryRecvError::Disconnected) => None,
                Err(mpsc::error::TryRecvError::Empty) => {
                    tokio::select! {
                        biased;
                        job = jobs.recv() => job,
                        () = tokio::time::sleep_until(until) => None,
                    }
                }
            };
            let Some(job) = job else { break };
            until = until.min(Instant::now() + job.patience);
            batch.push(job);
        }
        tokio::spawn(send(Arc::clone(&backend), batch));
    }
}

/// One `refresh_many` call for `batch`, each result to its job.
async fn send(backend: Arc<dyn LockBackend>, batch: Vec<Job>) {
    // A guard that stopped waiting (released, lost, timed out) needs no refresh.
    let batch: Vec<Job> = batch.into_iter().filter(|j| !j.reply.is_closed()).collect();
    if batch.is_empty() {
        return;
    }
    let leases: Vec<Lease> = batch.iter().map(|job| job.lease.clone()).collect();
    let results = backend.refresh_many(&leases).await;
    if results.len() != batch.len() {
        let (got, sent) = (results.len(), batch.len());
        for job in batch {
            let _ = job.reply.send(Err(Error::new(
                ErrorKind::OutcomeUnknown,
                format!("the backend answered a batch of {sent} refreshes with {got} results"),
            )));
        }
        return;
    }
    for (job, result) in batch.into_iter().zip(results) {
        let result = result.and_then(|lease| same_grant(&job.lease, lease));
        let _ = job.reply.send(result);
    }
}

/// `refreshed` when it answers for `asked` (same lock, same owner): a backend that mixed up
/// its answers must not hand one guard another's lease.
fn same_grant(asked: &Lease, refreshed: Lease) -> Result<Lease> {
    if refreshed.name() == asked.name() && refreshed.owner() == asked.owner() {
        return Ok(refreshed);
    }
    Err(Error::new(
        ErrorKind::OutcomeUnknown,
        format!(
            "the backend answered the refresh of lock {:?} with a lease of lock {:?}",
            asked.name().as_str(),
            refreshed.name().as_str()
        ),
    ))
}
