//! End-to-end tests of how `anylock run` handles its command's processes when `anylock`
//! itself is killed or stopped, when the command leaves processes behind, and when the
//! lease is already gone (issue #14). Real binary, real signals, the embedded backend
//! (process handling does not depend on the backend).

mod support;

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::Stdio;
use std::time::{Duration, Instant};

use nix::sys::signal::Signal;
use support::{
    Scene, code, pids, process_dead, process_halted, process_stopped, read, send, stderr_lines,
    wait_child, wait_until,
};

/// A command that records its pid and a grandchild's, then appends a tick to `ticks`
/// every 50 ms until stopped.
fn ticking(scene: &Scene) -> String {
    ticking_with(scene, "sleep 0.05")
}

/// As [`ticking`], with `pause` between ticks (`:` for none).
fn ticking_with(scene: &Scene, pause: &str) -> String {
    format!(
        "echo $$ >> {0}; sleep 60 & echo $! >> {0}; while true; do echo x >> {1}; {pause}; done",
        scene.path("pids").display(),
        scene.path("ticks").display()
    )
}

fn ticks(scene: &Scene) -> usize {
    read(&scene.path("ticks")).lines().count()
}

fn wait_started(scene: &Scene) {
    wait_until(Duration::from_secs(20), "the command to start", || {
        pids(&scene.path("pids")).len() == 2 && ticks(scene) > 2
    });
}

fn wait_all_dead(scene: &Scene, limit: Duration) {
    for pid in pids(&scene.path("pids")) {
        wait_until(limit, &format!("process {pid} to die"), || {
            process_dead(&pid)
        });
    }
}

/// SIGKILL of `anylock` (CI cancel, OOM, `kill -9`) must not leave the command and its
/// group running unlocked: the lease expires and the next holder would overlap it. Killed
/// at random moments, also right after the spawn, where the supervisor may not yet watch
/// its parent.
#[test]
fn killing_anylock_stops_the_command_and_its_group() {
    for round in 0..12 {
        let scene = Scene::local();
        let mut run = scene.spawn(&["run", "job", "--", "sh", "-c", &ticking(&scene)]);
        if round < 4 {
            wait_started(&scene);
        } else {
            std::thread::sleep(Duration::from_millis(rand::random_range(0..300)));
        }
        run.kill().expect("SIGKILL anylock");
        run.wait().expect("reap anylock");
        std::thread::sleep(Duration::from_millis(300));
        wait_all_dead(&scene, Duration::from_secs(5));
        let before = ticks(&scene);
        std::thread::sleep(Duration::from_millis(300));
        assert_eq!(ticks(&scene), before, "round {round}: still ticking");
    }
}

fn stop_and_continue(scene: &Scene, run: &std::process::Child) {
    let anylock = run.id().to_string();
    send(run.id(), Signal::SIGTSTP);
    wait_until(Duration::from_secs(5), "anylock to stop", || {
        process_stopped(&anylock)
    });
    for pid in pids(&scene.path("pids")) {
        wait_until(Duration::from_secs(5), &format!("{pid} to stop"), || {
            process_halted(&pid)
        });
    }
    let before = ticks(scene);
    std::thread::sleep(Duration::from_millis(500));
    assert_eq!(
        ticks(scene),
        before,
        "the command ran while anylock was stopped"
    );
    send(run.id(), Signal::SIGCONT);
    wait_until(Duration::from_secs(5), "the command to resume", || {
        ticks(scene) > before + 2
    });
    for pid in pids(&scene.path("pids")) {
        assert!(!process_stopped(&pid), "{pid} still stopped");
    }
}

/// Ctrl-Z (SIGTSTP) of `anylock` stops the command's group too (nobody refreshes the
/// lease while anylock is stopped), and SIGCONT resumes both.
#[test]
fn stopping_anylock_stops_the_command_group_and_continue_resumes_both() {
    let scene = Scene::local();
    let mut run = scene.spawn(&["run", "job", "--", "sh", "-c", &ticking(&scene)]);
    wait_started(&scene);
    for _ in 0..3 {
        stop_and_continue(&scene, &run);
    }
    send(run.id(), Signal::SIGTERM);
    let status = wait_child(&mut run, Duration::from_secs(15));
    assert_eq!(status.code(), Some(128 + 15), "{status:?}");
    wait_all_dead(&scene, Duration::from_secs(5));
}

