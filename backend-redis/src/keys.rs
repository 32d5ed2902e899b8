//! Where a lock lives in Redis, and the value stored in its key.
//!
//! For the lock `deploy` under the prefix `anylock`:
//!
//! | what | name | lifetime |
//! |---|---|---|
//! | lock key | `{anylock:deploy}:lock` | `PX` = the lease TTL; deleted on release |
//! | fence counter | `{anylock:deploy}:fence` | never deleted (single instance only) |
//! | note | `{anylock:deploy}:note` | a hash written with a grant that has a note; `PX` = the lease TTL |
//! | release channel | `{anylock:deploy}:released` | pub/sub, no storage |
//!
//! The keys share the hash tag `{anylock:deploy}`, so a Redis Cluster keeps them in one
//! slot and one script may touch them all.
//!
//! The lock key holds `<token>:<acquired unix ms>:<nonce>:<owner>`: the fence token (`0`
//! under Redlock), when the grant was made (client wall clock, for people), 32 hex digits
//! drawn per grant, and the owner's identity (last, because it may contain `:`).
//!
//! The note key is a hash `{grant = <the lock key's value>, note = <text>}`, written by
//! the acquire script together with the grant. A note counts only while `grant` equals the
//! lock key's value, so a note can never be shown for another grant, even one written by
//! a client that does not know about notes. The lock value itself is unchanged: values
//! written before notes existed parse (note: none), and older clients read and retake
//! locks written by this version as before.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use lockcore::{FenceToken, HolderInfo, Identity, LockName, Note};

/// The Redis names of one lock: lock key, fence counter key, note key and release channel.
///
/// ```
/// use backend_redis::LockKeys;
/// let keys = LockKeys::new("anylock", &lockcore::LockName::new("deploy")?);
/// assert_eq!(keys.lock(), "{anylock:deploy}:lock");
/// assert_eq!(keys.fence(), "{anylock:deploy}:fence");
/// assert_eq!(keys.hash_tag(), "anylock:deploy");
/// # Ok::<(), lockcore::Error>(())
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LockKeys {
    lock: String,
    fence: String,
    note: String,
    channel: String,
}

impl LockKeys {
    /// The names for `name` under `prefix`.
    pub fn new(prefix: &str, name: &LockName) -> Self {
        // Built on every lock call: four exact-size strings, no formatting machinery.
        let name = name.as_str();
        let tag_len = prefix.len() + name.len() + 3;
        let key = |suffix: &str| {
            let mut key = String::with_capacity(tag_len + suffix.len());
            key.push('{');
            key.push_str(prefix);
            key.push(':');
            key.push_str(name);
            key.push('}');
            key.push_str(suffix);
            key
        };
        Self {
            lock: key(":lock"),
            fence: key(":fence"),
            note: key(":note"),
            channel: key(":released"),
        }
    }

    /// The lock key (a string with a TTL).
    pub fn lock(&self) -> &str {
        &self.lock
    }

    /// The fence counter key (an integer, never deleted).
    pub fn fence(&self) -> &str {
        &self.fence
    }

    /// The note key (a hash `{grant, note}` with the lease's TTL; absent without a note).
    pub fn note(&self) -> &str {
        &self.note
    }

    /// The pub/sub channel a release publishes on.
    pub fn channel(&self) -> &str {
        &self.channel
    }

    /// What Redis Cluster hashes to pick the slot: the text between the first `{` and the
    /// first `}` after it. Identical for the lock key and the fence key.
    pub fn hash_tag(&self) -> &str {
        hash_tag(&self.lock)
    }
}

/// The Redis names of one semaphore (permits, see `docs/redis.md`, "Semaphores"): the
/// permits, their records, the semaphore's own fence counter, and the release channel,
/// which it shares with the lock of the same name (a spurious wake is allowed).
///
/// Under the lock's hash tag, so a Redis Cluster keeps them in the lock's slot, but with
/// key names no lock key can have: a semaphore and a lock of one name never share a key.
///
/// ```
/// use backend_redis::PermitKeys;
/// let keys = PermitKeys::new("anylock", &lockcore::LockName::new("jobs")?);
/// assert_eq!(keys.permits(), "{anylock:jobs}:permits");
/// assert_eq!(keys.info(), "{anylock:jobs}:permit-info");
/// assert_eq!(keys.fence(), "{anylock:jobs}:permit-fence");
/// assert_eq!(keys.channel(), "{anylock:jobs}:released");
/// # Ok::<(), lockcore::Error>(())
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PermitKeys {
    permits: String,
    info: String,
    fence: String,
    channel: String,
}

