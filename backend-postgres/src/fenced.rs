//! Fenced writes: statements that commit only while the lease is still ours.
//!
//! A lease alone cannot stop a paused holder from writing after its lease expired and
//! someone else took over (Kleppmann, "How to do distributed locking"). When the protected
//! data lives in the same PostgreSQL database, the database itself can enforce the fence:
//! [`FencedTx`] is a transaction whose first statement checks that the lease row still
//! holds this exact grant (owner and token) and has not expired, and locks that row until
//! the transaction ends.
//!
//! # Why `FOR KEY SHARE`
//! A takeover assigns a new token, and `token` carries a `UNIQUE` index, so PostgreSQL
//! treats a takeover as a *key* update: it needs the row's `FOR UPDATE` lock, which
//! conflicts with `FOR KEY SHARE`. The takeover (and an operator's `DELETE`) therefore
//! waits until the fenced transaction ends, so every fenced write that commits is ordered
//! before the next holder's grant. A refresh changes only `expires_at`, a non-key update
//! that `FOR KEY SHARE` lets through: the holder keeps refreshing during a long fenced
//! transaction. (`FOR SHARE` would block takeovers too, but also the holder's own
//! refreshes; without the `UNIQUE` index `FOR KEY SHARE` would block nothing that
//! matters.) Acquire attempts on a live lease never lock the row, so waiters keep getting
//! `Held` at once.
//!
//! A permit of a semaphore fences the same way, on its own row in the permits table, but
//! nothing waits for the transaction there (an acquire holds the semaphore's advisory lock
//! and every permit row `FOR SHARE`, so a wait would stall every acquire of the name and
//! every holder's refresh): an acquire skips the locked row (`FOR UPDATE SKIP LOCKED`) and
//! counts its place as held even after the permit expired, so other owners' grants into
//! other places go through at once, a grant that needs this place answers `Held`, and the
//! owner's own retake answers a temporary `Unavailable`, until the transaction ends; then
//! the next grant deletes or replaces the row (`crate::permit_sql`; tested by
//! `an_expired_permit_in_a_fenced_transaction_stalls_no_acquire` and
//! `an_expired_permit_keeps_its_place_while_its_fenced_transaction_runs` in
//! `tests/semaphore.rs`).
//!
//! A client paused *inside* a fenced transaction would hold the row lock and block every
//! takeover; the check therefore sets `idle_in_transaction_session_timeout` for this
//! transaction to the lease's TTL, and the server ends a session that sits idle longer.

use std::ops::{Deref, DerefMut};

use lockcore::{Error, ErrorKind, FenceToken, Lease, LockName, Result};
use sqlx::Transaction;
use sqlx::postgres::{PgConnection, Postgres};
use tokio::time::timeout;

use crate::backend::{PostgresBackend, grant_token};
use crate::error::{BACKEND, Effect, map_error};

/// Also at the crate root; kept here, where it was first published.
pub use crate::error::error_from_sqlx;

/// A transaction in which the lease's row is verified and locked against takeover.
///
/// Run your statements on it (it dereferences to a [`PgConnection`]), then
/// [`commit`](Self::commit). Dropping it without committing rolls back. Keep it short:
/// while it is open, other clients cannot take the lock over even after it expires, and it
/// may not sit idle longer than the lease TTL.
///
/// Created by [`PostgresBackend::begin_fenced`].
pub struct FencedTx {
    tx: Transaction<'static, Postgres>,
    name: LockName,
    token: FenceToken,
    backend: PostgresBackend,
}

impl FencedTx {
    /// The lock this transaction is fenced by.
    pub fn name(&self) -> &LockName {
        &self.name
    }

    /// The fence token the lease row was verified to hold; store it with your rows if
    /// other writers check tokens too.
    pub fn token(&self) -> FenceToken {
        self.token
    }

    /// Commits. The lease row stayed locked since the check, so no takeover happened in
    /// between.
    ///
    /// # Errors
    /// [`ErrorKind::OutcomeUnknown`] when the connection broke or the configured timeout
    /// passed after the `COMMIT` was sent; otherwise the mapped database error (for
    /// example a serialization failure, which is temporary).
    pub async fn commit(self) -> Result<()> {
        let limit = self.backend.timeout();
        let committed = match timeout(limit, self.tx.commit()).await {
            Ok(result) => result.map_err(|e| map_error(e, Effect::Write)),
            Err(_) => Err(Error::new(
                ErrorKind::OutcomeUnknown,
                format!("COMMIT got no answer within {limit:?}"),
            )),
        };
        // Called by the application, not through a Locker: name backend and lock here.
        committed.map_err(|e| e.in_context(BACKEND, &self.name))
    }

    /// Rolls back (dropping the transaction does the same, in the background).
    ///
    /// # Errors
    /// The mapped database or connection error.
    pub async fn rollback(self) -> Result<()> {
        let rolled_back = self.tx.rollback().await;
        rolled_back.map_err(|e| map_error(e, Effect::Read).in_context(BACKEND, &self.name))
    }
}

impl Deref for FencedTx {
    type Target = PgConnection;

