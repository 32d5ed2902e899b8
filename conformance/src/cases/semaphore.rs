//! Semaphores: at most N live permits of a name (issue 18). Every case first checks the
//! descriptor: a backend whose [`Guarantees::semaphores`](lockcore::Guarantees) is
//! `Unsupported` must refuse a permit with `ErrorKind::Unsupported` (and the case ends
//! there); one that claims `Supported` must keep every promise below.

use std::collections::HashSet;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use lockcore::{
    Acquire, AcquireRequest, ErrorKind, Fencing, Identity, Lease, LockBackend, LockName,
    LockOptions, Locker, Permits, Semaphores, WaitMode,
};
use tokio::sync::Mutex;
use tokio::time::Instant;

use super::{fresh, millis, ttl};
use crate::harness::Harness;
use crate::report::Report;

/// One direct permit attempt of `owner` on a semaphore of `n`.
pub(super) async fn attempt(
    backend: &dyn LockBackend,
    name: &LockName,
    owner: &Identity,
    n: u32,
    lease_ttl: Duration,
) -> lockcore::Result<Acquire> {
    let permits = Permits::new(n).expect("a valid count");
    let request =
        AcquireRequest::new(name.clone(), owner.clone(), ttl(lease_ttl)).with_permits(permits);
    backend.acquire_permit(&request).await
}

/// A direct permit attempt that must be granted.
pub(super) async fn granted(
    backend: &dyn LockBackend,
    name: &LockName,
    owner: &Identity,
    n: u32,
    lease_ttl: Duration,
) -> Lease {
    match attempt(backend, name, owner, n, lease_ttl).await {
        Ok(Acquire::Acquired(lease)) => {
            assert_eq!(
                lease.permits().map(Permits::get),
                Some(n),
                "a permit's lease must say it is a permit of {n}"
            );
            lease
        }
        Ok(Acquire::Held(holder)) => {
            panic!(
                "{name}: no permit of {n} for {owner}; full, first to expire {}",
                holder.owner()
            )
        }
        Err(err) => panic!("{name}: permit of {n} failed: {err}"),
    }
}

/// `true` when the backend claims semaphores; otherwise checks that it refuses a permit
/// with `Unsupported` (a backend that grants one while claiming none fails here).
pub(super) async fn supported(h: &dyn Harness) -> bool {
    let backend = h.backend();
    match backend.guarantees().semaphores {
        Semaphores::Supported => true,
        Semaphores::Unsupported(_) => {
            let name = fresh("permit-unsupported");
            let owner = Identity::unique();
            let outcome = attempt(&*backend, &name, &owner, 2, Duration::from_secs(5));
            match outcome.await {
                Err(err) => assert_eq!(err.kind(), ErrorKind::Unsupported, "{err}"),
                Ok(_) => panic!("a backend claiming no semaphores answered a permit request"),
            }
            false
        }
    }
}

/// The report of a case a backend without semaphores passed by refusing them.
pub(super) fn unsupported() -> Report {
    Report::new().metric("semaphores_unsupported", 1.0)
}

/// N = 3: three owners get a permit, a fourth is refused with the holder that expires
/// first, `inspect_permits` lists the three, and after one release the fourth gets in.
///
/// Checks: the grant condition and `inspect_permits`. Guards against a count that is off
/// by one, and a `Held` reply without a holder to back off on.
pub async fn permits_admit_at_most_n(h: &dyn Harness) -> Report {
    if !supported(h).await {
        return unsupported();
    }
    let backend = h.backend();
    let name = fresh("permits");
    let long = Duration::from_secs(30);
    let owners: Vec<Identity> = (0..4).map(|_| Identity::unique()).collect();
    let mut leases = Vec::new();
    for owner in &owners[..3] {
        leases.push(granted(&*backend, &name, owner, 3, long).await);
    }
    match attempt(&*backend, &name, &owners[3], 3, long)
        .await
        .expect("call")
    {
        Acquire::Held(holder) => {
            assert!(owners[..3].contains(holder.owner()), "held by a stranger");
            assert!(holder.expires_in().is_none_or(|left| left <= long));
        }
        Acquire::Acquired(_) => panic!("a fourth permit of 3 was granted"),
    }
    let listed = backend
        .inspect_permits(&name)
        .await
        .expect("inspect_permits");
    let listed: HashSet<Identity> = listed.iter().map(|h| h.owner().clone()).collect();
    let expected: HashSet<Identity> = owners[..3].iter().cloned().collect();
    assert_eq!(listed, expected, "inspect_permits lists the holders");
    let tokens: Vec<_> = leases.iter().map(|l| backend.fence_token(l)).collect();
    if backend.guarantees().fencing == Fencing::Monotonic {
        let tokens: Vec<_> = tokens.iter().map(|t| t.expect("fencing claimed")).collect();
        assert!(
            tokens.windows(2).all(|w| w[0] < w[1]),
            "tokens rise: {tokens:?}"
        );
    }
    backend.release(&leases[0]).await.expect("release");
    let fourth = granted(&*backend, &name, &owners[3], 3, long).await;
    for lease in leases.iter().skip(1).chain([&fourth]) {
        backend.release(lease).await.expect("release");
    }
    assert!(
        backend
            .inspect_permits(&name)
            .await
            .expect("inspect")
            .is_empty()
    );
    Report::new()
}

