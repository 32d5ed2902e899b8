//! Issue #14 (Low): a statement must not run on after the client gave up on it, and the
//! fence sequence must hand out values in order across sessions.

mod common;

use std::time::Duration;

use backend_postgres::PostgresBackend;
use common::{admin, fresh_name, fresh_schema, grant, shared_url, table};
use lockcore::{AcquireRequest, ErrorKind, Identity, LockBackend};
use sqlx::{AssertSqlSafe, Connection, Row};
use tokio::time::{Instant, sleep};

/// How many of `app`'s sessions are running a statement.
async fn active_statements(admin: &sqlx::PgPool, app: &str) -> i64 {
    sqlx::query(
        "SELECT count(*) AS n FROM pg_stat_activity \
          WHERE application_name = $1 AND state = 'active'",
    )
    .bind(app)
    .fetch_one(admin)
    .await
    .expect("pg_stat_activity")
    .get("n")
}

/// An acquire blocked on a row lock (an operator's open `FOR UPDATE`) times out on the
/// client after 1 s; the server must cancel the statement too, instead of leaving it
/// waiting to take the lock for a client that is gone.
async fn blocked_statement_is_cancelled(prepared: bool) {
    let Some(url) = shared_url() else { return };
    let schema = fresh_schema("stmt_timeout");
    let _cleanup = common::drop_schema_later(&url, &schema);
    let app = format!("anylock-timeout-{:08x}", rand::random::<u32>());
    let config = common::config(&format!("{url}&application_name={app}"), &schema)
        .with_timeout(Duration::from_secs(1))
        .with_prepared_statements(prepared);
    let backend = PostgresBackend::connect(config).await.expect("connect");
    let name = fresh_name("blocked");
    let ttl = Duration::from_millis(200);
    let lease = grant(&backend, &name, &Identity::unique(), ttl).await;
    sleep(ttl * 2).await;
    let mut operator = sqlx::PgConnection::connect(&url).await.expect("operator");
    let mut tx = operator.begin().await.expect("begin");
    let lock = format!(
        "SELECT 1 FROM {} WHERE name = $1 FOR UPDATE",
        table(&schema)
    );
    sqlx::query(AssertSqlSafe(lock))
        .bind(name.as_str())
        .execute(&mut *tx)
        .await
        .expect("lock the row");
    let request = AcquireRequest::new(
        name.clone(),
        Identity::unique(),
        lockcore::Ttl::new(ttl).expect("valid TTL"),
    );
    let err = backend
        .acquire(&request)
        .await
        .expect_err("blocked on the row lock");
    assert!(
        matches!(
            err.kind(),
            ErrorKind::OutcomeUnknown | ErrorKind::Unavailable
        ),
        "{err}"
    );
    let admin = admin(&url).await;
    let deadline = Instant::now() + Duration::from_secs(3);
    let mut left = active_statements(&admin, &app).await;
    while left > 0 && Instant::now() < deadline {
        sleep(Duration::from_millis(50)).await;
        left = active_statements(&admin, &app).await;
    }
    tx.rollback().await.expect("rollback");
    assert_eq!(
        left, 0,
        "the statement still runs 3 s after the client gave up"
    );
    drop(lease);
}

#[tokio::test]
async fn a_statement_blocked_after_the_client_timed_out_is_cancelled_by_the_server() {
    blocked_statement_is_cancelled(true).await;
}

/// The same without prepared statements (the PgBouncer mode: `SET LOCAL` in the
/// transaction instead of a session setting).
#[tokio::test]
async fn a_blocked_unprepared_statement_is_cancelled_by_the_server() {
    blocked_statement_is_cancelled(false).await;
}

/// A cached sequence (`CACHE > 1`) hands each session its own block of values, so tokens
/// drawn by two sessions come out of order: refuse it at connect, naming the fix.
#[tokio::test]
async fn a_fence_sequence_with_a_cache_is_refused() {
    let Some(url) = shared_url() else { return };
    let schema = fresh_schema("seq_cache");
    let _cleanup = common::drop_schema_later(&url, &schema);
    drop(common::backend(&url, &schema).await);
    let sequence = format!("\"{schema}\".\"leases_fence\"");
    let admin = admin(&url).await;
    sqlx::query(AssertSqlSafe(format!("ALTER SEQUENCE {sequence} CACHE 20")))
        .execute(&admin)
        .await
        .expect("alter sequence");
    let err = PostgresBackend::connect(common::config(&url, &schema))
        .await
        .expect_err("a cached fence sequence was accepted");
    assert_eq!(err.kind(), ErrorKind::Config, "{err}");
    let message = err.to_string();
    assert!(message.contains("leases_fence"), "{message}");
    assert!(message.contains("CACHE 1"), "{message}");
    sqlx::query(AssertSqlSafe(format!("ALTER SEQUENCE {sequence} CACHE 1")))
        .execute(&admin)
        .await
        .expect("alter sequence back");
    let backend = PostgresBackend::connect(common::config(&url, &schema)).await;
    let backend = backend.expect("CACHE 1 is accepted");
    grant(
        &backend,
        &fresh_name("after"),
        &Identity::unique(),
        Duration::from_secs(5),
    )
    .await;
}
