//! Servers that may evict a held lock's key under memory pressure (issue #14): `connect`
//! refuses them with a `Config` error that names the policy and the fix, and accepts
//! servers that never evict, or whose configuration it may not read.

mod common;

use std::time::Duration;

use backend_redis::{RedisBackend, RedisConfig, RedlockBackend, RedlockConfig};
use lockcore::ErrorKind;

async fn connect(url: &str) -> lockcore::Result<RedisBackend> {
    let config = RedisConfig::from_url(url)?
        .with_prefix(common::random_prefix("eviction"))
        .with_timeout(Duration::from_secs(2));
    RedisBackend::connect(config).await
}

async fn evicting(policy: &str) -> test_kit::servers::Redis {
    test_kit::servers::Redis::start_with(&["--maxmemory", "64mb", "--maxmemory-policy", policy])
        .await
}

/// `allkeys-*` may evict any key; `volatile-*` evicts keys with a TTL, and every lock key
/// has one (`volatile-ttl` picks the shortest TTLs first: the locks). Either can delete a
/// held lock, and the next acquire then grants it twice.
#[tokio::test]
async fn a_server_that_may_evict_lock_keys_is_refused() {
    if common::redis_url().is_none() {
        return;
    }
    for policy in ["allkeys-lru", "volatile-ttl"] {
        let server = evicting(policy).await;
        let err = connect(&server.url()).await.expect_err(policy);
        assert_eq!(err.kind(), ErrorKind::Config, "{policy}: {err}");
        let text = err.to_string();
        assert!(text.contains(policy), "{text}");
        assert!(text.contains("maxmemory-policy noeviction"), "{text}");
        assert!(!err.is_temporary(), "{text}");
    }
}

/// `noeviction` never deletes a key (writes fail with OOM instead), and without a memory
/// limit (`maxmemory 0`) no policy evicts anything.
#[tokio::test]
async fn servers_that_never_evict_are_accepted() {
    if common::redis_url().is_none() {
        return;
    }
    let limited = test_kit::servers::Redis::start_with(&["--maxmemory", "64mb"]).await;
    connect(&limited.url())
        .await
        .expect("noeviction with a limit");
    let unlimited = test_kit::servers::Redis::start_with(&[
        "--maxmemory",
        "0",
        "--maxmemory-policy",
        "allkeys-lru",
    ])
    .await;
    connect(&unlimited.url())
        .await
        .expect("no limit, no eviction");
}

/// Managed services and ACLs often forbid `CONFIG`: the check is then skipped (and
/// logged), never a reason to refuse the server.
#[tokio::test]
async fn a_user_without_config_permission_still_connects() {
    if common::redis_url().is_none() {
        return;
    }
    let server = evicting("allkeys-lru").await;
    let mut admin = common::admin(&server.url()).await;
    redis::cmd("ACL")
        .arg(
            &[
                "SETUSER", "locker", "on", ">secret", "~*", "&*", "+@all", "-config",
            ][..],
        )
        .query_async::<()>(&mut admin)
        .await
        .expect("ACL SETUSER");
    let url = server.url().replace("redis://", "redis://locker:secret@");
    connect(&url)
        .await
        .expect("CONFIG forbidden: skip the check");
}

/// Under Redlock one evicting node is enough to refuse: it can drop its share of a quorum.
#[tokio::test]
async fn redlock_refuses_an_evicting_node() {
    let Some(nodes) = common::redlock_urls() else {
        return;
    };
    let server = evicting("allkeys-lfu").await;
    let mut urls = nodes[..2].to_vec();
    urls.push(server.url());
    let config = RedlockConfig::from_node_urls(urls)
        .expect("valid")
        .with_prefix(common::random_prefix("eviction"));
    let err = RedlockBackend::connect(config)
        .await
        .expect_err("an evicting node");
    assert_eq!(err.kind(), ErrorKind::Config, "{err}");
    assert!(err.to_string().contains("allkeys-lfu"), "{err}");
}
