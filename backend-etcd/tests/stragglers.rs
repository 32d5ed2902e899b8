//! A lock on a session lease whose release or detach never got its answer (a network
//! blip, or lockcore dropping the call at its own bound, before etcd's request timeout
//! fires) still has its key deleted later (`src/stragglers.rs`): the key is recorded
//! before the first request, and the next refresh of another lock on the session sweeps
//! it. Without that the key lived as long as the session, which the process's other locks
//! keep alive: every test here failed (the lock still taken after 3 TTLs) while keys were
//! never recorded, and the last two while they were recorded only when the backend call
//! itself returned an error (the hostile reviews' cases).

mod common;

use std::sync::Arc;
use std::time::Duration;

use backend_etcd::{EtcdBackend, EtcdConfig};
use lockcore::{
    Acquire, AcquireRequest, ErrorKind, Identity, LockBackend, LockGuard, LockName, LockOptions,
    Locker, Ttl, WaitMode,
};
use test_kit::proxy::{Fault, FaultProxy};
use tokio::time::Instant;

/// One scenario: a backend behind fault proxies (etcd's request timeout `request_timeout`)
/// holds "other" (refreshed every 500 ms, as a keeper would, once the blackout is over)
/// and "victim" through a `Locker` with `options`. The proxies drop everything for
/// `blackout` while `end` runs on the victim's guard, which must fail. Returns how long
/// after `end` began a rival could take "victim" (within 3 TTLs), if it could.
async fn victim_freed_after<F, Fut, T>(
    tag: &str,
    request_timeout: Duration,
    options: LockOptions,
    blackout: Duration,
    end: F,
) -> Option<Duration>
where
    F: FnOnce(LockGuard) -> Fut,
    Fut: Future<Output = lockcore::Result<T>> + Send + 'static,
    T: Send + 'static,
{
    let endpoints = common::shared_endpoints().expect("endpoints");
    let prefix = common::random_prefix(tag);
    let mut proxies = Vec::new();
    for endpoint in &endpoints {
        let upstream: std::net::SocketAddr = test_kit::env::host_port(endpoint)
            .expect("host:port")
            .parse()
            .expect("addr");
        proxies.push(FaultProxy::start(upstream).await.expect("proxy"));
    }
    let urls: Vec<String> = proxies
        .iter()
        .map(|p| format!("http://{}", p.local_addr()))
        .collect();
    let config = EtcdConfig::new(&urls)
        .expect("endpoints")
        .with_prefix(&prefix)
        .with_request_timeout(request_timeout);
    let backend = EtcdBackend::connect(config).await.expect("connect");
    let ttl = options.ttl();
    let request = AcquireRequest::new(
        LockName::new("other").expect("valid"),
        Identity::unique(),
        Ttl::new(ttl).expect("valid"),
    );
    let Acquire::Acquired(other) = backend.acquire(&request).await.expect("acquire") else {
        panic!("other is held");
    };
    let locker = Locker::new(Arc::new(backend.clone())).with_options(options.clone());
    let victim = locker
        .try_acquire("victim")
        .await
        .expect("call")
        .expect("free");

    proxies.iter().for_each(|p| p.set_fault(Fault::Blackhole));
    let started = Instant::now();
    let ended = tokio::spawn(end(victim));
    tokio::time::sleep(blackout).await;
    proxies.iter().for_each(|p| p.set_fault(Fault::Pass));
    let ended = ended.await.expect("task");
    assert!(ended.is_err(), "the call got through the blackout");

    let refresher = {
        let (backend, other) = (backend.clone(), other.clone());
        tokio::spawn(async move {
            loop {
                let r = backend.refresh(&other).await;
                if matches!(&r, Err(e) if e.kind() == ErrorKind::Lost) {
                    panic!("the other lock was lost: {r:?}");
                }
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
        })
    };
    let rival = Locker::new(Arc::new(common::backend(&endpoints, &prefix).await))
        .with_options(LockOptions::new(ttl).with_wait(WaitMode::TryOnce));
    let mut freed = None;
    while started.elapsed() < ttl * 3 {
        if let Some(guard) = rival.try_acquire("victim").await.expect("call") {
            freed = Some(started.elapsed());
            guard.release().await.expect("release");
            break;
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    let refresher_alive = !refresher.is_finished();
    refresher.abort();
    backend.release(&other).await.ok();
    assert!(refresher_alive, "the other lock's refresher stopped");
    freed
}

/// A release lost to a 1.5 s blackhole: etcd's 1 s request timeout fails it.
#[tokio::test]
async fn a_release_lost_to_a_blip_is_retried_while_the_session_lives() {
    if common::shared_endpoints().is_none() {
        return;
    }
    let ttl = Duration::from_secs(4);
    let options = LockOptions::new(ttl).with_wait(WaitMode::TryOnce);
    let freed = victim_freed_after(
        "swept-blip",
        Duration::from_secs(1),
        options,
        Duration::from_millis(1_500),
        |guard| guard.release(),
    )
    .await;
    assert!(
        freed.is_some(),
        "a {ttl:?} lock whose release was lost is still taken"
    );
}

/// TTL 6 s, attempt timeout 2 s: lockcore bounds the release at 2 s, etcd's call at 5 s.
#[tokio::test]
async fn a_release_dropped_by_lockcore_is_swept() {
    if common::shared_endpoints().is_none() {
        return;
    }
    let ttl = Duration::from_secs(6);
    let options = LockOptions::new(ttl)
        .with_wait(WaitMode::TryOnce)
        .with_attempt_timeout(Duration::from_secs(2));
    let freed = victim_freed_after(
        "swept-release",
        Duration::from_secs(5),
        options,
        Duration::from_millis(2_500),
        |guard| guard.release(),
    )
    .await;
    assert!(
        freed.is_some(),
        "a {ttl:?} lock whose release timed out in lockcore is still taken"
    );
}

/// TTL 8 s, default options: `detach` is bounded by the refresh timeout (TTL/8 = 1 s),
/// shorter than etcd's 5 s request timeout. The contract says a failed detach leaves the
/// lease to expire by the TTL it had: the key is deleted once that TTL has run out (not
/// sooner: a detached lock is never freed early).
#[tokio::test]
async fn a_detach_dropped_by_lockcore_is_swept_after_its_ttl() {
    if common::shared_endpoints().is_none() {
        return;
    }
    let ttl = Duration::from_secs(8);
    let options = LockOptions::new(ttl).with_wait(WaitMode::TryOnce);
    let freed = victim_freed_after(
        "swept-detach",
        Duration::from_secs(5),
        options,
        Duration::from_millis(1_500),
        |guard| guard.detach(),
    )
    .await;
    let freed =
        freed.unwrap_or_else(|| panic!("a {ttl:?} lock whose detach timed out is still taken"));
    assert!(
        freed >= ttl,
        "a detached {ttl:?} lock was freed after {freed:?}"
    );
}
