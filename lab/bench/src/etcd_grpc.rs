//! The etcd clients the benchmark's baselines use: etcd's generated gRPC clients (from
//! `anylock-etcd-proto`) on one channel to one member, with the few requests they send.

use anylock_etcd_proto::etcdserverpb::compare::{CompareResult, CompareTarget, TargetUnion};
use anylock_etcd_proto::etcdserverpb::kv_client::KvClient;
use anylock_etcd_proto::etcdserverpb::lease_client::LeaseClient;
use anylock_etcd_proto::etcdserverpb::maintenance_client::MaintenanceClient;
use anylock_etcd_proto::etcdserverpb::request_op::Request;
use anylock_etcd_proto::etcdserverpb::{
    Compare, DeleteRangeRequest, LeaseGrantRequest, LeaseKeepAliveRequest, LeaseKeepAliveResponse,
    LeaseRevokeRequest, PutRequest, RangeRequest, RequestOp, StatusRequest, StatusResponse,
    TxnRequest,
};
use anylock_etcd_proto::v3lockpb::lock_client::LockClient;
use anylock_etcd_proto::v3lockpb::{LockRequest, UnlockRequest};
use tokio::sync::mpsc;
use tonic::Streaming;
use tonic::transport::{Channel, Endpoint};

use crate::op::Res;

/// KV, Lease, Maintenance and etcd's Lock service on one channel; cheap to clone.
#[derive(Clone)]
pub(crate) struct Etcd {
    kv: KvClient<Channel>,
    lease: LeaseClient<Channel>,
    maintenance: MaintenanceClient<Channel>,
    lock: LockClient<Channel>,
}

/// A keep-alive stream: the request side and the replies.
pub(crate) type KeepAlive = (
    mpsc::Sender<LeaseKeepAliveRequest>,
    Streaming<LeaseKeepAliveResponse>,
);

impl Etcd {
    /// A client of the member at `url` (`http://host:port`), connecting on first use.
    pub(crate) fn connect(url: &str) -> Res<Self> {
        let channel = Endpoint::from_shared(url.to_owned())?.connect_lazy();
        Ok(Self {
            kv: KvClient::new(channel.clone()),
            lease: LeaseClient::new(channel.clone()),
            maintenance: MaintenanceClient::new(channel.clone()),
            lock: LockClient::new(channel),
        })
    }

    /// The member's status.
    pub(crate) async fn status(&self) -> Res<StatusResponse> {
        let mut maintenance = self.maintenance.clone();
        Ok(maintenance.status(StatusRequest {}).await?.into_inner())
    }

    /// A linearizable Range of one key.
    pub(crate) async fn get(&self, key: &str) -> Res<()> {
        let request = RangeRequest {
            key: key.as_bytes().to_vec(),
            ..RangeRequest::default()
        };
        self.kv.clone().range(request).await?;
        Ok(())
    }

    /// How many keys start with `prefix`.
    pub(crate) async fn count(&self, prefix: &str) -> Res<i64> {
        let request = RangeRequest {
            key: prefix.as_bytes().to_vec(),
            range_end: prefix_end(prefix.as_bytes()),
            count_only: true,
            ..RangeRequest::default()
        };
        Ok(self.kv.clone().range(request).await?.into_inner().count)
    }

    /// Put `key` = `value` (no lease).
    pub(crate) async fn put(&self, key: &str, value: &str) -> Res<()> {
        let request = PutRequest {
            key: key.as_bytes().to_vec(),
            value: value.as_bytes().to_vec(),
            ..PutRequest::default()
        };
        self.kv.clone().put(request).await?;
        Ok(())
    }

    /// Delete one key.
    pub(crate) async fn delete(&self, key: &str) -> Res<()> {
        let request = DeleteRangeRequest {
            key: key.as_bytes().to_vec(),
            ..DeleteRangeRequest::default()
        };
        self.kv.clone().delete_range(request).await?;
        Ok(())
    }

    /// One Txn: put `key` bound to `lease` if it does not exist; whether it was put.
    pub(crate) async fn create_if_absent(&self, key: &str, lease: i64) -> Res<bool> {
        let absent = Compare {
            result: CompareResult::Equal.into(),
            target: CompareTarget::Create.into(),
            key: key.as_bytes().to_vec(),
            range_end: Vec::new(),
            target_union: Some(TargetUnion::CreateRevision(0)),
        };
        let put = RequestOp {
            request: Some(Request::RequestPut(PutRequest {
                key: key.as_bytes().to_vec(),
                lease,
                ..PutRequest::default()
            })),
        };
        let txn = TxnRequest {
            compare: vec![absent],
            success: vec![put],
            failure: Vec::new(),
        };
        Ok(self.kv.clone().txn(txn).await?.into_inner().succeeded)
    }

    /// A lease of `ttl` seconds; its id.
    pub(crate) async fn lease_grant(&self, ttl: i64) -> Res<i64> {
        let request = LeaseGrantRequest { ttl, id: 0 };
        Ok(self
            .lease
            .clone()
            .lease_grant(request)
            .await?
            .into_inner()
            .id)
    }

    /// Revokes lease `id`.
    pub(crate) async fn lease_revoke(&self, id: i64) -> Res<()> {
        self.lease
            .clone()
            .lease_revoke(LeaseRevokeRequest { id })
            .await?;
        Ok(())
    }

    /// Opens a keep-alive stream for lease `id` and keeps it alive once (request and
    /// reply), as etcd-client's `lease_keep_alive` did.
    pub(crate) async fn lease_keep_alive(&self, id: i64) -> Res<KeepAlive> {
        let (sender, receiver) = mpsc::channel::<LeaseKeepAliveRequest>(100);
        sender.send(LeaseKeepAliveRequest { id }).await?;
        let requests = futures_util::stream::unfold(receiver, |mut receiver| async move {
            receiver.recv().await.map(|item| (item, receiver))
        });
        let mut replies = self
            .lease
            .clone()
            .lease_keep_alive(requests)
            .await?
            .into_inner();
        match replies.message().await? {
            Some(reply) if reply.ttl > 0 => Ok((sender, replies)),
            Some(_) => Err("lease not found".into()),
            None => Err("keep-alive stream ended".into()),
        }
    }

    /// etcd's Lock RPC on `name` with `lease`; the key that holds the lock.
    pub(crate) async fn lock(&self, name: &str, lease: i64) -> Res<Vec<u8>> {
        let request = LockRequest {
            name: name.as_bytes().to_vec(),
            lease,
        };
        Ok(self.lock.clone().lock(request).await?.into_inner().key)
    }

    /// etcd's Unlock RPC on the key [`lock`](Self::lock) returned.
    pub(crate) async fn unlock(&self, key: Vec<u8>) -> Res<()> {
        self.lock.clone().unlock(UnlockRequest { key }).await?;
        Ok(())
    }
}

/// The end of the range of keys starting with `prefix` (etcd's `WithPrefix`).
fn prefix_end(prefix: &[u8]) -> Vec<u8> {
    let mut end = prefix.to_vec();
    while let Some(last) = end.pop() {
        if last < 0xff {
            end.push(last + 1);
            return end;
        }
    }
    vec![0]
}
