//! Interoperability with etcd's own lock, through the real `etcdctl lock` (Go's
//! `concurrency.Mutex`): each side waits for the other.

mod common;

use std::path::PathBuf;
use std::process::Stdio;
use std::sync::Arc;
use std::time::Duration;

use lockcore::{LockBackend, LockName, LockOptions, Locker, WaitMode};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};
use tokio::time::{Instant, sleep, timeout};

/// `etcdctl lock <lock> <command…>` against `endpoints`, stdout piped.
fn etcdctl_lock(endpoints: &[String], lock: &str, command: &str) -> Child {
    Command::new("etcdctl")
        .env("ETCDCTL_API", "3")
        .arg(format!("--endpoints={}", endpoints.join(",")))
        .args(["lock", lock, "--", "sh", "-c", command])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("etcdctl (apt etcd-client) in PATH")
}

fn marker() -> PathBuf {
    std::env::temp_dir().join(format!("anylock-interop-{:016x}", common::rand_u64()))
}

/// While anylock holds X, `etcdctl lock <prefix>X` does not run its command; it runs it
/// once anylock releases, and its lock's revision is above anylock's fence token.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcdctl_waits_while_anylock_holds() {
    let Some(endpoints) = common::shared_endpoints() else {
        return;
    };
    let prefix = common::random_prefix("interop-a");
    let backend = Arc::new(common::backend(&endpoints, &prefix).await);
    let locker =
        Locker::new(backend.clone()).with_options(LockOptions::new(Duration::from_secs(30)));
    let guard = locker.acquire("report").await.expect("acquire");
    let ran = marker();
    let script = format!("touch {}; echo \"$ETCD_LOCK_REV\"", ran.display());
    let lock = backend.lock_prefix(&LockName::new("report").expect("name"));
    let mut child = etcdctl_lock(&endpoints, lock.trim_end_matches('/'), &script);
    sleep(Duration::from_secs(2)).await;
    assert!(
        child.try_wait().expect("poll").is_none(),
        "etcdctl finished while we held the lock"
    );
    assert!(
        !ran.exists(),
        "etcdctl ran its command while anylock held the lock"
    );
    let mut raw = common::raw(&endpoints).await;
    let queued = common::keys_under(&mut raw, &lock).await;
    assert_eq!(
        queued.len(),
        2,
        "etcdctl should be queued behind us: {queued:?}"
    );
    assert!(guard.is_held(), "{}", guard.state());
    let token = guard.fence_token().expect("token").get();
    guard.release().await.expect("release");
    let output = timeout(Duration::from_secs(15), child.wait_with_output())
        .await
        .expect("etcdctl did not get the lock after our release")
        .expect("etcdctl output");
    assert!(output.status.success(), "{output:?}");
    assert!(ran.exists());
    let _ = std::fs::remove_file(&ran);
    let rev: u64 = String::from_utf8_lossy(&output.stdout)
        .trim()
        .parse()
        .expect("ETCD_LOCK_REV");
    assert!(
        rev > token,
        "etcdctl's revision {rev} is not above our token {token}"
    );
}

