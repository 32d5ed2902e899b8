//! This process's memory and CPU time from `/proc`, and what the report says about the
//! machine and the date.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// Linux reports CPU times in USER_HZ ticks, 100 per second on every architecture.
const TICKS_PER_SECOND: f64 = 100.0;

/// Thread names (as `/proc` shows them, 15 bytes at most) whose CPU time is not ours: the
/// in-process GCS test server's runtime.
pub(crate) const SERVER_THREADS: &str = "gcs-server";

/// Resident memory of this process, in bytes (0 where `/proc` is missing).
pub(crate) fn rss_bytes() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .map_or(0, |kib| kib * 1024)
}

/// CPU time (user + system) of this process, less its test server's live threads.
///
/// The process's own counters (`/proc/self/stat`) keep the time of threads that have
/// exited (a per-thread sum would lose it, and go backwards), and are rounded once; only
/// the GCS test server's threads, which live as long as the run, are read one by one.
pub(crate) fn client_cpu() -> Duration {
    let Some((_, process)) = std::fs::read_to_string("/proc/self/stat")
        .ok()
        .and_then(|stat| thread_ticks(&stat))
    else {
        return Duration::ZERO;
    };
    let server: u64 = std::fs::read_dir("/proc/self/task")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|task| std::fs::read_to_string(task.path().join("stat")).ok())
        .filter_map(|stat| thread_ticks(&stat))
        .filter(|(name, _)| name.starts_with(SERVER_THREADS))
        .map(|(_, ticks)| ticks)
        .sum();
    Duration::from_secs_f64(process.saturating_sub(server) as f64 / TICKS_PER_SECOND)
}

/// CPU time the whole machine spent busy (`/proc/stat`'s `cpu` line: user, nice, system,
/// irq, softirq; not idle, iowait, nor steal, the hypervisor's time elsewhere), summed over
/// its cores; `None` where `/proc/stat` is missing.
pub(crate) fn machine_busy() -> Option<Duration> {
    let stat = std::fs::read_to_string("/proc/stat").ok()?;
    busy_ticks(stat.lines().next()?).map(|t| Duration::from_secs_f64(t as f64 / TICKS_PER_SECOND))
}

/// The busy ticks of one `/proc/stat` `cpu` line: user, nice, system, irq, softirq.
fn busy_ticks(line: &str) -> Option<u64> {
    let mut fields = line.split_whitespace();
    if fields.next()? != "cpu" {
        return None;
    }
    let ticks: Vec<u64> = fields.map(|f| f.parse().ok()).collect::<Option<_>>()?;
    // user nice system idle iowait irq softirq [steal guest guest_nice: steal is not ours,
    // guest is already in user]
    let busy = [0, 1, 2, 5, 6]
        .iter()
        .map(|&i| ticks.get(i).copied().unwrap_or(0));
    Some(busy.sum())
}

/// `(comm, utime + stime)` from one `/proc/…/stat` line.
pub(crate) fn thread_ticks(stat: &str) -> Option<(String, u64)> {
    let open = stat.find('(')?;
    let close = stat.rfind(')')?;
    let name = stat.get(open + 1..close)?.to_owned();
    let fields: Vec<&str> = stat.get(close + 1..)?.split_whitespace().collect();
    let utime: u64 = fields.get(11)?.parse().ok()?;
    let stime: u64 = fields.get(12)?.parse().ok()?;
    Some((name, utime + stime))
}

/// The last second RFC 3339 can write: 9999-12-31T23:59:59Z.
const LAST_RFC3339_SECS: u64 = 253_402_300_799;

/// `2026-11-22 16:40 UTC` for `at` (clamped to 1970–9999, where humantime's formatting
/// works).
pub(crate) fn utc_date(at: SystemTime) -> String {
    let at = at.clamp(
        UNIX_EPOCH,
        UNIX_EPOCH + Duration::from_secs(LAST_RFC3339_SECS),
    );
    // `2026-11-22T16:40:00Z`
    let rfc3339 = humantime::format_rfc3339_seconds(at).to_string();
    format!("{} {} UTC", &rfc3339[..10], &rfc3339[11..16])
}

