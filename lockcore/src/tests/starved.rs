//! The guard's own reads must be honest about the validity deadline even when the keeper
//! cannot run (a current-thread runtime busy with blocking work): the clock check in the
//! guard is then the only protection. And once a guard has read as lost, it stays lost,
//! whatever the keeper hears afterwards.

use std::sync::Arc;

use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};

use async_trait::async_trait;

use super::{Rig, ms};
use crate::{
    Acquire, AcquireRequest, Clock, ClockControl, Guarantees, Health, HolderInfo, Lease,
    LockBackend, LockGuard, LockName, LockOptions, Locker, LostReason, MemoryBackend, Result,
};

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

/// A release exactly at the validity deadline is too late: the section was not protected
/// to its end.
#[test]
fn release_exactly_at_the_deadline_reports_the_loss() {
    crate::tests::bounded(release_exactly_at_the_deadline_reports_the_loss_body);
}

async fn release_exactly_at_the_deadline_reports_the_loss_body() {
    let (guard, control, _rig) = starved_guard(1000).await;
    control.jump_forward(guard.remaining_validity());
    let err = guard.release().await.expect_err("released at the deadline");
    assert_eq!(err.kind(), crate::ErrorKind::Lost, "{err}");
}

/// A starved leader whose lease ran out is no leader, though the keeper has not run to say
/// so (the election's own check reads the validity, as `is_held` does).
#[test]
fn a_starved_leader_is_no_leader_once_its_lease_ran_out() {
    crate::tests::bounded(a_starved_leader_is_no_leader_once_its_lease_ran_out_body);
}

async fn a_starved_leader_is_no_leader_once_its_lease_ran_out_body() {
    let (clock, control) = Clock::adjustable();
    let rig = Rig::new(LockOptions::new(ms(1000)));
    let locker = rig.locker.clone().with_clock(clock);
    let election = locker.election("scheduler").expect("name");
    let leader = election.campaign(None).await.expect("elected");
    assert!(leader.is_leader());
    control.jump_forward(ms(2000));
    assert!(!leader.is_leader(), "its lease ran out");
}

/// A memory backend whose refresh jumps the clock just before it answers: the keeper
/// handles the answer only after the validity it was sent under ran out, as after a
/// starvation (its `select!` may take a ready answer before its own timer); only the first
/// refresh jumps. Between the
/// jump and the answer, the guard in `owner` (if any) is looked at, as its owner's task
/// would between two steps.
#[derive(Debug)]
struct LateAnswer {
    memory: MemoryBackend,
    control: ClockControl,
    owner: Mutex<Option<Arc<LockGuard>>>,
    seen_lost: AtomicBool,
    jumped: AtomicBool,
}

impl LateAnswer {
    fn locker(clock: Clock, control: ClockControl) -> (Arc<Self>, Locker) {
        let backend = Arc::new(Self {
            memory: MemoryBackend::new(),
            control,
            owner: Mutex::default(),
            seen_lost: AtomicBool::new(false),
            jumped: AtomicBool::new(false),
        });
        let locker = Locker::new(Arc::clone(&backend) as Arc<dyn LockBackend>)
            .with_options(LockOptions::new(ms(800)))
            .with_clock(clock);
        (backend, locker)
    }
}

#[async_trait]
impl LockBackend for LateAnswer {
    fn backend_name(&self) -> &str {
        "late-answer"
    }
    async fn acquire(&self, request: &AcquireRequest) -> Result<Acquire> {
        self.memory.acquire(request).await
    }
    async fn refresh(&self, lease: &Lease) -> Result<Lease> {
        if self.jumped.swap(true, Ordering::SeqCst) {
            return self.memory.refresh(lease).await;
        }
        self.control.jump_forward(ms(695));
        let owner = self.owner.lock().expect("lock").clone();
        if let Some(guard) = owner {
            self.seen_lost.store(!guard.is_held(), Ordering::SeqCst);
        }
        self.memory.refresh(lease).await
    }
    async fn release(&self, lease: &Lease) -> Result<()> {
        self.memory.release(lease).await
    }
    async fn inspect(&self, name: &LockName) -> Result<Option<HolderInfo>> {
        self.memory.inspect(name).await
    }
    fn guarantees(&self) -> Guarantees {
        self.memory.guarantees()
    }
}

/// TTL 800 ms: refreshed at 100 ms, validity 762 ms (drift 38 ms). The refresh's answer is
/// handled at 795 ms: past the old validity, inside the one it would grant (862 ms). The
/// lease may have expired on the server and been granted again in between: the guard is
/// lost, not healthy.
#[test]
fn an_answer_handled_after_the_validity_ran_out_loses_the_lease() {
    crate::tests::bounded(an_answer_handled_after_the_validity_ran_out_loses_the_lease_body);
}

async fn an_answer_handled_after_the_validity_ran_out_loses_the_lease_body() {
    let (clock, control) = Clock::adjustable();
    let (_backend, locker) = LateAnswer::locker(clock, control);
    let guard = locker.acquire("job").await.expect("free");
    let reason = tokio::time::timeout(ms(200), guard.lost()).await;
    assert_eq!(reason, Ok(LostReason::ValidityExpired));
    assert!(!guard.is_held());
}

/// Once a guard has read as lost, nothing brings it back: here its owner sees
/// `is_held() == false` while the keeper's refresh is still out, and the answer (handled
/// within the validity the refresh would grant) leaves it lost, its token cancelled.
#[test]
fn a_guard_seen_lost_never_comes_back() {
    crate::tests::bounded(a_guard_seen_lost_never_comes_back_body);
}

async fn a_guard_seen_lost_never_comes_back_body() {
    let (clock, control) = Clock::adjustable();
    let (backend, locker) = LateAnswer::locker(clock, control);
    let guard = Arc::new(locker.acquire("job").await.expect("free"));
    *backend.owner.lock().expect("lock") = Some(Arc::clone(&guard));
    tokio::time::sleep(ms(150)).await;
    assert!(
        backend.seen_lost.load(Ordering::SeqCst),
        "the owner saw it lost"
    );
    for _ in 0..20 {
        assert!(!guard.is_held(), "came back: {}", guard.state());
        assert!(matches!(*guard.health().borrow(), Health::Lost(_)));
        tokio::time::sleep(ms(10)).await;
    }
    assert!(guard.cancellation_token().is_cancelled());
    drop(backend.owner.lock().expect("lock").take());
}

/// A guard's `Deadline` reads the validity left, follows refreshes, and reads zero once
/// the lease has ended here; its `Debug` says what it reads.
#[test]
fn a_deadline_reads_the_validity_left_and_zero_once_released() {
    crate::tests::bounded(a_deadline_reads_the_validity_left_body);
}

async fn a_deadline_reads_the_validity_left_body() {
    let locker = crate::Locker::new(std::sync::Arc::new(crate::MemoryBackend::new()))
        .with_options(crate::LockOptions::new(ms(1000)));
    let guard = locker.acquire("job").await.expect("free");
    let deadline = guard.deadline();
    // TTL 1000 ms less the drift allowance (10 ms + the 30 ms margin).
    assert_eq!(deadline.left(), ms(960));
    assert_eq!(format!("{deadline:?}"), "Deadline { left: 960ms }");
    tokio::time::sleep(ms(100)).await;
    assert_eq!(deadline.left(), guard.remaining_validity());
    tokio::time::sleep(ms(2000)).await;
    assert!(deadline.left() > ms(800), "refreshes move it later");
    guard.release().await.expect("released");
    assert_eq!(deadline.left(), std::time::Duration::ZERO);
}
