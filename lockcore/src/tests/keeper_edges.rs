//! Edges of the keeper and of ending a lease in the caller's task, from a hostile review
//! of the first keeper (each test failed on it, at 43d4860; all but the batch one passed
//! on the per-guard driver before it, which had that bug too). The comments say what the
//! first keeper did wrong.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use tokio::time::Instant;

use super::{ms, runtime};
use crate::{
    Acquire, AcquireRequest, Clock, ClockControl, Guarantees, Health, HolderInfo, Lease,
    LockBackend, LockName, LockOptions, Locker, MemoryBackend, Result,
};

/// A memory backend with slow refreshes and a release that can panic.
#[derive(Debug)]
struct Slow {
    memory: MemoryBackend,
    /// `refresh_many` takes this long before it reaches the lock table.
    many_delay: Mutex<Option<Duration>>,
    /// Single refreshes with this TTL take this long before they reach the table.
    slow_single: Mutex<Option<(Duration, Duration)>>,
    /// Single refreshes reach the table at once and answer this much later.
    late_single: Mutex<Option<Duration>>,
    /// Single refreshes sent.
    refreshes: AtomicUsize,
    release_panics: Mutex<bool>,
}

impl Slow {
    fn new(memory: MemoryBackend) -> Arc<Self> {
        Arc::new(Self {
            memory,
            many_delay: Mutex::new(None),
            slow_single: Mutex::new(None),
            late_single: Mutex::new(None),
            refreshes: AtomicUsize::new(0),
            release_panics: Mutex::new(false),
        })
    }
}

