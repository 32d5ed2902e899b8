//! The RPCs of semaphores (the key layout is in `slots.rs`): read a semaphore's slot keys,
//! take a free slot, retake our own, and clean up after a take whose outcome is unknown.

use anylock_etcd_proto::etcdserverpb::compare::CompareResult;
use anylock_etcd_proto::etcdserverpb::response_op::Response;
use anylock_etcd_proto::etcdserverpb::{ResponseOp, TxnResponse};
use anylock_etcd_proto::mvccpb::KeyValue;
use lockcore::Result;

use super::EtcdClient;
use super::rpcs::{range_rpc, revision_of, txn_rpc};
use crate::error::{Op, malformed};
use crate::keys::range_end;
use crate::requests;

/// What a take or retake Txn did.
#[derive(Debug)]
pub(crate) enum Taken {
    /// Our value was put, at `revision` (the slot's new mod revision), on the `at`-th of
    /// the keys offered.
    Won { revision: i64, at: usize },
    /// Nothing was written: the semaphore's keys as the same Txn read them.
    Lost { kvs: Vec<KeyValue> },
}

impl EtcdClient {
    /// Range (linearizable) on every key of the semaphore whose range is `semaphore`,
    /// with values.
    pub(crate) async fn slots(&self, semaphore: &[u8]) -> Result<Vec<KeyValue>> {
        let resp = self
            .call(Op::Slots, requests::under(semaphore), range_rpc)
            .await?;
        if resp.more {
            return Err(malformed(
                Op::Slots,
                "a Range without a limit said more keys follow",
            ));
        }
        Ok(resp.kvs)
    }

    /// One Txn: if no key of `semaphore` lies outside `limit` (the range of the slots of
    /// our number of permits: no permit of another limit exists), put `value` bound to
    /// `lease` on the first of `free` that does not exist (nested Txns, one per key, each
    /// trying the next when its key exists); otherwise read the whole semaphore.
    pub(crate) async fn take_slot(
        &self,
        (semaphore, limit): (&[u8], &[u8]),
        free: &[Vec<u8>],
        value: &[u8],
        lease: i64,
    ) -> Result<Taken> {
        let read = || requests::range_op(requests::under(semaphore));
        let mut chain = None;
        for key in free.iter().rev() {
            let failure = match chain.take() {
                Some(next) => vec![requests::txn_op(next)],
                None => vec![read()],
            };
            let missing = requests::create_revision(key, Vec::new(), CompareResult::Equal, 0);
            let put = vec![requests::put(key, value, lease)];
            chain = Some(requests::txn(vec![missing], put, failure));
        }
        let Some(chain) = chain else {
            return Err(malformed(Op::TakeSlot, "no free slot to take"));
        };
        let below = requests::create_revision(semaphore, limit.to_vec(), CompareResult::Equal, 0);
        let above = requests::create_revision(
            &range_end(limit),
            range_end(semaphore),
            CompareResult::Equal,
            0,
        );
        let txn = requests::txn(
            vec![below, above],
            vec![requests::txn_op(chain)],
            vec![read()],
        );
        let resp = self.call(Op::TakeSlot, txn, txn_rpc).await?;
        taken(resp, free.len())
    }

    /// One Txn: if our slot `slot` still has its mod revision, put `value` bound to
    /// `lease` on it (a new grant in place: a new mod revision); otherwise read the whole
    /// semaphore `semaphore`.
    pub(crate) async fn retake_slot(
        &self,
        semaphore: &[u8],
        slot: &KeyValue,
        value: &[u8],
        lease: i64,
    ) -> Result<Taken> {
        let txn = requests::txn(
            vec![requests::mod_revision_is(&slot.key, slot.mod_revision)],
            vec![requests::put(&slot.key, value, lease)],
            vec![requests::range_op(requests::under(semaphore))],
        );
        let resp = self.call(Op::RetakeSlot, txn, txn_rpc).await?;
        retaken(resp)
    }

    /// One Txn: deletes whichever of `keys` holds exactly `value` (the clean-up after a
    /// take whose outcome is unknown: only the slot that attempt may have written).
    pub(crate) async fn delete_any_with_value(&self, keys: &[Vec<u8>], value: &[u8]) -> Result<()> {
        let each = keys.iter().map(|key| {
            requests::txn_op(requests::txn(
                vec![requests::value_is(key, value)],
                vec![requests::delete_op(key)],
                Vec::new(),
            ))
        });
        let txn = requests::txn(Vec::new(), each.collect(), Vec::new());
        self.call(Op::Release, txn, txn_rpc).await.map(drop)
    }
}

/// The first reply of a branch.
fn first(replies: Vec<ResponseOp>) -> Option<Response> {
    replies.into_iter().next().and_then(|reply| reply.response)
}

/// Reads a take Txn's reply (`offered` keys): down the nested Txns to the one that put
/// (its place among the keys offered), or to the Range that ends the chain.
fn taken(resp: TxnResponse, offered: usize) -> Result<Taken> {
    let bad = || malformed(Op::TakeSlot, "a reply that does not match the request");
    if !resp.succeeded {
        return match first(resp.responses) {
            Some(Response::ResponseRange(range)) => Ok(Taken::Lost { kvs: range.kvs }),
            _ => Err(bad()),
        };
    }
    let Some(Response::ResponseTxn(mut level)) = first(resp.responses) else {
        return Err(bad());
    };
    let mut at = 0;
    loop {
        if level.succeeded {
            if at >= offered {
                return Err(bad());
            }
            let revision = revision_of(resp.header.as_ref(), Op::TakeSlot)?;
            return Ok(Taken::Won { revision, at });
        }
        match first(level.responses) {
            Some(Response::ResponseTxn(next)) => {
                level = next;
                at += 1;
            }
            Some(Response::ResponseRange(range)) => return Ok(Taken::Lost { kvs: range.kvs }),
            _ => return Err(bad()),
        }
    }
}

/// Reads a retake Txn's reply.
fn retaken(resp: TxnResponse) -> Result<Taken> {
    if resp.succeeded {
        let revision = revision_of(resp.header.as_ref(), Op::RetakeSlot)?;
        return Ok(Taken::Won { revision, at: 0 });
    }
    match first(resp.responses) {
        Some(Response::ResponseRange(range)) => Ok(Taken::Lost { kvs: range.kvs }),
        _ => Err(malformed(Op::RetakeSlot, "no Range in the failure branch")),
    }
}
