//! Everything one run measured, as written to `results.json` and rendered by `report`.

use serde::{Deserialize, Serialize};

use crate::op::Role;
use crate::stats::Summary;

/// One run's measurements.
#[derive(Debug, Default, Serialize, Deserialize)]
pub(crate) struct Results {
    /// When, where and how.
    pub(crate) meta: Meta,
    /// Item 1: uncontended acquire + release latency.
    pub(crate) latency: Vec<LatencyRow>,
    /// Item 1: round trips and server calls per cycle.
    pub(crate) counts: Vec<CountRow>,
    /// Item 2: throughput over concurrent tasks.
    pub(crate) throughput: Vec<ThroughputRow>,
    /// Item 3: contended handoff latency.
    pub(crate) handoff: Vec<HandoffRow>,
    /// Item 4: many leases held by one process.
    pub(crate) scale: Vec<ScaleRow>,
    /// Item 5: Redlock on N nodes versus one.
    pub(crate) fanout: Vec<FanoutRow>,
    /// Issue 18: leader failover after the leader resigns (absent in earlier runs).
    #[serde(default)]
    pub(crate) resign_failover: Vec<ResignRow>,
    /// Issue 18: leader failover after the leader crashes (absent in earlier runs).
    #[serde(default)]
    pub(crate) crash_failover: Vec<CrashRow>,
}

/// The run's circumstances.
#[derive(Debug, Default, Serialize, Deserialize)]
pub(crate) struct Meta {
    /// Start time, UTC.
    pub(crate) date: String,
    /// CPU, cores, memory, kernel, load.
    pub(crate) machine: String,
    /// The source revision, when given.
    pub(crate) commit: String,
    /// `full` or `smoke`.
    pub(crate) mode: String,
    /// Wall time of the whole run, seconds.
    pub(crate) seconds: f64,
    /// Per backend: server version and remarks.
    pub(crate) servers: Vec<String>,
}

/// One entry's latency and its ratio to the same backend's raw round trip.
#[derive(Debug, Serialize, Deserialize)]
pub(crate) struct LatencyRow {
    /// Backend name.
    pub(crate) backend: String,
    /// Entry label.
    pub(crate) label: String,
    /// Ours, raw or peer.
    pub(crate) role: Role,
    /// The samples' summary.
    pub(crate) summary: Summary,
    /// p50 over the raw round trip's p50.
    pub(crate) vs_raw_p50: Option<f64>,
    /// p99 over the raw round trip's p99.
    pub(crate) vs_raw_p99: Option<f64>,
    /// Cycles that failed (not in the samples).
    #[serde(default)]
    pub(crate) errors: u64,
}

/// Round trips and calls per unit of one entry.
#[derive(Debug, Serialize, Deserialize)]
pub(crate) struct CountRow {
    /// Backend name.
    pub(crate) backend: String,
    /// Entry label.
    pub(crate) label: String,
    /// Client round trips (tap) per unit.
    pub(crate) round_trips: Option<f64>,
    /// PostgreSQL statements (tap) per unit.
    pub(crate) statements: Option<f64>,
    /// Server-counted calls per unit.
    pub(crate) server_calls: Option<f64>,
    /// The server's calls by name, per unit.
    pub(crate) server_detail: String,
}

/// Completed units per second at one concurrency.
#[derive(Debug, Serialize, Deserialize)]
pub(crate) struct ThroughputRow {
    /// Backend name.
    pub(crate) backend: String,
    /// Entry label.
    pub(crate) label: String,
    /// Ours, raw or peer.
    pub(crate) role: Role,
    /// Concurrent tasks.
    pub(crate) tasks: usize,
    /// Units per second.
    pub(crate) per_second: f64,
    /// Units that failed (not counted).
    #[serde(default)]
    pub(crate) errors: u64,
    /// This process's CPU time per completed unit, µs (the in-process GCS test server's
    /// threads excluded); `None` in results written before it was measured.
    #[serde(default)]
    pub(crate) client_cpu_us: Option<f64>,
    /// The rest of the machine's busy CPU time per completed unit, µs: the servers, and
    /// whatever else ran; `None` where `/proc/stat` could not be read.
    #[serde(default)]
    pub(crate) other_cpu_us: Option<f64>,
}

