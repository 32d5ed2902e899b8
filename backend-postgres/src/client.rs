//! Talking to PostgreSQL: the pool, one bounded attempt per call, schema creation, and the
//! one place where sqlx and database errors become lockcore errors.

use std::time::Duration;

use lockcore::{Error, ErrorKind, RetryStatus};
use sqlx::postgres::{PgConnection, PgPool, PgPoolOptions};
use sqlx::{Connection, Row, SqlStr};
use tokio::time::{Instant, timeout_at};

use crate::config::PostgresConfig;
use crate::denied::{self, Who};
use crate::limits;
use crate::sql::{self, Names, Statements};
use crate::tls::tls_failure;

/// The backend name in every error.
pub(crate) const BACKEND: &str = "postgres";

/// Whether an operation changes the lease table, which decides what a lost reply means.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Effect {
    /// A read: a lost reply changed nothing.
    Read,
    /// A write: once sent, a lost reply leaves the outcome unknown.
    Write,
}

/// The pool plus the statements, shared by every clone of a backend.
#[derive(Debug)]
pub(crate) struct Client {
    pub(crate) pool: PgPool,
    pub(crate) statements: Statements,
    pub(crate) names: Names,
    pub(crate) timeout: Duration,
    pub(crate) prepared: bool,
    /// Begins every explicit transaction, with the statement timeout (see [`limits`]).
    pub(crate) begin: SqlStr,
    /// The role and objects, named in authentication and privilege errors.
    pub(crate) who: Who,
}

/// Pooled connections idle at least this long are pinged before a lock statement.
const PING_IF_IDLE_FOR: Duration = Duration::from_secs(1);

impl Client {
    /// A lazily connecting pool: no connection is opened until the first call.
    pub(crate) fn new(config: &PostgresConfig) -> Self {
        let pool = PgPoolOptions::new()
            .max_connections(config.pool_size())
            .min_connections(0)
            .acquire_timeout(config.timeout())
            // A connection idle for a while is pinged before use: after a server restart,
            // one ping per dead pooled connection is cheaper than one failed lock call
            // each. A connection used within the last second is not: pinging every time
            // cost a round trip per statement on the hot path (BENCHMARKS.md).
            .test_before_acquire(false)
            .before_acquire(|conn, meta| {
                Box::pin(async move {
                    if meta.idle_for >= PING_IF_IDLE_FOR {
                        sqlx::Connection::ping(conn).await?;
                    }
                    Ok(true)
                })
            })
            .connect_lazy_with(config.connect_options());
        let names = Names::new(config);
        let who = Who {
            user: config.user().to_owned(),
            names: names.clone(),
        };
        Self {
            pool,
            statements: Statements::new(&names),
            who,
            names,
            timeout: config.timeout(),
            prepared: config.prepared_statements(),
            begin: limits::begin_statement(config.statement_timeout()),
        }
    }

    /// Opens one connection outside the pool and closes it, so that a refused,
    /// unreachable or misconfigured server is reported with its cause within the timeout:
    /// the pool retries failed connects until its acquire timeout, then says only that it
    /// timed out.
    pub(crate) async fn check_reachable(&self, config: &PostgresConfig) -> lockcore::Result<()> {
        let deadline = Instant::now() + self.timeout;
        match timeout_at(
            deadline,
            PgConnection::connect_with(&config.connect_options()),
        )
        .await
        {
            Ok(Ok(conn)) => {
                let _ = conn.close().await;
                Ok(())
            }
            Ok(Err(err @ sqlx::Error::Io(_))) if tls_failure(&err).is_none() => Err(
                Error::unavailable("cannot connect to the PostgreSQL server")
                    .with_backend(BACKEND)
                    .with_source(err),
            ),
            Ok(Err(err)) => Err(map_error_as(err, Effect::Read, Some(&self.who))),
            Err(_) => Err(timed_out(Effect::Read, self.timeout, "connecting")),
        }
    }

