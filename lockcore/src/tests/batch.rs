//! Grouped refreshes (`batch.rs`): guards of one locker share `refresh_many` calls.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use tokio::time::Instant;

use super::{ms, until};
use crate::{
    Acquire, AcquireRequest, Guarantees, Health, HolderInfo, Lease, LockBackend, LockGuard,
    LockName, LockOptions, Locker, LostReason, MemoryBackend, Result,
};

/// A memory backend that takes batches, recording every refresh call.
#[derive(Debug)]
struct Counting {
    memory: MemoryBackend,
    /// Each `refresh_many` call: when, and how many leases.
    batches: Mutex<Vec<(Instant, usize)>>,
    /// When each lock was refreshed, by name.
    refreshed: Mutex<HashMap<String, Vec<Instant>>>,
    single: Mutex<usize>,
    /// Answer every batch without its first result.
    short: AtomicBool,
    /// Answer every batch in reverse order.
    reversed: AtomicBool,
}

impl Counting {
    fn new(limit: usize) -> Arc<Self> {
        Arc::new(Self {
            memory: MemoryBackend::new().with_refresh_batch_limit(limit),
            batches: Mutex::default(),
            refreshed: Mutex::default(),
            single: Mutex::default(),
            short: AtomicBool::new(false),
            reversed: AtomicBool::new(false),
        })
    }

    fn batches(&self) -> Vec<(Instant, usize)> {
        self.batches.lock().expect("lock").clone()
    }
}

