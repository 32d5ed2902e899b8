//! Talking to PostgreSQL: the pool, one bounded attempt per call, and schema creation
//! (sqlx and database errors become lockcore errors in [`crate::error`]).

use std::time::Duration;

use lockcore::{Error, ErrorKind};
use sqlx::postgres::{PgConnection, PgPool, PgPoolOptions};
use sqlx::{Connection, Row, SqlStr};
use tokio::time::{Instant, timeout_at};

use crate::config::PostgresConfig;
use crate::conns::{Conns, NotLent, PING_IF_IDLE_FOR};
use crate::denied::Who;
use crate::error::{Effect, connect_failed, map_error_as, timed_out};
use crate::limits;
use crate::names::Names;
use crate::permit_sql::{self, PermitStatements};
use crate::sql::{self, Statements};

/// The connections plus the statements, shared by every clone of a backend.
#[derive(Debug)]
pub(crate) struct Client {
    /// sqlx's pool: fenced transactions, the user's own statements, the `LISTEN`
    /// connection (lock calls run on [`conns`](Self::conns)).
    pub(crate) pool: PgPool,
    /// The lock calls' connections.
    pub(crate) conns: Conns,
    pub(crate) statements: Statements,
    /// The statements of semaphore permits.
    pub(crate) permits: PermitStatements,
    pub(crate) names: Names,
    pub(crate) timeout: Duration,
    pub(crate) prepared: bool,
    /// Begins every explicit transaction, with the statement timeout (see [`limits`]).
    pub(crate) begin: SqlStr,
    /// The role and objects, named in authentication and privilege errors.
    pub(crate) who: Who,
}

