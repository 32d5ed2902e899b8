//! The keeper (`keeper.rs`) and the release in the caller's task (`held.rs`): one task
//! refreshes every guard of a locker, a backend bug in one refresh reaches only its own
//! lease, and ending a lease needs no other task, yet finishes when its caller goes away.

use std::collections::HashSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;

use super::{ms, runtime};
use crate::{
    Acquire, AcquireRequest, Guarantees, Health, HolderInfo, Identity, Lease, LockBackend,
    LockName, LockOptions, Locker, LostReason, MemoryBackend, Result,
};

/// A memory backend whose refresh panics for the locks named, and whose release can be
/// slow and records which task called it.
#[derive(Debug, Default)]
struct Odd {
    memory: MemoryBackend,
    panics_on: Mutex<HashSet<String>>,
    slow_release: Mutex<Option<u64>>,
    /// Acquire and release yield to the runtime once.
    yields: Mutex<bool>,
    /// Refreshes with this TTL take 60 ms before they reach the lock table.
    slow_refresh_ttl: Mutex<Option<Duration>>,
    released_in: Mutex<Vec<Option<tokio::task::Id>>>,
}

#[async_trait]
impl LockBackend for Odd {
    fn backend_name(&self) -> &str {
        "odd"
    }
    async fn acquire(&self, request: &AcquireRequest) -> Result<Acquire> {
        self.memory.acquire(request).await
    }
    async fn refresh(&self, lease: &Lease) -> Result<Lease> {
        if self
            .panics_on
            .lock()
            .expect("lock")
            .contains(lease.name().as_str())
        {
            panic!("a backend bug in refresh");
        }
        if *self.slow_refresh_ttl.lock().expect("lock") == Some(lease.ttl().get()) {
            tokio::time::sleep(ms(60)).await;
        }
        self.memory.refresh(lease).await
    }
    async fn release(&self, lease: &Lease) -> Result<()> {
        self.released_in
            .lock()
            .expect("lock")
            .push(tokio::task::try_id());
        if *self.yields.lock().expect("lock") {
            tokio::task::yield_now().await;
        }
        let slow = *self.slow_release.lock().expect("lock");
        if let Some(slow) = slow {
            tokio::time::sleep(ms(slow)).await;
        }
        self.memory.release(lease).await
    }
    async fn inspect(&self, name: &LockName) -> Result<Option<HolderInfo>> {
        self.memory.inspect(name).await
    }
    fn guarantees(&self) -> Guarantees {
        self.memory.guarantees()
    }
}

fn name(s: &str) -> LockName {
    LockName::new(s).expect("a valid name")
}

fn locker(odd: &Arc<Odd>) -> Locker {
    Locker::new(Arc::clone(odd) as Arc<dyn LockBackend>)
        .with_options(LockOptions::new(ms(1_000)).with_refresh_interval(ms(125)))
}

/// 200 guards, refreshed through four TTLs, by one task: the keeper. With a refresher
/// task per guard this runtime had 201.
#[test]
fn one_task_refreshes_every_guard_of_a_locker() {
    crate::tests::bounded(one_task_refreshes_every_guard_of_a_locker_body);
}

async fn one_task_refreshes_every_guard_of_a_locker_body() {
    let odd = Arc::new(Odd::default());
    let locker = locker(&odd);
    let mut guards = Vec::new();
    for i in 0..200 {
        guards.push(locker.acquire(format!("job-{i}")).await.expect("free"));
    }
    tokio::time::sleep(ms(4_000)).await;
    let tasks = tokio::runtime::Handle::current()
        .metrics()
        .num_alive_tasks();
    assert!(
        tasks <= 1,
        "{tasks} tasks alive for one locker's 200 guards"
    );
    for guard in &guards {
        assert_eq!(guard.state(), Health::Healthy, "{} refreshed", guard.name());
    }
    for guard in guards {
        guard.release().await.expect("released");
    }
}

/// A refresh that panics is a failed refresh of its own lease: the keeper, and every other
/// guard it refreshes, go on.
#[test]
fn a_panicking_refresh_fails_only_its_own_lease() {
    crate::tests::bounded(a_panicking_refresh_fails_only_its_own_lease_body);
}

async fn a_panicking_refresh_fails_only_its_own_lease_body() {
    let odd = Arc::new(Odd::default());
    odd.panics_on.lock().expect("lock").insert("bad".into());
    let locker = locker(&odd);
    let bad = locker.acquire("bad").await.expect("free");
    let good = locker.acquire("good").await.expect("free");
    let reason = tokio::time::timeout(ms(3_000), bad.lost())
        .await
        .expect("lost within its TTL");
    assert!(
        matches!(&reason, LostReason::TooManyFailures { last, .. } if last.contains("panicked")),
        "{reason:?}"
    );
    tokio::time::sleep(ms(2_000)).await;
    assert_eq!(good.state(), Health::Healthy);
    good.release().await.expect("released");
    drop(bad);
}

