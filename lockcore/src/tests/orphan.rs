//! Issue #14, item 1: an attempt that outlives its attempt timeout must never destroy a
//! newer grant. One acquisition (or several sharing a fixed identity) never has two
//! attempts in flight; a late grant is used or released, never raced.
//!
//! The rule's registry is process-wide and keyed by lock name and owner, so every test
//! here uses a fresh identity (`Identity::unique()`): tests that share a name and an owner
//! would wait for each other, as two stores used by one owner in one process do.

use std::sync::Arc;

use super::{Rig, ms};
use crate::testing::{Fault, Op};
use crate::{Identity, LockBackend, LockGuard, LockOptions, Locker, WaitMode};

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

/// Retries `try_acquire("job")` every 200 ms, as a CLI or job runner would, for at most a
/// minute of (paused) time.
async fn retry_until_held(locker: &Locker) -> LockGuard {
    let start = tokio::time::Instant::now();
    loop {
        if let Ok(Some(guard)) = locker.try_acquire("job").await {
            return guard;
        }
        assert!(start.elapsed() < ms(60_000), "locked out of the lock");
        tokio::time::sleep(ms(200)).await;
    }
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
    let locker = rig.locker.clone().with_identity(Identity::unique());
    rig.faulty.script(Op::Acquire, [Fault::Delay(ms(3000))]);
    let first = locker.try_acquire("job").await;
    let err = first.expect_err("the first try gave up at its attempt timeout");
    assert_eq!(err.kind(), crate::ErrorKind::OutcomeUnknown, "{err}");
    // The caller retries at once with the same identity, as a CLI or job runner would.
    let guard = retry_until_held(&locker).await;
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
    let locker = rig.locker.clone().with_identity(Identity::unique());
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

#[test]
fn one_acquisition_never_has_two_attempts_in_flight() {
    crate::tests::bounded(one_acquisition_never_has_two_attempts_in_flight_body);
}

async fn one_acquisition_never_has_two_attempts_in_flight_body() {
    let options = LockOptions::new(ms(60_000))
        .with_attempt_timeout(ms(100))
        .with_wait(WaitMode::Timeout(ms(5000)));
    let rig = Rig::new(options);
    // Every attempt takes seven attempt timeouts to answer.
    rig.faulty.set(Op::Acquire, Fault::Delay(ms(700)));
    let guard = rig.locker.acquire("job").await.expect("acquired");
    assert_eq!(
        rig.faulty.max_in_flight(Op::Acquire),
        1,
        "attempts overlapped"
    );
    guard.release().await.expect("release");
}

#[test]
fn the_release_of_a_late_grant_finishes_before_its_owner_may_try_again() {
    crate::tests::bounded(the_release_of_a_late_grant_finishes_before_its_owner_may_try_again_body);
}

async fn the_release_of_a_late_grant_finishes_before_its_owner_may_try_again_body() {
    let broken = crate::testing::Broken::new(crate::Defect::ReleaseChecksOwnerOnly);
    let memory = broken.memory().clone();
    let faulty = crate::testing::FaultyBackend::new(Arc::new(broken));
    let locker = Locker::new(Arc::new(faulty.clone()))
        .with_options(slow_attempts())
        .with_identity(Identity::unique());
    let rig = Rig {
        memory,
        faulty,
        locker: locker.clone(),
    };
    // The late grant lands at 3 s; releasing it takes 0.8 s, within its bound (the attempt
    // timeout, 1 s), so the release really lands, at 3.8 s.
    rig.faulty.script(Op::Acquire, [Fault::Delay(ms(3000))]);
    rig.faulty.script(Op::Release, [Fault::Delay(ms(800))]);
    assert!(locker.try_acquire("job").await.is_err(), "gave up at 1 s");
    let guard = retry_until_held(&locker).await;
    tokio::time::sleep(ms(5000)).await;
    assert_exclusive(&rig, &guard).await;
}

#[test]
fn two_handles_on_one_store_share_the_rule_for_one_owner() {
    crate::tests::bounded(two_handles_on_one_store_share_the_rule_for_one_owner_body);
}

async fn two_handles_on_one_store_share_the_rule_for_one_owner_body() {
    // Two `Arc`s over one store (as two `anylock::connect` calls give), one identity.
    let rig = Rig::new(slow_attempts());
    let owner = Identity::unique();
    let first = Locker::new(Arc::new(rig.faulty.clone()))
        .with_options(slow_attempts())
        .with_identity(owner.clone());
    let second = Locker::new(Arc::new(rig.faulty.clone()))
        .with_options(slow_attempts())
        .with_identity(owner);
    rig.faulty.script(Op::Acquire, [Fault::Delay(ms(3000))]);
    assert!(first.try_acquire("job").await.is_err(), "gave up at 1 s");
    let guard = retry_until_held(&second).await;
    tokio::time::sleep(ms(5000)).await;
    assert_exclusive(&rig, &guard).await;
}

/// A rig whose backend releases by owner alone, for one fixed identity.
fn owner_only_rig() -> Rig {
    let broken = crate::testing::Broken::new(crate::Defect::ReleaseChecksOwnerOnly);
    let memory = broken.memory().clone();
    let faulty = crate::testing::FaultyBackend::new(Arc::new(broken));
    let locker = Locker::new(Arc::new(faulty.clone()))
        .with_options(slow_attempts())
        .with_identity(Identity::unique());
    Rig {
        memory,
        faulty,
        locker,
    }
}

#[test]
fn a_dropped_guards_slow_release_never_removes_its_owners_next_grant() {
    crate::tests::bounded(a_dropped_guards_slow_release_never_removes_its_owners_next_grant_body);
}

async fn a_dropped_guards_slow_release_never_removes_its_owners_next_grant_body() {
    let rig = owner_only_rig();
    let first = rig.locker.acquire("job").await.expect("free");
    rig.faulty.script(Op::Release, [Fault::Delay(ms(50))]);
    drop(first); // its release lands 50 ms later
    let guard = rig.locker.acquire("job").await.expect("acquired again");
    tokio::time::sleep(ms(200)).await;
    assert_exclusive(&rig, &guard).await;
}

#[test]
fn a_hung_release_of_a_late_grant_does_not_lock_its_owner_out_for_ever() {
    crate::tests::bounded(a_hung_release_of_a_late_grant_does_not_lock_its_owner_out_for_ever_body);
}

async fn a_hung_release_of_a_late_grant_does_not_lock_its_owner_out_for_ever_body() {
    let rig = Rig::new(slow_attempts());
    let locker = rig.locker.clone().with_identity(Identity::unique());
    rig.faulty.script(Op::Acquire, [Fault::Delay(ms(3000))]);
    rig.faulty.script(Op::Release, [Fault::Hang]);
    assert!(locker.try_acquire("job").await.is_err(), "gave up at 1 s");
    let guard = retry_until_held(&locker).await;
    assert_exclusive(&rig, &guard).await;
}

#[test]
fn an_attempt_that_waited_for_its_owners_slot_still_gets_its_full_timeout() {
    crate::tests::bounded(
        an_attempt_that_waited_for_its_owners_slot_still_gets_its_full_timeout_body,
    );
}

async fn an_attempt_that_waited_for_its_owners_slot_still_gets_its_full_timeout_body() {
    let rig = Rig::new(slow_attempts());
    let _holder = rig.rival().acquire("job").await.expect("free");
    let locker = rig.locker.clone().with_identity(Identity::unique());
    // The first try is answered `Held` at 980 ms; the second, which waited for the slot,
    // is answered 50 ms after it was sent, past 1 s from when it was called.
    rig.faulty
        .script(Op::Acquire, [Fault::Delay(ms(980)), Fault::Delay(ms(50))]);
    let other = locker.clone();
    let first = tokio::spawn(async move { other.try_acquire("job").await });
    tokio::task::yield_now().await;
    let second = locker.try_acquire("job").await;
    assert!(matches!(second, Ok(None)), "a real answer: {second:?}");
    assert!(matches!(first.await.expect("join"), Ok(None)));
}

/// A zero wait right after an abandoned try still gets its one real try: its first attempt
/// waits for the abandoned attempt's slot (up to the attempt timeout) rather than being
/// refused at once because the slot was busy.
#[test]
fn a_zero_wait_after_an_abandoned_try_waits_for_its_slot() {
    crate::tests::bounded(a_zero_wait_after_an_abandoned_try_waits_for_its_slot_body);
}

async fn a_zero_wait_after_an_abandoned_try_waits_for_its_slot_body() {
    let rig = Rig::new(slow_attempts());
    let locker = rig.locker.clone().with_identity(Identity::unique());
    // The first attempt answers after 1.5 s: the try gives up at its 1 s attempt timeout.
    rig.faulty.script(Op::Acquire, [Fault::Delay(ms(1500))]);
    let once = slow_attempts().with_wait(WaitMode::TryOnce);
    let tried = locker.acquire_with("job", &once).await;
    let err = tried.expect_err("gave up at the attempt timeout");
    assert_eq!(err.kind(), crate::ErrorKind::OutcomeUnknown);
    let start = tokio::time::Instant::now();
    let zero = slow_attempts().with_wait(WaitMode::Timeout(ms(0)));
    let guard = locker
        .acquire_with("job", &zero)
        .await
        .expect("its one try ran");
    assert!(start.elapsed() >= ms(500), "it waited for the late attempt");
    assert_exclusive(&rig, &guard).await;
    guard.release().await.expect("released");
}
