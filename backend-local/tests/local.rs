//! What only the embedded backend does: real processes sharing one file, instant recovery
//! from a dead holder, tokens that survive reopening, leases that end with the boot.

mod common;

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use backend_local::{LocalBackend, LocalConfig};
use common::TempDb;
use lockcore::{ErrorKind, LockName, LockOptions, Locker, WaitMode};
use sqlx::Connection;

const CHILD_DB: &str = "ANYLOCK_TEST_CHILD_DB";
const CHILD_HOLD_MS: &str = "ANYLOCK_TEST_CHILD_HOLD_MS";
const LONG_TTL: Duration = Duration::from_secs(60);

fn locker(backend: LocalBackend, wait: WaitMode) -> Locker {
    Locker::new(Arc::new(backend)).with_options(LockOptions::new(LONG_TTL).with_wait(wait))
}

/// Not a test on its own: the body of the child process the other tests start. It takes
/// `job`, prints `HELD <token>`, holds it for `CHILD_HOLD_MS` (forever if unset) and
/// releases. Ignored in normal runs, where it would pass without testing anything.
#[tokio::test]
#[ignore = "the body of a child process; the tests that need it run it with --ignored"]
async fn child_holder() {
    let Ok(path) = std::env::var(CHILD_DB) else {
        return;
    };
    let backend = LocalBackend::connect(LocalConfig::new(path))
        .await
        .expect("open");
    let guard = locker(backend, WaitMode::Forever)
        .acquire("job")
        .await
        .expect("acquire");
    println!("HELD {}", guard.fence_token().map_or(0, |t| t.get()));
    let hold = std::env::var(CHILD_HOLD_MS)
        .ok()
        .and_then(|ms| ms.parse().ok());
    tokio::time::sleep(Duration::from_millis(hold.unwrap_or(u64::MAX / 4))).await;
    guard.release().await.expect("release");
    println!("RELEASED");
}

/// Starts this test binary as a child running `child_holder`, and waits until it holds
/// the lock; returns the child and its token.
fn spawn_holder(db: &TempDb, hold_ms: Option<u64>) -> (Child, u64) {
    spawn_holder_with(
        Command::new(std::env::current_exe().expect("test binary")),
        db,
        hold_ms,
    )
}

/// As [`spawn_holder`], in a PID namespace of its own with its own `/proc` (as in a
/// container sharing the lock directory). Killing the returned `unshare` kills the holder.
fn spawn_holder_in_own_pid_namespace(db: &TempDb) -> (Child, u64) {
    let mut command = unshare();
    command.arg(std::env::current_exe().expect("test binary"));
    spawn_holder_with(command, db, None)
}

/// `unshare` into a new PID namespace with its own `/proc`, as an unprivileged user
/// through a user namespace.
fn unshare() -> Command {
    let mut command = Command::new("unshare");
    command.args(["--pid", "--fork", "--mount-proc", "--kill-child"]);
    if !nix::unistd::geteuid().is_root() {
        command.args(["--user", "--map-root-user"]);
    }
    command
}

/// Whether this machine lets us create PID namespaces; when it does not, the test is
/// skipped, or fails where servers are required (CI).
fn pid_namespaces_available() -> bool {
    let tried = unshare().arg("true").stderr(Stdio::piped()).output();
    match tried {
        Ok(out) if out.status.success() => true,
        other => {
            let why = match other {
                Ok(out) => String::from_utf8_lossy(&out.stderr).trim().to_owned(),
                Err(err) => err.to_string(),
            };
            assert!(
                !test_kit::env::servers_required(),
                "cannot create a PID namespace ({why}): run as root, or enable unprivileged \
                 user namespaces; `unshare` is in util-linux"
            );
            eprintln!("SKIPPED: cannot create a PID namespace: {why}");
            false
        }
    }
}

