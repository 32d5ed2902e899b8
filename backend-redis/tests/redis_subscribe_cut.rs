//! A waiter whose `SUBSCRIBE` is cut off (its future dropped at a deadline) must not leave
//! a route behind that the next waiter on that name shares unconfirmed: that waiter's
//! `subscribe` returned at once, before the server knew of any subscription, and a
//! release right after was missed (the second hostile review's case, which failed so).

mod common;

use std::time::Duration;

use backend_redis::{RedisBackend, RedisConfig};
use futures_util::StreamExt;
use lockcore::{Acquire, AcquireRequest, Identity, LockBackend, LockName, Ttl};
use test_kit::proxy::Fault;

#[tokio::test]
async fn a_second_subscriber_after_a_cancelled_subscribe_hears_the_release() {
    let Some(url) = common::redis_url() else {
        return;
    };
    let prefix = common::random_prefix("cut-subscribe");
    let proxy = common::proxy_for(&url).await;
    let cfg = |u: &str| {
        RedisConfig::from_url(u)
            .unwrap()
            .with_prefix(prefix.clone())
            .with_timeout(Duration::from_secs(5))
    };
    let waiter = RedisBackend::connect(cfg(&common::through(&url, &proxy)))
        .await
        .unwrap();
    let holder = RedisBackend::connect(cfg(&url)).await.unwrap();
    let name = common::fresh_name("victim");
    let req = AcquireRequest::new(
        name.clone(),
        Identity::unique(),
        Ttl::new(Duration::from_secs(30)).unwrap(),
    );
    let Acquire::Acquired(lease) = holder.acquire(&req).await.unwrap() else {
        panic!("held")
    };
    // Open the shared pub/sub connection first (another name).
    let _warm = waiter
        .subscribe(&LockName::new("warm").unwrap())
        .await
        .unwrap()
        .unwrap();
    proxy.set_fault(Fault::Delay(Duration::from_secs(2)));
    // Waiter A: its deadline passes while the SUBSCRIBE is in flight.
    let a = tokio::time::timeout(Duration::from_millis(100), waiter.subscribe(&name)).await;
    assert!(a.is_err(), "A's subscribe was expected to be cut off");
    // Waiter B.
    let mut b = waiter.subscribe(&name).await.unwrap().unwrap();
    holder.release(&lease).await.unwrap();
    proxy.set_fault(Fault::Pass);
    let woke = tokio::time::timeout(Duration::from_secs(6), b.next()).await;
    assert!(
        matches!(woke, Ok(Some(()))),
        "B's stream missed a release after its subscribe returned: {woke:?}"
    );
}
