//! PostgreSQL-specific behaviour on the shared server from `scripts/servers`: expiry on
//! the database clock, safe identifiers and lock names, concurrent schema creation,
//! privilege errors and password redaction.

mod common;

use std::time::Duration;

use backend_postgres::{PostgresBackend, PostgresConfig};
use common::{admin, attempt, backend, fresh_name, fresh_schema, grant, shared_url, table};
use lockcore::{Acquire, ErrorKind, Identity, LockBackend, LockName, RetryStatus};
use sqlx::{AssertSqlSafe, Row};

const LONG: Duration = Duration::from_secs(60);

/// The lease row's times come from the database: `expires_at - acquired_at` is exactly the
/// TTL, and `acquired_at` lies between two readings of the database clock taken around the
/// call. The client never sends a timestamp.
#[tokio::test]
async fn expiry_is_database_now_plus_ttl() {
    let Some(url) = shared_url() else { return };
    let schema = fresh_schema("clock");
    let _cleanup = common::drop_schema_later(&url, &schema);
    let backend = backend(&url, &schema).await;
    let admin = admin(&url).await;
    let name = fresh_name("clock");
    let ttl = Duration::from_micros(2_345_678);
    let db_now = async || -> f64 {
        sqlx::query("SELECT extract(epoch FROM clock_timestamp())::float8 AS t")
            .fetch_one(&admin)
            .await
            .expect("clock")
            .get("t")
    };
    let before = db_now().await;
    grant(&backend, &name, &Identity::unique(), ttl).await;
    let after = db_now().await;
    let row = sqlx::query(AssertSqlSafe(format!(
        "SELECT extract(epoch FROM acquired_at)::float8 AS at, \
                extract(epoch FROM expires_at - acquired_at)::float8 AS span \
           FROM {} WHERE name = $1",
        table(&schema)
    )))
    .bind(name.as_str())
    .fetch_one(&admin)
    .await
    .expect("row");
    let (at, span): (f64, f64) = (row.get("at"), row.get("span"));
    // The TTL the backend receives is rounded up to a whole millisecond (`lockcore::Ttl`).
    let stored = lockcore::Ttl::new(ttl).expect("valid TTL").get();
    assert!((span - stored.as_secs_f64()).abs() < 1e-6, "span {span}");
    assert!(before <= at && at <= after, "{before} <= {at} <= {after}");
}

/// Moves `name`'s stored expiry to the database's `now()` plus `offset`.
async fn set_expiry(admin: &sqlx::PgPool, schema: &str, name: &LockName, offset: &str) {
    sqlx::query(AssertSqlSafe(format!(
        "UPDATE {} SET expires_at = now() + $2::interval WHERE name = $1",
        table(schema)
    )))
    .bind(name.as_str())
    .bind(offset)
    .execute(admin)
    .await
    .expect("move expiry");
}

/// Expiry is decided by comparing the stored expiry with the database clock: a lease the
/// database says has expired is free at once although the client's 60 s TTL is far from
/// over, and it cannot be refreshed back to life even when nobody took it over.
#[tokio::test]
async fn a_lease_the_database_says_expired_is_free_and_lost() {
    let Some(url) = shared_url() else { return };
    let schema = fresh_schema("expired");
    let _cleanup = common::drop_schema_later(&url, &schema);
    let backend = backend(&url, &schema).await;
    let admin = admin(&url).await;
    let early = fresh_name("early");
    let first = grant(&backend, &early, &Identity::unique(), LONG).await;
    set_expiry(&admin, &schema, &early, "-1 millisecond").await;
    let second = grant(&backend, &early, &Identity::unique(), LONG).await;
    assert!(second.token() > first.token());
    let err = backend.refresh(&first).await.expect_err("taken over");
    assert_eq!(err.kind(), ErrorKind::Lost);

    let lapsed = fresh_name("lapsed");
    let alone = grant(&backend, &lapsed, &Identity::unique(), LONG).await;
    set_expiry(&admin, &schema, &lapsed, "-1 millisecond").await;
    let err = backend
        .refresh(&alone)
        .await
        .expect_err("an expired lease was refreshed");
    assert_eq!(err.kind(), ErrorKind::Lost, "{err}");
    assert!(err.message().contains("expired"), "{err}");
    assert!(backend.inspect(&lapsed).await.expect("inspect").is_none());
}

