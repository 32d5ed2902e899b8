//! The session lease (issue #16): the locks one backend takes with one TTL share one etcd
//! lease, as Go's `concurrency.Session` does. Each test attacks one way sharing could
//! weaken a guarantee: a stale session, a session that died, a lock left to expire while
//! the session lives on, a crashed process, two owners in one process, and a released key
//! on a live session.

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

use backend_etcd::EtcdBackend;
use lockcore::{
    Acquire, AcquireRequest, ErrorKind, Identity, Lease, LockBackend, LockName, LockOptions,
    Locker, Ttl, WaitMode,
};
use tokio::time::Instant;

fn name(s: &str) -> LockName {
    LockName::new(s).expect("valid name")
}

fn request(lock: &LockName, owner: &Identity, ttl: Duration) -> AcquireRequest {
    AcquireRequest::new(
        lock.clone(),
        owner.clone(),
        Ttl::new(ttl).expect("valid TTL"),
    )
}

async fn grant(backend: &EtcdBackend, lock: &LockName, ttl: Duration) -> Lease {
    match backend
        .acquire(&request(lock, &Identity::unique(), ttl))
        .await
        .expect("acquire")
    {
        Acquire::Acquired(lease) => lease,
        Acquire::Held(holder) => panic!("{lock} unexpectedly held by {}", holder.owner()),
    }
}

/// The etcd lease the key of `lock` is bound to (its only key).
async fn lease_of(raw: &mut common::raw::Raw, backend: &EtcdBackend, lock: &LockName) -> i64 {
    let keys = common::keys_under(raw, &backend.lock_prefix(lock)).await;
    assert_eq!(keys.len(), 1, "{lock}: {keys:?}");
    keys[0].lease
}

fn try_once(backend: &EtcdBackend, ttl: Duration) -> Locker {
    let options = LockOptions::new(ttl).with_wait(WaitMode::TryOnce);
    Locker::new(Arc::new(backend.clone())).with_options(options)
}

/// Locks taken with one TTL share one lease; another TTL gets another; an uncontended
/// cycle after the first makes no lease at all, and release leaves the session alone.
#[tokio::test]
async fn locks_with_one_ttl_share_one_session_lease() {
    let Some(endpoints) = common::shared_endpoints() else {
        return;
    };
    let prefix = common::random_prefix("session-share");
    let backend = common::backend(&endpoints, &prefix).await;
    let mut raw = common::raw(&endpoints).await;
    let ttl = Duration::from_secs(10);
    let a = grant(&backend, &name("a"), ttl).await;
    let b = grant(&backend, &name("b"), ttl).await;
    let c = grant(&backend, &name("c"), Duration::from_secs(20)).await;
    let session = lease_of(&mut raw, &backend, &name("a")).await;
    assert_eq!(lease_of(&mut raw, &backend, &name("b")).await, session);
    assert_ne!(lease_of(&mut raw, &backend, &name("c")).await, session);
    backend.release(&a).await.expect("release");
    assert!(
        common::keys_under(&mut raw, &backend.lock_prefix(&name("a")))
            .await
            .is_empty(),
        "release left the key"
    );
    assert!(
        raw.lease_time_to_live(session).await.expect("ttl") > 0,
        "release revoked the shared session"
    );
    backend.refresh(&b).await.expect("b lives on");
    for lease in [b, c] {
        backend.release(&lease).await.expect("release");
    }
}

