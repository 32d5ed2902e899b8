//! Semaphore permits on PostgreSQL, beyond the shared conformance cases: the permits'
//! own table and sequence (a lock and a semaphore of one name never touch each other),
//! contention from separate backends (separate pools), a refresh in flight counted by a
//! concurrent acquire, tokens across release, expiry, retake and deleted rows, schema
//! creation by many connects at once (fresh, and next to a lock table made before
//! semaphores), batches mixing locks and permits, planted rows, fenced writes, release
//! notifications, least privilege, and the statements each operation runs (counted by
//! `pg_stat_statements` on the private server).

mod common;

use std::collections::HashSet;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use backend_postgres::{PostgresBackend, PostgresConfig};
use common::{admin, backend, fresh_name, fresh_schema, grant, shared_url, table};
use futures_util::StreamExt;
use lockcore::{
    Acquire, AcquireRequest, Backoff, ErrorKind, FenceToken, Identity, Jitter, Lease, LockBackend,
    LockName, LockOptions, Locker, Permits, WaitMode,
};
use sqlx::postgres::PgPool;
use sqlx::{AssertSqlSafe, Row};
use tokio::time::{Instant, sleep, timeout};

const LONG: Duration = Duration::from_secs(60);

/// `"schema"."leases_sem"`, the permits table, quoted for the test's own statements.
fn permits_table(schema: &str) -> String {
    format!("\"{}\".\"leases_sem\"", schema.replace('"', "\"\""))
}

/// One direct permit attempt of `owner` on a semaphore of `n`.
async fn attempt(
    backend: &dyn LockBackend,
    name: &LockName,
    owner: &Identity,
    n: u32,
    ttl: Duration,
) -> lockcore::Result<Acquire> {
    let request = AcquireRequest::new(
        name.clone(),
        owner.clone(),
        lockcore::Ttl::new(ttl).expect("valid TTL"),
    )
    .with_permits(Permits::new(n).expect("valid count"));
    backend.acquire_permit(&request).await
}

/// A direct permit attempt that must be granted.
async fn permit(
    backend: &dyn LockBackend,
    name: &LockName,
    owner: &Identity,
    n: u32,
    ttl: Duration,
) -> Lease {
    match attempt(backend, name, owner, n, ttl).await {
        Ok(Acquire::Acquired(lease)) => {
            assert_eq!(lease.permits().map(Permits::get), Some(n));
            lease
        }
        Ok(Acquire::Held(first)) => panic!("{name}: full, first to expire {}", first.owner()),
        Err(err) => panic!("{name}: permit of {n} failed: {err}"),
    }
}

/// A direct permit attempt that must find the semaphore full; the first holder to expire.
async fn full(
    backend: &dyn LockBackend,
    name: &LockName,
    owner: &Identity,
    n: u32,
) -> lockcore::HolderInfo {
    match attempt(backend, name, owner, n, LONG).await {
        Ok(Acquire::Held(first)) => first,
        Ok(Acquire::Acquired(lease)) => panic!("{name}: granted {lease:?} on a full semaphore"),
        Err(err) => panic!("{name}: {err}"),
    }
}

fn token(lease: &Lease) -> u64 {
    lease.token().map(FenceToken::get).expect("a token")
}

async fn run(admin: &PgPool, sql: String) {
    sqlx::raw_sql(AssertSqlSafe(sql))
        .execute(admin)
        .await
        .expect("admin statement");
}

/// The lock `x` and the semaphore `x` do not exclude each other, and neither touches the
/// other's rows or tokens: in a fresh schema both sequences count 1, 2 on their own.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lock_and_a_semaphore_of_one_name_are_independent() {
    let Some(url) = shared_url() else { return };
    let schema = fresh_schema("semns");
    let _cleanup = common::drop_schema_later(&url, &schema);
    let backend = backend(&url, &schema).await;
    let admin = admin(&url).await;
    let x = fresh_name("x");
    let (a, b, c) = (Identity::unique(), Identity::unique(), Identity::unique());

    let lock = grant(&backend, &x, &a, LONG).await;
    let first = permit(&backend, &x, &b, 1, LONG).await;
    assert_eq!(
        common::attempt(&backend, &x, &c, LONG).await.holder_owner(),
        Some(a.clone()),
        "the lock is held by its holder, not by the permit's"
    );
    assert_eq!(full(&backend, &x, &c, 1).await.owner(), &b);
    assert_eq!(
        backend
            .inspect(&x)
            .await
            .expect("inspect")
            .map(|h| h.owner().clone()),
        Some(a.clone())
    );
    let holders = backend.inspect_permits(&x).await.expect("inspect_permits");
    assert_eq!(
        holders
            .iter()
            .map(|h| h.owner().clone())
            .collect::<Vec<_>>(),
        vec![b.clone()]
    );

    backend.release(&first).await.expect("release the permit");
    let lock_row = sqlx::query(AssertSqlSafe(format!(
        "SELECT owner, token FROM {} WHERE name = $1",
        table(&schema)
    )))
    .bind(x.as_str())
    .fetch_one(&admin)
    .await
    .expect("lock row");
    assert_eq!(
        lock_row.get::<String, _>("owner"),
        a.as_str(),
        "the permit's release freed the lock"
    );
    assert_eq!(lock_row.get::<i64, _>("token"), 1);

    let second = permit(&backend, &x, &b, 1, LONG).await;
    backend.release(&lock).await.expect("release the lock");
    assert_eq!(
        backend.inspect_permits(&x).await.expect("inspect").len(),
        1,
        "the lock's release freed the permit"
    );
    let again = grant(&backend, &x, &c, LONG).await;
    assert_eq!(
        (token(&lock), token(&again)),
        (1, 2),
        "two permit grants drew from the lock's sequence"
    );
    assert_eq!(
        (token(&first), token(&second)),
        (1, 2),
        "the permits count on their own"
    );
    let rows: i64 = sqlx::query_scalar(AssertSqlSafe(format!(
        "SELECT count(*) FROM {}",
        table(&schema)
    )))
    .fetch_one(&admin)
    .await
    .expect("count");
    assert_eq!(rows, 1, "permits wrote into the lock table");
}

