//! Semaphore permits on the embedded backend, where the shared conformance cases cannot
//! look: the lock and the semaphore of one name leave each other alone; separate backend
//! instances (separate pools, as separate processes have) never pass N together; a permit
//! holder whose process was killed frees its place at once; tokens survive reopening the
//! file; a batch mixes locks and permits; a release wakes a permit waiter without it
//! spinning; detach; other boots' permits; a planted bad limit is a typed error.

mod common;

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use backend_local::{LocalBackend, LocalConfig};
use common::TempDb;
use lockcore::{
    Acquire, AcquireRequest, ErrorKind, Guarantees, HeldLock, HolderInfo, Identity, Lease,
    LockBackend, LockName, LockOptions, Locker, Permits, ReleaseEvents, Result, Ttl, WaitMode,
};
use sqlx::Connection;

const CHILD_DB: &str = "ANYLOCK_TEST_PERMIT_CHILD_DB";
const CHILD_PERMITS: &str = "ANYLOCK_TEST_PERMIT_CHILD_N";
const LONG: Duration = Duration::from_secs(60);

fn name(text: &str) -> LockName {
    LockName::new(text).expect("valid name")
}

fn request(name_: &str, owner: &Identity, ttl: Duration) -> AcquireRequest {
    AcquireRequest::new(
        name(name_),
        owner.clone(),
        Ttl::new(ttl).expect("valid TTL"),
    )
}

fn permit_request(name_: &str, owner: &Identity, n: u32, ttl: Duration) -> AcquireRequest {
    request(name_, owner, ttl).with_permits(Permits::new(n).expect("valid count"))
}

/// A permit of `n` that must be granted.
async fn permit(backend: &impl LockBackend, name_: &str, owner: &Identity, n: u32) -> Lease {
    permit_for(backend, name_, owner, n, LONG).await
}

async fn permit_for(
    backend: &impl LockBackend,
    name_: &str,
    owner: &Identity,
    n: u32,
    ttl: Duration,
) -> Lease {
    let request = permit_request(name_, owner, n, ttl);
    match backend.acquire_permit(&request).await.expect("permit call") {
        Acquire::Acquired(lease) => {
            assert_eq!(lease.permits().map(Permits::get), Some(n));
            lease
        }
        Acquire::Held(holder) => panic!("{name_}: no permit of {n}; held by {}", holder.owner()),
    }
}

/// A permit attempt that must find the semaphore full; returns the holder it names.
async fn full(backend: &impl LockBackend, name_: &str, n: u32) -> HolderInfo {
    let request = permit_request(name_, &Identity::unique(), n, LONG);
    match backend.acquire_permit(&request).await.expect("permit call") {
        Acquire::Held(holder) => holder,
        Acquire::Acquired(lease) => panic!("{name_}: a permit of {n} was granted: {lease:?}"),
    }
}

async fn lock(backend: &impl LockBackend, name_: &str, owner: &Identity) -> Lease {
    match backend
        .acquire(&request(name_, owner, LONG))
        .await
        .expect("acquire call")
    {
        Acquire::Acquired(lease) => lease,
        Acquire::Held(holder) => panic!("lock {name_} held by {}", holder.owner()),
    }
}

fn token(lease: &Lease) -> u64 {
    lease.token().expect("a fence token").get()
}

/// The liveness files in the database's holders directory.
fn liveness_files(db: &TempDb) -> usize {
    let dir = db.dir.join("locks.sqlite3.holders");
    std::fs::read_dir(dir).map_or(0, Iterator::count)
}

async fn raw(db: &TempDb) -> sqlx::SqliteConnection {
    let url = format!("sqlite://{}", db.path().display());
    sqlx::SqliteConnection::connect(&url)
        .await
        .expect("connect")
}