/// A stop longer than the lease: another holder gets the lock meanwhile, so on SIGCONT
/// the command must not run another step: it is killed still stopped and anylock exits
/// with 122. The command ticks without pause, so that even a moment of running shows. On
/// Redis where configured: a `local:` holder stopped in the middle of a refresh keeps
/// SQLite's write lock, and the other holder then times out instead.
#[test]
fn a_stop_longer_than_the_lease_kills_the_command_and_exits_lost() {
    let scene = Scene::redis().unwrap_or_else(Scene::local);
    let busy = ticking_with(&scene, ":");
    let mut run = scene.spawn(&["run", "job", "--ttl", "2s", "--", "sh", "-c", &busy]);
    wait_started(&scene);
    send(run.id(), Signal::SIGTSTP);
    for pid in pids(&scene.path("pids")) {
        wait_until(Duration::from_secs(5), &format!("{pid} to stop"), || {
            process_halted(&pid)
        });
    }
    let other = scene.output(&["run", "job", "--wait", "20s", "--", "true"]);
    assert_eq!(code(&other), 0, "{:?}", stderr_lines(&other));
    let before = ticks(&scene);
    send(run.id(), Signal::SIGCONT);
    let status = wait_child(&mut run, Duration::from_secs(10));
    assert_eq!(status.code(), Some(122), "{status:?}");
    wait_all_dead(&scene, Duration::from_secs(5));
    assert_eq!(
        ticks(&scene),
        before,
        "the command ran after its lease was gone"
    );
}

/// `sh -c 'work &'`: the leader exits while `work` still runs in its group. By default the
/// leftovers are stopped before the lock is released, so they never run unlocked.
#[test]
fn leftover_processes_are_stopped_before_the_release() {
    let scene = Scene::local();
    let pid = scene.path("pid");
    let script = format!("sleep 60 & echo $! > {}", pid.display());
    let out = scene.output(&["run", "job", "--grace", "1s", "--", "sh", "-c", &script]);
    assert_eq!(code(&out), 0, "{:?}", stderr_lines(&out));
    let pid = read(&pid).trim().to_owned();
    assert!(!pid.is_empty());
    assert!(process_dead(&pid), "leftover {pid} outlived the lock");
}

/// `--leftovers wait`: the lock stays held (and refreshed) until the group is empty.
#[test]
fn with_leftovers_wait_the_lock_is_held_until_the_group_is_empty() {
    let scene = Scene::local();
    let (leader, done) = (scene.path("leader-done"), scene.path("done"));
    let script = format!(
        "(sleep 2; touch {1}) > /dev/null 2>&1 & touch {0}",
        leader.display(),
        done.display()
    );
    let mut run = scene.spawn(&[
        "run",
        "job",
        "--leftovers",
        "wait",
        "--",
        "sh",
        "-c",
        &script,
    ]);
    wait_until(Duration::from_secs(20), "the leader to exit", || {
        leader.exists()
    });
    std::thread::sleep(Duration::from_millis(300));
    let other = scene.output(&["run", "job", "--no-wait", "--", "true"]);
    assert_eq!(code(&other), 123, "the lock was released while work ran");
    let status = wait_child(&mut run, Duration::from_secs(15));
    assert!(status.success(), "{status:?}");
    assert!(done.exists(), "anylock exited before its leftover finished");
}

/// The lease is already gone when the backend says someone else owns it: the grace is
/// skipped and a command that ignores SIGTERM is killed at once, not 10 s later.
#[test]
fn a_broken_lock_kills_a_command_that_ignores_sigterm_at_once() {
    let scene = Scene::local();
    let ready = scene.path("ready");
    let script = format!(
        "trap '' TERM; touch {}; while true; do sleep 0.05; done",
        ready.display()
    );
    let mut run = scene.spawn(&["run", "job", "--ttl", "4s", "--", "sh", "-c", &script]);
    wait_until(Duration::from_secs(20), "the command to start", || {
        ready.exists()
    });
    let broke = scene.output(&["break", "job", "--yes"]);
    assert_eq!(code(&broke), 0, "{:?}", stderr_lines(&broke));
    let start = Instant::now();
    let status = wait_child(&mut run, Duration::from_secs(30));
    assert_eq!(status.code(), Some(122));
    // One refresh interval (0.5 s) to notice, no grace.
    assert!(
        start.elapsed() < Duration::from_secs(3),
        "took {:?}",
        start.elapsed()
    );
}