/// A lease the database says is live stays held after the client's 300 ms TTL passed.
#[tokio::test]
async fn a_lease_the_database_says_is_live_stays_held() {
    let Some(url) = shared_url() else { return };
    let schema = fresh_schema("live");
    let _cleanup = common::drop_schema_later(&url, &schema);
    let backend = backend(&url, &schema).await;
    let admin = admin(&url).await;
    let late = fresh_name("late");
    let holder = Identity::unique();
    grant(&backend, &late, &holder, Duration::from_millis(300)).await;
    set_expiry(&admin, &schema, &late, "1 hour").await;
    tokio::time::sleep(Duration::from_millis(600)).await;
    match attempt(&backend, &late, &Identity::unique(), LONG).await {
        Acquire::Held(h) => assert_eq!(h.owner(), &holder),
        Acquire::Acquired(_) => panic!("the client's TTL, not the database's expiry, decided"),
    }
}

/// Schema and table names with quotes, spaces, semicolons and non-ASCII letters are
/// created exactly as given and used safely; bad names fail with InvalidInput before any
/// connection is made (the URL points at a closed port).
#[tokio::test]
async fn odd_identifiers_are_quoted_and_bad_ones_rejected() {
    let Some(url) = shared_url() else { return };
    let schema = format!("{} \"q\"; DROP SCHEMA public; --", fresh_schema("Odd"));
    let _cleanup = common::drop_schema_later(&url, &schema);
    let table_name = "Lé\"ases; --";
    let config = PostgresConfig::from_url(&url)
        .expect("url")
        .with_schema(&schema)
        .with_table(table_name);
    let backend = PostgresBackend::connect(config)
        .await
        .expect("odd names work");
    let lease = grant(&backend, &fresh_name("odd"), &Identity::unique(), LONG).await;
    backend.release(&lease).await.expect("release");
    let admin = admin(&url).await;
    let found: i64 =
        sqlx::query("SELECT count(*) AS n FROM pg_tables WHERE schemaname = $1 AND tablename = $2")
            .bind(&schema)
            .bind(table_name)
            .fetch_one(&admin)
            .await
            .expect("catalog")
            .get("n");
    assert_eq!(found, 1, "the table was not created under its exact name");

    let closed = "postgres://postgres@127.0.0.1:1/nowhere";
    let base = PostgresConfig::from_url(closed).expect("url");
    for bad in [
        base.clone().with_schema(""),
        base.clone().with_schema("pg_toast"),
        base.clone().with_table("nul\0byte"),
        base.clone().with_table("t".repeat(60)),
    ] {
        let err = PostgresBackend::connect(bad).await.expect_err("bad name");
        assert_eq!(err.kind(), ErrorKind::InvalidInput, "{err}");
    }
}

/// Lock names that look like SQL are bound parameters: stored verbatim, exclusive, and
/// harmless to the table.
#[tokio::test]
async fn injection_looking_lock_names_are_stored_verbatim() {
    let Some(url) = shared_url() else { return };
    let schema = fresh_schema("inject");
    let _cleanup = common::drop_schema_later(&url, &schema);
    let backend = backend(&url, &schema).await;
    let admin = admin(&url).await;
    let names = [
        "x'; DROP TABLE leases; --",
        "\"; SELECT pg_sleep(30); --",
        "$1 $2 %s \\' \\\\",
        "名前 ü ✓",
        "a' OR '1'='1",
    ];
    for raw in names {
        let name = LockName::new(raw).expect("valid lock name");
        let owner = Identity::unique();
        let lease = grant(&backend, &name, &owner, LONG).await;
        let rival = attempt(&backend, &name, &Identity::unique(), LONG).await;
        assert!(matches!(rival, Acquire::Held(_)), "{raw:?} not exclusive");
        let stored: String = sqlx::query(AssertSqlSafe(format!(
            "SELECT name FROM {} WHERE name = $1 AND owner = $2",
            table(&schema)
        )))
        .bind(raw)
        .bind(owner.as_str())
        .fetch_one(&admin)
        .await
        .expect("stored verbatim")
        .get("name");
        assert_eq!(stored, raw);
        backend.release(&lease).await.expect("release");
    }
    let rows: i64 = sqlx::query(AssertSqlSafe(format!(
        "SELECT count(*) AS n FROM {}",
        table(&schema)
    )))
    .fetch_one(&admin)
    .await
    .expect("table intact")
    .get("n");
    assert_eq!(rows, names.len() as i64);
}