/// The lock `x` and the semaphore `x` neither exclude each other nor touch each other's
/// rows, counters or releases.
#[tokio::test]
async fn the_lock_and_the_semaphore_of_one_name_are_independent() {
    let db = TempDb::new();
    let backend = db.open().await;
    let (a, b) = (Identity::unique(), Identity::unique());
    let locked = lock(&backend, "x", &a).await;
    // The lock is held: a permit of one is still free, and fills the semaphore.
    let held = permit(&backend, "x", &b, 1).await;
    assert_eq!(full(&backend, "x", 1).await.owner(), &b);
    let rival = backend
        .acquire(&request("x", &Identity::unique(), LONG))
        .await
        .expect("call");
    assert!(
        matches!(rival, Acquire::Held(ref h) if h.owner() == &a),
        "{rival:?}"
    );
    // Each inspection sees its own kind only.
    let inspected = backend.inspect(&name("x")).await.expect("inspect");
    assert_eq!(inspected.map(|h| h.owner().clone()), Some(a.clone()));
    let permits = backend.inspect_permits(&name("x")).await.expect("inspect");
    assert_eq!(permits.len(), 1);
    assert_eq!(permits[0].owner(), &b);
    // Releasing the permit leaves the lock held; the lock's release leaves the next
    // permit alone; the lock's counter did not move for the permits.
    backend.release(&held).await.expect("release");
    assert!(
        backend
            .inspect(&name("x"))
            .await
            .expect("inspect")
            .is_some()
    );
    let again = permit(&backend, "x", &b, 1).await;
    backend.release(&locked).await.expect("release");
    assert_eq!(
        backend
            .inspect_permits(&name("x"))
            .await
            .expect("inspect")
            .len(),
        1
    );
    let relocked = lock(&backend, "x", &a).await;
    assert_eq!(
        token(&relocked),
        token(&locked) + 1,
        "the permits moved the lock's counter"
    );
    assert_eq!(token(&again), token(&held) + 1);
    assert_eq!(backend.list("").await.expect("list").len(), 1);
    backend.release(&again).await.expect("release");
    backend.release(&relocked).await.expect("release");
}

/// A backend instance per contender group, each with its own pools (as separate processes
/// have): 4 instances × 3 tasks × 15 rounds on a semaphore of 3. The holders inside,
/// counted by the test, never pass 3, and reach it: in its first round each holder stays
/// until 3 were inside at once (or 500 ms passed), so reaching 3 does not hang on 3 ms
/// holds overlapping by luck (on a loaded machine they once never did: "never 3 inside"),
/// and a mutex still fails it.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn separate_backends_on_one_file_never_exceed_n() {
    const LIMIT: u32 = 3;
    let db = TempDb::new();
    let inside = Arc::new(AtomicUsize::new(0));
    let most = Arc::new(AtomicUsize::new(0));
    let tokens = Arc::new(std::sync::Mutex::new(Vec::new()));
    let mut tasks = Vec::new();
    for _ in 0..4 {
        let backend = Arc::new(db.open().await);
        for _ in 0..3 {
            let locker = Locker::new(backend.clone()).with_options(
                LockOptions::new(Duration::from_secs(30))
                    .with_wait(WaitMode::Timeout(Duration::from_secs(60))),
            );
            let (inside, most, tokens) = (inside.clone(), most.clone(), tokens.clone());
            tasks.push(tokio::spawn(async move {
                for round in 0..15 {
                    let guard = locker.acquire_permit("pool", LIMIT).await.expect("permit");
                    let now = inside.fetch_add(1, Ordering::SeqCst) + 1;
                    most.fetch_max(now, Ordering::SeqCst);
                    tokens.lock().expect("lock").push(guard.fence_token());
                    let until = tokio::time::Instant::now() + Duration::from_millis(500);
                    while round == 0
                        && most.load(Ordering::SeqCst) < LIMIT as usize
                        && tokio::time::Instant::now() < until
                    {
                        tokio::time::sleep(Duration::from_millis(1)).await;
                    }
                    tokio::time::sleep(Duration::from_millis(3)).await;
                    inside.fetch_sub(1, Ordering::SeqCst);
                    guard.release().await.expect("release");
                }
            }));
        }
    }
    for task in tasks {
        task.await.expect("contender");
    }
    let most = most.load(Ordering::SeqCst);
    assert!(
        most <= LIMIT as usize,
        "{most} holders of a semaphore of {LIMIT}"
    );
    assert_eq!(most, LIMIT as usize, "never {LIMIT} inside: a mutex?");
    let tokens = tokens.lock().expect("lock");
    let distinct: std::collections::HashSet<_> = tokens.iter().collect();
    assert_eq!(distinct.len(), tokens.len(), "a token was handed out twice");
}

/// Not a test on its own: the body of the child process the dead-holder tests start. It
/// takes a permit of `jobs` (of `CHILD_PERMITS`), prints `HELD <token>` and holds it until
/// it is killed. Ignored in normal runs.
#[tokio::test]
#[ignore = "the body of a child process; the tests that need it run it with --ignored"]
async fn child_permit_holder() {
    let Ok(path) = std::env::var(CHILD_DB) else {
        return;
    };
    let n: u32 = std::env::var(CHILD_PERMITS)
        .expect("permits")
        .parse()
        .expect("a number");
    let backend = LocalBackend::connect(LocalConfig::new(path))
        .await
        .expect("open");
    let guard = Locker::new(Arc::new(backend))
        .with_options(LockOptions::new(LONG).with_wait(WaitMode::TryOnce))
        .acquire_permit("jobs", n)
        .await
        .expect("a permit");
    println!("HELD {}", guard.fence_token().map_or(0, |t| t.get()));
    tokio::time::sleep(Duration::from_secs(3600)).await;
    drop(guard);
}