trait HolderOwner {
    fn holder_owner(&self) -> Option<Identity>;
}

impl HolderOwner for Acquire {
    fn holder_owner(&self) -> Option<Identity> {
        match self {
            Acquire::Held(holder) => Some(holder.owner().clone()),
            Acquire::Acquired(_) => None,
        }
    }
}

const BACKENDS: usize = 4;
const TASKS_EACH: usize = 3;
const ROUNDS: usize = 12;
const LIMIT: u32 = 3;

/// 4 backends, each with its own pool of 2 connections, 3 contenders each, on one
/// semaphore of 3: an in-test register of the holders inside never passes 3 (and reaches
/// it), the permits table never shows more than 3 live rows, and no token repeats.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn separate_backends_never_exceed_n() {
    let Some(url) = shared_url() else { return };
    let schema = fresh_schema("semrace");
    let _cleanup = common::drop_schema_later(&url, &schema);
    let name = fresh_name("sem");
    let inside = Arc::new(AtomicUsize::new(0));
    let most = Arc::new(AtomicUsize::new(0));
    let tokens = Arc::new(std::sync::Mutex::new(Vec::new()));
    let backoff =
        Backoff::new(Duration::from_millis(1), Duration::from_millis(5)).with_jitter(Jitter::Full);
    let options = LockOptions::new(Duration::from_secs(30))
        .with_backoff(backoff)
        .with_wait(WaitMode::Timeout(Duration::from_secs(60)));
    let mut tasks = Vec::new();
    for _ in 0..BACKENDS {
        let config = common::config(&url, &schema).with_pool_size(2);
        let backend = PostgresBackend::connect(config).await.expect("connect");
        for _ in 0..TASKS_EACH {
            let locker = Locker::new(Arc::new(backend.clone())).with_options(options.clone());
            let (name, inside, most, tokens) =
                (name.clone(), inside.clone(), most.clone(), tokens.clone());
            tasks.push(tokio::spawn(async move {
                for _ in 0..ROUNDS {
                    let guard = locker.acquire_permit(&name, LIMIT).await.expect("permit");
                    let now = inside.fetch_add(1, Ordering::SeqCst) + 1;
                    most.fetch_max(now, Ordering::SeqCst);
                    tokens.lock().expect("tokens").push(guard.fence_token());
                    sleep(Duration::from_millis(3)).await;
                    inside.fetch_sub(1, Ordering::SeqCst);
                    guard.release().await.expect("release");
                }
            }));
        }
    }
    let admin = admin(&url).await;
    let watch = {
        let (admin, name, schema) = (admin.clone(), name.clone(), schema.clone());
        tokio::spawn(async move {
            let mut seen = 0_i64;
            for _ in 0..200 {
                let live: i64 = sqlx::query_scalar(AssertSqlSafe(format!(
                    "SELECT count(*) FROM {} WHERE name = $1 AND expires_at > now()",
                    permits_table(&schema)
                )))
                .bind(name.as_str())
                .fetch_one(&admin)
                .await
                .expect("count");
                seen = seen.max(live);
                sleep(Duration::from_millis(5)).await;
            }
            seen
        })
    };
    for task in tasks {
        task.await.expect("contender");
    }
    let most_rows = watch.await.expect("watcher");
    let most = most.load(Ordering::SeqCst);
    assert!(
        most <= LIMIT as usize,
        "{most} holders of a semaphore of {LIMIT}"
    );
    assert_eq!(most, LIMIT as usize, "never {LIMIT} holders at once");
    assert!(
        most_rows <= i64::from(LIMIT),
        "{most_rows} live permit rows"
    );
    let tokens = tokens.lock().expect("tokens");
    let distinct: HashSet<_> = tokens.iter().map(|t| t.expect("fenced")).collect();
    assert_eq!(distinct.len(), tokens.len(), "a token was handed out twice");
}

