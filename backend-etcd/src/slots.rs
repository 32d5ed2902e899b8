//! The key layout of semaphores, a namespace of its own beside the locks', and what a
//! semaphore's keys say.
//!
//! A semaphore named `N` of `L` permits under the key prefix `P` is at most `L` *slot
//! keys*
//!
//! ```text
//! P + "%sem/" + escape(N) + "/" + L + "/" + i        (i = 0 … L-1, decimal)
//! ```
//!
//! each bound to its holder's lease, its value the holder's JSON (as a lock key's). A
//! permit is a slot key; a slot is free when its key does not exist (a released permit's
//! key is deleted, an expired one's goes with its lease). One key per index, so at most
//! `L` permits. Putting `L` in the key lets one `Txn` check that no slot of another limit
//! exists (two range compares around `... + L + "/"`).
//!
//! Why no lock key and no `etcdctl lock`/Go key of a lock ever falls under `P + "%sem/"`,
//! nor a slot key under a lock's range `P + escape(M) + "/"`: the first segment after `P`
//! of every key of a lock `M` (its holder's, its queued waiters', etcdctl's and Go's, all
//! `P + escape(M) + "/" + …`) is `escape(M)`, which has no `/`, and has a `%` only as
//! `%25` or `%2F`. `%sem` is neither, so it is never `escape(M)`, and no lock's segment
//! is `%sem` followed by more (that would need `/` inside it) or a proper prefix of
//! `%sem/` (that would put a `/` before the fifth byte). `list` skips these keys for the
//! same reason (`Layout::lock_of` rejects the escape `%se`).

use anylock_etcd_proto::mvccpb::KeyValue;
use lockcore::{Error, ErrorKind, LockName, MAX_PERMITS, Result};

use crate::keys::{Layout, Stored, decode_own, escape_into};

/// The first segment under the key prefix of every semaphore key.
pub(crate) const SEGMENT: &str = "%sem";

impl Layout {
    /// `P + "%sem/" + escape(N) + "/"`: the range of every slot key of semaphore `name`.
    pub(crate) fn semaphore_prefix(&self, name: &LockName) -> Vec<u8> {
        let mut key = format!("{}{SEGMENT}/", self.prefix());
        escape_into(name.as_str(), &mut key);
        key.push('/');
        key.into_bytes()
    }

    /// The range of the slot keys of `name` with `limit` permits.
    pub(crate) fn limit_prefix(&self, name: &LockName, limit: u32) -> Vec<u8> {
        let mut key = self.semaphore_prefix(name);
        key.extend_from_slice(format!("{limit}/").as_bytes());
        key
    }

    /// The key of slot `index` of `name` with `limit` permits.
    pub(crate) fn slot_key(&self, name: &LockName, limit: u32, index: u32) -> Vec<u8> {
        let mut key = self.limit_prefix(name, limit);
        key.extend_from_slice(index.to_string().as_bytes());
        key
    }
}

/// One permit as read: its slot, what its value says, and the key as etcd returned it
/// (mod revision = the grant's fence token, lease).
#[derive(Debug)]
pub(crate) struct Slot {
    pub(crate) limit: u32,
    pub(crate) index: u32,
    pub(crate) stored: Stored,
    pub(crate) kv: KeyValue,
}

/// The slots of the semaphore whose range is `prefix`, from the keys read there.
///
/// # Errors
/// `Protocol` (permanent) for a key that is not a slot anylock writes (its name is not
/// `<limit>/<index>` in canonical decimal with `index < limit <= 10000`) or whose value
/// is not anylock's JSON: someone else wrote under the semaphore's range, and counting
/// it, or not, could admit more holders than the limit, so nothing is decided until an
/// operator removes it. The message names the key, never the value.
pub(crate) fn read(prefix: &[u8], kvs: Vec<KeyValue>) -> Result<Vec<Slot>> {
    kvs.into_iter()
        .map(|kv| {
            let bad = |why: &str| {
                Error::new(
                    ErrorKind::Protocol,
                    format!(
                        "the semaphore key {:?} is not a permit anylock wrote ({why}); \
                         remove it (etcdctl del) to use the semaphore",
                        String::from_utf8_lossy(&kv.key)
                    ),
                )
            };
            let rest = kv.key.strip_prefix(prefix).unwrap_or(&[]);
            let Some((limit, index)) = place(rest) else {
                return Err(bad("its name is not <limit>/<index>"));
            };
            let Some(stored) = decode_own(&kv.value) else {
                return Err(bad("its value is not anylock's"));
            };
            Ok(Slot {
                limit,
                index,
                stored,
                kv,
            })
        })
        .collect()
}