    fn deref(&self) -> &PgConnection {
        &self.tx
    }
}

impl DerefMut for FencedTx {
    fn deref_mut(&mut self) -> &mut PgConnection {
        &mut self.tx
    }
}

impl std::fmt::Debug for FencedTx {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FencedTx")
            .field("name", &self.name)
            .field("token", &self.token)
            .finish_non_exhaustive()
    }
}

impl PostgresBackend {
    /// Begins a transaction fenced by `lease`: it verifies that the lease row still holds
    /// this grant and has not expired (on the database clock), and locks the row
    /// `FOR KEY SHARE` until the transaction ends. See the [module docs](crate::fenced).
    ///
    /// ```no_run
    /// # async fn demo(backend: backend_postgres::PostgresBackend, lease: lockcore::Lease)
    /// # -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
    /// let mut tx = backend.begin_fenced(&lease).await?;
    /// sqlx::query("UPDATE accounts SET balance = balance - 10 WHERE id = $1")
    ///     .bind(7_i64)
    ///     .execute(&mut *tx)
    ///     .await?;
    /// tx.commit().await?;
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// - [`ErrorKind::Lost`] when the lease was released, expired or taken over (nothing
    ///   is left open);
    /// - [`ErrorKind::InvalidInput`] for a lease this backend did not issue;
    /// - [`ErrorKind::Unavailable`] (temporary) when the server cannot be reached in time.
    pub async fn begin_fenced(&self, lease: &Lease) -> Result<FencedTx> {
        // Called by the application, not through a Locker: name backend and lock here.
        (self.begin_checked(lease).await).map_err(|e| e.in_context(BACKEND, lease.name()))
    }

    async fn begin_checked(&self, lease: &Lease) -> Result<FencedTx> {
        let token = grant_token(lease)?;
        let limit = self.timeout();
        let begun = timeout(limit, self.check_and_lock(lease, token)).await;
        match begun {
            Ok(Ok(Some(tx))) => Ok(FencedTx {
                tx,
                name: lease.name().clone(),
                token: FenceToken::new(token.unsigned_abs()),
                backend: self.clone(),
            }),
            Ok(Ok(None)) => Err(Error::lost(format!(
                "the lease no longer holds grant {token} (released, expired or taken over); \
                 the fenced transaction was rolled back"
            ))),
            Ok(Err(err)) => Err(map_error(err, Effect::Read)),
            Err(_) => Err(Error::unavailable(format!(
                "the fence check got no answer within {limit:?}"
            ))),
        }
    }

    /// Runs `work` in a [`FencedTx`] and commits if it returns `Ok`, rolls back if it
    /// returns `Err`.
    ///
    /// ```no_run
    /// # async fn demo(backend: backend_postgres::PostgresBackend, lease: lockcore::Lease)
    /// # -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
    /// type BoxError = Box<dyn std::error::Error + Send + Sync>;
    /// let written = backend
    ///     .fenced(&lease, async |conn| -> Result<u64, BoxError> {
    ///         let done = sqlx::query("INSERT INTO reports (day) VALUES (current_date)")
    ///             .execute(conn)
    ///             .await?;
    ///         Ok(done.rows_affected())
    ///     })
    ///     .await?;
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// As [`begin_fenced`](Self::begin_fenced) and [`FencedTx::commit`] (converted into
    /// `E`), or `work`'s own error.
    pub async fn fenced<T, E, F>(&self, lease: &Lease, work: F) -> Result<T, E>
    where
        F: AsyncFnOnce(&mut PgConnection) -> Result<T, E>,
        E: From<Error>,
    {
        let mut tx = self.begin_fenced(lease).await?;
        match work(&mut tx).await {
            Ok(value) => {
                tx.commit().await?;
                Ok(value)
            }
            Err(err) => {
                if let Err(rollback) = tx.rollback().await {
                    tracing::debug!(error = %rollback, "rolling back a fenced transaction failed");
                }
                Err(err)
            }
        }
    }

    /// `BEGIN`, then the fence check; `None` (rolled back) when the grant is gone.
    async fn check_and_lock(
        &self,
        lease: &Lease,
        token: i64,
    ) -> Result<Option<Transaction<'static, Postgres>>, sqlx::Error> {
        let client = self.client();
        let mut tx = client.pool.begin_with(client.begin.clone()).await?;
        // The GUC's maximum is i32::MAX milliseconds (about 24 days).
        let idle_ms = lease
            .ttl()
            .as_millis()
            .clamp(1, i32::MAX.unsigned_abs().into());
        // A permit's grant is its row in the permits table.
        let fence = match lease.permits() {
            Some(_) => &client.permits.fence,
            None => &client.statements.fence,
        };
        let row = client
            .query(fence)
            .bind(lease.name().as_str())
            .bind(lease.owner().as_str())
            .bind(token)
            .bind(format!("{idle_ms}ms"))
            .fetch_optional(&mut *tx)
            .await?;
        if row.is_some() {
            return Ok(Some(tx));
        }
        tx.rollback().await?;
        Ok(None)
    }
}
