//! A machine suspend, replayed on injected kernel clocks: suspend moves `CLOCK_BOOTTIME`
//! on and leaves `CLOCK_MONOTONIC` (and with it the guard's tokio clock) where it was.

use std::sync::Arc;
use std::sync::atomic::{AtomicI64, Ordering};
use std::time::Duration;

use lockcore::{LockOptions, Locker, WaitMode};

use crate::host::{Host, SystemHost};
use crate::{LocalBackend, LocalConfig};

/// The real clocks, plus the time this fake machine spent suspended.
#[derive(Debug, Default)]
struct SuspendableClocks {
    suspended_ms: AtomicI64,
}

impl SuspendableClocks {
    /// The machine sleeps for `d`: what the kernel clocks show after the resume.
    fn suspend(&self, d: Duration) {
        let ms = i64::try_from(d.as_millis()).expect("short");
        self.suspended_ms.fetch_add(ms, Ordering::SeqCst);
    }

    fn suspended(&self) -> i64 {
        self.suspended_ms.load(Ordering::SeqCst)
    }
}

impl Host for SuspendableClocks {
    fn boot_id(&self) -> &str {
        SystemHost.boot_id()
    }

    fn monotonic_ms(&self) -> Option<i64> {
        SystemHost.monotonic_ms()
    }

    fn boottime_ms(&self) -> Option<i64> {
        SystemHost.boottime_ms().map(|ms| ms + self.suspended())
    }

    fn wall_ms(&self) -> i64 {
        SystemHost.wall_ms() + self.suspended()
    }
}

async fn open(path: &std::path::Path, clocks: &Arc<SuspendableClocks>) -> Arc<LocalBackend> {
    let backend = LocalBackend::connect_on(LocalConfig::new(path), clocks.clone())
        .await
        .expect("open");
    Arc::new(backend)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_a_suspend_longer_than_the_ttl_contenders_wait_while_the_holder_is_healthy() {
    let dir = std::env::temp_dir().join(format!("anylock-suspend-{:016x}", rand::random::<u64>()));
    let path = dir.join("locks.sqlite3");
    let clocks = Arc::new(SuspendableClocks::default());
    let options = LockOptions::new(Duration::from_secs(3)).with_wait(WaitMode::TryOnce);
    let holder = Locker::new(open(&path, &clocks).await).with_options(options.clone());
    let contender = Locker::new(open(&path, &clocks).await).with_options(options);
    let guard = holder.acquire("job").await.expect("free");

    let (boot, mono) = (clocks.boottime_ms(), clocks.monotonic_ms());
    clocks.suspend(Duration::from_secs(60));
    let boot_moved = clocks.boottime_ms().zip(boot).map(|(b, a)| b - a);
    let mono_moved = clocks.monotonic_ms().zip(mono).map(|(b, a)| b - a);
    assert!(boot_moved >= Some(60_000), "{boot_moved:?}");
    assert!(mono_moved < Some(10_000), "{mono_moved:?}");

    // Only the store's clocks were suspended here, not lockcore's: the guard's own
    // reading of a suspend is lockcore's concern (tests/suspend.rs there).
    assert!(guard.is_held(), "the guard's clock was left alone");
    let stolen = contender.try_acquire("job").await.expect("call");
    let healthy = guard.is_held();
    let _ = std::fs::remove_dir_all(&dir);
    if let Some(stolen) = stolen {
        panic!(
            "a contender got the lock (token {:?}) while the holder's guard says held \
             ({healthy}): the store's expiry counted the suspend",
            stolen.fence_token()
        );
    }
}