/// A permit whose refresh is in flight (its row updated but not committed) when its old
/// expiry passes still counts: an acquire on the full semaphore of 1 waits for the
/// refresh and answers `Held`, never a second permit.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refresh_in_flight_keeps_the_place() {
    let Some(url) = shared_url() else { return };
    let schema = fresh_schema("seminflight");
    let _cleanup = common::drop_schema_later(&url, &schema);
    let backend = backend(&url, &schema).await;
    let name = fresh_name("inflight");
    let (a, b) = (Identity::unique(), Identity::unique());
    let held = permit(&backend, &name, &a, 1, Duration::from_secs(1)).await;
    let admin = admin(&url).await;
    let mut refresh = admin.begin().await.expect("begin");
    let updated = sqlx::query(AssertSqlSafe(format!(
        "UPDATE {} SET expires_at = now() + interval '30 seconds' \
          WHERE name = $1 AND owner = $2 AND expires_at > clock_timestamp()",
        permits_table(&schema)
    )))
    .bind(name.as_str())
    .bind(a.as_str())
    .execute(&mut *refresh)
    .await
    .expect("the refresh's update");
    assert_eq!(
        updated.rows_affected(),
        1,
        "the permit was live when refreshed"
    );
    sleep(Duration::from_millis(1300)).await; // the old expiry has passed
    let rival = {
        let (backend, name, b) = (backend.clone(), name.clone(), b.clone());
        tokio::spawn(async move { attempt(&backend, &name, &b, 1, LONG).await })
    };
    sleep(Duration::from_millis(500)).await;
    refresh.commit().await.expect("commit the refresh");
    let outcome = rival.await.expect("join").expect("attempt");
    match outcome {
        Acquire::Held(first) => assert_eq!(first.owner(), &a),
        Acquire::Acquired(_) => panic!("a second permit of 1 while the first was refreshed"),
    }
    backend.refresh(&held).await.expect("still held");
}

/// Tokens rise across a release, an expiry, a retake and an operator deleting every
/// permit row: they come from a sequence, not from the rows.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn permit_tokens_rise_across_release_expiry_retake_and_deletes() {
    let Some(url) = shared_url() else { return };
    let schema = fresh_schema("semtok");
    let _cleanup = common::drop_schema_later(&url, &schema);
    let backend = backend(&url, &schema).await;
    let admin = admin(&url).await;
    let name = fresh_name("tok");
    let mut tokens = Vec::new();
    let released = permit(&backend, &name, &Identity::unique(), 2, LONG).await;
    tokens.push(token(&released));
    backend.release(&released).await.expect("release");
    let expiring = permit(
        &backend,
        &name,
        &Identity::unique(),
        2,
        Duration::from_secs(1),
    )
    .await;
    tokens.push(token(&expiring));
    sleep(Duration::from_millis(1300)).await;
    let owner = Identity::unique();
    tokens.push(token(&permit(&backend, &name, &owner, 2, LONG).await));
    tokens.push(token(&permit(&backend, &name, &owner, 2, LONG).await)); // retake
    run(&admin, format!("DELETE FROM {}", permits_table(&schema))).await;
    tokens.push(token(
        &permit(&backend, &name, &Identity::unique(), 2, LONG).await,
    ));
    assert!(
        tokens.windows(2).all(|w| w[0] < w[1]),
        "tokens went back: {tokens:?}"
    );
    let held = backend.inspect_permits(&name).await.expect("inspect");
    assert_eq!(held.len(), 1);
}

/// Eight backends connecting at once create the permit objects without failing: in a
/// fresh schema, and next to a lock table made before semaphores (with a lock held in
/// it, which stays held).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_connects_create_the_permit_objects() {
    let Some(url) = shared_url() else { return };
    let admin = admin(&url).await;
    let fresh = fresh_schema("semddl");
    let _cleanup = common::drop_schema_later(&url, &fresh);
    let old = fresh_schema("semold");
    let _cleanup_old = common::drop_schema_later(&url, &old);
    let before = backend(&url, &old).await;
    let name = fresh_name("held");
    let lock = grant(&before, &name, &Identity::unique(), LONG).await;
    let q = format!("\"{old}\"");
    run(
        &admin,
        format!("DROP TABLE {q}.leases_sem; DROP SEQUENCE {q}.leases_semf"),
    )
    .await;
    for schema in [&old, &fresh] {
        let connects: Vec<_> = (0..8)
            .map(|_| tokio::spawn(PostgresBackend::connect(common::config(&url, schema))))
            .collect();
        let mut backends = Vec::new();
        for connect in connects {
            backends.push(connect.await.expect("join").expect("concurrent creation"));
        }
        let sem = fresh_name("sem");
        for backend in &backends {
            permit(backend, &sem, &Identity::unique(), 8, LONG).await;
        }
        assert_eq!(
            backends[0]
                .inspect_permits(&sem)
                .await
                .expect("inspect")
                .len(),
            8
        );
    }
    before
        .refresh(&lock)
        .await
        .expect("the lock made before stays held");
}

