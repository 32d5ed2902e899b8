//! When the acquire loop subscribes to release notifications: only after an attempt found
//! the lock held, so a free lock costs no subscription (a statement, a watch, a
//! `SUBSCRIBE` on the real backends), and then it attempts once more before it waits, so
//! a release between that attempt and the subscription is not slept through.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use async_trait::async_trait;

use super::ms;
use crate::{
    Acquire, AcquireRequest, Backoff, Guarantees, HolderInfo, Identity, Jitter, Lease, LockBackend,
    LockName, LockOptions, Locker, MemoryBackend, ReleaseEvents, Result, Ttl, WaitMode,
};

/// A memory backend that counts subscriptions and can release a lease just before the
/// next subscription starts (a release that no notification reports to that subscriber).
#[derive(Debug, Default)]
struct Counted {
    inner: MemoryBackend,
    subscribes: AtomicUsize,
    attempts: AtomicUsize,
    release_before_subscribing: Mutex<Option<Lease>>,
}

#[async_trait]
impl LockBackend for Counted {
    fn backend_name(&self) -> &str {
        "counted"
    }
    fn guarantees(&self) -> Guarantees {
        self.inner.guarantees()
    }
    async fn acquire(&self, request: &AcquireRequest) -> Result<Acquire> {
        self.attempts.fetch_add(1, Ordering::Relaxed);
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
    async fn subscribe(&self, name: &LockName) -> Result<Option<ReleaseEvents>> {
        self.subscribes.fetch_add(1, Ordering::Relaxed);
        let release = self
            .release_before_subscribing
            .lock()
            .expect("not poisoned")
            .take();
        if let Some(lease) = release {
            self.inner.release(&lease).await.expect("released");
        }
        self.inner.subscribe(name).await
    }
}

/// A lease on `name` held by someone else, straight from the backend.
async fn held_by_rival(backend: &Counted, name: &str) -> Lease {
    let request = AcquireRequest::new(
        LockName::new(name).expect("valid"),
        Identity::from_stored("rival/1/0"),
        Ttl::new(ms(600_000)).expect("valid"),
    );
    match backend.inner.acquire(&request).await.expect("acquire") {
        Acquire::Acquired(lease) => lease,
        Acquire::Held(_) => panic!("the lock was free"),
    }
}

/// Waiting up to ten minutes, with a backoff of a whole minute between attempts: only a
/// notification or the attempt right after subscribing can make an acquire quick.
fn patient() -> LockOptions {
    let minute = ms(60_000);
    LockOptions::new(ms(30_000))
        .with_backoff(Backoff::new(minute, minute).with_jitter(Jitter::None))
        .with_wait(WaitMode::Timeout(ms(600_000)))
}

#[test]
fn an_acquire_that_finds_the_lock_free_never_subscribes() {
    crate::tests::bounded(an_acquire_that_finds_the_lock_free_never_subscribes_body);
}

async fn an_acquire_that_finds_the_lock_free_never_subscribes_body() {
    let backend = Arc::new(Counted::default());
    let locker = Locker::new(backend.clone()).with_options(patient());
    for _ in 0..3 {
        let guard = locker.acquire("free").await.expect("free");
        guard.release().await.expect("release");
    }
    assert_eq!(backend.subscribes.load(Ordering::Relaxed), 0);

    // A held lock: one subscription, then woken by the release (not the minute's backoff).
    let rival = held_by_rival(&backend, "busy").await;
    let waiter = {
        let locker = locker.clone();
        tokio::spawn(async move { locker.acquire("busy").await })
    };
    tokio::time::sleep(ms(1_000)).await;
    let released = tokio::time::Instant::now();
    backend.inner.release(&rival).await.expect("release");
    let guard = waiter.await.expect("join").expect("acquired");
    assert!(released.elapsed() < ms(1_000), "{:?}", released.elapsed());
    assert_eq!(backend.subscribes.load(Ordering::Relaxed), 1);
    guard.release().await.expect("release");
}

#[test]
fn a_release_just_before_the_subscription_is_caught_by_the_next_attempt() {
    crate::tests::bounded(
        a_release_just_before_the_subscription_is_caught_by_the_next_attempt_body,
    );
}

async fn a_release_just_before_the_subscription_is_caught_by_the_next_attempt_body() {
    let backend = Arc::new(Counted::default());
    let rival = held_by_rival(&backend, "race").await;
    *backend
        .release_before_subscribing
        .lock()
        .expect("not poisoned") = Some(rival);
    let locker = Locker::new(backend.clone()).with_options(patient());
    let started = tokio::time::Instant::now();
    let guard = locker.acquire("race").await.expect("acquired");
    // Without the attempt after subscribing, the release (which no notification reports)
    // would be found only after the minute's backoff.
    assert!(started.elapsed() < ms(1_000), "{:?}", started.elapsed());
    assert_eq!(backend.attempts.load(Ordering::Relaxed), 2);
    guard.release().await.expect("release");
}

#[test]
fn a_try_once_acquire_never_subscribes() {
    crate::tests::bounded(a_try_once_acquire_never_subscribes_body);
}

async fn a_try_once_acquire_never_subscribes_body() {
    let backend = Arc::new(Counted::default());
    let _rival = held_by_rival(&backend, "held").await;
    let locker = Locker::new(backend.clone());
    let guard = locker.try_acquire("held").await.expect("one attempt");
    assert!(guard.is_none(), "the lock is held");
    assert_eq!(backend.subscribes.load(Ordering::Relaxed), 0);
}
