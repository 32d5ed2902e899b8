//! End-to-end tests of the `anylock` binary: real processes, real signals, real backends.
//! Each runs against the embedded backend and, where its server is configured, against
//! PostgreSQL (`ANYLOCK_TEST_POSTGRES_URL`) too.

#[macro_use]
mod support;

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use support::{Scene, code, process_dead, read, stderr_lines, wait_child, wait_until};

fn the_readme_first_command_runs_and_passes_the_exit_code(scene: &Scene) {
    let out = scene.output(&["run", "demo", "--", "echo", "hello"]);
    assert_eq!(code(&out), 0, "{out:?}");
    assert_eq!(String::from_utf8_lossy(&out.stdout), "hello\n");
    let out = scene.output(&["run", "demo", "--", "sh", "-c", "exit 7"]);
    assert_eq!(code(&out), 7);
    let out = scene.output(&["run", "demo", "--", "sh", "-c", "kill -KILL $$"]);
    assert_eq!(code(&out), 128 + 9, "killed by a signal: 128 + N");
    // The command sees the lock's name and fence token; each run gets a higher token
    // (where a counter starts differs by backend: 1, or Redis's server clock).
    let token = || {
        let out = scene.output(&[
            "run",
            "demo",
            "--",
            "sh",
            "-c",
            "echo $ANYLOCK_NAME:$ANYLOCK_FENCE_TOKEN",
        ]);
        let text = String::from_utf8_lossy(&out.stdout).trim().to_owned();
        let token = text
            .strip_prefix("demo:")
            .unwrap_or_else(|| panic!("{text:?}"));
        token
            .parse::<u64>()
            .unwrap_or_else(|e| panic!("{text:?}: {e}"))
    };
    let (first, second) = (token(), token());
    assert!(first >= 4 && second > first, "{first} then {second}");
}

fn contending_runs_never_overlap(scene: &Scene) {
    let log = scene.path("log");
    let script = format!(
        "echo start $$ >> {0}; sleep 0.3; echo end $$ >> {0}",
        log.display()
    );
    let runs: Vec<Child> = (0..4)
        .map(|_| scene.spawn(&["run", "shared", "--", "sh", "-c", &script]))
        .collect();
    for mut run in runs {
        let status = wait_child(&mut run, Duration::from_secs(60));
        let mut stderr = String::new();
        std::io::Read::read_to_string(&mut run.stderr.take().expect("stderr"), &mut stderr)
            .expect("read stderr");
        assert!(status.success(), "{status:?}: {stderr}");
    }
    let lines: Vec<String> = read(&log).lines().map(str::to_owned).collect();
    assert_eq!(lines.len(), 8, "{lines:?}");
    for pair in lines.chunks(2) {
        let start = pair[0].strip_prefix("start ").expect("a start line");
        assert_eq!(
            pair[1],
            format!("end {start}"),
            "critical sections overlapped: {lines:?}"
        );
    }
}

fn no_wait_on_a_held_lock_and_a_wait_timeout_have_their_own_codes(scene: &Scene) {
    let marker = scene.path("holding");
    let hold = format!("touch {}; sleep 5", marker.display());
    let mut holder = scene.spawn(&["run", "job", "--", "sh", "-c", &hold]);
    wait_until(Duration::from_secs(20), "the holder to start", || {
        marker.exists()
    });
    let out = scene.output(&["run", "job", "--no-wait", "--", "true"]);
    assert_eq!(code(&out), 123, "{:?}", stderr_lines(&out));
    assert!(
        stderr_lines(&out).iter().any(|l| l.contains("held by")),
        "{:?}",
        stderr_lines(&out)
    );
    let out = scene.output(&["run", "job", "--wait", "500ms", "--", "true"]);
    assert_eq!(code(&out), 124, "{:?}", stderr_lines(&out));
    let status = scene.output(&["status", "job"]);
    assert_eq!(code(&status), 0, "status of a held lock exits 0");
    assert!(String::from_utf8_lossy(&status.stdout).contains("job is held by"));
    let json = scene.output(&["status", "job", "--json"]);
    assert_eq!(code(&json), 0);
    let held: serde_json::Value = serde_json::from_slice(&json.stdout).expect("one JSON object");
    assert_eq!(held["name"], "job");
    assert_eq!(held["held"], true);
    assert!(
        held["owner"].as_str().is_some_and(|o| !o.is_empty()),
        "{held}"
    );
    assert!(held["fence_token"].as_u64().is_some(), "{held}");
    let _ = holder.kill();
    let _ = holder.wait();
    let free = scene.output(&["status", "free-job", "--json"]);
    assert_eq!(code(&free), 1, "status of a free lock exits 1");
    let free: serde_json::Value = serde_json::from_slice(&free.stdout).expect("one JSON object");
    assert_eq!(
        free,
        serde_json::json!({ "name": "free-job", "held": false })
    );
}

