//! The system clock reads a real suspend: a child process whose monotonic clock skips the
//! time it was stopped (`test_kit::suspend`), as after a machine suspend, sees its guard
//! clock ahead of the runtime's by that time. (The lock tests emulate the reading; this
//! one checks the reading itself, `CLOCK_BOOTTIME` against `CLOCK_MONOTONIC`.)

#![cfg(target_os = "linux")]

use std::io::{BufRead, BufReader, Write};
use std::process::{Command, Stdio};
use std::time::Duration;

use lockcore::Clock;
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use test_kit::suspend::MonotonicSkip;

const CHILD: &str = "ANYLOCK_TEST_SUSPEND_CHILD";

#[test]
fn the_system_clock_counts_a_suspend() {
    if std::env::var_os(CHILD).is_some() {
        return child();
    }
    let dir = std::env::temp_dir().join(format!("anylock-suspend-{:016x}", rand::random::<u64>()));
    std::fs::create_dir_all(&dir).expect("scratch dir");
    let skip = MonotonicSkip::new(&dir);
    let mut command = Command::new(std::env::current_exe().expect("test binary"));
    command
        .args([
            "--exact",
            "the_system_clock_counts_a_suspend",
            "--nocapture",
        ])
        .env(CHILD, "1")
        .envs(skip.env())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped());
    let mut child = command.spawn().expect("spawn the child");
    let mut lines = BufReader::new(child.stdout.take().expect("stdout")).lines();
    let mut line = || lines.find_map(|l| l.ok().filter(|l| l.starts_with("child:")));
    assert_eq!(line().as_deref(), Some("child: ready"));
    let pid = Pid::from_raw(i32::try_from(child.id()).expect("pid"));
    kill(pid, Signal::SIGSTOP).expect("stop");
    std::thread::sleep(Duration::from_millis(400));
    skip.add(Duration::from_millis(400));
    kill(pid, Signal::SIGCONT).expect("continue");
    writeln!(child.stdin.take().expect("stdin")).expect("tell the child");
    let counted = line().expect("the child's reading");
    let ms: u64 = counted["child: suspended ".len()..].parse().expect("ms");
    assert!(child.wait().expect("wait").success());
    let _ = std::fs::remove_dir_all(&dir);
    // The monotonic clock skips exactly 400 ms while the boot clock runs on: the reading
    // is that skip, rounded down to whole milliseconds, however long the stop itself took.
    assert!(
        (390..450).contains(&ms),
        "counted {ms} ms of a 400 ms suspend"
    );
}

/// Reads the clock before and after the parent's suspend of this process.
fn child() {
    let clock = Clock::system();
    println!("child: ready");
    let mut line = String::new();
    std::io::stdin()
        .read_line(&mut line)
        .expect("the parent's word");
    let ahead = clock
        .now()
        .saturating_duration_since(tokio::time::Instant::now());
    println!("child: suspended {}", ahead.as_millis());
}