/// Handoff latencies of one waiter kind.
#[derive(Debug, Serialize, Deserialize)]
pub(crate) struct HandoffRow {
    /// Backend name.
    pub(crate) backend: String,
    /// Lock label.
    pub(crate) label: String,
    /// How the waiter learns of the release.
    pub(crate) mode: String,
    /// The samples' summary.
    pub(crate) summary: Summary,
    /// Every sample, milliseconds (for the plot).
    pub(crate) samples_ms: Vec<f64>,
    /// The raw round trip's p50, timed between the handoffs.
    pub(crate) raw_p50_us: Option<f64>,
    /// Our uncontended acquire + release p50, timed between the handoffs.
    pub(crate) cycle_p50_us: Option<f64>,
    /// Handoffs that failed and were tried again.
    #[serde(default)]
    pub(crate) errors: u64,
}

/// Cost of many held leases.
#[derive(Debug, Serialize, Deserialize)]
pub(crate) struct ScaleRow {
    /// Backend name.
    pub(crate) backend: String,
    /// `anylock today` or the prototype of a fix.
    pub(crate) variant: String,
    /// Leases held.
    pub(crate) leases: usize,
    /// Lease TTL, seconds.
    pub(crate) ttl_s: f64,
    /// Refresh interval, seconds.
    pub(crate) interval_s: f64,
    /// Time to acquire them all (64 at a time), seconds, where comparable.
    pub(crate) acquire_s: Option<f64>,
    /// Resident memory added per lease, bytes.
    pub(crate) rss_per_lease: Option<f64>,
    /// Lease refreshes per second in the window (before batching, also the calls).
    pub(crate) refreshes_per_s: f64,
    /// Refresh calls per second in the window, `refresh` and `refresh_many` together
    /// (absent in runs before batching, where it equals `refreshes_per_s`).
    #[serde(default)]
    pub(crate) refresh_calls_per_s: Option<f64>,
    /// The most leases one `refresh_many` call may carry (1: no batching; absent in runs
    /// before batching).
    #[serde(default)]
    pub(crate) batch_limit: Option<usize>,
    /// Client round trips per second in the window: each kind of call times its round
    /// trips in the counts (calls themselves for the embedded backend).
    pub(crate) round_trips_per_s: Option<f64>,
    /// Client CPU in the window, percent of one core.
    pub(crate) cpu_percent: f64,
    /// Refresh calls that failed in the window.
    pub(crate) failures: u64,
    /// Leases no longer held at the end of the window.
    pub(crate) lost: usize,
    /// Why the run stopped short, when it did.
    pub(crate) error: Option<String>,
}

/// Redlock acquire latency on some nodes.
#[derive(Debug, Serialize, Deserialize)]
pub(crate) struct FanoutRow {
    /// Lock label.
    pub(crate) label: String,
    /// Redis nodes.
    pub(crate) nodes: usize,
    /// Acquire alone.
    pub(crate) acquire: Summary,
    /// Acquire + release.
    pub(crate) cycle: Summary,
    /// Cycles that failed (not in the samples).
    #[serde(default)]
    pub(crate) errors: u64,
}

/// Failover after a resignation, on one backend.
#[derive(Debug, Serialize, Deserialize)]
pub(crate) struct ResignRow {
    /// Backend name.
    pub(crate) backend: String,
    /// How the waiting candidate learns that the leader resigned.
    pub(crate) wakes: String,
    /// From `Leadership::resign` being called to the candidate's `campaign` returning, ms,
    /// each sample.
    pub(crate) samples_ms: Vec<f64>,
    /// The observers' read interval when nothing wakes them, ms.
    pub(crate) observe_interval_ms: f64,
    /// From the new leader's `campaign` returning to an `Observer::next` on another
    /// locker reporting it, ms, each sample that reported it in time (negative when the
    /// observer read the new leader before its `campaign` call had returned).
    pub(crate) observer_lag_ms: Vec<f64>,
    /// Samples whose observer did not report the new leader within the limit.
    pub(crate) observer_missed: u64,
    /// Samples that failed and were tried again.
    pub(crate) errors: u64,
}

/// Failover after a crash (a leader process killed), on one backend.
#[derive(Debug, Serialize, Deserialize)]
pub(crate) struct CrashRow {
    /// Backend name.
    pub(crate) backend: String,
    /// The crashed leader's lease TTL, ms.
    pub(crate) ttl_ms: f64,
    /// From the SIGKILL to the waiting candidate's `campaign` returning, ms, each sample.
    pub(crate) samples_ms: Vec<f64>,
    /// From the crashed leader's grant (its last lease write) to the candidate leading,
    /// less the TTL, ms, each sample: the slack beyond the lease (negative when the
    /// backend proved the holder dead before its lease ran out).
    pub(crate) beyond_ttl_ms: Vec<f64>,
    /// Samples that failed and were tried again.
    pub(crate) errors: u64,
}
