//! [`Observed`]: a `LockBackend` wrapper that counts refreshes (single calls, batched
//! calls and the leases they carry) and can turn release notifications off, so one
//! backend can be measured notified and polled in one run. It forwards
//! `refresh_many` and `refresh_batch_limit`, so a `Locker` batches through it exactly as
//! it would on the bare backend.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use async_trait::async_trait;
use lockcore::{
    Acquire, AcquireRequest, FenceToken, Guarantees, HolderInfo, Lease, LockBackend, LockName,
    QueueTicket, ReleaseEvents, Result,
};

/// Delegates every call to `inner`, counting refresh outcomes; with `polled`, reports no
/// notifications and no FIFO queue, so `Locker` waiters fall back to backoff polling.
#[derive(Debug)]
pub(crate) struct Observed {
    inner: Arc<dyn LockBackend>,
    polled: bool,
    single_calls: AtomicU64,
    batch_calls: AtomicU64,
    batched_leases: AtomicU64,
    refresh_failures: AtomicU64,
    first_failure: Mutex<Option<String>>,
}

/// Refresh traffic through an [`Observed`] backend so far.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Refreshes {
    /// `refresh` calls (one lease each).
    pub(crate) single_calls: u64,
    /// `refresh_many` calls.
    pub(crate) batch_calls: u64,
    /// Leases those `refresh_many` calls carried.
    pub(crate) batched_leases: u64,
    /// Leases whose refresh failed (by either call).
    pub(crate) failures: u64,
}

impl Refreshes {
    /// Calls of either kind: what costs round trips.
    pub(crate) fn calls(&self) -> u64 {
        self.single_calls + self.batch_calls
    }

    /// Leases refreshed (or tried) by either kind of call.
    pub(crate) fn leases(&self) -> u64 {
        self.single_calls + self.batched_leases
    }

    /// What happened between `earlier` and `self`.
    pub(crate) fn since(&self, earlier: &Self) -> Self {
        Self {
            single_calls: self.single_calls - earlier.single_calls,
            batch_calls: self.batch_calls - earlier.batch_calls,
            batched_leases: self.batched_leases - earlier.batched_leases,
            failures: self.failures - earlier.failures,
        }
    }
}

impl Observed {
    /// Wraps `inner`; `polled` hides its notifications and queue.
    pub(crate) fn new(inner: Arc<dyn LockBackend>, polled: bool) -> Self {
        Self {
            inner,
            polled,
            single_calls: AtomicU64::new(0),
            batch_calls: AtomicU64::new(0),
            batched_leases: AtomicU64::new(0),
            refresh_failures: AtomicU64::new(0),
            first_failure: Mutex::new(None),
        }
    }