/// A batch of locks and permits, through prepared and unprepared statements: each lease
/// gets what a refresh of it alone would give, in the batch's order, and the live ones
/// are extended.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_mixing_locks_and_permits_answers_each_in_order() {
    let Some(url) = shared_url() else { return };
    for prepared in [true, false] {
        let schema = fresh_schema("sembatch");
        let _cleanup = common::drop_schema_later(&url, &schema);
        let config = common::config(&url, &schema).with_prepared_statements(prepared);
        let backend = PostgresBackend::connect(config).await.expect("connect");
        let owner = Identity::unique();
        let short = Duration::from_secs(1);
        let ttl = Duration::from_secs(4);
        let (x, y, z, w, v) = (
            fresh_name("x"),
            fresh_name("y"),
            fresh_name("z"),
            fresh_name("w"),
            fresh_name("v"),
        );
        // The same owner holds the lock x and a permit of x: same name, owner, token 1.
        let lock_x = grant(&backend, &x, &owner, ttl).await;
        let permit_x = permit(&backend, &x, &owner, 2, ttl).await;
        assert_eq!(token(&lock_x), token(&permit_x));
        let lock_y = grant(&backend, &y, &owner, ttl).await;
        backend.release(&lock_y).await.expect("release");
        let permit_z = permit(&backend, &z, &owner, 2, ttl).await;
        backend.release(&permit_z).await.expect("release");
        let old_w = permit(&backend, &w, &owner, 2, ttl).await;
        let new_w = permit(&backend, &w, &owner, 2, ttl).await;
        let expired_v = permit(&backend, &v, &owner, 2, short).await;
        let lock_v = grant(&backend, &v, &Identity::unique(), ttl).await;
        sleep(Duration::from_millis(1500)).await;
        let batch = [
            permit_x.clone(),
            lock_x.clone(),
            permit_z,
            lock_y,
            old_w,
            new_w,
            expired_v,
            lock_v,
        ];
        let results = backend.refresh_many(&batch).await;
        let shown: Vec<String> = results
            .iter()
            .map(|r| match r {
                Ok(_) => "ok".to_owned(),
                Err(err) => format!("{:?}: {err}", err.kind()),
            })
            .collect();
        let expected = [
            ("ok", ""),
            ("ok", ""),
            ("Lost", "permit was released"),
            ("Lost", "lock was released"),
            ("Lost", "replaced by a newer grant"),
            ("ok", ""),
            ("Lost", "expired"),
            ("ok", ""),
        ];
        for ((got, (kind, why)), lease) in shown.iter().zip(expected).zip(&batch) {
            assert!(
                got.starts_with(kind) && got.contains(why),
                "{lease:?}: {got} (prepared {prepared})"
            );
        }
        for (i, result) in results.iter().enumerate() {
            if let Ok(lease) = result {
                assert_eq!(lease, &batch[i], "result {i} is not its lease");
            }
        }
        let left = |holder: Option<&lockcore::HolderInfo>| holder.and_then(|h| h.expires_in());
        let lock_left = left(backend.inspect(&x).await.expect("inspect").as_ref());
        let permits = backend.inspect_permits(&x).await.expect("inspect");
        let permit_left = left(permits.first());
        for left in [lock_left, permit_left] {
            let left = left.expect("held, with a TTL");
            assert!(
                left > Duration::from_millis(3500),
                "not extended: {left:?} left"
            );
        }
    }
}

/// Rows written by hand into the permits table are typed errors or shown safely, never a
/// panic: a limit that is no limit is `Protocol`, another limit is the limit conflict, a
/// note with control characters is cleaned.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn planted_permit_rows_are_typed_errors() {
    let Some(url) = shared_url() else { return };
    let schema = fresh_schema("semplant");
    let _cleanup = common::drop_schema_later(&url, &schema);
    let backend = backend(&url, &schema).await;
    let admin = admin(&url).await;
    let plant = async |name: &LockName, permits: i32, note: &str| {
        sqlx::query(AssertSqlSafe(format!(
            "INSERT INTO {} (name, owner, permits, acquired_at, expires_at, note) \
             VALUES ($1, 'planted', $2, now(), now() + interval '1 minute', $3)",
            permits_table(&schema)
        )))
        .bind(name.as_str())
        .bind(permits)
        .bind(note)
        .execute(&admin)
        .await
        .expect("plant");
    };
    let negative = fresh_name("negative");
    plant(&negative, -1, "n").await;
    let err = attempt(&backend, &negative, &Identity::unique(), 2, LONG)
        .await
        .expect_err("a limit of -1");
    assert_eq!(err.kind(), ErrorKind::Protocol, "{err}");
    assert!(err.to_string().contains("-1"), "{err}");

    let other = fresh_name("other");
    plant(&other, 5, "bell \u{7} here").await;
    let err = attempt(&backend, &other, &Identity::unique(), 2, LONG)
        .await
        .expect_err("a limit of 5 against 2");
    assert_eq!(err.kind(), ErrorKind::InvalidInput, "{err}");
    assert!(
        err.to_string().contains('5') && err.to_string().contains('2'),
        "{err}"
    );
    let shown = backend.inspect_permits(&other).await.expect("inspect");
    let note = shown[0].note().expect("a note").as_str().to_owned();
    assert!(!note.contains('\u{7}'), "{note:?}");
    assert_eq!(shown[0].owner().as_str(), "planted");
}

