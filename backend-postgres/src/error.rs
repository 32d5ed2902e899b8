//! The one place where errors become lockcore errors: every sqlx error (database,
//! connection, TLS, pool) gets its kind, retry status and message here, with the
//! authentication and privilege wording of [`crate::denied`]. The backend and lock name
//! are added by lockcore's `Locker`, not here.

use std::borrow::Cow;
use std::time::Duration;

use lockcore::{Error, ErrorKind, RetryStatus};

use crate::denied::{self, Who};
use crate::tls::TlsSetup;

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

/// [`ErrorKind::InvalidInput`] with `message`: a bad URL, parameter or setting.
pub(crate) fn invalid(message: impl Into<Cow<'static, str>>) -> Error {
    Error::invalid_input(message)
}

/// [`ErrorKind::Config`] with `message`.
pub(crate) fn config_error(message: impl Into<Cow<'static, str>>) -> Error {
    Error::new(ErrorKind::Config, message)
}

/// Maps an error from your own statements the way the backend maps its own: serialization
/// failures and lost connections are temporary, missing privileges permanent, and a
/// connection lost after a write was sent is [`ErrorKind::OutcomeUnknown`].
pub fn error_from_sqlx(err: sqlx::Error) -> Error {
    map_error(err, Effect::Write)
}

/// A failed first connection: a refused or unreachable server (I/O, not TLS) is
/// [`ErrorKind::Unavailable`]; anything else is mapped as a read, naming `who`.
pub(crate) fn connect_failed(err: sqlx::Error, who: &Who) -> Error {
    match err {
        sqlx::Error::Io(_) if tls_failure(&err, None).is_none() => {
            Error::unavailable("cannot connect to the PostgreSQL server").with_source(err)
        }
        err => map_error_as(err, Effect::Read, Some(who)),
    }
}

/// No answer within `limit` while `phase` ran: for a write, the outcome is unknown.
pub(crate) fn timed_out(effect: Effect, limit: Duration, phase: &str) -> Error {
    let kind = match effect {
        Effect::Read => ErrorKind::Unavailable,
        Effect::Write => ErrorKind::OutcomeUnknown,
    };
    Error::new(kind, format!("no answer within {limit:?} ({phase})"))
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
    if let Some(tls) = tls_failure(&err, who.map(|w| &w.tls)) {
        // A TLS error worth another attempt, after a write went out: its outcome is unknown.
        if tls.kind() == ErrorKind::Unavailable && matches!(effect, Effect::Write) {
            let unknown = Error::new(ErrorKind::OutcomeUnknown, tls.message().to_owned());
            return unknown.with_source(err);
        }
        return tls.with_source(err);
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

/// A TLS failure in a sqlx error, worded by [`anylock_tls::diagnose`] (a refusal is
/// [`ErrorKind::PermissionDenied`], with what to do under `setup` when known; a garbled
/// record is temporary); `None` when `err` is not about TLS.
///
/// sqlx reports a failed handshake as `Error::Io` wrapping the `rustls::Error` (rustls'
/// `complete_io` puts it in an `io::Error`). `Error::Io` is `#[error(transparent)]`, whose
/// `source()` skips the `io::Error` itself, so the chain is entered here by hand. sqlx's own
/// TLS errors (`Error::Tls`) that hold no rustls error are worded from their text; a
/// server that answers `N` to the `SSLRequest` is sqlx's "server does not support TLS".
pub(crate) fn tls_failure(err: &sqlx::Error, setup: Option<&TlsSetup>) -> Option<Error> {
    let (diagnosed, declined) = match err {
        sqlx::Error::Io(io) => (anylock_tls::diagnose(io)?, false),
        sqlx::Error::Tls(inner) => match anylock_tls::diagnose(&**inner) {
            Some(diagnosed) => (diagnosed, false),
            None if inner.to_string().contains("does not support TLS") => (
                Error::new(
                    ErrorKind::PermissionDenied,
                    "the server does not offer TLS (it answered N to the SSLRequest)",
                ),
                true,
            ),
            None => (
                Error::new(
                    ErrorKind::PermissionDenied,
                    format!(
                        "TLS setup failed: {inner} (check sslmode and the server's ssl setting)"
                    ),
                ),
                false,
            ),
        },
        _ => return None,
    };
    // The sslmode advice is for a refusal, never for a garbled record.
    let setup = setup.filter(|_| diagnosed.kind() == ErrorKind::PermissionDenied);
    Some(match setup.and_then(|s| s.remedy(declined)) {
        Some(remedy) => Error::new(
            diagnosed.kind(),
            format!("{}; {remedy}", diagnosed.message()),
        )
        .with_status(diagnosed.status()),
        None => diagnosed,
    })
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
        assert_eq!(write.backend(), None, "the Locker names the backend");
        let pool = map_error(sqlx::Error::PoolTimedOut, Effect::Write);
        assert_eq!(pool.kind(), ErrorKind::Unavailable);
        assert!(pool.is_temporary());
    }
}