/// flock's habits: `-n`, `-w` with bare seconds (also from ANYLOCK_WAIT), `-E` for the
/// conflict code, `-c` for a shell line.
fn pipeline_habits_skip_with_a_chosen_code_and_run_shell_lines(scene: &Scene) {
    let marker = scene.path("holding");
    let hold = format!("touch {}; sleep 5", marker.display());
    let mut holder = scene.spawn(&["run", "job", "--", "sh", "-c", &hold]);
    wait_until(Duration::from_secs(20), "the holder to start", || {
        marker.exists()
    });
    let skipped = scene
        .command(&["run", "job", "-n", "-E", "0", "--", "false"])
        .env("ANYLOCK_WAIT", "5m")
        .output()
        .expect("run");
    assert_eq!(code(&skipped), 0, "{:?}", stderr_lines(&skipped));
    assert!(
        stderr_lines(&skipped).is_empty(),
        "{:?}",
        stderr_lines(&skipped)
    );
    let started = Instant::now();
    let timed_out = scene.output(&["run", "job", "-w", "0.5", "-E", "3", "--", "true"]);
    assert_eq!(code(&timed_out), 3, "{:?}", stderr_lines(&timed_out));
    assert!(started.elapsed() >= Duration::from_millis(500));
    let from_env = scene
        .command(&["run", "job", "--", "true"])
        .env("ANYLOCK_WAIT", "0.3")
        .output()
        .expect("run");
    assert_eq!(code(&from_env), 124, "{:?}", stderr_lines(&from_env));
    // Stopped the way a person would (SIGTERM: it stops its command and releases), so the
    // lock is free at once. A SIGKILLed holder's lease stays for its TTL on a server, and
    // the run below then waited 28 of its 30 s on Redis: a 2 s margin that a loaded CI
    // machine missed (the crash case has tests of its own: tests/process.rs).
    support::send(holder.id(), nix::sys::signal::Signal::SIGTERM);
    let stopped = wait_child(&mut holder, Duration::from_secs(30));
    // 143: its command stopped by the SIGTERM it forwarded (0 if the command had already
    // finished); never 122 (lost) or 125 (failed), after which the lease could remain.
    assert!(
        matches!(stopped.code(), Some(0 | 143)),
        "the stopped holder exited {stopped:?}"
    );

    let shell = scene.output(&[
        "run",
        "job",
        "-w",
        "30",
        "-c",
        "echo $ANYLOCK_NAME && exit 4",
    ]);
    assert_eq!(code(&shell), 4, "{:?}", stderr_lines(&shell));
    assert_eq!(String::from_utf8_lossy(&shell.stdout), "job\n");
}

fn a_broken_lock_stops_the_command_and_its_grandchildren_within_the_grace(scene: &Scene) {
    let pids = scene.path("pids");
    // Two grandchildren, one of which ignores SIGTERM and needs the SIGKILL.
    let script = format!(
        "sleep 1000 & echo $! >> {0}; (trap '' TERM; exec sleep 1001) & echo $! >> {0}; echo $$ >> {0}; wait",
        pids.display()
    );
    let mut run = scene.spawn(&[
        "run", "job", "--ttl", "4s", "--grace", "1s", "--", "sh", "-c", &script,
    ]);
    wait_until(Duration::from_secs(20), "the command to start", || {
        read(&pids).lines().count() == 3
    });
    let broke = scene.output(&["break", "job", "--yes"]);
    assert_eq!(code(&broke), 0, "{:?}", stderr_lines(&broke));
    assert!(String::from_utf8_lossy(&broke.stdout).contains("broke job"));
    let start = Instant::now();
    let status = wait_child(&mut run, Duration::from_secs(15));
    assert_eq!(status.code(), Some(122), "lost-lock exit code");
    // Detection within one refresh interval (0.5 s), then at most the 1 s grace.
    assert!(
        start.elapsed() < Duration::from_secs(5),
        "took {:?}",
        start.elapsed()
    );
    for pid in read(&pids).lines() {
        wait_until(
            Duration::from_secs(2),
            &format!("process {pid} to die"),
            || process_dead(pid),
        );
    }
}

