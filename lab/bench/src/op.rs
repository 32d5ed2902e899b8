//! What the harness measures: a [`Lock`] (ours or a peer's) and an [`Op`] (one timed unit:
//! a raw round trip, or a lock cycle through [`Cycle`]).

use std::any::Any;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use lockcore::{
    Acquire, AcquireRequest, Identity, Lease, LockBackend, LockGuard, LockName, LockOptions,
    Locker, WaitMode,
};

/// Any error, boxed.
pub(crate) type BoxError = Box<dyn std::error::Error + Send + Sync>;
/// The harness's result type.
pub(crate) type Res<T> = Result<T, BoxError>;
/// Whatever a [`Lock`] needs to release what it acquired.
pub(crate) type Held = Box<dyn Any + Send>;

/// How many distinct lock names a cycle walks through (issue 9: 1,000 distinct names).
pub(crate) const NAMES: usize = 1_000;

/// One lock implementation under test: ours through `Locker`, ours through bare backend
/// calls, or a peer library.
#[async_trait]
pub(crate) trait Lock: Send + Sync {
    /// Takes `name`. With `wait`, blocks until it is ours; without, one attempt that
    /// returns `None` when someone else holds it.
    async fn acquire(&self, name: &str, wait: bool) -> Res<Option<Held>>;
    /// Releases what [`acquire`](Self::acquire) returned.
    async fn release(&self, held: Held) -> Res<()>;
}

/// One timed unit of work; `i` picks the lock name or key, so concurrent tasks can keep to
/// disjoint names.
#[async_trait]
pub(crate) trait Op: Send + Sync {
    /// Runs the unit once.
    async fn run(&self, i: usize) -> Res<()>;
}

/// Who an entry in a table is: ours, the server's raw round trip, or a peer library.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub(crate) enum Role {
    /// anylock.
    Ours,
    /// The server's own round trip, no lock.
    Raw,
    /// Another lock library or the server's native lock.
    Peer,
}

/// A labelled [`Op`].
#[derive(Clone)]
pub(crate) struct Entry {
    /// What the report calls it.
    pub(crate) label: String,
    /// Ours, raw or peer.
    pub(crate) role: Role,
    /// The unit of work.
    pub(crate) op: Arc<dyn Op>,
    /// A reference point (one of a system's `extras`) that the throughput section
    /// measures too, beside the raw round trip.
    pub(crate) in_throughput: bool,
}

impl Entry {
    /// An entry for `op`.
    pub(crate) fn new(label: impl Into<String>, role: Role, op: Arc<dyn Op>) -> Self {
        Self {
            label: label.into(),
            role,
            op,
            in_throughput: false,
        }
    }

    /// This entry, measured by the throughput section too.
    pub(crate) fn in_throughput(mut self) -> Self {
        self.in_throughput = true;
        self
    }

    /// An entry whose unit is one uncontended acquire + release cycle of `lock`.
    pub(crate) fn cycle(label: &str, role: Role, lock: Arc<dyn Lock>, prefix: &str) -> Self {
        Self::cycle_of(label, role, lock, prefix, false)
    }

    /// A cycle whose acquire is a waiting one (it finds the lock free, so it never waits):
    /// what a default `Locker::acquire` costs on top of a try-acquire.
    pub(crate) fn waiting_cycle(
        label: &str,
        role: Role,
        lock: Arc<dyn Lock>,
        prefix: &str,
    ) -> Self {
        Self::cycle_of(label, role, lock, prefix, true)
    }

    fn cycle_of(label: &str, role: Role, lock: Arc<dyn Lock>, prefix: &str, wait: bool) -> Self {
        let op = Arc::new(Cycle {
            lock,
            prefix: format!("{prefix}-{}", slug(label)),
            wait,
        });
        Self::new(label, role, op)
    }
}

/// Lowercase letters and digits of `label`, others as `-`: a name-safe tag.
pub(crate) fn slug(label: &str) -> String {
    label
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() {
                c.to_ascii_lowercase()
            } else {
                '-'
            }
        })
        .collect()
}

/// One uncontended acquire (single attempt) + release of the name `prefix-(i mod NAMES)`.
pub(crate) struct Cycle {
    lock: Arc<dyn Lock>,
    prefix: String,
    /// Acquire with a waiting acquire instead of a try-acquire.
    wait: bool,
}

#[async_trait]
impl Op for Cycle {
    async fn run(&self, i: usize) -> Res<()> {
        let name = format!("{}-{}", self.prefix, i % NAMES);
        match self.lock.acquire(&name, self.wait).await? {
            Some(held) => self.lock.release(held).await,
            None => Err(format!("{name} was held during an uncontended cycle").into()),
        }
    }
}