/// A fenced transaction of a permit checks the permit's own row: it commits while the
/// permit holds, and is `Lost` for a replaced permit even while the same owner holds the
/// lock of the same name with the same token.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_permit_fences_on_its_own_row() {
    let Some(url) = shared_url() else { return };
    let schema = fresh_schema("semfence");
    let _cleanup = common::drop_schema_later(&url, &schema);
    let backend = backend(&url, &schema).await;
    let name = fresh_name("fence");
    let owner = Identity::unique();
    let lock = grant(&backend, &name, &owner, LONG).await;
    let first = permit(&backend, &name, &owner, 2, LONG).await;
    assert_eq!((token(&lock), token(&first)), (1, 1));
    let tx = backend
        .begin_fenced(&first)
        .await
        .expect("fenced by a live permit");
    assert_eq!(tx.token().get(), 1);
    tx.commit().await.expect("commit");
    let second = permit(&backend, &name, &owner, 2, LONG).await; // the retake
    let err = backend
        .begin_fenced(&first)
        .await
        .expect_err("a replaced permit");
    assert_eq!(err.kind(), ErrorKind::Lost, "{err}");
    let tx = backend.begin_fenced(&second).await.expect("the new grant");
    tx.commit().await.expect("commit");
}

/// Releasing a permit wakes a subscription to its name (on the lock's channel).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_permit_release_wakes_subscribers() {
    let Some(url) = shared_url() else { return };
    let schema = fresh_schema("semwake");
    let _cleanup = common::drop_schema_later(&url, &schema);
    let backend = backend(&url, &schema).await;
    let name = fresh_name("wake");
    let lease = permit(&backend, &name, &Identity::unique(), 2, LONG).await;
    let mut events = backend
        .subscribe(&name)
        .await
        .expect("subscribe")
        .expect("notified");
    timeout(Duration::from_secs(5), events.next())
        .await
        .expect("the listener came up")
        .expect("an event");
    while timeout(Duration::from_millis(300), events.next())
        .await
        .is_ok()
    {}
    let released = Instant::now();
    backend.release(&lease).await.expect("release");
    timeout(Duration::from_secs(5), events.next())
        .await
        .expect("no wake-up for the permit's release")
        .expect("an event");
    println!("permit release notified in {:?}", released.elapsed());
}

/// A role that may use the lock table but not create the permits table next to it (a
/// deployment from before semaphores) still connects and locks; a permit fails with
/// `Config` naming the permits table; once an owner created it and granted it, the same
/// backend grants permits. With schema creation off, the missing table is no error on
/// connect either.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_role_that_cannot_create_the_permits_table_still_locks() {
    let Some(url) = shared_url() else { return };
    let admin = admin(&url).await;
    let schema = fresh_schema("semrole");
    let _cleanup = common::drop_schema_later(&url, &schema);
    let owner_backend = backend(&url, &schema).await;
    let q = format!("\"{schema}\"");
    run(
        &admin,
        format!("DROP TABLE {q}.leases_sem; DROP SEQUENCE {q}.leases_semf"),
    )
    .await;
    let role = format!("anylock_sem_{:08x}", rand::random::<u32>());
    let _drop_role = DropRole {
        url: url.clone(),
        role: role.clone(),
    };
    run(
        &admin,
        format!(
            "CREATE ROLE {role} LOGIN; GRANT USAGE ON SCHEMA {q} TO {role}; \
             GRANT SELECT, INSERT, UPDATE ON {q}.leases TO {role}; \
             GRANT USAGE ON SEQUENCE {q}.leases_fence TO {role}"
        ),
    )
    .await;
    let app = format!("anylock-semrole-{:08x}", rand::random::<u32>());
    let as_role = url.replacen("postgres@", &format!("{role}@"), 1);
    {
        let sep = if as_role.contains('?') { '&' } else { '?' };
        let named = format!("{as_role}{sep}application_name={app}");
        let limited = PostgresBackend::connect(common::config(&named, &schema))
            .await
            .expect("connects although it cannot create the permits table");
        // The refused CREATE's transaction was rolled back before its connection was kept
        // for the next call, not left aborted (the review: `idle in transaction
        // (aborted)` until its next use).
        let states: Vec<String> = sqlx::query_scalar(
            "SELECT coalesce(state, '') FROM pg_stat_activity WHERE application_name = $1",
        )
        .bind(&app)
        .fetch_all(&admin)
        .await
        .expect("activity");
        assert!(!states.is_empty(), "the kept connection is listed");
        assert!(
            states.iter().all(|s| s == "idle"),
            "the kept connection: {states:?}"
        );
        let unprepared = common::config(&as_role, &schema).with_prepared_statements(false);
        PostgresBackend::connect(unprepared)
            .await
            .expect("the same inside BEGIN … COMMIT (the PgBouncer mode)");
        let off = PostgresBackend::connect(common::config(&url, &schema).with_create_schema(false))
            .await
            .expect("schema creation off: the missing permits table is no connect error");
        drop(off);
        let name = fresh_name("role");
        let lease = grant(&limited, &name, &Identity::unique(), LONG).await;
        limited.release(&lease).await.expect("release");
        let err = attempt(&limited, &name, &Identity::unique(), 2, LONG)
            .await
            .expect_err("no permits table");
        assert_eq!(err.kind(), ErrorKind::Config, "{err}");
        assert!(err.to_string().contains("leases_sem"), "{err}");
        assert!(err.to_string().contains("create_schema"), "{err}");
        drop(owner_backend);
        backend(&url, &schema).await; // the owner creates it
        run(
            &admin,
            format!(
                "GRANT SELECT, INSERT, UPDATE, DELETE ON {q}.leases_sem TO {role}; \
                 GRANT USAGE ON SEQUENCE {q}.leases_semf TO {role}"
            ),
        )
        .await;
        let lease = permit(&limited, &name, &Identity::unique(), 2, LONG).await;
        limited.release(&lease).await.expect("release");
    }
}

