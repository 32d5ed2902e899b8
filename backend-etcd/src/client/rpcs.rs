//! The etcd RPCs the backend makes, one method each: leases, the lock transactions,
//! reads, listing pages and the delete watch.

use std::time::Duration;

use anylock_etcd_proto::etcdserverpb::compare::CompareResult;
use anylock_etcd_proto::etcdserverpb::response_op::Response;
use anylock_etcd_proto::etcdserverpb::watch_create_request::FilterType;
use anylock_etcd_proto::etcdserverpb::watch_request::RequestUnion;
use anylock_etcd_proto::etcdserverpb::{
    LeaseGrantRequest, LeaseRevokeRequest, LeaseTimeToLiveRequest, RangeRequest, RangeResponse,
    ResponseHeader, TxnRequest, TxnResponse, WatchCreateRequest, WatchRequest, WatchResponse,
};
use anylock_etcd_proto::mvccpb::KeyValue;
use lockcore::{ErrorKind, Result};

use super::EtcdClient;
use crate::error::{Op, malformed};
use crate::grpc::{Connection, RpcError, WatchStream};
use crate::keys::range_end;
use crate::requests::{self, Pin};

/// The outcome of the create-if-free transaction.
#[derive(Debug)]
pub(crate) enum Created {
    /// Our key was created: it is the only key, so it owns the lock.
    Won { revision: i64 },
    /// The lock has keys; `head` has the lowest create revision (the owner).
    Held { head: KeyValue },
}

impl EtcdClient {
    /// LeaseGrant: a new lease of `ttl_secs`; returns its id and the TTL etcd granted
    /// (etcd raises TTLs below its minimum, about 2 s with default election settings).
    pub(crate) async fn grant(&self, ttl_secs: i64) -> Result<(i64, i64)> {
        let request = LeaseGrantRequest {
            ttl: ttl_secs,
            id: 0,
        };
        let grant =
            |c: Connection, r| async move { Ok(c.lease().lease_grant(r).await?.into_inner()) };
        let resp = self.call(Op::LeaseGrant, request, grant).await?;
        Ok((resp.id, resp.ttl))
    }

    /// One Txn: if no key exists under `prefix`, put `key` bound to `lease`; otherwise
    /// read the key with the lowest create revision.
    pub(crate) async fn create_if_free(
        &self,
        prefix: &[u8],
        key: &[u8],
        value: &[u8],
        lease: i64,
    ) -> Result<Created> {
        let free = requests::create_revision_of_prefix(prefix, CompareResult::Equal, 0);
        let txn = requests::txn(
            vec![free],
            vec![requests::put(key, value, lease)],
            vec![requests::range_op(requests::first_created(prefix))],
        );
        let resp = self.call(Op::CreateIfFree, txn, txn_rpc).await?;
        if resp.succeeded {
            return Ok(Created::Won {
                revision: revision_of(resp.header.as_ref(), Op::CreateIfFree)?,
            });
        }
        match resp.responses.into_iter().next().and_then(|op| op.response) {
            Some(Response::ResponseRange(mut get)) if !get.kvs.is_empty() => Ok(Created::Held {
                head: get.kvs.swap_remove(0),
            }),
            _ => Err(malformed(
                Op::CreateIfFree,
                "no owner key in the failure branch",
            )),
        }
    }

