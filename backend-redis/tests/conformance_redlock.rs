//! The whole conformance suite against Redlock over the real Redis nodes of
//! `ANYLOCK_TEST_REDLOCK_URLS` (5 in CI). Results go to `target/conformance/redlock.jsonl`.

mod common;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use backend_redis::{RedlockBackend, RedlockConfig};
use conformance::{Cuttable, Harness, Outage};
use futures_util::future::join_all;
use lockcore::{Identity, LockBackend, LockName};
use redis::aio::MultiplexedConnection;
use test_kit::proxy::{FaultHandle, FaultProxy};

/// Generous against a loaded 2-core CI machine; the default (50 ms) suits production.
const NODE_TIMEOUT: Duration = Duration::from_millis(250);

struct RedlockHarness {
    urls: Vec<String>,
    prefix: String,
    backend: RedlockBackend,
    admins: Vec<MultiplexedConnection>,
    proxies: Mutex<Vec<FaultProxy>>,
}

async fn connect(urls: &[String], prefix: &str) -> RedlockBackend {
    let config = RedlockConfig::from_node_urls(urls)
        .expect("valid URLs")
        .with_prefix(prefix)
        .with_node_timeout(NODE_TIMEOUT);
    RedlockBackend::connect(config).await.expect("connect")
}

impl RedlockHarness {
    async fn from_env() -> Option<Self> {
        let urls = common::redlock_urls()?;
        let prefix = common::random_prefix("conformance-redlock");
        let backend = connect(&urls, &prefix).await;
        let admins = join_all(urls.iter().map(|u| common::admin(u))).await;
        Some(Self {
            urls,
            prefix,
            backend,
            admins,
            proxies: Mutex::new(Vec::new()),
        })
    }
}

/// Cuts every node at once (a client partitioned from all of them).
struct CutAll(Vec<FaultHandle>);

impl Outage for CutAll {
    fn cut(&self) {
        self.0.iter().for_each(Outage::cut);
    }
    fn restore(&self) {
        self.0.iter().for_each(Outage::restore);
    }
}

#[async_trait]
impl Harness for RedlockHarness {
    fn label(&self) -> &str {
        "redlock"
    }

    fn backend(&self) -> Arc<dyn LockBackend> {
        Arc::new(self.backend.clone())
    }

    async fn admin_delete(&self, name: &LockName) {
        let keys = self.backend.keys(name);
        for admin in &self.admins {
            common::raw_del(&mut admin.clone(), keys.lock()).await;
        }
    }

    async fn admin_steal(&self, name: &LockName, owner: &Identity, ttl: Duration) {
        let keys = self.backend.keys(name);
        let value = common::stored_value(0, owner);
        for admin in &self.admins {
            common::raw_set(&mut admin.clone(), keys.lock(), &value, ttl).await;
        }
    }

    async fn cuttable(&self) -> Option<Cuttable> {
        let proxies = join_all(self.urls.iter().map(|u| common::proxy_for(u))).await;
        let urls: Vec<String> = (self.urls.iter().zip(&proxies))
            .map(|(url, proxy)| common::through(url, proxy))
            .collect();
        let backend = connect(&urls, &self.prefix).await;
        let outage = CutAll(proxies.iter().map(FaultProxy::handle).collect());
        self.proxies
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .extend(proxies);
        Some(Cuttable {
            backend: Arc::new(backend),
            outage: Arc::new(outage),
        })
    }
}

conformance::suite!(match RedlockHarness::from_env().await {
    Some(harness) => harness,
    None => return,
});