impl PermitKeys {
    /// The names for the semaphore `name` under `prefix`.
    pub fn new(prefix: &str, name: &LockName) -> Self {
        let key = |suffix: &str| format!("{{{prefix}:{name}}}{suffix}", name = name.as_str());
        Self {
            permits: key(":permits"),
            info: key(":permit-info"),
            fence: key(":permit-fence"),
            channel: key(":released"),
        }
    }

    /// The sorted set of live permits: member = the grant value (the lock value's format,
    /// `<token>:<acquired unix ms>:<nonce>:<owner>`), score = its expiry in server Unix ms.
    pub fn permits(&self) -> &str {
        &self.permits
    }

    /// The hash of permit records: `o:<owner>` = the owner's grant value, and
    /// `g:<grant value>` = `<limit>:<note>` (the note empty for none).
    pub fn info(&self) -> &str {
        &self.info
    }

    /// The semaphore's fence counter (an integer, never deleted), apart from the lock's.
    pub fn fence(&self) -> &str {
        &self.fence
    }

    /// The pub/sub channel a permit's release publishes on: the lock's.
    pub fn channel(&self) -> &str {
        &self.channel
    }
}

/// Redis Cluster's hash-tag rule: the text between the first `{` and the next `}`, when
/// non-empty; otherwise the whole key.
fn hash_tag(key: &str) -> &str {
    let Some(open) = key.find('{') else {
        return key;
    };
    match key[open + 1..].find('}') {
        Some(len) if len > 0 => &key[open + 1..open + 1 + len],
        _ => key,
    }
}

/// A fresh per-grant nonce: 128 random bits as 32 lowercase hex digits.
pub(crate) fn new_nonce() -> String {
    format!("{:032x}", rand::random::<u128>())
}

/// The part of a stored value after the token: `:<acquired unix ms>:<nonce>:<owner>`.
/// The acquire script prepends the token it draws.
pub(crate) fn value_suffix(nonce: &str, owner: &Identity) -> String {
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis());
    format!(":{now}:{nonce}:{owner}", owner = owner.as_str())
}

/// A parsed lock value (see the [module docs](self)).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct StoredValue<'a> {
    pub(crate) token: u64,
    pub(crate) acquired_ms: u64,
    pub(crate) owner: &'a str,
}

impl<'a> StoredValue<'a> {
    /// Parses `<token>:<ms>:<hex nonce>:<owner>`, the same shape the scripts match with
    /// `^%d+:%d+:%x+:(.*)$`. `None` for a value some other program wrote.
    pub(crate) fn parse(raw: &'a str) -> Option<Self> {
        let mut parts = raw.splitn(4, ':');
        let token = digits(parts.next()?)?;
        let acquired_ms = digits(parts.next()?)?;
        let nonce = parts.next()?;
        let owner = parts.next()?;
        let hex = !nonce.is_empty() && nonce.bytes().all(|b| b.is_ascii_hexdigit());
        hex.then_some(Self {
            token,
            acquired_ms,
            owner,
        })
    }

    /// The fence token, when the grant has one (`0` means none: Redlock).
    pub(crate) fn fence_token(&self) -> Option<FenceToken> {
        (self.token > 0).then(|| FenceToken::new(self.token))
    }
}

fn digits(part: &str) -> Option<u64> {
    if part.is_empty() || !part.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    part.parse().ok()
}

/// What one node stores for a held lock: the lock key's value, its `PTTL` in ms (-1 = no
/// expiry, as after an operator's plain `SET`) and the note bound to this value (`""` for
/// none).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Found {
    pub(crate) value: String,
    pub(crate) pttl: i64,
    pub(crate) note: String,
}

impl Found {
    pub(crate) fn new(value: impl Into<String>, pttl: i64, note: impl Into<String>) -> Self {
        Self {
            value: value.into(),
            pttl,
            note: note.into(),
        }
    }
}