/// A session last kept alive long ago has little time left: an acquire on it must not
/// claim the full TTL (the key would go with the session first). The lease must last, on
/// the server, at least as long as the returned TTL from the moment the call was made.
#[tokio::test]
async fn an_acquire_on_an_old_session_never_claims_more_than_the_server_gives() {
    let Some(endpoints) = common::shared_endpoints() else {
        return;
    };
    let prefix = common::random_prefix("session-old");
    let backend = common::backend(&endpoints, &prefix).await;
    let mut raw = common::raw(&endpoints).await;
    let ttl = Duration::from_secs(4);
    let first = grant(&backend, &name("first"), ttl).await;
    backend.release(&first).await.expect("release");
    // Nobody keeps the session alive for 3 of its 4 s.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let sent = Instant::now();
    let lease = grant(&backend, &name("second"), ttl).await;
    let claimed = lease.ttl().get();
    assert!(claimed <= ttl, "{claimed:?}");
    // lockcore trusts the lease until `sent + claimed` (minus a drift allowance of 1%
    // + 2 ms); the key must still be there just before then.
    let drift = claimed / 100 + Duration::from_millis(2);
    tokio::time::sleep_until(sent + claimed - drift - Duration::from_millis(50)).await;
    let keys = common::keys_under(&mut raw, &backend.lock_prefix(&name("second"))).await;
    assert_eq!(
        keys.len(),
        1,
        "the key went with its session {:?} after the call began, but the lease claimed {claimed:?}",
        sent.elapsed()
    );
    backend.release(&lease).await.expect("release");
}

/// A session revoked by an operator (`etcdctl lease revoke`): every lock on it is Lost on
/// refresh, and the next acquire grants a new session instead of failing with "lease not
/// found" for ever, both after a refresh saw the loss and when no refresh did.
#[tokio::test]
async fn a_revoked_session_loses_its_locks_and_the_next_acquire_starts_a_new_one() {
    let Some(endpoints) = common::shared_endpoints() else {
        return;
    };
    let prefix = common::random_prefix("session-revoked");
    let backend = common::backend(&endpoints, &prefix).await;
    let mut raw = common::raw(&endpoints).await;
    let ttl = Duration::from_secs(30);

    // Revoked, then seen by a refresh.
    let a = grant(&backend, &name("a"), ttl).await;
    let b = grant(&backend, &name("b"), ttl).await;
    let session = lease_of(&mut raw, &backend, &name("a")).await;
    raw.lease_revoke(session).await.expect("revoke");
    for (lease, result) in [&a, &b]
        .iter()
        .zip(backend.refresh_many(&[a.clone(), b.clone()]).await)
    {
        let err = result.expect_err("a lock on a revoked session refreshed");
        assert_eq!(err.kind(), ErrorKind::Lost, "{}: {err}", lease.name());
    }
    let c = grant(&backend, &name("a"), ttl).await;
    let renewed = lease_of(&mut raw, &backend, &name("a")).await;
    assert_ne!(renewed, session, "the dead session was used again");
    backend.refresh(&c).await.expect("the new session is alive");

    // Revoked, and no refresh ran before the next acquire.
    raw.lease_revoke(renewed).await.expect("revoke");
    let d = grant(&backend, &name("d"), ttl).await;
    let third = lease_of(&mut raw, &backend, &name("d")).await;
    assert!(third != renewed && third != session);
    let err = backend.refresh(&c).await.expect_err("revoked");
    assert_eq!(err.kind(), ErrorKind::Lost, "{err}");
    backend
        .refresh(&d)
        .await
        .expect("the newest session is alive");
    for lease in [a, b, c, d] {
        backend.release(&lease).await.expect("release");
    }
}

