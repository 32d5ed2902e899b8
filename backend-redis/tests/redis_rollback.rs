//! Fence tokens across a server that goes back in time: a restart from an older RDB
//! snapshot, and a failover to a replica that missed the latest grants (issue #14). Each
//! test runs its own private `redis-server`, so it may kill and restart it.

mod common;

use std::time::Duration;

use backend_redis::{RedisBackend, RedisConfig};
use lockcore::{Acquire, AcquireRequest, Identity, LockBackend, LockName};
use redis::aio::MultiplexedConnection;
use test_kit::proxy::Fault;

async fn backend_on(url: &str, prefix: &str) -> RedisBackend {
    let config = RedisConfig::from_url(url)
        .expect("valid URL")
        .with_prefix(prefix)
        .with_timeout(Duration::from_secs(2));
    RedisBackend::connect(config).await.expect("connect")
}

/// `n` grants of `name`, each released at once; their tokens. Retries a call that meets
/// the connection a restart broke (the backend re-dials once per failing call).
async fn grants(backend: &RedisBackend, name: &LockName, n: usize) -> Vec<u64> {
    let mut tokens = Vec::new();
    while tokens.len() < n {
        let request = AcquireRequest::new(
            name.clone(),
            Identity::unique(),
            lockcore::Ttl::new(Duration::from_secs(30)).expect("valid TTL"),
        );
        let lease = match backend.acquire(&request).await {
            Ok(Acquire::Acquired(lease)) => lease,
            Ok(Acquire::Held(holder)) => panic!("held by {}", holder.owner()),
            Err(err) if err.is_temporary() => {
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
            Err(err) => panic!("acquire: {err}"),
        };
        tokens.push(lease.token().expect("a single instance fences").get());
        backend.release(&lease).await.expect("release");
    }
    tokens
}

async fn admin_command(url: &str, command: &str) {
    let mut admin = common::admin(url).await;
    redis::cmd(command)
        .query_async::<()>(&mut admin)
        .await
        .unwrap_or_else(|e| panic!("{command}: {e}"));
}

/// Asserts that every token in `later` is above every token in `earlier`.
fn assert_above(earlier: &[u64], later: &[u64], what: &str) {
    let highest = earlier.iter().max().copied().unwrap_or(0);
    for token in later {
        assert!(
            *token > highest,
            "{what}: token {token} repeats or goes back (highest before: {highest}; \
             before {earlier:?}, after {later:?})"
        );
    }
}

/// A restart from an older RDB snapshot (`SAVE`, more grants, `kill -9`, restart from the
/// same directory) brings back the counter as it was at the snapshot. The reviewer saw the
/// next three tokens repeat exactly the three handed out after the snapshot, so a resource
/// that remembers the highest token would accept a stale holder's write again.
#[tokio::test]
async fn fence_tokens_never_repeat_after_a_restart_from_an_older_snapshot() {
    if common::redis_url().is_none() {
        return;
    }
    let mut server = test_kit::servers::Redis::start().await;
    let backend = backend_on(&server.url(), &common::random_prefix("rollback")).await;
    let name = common::fresh_name("snapshot");
    let mut before = grants(&backend, &name, 3).await;
    admin_command(&server.url(), "SAVE").await;
    before.extend(grants(&backend, &name, 3).await);
    server.restart().await;
    let after = grants(&backend, &name, 3).await;
    assert_above(&before, &after, "after a restart from the snapshot");
    assert!(after.windows(2).all(|w| w[0] < w[1]), "rising: {after:?}");
}

/// Waits until the replica at `url` has an open link to its primary.
async fn wait_replication_up(url: &str) {
    let mut admin = common::admin(url).await;
    for _ in 0..400 {
        let info: String = redis::cmd("INFO")
            .arg("replication")
            .query_async(&mut admin)
            .await
            .expect("INFO replication");
        if info.contains("master_link_status:up") {
            return;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    panic!("the replica at {url} never caught up with its primary");
}

async fn replica_counter(conn: &mut MultiplexedConnection, key: &str) -> Option<u64> {
    redis::cmd("GET")
        .arg(key)
        .query_async(conn)
        .await
        .expect("GET on the replica")
}

/// Waits until the replica at `url` has replicated the fence counter `key` up to `token`
/// (`WAIT` would not do: it counts acknowledgements of the calling connection's writes).
async fn wait_replica_counter(url: &str, key: &str, token: u64) {
    let mut replica = common::admin(url).await;
    for _ in 0..400 {
        if replica_counter(&mut replica, key).await == Some(token) {
            return;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    panic!("the replica at {url} never got the fence counter {token}");
}

/// A failover to an asynchronously replicated replica that missed the latest grants: the
/// promoted replica's counter is behind the tokens the old primary handed out. The grants
/// it makes must still be above all of them (the replication link runs through a fault
/// proxy that swallows the latest grants, then the replica is promoted with
/// `REPLICAOF NO ONE`).
#[tokio::test]
async fn fence_tokens_never_repeat_after_failover_to_a_lagging_replica() {
    if common::redis_url().is_none() {
        return;
    }
    // No 5 s wait for more replicas before the first full sync.
    let primary = test_kit::servers::Redis::start_with(&["--repl-diskless-sync-delay", "0"]).await;
    let link = common::proxy_for(&primary.url()).await;
    let link_port = link.local_addr().port().to_string();
    let replica =
        test_kit::servers::Redis::start_with(&["--replicaof", "127.0.0.1", &link_port]).await;
    wait_replication_up(&replica.url()).await;
    let prefix = common::random_prefix("failover");
    let backend = backend_on(&primary.url(), &prefix).await;
    let name = common::fresh_name("failover");
    let mut before = grants(&backend, &name, 3).await;
    let counter = backend.keys(&name).fence().to_owned();
    wait_replica_counter(&replica.url(), &counter, before[2]).await;
    link.set_fault(Fault::Blackhole);
    before.extend(grants(&backend, &name, 3).await);
    let mut promote = common::admin(&replica.url()).await;
    let lagging = replica_counter(&mut promote, &counter).await;
    assert_eq!(
        lagging,
        Some(before[2]),
        "the replica must lag by exactly 3 grants"
    );
    redis::cmd("REPLICAOF")
        .arg("NO")
        .arg("ONE")
        .query_async::<()>(&mut promote)
        .await
        .expect("REPLICAOF NO ONE");
    let promoted = backend_on(&replica.url(), &prefix).await;
    let after = grants(&promoted, &name, 3).await;
    assert_above(&before, &after, "after failover to the lagging replica");
}
