//! `LockGuard::leave_for`: the lease outlives the guard for exactly the TTL asked, and is
//! never released on the way, not even when the refresh fails.

use tokio::time::{Instant, sleep, sleep_until};

use super::{Rig, ms};
use crate::testing::{Fault, Op};
use crate::{ErrorKind, Health, LockBackend, LockName, LockOptions};

/// TTL 800 ms: refresh every 100 ms, drift 10 ms.
fn rig() -> Rig {
    Rig::new(LockOptions::new(ms(800)))
}

/// Whether a rival could take the lock right now.
async fn free(rig: &Rig) -> bool {
    let name = LockName::new("job").expect("valid");
    rig.memory
        .inspect(&name)
        .await
        .expect("memory answers")
        .is_none()
}

#[test]
fn a_left_lease_lasts_exactly_the_ttl_asked_with_no_refresh_and_no_release() {
    crate::tests::bounded(a_left_lease_lasts_exactly_the_ttl_asked_body);
}

async fn a_left_lease_lasts_exactly_the_ttl_asked_body() {
    let rig = rig();
    let guard = rig.locker.acquire("job").await.expect("free");
    let token = guard.fence_token();
    let health = guard.health();
    let cancel = guard.cancellation_token();
    sleep(ms(50)).await;
    let left_at = Instant::now();
    let lease = guard.leave_for(ms(300)).await.expect("left");
    assert_eq!(lease.ttl().get(), ms(300));
    assert_eq!(lease.token(), token, "the same grant, not a new one");
    assert_eq!(*health.borrow(), Health::Released);
    assert!(cancel.is_cancelled());
    let refreshes = rig.faulty.calls(Op::Refresh);
    assert_eq!(refreshes, 1, "exactly the leaving refresh");
    sleep_until(left_at + ms(299)).await;
    assert!(!free(&rig).await, "held until the TTL asked");
    assert!(rig.rival().try_acquire("job").await.expect("ok").is_none());
    sleep_until(left_at + ms(300)).await;
    assert!(
        free(&rig).await,
        "expired at the TTL asked, shorter than the lease's 800 ms"
    );
    assert!(rig.rival().try_acquire("job").await.expect("ok").is_some());
    sleep(ms(2000)).await;
    assert_eq!(rig.faulty.calls(Op::Release), 0, "never released");
    assert_eq!(
        rig.faulty.calls(Op::Refresh),
        refreshes,
        "no refresh after leaving"
    );
}

#[test]
fn a_lease_can_be_left_for_longer_than_its_ttl() {
    crate::tests::bounded(a_lease_can_be_left_for_longer_than_its_ttl_body);
}

async fn a_lease_can_be_left_for_longer_than_its_ttl_body() {
    let rig = rig();
    let guard = rig.locker.acquire("job").await.expect("free");
    let left_at = Instant::now();
    guard.leave_for(ms(5000)).await.expect("left");
    sleep_until(left_at + ms(4999)).await;
    assert!(
        !free(&rig).await,
        "held for the 5 s asked, not the 800 ms TTL"
    );
    sleep_until(left_at + ms(5000)).await;
    assert!(free(&rig).await);
    assert_eq!(rig.faulty.calls(Op::Release), 0);
}

#[test]
fn a_failed_leaving_refresh_is_reported_and_nothing_is_released() {
    crate::tests::bounded(a_failed_leaving_refresh_is_reported_body);
}

async fn a_failed_leaving_refresh_is_reported_body() {
    let rig = rig();
    let guard = rig.locker.acquire("job").await.expect("free");
    let granted = Instant::now();
    rig.faulty
        .set(Op::Refresh, Fault::Fail(ErrorKind::Unavailable));
    let err = guard
        .leave_for(ms(5000))
        .await
        .expect_err("the refresh failed");
    assert_eq!(err.kind(), ErrorKind::Unavailable, "{err}");
    assert_eq!(err.lock().map(LockName::as_str), Some("job"), "{err}");
    assert_eq!(rig.faulty.calls(Op::Release), 0, "not released");
    // It expires by the TTL it had: earlier than asked, which is why it is an error.
    sleep_until(granted + ms(799)).await;
    assert!(!free(&rig).await);
    sleep_until(granted + ms(800)).await;
    assert!(free(&rig).await);
    assert_eq!(
        rig.faulty.calls(Op::Refresh),
        1,
        "one try, no refresher left"
    );
}

