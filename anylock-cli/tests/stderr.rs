//! `anylock` whose stderr or stdout reader has gone away (a CI log collector that died,
//! `anylock guarantees | head -1`) must still exit with its own exit code, not panic with
//! 101 on a failed write.

use std::process::{Command, Stdio};

const BIN: &str = env!("CARGO_BIN_EXE_anylock");

/// Runs `anylock args` with stderr on a pipe whose read end is closed before it writes.
fn with_stderr_closed(args: &[&str]) -> Option<i32> {
    let mut child = Command::new(BIN)
        .args(args)
        .env_remove("ANYLOCK_BACKEND")
        .env_remove("ANYLOCK_CONFIG")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn anylock");
    drop(child.stderr.take()); // the reader is gone: writes fail with EPIPE
    child.wait().expect("wait").code()
}

#[test]
fn a_closed_stderr_does_not_turn_an_error_into_a_panic() {
    // A bad backend URL: exit 2 with one line on stderr.
    let code = with_stderr_closed(&["run", "job", "--backend", "nope://x", "--", "true"]);
    assert_eq!(code, Some(2), "exit code with stderr closed");
    // A bad flag: clap's one line, exit 2.
    let code = with_stderr_closed(&["run", "--no-such-flag"]);
    assert_eq!(code, Some(2), "exit code with stderr closed");
}

#[test]
fn a_closed_stdout_does_not_turn_a_report_into_a_panic() {
    let mut child = Command::new(BIN)
        .arg("guarantees")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn anylock");
    drop(child.stdout.take());
    assert_eq!(child.wait().expect("wait").code(), Some(0));
}

/// The internal supervisor argument run by hand (not as a process-group leader started by
/// `anylock run`) must refuse, not run a command and later kill its caller's whole group.
#[test]
fn the_internal_supervisor_refuses_to_run_outside_its_own_process_group() {
    let parent = std::process::id().to_string();
    let status = Command::new(BIN)
        .args(["__supervise", &parent, "0", "kill", "--", "true"])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .expect("run anylock");
    assert_eq!(status.code(), Some(2), "refused as bad usage");
}
