//! `LockGuard::leave_for`: the lease outlives the guard for exactly the TTL asked, and is
//! never released on the way, not even when the refresh fails.

use tokio::time::{Instant, sleep, sleep_until};

use super::{Rig, ms};
use crate::testing::{Fault, Op};
use crate::{ErrorKind, Health, LockBackend, LockName, LockOptions};

/// TTL 800 ms: refresh every 100 ms, drift 38 ms.
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

/// A memory backend whose refreshes can come back twisted: a different fence token, or a
/// TTL cut to `cap`.
#[derive(Debug, Default)]
struct Twisted {
    memory: crate::MemoryBackend,
    new_token: std::sync::atomic::AtomicBool,
    cap: std::sync::Mutex<Option<std::time::Duration>>,
}

#[async_trait::async_trait]
impl LockBackend for Twisted {
    fn backend_name(&self) -> &str {
        "twisted"
    }
    fn guarantees(&self) -> crate::Guarantees {
        self.memory.guarantees()
    }
    async fn acquire(&self, request: &crate::AcquireRequest) -> crate::Result<crate::Acquire> {
        self.memory.acquire(request).await
    }
    async fn refresh(&self, lease: &crate::Lease) -> crate::Result<crate::Lease> {
        let mut lease = self.memory.refresh(lease).await?;
        if self.new_token.load(std::sync::atomic::Ordering::Relaxed) {
            let token = lease.token().map_or(1, crate::FenceToken::get) + 1;
            lease = lease.with_token(crate::FenceToken::new(token));
        }
        if let Some(cap) = *self.cap.lock().expect("not poisoned") {
            lease = lease.with_ttl(crate::Ttl::new(cap).expect("valid"));
        }
        Ok(lease)
    }
    async fn release(&self, lease: &crate::Lease) -> crate::Result<()> {
        self.memory.release(lease).await
    }
    async fn inspect(&self, name: &LockName) -> crate::Result<Option<crate::HolderInfo>> {
        self.memory.inspect(name).await
    }
}

fn twisted() -> (std::sync::Arc<Twisted>, crate::Locker) {
    let backend = std::sync::Arc::new(Twisted::default());
    let locker = crate::Locker::new(backend.clone()).with_options(LockOptions::new(ms(800)));
    (backend, locker)
}

/// A leaving refresh that comes back with another fence token is not our grant: `Lost`,
/// and the guard's health says so; nothing is detached.
#[test]
fn a_leaving_refresh_with_another_token_is_lost() {
    crate::tests::bounded(a_leaving_refresh_with_another_token_is_lost_body);
}

async fn a_leaving_refresh_with_another_token_is_lost_body() {
    let (backend, locker) = twisted();
    let guard = locker.acquire("job").await.expect("free");
    let health = guard.health();
    backend
        .new_token
        .store(true, std::sync::atomic::Ordering::Relaxed);
    let err = guard.leave_for(ms(5000)).await.expect_err("another token");
    assert_eq!(err.kind(), ErrorKind::Lost, "{err}");
    assert!(
        matches!(*health.borrow(), Health::Lost(_)),
        "{:?}",
        *health.borrow()
    );
}

/// A backend that sets a shorter TTL than the leave asked for is an error (the lease ends
/// sooner than the caller was promised); one that sets exactly the TTL asked is not.
#[test]
fn a_leave_cut_short_by_the_backend_is_an_error() {
    crate::tests::bounded(a_leave_cut_short_by_the_backend_is_an_error_body);
}

async fn a_leave_cut_short_by_the_backend_is_an_error_body() {
    let (backend, locker) = twisted();
    let guard = locker.acquire("short").await.expect("free");
    *backend.cap.lock().expect("not poisoned") = Some(ms(2000));
    let err = guard.leave_for(ms(5000)).await.expect_err("cut to 2 s");
    assert_eq!(err.kind(), ErrorKind::Unsupported, "{err}");
    let guard = locker.acquire("exact").await.expect("free");
    *backend.cap.lock().expect("not poisoned") = Some(ms(5000));
    let lease = guard.leave_for(ms(5000)).await.expect("exactly as asked");
    assert_eq!(lease.ttl().get(), ms(5000));
}

/// A leaving refresh the backend answers `Lost` turns the guard's health `Lost`.
#[test]
fn a_leaving_refresh_answered_lost_marks_the_guard_lost() {
    crate::tests::bounded(a_leaving_refresh_answered_lost_marks_the_guard_lost_body);
}

async fn a_leaving_refresh_answered_lost_marks_the_guard_lost_body() {
    let rig = rig();
    let guard = rig.locker.acquire("job").await.expect("free");
    let health = guard.health();
    rig.faulty.set(Op::Refresh, Fault::Fail(ErrorKind::Lost));
    let err = guard.leave_for(ms(5000)).await.expect_err("lost");
    assert_eq!(err.kind(), ErrorKind::Lost, "{err}");
    assert!(
        matches!(*health.borrow(), Health::Lost(_)),
        "{:?}",
        *health.borrow()
    );
}

/// A leaving refresh that answers within the refresh timeout, however slowly, succeeds.
#[test]
fn a_slow_leaving_refresh_within_the_timeout_succeeds() {
    crate::tests::bounded(a_slow_leaving_refresh_within_the_timeout_succeeds_body);
}

async fn a_slow_leaving_refresh_within_the_timeout_succeeds_body() {
    let rig = rig();
    let guard = rig.locker.acquire("job").await.expect("free");
    rig.faulty.set(Op::Refresh, Fault::Delay(ms(50)));
    let lease = guard.leave_for(ms(5000)).await.expect("answered in 50 ms");
    assert_eq!(lease.ttl().get(), ms(5000));
}

#[test]
fn a_lease_may_be_left_for_the_longest_ttl_and_not_a_moment_longer() {
    crate::tests::bounded(a_lease_may_be_left_for_the_longest_ttl_body);
}

async fn a_lease_may_be_left_for_the_longest_ttl_body() {
    let rig = rig();
    let guard = rig.locker.acquire("job").await.expect("free");
    let lease = guard
        .leave_for(crate::MAX_TTL)
        .await
        .expect("the limit is allowed");
    assert_eq!(lease.ttl().get(), crate::MAX_TTL);
    assert!(!free(&rig).await);
    let other = rig.rival().acquire("other").await.expect("free");
    let err = other
        .leave_for(crate::MAX_TTL + ms(1))
        .await
        .expect_err("above the limit");
    assert_eq!(err.kind(), ErrorKind::InvalidInput);
}
