//! Facts about this machine that every process on it agrees on: the boot and a clock that
//! never jumps.

use std::fmt;
use std::io;
use std::path::Path;
use std::sync::OnceLock;
use std::time::{SystemTime, UNIX_EPOCH};

use crate::filesystem::Filesystem;

/// The machine as the backend sees it: its boot and its clocks. Tests replace it to replay
/// what a suspend does to each clock (the machine cannot be suspended in a test) and to
/// play another boot sharing the store (another host, another sandbox).
pub(crate) trait Host: Send + Sync + fmt::Debug {
    /// This boot's identifier (see [`boot_id`]).
    fn boot_id(&self) -> &str;
    /// `CLOCK_MONOTONIC` in ms: stops while the machine is suspended, for every process
    /// of the store alike. `None` off Linux.
    fn monotonic_ms(&self) -> Option<i64>;
    /// `CLOCK_BOOTTIME` in ms: counts suspend. `None` off Linux. Only tests read it: it
    /// is the clock expiry must not use (see [`expiry_now_ms`]).
    #[cfg(test)]
    fn boottime_ms(&self) -> Option<i64>;
    /// Wall-clock ms since the Unix epoch.
    fn wall_ms(&self) -> i64;
    /// The filesystem `dir` is on (`statfs`).
    fn filesystem(&self, dir: &Path) -> io::Result<Filesystem> {
        crate::filesystem::of(dir)
    }
}

/// The real machine.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct SystemHost;

impl Host for SystemHost {
    fn boot_id(&self) -> &str {
        boot_id()
    }

    fn monotonic_ms(&self) -> Option<i64> {
        clock_ms(Kernel::Monotonic)
    }

    #[cfg(test)]
    fn boottime_ms(&self) -> Option<i64> {
        clock_ms(Kernel::Boottime)
    }

    fn wall_ms(&self) -> i64 {
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
    }
}

/// The boot id of a machine that has none: expiry then falls back to the wall clock.
const WALL_CLOCK: &str = "wall-clock";

/// This boot's identifier (`/proc/sys/kernel/random/boot_id`), or `"wall-clock"` where the
/// machine has none (then [`expiry_now_ms`] falls back to the wall clock).
pub(crate) fn boot_id() -> &'static str {
    static BOOT: OnceLock<String> = OnceLock::new();
    BOOT.get_or_init(|| {
        std::fs::read_to_string("/proc/sys/kernel/random/boot_id")
            .map(|s| s.trim().to_owned())
            .ok()
            .filter(|s| !s.is_empty() && clock_ms(Kernel::Monotonic).is_some())
            .unwrap_or_else(|| WALL_CLOCK.to_owned())
    })
}

/// On Linux, refuses to run without the boot id. Without it every lease of this boot would
/// look like one from another boot (free at once), and this process's own leases would be
/// judged on the wall clock by everyone else: two holders at once (found by review, issue
/// #14). Elsewhere the wall clock is the documented mode.
pub(crate) fn require_boot_id(host: &dyn Host) -> Result<(), lockcore::Error> {
    if cfg!(target_os = "linux") && host.boot_id() == WALL_CLOCK {
        return Err(lockcore::Error::new(
            lockcore::ErrorKind::Config,
            "cannot read /proc/sys/kernel/random/boot_id (or CLOCK_MONOTONIC): local: needs \
             it to tell this boot's leases from an earlier boot's; mount /proc, or use a \
             server backend",
        ));
    }
    Ok(())
}

/// Milliseconds on the machine-wide clock that decides expiry: on Linux `CLOCK_MONOTONIC`
/// (shared by every process, immune to NTP steps, reset by a reboot, which the boot id
/// catches), else the wall clock.
///
/// Not `CLOCK_BOOTTIME`: it counts time spent suspended, so a lease would end during a
/// laptop's sleep and a contender take it as the machine wakes. On `CLOCK_MONOTONIC` a
/// suspend stops every lease of the store alike. (The holder's guard counts the suspend
/// and gives the lease up after a long one: early, never unsafe.)
pub(crate) fn expiry_now_ms(host: &dyn Host) -> i64 {
    if host.boot_id() != WALL_CLOCK
        && let Some(ms) = host.monotonic_ms()
    {
        return ms;
    }
    host.wall_ms()
}

/// The moment an attempt judges leases at: this boot, and both clocks, each read once.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Now<'a> {
    /// This boot's identifier.
    pub(crate) boot_id: &'a str,
    /// [`expiry_now_ms`]: this boot's clock, which decides its own leases.
    pub(crate) expiry_ms: i64,
    /// Wall-clock ms since the Unix epoch, which decides another boot's leases.
    pub(crate) wall_ms: i64,
}

