//! Cases that check optional promises of the [`Guarantees`](lockcore::Guarantees)
//! descriptor. A promise that is made must be kept; one that is not made is reported as
//! "not claimed".

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use lockcore::{
    Backoff, Durability, ErrorKind, Fairness, Fencing, Identity, Jitter, LockOptions, Locker,
    WaitMode, Waiting,
};
use tokio::sync::Mutex;
use tokio::time::{Instant, timeout};

use super::{fresh, grant, hold, locker, millis, spawn_acquire};
use crate::harness::Harness;
use crate::report::Report;

/// The same identity retakes its own abandoned lock at once, with a new grant that
/// supersedes the abandoned one.
///
/// Checks: `same_owner_retake`. Guards against a restarted worker waiting out a whole TTL
/// for its own lock (Lai's GCS locking post, Vault's instant recovery), against the
/// abandoned grant staying refreshable after the retake, and against its late release
/// removing the retake (a release that compares only the owner).
pub async fn same_identity_instant_retake(h: &dyn Harness) -> Report {
    let backend = h.backend();
    if !backend.guarantees().same_owner_retake {
        return Report::not_claimed("same-owner retake not claimed");
    }
    let name = fresh("retake");
    let me = Identity::unique();
    let long = Duration::from_secs(60);
    let abandoned = grant(&*backend, &name, &me, long).await;
    let options = LockOptions::new(long).with_wait(WaitMode::TryOnce);
    let retaker = Locker::new(backend.clone())
        .with_identity(me)
        .with_options(options);
    let start = Instant::now();
    let guard = retaker
        .try_acquire(&name)
        .await
        .expect("call")
        .expect("no instant retake");
    let took = start.elapsed();
    if backend.guarantees().fencing == Fencing::Monotonic {
        assert!(
            guard.fence_token() > abandoned.token(),
            "the retake did not get a new token"
        );
    }
    let err = backend
        .refresh(&abandoned)
        .await
        .expect_err("abandoned grant still refreshable");
    assert_eq!(err.kind(), ErrorKind::Lost, "{err}");
    // A late release of the superseded grant (its owner's crashed run, or an abandoned
    // attempt) must not remove the retake: release compares the grant, not just the owner.
    backend
        .release(&abandoned)
        .await
        .expect("releasing a superseded grant is not an error");
    let holder = backend.inspect(&name).await.expect("inspect");
    assert_eq!(
        holder.map(|h| h.owner().clone()),
        Some(guard.lease().owner().clone()),
        "releasing the superseded grant removed the retake"
    );
    guard.release().await.expect("release");
    Report::new().metric("retake_ms", millis(took))
}

/// A backend claiming notification wakes a waiter on release even when the waiter's
/// backoff would keep it asleep for 60 s.
///
/// Checks: `waiting == Notified` and `subscribe`. Guards against a notification claim
/// that silently degrades to polling (a lost subscription, a wrong channel name).
pub async fn notification_claim(h: &dyn Harness) -> Report {
    if h.backend().guarantees().waiting != Waiting::Notified {
        return Report::not_claimed("waiters poll; notification not claimed");
    }
    let ttl = Duration::from_secs(300);
    let (name, holder) = hold(h, "notify", ttl).await;
    let sleepy =
        Backoff::new(Duration::from_secs(60), Duration::from_secs(60)).with_jitter(Jitter::None);
    let options = LockOptions::new(ttl)
        .with_backoff(sleepy)
        .with_wait(WaitMode::Timeout(Duration::from_secs(120)));
    let task = spawn_acquire(Locker::new(h.backend()).with_options(options), &name);
    tokio::time::sleep(Duration::from_millis(500)).await;
    let released = Instant::now();
    holder.release().await.expect("release");
    let bound = Duration::from_secs(10);
    let (got, guard) = timeout(bound, task)
        .await
        .expect("notification claimed, but the waiter slept on after the release")
        .expect("join")
        .expect("acquire");
    guard.release().await.expect("release");
    Report::new().metric("notified_handoff_ms", millis(got - released))
}

/// Waiters that arrive in order are served in order.
///
/// Checks: `fairness == Fifo`. Guards against starvation of early waiters (the FIFO waiter
/// queue of FitrahHaque/Distributed-Lock).
pub async fn fifo_claim(h: &dyn Harness) -> Report {
    if h.backend().guarantees().fairness != Fairness::Fifo {
        return Report::not_claimed("FIFO fairness not claimed");
    }
    let ttl = Duration::from_secs(30);
    let (name, holder) = hold(h, "fifo", ttl).await;
    let order = Arc::new(Mutex::new(Vec::new()));
    // Holders inside the critical section: the holder counts until it releases.
    let inside = Arc::new(AtomicUsize::new(1));
    let mut tasks = Vec::new();
    for index in 0..3 {
        let waiter = locker(h.backend(), ttl, Duration::from_secs(60));
        let (name, order, inside) = (name.clone(), order.clone(), inside.clone());
        tasks.push(tokio::spawn(async move {
            let guard = waiter.acquire(&name).await.expect("acquire");
            let others = inside.fetch_add(1, Ordering::SeqCst);
            order.lock().await.push(index);
            tokio::time::sleep(Duration::from_millis(50)).await;
            inside.fetch_sub(1, Ordering::SeqCst);
            guard.release().await.expect("release");
            others
        }));
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    inside.fetch_sub(1, Ordering::SeqCst);
    holder.release().await.expect("release");
    for task in tasks {
        let others = task.await.expect("waiter");
        assert_eq!(
            others, 0,
            "a waiter got the lock while another holder was inside"
        );
    }
    assert_eq!(
        *order.lock().await,
        [0, 1, 2],
        "waiters were not served in arrival order"
    );
    Report::new()
}

/// A held lease and the fence counter survive a server restart.
///
/// Checks: `durability == SurvivesRestart`. Guards against a restart handing a held lock
/// to a second owner or resetting tokens (the Redlock page's restart-delay discussion).
pub async fn durability_claim(h: &dyn Harness) -> Report {
    let backend = h.backend();
    if backend.guarantees().durability != Durability::SurvivesRestart {
        return Report::not_claimed("a restart forgets locks; durability not claimed");
    }
    let name = fresh("durable");
    let owner = Identity::unique();
    let lease = grant(&*backend, &name, &owner, Duration::from_secs(60)).await;
    h.restart_server()
        .await
        .expect("durability claimed, but the harness cannot restart the server");
    let holder = backend.inspect(&name).await.expect("inspect after restart");
    let holder = holder.expect("the held lock vanished in the restart");
    assert_eq!(holder.owner(), &owner);
    backend
        .release(&lease)
        .await
        .expect("release after restart");
    let next = grant(
        &*backend,
        &name,
        &Identity::unique(),
        Duration::from_secs(60),
    )
    .await;
    if backend.guarantees().fencing == Fencing::Monotonic {
        assert!(
            next.token() > lease.token(),
            "the fence counter went back after the restart"
        );
    }
    backend.release(&next).await.expect("release");
    Report::new()
}
