//! A release or detach whose backend call lockcore drops at its own bound (before etcd's
//! request timeout fires) still has its key deleted later (`src/stragglers.rs`): the key
//! is recorded before the first request. Both tests are the second hostile review's, and
//! failed (the lock still taken after 3 TTLs) while keys were recorded only when the
//! backend call itself returned an error.

mod common;

use std::sync::Arc;
use std::time::Duration;

use backend_etcd::{EtcdBackend, EtcdConfig};
use lockcore::{
    Acquire, AcquireRequest, ErrorKind, Identity, Lease, LockBackend, LockName, LockOptions,
    Locker, Ttl, WaitMode,
};
use test_kit::proxy::{Fault, FaultProxy};
use tokio::time::Instant;

async fn proxied(prefix: &str) -> (EtcdBackend, Vec<FaultProxy>, Vec<String>) {
    let endpoints = common::shared_endpoints().expect("endpoints");
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
    // Default request timeout (5 s).
    let config = EtcdConfig::new(&urls)
        .expect("endpoints")
        .with_prefix(prefix);
    (
        EtcdBackend::connect(config).await.expect("connect"),
        proxies,
        endpoints,
    )
}

async fn grant(backend: &EtcdBackend, lock: &str, ttl: Duration) -> Lease {
    let req = AcquireRequest::new(
        LockName::new(lock).unwrap(),
        Identity::unique(),
        Ttl::new(ttl).unwrap(),
    );
    match backend.acquire(&req).await.expect("acquire") {
        Acquire::Acquired(lease) => lease,
        Acquire::Held(_) => panic!("held"),
    }
}

fn keep_refreshing(backend: &EtcdBackend, lease: Lease) -> tokio::task::JoinHandle<()> {
    let backend = backend.clone();
    tokio::spawn(async move {
        loop {
            let r = backend.refresh(&lease).await;
            if matches!(&r, Err(e) if e.kind() == ErrorKind::Lost) {
                panic!("the other lock was lost: {r:?}");
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    })
}

async fn freed_within(
    endpoints: &[String],
    prefix: &str,
    ttl: Duration,
    started: Instant,
    bound: Duration,
) -> Option<Duration> {
    let rival = common::backend(endpoints, prefix).await;
    let rival = Locker::new(Arc::new(rival))
        .with_options(LockOptions::new(ttl).with_wait(WaitMode::TryOnce));
    while started.elapsed() < bound {
        if let Some(g) = rival.try_acquire("victim").await.expect("call") {
            g.release().await.expect("release");
            return Some(started.elapsed());
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    None
}

/// TTL 6 s, attempt timeout 2 s: lockcore bounds the release at 2 s, etcd's call at 5 s.
#[tokio::test]
async fn a_release_dropped_by_lockcore_is_swept() {
    if common::shared_endpoints().is_none() {
        return;
    }
    let prefix = common::random_prefix("swept-release");
    let (backend, proxies, endpoints) = proxied(&prefix).await;
    let ttl = Duration::from_secs(6);
    let other = grant(&backend, "other", ttl).await;
    let options = LockOptions::new(ttl)
        .with_wait(WaitMode::TryOnce)
        .with_attempt_timeout(Duration::from_secs(2));
    let locker = Locker::new(Arc::new(backend.clone())).with_options(options);
    let victim = locker
        .try_acquire("victim")
        .await
        .expect("call")
        .expect("free");
    proxies.iter().for_each(|p| p.set_fault(Fault::Blackhole));
    let started = Instant::now();
    let released = victim.release().await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    proxies.iter().for_each(|p| p.set_fault(Fault::Pass));
    assert!(released.is_err());
    let refresher = keep_refreshing(&backend, other.clone());
    let freed = freed_within(&endpoints, &prefix, ttl, started, ttl * 3).await;
    refresher.abort();
    backend.release(&other).await.ok();
    assert!(
        freed.is_some(),
        "a {ttl:?} lock whose release timed out in lockcore is still taken {:?} later",
        started.elapsed()
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
    let prefix = common::random_prefix("swept-detach");
    let (backend, proxies, endpoints) = proxied(&prefix).await;
    let ttl = Duration::from_secs(8);
    let other = grant(&backend, "other", ttl).await;
    let locker = Locker::new(Arc::new(backend.clone()))
        .with_options(LockOptions::new(ttl).with_wait(WaitMode::TryOnce));
    let victim = locker
        .try_acquire("victim")
        .await
        .expect("call")
        .expect("free");
    proxies.iter().for_each(|p| p.set_fault(Fault::Blackhole));
    let started = Instant::now();
    let detached = victim.detach().await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    proxies.iter().for_each(|p| p.set_fault(Fault::Pass));
    assert!(detached.is_err());
    let refresher = keep_refreshing(&backend, other.clone());
    let freed = freed_within(&endpoints, &prefix, ttl, started, ttl * 3).await;
    refresher.abort();
    backend.release(&other).await.ok();
    let freed = freed.unwrap_or_else(|| {
        panic!(
            "a {ttl:?} lock whose detach timed out in lockcore is still taken {:?} later",
            started.elapsed()
        )
    });
    assert!(
        freed >= ttl,
        "a detached {ttl:?} lock was freed after {freed:?}"
    );
}
