//! The one place Redis client errors become lockcore errors: [`Call`] (which server
//! operation failed) and the table from [`RedisError`] to [`ErrorKind`], retry status and
//! message. Messages name the call and the (redacted) node; the backend and the lock are
//! filled in by lockcore's `Locker` (`Error::in_context`).

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use lockcore::{Error, ErrorKind};
use redis::RedisError;

use crate::limits::refusal_in;

/// Which call failed; decides whether a lost reply leaves the outcome unknown.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Call {
    Ping,
    Time,
    Config,
    Acquire,
    Refresh,
    Release,
    Inspect,
    List,
    Break,
    Subscribe,
    Unsubscribe,
}

impl Call {
    /// Whether the call writes: a timeout or dropped connection may have applied it.
    pub(crate) fn writes(self) -> bool {
        matches!(
            self,
            Self::Acquire | Self::Refresh | Self::Release | Self::Break
        )
    }
}

impl fmt::Display for Call {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Ping => "ping",
            Self::Time => "server time",
            Self::Config => "memory settings check",
            Self::Acquire => "acquire",
            Self::Refresh => "refresh",
            Self::Release => "release",
            Self::Inspect => "inspect",
            Self::List => "list",
            Self::Break => "break",
            Self::Subscribe => "subscribe",
            Self::Unsubscribe => "unsubscribe",
        })
    }
}

/// The error kind for a Redis client error: the one mapping table of this crate.
///
/// The retry status follows from the kind: `Unavailable` and `OutcomeUnknown` are
/// temporary, everything else permanent.
fn classify(err: &RedisError, call: Call) -> ErrorKind {
    use redis::ErrorKind as K;
    use redis::ServerErrorKind as S;
    if refused_inside_a_script(err) {
        return ErrorKind::PermissionDenied;
    }
    match err.kind() {
        K::AuthenticationFailed | K::Server(S::NoPerm) => ErrorKind::PermissionDenied,
        K::InvalidClientConfig | K::RESP3NotSupported | K::Client => ErrorKind::Config,
        // A Redis Cluster answered: point the URL at one node (or use the hash-tagged keys
        // with a cluster-aware proxy).
        K::Server(S::Moved | S::Ask | S::CrossSlot) => ErrorKind::Config,
        K::Server(S::BusyLoading | S::TryAgain | S::ClusterDown | S::MasterDown | S::ReadOnly) => {
            ErrorKind::Unavailable
        }
        // Flushed again between SCRIPT LOAD and EVALSHA: the next attempt reloads.
        K::Server(S::NoScript) => ErrorKind::Unavailable,
        K::Io if err.is_connection_refusal() => ErrorKind::Unavailable,
        K::Io if call.writes() => ErrorKind::OutcomeUnknown,
        K::Io => ErrorKind::Unavailable,
        K::Extension => match err.code() {
            Some("NOAUTH" | "WRONGPASS" | "NOPERM") => ErrorKind::PermissionDenied,
            Some("OOM" | "BUSY" | "LOADING" | "MASTERDOWN") => ErrorKind::Unavailable,
            _ => ErrorKind::Protocol,
        },
        _ => ErrorKind::Protocol,
    }
}

/// Maps a Redis client error to a lockcore error naming the call and the (redacted) node.
///
/// A connection cut because a reply broke a limit ([`crate::limits`]) is a
/// [`Protocol`](ErrorKind::Protocol) error naming the limit, for the call whose reply it
/// was and for every call that was waiting on the same connection.
/// A TLS failure anywhere in the error's source chain (the `redis` crate keeps rustls's
/// error inside its I/O error) is worded by [`anylock_tls::diagnose`]; rejected credentials
/// and ACL refusals name the user and the fix. None of these contain the password: the
/// node label is redacted and Redis never echoes it.
pub(crate) fn map_error(err: &RedisError, call: Call, node: &str) -> Error {
    if let Some(refused) = refusal_in(err) {
        let message = format!("{call} on {node}: {refused}");
        return Error::new(ErrorKind::Protocol, message).with_source(err.clone());
    }
    let (kind, message) = match tls_failure(err) {
        Some(tls) => (tls.kind(), format!("{call} on {node}: {}", tls.message())),
        None => (classify(err, call), explain(err, call, node)),
    };
    Error::new(kind, message).with_source(err.clone())
}