    /// The message of the first failed refresh, if any failed.
    pub(crate) fn first_failure(&self) -> Option<String> {
        self.first_failure
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// Refresh calls and leases so far, and how many leases' refreshes failed.
    pub(crate) fn refreshes(&self) -> Refreshes {
        Refreshes {
            single_calls: self.single_calls.load(Ordering::Relaxed),
            batch_calls: self.batch_calls.load(Ordering::Relaxed),
            batched_leases: self.batched_leases.load(Ordering::Relaxed),
            failures: self.refresh_failures.load(Ordering::Relaxed),
        }
    }

    /// Counts one failed lease refresh, keeping the first message.
    fn failed(&self, e: &lockcore::Error) {
        self.refresh_failures.fetch_add(1, Ordering::Relaxed);
        let mut first = self
            .first_failure
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        first.get_or_insert_with(|| e.to_string());
    }
}

#[async_trait]
impl LockBackend for Observed {
    fn backend_name(&self) -> &str {
        self.inner.backend_name()
    }
    async fn acquire(&self, request: &AcquireRequest) -> Result<Acquire> {
        self.inner.acquire(request).await
    }
    async fn refresh(&self, lease: &Lease) -> Result<Lease> {
        self.single_calls.fetch_add(1, Ordering::Relaxed);
        let outcome = self.inner.refresh(lease).await;
        if let Err(e) = &outcome {
            self.failed(e);
        }
        outcome
    }
    async fn refresh_many(&self, leases: &[Lease]) -> Vec<Result<Lease>> {
        self.batch_calls.fetch_add(1, Ordering::Relaxed);
        self.batched_leases
            .fetch_add(leases.len() as u64, Ordering::Relaxed);
        let outcomes = self.inner.refresh_many(leases).await;
        for e in outcomes.iter().filter_map(|o| o.as_ref().err()) {
            self.failed(e);
        }
        outcomes
    }
    fn refresh_batch_limit(&self) -> usize {
        self.inner.refresh_batch_limit()
    }
    async fn release(&self, lease: &Lease) -> Result<()> {
        self.inner.release(lease).await
    }
    async fn detach(&self, lease: &Lease) -> Result<()> {
        self.inner.detach(lease).await
    }
    fn check_options(&self, options: &lockcore::LockOptions) -> Result<()> {
        self.inner.check_options(options)
    }
    async fn server_time(&self) -> Result<Option<std::time::SystemTime>> {
        self.inner.server_time().await
    }
    fn fence_token(&self, lease: &Lease) -> Option<FenceToken> {
        self.inner.fence_token(lease)
    }
    async fn inspect(&self, name: &LockName) -> Result<Option<HolderInfo>> {
        self.inner.inspect(name).await
    }
    fn guarantees(&self) -> Guarantees {
        self.inner.guarantees()
    }
    async fn list(&self, prefix: &str) -> Result<Vec<lockcore::HeldLock>> {
        self.inner.list(prefix).await
    }
    async fn enqueue(&self, request: &AcquireRequest) -> Result<Option<QueueTicket>> {
        if self.polled {
            return Ok(None);
        }
        self.inner.enqueue(request).await
    }
    async fn subscribe(&self, name: &LockName) -> Result<Option<ReleaseEvents>> {
        if self.polled {
            return Ok(None);
        }
        self.inner.subscribe(name).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use lockcore::{Identity, LockOptions, Locker, MemoryBackend};
    use std::time::Duration;

    fn request(name: &str) -> AcquireRequest {
        AcquireRequest::new(
            LockName::new(name).expect("name"),
            Identity::unique(),
            lockcore::Ttl::new(Duration::from_secs(5)).expect("valid TTL"),
        )
    }

    async fn acquire(backend: &dyn LockBackend, name: &str) -> Lease {
        let Acquire::Acquired(lease) = backend.acquire(&request(name)).await.expect("acquire")
        else {
            panic!("free lock was held");
        };
        lease
    }

    #[tokio::test]
    async fn polled_hides_notifications_and_counts_refreshes() {
        let inner: Arc<dyn LockBackend> = Arc::new(MemoryBackend::new());
        let name = LockName::new("n").expect("name");
        let polled = Observed::new(inner.clone(), true);
        assert!(polled.subscribe(&name).await.expect("subscribe").is_none());
        let notified = Observed::new(inner, false);
        assert!(
            notified
                .subscribe(&name)
                .await
                .expect("subscribe")
                .is_some()
        );
        let lease = acquire(&notified, "n").await;
        notified.refresh(&lease).await.expect("refresh");
        notified.release(&lease).await.expect("release");
        assert!(notified.refresh(&lease).await.is_err());
        let counted = notified.refreshes();
        assert_eq!(
            (counted.calls(), counted.leases(), counted.failures),
            (2, 2, 1)
        );
        assert!(notified.first_failure().is_some());
    }

    #[tokio::test]
    async fn batches_are_forwarded_and_counted_as_one_call() {
        let inner: Arc<dyn LockBackend> =
            Arc::new(MemoryBackend::new().with_refresh_batch_limit(50));
        let observed = Observed::new(inner, false);
        assert_eq!(observed.refresh_batch_limit(), 50);
        let mut leases = Vec::new();
        for i in 0..3 {
            leases.push(acquire(&observed, &format!("b{i}")).await);
        }
        observed.release(&leases[1]).await.expect("release");
        let outcomes = observed.refresh_many(&leases).await;
        assert_eq!(outcomes.len(), 3);
        assert!(outcomes[0].is_ok() && outcomes[1].is_err() && outcomes[2].is_ok());
        let counted = observed.refreshes();
        assert_eq!(
            counted,
            Refreshes {
                single_calls: 0,
                batch_calls: 1,
                batched_leases: 3,
                failures: 1,
            }
        );
        assert_eq!((counted.calls(), counted.leases()), (1, 3));
        let later = Refreshes {
            single_calls: 2,
            ..counted
        };
        assert_eq!(later.since(&counted).calls(), 2);
    }

    /// A `Locker` over the wrapper batches as it would over the bare backend: its guards'
    /// refreshes arrive as `refresh_many` calls, fewer calls than leases.
    #[tokio::test]
    async fn a_locker_batches_through_the_wrapper() {
        let inner: Arc<dyn LockBackend> =
            Arc::new(MemoryBackend::new().with_refresh_batch_limit(100));
        let observed = Arc::new(Observed::new(inner, false));
        // TTL 1 s: a refresh every 125 ms (guards refreshing more often than every 100 ms
        // refresh alone, see lockcore's `keeper.rs`).
        let options = LockOptions::new(Duration::from_millis(1000));
        let locker = Locker::new(observed.clone()).with_options(options);
        let mut guards = Vec::new();
        for i in 0..20 {
            guards.push(locker.try_acquire(&format!("g{i}")).await.expect("acquire"));
        }
        let before = observed.refreshes();
        // Two refreshes per guard; the timeout only keeps a broken wrapper from hanging
        // the test.
        let refreshed = async {
            while observed.refreshes().since(&before).leases() < 40 {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        };
        tokio::time::timeout(Duration::from_secs(30), refreshed)
            .await
            .expect("the guards refreshed");
        let counted = observed.refreshes().since(&before);
        assert_eq!(counted.single_calls, 0, "{counted:?}");
        assert!(counted.batch_calls < counted.leases(), "{counted:?}");
        for guard in guards.into_iter().flatten() {
            guard.release().await.expect("release");
        }
    }
}