#[async_trait]
impl LockBackend for Slow {
    fn backend_name(&self) -> &str {
        "slow"
    }
    async fn acquire(&self, request: &AcquireRequest) -> Result<Acquire> {
        self.memory.acquire(request).await
    }
    async fn refresh(&self, lease: &Lease) -> Result<Lease> {
        self.refreshes.fetch_add(1, Ordering::SeqCst);
        let slow = *self.slow_single.lock().expect("lock");
        if let Some((ttl, delay)) = slow
            && lease.ttl().get() == ttl
        {
            tokio::time::sleep(delay).await;
        }
        let refreshed = self.memory.refresh(lease).await;
        let late = *self.late_single.lock().expect("lock");
        if let Some(late) = late {
            tokio::time::sleep(late).await;
        }
        refreshed
    }
    async fn refresh_many(&self, leases: &[Lease]) -> Vec<Result<Lease>> {
        let delay = *self.many_delay.lock().expect("lock");
        if let Some(delay) = delay {
            tokio::time::sleep(delay).await;
        }
        self.memory.refresh_many(leases).await
    }
    fn refresh_batch_limit(&self) -> usize {
        self.memory.refresh_batch_limit()
    }
    async fn release(&self, lease: &Lease) -> Result<()> {
        if *self.release_panics.lock().expect("lock") {
            panic!("a backend bug in release");
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

/// A locker on `slow` with TTL 8 s, refreshed every second (so a 1 s refresh timeout),
/// on an adjustable clock.
fn on_adjustable_clock(slow: &Arc<Slow>) -> (Locker, ClockControl) {
    let (clock, control) = Clock::adjustable();
    let options = LockOptions::new(ms(8_000)).with_refresh_interval(ms(1_000));
    let locker = Locker::new(Arc::clone(slow) as Arc<dyn LockBackend>)
        .with_options(options)
        .with_clock(clock);
    (locker, control)
}

fn name(s: &str) -> LockName {
    LockName::new(s).expect("a valid name")
}

/// a batched refresh is bounded by the *longest* refresh timeout of its
/// leases, but each lease's keeper entry gives up at its *own* timeout. A guard with a
/// short refresh timeout that calls `leave_for` while its lease is in such a batch is let
/// go at its own timeout; the batch, still in flight, lands after the leaving refresh and
/// cuts the 60 s `leave_for` back to the 8 s TTL.
#[test]
fn leave_for_is_not_undone_by_a_batch_with_a_longer_timeout() {
    crate::tests::bounded(leave_for_is_not_undone_by_a_batch_with_a_longer_timeout_body);
}

async fn leave_for_is_not_undone_by_a_batch_with_a_longer_timeout_body() {
    let slow = Slow::new(MemoryBackend::new().with_refresh_batch_limit(16));
    *slow.many_delay.lock().expect("lock") = Some(ms(600));
    let options = LockOptions::new(ms(8_000)).with_refresh_interval(ms(1_000));
    let locker =
        Locker::new(Arc::clone(&slow) as Arc<dyn LockBackend>).with_options(options.clone());
    let start = Instant::now();
    // Refresh timeout 200 ms; the other guard's is the interval, 1 s.
    let short = options.clone().with_attempt_timeout(ms(200));
    let ci = locker.acquire_with("ci-step", &short).await.expect("free");
    let other = locker.acquire("other").await.expect("free");
    // Both fall due at 1 s on the grid: one refresh_many (bounded by 1 s) lands at 1.6 s.
    tokio::time::sleep_until(start + ms(1_050)).await;
    let lease = ci.leave_for(ms(60_000)).await.expect("left");
    assert_eq!(lease.ttl().get(), ms(60_000));
    tokio::time::sleep_until(start + ms(20_000)).await;
    let holder = slow.memory.inspect(&name("ci-step")).await.expect("ok");
    assert!(
        holder.is_some(),
        "leave_for promised 60 s; the batch in flight landed after it and cut it to 8 s"
    );
    other.release().await.expect("released");
}

/// the keeper gives up on a refresh at its timeout on the locker's
/// `Clock`, but the backend call keeps running until its tokio timeout. After a forward
/// jump (well inside the validity) the keeper lets a leaving guard go while its refresh is
/// still in flight, and that refresh undoes the `leave_for` TTL. (The old driver dropped
/// the refresh future when it gave up.)
#[test]
fn leave_for_is_not_undone_after_a_forward_clock_jump() {
    crate::tests::bounded(leave_for_is_not_undone_after_a_forward_clock_jump_body);
}

async fn leave_for_is_not_undone_after_a_forward_clock_jump_body() {
    let slow = Slow::new(MemoryBackend::new());
    // The keeper's refreshes (TTL 8 s) take 600 ms; the leaving one (60 s) is instant.
    *slow.slow_single.lock().expect("lock") = Some((ms(8_000), ms(600)));
    let (locker, control) = on_adjustable_clock(&slow);
    let start = Instant::now();
    let ci = locker.acquire("ci-step").await.expect("free");
    // The keeper's refresh goes out at 1 s and lands at 1.6 s.
    tokio::time::sleep_until(start + ms(1_050)).await;
    let leaving = tokio::spawn(ci.leave_for(ms(60_000)));
    tokio::time::sleep(ms(10)).await;
    // Past the refresh's 1 s timeout on the clock, far from the 7.9 s validity.
    control.jump_forward(ms(1_000));
    let lease = leaving.await.expect("no panic").expect("left");
    assert_eq!(lease.ttl().get(), ms(60_000));
    tokio::time::sleep_until(start + ms(20_000)).await;
    let holder = slow.memory.inspect(&name("ci-step")).await.expect("ok");
    assert!(
        holder.is_some(),
        "leave_for promised 60 s; the keeper's refresh landed after it and cut it to 8 s"
    );
}

/// A refresh the keeper gave up on (its timeout passed on the locker's `Clock`) still
/// runs until its tokio timeout, and the keeper sends the next one meanwhile. The first
/// one's late answer proves the lease only from when *it* was sent: credited to the call
/// in flight (sent later), it would stretch the guard's validity past what the server
/// granted. (The keeper matches an answer to its call by number; with that check taken
/// out, this test fails: 7.77 s left against at most 6.05 s.)
#[test]
fn a_late_answer_is_not_credited_to_the_call_that_replaced_it() {
    crate::tests::bounded(a_late_answer_is_not_credited_to_the_call_that_replaced_it_body);
}

async fn a_late_answer_is_not_credited_to_the_call_that_replaced_it_body() {
    let slow = Slow::new(MemoryBackend::new());
    // Refreshes reach the table when sent and answer 900 ms later.
    *slow.late_single.lock().expect("lock") = Some(ms(900));
    let (locker, control) = on_adjustable_clock(&slow);
    let start = Instant::now();
    let guard = locker.acquire("job").await.expect("free");
    // The first refresh goes out at 1 s: the server's lease now ends at 9 s.
    tokio::time::sleep_until(start + ms(1_800)).await;
    // Past its 1 s timeout on the clock: the keeper gives it up and sends the next one,
    // which answers at 2.7 s.
    control.jump_forward(ms(1_000));
    tokio::time::sleep_until(start + ms(1_950)).await;
    assert_eq!(
        slow.refreshes.load(Ordering::SeqCst),
        2,
        "the replacement is in flight"
    );
    // The first answer landed at 1.9 s. All the guard may know is that the lease lasts
    // 8 s from when that refresh was sent: 1 s on the locker's clock, which reads 2.95 s
    // now, so at most 6.05 s from now (the answer ignored leaves the acquire's 4.97 s).
    let left = guard.remaining_validity();
    assert!(
        left <= ms(8_000) - ms(1_950),
        "{left:?} left: the late answer was credited to the later call"
    );
    guard.release().await.expect("released");
}

/// the mailbox measures deadlines in nanoseconds after its base and saturates
/// at 0 below it. After the clock jumps back past the keeper's start, every deadline reads
/// 0, `0 < 0` is false, and a lease due sooner than the keeper's plan no longer wakes it:
/// its first refresh waits for the other lease's, and it is lost.
#[test]
fn a_lease_due_sooner_wakes_the_keeper_after_a_backward_jump() {
    crate::tests::bounded(a_lease_due_sooner_wakes_the_keeper_after_a_backward_jump_body);
}

async fn a_lease_due_sooner_wakes_the_keeper_after_a_backward_jump_body() {
    let (clock, control) = Clock::adjustable();
    let locker = Locker::new(Arc::new(MemoryBackend::new()))
        .with_options(LockOptions::new(ms(30_000)))
        .with_clock(clock);
    let anchor = locker.acquire("anchor").await.expect("free");
    control.jump_back(Duration::from_secs(3_600));
    // Due before the mailbox's base: wakes the keeper, which then plans "0".
    let slow = locker.acquire("slow").await.expect("free");
    tokio::time::sleep(ms(10)).await;
    let options = LockOptions::new(ms(1_000)).with_refresh_interval(ms(125));
    let fast = locker.acquire_with("fast", &options).await.expect("free");
    tokio::time::sleep(ms(3_000)).await;
    assert_eq!(fast.state(), Health::Healthy, "fast was never refreshed");
    fast.release().await.expect("released");
    slow.release().await.expect("released");
    anchor.release().await.expect("released");
}

/// a backend whose `release` panics now unwinds into the caller of
/// `guard.release()` (it runs in the caller's task, without `catch_unwind`). The old
/// driver's task died instead and `release()` returned an error; `acquire` catches a
/// panicking backend for exactly this reason (docs/lockcore.md).
#[test]
fn a_panicking_release_does_not_unwind_into_the_caller() {
    crate::tests::bounded(a_panicking_release_does_not_unwind_into_the_caller_body);
}

async fn a_panicking_release_does_not_unwind_into_the_caller_body() {
    let slow = Slow::new(MemoryBackend::new());
    let locker = Locker::new(Arc::clone(&slow) as Arc<dyn LockBackend>)
        .with_options(LockOptions::new(ms(30_000)));
    let guard = locker.acquire("job").await.expect("free");
    *slow.release_panics.lock().expect("lock") = true;
    let outcome = tokio::spawn(guard.release()).await;
    assert!(
        matches!(outcome, Ok(Err(_))),
        "release() should fail, not panic the caller: {outcome:?}"
    );
}

/// a guard dropped on a runtime that is shutting down (a task of a short-lived
/// runtime, say) is not released although its keeper's runtime lives: the release task is
/// spawned on the dying runtime and never runs. The old driver released it on the
/// runtime the guard was acquired on; the docs say the lease expires by its TTL only "if
/// no runtime is left".
#[test]
fn a_guard_dropped_on_a_dying_runtime_is_released_by_its_keepers() {
    let memory = MemoryBackend::new();
    let locker = Locker::new(Arc::new(memory.clone())).with_options(LockOptions::new(ms(30_000)));
    let first = runtime();
    let guard = first.block_on(locker.acquire("job")).expect("free");
    let second = runtime();
    second.block_on(async move {
        drop(tokio::spawn(async move {
            let _guard = guard;
            std::future::pending::<()>().await;
        }));
        tokio::task::yield_now().await;
    });
    // The task holding the guard is dropped with the runtime.
    drop(second);
    first.block_on(async { tokio::time::sleep(ms(200)).await });
    let holder = first.block_on(memory.inspect(&name("job"))).expect("ok");
    assert!(
        holder.is_none(),
        "still held for its 30 s TTL with its keeper's runtime alive"
    );
}

/// after that panic the owner's slot is not freed with the release: it waits
/// in the keeper's entry until the keeper next wakes (here the 30 s lease's 3.75 s
/// refresh), and the same identity's next acquire waits for it. The old driver's slot
/// died with its task at once.
#[test]
fn a_panicking_release_frees_the_owners_slot_at_once() {
    crate::tests::bounded(a_panicking_release_frees_the_owners_slot_at_once_body);
}

async fn a_panicking_release_frees_the_owners_slot_at_once_body() {
    let slow = Slow::new(MemoryBackend::new());
    let me = crate::Identity::named("me").expect("an identity");
    let locker = Locker::new(Arc::clone(&slow) as Arc<dyn LockBackend>)
        .with_options(LockOptions::new(ms(30_000)))
        .with_identity(me);
    let guard = locker.acquire("job").await.expect("free");
    *slow.release_panics.lock().expect("lock") = true;
    let _ = tokio::spawn(guard.release()).await;
    *slow.release_panics.lock().expect("lock") = false;
    let start = Instant::now();
    let again = locker.acquire("job").await;
    assert!(again.is_ok(), "{again:?}");
    let waited = start.elapsed();
    assert!(
        waited < ms(1_000),
        "the same identity waited {waited:?} for its own slot"
    );
}

/// `release()` (and `leave_for`/`detach`) now need a tokio runtime in the
/// awaiting task: awaited from another executor (a sync shutdown path's `block_on`), the
/// release's `tokio::time::timeout` panics "no reactor running". The old guard only
/// awaited a oneshot answered by its refresher task, and worked from any executor.
#[test]
fn release_works_outside_a_tokio_runtime() {
    let memory = MemoryBackend::new();
    let locker = Locker::new(Arc::new(memory.clone())).with_options(LockOptions::new(ms(30_000)));
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .expect("a runtime");
    let guard = runtime.block_on(locker.acquire("job")).expect("free");
    let released =
        std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| block_on(guard.release())));
    assert!(
        matches!(released, Ok(Ok(()))),
        "release() from a non-tokio executor panicked or failed"
    );
    let holder = runtime.block_on(memory.inspect(&name("job"))).expect("ok");
    assert!(holder.is_none());
}

/// A minimal executor that is not tokio.
fn block_on<F: std::future::Future>(future: F) -> F::Output {
    struct Unpark(std::thread::Thread);
    impl std::task::Wake for Unpark {
        fn wake(self: Arc<Self>) {
            self.0.unpark();
        }
    }
    let waker = Arc::new(Unpark(std::thread::current())).into();
    let mut cx = std::task::Context::from_waker(&waker);
    let mut future = std::pin::pin!(future);
    loop {
        if let std::task::Poll::Ready(out) = future.as_mut().poll(&mut cx) {
            return out;
        }
        std::thread::park();
    }
}

/// after `release()` a health watcher's `changed()` no longer ends: the watch's
/// sender lives in the `Held`, which the keeper keeps until it next reads its mailbox (the
/// released lease's own next refresh time, 3.75 s here). With the old driver the sender
/// died with the refresher task as the release finished, which is how a watcher learned
/// that the guard was over.
#[test]
fn a_health_watch_closes_when_the_guard_is_released() {
    crate::tests::bounded(a_health_watch_closes_when_the_guard_is_released_body);
}

async fn a_health_watch_closes_when_the_guard_is_released_body() {
    let locker =
        Locker::new(Arc::new(MemoryBackend::new())).with_options(LockOptions::new(ms(30_000)));
    let guard = locker.acquire("job").await.expect("free");
    let mut health = guard.health();
    // The keeper has read the new lease from its mailbox.
    tokio::time::sleep(ms(10)).await;
    guard.release().await.expect("released");
    let closed =
        tokio::time::timeout(ms(100), async { while health.changed().await.is_ok() {} }).await;
    assert!(
        closed.is_ok(),
        "the health watch outlived its released guard"
    );
}

/// A memory backend whose server caps the TTL of locks named `capped*` at 1 s (the
/// contract allows it: "the lease reports the TTL actually set").
#[derive(Debug, Default)]
struct Capped {
    memory: MemoryBackend,
}

#[async_trait]
impl LockBackend for Capped {
    fn backend_name(&self) -> &str {
        "capped"
    }
    async fn acquire(&self, request: &AcquireRequest) -> Result<Acquire> {
        if !request.name.as_str().starts_with("capped") {
            return self.memory.acquire(request).await;
        }
        let capped = AcquireRequest::new(
            request.name.clone(),
            request.owner.clone(),
            crate::Ttl::new(ms(1_000)).expect("a TTL"),
        );
        self.memory.acquire(&capped).await
    }
    async fn refresh(&self, lease: &Lease) -> Result<Lease> {
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

/// the mailbox wakes the keeper only when a new lease's first *refresh* is due
/// before its plan, but the entry's timer is the earlier of that and the *validity*. A
/// grant with a shorter TTL than its options' refresh interval expires locally at 0.7 s,
/// yet `lost()`, health watchers and the cancellation token hear of it only when the
/// keeper wakes for another lease (3.75 s). The old per-guard driver said `Lost` at 0.7 s.
#[test]
fn a_short_grant_is_lost_on_time() {
    crate::tests::bounded(a_short_grant_is_lost_on_time_body);
}

async fn a_short_grant_is_lost_on_time_body() {
    let locker =
        Locker::new(Arc::new(Capped::default())).with_options(LockOptions::new(ms(30_000)));
    let anchor = locker.acquire("anchor").await.expect("free");
    tokio::time::sleep(ms(10)).await;
    let capped = locker.acquire("capped").await.expect("free");
    assert_eq!(capped.lease().ttl().get(), ms(1_000));
    let token = capped.cancellation_token();
    let told = tokio::time::timeout(ms(1_500), token.cancelled()).await;
    assert!(
        told.is_ok(),
        "validity ran out at 0.7 s; nobody was told by 1.5 s"
    );
    drop(capped);
    anchor.release().await.expect("released");
}
