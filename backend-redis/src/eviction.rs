//! Refuses a Redis server that may evict a held lock's key (issue #14).
//!
//! Once memory reaches `maxmemory`, Redis deletes keys chosen by its `maxmemory-policy`.
//! `allkeys-*` policies may pick any key. `volatile-*` policies pick keys with a TTL, and
//! every lock key has one (`volatile-ttl` even starts with the shortest TTLs: the locks).
//! Either can delete a held lock, and the next acquire then grants it a second time, so
//! [`check`] refuses both with a `Config` error. `noeviction` deletes nothing (a full
//! server refuses writes with `OOM`, reported as `Unavailable`), and without a memory limit
//! (`maxmemory 0`) no policy evicts anything: both are accepted, the second with a warning.
//! A server that does not let us read its settings (an ACL without `CONFIG`, a managed
//! service that renamed it) is accepted with a warning: the check must not lock anyone out.

use lockcore::{Error, ErrorKind, Result};
use redis::Value;

use crate::client::Node;
use crate::replies::text;

/// What a server's memory settings mean for lock keys.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Eviction {
    /// `noeviction`: nothing is ever deleted to free memory.
    Never,
    /// An evicting policy, but no memory limit: nothing is evicted until one is set.
    Dormant(String),
    /// An evicting policy with a memory limit: a held lock's key can vanish.
    Evicting { policy: String, maxmemory: u64 },
}

/// Judges `maxmemory-policy` and `maxmemory` (bytes). Any policy but `noeviction` evicts,
/// including ones this crate does not know yet.
pub(crate) fn judge(policy: &str, maxmemory: u64) -> Eviction {
    match (policy, maxmemory) {
        ("noeviction", _) => Eviction::Never,
        (_, 0) => Eviction::Dormant(policy.to_owned()),
        _ => Eviction::Evicting {
            policy: policy.to_owned(),
            maxmemory,
        },
    }
}

/// Reads the node's memory settings with one `CONFIG GET maxmemory*` and refuses a server
/// that may evict lock keys.
///
/// # Errors
/// [`ErrorKind::Config`] naming the policy and the fix for an evicting server; the
/// connection's error when the node cannot be reached.
pub(crate) async fn check(node: &Node) -> Result<()> {
    let settings = match node.config_get("maxmemory*").await? {
        Ok(reply) => settings(&reply),
        Err(err) => {
            tracing::warn!(node = node.label(), error = %err, "{UNCHECKED}");
            return Ok(());
        }
    };
    let Some((policy, maxmemory)) = settings else {
        tracing::warn!(
            node = node.label(),
            "unexpected CONFIG GET reply; {UNCHECKED}"
        );
        return Ok(());
    };
    match judge(&policy, maxmemory) {
        Eviction::Never => Ok(()),
        Eviction::Dormant(policy) => {
            tracing::warn!(
                node = node.label(),
                policy,
                "maxmemory-policy evicts keys once a maxmemory limit is set; lock keys could \
                 then vanish: use maxmemory-policy noeviction on lock servers"
            );
            Ok(())
        }
        Eviction::Evicting { policy, maxmemory } => Err(refusal(node.label(), &policy, maxmemory)),
    }
}

const UNCHECKED: &str = "cannot read maxmemory-policy (CONFIG GET refused: expected for a \
    least-privilege ACL user, which should not be granted CONFIG); make sure the server never \
    evicts keys (maxmemory-policy noeviction), or held locks may vanish";

/// The `Config` error for an evicting server: what, why, and the fix.
pub(crate) fn refusal(node: &str, policy: &str, maxmemory: u64) -> Error {
    Error::new(
        ErrorKind::Config,
        format!(
            "{node} has maxmemory-policy {policy} with maxmemory {maxmemory} bytes: under \
             memory pressure it may evict a held lock's key and the lock is then granted \
             twice. Set `maxmemory-policy noeviction` on the lock server (a full server then \
             refuses writes, reported as Unavailable) or `maxmemory 0`; volatile-* policies \
             are refused too, because every lock key has a TTL"
        ),
    )
}

/// `maxmemory-policy` and `maxmemory` from a `CONFIG GET` reply: a flat name/value array
/// (RESP2) or a map (RESP3).
fn settings(reply: &Value) -> Option<(String, u64)> {
    let pairs: Vec<(String, String)> = match reply {
        Value::Array(items) => items
            .chunks_exact(2)
            .filter_map(|pair| Some((text(&pair[0])?, text(&pair[1])?)))
            .collect(),
        Value::Map(entries) => entries
            .iter()
            .filter_map(|(k, v)| Some((text(k)?, text(v)?)))
            .collect(),
        _ => return None,
    };
    let find = |name: &str| {
        pairs
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.clone())
    };
    let policy = find("maxmemory-policy")?;
    let maxmemory = find("maxmemory")?.parse().ok()?;
    Some((policy, maxmemory))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bulk(s: &str) -> Value {
        Value::BulkString(s.as_bytes().to_vec())
    }

    #[test]
    fn only_noeviction_or_no_limit_keeps_lock_keys() {
        assert_eq!(judge("noeviction", 1 << 20), Eviction::Never);
        assert_eq!(judge("noeviction", 0), Eviction::Never);
        assert_eq!(
            judge("allkeys-lru", 0),
            Eviction::Dormant("allkeys-lru".into())
        );
        for policy in ["allkeys-lru", "allkeys-lfu", "allkeys-random"] {
            assert!(
                matches!(judge(policy, 1), Eviction::Evicting { .. }),
                "{policy}"
            );
        }
        for policy in [
            "volatile-lru",
            "volatile-lfu",
            "volatile-random",
            "volatile-ttl",
        ] {
            assert!(
                matches!(judge(policy, 1), Eviction::Evicting { .. }),
                "{policy}"
            );
        }
        assert!(matches!(
            judge("some-new-policy", 1),
            Eviction::Evicting { .. }
        ));
    }

    #[test]
    fn both_reply_shapes_parse() {
        let flat = Value::Array(vec![
            bulk("maxmemory"),
            bulk("67108864"),
            bulk("maxmemory-samples"),
            bulk("5"),
            bulk("maxmemory-policy"),
            bulk("allkeys-lru"),
        ]);
        let expected = Some(("allkeys-lru".to_owned(), 67_108_864));
        assert_eq!(settings(&flat), expected);
        let map = Value::Map(vec![
            (bulk("maxmemory-policy"), bulk("allkeys-lru")),
            (bulk("maxmemory"), bulk("67108864")),
        ]);
        assert_eq!(settings(&map), expected);
        assert_eq!(settings(&Value::Array(vec![bulk("maxmemory")])), None);
        assert_eq!(settings(&Value::Nil), None);
    }

    #[test]
    fn the_refusal_names_the_policy_and_the_fix() {
        let err = refusal("redis://h:1/0", "volatile-ttl", 1024);
        assert_eq!(err.kind(), ErrorKind::Config);
        let text = err.to_string();
        assert!(text.contains("volatile-ttl"), "{text}");
        assert!(text.contains("maxmemory-policy noeviction"), "{text}");
    }
}