/// Who holds a lock, from what its keys hold.
pub(crate) fn holder_info(found: &Found) -> HolderInfo {
    let (raw, pttl) = (found.value.as_str(), found.pttl);
    let mut info = match StoredValue::parse(raw) {
        Some(value) => {
            let at = UNIX_EPOCH + Duration::from_millis(value.acquired_ms);
            let info = HolderInfo::new(Identity::from_stored(value.owner)).with_acquired_at(at);
            match value.fence_token() {
                Some(token) => info.with_token(token),
                None => info,
            }
        }
        None => HolderInfo::new(Identity::from_stored(format!(
            "<foreign value, {} bytes>",
            raw.len()
        ))),
    };
    // `PTTL` rounds down: 0 is a key with under a millisecond left, still there. Reported
    // as 1 ms, so a waiter sleeps until it is gone rather than take it for an expired
    // holder not yet removed (which lockcore does not let cap its backoff).
    if let Ok(ms) = u64::try_from(pttl) {
        info = info.with_expires_in(Duration::from_millis(ms.max(1)));
    }
    info.with_note(Note::from_stored(&found.note))
}

/// The `SCAN MATCH` pattern for the lock keys under `prefix` whose lock names start with
/// `name_prefix`: every glob character of both is escaped, so it matches only itself.
pub(crate) fn lock_pattern(prefix: &str, name_prefix: &str) -> String {
    let mut pattern = glob_escape(&format!("{{{prefix}:{name_prefix}"));
    pattern.push('*');
    pattern.push_str(&glob_escape(LOCK_SUFFIX));
    pattern
}

const LOCK_SUFFIX: &str = "}:lock";

/// Escapes Redis glob characters (`\`, `*`, `?`, `[`, `]`) with a backslash.
pub(crate) fn glob_escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len() + 8);
    for ch in text.chars() {
        if matches!(ch, '\\' | '*' | '?' | '[' | ']') {
            out.push('\\');
        }
        out.push(ch);
    }
    out
}

/// The lock name of the lock key `key` under `prefix`, when `key` is one (`{prefix:NAME}:lock`
/// with a valid name starting with `name_prefix`). Fence, note and foreign keys give `None`.
///
/// Unambiguous although names may contain `}` and `:`: the key is exactly the prefix text,
/// the name and `}:lock`, and no other key of this layout ends in `}:lock`.
pub(crate) fn name_of_lock_key(prefix: &str, name_prefix: &str, key: &[u8]) -> Option<LockName> {
    let key = std::str::from_utf8(key).ok()?;
    let head = format!("{{{prefix}:");
    let name = key.strip_prefix(&head)?.strip_suffix(LOCK_SUFFIX)?;
    if !name.starts_with(name_prefix) {
        return None;
    }
    LockName::new(name).ok()
}

