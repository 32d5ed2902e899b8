//! The semaphores' statements: permits in `anylock_permits`, one row per (semaphore,
//! owner), and each semaphore's fence counter in `anylock_semaphores` (schemas in
//! `client.rs`).
//!
//! A grant is one write transaction (`BEGIN IMMEDIATE`: SQLite serializes writers, so
//! the count it reads is the count it commits against); every other operation is one
//! statement, under the condition the lock's statement of the same operation uses.

use lockcore::{Error, ErrorKind, MAX_PERMITS, Permits};
use sqlx::Row as _;
use sqlx::sqlite::SqliteRow;

use crate::client::{Claim, Client};
use crate::error::map_error;
use crate::host::Now;
use crate::liveness::{Held, HolderDir, Probe};

/// Every permit row of a semaphore, live or not, earliest grant first: the caller decides
/// which count (`PermitRow::is_live`).
const ROWS: &str = "SELECT owner, permits, token, boot_id, liveness, acquired_ms, expires_ms, note,
        expires_wall_ms
    FROM anylock_permits WHERE name = ?1 ORDER BY token";

/// Drops the semaphore's permits that have ended: of this boot (`?2`) past their expiry on
/// its clock (`?3`), of another boot past their wall-clock expiry (`?4`), the rule of
/// `host::Now::left_ms`.
const DROP_STALE: &str = "DELETE FROM anylock_permits
    WHERE name = ?1 AND ((boot_id IS ?2 AND expires_ms <= ?3)
        OR (boot_id IS NOT ?2 AND IFNULL(expires_wall_ms, ?4) <= ?4))";

/// Deletes one permit if it is still exactly that grant: a release, or a holder proven dead.
const DELETE_GRANT: &str =
    "DELETE FROM anylock_permits WHERE name = ?1 AND owner = ?2 AND token = ?3";

/// The semaphore's next token: its counter row is created at 1 and never deleted.
const NEXT_TOKEN: &str = "INSERT INTO anylock_semaphores (name, token) VALUES (?1, 1)
    ON CONFLICT (name) DO UPDATE SET token = anylock_semaphores.token + 1
    RETURNING token";

/// Writes the claimant's permit, replacing its earlier one (a same-owner retake).
const UPSERT: &str = "INSERT INTO anylock_permits
        (name, owner, permits, token, boot_id, liveness, acquired_ms, expires_ms, note,
         expires_wall_ms)
    VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10)
    ON CONFLICT (name, owner) DO UPDATE SET
        permits = excluded.permits, token = excluded.token, boot_id = excluded.boot_id,
        liveness = excluded.liveness, acquired_ms = excluded.acquired_ms,
        expires_ms = excluded.expires_ms, note = excluded.note,
        expires_wall_ms = excluded.expires_wall_ms";

/// Extends exactly this live grant (the lock's `EXTEND`, on the permit's row).
const EXTEND: &str = "UPDATE anylock_permits SET expires_ms = ?5, expires_wall_ms = ?7
    WHERE name = ?1 AND owner = ?2 AND token = ?3 AND boot_id = ?4 AND expires_ms > ?6
    RETURNING token";

/// Unties exactly this live grant from its holder's liveness file (the lock's `DETACH`).
const DETACH: &str = "UPDATE anylock_permits SET liveness = NULL
    WHERE name = ?1 AND owner = ?2 AND token = ?3 AND boot_id = ?4 AND expires_ms > ?5
    RETURNING token";

/// A permit row as stored.
#[derive(Debug, Clone)]
pub(crate) struct PermitRow {
    pub(crate) owner: String,
    /// The limit it was taken with, as stored (checked by [`PermitRow::limit`]).
    pub(crate) permits: i64,
    pub(crate) token: i64,
    pub(crate) boot_id: String,
    pub(crate) liveness: Option<String>,
    pub(crate) acquired_ms: Option<i64>,
    pub(crate) expires_ms: i64,
    pub(crate) note: Option<String>,
    /// The expiry on the wall clock, by which another boot judges the permit.
    pub(crate) expires_wall_ms: Option<i64>,
}

impl PermitRow {
    /// How long the permit still counts at `now`, or `None` once it has ended (the rule of
    /// [`Now::left_ms`]: another boot's permit by its wall-clock expiry).
    pub(crate) fn left_ms(&self, now: &Now<'_>) -> Option<i64> {
        now.left_ms(
            Some(&self.boot_id),
            Some(self.expires_ms),
            self.expires_wall_ms,
        )
    }

    /// Whether the permit counts at `now`.
    pub(crate) fn is_live(&self, now: &Now<'_>) -> bool {
        self.left_ms(now).is_some()
    }

    /// The limit the permit was taken with; a stored value outside 1 to `MAX_PERMITS`
    /// (written by hand) is a `Protocol` error.
    pub(crate) fn limit(&self) -> Result<u32, Error> {
        u32::try_from(self.permits)
            .ok()
            .and_then(|n| Permits::new(n).ok())
            .map(Permits::get)
            .ok_or_else(|| {
                Error::new(
                    ErrorKind::Protocol,
                    format!(
                        "a stored permit has a limit of {}, not 1 to {MAX_PERMITS}",
                        self.permits
                    ),
                )
            })
    }
}

