//! The time left a refused attempt reports, when the statement that refused it straddles
//! the holder's expiry or loses a race to a row that appears while it runs.
//!
//! lockcore reads a holder's time left of zero as "expired, not yet removed" and then
//! sleeps its backoff instead of waking at the expiry (`HolderInfo::with_expires_in`). A
//! lease the statement judged live (by `now()`, its start) must therefore report at least
//! one microsecond even when `clock_timestamp()` has passed its end by the time the row is
//! read; and a lost race that then finds no holder reports a holder that ends at once.
//! Both are made deterministic here by holding a lock the attempt waits behind.

mod common;

use std::time::Duration;

use backend_postgres::PostgresBackend;
use common::{admin, attempt, backend, fresh_name, fresh_schema, grant, shared_url, table};
use lockcore::{Acquire, HolderInfo, Identity, LockName};
use sqlx::{AssertSqlSafe, PgPool, Row};

const LONG: Duration = Duration::from_secs(60);

/// Waits until some session runs a statement on `table` and waits for a heavyweight lock
/// (the attempt blocked behind the test's transaction); returns that statement's
/// transaction start (its `now()`) as microseconds since the epoch.
async fn wait_until_blocked(watcher: &PgPool, table: &str) -> i64 {
    for _ in 0..500 {
        let row = sqlx::query(
            "SELECT (extract(epoch FROM xact_start) * 1000000)::int8 AS started \
               FROM pg_stat_activity \
              WHERE wait_event_type = 'Lock' AND strpos(query, $1) > 0",
        )
        .bind(table)
        .fetch_optional(watcher)
        .await
        .expect("read pg_stat_activity");
        if let Some(row) = row {
            return row.get("started");
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("the attempt never waited for the test's lock on {table}");
}

/// Spawns one attempt by a new owner on `name`.
fn spawn_attempt(backend: &PostgresBackend, name: &LockName) -> tokio::task::JoinHandle<Acquire> {
    let (backend, name) = (backend.clone(), name.clone());
    tokio::spawn(async move { attempt(&backend, &name, &Identity::unique(), LONG).await })
}

fn refused(outcome: Acquire) -> HolderInfo {
    match outcome {
        Acquire::Held(holder) => holder,
        Acquire::Acquired(lease) => panic!("expected a refusal, got {lease:?}"),
    }
}

/// A backend on a fresh schema (dropped afterwards), the test's own pool, the lock table
/// and a fresh lock name.
struct Scene {
    _cleanup: common::DropSchema,
    backend: PostgresBackend,
    admin: PgPool,
    table: String,
    name: LockName,
}

impl Scene {
    /// `None` where no shared server is configured (a failure when one is required).
    async fn new(tag: &str) -> Option<Self> {
        let url = shared_url()?;
        let schema = fresh_schema(tag);
        Some(Self {
            _cleanup: common::drop_schema_later(&url, &schema),
            backend: backend(&url, &schema).await,
            admin: admin(&url).await,
            table: table(&schema),
            name: fresh_name(tag),
        })
    }

    /// Waits for the spawned attempt's refusal, asserts its holder ends at once (above
    /// zero, at most 1 ms: `why`), and that the lock is indeed free: the next attempt wins.
    async fn assert_refused_by_a_holder_ending_at_once(
        &self,
        outcome: tokio::task::JoinHandle<Acquire>,
        why: &str,
    ) -> HolderInfo {
        let seen = refused(outcome.await.expect("attempt task"));
        let left = seen.expires_in().expect("a time left");
        assert!(
            left > Duration::ZERO && left <= Duration::from_millis(1),
            "{why}, not {left:?} (holder {})",
            seen.owner()
        );
        grant(&self.backend, &self.name, &Identity::unique(), LONG).await;
        seen
    }
}

/// The holder's lease is live when the refusing statement starts and over when it reads
/// the row: the statement waits (behind the test's `LOCK TABLE`) across the expiry. It
/// must report a time left above zero, so that a waiter wakes at once; before the fix it
/// reported zero, and a waiter slept its whole backoff (lockcore's side of this:
/// `tests/poll.rs`, `a_holder_ending_before_the_reply_arrives_is_tried_again_at_once`).
///
/// The attempt runs on the connection the grant just used (the backend keeps it and lends
/// it again), where the acquire statement is already prepared: so the wait is inside the
/// statement's own transaction. On a fresh connection the `Parse` would wait in a
/// transaction of its own and the statement would start after the expiry and win.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lease_that_ends_while_the_refusing_statement_runs_reports_time_left() {
    let Some(scene) = Scene::new("ends-mid-statement").await else {
        return;
    };
    let Scene {
        backend,
        admin,
        table,
        name,
        ..
    } = &scene;
    let holder = Identity::unique();
    // Long enough for the set-up below on a loaded machine (the premise is checked).
    grant(backend, name, &holder, Duration::from_secs(4)).await;

    let mut blocker = admin.begin().await.expect("begin");
    sqlx::query(AssertSqlSafe(format!(
        "LOCK TABLE {table} IN ACCESS EXCLUSIVE MODE"
    )))
    .execute(&mut *blocker)
    .await
    .expect("lock the table");
    let expires_at: i64 = sqlx::query(AssertSqlSafe(format!(
        "SELECT (extract(epoch FROM expires_at) * 1000000)::int8 AS e FROM {table} \
          WHERE name = $1"
    )))
    .bind(name.as_str())
    .fetch_one(&mut *blocker)
    .await
    .expect("read the expiry")
    .get("e");
    let outcome = spawn_attempt(backend, name);
    let started = wait_until_blocked(admin, table).await;
    assert!(
        started < expires_at,
        "the test's premise: the attempt's statement started ({started} µs) before the \
         lease's end ({expires_at} µs); the machine was too slow to arrange it"
    );
    // Past the lease's end by the database clock, then let the attempt go on.
    sqlx::query(
        "SELECT pg_sleep(greatest(0, $1::int8 / 1000000.0 \
                 - extract(epoch FROM clock_timestamp())::float8) + 0.05)",
    )
    .bind(expires_at)
    .execute(&mut *blocker)
    .await
    .expect("sleep past the expiry");
    blocker.commit().await.expect("commit");

    let seen = scene
        .assert_refused_by_a_holder_ending_at_once(
            outcome,
            "a lease live at the statement's start but over at its read reports a tiny, \
             non-zero time left",
        )
        .await;
    assert_eq!(
        seen.owner(),
        &holder,
        "the refusal names the holder it saw live"
    );
}

/// The attempt's insert of a name's first row waits behind another transaction's
/// uncommitted insert of that row (with no holder); once that commits, the attempt's
/// statement has neither taken nor seen a holder (the lock changed hands during the
/// attempt), and its follow-up read finds the lock free. It reports an unknown holder that
/// ends at once, not one with zero time left (which lockcore reads as expired and waits a
/// whole backoff for).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_race_that_finds_the_lock_free_reports_a_holder_ending_at_once() {
    let Some(scene) = Scene::new("lost-race").await else {
        return;
    };
    let Scene {
        backend,
        admin,
        table,
        name,
        ..
    } = &scene;

    let mut racer = admin.begin().await.expect("begin");
    sqlx::query(AssertSqlSafe(format!(
        "INSERT INTO {table} (name) VALUES ($1)"
    )))
    .bind(name.as_str())
    .execute(&mut *racer)
    .await
    .expect("insert a row without a holder");
    let outcome = spawn_attempt(backend, name);
    wait_until_blocked(admin, table).await;
    racer.commit().await.expect("commit");

    scene
        .assert_refused_by_a_holder_ending_at_once(
            outcome,
            "a lost race that then finds no holder reports a holder ending at once",
        )
        .await;
}