/// The owner named by a stored value, for messages (never the nonce).
pub(crate) fn owner_of(raw: &str) -> String {
    StoredValue::parse(raw).map_or_else(
        || "a value this crate did not write".to_owned(),
        |v| v.owner.to_owned(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_share_one_hash_tag_even_with_braces_in_the_name() {
        for name in ["deploy", "a}b", "{x}", "with:colons", "}"] {
            let keys = LockKeys::new("p", &LockName::new(name).expect("valid"));
            assert_eq!(hash_tag(keys.lock()), hash_tag(keys.fence()), "{name}");
            assert!(keys.lock().starts_with("{p:"), "{name}");
            assert_ne!(keys.lock(), keys.fence());
        }
        let keys = LockKeys::new("anylock", &LockName::new("deploy").expect("valid"));
        assert_eq!(keys.channel(), "{anylock:deploy}:released");
    }

    #[test]
    fn permit_keys_share_the_lock_slot_and_no_lock_key() {
        let names = [
            "deploy",
            "a}b",
            "x}:permit",
            "x}:permits",
            "x}:permit-",
            "}",
            "a:b",
        ];
        let mut locks = std::collections::HashSet::new();
        let mut permits = std::collections::HashSet::new();
        for name in names {
            let name = LockName::new(name).expect("valid");
            let lock = LockKeys::new("p", &name);
            let sem = PermitKeys::new("p", &name);
            for key in [sem.permits(), sem.info(), sem.fence()] {
                assert_eq!(hash_tag(key), lock.hash_tag(), "{name}");
                permits.insert(key.to_owned());
            }
            assert_eq!(sem.channel(), lock.channel());
            locks.extend([lock.lock(), lock.fence(), lock.note()].map(str::to_owned));
            assert_eq!(name_of_lock_key("p", "", sem.permits().as_bytes()), None);
        }
        assert_eq!(permits.len(), 3 * names.len(), "distinct permit keys");
        assert!(locks.is_disjoint(&permits), "a permit key is a lock key");
    }

    #[test]
    fn distinct_names_get_distinct_keys() {
        let a = LockKeys::new("p", &LockName::new("a").expect("valid"));
        let b = LockKeys::new("p", &LockName::new("a}:lock").expect("valid"));
        assert_ne!(a.lock(), b.lock());
        assert_ne!(a.lock(), b.fence());
    }

    #[test]
    fn stored_values_round_trip() {
        let owner = Identity::from_stored("host/1/abc/task:with:colons");
        let nonce = new_nonce();
        assert_eq!(nonce.len(), 32);
        let raw = format!("42{}", value_suffix(&nonce, &owner));
        let value = StoredValue::parse(&raw).expect("parses");
        assert_eq!(value.token, 42);
        assert_eq!(value.owner, owner.as_str());
        assert_eq!(value.fence_token(), Some(FenceToken::new(42)));
        let info = holder_info(&Found::new(raw.clone(), 1500, ""));
        assert_eq!(info.owner(), &owner);
        assert_eq!(info.token(), Some(FenceToken::new(42)));
        assert_eq!(info.expires_in(), Some(Duration::from_millis(1500)));
        assert!(info.acquired_at().is_some());
        assert_eq!(info.note(), None);
        let info = holder_info(&Found::new(raw, 1500, "ci \x1b[2J run"));
        assert_eq!(info.note().map(Note::as_str), Some("ci \u{fffd}[2J run"));
    }

    /// `PTTL` 0 is a key in its last millisecond, still there (Redis deletes it once the
    /// clock passes its expiry): it reads as 1 ms left, not zero, which lockcore takes for
    /// a holder expired but not yet removed and answers with its full backoff (the
    /// failover bench saw a crashed leader's successor take over 267 ms past the TTL).
    #[test]
    fn a_key_in_its_last_millisecond_has_one_ms_left() {
        let owner = Identity::from_stored("host/1/abc");
        let raw = format!("7{}", value_suffix(&new_nonce(), &owner));
        let info = holder_info(&Found::new(raw.clone(), 0, ""));
        assert_eq!(info.expires_in(), Some(Duration::from_millis(1)));
        let info = holder_info(&Found::new(raw, 2, ""));
        assert_eq!(info.expires_in(), Some(Duration::from_millis(2)));
    }

    #[test]
    fn foreign_values_are_not_parsed() {
        for raw in ["", "x", "1:2:zz:o", "a:2:ff:o", "1:2:ff", ":2:ff:o"] {
            assert_eq!(StoredValue::parse(raw), None, "{raw:?}");
        }
        let info = holder_info(&Found::new("my_random_value", -1, ""));
        assert!(info.owner().as_str().contains("foreign"));
        assert_eq!(info.expires_in(), None);
        assert_eq!(
            StoredValue::parse("0:1:ab:o").and_then(|v| v.fence_token()),
            None
        );
    }

    #[test]
    fn lock_keys_decode_to_their_names_and_nothing_else_does() {
        for name in [
            "deploy",
            "a}b",
            "{x}",
            "with:colons",
            "}",
            "a}:lock",
            "a}:note",
            "*?[]\\",
        ] {
            let lock_name = LockName::new(name).expect("valid");
            let keys = LockKeys::new("p", &lock_name);
            let decoded = name_of_lock_key("p", "", keys.lock().as_bytes());
            assert_eq!(decoded.as_ref(), Some(&lock_name), "{name}");
            for other in [keys.fence(), keys.note(), keys.channel()] {
                assert_eq!(name_of_lock_key("p", "", other.as_bytes()), None, "{other}");
            }
            assert_eq!(name_of_lock_key("q", "", keys.lock().as_bytes()), None);
        }
        let keys = LockKeys::new("p", &LockName::new("ab").expect("valid"));
        assert!(name_of_lock_key("p", "a", keys.lock().as_bytes()).is_some());
        assert!(name_of_lock_key("p", "b", keys.lock().as_bytes()).is_none());
        assert!(name_of_lock_key("p", "", b"{p:\xff}:lock").is_none());
    }

    #[test]
    fn patterns_escape_every_glob_character() {
        assert_eq!(lock_pattern("p", ""), "{p:*}:lock");
        assert_eq!(lock_pattern("a*b", "x?[y]\\"), r"{a\*b:x\?\[y\]\\*}:lock");
    }
}