    /// One Txn: if `head` is unchanged, delete it, and if it was the only key under
    /// `prefix`, put `key` bound to `lease` in its place. Returns the new key's create
    /// revision when it was put.
    pub(crate) async fn retake(
        &self,
        prefix: &[u8],
        head: &KeyValue,
        key: &[u8],
        value: &[u8],
        lease: i64,
    ) -> Result<Option<i64>> {
        let head_key = head.key.as_slice();
        let mut after_head = head_key.to_vec();
        after_head.push(0);
        let alone = vec![
            requests::create_revision(prefix, head_key.to_vec(), CompareResult::Equal, 0),
            requests::create_revision(&after_head, range_end(prefix), CompareResult::Equal, 0),
        ];
        let put = requests::txn(alone, vec![requests::put(key, value, lease)], Vec::new());
        let txn = requests::txn(
            vec![requests::mod_revision_is(head_key, head.mod_revision)],
            vec![requests::delete_op(head_key), requests::txn_op(put)],
            Vec::new(),
        );
        let resp = self.call(Op::Retake, txn, txn_rpc).await?;
        let put_done = resp.succeeded
            && resp.responses.iter().any(
                |op| matches!(&op.response, Some(Response::ResponseTxn(inner)) if inner.succeeded),
            );
        if !put_done {
            return Ok(None);
        }
        revision_of(resp.header.as_ref(), Op::Retake).map(Some)
    }

    /// LeaseRevoke: deletes every key bound to `lease` (ours: exactly our lock key). A lease
    /// that is already gone is not an error.
    pub(crate) async fn revoke(&self, lease: i64) -> Result<()> {
        let request = LeaseRevokeRequest { id: lease };
        let revoke = |c: Connection, r| async move { Ok(c.lease().lease_revoke(r).await?) };
        match self.call(Op::LeaseRevoke, request, revoke).await {
            Err(err) if err.kind() == ErrorKind::Lost => Ok(()),
            other => other.map(drop),
        }
    }

    /// One Txn: delete `key` if it still has `pin` (a session grant's release: the key of
    /// exactly that grant, never a later one). A key already gone is not an error.
    pub(crate) async fn delete_pinned(&self, key: &[u8], pin: Pin) -> Result<()> {
        let txn = requests::txn(
            vec![pin.compare(key)],
            vec![requests::delete_op(key)],
            Vec::new(),
        );
        self.call(Op::Release, txn, txn_rpc).await.map(drop)
    }

    /// One Txn: delete `key` if it still has `pin` and is bound to `lease` (a key a failed
    /// release or move left on a session lease: never another grant's key, never one
    /// moved to a lease of its own). A key gone is not an error.
    pub(crate) async fn delete_pinned_on(&self, key: &[u8], pin: Pin, lease: i64) -> Result<()> {
        let txn = requests::txn(
            vec![pin.compare(key), requests::lease_is(key, lease)],
            vec![requests::delete_op(key)],
            Vec::new(),
        );
        self.call(Op::Release, txn, txn_rpc).await.map(drop)
    }

    /// One Txn: delete `key` if its value is exactly `value` (the clean-up after a grant
    /// whose outcome is unknown: only the key that attempt may have written).
    pub(crate) async fn delete_if_value(&self, key: &[u8], value: &[u8]) -> Result<bool> {
        let txn = requests::txn(
            vec![requests::value_is(key, value)],
            vec![requests::delete_op(key)],
            Vec::new(),
        );
        Ok(self.call(Op::Release, txn, txn_rpc).await?.succeeded)
    }

    /// One Txn: if `key` still has `pin` and is bound to `from`, bind it to `to`, keeping
    /// its value and create revision. The revision of the move when it moved (the key's
    /// new mod revision), `None` when it did not.
    pub(crate) async fn rebind(
        &self,
        key: &[u8],
        pin: Pin,
        from: i64,
        to: i64,
    ) -> Result<Option<i64>> {
        let txn = requests::txn(
            vec![pin.compare(key), requests::lease_is(key, from)],
            vec![requests::rebind(key, to)],
            Vec::new(),
        );
        let resp = self.call(Op::Detach, txn, txn_rpc).await?;
        if !resp.succeeded {
            return Ok(None);
        }
        revision_of(resp.header.as_ref(), Op::Detach).map(Some)
    }

    /// DeleteRange on one key; whether it existed.
    pub(crate) async fn delete(&self, key: &[u8]) -> Result<bool> {
        let request = requests::delete(key);
        let delete =
            |c: Connection, r| async move { Ok(c.kv().delete_range(r).await?.into_inner()) };
        Ok(self.call(Op::Delete, request, delete).await?.deleted > 0)
    }

