//! Issue #14, item 1: an attempt that outlives its attempt timeout must never destroy a
//! newer grant. One acquisition (or several sharing a fixed identity) never has two
//! attempts in flight; a late grant is used or released, never raced.

use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use async_trait::async_trait;

use super::{Rig, ms};
use crate::testing::{Fault, Op};
use crate::{
    Acquire, AcquireRequest, Guarantees, HolderInfo, Identity, Lease, LockBackend, LockGuard,
    LockName, LockOptions, Locker, MemoryBackend, Result, WaitMode,
};

fn slow_attempts() -> LockOptions {
    // A long TTL keeps the refresher quiet for the whole test, so only the late attempt
    // can change who holds the lock.
    LockOptions::new(ms(60_000)).with_attempt_timeout(ms(1000))
}

/// The one invariant: while our guard believes it holds the lock, the backend says the
/// lock is ours under the guard's token, and a rival cannot take it.
async fn assert_exclusive(rig: &Rig, guard: &LockGuard) {
    assert!(
        guard.is_held(),
        "the guard still believes it holds the lock"
    );
    let stored = rig
        .memory
        .inspect(guard.name())
        .await
        .expect("inspect")
        .expect("a held lock is stored");
    assert_eq!(
        stored.token(),
        guard.fence_token(),
        "the stored grant is the guard's"
    );
    assert!(
        rig.rival()
            .try_acquire(guard.name().as_str())
            .await
            .expect("try")
            .is_none(),
        "a rival took a lock whose guard reports it held"
    );
}

#[test]
fn a_late_first_attempt_never_destroys_the_grant_of_the_next() {
    crate::tests::bounded(a_late_first_attempt_never_destroys_the_grant_of_the_next_body);
}

async fn a_late_first_attempt_never_destroys_the_grant_of_the_next_body() {
    let rig = Rig::new(slow_attempts());
    rig.faulty.script(Op::Acquire, [Fault::Delay(ms(3000))]);
    let guard = rig.locker.acquire("job").await.expect("acquired");
    // Let the slow first attempt land and anything it triggers run.
    tokio::time::sleep(ms(5000)).await;
    assert_exclusive(&rig, &guard).await;
}

#[test]
fn a_late_attempt_of_an_abandoned_try_never_destroys_a_newer_grant_of_its_owner() {
    crate::tests::bounded(
        a_late_attempt_of_an_abandoned_try_never_destroys_a_newer_grant_of_its_owner_body,
    );
}

async fn a_late_attempt_of_an_abandoned_try_never_destroys_a_newer_grant_of_its_owner_body() {
    let rig = Rig::new(slow_attempts());
    let locker = rig
        .locker
        .clone()
        .with_identity(Identity::for_task("publisher").expect("ok"));
    rig.faulty.script(Op::Acquire, [Fault::Delay(ms(3000))]);
    let first = locker.try_acquire("job").await;
    assert!(
        first.is_err(),
        "the first try gave up at its attempt timeout"
    );
    // The caller retries at once with the same identity, as a CLI or job runner would.
    let guard = loop {
        match locker.try_acquire("job").await {
            Ok(Some(guard)) => break guard,
            Ok(None) | Err(_) => tokio::time::sleep(ms(200)).await,
        }
    };
    tokio::time::sleep(ms(5000)).await;
    assert_exclusive(&rig, &guard).await;
}

#[test]
fn a_late_grant_is_used_instead_of_racing_a_second_attempt() {
    crate::tests::bounded(a_late_grant_is_used_instead_of_racing_a_second_attempt_body);
}

async fn a_late_grant_is_used_instead_of_racing_a_second_attempt_body() {
    let rig = Rig::new(slow_attempts());
    rig.faulty.script(Op::Acquire, [Fault::Delay(ms(2500))]);
    let guard = rig.locker.acquire("job").await.expect("acquired");
    assert_eq!(
        rig.faulty.calls(Op::Acquire),
        1,
        "no second attempt was sent"
    );
    assert_eq!(rig.faulty.calls(Op::Release), 0, "nothing was released");
    // Validity counts from when the slow request was sent, 2.5 s ago.
    let left = guard.remaining_validity();
    let drift = slow_attempts().drift();
    assert_eq!(left, ms(60_000 - 2500) - drift);
    assert_exclusive(&rig, &guard).await;
}

#[test]
fn a_try_that_meets_its_owners_earlier_attempt_in_flight_does_not_send_another() {
    crate::tests::bounded(
        a_try_that_meets_its_owners_earlier_attempt_in_flight_does_not_send_another_body,
    );
}

async fn a_try_that_meets_its_owners_earlier_attempt_in_flight_does_not_send_another_body() {
    let rig = Rig::new(slow_attempts());
    let locker = rig
        .locker
        .clone()
        .with_identity(Identity::for_task("publisher").expect("ok"));
    rig.faulty.script(Op::Acquire, [Fault::Delay(ms(3000))]);
    assert!(locker.try_acquire("job").await.is_err(), "gave up at 1 s");
    let err = locker
        .try_acquire("job")
        .await
        .expect_err("still in flight");
    assert!(err.is_temporary(), "{err}");
    assert!(err.to_string().contains("still in flight"), "{err}");
    assert_eq!(
        rig.faulty.calls(Op::Acquire),
        1,
        "no second attempt was sent"
    );
}

