//! How long the machine has been suspended since a [`Clock`](crate::Clock) was made.
//!
//! Tokio's clock is `CLOCK_MONOTONIC` on Linux (the runtime's `Instant`), which stops
//! while the machine is suspended (laptop sleep, a VM suspended or its runner stopped);
//! Redis, PostgreSQL, etcd and GCS keep counting their leases down meanwhile. So a
//! guard's deadlines are kept on the runtime's clock *plus* the time suspended, read as
//! the growth of `CLOCK_BOOTTIME − CLOCK_MONOTONIC` (Linux counts suspend in the first
//! only). Elsewhere the wall clock stands in for the boot clock: the larger of the two
//! elapsed times counts, so a suspend still counts, and so does a wall clock stepped
//! forwards (the guard then gives up early, which is safe).
//!
//! The reading only grows, in whole milliseconds (rounded down: a suspend counts up to a
//! millisecond short, which the drift allowance's margin covers). The boot clock is read
//! between two monotonic reads, and a triple that a preemption stretched is read again.
//! Each side's error is one way: the base is taken from the later monotonic read (it can
//! only err low) and every later reading from the earlier one (it can only err high), so a
//! stretched triple makes a suspend count early or a little long, never short.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// A pair of readings whose first and last monotonic reads are further apart than this
/// was preempted in between: read again.
const TIGHT: Duration = Duration::from_micros(50);

/// What counts the time suspended, for people (`anylock check`).
#[cfg(any(target_os = "linux", target_os = "android"))]
pub(crate) const SOURCE: &str = "CLOCK_BOOTTIME (counts suspend)";
/// What counts the time suspended, for people (`anylock check`).
#[cfg(not(any(target_os = "linux", target_os = "android")))]
pub(crate) const SOURCE: &str = "the monotonic clock or the wall clock, whichever ran further";

/// The time suspended since this value was made; shared by a clock's clones.
#[derive(Debug)]
pub(crate) struct Suspended {
    /// Boot clock minus monotonic clock when made, in nanoseconds.
    base: i128,
    /// The most suspended time read so far, in whole milliseconds.
    seen_ms: AtomicU64,
    /// Tests: the time suspended comes from here instead of the machine's clocks.
    #[cfg(test)]
    fake: Option<Arc<AtomicU64>>,
}

impl Suspended {
    pub(crate) fn new() -> Arc<Self> {
        Arc::new(Self {
            base: gap().0,
            seen_ms: AtomicU64::new(0),
            #[cfg(test)]
            fake: None,
        })
    }

    /// A reading that only [`FakeSuspend`] moves.
    #[cfg(test)]
    pub(crate) fn fake() -> (Arc<Self>, FakeSuspend) {
        let ms = Arc::new(AtomicU64::new(0));
        let suspended = Arc::new(Self {
            base: 0,
            seen_ms: AtomicU64::new(0),
            fake: Some(Arc::clone(&ms)),
        });
        (suspended, FakeSuspend { ms })
    }

    /// The time suspended since this was made (never less than an earlier reading).
    pub(crate) fn get(&self) -> Duration {
        let now_ms = self.read_ms();
        let seen = self
            .seen_ms
            .fetch_max(now_ms, Ordering::Relaxed)
            .max(now_ms);
        Duration::from_millis(seen)
    }

    fn read_ms(&self) -> u64 {
        #[cfg(test)]
        if let Some(fake) = &self.fake {
            return fake.load(Ordering::Relaxed);
        }
        let grown = gap().1.saturating_sub(self.base).max(0);
        u64::try_from(grown / 1_000_000).unwrap_or(u64::MAX)
    }
}

/// Emulates a machine suspend for tests: the boot clock runs on while the monotonic clock
/// (tokio's, paused or not) stands still, and nothing is woken.
#[cfg(test)]
#[derive(Debug, Clone)]
pub(crate) struct FakeSuspend {
    ms: Arc<AtomicU64>,
}

