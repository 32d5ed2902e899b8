//! FIFO waiting: a waiting acquire keeps a queue key for the whole wait, and leaves the
//! queue when it times out or is cancelled; newcomers and try-once attempts never jump or
//! clutter the queue; the queue key is kept alive past its TTL.

mod common;

use std::sync::Arc;
use std::time::Duration;

use backend_etcd::EtcdBackend;
use lockcore::{ErrorKind, LockBackend, LockName, LockOptions, Locker, WaitMode};
use tokio::time::{Instant, sleep};

const LONG: Duration = Duration::from_secs(30);

/// A backend under a fresh prefix, a raw client, and the lock's key prefix.
async fn setup(endpoints: &[String], what: &str) -> (Arc<EtcdBackend>, common::raw::Raw, String) {
    let prefix = common::random_prefix(what);
    let backend = Arc::new(common::backend(endpoints, &prefix).await);
    let raw = common::raw(endpoints).await;
    let lock = backend.lock_prefix(&LockName::new("q").expect("name"));
    (backend, raw, lock)
}

fn locker(backend: &Arc<EtcdBackend>, ttl: Duration, wait: WaitMode) -> Locker {
    Locker::new(backend.clone()).with_options(LockOptions::new(ttl).with_wait(wait))
}

/// Waits (up to 5 s) until exactly `count` keys are under `lock`; panics otherwise.
async fn wait_for_keys(raw: &mut common::raw::Raw, lock: &str, count: usize) {
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let keys = common::keys_under(raw, lock).await;
        if keys.len() == count {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "expected {count} keys under {lock}, found {}",
            keys.len()
        );
        sleep(Duration::from_millis(20)).await;
    }
}

/// A waiter that times out leaves the queue at once: the next waiter gets the lock right
/// after the holder releases, not a TTL (30 s) later.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_timed_out_waiter_leaves_the_queue() {
    let Some(endpoints) = common::shared_endpoints() else {
        return;
    };
    let (backend, mut raw, lock) = setup(&endpoints, "queue-timeout").await;
    let holder = locker(&backend, LONG, WaitMode::Forever);
    let guard = holder.acquire("q").await.expect("acquire");
    let quitter = locker(&backend, LONG, WaitMode::Timeout(Duration::from_secs(1)));
    let quitting = tokio::spawn(async move { quitter.acquire("q").await.map(drop) });
    wait_for_keys(&mut raw, &lock, 2).await;
    let patient = locker(&backend, LONG, WaitMode::Timeout(Duration::from_secs(20)));
    let waiting = tokio::spawn(async move { patient.acquire("q").await });
    wait_for_keys(&mut raw, &lock, 3).await;
    let err = quitting.await.expect("task").expect_err("should time out");
    assert_eq!(err.kind(), ErrorKind::Timeout, "{err}");
    wait_for_keys(&mut raw, &lock, 2).await;
    let released = Instant::now();
    guard.release().await.expect("release");
    let next = waiting.await.expect("task").expect("the next waiter");
    let waited = released.elapsed();
    assert!(
        waited < Duration::from_secs(3),
        "next waiter waited {waited:?}"
    );
    next.release().await.expect("release");
    wait_for_keys(&mut raw, &lock, 0).await;
}

/// Dropping a waiting acquire (aborting its task) leaves the queue at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancelled_waiter_leaves_the_queue() {
    let Some(endpoints) = common::shared_endpoints() else {
        return;
    };
    let (backend, mut raw, lock) = setup(&endpoints, "queue-cancel").await;
    let holder = locker(&backend, LONG, WaitMode::Forever);
    let guard = holder.acquire("q").await.expect("acquire");
    let waiter = locker(&backend, LONG, WaitMode::Forever);
    let waiting = tokio::spawn(async move { waiter.acquire("q").await.map(drop) });
    wait_for_keys(&mut raw, &lock, 2).await;
    waiting.abort();
    assert!(waiting.await.expect_err("aborted").is_cancelled());
    wait_for_keys(&mut raw, &lock, 1).await;
    guard.release().await.expect("release");
    let newcomer = locker(&backend, LONG, WaitMode::TryOnce);
    let guard = newcomer.try_acquire("q").await.expect("call");
    guard
        .expect("free once the holder released")
        .release()
        .await
        .expect("release");
}

