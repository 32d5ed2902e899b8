//! `local:` trusts no other user's files: the hostile review's attacks, with the attacker's
//! steps run as another user.
//!
//! Needs root: it creates throwaway system users `anylock-other` (the attacker),
//! `anylock-victim` and `anylock-peer` (members of the throwaway group `anylock-share`) if
//! they are missing (`useradd --system --no-create-home`, `groupadd --system`), and runs
//! their steps with `setpriv` (which execs, so killing the child kills the step). Where the
//! victim's steps run in this process they run as root, which bypasses permission checks:
//! the attacks do not rely on the victim lacking a permission. Not root: a failure when
//! `ANYLOCK_REQUIRE_SERVERS=1` (CI), else a loud skip.

use std::io::{BufRead, BufReader};
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use backend_local::{LocalBackend, LocalConfig, StoreRefused};
use lockcore::{ErrorKind, LockOptions, Locker, WaitMode};

const OTHER: &str = "anylock-other";
const VICTIM: &str = "anylock-victim";
const PEER: &str = "anylock-peer";
const GROUP: &str = "anylock-share";
const STEP: &str = "ANYLOCK_TRUST_STEP";
const URL: &str = "ANYLOCK_TRUST_URL";

/// Whether this process is root; when it is not, a failure in CI and a loud skip elsewhere.
fn root() -> bool {
    if nix::unistd::geteuid().is_root() {
        return true;
    }
    assert!(
        !test_kit::env::servers_required(),
        "tests/trust.rs runs the attacker's steps as other users and needs root (CI runs \
         as root): run it as root"
    );
    eprintln!("SKIPPED: tests/trust.rs needs root to create and become other users");
    false
}

fn sh(script: &str) -> std::process::Output {
    Command::new("sh")
        .args(["-c", script])
        .output()
        .expect("run sh")
}

/// Creates the throwaway users and group once; panics with the reason if it cannot.
fn ensure_users() {
    static DONE: OnceLock<()> = OnceLock::new();
    DONE.get_or_init(|| {
        let script = format!(
            "getent group {GROUP} >/dev/null || groupadd --system {GROUP} || exit 1; \
             for u in {OTHER} {VICTIM} {PEER}; do id -u $u >/dev/null 2>&1 || \
             useradd --system --no-create-home --shell /usr/sbin/nologin $u || exit 1; done; \
             usermod -aG {GROUP} {VICTIM} && usermod -aG {GROUP} {PEER}"
        );
        let out = sh(&script);
        assert!(
            out.status.success(),
            "cannot create the throwaway users {OTHER}, {VICTIM}, {PEER} and group {GROUP} \
             (useradd/groupadd/usermod from the passwd package): {}",
            String::from_utf8_lossy(&out.stderr)
        );
    });
}