fn sigterm_is_forwarded_and_the_command_decides_the_exit_code(scene: &Scene) {
    let (ready, got) = (scene.path("ready"), scene.path("got"));
    let script = format!(
        "trap 'echo term > {1}; exit 3' TERM; touch {0}; while true; do sleep 0.05; done",
        ready.display(),
        got.display()
    );
    let mut run = scene.spawn(&["run", "job", "--", "sh", "-c", &script]);
    wait_until(Duration::from_secs(20), "the command to start", || {
        ready.exists()
    });
    let pid = nix::unistd::Pid::from_raw(i32::try_from(run.id()).expect("pid"));
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM).expect("signal anylock");
    let status = wait_child(&mut run, Duration::from_secs(15));
    assert_eq!(status.code(), Some(3), "the command's own exit code");
    assert_eq!(read(&got).trim(), "term");
    let after = scene.output(&["status", "job"]);
    assert!(
        String::from_utf8_lossy(&after.stdout).contains("job is free"),
        "released at the end"
    );
}

#[test]
fn bad_input_gets_one_clear_line() {
    let scene = Scene::local();
    let cases: [(&[&str], &str); 5] = [
        (
            &["run", "--ttl", "5x", "job", "--", "true"],
            "unknown time unit",
        ),
        (
            &["--backend", "mongodb://u@h/db", "run", "job", "--", "true"],
            "must be one of local",
        ),
        (
            &[
                "--backend",
                "mongodb://u:hunter2@h/db",
                "run",
                "job",
                "--",
                "true",
            ],
            "readable by every user",
        ),
        (&["run", "bad\u{1}name", "--", "true"], "control character"),
        (
            &["run", "job", "--ttl", "1ms", "--", "true"],
            "outside the accepted range",
        ),
    ];
    for (i, (args, expected)) in cases.into_iter().enumerate() {
        let out = scene.output(args);
        let lines = stderr_lines(&out);
        assert_eq!(code(&out), 2, "{args:?}: {lines:?}");
        // The first case is clap's: its message keeps clap's hint lines.
        if i > 0 {
            assert_eq!(lines.len(), 1, "{args:?}: {lines:?}");
        }
        assert!(
            lines[0].starts_with("anylock: ") && lines[0].contains(expected),
            "{lines:?}"
        );
        assert!(!lines[0].contains("hunter2"), "password leaked: {lines:?}");
    }
}

/// `-E` turns a conflict into an expected outcome, never an outage: with nothing to
/// reach, the backend cannot be opened, and that is reported as the failure it is.
#[test]
fn the_conflict_exit_code_never_hides_an_unreachable_backend() {
    let scene = Scene::local();
    let mut command = scene.command(&["run", "job", "-w", "1", "-E", "0", "--", "echo", "RAN"]);
    let closed = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let port = closed.local_addr().expect("addr").port();
    drop(closed);
    command.env(
        "ANYLOCK_BACKEND",
        format!("gs://bkt/?endpoint=http://127.0.0.1:{port}"),
    );
    let out = command.output().expect("run");
    assert_eq!(code(&out), 125, "{:?}", stderr_lines(&out));
    assert!(!String::from_utf8_lossy(&out.stdout).contains("RAN"));
    assert_eq!(stderr_lines(&out).len(), 1, "{:?}", stderr_lines(&out));
}

#[test]
fn a_usage_error_keeps_clap_hints() {
    let scene = Scene::local();
    let out = scene.output(&["run", "job"]);
    let text = String::from_utf8_lossy(&out.stderr).to_string();
    assert_eq!(code(&out), 2, "{text}");
    assert!(text.starts_with("anylock: "), "{text}");
    for hint in ["<CMD>", "Usage:", "--help"] {
        assert!(text.contains(hint), "{hint:?} missing: {text}");
    }
    let clash = scene.output(&["run", "job", "-n", "-E", "124", "--", "true"]);
    assert_eq!(code(&clash), 2);
    assert!(
        String::from_utf8_lossy(&clash.stderr).contains("anylock's own exit codes"),
        "{:?}",
        stderr_lines(&clash)
    );
}

