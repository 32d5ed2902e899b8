//! A burst of batched Redlock refreshes on the 5 shared nodes of
//! `ANYLOCK_TEST_REDLOCK_URLS` with the default 50 ms node timeout: what the `Locker` sends
//! when thousands of held leases fall due on its shared refresh grid together (several full
//! batches at once, queued behind each other on every node's one connection).

mod common;

use std::time::Duration;

use backend_redis::{DEFAULT_NODE_TIMEOUT, RedlockBackend, RedlockConfig};
use futures_util::future::join_all;
use futures_util::stream::{self, StreamExt};
use lockcore::{Acquire, AcquireRequest, Identity, Lease, LockBackend, Ttl};

const TTL: Duration = Duration::from_secs(30);
/// Full batches sent at once.
const BATCHES: usize = 10;

async fn backend_on(urls: &[String], prefix: &str, node_timeout: Duration) -> RedlockBackend {
    let config = RedlockConfig::from_node_urls(urls)
        .expect("valid URLs")
        .with_prefix(prefix)
        .with_node_timeout(node_timeout);
    RedlockBackend::connect(config).await.expect("connect")
}

/// `count` leases, taken a few dozen at a time through a backend with a generous timeout
/// (the setup is not what the test is about).
async fn take_many(backend: &RedlockBackend, count: usize) -> Vec<Lease> {
    let me = Identity::unique();
    let ttl = Ttl::new(TTL).expect("valid TTL");
    stream::iter(0..count)
        .map(|_| {
            let request = AcquireRequest::new(common::fresh_name("burst"), me.clone(), ttl);
            async move {
                match backend.acquire(&request).await.expect("acquire") {
                    Acquire::Acquired(lease) => lease,
                    Acquire::Held(holder) => panic!("held by {}", holder.owner()),
                }
            }
        })
        .buffer_unordered(32)
        .collect()
        .await
}

/// 10 full batches (10,000 leases) at once with the default node timeout: every lease is
/// extended. Every node then runs 10,000 refresh scripts queued on one connection, and
/// the one client thread encodes and reads 50,000, which takes longer than the 50 ms a
/// single call gets; a call's wait is bounded by the node timeout plus an allowance per
/// script in flight with it (sent before or after it), so none of them times out.
#[tokio::test]
async fn concurrent_full_batches_survive_the_node_timeout() {
    let Some(urls) = common::redlock_urls() else {
        return;
    };
    assert_eq!(urls.len(), 5, "this test needs 5 Redlock nodes: {urls:?}");
    let prefix = common::random_prefix("redlock-burst");
    let setup = backend_on(&urls, &prefix, Duration::from_secs(2)).await;
    let backend = backend_on(&urls, &prefix, DEFAULT_NODE_TIMEOUT).await;
    let limit = backend.refresh_batch_limit();
    let leases = take_many(&setup, BATCHES * limit).await;

    let started = std::time::Instant::now();
    let results = join_all(
        leases
            .chunks(limit)
            .map(|batch| backend.refresh_many(batch)),
    )
    .await;
    eprintln!(
        "{} leases refreshed in {:?}",
        leases.len(),
        started.elapsed()
    );
    let failed: Vec<String> = (results.iter().flatten())
        .filter_map(|result| result.as_ref().err().map(ToString::to_string))
        .collect();
    assert!(
        failed.is_empty(),
        "{} of {} refreshes failed, first: {:?}",
        failed.len(),
        leases.len(),
        failed.first()
    );
    for (batch, results) in leases.chunks(limit).zip(&results) {
        assert_eq!(results.len(), batch.len(), "one result per lease");
        for (lease, result) in batch.iter().zip(results) {
            let refreshed = result.as_ref().expect("refreshed");
            assert_eq!(refreshed.grant(), lease.grant());
            assert!(
                refreshed.ttl().get() < TTL,
                "validity {:?}",
                refreshed.ttl()
            );
        }
    }

    stream::iter(&leases)
        .for_each_concurrent(32, |lease| async {
            let _ = setup.release(lease).await;
        })
        .await;
}