/// `detach` and `leave_for` promise that the lock expires by its own TTL after the guard
/// stops refreshing, even while other guards keep the shared session alive: the key moves
/// to a lease of its own, with its create revision (so its fence token) unchanged.
#[tokio::test]
async fn a_left_lock_expires_by_its_own_ttl_while_the_session_lives_on() {
    let Some(endpoints) = common::shared_endpoints() else {
        return;
    };
    let prefix = common::random_prefix("session-leave");
    let backend = common::backend(&endpoints, &prefix).await;
    let mut raw = common::raw(&endpoints).await;
    let ttl = Duration::from_secs(2);
    let locker = try_once(&backend, ttl);
    let keeper = locker
        .try_acquire("keeper")
        .await
        .expect("call")
        .expect("free");
    let detached = locker
        .try_acquire("detached")
        .await
        .expect("call")
        .expect("free");
    let left = locker
        .try_acquire("left")
        .await
        .expect("call")
        .expect("free");
    let (detached_token, left_token) = (detached.fence_token(), left.fence_token());
    let session = lease_of(&mut raw, &backend, &name("keeper")).await;
    let started = Instant::now();
    detached.detach().await.expect("detach");
    left.leave_for(Duration::from_secs(5))
        .await
        .expect("leave_for");
    for lock in ["detached", "left"] {
        let moved = lease_of(&mut raw, &backend, &name(lock)).await;
        assert_ne!(moved, session, "{lock} still on the session");
    }
    let shown = backend.inspect(&name("left")).await.expect("inspect");
    assert_eq!(
        shown.and_then(|h| h.token()),
        left_token,
        "the token changed"
    );
    let shown = backend.inspect(&name("detached")).await.expect("inspect");
    assert_eq!(shown.and_then(|h| h.token()), detached_token);

    let rival = try_once(&backend, Duration::from_secs(30));
    // The detached lock (2 s) is free once its TTL and etcd's expiry loop (500 ms) pass,
    // while `keeper` keeps the session alive.
    let deadline = started + ttl + Duration::from_secs(3);
    let taken = loop {
        if let Some(guard) = rival.try_acquire("detached").await.expect("call") {
            break guard;
        }
        assert!(Instant::now() < deadline, "the detached lock never expired");
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert!(taken.fence_token() > detached_token);
    assert!(
        started.elapsed() + Duration::from_millis(100) >= ttl,
        "expired early"
    );
    // `left` asked for 5 s: still held now, free after.
    assert!(rival.try_acquire("left").await.expect("call").is_none());
    let deadline = started + Duration::from_secs(5) + Duration::from_secs(3);
    let after = loop {
        if let Some(guard) = rival.try_acquire("left").await.expect("call") {
            break guard;
        }
        assert!(Instant::now() < deadline, "the left lock never expired");
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert!(started.elapsed() + Duration::from_millis(100) >= Duration::from_secs(5));
    assert!(keeper.is_held(), "keeper is {}", keeper.state());
    for guard in [keeper, taken, after] {
        guard.release().await.expect("release");
    }
}

/// A process that dies without releasing (here: the backend and its lease dropped, nothing
/// refreshes) leaves its keys until its session lease expires, and no longer.
#[tokio::test]
async fn a_crashed_process_loses_its_locks_when_its_session_expires() {
    let Some(endpoints) = common::shared_endpoints() else {
        return;
    };
    let prefix = common::random_prefix("session-crash");
    let ttl = Duration::from_secs(2);
    let crashed = common::backend(&endpoints, &prefix).await;
    let started = Instant::now();
    for lock in ["x", "y"] {
        let _abandoned = grant(&crashed, &name(lock), ttl).await;
    }
    drop(crashed);
    let other = common::backend(&endpoints, &prefix).await;
    let rival = try_once(&other, Duration::from_secs(30));
    let deadline = started + ttl + Duration::from_secs(3);
    for lock in ["x", "y"] {
        let guard = loop {
            if let Some(guard) = rival.try_acquire(lock).await.expect("call") {
                break guard;
            }
            assert!(Instant::now() < deadline, "{lock} outlived its session");
            tokio::time::sleep(Duration::from_millis(100)).await;
        };
        guard.release().await.expect("release");
    }
    assert!(
        started.elapsed() + Duration::from_millis(100) >= ttl,
        "expired early"
    );
}

/// Two owners in one process (one backend, so one session) taking one name: one is
/// granted, the other is told it is held, every time, also when both try at once. A fixed
/// identity still retakes its own abandoned lock at once with a higher token.
#[tokio::test]
async fn two_owners_in_one_process_never_both_hold_one_name() {
    let Some(endpoints) = common::shared_endpoints() else {
        return;
    };
    let prefix = common::random_prefix("session-owners");
    let backend = common::backend(&endpoints, &prefix).await;
    let ttl = Duration::from_secs(30);
    for round in 0..10 {
        let lock = name(&format!("one-{round}"));
        let (first, second) = (Identity::unique(), Identity::unique());
        let (one, two) = (request(&lock, &first, ttl), request(&lock, &second, ttl));
        let (x, y) = tokio::join!(backend.acquire(&one), backend.acquire(&two));
        let granted: Vec<Lease> = [x, y]
            .into_iter()
            .filter_map(|r| match r.expect("acquire") {
                Acquire::Acquired(lease) => Some(lease),
                Acquire::Held(_) => None,
            })
            .collect();
        assert_eq!(granted.len(), 1, "round {round}: both or neither granted");
        let holder = &granted[0];
        // The loser asks again, alone: still held.
        let loser = if holder.owner() == &first {
            &second
        } else {
            &first
        };
        match backend
            .acquire(&request(&lock, loser, ttl))
            .await
            .expect("acquire")
        {
            Acquire::Held(info) => assert_eq!(info.owner(), holder.owner()),
            Acquire::Acquired(_) => panic!("round {round}: a second owner was granted"),
        }
        // The holder's identity retakes its own lock: a new grant, a higher token, and
        // the old grant is Lost.
        let retaken = match backend
            .acquire(&request(&lock, holder.owner(), ttl))
            .await
            .expect("retake")
        {
            Acquire::Acquired(lease) => lease,
            Acquire::Held(info) => panic!("round {round}: no retake, held by {}", info.owner()),
        };
        assert!(retaken.token() > holder.token());
        let err = backend.refresh(holder).await.expect_err("superseded");
        assert_eq!(err.kind(), ErrorKind::Lost, "{err}");
        backend
            .refresh(&retaken)
            .await
            .expect("the retake is alive");
        // A second retake (its key now has another name) works the same.
        let again = match backend
            .acquire(&request(&lock, holder.owner(), ttl))
            .await
            .expect("retake")
        {
            Acquire::Acquired(lease) => lease,
            Acquire::Held(info) => panic!("round {round}: no retake, held by {}", info.owner()),
        };
        assert!(again.token() > retaken.token());
        backend.release(holder).await.expect("late release");
        backend.release(&retaken).await.expect("late release");
        let shown = backend
            .inspect(&lock)
            .await
            .expect("inspect")
            .expect("held");
        assert_eq!(
            shown.token(),
            again.token(),
            "a late release removed the retake"
        );
        backend.release(&again).await.expect("release");
        assert!(backend.inspect(&lock).await.expect("inspect").is_none());
    }
}

/// A released lock is Lost on refresh even though its session lives on (other locks keep
/// it alive): refresh checks the key, not only the lease.
#[tokio::test]
async fn refreshing_a_released_lock_on_a_live_session_is_lost() {
    let Some(endpoints) = common::shared_endpoints() else {
        return;
    };
    let prefix = common::random_prefix("session-released");
    let backend = common::backend(&endpoints, &prefix).await;
    let ttl = Duration::from_secs(30);
    let kept = grant(&backend, &name("kept"), ttl).await;
    let released = grant(&backend, &name("released"), ttl).await;
    backend.release(&released).await.expect("release");
    let results = backend
        .refresh_many(&[kept.clone(), released.clone()])
        .await;
    results[0].as_ref().expect("the kept lock refreshes");
    let err = results[1].as_ref().expect_err("a released lock refreshed");
    assert_eq!(err.kind(), ErrorKind::Lost, "{err}");
    let err = backend.refresh(&released).await.expect_err("released");
    assert_eq!(err.kind(), ErrorKind::Lost, "{err}");
    assert!(
        backend
            .inspect(&name("released"))
            .await
            .expect("inspect")
            .is_none(),
        "a refresh re-created the key"
    );
    backend.release(&kept).await.expect("release");
}

/// Many owners in one process, one backend (so one session and one key name), hammering
/// one lock for 8 s: acquire, refresh, release, and stale releases/refreshes of their old
/// grants interleaved (from the hostile review). Exclusion: at most one owner believes it holds at any time; a holder's
/// refresh is never Lost (nobody may delete its key); tokens strictly increase.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn many_owners_on_one_session_never_share_a_lock() {
    let Some(endpoints) = common::shared_endpoints() else {
        return;
    };
    let prefix = common::random_prefix("review-stress");
    let backend = common::backend(&endpoints, &prefix).await;
    let lock = name("hot");
    let ttl = Duration::from_secs(30);
    let holder = Arc::new(AtomicUsize::new(0));
    let last_token = Arc::new(AtomicU64::new(0));
    let grants = Arc::new(AtomicUsize::new(0));
    let stop = Instant::now() + Duration::from_secs(8);
    let mut tasks = Vec::new();
    for me in 1..=6_usize {
        let (backend, lock, holder, last_token, grants) = (
            backend.clone(),
            lock.clone(),
            Arc::clone(&holder),
            Arc::clone(&last_token),
            Arc::clone(&grants),
        );
        tasks.push(tokio::spawn(async move {
            let owner = Identity::unique();
            let mut old: Vec<Lease> = Vec::new();
            while Instant::now() < stop {
                // Stale operations on old grants, at random.
                if let Some(stale) = old.last().cloned() {
                    if rand::random::<bool>() {
                        backend.release(&stale).await.expect("stale release");
                    } else {
                        match backend.refresh(&stale).await {
                            Err(e) if e.kind() == ErrorKind::Lost => {}
                            other => panic!("stale grant refreshed: {other:?}"),
                        }
                    }
                }
                let got = match backend.acquire(&request(&lock, &owner, ttl)).await {
                    Ok(Acquire::Acquired(lease)) => lease,
                    Ok(Acquire::Held(_)) => continue,
                    Err(e) => panic!("acquire: {e}"),
                };
                if let Err(other) =
                    holder.compare_exchange(0, me, Ordering::SeqCst, Ordering::SeqCst)
                {
                    panic!("owner {me} granted while owner {other} holds");
                }
                grants.fetch_add(1, Ordering::Relaxed);
                let token = got.token().expect("token").get();
                let before = last_token.swap(token, Ordering::SeqCst);
                assert!(token > before, "token went backwards: {before} -> {token}");
                tokio::time::sleep(Duration::from_millis(rand::random::<u64>() % 3)).await;
                backend.refresh(&got).await.expect("the holder's refresh");
                holder.store(0, Ordering::SeqCst);
                backend.release(&got).await.expect("release");
                old.push(got);
            }
        }));
    }
    for t in tasks {
        t.await.expect("task");
    }
    let n = grants.load(Ordering::Relaxed);
    assert!(n > 20, "too few grants to mean anything: {n}");
    assert!(backend.inspect(&lock).await.expect("inspect").is_none());
}

/// An acquire that finds an eighth of the session's TTL used sends a keep-alive first, so
/// it reports the full TTL: after 1 s of a 4 s session the next acquire does. (The review
/// found no test failing when that keep-alive was skipped; this one does.)
#[tokio::test]
async fn an_acquire_renews_a_session_an_eighth_used() {
    let Some(endpoints) = common::shared_endpoints() else {
        return;
    };
    let prefix = common::random_prefix("review-renew");
    let backend = common::backend(&endpoints, &prefix).await;
    let ttl = Duration::from_secs(4);
    let first = grant(&backend, &name("first"), ttl).await;
    backend.release(&first).await.expect("release");
    tokio::time::sleep(Duration::from_millis(1_000)).await;
    let second = grant(&backend, &name("second"), ttl).await;
    assert_eq!(
        second.ttl().get(),
        ttl,
        "the acquire did not renew a session with 3/4 of its TTL left"
    );
    backend.release(&second).await.expect("release");
}