#[test]
fn leaving_a_lost_lease_says_lost() {
    crate::tests::bounded(leaving_a_lost_lease_says_lost_body);
}

async fn leaving_a_lost_lease_says_lost_body() {
    let rig = rig();
    let guard = rig.locker.acquire("job").await.expect("free");
    let name = LockName::new("job").expect("valid");
    rig.memory.break_lock(&name).await.expect("broken");
    let rival = rig
        .rival()
        .acquire("job")
        .await
        .expect("free after the break");
    let err = guard.leave_for(ms(5000)).await.expect_err("not ours");
    assert_eq!(err.kind(), ErrorKind::Lost, "{err}");
    assert!(rival.is_held(), "the rival's lease is untouched");
    sleep(ms(300)).await;
    assert!(rival.is_held());
}

#[test]
fn leaving_after_the_validity_ran_out_says_lost_and_sends_nothing() {
    crate::tests::bounded(leaving_after_the_validity_ran_out_body);
}

async fn leaving_after_the_validity_ran_out_body() {
    let rig = rig();
    rig.faulty.set(Op::Refresh, Fault::Hang);
    let guard = rig.locker.acquire("job").await.expect("free");
    sleep(ms(900)).await;
    let refreshes = rig.faulty.calls(Op::Refresh);
    let err = guard.leave_for(ms(5000)).await.expect_err("expired");
    assert_eq!(err.kind(), ErrorKind::Lost, "{err}");
    assert_eq!(
        rig.faulty.calls(Op::Refresh),
        refreshes,
        "no leaving refresh"
    );
}

#[test]
fn a_detached_lease_keeps_its_ttl_with_no_refresh_and_no_release() {
    crate::tests::bounded(a_detached_lease_keeps_its_ttl_body);
}

async fn a_detached_lease_keeps_its_ttl_body() {
    let rig = rig();
    let guard = rig.locker.acquire("job").await.expect("free");
    let granted = Instant::now();
    let lease = guard.detach().await.expect("detached");
    assert_eq!(lease.ttl().get(), ms(800));
    sleep_until(granted + ms(799)).await;
    assert!(!free(&rig).await, "held for its TTL");
    sleep_until(granted + ms(800)).await;
    assert!(free(&rig).await);
    assert_eq!(rig.faulty.calls(Op::Refresh), 0);
    assert_eq!(rig.faulty.calls(Op::Release), 0);
}

#[test]
fn leaving_a_lease_lost_to_failed_refreshes_releases_nothing() {
    crate::tests::bounded(leaving_a_lease_lost_to_failed_refreshes_body);
}

/// Three failed refreshes mark the lease lost while the server may still hold it: a
/// release would free the lock before the time the caller asked to keep it.
async fn leaving_a_lease_lost_to_failed_refreshes_body() {
    let rig = rig();
    rig.faulty
        .set(Op::Refresh, Fault::Fail(ErrorKind::Unavailable));
    let guard = rig.locker.acquire("job").await.expect("free");
    let granted = Instant::now();
    while !matches!(guard.state(), Health::Lost(_)) {
        sleep(ms(10)).await;
    }
    let err = guard.leave_for(ms(5000)).await.expect_err("lost");
    assert_eq!(err.kind(), ErrorKind::Lost, "{err}");
    assert_eq!(rig.faulty.calls(Op::Release), 0, "leaving never releases");
    sleep_until(granted + ms(799)).await;
    assert!(!free(&rig).await, "still held by its TTL on the server");
}
