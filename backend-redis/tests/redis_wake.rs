//! Release notifications are published only when someone may be waiting (a refused acquire
//! marked the lock), and no waiter misses its wake for that: every interleaving of a
//! waiter's subscribe and attempt with the holder's release, on one server and over Redlock;
//! the mark follows a holder that refreshes past its first TTL; calls counted on private
//! servers by `INFO commandstats` deltas.

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
/// waiter is always woken (the release sees the mark its refusal set).
#[tokio::test]
async fn a_refused_waiter_is_woken_whatever_the_order() {
    let Some(url) = common::redis_url() else {
        return;
    };
    every_order(&redis_on(&url).await, 100).await;
}

/// The same over Redlock: each node's release publishes where that node refused.
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

/// A holder that refreshes past the TTL it had when the waiter was refused: the mark set
/// then expires with that TTL, and the waiter's next attempt (lockcore's waiters retry no
/// later than the holder's expiry they were told) sets it again with the holder's current
/// TTL, so the final release still publishes.
#[tokio::test]
async fn the_mark_follows_a_holder_that_refreshes() {
    let Some(url) = common::redis_url() else {
        return;
    };
    let backend = redis_on(&url).await;
    let mut admin = common::admin(&url).await;
    let name = common::fresh_name("refreshing");
    let ttl = Duration::from_millis(600);
    let holder = common::take(&backend, &request(&name, ttl)).await;
    let waiter = request(&name, Duration::from_secs(30));
    let mut woken = events(&backend, &name).await;
    refused(&backend, &waiter).await;
    let wait_key = backend.keys(&name).wait().to_owned();
    let pttl = |admin: &mut redis::aio::MultiplexedConnection, key: String| {
        let mut admin = admin.clone();
        async move {
            redis::cmd("PTTL")
                .arg(key)
                .query_async::<i64>(&mut admin)
                .await
                .expect("PTTL")
        }
    };
    let marked = pttl(&mut admin, wait_key.clone()).await;
    assert!(
        marked > 0 && marked <= 600,
        "the mark lives as long as the holder: {marked}"
    );
    for _ in 0..4 {
        tokio::time::sleep(Duration::from_millis(250)).await;
        backend.refresh(&holder).await.expect("refresh");
    }
    assert_eq!(pttl(&mut admin, wait_key.clone()).await, -2, "expired");
    refused(&backend, &waiter).await;
    let renewed = pttl(&mut admin, wait_key).await;
    assert!(renewed > 0, "a refusal marks again: {renewed}");
    backend.release(&holder).await.expect("release");
    let got = timeout(WAKE_BOUND, woken.next()).await;
    assert_eq!(got.ok().flatten(), Some(()), "no notification");
}

/// Counted on a private server: a release nobody waited for publishes nothing; one after a
/// refusal publishes once, and clears the mark (the next release publishes nothing again);
/// a grant with a note publishes as before (its note key counts like a mark).
#[tokio::test]
async fn only_a_release_someone_may_wait_for_publishes() {
    if common::redis_url().is_none() {
        return;
    }
    let server = test_kit::servers::Redis::start().await;
    let backend = redis_on(&server.url()).await;
    let name = common::fresh_name("counted");
    let ttl = Duration::from_secs(30);
    let warm = common::take(&backend, &request(&name, ttl)).await;
    backend.release(&warm).await.expect("release");
    let url = server.url();
    let released = |noted, refused_first| publishes(&backend, &name, &url, noted, refused_first);
    assert_eq!(released(false, false).await, 0, "nobody waited");
    assert_eq!(released(false, true).await, 1, "a refusal came first");
    assert_eq!(released(false, false).await, 0, "the mark went with it");
    assert_eq!(released(true, false).await, 1, "a note key publishes");
}

/// Takes `name` (with a note when `noted`), has a rival refused first when `refused_first`,
/// releases, and counts the server's `PUBLISH` calls during the release.
async fn publishes(
    backend: &RedisBackend,
    name: &LockName,
    url: &str,
    noted: bool,
    refused_first: bool,
) -> u64 {
    let ttl = Duration::from_secs(30);
    let mut ask = request(name, ttl);
    if noted {
        ask = ask.with_note(Some(lockcore::Note::new("n").expect("note")));
    }
    let lease = common::take(backend, &ask).await;
    if refused_first {
        refused(backend, &request(name, ttl)).await;
    }
    let stats = &mut common::admin(url).await;
    let before = common::command_calls(stats).await;
    backend.release(&lease).await.expect("release");
    let after = common::command_calls(stats).await;
    (common::calls_between(&before, &after).get("publish")).map_or(0, |n| *n)
}