/// A try-once attempt on a held lock never joins the queue; a newcomer's try-once cannot
/// jump a queued waiter, even right after the holder released.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn try_once_never_queues_and_never_jumps_the_queue() {
    let Some(endpoints) = common::shared_endpoints() else {
        return;
    };
    let (backend, mut raw, lock) = setup(&endpoints, "queue-try").await;
    let holder = locker(&backend, LONG, WaitMode::Forever);
    let guard = holder.acquire("q").await.expect("acquire");
    let trier = locker(&backend, LONG, WaitMode::TryOnce);
    assert!(trier.try_acquire("q").await.expect("call").is_none());
    wait_for_keys(&mut raw, &lock, 1).await;
    let waiter = locker(&backend, LONG, WaitMode::Forever);
    let waiting = tokio::spawn(async move { waiter.acquire("q").await });
    wait_for_keys(&mut raw, &lock, 2).await;
    sleep(Duration::from_millis(200)).await;
    assert!(!waiting.is_finished(), "the waiter got a held lock");
    guard.release().await.expect("release");
    for _ in 0..5 {
        assert!(
            trier.try_acquire("q").await.expect("call").is_none(),
            "a newcomer jumped the queued waiter"
        );
    }
    let next = waiting.await.expect("task").expect("the queued waiter");
    assert!(trier.try_acquire("q").await.expect("call").is_none());
    next.release().await.expect("release");
    wait_for_keys(&mut raw, &lock, 0).await;
}

/// A queue key outlives its TTL while its waiter waits (kept alive), keeps its create
/// revision (its place), and that revision becomes the grant's fence token.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn queue_keys_are_kept_alive_while_waiting() {
    let Some(endpoints) = common::shared_endpoints() else {
        return;
    };
    let (backend, mut raw, lock) = setup(&endpoints, "queue-alive").await;
    let ttl = Duration::from_secs(2);
    let holder = locker(&backend, ttl, WaitMode::Forever);
    let guard = holder.acquire("q").await.expect("acquire");
    let waiter = locker(&backend, ttl, WaitMode::Forever);
    let waiting = tokio::spawn(async move { waiter.acquire("q").await });
    wait_for_keys(&mut raw, &lock, 2).await;
    let queued = common::keys_under(&mut raw, &lock).await[1].clone();
    sleep(Duration::from_secs(6)).await;
    let keys = common::keys_under(&mut raw, &lock).await;
    assert_eq!(keys.len(), 2, "the queue key expired while waiting");
    assert_eq!(keys[1].create_revision, queued.create_revision);
    assert_eq!(keys[1].lease, queued.lease);
    assert!(!waiting.is_finished(), "the waiter got a held lock");
    guard.release().await.expect("release");
    let next = waiting.await.expect("task").expect("the queued waiter");
    let token = next.fence_token().expect("token").get();
    assert_eq!(i64::try_from(token).expect("fits"), queued.create_revision);
    sleep(Duration::from_secs(3)).await;
    assert!(next.is_held(), "the grant was lost: {}", next.state());
    let holder = backend.inspect(&LockName::new("q").expect("name")).await;
    let holder = holder.expect("inspect").expect("held");
    assert!(
        holder.acquired_at().is_some(),
        "the grant rewrote the value"
    );
    next.release().await.expect("release");
    wait_for_keys(&mut raw, &lock, 0).await;
}

/// A waiter whose queue key disappears (deleted by an operator, or its lease lost) joins
/// the queue again, instead of waiting out the whole wait unqueued and polling (issue
/// #14: "an etcd waiter that loses its queue place never queues again").
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_that_loses_its_queue_key_queues_again() {
    let Some(endpoints) = common::shared_endpoints() else {
        return;
    };
    let (backend, mut raw, lock) = setup(&endpoints, "queue-lost").await;
    let holder = locker(&backend, LONG, WaitMode::Forever);
    let guard = holder.acquire("q").await.expect("acquire");
    let waiter = locker(&backend, LONG, WaitMode::Timeout(Duration::from_secs(25)));
    let waiting = tokio::spawn(async move { waiter.acquire("q").await });
    wait_for_keys(&mut raw, &lock, 2).await;
    let keys = common::keys_under(&mut raw, &lock).await;
    let place = keys[1].key.clone();
    raw.delete(place.clone()).await.expect("delete");
    // Joined again: a second key, and not the deleted one.
    wait_for_keys(&mut raw, &lock, 2).await;
    let keys = common::keys_under(&mut raw, &lock).await;
    assert_ne!(keys[1].key, place, "a new place, not the old key");
    let released = Instant::now();
    guard.release().await.expect("release");
    let next = waiting.await.expect("task").expect("the waiter");
    assert!(
        released.elapsed() < Duration::from_secs(3),
        "the waiter was woken, waited {:?}",
        released.elapsed()
    );
    next.release().await.expect("release");
}
