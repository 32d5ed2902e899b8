//! The whole conformance suite against the in-process GCS test server
//! (`gcs-test-server`, which keeps GCS's precondition semantics).
//!
//! The harness's main backend talks through a `FaultProxy`, so that `restart_server` can
//! drop every connection: the test server is in memory and cannot restart with its data,
//! and GCS's own durability is Google's. The durability case therefore checks that the
//! backend keeps no connection state a reconnect would lose (see `docs/gcs.md`).

mod common;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use backend_gcs::GcsBackend;
use common::Gcs;
use conformance::{Cuttable, Harness, Timing};
use lockcore::{Identity, LockBackend, LockName};
use test_kit::proxy::{Fault, FaultProxy};

struct GcsHarness {
    gcs: Gcs,
    main_proxy: FaultProxy,
    backend: GcsBackend,
    /// Proxies handed out by `cuttable`, kept alive as long as the harness.
    proxies: Mutex<Vec<FaultProxy>>,
}

impl GcsHarness {
    async fn start() -> Self {
        let gcs = Gcs::start().await;
        let main_proxy = FaultProxy::start(gcs.server.addr()).await.expect("proxy");
        let backend = gcs
            .backend_at(&format!("http://{}", main_proxy.local_addr()))
            .await;
        Self {
            gcs,
            main_proxy,
            backend,
            proxies: Mutex::new(Vec::new()),
        }
    }
}

#[async_trait]
impl Harness for GcsHarness {
    fn label(&self) -> &str {
        "gcs"
    }

    fn backend(&self) -> Arc<dyn LockBackend> {
        Arc::new(self.backend.clone())
    }

    fn timing(&self) -> Timing {
        // `Date` has one-second resolution and staleness allows one more second, so a
        // lapsed lock is taken over up to 2 s after its TTL.
        Timing::default()
            .with_ttl(Duration::from_secs(3))
            .with_slack(Duration::from_secs(3))
            .with_expiry_resolution(Duration::from_secs(1))
    }

    async fn admin_delete(&self, name: &LockName) {
        self.gcs.raw_delete(name.as_str()).await;
    }

    async fn admin_steal(&self, name: &LockName, owner: &Identity, ttl: Duration) {
        self.gcs.raw_put(name.as_str(), owner, ttl).await;
    }

    async fn cuttable(&self) -> Option<Cuttable> {
        let proxy = FaultProxy::start(self.gcs.server.addr())
            .await
            .expect("proxy");
        let backend = self
            .gcs
            .backend_at(&format!("http://{}", proxy.local_addr()))
            .await;
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

    async fn restart_server(&self) -> Option<()> {
        // Every connection dies (as in a restart); the in-memory store is kept, standing
        // in for GCS's durable storage.
        self.main_proxy.set_fault(Fault::Reset);
        tokio::time::sleep(Duration::from_millis(200)).await;
        self.main_proxy.set_fault(Fault::Pass);
        Some(())
    }
}

conformance::suite!(GcsHarness::start().await);
