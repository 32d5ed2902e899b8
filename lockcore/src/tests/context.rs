//! Who names the backend and the lock in an error: lockcore, once. A backend returns the
//! bare error; every `Locker` operation and the guard's driver add the context.

use std::sync::Arc;
use std::time::Duration;

use crate::testing::{Fault, FaultyBackend, Op};
use crate::{
    Error, ErrorKind, LockBackend, LockName, LockOptions, Locker, MemoryBackend, WaitMode,
};

fn named(err: &Error, lock: Option<&str>) {
    assert_eq!(err.backend(), Some("memory"), "{err}");
    assert_eq!(err.lock().map(LockName::as_str), lock, "{err}");
}

#[test]
fn every_locker_operation_names_the_backend_and_the_lock() {
    crate::tests::bounded(every_locker_operation_names_the_backend_and_the_lock_body);
}

async fn every_locker_operation_names_the_backend_and_the_lock_body() {
    let memory = MemoryBackend::new();
    let faulty = FaultyBackend::new(Arc::new(memory.clone()));
    let locker = Locker::new(Arc::new(faulty.clone()))
        .with_options(LockOptions::new(Duration::from_secs(8)).with_wait(WaitMode::TryOnce));
    // A bad name or prefix: refused before the backend is called, naming the backend.
    for err in [
        locker.try_acquire("").await.map(drop).expect_err("empty"),
        locker.inspect("").await.map(drop).expect_err("empty"),
        locker.break_lock("").await.map(drop).expect_err("empty"),
        locker.list("\u{1}").await.map(drop).expect_err("control"),
    ] {
        assert_eq!(err.kind(), ErrorKind::InvalidInput, "{err}");
        named(&err, None);
    }
    // A backend error: bare from the backend, named by the locker.
    faulty.set_all(Fault::Fail(ErrorKind::Unavailable));
    let name = LockName::new("job").expect("valid");
    let bare = faulty.inspect(&name).await.expect_err("failing");
    assert_eq!((bare.backend(), bare.lock()), (None, None), "{bare}");
    named(
        &locker.inspect("job").await.expect_err("failing"),
        Some("job"),
    );
    named(
        &locker
            .try_acquire("job")
            .await
            .map(drop)
            .expect_err("failing"),
        Some("job"),
    );
    // A refresh failure reaches the guard's error named as well.
    faulty.set_all(Fault::Pass);
    let guard = locker.acquire("job").await.expect("free");
    faulty.set(Op::Release, Fault::Fail(ErrorKind::Unavailable));
    named(&guard.release().await.expect_err("failing"), Some("job"));
    assert_eq!(faulty.calls(Op::Release), 1);
}
