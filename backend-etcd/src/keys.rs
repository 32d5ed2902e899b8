//! The key layout shared with etcd's own lock, and the value anylock stores in a key.
//!
//! A lock named `N` under the key prefix `P` is the set of keys `P + escape(N) + "/" +
//! <lease id in lowercase hex>`, one per contender, each bound to its contender's lease.
//! The key with the lowest create revision owns the lock. This is exactly the layout of
//! Go's `concurrency.Mutex` created with the prefix `P + escape(N)` (it appends the `/`
//! itself), which is what `etcdctl lock P+escape(N)` uses.
//!
//! `escape` turns `%` into `%25` and `/` into `%2F` and leaves every other character alone,
//! so ordinary names appear unchanged. Escaping `/` keeps the per-lock prefixes disjoint:
//! without it, the keys of a lock `a/b` (`P a/b/<hex>`) would sit inside the range of the
//! lock `a` (`P a/…`), and holding `a/b` would block `a`.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use lockcore::{Identity, LockName, Note};
use serde::{Deserialize, Serialize};

/// The key layout of one backend: its key prefix.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Layout {
    prefix: String,
}

impl Layout {
    /// A layout under `prefix` (already normalised by the config: empty or ending in `/`).
    pub(crate) fn new(prefix: &str) -> Self {
        Self {
            prefix: prefix.to_owned(),
        }
    }

    /// The range prefix that holds every contender key of `name`: `P + escape(N) + "/"`.
    pub(crate) fn lock_prefix(&self, name: &LockName) -> Vec<u8> {
        let mut key = self.prefix.clone();
        escape_into(name.as_str(), &mut key);
        key.push('/');
        key.into_bytes()
    }

    /// The key prefix (empty or ending in `/`).
    pub(crate) fn prefix(&self) -> &str {
        &self.prefix
    }

    /// The contender key of `name` bound to `lease`.
    pub(crate) fn key(&self, name: &LockName, lease: i64) -> Vec<u8> {
        self.key_named(name, &format!("{lease:x}"))
    }

    /// The contender key of `name` whose last part is `suffix` (normally its lease id in
    /// hex; see `backend/grant.rs` for when it is not).
    pub(crate) fn key_named(&self, name: &LockName, suffix: &str) -> Vec<u8> {
        let mut key = self.lock_prefix(name);
        key.extend_from_slice(suffix.as_bytes());
        key
    }
}

impl Layout {
    /// The range that holds the keys of every lock whose name starts with `prefix`:
    /// `P + escape(prefix)` (`P` alone for `""`).
    ///
    /// Why one byte-prefix range is exact: `escape` replaces each character on its own by
    /// a fixed code (`%25` for `%`, `%2F` for `/`, the character's own UTF-8 otherwise),
    /// and no code is a prefix of another (UTF-8 is prefix-free, only the two escapes
    /// start with `%`, and they differ in their third byte). So `escape(prefix)` is a byte
    /// prefix of `escape(name)` exactly when `prefix` is a prefix of `name`: reading both
    /// left to right, each code of `escape(prefix)` must be the code of `name`'s character
    /// at that place. The prefix is never given to a pattern language, so `*`, `_`, `?`,
    /// `[` and `\` match only themselves.
    pub(crate) fn list_prefix(&self, prefix: &str) -> Vec<u8> {
        let mut key = self.prefix.clone();
        escape_into(prefix, &mut key);
        key.into_bytes()
    }

    /// The lock that a key under `P` belongs to: the part before the first `/` after `P`,
    /// unescaped (the rest, normally the lease id in hex, may be anything: every key in
    /// the lock's range is one of its contenders, as acquire and inspect see it).
    ///
    /// `None` for a key that belongs to no lock anylock could name: outside `P`, without a
    /// `/`, not UTF-8, an escape other than `%25` and `%2F` (which anylock never writes,
    /// so no name's range holds it), or a name lockcore rejects.
    pub(crate) fn lock_of(&self, key: &[u8]) -> Option<LockName> {
        let rest = key.strip_prefix(self.prefix.as_bytes())?;
        let slash = rest.iter().position(|b| *b == b'/')?;
        let escaped = std::str::from_utf8(&rest[..slash]).ok()?;
        let name = unescape(escaped)?;
        LockName::new(name).ok()
    }
}

