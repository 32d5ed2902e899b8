//! `--note` and `anylock list`, end to end with the real binary on every backend: the note
//! is stored with the lease on the server, so `status`, `list` and a waiting `run` in
//! other processes show it.

#[macro_use]
mod support;

use std::time::Duration;

use support::{Scene, code, wait_child};

fn stdout(output: &std::process::Output) -> String {
    String::from_utf8_lossy(&output.stdout).into_owned()
}

fn stderr(output: &std::process::Output) -> String {
    String::from_utf8_lossy(&output.stderr).into_owned()
}

/// `acquire NAME --owner OWNER --note NOTE`, which must succeed.
fn acquire(scene: &Scene, name: &str, owner: &str, note: Option<&str>) {
    let mut args = vec!["acquire", name, "--owner", owner, "--ttl", "5m", "-n"];
    if let Some(note) = note {
        args.extend(["--note", note]);
    }
    let out = scene.output(&args);
    assert_eq!(code(&out), 0, "acquire {name}: {}", stderr(&out));
}

fn json(text: &str) -> serde_json::Value {
    serde_json::from_str(text).unwrap_or_else(|e| panic!("not JSON ({e}): {text}"))
}

/// `status` and `list` in other processes show the note given to `acquire`; `list` shows
/// exactly the held locks under the prefix (pattern characters are literal), in order.
fn list_and_status_show_holders_and_notes(scene: &Scene) {
    let url = "https://ci.example/org/repo/actions/runs/42?attempt=1";
    acquire(scene, "deploy/web", "run-42", Some(url));
    acquire(scene, "deploy/db", "run-43", None);
    acquire(scene, "deploy_x", "run-44", Some("outside the prefix"));
    acquire(scene, "other", "run-45", None);

    let status = scene.output(&["status", "deploy/web", "--json"]);
    assert_eq!(code(&status), 0, "{}", stderr(&status));
    assert_eq!(json(&stdout(&status))["note"], url);
    let status = scene.output(&["status", "deploy/web"]);
    assert!(
        stdout(&status).contains(&format!("note:        {url}")),
        "{}",
        stdout(&status)
    );
    let status = scene.output(&["status", "deploy/db", "--json"]);
    assert!(
        json(&stdout(&status)).get("note").is_none(),
        "{}",
        stdout(&status)
    );

    let listed = scene.output(&["list", "deploy/", "--json"]);
    assert_eq!(code(&listed), 0, "{}", stderr(&listed));
    let listed = json(&stdout(&listed));
    let names: Vec<_> = listed
        .as_array()
        .expect("array")
        .iter()
        .map(|l| l["name"].clone())
        .collect();
    assert_eq!(names, ["deploy/db", "deploy/web"], "{listed}");
    assert_eq!(listed[1]["note"], url);
    assert_eq!(listed[1]["held"], true);
    assert!(
        listed[1]["owner"]
            .as_str()
            .expect("owner")
            .ends_with("run-42"),
        "{listed}"
    );
    assert!(
        listed[1]["expires_in_ms"].as_u64().expect("expiry") > 60_000,
        "{listed}"
    );

    // `_` is a literal, not SQL's "any character": `deploy_` matches only `deploy_x`.
    let listed = scene.output(&["list", "deploy_", "--json"]);
    let listed = json(&stdout(&listed));
    assert_eq!(listed.as_array().expect("array").len(), 1, "{listed}");
    assert_eq!(listed[0]["name"], "deploy_x");

    let table = scene.output(&["list", "deploy/"]);
    let text = stdout(&table);
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), 3, "header and two locks: {text}");
    assert!(lines[0].starts_with("NAME"), "{text}");
    assert!(lines[1].starts_with("deploy/db"), "{text}");
    assert!(
        lines[2].starts_with("deploy/web") && lines[2].ends_with(url),
        "{text}"
    );

    let out = scene.output(&["release", "deploy/web", "--owner", "run-42"]);
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    let listed = json(&stdout(&scene.output(&["list", "deploy/", "--json"])));
    assert_eq!(listed.as_array().expect("array").len(), 1, "{listed}");
    let empty = scene.output(&["list", "nothing-here/"]);
    assert_eq!(code(&empty), 0, "{}", stderr(&empty));
    assert_eq!(stdout(&empty), "");
    assert!(
        stderr(&empty).contains("no lock is held under \"nothing-here/\""),
        "{}",
        stderr(&empty)
    );
    let all = json(&stdout(&scene.output(&["list", "--json"])));
    assert_eq!(all.as_array().expect("array").len(), 3, "{all}");
}

