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

use lockcore::{Identity, LockName};
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

    /// The contender key of `name` bound to `lease`.
    pub(crate) fn key(&self, name: &LockName, lease: i64) -> Vec<u8> {
        let mut key = self.lock_prefix(name);
        key.extend_from_slice(format!("{lease:x}").as_bytes());
        key
    }
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

fn escape_into(name: &str, out: &mut String) {
    for ch in name.chars() {
        match ch {
            '%' => out.push_str("%25"),
            '/' => out.push_str("%2F"),
            other => out.push(other),
        }
    }
}

/// What anylock writes as the value of its contender key: JSON, so people reading
/// `etcdctl get --prefix` see who holds a lock and since when.
#[derive(Debug, Serialize, Deserialize)]
struct Value {
    owner: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    acquired_unix_ms: Option<u64>,
}

/// The value for a key that `owner` creates now.
pub(crate) fn encode_value(owner: &Identity) -> Vec<u8> {
    let acquired_unix_ms = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .ok()
        .and_then(|d| u64::try_from(d.as_millis()).ok());
    let value = Value {
        owner: owner.as_str().to_owned(),
        acquired_unix_ms,
    };
    serde_json::to_vec(&value).unwrap_or_else(|_| owner.as_str().as_bytes().to_vec())
}

/// The value of a queued waiter's key: the owner, without an acquisition time (the
/// claim that turns the place into the grant rewrites it with [`encode_value`]).
pub(crate) fn encode_queued_value(owner: &Identity) -> Vec<u8> {
    let value = Value {
        owner: owner.as_str().to_owned(),
        acquired_unix_ms: None,
    };
    serde_json::to_vec(&value).unwrap_or_else(|_| owner.as_str().as_bytes().to_vec())
}

/// Who a stored key names, and when it was acquired if the writer said.
///
/// Keys written by `etcdctl lock` and Go's `concurrency.Mutex` have an empty value; they
/// are shown as `etcd-lease/<lease id hex>`. A value that is not anylock's JSON is shown
/// as it is.
pub(crate) fn decode_value(value: &[u8], lease: i64) -> (Identity, Option<SystemTime>) {
    if value.is_empty() {
        return (Identity::from_stored(format!("etcd-lease/{lease:x}")), None);
    }
    match serde_json::from_slice::<Value>(value) {
        Ok(parsed) => {
            let at = parsed
                .acquired_unix_ms
                .map(|ms| UNIX_EPOCH + Duration::from_millis(ms));
            (Identity::from_stored(parsed.owner), at)
        }
        Err(_) => (
            Identity::from_stored(String::from_utf8_lossy(value).into_owned()),
            None,
        ),
    }
}

/// Whether a stored value names `owner` (anylock's own keys only).
pub(crate) fn is_owned_by(value: &[u8], owner: &Identity) -> bool {
    serde_json::from_slice::<Value>(value).is_ok_and(|v| v.owner == owner.as_str())
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
        let value = encode_value(&me);
        assert!(is_owned_by(&value, &me));
        assert!(!is_owned_by(&value, &Identity::unique()));
        let (who, at) = decode_value(&value, 7);
        assert_eq!(who, me);
        assert!(at.is_some());
        let (who, at) = decode_value(b"", 0x1f);
        assert_eq!(who.as_str(), "etcd-lease/1f");
        assert!(at.is_none());
        assert_eq!(decode_value(b"plain", 1).0.as_str(), "plain");
        assert!(!is_owned_by(b"", &me));
        let queued = encode_queued_value(&me);
        assert!(is_owned_by(&queued, &me));
        assert_eq!(decode_value(&queued, 7), (me.clone(), None));
    }
}
