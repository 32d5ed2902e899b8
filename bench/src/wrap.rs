//! [`Observed`]: a `LockBackend` wrapper that counts refreshes and can turn release
//! notifications off, so one backend can be measured notified and polled in one run.

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
    refreshes: AtomicU64,
    refresh_failures: AtomicU64,
    first_failure: Mutex<Option<String>>,
}

impl Observed {
    /// Wraps `inner`; `polled` hides its notifications and queue.
    pub(crate) fn new(inner: Arc<dyn LockBackend>, polled: bool) -> Self {
        Self {
            inner,
            polled,
            refreshes: AtomicU64::new(0),
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

    /// Refresh calls so far, and how many of them failed.
    pub(crate) fn refreshes(&self) -> (u64, u64) {
        (
            self.refreshes.load(Ordering::Relaxed),
            self.refresh_failures.load(Ordering::Relaxed),
        )
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
        self.refreshes.fetch_add(1, Ordering::Relaxed);
        let outcome = self.inner.refresh(lease).await;
        if let Err(e) = &outcome {
            self.refresh_failures.fetch_add(1, Ordering::Relaxed);
            let mut first = self
                .first_failure
                .lock()
                .unwrap_or_else(PoisonError::into_inner);
            first.get_or_insert_with(|| e.to_string());
        }
        outcome
    }
    async fn release(&self, lease: &Lease) -> Result<()> {
        self.inner.release(lease).await
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
    use lockcore::{Identity, MemoryBackend};
    use std::time::Duration;

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
        let request = AcquireRequest::new(
            name,
            Identity::unique(),
            lockcore::Ttl::new(Duration::from_secs(5)).expect("valid TTL"),
        );
        let Acquire::Acquired(lease) = notified.acquire(&request).await.expect("acquire") else {
            panic!("free lock was held");
        };
        notified.refresh(&lease).await.expect("refresh");
        notified.release(&lease).await.expect("release");
        assert!(notified.refresh(&lease).await.is_err());
        assert_eq!(notified.refreshes(), (2, 1));
        assert!(notified.first_failure().is_some());
    }
}