/// A grace as long as the TTL would let the command run after the server expired the
/// lease: refused with a usage error that says what to change.
#[test]
fn a_grace_not_shorter_than_the_ttl_is_refused() {
    let scene = Scene::local();
    let out = scene.output(&["run", "job", "--ttl", "5s", "--grace", "5s", "--", "true"]);
    let lines = stderr_lines(&out);
    assert_eq!(code(&out), 2, "{lines:?}");
    assert_eq!(lines.len(), 1, "{lines:?}");
    assert!(
        lines[0].contains("--grace") && lines[0].contains("--ttl"),
        "{lines:?}"
    );
    // The default grace (10 s) is cut to what the lease leaves, not refused.
    let out = scene.output(&["run", "job", "--ttl", "3s", "--", "true"]);
    assert_eq!(code(&out), 0, "{:?}", stderr_lines(&out));
}

/// `--margin` raises the drift allowance; one that leaves half the TTL or less, or one below
/// the default, is refused.
#[test]
fn a_margin_is_taken_and_one_eating_half_the_ttl_is_refused() {
    let scene = Scene::local();
    let out = scene.output(&["run", "job", "--ttl", "3s", "--margin", "2s", "--", "true"]);
    let lines = stderr_lines(&out);
    assert_eq!(code(&out), 2, "{lines:?}");
    assert!(lines[0].contains("margin"), "{lines:?}");
    let out = scene.output(&["run", "job", "--ttl", "3s", "--margin", "1s", "--", "true"]);
    assert_eq!(code(&out), 0, "{:?}", stderr_lines(&out));
    // It may only be raised: no option weakens the default.
    let out = scene.output(&["run", "job", "--ttl", "3s", "--margin", "0ms", "--", "true"]);
    let lines = stderr_lines(&out);
    assert_eq!(code(&out), 2, "{lines:?}");
    assert!(lines[0].contains("below the default"), "{lines:?}");
}

/// A refreshed lease runs its command to the end, past the first deadline (0.96 s after the
/// grant): the watchdog follows the guard's deadline as refreshes move it. That it reads
/// it often enough for a TTL of 50 ms is the watchdog's own test; here the TTL leaves each
/// refresh of the local store 125 ms to answer, which a loaded machine keeps.
#[test]
fn a_refreshed_lease_runs_its_command_to_the_end() {
    let scene = Scene::local();
    let out = scene.output(&["run", "job", "--ttl", "1s", "--", "sleep", "2"]);
    assert_eq!(code(&out), 0, "{:?}", stderr_lines(&out));
}

/// `memory:` locks live inside one process: two `anylock run` would both get the lock.
#[test]
fn the_memory_backend_is_refused() {
    let scene = Scene::local();
    let mut command = scene.command(&["run", "job", "--", "true"]);
    command.env("ANYLOCK_BACKEND", "memory:");
    let out = command.output().expect("run");
    let lines = stderr_lines(&out);
    assert_eq!(code(&out), 2, "{lines:?}");
    assert_eq!(lines.len(), 1, "{lines:?}");
    assert!(
        lines[0].contains("memory:") && lines[0].contains("local:"),
        "{lines:?}"
    );
}

/// A signal that arrives right after the grant, around the spawn, is forwarded to the
/// command; it never kills anylock by its default action (which would orphan the command).
#[test]
fn a_signal_right_after_the_grant_is_forwarded_not_fatal() {
    for round in 0..20 {
        let scene = Scene::local();
        let mut run = scene
            .command(&["-v", "run", "job", "--", "sleep", "30"])
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn");
        let mut stderr = BufReader::new(run.stderr.take().expect("stderr")).lines();
        for line in stderr.by_ref() {
            if line.expect("stderr line").contains("acquired") {
                break;
            }
        }
        send(run.id(), Signal::SIGINT);
        // Keep reading: anylock's later lines must not meet a closed pipe.
        std::thread::spawn(move || stderr.for_each(drop));
        let status = wait_child(&mut run, Duration::from_secs(15));
        assert_eq!(status.code(), Some(128 + 2), "round {round}: {status:?}");
    }
}

/// The supervisor of `anylock run`'s command, once it runs its own code (after exec).
fn supervisor_of(anylock: u32) -> Option<String> {
    let tasks = std::fs::read_dir(format!("/proc/{anylock}/task")).ok()?;
    tasks
        .filter_map(Result::ok)
        .flat_map(|task| {
            read(&task.path().join("children"))
                .split_whitespace()
                .map(str::to_owned)
                .collect::<Vec<_>>()
        })
        .find(|pid| read(Path::new(&format!("/proc/{pid}/cmdline"))).contains("__supervise"))
}

