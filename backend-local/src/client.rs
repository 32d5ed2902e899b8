//! The SQLite lease table: one statement per operation (the tables are in `schema.rs`;
//! errors are mapped in [`crate::error`]).
//!
//! Rows are never deleted: release clears the owner and keeps the row, so each name's
//! `token` counter only ever grows (durable, monotonic fencing).

use std::path::Path;
use std::time::Duration;

use lockcore::{Error, ErrorKind, Ttl};
use sqlx::Row as _;
use sqlx::sqlite::{
    SqliteConnectOptions, SqliteJournalMode, SqlitePool, SqlitePoolOptions, SqliteRow,
    SqliteSynchronous,
};

use crate::config::LocalConfig;
use crate::error::map_error;
use crate::host::Now;
use crate::schema;

/// Takes the name when it is free, ended (a lease of this boot at its expiry on this
/// boot's clock `?9`, a lease of another boot at its wall-clock expiry, `?10`: the rule of
/// `host::Now::left_ms`), or already ours.
///
/// `pid` and `pid_start` are written as NULL: older versions took over from any holder
/// whose pid they could not see alive, which is wrong across PID namespaces, and a NULL
/// pid keeps them from doing so.
/// The note (`?7`, NULL for none) is written by the same statement as the grant, and
/// replaced (or cleared) by every grant.
const GRANT: &str = "INSERT INTO anylock_leases
        (name, owner, token, boot_id, liveness, acquired_ms, expires_ms, note, expires_wall_ms)
    VALUES (?1, ?2, 1, ?3, ?4, ?5, ?6, ?7, ?8)
    ON CONFLICT (name) DO UPDATE SET
        owner = excluded.owner, token = anylock_leases.token + 1,
        boot_id = excluded.boot_id, pid = NULL, pid_start = NULL,
        liveness = excluded.liveness,
        acquired_ms = excluded.acquired_ms, expires_ms = excluded.expires_ms,
        note = excluded.note, expires_wall_ms = excluded.expires_wall_ms
    WHERE anylock_leases.owner IS NULL
       OR anylock_leases.owner = excluded.owner
       OR (anylock_leases.boot_id IS excluded.boot_id AND anylock_leases.expires_ms <= ?9)
       OR (anylock_leases.boot_id IS NOT excluded.boot_id
           AND IFNULL(anylock_leases.expires_wall_ms, ?10) <= ?10)
    RETURNING token";

/// Takes the name from a holder of this boot seen dead, only if nothing changed since it
/// was seen.
const TAKE_OVER: &str = "UPDATE anylock_leases SET
        owner = ?2, token = token + 1, boot_id = ?3, pid = NULL, pid_start = NULL,
        liveness = ?4, acquired_ms = ?5, expires_ms = ?6, note = ?7, expires_wall_ms = ?8
    WHERE name = ?1 AND token = ?9 AND owner = ?10
    RETURNING token";

const READ: &str = "SELECT owner, token, boot_id, liveness, acquired_ms, expires_ms, note,
        expires_wall_ms
    FROM anylock_leases WHERE name = ?1";

/// The held rows from the name `?1` on, in byte order (`BINARY` collation), read through the
/// primary key's index; the caller stops at the first name outside its prefix, so no
/// pattern (`LIKE`, `GLOB`) ever sees the prefix.
const LIST: &str = "SELECT name, owner, token, boot_id, liveness, acquired_ms, expires_ms, note,
        expires_wall_ms
    FROM anylock_leases WHERE name >= ?1 AND owner IS NOT NULL ORDER BY name";

const EXTEND: &str = "UPDATE anylock_leases SET expires_ms = ?5, expires_wall_ms = ?7
    WHERE name = ?1 AND owner = ?2 AND token = ?3 AND boot_id = ?4 AND expires_ms > ?6
    RETURNING token";

/// Unties a live grant from its holder's liveness file, so that the holder may exit and the
/// lease last until its TTL (`LockBackend::detach`).
const DETACH: &str = "UPDATE anylock_leases SET liveness = NULL
    WHERE name = ?1 AND owner = ?2 AND token = ?3 AND boot_id = ?4 AND expires_ms > ?5
    RETURNING token";

const CLEAR: &str = "UPDATE anylock_leases
    SET owner = NULL, pid = NULL, pid_start = NULL, liveness = NULL, expires_ms = NULL,
        note = NULL, expires_wall_ms = NULL
    WHERE name = ?1 AND owner = ?2 AND token = ?3";