/// In CI the embedded default would lock one runner only: refused unless chosen.
#[test]
fn ci_refuses_the_implicit_local_backend_but_not_an_explicit_one() {
    let dir = Scene::scratch();
    let run = |ci: &str, extra: &[&str]| {
        let mut cmd = Command::new(support::BIN);
        for (name, _) in std::env::vars() {
            if name.starts_with("ANYLOCK_") {
                cmd.env_remove(name);
            }
        }
        for marker in [
            "TF_BUILD",
            "JENKINS_URL",
            "CODEBUILD_BUILD_ID",
            "TEAMCITY_VERSION",
            "BUILDKITE",
        ] {
            cmd.env_remove(marker);
        }
        cmd.env("CI", ci)
            .env("XDG_CONFIG_HOME", &dir)
            .env("XDG_STATE_HOME", &dir)
            .env("HOME", &dir)
            .args(extra)
            .args(["run", "ci-job", "--", "true"])
            .stdin(Stdio::null())
            .output()
            .expect("run anylock")
    };
    let refused = run("true", &[]);
    let lines = stderr_lines(&refused);
    assert_eq!(code(&refused), 2, "{lines:?}");
    assert!(
        lines.len() == 1 && lines[0].contains("CI is set") && lines[0].contains("--backend local:"),
        "{lines:?}"
    );
    let explicit = format!("local:{}/ci.sqlite3", dir.display());
    let chosen = run("true", &["--backend", &explicit]);
    assert_eq!(code(&chosen), 0, "{:?}", stderr_lines(&chosen));
    let not_ci = run("false", &[]);
    assert_eq!(code(&not_ci), 0, "{:?}", stderr_lines(&not_ci));
    let jenkins = {
        let mut cmd = Command::new(support::BIN);
        for (name, _) in std::env::vars() {
            if name.starts_with("ANYLOCK_") || name == "CI" {
                cmd.env_remove(name);
            }
        }
        cmd.env("JENKINS_URL", "https://jenkins.example/")
            .env("XDG_CONFIG_HOME", &dir)
            .env("XDG_STATE_HOME", &dir)
            .env("HOME", &dir)
            .args(["run", "ci-job", "--", "true"])
            .stdin(Stdio::null())
            .output()
            .expect("run anylock")
    };
    assert_eq!(
        code(&jenkins),
        2,
        "Jenkins sets no CI: {:?}",
        stderr_lines(&jenkins)
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn an_unusable_backend_is_one_line_and_no_backtrace() {
    let scene = Scene::local();
    let mut command = scene.command(&["run", "job", "--", "true"]);
    command.env("ANYLOCK_BACKEND", "local:/proc/anylock-nope/locks.sqlite3");
    command.env("RUST_BACKTRACE", "1");
    let out = command.output().expect("run");
    let lines = stderr_lines(&out);
    assert_eq!(code(&out), 2, "{lines:?}");
    assert_eq!(lines.len(), 1, "{lines:?}");
    assert!(
        lines[0].contains("cannot create /proc/anylock-nope"),
        "{lines:?}"
    );
}

#[test]
fn help_lists_examples_and_exit_codes_and_completions_generate() {
    let scene = Scene::local();
    let help = String::from_utf8_lossy(&scene.output(&["--help"]).stdout).to_string();
    assert!(
        help.contains("Examples:") && help.contains("124 timed out waiting"),
        "{help}"
    );
    for shown in [
        "anylock acquire deploy --owner",
        "anylock verify",
        "anylock release",
        "--hold-at-least",
        "`verify`, `release`: the owner does not hold",
    ] {
        assert!(help.contains(shown), "{shown:?} missing: {help}");
    }
    let version = String::from_utf8_lossy(&scene.output(&["--version"]).stdout).to_string();
    assert!(
        version.starts_with(&format!(
            "anylock {} (backends: local, ",
            env!("CARGO_PKG_VERSION")
        )) && !version.contains("memory"),
        "{version}"
    );
    let bash = scene.output(&["completions", "bash"]);
    assert_eq!(code(&bash), 0);
    assert!(String::from_utf8_lossy(&bash.stdout).contains("_anylock()"));
    let table = String::from_utf8_lossy(&scene.output(&["guarantees"]).stdout).to_string();
    assert!(table.contains("| `local` |"), "{table}");
    let rows: serde_json::Value =
        serde_json::from_slice(&scene.output(&["guarantees", "--json"]).stdout).expect("JSON");
    let local = rows
        .as_array()
        .and_then(|rows| rows.iter().find(|r| r["backend"] == "local"))
        .unwrap_or_else(|| panic!("no local row: {rows}"));
    assert_eq!(local["fencing"], "monotonic");
    assert_eq!(local["durability"], "survives_restart");
}

on_every_backend!(
    the_readme_first_command_runs_and_passes_the_exit_code,
    contending_runs_never_overlap,
    no_wait_on_a_held_lock_and_a_wait_timeout_have_their_own_codes,
    pipeline_habits_skip_with_a_chosen_code_and_run_shell_lines,
    a_broken_lock_stops_the_command_and_its_grandchildren_within_the_grace,
    sigterm_is_forwarded_and_the_command_decides_the_exit_code,
);

#[test]
fn an_unreachable_server_is_one_line_and_exit_code_125() {
    let scene = Scene::local();
    let mut command = scene.command(&["run", "job", "--wait", "2s", "--", "true"]);
    command.env(
        "ANYLOCK_BACKEND",
        "postgres://postgres:hunter2@127.0.0.1:1/nowhere",
    );
    let out = command.output().expect("run");
    let lines = stderr_lines(&out);
    assert_eq!(code(&out), 125, "{lines:?}");
    assert_eq!(lines.len(), 1, "{lines:?}");
    assert!(lines[0].starts_with("anylock: postgres"), "{lines:?}");
    assert!(!lines[0].contains("hunter2"), "password leaked: {lines:?}");
}

#[test]
fn check_reports_round_trip_permissions_and_clock_skew() {
    let scene = Scene::local();
    let out = scene.output(&["check"]);
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    assert_eq!(code(&out), 0, "{text} {:?}", stderr_lines(&out));
    assert!(text.contains("permissions:  ok"), "{text}");
    assert!(
        text.contains("clock skew:   not exposed by the local backend"),
        "{text}"
    );
    for server in [Scene::postgres(), Scene::redis()].into_iter().flatten() {
        let out = server.output(&["check"]);
        let text = String::from_utf8_lossy(&out.stdout).to_string();
        assert_eq!(code(&out), 0, "{text} {:?}", stderr_lines(&out));
        assert!(text.contains("clock skew:   server clock"), "{text}");
        assert!(text.contains("round trip:"), "{text}");
    }
}

#[test]
fn an_unreachable_redis_is_one_line_and_exit_code_125() {
    let scene = Scene::local();
    let mut command = scene.command(&["run", "job", "--wait", "2s", "--", "true"]);
    command.env("ANYLOCK_BACKEND", "redis://:hunter2@127.0.0.1:1/0");
    let out = command.output().expect("run");
    let lines = stderr_lines(&out);
    assert_eq!(code(&out), 125, "{lines:?}");
    assert_eq!(lines.len(), 1, "{lines:?}");
    assert!(lines[0].starts_with("anylock: redis"), "{lines:?}");
    assert!(!lines[0].contains("hunter2"), "password leaked: {lines:?}");
}

/// A Redis that may evict a held lock's key (issue #14): `check` fails with one line that
/// names the policy and the fix. A private `redis-server` (killed by PID on drop).
#[test]
fn check_refuses_a_redis_that_may_evict_lock_keys() {
    let Some(scene) = Scene::redis() else {
        return;
    };
    let server = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime")
        .block_on(test_kit::servers::Redis::start_with(&[
            "--maxmemory",
            "64mb",
            "--maxmemory-policy",
            "allkeys-lru",
        ]));
    let out = scene
        .command(&["check"])
        .env("ANYLOCK_BACKEND", server.url())
        .output();
    drop(server);
    let out = out.expect("run anylock check");
    let lines = stderr_lines(&out);
    assert_ne!(code(&out), 0, "{lines:?}");
    assert_eq!(lines.len(), 1, "{lines:?}");
    assert!(lines[0].contains("allkeys-lru"), "{lines:?}");
    assert!(
        lines[0].contains("maxmemory-policy noeviction"),
        "{lines:?}"
    );
}

/// `check` says what the backend's replies are bounded to and which clock leases are
/// measured on (one that counts a machine suspend), in text and JSON.
#[test]
fn check_shows_the_reply_limits_and_the_lease_clock() {
    let Some(scene) = Scene::redis() else { return };
    let out = scene.output(&["check"]);
    assert_eq!(code(&out), 0, "{:?}", stderr_lines(&out));
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("reply limits: value 1,048,576 bytes;"),
        "{text}"
    );
    assert!(
        text.contains("lease clock:  CLOCK_BOOTTIME (counts suspend)"),
        "{text}"
    );
    let out = scene.output(&["check", "--json"]);
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");
    assert_eq!(json["reply_limits"]["value"], 1_048_576, "{json}");
    assert_eq!(
        json["lease_clock"], "CLOCK_BOOTTIME (counts suspend)",
        "{json}"
    );
    let local = Scene::local().output(&["check"]);
    let text = String::from_utf8_lossy(&local.stdout);
    assert!(
        text.contains("reply limits: none needed (no server)"),
        "{text}"
    );
}
