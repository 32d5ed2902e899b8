//! The locked command runs as the same user as `anylock`, so it may read whatever that user
//! may read of `anylock`'s processes. None of it may hold the backend's secret: not the
//! environment, command line, memory or open descriptors of `anylock run` (its parent's
//! parent) or of the supervisor (its parent); and no descriptor of `anylock`'s own (the
//! config file, a socket, the SQLite files) is inherited. A URL with a password is refused
//! on the command line, where every user of the machine can read it.

#[macro_use]
mod support;

use std::os::unix::process::CommandExt as _;
use std::process::{Command, Output};

use support::{Scene, code};

/// A password for the plaintext PostgreSQL of the harness, which trusts loopback: it is
/// never checked, but anylock holds it, and redacts it, as any password.
const SECRET: &str = "exposure-secret-5b9e2c7d41";

/// Run as the locked command: prints what it can read of its parent (the supervisor) and
/// grandparent (`anylock run`): command line, environment, the regular files behind their
/// descriptors, and their stacks (where the environment strings live) through
/// /proc/PID/mem.
const SNOOP: &str = r#"
sup=$PPID
run=$(sed 's/.*) //' /proc/$sup/stat | cut -d' ' -f2)
for p in $sup $run; do
  echo "== process $p"
  tr '\0' ' ' < /proc/$p/cmdline; echo
  tr '\0' '\n' < /proc/$p/environ
  for fd in /proc/$p/fd/*; do
    echo "fd $fd -> $(readlink $fd)"
    [ -f "$fd" ] && head -c 1048576 "$fd"
  done
  grep '\[stack\]' /proc/$p/maps | while read range rest; do
    start=$((0x${range%-*})); end=$((0x${range#*-}))
    dd if=/proc/$p/mem iflag=skip_bytes,count_bytes skip=$start count=$((end - start)) 2>/dev/null
  done
done
"#;

/// As an ordinary user: root reads every process's /proc files whatever they protect, and
/// the guarantee is about a command of the same, unprivileged user.
fn unprivileged(command: &mut Command) -> &mut Command {
    use std::os::unix::fs::MetadataExt as _;
    let euid = std::fs::metadata("/proc/self").expect("/proc/self").uid();
    if euid == 0 {
        command.uid(65534).gid(65534); // nobody
    }
    command
}

/// The locked command (run as an unprivileged user, like `anylock`) finds no trace of the
/// password in its ancestors, although it can read them: the supervisor's command line,
/// environment and stack, and `anylock run`'s command line.
#[test]
fn the_command_reads_no_secret_from_anylocks_processes() {
    let Some(scene) = Scene::postgres() else {
        return;
    };
    let url = scene
        .backend
        .replacen("postgres@", &format!("postgres:{SECRET}@"), 1);
    assert!(url.contains(SECRET), "{url}");
    let mut command = scene.command(&["run", "snoop", "-c", SNOOP]);
    for (name, _) in std::env::vars().filter(|(name, _)| name.starts_with("ANYLOCK_TEST_")) {
        command.env_remove(name);
    }
    let out = unprivileged(&mut command)
        .env("ANYLOCK_BACKEND", &url)
        .output()
        .expect("run anylock");
    let seen = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(code(&out), 0, "{stderr}");
    // What the command could read, so that finding nothing means something.
    assert!(
        seen.contains("__supervise"),
        "the supervisor's command line:\n{seen}"
    );
    assert!(
        seen.contains(" run snoop"),
        "anylock run's command line:\n{seen}"
    );
    assert!(
        seen.matches("ANYLOCK_FENCE_TOKEN=").count() >= 2,
        "the supervisor's environment, and again in its stack:\n{seen}"
    );
    assert!(
        !seen.contains(SECRET) && !stderr.contains(SECRET),
        "the command read the password:\n{seen}"
    );
}

/// The inheritable descriptors of this test process: `anylock` may pass them on, as any
/// program does, but it must add none of its own.
fn inherited_by_anylock() -> Vec<String> {
    let mut fds = vec!["0".to_owned(), "1".to_owned(), "2".to_owned()];
    for entry in std::fs::read_dir("/proc/self/fdinfo").expect("fdinfo") {
        let entry = entry.expect("entry");
        let info = std::fs::read_to_string(entry.path()).unwrap_or_default();
        let flags = info
            .lines()
            .find_map(|l| l.strip_prefix("flags:"))
            .and_then(|f| u32::from_str_radix(f.trim(), 8).ok());
        let cloexec = 0o2000000;
        if flags.is_some_and(|f| f & cloexec == 0) {
            fds.push(entry.file_name().to_string_lossy().into_owned());
        }
    }
    fds.sort();
    fds.dedup();
    fds
}

/// `ls -l /proc/self/fd/` as the locked command, with the backend named by a config file:
/// it has its standard streams (and what the test passed on), plus the directory `ls`
/// itself reads; no socket, SQLite file, config file, pipe or event descriptor of anylock.
fn the_command_inherits_no_descriptor_of_anylock(scene: &Scene) {
    let config = scene.path("config.toml");
    std::fs::write(&config, format!("backend = {:?}\n", scene.backend)).expect("config");
    let out = scene
        .command(&["--config", &config.to_string_lossy(), "run", "fds"])
        .args(["--", "ls", "-l", "/proc/self/fd/"])
        .env_remove("ANYLOCK_BACKEND")
        .output()
        .expect("run anylock");
    assert_eq!(code(&out), 0, "{}", String::from_utf8_lossy(&out.stderr));
    let listing = String::from_utf8_lossy(&out.stdout);
    let mut fds: Vec<String> = Vec::new();
    let mut holders = 0;
    for line in listing.lines().filter(|l| l.contains(" -> ")) {
        let (left, target) = line.split_once(" -> ").expect("arrow");
        let fd = left.rsplit(' ').next().expect("fd").to_owned();
        // The directory `ls` is listing, its own descriptor.
        if target.starts_with("/proc/") && target.ends_with("/fd") {
            continue;
        }
        // The embedded backend's liveness file, inherited by design (backend-local's
        // `liveness.rs`): while any process holding it lives, nobody takes the lock over
        // as if its holder had died. It is empty and names no secret.
        if scene.backend.starts_with("local:") && target.contains(".sqlite3.holders/") {
            holders += 1;
            continue;
        }
        fds.push(fd);
    }
    assert!(holders <= 1, "one liveness file at most:\n{listing}");
    fds.sort();
    assert_eq!(
        fds,
        inherited_by_anylock(),
        "the command's descriptors:\n{listing}"
    );
}

on_every_backend!(the_command_inherits_no_descriptor_of_anylock);

fn assert_refused_on_the_command_line(out: &Output, what: &str) {
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(code(out), 2, "{what}: {stderr}");
    let lines: Vec<&str> = stderr.lines().collect();
    assert_eq!(lines.len(), 1, "{what}: {stderr}");
    for words in ["command line", "ANYLOCK_BACKEND", "config file"] {
        assert!(
            lines[0].contains(words),
            "{what}: {words:?} missing: {stderr}"
        );
    }
    assert!(!stderr.contains(SECRET), "{what}: {stderr}");
    assert!(out.stdout.is_empty(), "{what}: nothing is done");
}

/// A password or secret parameter in `--backend URL` or `check URL` is visible to every
/// user of the machine (`ps`, /proc/PID/cmdline): refused, pointing at the environment and
/// the config file. The same URL from ANYLOCK_BACKEND works, and so does a URL without
/// a secret on the command line.
#[test]
fn a_secret_on_the_command_line_is_refused() {
    let scene = Scene::local();
    let with_password = format!("redis://:{SECRET}@127.0.0.1:1/0");
    let with_param = format!("postgres://db/locks?password={SECRET}");
    for url in [&with_password, &with_param] {
        let out = scene.output(&["--backend", url, "status", "job"]);
        assert_refused_on_the_command_line(&out, "--backend");
        let out = scene.output(&["status", "job", "--backend", url]);
        assert_refused_on_the_command_line(&out, "--backend after the subcommand");
        let out = scene.output(&["check", url]);
        assert_refused_on_the_command_line(&out, "check URL");
    }
    // From the environment: used (here: nothing listens, exit 125, password redacted).
    let out = scene
        .command(&["status", "job"])
        .env("ANYLOCK_BACKEND", &with_password)
        .output()
        .expect("run anylock");
    assert_eq!(code(&out), 125, "{}", String::from_utf8_lossy(&out.stderr));
    let no_secret = format!("local:{}/cli.sqlite3", scene.dir.display());
    let out = scene.output(&["--backend", &no_secret, "status", "job"]);
    assert_eq!(
        code(&out),
        1,
        "free: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let out = scene.output(&["check", &no_secret]);
    assert_eq!(code(&out), 0, "{}", String::from_utf8_lossy(&out.stderr));
}
