//! End-to-end: `anylock elect` runs its command only while leader, `anylock leader` shows
//! who leads (once, or at each change with `--watch`).

#[macro_use]
mod support;

use std::io::{BufRead, BufReader};
use std::sync::mpsc;
use std::time::Duration;

use support::{Scene, code, wait_child};

fn json(output: &std::process::Output) -> serde_json::Value {
    serde_json::from_slice(&output.stdout).expect("one JSON object on stdout")
}

/// A leader runs, a second candidate with `--no-wait` is refused (123), `leader` shows
/// the first one's value and term; once it stops, nobody leads (exit 1).
fn elect_runs_the_command_only_while_leader(scene: &Scene) {
    let ready = scene.path("ready");
    let script = format!("touch {}; sleep 30", ready.display());
    let mut first = scene.spawn(&["elect", "job", "--note", "node-a", "-c", &script]);
    support::wait_until(Duration::from_secs(20), "the first candidate leads", || {
        ready.exists()
    });
    let second = scene.output(&["elect", "job", "--no-wait", "--", "true"]);
    assert_eq!(
        code(&second),
        123,
        "{}",
        String::from_utf8_lossy(&second.stderr)
    );
    let shown = scene.output(&["leader", "job", "--json"]);
    assert_eq!(code(&shown), 0);
    let shown = json(&shown);
    assert_eq!(shown["leader"], true, "{shown}");
    assert_eq!(shown["value"], "node-a", "{shown}");
    assert!(
        shown["term"].as_u64().is_some(),
        "every backend here fences: {shown}"
    );
    support::send(first.id(), nix::sys::signal::Signal::SIGTERM);
    wait_child(&mut first, Duration::from_secs(30));
    let none = scene.output(&["leader", "job"]);
    assert_eq!(code(&none), 1);
    assert!(String::from_utf8_lossy(&none.stdout).contains("has no leader"));
}

on_all_five_backends!(elect_runs_the_command_only_while_leader);

/// `leader --watch --json` prints nobody, then the new leader with its value, then nobody
/// again after it resigned (each term lasts longer than the watch's half-second poll).
#[test]
fn leader_watch_prints_each_change() {
    let scene = Scene::local();
    let mut watch = scene.spawn(&["leader", "job", "--watch", "--json"]);
    let stdout = watch.stdout.take().expect("piped stdout");
    let (lines, seen) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            if lines.send(line).is_err() {
                return;
            }
        }
    });
    let next = || -> serde_json::Value {
        let line = seen.recv_timeout(Duration::from_secs(20)).expect("a line");
        serde_json::from_str(&line).expect("a JSON line")
    };
    assert_eq!(next()["leader"], false);
    let term = scene.output(&["elect", "job", "--note", "node-b", "--", "sleep", "2"]);
    assert_eq!(code(&term), 0, "{}", String::from_utf8_lossy(&term.stderr));
    let led = next();
    assert_eq!(led["leader"], true, "{led}");
    assert_eq!(led["value"], "node-b", "{led}");
    assert_eq!(next()["leader"], false);
    let _ = watch.kill();
    let _ = watch.wait();
}

#[test]
fn elect_takes_no_permits() {
    let scene = Scene::local();
    let out = scene.output(&["elect", "job", "--permits", "2", "--", "true"]);
    assert_eq!(code(&out), 2);
    assert!(String::from_utf8_lossy(&out.stderr).contains("one leader"));
}
