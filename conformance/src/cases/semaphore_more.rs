//! Semaphores, continued: waiting, refreshing, and permits beside locks.

use std::time::Duration;

use lockcore::{Backoff, ErrorKind, Identity, Jitter, LockOptions, Locker, WaitMode, Waiting};
use tokio::time::Instant;

use super::semaphore::{granted, supported, unsupported};
use super::{fresh, millis};
use crate::harness::Harness;
use crate::report::Report;

/// A waiter on a full semaphore gets the place a holder releases, long before the
/// holder's TTL would have freed it. Where the backend claims notified waiting, the waiter
/// backs off 60 s between attempts, so only the release's notification can hand it the
/// place within 10 s; otherwise it polls with the default backoff.
///
/// Checks: waiting on permits, and `waiting == Notified` for permits. Guards against
/// permit releases that notify nobody (waiters then sleep out their backoff) and waiters
/// that only wake at the holder's expiry.
pub async fn permit_waiter_gets_a_released_place(h: &dyn Harness) -> Report {
    if !supported(h).await {
        return unsupported();
    }
    let name = fresh("permit-wait");
    let long = Duration::from_secs(300);
    let holder = Locker::new(h.backend()).with_options(LockOptions::new(long));
    let guard = holder.acquire_permit(&name, 1).await.expect("free");
    let notified = h.backend().guarantees().waiting == Waiting::Notified;
    let mut options = LockOptions::new(long).with_wait(WaitMode::Timeout(Duration::from_secs(120)));
    if notified {
        let sleepy = Backoff::new(Duration::from_secs(60), Duration::from_secs(60))
            .with_jitter(Jitter::None);
        options = options.with_backoff(sleepy);
    }
    let waiter = Locker::new(h.backend()).with_options(options);
    let task = {
        let name = name.clone();
        tokio::spawn(async move {
            let guard = waiter.acquire_permit(&name, 1).await;
            (Instant::now(), guard)
        })
    };
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(
        !task.is_finished(),
        "the waiter got a permit of a full semaphore"
    );
    let released = Instant::now();
    guard.release().await.expect("release");
    let bound = Duration::from_secs(10);
    let (got, taken) = tokio::time::timeout(bound, task)
        .await
        .expect("the waiter slept on after the release (notified: backoff 60 s; else default)")
        .expect("waiter task");
    let taken = taken.expect("the waiter gets the released place");
    let handoff = got.saturating_duration_since(released);
    taken.release().await.expect("release");
    Report::new()
        .metric("handoff_ms", millis(handoff))
        .metric("notified", f64::from(u8::from(notified)))
}

/// A permit guard with a short TTL is kept for three TTLs by its refresher, and the
/// semaphore stays full meanwhile.
///
/// Checks: `refresh` of a permit lease. Guards against a refresh that extends the wrong
/// member or nothing.
pub async fn refresh_keeps_a_permit_beyond_its_ttl(h: &dyn Harness) -> Report {
    if !supported(h).await {
        return unsupported();
    }
    let ttl = h.timing().ttl;
    let name = fresh("permit-refresh");
    let holder = Locker::new(h.backend()).with_options(LockOptions::new(ttl));
    let guard = holder.acquire_permit(&name, 1).await.expect("free");
    let rival =
        Locker::new(h.backend()).with_options(LockOptions::new(ttl).with_wait(WaitMode::TryOnce));
    let until = Instant::now() + ttl * 3;
    while Instant::now() < until {
        tokio::time::sleep(ttl / 2).await;
        assert!(
            rival
                .try_acquire_permit(&name, 1)
                .await
                .expect("call")
                .is_none(),
            "the permit lapsed while its guard refreshed it"
        );
    }
    assert!(guard.is_held(), "guard is {}", guard.state());
    guard.release().await.expect("release");
    Report::new()
}

/// One owner identity holds a permit of `x` and the lock `x` at once, through the backend
/// and through one `Locker` with that fixed identity; releasing either leaves the other.
///
/// Checks: semaphore names are a namespace of their own, for the same owner too. Guards
/// against a permit stored as (or counted with) the lock, and a client-side rule that
/// holds up one behind the other.
pub async fn a_permit_and_the_lock_of_its_name_are_apart(h: &dyn Harness) -> Report {
    if !supported(h).await {
        return unsupported();
    }
    let backend = h.backend();
    let name = fresh("permit-apart");
    let long = Duration::from_secs(30);
    let owner = Identity::unique();
    let permit = granted(&*backend, &name, &owner, 1, long).await;
    let lock = super::grant(&*backend, &name, &owner, long).await;
    assert!(backend.inspect(&name).await.expect("inspect").is_some());
    backend.release(&lock).await.expect("release the lock");
    assert_eq!(
        backend.inspect_permits(&name).await.expect("inspect").len(),
        1
    );
    backend
        .refresh(&permit)
        .await
        .expect("the permit outlives the lock's release");
    let lock = super::grant(&*backend, &name, &owner, long).await;
    backend.release(&permit).await.expect("release the permit");
    backend
        .refresh(&lock)
        .await
        .expect("the lock outlives the permit's release");
    backend.release(&lock).await.expect("release");
    let locker = Locker::new(h.backend())
        .with_identity(Identity::named("apart").expect("id"))
        .with_options(LockOptions::new(long).with_wait(WaitMode::TryOnce));
    let name = fresh("permit-apart-locker");
    let permit = locker.acquire_permit(&name, 1).await.expect("a permit");
    let lock = locker
        .acquire(&name)
        .await
        .expect("the lock beside the permit");
    lock.release().await.expect("release");
    permit.release().await.expect("release");
    Report::new()
}

/// One `refresh_many` of a lock and a permit of one name, a released permit and a permit
/// twice: answered in order, each as its single refresh would be.
///
/// Checks: batches that mix locks and permits (the `Locker` batches whatever falls due
/// together). Guards against a batch that sends every lease down the lock's path (the
/// permit read as a lost lock) or answers by name.
pub async fn refresh_many_mixes_locks_and_permits(h: &dyn Harness) -> Report {
    if !supported(h).await {
        return unsupported();
    }
    let backend = h.backend();
    let name = fresh("permit-batch");
    let long = Duration::from_secs(30);
    let lock = super::grant(&*backend, &name, &Identity::unique(), long).await;
    let permit = granted(&*backend, &name, &Identity::unique(), 2, long).await;
    let gone = granted(&*backend, &name, &Identity::unique(), 2, long).await;
    backend.release(&gone).await.expect("release");
    let batch = [lock.clone(), permit.clone(), gone, permit.clone()];
    let results = backend.refresh_many(&batch).await;
    assert_eq!(results.len(), 4, "one result per lease");
    assert!(results[0].is_ok(), "the lock: {:?}", results[0]);
    assert!(results[1].is_ok(), "the permit: {:?}", results[1]);
    let err = results[2].as_ref().expect_err("the released permit");
    assert_eq!(err.kind(), ErrorKind::Lost, "{err}");
    assert!(results[3].is_ok(), "the permit again: {:?}", results[3]);
    let listed = backend.inspect_permits(&name).await.expect("inspect");
    assert_eq!(listed.len(), 1, "the released permit was re-created");
    backend.release(&permit).await.expect("release");
    backend.release(&lock).await.expect("release");
    Report::new()
}