/// Starts this test binary as a child running `child_permit_holder` and waits until it
/// holds its permit; returns the child and its token.
fn spawn_permit_holder(db: &TempDb, n: u32) -> (Child, u64) {
    let mut child = Command::new(std::env::current_exe().expect("test binary"))
        .args([
            "--exact",
            "child_permit_holder",
            "--ignored",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(CHILD_DB, db.path())
        .env(CHILD_PERMITS, n.to_string())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn the child holder");
    let stdout = child.stdout.take().expect("stdout");
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(|l| l.ok()) {
            if let Some(token) = line.split("HELD ").nth(1) {
                let _ = tx.send(token.trim().parse::<u64>().expect("token"));
            }
        }
    });
    match rx.recv_timeout(Duration::from_secs(30)) {
        Ok(token) => (child, token),
        Err(_) => {
            let _ = child.kill();
            panic!("the child never reported holding its permit");
        }
    }
}

/// A semaphore of 2: one permit ours, one a child process's. While the child lives the
/// semaphore is full; once it is SIGKILLed (TTL 60 s, still an unreaped zombie) its place
/// is free at once, and only its place: our own live permit still counts.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_permit_holder_frees_its_place_at_once() {
    let db = TempDb::new();
    let backend = db.open().await;
    let ours = permit(&backend, "jobs", &Identity::unique(), 2).await;
    let (mut child, child_token) = spawn_permit_holder(&db, 2);
    full(&backend, "jobs", 2).await;
    child.kill().expect("SIGKILL the holder");
    tokio::time::sleep(Duration::from_millis(200)).await;
    let start = Instant::now();
    let taken = permit(&backend, "jobs", &Identity::unique(), 2).await;
    assert!(start.elapsed() < Duration::from_secs(5));
    assert!(token(&taken) > child_token);
    // Full again: our first permit was not taken for dead (its holder lives, here).
    full(&backend, "jobs", 2).await;
    let listed = backend
        .inspect_permits(&name("jobs"))
        .await
        .expect("inspect");
    let tokens: Vec<u64> = listed
        .iter()
        .filter_map(|h| h.token())
        .map(|t| t.get())
        .collect();
    assert_eq!(tokens, [token(&ours), token(&taken)]);
    child.wait().expect("reap");
    backend.release(&ours).await.expect("release");
    backend.release(&taken).await.expect("release");
}

/// A live permit of another limit refuses the request; once its holder is killed it no
/// longer does (its holder is proven dead, so it does not count).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_holder_of_another_limit_does_not_block() {
    let db = TempDb::new();
    let backend = db.open().await;
    let (mut child, _) = spawn_permit_holder(&db, 1);
    let request = permit_request("jobs", &Identity::unique(), 2, LONG);
    let err = backend
        .acquire_permit(&request)
        .await
        .expect_err("a limit of 2 against a live limit of 1");
    assert_eq!(err.kind(), ErrorKind::InvalidInput, "{err}");
    child.kill().expect("SIGKILL the holder");
    child.wait().expect("reap");
    let taken = permit(&backend, "jobs", &Identity::unique(), 2).await;
    backend.release(&taken).await.expect("release");
}

/// A semaphore's tokens rise across release (its rows deleted), closing and reopening the
/// file, and a permit of an earlier boot (which does not count once its wall-clock expiry
/// has passed).
#[tokio::test]
async fn permit_tokens_keep_rising_across_reopening() {
    let db = TempDb::new();
    let first = db.open().await;
    let a = permit(&first, "tokens", &Identity::unique(), 2).await;
    let b = permit(&first, "tokens", &Identity::unique(), 2).await;
    first.release(&a).await.expect("release");
    first.release(&b).await.expect("release");
    first.close().await;
    let second = db.open().await;
    let c = permit(&second, "tokens", &Identity::unique(), 2).await;
    assert!(token(&c) > token(&b), "{} after {}", token(&c), token(&b));
    // Both permits of another boot whose wall-clock expiry has passed: neither counts, and
    // tokens still rise.
    let d = permit(&second, "tokens", &Identity::unique(), 2).await;
    sqlx::query("UPDATE anylock_permits SET boot_id = 'an-earlier-boot', expires_wall_ms = 0")
        .execute(&mut raw(&db).await)
        .await
        .expect("rewrite the boot");
    assert!(
        second
            .inspect_permits(&name("tokens"))
            .await
            .expect("inspect")
            .is_empty()
    );
    let e = permit(&second, "tokens", &Identity::unique(), 2).await;
    let f = permit(&second, "tokens", &Identity::unique(), 2).await;
    assert!(token(&e) > token(&d) && token(&f) > token(&e));
    second.release(&e).await.expect("release");
    second.release(&f).await.expect("release");
}

