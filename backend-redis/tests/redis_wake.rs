//! No waiter misses its wake: every interleaving of a waiter's subscribe and attempt with
//! the holder's release, on one server and over Redlock, with a holder TTL long enough that
//! only a notification can wake the waiter in time. (The guard for any release that would
//! publish only when someone may be waiting.)

mod common;

use std::time::Duration;

use backend_redis::{RedisBackend, RedisConfig, RedlockBackend, RedlockConfig};
use futures_util::StreamExt;
use lockcore::{Acquire, AcquireRequest, Identity, LockBackend, LockName, ReleaseEvents, Ttl};
use tokio::time::timeout;

/// Far longer than any wake takes; a waiter still asleep then missed its notification.
const WAKE_BOUND: Duration = Duration::from_secs(5);

async fn redis_on(url: &str) -> RedisBackend {
    let config = RedisConfig::from_url(url)
        .expect("valid URL")
        .with_prefix(common::random_prefix("wake"))
        .with_timeout(Duration::from_secs(2));
    RedisBackend::connect(config).await.expect("connect")
}

fn request(name: &LockName, ttl: Duration) -> AcquireRequest {
    AcquireRequest::new(
        name.clone(),
        Identity::unique(),
        Ttl::new(ttl).expect("valid TTL"),
    )
}

async fn events(backend: &dyn LockBackend, name: &LockName) -> ReleaseEvents {
    (backend.subscribe(name).await)
        .expect("subscribe")
        .expect("notifications")
}

async fn refused(backend: &dyn LockBackend, request: &AcquireRequest) {
    match backend.acquire(request).await.expect("acquire") {
        Acquire::Held(_) => {}
        Acquire::Acquired(lease) => panic!("granted while held: {lease:?}"),
    }
}

/// The order of one waiter's steps around the holder's release.
#[derive(Debug, Clone, Copy)]
enum Order {
    /// Subscribe, attempt (refused), then the release.
    SubscribeAttemptRelease,
    /// Attempt (refused), subscribe, then the release.
    AttemptSubscribeRelease,
    /// Subscribe, the release, then the attempt (granted: no wake needed).
    SubscribeReleaseAttempt,
    /// Subscribe and attempt concurrently with the release.
    Racing,
}

/// One holder and one waiter on a fresh name, in `order`: the waiter ends up holding the
/// lock, and when its attempt was refused, a notification woke it (the holder's TTL is
/// 30 s and nothing else wakes it within [`WAKE_BOUND`]).
async fn one_handoff(backend: &dyn LockBackend, order: Order) {
    let name = common::fresh_name("handoff");
    let ttl = Duration::from_secs(30);
    let holder = common::take(backend, &request(&name, ttl)).await;
    let waiter = request(&name, ttl);
    let mut woken = match order {
        Order::SubscribeAttemptRelease => {
            let woken = events(backend, &name).await;
            refused(backend, &waiter).await;
            backend.release(&holder).await.expect("release");
            Some(woken)
        }
        Order::AttemptSubscribeRelease => {
            refused(backend, &waiter).await;
            let woken = events(backend, &name).await;
            backend.release(&holder).await.expect("release");
            Some(woken)
        }
        Order::SubscribeReleaseAttempt => {
            let _woken = events(backend, &name).await;
            backend.release(&holder).await.expect("release");
            None
        }
        Order::Racing => {
            let release = async {
                tokio::task::yield_now().await;
                backend.release(&holder).await.expect("release");
            };
            let wait = async {
                let woken = events(backend, &name).await;
                match backend.acquire(&waiter).await.expect("acquire") {
                    Acquire::Acquired(lease) => Err(lease),
                    Acquire::Held(_) => Ok(woken),
                }
            };
            let ((), attempt) = tokio::join!(release, wait);
            match attempt {
                Ok(woken) => Some(woken),
                Err(lease) => {
                    backend.release(&lease).await.expect("release");
                    return;
                }
            }
        }
    };
    if let Some(woken) = woken.as_mut() {
        let got = timeout(WAKE_BOUND, woken.next()).await;
        assert_eq!(
            got.ok().flatten(),
            Some(()),
            "{order:?}: the waiter was refused and its holder released, but no notification came"
        );
    }
    let lease = common::take(backend, &waiter).await;
    backend.release(&lease).await.expect("release");
}

async fn every_order(backend: &dyn LockBackend, racing: usize) {
    for order in [
        Order::SubscribeAttemptRelease,
        Order::AttemptSubscribeRelease,
        Order::SubscribeReleaseAttempt,
    ] {
        one_handoff(backend, order).await;
    }
    for _ in 0..racing {
        one_handoff(backend, Order::Racing).await;
    }
}

/// Every order of a waiter's subscribe and attempt with the holder's release: a refused
/// waiter is always woken.
#[tokio::test]
async fn a_refused_waiter_is_woken_whatever_the_order() {
    let Some(url) = common::redis_url() else {
        return;
    };
    every_order(&redis_on(&url).await, 100).await;
}

/// The same over Redlock.
#[tokio::test]
async fn a_refused_redlock_waiter_is_woken_whatever_the_order() {
    let Some(urls) = common::redlock_urls() else {
        return;
    };
    let config = RedlockConfig::from_node_urls(&urls)
        .expect("valid URLs")
        .with_prefix(common::random_prefix("wake-redlock"));
    let backend = RedlockBackend::connect(config).await.expect("connect");
    every_order(&backend, 30).await;
}