/// Eight backends created at the same moment on a fresh schema all succeed (creators
/// queue on an advisory lock instead of failing on duplicate catalog rows), and they share
/// one table and one token sequence.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_schema_creation_succeeds() {
    let Some(url) = shared_url() else { return };
    let schema = fresh_schema("race");
    let _cleanup = common::drop_schema_later(&url, &schema);
    let connects = (0..8).map(|_| {
        let config = common::config(&url, &schema);
        tokio::spawn(PostgresBackend::connect(config))
    });
    let mut backends = Vec::new();
    for connect in connects {
        backends.push(connect.await.expect("join").expect("concurrent creation"));
    }
    let name = fresh_name("race");
    let mut tokens = Vec::new();
    for backend in &backends {
        let lease = grant(backend, &name, &Identity::unique(), LONG).await;
        tokens.push(lease.token().expect("token"));
        backend.release(&lease).await.expect("release");
    }
    assert!(tokens.windows(2).all(|w| w[0] < w[1]), "{tokens:?}");
}

/// A role without privileges gets PermissionDenied (permanent) at each level: creating
/// the schema (no CREATE on the database), finding the table (no USAGE on the schema) and
/// the lock statements themselves (USAGE but no rights on the table).
#[tokio::test]
async fn missing_privileges_are_permission_denied() {
    let Some(url) = shared_url() else { return };
    let admin = admin(&url).await;
    let role = format!("anylock_noprivs_{:08x}", rand::random::<u32>());
    let run = async |sql: String| {
        sqlx::query(AssertSqlSafe(sql))
            .execute(&admin)
            .await
            .expect("admin")
    };
    run(format!("CREATE ROLE {role} LOGIN")).await;
    let schema = fresh_schema("privs");
    let _cleanup = common::drop_schema_later(&url, &schema);
    backend(&url, &schema).await; // created by the superuser
    let as_role = url.replacen("postgres@", &format!("{role}@"), 1);
    let connect =
        async |schema: &str| PostgresBackend::connect(common::config(&as_role, schema)).await;
    let denied = fresh_schema("np");
    let _cleanup_denied = common::drop_schema_later(&url, &denied);
    let create = connect(&denied).await.map(drop);
    let no_usage = connect(&schema).await.map(drop);
    run(format!("GRANT USAGE ON SCHEMA \"{schema}\" TO {role}")).await;
    let request = lockcore::AcquireRequest::new(
        fresh_name("np"),
        Identity::unique(),
        lockcore::Ttl::new(LONG).expect("valid TTL"),
    );
    let (statement, through_locker) = match connect(&schema).await {
        Ok(backend) => {
            let direct = backend.acquire(&request).await.map(drop);
            let locker = lockcore::Locker::new(std::sync::Arc::new(backend));
            let name = request.name.as_str();
            (direct, locker.try_acquire(name).await.map(drop))
        }
        Err(err) => panic!("USAGE granted and the table exists, yet: {err}"),
    };
    run(format!("DROP OWNED BY {role}")).await;
    run(format!("DROP ROLE {role}")).await;
    for (what, outcome) in [
        ("create", create),
        ("usage", no_usage),
        ("table", statement),
    ] {
        let err = outcome.expect_err(what);
        assert_eq!(err.kind(), ErrorKind::PermissionDenied, "{what}: {err}");
        assert_eq!(err.status(), RetryStatus::Permanent, "{what}");
    }
    // The backend leaves out the context; the Locker names the backend and the lock.
    let err = through_locker.expect_err("through a Locker");
    assert_eq!(err.kind(), ErrorKind::PermissionDenied, "{err}");
    assert_eq!(err.backend(), Some("postgres"), "{err}");
    assert_eq!(err.lock(), Some(&request.name), "{err}");
}