/// One `refresh_many` of locks and permits, where a lock and a permit share a name, an
/// owner and a token: each is extended in its own table; a released permit is `Lost`, is
/// not re-created and loses its liveness file; a permit twice gets two answers.
#[tokio::test]
async fn a_batch_mixes_locks_and_permits() {
    let db = TempDb::new();
    let backend = db.open().await;
    let me = Identity::unique();
    let ttl = Duration::from_secs(5);
    let locked = match backend
        .acquire(&request("x", &me, ttl))
        .await
        .expect("call")
    {
        Acquire::Acquired(lease) => lease,
        Acquire::Held(_) => panic!("held"),
    };
    let permit_x = permit_for(&backend, "x", &me, 2, ttl).await;
    assert_eq!(
        token(&locked),
        token(&permit_x),
        "same name, owner and token"
    );
    let permit_y = permit_for(&backend, "y", &me, 1, ttl).await;
    let gone = permit_for(&backend, "z", &me, 1, ttl).await;
    backend.release(&gone).await.expect("release");
    let files_before = liveness_files(&db);
    tokio::time::sleep(Duration::from_millis(2500)).await;
    let batch = [
        locked.clone(),
        permit_x.clone(),
        gone.clone(),
        permit_y.clone(),
        permit_x.clone(),
    ];
    let results = backend.refresh_many(&batch).await;
    for (i, result) in results.iter().enumerate() {
        match (i, result) {
            (2, Err(err)) => assert_eq!(err.kind(), ErrorKind::Lost, "{err}"),
            (2, Ok(_)) => panic!("a released permit was refreshed"),
            (_, Ok(lease)) => assert_eq!(lease.grant(), batch[i].grant()),
            (_, Err(err)) => panic!("lease {i}: {err}"),
        }
    }
    assert_eq!(liveness_files(&db), files_before);
    for name_ in ["x", "y"] {
        let listed = backend
            .inspect_permits(&name(name_))
            .await
            .expect("inspect");
        let left = listed[0].expires_in().expect("a TTL");
        assert!(left > Duration::from_millis(3500), "{name_}: {left:?} left");
    }
    let lock_left = backend.inspect(&name("x")).await.expect("inspect");
    let lock_left = lock_left.and_then(|h| h.expires_in()).expect("held");
    assert!(lock_left > Duration::from_millis(3500), "{lock_left:?}");
    assert!(
        backend
            .inspect_permits(&name("z"))
            .await
            .expect("inspect")
            .is_empty()
    );
    // The lost permit's liveness file: a lease lost while we still hold its file.
    let held = permit_for(&backend, "w", &me, 1, ttl).await;
    sqlx::query("DELETE FROM anylock_permits WHERE name = 'w'")
        .execute(&mut raw(&db).await)
        .await
        .expect("delete behind its back");
    let with_file = liveness_files(&db);
    let results = backend.refresh_many(&[held, locked.clone()]).await;
    assert_eq!(
        results[0].as_ref().map_err(|e| e.kind()).err(),
        Some(ErrorKind::Lost)
    );
    assert!(results[1].is_ok());
    assert_eq!(
        liveness_files(&db),
        with_file - 1,
        "the lost permit keeps its file"
    );
    for lease in [locked, permit_x, permit_y] {
        backend.release(&lease).await.expect("release");
    }
}

/// Counts permit attempts, forwarding everything to the backend.
#[derive(Debug)]
struct Counted {
    inner: LocalBackend,
    permit_attempts: AtomicUsize,
}