/// A TLS failure in `err`, worded by [`anylock_tls::diagnose`]. The `redis` crate keeps
/// the I/O error that carries rustls's error behind an `Arc<dyn Error>`, whose `source()`
/// skips the I/O error itself, so the chain is looked through that `Arc` too.
fn tls_failure(err: &RedisError) -> Option<Error> {
    if let Some(found) = anylock_tls::diagnose(err) {
        return Some(found);
    }
    let shared = std::error::Error::source(err)?
        .downcast_ref::<Arc<dyn std::error::Error + Send + Sync>>()?;
    let inner: &(dyn std::error::Error + 'static) = &**shared;
    anylock_tls::diagnose(inner)
}

/// The message for a client error: what the server refused and what to do about it.
fn explain(err: &RedisError, call: Call, node: &str) -> String {
    let user = || user_of(node);
    match refusal_of(err) {
        Some(Refusal::Credentials) => format!(
            "{call} on {node}: authentication failed for user \"{}\": the server refused the \
             user name and password ({err}); check both in the URL (a wrong password, an \
             unknown or disabled ACL user, or `requirepass` set with no password given)",
            user()
        ),
        Some(Refusal::Acl) => format!(
            "{call} on {node}: the ACL permission is missing: user \"{}\" may not run this \
             ({err}); grant the commands, keys and channels anylock uses (the least-privilege \
             `ACL SETUSER` recipe in docs/tls-and-auth.md, section \"Redis and Redlock\")",
            user()
        ),
        None => format!("{call} on {node}: {err}"),
    }
}

/// What kind of refusal a server error is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Refusal {
    /// `WRONGPASS`, `NOAUTH`, or the client's own authentication failure.
    Credentials,
    /// `NOPERM`: the ACL user lacks a command, key or channel.
    Acl,
}

/// The refusal a client error is, if it is one.
pub(crate) fn refusal_of(err: &RedisError) -> Option<Refusal> {
    use redis::ErrorKind as K;
    match (err.kind(), err.code()) {
        (K::AuthenticationFailed, _) | (_, Some("WRONGPASS" | "NOAUTH")) => {
            Some(Refusal::Credentials)
        }
        (K::Server(redis::ServerErrorKind::NoPerm), _) | (_, Some("NOPERM")) => Some(Refusal::Acl),
        _ if refused_inside_a_script(err) => Some(Refusal::Acl),
        _ => None,
    }
}

/// Whether the ACL refused a command a script called: Redis answers that with a plain
/// `ERR` ("The user executing the script can't run this command or subcommand"), not
/// `NOPERM`, so the code alone does not tell (a user of an older least-privilege recipe
/// that lacks a command a newer script uses).
fn refused_inside_a_script(err: &RedisError) -> bool {
    err.kind() == redis::ErrorKind::Server(redis::ServerErrorKind::ResponseError)
        && err
            .detail()
            .is_some_and(|d| d.contains("can't run this command or subcommand"))
}

/// The ACL user named in a (redacted) node URL; `default` without one.
fn user_of(node: &str) -> String {
    let user = url::Url::parse(node)
        .ok()
        .map(|url| url.username().to_owned())
        .unwrap_or_default();
    match user.as_str() {
        "" => "default".to_owned(),
        _ => lockcore::url::percent_decode(&user, "user name").unwrap_or(user),
    }
}

/// The error for a call that got no reply in time.
pub(crate) fn timed_out(call: Call, node: &str, limit: Duration) -> Error {
    let kind = if call.writes() {
        ErrorKind::OutcomeUnknown
    } else {
        ErrorKind::Unavailable
    };
    Error::new(kind, format!("{call} on {node}: no reply within {limit:?}"))
}

/// The error for a reply of the wrong shape.
pub(crate) fn malformed(call: Call, node: &str) -> Error {
    Error::new(
        ErrorKind::Protocol,
        format!("{call} on {node}: unexpected script reply"),
    )
}

/// The error for a node URL the `redis` client refuses to build a client from: its
/// category only (the client's message may quote the URL, password included).
pub(crate) fn bad_client_url(err: &RedisError, node: &str) -> Error {
    Error::invalid_input(format!("{node}: {}", err.category()))
}

