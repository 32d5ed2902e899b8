//! The acquire loop's use of a backend's FIFO queue (`LockBackend::enqueue`).

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use tokio::time::Instant;

use super::ms;
use crate::{
    Acquire, AcquireRequest, Backoff, ErrorKind, Guarantees, HolderInfo, Identity, Jitter, Lease,
    LockBackend, LockName, LockOptions, Locker, MemoryBackend, QueueTicket, Result, WaitMode,
};

/// A memory backend with a queue: records enqueues and when places are left. If
/// `release_on_enqueue` holds a lease, `enqueue` releases it first (the holder leaving
/// between the waiter's attempt and its enqueue).
#[derive(Debug, Default)]
struct Queueing {
    inner: MemoryBackend,
    enqueued: Arc<AtomicUsize>,
    left: Arc<AtomicUsize>,
    release_on_enqueue: Mutex<Option<Lease>>,
    /// Tickets carry an event stream that ends at once: the place was lost (etcd: the
    /// queue key's lease expired or was revoked).
    places_get_lost: bool,
}

/// The place: leaving the queue is counted on drop.
struct Place(Arc<AtomicUsize>);

impl Drop for Place {
    fn drop(&mut self) {
        self.0.fetch_add(1, Ordering::SeqCst);
    }
}

#[async_trait]
impl LockBackend for Queueing {
    fn backend_name(&self) -> &str {
        "queueing"
    }
    async fn acquire(&self, request: &AcquireRequest) -> Result<Acquire> {
        self.inner.acquire(request).await
    }
    async fn refresh(&self, lease: &Lease) -> Result<Lease> {
        self.inner.refresh(lease).await
    }
    async fn release(&self, lease: &Lease) -> Result<()> {
        self.inner.release(lease).await
    }
    async fn inspect(&self, name: &LockName) -> Result<Option<HolderInfo>> {
        self.inner.inspect(name).await
    }
    fn guarantees(&self) -> Guarantees {
        self.inner.guarantees()
    }
    async fn enqueue(&self, _request: &AcquireRequest) -> Result<Option<QueueTicket>> {
        self.enqueued.fetch_add(1, Ordering::SeqCst);
        let holder = self.release_on_enqueue.lock().expect("lock").take();
        if let Some(lease) = holder {
            self.inner.release(&lease).await?;
        }
        let events: Option<crate::ReleaseEvents> = self
            .places_get_lost
            .then(|| Box::pin(futures_util::stream::empty()) as crate::ReleaseEvents);
        Ok(Some(QueueTicket::new(Place(self.left.clone()), events)))
    }
}

/// A backoff so long that only an immediate retry explains a prompt grant.
fn sleepy(wait: WaitMode) -> LockOptions {
    let backoff = Backoff::new(ms(60_000), ms(60_000)).with_jitter(Jitter::None);
    LockOptions::new(ms(600_000))
        .with_backoff(backoff)
        .with_wait(wait)
}

async fn held(backend: &Queueing) -> Lease {
    let request = AcquireRequest::new(
        LockName::new("job").expect("ok"),
        Identity::unique(),
        crate::Ttl::new(ms(600_000)).expect("valid"),
    );
    match backend.inner.acquire(&request).await.expect("ok") {
        Acquire::Acquired(lease) => lease,
        Acquire::Held(_) => panic!("free"),
    }
}

#[test]
fn try_once_never_joins_the_queue() {
    crate::tests::bounded(try_once_never_joins_the_queue_body);
}

async fn try_once_never_joins_the_queue_body() {
    let backend = Arc::new(Queueing::default());
    held(&backend).await;
    let locker = Locker::new(backend.clone()).with_options(sleepy(WaitMode::TryOnce));
    assert!(locker.try_acquire("job").await.expect("ok").is_none());
    assert_eq!(backend.enqueued.load(Ordering::SeqCst), 0);
}

/// A zero wait is one real try and no more: past its deadline the loop takes no queue
/// place (on etcd a lease, a key ahead of newcomers and a watch), and gives up.
#[test]
fn a_zero_wait_never_joins_the_queue() {
    crate::tests::bounded(a_zero_wait_never_joins_the_queue_body);
}

