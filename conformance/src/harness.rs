//! What the suite needs from a backend under test: the [`Harness`] trait, its timing
//! profile, the outage hook, and [`MemoryHarness`] for the suite's own self-test.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use lockcore::testing::{Broken, Fault, FaultyBackend};
use lockcore::{Defect, Identity, LockBackend, LockName, MemoryBackend};

use test_kit::proxy::{self, FaultHandle};

/// A backend under test plus the operator powers some cases need.
///
/// Implement it in a backend crate's `tests/` and stamp the suite with
/// [`suite!`](crate::suite). A third-party backend can do the same.
#[async_trait]
pub trait Harness: Send + Sync + 'static {
    /// A short label for reports and result files (`"redis"`, `"memory"`).
    fn label(&self) -> &str;

    /// The backend, talking to the real server directly.
    fn backend(&self) -> Arc<dyn LockBackend>;

    /// Timings suited to the backend (its TTL granularity and latency).
    fn timing(&self) -> Timing {
        Timing::default()
    }

    /// Deletes `name` the way an operator would (`DEL`, `DELETE FROM`, `etcdctl del`),
    /// without notifying waiters.
    async fn admin_delete(&self, name: &LockName);

    /// Overwrites `name` so that `owner` holds it for `ttl`, the way an operator or a
    /// buggy client would.
    async fn admin_steal(&self, name: &LockName, owner: &Identity, ttl: Duration);

    /// A second backend instance whose connection to the server can be cut (through the
    /// [`FaultProxy`](test_kit::proxy::FaultProxy)), with the switch.
    async fn cuttable(&self) -> Option<Cuttable>;

    /// Restarts the server, keeping its data directory; for backends claiming
    /// [`Durability::SurvivesRestart`](lockcore::Durability::SurvivesRestart).
    async fn restart_server(&self) -> Option<()> {
        None
    }

    /// Lock names this backend rejects beyond lockcore's own rules.
    fn invalid_names(&self) -> Vec<String> {
        Vec::new()
    }
}

/// A backend whose server connection can be cut and restored.
pub struct Cuttable {
    /// The backend that goes through the cuttable path.
    pub backend: Arc<dyn LockBackend>,
    /// The switch.
    pub outage: Arc<dyn Outage>,
}

impl std::fmt::Debug for Cuttable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Cuttable")
            .field("backend", &self.backend)
            .finish_non_exhaustive()
    }
}

/// Cuts and restores a backend's path to its server.
pub trait Outage: Send + Sync {
    /// Makes the server unreachable: calls hang (a partition, not a refused connection).
    fn cut(&self);
    /// Makes it reachable again.
    fn restore(&self);
}

impl Outage for FaultHandle {
    fn cut(&self) {
        self.set_fault(proxy::Fault::Blackhole);
    }
    fn restore(&self) {
        self.set_fault(proxy::Fault::Pass);
    }
}

/// Timings a harness can tune to its backend.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct Timing {
    /// The short TTL used by expiry and health cases (default 1 s).
    pub ttl: Duration,
    /// Allowance on top of a deadline for scheduling and round trips (default 1 s).
    pub slack: Duration,
    /// How early a server may expire a lease because of its clock resolution (default
    /// 10 ms; GCS timestamps have one-second resolution).
    pub expiry_resolution: Duration,
    /// How many names the scale case holds at once (default 1000).
    pub many_names: usize,
    /// Upper bound on any one case (default 120 s).
    pub case_limit: Duration,
}

impl Default for Timing {
    fn default() -> Self {
        Self {
            ttl: Duration::from_secs(1),
            slack: Duration::from_secs(1),
            expiry_resolution: Duration::from_millis(10),
            many_names: 1000,
            case_limit: Duration::from_secs(120),
        }
    }
}

impl Timing {
    /// Sets the short TTL.
    pub fn with_ttl(mut self, ttl: Duration) -> Self {
        self.ttl = ttl;
        self
    }

    /// Sets the slack.
    pub fn with_slack(mut self, slack: Duration) -> Self {
        self.slack = slack;
        self
    }

    /// Sets the server's expiry resolution.
    pub fn with_expiry_resolution(mut self, resolution: Duration) -> Self {
        self.expiry_resolution = resolution;
        self
    }

    /// Sets the number of names the scale case holds.
    pub fn with_many_names(mut self, count: usize) -> Self {
        self.many_names = count;
        self
    }
}

/// The in-process [`MemoryBackend`] as a harness: the suite's reference and self-test.
#[derive(Debug, Clone)]
pub struct MemoryHarness {
    memory: MemoryBackend,
    /// `memory` itself, or `memory` behind a [`Broken`] wrapper.
    backend: Arc<dyn LockBackend>,
    label: &'static str,
}

impl Default for MemoryHarness {
    fn default() -> Self {
        Self::new()
    }
}

impl MemoryHarness {
    /// A correct memory backend.
    pub fn new() -> Self {
        let memory = MemoryBackend::new();
        Self {
            backend: Arc::new(memory.clone()),
            memory,
            label: "memory",
        }
    }

    /// A correct memory backend that takes refresh batches of up to 64 leases, so every
    /// case that holds a guard runs through the locker's grouped refreshes.
    pub fn batched() -> Self {
        let memory = MemoryBackend::new().with_refresh_batch_limit(64);
        Self {
            backend: Arc::new(memory.clone()),
            memory,
            label: "memory-batched",
        }
    }

    /// A memory backend with a deliberate bug, to prove a case able to fail.
    pub fn with_defect(defect: Defect) -> Self {
        let broken = Broken::new(defect);
        Self {
            memory: broken.memory().clone(),
            backend: Arc::new(broken),
            label: "memory-defect",
        }
    }
}

/// Cuts a [`FaultyBackend`] by making every call hang.
struct HangSwitch(FaultyBackend);

impl Outage for HangSwitch {
    fn cut(&self) {
        self.0.set_all(Fault::Hang);
    }
    fn restore(&self) {
        self.0.set_all(Fault::Pass);
    }
}

#[async_trait]
impl Harness for MemoryHarness {
    fn label(&self) -> &str {
        self.label
    }

    fn backend(&self) -> Arc<dyn LockBackend> {
        Arc::clone(&self.backend)
    }

    async fn admin_delete(&self, name: &LockName) {
        self.memory.admin_delete(name);
    }

    async fn admin_steal(&self, name: &LockName, owner: &Identity, ttl: Duration) {
        self.memory.admin_steal(name, owner.clone(), ttl);
    }

    async fn cuttable(&self) -> Option<Cuttable> {
        let faulty = FaultyBackend::new(Arc::clone(&self.backend));
        Some(Cuttable {
            backend: Arc::new(faulty.clone()),
            outage: Arc::new(HangSwitch(faulty)),
        })
    }
}