    /// One Txn of keys-only Ranges, one per key of `keys` (at most etcd's
    /// `--max-txn-ops`), read at one revision: each key's create revision and lease (its
    /// value left out), `None` for a key that does not exist.
    ///
    /// # Errors
    /// As any read; a reply without one Range reply per key is a temporary `Protocol`
    /// error.
    pub(crate) async fn check_keys(&self, keys: &[Vec<u8>]) -> Result<Vec<Option<KeyValue>>> {
        let ranges = keys
            .iter()
            .map(|key| requests::range_op(requests::key_only(key)));
        let txn = requests::txn(Vec::new(), ranges.collect(), Vec::new());
        let resp = self.call(Op::CheckKeys, txn, txn_rpc).await?;
        let unreadable = || {
            malformed(Op::CheckKeys, "not one Range reply per key")
                .with_status(lockcore::RetryStatus::Temporary)
        };
        if !resp.succeeded || resp.responses.len() != keys.len() {
            return Err(unreadable());
        }
        let read = resp
            .responses
            .into_iter()
            .zip(keys)
            .map(|(op, key)| match op.response {
                Some(Response::ResponseRange(range)) => {
                    Ok(range.kvs.into_iter().find(|kv| kv.key == *key))
                }
                _ => Err(unreadable()),
            });
        read.collect()
    }

    /// Range on one key (linearizable).
    pub(crate) async fn get(&self, key: &[u8]) -> Result<Option<KeyValue>> {
        let resp = self.call(Op::Get, requests::get(key), range_rpc).await?;
        Ok(resp.kvs.into_iter().next())
    }

    /// Range on `prefix`, lowest create revision first, one key: the owner.
    pub(crate) async fn head(&self, prefix: &[u8]) -> Result<Option<KeyValue>> {
        let request = requests::first_created(prefix);
        let resp = self.call(Op::Get, request, range_rpc).await?;
        Ok(resp.kvs.into_iter().next())
    }

    /// One page of a keys-only scan of `[from, range_end)` (linearizable): the keys, and
    /// whether more follow.
    pub(crate) async fn keys_page(
        &self,
        from: &[u8],
        range_end: &[u8],
        limit: i64,
    ) -> Result<(Vec<KeyValue>, bool)> {
        let request = requests::keys_page(from, range_end, limit);
        let resp = self.call(Op::List, request, range_rpc).await?;
        Ok((resp.kvs, resp.more))
    }

    /// LeaseTimeToLive: the remaining TTL, `None` when the lease is gone.
    pub(crate) async fn time_to_live(&self, lease: i64) -> Result<Option<Duration>> {
        let request = LeaseTimeToLiveRequest {
            id: lease,
            keys: false,
        };
        let ttl = |c: Connection, r| async move {
            Ok(c.lease().lease_time_to_live(r).await?.into_inner())
        };
        let resp = self.call(Op::LeaseTimeToLive, request, ttl).await?;
        Ok(u64::try_from(resp.ttl).ok().map(Duration::from_secs))
    }

    /// Watch: delete events under `prefix`, returned once etcd confirmed the watch exists
    /// (so no delete after this returns is missed).
    pub(crate) async fn watch_deletes(&self, prefix: &[u8]) -> Result<WatchStream> {
        self.watch_deletes_under(&[prefix]).await
    }

