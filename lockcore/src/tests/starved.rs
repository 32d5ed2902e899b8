//! Issue #14 item 8 and issue #20 item 3: the guard's own reads must be honest about the
//! validity deadline even when the refresher task cannot run (a current-thread runtime
//! busy with blocking work). The clock check in the guard is then the only protection.

use super::{Rig, ms};
use crate::{Clock, Health, LockOptions, LostReason};

/// A guard on an adjustable clock: jumping it moves time for the guard without giving the
/// refresher task a chance to run (no `.await` in between).
async fn starved_guard(ttl_ms: u64) -> (crate::LockGuard, crate::ClockControl, Rig) {
    let (clock, control) = Clock::adjustable();
    let mut rig = Rig::new(LockOptions::new(ms(ttl_ms)));
    rig.locker = rig.locker.clone().with_clock(clock);
    let guard = rig.locker.acquire("job").await.expect("free");
    (guard, control, rig)
}

#[test]
fn state_reads_lost_once_the_validity_deadline_passes_even_if_the_refresher_is_starved() {
    crate::tests::bounded(
        state_reads_lost_once_the_validity_deadline_passes_even_if_the_refresher_is_starved_body,
    );
}

async fn state_reads_lost_once_the_validity_deadline_passes_even_if_the_refresher_is_starved_body()
{
    let (guard, control, _rig) = starved_guard(1000).await;
    assert_eq!(guard.state(), Health::Healthy);
    control.jump_forward(ms(2000));
    assert_eq!(guard.state(), Health::Lost(LostReason::ValidityExpired));
    assert!(!guard.is_held());
    assert_eq!(guard.remaining_validity(), ms(0));
}

#[test]
fn is_held_is_false_exactly_at_the_deadline_and_true_just_before() {
    crate::tests::bounded(is_held_is_false_exactly_at_the_deadline_and_true_just_before_body);
}

async fn is_held_is_false_exactly_at_the_deadline_and_true_just_before_body() {
    let (guard, control, _rig) = starved_guard(1000).await;
    let left = guard.remaining_validity();
    assert!(left > ms(1), "{left:?}");
    control.jump_forward(left - ms(1));
    assert!(guard.is_held(), "one millisecond before the deadline");
    assert_eq!(guard.state(), Health::Healthy);
    control.jump_forward(ms(1));
    assert_eq!(guard.remaining_validity(), ms(0));
    assert!(
        !guard.is_held(),
        "at the deadline the lease is no longer trusted"
    );
    assert_eq!(guard.state(), Health::Lost(LostReason::ValidityExpired));
}

#[test]
fn release_after_the_deadline_passed_unseen_reports_the_loss() {
    crate::tests::bounded(release_after_the_deadline_passed_unseen_reports_the_loss_body);
}

async fn release_after_the_deadline_passed_unseen_reports_the_loss_body() {
    let (guard, control, _rig) = starved_guard(1000).await;
    let token = guard.cancellation_token();
    control.jump_forward(ms(2000));
    assert_eq!(guard.state(), Health::Lost(LostReason::ValidityExpired));
    assert!(token.is_cancelled(), "sub-tasks were told at once");
    let err = guard.release().await.expect_err("not protected to the end");
    assert_eq!(err.kind(), crate::ErrorKind::Lost, "{err}");
}
