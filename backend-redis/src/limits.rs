//! How large a server's replies may be ([`REPLY_LIMITS`](crate::REPLY_LIMITS)), and the
//! error that names the limit a reply broke ([`Refused`]).
//!
//! The `redis` crate's parser has no limit: a `$8589934592` header makes it buffer 8 GiB,
//! and a `*2000000000` header makes it collect two billion values. These limits are
//! enforced on the bytes before the parser sees them ([`Bounded`](crate::bounded::Bounded)),
//! so a hostile or impostor server can make the client hold at most about one batch's worth
//! of replies, and the call gets an error that names the limit.
//!
//! Why each number (the largest replies this crate reads legitimately):
//! - a value is a lock value (fence token, time, nonce, owner: under 1 KiB), a note (at most
//!   [`MAX_NOTE_LEN`](lockcore::MAX_NOTE_LEN), 512 bytes), a key from `SCAN` (a prefix of at
//!   most 128 bytes and a name of at most 512), a script's SHA1 or a `CONFIG GET` setting:
//!   [`MAX_VALUE`] (1 MiB) is a thousand times the largest;
//! - an error text or status line is a few hundred bytes (a script error names the script
//!   and line): [`MAX_LINE`] (64 KiB);
//! - the longest array is a semaphore's permits (at most
//!   [`MAX_PERMITS`](lockcore::MAX_PERMITS), 10,000) or a `SCAN` page (about
//!   [`SCAN_COUNT`](crate::listing::SCAN_COUNT), 500 keys): [`MAX_ELEMENTS`] (100,000) is ten
//!   times the first;
//! - the reply with the most values is that permit listing, 4 per permit (40,001):
//!   [`MAX_VALUES`] (262,144) leaves a margin of six and caps what the parser allocates per
//!   value (a value decoded takes about 56 bytes, a 4-byte `:1` on the wire included);
//! - the largest reply in bytes is the same listing with 512-byte notes and long owners,
//!   about 11 MB: [`MAX_REPLY`] (64 MiB, as the etcd backend's largest reply) leaves a
//!   margin of six, and the replies to one batch of commands written together (a pipeline
//!   of 1,000 refreshes, whose replies the client holds until the last arrives) share the
//!   same budget ([`MAX_BATCH`]).

use std::fmt;

/// The largest value (bulk or verbatim string), in bytes.
pub(crate) const MAX_VALUE: usize = 1 << 20;
/// The longest error text or status line (`+…`, `-…`, a number), in bytes.
pub(crate) const MAX_LINE: usize = 64 << 10;
/// The most elements directly inside one array, set or map (a map's keys and values count).
pub(crate) const MAX_ELEMENTS: usize = 100_000;
/// The most values in one reply, nested ones included.
pub(crate) const MAX_VALUES: usize = 1 << 18;
/// The largest reply, in bytes.
pub(crate) const MAX_REPLY: usize = 64 << 20;
/// The most bytes of the replies to one batch of commands written together (one pipeline,
/// or the calls of several tasks sent in one write).
pub(crate) const MAX_BATCH: usize = 64 << 20;

/// The most held locks one listing collects on one node. A listing is for people and
/// tools; a name prefix narrows a larger one. (Each lock listed takes a few hundred bytes
/// until the listing returns.)
pub(crate) const MAX_LISTED: usize = 100_000;

/// The most `SCAN` pages of one listing: [`SCAN_COUNT`](crate::listing::SCAN_COUNT) keys
/// each, so a database of up to about 500 million keys, whatever the prefix. A server that
/// answers without end (with new cursors) is stopped here.
pub(crate) const MAX_PAGES: usize = 1_000_000;

/// The limits in the order of [`REPLY_LIMITS`](crate::REPLY_LIMITS).
pub(crate) const ALL: &[(&str, usize)] = &[
    ("value", MAX_VALUE),
    ("error text or status line", MAX_LINE),
    ("elements of one array, set or map (count)", MAX_ELEMENTS),
    ("values in one reply (count)", MAX_VALUES),
    ("one reply", MAX_REPLY),
    ("the replies to one batch of commands", MAX_BATCH),
    ("held locks in one listing, per node (count)", MAX_LISTED),
    ("SCAN pages of one listing (count)", MAX_PAGES),
];

/// Which limit a reply broke, or that it is not RESP at all.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Refused {
    Value,
    Line,
    Elements,
    Values,
    Reply,
    Batch,
    /// A header that is not RESP (an unknown type byte, a length that is not a number).
    NotResp,
}

impl fmt::Display for Refused {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let (limit, what) = match self {
            Self::Value => (size(MAX_VALUE), "a value"),
            Self::Line => (size(MAX_LINE), "an error text or status line"),
            Self::Elements => (count(MAX_ELEMENTS), "one array, set or map"),
            Self::Values => (count(MAX_VALUES), "the values of one reply"),
            Self::Reply => (size(MAX_REPLY), "one reply"),
            Self::Batch => (size(MAX_BATCH), "the replies to one batch of commands"),
            Self::NotResp => {
                return f.write_str(
                    "the server's reply is not RESP (a bad header); is this a Redis server?",
                );
            }
        };
        write!(
            f,
            "the server's reply exceeds {limit} ({what}); is this a Redis server? The \
             connection was closed"
        )
    }
}

impl std::error::Error for Refused {}

fn size(bytes: usize) -> String {
    match bytes {
        b if b >= 1 << 20 && b % (1 << 20) == 0 => format!("{} MiB", b >> 20),
        b if b >= 1 << 10 && b % (1 << 10) == 0 => format!("{} KiB", b >> 10),
        b => format!("{b} bytes"),
    }
}

fn count(n: usize) -> String {
    format!("{n} elements")
}

/// The refusal inside a client error, if the connection was cut for one.
pub(crate) fn refusal_in(err: &redis::RedisError) -> Option<Refused> {
    let shared = std::error::Error::source(err)?
        .downcast_ref::<std::sync::Arc<dyn std::error::Error + Send + Sync>>()?;
    let io = (&**shared as &(dyn std::error::Error + 'static)).downcast_ref::<std::io::Error>()?;
    io.get_ref()?.downcast_ref::<Refused>().copied()
}

/// The client error a refusal becomes (an I/O error: the connection is closed).
pub(crate) fn into_redis_error(refused: Refused) -> redis::RedisError {
    std::io::Error::new(std::io::ErrorKind::InvalidData, refused).into()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refusals_name_the_limit_and_survive_the_client_error() {
        let text = Refused::Value.to_string();
        assert!(
            text.starts_with("the server's reply exceeds 1 MiB (a value); is this a Redis"),
            "{text}"
        );
        assert!(Refused::Line.to_string().contains("64 KiB (an error text"));
        assert!(Refused::Elements.to_string().contains("100000 elements"));
        assert!(
            Refused::Batch
                .to_string()
                .contains("64 MiB (the replies to one batch")
        );
        for refused in [Refused::Reply, Refused::NotResp, Refused::Values] {
            assert_eq!(refusal_in(&into_redis_error(refused)), Some(refused));
        }
        let other = redis::RedisError::from(std::io::Error::other("reset"));
        assert_eq!(refusal_in(&other), None);
        assert_eq!(ALL.len(), 8);
    }
}
