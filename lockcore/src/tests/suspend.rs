//! A machine suspend (laptop sleep, a VM or CI runner stopped): tokio's clock, which is
//! `CLOCK_MONOTONIC`, stands still while the lock server's clock runs on. The guard's
//! clock counts the suspend, so a lease that ran out meanwhile is lost at resume, and a
//! refresh that fell due is sent at once.

use super::{bounded, ms};
use crate::testing::Op;
use crate::{Clock, Health, LockOptions, LostReason, RESUME_CHECK};

/// A locker over `rig`'s backend on a clock whose suspends the test makes.
fn rig(ttl: u64) -> (super::Rig, crate::suspend::FakeSuspend) {
    let mut rig = super::Rig::new(LockOptions::new(ms(ttl)));
    let (clock, suspend) = Clock::with_fake_suspend();
    rig.locker = rig.locker.clone().with_clock(clock);
    (rig, suspend)
}

/// Resumed past its lease, a guard reads lost before the runtime's clock moves at all,
/// and its `lost()` fires within [`RESUME_CHECK`], not at its next refresh (3.75 s away
/// on tokio's clock). No refresh is sent for the lease the server already expired.
#[test]
fn a_suspend_past_the_lease_loses_it_at_resume() {
    bounded(|| async {
        let (rig, suspend) = rig(30_000);
        let watched = rig.locker.acquire("job").await.expect("free");
        let read = rig.locker.acquire("other").await.expect("free");
        let token = read.cancellation_token();
        // The keeper sleeps until the refreshes due at 3.75 s on tokio's clock.
        tokio::time::sleep(ms(1_000)).await;
        suspend.suspend(ms(60_000));
        assert!(!read.is_held(), "the lease ran out during the suspend");
        assert_eq!(read.state(), Health::Lost(LostReason::ValidityExpired));
        assert_eq!(read.remaining_validity(), ms(0));
        assert!(token.is_cancelled());
        // Nobody reads `watched`: its keeper must notice by itself.
        let reason = tokio::time::timeout(RESUME_CHECK + ms(1), watched.lost()).await;
        assert_eq!(reason, Ok(LostReason::ValidityExpired));
        assert_eq!(rig.faulty.calls(Op::Refresh), 0, "no refresh after resume");
        let err = watched
            .release()
            .await
            .expect_err("not protected to the end");
        assert_eq!(err.kind(), crate::ErrorKind::Lost, "{err}");
    });
}

/// Resumed with lease left but a refresh overdue, the guard refreshes within
/// [`RESUME_CHECK`] and stays held.
#[test]
fn a_short_suspend_refreshes_at_resume() {
    bounded(|| async {
        let (rig, suspend) = rig(30_000);
        let guard = rig.locker.acquire("job").await.expect("free");
        tokio::time::sleep(ms(1_000)).await;
        suspend.suspend(ms(10_000));
        assert!(guard.is_held(), "19 s of the lease are left");
        tokio::time::sleep(RESUME_CHECK + ms(1)).await;
        assert_eq!(
            rig.faulty.calls(Op::Refresh),
            1,
            "the overdue refresh went out"
        );
        assert_eq!(guard.state(), Health::Healthy);
        assert!(guard.remaining_validity() > ms(29_000));
        guard.release().await.expect("released");
    });
}

/// Permits and leaders follow the same clock: both read lost at resume.
#[test]
fn permits_and_leaders_are_lost_at_resume_too() {
    bounded(|| async {
        let (rig, suspend) = rig(30_000);
        let permit = rig.locker.acquire_permit("pool", 3).await.expect("room");
        let election = rig.locker.election("leader").expect("name");
        let leader = election.campaign(None).await.expect("elected");
        suspend.suspend(ms(31_000));
        assert!(!permit.is_held());
        assert!(!leader.is_leader());
        assert_eq!(leader.lost().await, LostReason::ValidityExpired);
    });
}

/// The default clock reads the machine's boot clock: this machine is awake, so it
/// follows tokio's exactly.
#[test]
fn the_system_clock_follows_the_runtime_while_awake() {
    bounded(|| async {
        let clock = Clock::system();
        let before = tokio::time::Instant::now();
        tokio::time::sleep(ms(5_000)).await;
        assert_eq!(clock.now(), before + ms(5_000));
        if cfg!(target_os = "linux") {
            assert!(clock.suspend_source().contains("CLOCK_BOOTTIME"));
        }
    });
}
