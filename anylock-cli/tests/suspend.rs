//! A machine suspend while `anylock run` holds the lock: every process stops, the lock
//! server's clock runs on, and the holder's monotonic clock skips the suspended time (see
//! `test_kit::suspend`). After the resume the command must not run inside the next
//! holder's section, and `anylock` exits 122. On Redis (the server decides expiry).

mod support;

use std::path::Path;
use std::process::Child;
use std::time::{Duration, Instant};

use nix::sys::signal::Signal;
use nix::unistd::Pid;
use support::{Scene, code, pids, read, send, stderr_lines, wait_child, wait_until};
use test_kit::proxy::{Fault, FaultProxy};
use test_kit::suspend::{Freezer, MonotonicSkip};

/// What the holders hold: a lock, the one permit of a semaphore, or leadership.
#[derive(Clone, Copy)]
enum How {
    Lock,
    Permit,
    Leader,
}

impl How {
    fn args(self) -> Vec<&'static str> {
        match self {
            Self::Lock => vec!["run", "job"],
            Self::Permit => vec!["run", "job", "--permits", "1"],
            Self::Leader => vec!["elect", "job"],
        }
    }
}

/// The old holder's command: its pid, then a wall-clock timestamp (ns) every 20 ms.
fn beating(scene: &Scene) -> String {
    format!(
        "echo $$ >> {}; while true; do date +%s%N >> {}; sleep 0.02; done",
        scene.path("pids").display(),
        scene.path("beats").display()
    )
}

fn beats(scene: &Scene) -> Vec<u128> {
    let text = read(&scene.path("beats"));
    text.lines().filter_map(|l| l.trim().parse().ok()).collect()
}

/// The command's process group (its supervisor leads it).
fn group_of(pid: &str) -> Pid {
    let stat = read(Path::new(&format!("/proc/{pid}/stat")));
    let after_name = &stat[stat.rfind(')').expect("stat") + 2..];
    let pgrp = after_name.split(' ').nth(2).expect("pgrp field");
    Pid::from_raw(pgrp.parse().expect("a pgrp"))
}

/// The Redis URL through a fault proxy (which the test can blackhole), with a fresh
/// prefix; and the direct URL with the same prefix, for the next holder.
struct Redis {
    proxy: FaultProxy,
    via_proxy: String,
    direct: String,
    _runtime: tokio::runtime::Runtime,
}

fn redis() -> Option<Redis> {
    let url = test_kit::env::require("ANYLOCK_TEST_REDIS_URL", "Redis")?;
    let upstream = test_kit::env::host_port(&url).expect("host:port");
    let runtime = tokio::runtime::Runtime::new().expect("runtime");
    let proxy = runtime
        .block_on(FaultProxy::start(upstream.parse().expect("address")))
        .expect("proxy");
    let separator = if url.contains('?') { '&' } else { '?' };
    let direct = format!("{url}{separator}prefix=cli-{:016x}", rand::random::<u64>());
    let via_proxy = direct.replacen(upstream, &proxy.local_addr().to_string(), 1);
    Some(Redis {
        proxy,
        via_proxy: format!("{via_proxy}&timeout_ms=200"),
        direct,
        _runtime: runtime,
    })
}

/// Starts the old holder (TTL 2 s) through the proxy, with the monotonic skip preloaded;
/// returns once its command beats.
fn start_holder(scene: &Scene, redis: &Redis, skip: &MonotonicSkip, how: How) -> Child {
    let beating = beating(scene);
    let mut args = how.args();
    args.extend(["--ttl", "2s", "--", "sh", "-c", &beating]);
    let mut command = scene.command(&args);
    command
        .env("ANYLOCK_BACKEND", &redis.via_proxy)
        .envs(skip.env())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped());
    let run = command.spawn().expect("spawn anylock");
    wait_until(Duration::from_secs(20), "the command to beat", || {
        beats(scene).len() > 3
    });
    run
}

/// The next holder, on Redis directly: a 3 s section whose start and end (wall clock, ns)
/// it writes to `start` and `end`. Returns once it has started.
fn start_next_holder(scene: &Scene, redis: &Redis, how: How) -> Child {
    let section = format!(
        "date +%s%N > {0}.tmp && mv {0}.tmp {0}; sleep 3; date +%s%N > {1}",
        scene.path("start").display(),
        scene.path("end").display()
    );
    let mut args = how.args();
    args.extend(["--wait", "20s", "--", "sh", "-c", &section]);
    let mut command = scene.command(&args);
    command.env("ANYLOCK_BACKEND", &redis.direct);
    let next = command.spawn().expect("spawn the next holder");
    wait_until(Duration::from_secs(20), "the next holder to start", || {
        scene.path("start").exists()
    });
    next
}