/// A signal forwarded to the group at any moment of the supervisor's start (before, during
/// or after it starts the command) ends the run: it is never lost in between, which would
/// leave the command running (here for 30 s).
#[test]
fn a_signal_forwarded_while_the_supervisor_starts_reaches_the_command() {
    for round in 0..50 {
        let scene = Scene::local();
        let mut run = scene.spawn(&["run", "job", "--", "sleep", "30"]);
        let start = Instant::now();
        let supervisor = loop {
            if let Some(pid) = supervisor_of(run.id()) {
                break pid;
            }
            assert!(start.elapsed() < Duration::from_secs(20), "no supervisor");
        };
        let spin = Instant::now() + Duration::from_micros(rand::random_range(0..2000));
        while Instant::now() < spin {}
        let group = nix::unistd::Pid::from_raw(supervisor.parse().expect("pid"));
        nix::sys::signal::killpg(group, Signal::SIGINT).expect("signal the group");
        let status = wait_child(&mut run, Duration::from_secs(15));
        assert_eq!(status.code(), Some(128 + 2), "round {round}: {status:?}");
    }
}

/// Redis cut off by a blackhole mid-run: the lease is lost after three failed refreshes
/// but may still be valid for a while on the server. A command that ignores SIGTERM gets
/// SIGKILL when the lease can have expired at the latest, not after the full `--grace`.
#[test]
fn the_grace_never_outlasts_the_lease_when_the_backend_is_unreachable() {
    let Some(url) = test_kit::env::require("ANYLOCK_TEST_REDIS_URL", "Redis") else {
        return;
    };
    let upstream = test_kit::env::host_port(&url).expect("host:port");
    let runtime = tokio::runtime::Runtime::new().expect("runtime");
    let proxy = runtime
        .block_on(test_kit::proxy::FaultProxy::start(
            upstream.parse().expect("address"),
        ))
        .expect("proxy");
    let via_proxy = url.replacen(upstream, &proxy.local_addr().to_string(), 1);
    let separator = if via_proxy.contains('?') { '&' } else { '?' };
    let mut scene = Scene::local();
    scene.backend = format!(
        "{via_proxy}{separator}timeout_ms=200&prefix=cli-{:016x}",
        rand::random::<u64>()
    );
    let ready = scene.path("ready");
    let script = format!(
        "trap '' TERM; touch {}; while true; do sleep 0.05; done",
        ready.display()
    );
    let args = [
        "run", "job", "--ttl", "6s", "--grace", "5900ms", "--", "sh", "-c", &script,
    ];
    let mut run = scene.spawn(&args);
    wait_until(Duration::from_secs(20), "the command to start", || {
        ready.exists()
    });
    proxy.set_fault(test_kit::proxy::Fault::Blackhole);
    let cut = Instant::now();
    let status = wait_child(&mut run, Duration::from_secs(30));
    assert_eq!(status.code(), Some(122), "{status:?}");
    // The last refresh that reached Redis was sent before the cut: the server expires the
    // lease at most 6 s after it. With the full grace the kill came about 8 s after the cut.
    assert!(
        cut.elapsed() < Duration::from_secs(7),
        "took {:?}",
        cut.elapsed()
    );
}

/// SIGKILL of `anylock` while it and the command's group are stopped (Ctrl-Z, then the job
/// is killed): the stopped group must not be resumed later to run unlocked. The kernel
/// sends an orphaned stopped group SIGHUP and SIGCONT; the command ignores SIGHUP (as under
/// `nohup`), so only the supervisor, which sees its parent gone, can stop it.
#[test]
fn killing_a_stopped_anylock_stops_the_stopped_command_for_good() {
    let scene = Scene::local();
    let script = format!("trap '' HUP; {}", ticking(&scene));
    let mut run = scene.spawn(&["run", "job", "--", "sh", "-c", &script]);
    wait_started(&scene);
    send(run.id(), Signal::SIGTSTP);
    for pid in pids(&scene.path("pids")) {
        wait_until(Duration::from_secs(5), &format!("{pid} to stop"), || {
            process_halted(&pid)
        });
    }
    run.kill().expect("SIGKILL anylock");
    run.wait().expect("reap anylock");
    wait_all_dead(&scene, Duration::from_secs(5));
}