/// What one permit attempt did.
#[derive(Debug)]
pub(crate) enum PermitAttempt {
    /// Granted, with this token.
    Granted(i64),
    /// Every place is taken: the live holder (not the claimant) whose permit expires first.
    Full(PermitRow),
    /// A live permit was taken with this other limit; nothing was written.
    Conflict(u32),
}

/// The permits of one semaphore as the attempt found them, dead holders' files locked.
struct Seen<'a> {
    /// When the attempt judges them.
    now: Now<'a>,
    /// Live permits of other owners, not proven dead.
    others: Vec<PermitRow>,
    /// The claimant's own live permit, which the grant replaces.
    own: Option<PermitRow>,
    /// Whether some row is of another boot or expired.
    stale: bool,
    /// Permits whose holders were proven dead, with their locked files.
    dead: Vec<(PermitRow, Held)>,
}

impl<'a> Seen<'a> {
    fn new(rows: Vec<PermitRow>, claim: &Claim<'a>) -> Self {
        let mut seen = Self {
            now: claim.now(),
            others: Vec::new(),
            own: None,
            stale: false,
            dead: Vec::new(),
        };
        for row in rows {
            if !row.is_live(&seen.now) {
                seen.stale = true;
            } else if row.owner == claim.owner {
                seen.own = Some(row);
            } else {
                seen.others.push(row);
            }
        }
        seen
    }

    /// Probes the holders of the other permits that `pick` selects, in grant order, and
    /// drops each proven dead, until `enough` holds; "unknown" is never death. Only holders
    /// of this boot are probed: another boot's kernel locks prove nothing here.
    fn drop_dead(
        &mut self,
        holders: &HolderDir,
        pick: impl Fn(&PermitRow) -> bool,
        enough: impl Fn(&Self) -> bool,
    ) {
        let mut i = 0;
        while i < self.others.len() && !enough(self) {
            let row = &self.others[i];
            if !pick(row) || !self.now.is_this_boot(Some(&row.boot_id)) {
                i += 1;
                continue;
            }
            match holders.probe(self.others[i].liveness.as_deref()) {
                Probe::Dead(file) => {
                    let row = self.others.remove(i);
                    self.dead.push((row, file));
                }
                Probe::Alive | Probe::Unknown => i += 1,
            }
        }
    }

    /// Whether the claimant is refused: a live permit with another limit (once the dead
    /// among those are dropped), or no room among `limit` (once enough dead are dropped).
    fn decide(&mut self, limit: u32, holders: &HolderDir) -> Result<Option<PermitAttempt>, Error> {
        // Every holder of another limit is probed: one left alive refuses the request.
        let conflicting = |row: &PermitRow| row.limit().is_ok_and(|held| held != limit);
        self.drop_dead(holders, conflicting, |_| false);
        if let Some(held) = self.conflict(limit)? {
            return Ok(Some(PermitAttempt::Conflict(held)));
        }
        let room = usize::try_from(limit).unwrap_or(usize::MAX);
        self.drop_dead(holders, |_| true, |seen| seen.others.len() < room);
        let now = self.now;
        let first = self.others.iter().min_by_key(|row| row.left_ms(&now));
        Ok(first
            .filter(|_| self.others.len() >= room)
            .cloned()
            .map(PermitAttempt::Full))
    }

    /// The first live permit, own or another's, taken with a limit other than `limit`.
    fn conflict(&self, limit: u32) -> Result<Option<u32>, Error> {
        for row in self.own.iter().chain(&self.others) {
            let held = row.limit()?;
            if held != limit {
                return Ok(Some(held));
            }
        }
        Ok(None)
    }

    /// After a commit that deleted the dead holders' rows: their files are removed (and
    /// only then unlocked). Otherwise [`Drop`] only unlocks them.
    fn committed(mut self) {
        for (_, file) in self.dead.drain(..) {
            drop(file);
        }
    }
}

impl Drop for Seen<'_> {
    /// Without a commit (refused, failed, or cancelled) the rows still name the dead
    /// holders' files: they are only unlocked, so the next contender can prove the deaths.
    fn drop(&mut self) {
        for (_, file) in self.dead.drain(..) {
            file.unlock_only();
        }
    }
}

impl Client {
    /// One attempt at a permit of `claim.name` among `limit`, in one write transaction:
    /// permits of another boot or past their expiry do not count (and are deleted with a
    /// grant); when the semaphore is full, or another live permit has another limit, the
    /// holders of the other permits are probed (`holders`) and those proven dead do not
    /// count either (and are deleted with a grant). Committed, synced, only on a grant.
    pub(crate) async fn acquire_permit(
        &self,
        claim: &Claim<'_>,
        limit: u32,
        holders: &HolderDir,
    ) -> Result<PermitAttempt, Error> {
        let mut tx = self
            .pool()
            .begin_with("BEGIN IMMEDIATE")
            .await
            .map_err(map_error)?;
        let rows = sqlx::query(ROWS)
            .bind(claim.name)
            .fetch_all(&mut *tx)
            .await
            .map_err(map_error)?;
        let rows = rows.iter().map(decode).collect::<Result<Vec<_>, _>>()?;
        let mut seen = Seen::new(rows, claim);
        if let Some(refused) = seen.decide(limit, holders)? {
            // Nothing was written.
            tx.rollback().await.map_err(map_error)?;
            return Ok(refused);
        }
        let token = self.grant_permit(&mut tx, claim, limit, &seen).await?;
        tx.commit().await.map_err(map_error)?;
        seen.committed();
        Ok(PermitAttempt::Granted(token))
    }

