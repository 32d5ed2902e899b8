//! Facts about this machine that every process on it agrees on: the boot and a clock that
//! never jumps.

use std::sync::OnceLock;
use std::time::{SystemTime, UNIX_EPOCH};

/// This boot's identifier (`/proc/sys/kernel/random/boot_id`), or `"wall-clock"` where the
/// machine has none (then [`now_ms`] falls back to the wall clock).
pub(crate) fn boot_id() -> &'static str {
    static BOOT: OnceLock<String> = OnceLock::new();
    BOOT.get_or_init(|| {
        std::fs::read_to_string("/proc/sys/kernel/random/boot_id")
            .map(|s| s.trim().to_owned())
            .ok()
            .filter(|s| !s.is_empty() && boottime_ms().is_some())
            .unwrap_or_else(|| "wall-clock".to_owned())
    })
}

/// Milliseconds on the machine-wide clock that decides expiry: `CLOCK_BOOTTIME` on Linux
/// (monotonic, counts suspend, shared by every process, immune to NTP steps), else the
/// wall clock.
pub(crate) fn now_ms() -> i64 {
    if boot_id() != "wall-clock"
        && let Some(ms) = boottime_ms()
    {
        return ms;
    }
    wall_ms()
}

/// Wall-clock milliseconds since the Unix epoch, for people reading `inspect`.
pub(crate) fn wall_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
}

#[cfg(any(target_os = "linux", target_os = "android"))]
fn boottime_ms() -> Option<i64> {
    use nix::time::{ClockId, clock_gettime};
    let t = clock_gettime(ClockId::CLOCK_BOOTTIME).ok()?;
    Some(t.tv_sec() * 1000 + t.tv_nsec() / 1_000_000)
}

#[cfg(not(any(target_os = "linux", target_os = "android")))]
fn boottime_ms() -> Option<i64> {
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_boot_clock_moves_forward() {
        assert_ne!(boot_id(), "wall-clock", "Linux has a boot id");
        let a = now_ms();
        std::thread::sleep(std::time::Duration::from_millis(20));
        let b = now_ms();
        assert!(b - a >= 19 && b - a < 5_000, "{a} -> {b}");
    }
}
