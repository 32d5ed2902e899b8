//! The attempt in the caller's task (`attempt.rs`): what the caller's task must never see,
//! and what must still happen when it goes away. Real runtimes: these are about runtimes.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use async_trait::async_trait;

use super::ms;
use crate::{
    Acquire, AcquireRequest, Guarantees, HolderInfo, Identity, Lease, LockBackend, LockName,
    LockOptions, Locker, MemoryBackend, Result, WaitMode,
};

/// A memory backend whose acquire can panic once, or answer 100 ms after granting.
#[derive(Debug, Default)]
struct Quirky {
    memory: MemoryBackend,
    panic_once: AtomicBool,
    slow_reply: AtomicBool,
}

#[async_trait]
impl LockBackend for Quirky {
    fn backend_name(&self) -> &str {
        "quirky"
    }
    async fn acquire(&self, request: &AcquireRequest) -> Result<Acquire> {
        if self.panic_once.swap(false, Ordering::SeqCst) {
            panic!("a backend bug in acquire");
        }
        let outcome = self.memory.acquire(request).await;
        if self.slow_reply.load(Ordering::SeqCst) {
            tokio::time::sleep(ms(100)).await;
        }
        outcome
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

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .expect("a runtime")
}

/// A panicking backend fails one attempt (retried while waiting), not the caller's task,
/// and frees the owner's slot.
#[test]
fn a_panicking_acquire_fails_the_attempt_not_the_caller() {
    runtime().block_on(async {
        let backend = Arc::new(Quirky::default());
        backend.panic_once.store(true, Ordering::SeqCst);
        let options = LockOptions::new(ms(800)).with_wait(WaitMode::Timeout(ms(2000)));
        let owner = Identity::named("inline-test").expect("valid");
        let locker = Locker::new(backend.clone())
            .with_options(options)
            .with_identity(owner);
        let caller = locker.clone();
        let joined = tokio::spawn(async move { caller.acquire("x").await.map(drop) }).await;
        joined
            .expect("the panic stayed out of the caller's task")
            .expect("the next attempt got the lock");
        backend.panic_once.store(true, Ordering::SeqCst);
        let once = locker.options().clone().with_wait(WaitMode::TryOnce);
        let err = locker.acquire_with("y", &once).await.expect_err("panicked");
        assert!(err.is_temporary(), "{err}");
        locker
            .acquire("y")
            .await
            .expect("the owner's slot was freed");
    });
}

/// An acquire future dropped outside any runtime, with its grant made but not answered,
/// still has that grant released (on the attempt's own runtime).
#[test]
fn a_grant_whose_future_is_dropped_outside_a_runtime_is_released() {
    let backend = Arc::new(Quirky::default());
    backend.slow_reply.store(true, Ordering::SeqCst);
    let locker = Locker::new(backend.clone()).with_options(LockOptions::new(ms(5000)));
    let runtime = runtime();
    let mut acquire = Box::pin(locker.acquire("x"));
    let early = runtime.block_on(async { tokio::time::timeout(ms(30), &mut acquire).await });
    assert!(early.is_err(), "the reply is still on its way");
    drop(acquire); // outside the runtime
    let held = runtime.block_on(async {
        tokio::time::sleep(ms(500)).await;
        backend
            .memory
            .inspect(&LockName::new("x").expect("valid"))
            .await
    });
    assert!(
        held.expect("ok").is_none(),
        "the grant was left held by nobody"
    );
}