#[cfg(test)]
impl FakeSuspend {
    /// The machine was suspended for `by`.
    pub(crate) fn suspend(&self, by: Duration) {
        let by = u64::try_from(by.as_millis()).unwrap_or(u64::MAX);
        self.ms.fetch_add(by, Ordering::Relaxed);
    }
}

/// Boot clock minus monotonic clock, in nanoseconds: a bound below and one above.
fn gap() -> (i128, i128) {
    bounds(std::iter::repeat_with(|| {
        let first = monotonic();
        let boot = boot();
        (first, boot, monotonic())
    }))
}

/// The bounds of the gap from up to three `(monotonic, boot, monotonic)` triples, stopping
/// at the first tight one: `boot - then` errs only low, `boot - first` only high (the boot
/// clock was read between the two), and the tightest of each is kept.
fn bounds(triples: impl Iterator<Item = (i128, i128, i128)>) -> (i128, i128) {
    let mut low = i128::MIN;
    let mut high = i128::MAX;
    for (first, boot, then) in triples.take(3) {
        low = low.max(boot - then);
        high = high.min(boot - first);
        if then - first <= TIGHT.as_nanos() as i128 {
            break;
        }
    }
    (low, high)
}

#[cfg(any(target_os = "linux", target_os = "android"))]
fn monotonic() -> i128 {
    read(nix::time::ClockId::CLOCK_MONOTONIC)
}

#[cfg(any(target_os = "linux", target_os = "android"))]
fn boot() -> i128 {
    read(nix::time::ClockId::CLOCK_BOOTTIME)
}

#[cfg(any(target_os = "linux", target_os = "android"))]
fn read(clock: nix::time::ClockId) -> i128 {
    // These clocks exist on every kernel Rust supports; a failed read counts nothing.
    nix::time::clock_gettime(clock).map_or(0, |t| {
        i128::from(t.tv_sec()) * 1_000_000_000 + i128::from(t.tv_nsec())
    })
}

#[cfg(not(any(target_os = "linux", target_os = "android")))]
fn monotonic() -> i128 {
    static ANCHOR: std::sync::OnceLock<std::time::Instant> = std::sync::OnceLock::new();
    let anchor = *ANCHOR.get_or_init(std::time::Instant::now);
    anchor.elapsed().as_nanos() as i128
}

#[cfg(not(any(target_os = "linux", target_os = "android")))]
fn boot() -> i128 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as i128)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_awake_machine_reads_no_suspend() {
        let suspended = Suspended::new();
        std::thread::sleep(Duration::from_millis(20));
        assert_eq!(suspended.get(), Duration::ZERO);
    }

    /// A triple stretched by a preemption (5 ms between the two monotonic reads, the boot
    /// clock read at either end) gives a base that is never above the true gap and a
    /// reading never below it: a suspend counts early, never short.
    #[test]
    fn a_stretched_reading_errs_towards_counting_a_suspend() {
        const GAP: i128 = 1_000_000_000;
        const STRETCH: i128 = 5_000_000;
        let at_start = (0, GAP, STRETCH);
        let at_end = (0, GAP + STRETCH, STRETCH);
        for triple in [at_start, at_end] {
            let (low, high) = bounds(std::iter::repeat(triple));
            assert!(low <= GAP && high >= GAP, "{triple:?}: {low}..{high}");
        }
        // A tight triple after a stretched one narrows the bound above to the true gap.
        let tight = (10_000_000, GAP + 10_000_000, 10_000_010);
        let (low, high) = bounds([at_end, tight].into_iter());
        assert_eq!((low, high), (GAP, GAP));
    }

    #[test]
    fn a_fake_suspend_counts_and_never_shrinks() {
        let (suspended, control) = Suspended::fake();
        control.suspend(Duration::from_secs(3));
        assert_eq!(suspended.get(), Duration::from_secs(3));
        control.ms.store(1_000, Ordering::Relaxed);
        assert_eq!(suspended.get(), Duration::from_secs(3), "never backwards");
    }
}