async fn a_zero_wait_never_joins_the_queue_body() {
    let backend = Arc::new(Queueing::default());
    held(&backend).await;
    let locker = Locker::new(backend.clone()).with_options(sleepy(WaitMode::Timeout(ms(0))));
    let err = locker.acquire("job").await.expect_err("held");
    assert_eq!(err.kind(), ErrorKind::Timeout, "{err}");
    // An enqueue would run in a task of its own: give it the chance.
    tokio::time::sleep(ms(10)).await;
    assert_eq!(backend.enqueued.load(Ordering::SeqCst), 0);
}

#[test]
fn a_waiter_joins_once_retries_at_once_and_leaves_after_the_grant() {
    crate::tests::bounded(a_waiter_joins_once_retries_at_once_and_leaves_after_the_grant_body);
}

async fn a_waiter_joins_once_retries_at_once_and_leaves_after_the_grant_body() {
    let backend = Arc::new(Queueing::default());
    *backend.release_on_enqueue.lock().expect("lock") = Some(held(&backend).await);
    let locker = Locker::new(backend.clone()).with_options(sleepy(WaitMode::Forever));
    let start = Instant::now();
    let guard = locker.acquire("job").await.expect("granted");
    assert_eq!(
        start.elapsed(),
        Duration::ZERO,
        "retried at once after joining the queue"
    );
    assert_eq!(backend.enqueued.load(Ordering::SeqCst), 1);
    assert_eq!(
        backend.left.load(Ordering::SeqCst),
        1,
        "the ticket is dropped after the grant"
    );
    guard.release().await.expect("release");
}

#[test]
fn a_timed_out_waiter_leaves_the_queue() {
    crate::tests::bounded(a_timed_out_waiter_leaves_the_queue_body);
}

async fn a_timed_out_waiter_leaves_the_queue_body() {
    let backend = Arc::new(Queueing::default());
    held(&backend).await;
    let locker = Locker::new(backend.clone()).with_options(sleepy(WaitMode::Timeout(ms(500))));
    let err = locker.acquire("job").await.expect_err("held");
    assert_eq!(err.kind(), ErrorKind::Timeout);
    assert_eq!(
        backend.enqueued.load(Ordering::SeqCst),
        1,
        "joined once, not per attempt"
    );
    assert_eq!(backend.left.load(Ordering::SeqCst), 1);
}

#[test]
fn a_cancelled_waiter_leaves_the_queue() {
    crate::tests::bounded(a_cancelled_waiter_leaves_the_queue_body);
}

async fn a_cancelled_waiter_leaves_the_queue_body() {
    let backend = Arc::new(Queueing::default());
    held(&backend).await;
    let locker = Locker::new(backend.clone()).with_options(sleepy(WaitMode::Forever));
    let waiting = tokio::time::timeout(ms(1000), locker.acquire("job")).await;
    assert!(waiting.is_err(), "still waiting");
    tokio::task::yield_now().await;
    assert_eq!(backend.enqueued.load(Ordering::SeqCst), 1);
    assert_eq!(
        backend.left.load(Ordering::SeqCst),
        1,
        "dropping the acquire left the queue"
    );
}

#[test]
fn a_waiter_that_loses_its_place_in_the_queue_joins_it_again() {
    crate::tests::bounded(a_waiter_that_loses_its_place_in_the_queue_joins_it_again_body);
}

async fn a_waiter_that_loses_its_place_in_the_queue_joins_it_again_body() {
    let backend = Arc::new(Queueing {
        places_get_lost: true,
        ..Queueing::default()
    });
    let _holder = held(&backend).await;
    let options = LockOptions::new(ms(600_000))
        .with_backoff(Backoff::new(ms(100), ms(100)).with_jitter(Jitter::None))
        .with_wait(WaitMode::Timeout(ms(1000)));
    let locker = Locker::new(backend.clone()).with_options(options);
    let err = locker.acquire("job").await.expect_err("held throughout");
    assert_eq!(err.kind(), ErrorKind::Timeout);
    let enqueued = backend.enqueued.load(Ordering::SeqCst);
    assert!(enqueued >= 2, "joined the queue {enqueued} time(s)");
    assert_eq!(
        backend.left.load(Ordering::SeqCst),
        enqueued,
        "every lost place was left before joining again"
    );
}
