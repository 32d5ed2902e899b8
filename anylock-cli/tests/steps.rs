//! End-to-end tests of holding one lock across CI steps (`acquire`, `verify`, `release`
//! with `--owner`) and of `run --hold-at-least`, with the real binary on the embedded
//! backend, PostgreSQL and Redis. Every step is its own process, as on a CI runner.

#[macro_use]
mod support;

use std::process::Output;
use std::time::{Duration, Instant};

use support::{Scene, code, stderr_lines};

fn stdout(out: &Output) -> String {
    String::from_utf8_lossy(&out.stdout).to_string()
}

/// The value of `KEY=` in `acquire`'s output.
fn line(out: &Output, key: &str) -> String {
    let text = stdout(out);
    text.lines()
        .find_map(|l| l.strip_prefix(&format!("{key}=")))
        .unwrap_or_else(|| panic!("no {key}= in {text:?} {:?}", stderr_lines(out)))
        .to_owned()
}

fn token(out: &Output) -> u64 {
    line(out, "ANYLOCK_FENCE_TOKEN").parse().expect("a number")
}

/// `acquire` in one process holds the lock after it exits: others are refused or wait;
/// `verify` and `release` by the owner in later processes, nothing by anyone else.
fn a_lock_acquired_in_one_step_is_held_until_its_owner_releases_it(scene: &Scene) {
    let acquired = scene.output(&["acquire", "deploy", "--owner", "ci-1", "--ttl", "2m"]);
    assert_eq!(code(&acquired), 0, "{:?}", stderr_lines(&acquired));
    assert_eq!(line(&acquired, "ANYLOCK_NAME"), "deploy");
    assert_eq!(line(&acquired, "ANYLOCK_OWNER"), "ci-1");
    let first = token(&acquired);
    assert!(!line(&acquired, "ANYLOCK_EXPIRES_AT").is_empty());

    // The acquiring process is gone; the lease is not.
    let refused = scene.output(&["run", "deploy", "-n", "--", "true"]);
    assert_eq!(code(&refused), 123, "{:?}", stderr_lines(&refused));
    let waited = scene.output(&["run", "deploy", "-w", "1", "--", "true"]);
    assert_eq!(code(&waited), 124, "{:?}", stderr_lines(&waited));
    let other = scene.output(&["acquire", "deploy", "--owner", "ci-2", "-n"]);
    assert_eq!(code(&other), 123, "{:?}", stderr_lines(&other));
    let skipped = scene.output(&["acquire", "deploy", "--owner", "ci-2", "-n", "-E", "0"]);
    assert_eq!(code(&skipped), 0, "{:?}", stderr_lines(&skipped));
    assert!(
        stdout(&skipped).is_empty(),
        "no ANYLOCK_ lines when not acquired"
    );

    let verified = scene.output(&["verify", "deploy", "--owner", "ci-1"]);
    assert_eq!(code(&verified), 0, "{:?}", stderr_lines(&verified));
    assert!(
        stdout(&verified).contains(&format!("fence token {first}"))
            && stdout(&verified).contains("expires in"),
        "{}",
        stdout(&verified)
    );
    let not_ours = scene.output(&["verify", "deploy", "--owner", "ci-2"]);
    assert_eq!(code(&not_ours), 122, "{:?}", stderr_lines(&not_ours));

    // A wrong owner's release touches nothing.
    let wrong = scene.output(&["release", "deploy", "--owner", "ci-2"]);
    assert_eq!(code(&wrong), 122, "{:?}", stderr_lines(&wrong));
    let lines = stderr_lines(&wrong);
    assert!(
        lines.len() == 1 && lines[0].contains("not held by owner ci-2"),
        "{lines:?}"
    );
    let status = scene.output(&["status", "deploy", "--json"]);
    let status: serde_json::Value = serde_json::from_slice(&status.stdout).expect("JSON");
    assert_eq!(status["owner"], "~owner/ci-1", "{status}");
    assert_eq!(status["fence_token"], first, "{status}");

    // Acquiring again as the same owner renews: a new grant with a higher token.
    let renewed = scene.output(&["acquire", "deploy", "--owner", "ci-1", "--json"]);
    assert_eq!(code(&renewed), 0, "{:?}", stderr_lines(&renewed));
    let renewed: serde_json::Value = serde_json::from_slice(&renewed.stdout).expect("JSON");
    let second = renewed["fence_token"].as_u64().expect("a token");
    assert!(second > first, "{first} then {second}");
    assert_eq!(
        renewed["ttl_ms"],
        30 * 60 * 1000,
        "the default TTL: {renewed}"
    );

    // The owner from the environment, as a later step gets it from $GITHUB_ENV.
    let verified = scene
        .command(&["verify", "deploy", "--json"])
        .env("ANYLOCK_OWNER", "ci-1")
        .output()
        .expect("verify");
    assert_eq!(code(&verified), 0, "{:?}", stderr_lines(&verified));
    let verified: serde_json::Value = serde_json::from_slice(&verified.stdout).expect("JSON");
    assert_eq!(verified["held"], true);
    assert_eq!(verified["fence_token"], second);

    let released = scene.output(&["release", "deploy", "--owner", "ci-1"]);
    assert_eq!(code(&released), 0, "{:?}", stderr_lines(&released));
    let gone = scene.output(&["verify", "deploy", "--owner", "ci-1"]);
    assert_eq!(code(&gone), 122, "{:?}", stderr_lines(&gone));
    let again = scene.output(&["release", "deploy", "--owner", "ci-1"]);
    assert_eq!(
        code(&again),
        122,
        "released twice: {:?}",
        stderr_lines(&again)
    );
    let free = scene.output(&["status", "deploy"]);
    assert_eq!(code(&free), 1, "the second release acquired nothing");
    let runs = scene.output(&["run", "deploy", "-n", "--", "true"]);
    assert_eq!(code(&runs), 0, "{:?}", stderr_lines(&runs));
}