#[async_trait]
impl LockBackend for Counting {
    fn backend_name(&self) -> &str {
        "counting"
    }
    async fn acquire(&self, request: &AcquireRequest) -> Result<Acquire> {
        self.memory.acquire(request).await
    }
    async fn refresh(&self, lease: &Lease) -> Result<Lease> {
        *self.single.lock().expect("lock") += 1;
        self.memory.refresh(lease).await
    }
    async fn refresh_many(&self, leases: &[Lease]) -> Vec<Result<Lease>> {
        let now = Instant::now();
        self.batches.lock().expect("lock").push((now, leases.len()));
        {
            let mut refreshed = self.refreshed.lock().expect("lock");
            for lease in leases {
                let times = refreshed.entry(lease.name().to_string()).or_default();
                times.push(now);
            }
        }
        let mut results = self.memory.refresh_many(leases).await;
        if self.short.load(Ordering::SeqCst) {
            drop(results.remove(0));
        }
        if self.reversed.load(Ordering::SeqCst) {
            results.reverse();
        }
        results
    }
    fn refresh_batch_limit(&self) -> usize {
        self.memory.refresh_batch_limit()
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

/// TTL 800 ms: refresh every 100 ms, so the grid step is 25 ms.
fn locker(backend: &Arc<Counting>) -> Locker {
    Locker::new(backend.clone()).with_options(LockOptions::new(ms(800)))
}

async fn hold(locker: &Locker, names: impl Iterator<Item = String>, gap: u64) -> Vec<LockGuard> {
    let mut guards = Vec::new();
    for name in names {
        guards.push(locker.acquire(name).await.expect("free"));
        tokio::time::sleep(ms(gap)).await;
    }
    guards
}

#[test]
fn guards_acquired_apart_are_refreshed_together() {
    crate::tests::bounded(guards_acquired_apart_are_refreshed_together_body);
}

async fn guards_acquired_apart_are_refreshed_together_body() {
    let backend = Counting::new(1000);
    let locker = locker(&backend);
    // 50 acquisitions 7 ms apart: their own schedules would be 50 different instants.
    let guards = hold(&locker, (0..50).map(|i| format!("job-{i}")), 7).await;
    let start = Instant::now();
    tokio::time::sleep(ms(1000)).await;
    let calls = backend
        .batches()
        .iter()
        .filter(|(t, _)| *t >= start)
        .count();
    let leases: usize = backend
        .batches()
        .iter()
        .filter(|(t, _)| *t >= start)
        .map(|b| b.1)
        .sum();
    // The grid has 40 instants in 1 s; one call each at most. One call per lease would be
    // 500 and more.
    assert!(calls <= 41, "{calls} refresh_many calls in 1 s");
    assert!(leases >= 500, "{leases} leases refreshed in 1 s");
    assert_eq!(*backend.single.lock().expect("lock"), 0, "no lone refresh");
    for guard in &guards {
        assert_eq!(guard.state(), Health::Healthy);
    }
    // Never later than the guard's own interval, at most a grid step earlier.
    for (name, times) in backend.refreshed.lock().expect("lock").iter() {
        for pair in times.windows(2) {
            let gap = pair[1] - pair[0];
            assert!(
                gap <= ms(100) && gap >= ms(75),
                "{name}: refreshes {gap:?} apart"
            );
        }
    }
}

#[test]
fn a_batch_never_exceeds_the_backends_limit() {
    crate::tests::bounded(a_batch_never_exceeds_the_backends_limit_body);
}

async fn a_batch_never_exceeds_the_backends_limit_body() {
    let backend = Counting::new(4);
    let locker = locker(&backend);
    let guards = hold(&locker, (0..10).map(|i| format!("job-{i}")), 0).await;
    tokio::time::sleep(ms(250)).await;
    let batches = backend.batches();
    assert!(batches.iter().all(|(_, n)| *n <= 4), "{batches:?}");
    assert!(
        batches.iter().map(|b| b.1).sum::<usize>() >= 20,
        "{batches:?}"
    );
    for guard in &guards {
        assert_eq!(guard.state(), Health::Healthy);
    }
}

#[test]
fn a_lease_lost_in_a_batch_loses_only_its_guard() {
    crate::tests::bounded(a_lease_lost_in_a_batch_loses_only_its_guard_body);
}

async fn a_lease_lost_in_a_batch_loses_only_its_guard_body() {
    let backend = Counting::new(1000);
    let locker = locker(&backend);
    let guards = hold(&locker, ["a", "b", "c"].map(String::from).into_iter(), 0).await;
    let b = LockName::new("b").expect("valid");
    assert!(backend.memory.admin_delete(&b));
    let (_, lost) = until(&guards[1], |h| !h.is_held()).await;
    assert!(
        matches!(lost, Health::Lost(LostReason::NotOwner(_))),
        "{lost:?}"
    );
    tokio::time::sleep(ms(300)).await;
    assert_eq!(guards[0].state(), Health::Healthy);
    assert_eq!(guards[2].state(), Health::Healthy);
    assert!(
        backend.memory.inspect(&b).await.expect("ok").is_none(),
        "a batch re-created a deleted lock"
    );
}

#[test]
fn a_batch_answered_short_fails_every_lease_without_losing_it() {
    crate::tests::bounded(a_batch_answered_short_fails_every_lease_without_losing_it_body);
}

async fn a_batch_answered_short_fails_every_lease_without_losing_it_body() {
    let backend = Counting::new(1000);
    let locker = locker(&backend);
    let guards = hold(&locker, ["a", "b"].map(String::from).into_iter(), 0).await;
    backend.short.store(true, Ordering::SeqCst);
    for guard in &guards {
        let (_, health) = until(guard, |h| *h != Health::Healthy).await;
        assert_eq!(health, Health::Degraded { failures: 1 });
    }
    assert_eq!(
        guards[0].lease().name().as_str(),
        "a",
        "given another lock's lease"
    );
    backend.short.store(false, Ordering::SeqCst);
    for guard in &guards {
        until(guard, |h| *h == Health::Healthy).await;
    }
}

/// A backend that answers a batch out of order answers each lease with another lock of the
/// same owner: no guard takes another's lease (it would refresh that lock while its own
/// expires), each counts an unknown outcome instead.
#[test]
fn a_batch_answered_out_of_order_gives_no_guard_another_lease() {
    crate::tests::bounded(a_batch_answered_out_of_order_gives_no_guard_another_lease_body);
}

async fn a_batch_answered_out_of_order_gives_no_guard_another_lease_body() {
    let backend = Counting::new(1000);
    let locker = locker(&backend).with_identity(crate::Identity::unique());
    let guards = hold(&locker, ["a", "b"].map(String::from).into_iter(), 0).await;
    assert_eq!(guards[0].lease().owner(), guards[1].lease().owner());
    backend.reversed.store(true, Ordering::SeqCst);
    // One refresh round (every 100 ms), answered reversed.
    tokio::time::sleep(ms(150)).await;
    for (guard, name) in guards.iter().zip(["a", "b"]) {
        assert_eq!(
            guard.lease().name().as_str(),
            name,
            "given another lock's lease"
        );
        assert_eq!(guard.state(), Health::Degraded { failures: 1 }, "{name}");
    }
    backend.reversed.store(false, Ordering::SeqCst);
    for guard in &guards {
        until(guard, |h| *h == Health::Healthy).await;
    }
}

#[test]
fn released_guards_are_left_out_of_later_batches() {
    crate::tests::bounded(released_guards_are_left_out_of_later_batches_body);
}

async fn released_guards_are_left_out_of_later_batches_body() {
    let backend = Counting::new(1000);
    let locker = locker(&backend);
    let mut guards = hold(&locker, (0..5).map(|i| format!("job-{i}")), 0).await;
    for guard in guards.drain(2..) {
        guard.release().await.expect("released");
    }
    let start = Instant::now();
    tokio::time::sleep(ms(300)).await;
    let batches = backend.batches();
    let after: Vec<usize> = batches
        .iter()
        .filter(|(t, _)| *t >= start)
        .map(|b| b.1)
        .collect();
    assert!(
        !after.is_empty() && after.iter().all(|n| *n == 2),
        "{after:?}"
    );
}

#[test]
fn guards_with_short_intervals_refresh_on_their_own() {
    crate::tests::bounded(guards_with_short_intervals_refresh_on_their_own_body);
}

/// TTL 80 ms, so a refresh every 10 ms: the gathering wait and the queue's hops would eat
/// the refresh timeout (the interval), so these guards call `refresh` themselves.
async fn guards_with_short_intervals_refresh_on_their_own_body() {
    let backend = Counting::new(1000);
    let locker = Locker::new(backend.clone()).with_options(LockOptions::new(ms(80)));
    let guards = hold(&locker, (0..4).map(|i| format!("job-{i}")), 0).await;
    tokio::time::sleep(ms(300)).await;
    let batches = backend.batches().len();
    assert_eq!(
        batches, 0,
        "{batches} refresh_many calls for short intervals"
    );
    assert!(*backend.single.lock().expect("lock") >= 4 * 25);
    for guard in &guards {
        assert_eq!(guard.state(), Health::Healthy);
    }
}

/// A locker used on two runtimes: the first one, no longer driven, must not hold up the
/// refreshes of guards on the second (each runtime has its own queue task).
#[test]
fn an_idle_runtime_does_not_hold_up_guards_on_another() {
    let backend = Counting::new(100);
    let locker = locker(&backend);
    let idle = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a runtime");
    let _held_on_idle = idle.block_on(locker.acquire("on-idle")).expect("free");
    let busy = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .expect("a runtime");
    busy.block_on(async {
        let guard = locker.acquire("on-busy").await.expect("free");
        // 800 ms TTL: three failed refreshes (300 ms) would lose it.
        tokio::time::sleep(ms(1000)).await;
        assert_eq!(guard.state(), Health::Healthy);
        guard.release().await.expect("released");
    });
}

#[test]
fn the_fault_injector_passes_batches_through_as_one_call() {
    crate::tests::bounded(the_fault_injector_passes_batches_through_as_one_call_body);
}

/// `FaultyBackend` offers its inner backend's batches, so cuttable conformance cases run
/// the batched path, and a fault fails the whole batch alike, as a cut connection would.
async fn the_fault_injector_passes_batches_through_as_one_call_body() {
    use crate::testing::{Fault, FaultyBackend, Op};
    let memory = MemoryBackend::new().with_refresh_batch_limit(10);
    let faulty = FaultyBackend::new(Arc::new(memory.clone()));
    assert_eq!(faulty.refresh_batch_limit(), 10);
    let mut leases = Vec::new();
    for name in ["a", "b"] {
        let request = AcquireRequest::new(
            LockName::new(name).expect("valid"),
            crate::Identity::unique(),
            crate::Ttl::new(ms(800)).expect("valid"),
        );
        match faulty.acquire(&request).await.expect("acquire") {
            Acquire::Acquired(lease) => leases.push(lease),
            Acquire::Held(_) => panic!("free"),
        }
    }
    assert!(faulty.refresh_many(&leases).await.iter().all(Result::is_ok));
    faulty.set(Op::Refresh, Fault::Fail(crate::ErrorKind::Unavailable));
    let failed = faulty.refresh_many(&leases).await;
    assert_eq!(failed.len(), 2);
    for result in &failed {
        let err = result.as_ref().expect_err("injected");
        assert_eq!(err.kind(), crate::ErrorKind::Unavailable);
    }
    assert_eq!(faulty.calls(Op::Refresh), 2, "one call per batch");
}
