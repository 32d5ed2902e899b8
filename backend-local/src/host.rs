//! Facts about this machine that every process on it agrees on: the boot, a clock that
//! never jumps, and whether a process is still alive.

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

/// A process as recorded in a lease: its pid and its start time (in clock ticks since
/// boot), so a reused pid is not mistaken for the holder.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct ProcessId {
    pub(crate) pid: u32,
    pub(crate) start: u64,
}

/// Whether a recorded process still runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Liveness {
    Alive,
    /// Gone, a zombie, or its pid now belongs to a different process.
    Dead,
    /// This platform cannot tell.
    Unknown,
}

/// This process, read from `/proc` once (pid and start time never change).
pub(crate) fn this_process() -> Option<ProcessId> {
    static ME: OnceLock<Option<ProcessId>> = OnceLock::new();
    *ME.get_or_init(|| {
        let pid = std::process::id();
        process_start(pid).map(|start| ProcessId { pid, start })
    })
}

/// Whether `process` is still running (on this boot).
pub(crate) fn liveness(process: ProcessId) -> Liveness {
    if !std::path::Path::new("/proc/self/stat").exists() {
        return Liveness::Unknown;
    }
    match read_stat(process.pid) {
        Some((state, start)) if start == process.start && !matches!(state, 'Z' | 'X') => {
            Liveness::Alive
        }
        _ => Liveness::Dead,
    }
}

fn process_start(pid: u32) -> Option<u64> {
    read_stat(pid).map(|(_, start)| start)
}

/// `(state, starttime)` from `/proc/<pid>/stat`. The command name (field 2) may contain
/// spaces and parentheses, so fields are counted from the last `)`.
fn read_stat(pid: u32) -> Option<(char, u64)> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    parse_stat(&stat)
}

pub(crate) fn parse_stat(stat: &str) -> Option<(char, u64)> {
    let rest = &stat[stat.rfind(')')? + 1..];
    let mut fields = rest.split_whitespace();
    let state = fields.next()?.chars().next()?;
    // After the state (field 3), starttime is field 22: the 19th of the remaining fields.
    let start = fields.nth(18)?.parse().ok()?;
    Some((state, start))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_stat_with_awkward_command_names() {
        let stat = "4242 (my ) (app) S 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 987654 20 21";
        assert_eq!(parse_stat(stat), Some(('S', 987_654)));
        assert_eq!(parse_stat("garbage"), None);
        assert_eq!(parse_stat("1 (x) R 1"), None);
    }

    #[test]
    fn this_process_is_alive_and_a_made_up_one_is_dead() {
        let me = this_process().expect("Linux /proc");
        assert_eq!(liveness(me), Liveness::Alive);
        let reused = ProcessId {
            start: me.start + 1,
            ..me
        };
        assert_eq!(
            liveness(reused),
            Liveness::Dead,
            "a reused pid is not the holder"
        );
        let gone = ProcessId {
            pid: u32::MAX - 7,
            start: 1,
        };
        assert_eq!(liveness(gone), Liveness::Dead);
    }

    #[test]
    fn the_boot_clock_moves_forward() {
        assert_ne!(boot_id(), "wall-clock", "Linux has a boot id");
        let a = now_ms();
        std::thread::sleep(std::time::Duration::from_millis(20));
        let b = now_ms();
        assert!(b - a >= 19 && b - a < 5_000, "{a} -> {b}");
    }
}