#[async_trait]
impl LockBackend for Counted {
    fn backend_name(&self) -> &str {
        "local"
    }
    async fn acquire(&self, request: &AcquireRequest) -> Result<Acquire> {
        self.inner.acquire(request).await
    }
    async fn refresh(&self, lease: &Lease) -> Result<Lease> {
        self.inner.refresh(lease).await
    }
    async fn refresh_many(&self, leases: &[Lease]) -> Vec<Result<Lease>> {
        self.inner.refresh_many(leases).await
    }
    async fn release(&self, lease: &Lease) -> Result<()> {
        self.inner.release(lease).await
    }
    async fn inspect(&self, name: &LockName) -> Result<Option<HolderInfo>> {
        self.inner.inspect(name).await
    }
    async fn acquire_permit(&self, request: &AcquireRequest) -> Result<Acquire> {
        self.permit_attempts.fetch_add(1, Ordering::SeqCst);
        self.inner.acquire_permit(request).await
    }
    async fn inspect_permits(&self, name: &LockName) -> Result<Vec<HolderInfo>> {
        self.inner.inspect_permits(name).await
    }
    fn guarantees(&self) -> Guarantees {
        self.inner.guarantees()
    }
    async fn list(&self, prefix: &str) -> Result<Vec<HeldLock>> {
        self.inner.list(prefix).await
    }
    async fn subscribe(&self, name: &LockName) -> Result<Option<ReleaseEvents>> {
        self.inner.subscribe(name).await
    }
}

/// A permit waiter whose backoff would keep it asleep for a minute: it sleeps (no attempts
/// while the semaphore stays full, though the lock of its name is free), and a permit's
/// release wakes it at once.
#[cfg(target_os = "linux")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_permit_release_wakes_a_permit_waiter_that_does_not_spin() {
    use lockcore::{Backoff, Jitter};
    let db = TempDb::new();
    let holder = Locker::new(Arc::new(db.open().await));
    let guard = holder.acquire_permit("slots", 1).await.expect("free");
    let counted = Arc::new(Counted {
        inner: db.open().await,
        permit_attempts: AtomicUsize::new(0),
    });
    let minute = Duration::from_secs(60);
    let waiter = Locker::new(counted.clone()).with_options(
        LockOptions::new(Duration::from_secs(30))
            .with_backoff(Backoff::new(minute, minute).with_jitter(Jitter::None))
            .with_wait(WaitMode::Timeout(Duration::from_secs(120))),
    );
    let task = tokio::spawn(async move { waiter.acquire_permit("slots", 1).await });
    tokio::time::sleep(Duration::from_millis(500)).await;
    let attempts = counted.permit_attempts.load(Ordering::SeqCst);
    assert_eq!(attempts, 2, "the waiter's attempts before it sleeps");
    let released = Instant::now();
    guard.release().await.expect("release");
    let next = tokio::time::timeout(Duration::from_secs(10), task)
        .await
        .expect("the permit's release did not wake the waiter (it would sleep a minute)")
        .expect("join")
        .expect("a permit");
    assert!(released.elapsed() < Duration::from_secs(5));
    assert_eq!(counted.permit_attempts.load(Ordering::SeqCst), 3);
    next.release().await.expect("release");
}

/// A detached permit is untied from its process: its liveness file goes, it stays held
/// until its TTL, and with no file it is never taken for dead.
#[tokio::test]
async fn a_detached_permit_outlives_its_file() {
    let db = TempDb::new();
    let backend = db.open().await;
    let lease = permit(&backend, "detached", &Identity::unique(), 1).await;
    let files = liveness_files(&db);
    backend.detach(&lease).await.expect("detach");
    assert_eq!(liveness_files(&db), files - 1, "the file stays");
    let rival = db.open().await;
    full(&rival, "detached", 1).await;
    let listed = rival
        .inspect_permits(&name("detached"))
        .await
        .expect("inspect");
    assert_eq!(listed.len(), 1);
    assert_eq!(listed[0].token().map(|t| t.get()), Some(token(&lease)));
    let stored: Option<String> =
        sqlx::query_scalar("SELECT liveness FROM anylock_permits WHERE name = 'detached'")
            .fetch_one(&mut raw(&db).await)
            .await
            .expect("read");
    assert_eq!(stored, None);
    backend.release(&lease).await.expect("release");
}

/// A limit written by hand outside 1 to 10,000 is a `Protocol` error, not a panic nor a
/// limit conflict naming a nonsense limit.
#[tokio::test]
async fn a_planted_bad_limit_is_a_typed_error() {
    let db = TempDb::new();
    let backend = db.open().await;
    let lease = permit(&backend, "planted", &Identity::unique(), 2).await;
    for bad in [0, -1, 10_001, i64::MAX] {
        sqlx::query("UPDATE anylock_permits SET permits = ?1")
            .bind(bad)
            .execute(&mut raw(&db).await)
            .await
            .expect("plant");
        let request = permit_request("planted", &Identity::unique(), 2, LONG);
        let err = backend
            .acquire_permit(&request)
            .await
            .expect_err("a planted limit");
        assert_eq!(err.kind(), ErrorKind::Protocol, "{bad}: {err}");
    }
    backend.release(&lease).await.expect("release");
}
