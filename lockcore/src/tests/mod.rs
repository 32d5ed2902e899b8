//! Runtime tests of the acquire loop and the lease refresher, on tokio's paused clock with
//! a scripted fault-injecting backend. Time is virtual: bounds are exact, not generous.

mod acquire;
mod clock;
mod orphan;
mod poll;
mod queue;
mod refresher;
mod starved;

use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use crate::testing::FaultyBackend;
use crate::{Health, LockGuard, LockOptions, Locker, MemoryBackend};

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