/// A lease acquired with a short TTL ends by itself: `verify` says so.
fn an_expired_step_lease_is_reported_lost_and_frees_the_lock(scene: &Scene) {
    let acquired = scene.output(&["acquire", "short", "--owner", "ci-1", "--ttl", "1s"]);
    assert_eq!(code(&acquired), 0, "{:?}", stderr_lines(&acquired));
    std::thread::sleep(Duration::from_millis(1300));
    let lost = scene.output(&["verify", "short", "--owner", "ci-1"]);
    assert_eq!(code(&lost), 122, "{:?}", stderr_lines(&lost));
    let runs = scene.output(&["run", "short", "-n", "--", "true"]);
    assert_eq!(code(&runs), 0, "{:?}", stderr_lines(&runs));
}

/// ShedLock's lockAtLeastFor: a job that finished at once still keeps a late run on
/// another node out until acquisition + DUR, and no longer.
fn hold_at_least_keeps_a_quick_job_locked_for_the_duration(scene: &Scene) {
    let started = Instant::now();
    let quick = scene.output(&["run", "cron", "--hold-at-least", "3s", "--", "true"]);
    assert_eq!(code(&quick), 0, "{:?}", stderr_lines(&quick));
    let late = scene.output(&["run", "cron", "-n", "--", "true"]);
    assert_eq!(code(&late), 123, "{:?}", stderr_lines(&late));
    let freed = loop {
        let attempt = scene.output(&["run", "cron", "-n", "--", "true"]);
        if code(&attempt) == 0 {
            break started.elapsed();
        }
        assert_eq!(code(&attempt), 123, "{:?}", stderr_lines(&attempt));
        assert!(started.elapsed() < Duration::from_secs(10), "never freed");
        std::thread::sleep(Duration::from_millis(200));
    };
    assert!(freed >= Duration::from_secs(3), "freed after {freed:?}");

    // A job that ran longer than DUR releases as usual.
    let long = scene.output(&["run", "cron", "--hold-at-least", "1s", "--", "sleep", "1.2"]);
    assert_eq!(code(&long), 0, "{:?}", stderr_lines(&long));
    let next = scene.output(&["run", "cron", "-n", "--", "true"]);
    assert_eq!(code(&next), 0, "{:?}", stderr_lines(&next));

    let too_long = scene.output(&[
        "run",
        "cron",
        "--ttl",
        "2s",
        "--hold-at-least",
        "3s",
        "--",
        "true",
    ]);
    assert_eq!(code(&too_long), 2, "{:?}", stderr_lines(&too_long));
}

on_every_backend!(
    a_lock_acquired_in_one_step_is_held_until_its_owner_releases_it,
    an_expired_step_lease_is_reported_lost_and_frees_the_lock,
    hold_at_least_keeps_a_quick_job_locked_for_the_duration,
);

#[test]
fn a_bad_owner_is_refused_with_exit_code_2() {
    let scene = Scene::local();
    for bad in ["", "two words", "~auto-1"] {
        let out = scene.output(&["acquire", "x", "--owner", bad]);
        let lines = stderr_lines(&out);
        assert_eq!(code(&out), 2, "{bad:?}: {lines:?}");
        assert!(
            lines.len() == 1 && lines[0].contains("--owner"),
            "{lines:?}"
        );
    }
    let missing = scene
        .command(&["verify", "x"])
        .env_remove("ANYLOCK_OWNER")
        .output()
        .expect("run");
    assert_eq!(code(&missing), 2, "{:?}", stderr_lines(&missing));
}