const FORCE: &str = "INSERT INTO anylock_leases
        (name, owner, token, boot_id, acquired_ms, expires_ms, expires_wall_ms)
    VALUES (?1, ?2, 1, ?3, ?4, ?5, ?6)
    ON CONFLICT (name) DO UPDATE SET
        owner = excluded.owner, token = anylock_leases.token + 1, boot_id = excluded.boot_id,
        pid = NULL, pid_start = NULL, liveness = NULL, acquired_ms = excluded.acquired_ms,
        expires_ms = excluded.expires_ms, note = NULL,
        expires_wall_ms = excluded.expires_wall_ms";

/// A lease row as stored.
#[derive(Debug, Clone)]
pub(crate) struct Row {
    pub(crate) owner: Option<String>,
    pub(crate) token: i64,
    pub(crate) boot_id: Option<String>,
    /// The key of the holder's liveness file, if it has one.
    pub(crate) liveness: Option<String>,
    pub(crate) acquired_ms: Option<i64>,
    pub(crate) expires_ms: Option<i64>,
    /// The note stored with the grant, as stored (not yet made safe to show).
    pub(crate) note: Option<String>,
    /// The expiry on the wall clock, by which another boot judges the lease.
    pub(crate) expires_wall_ms: Option<i64>,
}

impl Row {
    /// How long the lease still has at `now`, or `None` when nobody holds it.
    pub(crate) fn left_ms(&self, now: &Now<'_>) -> Option<i64> {
        self.owner.as_ref()?;
        now.left_ms(
            self.boot_id.as_deref(),
            self.expires_ms,
            self.expires_wall_ms,
        )
    }
}

/// Who asks, on which boot, with which expiry.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Claim<'a> {
    pub(crate) name: &'a str,
    pub(crate) owner: &'a str,
    pub(crate) boot_id: &'a str,
    /// The key of the claimant's liveness file (locked before the claim is sent).
    pub(crate) liveness: Option<&'a str>,
    /// The note to store with the grant.
    pub(crate) note: Option<&'a str>,
    pub(crate) now_ms: i64,
    pub(crate) ttl: Ttl,
    pub(crate) wall_ms: i64,
}

impl<'a> Claim<'a> {
    fn ttl_ms(&self) -> i64 {
        i64::try_from(self.ttl.as_millis()).unwrap_or(i64::MAX)
    }

    /// When the grant or refresh the claim makes ends, on the expiry clock.
    pub(crate) fn expires_ms(&self) -> i64 {
        self.now_ms.saturating_add(self.ttl_ms())
    }

    /// When the grant or refresh the claim makes ends, on the wall clock (for other boots).
    pub(crate) fn expires_wall_ms(&self) -> i64 {
        self.wall_ms.saturating_add(self.ttl_ms())
    }

    /// The moment the claim was made at.
    pub(crate) fn now(&self) -> Now<'a> {
        Now {
            boot_id: self.boot_id,
            expiry_ms: self.now_ms,
            wall_ms: self.wall_ms,
        }
    }
}

/// Two pools on the lock database.
#[derive(Debug, Clone)]
pub(crate) struct Client {
    /// `synchronous = FULL`: each commit is synced to disk before it returns, so a token
    /// handed out survives power loss.
    pool: SqlitePool,
    /// `synchronous = NORMAL`, for the release alone: its commit is written to the WAL but
    /// not synced, so it needs no sync of its own and the next holder's grant comes a
    /// sync sooner. Only power loss (or a kernel crash) can undo it, and after one the
    /// machine boots anew: every lease of the earlier boot is expired whatever its row
    /// says (off Linux the restored row lasts until its TTL at most: its liveness file
    /// may be gone, so no contender can prove the holder dead).
    /// An undone release can only make a lock look held longer, never held twice; it
    /// changes no token; and the next synced commit (any grant) syncs it too, in order.
    unsynced: SqlitePool,
}

impl Client {
    /// Opens (creating if needed) the database at `db` (the store `config` names, made
    /// ready by `store::prepare`) and its tables.
    pub(crate) async fn open(config: &LocalConfig, db: &Path) -> Result<Self, Error> {
        // First-time setup (switching a new file to WAL, creating the table) can answer
        // SQLITE_BUSY at once, without consulting the busy handler, when several processes
        // open a fresh file together (seen in CI: 1 of 320 concurrent opens). Opening is not
        // a lock attempt, so it is retried here, within the busy timeout.
        let deadline = tokio::time::Instant::now() + config.busy_timeout();
        loop {
            match Self::try_open(config, db).await {
                Err(err)
                    if err.kind() == ErrorKind::Unavailable
                        && tokio::time::Instant::now() < deadline =>
                {
                    // Random, so processes that started together do not retry together.
                    let jitter = rand::random_range(0..40);
                    tokio::time::sleep(Duration::from_millis(10 + jitter)).await;
                }
                other => return other,
            }
        }
    }

