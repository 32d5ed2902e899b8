//! Errors: which etcd call failed ([`Op`]) and THE mapping from etcd's (and the gRPC
//! channel's) failures to lockcore errors, including etcd's authentication and RBAC
//! refusals worded for a person and TLS handshake failures. Backend and lock name are
//! left out: lockcore's `Locker` and guard driver fill them in.

use std::time::Duration;

use lockcore::{Error, ErrorKind};
use tonic::Code;

use crate::grpc::RpcError;

/// The RPC a failure happened in: its name for messages, and whether it writes (a write
/// that times out may still have been applied).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Op {
    LeaseGrant,
    CreateIfFree,
    Retake,
    Enqueue,
    Claim,
    LeaseRevoke,
    Release,
    Detach,
    Delete,
    KeepAlive,
    CheckKeys,
    Get,
    List,
    LeaseTimeToLive,
    Watch,
    Authenticate,
    Slots,
    TakeSlot,
    RetakeSlot,
}

impl Op {
    pub(crate) fn name(self) -> &'static str {
        match self {
            Self::LeaseGrant => "LeaseGrant",
            Self::CreateIfFree => "Txn (create if free)",
            Self::Retake => "Txn (same-owner retake)",
            Self::Enqueue => "Txn (join the queue)",
            Self::Claim => "Txn (claim a queue place)",
            Self::LeaseRevoke => "LeaseRevoke",
            Self::Release => "Txn (delete our key)",
            Self::Detach => "Txn (move our key to a lease of its own)",
            Self::Delete => "DeleteRange",
            Self::KeepAlive => "LeaseKeepAlive",
            Self::CheckKeys => "Txn (check our keys)",
            Self::Get => "Range",
            Self::List => "Range (list)",
            Self::LeaseTimeToLive => "LeaseTimeToLive",
            Self::Watch => "Watch",
            Self::Authenticate => "Authenticate",
            Self::Slots => "Range (semaphore slots)",
            Self::TakeSlot => "Txn (take a semaphore slot)",
            Self::RetakeSlot => "Txn (retake our semaphore slot)",
        }
    }

    fn writes(self) -> bool {
        matches!(
            self,
            Self::LeaseGrant
                | Self::CreateIfFree
                | Self::Retake
                | Self::Enqueue
                | Self::Claim
                | Self::LeaseRevoke
                | Self::Release
                | Self::Detach
                | Self::Delete
                | Self::TakeSlot
                | Self::RetakeSlot
        )
    }
}

/// Why an RPC failed: etcd's (or the channel's) error, or our own request timeout.
#[derive(Debug)]
pub(crate) enum Failure {
    Etcd(RpcError),
    TimedOut(Duration),
}

/// Maps a failed RPC to a lockcore error: THE place where etcd errors get their kind.
///
/// | etcd / gRPC | kind |
/// |---|---|
/// | Unavailable, DeadlineExceeded, Cancelled, Aborted, Unknown, Internal, our timeout, I/O | `OutcomeUnknown` for writes, `Unavailable` for reads |
/// | transport error (no connection), ResourceExhausted | `Unavailable` |
/// | PermissionDenied, Unauthenticated | `PermissionDenied` |
/// | InvalidArgument, OutOfRange | `InvalidInput` |
/// | NotFound, keep-alive "lease not found" | `Lost` (callers turn it into `Ok` where gone is fine) |
/// | FailedPrecondition, bad endpoint/URI/metadata | `Config` |
/// | Unimplemented | `Unsupported` |
/// | DataLoss, malformed reply | `Protocol` |
pub(crate) fn map_error(op: Op, failure: Failure) -> Error {
    let uncertain = if op.writes() {
        ErrorKind::OutcomeUnknown
    } else {
        ErrorKind::Unavailable
    };
    let (kind, detail) = match &failure {
        Failure::TimedOut(limit) => (uncertain, format!("no reply within {limit:?}")),
        Failure::Etcd(err) => (etcd_kind(err, uncertain), err.to_string()),
    };
    let error = Error::new(kind, format!("{}: {detail}", op.name()));
    match failure {
        Failure::Etcd(err) => error.with_source(err),
        Failure::TimedOut(_) => error,
    }
}

/// As [`map_error`], with etcd's authentication and RBAC refusals worded for a person:
/// `user` is who we are to etcd, `prefix` the key prefix the locks live under.
pub(crate) fn map_error_for(op: Op, failure: Failure, user: &str, prefix: &str) -> Error {
    if let Failure::Etcd(err) = &failure
        && let Some(refusal) = refusal(err)
    {
        let message = explain(refusal, op.name(), user, prefix);
        return Error::new(ErrorKind::PermissionDenied, message);
    }
    map_error(op, failure)
}

