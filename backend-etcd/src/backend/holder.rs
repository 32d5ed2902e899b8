//! What a key and a lease say: the holder an owner key names, and the grant string a
//! lease carries (`"<lease id in hex>:<create revision>"`).

use std::time::Duration;

use anylock_etcd_proto::mvccpb::KeyValue;
use lockcore::{Error, FenceToken, HolderInfo, Lease, Result};

use crate::keys;

/// The grant string of a lease: its etcd lease id and its key's create revision.
pub(super) fn grant_of(lease: i64, revision: i64) -> String {
    format!("{lease:x}:{revision}")
}

/// The holder an owner key names: owner, note and time from its value, its create
/// revision as the token, and its lease's `remaining` TTL.
pub(super) fn holder_info(head: &KeyValue, remaining: Option<Duration>) -> HolderInfo {
    let stored = keys::decode_value(&head.value, head.lease);
    let mut holder = HolderInfo::new(stored.owner).with_note(stored.note);
    if let Ok(rev) = u64::try_from(head.create_revision) {
        holder = holder.with_token(FenceToken::new(rev));
    }
    if let Some(at) = stored.acquired_at {
        holder = holder.with_acquired_at(at);
    }
    if let Some(left) = remaining {
        holder = holder.with_expires_in(left);
    }
    holder
}

/// The lease id and create revision stored in a lease's grant (`"<lease hex>:<rev>"`).
pub(crate) fn parse_grant(lease: &Lease) -> Result<(i64, i64)> {
    let parsed = lease
        .grant()
        .split_once(':')
        .and_then(|(id, rev)| Some((i64::from_str_radix(id, 16).ok()?, rev.parse::<i64>().ok()?)));
    parsed.ok_or_else(|| Error::invalid_input("the lease was not issued by the etcd backend"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use lockcore::{ErrorKind, Identity, LockName};

    #[test]
    fn grants_parse_and_foreign_grants_are_rejected() {
        let name = LockName::new("x").expect("valid");
        let lease = Lease::new(
            name.clone(),
            Identity::unique(),
            lockcore::Ttl::new(Duration::from_secs(1)).expect("valid TTL"),
            "1f:42",
        );
        assert_eq!(parse_grant(&lease).expect("ours"), (0x1f, 42));
        for bad in ["", "42", "zz:1", "1f:", "1f:x"] {
            let lease = Lease::new(
                name.clone(),
                Identity::unique(),
                lockcore::Ttl::new(Duration::from_secs(1)).expect("valid TTL"),
                bad,
            );
            let err = parse_grant(&lease).expect_err(bad);
            assert_eq!(err.kind(), ErrorKind::InvalidInput);
        }
    }
}