/// The inverse of `escape_into`, strict: `%` must start `%25` or `%2F`.
fn unescape(escaped: &str) -> Option<String> {
    let mut out = String::with_capacity(escaped.len());
    let mut rest = escaped;
    while let Some(at) = rest.find('%') {
        out.push_str(&rest[..at]);
        let code = rest.get(at..at + 3)?;
        out.push(match code {
            "%25" => '%',
            "%2F" => '/',
            _ => return None,
        });
        rest = &rest[at + 3..];
    }
    out.push_str(rest);
    Some(out)
}

/// The end of the range of keys starting with `prefix` (etcd's `WithPrefix` rule).
pub(crate) fn range_end(prefix: &[u8]) -> Vec<u8> {
    let mut end = prefix.to_vec();
    while let Some(last) = end.pop() {
        if last < 0xff {
            end.push(last + 1);
            return end;
        }
    }
    vec![0]
}

pub(crate) fn escape_into(name: &str, out: &mut String) {
    for ch in name.chars() {
        match ch {
            '%' => out.push_str("%25"),
            '/' => out.push_str("%2F"),
            other => out.push(other),
        }
    }
}

/// What anylock writes as the value of its contender key: JSON, so people reading
/// `etcdctl get --prefix` see who holds a lock, since when, and why.
///
/// `note` was added after the first release: it is optional and left out when absent, so
/// values written before it still decode (note = none) and an older anylock reading a
/// value with a note ignores the unknown field (serde's default; never add
/// `deny_unknown_fields` here). `etcdctl lock` and Go never read the value.
#[derive(Debug, Serialize, Deserialize)]
struct Value {
    owner: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    acquired_unix_ms: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    note: Option<String>,
    /// Different in every grant value this process writes, so the clean-up after an
    /// attempt whose outcome is unknown (which deletes the key only if it holds exactly
    /// that attempt's value) can never delete a later attempt's grant written in the same
    /// millisecond.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    nonce: Option<u64>,
    /// The format mark (1), in every value this version writes: what tells anylock's own
    /// values from an `etcdctl elect` / Go `Election` proposal that happens to be JSON with
    /// an `owner` (which a same-owner retake must never take for its own, or it would
    /// delete a Go leader's key). On a lock key a value without it is foreign; in a
    /// semaphore slot, a value from before the mark is still read ([`Legacy`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    anylock: Option<u64>,
}

/// The mark [`Value::anylock`] carries.
const FORMAT_MARK: u64 = 1;

/// A semaphore slot's value written before the format mark: exactly these fields and no
/// other. Never read from a lock key, where Go may have written the same shape.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Legacy {
    owner: String,
    #[serde(default)]
    acquired_unix_ms: Option<u64>,
    #[serde(default)]
    note: Option<String>,
    /// Allowed (a grant value has it), never read.
    #[serde(default, rename = "nonce")]
    _nonce: Option<u64>,
}

/// The value for a key that `owner` creates (or claims) now as the grant, with its note.
pub(crate) fn encode_value(owner: &Identity, note: Option<&Note>) -> Vec<u8> {
    let acquired_unix_ms = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .ok()
        .and_then(|d| u64::try_from(d.as_millis()).ok());
    encode(owner, acquired_unix_ms, note, Some(nonce()))
}

/// A value no earlier call in this process returned: a per-process random start (std's
/// randomly keyed hasher) plus a counter.
fn nonce() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    use std::sync::OnceLock;
    use std::sync::atomic::{AtomicU64, Ordering};
    static START: OnceLock<u64> = OnceLock::new();
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let start = *START.get_or_init(|| {
        let mut hasher = std::collections::hash_map::RandomState::new().build_hasher();
        hasher.write_u32(std::process::id());
        hasher.finish()
    });
    start.wrapping_add(NEXT.fetch_add(1, Ordering::Relaxed))
}