/// A waiting `run` names the holder's note, so a blocked pipeline says which run blocks it.
fn a_waiting_run_shows_the_holders_note(scene: &Scene) {
    acquire(scene, "deploy", "run-7", Some("deploy of v1.2 by run 7"));
    let mut child = scene.spawn(&["run", "deploy", "-w", "2", "--", "true"]);
    let status = wait_child(&mut child, Duration::from_secs(60));
    let out = child.wait_with_output().expect("output");
    assert_eq!(status.code(), Some(124), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("(deploy of v1.2 by run 7)"),
        "{}",
        stderr(&out)
    );
}

/// `run --note` stores the note while the command runs, and the next holder's lease
/// without one shows none.
fn run_note_lives_and_dies_with_its_lease(scene: &Scene) {
    let out = scene.output(&[
        "run",
        "job",
        "--note",
        "nightly on runner-3",
        "-c",
        "\"$ANYLOCK_BIN\" status job --json",
    ]);
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    assert_eq!(json(&stdout(&out))["note"], "nightly on runner-3");
    let out = scene.output(&["run", "job", "-c", "\"$ANYLOCK_BIN\" status job --json"]);
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    assert!(
        json(&stdout(&out)).get("note").is_none(),
        "{}",
        stdout(&out)
    );
}

/// A note that is not one short line is refused before anything is taken; an empty one is
/// no note.
fn a_bad_note_is_refused(scene: &Scene) {
    for bad in ["two\nlines", &"x".repeat(513), "bidi\u{202e}override"] {
        let out = scene.output(&["run", "job", "--note", bad, "--", "true"]);
        assert_eq!(code(&out), 2, "{bad:?}: {}", stderr(&out));
        assert!(stderr(&out).contains("note"), "{}", stderr(&out));
    }
    let status = scene.output(&["status", "job"]);
    assert_eq!(code(&status), 1, "nothing was taken: {}", stdout(&status));
    // Empty is no note: `--note "$CI_JOB_URL"` with the variable unset still runs.
    let empty = scene.output(&[
        "run",
        "job",
        "--note",
        "",
        "-c",
        "\"$ANYLOCK_BIN\" status job --json",
    ]);
    assert_eq!(code(&empty), 0, "{}", stderr(&empty));
    assert!(
        json(&stdout(&empty)).get("note").is_none(),
        "{}",
        stdout(&empty)
    );
    let from_env = scene
        .command(&["run", "job", "--", "true"])
        .env("ANYLOCK_NOTE", " ")
        .output()
        .expect("run");
    assert_eq!(code(&from_env), 0, "{}", stderr(&from_env));
}

/// An owner written by anyone who can write the lock store (terminal escapes, a bidi
/// override) and a name with a bidi override reach the terminal only as U+FFFD: `list`,
/// `status` and a waiting `run` print no escape byte.
fn hostile_owners_and_names_reach_no_terminal(scene: &Scene) {
    use anylock::lockcore::{Acquire, AcquireRequest, Identity, LockName};
    let evil_owner = "mallory\x1b]0;pwned\x07\x1b[31m\u{202e}";
    let name = "deploy-\u{202e}cod.exe";
    let runtime = tokio::runtime::Runtime::new().expect("runtime");
    runtime.block_on(async {
        let backend = anylock::connect(&scene.backend).await.expect("connect");
        let request = AcquireRequest::new(
            LockName::new(name).expect("name"),
            Identity::from_stored(evil_owner),
            lockcore::Ttl::new(Duration::from_secs(300)).expect("valid TTL"),
        );
        let outcome = backend.acquire(&request).await.expect("acquire");
        assert!(matches!(outcome, Acquire::Acquired(_)), "{outcome:?}");
    });
    let mut child = scene.spawn(&["run", name, "-w", "1", "--", "true"]);
    wait_child(&mut child, Duration::from_secs(60));
    let waited = child.wait_with_output().expect("output");
    let outputs = [
        scene.output(&["list"]),
        scene.output(&["status", name]),
        scene.output(&["run", name, "-n", "--", "true"]),
        waited,
    ];
    for out in &outputs {
        for stream in [&out.stdout, &out.stderr] {
            let text = String::from_utf8_lossy(stream);
            assert!(
                !text.contains(['\x1b', '\x07', '\u{202e}']),
                "raw: {text:?}"
            );
        }
    }
    assert!(
        stdout(&outputs[0]).contains("mallory\u{fffd}]0;pwned"),
        "{}",
        stdout(&outputs[0])
    );
    // JSON escapes the control characters and keeps the stored owner exact.
    let listed = json(&stdout(&scene.output(&["list", "--json"])));
    assert_eq!(listed[0]["owner"], evil_owner);
}

on_all_five_backends!(
    hostile_owners_and_names_reach_no_terminal,
    list_and_status_show_holders_and_notes,
    a_waiting_run_shows_the_holders_note,
    run_note_lives_and_dies_with_its_lease,
    a_bad_note_is_refused,
);
