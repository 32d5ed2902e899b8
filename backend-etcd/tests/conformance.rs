//! The whole conformance suite against etcd.
//!
//! Every case runs on the shared 3-member cluster from `scripts/servers`, under a key
//! prefix of its own, except `durability_claim`: it restarts its server, and the shared
//! cluster must never be restarted (other engineers' tests use it), so that case gets a
//! private single-member etcd with fsync on, killed with SIGKILL and started again on the
//! same data directory.

mod common;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use backend_etcd::{EtcdBackend, EtcdConfig};
use conformance::{Cuttable, Harness, Outage, Timing};
use lockcore::{Identity, LockBackend, LockName};
use test_kit::proxy::{Fault, FaultProxy};
use test_kit::servers::Etcd;
use tokio::sync::Mutex;

/// Ports of the private server used by `durability_claim`.
const DURABILITY_PORTS: (u16, u16) = (27591, 27691);

struct EtcdHarness {
    endpoints: Vec<String>,
    prefix: String,
    backend: Arc<EtcdBackend>,
    raw: Mutex<common::raw::Raw>,
    /// The private server, for the one case that restarts it.
    private: Option<Mutex<Etcd>>,
}

/// The harness for the running case, or `None` to skip (outside CI, with no servers).
///
/// libtest names each test's thread after the test, which is the only way a `suite!`
/// harness can tell which case it serves.
async fn harness() -> Option<EtcdHarness> {
    let shared = common::shared_endpoints()?;
    let case = std::thread::current().name().unwrap_or_default().to_owned();
    if case.ends_with("durability_claim") {
        let cluster = Etcd::start(&[DURABILITY_PORTS], true).await;
        let endpoints = cluster.endpoints();
        return Some(EtcdHarness::new(endpoints, Some(cluster)).await);
    }
    Some(EtcdHarness::new(shared, None).await)
}

impl EtcdHarness {
    async fn new(endpoints: Vec<String>, private: Option<Etcd>) -> Self {
        let prefix = common::random_prefix("conformance");
        let backend = common::backend(&endpoints, &prefix).await;
        let raw = common::raw(&endpoints).await;
        Self {
            endpoints,
            prefix,
            backend: Arc::new(backend),
            raw: Mutex::new(raw),
            private: private.map(Mutex::new),
        }
    }

    fn lock_prefix(&self, name: &LockName) -> String {
        self.backend.lock_prefix(name)
    }
}

/// Cuts every member at once: one fault proxy per endpoint.
struct AllMembers(Vec<FaultProxy>);

impl Outage for AllMembers {
    fn cut(&self) {
        self.0.iter().for_each(|p| p.set_fault(Fault::Blackhole));
    }
    fn restore(&self) {
        self.0.iter().for_each(|p| p.set_fault(Fault::Pass));
    }
}

#[async_trait]
impl Harness for EtcdHarness {
    fn label(&self) -> &str {
        "etcd"
    }

    fn backend(&self) -> Arc<dyn LockBackend> {
        self.backend.clone()
    }

    /// etcd lease TTLs are whole seconds with a floor of about 2 s (from the election
    /// timeout), and leases are revoked by a loop that runs every 500 ms.
    fn timing(&self) -> Timing {
        Timing::default()
            .with_ttl(Duration::from_secs(2))
            .with_slack(Duration::from_secs(2))
            .with_expiry_resolution(Duration::from_millis(100))
    }

    /// Deletes the owner key, as `etcdctl del <key>` would.
    async fn admin_delete(&self, name: &LockName) {
        let prefix = self.lock_prefix(name);
        let mut raw = self.raw.lock().await;
        let first = raw.by_creation(&prefix, 1, false).await.expect("range");
        if let Some(owner) = first.into_iter().next() {
            raw.delete(owner.key).await.expect("delete");
        }
    }

    /// Deletes every key of the lock and puts `owner`'s key with a lease of its own.
    async fn admin_steal(&self, name: &LockName, owner: &Identity, ttl: Duration) {
        let prefix = self.lock_prefix(name);
        let mut raw = self.raw.lock().await;
        raw.delete_prefix(&prefix).await.expect("delete");
        let lease = raw
            .lease_grant(i64::try_from(ttl.as_secs().max(1)).expect("ttl"))
            .await
            .expect("grant");
        // anylock's own value (with its format mark), as another anylock client writes it.
        let value = format!("{{\"owner\":{:?},\"anylock\":1}}", owner.as_str());
        let key = format!("{prefix}{lease:x}");
        raw.put(key, value, lease).await.expect("put");
    }

    /// A second backend that reaches every member through its own fault proxy.
    async fn cuttable(&self) -> Option<Cuttable> {
        let mut proxies = Vec::new();
        for endpoint in &self.endpoints {
            let upstream: SocketAddr = test_kit::env::host_port(endpoint)
                .expect("host:port")
                .parse()
                .expect("socket address");
            proxies.push(FaultProxy::start(upstream).await.expect("proxy"));
        }
        let proxied: Vec<String> = proxies
            .iter()
            .map(|p| format!("http://{}", p.local_addr()))
            .collect();
        let config = EtcdConfig::new(&proxied)
            .expect("endpoints")
            .with_prefix(&self.prefix)
            .with_request_timeout(Duration::from_secs(1));
        let backend = EtcdBackend::connect(config).await.expect("connect");
        Some(Cuttable {
            backend: Arc::new(backend),
            outage: Arc::new(AllMembers(proxies)),
        })
    }

    /// Kills the private server with SIGKILL and starts it again on its data directory.
    async fn restart_server(&self) -> Option<()> {
        let private = self.private.as_ref()?;
        let mut cluster = private.lock().await;
        cluster.restart(0);
        cluster.wait_healthy(Duration::from_secs(30)).await;
        Some(())
    }

    /// etcd itself accepts any key; names are escaped instead (see the crate docs). A
    /// name whose key would exceed etcd's request size is the only rejection, and
    /// lockcore's 512-byte limit keeps every name well inside it.
    fn invalid_names(&self) -> Vec<String> {
        Vec::new()
    }
}

conformance::suite!(match harness().await {
    Some(harness) => harness,
    None => return,
});
