//! Waiters are woken by the kernel when the holder releases (Linux, inotify), and only
//! then: the files contenders create and remove on refused attempts wake nobody.

#![cfg(target_os = "linux")]

mod common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use common::TempDb;
use lockcore::testing::{FaultyBackend, Op};
use lockcore::{Backoff, Jitter, LockOptions, Locker, WaitMode};

/// A waiter whose backoff would keep it asleep for a minute.
fn sleepy(wait: WaitMode) -> LockOptions {
    let minute = Duration::from_secs(60);
    LockOptions::new(Duration::from_secs(30))
        .with_backoff(Backoff::new(minute, minute).with_jitter(Jitter::None))
        .with_wait(wait)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_wakes_the_waiter_and_refused_contenders_do_not() {
    let db = TempDb::new();
    let holder = Locker::new(Arc::new(db.open().await));
    let guard = holder.acquire("job").await.expect("free");

    // The waiter, counted: an attempt, one more once subscribed (lockcore subscribes after
    // an attempt found the lock held), then asleep until something wakes it.
    let counted = FaultyBackend::new(Arc::new(db.open().await));
    let waiter = Locker::new(Arc::new(counted.clone()))
        .with_options(sleepy(WaitMode::Timeout(Duration::from_secs(120))));
    let task = tokio::spawn(async move { waiter.acquire("job").await });
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(counted.calls(Op::Acquire), 2, "the waiter's first attempts");

    // 30 refused attempts by another process-like contender: each creates and removes a
    // liveness file in the watched directory.
    let rival = Locker::new(Arc::new(db.open().await)).with_options(sleepy(WaitMode::TryOnce));
    for _ in 0..30 {
        assert!(rival.try_acquire("job").await.expect("attempt").is_none());
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(
        counted.calls(Op::Acquire),
        2,
        "a refused contender's file woke the waiter"
    );

    let released = Instant::now();
    guard.release().await.expect("release");
    let next = tokio::time::timeout(Duration::from_secs(10), task)
        .await
        .expect("the release did not wake the waiter (it would sleep a minute)")
        .expect("join")
        .expect("acquired");
    let took = released.elapsed();
    assert_eq!(
        counted.calls(Op::Acquire),
        3,
        "one attempt after the wake-up"
    );
    assert!(took < Duration::from_secs(5), "woken after {took:?}");
    next.release().await.expect("release");
}

/// A break wakes waiters at once too (it removes the broken holder's file), not when the
/// broken holder's next refresh fails.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_break_wakes_the_waiter() {
    let db = TempDb::new();
    // TTL 300 s: the holder refreshes every 37.5 s, so its failing refresh cannot be what
    // wakes the waiter within the 5 s below.
    let long = LockOptions::new(Duration::from_secs(300));
    let holder = Locker::new(Arc::new(db.open().await)).with_options(long);
    let guard = holder.acquire("job").await.expect("free");
    let waiter = Locker::new(Arc::new(db.open().await))
        .with_options(sleepy(WaitMode::Timeout(Duration::from_secs(120))));
    let task = tokio::spawn(async move { waiter.acquire("job").await });
    tokio::time::sleep(Duration::from_millis(300)).await;
    let broken = Instant::now();
    let operator = Locker::new(Arc::new(db.open().await));
    assert!(operator.break_lock("job").await.expect("break").is_some());
    let next = tokio::time::timeout(Duration::from_secs(5), task)
        .await
        .expect("the break did not wake the waiter")
        .expect("join")
        .expect("acquired");
    assert!(broken.elapsed() < Duration::from_secs(5));
    next.release().await.expect("release");
    drop(guard);
}
