//! The lease refresher: every health transition, driven through a real guard.

use std::sync::Arc;

use async_trait::async_trait;
use tokio::time::Instant;

use super::{Rig, ms, until};
use crate::testing::{Fault, Op};
use crate::{
    Acquire, AcquireRequest, ErrorKind, FenceToken, Guarantees, Health, HolderInfo, Identity,
    Lease, LockBackend, LockName, LockOptions, Locker, LostReason, MemoryBackend, Result,
    RetryStatus,
};

/// TTL 800 ms: refresh every 100 ms, drift 38 ms, Lost after 3 failures.
fn rig() -> Rig {
    Rig::new(LockOptions::new(ms(800)))
}

fn name() -> LockName {
    LockName::new("job").expect("valid")
}

#[test]
fn refreshing_keeps_the_lease_far_beyond_its_ttl() {
    crate::tests::bounded(refreshing_keeps_the_lease_far_beyond_its_ttl_body);
}

async fn refreshing_keeps_the_lease_far_beyond_its_ttl_body() {
    let rig = rig();
    let guard = rig.locker.acquire("job").await.expect("free");
    tokio::time::sleep(ms(8000)).await;
    assert_eq!(guard.state(), Health::Healthy);
    assert!(guard.remaining_validity() > ms(600));
    let holder = rig
        .memory
        .inspect(&name())
        .await
        .expect("ok")
        .expect("held");
    assert_eq!(holder.owner(), guard.lease().owner());
    assert!(
        rig.faulty.calls(Op::Refresh) >= 79,
        "{} refreshes",
        rig.faulty.calls(Op::Refresh)
    );
}

#[test]
fn transient_failures_degrade_then_lose_after_the_limit() {
    crate::tests::bounded(transient_failures_degrade_then_lose_after_the_limit_body);
}

async fn transient_failures_degrade_then_lose_after_the_limit_body() {
    let rig = rig();
    let guard = rig.locker.acquire("job").await.expect("free");
    let start = Instant::now();
    rig.faulty
        .set(Op::Refresh, Fault::Fail(ErrorKind::Unavailable));
    let (t1, _) = until(&guard, |h| *h == Health::Degraded { failures: 1 }).await;
    let (t2, _) = until(&guard, |h| *h == Health::Degraded { failures: 2 }).await;
    let (t3, lost) = until(&guard, |h| !h.is_held()).await;
    assert_eq!(
        [t1 - start, t2 - start, t3 - start],
        [ms(100), ms(200), ms(300)]
    );
    assert!(
        matches!(
            lost,
            Health::Lost(LostReason::TooManyFailures { failures: 3, .. })
        ),
        "{lost:?}"
    );
    assert!(guard.cancellation_token().is_cancelled());
    assert_eq!(guard.remaining_validity(), ms(0));
    assert!(!guard.is_held());
    let err = guard.release().await.expect_err("lost before release");
    assert_eq!(err.kind(), ErrorKind::Lost);
    assert_eq!(
        err.status(),
        RetryStatus::Persistent,
        "transient failures, retries exhausted"
    );
}

#[test]
fn a_success_brings_a_degraded_lease_back_to_healthy() {
    crate::tests::bounded(a_success_brings_a_degraded_lease_back_to_healthy_body);
}

async fn a_success_brings_a_degraded_lease_back_to_healthy_body() {
    let rig = rig();
    let guard = rig.locker.acquire("job").await.expect("free");
    rig.faulty
        .script(Op::Refresh, [Fault::Fail(ErrorKind::Unavailable); 2]);
    until(&guard, |h| *h == Health::Degraded { failures: 2 }).await;
    let (_, h) = until(&guard, |h| *h == Health::Healthy).await;
    assert_eq!(h, Health::Healthy);
    tokio::time::sleep(ms(2000)).await;
    assert_eq!(guard.state(), Health::Healthy);
}

#[test]
fn a_stolen_lock_is_lost_within_one_interval_and_not_released() {
    crate::tests::bounded(a_stolen_lock_is_lost_within_one_interval_and_not_released_body);
}

