//! What an owner key says: the holder it names (the grant string a lease carries is in
//! `backend/grant.rs`).

use std::time::Duration;

use anylock_etcd_proto::mvccpb::KeyValue;
use lockcore::{FenceToken, HolderInfo};

use crate::keys;

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