fn etcd_kind(err: &RpcError, uncertain: ErrorKind) -> ErrorKind {
    use RpcError as E;
    match err {
        E::Status(status) => match status.code() {
            Code::Unavailable
            | Code::DeadlineExceeded
            | Code::Cancelled
            | Code::Aborted
            | Code::Unknown
            | Code::Internal => uncertain,
            Code::ResourceExhausted => ErrorKind::Unavailable,
            Code::PermissionDenied | Code::Unauthenticated => ErrorKind::PermissionDenied,
            Code::InvalidArgument | Code::OutOfRange | Code::AlreadyExists => {
                ErrorKind::InvalidInput
            }
            Code::NotFound => ErrorKind::Lost,
            Code::FailedPrecondition => ErrorKind::Config,
            Code::Unimplemented => ErrorKind::Unsupported,
            Code::DataLoss | Code::Ok => ErrorKind::Protocol,
        },
        E::LeaseKeepAlive(msg) if msg.contains("not found") => ErrorKind::Lost,
        E::Transport(_) => ErrorKind::Unavailable,
        E::LeaseKeepAlive(_) | E::Watch(_) | E::Internal(_) => uncertain,
        E::InvalidUri(_) | E::InvalidMetadataValue(_) => ErrorKind::Config,
    }
}

/// A reply that does not have the shape etcd's API promises.
pub(crate) fn malformed(op: Op, what: &str) -> Error {
    Error::new(ErrorKind::Protocol, format!("{}: {what}", op.name()))
}

/// What the server said no to, recognised in an etcd client error.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Refusal {
    /// Wrong user name or password (etcd answers both with one message).
    BadCredentials,
    /// Authentication is on and we sent no credentials (and no client certificate).
    NoCredentials,
    /// The user lacks an RBAC permission on the keys.
    NoPermission,
}

/// Recognises etcd's authentication and RBAC refusals by their gRPC status message (etcd
/// sends the same code, InvalidArgument, for a wrong password as for a malformed request).
pub(crate) fn refusal(err: &RpcError) -> Option<Refusal> {
    let RpcError::Status(status) = err else {
        return None;
    };
    let message = status.message();
    if message.contains("authentication failed") {
        Some(Refusal::BadCredentials)
    } else if message.contains("user name is empty") {
        Some(Refusal::NoCredentials)
    } else if message.contains("permission denied") {
        Some(Refusal::NoPermission)
    } else {
        None
    }
}

/// The message for `refusal` of `user` in `op`: what etcd refused and how to fix it.
/// Never holds a password.
pub(crate) fn explain(refusal: Refusal, op: &str, user: &str, prefix: &str) -> String {
    match refusal {
        Refusal::BadCredentials => format!(
            "{op}: etcd refused user `{user}`: authentication failed (wrong user name or \
             password)"
        ),
        Refusal::NoCredentials => format!(
            "{op}: etcd has authentication enabled and we sent no user: put \
             `user:password@` in the URL, or present a client certificate (URL parameters \
             `cert` and `key`) whose common name is an etcd user"
        ),
        Refusal::NoPermission => {
            let range = if prefix.is_empty() {
                "--from-key ''".to_owned()
            } else {
                format!("--prefix=true '{prefix}'")
            };
            format!(
                "{op}: etcd denied user `{user}` access to the lock keys under `{prefix}` \
                 (RBAC: the user needs a role with readwrite on that key prefix); fix: \
                 `etcdctl role add anylock-locks && etcdctl role grant-permission \
                 anylock-locks readwrite {range} && etcdctl user grant-role {user} \
                 anylock-locks`"
            )
        }
    }
}

/// A failed TLS connection to `host_port`, worded by [`anylock_tls::diagnose`].
/// `presented`: whether we sent a client certificate. Servers built with older Go answer a
/// missing one with the same alert as a bad one, so without one the message says so.
pub(crate) fn tls_failure(host_port: &str, presented: bool, e: std::io::Error) -> Error {
    match anylock_tls::diagnose(&e) {
        Some(explained) => {
            let mut what = explained.message().to_owned();
            if !presented && what.contains("client certificate") {
                what = "TLS handshake failed: the server requires a client certificate and \
                        we sent none (URL parameters `cert` and `key`)"
                    .to_owned();
            }
            let message = format!("etcd at {host_port}: {what}");
            Error::new(explained.kind(), message).with_source(e)
        }
        None => Error::unavailable(format!("TLS connection to etcd at {host_port} failed: {e}"))
            .with_source(e),
    }
}
