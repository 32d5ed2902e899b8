//! Every reply body this crate reads, read with a bound: a faulty or impostor server (a
//! huge `Content-Length`, a chunked body that never ends) costs at most the bound in
//! memory, never what it chooses to send.
//!
//! The bounds, by what the body holds, each generous for what real GCS and Google's token
//! endpoints send (`body::tests` builds the largest replies GCS can send and checks that
//! each fits; the sizes below are its output):
//! - [`OBJECT`], 4 MiB: one object resource (insert, get, patch, delete). Ours are about
//!   1 KB. The largest GCS can send is a PATCH reply (full projection, the default) for a
//!   1,024-byte name of characters its JSON escapes, with 8 KiB of custom metadata and
//!   GCS's most ACL entries (100), each repeating the name: about 1.7 MB.
//! - [`LIST_PAGE`], 128 MiB: an `objects.list` page, 1,000 objects at most
//!   (`projection=noAcl`), each as large as above without ACLs: about 69 MB.
//! - [`BATCH`], 64 MiB (the etcd backend's bound on a reply): a batch reply, 100 PATCH
//!   answers at most. With ACLs as GCS's default object ACL writes them (four entries)
//!   the largest is about 13 MB. A batch whose 100 objects each carry 100 ACL entries (170 MB)
//!   does not fit: refused as [`too_large`], each lease's outcome is unknown, and its next
//!   refresh (a 412, the PATCH having applied) recovers it alone, under [`OBJECT`].
//! - [`TOKEN`], 64 KiB: a token endpoint's reply (STS, IAM credentials, a subject token
//!   URL), error replies included. Access tokens and subject tokens (JWTs) are a few KB.
//! - [`COMMAND_OUTPUT`], 64 KiB: what `GCS_TOKEN_COMMAND` prints on stdout.
//!
//! A body over its bound is refused as soon as that is known: before reading anything
//! when `Content-Length` says so, else at the chunk that passes it. GCS's own error
//! replies (any status the lock logic does not decide on) are never read: the status is
//! the answer.

use lockcore::{Error, ErrorKind};

use crate::error::Call;

/// What a body holds, and the most bytes of it that are read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Limit {
    /// What the body is, for messages and [`crate::REPLY_LIMITS`].
    pub(crate) what: &'static str,
    /// The most bytes read.
    pub(crate) bytes: usize,
}

const MIB: usize = 1024 * 1024;

/// One object resource: the reply to an insert, get, patch or delete.
pub(crate) const OBJECT: Limit = Limit {
    what: "object resource: insert, get, patch and delete replies",
    bytes: 4 * MIB,
};

/// One `objects.list` page (up to 1,000 objects).
pub(crate) const LIST_PAGE: Limit = Limit {
    what: "list page: objects.list, up to 1000 objects",
    bytes: 128 * MIB,
};

/// One batch reply (up to 100 PATCH answers).
pub(crate) const BATCH: Limit = Limit {
    what: "batch reply: up to 100 PATCH answers",
    bytes: 64 * MIB,
};

/// A token endpoint's reply (STS, IAM credentials, a subject token URL), errors included.
pub(crate) const TOKEN: Limit = Limit {
    what: "token endpoint reply: STS, IAM credentials, subject token URL; errors too",
    bytes: 64 * 1024,
};

/// What `GCS_TOKEN_COMMAND` prints on stdout.
pub(crate) const COMMAND_OUTPUT: Limit = Limit {
    what: "GCS_TOKEN_COMMAND output: stdout",
    bytes: 64 * 1024,
};

/// Why a body was not read whole.
#[derive(Debug)]
pub(crate) enum Unread {
    /// It is, or declared itself, larger than the limit.
    TooLarge(Limit),
    /// The connection failed while it was read.
    Transport(reqwest::Error),
}

/// The body of `response`, at most `limit.bytes` of it.
///
/// # Errors
/// [`Unread::TooLarge`] when `Content-Length` declares more than the limit (nothing is
/// read) or the body grows past it (reading stops there); [`Unread::Transport`] when the
/// connection fails.
///
/// # Cancel safety
/// Cancel safe: dropping it drops the response and its connection.
pub(crate) async fn read(mut response: reqwest::Response, limit: Limit) -> Result<Vec<u8>, Unread> {
    let declared = response.content_length();
    if declared.is_some_and(|n| n > limit.bytes as u64) {
        return Err(Unread::TooLarge(limit));
    }
    // Never reserve more than the declared length (or 64 KiB without one) up front.
    let reserve = declared.map_or(64 * 1024, |n| n as usize).min(limit.bytes);
    let mut body = Vec::with_capacity(reserve);
    while let Some(chunk) = response.chunk().await.map_err(Unread::Transport)? {
        if body.len() + chunk.len() > limit.bytes {
            return Err(Unread::TooLarge(limit));
        }
        body.extend_from_slice(&chunk);
    }
    Ok(body)
}

/// A GCS reply over `limit`: for a read, a [`Protocol`](ErrorKind::Protocol) error (real
/// GCS never sends one, so retrying cannot help); for a write, whose change may have been
/// applied before the reply, [`OutcomeUnknown`](ErrorKind::OutcomeUnknown).
pub(crate) fn too_large(limit: Limit, call: Call) -> Error {
    let (kind, after) = match call {
        Call::Read => (ErrorKind::Protocol, ""),
        Call::Write => (
            ErrorKind::OutcomeUnknown,
            "; the write may have been applied",
        ),
    };
    Error::new(
        kind,
        format!(
            "GCS sent a reply larger than the {} backend-gcs reads ({}); it was not \
             read{after} (is the endpoint really GCS?)",
            size(limit.bytes),
            limit.what
        ),
    )
}

/// `4 MiB`, `64 KiB`, `100 bytes`.
pub(crate) fn size(bytes: usize) -> String {
    match bytes {
        b if b >= MIB && b % MIB == 0 => format!("{} MiB", b / MIB),
        b if b >= 1024 && b % 1024 == 0 => format!("{} KiB", b / 1024),
        b => format!("{b} bytes"),
    }
}

#[cfg(test)]
mod tests;

/// The most a credentials or subject-token file may hold (they hold a few KiB).
#[cfg(feature = "auth")]
pub(crate) const MAX_CREDENTIALS_FILE: u64 = 1 << 20;

/// A regular file of at most [`MAX_CREDENTIALS_FILE`] bytes: a FIFO or `/dev/zero` named
/// as credentials is refused, never waited on or read without end.
#[cfg(feature = "auth")]
pub(crate) fn read_small_file(path: &std::path::Path) -> std::io::Result<Vec<u8>> {
    anylock_tls::read_regular_file(path, MAX_CREDENTIALS_FILE)
}