    async fn try_open(config: &LocalConfig, db: &Path) -> Result<Self, Error> {
        // WAL keeps its index in memory shared by every process of one kernel: on a
        // filesystem shared between kernels only the rollback journal is safe.
        let shared = config.shared_filesystem();
        let journal = match shared {
            true => SqliteJournalMode::Delete,
            false => SqliteJournalMode::Wal,
        };
        let options = SqliteConnectOptions::new()
            .filename(db)
            .create_if_missing(true)
            .journal_mode(journal)
            // FULL: a committed grant survives power loss, so fence tokens never go back.
            .synchronous(SqliteSynchronous::Full)
            .busy_timeout(config.busy_timeout());
        let pools = || {
            SqlitePoolOptions::new()
                .max_connections(4)
                .acquire_timeout(config.busy_timeout() + Duration::from_secs(1))
        };
        // The unsynced release is an argument about one WAL written in order; with the
        // rollback journal every commit is synced.
        let unsynced = match shared {
            true => options.clone(),
            false => options.clone().synchronous(SqliteSynchronous::Normal),
        };
        let pool = pools().connect_with(options).await.map_err(map_error)?;
        if shared {
            schema::require_rollback_journal(&pool, db).await?;
        }
        schema::create(&pool).await?;
        // Opened once the table exists.
        let unsynced = pools().connect_with(unsynced).await.map_err(map_error)?;
        Ok(Self { pool, unsynced })
    }

    /// One atomic upsert; `Some(token)` when granted.
    pub(crate) async fn grant(&self, claim: &Claim<'_>) -> Result<Option<i64>, Error> {
        let row = self
            .bind_claim(sqlx::query(GRANT), claim)
            .bind(claim.now_ms)
            .bind(claim.wall_ms)
            .fetch_optional(&self.pool)
            .await
            .map_err(map_error)?;
        row.map(|r| r.try_get::<i64, _>(0))
            .transpose()
            .map_err(map_error)
    }

    /// Compare-and-swap takeover of a dead holder's row.
    pub(crate) async fn take_over(
        &self,
        claim: &Claim<'_>,
        seen: &Row,
    ) -> Result<Option<i64>, Error> {
        let row = self
            .bind_claim(sqlx::query(TAKE_OVER), claim)
            .bind(seen.token)
            .bind(seen.owner.as_deref())
            .fetch_optional(&self.pool)
            .await
            .map_err(map_error)?;
        row.map(|r| r.try_get::<i64, _>(0))
            .transpose()
            .map_err(map_error)
    }