/// One line about the machine: CPU model, cores, memory, kernel, load average now.
pub(crate) fn machine() -> String {
    let read = |p: &str| std::fs::read_to_string(p).unwrap_or_default();
    let cpuinfo = read("/proc/cpuinfo");
    let model = cpuinfo
        .lines()
        .find_map(|l| l.strip_prefix("model name"))
        .map_or("unknown CPU", |v| v.trim_start_matches([' ', '\t', ':']));
    let cores = std::thread::available_parallelism().map_or(0, usize::from);
    let mem_gib = read("/proc/meminfo")
        .lines()
        .find_map(|l| l.strip_prefix("MemTotal:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<f64>().ok())
        .map_or(0.0, |kib| kib / 1_048_576.0);
    let kernel = read("/proc/sys/kernel/osrelease");
    let load = read("/proc/loadavg");
    let load: Vec<&str> = load.split_whitespace().take(3).collect();
    format!(
        "{model}, {cores} cores, {mem_gib:.0} GiB, Linux {}, load average {} at start",
        kernel.trim(),
        load.join(" ")
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn busy_ticks_leave_out_idle_iowait_and_steal() {
        // user nice system idle iowait irq softirq steal guest guest_nice
        assert_eq!(busy_ticks("cpu  10 1 5 1000 7 2 3 4 9 9"), Some(21));
        assert_eq!(busy_ticks("cpu0 10 1 5 1000 7 2 3 4 0 0"), None);
        assert_eq!(busy_ticks("cpu  10 x 5"), None);
        assert!(machine_busy().is_some(), "/proc/stat on Linux");
    }

    #[test]
    fn dates_from_the_epoch() {
        assert_eq!(utc_date(UNIX_EPOCH), "1970-01-01 00:00 UTC");
        let leap = UNIX_EPOCH + Duration::from_secs(951_782_400 + 3_660); // 2000-02-29 01:01
        assert_eq!(utc_date(leap), "2000-02-29 01:01 UTC");
        let later = UNIX_EPOCH + Duration::from_secs(1_795_000_000);
        assert_eq!(utc_date(later), "2026-11-18 11:06 UTC");
        let before = UNIX_EPOCH - Duration::from_secs(1);
        assert_eq!(utc_date(before), "1970-01-01 00:00 UTC");
        let after = UNIX_EPOCH + Duration::from_secs(253_402_300_800);
        assert_eq!(utc_date(after), "9999-12-31 23:59 UTC");
    }

    #[test]
    fn thread_ticks_survive_spaces_and_parens_in_names() {
        let stat = "42 (gcs-server (1)) S 1 1 1 0 -1 4194560 10 0 0 0 250 50 0 0 20 0 1 0";
        assert_eq!(thread_ticks(stat), Some(("gcs-server (1)".to_owned(), 300)));
        assert_eq!(thread_ticks("garbage"), None);
    }

    #[test]
    fn this_process_has_memory_and_cpu() {
        assert!(rss_bytes() > 0);
        let spin = std::time::Instant::now();
        while spin.elapsed() < Duration::from_millis(30) {
            std::hint::black_box(0u64);
        }
        assert!(client_cpu() > Duration::ZERO);
        assert!(machine().contains("cores"));
    }

    /// A thread that burns CPU and exits keeps its time in `client_cpu` (a sum over the
    /// live threads would drop it, and the difference would go negative).
    #[test]
    fn an_exited_threads_cpu_stays_counted() {
        let before = client_cpu();
        std::thread::spawn(|| {
            let spin = std::time::Instant::now();
            while spin.elapsed() < Duration::from_millis(300) {
                std::hint::black_box(0u64);
            }
        })
        .join()
        .expect("spinner");
        let gained = client_cpu().saturating_sub(before);
        // 300 ms of spinning, at 10 ms ticks; generous for a loaded 2-core machine.
        assert!(gained >= Duration::from_millis(100), "{gained:?}");
    }
}