/// The value of a queued waiter's key: the owner and its note, without an acquisition
/// time (the claim that turns the place into the grant rewrites it with
/// [`encode_value`]).
pub(crate) fn encode_queued_value(owner: &Identity, note: Option<&Note>) -> Vec<u8> {
    encode(owner, None, note, None)
}

fn encode(
    owner: &Identity,
    acquired_unix_ms: Option<u64>,
    note: Option<&Note>,
    nonce: Option<u64>,
) -> Vec<u8> {
    let value = Value {
        owner: owner.as_str().to_owned(),
        acquired_unix_ms,
        note: note.map(|n| n.as_str().to_owned()),
        nonce,
        anylock: Some(FORMAT_MARK),
    };
    serde_json::to_vec(&value).unwrap_or_else(|_| owner.as_str().as_bytes().to_vec())
}

/// What a stored key says about its holder.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct Stored {
    pub(crate) owner: Identity,
    pub(crate) acquired_at: Option<SystemTime>,
    pub(crate) note: Option<Note>,
}

/// Who a stored key names, when it was acquired and its note, if the writer said.
///
/// A key whose value is not anylock's ([`decode_own`]) was written by another client of
/// the same layout: `etcdctl lock` and Go's `concurrency.Mutex` (an empty value), or
/// `etcdctl elect` and Go's `concurrency.Election` (the campaign's proposal). Its holder is
/// shown as `etcd-lease/<lease id hex>` (the Go session) and its value, if any, as the
/// note, so an election's leader shows its proposal as anylock's own leaders show their
/// campaign value. A stored note is read lossily ([`Note::from_stored`]): anyone with
/// write access to the prefix may have written it.
pub(crate) fn decode_value(value: &[u8], lease: i64) -> Stored {
    decode_marked(value).unwrap_or_else(|| Stored {
        owner: Identity::from_stored(format!("etcd-lease/{lease:x}")),
        acquired_at: None,
        note: Note::from_stored(&String::from_utf8_lossy(value)),
    })
}

/// What a lock key's value says when anylock wrote it with the format mark; `None` for
/// anything else (an empty value, a foreign value, JSON without the mark or an owner).
/// The same rule as a same-owner retake ([`is_owned_by`]): a lock key without the mark
/// may be a Go / `etcdctl elect` proposal that is JSON naming an owner (`{"owner":"ci"}`),
/// so it is shown as foreign, never as that owner's (the review: `verify --owner ci`
/// passed while a Go process led, and `release` named the holder it then refused).
pub(crate) fn decode_marked(value: &[u8]) -> Option<Stored> {
    match serde_json::from_slice::<Value>(value) {
        Ok(v) if v.anylock.is_some() => stored(v.owner, v.acquired_unix_ms, v.note),
        _ => None,
    }
}

/// What a semaphore slot's value says: a value with the format mark, or one with exactly
/// the fields of the values written before the mark (slot keys are a namespace only
/// anylock writes, so an unmarked value there is an older anylock's); `None` otherwise.
pub(crate) fn decode_own(value: &[u8]) -> Option<Stored> {
    decode_marked(value).or_else(|| {
        let old = serde_json::from_slice::<Legacy>(value).ok()?;
        stored(old.owner, old.acquired_unix_ms, old.note)
    })
}

fn stored(owner: String, acquired_unix_ms: Option<u64>, note: Option<String>) -> Option<Stored> {
    if owner.is_empty() {
        return None;
    }
    Some(Stored {
        owner: Identity::from_stored(owner),
        acquired_at: acquired_unix_ms.map(|ms| UNIX_EPOCH + Duration::from_millis(ms)),
        note: note.as_deref().and_then(Note::from_stored),
    })
}