fn spawn_holder_with(mut command: Command, db: &TempDb, hold_ms: Option<u64>) -> (Child, u64) {
    command
        .args([
            "--exact",
            "child_holder",
            "--ignored",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(CHILD_DB, db.path())
        .stdout(Stdio::piped())
        .stderr(Stdio::null());
    if let Some(ms) = hold_ms {
        command.env(CHILD_HOLD_MS, ms.to_string());
    }
    let mut child = command.spawn().expect("spawn the child holder");
    let stdout = child.stdout.take().expect("stdout");
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            // libtest prints "test child_holder ... " on the same line first.
            if let Some(token) = line.split("HELD ").nth(1) {
                let _ = tx.send(token.trim().parse::<u64>().expect("token"));
            }
        }
    });
    match rx.recv_timeout(Duration::from_secs(30)) {
        Ok(token) => (child, token),
        Err(_) => {
            let _ = child.kill();
            panic!("the child never reported holding the lock");
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_holder_is_taken_over_at_once_even_as_a_zombie() {
    let db = TempDb::new();
    let (mut child, child_token) = spawn_holder(&db, None);
    let ours = locker(db.open().await, WaitMode::TryOnce);
    assert!(
        ours.try_acquire("job").await.expect("call").is_none(),
        "the live child holds it"
    );
    child.kill().expect("SIGKILL the holder");
    // Not reaped yet: the child is a zombie, which must count as dead.
    tokio::time::sleep(Duration::from_millis(200)).await;
    let start = Instant::now();
    let guard = ours
        .try_acquire("job")
        .await
        .expect("call")
        .expect("taken over at once");
    assert!(
        start.elapsed() < Duration::from_secs(5),
        "took {:?}",
        start.elapsed()
    );
    assert!(guard.fence_token().map(|t| t.get()) > Some(child_token));
    child.wait().expect("reap");
    guard.release().await.expect("release");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_live_holder_in_another_pid_namespace_is_not_taken_over() {
    if !pid_namespaces_available() {
        return;
    }
    let db = TempDb::new();
    let (mut unshare, holder_token) = spawn_holder_in_own_pid_namespace(&db);
    let ours = locker(db.open().await, WaitMode::TryOnce);
    for attempt in 0..10 {
        let got = ours.try_acquire("job").await.expect("call");
        if let Some(guard) = got {
            let _ = unshare.kill();
            panic!(
                "attempt {attempt}: took the lock (token {:?}) from a live holder (token \
                 {holder_token}) we cannot see in our PID namespace",
                guard.fence_token()
            );
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // `--kill-child`: the holder dies with `unshare`, so the kernel closes its files.
    unshare
        .kill()
        .expect("SIGKILL unshare and with it the holder");
    unshare.wait().expect("reap unshare");
    let start = Instant::now();
    let guard = loop {
        if let Some(guard) = ours.try_acquire("job").await.expect("call") {
            break guard;
        }
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "a dead holder in another PID namespace was not taken over (TTL 60 s)"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert!(guard.fence_token().map(|t| t.get()) > Some(holder_token));
    guard.release().await.expect("release");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn processes_exclude_each_other_and_hand_over_on_release() {
    let db = TempDb::new();
    let (mut child, child_token) = spawn_holder(&db, Some(1500));
    let start = Instant::now();
    let waiter = locker(db.open().await, WaitMode::Timeout(Duration::from_secs(30)));
    let guard = waiter
        .acquire("job")
        .await
        .expect("after the child releases");
    let waited = start.elapsed();
    assert!(
        waited >= Duration::from_millis(1000),
        "got it while the child held it ({waited:?})"
    );
    assert!(guard.fence_token().map(|t| t.get()) > Some(child_token));
    assert!(child.wait().expect("child").success(), "the child failed");
    guard.release().await.expect("release");
}

#[tokio::test]
async fn fence_tokens_survive_reopening_the_database() {
    let db = TempDb::new();
    let first = locker(db.open().await, WaitMode::TryOnce);
    let guard = first.try_acquire("job").await.expect("call").expect("free");
    let before = guard.fence_token();
    guard.release().await.expect("release");
    first
        .backend()
        .inspect(&LockName::new("job").expect("name"))
        .await
        .expect("inspect");
    let second = locker(db.open().await, WaitMode::TryOnce);
    let guard = second
        .try_acquire("job")
        .await
        .expect("call")
        .expect("free");
    assert!(
        guard.fence_token() > before,
        "{:?} after {before:?}",
        guard.fence_token()
    );
    guard.release().await.expect("release");
}

/// A lease of another boot (this machine before a reboot, or another host sharing the file:
/// they look the same) holds until its wall-clock expiry, then is free.
#[tokio::test]
async fn a_lease_from_an_earlier_boot_ends_at_its_wall_clock_expiry() {
    let db = TempDb::new();
    let backend = db.open().await;
    let ours = locker(backend, WaitMode::TryOnce);
    let guard = ours.try_acquire("job").await.expect("call").expect("free");
    let token = guard.fence_token();
    std::mem::forget(guard);
    let url = format!("sqlite://{}", db.path().display());
    let mut conn = sqlx::SqliteConnection::connect(&url)
        .await
        .expect("connect");
    sqlx::query("UPDATE anylock_leases SET boot_id = 'an-earlier-boot', pid = NULL")
        .execute(&mut conn)
        .await
        .expect("rewrite the boot");
    let rival = locker(db.open().await, WaitMode::TryOnce);
    assert!(
        rival.try_acquire("job").await.expect("call").is_none(),
        "held until its wall-clock expiry"
    );
    sqlx::query("UPDATE anylock_leases SET expires_wall_ms = expires_wall_ms - 61000")
        .execute(&mut conn)
        .await
        .expect("let its TTL pass on the wall clock");
    let guard = rival
        .try_acquire("job")
        .await
        .expect("call")
        .expect("free once its wall-clock expiry has passed");
    assert!(guard.fence_token() > token);
}

#[tokio::test]
async fn a_lease_from_an_older_version_is_not_taken_over_early() {
    let db = TempDb::new();
    let url = format!("sqlite://{}?mode=rwc", db.path().display());
    let mut conn = sqlx::SqliteConnection::connect(&url)
        .await
        .expect("connect");
    let boot = std::fs::read_to_string("/proc/sys/kernel/random/boot_id").expect("boot id");
    // The old schema, and a lease naming a pid nobody can see (another PID namespace).
    for statement in [
        "CREATE TABLE anylock_leases (name TEXT PRIMARY KEY NOT NULL, owner TEXT, \
         token INTEGER NOT NULL, boot_id TEXT, pid INTEGER, pid_start INTEGER, \
         acquired_ms INTEGER, expires_ms INTEGER) STRICT",
        "INSERT INTO anylock_leases VALUES ('job', 'old-holder', 7, ?1, 4194300, 1, 0, \
         9223372036854775807)",
    ] {
        sqlx::query(statement)
            .bind(boot.trim())
            .execute(&mut conn)
            .await
            .expect("old database");
    }
    let ours = locker(db.open().await, WaitMode::TryOnce);
    assert!(
        ours.try_acquire("job").await.expect("call").is_none(),
        "an unseen pid is no proof of death"
    );
}

#[tokio::test]
async fn an_unusable_path_is_a_clear_config_error() {
    let config = LocalConfig::new("/proc/anylock-cannot-create/locks.sqlite3");
    let err = LocalBackend::connect(config)
        .await
        .expect_err("cannot create");
    assert_eq!(err.kind(), ErrorKind::Config, "{err}");
    assert!(
        err.to_string()
            .contains("cannot create /proc/anylock-cannot-create"),
        "{err}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn many_processes_opening_a_fresh_database_at_once_all_succeed() {
    for round in 0..20 {
        let db = TempDb::new();
        let opens: Vec<_> = (0..16)
            .map(|_| {
                let config = db.config();
                tokio::spawn(async move { LocalBackend::connect(config).await })
            })
            .collect();
        for open in opens {
            let backend = open.await.expect("join");
            if let Err(err) = backend {
                panic!("round {round}: a concurrent first open failed: {err}");
            }
        }
    }
}
