//! The one place where sqlx (SQLite) errors become lockcore errors: kind, retry status
//! and message. The backend and lock name are added by lockcore's `Locker`.

use lockcore::{Error, ErrorKind, RetryStatus};

/// Every sqlx error becomes a lockcore error here, and nowhere else.
///
/// | SQLite / sqlx | kind | retry |
/// |---|---|---|
/// | `SQLITE_BUSY`, `SQLITE_LOCKED`, pool timeout, I/O | `Unavailable` | temporary |
/// | `SQLITE_READONLY`, `SQLITE_PERM`, `SQLITE_AUTH` | `PermissionDenied` | permanent |
/// | `SQLITE_CANTOPEN`, `SQLITE_NOTADB` | `Config` | permanent |
/// | anything else (corruption, decode errors) | `Protocol` | permanent |
pub(crate) fn map_error(err: sqlx::Error) -> Error {
    let (kind, status, message) = match &err {
        sqlx::Error::Database(db) => {
            let code = db.code().and_then(|c| c.parse::<i32>().ok()).unwrap_or(0);
            match code & 0xff {
                5 | 6 => (
                    ErrorKind::Unavailable,
                    RetryStatus::Temporary,
                    "the lock database is busy",
                ),
                3 | 8 | 23 => (
                    ErrorKind::PermissionDenied,
                    RetryStatus::Permanent,
                    "no permission to write the lock database",
                ),
                14 | 26 => (
                    ErrorKind::Config,
                    RetryStatus::Permanent,
                    "cannot open the lock database",
                ),
                _ => (
                    ErrorKind::Protocol,
                    RetryStatus::Permanent,
                    "the lock database failed",
                ),
            }
        }
        sqlx::Error::PoolTimedOut | sqlx::Error::Io(_) | sqlx::Error::PoolClosed => (
            ErrorKind::Unavailable,
            RetryStatus::Temporary,
            "the lock database is unavailable",
        ),
        _ => (
            ErrorKind::Protocol,
            RetryStatus::Permanent,
            "unexpected lock database reply",
        ),
    };
    Error::new(kind, message)
        .with_status(status)
        .with_source(err)
}