/// `release()` calls the backend from the caller's own task: no hand-off to another task
/// and back.
#[test]
fn release_runs_in_the_callers_task() {
    crate::tests::bounded(release_runs_in_the_callers_task_body);
}

async fn release_runs_in_the_callers_task_body() {
    let odd = Arc::new(Odd::default());
    let locker = locker(&odd);
    let caller = tokio::spawn(async move {
        let guard = locker.acquire("job").await.expect("free");
        guard.release().await.expect("released");
        tokio::task::id()
    });
    let caller = caller.await.expect("the caller");
    assert_eq!(*odd.released_in.lock().expect("lock"), vec![Some(caller)]);
}

/// A release whose future is dropped halfway still releases, and frees the owner's slot
/// (the same identity can take the lock again at once).
#[test]
fn a_release_dropped_halfway_still_finishes() {
    crate::tests::bounded(a_release_dropped_halfway_still_finishes_body);
}

async fn a_release_dropped_halfway_still_finishes_body() {
    let odd = Arc::new(Odd::default());
    let me = Identity::named("me").expect("an identity");
    let locker = locker(&odd).with_identity(me);
    let guard = locker.acquire("job").await.expect("free");
    *odd.slow_release.lock().expect("lock") = Some(100);
    let dropped = tokio::time::timeout(ms(10), guard.release()).await;
    assert!(dropped.is_err(), "the release takes 100 ms");
    tokio::time::sleep(ms(200)).await;
    assert!(
        odd.memory
            .inspect(&name("job"))
            .await
            .expect("ok")
            .is_none()
    );
    *odd.slow_release.lock().expect("lock") = None;
    let again = locker.try_acquire("job").await.expect("ok");
    assert!(again.is_some(), "the slot was freed with the release");
}

/// A locker used from one short-lived runtime after another (a `block_on` per call, a
/// runtime per test) keeps the way to the live keeper only: each stopped keeper's handle
/// (and its mailbox) is dropped when the next runtime asks for one.
#[test]
fn a_locker_forgets_the_keepers_of_runtimes_that_ended() {
    let odd = Arc::new(Odd::default());
    let locker = locker(&odd);
    for round in 0..5 {
        let rt = runtime();
        let guard = rt.block_on(locker.acquire("job")).expect("free");
        rt.block_on(guard.release()).expect("released");
        assert_eq!(locker.keepers_known(), 1, "round {round}");
        drop(rt);
    }
}

/// A guard whose keeper stopped (its runtime shut down) still releases when asked, and
/// says the lease was lost: nothing refreshed it since.
#[test]
fn a_guard_whose_keeper_stopped_still_releases() {
    let odd = Arc::new(Odd::default());
    let first = runtime();
    let guard = first.block_on(locker(&odd).acquire("job")).expect("free");
    let health = guard.health();
    drop(first);
    assert_eq!(guard.state(), Health::Lost(LostReason::RefresherStopped));
    // Told, not only read: a watcher of the health sees it too.
    assert_eq!(*health.borrow(), Health::Lost(LostReason::RefresherStopped));
    assert!(guard.cancellation_token().is_cancelled());
    let second = runtime();
    let released = second.block_on(guard.release());
    let err = released.expect_err("lost");
    assert!(err.to_string().contains("refresher stopped"), "{err}");
    let holder = second.block_on(odd.memory.inspect(&name("job")));
    assert!(holder.expect("ok").is_none(), "released on the server");
}

/// `leave_for` waits for the keeper's refresh in flight: landing after the leaving refresh,
/// it would cut the lease back to the old TTL, and the lock would be free long before the
/// time `leave_for` promised.
#[test]
fn leaving_waits_for_the_refresh_in_flight() {
    crate::tests::bounded(leaving_waits_for_the_refresh_in_flight_body);
}

async fn leaving_waits_for_the_refresh_in_flight_body() {
    let odd = Arc::new(Odd::default());
    *odd.slow_refresh_ttl.lock().expect("lock") = Some(ms(1_000));
    let locker = locker(&odd);
    let start = tokio::time::Instant::now();
    let guard = locker.acquire("ci-step").await.expect("free");
    // The first refresh (TTL 1 s) goes out at 125 ms and lands at 185 ms.
    tokio::time::sleep_until(start + ms(130)).await;
    let lease = guard.leave_for(ms(10_000)).await.expect("left");
    assert_eq!(lease.ttl().get(), ms(10_000));
    tokio::time::sleep_until(start + ms(3_000)).await;
    let holder = odd.memory.inspect(&name("ci-step")).await.expect("ok");
    assert!(holder.is_some(), "held for the 10 s leave_for promised");
}