/// Drops a test's role on the shared server when dropped, also when the test panicked.
struct DropRole {
    url: String,
    role: String,
}

impl Drop for DropRole {
    fn drop(&mut self) {
        let sql = format!("DROP OWNED BY {0}; DROP ROLE {0}", self.role);
        let psql = test_kit::servers::pg_bin().expect("psql").join("psql");
        let dropped = std::process::Command::new(psql)
            .args(["-X", "-q", &self.url, "-c", &sql])
            .output();
        if !dropped.is_ok_and(|o| o.status.success()) {
            eprintln!("could not drop test role {}", self.role);
        }
    }
}

/// A permits sequence an operator made with a cache would hand tokens out of grant order:
/// connect refuses it, naming the fix.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cached_permit_sequence_is_refused() {
    let Some(url) = shared_url() else { return };
    let admin = admin(&url).await;
    let schema = fresh_schema("semcache");
    let _cleanup = common::drop_schema_later(&url, &schema);
    backend(&url, &schema).await;
    run(
        &admin,
        format!("ALTER SEQUENCE \"{schema}\".leases_semf CACHE 20"),
    )
    .await;
    let err = PostgresBackend::connect(common::config(&url, &schema))
        .await
        .expect_err("a cached permits sequence");
    assert_eq!(err.kind(), ErrorKind::Config, "{err}");
    assert!(err.to_string().contains("leases_semf\" CACHE 1"), "{err}");
}

/// Statements per permit operation, counted by the private server's
/// `pg_stat_statements`: an acquire (granted or full) is `BEGIN`, the advisory lock, the
/// deciding statement and `COMMIT`; refresh, inspect and release one statement each.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_permit_operation_runs_its_statements() {
    let _only = common::exclusive().await;
    if shared_url().is_none() {
        return;
    }
    let server = common::private_server().await;
    let schema = fresh_schema("semcount");
    let config = PostgresConfig::from_url(&server.url())
        .expect("valid")
        .with_schema(&schema);
    let backend = PostgresBackend::connect(config).await.expect("connect");
    server.psql(
        "anylock_private",
        "CREATE EXTENSION IF NOT EXISTS pg_stat_statements",
    );
    server.psql("anylock_private", "SELECT pg_stat_statements_reset()");
    const N: i64 = 10;
    for _ in 0..N {
        let name = fresh_name("count");
        let lease = permit(&backend, &name, &Identity::unique(), 1, LONG).await;
        full(&backend, &name, &Identity::unique(), 1).await;
        backend.refresh(&lease).await.expect("refresh");
        assert_eq!(
            backend.inspect_permits(&name).await.expect("inspect").len(),
            1
        );
        backend.release(&lease).await.expect("release");
    }
    let admin = admin(&server.url()).await;
    // The advisory lock's key prefix is a literal, which pg_stat_statements normalizes
    // away; that statement is recognised by its shape.
    let rows = sqlx::query(
        "SELECT query, calls FROM pg_stat_statements \
          WHERE query LIKE $1 OR query IN ('BEGIN', 'COMMIT') \
             OR query LIKE 'SELECT pg_advisory_xact_lock(hashtextextended($_ || $_::text, $_))'",
    )
    .bind(format!("%{schema}%"))
    .fetch_all(&admin)
    .await
    .expect("pg_stat_statements");
    let kinds = [
        "BEGIN",
        "COMMIT",
        "SELECT pg_advisory_xact_lock",
        "WITH seen",
        "WITH batch",
        "SELECT owner",
        "WITH released",
    ];
    let mut calls = [0_i64; 7];
    for row in rows {
        let (query, n): (String, i64) = (row.get("query"), row.get("calls"));
        let kind = kinds
            .iter()
            .position(|p| query.trim_start().starts_with(p))
            .unwrap_or_else(|| panic!("unexpected statement: {query}"));
        calls[kind] += n;
    }
    assert_eq!(calls, [2 * N, 2 * N, 2 * N, 2 * N, N, N, N], "{kinds:?}");
}

/// A permit of `owner` (TTL 1 s) with a fenced transaction open on it that runs
/// `SELECT pg_sleep(sleep)` and commits: the task ends when the transaction has. Returns
/// once the fence check has passed (the row is locked `FOR KEY SHARE`), with the lease
/// and the instant it was granted.
async fn fenced_sleeper(
    backend: &PostgresBackend,
    name: &LockName,
    owner: &Identity,
    n: u32,
    sleep_secs: f64,
) -> (Lease, Instant, tokio::task::JoinHandle<()>) {
    let lease = permit(backend, name, owner, n, Duration::from_secs(1)).await;
    let granted = Instant::now();
    let (locked, is_locked) = tokio::sync::oneshot::channel();
    let task = tokio::spawn({
        let (backend, lease) = (backend.clone(), lease.clone());
        async move {
            let mut tx = backend
                .begin_fenced(&lease)
                .await
                .expect("fenced while live");
            locked.send(()).expect("the test waits");
            sqlx::query("SELECT pg_sleep($1)")
                .bind(sleep_secs)
                .execute(&mut *tx)
                .await
                .expect("the fenced statement");
            tx.commit().await.expect("commit the fenced transaction");
        }
    });
    is_locked.await.expect("the fence check passed");
    (lease, granted, task)
}