impl Now<'_> {
    /// Whether a lease of the boot `boot` was written by this boot.
    pub(crate) fn is_this_boot(&self, boot: Option<&str>) -> bool {
        boot == Some(self.boot_id)
    }

    /// How long (ms) a lease row of the boot `boot` still has, or `None` once it has ended:
    /// a lease of this boot ends at `expires_ms` on this boot's clock; a lease of another
    /// boot (another host or sandbox sharing the store, or this machine before a reboot:
    /// they cannot be told apart) at `expires_wall_ms` on the wall clock, the only clock
    /// two boots share. Another boot's lease with no wall-clock expiry was written by a
    /// version before it was recorded; it has ended, as it had then. The SQL grant
    /// (`GRANT` in `client.rs`) applies the same rule.
    pub(crate) fn left_ms(
        &self,
        boot: Option<&str>,
        expires_ms: Option<i64>,
        expires_wall_ms: Option<i64>,
    ) -> Option<i64> {
        let (at, now) = if self.is_this_boot(boot) {
            (expires_ms?, self.expiry_ms)
        } else {
            (expires_wall_ms?, self.wall_ms)
        };
        (at > now).then(|| at - now)
    }
}

#[derive(Debug, Clone, Copy)]
enum Kernel {
    Monotonic,
    #[cfg(test)]
    Boottime,
}

#[cfg(any(target_os = "linux", target_os = "android"))]
fn clock_ms(clock: Kernel) -> Option<i64> {
    use nix::time::{ClockId, clock_gettime};
    let id = match clock {
        Kernel::Monotonic => ClockId::CLOCK_MONOTONIC,
        #[cfg(test)]
        Kernel::Boottime => ClockId::CLOCK_BOOTTIME,
    };
    let t = clock_gettime(id).ok()?;
    let ms = t.tv_sec() * 1000 + t.tv_nsec() / 1_000_000;
    match clock {
        // The host's clock, whatever this process's time namespace adds: processes in
        // different time namespaces must agree on when a lease expires.
        Kernel::Monotonic => Some(ms - monotonic_offset_ms()),
        #[cfg(test)]
        Kernel::Boottime => Some(ms),
    }
}

/// This process's time-namespace offset of `CLOCK_MONOTONIC`, in ms (0 outside one, or on
/// kernels without time namespaces).
#[cfg(any(target_os = "linux", target_os = "android"))]
fn monotonic_offset_ms() -> i64 {
    static OFFSET: OnceLock<i64> = OnceLock::new();
    *OFFSET.get_or_init(|| {
        std::fs::read_to_string("/proc/self/timens_offsets")
            .ok()
            .and_then(|text| parse_monotonic_offset_ms(&text))
            .unwrap_or(0)
    })
}

/// The `monotonic <seconds> <nanoseconds>` line of `/proc/self/timens_offsets`, in ms.
#[cfg(any(target_os = "linux", target_os = "android"))]
fn parse_monotonic_offset_ms(text: &str) -> Option<i64> {
    let line = text
        .lines()
        .find(|l| l.split_whitespace().next() == Some("monotonic"))?;
    let mut fields = line.split_whitespace().skip(1);
    let secs: i64 = fields.next()?.parse().ok()?;
    let nanos: i64 = fields.next()?.parse().ok()?;
    secs.checked_mul(1000)?.checked_add(nanos / 1_000_000)
}

#[cfg(not(any(target_os = "linux", target_os = "android")))]
fn clock_ms(_clock: Kernel) -> Option<i64> {
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    #[cfg(any(target_os = "linux", target_os = "android"))]
    fn the_time_namespace_offset_is_read_from_its_monotonic_line() {
        let text = "monotonic      100000         5000000\nboottime  7 0\n";
        assert_eq!(parse_monotonic_offset_ms(text), Some(100_000_005));
        assert_eq!(parse_monotonic_offset_ms("monotonic -3 0\n"), Some(-3000));
        assert_eq!(parse_monotonic_offset_ms("boottime 1 0\n"), None);
        assert_eq!(parse_monotonic_offset_ms("monotonic x 0\n"), None);
    }

    #[test]
    fn the_expiry_clock_moves_forward() {
        assert_ne!(boot_id(), WALL_CLOCK, "Linux has a boot id");
        let a = expiry_now_ms(&SystemHost);
        std::thread::sleep(std::time::Duration::from_millis(20));
        let b = expiry_now_ms(&SystemHost);
        assert!(b - a >= 19 && b - a < 5_000, "{a} -> {b}");
    }
}