impl Client {
    /// Lazily connecting: no connection is opened until the first call.
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
        let names = config.names();
        let who = Who {
            user: config.user().to_owned(),
            names: names.clone(),
            tls: config.tls(),
        };
        Self {
            pool,
            conns: Conns::new(config.connect_options(), config.pool_size()),
            statements: Statements::new(&names),
            permits: PermitStatements::new(&names),
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
            Ok(Err(err)) => Err(connect_failed(err, &self.who)),
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

    /// Runs `work` on one of the lock calls' connections ([`Conns`]) within the configured
    /// timeout: one attempt, no retries. Failing to get a connection is
    /// [`ErrorKind::Unavailable`] (nothing was sent); failures after that are mapped with
    /// `effect`. Without prepared statements the work runs inside `BEGIN`/`COMMIT` (see
    /// [`pinned`]). The connection is used again only if the work ended without an error.
    pub(crate) async fn run<T>(
        &self,
        effect: Effect,
        work: impl AsyncFnOnce(&mut PgConnection) -> Result<T, sqlx::Error>,
    ) -> lockcore::Result<T> {
        self.attempt(effect, false, work).await
    }

    /// [`run`](Self::run), always inside one transaction (`BEGIN` … `COMMIT`, begun as
    /// every explicit transaction is, with the statement timeout where needed), for work
    /// of more than one statement. An error or a timeout leaves it rolled back.
    pub(crate) async fn run_tx<T>(
        &self,
        effect: Effect,
        work: impl AsyncFnOnce(&mut PgConnection) -> Result<T, sqlx::Error>,
    ) -> lockcore::Result<T> {
        self.attempt(effect, true, work).await
    }

    async fn attempt<T>(
        &self,
        effect: Effect,
        transaction: bool,
        work: impl AsyncFnOnce(&mut PgConnection) -> Result<T, sqlx::Error>,
    ) -> lockcore::Result<T> {
        let deadline = Instant::now() + self.timeout;
        let mut conn = match self.conns.lend(deadline).await {
            Ok(conn) => conn,
            Err(NotLent::Connect(err)) => return Err(connect_failed(err, &self.who)),
            Err(NotLent::Busy) => {
                return Err(Error::unavailable(format!(
                    "all {} connections stayed busy for {:?}; nothing was sent (raise \
                     pool_size, or make fewer calls at once)",
                    self.conns.size(),
                    self.timeout
                )));
            }
            Err(NotLent::Slow) => {
                return Err(timed_out(
                    Effect::Read,
                    self.timeout,
                    "getting a connection",
                ));
            }
        };
        let attempt = async {
            if self.prepared && !transaction {
                work(&mut conn).await
            } else {
                pinned(&mut conn, self.begin.clone(), work).await
            }
        };
        match timeout_at(deadline, attempt).await {
            Ok(Ok(value)) => {
                conn.give_back();
                Ok(value)
            }
            Ok(Err(err)) => Err(map_error_as(err, effect, Some(&self.who))),
            Err(_) => Err(timed_out(effect, self.timeout, "waiting for the reply")),
        }
    }

    /// Creates the schema, sequence and table unless they exist, adds the `note` column to
    /// a table made by an older version, and creates the permits' table and sequence
    /// (semaphores) when they are missing.
    ///
    /// Concurrent creators (many processes starting at once) serialize on a
    /// transaction-scoped advisory lock, so none fails on a duplicate catalog entry. When
    /// the objects (and the column) exist no DDL runs, so a role without `CREATE` or
    /// ownership can use a table an operator made. A role that may not create the permit
    /// objects next to an existing lock table still connects: locks work, and permits fail
    /// with the missing table's error until an owner creates them.
    pub(crate) async fn ensure_schema(&self, create: bool) -> lockcore::Result<()> {
        let names = self.names.clone();
        let found = self
            .run(Effect::Write, async |conn| {
                let found = exists(conn, &names).await?;
                if (found.complete() && found.permits) || !create {
                    return Ok(found);
                }
                match create_schema_retrying(conn, &names).await {
                    Ok(()) => Ok(Found {
                        present: true,
                        has_note: true,
                        permits: true,
                        // A sequence made just now has CACHE 1; an existing one was read.
                        ..found
                    }),
                    Err(err) if found.complete() && is_insufficient_privilege(&err) => {
                        // The failed transaction's ROLLBACK is only queued (sqlx sends it
                        // with the next message); send it now, or the connection goes back
                        // idle in an aborted transaction (the review; sqlx's pool pinged
                        // every connection on return, which sent it).
                        sqlx::Connection::ping(&mut *conn).await?;
                        tracing::warn!(table = %names.permits, error = %err,
                            "cannot create the semaphore permits table; locks work, permits \
                             fail until its owner creates it (docs/postgres.md, Semaphores)");
                        Ok(found)
                    }
                    Err(err) => Err(err),
                }
            })
            .await?;
        if let Some(cache) = found.permit_cache.filter(|&cache| cache > 1) {
            return Err(cached_sequence(&self.names.permit_sequence, cache));
        }
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
        Err(Error::new(ErrorKind::Config, message))
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
    /// The permits table and its sequence exist.
    permits: bool,
    /// The permits sequence's `CACHE`.
    permit_cache: Option<i64>,
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
    sqlstate_is(err, "55P03")
}

/// SQLSTATE 42501: a privilege is missing.
fn is_insufficient_privilege(err: &sqlx::Error) -> bool {
    sqlstate_is(err, "42501")
}

fn sqlstate_is(err: &sqlx::Error, sqlstate: &str) -> bool {
    err.as_database_error()
        .and_then(|e| e.code())
        .is_some_and(|code| code == sqlstate)
}

/// Creates the missing objects (the permits' among them) and adds a missing `note` column,
/// in one transaction, after taking a transaction-scoped advisory lock so that concurrent
/// creators queue. What exists is checked again under the lock: a creator that queued
/// behind another runs no DDL.
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
    if !found.permits {
        for statement in permit_sql::create_statements(names) {
            sqlx::query(statement)
                .persistent(false)
                .execute(&mut *tx)
                .await?;
        }
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
/// sequence's `CACHE` when it exists; the same for the permits' table and sequence.
async fn exists(conn: &mut PgConnection, names: &Names) -> Result<Found, sqlx::Error> {
    let row = sqlx::query(sql::EXISTS)
        .bind(&names.table)
        .bind(&names.sequence)
        .bind(&names.permits)
        .bind(&names.permit_sequence)
        .persistent(false)
        .fetch_one(conn)
        .await?;
    Ok(Found {
        present: row.try_get("present")?,
        has_note: row.try_get("has_note")?,
        cache: row.try_get("cache")?,
        permits: row.try_get("permits")?,
        permit_cache: row.try_get("permit_cache")?,
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
}

async fn schema_exists(conn: &mut PgConnection, names: &Names) -> Result<bool, sqlx::Error> {
    let row = sqlx::query(sql::SCHEMA_EXISTS)
        .bind(&names.schema)
        .persistent(false)
        .fetch_one(conn)
        .await?;
    row.try_get("present")
}