/// The owners of `name`'s rows in the permits table, live or not, sorted.
async fn rows_of(admin: &PgPool, schema: &str, name: &LockName) -> Vec<String> {
    let mut owners: Vec<String> = sqlx::query_scalar(AssertSqlSafe(format!(
        "SELECT owner FROM {} WHERE name = $1",
        permits_table(schema)
    )))
    .bind(name.as_str())
    .fetch_all(admin)
    .await
    .expect("rows");
    owners.sort();
    owners
}

/// `ids` as the sorted owners [`rows_of`] returns.
fn owners(ids: &[&Identity]) -> Vec<String> {
    let mut owners: Vec<String> = ids.iter().map(|id| id.as_str().to_owned()).collect();
    owners.sort();
    owners
}

/// Far below the fenced statement's 6 s, far above a grant's few milliseconds.
const PROMPT: Duration = Duration::from_secs(2);

/// The review's stall (N = 3): D holds a live permit; A's permit (TTL 1 s) has expired
/// while A's fenced transaction still runs a 6 s statement. B's acquire, with room,
/// answers at once; D's refresh, sent while B's acquire runs, too (before the fix B
/// waited for the fenced transaction to delete A's row, ~4.5 s, holding the advisory lock
/// and `FOR SHARE` on D's row, and D's refresh waited behind it). A's place stays held
/// while the transaction runs: C finds the semaphore full, A named as the first to end,
/// and A's row is still there; once the transaction ends, C gets A's place.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_expired_permit_in_a_fenced_transaction_stalls_no_acquire() {
    let Some(url) = shared_url() else { return };
    let schema = fresh_schema("semstall");
    let _cleanup = common::drop_schema_later(&url, &schema);
    let backend = backend(&url, &schema).await;
    let admin = admin(&url).await;
    let name = fresh_name("stall");
    let (a, b, c, d) = (
        Identity::unique(),
        Identity::unique(),
        Identity::unique(),
        Identity::unique(),
    );
    let live = permit(&backend, &name, &d, 3, Duration::from_secs(30)).await;
    let (_, granted, fenced) = fenced_sleeper(&backend, &name, &a, 3, 6.0).await;
    sleep((granted + Duration::from_millis(1300)).saturating_duration_since(Instant::now())).await;

    let b_attempt = tokio::spawn({
        let (backend, name, b) = (backend.clone(), name.clone(), b.clone());
        async move {
            let started = Instant::now();
            let outcome = attempt(&backend, &name, &b, 3, LONG).await;
            (outcome, started.elapsed())
        }
    });
    sleep(Duration::from_millis(300)).await; // B's acquire is in flight (or done)
    let started = Instant::now();
    let refreshed = backend.refresh(&live).await;
    let refresh_took = started.elapsed();
    let (outcome, b_took) = b_attempt.await.expect("join");
    println!("with room: B answered in {b_took:?}, D's refresh in {refresh_took:?}");
    assert!(
        matches!(outcome, Ok(Acquire::Acquired(_))),
        "B, with room: {outcome:?}"
    );
    assert!(b_took < PROMPT, "B's acquire with room waited {b_took:?}");
    refreshed.expect("D's live permit refreshes");
    assert!(
        refresh_took < PROMPT,
        "D's refresh waited {refresh_took:?} behind an acquire"
    );

    let started = Instant::now();
    let first = full(&backend, &name, &c, 3).await;
    let c_took = started.elapsed();
    println!("full: C answered Held in {c_took:?}");
    assert!(c_took < PROMPT, "C's refused acquire took {c_took:?}");
    assert_eq!(
        first.owner(),
        &a,
        "the place of the expired permit whose fenced transaction runs"
    );
    let expected = owners(&[&a, &b, &d]);
    assert_eq!(rows_of(&admin, &schema, &name).await, expected);

    // For 1.5 s, C's refused attempts back to back and D's refreshes back to back.
    let until = Instant::now() + Duration::from_millis(1500);
    let contender = tokio::spawn({
        let (backend, name, c) = (backend.clone(), name.clone(), c.clone());
        async move {
            let (mut slowest, mut attempts) = (Duration::ZERO, 0);
            while Instant::now() < until {
                let started = Instant::now();
                full(&backend, &name, &c, 3).await;
                slowest = slowest.max(started.elapsed());
                attempts += 1;
            }
            (slowest, attempts)
        }
    });
    let (mut slowest, mut refreshes) = (Duration::ZERO, 0);
    while Instant::now() < until {
        let started = Instant::now();
        backend.refresh(&live).await.expect("D's refresh");
        slowest = slowest.max(started.elapsed());
        refreshes += 1;
    }
    let (slowest_attempt, attempts) = contender.await.expect("join");
    println!(
        "side by side: {attempts} refused attempts (slowest {slowest_attempt:?}), \
         {refreshes} refreshes of D (slowest {slowest:?})"
    );
    assert!(
        slowest_attempt < PROMPT,
        "a refused attempt took {slowest_attempt:?}"
    );
    assert!(slowest < PROMPT, "D's refresh took {slowest:?}");
    assert!(
        !fenced.is_finished(),
        "the fenced transaction ended before the checks: make its sleep longer"
    );

    timeout(Duration::from_secs(15), fenced)
        .await
        .expect("the fenced transaction ends")
        .expect("join");
    permit(&backend, &name, &c, 3, LONG).await;
    let expected = owners(&[&b, &c, &d]);
    assert_eq!(
        rows_of(&admin, &schema, &name).await,
        expected,
        "A's row outlived the grant of its place"
    );
}