/// `<limit>/<index>`, both canonical decimal, `index < limit <= MAX_PERMITS`.
fn place(rest: &[u8]) -> Option<(u32, u32)> {
    let rest = std::str::from_utf8(rest).ok()?;
    let (limit, index) = rest.split_once('/')?;
    let (limit, index) = (number(limit)?, number(index)?);
    ((1..=MAX_PERMITS).contains(&limit) && index < limit).then_some((limit, index))
}

/// A canonical decimal: digits only, no leading zero (but `0`), as `u32::to_string` writes.
fn number(text: &str) -> Option<u32> {
    let n: u32 = text.parse().ok()?;
    (n.to_string() == text).then_some(n)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::keys::encode_value;
    use lockcore::Identity;

    fn name(s: &str) -> LockName {
        LockName::new(s).expect("valid")
    }

    fn kv(key: &[u8], value: &[u8]) -> KeyValue {
        KeyValue {
            key: key.to_vec(),
            value: value.to_vec(),
            mod_revision: 9,
            ..KeyValue::default()
        }
    }

    #[test]
    fn slot_keys_are_laid_out_under_their_own_segment() {
        let layout = Layout::new("locks/");
        assert_eq!(layout.semaphore_prefix(&name("jobs")), b"locks/%sem/jobs/");
        assert_eq!(layout.limit_prefix(&name("jobs"), 3), b"locks/%sem/jobs/3/");
        assert_eq!(layout.slot_key(&name("jobs"), 3, 2), b"locks/%sem/jobs/3/2");
        assert_eq!(
            Layout::new("").slot_key(&name("a/b%"), 10, 0),
            b"%sem/a%2Fb%25/10/0"
        );
    }

    /// No lock key (anylock's, a queued waiter's, etcdctl's or Go's: all
    /// `lock_prefix(M) + anything`) can fall under a semaphore range, and no slot key
    /// under a lock's range, whatever the names; `list` maps no slot key to a lock.
    #[test]
    fn semaphore_and_lock_ranges_never_overlap() {
        let names = [
            "x", "%sem", "%", "%s", "%se", "%sem/x", "%25sem", "%2Fsem", "sem", "%sem%", "/",
            "x/3/0", "é", "a b",
        ];
        for prefix in ["", "locks/", "%sem/"] {
            let layout = Layout::new(prefix);
            let all_semaphores = format!("{prefix}{SEGMENT}/").into_bytes();
            for lock in names {
                let lock_prefix = layout.lock_prefix(&name(lock));
                assert!(!lock_prefix.starts_with(&all_semaphores), "{prefix}{lock}");
                for sem in names {
                    let slot = layout.slot_key(&name(sem), 3, 0);
                    assert!(!slot.starts_with(&lock_prefix), "{prefix}: {sem} in {lock}");
                    assert_eq!(layout.lock_of(&slot), None, "{prefix}: {sem}");
                }
            }
        }
    }

    #[test]
    fn only_canonical_slots_with_anylock_values_are_read() {
        let prefix = b"p/%sem/x/";
        let value = encode_value(&Identity::unique(), None);
        let slots = read(prefix, vec![kv(b"p/%sem/x/3/2", &value)]).expect("a slot");
        assert_eq!((slots[0].limit, slots[0].index), (3, 2));
        assert_eq!(slots[0].kv.mod_revision, 9);
        for key in [
            &b"p/%sem/x/3/3"[..],
            b"p/%sem/x/03/1",
            b"p/%sem/x/3/01",
            b"p/%sem/x/0/0",
            b"p/%sem/x/10001/0",
            b"p/%sem/x/3",
            b"p/%sem/x/3/1/0",
            b"p/%sem/x/3/-1",
            b"p/%sem/x/3/+1",
            b"p/%sem/x/694d77aa",
            b"p/%sem/x/\xff/0",
        ] {
            let err = read(prefix, vec![kv(key, &value)]).expect_err("not a slot");
            assert_eq!(err.kind(), ErrorKind::Protocol, "{err}");
            assert!(!err.is_temporary());
        }
        for value in [&b""[..], b"garbage", br#"{"owner":""}"#, br#"{"owner":5}"#] {
            let err = read(prefix, vec![kv(b"p/%sem/x/3/0", value)]).expect_err("foreign");
            assert_eq!(err.kind(), ErrorKind::Protocol, "{err}");
            assert!(err.message().contains("p/%sem/x/3/0"), "{err}");
        }
    }
}
