//! Expiry, refresh, stale leases and fencing.

use std::time::Duration;

use lockcore::{
    Backoff, ErrorKind, Fencing, Identity, Lease, LockGuard, LockOptions, Locker, WaitMode,
};
use tokio::time::Instant;

use super::{fresh, grant, hold, holder_of, millis};
use crate::harness::Harness;
use crate::report::Report;

/// A locker that polls finely, so expiry is observed close to when it happens.
fn fine_locker(h: &dyn Harness, ttl: Duration, wait: Duration) -> Locker {
    let backoff = Backoff::new(Duration::from_millis(5), Duration::from_millis(50));
    let options = LockOptions::new(ttl)
        .with_wait(WaitMode::Timeout(wait))
        .with_backoff(backoff);
    Locker::new(h.backend()).with_options(options)
}

/// A crashed holder (no refresh, no release) stops blocking others once its TTL passes, and
/// not before.
///
/// Checks: `acquire` contract, "the new lease expires `ttl` later". Guards against the
/// "stuck locks" of Lai's GCS locking post (a crash holds the lock forever) and early
/// expiry (a TTL unit bug, such as seconds read as milliseconds).
pub async fn expiry_frees_a_crashed_holder(h: &dyn Harness) -> Report {
    let timing = h.timing();
    let name = fresh("expiry");
    let sent = Instant::now();
    grant(&*h.backend(), &name, &Identity::unique(), timing.ttl).await;
    let rival = fine_locker(h, Duration::from_secs(30), timing.ttl + timing.slack);
    let guard = rival
        .acquire(&name)
        .await
        .expect("freed within TTL + slack");
    let took = sent.elapsed();
    assert!(
        took + timing.expiry_resolution >= timing.ttl,
        "a {:?} lease expired after only {took:?}",
        timing.ttl
    );
    guard.release().await.expect("release");
    Report::new().metric("expiry_overrun_ms", millis(took.saturating_sub(timing.ttl)))
}

/// Refreshing keeps a lease alive for three TTLs, and nobody else can take it meanwhile.
///
/// Checks: `refresh` contract and the refresher cadence (TTL/8). Guards against refresh
/// that does not extend the server-side expiry (a PATCH that changes nothing, PEXPIRE on the
/// wrong key), which would hand the lock to a second holder mid-job.
pub async fn refresh_keeps_the_lease_beyond_its_ttl(h: &dyn Harness) -> Report {
    let ttl = h.timing().ttl;
    let (name, guard) = hold(h, "refresh", ttl).await;
    let rival = super::locker(h.backend(), ttl, Duration::ZERO);
    let until = Instant::now() + ttl * 3;
    while Instant::now() < until {
        tokio::time::sleep(ttl / 2).await;
        assert!(
            rival.try_acquire(&name).await.expect("call").is_none(),
            "lease lapsed"
        );
    }
    assert!(guard.is_held(), "guard is {}", guard.state());
    assert_eq!(
        holder_of(h, &name).await.as_ref(),
        Some(guard.lease().owner())
    );
    guard.release().await.expect("release");
    Report::new()
}

/// A lease granted straight from the backend with the short TTL, left to expire, and the
/// newer holder that took the name over after it expired.
async fn expired_and_taken_over(h: &dyn Harness, case: &str) -> (Lease, LockGuard) {
    let timing = h.timing();
    let name = fresh(case);
    let stale = grant(&*h.backend(), &name, &Identity::unique(), timing.ttl).await;
    let newer = fine_locker(h, Duration::from_secs(30), timing.ttl + timing.slack)
        .acquire(&name)
        .await
        .expect("taken over after expiry");
    (stale, newer)
}

/// A holder whose lease expired and was taken over, then calls `release`.
///
/// Checks: `release` contract, "never removes another owner's lock". Guards against the
/// "unintended releases" of Lai's GCS locking post: a slow process deleting the lock its
/// successor now holds.
pub async fn stale_lease_cannot_release(h: &dyn Harness) -> Report {
    let (stale, newer) = expired_and_taken_over(h, "stale-release").await;
    let released = h.backend().release(&stale).await;
    released.expect("releasing a gone lease is not an error");
    let holder = holder_of(h, newer.name()).await;
    let holder = holder.expect("the stale release deleted the newer holder's lock");
    assert_eq!(&holder, newer.lease().owner());
    assert!(newer.is_held(), "newer holder is {}", newer.state());
    newer.release().await.expect("release");
    Report::new()
}

/// A holder whose lease expired and was taken over, then calls `refresh`.
///
/// Checks: `refresh` contract, "fails with Lost when the owner changed; never re-creates".
/// Guards against a paused process (Kleppmann, "How to do distributed locking") refreshing
/// its way back into a lock someone else holds.
pub async fn stale_lease_cannot_refresh(h: &dyn Harness) -> Report {
    let (stale, newer) = expired_and_taken_over(h, "stale-refresh").await;
    let refreshed = h.backend().refresh(&stale).await;
    let err = refreshed.expect_err("a stale lease was refreshed");
    assert_eq!(err.kind(), ErrorKind::Lost, "{err}");
    let holder = holder_of(h, newer.name()).await;
    assert_eq!(
        holder.as_ref(),
        Some(newer.lease().owner()),
        "the stale refresh took the lock"
    );
    newer.release().await.expect("release");
    Report::new()
}

