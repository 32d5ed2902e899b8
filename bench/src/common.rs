//! What the sections share: the lease TTL of their cycles and the progress line.

use std::sync::OnceLock;
use std::time::{Duration, Instant};

/// Lease TTL of latency, throughput and handoff cycles.
pub(crate) const TTL: Duration = Duration::from_secs(30);

/// Acquisitions (and releases) in flight at once where many leases are taken together
/// (the scale section, the batched refresh's leases).
pub(crate) const CONCURRENCY: usize = 64;

/// When the run started (the first call).
pub(crate) fn started() -> Instant {
    static START: OnceLock<Instant> = OnceLock::new();
    *START.get_or_init(Instant::now)
}

/// Prints one progress line with the time since start.
pub(crate) fn progress(what: &str) {
    eprintln!(
        "anylock-bench: [{:6.1} s] {what}",
        started().elapsed().as_secs_f64()
    );
}