const TASKS: usize = 8;
const ROUNDS: usize = 20;
const LIMIT: u32 = 3;

/// 8 tasks × 20 rounds on a semaphore of 3: an in-test register counts holders inside;
/// it must never pass 3, and must reach 3 (or the case would pass for a mutex too). In its
/// first round each holder stays until 3 were inside at once (at most 500 ms), so reaching
/// 3 does not rest on 2 ms holds overlapping by luck on a loaded machine.
///
/// Checks: the grant condition under real contention, through the `Locker`'s waiting
/// loop and guards. Guards against check-then-insert races (two contenders counting the
/// same free place) and releases that free another's permit.
pub async fn permits_never_exceed_n_under_contention(h: &dyn Harness) -> Report {
    if !supported(h).await {
        return unsupported();
    }
    let name = fresh("permit-contention");
    let inside = Arc::new(AtomicUsize::new(0));
    let most = Arc::new(AtomicUsize::new(0));
    let tokens = Arc::new(Mutex::new(Vec::new()));
    let options = LockOptions::new(Duration::from_secs(30)).with_wait(WaitMode::Forever);
    let start = Instant::now();
    let mut tasks = Vec::new();
    for _ in 0..TASKS {
        let locker = Locker::new(h.backend()).with_options(options.clone());
        let (name, inside, most, tokens) =
            (name.clone(), inside.clone(), most.clone(), tokens.clone());
        tasks.push(tokio::spawn(async move {
            for round in 0..ROUNDS {
                let guard = locker.acquire_permit(&name, LIMIT).await.expect("permit");
                let now = inside.fetch_add(1, Ordering::SeqCst) + 1;
                most.fetch_max(now, Ordering::SeqCst);
                tokens.lock().await.push(guard.fence_token());
                let until = Instant::now() + Duration::from_millis(500);
                while round == 0
                    && most.load(Ordering::SeqCst) < LIMIT as usize
                    && Instant::now() < until
                {
                    tokio::time::sleep(Duration::from_millis(1)).await;
                }
                tokio::time::sleep(Duration::from_millis(2)).await;
                inside.fetch_sub(1, Ordering::SeqCst);
                guard.release().await.expect("release");
            }
        }));
    }
    for task in tasks {
        task.await.expect("contender task");
    }
    let took = start.elapsed();
    let most = most.load(Ordering::SeqCst);
    assert!(
        most <= LIMIT as usize,
        "{most} holders of a semaphore of {LIMIT} at once"
    );
    assert_eq!(
        most, LIMIT as usize,
        "never {LIMIT} holders at once: is it a mutex?"
    );
    let tokens = tokens.lock().await;
    if h.backend().guarantees().fencing == Fencing::Monotonic {
        let distinct: HashSet<_> = tokens.iter().map(|t| t.expect("fencing claimed")).collect();
        assert_eq!(
            distinct.len(),
            tokens.len(),
            "a fence token was handed out twice"
        );
    }
    Report::new().metric("most_inside", most as f64).metric(
        "grants_per_second",
        (TASKS * ROUNDS) as f64 / took.as_secs_f64(),
    )
}

/// A semaphore of 2 filled by holders that crash (granted, never refreshed nor released)
/// has a free place again after their TTL, not before.
///
/// Checks: permits expire on the backend's clock like leases. Guards against permits
/// that outlive their holder (a count that is never decremented).
pub async fn expired_permits_free_their_places(h: &dyn Harness) -> Report {
    if !supported(h).await {
        return unsupported();
    }
    let timing = h.timing();
    let backend = h.backend();
    let name = fresh("permit-expiry");
    let sent = Instant::now();
    for _ in 0..2 {
        granted(&*backend, &name, &Identity::unique(), 2, timing.ttl).await;
    }
    let locker = Locker::new(h.backend()).with_options(
        LockOptions::new(Duration::from_secs(30))
            .with_wait(WaitMode::Timeout(timing.ttl + timing.slack)),
    );
    let guard = locker
        .acquire_permit(&name, 2)
        .await
        .expect("a place freed within TTL + slack");
    let took = sent.elapsed();
    assert!(
        took + timing.expiry_resolution >= timing.ttl,
        "a {:?} permit expired after only {took:?}",
        timing.ttl
    );
    guard.release().await.expect("release");
    Report::new().metric("expiry_overrun_ms", millis(took.saturating_sub(timing.ttl)))
}