/// `script` run by `sh` as `user`; panics if it fails.
fn as_user(user: &str, script: &str) {
    let out = Command::new("setpriv")
        .args(["--reuid", user, "--regid", user, "--init-groups", "--"])
        .args(["sh", "-c", script])
        .output()
        .expect("run setpriv");
    assert!(
        out.status.success(),
        "as {user}: {script}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A scratch directory every user can enter, removed on drop.
struct Scratch(PathBuf);

impl Scratch {
    fn new() -> Self {
        let dir =
            std::env::temp_dir().join(format!("anylock-trust-{:016x}", rand::random::<u64>()));
        std::fs::create_dir(&dir).expect("scratch");
        std::fs::set_permissions(&dir, PermissionsExt::from_mode(0o755)).expect("chmod");
        Self(dir)
    }

    /// A directory `name` owned by `owner:group` with `mode`.
    fn dir(&self, name: &str, owner: &str, mode: u32) -> PathBuf {
        let dir = self.0.join(name);
        std::fs::create_dir(&dir).expect("mkdir");
        let out = sh(&format!("chown {owner} '{}'", dir.display()));
        assert!(out.status.success(), "chown {owner}");
        std::fs::set_permissions(&dir, PermissionsExt::from_mode(mode)).expect("chmod");
        dir
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn options() -> LockOptions {
    LockOptions::new(Duration::from_secs(60)).with_wait(WaitMode::TryOnce)
}

/// Asserts that opening `db` is refused with a typed error of `kind` that names `path`.
fn assert_refused(opened: lockcore::Result<LocalBackend>, kind: ErrorKind, path: &Path, why: &str) {
    let err = match opened {
        Ok(_) => panic!(
            "{why}: the store was opened; {} should be refused",
            path.display()
        ),
        Err(err) => err,
    };
    assert_eq!(err.kind(), kind, "{why}: {err}");
    let refused = std::error::Error::source(&err)
        .and_then(|s| s.downcast_ref::<StoreRefused>())
        .unwrap_or_else(|| panic!("{why}: no StoreRefused behind {err}"));
    assert_eq!(refused.path(), path, "{why}: {err}");
    assert!(
        err.to_string().contains(&path.display().to_string()),
        "{err}"
    );
}

/// The hostile review's attack: in a directory other users may write (`1777`, like
/// `/tmp`), another user makes the `.holders` directory first; once the victim holds a
/// lock, they delete the victim's liveness file and put an unlocked one in its place, and
/// the victim's next contender takes the lock from its live holder. The store is refused
/// instead (if it opens, the attack is played to show what it gives).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn another_user_cannot_swap_liveness_files_in_a_shared_directory() {
    if !root() {
        return;
    }
    ensure_users();
    let scratch = Scratch::new();
    let shared = scratch.dir("shared", "root", 0o1777);
    let db = shared.join("locks.sqlite3");
    let holders = shared.join("locks.sqlite3.holders");
    as_user(
        OTHER,
        &format!("mkdir '{0}' && chmod 777 '{0}'", holders.display()),
    );
    let opened = LocalBackend::connect(LocalConfig::new(&db)).await;
    if let Ok(holder) = &opened {
        let contender = LocalBackend::connect(LocalConfig::new(&db))
            .await
            .expect("open");
        let guard = Locker::new(Arc::new(holder.clone()))
            .with_options(options())
            .acquire("job")
            .await
            .expect("free");
        as_user(
            OTHER,
            &format!(
                "cd '{}' && for f in *; do rm -f \"$f\" && touch \"$f\"; done",
                holders.display()
            ),
        );
        let stolen = Locker::new(Arc::new(contender))
            .with_options(options())
            .try_acquire("job")
            .await
            .expect("call");
        assert!(
            stolen.is_none(),
            "double grant: {OTHER} swapped the live holder's liveness file and a contender \
             took the lock (token {:?}) while the holder (token {:?}) held it",
            stolen.as_ref().and_then(|g| g.fence_token()),
            guard.fence_token()
        );
    }
    assert_refused(
        opened,
        ErrorKind::PermissionDenied,
        &shared,
        "a 1777 store directory",
    );
}

/// Another user's `.holders` directory in a directory of ours (left from when it was
/// shared, or made by an administrator) is refused: its owner could swap the files in it.
#[tokio::test]
async fn a_holders_directory_of_another_user_is_refused() {
    if !root() {
        return;
    }
    ensure_users();
    let scratch = Scratch::new();
    let ours = scratch.dir("ours", "root", 0o711);
    let holders = ours.join("locks.sqlite3.holders");
    std::fs::create_dir(&holders).expect("mkdir");
    let out = sh(&format!(
        "chown {OTHER} '{0}' && chmod 777 '{0}'",
        holders.display()
    ));
    assert!(out.status.success());
    let opened = LocalBackend::connect(LocalConfig::new(ours.join("locks.sqlite3"))).await;
    assert_refused(
        opened,
        ErrorKind::PermissionDenied,
        &holders,
        "another user's .holders",
    );
}

/// A database another user made (and can write) is refused: its owner could list and break
/// every lock in it. The attacker makes it; it ends up in our directory (copied there,
/// or left from when the directory was shared).
#[tokio::test]
async fn a_database_another_user_made_is_refused() {
    if !root() {
        return;
    }
    ensure_users();
    let scratch = Scratch::new();
    let theirs = scratch.dir("theirs", OTHER, 0o755);
    let ours = scratch.dir("ours", "root", 0o755);
    let planted = theirs.join("locks.sqlite3");
    as_user(
        OTHER,
        &format!("touch '{0}' && chmod 666 '{0}'", planted.display()),
    );
    let db = ours.join("locks.sqlite3");
    std::fs::rename(&planted, &db).expect("move");
    let opened = LocalBackend::connect(LocalConfig::new(&db)).await;
    assert_refused(
        opened,
        ErrorKind::PermissionDenied,
        &db,
        "another user's database",
    );
    // Another user's store directory, too.
    let opened = LocalBackend::connect(LocalConfig::new(theirs.join("x.sqlite3"))).await;
    assert_refused(
        opened,
        ErrorKind::PermissionDenied,
        &theirs,
        "another user's directory",
    );
}

/// Links into another user's directory are never followed: the database, the holders
/// directory, and SQLite's `-wal` and `-shm` files beside the database.
#[tokio::test]
async fn links_into_another_users_directory_are_refused() {
    if !root() {
        return;
    }
    ensure_users();
    let scratch = Scratch::new();
    let theirs = scratch.dir("theirs", OTHER, 0o777);
    as_user(
        OTHER,
        &format!(
            "cd '{}' && touch db wal shm && mkdir holders && chmod 666 db wal shm && chmod 777 holders",
            theirs.display()
        ),
    );
    for (name, target) in [
        ("locks.sqlite3", "db"),
        ("locks.sqlite3.holders", "holders"),
        ("locks.sqlite3-wal", "wal"),
        ("locks.sqlite3-shm", "shm"),
    ] {
        let ours = scratch.dir(&format!("ours-{target}"), "root", 0o755);
        let link = ours.join(name);
        std::os::unix::fs::symlink(theirs.join(target), &link).expect("symlink");
        let opened = LocalBackend::connect(LocalConfig::new(ours.join("locks.sqlite3"))).await;
        assert_refused(opened, ErrorKind::PermissionDenied, &link, name);
    }
}

/// A new store is private whatever the umask: the directories anylock makes (here the
/// default location's `~/.local/state/anylock`) are `0700`, the database and SQLite's
/// files beside it `0600`, the holders directory `0700` and a liveness file `0600`. The
/// opener runs with umask 000, under which the store used to come out world-writable.
#[tokio::test]
async fn a_new_store_is_private_whatever_the_umask() {
    if !root() {
        return;
    }
    let scratch = Scratch::new();
    let home = scratch.dir("home", "root", 0o700);
    let mut holder = child(None, "hold", "local:")
        .env("HOME", &home)
        .env_remove("XDG_STATE_HOME")
        .env_remove("ANYLOCK_LOCAL_DB")
        .spawn()
        .expect("spawn");
    let said = wait_for(&mut holder, "HELD");
    let state = home.join(".local/state/anylock");
    let db = state.join("locks.sqlite3");
    let holders = state.join("locks.sqlite3.holders");
    let liveness = std::fs::read_dir(&holders)
        .expect("holders")
        .next()
        .expect("a file");
    let mut modes = Vec::new();
    for (path, want) in [
        (home.join(".local"), 0o700),
        (home.join(".local/state"), 0o700),
        (state.clone(), 0o700),
        (db.clone(), 0o600),
        (state.join("locks.sqlite3-wal"), 0o600),
        (state.join("locks.sqlite3-shm"), 0o600),
        (holders.clone(), 0o700),
        (liveness.expect("entry").path(), 0o600),
    ] {
        let mode = std::fs::symlink_metadata(&path)
            .map(|m| m.mode() & 0o7777)
            .ok();
        let shown = mode.map_or_else(|| "missing".to_owned(), |m| format!("{m:o}"));
        modes.push(format!("{}: {shown} (want {want:o})", path.display()));
        if mode != Some(want) {
            let _ = holder.kill();
            panic!("{said}; not private:\n{}", modes.join("\n"));
        }
    }
    let _ = holder.kill();
    let _ = holder.wait();
}

/// A group store (`root:anylock-share`, mode `2770`) is refused to a member who did not
/// ask for one, accepted with `?shared_group=anylock-share`; the two members then exclude
/// each other and take over each other's dead holders at once; a user outside the group is
/// refused even when asking, and so is a member when the store is world-writable or its
/// directory lacks the setgid bit.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_group_store_is_accepted_only_when_asked_for() {
    if !root() {
        return;
    }
    ensure_users();
    let scratch = Scratch::new();
    let team = scratch.dir("team", &format!("root:{GROUP}"), 0o2770);
    let bin = runnable_copy(&scratch);
    let plain = format!("local:{}/locks.sqlite3", team.display());
    let asked = format!("{plain}?shared_group={GROUP}");
    let refused = run(&bin, VICTIM, "open", &plain);
    assert!(
        refused.contains("REFUSED PermissionDenied"),
        "no opt-in: {refused}"
    );
    assert!(refused.contains(&team.display().to_string()), "{refused}");
    let mut holder = child(Some((&bin, VICTIM)), "hold", &asked)
        .spawn()
        .expect("spawn");
    wait_for(&mut holder, "HELD");
    let db = std::fs::metadata(team.join("locks.sqlite3")).expect("db");
    let gid = nix::unistd::Group::from_name(GROUP)
        .expect("group")
        .expect("exists")
        .gid;
    assert_eq!(
        (db.gid(), db.mode() & 0o777),
        (gid.as_raw(), 0o660),
        "the group's file"
    );
    assert!(
        run(&bin, PEER, "try", &asked).contains("BUSY"),
        "the members exclude each other"
    );
    holder.kill().expect("kill the holder");
    holder.wait().expect("reap");
    let taken = run(&bin, PEER, "try", &asked);
    assert!(
        taken.contains("GOT"),
        "a dead member's lock is taken over at once: {taken}"
    );
    let outsider = run(&bin, OTHER, "open", &asked);
    assert!(
        outsider.contains("REFUSED Config"),
        "not a member: {outsider}"
    );
    for (mode, why) in [(0o2777, "world-writable"), (0o770, "no setgid bit")] {
        std::fs::set_permissions(&team, PermissionsExt::from_mode(mode)).expect("chmod");
        let opened = run(&bin, VICTIM, "open", &asked);
        assert!(
            opened.contains("REFUSED PermissionDenied"),
            "{why}: {opened}"
        );
    }
}

/// A copy of this test binary every user can run (the build directory may be private).
fn runnable_copy(scratch: &Scratch) -> PathBuf {
    let bin = scratch.0.join("trust-test");
    std::fs::copy(std::env::current_exe().expect("test binary"), &bin).expect("copy");
    std::fs::set_permissions(&bin, PermissionsExt::from_mode(0o755)).expect("chmod");
    bin
}

/// The command running [`child_step`] `step` on `url`: as `user` through the copy `bin`,
/// or as root with umask 000 through this binary.
fn child(user: Option<(&Path, &str)>, step: &str, url: &str) -> Command {
    let mut command = match user {
        Some((bin, user)) => {
            let mut command = Command::new("setpriv");
            command
                .args(["--reuid", user, "--regid", user, "--init-groups", "--"])
                .arg(bin);
            command
        }
        None => {
            let mut command = Command::new("sh");
            command
                .args(["-c", "umask 000 && exec \"$0\" \"$@\""])
                .arg(std::env::current_exe().expect("test binary"));
            command
        }
    };
    command
        .args([
            "--exact",
            "child_step",
            "--ignored",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(STEP, step)
        .env(URL, url)
        .stdout(Stdio::piped())
        .stderr(Stdio::null());
    command
}

/// Runs `step` on `url` as `user` to its end; its output.
fn run(bin: &Path, user: &str, step: &str, url: &str) -> String {
    let out = child(Some((bin, user)), step, url)
        .output()
        .expect("run the step");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Waits (30 s at most) for the line of `child` that contains `marker`.
fn wait_for(child: &mut Child, marker: &str) -> String {
    let stdout = child.stdout.take().expect("stdout");
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            let _ = tx.send(line);
        }
    });
    let mut seen = Vec::new();
    while let Ok(line) = rx.recv_timeout(Duration::from_secs(30)) {
        if line.contains(marker) {
            return line;
        }
        seen.push(line);
    }
    let _ = child.kill();
    panic!("the child never said {marker}: {seen:?}");
}

/// Not a test on its own: a step of another user's process, run by the tests above with
/// `--ignored`. `open` opens the store; `hold` takes `job` and holds it until killed;
/// `try` tries `job` once. Each prints what happened.
#[tokio::test]
#[ignore = "the body of a child process; the tests that need it run it with --ignored"]
async fn child_step() {
    let (Ok(step), Ok(url)) = (std::env::var(STEP), std::env::var(URL)) else {
        return;
    };
    let backend = match backend_local::open(&url).await {
        Ok(backend) => backend,
        Err(err) => {
            println!("REFUSED {:?} {err}", err.kind());
            return;
        }
    };
    let locker = Locker::new(backend).with_options(options());
    match step.as_str() {
        "open" => println!("OPENED"),
        "hold" => {
            let guard = locker.acquire("job").await.expect("free");
            println!("HELD {:?}", guard.fence_token());
            tokio::time::sleep(Duration::from_secs(600)).await;
        }
        "try" => match locker.try_acquire("job").await.expect("call") {
            Some(guard) => println!("GOT {:?}", guard.fence_token()),
            None => println!("BUSY"),
        },
        other => panic!("no step {other}"),
    }
}