async fn a_stolen_lock_is_lost_within_one_interval_and_not_released_body() {
    let rig = rig();
    let guard = rig.locker.acquire("job").await.expect("free");
    let thief = Identity::unique();
    let start = Instant::now();
    rig.memory.admin_steal(&name(), thief.clone(), ms(60_000));
    let (at, lost) = until(&guard, |h| !h.is_held()).await;
    assert!(at - start <= ms(100), "noticed after {:?}", at - start);
    assert!(
        matches!(lost, Health::Lost(LostReason::NotOwner(_))),
        "{lost:?}"
    );
    assert_eq!(
        rig.faulty.calls(Op::Release),
        0,
        "never release after a steal"
    );
    let err = guard.release().await.expect_err("lost before release");
    assert_eq!(err.kind(), ErrorKind::Lost);
    let holder = rig
        .memory
        .inspect(&name())
        .await
        .expect("ok")
        .expect("thief holds");
    assert_eq!(holder.owner(), &thief);
}

#[test]
fn a_deleted_lock_is_lost() {
    crate::tests::bounded(a_deleted_lock_is_lost_body);
}

async fn a_deleted_lock_is_lost_body() {
    let rig = rig();
    let guard = rig.locker.acquire("job").await.expect("free");
    assert!(rig.memory.admin_delete(&name()));
    let (_, lost) = until(&guard, |h| !h.is_held()).await;
    assert!(
        matches!(lost, Health::Lost(LostReason::NotOwner(_))),
        "{lost:?}"
    );
    assert!(
        rig.memory.inspect(&name()).await.expect("ok").is_none(),
        "not re-created"
    );
}

#[test]
fn a_permanent_refresh_error_is_lost_at_once() {
    crate::tests::bounded(a_permanent_refresh_error_is_lost_at_once_body);
}

async fn a_permanent_refresh_error_is_lost_at_once_body() {
    let rig = rig();
    let guard = rig.locker.acquire("job").await.expect("free");
    rig.faulty
        .set(Op::Refresh, Fault::Fail(ErrorKind::PermissionDenied));
    let reason = guard.lost().await;
    assert!(matches!(reason, LostReason::RefreshFailed(_)), "{reason:?}");
    assert_eq!(rig.faulty.calls(Op::Refresh), 1);
}

#[test]
fn hanging_refreshes_count_as_failures() {
    crate::tests::bounded(hanging_refreshes_count_as_failures_body);
}

async fn hanging_refreshes_count_as_failures_body() {
    let rig = rig();
    let guard = rig.locker.acquire("job").await.expect("free");
    let start = Instant::now();
    rig.faulty.set(Op::Refresh, Fault::Hang);
    let (t1, _) = until(&guard, |h| *h == Health::Degraded { failures: 1 }).await;
    let (t3, lost) = until(&guard, |h| !h.is_held()).await;
    // Sent at 100 ms, no reply within the 100 ms refresh timeout.
    assert_eq!(t1 - start, ms(200));
    assert_eq!(t3 - start, ms(400));
    assert!(matches!(
        lost,
        Health::Lost(LostReason::TooManyFailures { .. })
    ));
}

#[test]
fn a_hung_refresh_cannot_keep_the_guard_healthy_past_validity() {
    crate::tests::bounded(a_hung_refresh_cannot_keep_the_guard_healthy_past_validity_body);
}

async fn a_hung_refresh_cannot_keep_the_guard_healthy_past_validity_body() {
    // The grant arrives late (700 ms after it was sent), so validity is almost gone.
    let rig = Rig::new(LockOptions::new(ms(800)).with_attempt_timeout(ms(5000)));
    rig.faulty.script(Op::Acquire, [Fault::Delay(ms(700))]);
    rig.faulty.set(Op::Refresh, Fault::Hang);
    let sent = Instant::now();
    let guard = rig.locker.acquire("job").await.expect("granted late");
    let left = guard.remaining_validity();
    // The drift allowance: 8 ms (1 %) + the 30 ms margin.
    assert_eq!(
        left,
        ms(800 - 38 - 700),
        "validity counts from the send, minus drift"
    );
    let (at, lost) = until(&guard, |h| !h.is_held()).await;
    assert_eq!(at - sent, ms(762));
    assert_eq!(lost, Health::Lost(LostReason::ValidityExpired));
    tokio::time::sleep(ms(1000)).await;
    assert_eq!(
        rig.faulty.calls(Op::Release),
        0,
        "never released on the holder's behalf while it may still be acting"
    );
    drop(guard);
    tokio::time::sleep(ms(1)).await;
    assert_eq!(
        rig.faulty.calls(Op::Release),
        1,
        "released once the guard is dropped"
    );
}

#[test]
fn release_removes_the_lock_and_ends_the_lease() {
    crate::tests::bounded(release_removes_the_lock_and_ends_the_lease_body);
}