    /// One Watch stream (1 RPC) carrying a watch for delete events under each of
    /// `prefixes`, returned once etcd confirmed every one of them.
    pub(crate) async fn watch_deletes_under(&self, prefixes: &[&[u8]]) -> Result<WatchStream> {
        let requests: Vec<WatchRequest> = prefixes
            .iter()
            .map(|prefix| {
                let (key, range_end) = requests::prefix_range(prefix);
                WatchRequest {
                    request_union: Some(RequestUnion::CreateRequest(WatchCreateRequest {
                        key,
                        range_end,
                        filters: vec![FilterType::Noput.into()],
                        ..WatchCreateRequest::default()
                    })),
                }
            })
            .collect();
        let start = |c: Connection, r: Vec<WatchRequest>| async move {
            let watches = r.len();
            let mut stream = c.watch(r).await?;
            let mut created = 0;
            // Events that come before the last confirmation are dropped: the caller
            // attempts once more after subscribing, which sees any release they report.
            while created < watches {
                let reply = stream.message().await?;
                if reply.as_ref().is_some_and(|r| r.created) || reply.is_none() {
                    watch_started(reply.as_ref())?;
                    created += 1;
                }
            }
            Ok(stream)
        };
        self.call(Op::Watch, requests, start).await
    }
}

/// Whether a watch's first reply confirms it. etcd refuses a watch with a stale token not
/// by failing the RPC but by a cancel whose reason names the token: that becomes the
/// status it stands for, so [`Connection::call`](crate::grpc::Connection::call)
/// re-authenticates and repeats it once, as for any other RPC.
fn watch_started(first: Option<&WatchResponse>) -> Result<(), RpcError> {
    match first {
        Some(resp) if resp.created && !resp.canceled => Ok(()),
        Some(resp) if resp.cancel_reason.contains("invalid auth token") => Err(RpcError::Status(
            tonic::Status::unauthenticated(resp.cancel_reason.clone()),
        )),
        Some(resp) if !resp.cancel_reason.is_empty() => Err(RpcError::Watch(format!(
            "watch not created: {}",
            resp.cancel_reason
        ))),
        _ => Err(RpcError::Watch("watch not created".into())),
    }
}

/// Txn, for [`EtcdClient::call`].
pub(crate) async fn txn_rpc(c: Connection, txn: TxnRequest) -> Result<TxnResponse, RpcError> {
    Ok(c.kv().txn(txn).await?.into_inner())
}

/// Range, for [`EtcdClient::call`].
pub(crate) async fn range_rpc(
    c: Connection,
    range: RangeRequest,
) -> Result<RangeResponse, RpcError> {
    Ok(c.kv().range(range).await?.into_inner())
}

/// The revision of a reply's header: where a write happened.
pub(crate) fn revision_of(header: Option<&ResponseHeader>, op: Op) -> Result<i64> {
    header
        .map(|h| h.revision)
        .filter(|rev| *rev > 0)
        .ok_or_else(|| malformed(op, "the reply has no revision"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use RpcError as E;

    /// etcd answers a watch with a stale token by a cancel, not a failed RPC: that must
    /// read as the invalid token it is, so the call re-authenticates and repeats it.
    #[test]
    fn a_watch_cancelled_for_its_token_asks_for_a_new_token() {
        let created = WatchResponse {
            created: true,
            ..WatchResponse::default()
        };
        assert!(watch_started(Some(&created)).is_ok());
        let stale = WatchResponse {
            created: true,
            canceled: true,
            cancel_reason:
                "rpc error: code = Unauthenticated desc = etcdserver: invalid auth token".into(),
            ..WatchResponse::default()
        };
        match watch_started(Some(&stale)) {
            Err(E::Status(s)) => assert!(crate::grpc::is_invalid_token(&s), "{s:?}"),
            other => panic!("expected an invalid-token status: {other:?}"),
        }
        let denied = WatchResponse {
            created: true,
            canceled: true,
            cancel_reason: "etcdserver: permission denied".into(),
            ..WatchResponse::default()
        };
        match watch_started(Some(&denied)) {
            Err(E::Watch(why)) => assert!(why.contains("permission denied"), "{why}"),
            other => panic!("expected the reason in the error: {other:?}"),
        }
        assert!(matches!(watch_started(None), Err(E::Watch(_))));
    }
}