/// One `refresh_many` call over a live lease, a released one, a stale one whose name
/// another owner took over after it expired, and the live one again: each answered as its
/// own `refresh` would be, in order.
///
/// Checks: `refresh_many` contract, "result `i` is what `refresh` of `leases[i]` would
/// return; one lease's failure never fails another; never re-creates a deleted lock".
/// Guards against a batch that matches by name only (a pipelined `PEXPIRE`, an
/// `UPDATE … WHERE name = ANY(…)` without the owner) and so refreshes a paused process
/// back into a lock its successor holds, or answers the leases out of order.
pub async fn refresh_many_answers_each_lease(h: &dyn Harness) -> Report {
    let backend = h.backend();
    let ttl = h.timing().ttl;
    let (stale, newer) = expired_and_taken_over(h, "batch-stale").await;
    let first = grant(&*backend, &fresh("batch-first"), &Identity::unique(), ttl).await;
    let second = grant(&*backend, &fresh("batch-second"), &Identity::unique(), ttl).await;
    let gone = grant(&*backend, &fresh("batch-gone"), &Identity::unique(), ttl).await;
    backend.release(&gone).await.expect("release");
    tokio::time::sleep(ttl / 2).await;
    // Answers reversed or rotated would not read the same: first, gone, second, first,
    // stale, second.
    let leases = [
        first.clone(),
        gone.clone(),
        second.clone(),
        first.clone(),
        stale,
        second.clone(),
    ];
    let results = backend.refresh_many(&leases).await;
    assert_eq!(results.len(), leases.len(), "one result per lease");
    for (at, live) in [(0, &first), (2, &second), (3, &first), (5, &second)] {
        let refreshed = results[at].as_ref().expect("a live lease refreshes");
        assert_eq!(
            refreshed.name(),
            live.name(),
            "result {at} answers another lock"
        );
        assert_eq!(
            refreshed.token(),
            live.token(),
            "result {at} changed the token"
        );
    }
    for (at, what) in [(1, "released"), (4, "stale")] {
        match &results[at] {
            Err(err) => assert_eq!(err.kind(), ErrorKind::Lost, "{what} lease: {err}"),
            Ok(_) => panic!("a batch refreshed a {what} lease"),
        }
    }
    assert_eq!(
        holder_of(h, gone.name()).await,
        None,
        "a batch re-created a released lock"
    );
    let successor = backend.inspect(newer.name()).await.expect("inspect");
    let successor = successor.expect("the successor still holds its lock");
    assert_eq!(
        successor.owner(),
        newer.lease().owner(),
        "a batched stale refresh took the lock"
    );
    // The successor's own lease is 30 s long: a batch that extended it by name, with the
    // stale lease's short TTL, cut it short.
    if let Some(left) = successor.expires_in() {
        assert!(
            left > ttl * 2,
            "a batched stale refresh changed the successor's expiry to {left:?}"
        );
    }
    // Past the live leases' first expiry: the batch extended both.
    tokio::time::sleep(ttl * 3 / 4).await;
    for live in [&first, &second] {
        assert_eq!(
            holder_of(h, live.name()).await.as_ref(),
            Some(live.owner()),
            "the batch did not extend a live lease"
        );
        backend.release(live).await.expect("release");
    }
    newer.release().await.expect("release");
    Report::new().metric("refresh_batch_limit", backend.refresh_batch_limit() as f64)
}

/// Fence tokens strictly increase over 100+ grants of one name: after release, after
/// same-owner retake where claimed, and after expiry. Backends without fencing must
/// return `None`, never a fake token.
///
/// Checks: `fence_token` contract. Guards against counters that reset when the lock key
/// is deleted or expires (Kleppmann: the storage would then accept a stale writer).
pub async fn fence_tokens_strictly_increase(h: &dyn Harness) -> Report {
    let backend = h.backend();
    let guarantees = backend.guarantees();
    let name = fresh("fence");
    let long = Duration::from_secs(30);
    if guarantees.fencing == Fencing::None {
        let lease = grant(&*backend, &name, &Identity::unique(), long).await;
        assert_eq!(
            backend.fence_token(&lease),
            None,
            "unclaimed fencing returned a token"
        );
        backend.release(&lease).await.expect("release");
        return Report::not_claimed("no fencing claimed; verified that no token is issued");
    }
    let mut tokens = Vec::new();
    for round in 0..100 {
        let owner = Identity::unique();
        let mut lease = grant(&*backend, &name, &owner, long).await;
        tokens.push(backend.fence_token(&lease));
        if guarantees.same_owner_retake && round % 10 == 5 {
            lease = grant(&*backend, &name, &owner, long).await;
            tokens.push(backend.fence_token(&lease));
        }
        backend.release(&lease).await.expect("release");
    }
    let timing = h.timing();
    for _ in 0..2 {
        let crashed = grant(&*backend, &name, &Identity::unique(), timing.ttl).await;
        tokens.push(backend.fence_token(&crashed));
        let after = fine_locker(h, long, timing.ttl + timing.slack);
        let guard = after.acquire(&name).await.expect("free after expiry");
        tokens.push(guard.fence_token());
        guard.release().await.expect("release");
    }
    let tokens: Vec<_> = tokens
        .into_iter()
        .map(|t| t.expect("fencing claimed"))
        .collect();
    if let Some(at) = tokens.windows(2).position(|w| w[1] <= w[0]) {
        panic!(
            "fence token did not increase at grant {}: {:?}",
            at + 1,
            &tokens[at..at + 2]
        );
    }
    Report::new().metric("grants", tokens.len() as f64)
}