async fn release_removes_the_lock_and_ends_the_lease_body() {
    let rig = rig();
    let guard = rig.locker.acquire("job").await.expect("free");
    let token = guard.cancellation_token();
    let health = guard.health();
    guard.release().await.expect("released");
    assert!(token.is_cancelled());
    assert_eq!(*health.borrow(), Health::Released);
    assert!(rig.memory.inspect(&name()).await.expect("ok").is_none());
}

#[test]
fn release_reports_backend_errors() {
    crate::tests::bounded(release_reports_backend_errors_body);
}

async fn release_reports_backend_errors_body() {
    let rig = rig();
    let guard = rig.locker.acquire("job").await.expect("free");
    rig.faulty
        .set(Op::Release, Fault::Fail(ErrorKind::Unavailable));
    let err = guard.release().await.expect_err("release failed");
    assert_eq!(err.kind(), ErrorKind::Unavailable);
    assert!(err.to_string().contains("lock \"job\""), "{err}");
}

#[test]
fn dropping_the_guard_releases_best_effort() {
    crate::tests::bounded(dropping_the_guard_releases_best_effort_body);
}

async fn dropping_the_guard_releases_best_effort_body() {
    let rig = rig();
    let guard = rig.locker.acquire("job").await.expect("free");
    drop(guard);
    tokio::time::sleep(ms(1)).await;
    assert_eq!(rig.faulty.calls(Op::Release), 1);
    assert!(rig.memory.inspect(&name()).await.expect("ok").is_none());
}

#[test]
fn dropping_the_guard_outside_a_runtime_does_not_panic() {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .expect("runtime");
    let memory = MemoryBackend::new();
    let locker = Locker::new(Arc::new(memory)).with_options(LockOptions::new(ms(60_000)));
    let guard = rt.block_on(locker.acquire("job")).expect("free");
    drop(rt);
    assert_eq!(guard.state(), Health::Lost(LostReason::RefresherStopped));
    assert_eq!(guard.remaining_validity(), ms(0));
    drop(guard);
}

/// A backend whose refresh returns a different fence token: a contract violation.
#[derive(Debug)]
struct TokenChanger(MemoryBackend);

#[async_trait]
impl LockBackend for TokenChanger {
    fn backend_name(&self) -> &str {
        "token-changer"
    }
    async fn acquire(&self, request: &AcquireRequest) -> Result<Acquire> {
        self.0.acquire(request).await
    }
    async fn refresh(&self, lease: &Lease) -> Result<Lease> {
        Ok(self
            .0
            .refresh(lease)
            .await?
            .with_token(FenceToken::new(999)))
    }
    async fn release(&self, lease: &Lease) -> Result<()> {
        self.0.release(lease).await
    }
    async fn inspect(&self, name: &LockName) -> Result<Option<HolderInfo>> {
        self.0.inspect(name).await
    }
    fn guarantees(&self) -> Guarantees {
        self.0.guarantees()
    }
}

#[test]
fn a_refresh_that_changes_the_fence_token_is_lost() {
    crate::tests::bounded(a_refresh_that_changes_the_fence_token_is_lost_body);
}

async fn a_refresh_that_changes_the_fence_token_is_lost_body() {
    let locker = Locker::new(Arc::new(TokenChanger(MemoryBackend::new())))
        .with_options(LockOptions::new(ms(800)));
    let guard = locker.acquire("job").await.expect("free");
    let reason = guard.lost().await;
    assert!(
        matches!(reason, LostReason::RefreshFailed(ref m) if m.contains("fence token")),
        "{reason:?}"
    );
}

#[test]
fn a_broken_lock_is_lost_and_reports_its_holder() {
    crate::tests::bounded(a_broken_lock_is_lost_and_reports_its_holder_body);
}

async fn a_broken_lock_is_lost_and_reports_its_holder_body() {
    let rig = rig();
    let guard = rig.locker.acquire("job").await.expect("free");
    let removed = rig
        .memory
        .break_lock(&name())
        .await
        .expect("break")
        .expect("was held");
    assert_eq!(removed.owner(), guard.lease().owner());
    assert!(matches!(guard.lost().await, LostReason::NotOwner(_)));
    assert!(
        rig.memory
            .break_lock(&name())
            .await
            .expect("break")
            .is_none(),
        "nothing left"
    );
    let again = rig.rival().acquire("job").await.expect("free after break");
    assert!(
        again.fence_token() > guard.fence_token(),
        "fencing stays monotonic"
    );
}