    /// A query for `statement`, prepared (and cached) unless the config says otherwise.
    pub(crate) fn query(
        &self,
        statement: &SqlStr,
    ) -> sqlx::query::Query<'static, sqlx::Postgres, sqlx::postgres::PgArguments> {
        sqlx::query(statement.clone()).persistent(self.prepared)
    }

    /// Runs `work` on one pooled connection within the configured timeout: one attempt,
    /// no retries. Failing to get a connection is [`ErrorKind::Unavailable`] (nothing was
    /// sent); failures after that are mapped with `effect`. Without prepared statements
    /// the work runs inside `BEGIN`/`COMMIT` (see [`pinned`]).
    pub(crate) async fn run<T>(
        &self,
        effect: Effect,
        work: impl AsyncFnOnce(&mut PgConnection) -> Result<T, sqlx::Error>,
    ) -> lockcore::Result<T> {
        let deadline = Instant::now() + self.timeout;
        let mut conn = match timeout_at(deadline, self.pool.acquire()).await {
            Ok(Ok(conn)) => conn,
            Ok(Err(err)) => return Err(map_error_as(err, Effect::Read, Some(&self.who))),
            Err(_) => {
                return Err(timed_out(
                    Effect::Read,
                    self.timeout,
                    "getting a connection",
                ));
            }
        };
        let attempt = async {
            if self.prepared {
                work(&mut conn).await
            } else {
                pinned(&mut conn, self.begin.clone(), work).await
            }
        };
        match timeout_at(deadline, attempt).await {
            Ok(Ok(value)) => Ok(value),
            Ok(Err(err)) => Err(map_error_as(err, effect, Some(&self.who))),
            Err(_) => Err(timed_out(effect, self.timeout, "waiting for the reply")),
        }
    }

    /// Creates the schema, sequence and table unless they exist, and adds the `note`
    /// column to a table made by an older version.
    ///
    /// Concurrent creators (many processes starting at once) serialize on a
    /// transaction-scoped advisory lock, so none fails on a duplicate catalog entry. When
    /// the objects (and the column) exist no DDL runs, so a role without `CREATE` or
    /// ownership can use a table an operator made.
    pub(crate) async fn ensure_schema(&self, create: bool) -> lockcore::Result<()> {
        let names = self.names.clone();
        let found = self
            .run(Effect::Write, async |conn| {
                let found = exists(conn, &names).await?;
                if found.complete() || !create {
                    return Ok(found);
                }
                create_schema_retrying(conn, &names).await.map(|()| Found {
                    present: true,
                    has_note: true,
                    // A sequence made just now has CACHE 1; an existing one was read.
                    cache: found.cache,
                })
            })
            .await?;
        if let Some(cache) = found.cache.filter(|&cache| cache > 1) {
            return Err(cached_sequence(&self.names.sequence, cache));
        }
        if found.complete() {
            return Ok(());
        }
        let table = &self.names.table;
        let message = if found.present {
            format!(
                "the lease table {table} lacks the `note` column this version stores notes in, \
                 and schema creation is off; as the table's owner run \
                 ALTER TABLE {table} ADD COLUMN IF NOT EXISTS note text \
                 (see docs/postgres.md) or allow create_schema"
            )
        } else {
            format!(
                "the lease table {table} or its sequence does not exist and schema creation is \
                 off; create it (see docs/postgres.md) or allow create_schema"
            )
        };
        Err(Error::new(ErrorKind::Config, message).with_backend(BACKEND))
    }
}

/// What [`sql::EXISTS`] found.
#[derive(Debug, Clone, Copy)]
struct Found {
    /// The table and the sequence exist.
    present: bool,
    /// The table has the `note` column.
    has_note: bool,
    /// The sequence's `CACHE`.
    cache: Option<i64>,
}

impl Found {
    /// Nothing to create or add.
    fn complete(self) -> bool {
        self.present && self.has_note
    }
}

/// How long the `ALTER TABLE` that adds the `note` column may wait for the table's lock.
/// It needs `ACCESS EXCLUSIVE`, and while it waits every other client's statement on the
/// table queues behind it: waiting for the whole client timeout (10 s) would stall the
/// fleet's refreshes (and lose leases with short TTLs) behind one long transaction.
const SET_ALTER_LOCK_TIMEOUT: &str = "SET LOCAL lock_timeout = '200ms'";
/// Attempts of the upgrade while the table is busy, 100 ms apart (about 3 s in all).
const ALTER_ATTEMPTS: u32 = 10;