    fn bind_claim<'q>(
        &self,
        query: sqlx::query::Query<'q, sqlx::Sqlite, sqlx::sqlite::SqliteArguments>,
        claim: &Claim<'q>,
    ) -> sqlx::query::Query<'q, sqlx::Sqlite, sqlx::sqlite::SqliteArguments> {
        query
            .bind(claim.name)
            .bind(claim.owner)
            .bind(claim.boot_id)
            .bind(claim.liveness)
            .bind(claim.wall_ms)
            .bind(claim.expires_ms())
            .bind(claim.note)
            .bind(claim.expires_wall_ms())
    }

    /// The row for `name`, if it was ever taken.
    pub(crate) async fn read(&self, name: &str) -> Result<Option<Row>, Error> {
        let row = sqlx::query(READ)
            .bind(name)
            .fetch_optional(&self.pool)
            .await
            .map_err(map_error)?;
        row.map(|r| decode(&r)).transpose()
    }

    /// `keep` applied to every held row whose name starts with `prefix` (byte for byte), in
    /// byte order of the names, streamed: only what `keep` returns is kept in memory. A row
    /// that cannot be decoded (written by hand) is skipped with a warning.
    pub(crate) async fn list<T>(
        &self,
        prefix: &str,
        mut keep: impl FnMut(String, Row) -> Option<T>,
    ) -> Result<Vec<T>, Error> {
        use futures_util::TryStreamExt as _;
        let mut rows = sqlx::query(LIST).bind(prefix).fetch(&self.pool);
        let mut kept = Vec::new();
        while let Some(row) = rows.try_next().await.map_err(map_error)? {
            let decoded = row
                .try_get::<String, _>("name")
                .map_err(map_error)
                .and_then(|name| Ok((name, decode(&row)?)));
            let (name, row) = match decoded {
                Ok(decoded) => decoded,
                Err(err) => {
                    tracing::warn!(%err, "list: skipping a lock row that cannot be decoded");
                    continue;
                }
            };
            // Sorted by bytes: the names under the prefix are one run starting at it.
            if !name.starts_with(prefix) {
                break;
            }
            kept.extend(keep(name, row));
        }
        Ok(kept)
    }

    /// Extends our unexpired lease; `false` when it is not ours any more. One statement,
    /// committed on its own.
    pub(crate) async fn extend(&self, claim: &Claim<'_>, token: i64) -> Result<bool, Error> {
        extend_on(&self.pool, claim, token).await
    }

    /// Forgets the liveness file of this grant if it is still live; `true` when it was.
    pub(crate) async fn detach(&self, claim: &Claim<'_>, token: i64) -> Result<bool, Error> {
        let row = sqlx::query(DETACH)
            .bind(claim.name)
            .bind(claim.owner)
            .bind(token)
            .bind(claim.boot_id)
            .bind(claim.now_ms)
            .fetch_optional(&self.pool)
            .await
            .map_err(map_error)?;
        Ok(row.is_some())
    }

    /// Clears the owner if it is still exactly this grant; `true` when it was. Committed
    /// without a sync of its own (see `Client::unsynced`).
    pub(crate) async fn clear(&self, name: &str, owner: &str, token: i64) -> Result<bool, Error> {
        let done = sqlx::query(CLEAR)
            .bind(name)
            .bind(owner)
            .bind(token)
            .execute(&self.unsynced)
            .await
            .map_err(map_error)?;
        Ok(done.rows_affected() > 0)
    }

    /// Overwrites `name` with `claim.owner` and a new token, whoever holds it.
    pub(crate) async fn force(&self, claim: &Claim<'_>) -> Result<(), Error> {
        sqlx::query(FORCE)
            .bind(claim.name)
            .bind(claim.owner)
            .bind(claim.boot_id)
            .bind(claim.wall_ms)
            .bind(claim.expires_ms())
            .bind(claim.expires_wall_ms())
            .execute(&self.pool)
            .await
            .map_err(map_error)?;
        Ok(())
    }

    /// The pool, for the statements of other modules (`batch.rs`, `permit_store.rs`).
    pub(crate) fn pool(&self) -> &SqlitePool {
        &self.pool
    }

    /// The pool whose commits are not synced (see the field), for a permit's release.
    pub(crate) fn unsynced(&self) -> &SqlitePool {
        &self.unsynced
    }

    /// Closes the pool.
    pub(crate) async fn close(&self) {
        self.unsynced.close().await;
        self.pool.close().await;
    }
}

/// The one refresh statement ([`EXTEND`]) on `executor`; `true` when it extended the grant.
/// `batch.rs` extends many leases under the same condition.
async fn extend_on<'c>(
    executor: impl sqlx::SqliteExecutor<'c>,
    claim: &Claim<'_>,
    token: i64,
) -> Result<bool, Error> {
    let row = sqlx::query(EXTEND)
        .bind(claim.name)
        .bind(claim.owner)
        .bind(token)
        .bind(claim.boot_id)
        .bind(claim.expires_ms())
        .bind(claim.now_ms)
        .bind(claim.expires_wall_ms())
        .fetch_optional(executor)
        .await
        .map_err(map_error)?;
    Ok(row.is_some())
}

fn decode(row: &SqliteRow) -> Result<Row, Error> {
    Ok(Row {
        owner: row.try_get("owner").map_err(map_error)?,
        token: row.try_get("token").map_err(map_error)?,
        boot_id: row.try_get("boot_id").map_err(map_error)?,
        liveness: row.try_get("liveness").map_err(map_error)?,
        acquired_ms: row.try_get("acquired_ms").map_err(map_error)?,
        expires_ms: row.try_get("expires_ms").map_err(map_error)?,
        note: row.try_get("note").map_err(map_error)?,
        expires_wall_ms: row.try_get("expires_wall_ms").map_err(map_error)?,
    })
}
