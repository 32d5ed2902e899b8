//! Another boot sharing the store (another host over NFS, another sandbox on a shared
//! volume, or this machine before a reboot), played by a backend with a host of its own:
//! its leases hold until their wall-clock expiry, and are never judged dead early.

use std::sync::Arc;
use std::sync::atomic::{AtomicI64, Ordering};

use lockcore::{Acquire, AcquireRequest, Identity, LockBackend, LockName, Permits, Ttl};

use super::*;
use crate::host::{Host, SystemHost};

const TTL: Duration = Duration::from_secs(60);

/// A machine of its own: a boot id, a monotonic clock `mono_offset_ms` away from ours
/// (another boot's clock has nothing to do with ours), and a wall clock tests move.
#[derive(Debug)]
struct Machine {
    boot: &'static str,
    mono_offset_ms: i64,
    wall_offset_ms: AtomicI64,
}

impl Machine {
    fn new(boot: &'static str, mono_offset_ms: i64) -> Arc<Self> {
        Arc::new(Self {
            boot,
            mono_offset_ms,
            wall_offset_ms: AtomicI64::new(0),
        })
    }

    /// Moves this machine's wall clock to `secs` after the real one.
    fn wall_at(&self, secs: i64) {
        self.wall_offset_ms.store(secs * 1000, Ordering::SeqCst);
    }
}

impl Host for Machine {
    fn boot_id(&self) -> &str {
        self.boot
    }

    fn monotonic_ms(&self) -> Option<i64> {
        SystemHost.monotonic_ms().map(|ms| ms + self.mono_offset_ms)
    }

    fn boottime_ms(&self) -> Option<i64> {
        SystemHost.boottime_ms().map(|ms| ms + self.mono_offset_ms)
    }

    fn wall_ms(&self) -> i64 {
        SystemHost.wall_ms() + self.wall_offset_ms.load(Ordering::SeqCst)
    }
}

/// A fresh store shared by two boots.
struct Boots {
    dir: std::path::PathBuf,
    /// Our machine, and our backend on it.
    here: Arc<Machine>,
    ours: LocalBackend,
    /// The other boot's machine, and its backend.
    other: Arc<Machine>,
    theirs: LocalBackend,
}

/// Our machine and another boot's, on one fresh store. The other boot's monotonic clock
/// is far behind ours, so its expiries look long past on our clock.
async fn two_boots() -> Boots {
    let dir = std::env::temp_dir().join(format!("anylock-boots-{:016x}", rand::random::<u64>()));
    let config = LocalConfig::new(dir.join("locks.sqlite3"));
    let here = Machine::new("this-boot", 0);
    let ours = LocalBackend::connect_on(config.clone(), here.clone())
        .await
        .expect("open");
    let other = Machine::new("another-boot", -1_000_000_000);
    let theirs = LocalBackend::connect_on(config, other.clone())
        .await
        .expect("open");
    Boots {
        dir,
        here,
        ours,
        other,
        theirs,
    }
}

/// The holder's process on the other boot is gone from our view: its liveness files are
/// unlocked (a kernel lock of another kernel proves nothing here either way).
fn unlock_liveness(backend: &LocalBackend) {
    for (_, held) in backend.held().drain() {
        held.unlock_only();
    }
}

fn request(name: &str, permits: Option<u32>) -> AcquireRequest {
    let request = AcquireRequest::new(
        LockName::new(name).expect("valid"),
        Identity::unique(),
        Ttl::new(TTL).expect("valid TTL"),
    );
    match permits {
        Some(n) => request.with_permits(Permits::new(n).expect("valid")),
        None => request,
    }
}

async fn attempt(backend: &LocalBackend, name: &str, permits: Option<u32>) -> Acquire {
    let request = request(name, permits);
    let attempt = match permits {
        Some(_) => backend.acquire_permit(&request).await,
        None => backend.acquire(&request).await,
    };
    attempt.expect("one attempt")
}

async fn granted(backend: &LocalBackend, name: &str, permits: Option<u32>) -> Lease {
    match attempt(backend, name, permits).await {
        Acquire::Acquired(lease) => lease,
        Acquire::Held(holder) => panic!("{name} is held by {holder:?}"),
    }
}

