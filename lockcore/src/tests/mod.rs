//! Runtime tests of the acquire loop and the lease refresher, on tokio's paused clock with
//! a scripted fault-injecting backend. Time is virtual: bounds are exact, not generous.
//!
//! Every runtime test runs through [`bounded`]: on the paused clock a regression that
//! spins (a loop that never sleeps) or waits on something that never comes hangs for
//! ever, so each test gets a wall-clock limit and fails with its own name instead.

mod acquire;
mod arithmetic;
mod batch;
mod clock;
mod context;
mod election;
mod grants;
mod inline;
mod keeper;
mod keeper_edges;
mod leave;
mod observe;
mod orphan;
mod permits;
mod poll;
mod queue;
mod refresher;
mod starved;
mod subscribe;
mod suspend;

use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use crate::testing::FaultyBackend;
use crate::{Health, LockGuard, LockOptions, Locker, MemoryBackend};

/// Wall-clock time a paused-clock test may take; they take milliseconds.
const HANG_LIMIT: Duration = Duration::from_secs(60);

/// Runs `body` on a current-thread runtime with tokio's clock paused, in its own thread;
/// fails the calling test (named by the harness) if it has not finished within
/// [`HANG_LIMIT`] of real time. A hung body's thread is left behind; the test binary
/// exits without it.
pub(crate) fn bounded<F>(body: impl FnOnce() -> F + Send + 'static)
where
    F: Future<Output = ()>,
{
    let (done, finished) = std::sync::mpsc::channel();
    let name = std::thread::current().name().map(str::to_owned);
    let mut thread = std::thread::Builder::new();
    if let Some(name) = name {
        thread = thread.name(name);
    }
    let spawned = thread.spawn(move || {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .start_paused(true)
            .build()
            .expect("a test runtime");
        let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            runtime.block_on(body());
        }));
        let _ = done.send(outcome);
    });
    spawned.expect("a test thread");
    match finished.recv_timeout(HANG_LIMIT) {
        Ok(Ok(())) => {}
        Ok(Err(panic)) => std::panic::resume_unwind(panic),
        Err(_) => panic!(
            "still running after {HANG_LIMIT:?} of wall-clock time on the paused clock: \
             a hang or a spin"
        ),
    }
}

/// A current-thread runtime on the real clock (tests of runtimes that end).
pub(super) fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a runtime")
}

pub(super) fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

/// A memory backend behind a fault injector, and a locker over it.
pub(super) struct Rig {
    pub(super) memory: MemoryBackend,
    pub(super) faulty: FaultyBackend,
    pub(super) locker: Locker,
}

impl Rig {
    pub(super) fn new(options: LockOptions) -> Self {
        let memory = MemoryBackend::new();
        let faulty = FaultyBackend::new(Arc::new(memory.clone()));
        let locker = Locker::new(Arc::new(faulty.clone()))
            .with_options(options)
            .with_jitter_seed(7);
        Self {
            memory,
            faulty,
            locker,
        }
    }

    /// A second locker on the same (fault-free) lock table.
    pub(super) fn rival(&self) -> Locker {
        Locker::new(Arc::new(self.memory.clone())).with_options(self.locker.options().clone())
    }
}

/// Waits until the guard's health satisfies `pred`; returns when that happened.
pub(super) async fn until(guard: &LockGuard, pred: impl Fn(&Health) -> bool) -> (Instant, Health) {
    let mut rx = guard.health();
    loop {
        let health = rx.borrow_and_update().clone();
        if pred(&health) {
            return (Instant::now(), health);
        }
        rx.changed().await.expect("refresher alive");
    }
}