/// Waits for both holders; checks the old one exited 122 having seen its lease run out,
/// and that none of its command's beats fell inside the next holder's section.
fn check_no_overlap(scene: &Scene, run: Child, mut next: Child) {
    let out = run.wait_with_output().expect("wait for anylock");
    let stderr = stderr_lines(&out);
    assert_eq!(code(&out), 122, "{stderr:?}");
    assert!(
        stderr.iter().any(|l| l.contains("validity expired")),
        "lost for another reason: {stderr:?}"
    );
    assert_eq!(
        wait_child(&mut next, Duration::from_secs(20)).code(),
        Some(0)
    );
    let parse = |file: &str| -> u128 { read(&scene.path(file)).trim().parse().expect("a time") };
    let (start, end) = (parse("start"), parse("end"));
    let inside: Vec<u128> = beats(scene)
        .into_iter()
        .filter(|b| (start..=end).contains(b))
        .collect();
    assert!(
        inside.is_empty(),
        "{} beats of the old holder inside the next one's section",
        inside.len()
    );
}

/// Every process in the process group `group`.
fn members(group: Pid) -> Vec<u32> {
    let mut pids = Vec::new();
    for entry in std::fs::read_dir("/proc").expect("/proc").flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(entry.path().join("stat")) else {
            continue;
        };
        let Some(close) = stat.rfind(')') else {
            continue;
        };
        let pgrp = stat[close + 2..].split(' ').nth(2);
        if pgrp == Some(&group.as_raw().to_string()) {
            pids.push(pid);
        }
    }
    pids
}

/// The machine suspends for longer than the lease: every process of the holder is frozen
/// (a cgroup freezer: no signal, as in a real suspend) and, once thawed, its monotonic
/// clock has skipped the frozen time. Meanwhile the next holder takes the lock. At the
/// resume the old holder's connection is cut, so only its own clock can tell it that the
/// lease is gone; all its processes thaw at once, as they do after a suspend. Without
/// the suspend counted, anylock believes in its lease for up to 2 s more, and the command
/// beats inside the next holder's section.
fn a_suspend_past_the_lease_kills_the_command_at_resume(how: How) {
    let Some(redis) = redis() else { return };
    let scene = Scene::local();
    let skip = MonotonicSkip::new(&scene.dir);
    let run = start_holder(&scene, &redis, &skip, how);
    let shell = pids(&scene.path("pids")).remove(0);
    let freezer = Freezer::new("suspend");
    freezer.add(run.id());
    // The shell first: what it starts from now on is born frozen with it.
    freezer.add(shell.parse().expect("a pid"));
    for pid in members(group_of(&shell)) {
        freezer.add(pid);
    }
    freezer.freeze();
    let frozen = Instant::now();
    let next = start_next_holder(&scene, &redis, how);
    redis.proxy.set_fault(Fault::Blackhole);
    skip.add(frozen.elapsed());
    freezer.thaw();
    check_no_overlap(&scene, run, next);
}

#[test]
fn a_suspend_past_a_lock_kills_the_command_at_resume() {
    a_suspend_past_the_lease_kills_the_command_at_resume(How::Lock);
}

#[test]
fn a_suspend_past_a_permit_kills_the_command_at_resume() {
    a_suspend_past_the_lease_kills_the_command_at_resume(How::Permit);
}

#[test]
fn a_suspend_past_leadership_kills_the_command_at_resume() {
    a_suspend_past_the_lease_kills_the_command_at_resume(How::Leader);
}

/// Ctrl-Z, then the machine suspends for longer than the lease, then `fg`: anylock must
/// not continue its command (the lease is gone), but kill it still stopped, at once.
#[test]
fn ctrl_z_then_a_suspend_then_fg_kills_the_stopped_command() {
    let Some(redis) = redis() else { return };
    let scene = Scene::local();
    let skip = MonotonicSkip::new(&scene.dir);
    let run = start_holder(&scene, &redis, &skip, How::Lock);
    send(run.id(), Signal::SIGTSTP);
    let anylock = run.id().to_string();
    wait_until(Duration::from_secs(5), "anylock to stop", || {
        support::process_stopped(&anylock)
    });
    let stopped = Instant::now();
    let next = start_next_holder(&scene, &redis, How::Lock);
    redis.proxy.set_fault(Fault::Blackhole);
    skip.add(stopped.elapsed());
    send(run.id(), Signal::SIGCONT);
    check_no_overlap(&scene, run, next);
}
