//! Client clock faults through an adjustable [`Clock`]: what a jump does to a held lease.

use super::{Rig, ms};
use crate::testing::Op;
use crate::{Clock, Health, LockOptions, LostReason};

/// TTL 800 ms: refresh every 100 ms, drift 38 ms.
fn rig_with_clock() -> (Rig, crate::ClockControl) {
    let mut rig = Rig::new(LockOptions::new(ms(800)));
    let (clock, control) = Clock::adjustable();
    rig.locker = rig.locker.clone().with_clock(clock);
    (rig, control)
}

/// Kleppmann's clock scenario ("How to do distributed locking") on the client: a clock
/// stepped back makes the holder keep believing in a lease the server has already expired
/// and granted to someone else. This is the unsafe case; only a fence token protects the
/// resource from it.
#[test]
fn a_backward_jump_keeps_a_holder_believing_in_an_expired_lease() {
    crate::tests::bounded(a_backward_jump_keeps_a_holder_believing_in_an_expired_lease_body);
}

async fn a_backward_jump_keeps_a_holder_believing_in_an_expired_lease_body() {
    let (rig, control) = rig_with_clock();
    let guard = rig.locker.acquire("job").await.expect("free");
    control.jump_back(ms(5_000));
    tokio::time::sleep(ms(2_000)).await;
    assert_eq!(
        rig.faulty.calls(Op::Refresh),
        0,
        "refresh schedule moved 5 s later"
    );
    let rival = rig.rival().try_acquire("job").await.expect("ok");
    let rival = rival.expect("the server expired the lease after 800 ms");
    assert!(rival.fence_token() > guard.fence_token());
    assert!(
        guard.is_held(),
        "the stepped-back holder still believes it holds the lock"
    );
    assert_eq!(guard.state(), Health::Healthy);
}

/// A clock that jumps forwards past the validity makes the guard give the lease up at
/// once: early, which is safe.
#[test]
fn a_forward_jump_past_the_validity_turns_the_guard_lost() {
    crate::tests::bounded(a_forward_jump_past_the_validity_turns_the_guard_lost_body);
}

async fn a_forward_jump_past_the_validity_turns_the_guard_lost_body() {
    let (rig, control) = rig_with_clock();
    let guard = rig.locker.acquire("job").await.expect("free");
    control.jump_forward(ms(10_000));
    let reason = tokio::time::timeout(ms(50), guard.lost())
        .await
        .expect("lost at once");
    assert_eq!(reason, LostReason::ValidityExpired);
    assert!(!guard.is_held());
    assert_eq!(guard.remaining_validity(), ms(0));
}

/// A forward jump turns the guard Lost, but the library does not release the lock on the
/// holder's behalf: the holder may be finishing a write it started while `is_held()` was
/// true, so a rival must wait for the server's expiry or the holder's own release. The
/// reliability harness caught the earlier behaviour (release at once on Lost) handing the
/// lock over under an in-flight write.
#[test]
fn a_lost_guard_is_not_released_until_the_holder_lets_go() {
    crate::tests::bounded(a_lost_guard_is_not_released_until_the_holder_lets_go_body);
}

async fn a_lost_guard_is_not_released_until_the_holder_lets_go_body() {
    let (rig, control) = rig_with_clock();
    let guard = rig.locker.acquire("job").await.expect("free");
    control.jump_forward(ms(10_000));
    guard.lost().await;
    tokio::time::sleep(ms(100)).await;
    let rival = rig.rival();
    assert!(
        rival.try_acquire("job").await.expect("ok").is_none(),
        "still held on the server"
    );
    drop(guard);
    tokio::time::sleep(ms(1)).await;
    let taken = rival.try_acquire("job").await.expect("ok");
    assert!(taken.is_some(), "free once the holder dropped its guard");
}

/// Without jumps an adjustable clock behaves exactly like the runtime's.
#[test]
fn an_unmoved_adjustable_clock_refreshes_on_schedule() {
    crate::tests::bounded(an_unmoved_adjustable_clock_refreshes_on_schedule_body);
}

async fn an_unmoved_adjustable_clock_refreshes_on_schedule_body() {
    let (rig, _control) = rig_with_clock();
    let guard = rig.locker.acquire("job").await.expect("free");
    tokio::time::sleep(ms(1_050)).await;
    assert_eq!(rig.faulty.calls(Op::Refresh), 10);
    assert!(guard.is_held());
    assert!(guard.remaining_validity() > ms(600));
}

/// `Locker::clock` is the clock the locker's guards follow: the one it was given.
#[test]
fn the_locker_hands_out_the_clock_its_guards_follow() {
    crate::tests::bounded(the_locker_hands_out_the_clock_its_guards_follow_body);
}

async fn the_locker_hands_out_the_clock_its_guards_follow_body() {
    let (rig, control) = rig_with_clock();
    let before = rig.locker.clock().now();
    control.jump_forward(ms(5_000));
    assert_eq!(rig.locker.clock().now(), before + ms(5_000));
}