/// Whether the server answered the command with an error reply (rather than the
/// connection failing).
pub(crate) fn is_refusal(err: &RedisError) -> bool {
    matches!(
        err.kind(),
        redis::ErrorKind::Server(_) | redis::ErrorKind::Extension
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn io(kind: std::io::ErrorKind) -> RedisError {
        RedisError::from(std::io::Error::from(kind))
    }

    #[test]
    fn lost_replies_of_writes_are_outcome_unknown() {
        let reset = io(std::io::ErrorKind::ConnectionReset);
        assert_eq!(classify(&reset, Call::Acquire), ErrorKind::OutcomeUnknown);
        assert_eq!(classify(&reset, Call::Release), ErrorKind::OutcomeUnknown);
        assert_eq!(classify(&reset, Call::Inspect), ErrorKind::Unavailable);
        let refused = io(std::io::ErrorKind::ConnectionRefused);
        assert_eq!(classify(&refused, Call::Acquire), ErrorKind::Unavailable);
        let late = timed_out(Call::Refresh, "redis://h:1", Duration::from_millis(5));
        assert_eq!(late.kind(), ErrorKind::OutcomeUnknown);
        assert!(late.is_temporary());
        let late = timed_out(Call::Ping, "redis://h:1", Duration::from_millis(5));
        assert_eq!(late.kind(), ErrorKind::Unavailable);
    }

    #[test]
    fn server_errors_map_to_kinds() {
        let cases = [
            (
                redis::ErrorKind::AuthenticationFailed,
                ErrorKind::PermissionDenied,
            ),
            (redis::ErrorKind::InvalidClientConfig, ErrorKind::Config),
            (redis::ErrorKind::Parse, ErrorKind::Protocol),
            (
                redis::ErrorKind::Server(redis::ServerErrorKind::BusyLoading),
                ErrorKind::Unavailable,
            ),
            (
                redis::ErrorKind::Server(redis::ServerErrorKind::Moved),
                ErrorKind::Config,
            ),
            (
                redis::ErrorKind::Server(redis::ServerErrorKind::ResponseError),
                ErrorKind::Protocol,
            ),
        ];
        for (redis_kind, expected) in cases {
            let err = RedisError::from((redis_kind, "test"));
            assert_eq!(classify(&err, Call::Acquire), expected, "{redis_kind:?}");
        }
        let err = map_error(
            &RedisError::from((redis::ErrorKind::AuthenticationFailed, "nope")),
            Call::Ping,
            "redis://u:***@h:1",
        );
        assert_eq!(err.kind(), ErrorKind::PermissionDenied);
        assert!(!err.is_temporary());
    }

    /// Rejected credentials and ACL refusals name the user (percent-decoded) and the fix,
    /// never the password (the label is redacted).
    #[test]
    fn refusals_name_the_user_and_the_fix() {
        let label = "rediss://app%40team:***@h:1/0";
        let auth = RedisError::from((redis::ErrorKind::AuthenticationFailed, "nope"));
        let err = map_error(&auth, Call::Ping, label);
        assert_eq!(err.kind(), ErrorKind::PermissionDenied);
        assert!(
            err.message()
                .contains("authentication failed for user \"app@team\""),
            "{err}"
        );
        let noperm = RedisError::from((
            redis::ErrorKind::Server(redis::ServerErrorKind::NoPerm),
            "no permissions to run the 'evalsha' command",
        ));
        let err = map_error(&noperm, Call::Acquire, "redis://h:1");
        assert_eq!(err.kind(), ErrorKind::PermissionDenied);
        assert!(err.message().contains("user \"default\""), "{err}");
        assert!(err.message().contains("ACL SETUSER"), "{err}");
        let in_script = RedisError::from((
            redis::ErrorKind::Server(redis::ServerErrorKind::ResponseError),
            "ResponseError",
            "The user executing the script can't run this command or subcommand script: \
             d3e1, on @user_script:14."
                .to_owned(),
        ));
        let err = map_error(&in_script, Call::Acquire, "redis://h:1");
        assert_eq!(err.kind(), ErrorKind::PermissionDenied, "{err}");
        assert!(err.message().contains("ACL SETUSER"), "{err}");
        let other = RedisError::from((
            redis::ErrorKind::Server(redis::ServerErrorKind::ResponseError),
            "ResponseError",
            "WRONGTYPE Operation against a key holding the wrong kind of value".to_owned(),
        ));
        assert_eq!(classify(&other, Call::Acquire), ErrorKind::Protocol);
    }
}
