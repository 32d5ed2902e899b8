//! The lock database's tables, their upgrade from older versions, and the check of its
//! journal mode.

use std::path::Path;

use lockcore::{Error, ErrorKind};
use sqlx::sqlite::SqlitePool;

use crate::error::map_error;

const SCHEMA: &str = "CREATE TABLE IF NOT EXISTS anylock_leases (
    name        TEXT PRIMARY KEY NOT NULL,
    owner       TEXT,
    token       INTEGER NOT NULL,
    boot_id     TEXT,
    pid         INTEGER,
    pid_start   INTEGER,
    acquired_ms INTEGER,
    expires_ms  INTEGER,
    liveness    TEXT,
    note        TEXT,
    expires_wall_ms INTEGER
) STRICT";

/// The semaphores' tables (`permit_store.rs`): one row per live permit, keyed by semaphore
/// and owner (deleted on release), and one fence counter per semaphore name, never deleted,
/// so a semaphore's tokens only grow. A database made by an older version gets them at
/// its next open; older versions ignore them.
const PERMIT_SCHEMA: [&str; 2] = [
    "CREATE TABLE IF NOT EXISTS anylock_permits (
    name        TEXT NOT NULL,
    owner       TEXT NOT NULL,
    permits     INTEGER NOT NULL,
    token       INTEGER NOT NULL,
    boot_id     TEXT NOT NULL,
    liveness    TEXT,
    acquired_ms INTEGER,
    expires_ms  INTEGER NOT NULL,
    note        TEXT,
    expires_wall_ms INTEGER,
    PRIMARY KEY (name, owner)
) STRICT",
    "CREATE TABLE IF NOT EXISTS anylock_semaphores (
    name  TEXT PRIMARY KEY NOT NULL,
    token INTEGER NOT NULL
) STRICT",
];

/// Whether the table `?1` has the column `?2`.
const HAS_COLUMN: &str = "SELECT COUNT(*) FROM pragma_table_info(?1) WHERE name = ?2";

/// Columns added after a table's first release, each with its table and the statement that
/// adds it to a database made by an older version: the kernel-lock liveness signal, the
/// note stored with a grant, and the wall-clock expiry by which another boot judges a
/// lease (`host::Now::left_ms`).
const ADDED_COLUMNS: [(&str, &str, &str); 4] = [
    (
        "anylock_leases",
        "liveness",
        "ALTER TABLE anylock_leases ADD COLUMN liveness TEXT",
    ),
    (
        "anylock_leases",
        "note",
        "ALTER TABLE anylock_leases ADD COLUMN note TEXT",
    ),
    (
        "anylock_leases",
        "expires_wall_ms",
        "ALTER TABLE anylock_leases ADD COLUMN expires_wall_ms INTEGER",
    ),
    (
        "anylock_permits",
        "expires_wall_ms",
        "ALTER TABLE anylock_permits ADD COLUMN expires_wall_ms INTEGER",
    ),
];

/// Creates the tables a database lacks and adds the columns an older version's lacks.
pub(crate) async fn create(pool: &SqlitePool) -> Result<(), Error> {
    sqlx::query(SCHEMA).execute(pool).await.map_err(map_error)?;
    for schema in PERMIT_SCHEMA {
        sqlx::query(schema).execute(pool).await.map_err(map_error)?;
    }
    for (table, column, add) in ADDED_COLUMNS {
        add_column(pool, table, column, add).await?;
    }
    Ok(())
}

/// Refuses a shared store that is still in WAL mode: SQLite leaves the mode as it is when
/// another process has the file open in WAL mode (one that did not ask for
/// `shared_fs=allow`, or an older version).
pub(crate) async fn require_rollback_journal(pool: &SqlitePool, db: &Path) -> Result<(), Error> {
    let mode: String = sqlx::query_scalar("PRAGMA journal_mode")
        .fetch_one(pool)
        .await
        .map_err(map_error)?;
    if mode.eq_ignore_ascii_case("delete") {
        return Ok(());
    }
    Err(Error::new(
        ErrorKind::Config,
        format!(
            "the shared store {} is in {mode} journal mode, which only one machine can use: \
             another process has it open without shared_fs=allow; stop it (or give it \
             shared_fs=allow too) and open again",
            db.display()
        ),
    ))
}

/// Adds `column` (with the statement `add`) to a database made by an older version.
/// Another process may add it at the same moment; only a column still missing afterwards
/// is an error. Nothing is written when the column exists.
async fn add_column(
    pool: &SqlitePool,
    table: &str,
    column: &str,
    add: &'static str,
) -> Result<(), Error> {
    let has = |pool| async move {
        sqlx::query_scalar::<_, i64>(HAS_COLUMN)
            .bind(table)
            .bind(column)
            .fetch_one(pool)
            .await
            .map_err(map_error)
    };
    if has(pool).await? > 0 {
        return Ok(());
    }
    let added = sqlx::query(add).execute(pool).await;
    match added {
        Err(err) if has(pool).await? == 0 => Err(map_error(err)),
        _ => Ok(()),
    }
}