/// Whether a stored value is one anylock wrote (with the format mark) naming `owner`:
/// what a same-owner retake needs before it replaces the key.
pub(crate) fn is_owned_by(value: &[u8], owner: &Identity) -> bool {
    serde_json::from_slice::<Value>(value)
        .is_ok_and(|v| v.anylock.is_some() && v.owner == owner.as_str())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn name(s: &str) -> LockName {
        LockName::new(s).expect("valid")
    }

    #[test]
    fn keys_follow_the_etcd_mutex_layout() {
        let layout = Layout::new("locks/");
        assert_eq!(layout.lock_prefix(&name("deploy")), b"locks/deploy/");
        assert_eq!(
            layout.key(&name("deploy"), 0x694d_77aa),
            b"locks/deploy/694d77aa"
        );
        assert_eq!(Layout::new("").key(&name("x"), 255), b"x/ff");
    }

    #[test]
    fn slashes_and_percents_are_escaped_so_prefixes_stay_disjoint() {
        let layout = Layout::new("");
        assert_eq!(layout.lock_prefix(&name("team/ci")), b"team%2Fci/");
        assert_eq!(layout.lock_prefix(&name("100%")), b"100%25/");
        let a = layout.lock_prefix(&name("a"));
        for other in ["a/b", "a%2Fb", "a/", "a%"] {
            let key = layout.key(&name(other), 1);
            assert!(!key.starts_with(&a), "{other} falls inside the range of a");
        }
        assert_ne!(
            layout.lock_prefix(&name("a/b")),
            layout.lock_prefix(&name("a%2Fb"))
        );
    }

    #[test]
    fn range_end_follows_etcd() {
        assert_eq!(range_end(b"a/"), b"a0");
        assert_eq!(range_end(b"a\xff"), b"b");
        assert_eq!(range_end(b"\xff"), vec![0]);
    }

    #[test]
    fn values_round_trip_and_foreign_values_are_readable() {
        let me = Identity::unique();
        let value = encode_value(&me, None);
        assert!(is_owned_by(&value, &me));
        assert!(!is_owned_by(&value, &Identity::unique()));
        let stored = decode_value(&value, 7);
        assert_eq!(stored.owner, me);
        assert!(stored.acquired_at.is_some());
        assert_eq!(stored.note, None);
        let stored = decode_value(b"", 0x1f);
        assert_eq!(stored.owner.as_str(), "etcd-lease/1f");
        assert!(stored.acquired_at.is_none());
        assert_eq!(stored.note, None);
        // A Go election's proposal: the Go session holds, the proposal is the note.
        let plain = decode_value(b"node-7", 0x2a);
        assert_eq!(plain.owner.as_str(), "etcd-lease/2a");
        assert_eq!(plain.note.as_ref().map(Note::as_str), Some("node-7"));
        // A Go proposal that is JSON with an `owner` is foreign, and never taken as ours
        // (a retake would delete the Go leader's key): only marked values are.
        let proposal = br#"{"owner":"~owner/ops","addr":"10.0.0.9"}"#;
        let shown = decode_value(proposal, 0x2a);
        assert_eq!(shown.owner.as_str(), "etcd-lease/2a");
        assert_eq!(
            shown.note.as_ref().map(Note::as_str),
            Some(std::str::from_utf8(proposal).expect("text"))
        );
        let ops = Identity::from_stored("~owner/ops".to_owned());
        assert!(!is_owned_by(proposal, &ops));
        // Nor a proposal of exactly anylock's old shape: a lock key without the mark is
        // foreign, shown whole, so `verify --owner ops` cannot pass for a Go leader and
        // `release` never names a holder it then refuses as not its own.
        for unmarked in [
            &br#"{"owner":"~owner/ops"}"#[..],
            br#"{"owner":"~owner/ops","acquired_unix_ms":1700000000000,"nonce":7}"#,
        ] {
            let shown = decode_value(unmarked, 0x2a);
            assert_eq!(shown.owner.as_str(), "etcd-lease/2a");
            assert_eq!(
                shown.note.as_ref().map(Note::as_str),
                Some(std::str::from_utf8(unmarked).expect("text"))
            );
            assert!(!is_owned_by(unmarked, &ops));
            // In a semaphore slot (only anylock writes there) it is an older anylock's.
            assert_eq!(decode_own(unmarked).map(|s| s.owner), Some(ops.clone()));
        }
        // JSON that is not ours (no owner) is foreign too.
        let other = decode_value(br#"{"host":"h"}"#, 1);
        assert_eq!(other.owner.as_str(), "etcd-lease/1");
        assert_eq!(
            other.note.as_ref().map(Note::as_str),
            Some(r#"{"host":"h"}"#)
        );
        assert!(!is_owned_by(b"", &me));
        let queued = encode_queued_value(&me, None);
        assert!(is_owned_by(&queued, &me));
        let stored = decode_value(&queued, 7);
        assert_eq!((stored.owner, stored.acquired_at), (me.clone(), None));
    }

    #[test]
    fn notes_are_stored_in_an_optional_field_both_versions_read() {
        let me = Identity::unique();
        let note = Note::new("run 42 — ✓").expect("note");
        let value = encode_value(&me, Some(&note));
        assert_eq!(decode_value(&value, 7).note, Some(note.clone()));
        assert!(is_owned_by(&value, &me));
        let queued = encode_queued_value(&me, Some(&note));
        assert_eq!(decode_value(&queued, 7).note, Some(note));
        // No note: no field at all, byte for byte what the previous version wrote.
        let bare: serde_json::Value =
            serde_json::from_slice(&encode_value(&me, None)).expect("JSON");
        assert!(bare.get("note").is_none(), "{bare}");
        // A value from the previous version (no note field) still decodes as a slot's.
        let old = format!(
            r#"{{"owner":"{}","acquired_unix_ms":1700000000000}}"#,
            me.as_str()
        );
        let stored = decode_own(old.as_bytes()).expect("an older slot value");
        assert_eq!((stored.owner, stored.note), (me.clone(), None));
        // The previous version's reader (the same struct without `note`) reads a new value.
        #[derive(Deserialize)]
        struct OldValue {
            owner: String,
            acquired_unix_ms: Option<u64>,
        }
        let noted = Note::new("x").expect("note");
        let old: OldValue =
            serde_json::from_slice(&encode_value(&me, Some(&noted))).expect("old reader");
        assert_eq!(old.owner, me.as_str());
        assert!(old.acquired_unix_ms.is_some());
    }

    #[test]
    fn stored_notes_are_read_lossily_and_empty_means_none() {
        let stored = decode_value(br#"{"owner":"o","note":"a\u001b[2Jb","anylock":1}"#, 1);
        assert_eq!(stored.note.expect("note").as_str(), "a\u{fffd}[2Jb");
        let empty = br#"{"owner":"o","note":"","anylock":1}"#;
        assert_eq!(decode_value(empty, 1).note, None);
        // A note of the wrong type makes the value foreign: shown whole, as the note.
        let odd = br#"{"owner":"o","note":5,"anylock":1}"#;
        let shown = decode_value(odd, 1);
        assert_eq!(shown.owner.as_str(), "etcd-lease/1");
        assert_eq!(
            shown.note.as_ref().map(Note::as_str),
            Some(std::str::from_utf8(odd).expect("text"))
        );
    }

    #[test]
    fn listing_prefixes_escape_like_names_and_keys_map_back_to_names() {
        let layout = Layout::new("locks/");
        assert_eq!(layout.list_prefix(""), b"locks/");
        assert_eq!(layout.list_prefix("a%/_*"), b"locks/a%25%2F_*");
        for n in ["deploy", "team/ci", "100%", "a%2Fb", "a*?[z]", "é/%"] {
            let lock = name(n);
            let key = layout.key(&lock, 0x1f);
            assert_eq!(layout.lock_of(&key), Some(lock.clone()), "{n}");
            assert_eq!(layout.lock_of(&layout.lock_prefix(&lock)), Some(lock));
        }
        for foreign in [
            &b"other/x/1"[..],
            b"locks/noslash",
            b"locks//1",
            b"locks/a%2f/1",
            b"locks/a%/1",
            b"locks/a%2/1",
            b"locks/\xff/1",
            b"locks/a\x07/1",
        ] {
            assert_eq!(layout.lock_of(foreign), None, "{foreign:?}");
        }
        // Anything after the first `/` is a contender of the lock, as inspect sees it.
        assert_eq!(layout.lock_of(b"locks/a/b/c"), Some(name("a")));
    }
}