/// Releasing a permit frees its place at once (not at its TTL), and only its own.
///
/// Checks: `release` of a permit lease. Guards against a leaked permit (a release that
/// answers `Ok` and deletes nothing, or deletes the wrong member).
pub async fn released_permit_frees_its_place(h: &dyn Harness) -> Report {
    if !supported(h).await {
        return unsupported();
    }
    let backend = h.backend();
    let name = fresh("permit-release");
    let long = Duration::from_secs(30);
    let (a, b, c) = (Identity::unique(), Identity::unique(), Identity::unique());
    let first = granted(&*backend, &name, &a, 2, long).await;
    let second = granted(&*backend, &name, &b, 2, long).await;
    backend.release(&first).await.expect("release");
    let third = match attempt(&*backend, &name, &c, 2, long).await.expect("call") {
        Acquire::Acquired(lease) => lease,
        Acquire::Held(_) => panic!("a released permit still holds its place"),
    };
    let listed = backend.inspect_permits(&name).await.expect("inspect");
    let listed: HashSet<Identity> = listed.iter().map(|h| h.owner().clone()).collect();
    assert_eq!(
        listed,
        HashSet::from([b, c]),
        "only the released permit is gone"
    );
    backend.release(&second).await.expect("release");
    backend.release(&third).await.expect("release");
    Report::new()
}

/// A permit that expired and whose place was taken: its release frees nothing and its
/// refresh is `Lost`, never a re-created permit.
///
/// Checks: release and refresh compare the exact grant. Guards against a permit lease
/// that removes or revives by owner or by position.
pub async fn stale_permit_cannot_release_or_refresh(h: &dyn Harness) -> Report {
    if !supported(h).await {
        return unsupported();
    }
    let timing = h.timing();
    let backend = h.backend();
    let name = fresh("permit-stale");
    let long = Duration::from_secs(30);
    let (a, b) = (Identity::unique(), Identity::unique());
    let stale = granted(&*backend, &name, &a, 1, timing.ttl).await;
    tokio::time::sleep(timing.ttl + timing.slack).await;
    let fresh_lease = granted(&*backend, &name, &b, 1, long).await;
    backend
        .release(&stale)
        .await
        .expect("a stale release is Ok");
    let listed = backend.inspect_permits(&name).await.expect("inspect");
    assert_eq!(
        listed.len(),
        1,
        "the stale release freed the new holder's permit"
    );
    assert_eq!(listed[0].owner(), &b);
    let err = backend
        .refresh(&stale)
        .await
        .expect_err("a stale refresh must fail");
    assert_eq!(err.kind(), ErrorKind::Lost, "{err}");
    let listed = backend.inspect_permits(&name).await.expect("inspect");
    assert_eq!(listed.len(), 1, "the stale refresh re-created its permit");
    backend.release(&fresh_lease).await.expect("release");
    Report::new()
}

/// One owner asking twice gets its own permit back with a new grant, never a second one:
/// a retry after a lost reply must not take two places.
///
/// Checks: one permit per owner identity. Guards against a permit per request, which
/// leaks a place each time a reply is lost.
pub async fn same_owner_retakes_its_permit(h: &dyn Harness) -> Report {
    if !supported(h).await {
        return unsupported();
    }
    let backend = h.backend();
    let name = fresh("permit-retake");
    let long = Duration::from_secs(30);
    let (a, b) = (Identity::unique(), Identity::unique());
    let first = granted(&*backend, &name, &a, 2, long).await;
    let again = granted(&*backend, &name, &a, 2, long).await;
    let listed = backend.inspect_permits(&name).await.expect("inspect");
    assert_eq!(listed.len(), 1, "one owner holds {} permits", listed.len());
    if backend.guarantees().fencing == Fencing::Monotonic {
        assert!(
            backend.fence_token(&again) > backend.fence_token(&first),
            "a retake gets a greater token"
        );
    }
    let other = granted(&*backend, &name, &b, 2, long).await;
    let err = backend
        .refresh(&first)
        .await
        .expect_err("the replaced grant");
    assert_eq!(err.kind(), ErrorKind::Lost, "{err}");
    backend.release(&first).await.expect("stale release is Ok");
    assert_eq!(
        backend.inspect_permits(&name).await.expect("inspect").len(),
        2
    );
    backend.release(&again).await.expect("release");
    backend.release(&other).await.expect("release");
    Report::new()
}

/// A live permit taken with a limit of 2 makes a request with a limit of 3 fail with
/// `InvalidInput`, writing nothing.
///
/// Checks: the limit-conflict rule. Guards against mixed limits admitting more holders
/// than the smaller limit allows.
pub async fn mixed_permit_limits_are_refused(h: &dyn Harness) -> Report {
    if !supported(h).await {
        return unsupported();
    }
    let backend = h.backend();
    let name = fresh("permit-limits");
    let long = Duration::from_secs(30);
    let held = granted(&*backend, &name, &Identity::unique(), 2, long).await;
    let err = attempt(&*backend, &name, &Identity::unique(), 3, long)
        .await
        .expect_err("a limit of 3 against a held limit of 2");
    assert_eq!(err.kind(), ErrorKind::InvalidInput, "{err}");
    assert!(
        err.to_string().contains('2') && err.to_string().contains('3'),
        "{err}"
    );
    assert_eq!(
        backend.inspect_permits(&name).await.expect("inspect").len(),
        1
    );
    backend.release(&held).await.expect("release");
    granted(&*backend, &name, &Identity::unique(), 3, long).await;
    Report::new()
}