/// Counts acquire calls in flight per owner, and remembers the most seen at once.
#[derive(Debug)]
struct InFlightProbe {
    inner: MemoryBackend,
    delay: Duration,
    now: Mutex<(usize, usize)>,
}

impl InFlightProbe {
    fn max(&self) -> usize {
        self.now.lock().unwrap_or_else(PoisonError::into_inner).1
    }

    fn enter(&self, step: isize) {
        let mut now = self.now.lock().unwrap_or_else(PoisonError::into_inner);
        now.0 = now.0.saturating_add_signed(step);
        now.1 = now.1.max(now.0);
    }
}

#[async_trait]
impl LockBackend for InFlightProbe {
    fn backend_name(&self) -> &str {
        "probe"
    }
    fn guarantees(&self) -> Guarantees {
        self.inner.guarantees()
    }
    async fn acquire(&self, request: &AcquireRequest) -> Result<Acquire> {
        self.enter(1);
        tokio::time::sleep(self.delay).await;
        let outcome = self.inner.acquire(request).await;
        self.enter(-1);
        outcome
    }
    async fn refresh(&self, lease: &Lease) -> Result<Lease> {
        self.inner.refresh(lease).await
    }
    async fn release(&self, lease: &Lease) -> Result<()> {
        self.inner.release(lease).await
    }
    async fn inspect(&self, name: &LockName) -> Result<Option<HolderInfo>> {
        self.inner.inspect(name).await
    }
}

#[test]
fn one_acquisition_never_has_two_attempts_in_flight() {
    crate::tests::bounded(one_acquisition_never_has_two_attempts_in_flight_body);
}

async fn one_acquisition_never_has_two_attempts_in_flight_body() {
    let probe = Arc::new(InFlightProbe {
        inner: MemoryBackend::new(),
        delay: ms(700),
        now: Mutex::new((0, 0)),
    });
    let options = LockOptions::new(ms(60_000))
        .with_attempt_timeout(ms(100))
        .with_wait(WaitMode::Timeout(ms(5000)));
    let locker = Locker::new(probe.clone()).with_options(options);
    let guard = locker.acquire("job").await.expect("acquired");
    assert_eq!(probe.max(), 1, "attempts overlapped");
    guard.release().await.expect("release");
}

/// Releases whatever lease `owner` holds, whatever its token: backends whose stored value
/// is the owner alone compare-and-delete this way.
#[derive(Debug)]
struct OwnerOnlyRelease(MemoryBackend);

#[async_trait]
impl LockBackend for OwnerOnlyRelease {
    fn backend_name(&self) -> &str {
        "owner-only-release"
    }
    fn guarantees(&self) -> Guarantees {
        self.0.guarantees()
    }
    async fn acquire(&self, request: &AcquireRequest) -> Result<Acquire> {
        self.0.acquire(request).await
    }
    async fn refresh(&self, lease: &Lease) -> Result<Lease> {
        self.0.refresh(lease).await
    }
    async fn release(&self, lease: &Lease) -> Result<()> {
        match self.0.inspect(lease.name()).await? {
            Some(holder) if holder.owner() == lease.owner() => self.0.release(lease).await,
            _ => Ok(()),
        }
    }
    async fn inspect(&self, name: &LockName) -> Result<Option<HolderInfo>> {
        self.0.inspect(name).await
    }
}

#[test]
fn the_release_of_a_late_grant_finishes_before_its_owner_may_try_again() {
    crate::tests::bounded(the_release_of_a_late_grant_finishes_before_its_owner_may_try_again_body);
}

async fn the_release_of_a_late_grant_finishes_before_its_owner_may_try_again_body() {
    let memory = MemoryBackend::with_defect(crate::Defect::ReleaseIgnoresOwner);
    let faulty = crate::testing::FaultyBackend::new(Arc::new(OwnerOnlyRelease(memory.clone())));
    let locker = Locker::new(Arc::new(faulty.clone()))
        .with_options(slow_attempts())
        .with_identity(Identity::for_task("publisher").expect("ok"));
    let rig = Rig {
        memory,
        faulty,
        locker: locker.clone(),
    };
    // The late grant lands at 3 s; releasing it takes until 5 s.
    rig.faulty.script(Op::Acquire, [Fault::Delay(ms(3000))]);
    rig.faulty.script(Op::Release, [Fault::Delay(ms(2000))]);
    assert!(locker.try_acquire("job").await.is_err(), "gave up at 1 s");
    let guard = loop {
        match locker.try_acquire("job").await {
            Ok(Some(guard)) => break guard,
            Ok(None) | Err(_) => tokio::time::sleep(ms(200)).await,
        }
    };
    tokio::time::sleep(ms(5000)).await;
    assert_exclusive(&rig, &guard).await;
}