/// Asserts that our attempt on `name` at our wall clock `secs` from now finds it held.
async fn held_at(here: &Machine, ours: &LocalBackend, name: &str, permits: Option<u32>, secs: i64) {
    here.wall_at(secs);
    if let Acquire::Acquired(lease) = attempt(ours, name, permits).await {
        panic!(
            "{name} taken (token {:?}) from another boot's live lease at +{secs} s of its \
             {TTL:?} TTL on the wall clock",
            lease.token()
        );
    }
}

/// Guards against another boot's row counting as free (hosts sharing a home directory over
/// NFS took each other's live leases every time), and against a liveness probe judging a
/// holder of another kernel dead: the lease holds until its wall-clock expiry, then goes.
#[tokio::test]
async fn another_boots_lock_holds_until_its_wall_clock_expiry() {
    let Boots {
        dir,
        here,
        ours,
        theirs,
        ..
    } = two_boots().await;
    let lease = granted(&theirs, "job", None).await;
    unlock_liveness(&theirs);
    held_at(&here, &ours, "job", None, 0).await;
    let name = LockName::new("job").expect("valid");
    let shown = ours.inspect(&name).await.expect("inspect").expect("held");
    assert_eq!(shown.owner(), lease.owner());
    let left = shown.expires_in().expect("an expiry");
    assert!(
        left > TTL - Duration::from_secs(5) && left <= TTL,
        "{left:?}"
    );
    assert_eq!(ours.list("").await.expect("list").len(), 1, "listed");
    held_at(&here, &ours, "job", None, 59).await;
    here.wall_at(61);
    let taken = granted(&ours, "job", None).await;
    assert!(taken.token() > lease.token());
    let _ = std::fs::remove_dir_all(&dir);
}

/// As for a lock, for a semaphore's permit: another boot's live permit keeps its place
/// until its wall-clock expiry, dead or not as far as our kernel can tell.
#[tokio::test]
async fn another_boots_permit_holds_until_its_wall_clock_expiry() {
    let Boots {
        dir,
        here,
        ours,
        theirs,
        ..
    } = two_boots().await;
    let lease = granted(&theirs, "jobs", Some(1)).await;
    unlock_liveness(&theirs);
    held_at(&here, &ours, "jobs", Some(1), 0).await;
    let name = LockName::new("jobs").expect("valid");
    let shown = ours.inspect_permits(&name).await.expect("inspect");
    assert_eq!(shown.len(), 1, "{shown:?}");
    held_at(&here, &ours, "jobs", Some(1), 59).await;
    here.wall_at(61);
    let taken = granted(&ours, "jobs", Some(1)).await;
    assert!(taken.token() > lease.token());
    let _ = std::fs::remove_dir_all(&dir);
}

/// A refresh on the other boot, alone or batched, moves the wall-clock expiry on too: a
/// refresh that only moved the expiry on its own boot's clock would let the lease go at
/// its first TTL.
#[tokio::test]
async fn another_boots_refresh_extends_its_wall_clock_expiry() {
    let Boots {
        dir,
        here,
        ours,
        other,
        theirs,
    } = two_boots().await;
    let alone = granted(&theirs, "alone", None).await;
    let batched = granted(&theirs, "batched", None).await;
    let permit = granted(&theirs, "permit", Some(2)).await;
    other.wall_at(50);
    theirs.refresh(&alone).await.expect("refreshed");
    for result in theirs.refresh_many(&[batched, permit]).await {
        result.expect("refreshed");
    }
    for (name, permits) in [("alone", None), ("batched", None), ("permit", Some(2))] {
        if permits.is_some() {
            // One of the two places is free: take it, so that only the other boot's
            // permit stands between the next attempt and a place.
            granted(&ours, name, permits).await;
        }
        held_at(&here, &ours, name, permits, 61).await;
        held_at(&here, &ours, name, permits, 109).await;
    }
    here.wall_at(111);
    for (name, permits) in [("alone", None), ("batched", None), ("permit", Some(2))] {
        granted(&ours, name, permits).await;
    }
    let _ = std::fs::remove_dir_all(&dir);
}