/// N = 1: an expired permit whose fenced transaction still runs keeps its place. B gets
/// `Held` (naming A) at once and writes nothing (A's row stays, no token is drawn); A's
/// own retake is a temporary error at once instead of waiting; once the transaction
/// ends, B gets the place and A's row is deleted.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_expired_permit_keeps_its_place_while_its_fenced_transaction_runs() {
    let Some(url) = shared_url() else { return };
    let schema = fresh_schema("semkeep");
    let _cleanup = common::drop_schema_later(&url, &schema);
    let backend = backend(&url, &schema).await;
    let admin = admin(&url).await;
    let name = fresh_name("keep");
    let (a, b) = (Identity::unique(), Identity::unique());
    let (held, granted, fenced) = fenced_sleeper(&backend, &name, &a, 1, 4.0).await;
    sleep((granted + Duration::from_millis(1300)).saturating_duration_since(Instant::now())).await;

    let started = Instant::now();
    let first = full(&backend, &name, &b, 1).await;
    let took = started.elapsed();
    println!("N = 1: B answered Held in {took:?}");
    assert!(took < PROMPT, "B's refused acquire waited {took:?}");
    assert_eq!(first.owner(), &a);
    assert_eq!(first.token(), held.token());
    assert_eq!(rows_of(&admin, &schema, &name).await, owners(&[&a]));

    let started = Instant::now();
    let retake = attempt(&backend, &name, &a, 1, LONG).await;
    let took = started.elapsed();
    println!("N = 1: A's retake answered in {took:?}: {retake:?}");
    let err = retake.expect_err("a retake over an open fenced transaction");
    assert_eq!(err.kind(), ErrorKind::Unavailable, "{err}");
    assert!(err.is_temporary(), "{err}");
    assert!(err.to_string().contains("fenced transaction"), "{err}");
    assert!(took < PROMPT, "A's retake waited {took:?}");
    assert_eq!(rows_of(&admin, &schema, &name).await, owners(&[&a]));

    timeout(Duration::from_secs(15), fenced)
        .await
        .expect("the fenced transaction ends")
        .expect("join");
    let next = permit(&backend, &name, &b, 1, LONG).await;
    assert_eq!(
        token(&next),
        token(&held) + 1,
        "a refused attempt drew a token"
    );
    assert_eq!(rows_of(&admin, &schema, &name).await, owners(&[&b]));
}

/// A refused attempt writes nothing: neither a full semaphore nor a limit conflict
/// deletes another owner's expired row (before the fix both did).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_permit_attempt_deletes_nothing() {
    let Some(url) = shared_url() else { return };
    let schema = fresh_schema("semrefuse");
    let _cleanup = common::drop_schema_later(&url, &schema);
    let backend = backend(&url, &schema).await;
    let admin = admin(&url).await;
    let name = fresh_name("refuse");
    let (a, b, x) = (Identity::unique(), Identity::unique(), Identity::unique());
    permit(&backend, &name, &a, 2, Duration::from_secs(1)).await;
    let live = permit(&backend, &name, &x, 2, LONG).await;
    sleep(Duration::from_millis(1300)).await; // A's permit has expired
    let both = owners(&[&a, &x]);

    let err = attempt(&backend, &name, &b, 3, LONG)
        .await
        .expect_err("a limit of 3 against 2");
    assert_eq!(err.kind(), ErrorKind::InvalidInput, "{err}");
    assert_eq!(
        rows_of(&admin, &schema, &name).await,
        both,
        "a conflicting attempt deleted"
    );
    // An operator plants a second live permit (a grant would have deleted A's row): full.
    let y = Identity::unique();
    sqlx::query(AssertSqlSafe(format!(
        "INSERT INTO {} (name, owner, permits, acquired_at, expires_at) \
         VALUES ($1, $2, 2, now(), now() + interval '1 minute')",
        permits_table(&schema)
    )))
    .bind(name.as_str())
    .bind(y.as_str())
    .execute(&admin)
    .await
    .expect("plant");
    assert_eq!(full(&backend, &name, &b, 2).await.owner(), &x);
    let three = owners(&[&a, &x, &y]);
    assert_eq!(
        rows_of(&admin, &schema, &name).await,
        three,
        "a refused attempt deleted"
    );
    backend.release(&live).await.expect("release X");
    permit(&backend, &name, &b, 2, LONG).await;
    let after = owners(&[&b, &y]);
    assert_eq!(
        rows_of(&admin, &schema, &name).await,
        after,
        "a grant kept A's expired row"
    );
}
