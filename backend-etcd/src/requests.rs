//! Builders for the etcd requests the backend sends: key ranges, transaction compares and
//! operations, on the generated messages of `anylock-etcd-proto`.

use anylock_etcd_proto::etcdserverpb::compare::{CompareResult, CompareTarget, TargetUnion};
use anylock_etcd_proto::etcdserverpb::range_request::{SortOrder, SortTarget};
use anylock_etcd_proto::etcdserverpb::request_op::Request;
use anylock_etcd_proto::etcdserverpb::{
    Compare, DeleteRangeRequest, PutRequest, RangeRequest, RequestOp, TxnRequest,
};
use anylock_etcd_proto::mvccpb::KeyValue;

use crate::keys::range_end;

/// The key and range end that cover every key starting with `prefix` (etcd's `WithPrefix`;
/// an empty prefix covers all keys).
pub(crate) fn prefix_range(prefix: &[u8]) -> (Vec<u8>, Vec<u8>) {
    if prefix.is_empty() {
        (vec![0], vec![0])
    } else {
        (prefix.to_vec(), range_end(prefix))
    }
}

/// Range on one key.
pub(crate) fn get(key: &[u8]) -> RangeRequest {
    RangeRequest {
        key: key.to_vec(),
        ..RangeRequest::default()
    }
}

/// Range on one key without its value (its create revision and lease are enough).
pub(crate) fn key_only(key: &[u8]) -> RangeRequest {
    RangeRequest {
        key: key.to_vec(),
        keys_only: true,
        ..RangeRequest::default()
    }
}

/// Range on `prefix`, lowest create revision first, one key: the owner.
pub(crate) fn first_created(prefix: &[u8]) -> RangeRequest {
    let (key, range_end) = prefix_range(prefix);
    RangeRequest {
        key,
        range_end,
        limit: 1,
        sort_order: SortOrder::Ascend.into(),
        sort_target: SortTarget::Create.into(),
        ..RangeRequest::default()
    }
}

/// One page of a listing scan: the keys in `[from, range_end)` in key order, without
/// their values (a waiter's or a foreign key's value is never needed, and a page of keys
/// stays small however large the values are), at most `limit`.
pub(crate) fn keys_page(from: &[u8], range_end: &[u8], limit: i64) -> RangeRequest {
    RangeRequest {
        key: from.to_vec(),
        range_end: range_end.to_vec(),
        limit,
        keys_only: true,
        sort_order: SortOrder::Ascend.into(),
        sort_target: SortTarget::Key.into(),
        ..RangeRequest::default()
    }
}

/// Range on every key under `prefix`, with values, in key order (a semaphore's slots).
pub(crate) fn under(prefix: &[u8]) -> RangeRequest {
    let (key, range_end) = prefix_range(prefix);
    RangeRequest {
        key,
        range_end,
        ..RangeRequest::default()
    }
}

/// Range on `prefix` that only counts.
pub(crate) fn count(prefix: &[u8]) -> RangeRequest {
    let (key, range_end) = prefix_range(prefix);
    RangeRequest {
        key,
        range_end,
        count_only: true,
        ..RangeRequest::default()
    }
}

/// Compare: the create revision of `key` (up to `range_end`, if not empty) against `value`.
pub(crate) fn create_revision(
    key: &[u8],
    range_end: Vec<u8>,
    result: CompareResult,
    value: i64,
) -> Compare {
    Compare {
        result: result.into(),
        target: CompareTarget::Create.into(),
        key: key.to_vec(),
        range_end,
        target_union: Some(TargetUnion::CreateRevision(value)),
    }
}

/// Compare: the create revision of every key starting with `prefix` against `value`.
pub(crate) fn create_revision_of_prefix(
    prefix: &[u8],
    result: CompareResult,
    value: i64,
) -> Compare {
    create_revision(prefix, range_end(prefix), result, value)
}

