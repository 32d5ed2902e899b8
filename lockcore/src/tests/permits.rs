//! The `Locker`'s permit path over the memory backend: the same loop, guard and refresher
//! as a lock, with the semaphore's grant condition and messages.

use std::sync::Arc;

use super::{Rig, bounded, ms, until};
use crate::testing::{Fault, Op};
use crate::{
    ErrorKind, Health, LockBackend, LockName, LockOptions, Locker, MemoryBackend, WaitMode,
};

#[test]
fn a_full_semaphore_names_its_first_holder_to_end() {
    bounded(|| async {
        let rig = Rig::new(LockOptions::new(ms(1000)));
        let a = rig.locker.acquire_permit("s", 2).await.expect("free");
        let _b = rig.rival().acquire_permit("s", 2).await.expect("room");
        let once = LockOptions::new(ms(1000)).with_wait(WaitMode::TryOnce);
        let err = (rig.rival().acquire_permit_with("s", 2, &once).await).expect_err("full");
        assert_eq!(err.kind(), ErrorKind::Held);
        assert!(err.to_string().contains("all 2 permits are held"), "{err}");
        assert_eq!(err.holder().map(|h| h.owner()), Some(a.lease().owner()));
        assert!(
            rig.rival()
                .try_acquire_permit("s", 2)
                .await
                .expect("call")
                .is_none()
        );
        // A lock of the same name is another thing.
        let lock = rig.rival().try_acquire("s").await.expect("call");
        assert!(lock.is_some(), "the lock s is not the semaphore s");
    });
}

#[test]
fn a_permit_guard_is_refreshed_and_lost_like_a_lock() {
    bounded(|| async {
        let rig = Rig::new(LockOptions::new(ms(800)));
        let guard = rig.locker.acquire_permit("s", 1).await.expect("free");
        assert_eq!(guard.lease().permits().map(|p| p.get()), Some(1));
        tokio::time::sleep(ms(3000)).await;
        assert!(guard.is_held(), "refreshed past its TTL: {}", guard.state());
        assert!(
            rig.rival()
                .try_acquire_permit("s", 1)
                .await
                .expect("call")
                .is_none()
        );
        rig.faulty.set(Op::Refresh, Fault::Fail(ErrorKind::Lost));
        let (_, health) = until(&guard, |h| matches!(h, Health::Lost(_))).await;
        assert!(matches!(health, Health::Lost(_)));
    });
}

#[test]
fn a_waiter_gets_a_released_permit() {
    bounded(|| async {
        let rig = Rig::new(LockOptions::new(ms(30_000)));
        let held = rig.locker.acquire_permit("s", 1).await.expect("free");
        let waiter = rig.rival();
        let task = tokio::spawn(async move { waiter.acquire_permit("s", 1).await });
        tokio::time::sleep(ms(100)).await;
        assert!(!task.is_finished());
        held.release().await.expect("release");
        let got = task.await.expect("task").expect("the released permit");
        assert!(got.is_held());
    });
}

#[test]
fn bad_counts_and_backends_without_semaphores_are_typed_errors() {
    bounded(|| async {
        let locker = Locker::new(Arc::new(MemoryBackend::new()));
        for bad in [0, crate::MAX_PERMITS + 1] {
            let err = locker
                .acquire_permit("s", bad)
                .await
                .expect_err("bad count");
            assert_eq!(err.kind(), ErrorKind::InvalidInput, "{err}");
            assert!(err.to_string().contains("1 to 10000"), "{err}");
        }
        let none = Locker::new(Arc::new(NoSemaphores(MemoryBackend::new())));
        let err = none.acquire_permit("s", 2).await.expect_err("unsupported");
        assert_eq!(err.kind(), ErrorKind::Unsupported, "{err}");
        assert!(err.to_string().contains("no semaphores"), "{err}");
        let err = none.inspect_permits("s").await.expect_err("unsupported");
        assert_eq!(err.kind(), ErrorKind::Unsupported, "{err}");
    });
}

/// A backend that implements only the lock: the trait's defaults refuse permits.
#[derive(Debug)]
struct NoSemaphores(MemoryBackend);

#[async_trait::async_trait]
impl LockBackend for NoSemaphores {
    fn backend_name(&self) -> &str {
        "nosem"
    }
    async fn acquire(&self, request: &crate::AcquireRequest) -> crate::Result<crate::Acquire> {
        self.0.acquire(request).await
    }
    async fn refresh(&self, lease: &crate::Lease) -> crate::Result<crate::Lease> {
        self.0.refresh(lease).await
    }
    async fn release(&self, lease: &crate::Lease) -> crate::Result<()> {
        self.0.release(lease).await
    }
    async fn inspect(&self, name: &LockName) -> crate::Result<Option<crate::HolderInfo>> {
        self.0.inspect(name).await
    }
    fn guarantees(&self) -> crate::Guarantees {
        self.0.guarantees()
    }
}

#[test]
fn one_identity_holds_a_permit_and_the_lock_of_its_name_at_once() {
    bounded(|| async {
        let locker = Locker::new(Arc::new(MemoryBackend::new()))
            .with_identity(crate::Identity::named("job-7").expect("id"))
            .with_options(LockOptions::new(ms(30_000)).with_wait(WaitMode::TryOnce));
        let permit = locker.acquire_permit("s", 2).await.expect("a permit");
        let lock = locker
            .acquire("s")
            .await
            .expect("the lock s is apart from the semaphore s");
        lock.release().await.expect("release");
        let election = locker.election("s").expect("name");
        let leader = election.try_campaign(None).await.expect("call");
        assert!(
            leader.is_some(),
            "a permit does not hold up the election of its name"
        );
        permit.release().await.expect("release");
    });
}