/// [`create_schema`], tried again while the `ALTER TABLE` gives up on the table's lock
/// (`lock_not_available`): each wait is short, so the other clients' statements are held
/// up at most 200 ms at a time ([`SET_ALTER_LOCK_TIMEOUT`]).
async fn create_schema_retrying(conn: &mut PgConnection, names: &Names) -> Result<(), sqlx::Error> {
    let mut attempt = 1;
    loop {
        match create_schema(conn, names).await {
            Err(err) if is_lock_not_available(&err) && attempt < ALTER_ATTEMPTS => {
                tracing::debug!(table = %names.table, attempt, "table busy; adding the note column later");
                attempt += 1;
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            outcome => return outcome,
        }
    }
}

/// SQLSTATE 55P03: a lock wait ran into `lock_timeout`.
fn is_lock_not_available(err: &sqlx::Error) -> bool {
    err.as_database_error()
        .and_then(|e| e.code())
        .is_some_and(|code| code == "55P03")
}

/// Creates the missing objects and adds a missing `note` column, in one transaction, after
/// taking a transaction-scoped advisory lock so that concurrent creators queue. What
/// exists is checked again under the lock: a creator that queued behind another runs no
/// DDL.
async fn create_schema(conn: &mut PgConnection, names: &Names) -> Result<(), sqlx::Error> {
    let mut tx = conn.begin().await?;
    let key = format!("anylock schema {}", names.table);
    sqlx::query(sql::CREATE_LOCK)
        .bind(key)
        .persistent(false)
        .execute(&mut *tx)
        .await?;
    let found = exists(&mut tx, names).await?;
    if !found.present {
        // CREATE SCHEMA IF NOT EXISTS checks the database's CREATE privilege even when the
        // schema exists, so skip it for a schema an operator made.
        let skip = usize::from(schema_exists(&mut tx, names).await?);
        for statement in sql::create_statements(names).into_iter().skip(skip) {
            sqlx::query(statement)
                .persistent(false)
                .execute(&mut *tx)
                .await?;
        }
    } else if !found.has_note {
        sqlx::query(SET_ALTER_LOCK_TIMEOUT)
            .persistent(false)
            .execute(&mut *tx)
            .await?;
        sqlx::query(sql::add_note_column(names))
            .persistent(false)
            .execute(&mut *tx)
            .await?;
    }
    tx.commit().await
}

/// Runs `work` in an explicit transaction begun by `begin`.
///
/// sqlx parses a statement (`Parse`, `Describe`, `Sync`) and only then binds and executes
/// it. Behind PgBouncer in transaction mode the `Sync` ends the implicit transaction, so
/// another client can take the server connection in between and replace the unnamed
/// statement (seen in tests as "bind message supplies 4 parameters, but prepared
/// statement \"\" requires 3"). An open transaction pins the server connection.
async fn pinned<T>(
    conn: &mut PgConnection,
    begin: SqlStr,
    work: impl AsyncFnOnce(&mut PgConnection) -> Result<T, sqlx::Error>,
) -> Result<T, sqlx::Error> {
    let mut tx = conn.begin_with(begin).await?;
    let value = work(&mut tx).await?;
    tx.commit().await?;
    Ok(value)
}

/// Whether the table and sequence exist, whether the table has its `note` column, and the
/// sequence's `CACHE` when it exists.
async fn exists(conn: &mut PgConnection, names: &Names) -> Result<Found, sqlx::Error> {
    let row = sqlx::query(sql::EXISTS)
        .bind(&names.table)
        .bind(&names.sequence)
        .persistent(false)
        .fetch_one(conn)
        .await?;
    Ok(Found {
        present: row.try_get("present")?,
        has_note: row.try_get("has_note")?,
        cache: row.try_get("cache")?,
    })
}

/// A fence sequence with `CACHE > 1` hands each session a block of values of its own, so
/// tokens drawn by two sessions are not in grant order: fencing would go backwards.
fn cached_sequence(sequence: &str, cache: i64) -> Error {
    Error::new(
        ErrorKind::Config,
        format!(
            "the fence sequence {sequence} has CACHE {cache}: each session draws from its own \
             block of values, so fence tokens would not rise in grant order; run \
             ALTER SEQUENCE {sequence} CACHE 1"
        ),
    )
    .with_backend(BACKEND)
}

async fn schema_exists(conn: &mut PgConnection, names: &Names) -> Result<bool, sqlx::Error> {
    let row = sqlx::query(sql::SCHEMA_EXISTS)
        .bind(&names.schema)
        .persistent(false)
        .fetch_one(conn)
        .await?;
    row.try_get("present")
}

fn timed_out(effect: Effect, limit: Duration, phase: &str) -> Error {
    let kind = match effect {
        Effect::Read => ErrorKind::Unavailable,
        Effect::Write => ErrorKind::OutcomeUnknown,
    };
    Error::new(kind, format!("no answer within {limit:?} ({phase})")).with_backend(BACKEND)
}

/// Maps every sqlx error to a lockcore kind and retry status.
///
/// A database error means the statement failed and was rolled back, so even for a write
/// its outcome is known; a broken connection after a write was sent is not.
pub(crate) fn map_error(err: sqlx::Error, effect: Effect) -> Error {
    map_error_as(err, effect, None)
}

/// [`map_error`], naming `who` in authentication and privilege failures.
pub(crate) fn map_error_as(err: sqlx::Error, effect: Effect, who: Option<&Who>) -> Error {
    if let Some(tls) = tls_failure(&err) {
        return tls.with_backend(BACKEND).with_source(err);
    }
    let (kind, status, message) = match &err {
        sqlx::Error::Database(db) => {
            let code = db.code().map(|c| c.into_owned()).unwrap_or_default();
            let (kind, status) = classify_sqlstate(&code);
            let mut message = format!("SQLSTATE {code}: {}", db.message());
            if let Some(hint) = denied::hint(&code, db.message(), who) {
                message = hint;
            }
            (kind, status, message)
        }
        other => {
            let (kind, status, message) = classify_client_error(other, effect);
            (kind, status, message.to_owned())
        }
    };
    Error::new(kind, message)
        .with_status(status)
        .with_backend(BACKEND)
        .with_source(err)
}

/// The kind, retry status and message of an error raised on the client side.
fn classify_client_error(err: &sqlx::Error, effect: Effect) -> (ErrorKind, RetryStatus, &str) {
    use ErrorKind::*;
    use RetryStatus::*;
    match err {
        sqlx::Error::Io(_) | sqlx::Error::WorkerCrashed => match effect {
            Effect::Read => (Unavailable, Temporary, "connection lost"),
            Effect::Write => (OutcomeUnknown, Temporary, "connection lost after sending"),
        },
        sqlx::Error::PoolTimedOut => (
            Unavailable,
            Temporary,
            "no pooled connection became available (server unreachable or pool exhausted)",
        ),
        sqlx::Error::PoolClosed => (Unavailable, Permanent, "the connection pool is closed"),
        sqlx::Error::Configuration(_) | sqlx::Error::InvalidArgument(_) => {
            (Config, Permanent, "invalid connection settings")
        }
        _ => (Protocol, Permanent, "unexpected reply from the server"),
    }
}

/// The kind and retry status of a SQLSTATE code (PostgreSQL appendix A).
pub(crate) fn classify_sqlstate(code: &str) -> (ErrorKind, RetryStatus) {
    use ErrorKind::*;
    use RetryStatus::*;
    match code {
        // serialization_failure, deadlock_detected: the transaction lost a race.
        "40001" | "40P01" => (Unavailable, Temporary),
        // lock_not_available, query_canceled (statement_timeout), read_only_sql_transaction
        // (a standby after a failover), idle_in_transaction_session_timeout (the server
        // ended an idle transaction), admin/crash shutdown, cannot_connect_now.
        "55P03" | "57014" | "25006" | "25P03" | "57P01" | "57P02" | "57P03" => {
            (Unavailable, Temporary)
        }
        // invalid_password, invalid_authorization_specification, insufficient_privilege.
        "28P01" | "28000" | "42501" => (PermissionDenied, Permanent),
        // invalid_catalog_name (no such database), undefined_table, invalid_schema_name.
        "3D000" | "42P01" | "3F000" => (Config, Permanent),
        "0A000" => (Unsupported, Permanent),
        _ => match code.get(..2) {
            // connection_exception, insufficient_resources (too many connections, disk full),
            // operator_intervention, system_error.
            Some("08" | "53" | "57" | "58") => (Unavailable, Temporary),
            // data_exception (string too long, bad encoding), program_limit_exceeded.
            Some("22" | "54") => (InvalidInput, Permanent),
            _ => (Protocol, Permanent),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sqlstates_map_to_kinds_and_retry_status() {
        let cases = [
            ("40001", ErrorKind::Unavailable, RetryStatus::Temporary),
            ("40P01", ErrorKind::Unavailable, RetryStatus::Temporary),
            ("08006", ErrorKind::Unavailable, RetryStatus::Temporary),
            ("57P01", ErrorKind::Unavailable, RetryStatus::Temporary),
            ("53300", ErrorKind::Unavailable, RetryStatus::Temporary),
            ("25006", ErrorKind::Unavailable, RetryStatus::Temporary),
            ("25P03", ErrorKind::Unavailable, RetryStatus::Temporary),
            ("28P01", ErrorKind::PermissionDenied, RetryStatus::Permanent),
            ("42501", ErrorKind::PermissionDenied, RetryStatus::Permanent),
            ("3D000", ErrorKind::Config, RetryStatus::Permanent),
            ("42P01", ErrorKind::Config, RetryStatus::Permanent),
            ("22001", ErrorKind::InvalidInput, RetryStatus::Permanent),
            ("23505", ErrorKind::Protocol, RetryStatus::Permanent),
            ("XX000", ErrorKind::Protocol, RetryStatus::Permanent),
        ];
        for (code, kind, status) in cases {
            assert_eq!(classify_sqlstate(code), (kind, status), "{code}");
        }
    }

    #[test]
    fn a_lost_connection_is_unknown_only_for_writes() {
        let io = || sqlx::Error::Io(std::io::Error::from(std::io::ErrorKind::UnexpectedEof));
        let read = map_error(io(), Effect::Read);
        assert_eq!(read.kind(), ErrorKind::Unavailable);
        assert!(read.is_temporary());
        let write = map_error(io(), Effect::Write);
        assert_eq!(write.kind(), ErrorKind::OutcomeUnknown);
        assert!(write.is_temporary());
        assert_eq!(write.backend(), Some(BACKEND));
        let pool = map_error(sqlx::Error::PoolTimedOut, Effect::Write);
        assert_eq!(pool.kind(), ErrorKind::Unavailable);
        assert!(pool.is_temporary());
    }
}