/// Compare: `key`'s mod revision equals `value`.
pub(crate) fn mod_revision_is(key: &[u8], value: i64) -> Compare {
    Compare {
        result: CompareResult::Equal.into(),
        target: CompareTarget::Mod.into(),
        key: key.to_vec(),
        range_end: Vec::new(),
        target_union: Some(TargetUnion::ModRevision(value)),
    }
}

/// Which revision of its key identifies a grant: a lock key's create revision (every
/// lock grant creates its key), or a semaphore slot key's mod revision (a same-owner
/// retake rewrites the slot in place, keeping its create revision; see `slots.rs`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Pin {
    Created(i64),
    Modified(i64),
}

impl Pin {
    /// Compare: `key` still has this revision.
    pub(crate) fn compare(self, key: &[u8]) -> Compare {
        match self {
            Self::Created(revision) => {
                create_revision(key, Vec::new(), CompareResult::Equal, revision)
            }
            Self::Modified(revision) => mod_revision_is(key, revision),
        }
    }

    /// Whether `kv` (as read) still has this revision.
    pub(crate) fn holds(self, kv: &KeyValue) -> bool {
        match self {
            Self::Created(revision) => kv.create_revision == revision,
            Self::Modified(revision) => kv.mod_revision == revision,
        }
    }
}

/// Compare: `key`'s value equals `value`.
pub(crate) fn value_is(key: &[u8], value: &[u8]) -> Compare {
    Compare {
        result: CompareResult::Equal.into(),
        target: CompareTarget::Value.into(),
        key: key.to_vec(),
        range_end: Vec::new(),
        target_union: Some(TargetUnion::Value(value.to_vec())),
    }
}

/// Compare: `key` is bound to `lease`.
pub(crate) fn lease_is(key: &[u8], lease: i64) -> Compare {
    Compare {
        result: CompareResult::Equal.into(),
        target: CompareTarget::Lease.into(),
        key: key.to_vec(),
        range_end: Vec::new(),
        target_union: Some(TargetUnion::Lease(lease)),
    }
}

/// Put `key`, keeping its value, bound to `lease` (the key must exist).
pub(crate) fn rebind(key: &[u8], lease: i64) -> RequestOp {
    op(Request::RequestPut(PutRequest {
        key: key.to_vec(),
        lease,
        ignore_value: true,
        ..PutRequest::default()
    }))
}

/// Put `key` = `value` bound to `lease`.
pub(crate) fn put(key: &[u8], value: &[u8], lease: i64) -> RequestOp {
    op(Request::RequestPut(PutRequest {
        key: key.to_vec(),
        value: value.to_vec(),
        lease,
        ..PutRequest::default()
    }))
}

/// Delete one key.
pub(crate) fn delete(key: &[u8]) -> DeleteRangeRequest {
    DeleteRangeRequest {
        key: key.to_vec(),
        ..DeleteRangeRequest::default()
    }
}

/// A Range as a transaction operation.
pub(crate) fn range_op(range: RangeRequest) -> RequestOp {
    op(Request::RequestRange(range))
}

/// A DeleteRange as a transaction operation.
pub(crate) fn delete_op(key: &[u8]) -> RequestOp {
    op(Request::RequestDeleteRange(delete(key)))
}

/// A nested transaction as an operation.
pub(crate) fn txn_op(txn: TxnRequest) -> RequestOp {
    op(Request::RequestTxn(txn))
}

/// A transaction: `success` if every compare holds, else `failure`.
pub(crate) fn txn(
    compare: Vec<Compare>,
    success: Vec<RequestOp>,
    failure: Vec<RequestOp>,
) -> TxnRequest {
    TxnRequest {
        compare,
        success,
        failure,
    }
}

fn op(request: Request) -> RequestOp {
    RequestOp {
        request: Some(request),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prefix_ranges_follow_etcd() {
        assert_eq!(prefix_range(b"a/"), (b"a/".to_vec(), b"a0".to_vec()));
        assert_eq!(prefix_range(b""), (vec![0], vec![0]));
        let head = first_created(b"locks/x/");
        assert_eq!(head.range_end, b"locks/x0");
        assert_eq!((head.limit, head.sort_order, head.sort_target), (1, 1, 2));
    }
}
