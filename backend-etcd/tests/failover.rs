//! Killing the etcd leader while a lock is held, on a private 3-member cluster (the shared
//! cluster must never be disturbed). The holder stays held (Healthy, or Degraded and back)
//! with the same fence token, nobody else gets the lock meanwhile, new acquires work after
//! the election with a greater token, and the killed member rejoins and catches up.

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

use lockcore::{Health, LockBackend, LockGuard, LockOptions, Locker};
use test_kit::servers::Etcd;
use tokio::task::JoinHandle;
use tokio::time::{Instant, sleep};

const PORTS: [(u16, u16); 3] = [(27592, 27692), (27593, 27693), (27594, 27694)];

/// Records every health state the guard goes through.
fn record(guard: &LockGuard) -> JoinHandle<Vec<Health>> {
    let mut rx = guard.health();
    tokio::spawn(async move {
        let mut seen = vec![rx.borrow_and_update().clone()];
        while rx.changed().await.is_ok() {
            let health = rx.borrow_and_update().clone();
            let done = health.is_terminal();
            seen.push(health);
            if done {
                break;
            }
        }
        seen
    })
}

/// Try-acquires `name` every 50 ms until `stop`, counting grants (there must be none).
fn rival(backend: Arc<dyn LockBackend>, stop: Arc<AtomicBool>) -> JoinHandle<(usize, usize)> {
    tokio::spawn(async move {
        let locker = Locker::new(backend).with_options(LockOptions::new(Duration::from_secs(5)));
        let (grants, errors) = (AtomicUsize::new(0), AtomicUsize::new(0));
        while !stop.load(Ordering::SeqCst) {
            match locker.try_acquire("critical").await {
                Ok(Some(guard)) => {
                    grants.fetch_add(1, Ordering::SeqCst);
                    let _ = guard.release().await;
                }
                Ok(None) => {}
                Err(_) => {
                    errors.fetch_add(1, Ordering::SeqCst);
                }
            }
            sleep(Duration::from_millis(50)).await;
        }
        (grants.into_inner(), errors.into_inner())
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killing_the_leader_keeps_the_lock_held() {
    if common::shared_endpoints().is_none() {
        return;
    }
    let mut cluster = Etcd::start(&PORTS, false).await;
    let endpoints = cluster.endpoints();
    let backend = Arc::new(common::backend(&endpoints, "failover/").await);
    let options = LockOptions::new(Duration::from_secs(20));
    let (ttl, interval) = (options.ttl(), options.refresh_interval());
    let locker = Locker::new(backend.clone()).with_options(options.clone());
    let guard = locker.acquire("critical").await.expect("acquire");
    let token = guard.fence_token().expect("token");
    let history = record(&guard);
    let stop = Arc::new(AtomicBool::new(false));
    let other = Arc::new(common::backend(&endpoints, "failover/").await);
    let rival = rival(other, stop.clone());

    let leader = cluster.leader().await.expect("a leader");
    let killed_at = Instant::now();
    cluster.kill(leader);
    let new_leader = cluster.leader().await.expect("a leader");
    assert_ne!(new_leader, leader);
    println!("new leader after {:?}", killed_at.elapsed());
    // A refresh must succeed after the kill: wait until the last success is more recent
    // than the kill, seen as more validity left than a refresh made before it could leave.
    sleep((interval * 3 / 2).saturating_sub(killed_at.elapsed())).await;
    let refreshed = common::eventually(interval * 4, || {
        guard.remaining_validity() > ttl.saturating_sub(interval * 3 / 2)
    })
    .await;
    assert!(
        guard.is_held(),
        "lost the lock in the failover: {}",
        guard.state()
    );
    assert!(
        refreshed,
        "no successful refresh after the leader was killed: {}",
        guard.state()
    );
    assert_eq!(guard.fence_token(), Some(token), "the fence token changed");
    let holder = backend
        .inspect(guard.name())
        .await
        .expect("inspect")
        .expect("held");
    assert_eq!(holder.owner(), guard.lease().owner());
    assert_eq!(holder.token(), Some(token));

    stop.store(true, Ordering::SeqCst);
    let (grants, errors) = rival.await.expect("rival");
    assert_eq!(
        grants, 0,
        "a second holder got the lock during the failover"
    );
    guard.release().await.expect("release");
    let history = history.await.expect("recorder");
    println!("holder health: {history:?}; rival errors: {errors}");
    assert!(
        !history.iter().any(|h| matches!(h, Health::Lost(_))),
        "the holder went Lost: {history:?}"
    );

    let next = locker
        .acquire("critical")
        .await
        .expect("acquire after the election");
    assert!(next.fence_token().expect("token") > token);

    cluster.restart(leader);
    cluster.wait_healthy(Duration::from_secs(30)).await;
    let mut rejoined = common::raw(&[cluster.endpoint(leader)]).await;
    let key = backend.lock_prefix(next.name());
    let mut caught_up = false;
    for _ in 0..100 {
        let resp = rejoined.by_creation(&key, 0, true).await;
        if let Ok(kvs) = resp
            && kvs.first().map(|kv| kv.create_revision)
                == next.fence_token().map(|t| t.get() as i64)
        {
            caught_up = true;
            break;
        }
        sleep(Duration::from_millis(100)).await;
    }
    assert!(
        caught_up,
        "the restarted member never saw the lock taken after its death"
    );
    next.release().await.expect("release");
}
