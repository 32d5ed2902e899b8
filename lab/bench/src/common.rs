//! What the sections share: the lease TTL of their cycles, the progress line, and the
//! failover samples' lockers and millisecond arithmetic.

use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use lockcore::{LockBackend, LockOptions, Locker, WaitMode};

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

/// A locker whose campaigns wait up to `wait`, with leases of `ttl`.
pub(crate) fn locker(backend: Arc<dyn LockBackend>, ttl: Duration, wait: Duration) -> Locker {
    Locker::new(backend).with_options(LockOptions::new(ttl).with_wait(WaitMode::Timeout(wait)))
}

/// `d` in milliseconds.
pub(crate) fn millis(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

/// `later - earlier` in milliseconds, negative when `later` came first.
pub(crate) fn signed_millis(later: tokio::time::Instant, earlier: tokio::time::Instant) -> f64 {
    if later >= earlier {
        millis(later - earlier)
    } else {
        -millis(earlier - later)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn signed_differences() {
        let t = tokio::time::Instant::now();
        let later = t + Duration::from_millis(5);
        assert_eq!(signed_millis(later, t), 5.0);
        assert_eq!(signed_millis(t, later), -5.0);
    }
}
