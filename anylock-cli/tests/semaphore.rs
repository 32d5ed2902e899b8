//! End-to-end: `anylock run NAME --permits N` runs at most N commands at once (a
//! semaphore), on every backend that has semaphores, and refuses plainly where there are
//! none.

#[macro_use]
mod support;

use std::process::Child;
use std::time::Duration;

use support::{Scene, code, wait_child};

/// How many commands contend, and the permits they share.
const RUNS: usize = 5;
const PERMITS: usize = 2;

/// The most commands inside at once, from their `+ ns` / `- ns` lines in `log` (one
/// machine, one clock; appends of one short line are atomic).
fn most_inside(log: &str) -> usize {
    let mut events: Vec<(u128, i32)> = log
        .lines()
        .filter_map(|line| {
            let (sign, at) = line.split_once(' ')?;
            let at: u128 = at.trim().parse().ok()?;
            Some((at, if sign == "+" { 1 } else { -1 }))
        })
        .collect();
    assert_eq!(
        events.len(),
        2 * RUNS,
        "every run logs its start and end:\n{log}"
    );
    // At one instant an end counts before a start.
    events.sort();
    let (mut inside, mut most) = (0, 0);
    for (_, step) in events {
        inside += step;
        most = most.max(inside);
    }
    usize::try_from(most).expect("never negative")
}

/// Five `run --permits 2` at once: at most two commands inside, and two do meet (or the
/// check would pass for a lock too); all five run.
fn at_most_n_commands_run_at_once(scene: &Scene) {
    let log = scene.path("log");
    let script = format!(
        "echo \"+ $(date +%s%N)\" >> {log}; sleep 0.6; echo \"- $(date +%s%N)\" >> {log}",
        log = log.display()
    );
    let permits = PERMITS.to_string();
    let args = [
        "run",
        "job",
        "--permits",
        &permits,
        "--ttl",
        "30s",
        "-c",
        &script,
    ];
    let mut runs: Vec<Child> = (0..RUNS).map(|_| scene.spawn(&args)).collect();
    for run in &mut runs {
        let status = wait_child(run, Duration::from_secs(60));
        assert_eq!(status.code(), Some(0), "a run failed");
    }
    let most = most_inside(&std::fs::read_to_string(&log).expect("log"));
    assert!(
        most <= PERMITS,
        "{most} commands ran at once under --permits {PERMITS}"
    );
    assert_eq!(
        most, PERMITS,
        "never {PERMITS} at once: the permits acted as a lock"
    );
}

/// A semaphore and the lock of the same name do not exclude each other.
fn a_semaphore_is_apart_from_the_lock_of_its_name(scene: &Scene) {
    let mut holder = scene.spawn(&["run", "job", "--ttl", "30s", "--", "sleep", "30"]);
    support::wait_until(Duration::from_secs(20), "the lock is held", || {
        code(&scene.output(&["status", "job"])) == 0
    });
    let out = scene.output(&["run", "job", "--permits", "2", "--no-wait", "--", "true"]);
    assert_eq!(code(&out), 0, "{}", String::from_utf8_lossy(&out.stderr));
    stop(&mut holder);
}

/// `status --permits` lists the live permits (the lock of the name stays free), and
/// says so when none is held.
fn status_lists_the_permits(scene: &Scene) {
    let mut holders = Vec::new();
    for who in ["a", "b"] {
        let ready = scene.path(who);
        let script = format!("touch {}; sleep 30", ready.display());
        holders.push(scene.spawn(&["run", "job", "--permits", "3", "--note", who, "-c", &script]));
        support::wait_until(Duration::from_secs(20), "a permit is held", || {
            ready.exists()
        });
    }
    let out = scene.output(&["status", "job", "--permits", "--json"]);
    assert_eq!(code(&out), 0, "{}", String::from_utf8_lossy(&out.stderr));
    let shown: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON");
    let permits = shown["permits"].as_array().expect("an array of permits");
    let notes: Vec<&str> = permits.iter().filter_map(|p| p["note"].as_str()).collect();
    assert_eq!(notes, ["a", "b"], "earliest grant first: {shown}");
    assert_eq!(
        code(&scene.output(&["status", "job"])),
        1,
        "the lock job is free"
    );
    for holder in &mut holders {
        stop(holder);
    }
    let out = scene.output(&["status", "job", "--permits"]);
    assert_eq!(code(&out), 1);
    assert!(String::from_utf8_lossy(&out.stdout).contains("no permit is held"));
}

/// Stops a holding `anylock run` the way a person would (SIGTERM: it stops its command and
/// releases).
fn stop(holder: &mut Child) {
    support::send(holder.id(), nix::sys::signal::Signal::SIGTERM);
    wait_child(holder, Duration::from_secs(30));
}

on_all_five_backends!(
    at_most_n_commands_run_at_once,
    a_semaphore_is_apart_from_the_lock_of_its_name,
    status_lists_the_permits
);

#[test]
fn bad_permit_counts_are_usage_errors() {
    let scene = Scene::local();
    for bad in ["0", "-1", "10001", "two", ""] {
        let out = scene.output(&["run", "job", "--permits", bad, "--", "true"]);
        assert_eq!(code(&out), 2, "--permits {bad:?}");
    }
}

#[test]
fn mixed_permit_counts_are_refused() {
    let scene = Scene::local();
    let ready = scene.path("ready");
    let script = format!("touch {}; sleep 30", ready.display());
    let mut holder = scene.spawn(&["run", "job", "--permits", "2", "-c", &script]);
    support::wait_until(Duration::from_secs(20), "a permit is held", || {
        ready.exists()
    });
    let out = scene.output(&["run", "job", "--permits", "3", "--no-wait", "--", "true"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(code(&out), 2, "{stderr}");
    assert!(stderr.contains("same limit"), "{stderr}");
    stop(&mut holder);
}

/// Redlock has no semaphores (a count over a majority is not a count): a permit is
/// refused with a message, and the command never runs.
#[test]
fn a_backend_without_semaphores_refuses_plainly() {
    let Some(urls) = test_kit::env::require("ANYLOCK_TEST_REDLOCK_URLS", "Redlock") else {
        return;
    };
    let hosts: Vec<&str> = (urls.split(','))
        .map(|url| {
            url.trim()
                .trim_start_matches("redis://")
                .trim_end_matches('/')
        })
        .collect();
    let scene = Scene::local();
    let prefix = format!("cli-{:016x}", rand::random::<u64>());
    let backend = format!("redlock://{}/?prefix={prefix}", hosts.join(","));
    let marker = scene.path("ran");
    let script = format!("touch {}", marker.display());
    let out = scene
        .command(&["run", "job", "--permits", "2", "-c", &script])
        .env("ANYLOCK_BACKEND", &backend)
        .output()
        .expect("run anylock");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(code(&out), 125, "{stderr}");
    assert!(stderr.contains("no semaphores"), "{stderr}");
    assert!(!marker.exists(), "the command ran without a permit");
    // `status --permits` says the same, without the lock-only hint.
    let out = scene
        .command(&["status", "job", "--permits"])
        .env("ANYLOCK_BACKEND", &backend)
        .output()
        .expect("run anylock");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(code(&out), 125, "{stderr}");
    assert!(stderr.contains("no semaphores"), "{stderr}");
    assert!(
        !stderr.contains("own tools"),
        "a lock hint for a semaphore: {stderr}"
    );
}
