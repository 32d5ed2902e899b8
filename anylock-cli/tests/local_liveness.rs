//! End-to-end: on `local:`, the lock outlives a killed `anylock` for as long as anything
//! its command started still runs, and is handed over at once when the last of them exits.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;

const BIN: &str = env!("CARGO_BIN_EXE_anylock");
/// `anylock`'s exit code when the lock is held and `--no-wait` was given.
const HELD: i32 = 123;

struct Scratch(PathBuf);

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn anylock(dir: &Path, args: &[&str]) -> Command {
    in_scratch(dir, Command::new(BIN), args)
}

/// `command args`, with `anylock`'s settings pointing at the scratch dir's `local:` file.
fn in_scratch(dir: &Path, mut command: Command, args: &[&str]) -> Command {
    command
        .args(args)
        .env(
            "ANYLOCK_BACKEND",
            format!("local:{}/locks.sqlite3", dir.display()),
        )
        .env_remove("ANYLOCK_CONFIG")
        .env("XDG_CONFIG_HOME", dir)
        .current_dir(dir)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    command
}

fn scratch(what: &str) -> Scratch {
    let dir = Scratch(std::env::temp_dir().join(format!(
        "anylock-local-{what}-{:016x}",
        rand::random::<u64>()
    )));
    std::fs::create_dir_all(&dir.0).expect("scratch dir");
    dir
}

/// While another `anylock run job` holds the lock, the exit code of
/// `unshare WRAPPER... anylock run job --no-wait -- true`.
fn contend_from(what: &str, wrapper: &[&str]) -> Option<i32> {
    let dir = scratch(what);
    let mut holder = anylock(&dir.0, &["run", "job", "--ttl", "60s", "--", "sleep", "30"])
        .spawn()
        .expect("spawn anylock");
    let start = Instant::now();
    while try_once(&dir.0) != HELD {
        assert!(start.elapsed() < Duration::from_secs(30), "never held");
        std::thread::sleep(Duration::from_millis(50));
    }
    let mut unshare = Command::new("unshare");
    unshare.args(wrapper).arg(BIN);
    let status = in_scratch(&dir.0, unshare, &["run", "job", "--no-wait", "--", "true"])
        .status()
        .expect("run unshare");
    let _ = holder.kill();
    let _ = holder.wait();
    status.code()
}

/// `anylock run job --no-wait -- true`: its exit code.
fn try_once(dir: &Path) -> i32 {
    let status = anylock(dir, &["run", "job", "--no-wait", "--", "true"])
        .status()
        .expect("run anylock");
    status.code().unwrap_or(-1)
}

fn wait_for_file(path: &Path, limit: Duration) -> String {
    let start = Instant::now();
    loop {
        if let Ok(text) = std::fs::read_to_string(path)
            && text.ends_with('\n')
        {
            return text;
        }
        assert!(start.elapsed() < limit, "{} never appeared", path.display());
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Waits until `pid` runs the program `name` (its exec happened).
fn wait_for_exec(pid: Pid, name: &str, limit: Duration) {
    let start = Instant::now();
    loop {
        let comm = std::fs::read_to_string(format!("/proc/{pid}/comm")).unwrap_or_default();
        if comm.trim_end() == name {
            return;
        }
        assert!(
            start.elapsed() < limit,
            "{pid} never became {name} (it is {comm:?})"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// Running, not a zombie (an orphan's zombie may wait a while for its reaper).
fn alive(pid: Pid) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Err(_) => false,
        Ok(stat) => stat
            .rsplit_once(')')
            .is_some_and(|(_, rest)| !rest.trim_start().starts_with(['Z', 'X'])),
    }
}

#[test]
fn a_killed_anylock_keeps_the_lock_while_its_command_runs() {
    let dir = scratch("liveness");
    // The sleep is a grandchild that left the command's process group (`setsid`), so the
    // CLI's supervisor, which kills the group when `anylock` dies, cannot reach it: only
    // the inherited kernel lock keeps the lease alive while it runs.
    let mut holder = anylock(
        &dir.0,
        &[
            "run",
            "job",
            "--ttl",
            "60s",
            "--",
            "sh",
            "-c",
            "setsid sleep 30 & echo $! > sleep.pid; wait",
        ],
    )
    .spawn()
    .expect("spawn anylock");
    let pid = wait_for_file(&dir.0.join("sleep.pid"), Duration::from_secs(30));
    let sleep = Pid::from_raw(pid.trim().parse().expect("pid"));
    // `$!` is written as soon as sh forks `setsid`, before it has left the group: killing
    // anylock before then lets the supervisor kill it with the group. `setsid` execs
    // `sleep` only after its setsid() call succeeded.
    wait_for_exec(sleep, "sleep", Duration::from_secs(30));
    holder.kill().expect("SIGKILL anylock");
    holder.wait().expect("reap anylock");

    for attempt in 0..5 {
        assert!(alive(sleep), "the command's sleep died with anylock");
        let code = try_once(&dir.0);
        if code != HELD {
            let _ = kill(sleep, Signal::SIGKILL);
            panic!(
                "attempt {attempt}: a second run got exit code {code}, not {HELD} (held), \
                 while the first run's command still runs"
            );
        }
        std::thread::sleep(Duration::from_millis(200));
    }

    kill(sleep, Signal::SIGKILL).expect("SIGKILL the sleep");
    let start = Instant::now();
    loop {
        let code = try_once(&dir.0);
        if code == 0 {
            break;
        }
        assert_eq!(code, HELD, "unexpected exit code");
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "the lock was not handed over after the command exited (TTL 60 s)"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// A process that cannot read `/proc/sys/kernel/random/boot_id` (a chroot without /proc,
/// a sandbox) used to fall back to a "wall-clock" boot id; every lease of the real boot
/// then looked like one from another boot, and it took a live lock at once. It must be
/// refused instead (exit 2), and the holder keeps the lock.
#[test]
fn a_process_that_cannot_read_the_boot_id_never_takes_a_held_lock() {
    // The boot id masked by an empty file in a mount namespace of its own.
    let masked = "mount --bind /dev/null /proc/sys/kernel/random/boot_id && exec \"$0\" \"$@\"";
    assert_eq!(
        contend_from("bootid", &["-m", "-r", "--fork", "sh", "-c", masked]),
        Some(2),
        "with no boot id, anylock must refuse (exit 2), not take the held lock (exit 0)"
    );
}

/// A process in a time namespace whose `CLOCK_MONOTONIC` runs 100 000 s ahead (a
/// container restored by CRIU, `unshare --time`) saw every live lease as long expired and
/// took it. Expiry is judged on the host's monotonic clock, whatever the namespace.
#[test]
fn a_process_in_a_time_namespace_never_takes_a_held_lock() {
    assert_eq!(
        contend_from(
            "timens",
            &["--time", "--monotonic", "100000", "--fork", "-r"]
        ),
        Some(HELD),
        "a clock 100 000 s ahead must still see the lease as held"
    );
}