/// Acquire and release do not wake the keeper: a new lease is due an interval later, and a
/// released one leaves the queue with the next mail. (The backend yields in each call, so
/// a keeper that is woken gets to run.)
#[test]
fn a_cycle_leaves_the_keeper_asleep() {
    crate::tests::bounded(a_cycle_leaves_the_keeper_asleep_body);
}

async fn a_cycle_leaves_the_keeper_asleep_body() {
    let odd = Arc::new(Odd::default());
    *odd.yields.lock().expect("lock") = true;
    let locker = Locker::new(Arc::clone(&odd) as Arc<dyn LockBackend>)
        .with_options(LockOptions::new(ms(30_000)));
    let held = locker.acquire("held").await.expect("free");
    let before = locker.keeper_wakes();
    for i in 0..1_000 {
        let guard = locker.acquire(format!("job-{i}")).await.expect("free");
        guard.release().await.expect("released");
    }
    let wakes = locker.keeper_wakes() - before;
    assert!(
        wakes <= 20,
        "the keeper woke {wakes} times for 1,000 cycles"
    );
    held.release().await.expect("released");
}

/// Released leases leave the keeper within one mailbox (128 pieces of mail) even while no
/// lease is added: each holds the backend, its lease and its options until then.
#[test]
fn released_leases_leave_the_keeper_within_one_mailbox() {
    crate::tests::bounded(released_leases_leave_the_keeper_within_one_mailbox_body);
}

async fn released_leases_leave_the_keeper_within_one_mailbox_body() {
    let odd = Arc::new(Odd::default());
    *odd.yields.lock().expect("lock") = true;
    let backend = Arc::clone(&odd) as Arc<dyn LockBackend>;
    let locker = Locker::new(Arc::clone(&backend)).with_options(LockOptions::new(ms(30_000)));
    let mut guards = Vec::new();
    for i in 0..1_000 {
        guards.push(locker.acquire(format!("job-{i}")).await.expect("free"));
    }
    for guard in guards {
        guard.release().await.expect("released");
    }
    tokio::task::yield_now().await;
    // `backend`, the locker, and at most a mailbox of released leases.
    let alive = Arc::strong_count(&backend);
    assert!(alive <= 2 + 128, "{alive} references to the backend");
}

/// A lease due before the keeper's planned wake-up wakes it: a 1 s lease taken while the
/// keeper sleeps until a 30 s lease's refresh is still refreshed every 125 ms.
#[test]
fn a_lease_due_sooner_wakes_the_keeper() {
    crate::tests::bounded(a_lease_due_sooner_wakes_the_keeper_body);
}

async fn a_lease_due_sooner_wakes_the_keeper_body() {
    let odd = Arc::new(Odd::default());
    let locker = Locker::new(Arc::clone(&odd) as Arc<dyn LockBackend>)
        .with_options(LockOptions::new(ms(30_000)));
    let slow = locker.acquire("slow").await.expect("free");
    tokio::time::sleep(ms(10)).await;
    let options = LockOptions::new(ms(1_000)).with_refresh_interval(ms(125));
    let fast = locker.acquire_with("fast", &options).await.expect("free");
    tokio::time::sleep(ms(3_000)).await;
    assert_eq!(fast.state(), Health::Healthy);
    fast.release().await.expect("released");
    slow.release().await.expect("released");
}

/// Thousands of short leases leave a stale timer each behind; compaction drops them once
/// they outnumber the live ones (the heap stays bounded), and keeps the live lease's timer
/// (a long-held guard goes on being refreshed through it).
#[test]
fn compaction_bounds_stale_timers_and_keeps_the_live_one() {
    crate::tests::bounded(compaction_bounds_stale_timers_and_keeps_the_live_one_body);
}

async fn compaction_bounds_stale_timers_and_keeps_the_live_one_body() {
    // TTL 10 s: refreshed every 1.25 s.
    let rig = crate::tests::Rig::new(LockOptions::new(ms(10_000)));
    let long = rig.locker.acquire("long").await.expect("free");
    let mut most = 0;
    for i in 0..3_000 {
        let guard = rig.locker.acquire(format!("short{i}")).await.expect("free");
        guard.release().await.expect("release");
        tokio::task::yield_now().await;
        most = most.max(rig.locker.keeper_timers());
    }
    assert!(most > 0, "the keeper reports its timers");
    // Without compaction every one of the 3,000 would wait until it would have fired.
    assert!(most <= 2 * 2 + 1024 + 256, "{most} timers queued at most");
    let before = rig.faulty.calls(crate::testing::Op::Refresh);
    tokio::time::sleep(ms(5_000)).await;
    let refreshed = rig.faulty.calls(crate::testing::Op::Refresh) - before;
    assert!(
        refreshed >= 3,
        "the long-held lease was refreshed {refreshed} times in 5 s"
    );
    assert_eq!(long.state(), Health::Healthy);
}