/// While `etcdctl lock X -- sleep` holds X, anylock sees the holder, a try-once fails, and
/// a waiting acquire gets the lock only after etcdctl's command has finished.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn anylock_waits_while_etcdctl_holds() {
    let Some(endpoints) = common::shared_endpoints() else {
        return;
    };
    let prefix = common::random_prefix("interop-b");
    let backend = Arc::new(common::backend(&endpoints, &prefix).await);
    let name = LockName::new("nightly").expect("name");
    let lock = backend.lock_prefix(&name);
    let done = marker();
    let script = format!("echo locked; sleep 3; touch {}", done.display());
    let mut child = etcdctl_lock(&endpoints, lock.trim_end_matches('/'), &script);
    let mut lines = BufReader::new(child.stdout.take().expect("stdout")).lines();
    let first = timeout(Duration::from_secs(15), lines.next_line()).await;
    assert_eq!(
        first
            .expect("etcdctl never got the free lock")
            .expect("read")
            .as_deref(),
        Some("locked")
    );
    let holder = backend
        .inspect(&name)
        .await
        .expect("inspect")
        .expect("etcdctl holds it");
    assert!(
        holder.owner().as_str().starts_with("etcd-lease/"),
        "{}",
        holder.owner()
    );
    let options = LockOptions::new(Duration::from_secs(30));
    let locker = Locker::new(backend.clone()).with_options(options.clone());
    assert!(
        locker.try_acquire(&name).await.expect("call").is_none(),
        "got a lock etcdctl holds"
    );
    let waiting = options.with_wait(WaitMode::Timeout(Duration::from_secs(30)));
    let started = Instant::now();
    let guard = locker
        .acquire_with(&name, &waiting)
        .await
        .expect("acquire after etcdctl");
    let waited = started.elapsed();
    assert!(
        done.exists(),
        "anylock got the lock before etcdctl's command finished ({waited:?})"
    );
    assert!(waited >= Duration::from_secs(2), "waited only {waited:?}");
    assert!(guard.fence_token().expect("token") > holder.token().expect("token"));
    guard.release().await.expect("release");
    let status = timeout(Duration::from_secs(10), child.wait())
        .await
        .expect("etcdctl exits");
    assert!(status.expect("status").success());
    let _ = std::fs::remove_file(&done);
}

/// anylock and etcdctl waiters share one FIFO queue: with anylock holding, an anylock
/// waiter queued before an `etcdctl lock` waiter gets the lock first, and one queued after
/// it gets the lock only once etcdctl's command has finished.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn anylock_and_etcdctl_waiters_are_served_in_queue_order() {
    let Some(endpoints) = common::shared_endpoints() else {
        return;
    };
    let prefix = common::random_prefix("interop-fifo");
    let backend = Arc::new(common::backend(&endpoints, &prefix).await);
    let lock = backend.lock_prefix(&LockName::new("queue").expect("name"));
    let mut raw = common::raw(&endpoints).await;
    let locker =
        Locker::new(backend.clone()).with_options(LockOptions::new(Duration::from_secs(30)));
    let holder = locker.acquire("queue").await.expect("acquire");
    let first = locker.clone();
    let first = tokio::spawn(async move { first.acquire("queue").await });
    queued(&mut raw, &lock, 2).await;
    let (ran, done) = (marker(), marker());
    let script = format!("touch {}; sleep 2; touch {}", ran.display(), done.display());
    let mut child = etcdctl_lock(&endpoints, lock.trim_end_matches('/'), &script);
    queued(&mut raw, &lock, 3).await;
    let second = locker.clone();
    let second = tokio::spawn(async move { second.acquire("queue").await });
    queued(&mut raw, &lock, 4).await;
    holder.release().await.expect("release");
    let first = timeout(Duration::from_secs(10), first)
        .await
        .expect("the first anylock waiter did not get the lock")
        .expect("task")
        .expect("acquire");
    sleep(Duration::from_secs(1)).await;
    assert!(!ran.exists(), "etcdctl ran while the first waiter held");
    assert!(!second.is_finished(), "the second waiter jumped etcdctl");
    first.release().await.expect("release");
    let second = timeout(Duration::from_secs(15), second)
        .await
        .expect("the second anylock waiter did not get the lock")
        .expect("task")
        .expect("acquire");
    assert!(ran.exists(), "etcdctl never ran");
    assert!(
        done.exists(),
        "the second waiter got the lock while etcdctl held it"
    );
    second.release().await.expect("release");
    let status = timeout(Duration::from_secs(10), child.wait()).await;
    assert!(status.expect("etcdctl exits").expect("status").success());
    for file in [ran, done] {
        let _ = std::fs::remove_file(file);
    }
}

/// Waits (up to 5 s) until `count` keys are queued under `lock`.
async fn queued(raw: &mut common::raw::Raw, lock: &str, count: usize) {
    let deadline = Instant::now() + Duration::from_secs(5);
    while common::keys_under(raw, lock).await.len() != count {
        assert!(
            Instant::now() < deadline,
            "{count} keys never queued under {lock}"
        );
        sleep(Duration::from_millis(20)).await;
    }
}
