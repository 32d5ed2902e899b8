//! Semaphore permits: acquire (one transaction of two statements), inspect and release
//! (one statement each). Refresh is in [`crate::refresh`], with the locks'; the SQL and
//! why the acquire needs a transaction are in [`crate::permit_sql`].

use lockcore::{
    Acquire, AcquireRequest, Error, ErrorKind, FenceToken, HolderInfo, Lease, LockName, Note,
    Result, limit_conflict,
};
use sqlx::Row;
use sqlx::postgres::PgRow;

use crate::client::Client;
use crate::error::Effect;
use crate::holder::holder;

/// What the deciding statement answered.
enum Decision {
    /// Our new grant, as a holder.
    Granted(HolderInfo),
    /// A live permit was taken with this other limit; nothing was granted.
    Conflict(u32),
    /// Full: the holder that ends first (live, or expired with its row still locked).
    Held(HolderInfo),
    /// Our own row (an older grant of this owner) is locked by another transaction (a
    /// fenced one still open on it): not replaced, nothing written.
    Busy(HolderInfo),
    /// An answer that makes no sense (a row written by hand): why.
    Bad(String),
}

impl Decision {
    fn from_row(row: &PgRow) -> Result<Self, sqlx::Error> {
        let outcome: String = row.try_get("outcome")?;
        match outcome.as_str() {
            "granted" => holder(row).map(Self::Granted),
            "held" => holder(row).map(Self::Held),
            "busy" => holder(row).map(Self::Busy),
            "conflict" => {
                let held: Option<i32> = row.try_get("held_permits")?;
                Ok(match held.and_then(|held| u32::try_from(held).ok()) {
                    Some(held) => Self::Conflict(held),
                    None => Self::Bad(format!(
                        "a live permit of this semaphore records a limit of {} permits, \
                         which is no limit (a row written by hand?)",
                        held.map_or_else(|| "NULL".to_owned(), |held| held.to_string())
                    )),
                })
            }
            other => Ok(Self::Bad(format!(
                "the permit acquire answered {:?}, not granted, held, busy or conflict",
                other.escape_debug().to_string()
            ))),
        }
    }
}

/// One attempt at a permit of `request.name` (see
/// [`LockBackend::acquire_permit`](lockcore::LockBackend::acquire_permit)): `BEGIN`, the
/// semaphore's advisory lock, the deciding statement, `COMMIT`.
pub(crate) async fn acquire(c: &Client, request: &AcquireRequest) -> Result<Acquire> {
    let Some(limit) = request.permits else {
        return Err(Error::invalid_input(
            "a permit request without a number of permits",
        ));
    };
    let asked = i32::try_from(limit.get())
        .map_err(|_| Error::invalid_input(format!("{limit} permits are too many")))?;
    let name = request.name.as_str();
    let decision = c
        .run_tx(Effect::Write, async |conn| {
            c.query(&c.permits.serialize)
                .bind(name)
                .execute(&mut *conn)
                .await?;
            let row = c
                .query(&c.permits.acquire)
                .bind(name)
                .bind(request.owner.as_str())
                .bind(asked)
                .bind(request.ttl.as_micros())
                .bind(request.note.as_ref().map(Note::as_str))
                .fetch_optional(&mut *conn)
                .await?;
            match row {
                Some(row) => Decision::from_row(&row),
                None => Err(sqlx::Error::Protocol(
                    "the permit acquire returned no outcome".to_owned(),
                )),
            }
        })
        .await
        .map_err(|e| explain_missing(e, c))?;
    match decision {
        Decision::Granted(granted) => {
            let token = granted.token().unwrap_or(FenceToken::new(0));
            let lease = Lease::new(
                request.name.clone(),
                request.owner.clone(),
                request.ttl,
                token.to_string(),
            );
            Ok(Acquire::Acquired(
                lease.with_token(token).with_permits(limit),
            ))
        }
        Decision::Held(first) => Ok(Acquire::Held(first)),
        Decision::Busy(old) => Err(Error::new(
            ErrorKind::Unavailable,
            format!(
                "this owner's previous permit (token {}) is locked by another transaction \
                 (a fenced transaction still open on it, or an operator's): it is not \
                 replaced while that transaction runs; nothing was written, try again",
                old.token().map_or(0, FenceToken::get)
            ),
        )),
        Decision::Conflict(held) => Err(limit_conflict(name, held, limit.get())),
        Decision::Bad(why) => Err(Error::new(ErrorKind::Protocol, why)),
    }
}

/// The live permits of `name`, earliest grant first: one statement.
pub(crate) async fn holders(c: &Client, name: &LockName) -> Result<Vec<HolderInfo>> {
    c.run(Effect::Read, async |conn| {
        let rows = c
            .query(&c.permits.holders)
            .bind(name.as_str())
            .fetch_all(conn)
            .await?;
        rows.iter().map(holder).collect()
    })
    .await
    .map_err(|e| explain_missing(e, c))
}

/// Deletes exactly the grant `token` of `lease` and notifies `channel` when it did: one
/// statement. A grant already gone is `Ok`.
pub(crate) async fn release(c: &Client, lease: &Lease, token: i64, channel: &str) -> Result<()> {
    c.run(Effect::Write, async |conn| {
        c.query(&c.permits.release)
            .bind(lease.name().as_str())
            .bind(lease.owner().as_str())
            .bind(token)
            .bind(channel)
            .execute(conn)
            .await
    })
    .await
    .map(drop)
}

/// The error for a permit statement that found no permits table: semaphores were added
/// after the lock table, and this role could not create their objects.
fn explain_missing(err: Error, c: &Client) -> Error {
    if err.kind() != ErrorKind::Config {
        return err;
    }
    let table = &c.names.permits;
    let message = format!(
        "{err}; the semaphore permits table {table} (or its sequence) is missing: connect \
         once with create_schema and a role that may create it, or create it as \
         docs/postgres.md (Semaphores) shows"
    );
    Error::new(ErrorKind::Config, message).with_source(err)
}
