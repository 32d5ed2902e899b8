//! The whole conformance suite against one real Redis server (`ANYLOCK_TEST_REDIS_URL`).
//! Results go to `target/conformance/redis.jsonl`.

mod common;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use backend_redis::{RedisBackend, RedisConfig};
use conformance::{Cuttable, Harness};
use lockcore::{Identity, LockBackend, LockName};
use redis::aio::MultiplexedConnection;
use test_kit::proxy::FaultProxy;

struct RedisHarness {
    url: String,
    prefix: String,
    backend: RedisBackend,
    admin: MultiplexedConnection,
    /// Proxies handed out by `cuttable`, kept alive as long as the harness.
    proxies: Mutex<Vec<FaultProxy>>,
}

impl RedisHarness {
    async fn from_env() -> Option<Self> {
        let url = common::redis_url()?;
        let prefix = common::random_prefix("conformance");
        let backend = connect(&url, &prefix).await;
        let admin = common::admin(&url).await;
        Some(Self {
            url,
            prefix,
            backend,
            admin,
            proxies: Mutex::new(Vec::new()),
        })
    }
}

async fn connect(url: &str, prefix: &str) -> RedisBackend {
    let config = RedisConfig::from_url(url)
        .expect("valid URL")
        .with_prefix(prefix);
    RedisBackend::connect(config).await.expect("connect")
}

#[async_trait]
impl Harness for RedisHarness {
    fn label(&self) -> &str {
        "redis"
    }

    fn backend(&self) -> Arc<dyn LockBackend> {
        Arc::new(self.backend.clone())
    }

    async fn admin_delete(&self, name: &LockName) {
        let keys = self.backend.keys(name);
        common::raw_del(&mut self.admin.clone(), keys.lock()).await;
    }

    async fn admin_steal(&self, name: &LockName, owner: &Identity, ttl: Duration) {
        let keys = self.backend.keys(name);
        let mut admin = self.admin.clone();
        let token: u64 = redis::cmd("INCR")
            .arg(keys.fence())
            .query_async(&mut admin)
            .await
            .expect("INCR");
        let value = common::stored_value(token, owner);
        common::raw_set(&mut admin, keys.lock(), &value, ttl).await;
    }

    async fn cuttable(&self) -> Option<Cuttable> {
        let proxy = common::proxy_for(&self.url).await;
        let backend = connect(&common::through(&self.url, &proxy), &self.prefix).await;
        let outage = Arc::new(proxy.handle());
        self.proxies
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .push(proxy);
        Some(Cuttable {
            backend: Arc::new(backend),
            outage,
        })
    }
}

conformance::suite!(match RedisHarness::from_env().await {
    Some(harness) => harness,
    None => return,
});