    /// The grant's writes, in the attempt's transaction: stale and dead permits deleted,
    /// the counter advanced, the claimant's row written.
    async fn grant_permit(
        &self,
        tx: &mut sqlx::SqliteConnection,
        claim: &Claim<'_>,
        limit: u32,
        seen: &Seen<'_>,
    ) -> Result<i64, Error> {
        if seen.stale {
            sqlx::query(DROP_STALE)
                .bind(claim.name)
                .bind(claim.boot_id)
                .bind(claim.now_ms)
                .bind(claim.wall_ms)
                .execute(&mut *tx)
                .await
                .map_err(map_error)?;
        }
        for (row, _) in &seen.dead {
            sqlx::query(DELETE_GRANT)
                .bind(claim.name)
                .bind(&row.owner)
                .bind(row.token)
                .execute(&mut *tx)
                .await
                .map_err(map_error)?;
        }
        let token: i64 = sqlx::query_scalar(NEXT_TOKEN)
            .bind(claim.name)
            .fetch_one(&mut *tx)
            .await
            .map_err(map_error)?;
        sqlx::query(UPSERT)
            .bind(claim.name)
            .bind(claim.owner)
            .bind(i64::from(limit))
            .bind(token)
            .bind(claim.boot_id)
            .bind(claim.liveness)
            .bind(claim.wall_ms)
            .bind(claim.expires_ms())
            .bind(claim.note)
            .bind(claim.expires_wall_ms())
            .execute(&mut *tx)
            .await
            .map_err(map_error)?;
        Ok(token)
    }

    /// The live permits of `name` at `now`, earliest grant first.
    pub(crate) async fn live_permits(
        &self,
        name: &str,
        now: &Now<'_>,
    ) -> Result<Vec<PermitRow>, Error> {
        let rows = sqlx::query(ROWS)
            .bind(name)
            .fetch_all(self.pool())
            .await
            .map_err(map_error)?;
        let mut live = Vec::with_capacity(rows.len());
        for row in &rows {
            let row = decode(row)?;
            if row.is_live(now) {
                live.push(row);
            }
        }
        Ok(live)
    }

    /// Extends our live permit `token`; `false` when it is not ours any more.
    pub(crate) async fn extend_permit(&self, claim: &Claim<'_>, token: i64) -> Result<bool, Error> {
        let row = sqlx::query(EXTEND)
            .bind(claim.name)
            .bind(claim.owner)
            .bind(token)
            .bind(claim.boot_id)
            .bind(claim.expires_ms())
            .bind(claim.now_ms)
            .bind(claim.expires_wall_ms())
            .fetch_optional(self.pool())
            .await
            .map_err(map_error)?;
        Ok(row.is_some())
    }

    /// Forgets the liveness file of our live permit `token`; `true` when it was live.
    pub(crate) async fn detach_permit(&self, claim: &Claim<'_>, token: i64) -> Result<bool, Error> {
        let row = sqlx::query(DETACH)
            .bind(claim.name)
            .bind(claim.owner)
            .bind(token)
            .bind(claim.boot_id)
            .bind(claim.now_ms)
            .fetch_optional(self.pool())
            .await
            .map_err(map_error)?;
        Ok(row.is_some())
    }

    /// Deletes the permit if it is still exactly this grant; `true` when it was. Committed
    /// without a sync of its own, as a lock's release (`Client::unsynced`).
    pub(crate) async fn delete_permit(
        &self,
        name: &str,
        owner: &str,
        token: i64,
    ) -> Result<bool, Error> {
        let done = sqlx::query(DELETE_GRANT)
            .bind(name)
            .bind(owner)
            .bind(token)
            .execute(self.unsynced())
            .await
            .map_err(map_error)?;
        Ok(done.rows_affected() > 0)
    }
}

fn decode(row: &SqliteRow) -> Result<PermitRow, Error> {
    Ok(PermitRow {
        owner: row.try_get("owner").map_err(map_error)?,
        permits: row.try_get("permits").map_err(map_error)?,
        token: row.try_get("token").map_err(map_error)?,
        boot_id: row.try_get("boot_id").map_err(map_error)?,
        liveness: row.try_get("liveness").map_err(map_error)?,
        acquired_ms: row.try_get("acquired_ms").map_err(map_error)?,
        expires_ms: row.try_get("expires_ms").map_err(map_error)?,
        note: row.try_get("note").map_err(map_error)?,
        expires_wall_ms: row.try_get("expires_wall_ms").map_err(map_error)?,
    })
}