/// Connection errors are temporary, a missing database is a config error, and neither
/// the backend's Debug/Display nor any error shows the password.
#[tokio::test]
async fn unreachable_and_misconfigured_servers_map_cleanly_without_secrets() {
    let Some(url) = shared_url() else { return };
    let secret = "S3cret-Pa55";
    let refused = format!("postgres://postgres:{secret}@127.0.0.1:1/db?timeout_ms=2000");
    let err = PostgresBackend::from_url(&refused)
        .await
        .expect_err("refused");
    assert_eq!(err.kind(), ErrorKind::Unavailable, "{err}");
    assert!(err.is_temporary());
    let shown = format!("{err} {err:?}");
    assert!(!shown.contains(secret), "{shown}");

    let no_db = url.replace("/anylock_test", "/anylock_no_such_db");
    let err = PostgresBackend::from_url(&no_db)
        .await
        .expect_err("no database");
    assert_eq!(err.kind(), ErrorKind::Config, "{err}");

    // A password goes to a server without TLS only when the URL says so knowingly, as the
    // harness's URL does (`sslmode=disable`).
    assert!(url.contains("sslmode=disable"), "{url}");
    let with_password = url.replacen("postgres@", &format!("postgres:{secret}@"), 1);
    let schema = fresh_schema("redact");
    let _cleanup = common::drop_schema_later(&url, &schema);
    let config = common::config(&with_password, &schema);
    let backend = PostgresBackend::connect(config).await.expect("trust auth");
    for shown in [format!("{backend:?}"), format!("{}", backend.config())] {
        assert!(!shown.contains(secret), "{shown}");
        assert!(shown.contains("***"), "{shown}");
    }
}

/// Releasing keeps the row (and its token) and clears the owner, so a later grant's token
/// continues from it; an operator's DELETE does not reset tokens either (they come from a
/// sequence).
#[tokio::test]
async fn tokens_survive_release_and_row_deletion() {
    let Some(url) = shared_url() else { return };
    let schema = fresh_schema("tokens");
    let _cleanup = common::drop_schema_later(&url, &schema);
    let backend = backend(&url, &schema).await;
    let admin = admin(&url).await;
    let name = fresh_name("tokens");
    let first = grant(&backend, &name, &Identity::unique(), LONG).await;
    backend.release(&first).await.expect("release");
    let kept: (Option<String>, i64) = {
        let row = sqlx::query(AssertSqlSafe(format!(
            "SELECT owner, token FROM {} WHERE name = $1",
            table(&schema)
        )))
        .bind(name.as_str())
        .fetch_one(&admin)
        .await
        .expect("row kept after release");
        (row.get("owner"), row.get("token"))
    };
    assert_eq!(kept.0, None);
    assert_eq!(kept.1 as u64, first.token().expect("token").get());
    let second = grant(&backend, &name, &Identity::unique(), LONG).await;
    common::admin_delete(&admin, &table(&schema), &name).await;
    let third = grant(&backend, &name, &Identity::unique(), LONG).await;
    assert!(first.token() < second.token() && second.token() < third.token());
    let err = backend.refresh(&second).await.expect_err("superseded");
    assert_eq!(err.kind(), ErrorKind::Lost);
}

/// An operator's break removes whoever holds the lock and reports them: the holder's
/// refresh is Lost, a waiter is woken at once, the next token is still higher, and
/// breaking a free, expired or unknown lock reports nobody.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn break_lock_removes_the_holder_and_wakes_waiters() {
    let Some(url) = shared_url() else { return };
    let schema = fresh_schema("break");
    let _cleanup = common::drop_schema_later(&url, &schema);
    let backend = backend(&url, &schema).await;
    let name = fresh_name("break");
    let owner = Identity::unique();
    let lease = grant(&backend, &name, &owner, LONG).await;
    let mut events = backend.subscribe(&name).await.expect("sub").expect("on");
    next_event(&mut events).await.expect("listener up");
    let removed = backend.break_lock(&name).await.expect("break");
    let removed = removed.expect("was held");
    assert_eq!((removed.owner(), removed.token()), (&owner, lease.token()));
    next_event(&mut events)
        .await
        .expect("the break woke nobody");
    let err = backend.refresh(&lease).await.expect_err("broken");
    assert_eq!(err.kind(), ErrorKind::Lost);
    assert!(backend.inspect(&name).await.expect("inspect").is_none());
    let short = Duration::from_millis(200);
    let next = grant(&backend, &name, &Identity::unique(), short).await;
    assert!(next.token() > lease.token());
    tokio::time::sleep(short * 2).await;
    for gone in [name, fresh_name("never")] {
        let removed = backend.break_lock(&gone).await.expect("break");
        assert!(removed.is_none(), "{gone}: {removed:?}");
    }
}

/// The next item of `events` within 5 s.
async fn next_event(events: &mut lockcore::ReleaseEvents) -> Option<()> {
    let next = futures_util::StreamExt::next(events);
    tokio::time::timeout(Duration::from_secs(5), next)
        .await
        .ok()
        .flatten()
}