/// anylock through [`Locker`]: what an application calls.
pub(crate) struct Ours {
    locker: Locker,
    wait: LockOptions,
}

impl Ours {
    /// A locker on `backend` with lease `ttl`; waiting acquires wait up to a minute.
    pub(crate) fn new(backend: Arc<dyn LockBackend>, ttl: Duration) -> Self {
        let options = LockOptions::new(ttl);
        Self {
            locker: Locker::new(backend).with_options(options.clone()),
            wait: options.with_wait(WaitMode::Timeout(Duration::from_secs(60))),
        }
    }
}

#[async_trait]
impl Lock for Ours {
    async fn acquire(&self, name: &str, wait: bool) -> Res<Option<Held>> {
        let guard = if wait {
            Some(self.locker.acquire_with(name, &self.wait).await?)
        } else {
            self.locker.try_acquire(name).await?
        };
        Ok(guard.map(|g| Box::new(g) as Held))
    }

    async fn release(&self, held: Held) -> Res<()> {
        let guard = held
            .downcast::<LockGuard>()
            .map_err(|_| "not a LockGuard")?;
        Ok(guard.release().await?)
    }
}

/// One permit of a semaphore through [`Locker`] (`try_acquire_permit` + release): what a
/// `run --permits N` costs beside a lock.
pub(crate) struct OursPermit {
    locker: Locker,
    permits: u32,
}

impl OursPermit {
    /// A locker on `backend` with lease `ttl`, taking permits of semaphores of `permits`.
    pub(crate) fn new(backend: Arc<dyn LockBackend>, ttl: Duration, permits: u32) -> Self {
        Self {
            locker: Locker::new(backend).with_options(LockOptions::new(ttl)),
            permits,
        }
    }
}

#[async_trait]
impl Lock for OursPermit {
    async fn acquire(&self, name: &str, wait: bool) -> Res<Option<Held>> {
        let guard = if wait {
            Some(self.locker.acquire_permit(name, self.permits).await?)
        } else {
            self.locker.try_acquire_permit(name, self.permits).await?
        };
        Ok(guard.map(|g| Box::new(g) as Held))
    }

    async fn release(&self, held: Held) -> Res<()> {
        let guard = held
            .downcast::<LockGuard>()
            .map_err(|_| "not a LockGuard")?;
        Ok(guard.release().await?)
    }
}

/// anylock's backend called directly (one `acquire`, one `release`), without `Locker`,
/// its attempt task and its refresher task: isolates lockcore's own cost.
pub(crate) struct Bare {
    backend: Arc<dyn LockBackend>,
    ttl: Duration,
}

impl Bare {
    /// Bare calls on `backend` with lease `ttl`.
    pub(crate) fn new(backend: Arc<dyn LockBackend>, ttl: Duration) -> Self {
        Self { backend, ttl }
    }
}

#[async_trait]
impl Lock for Bare {
    async fn acquire(&self, name: &str, wait: bool) -> Res<Option<Held>> {
        if wait {
            return Err("bare backend calls do not wait".into());
        }
        let request = AcquireRequest::new(
            LockName::new(name)?,
            Identity::unique(),
            lockcore::Ttl::new(self.ttl)?,
        );
        Ok(match self.backend.acquire(&request).await? {
            Acquire::Acquired(lease) => Some(Box::new(lease)),
            Acquire::Held(_) => None,
        })
    }

    async fn release(&self, held: Held) -> Res<()> {
        let lease = held.downcast::<Lease>().map_err(|_| "not a Lease")?;
        Ok(self.backend.release(&lease).await?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use lockcore::MemoryBackend;

    #[test]
    fn slugs_are_name_safe() {
        assert_eq!(slug("rslock, 5 nodes"), "rslock--5-nodes");
    }

    #[tokio::test]
    async fn cycles_take_and_free_distinct_names() {
        let backend: Arc<dyn LockBackend> = Arc::new(MemoryBackend::new());
        let ttl = Duration::from_secs(5);
        for lock in [
            Arc::new(Ours::new(backend.clone(), ttl)) as Arc<dyn Lock>,
            Arc::new(Bare::new(backend.clone(), ttl)),
        ] {
            let entry = Entry::cycle("ours", Role::Ours, lock, "t");
            for i in 0..3 * NAMES / 2 {
                entry.op.run(i).await.expect("cycle");
            }
        }
        assert!(
            backend
                .inspect(&LockName::new("t-ours-7").expect("name"))
                .await
                .expect("inspect")
                .is_none()
        );
    }
}
