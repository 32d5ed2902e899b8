//! A raw etcd client on the generated gRPC clients, for acting as an operator (`etcdctl`)
//! or another client would: plain requests, no retries, no anylock logic.

use anylock_etcd_proto::etcdserverpb::kv_client::KvClient;
use anylock_etcd_proto::etcdserverpb::lease_client::LeaseClient;
use anylock_etcd_proto::etcdserverpb::maintenance_client::MaintenanceClient;
use anylock_etcd_proto::etcdserverpb::range_request::{SortOrder, SortTarget};
use anylock_etcd_proto::etcdserverpb::{
    DeleteRangeRequest, LeaseGrantRequest, LeaseLeasesRequest, LeaseRevokeRequest,
    LeaseTimeToLiveRequest, PutRequest, PutResponse, RangeRequest, StatusRequest, StatusResponse,
};
use anylock_etcd_proto::mvccpb::KeyValue;
use tonic::Status;
use tonic::transport::{Channel, Endpoint};

/// Clients for the KV, Lease and Maintenance services over one channel to `endpoints`.
#[derive(Debug, Clone)]
pub(crate) struct Raw {
    kv: KvClient<Channel>,
    lease: LeaseClient<Channel>,
    maintenance: MaintenanceClient<Channel>,
}

/// The end of the range of keys starting with `prefix` (etcd's `WithPrefix`).
pub(crate) fn prefix_end(prefix: &[u8]) -> Vec<u8> {
    let mut end = prefix.to_vec();
    while let Some(last) = end.pop() {
        if last < 0xff {
            end.push(last + 1);
            return end;
        }
    }
    vec![0]
}

impl Raw {
    /// A client balanced over `endpoints` (`http://host:port`), connecting on first use.
    pub(crate) fn connect(endpoints: &[String]) -> Raw {
        let endpoints = endpoints
            .iter()
            .map(|e| Endpoint::from_shared(e.clone()).expect("endpoint URL"));
        let channel = Channel::balance_list(endpoints);
        Raw {
            kv: KvClient::new(channel.clone()),
            lease: LeaseClient::new(channel.clone()),
            maintenance: MaintenanceClient::new(channel),
        }
    }

    /// The keys under `prefix`, lowest create revision first; `limit` 0 for all;
    /// `serializable` to read the member's local state.
    pub(crate) async fn by_creation(
        &mut self,
        prefix: &str,
        limit: i64,
        serializable: bool,
    ) -> Result<Vec<KeyValue>, Status> {
        let request = RangeRequest {
            key: prefix.as_bytes().to_vec(),
            range_end: prefix_end(prefix.as_bytes()),
            limit,
            sort_order: SortOrder::Ascend.into(),
            sort_target: SortTarget::Create.into(),
            serializable,
            ..RangeRequest::default()
        };
        Ok(self.kv.range(request).await?.into_inner().kvs)
    }

    /// Deletes one key (as `etcdctl del key`); how many were deleted.
    pub(crate) async fn delete(&mut self, key: impl Into<Vec<u8>>) -> Result<i64, Status> {
        let request = DeleteRangeRequest {
            key: key.into(),
            ..DeleteRangeRequest::default()
        };
        Ok(self.kv.delete_range(request).await?.into_inner().deleted)
    }

    /// Deletes every key under `prefix` (as `etcdctl del --prefix`).
    pub(crate) async fn delete_prefix(&mut self, prefix: &str) -> Result<i64, Status> {
        let request = DeleteRangeRequest {
            key: prefix.as_bytes().to_vec(),
            range_end: prefix_end(prefix.as_bytes()),
            ..DeleteRangeRequest::default()
        };
        Ok(self.kv.delete_range(request).await?.into_inner().deleted)
    }

    /// Puts `key` = `value` bound to `lease` (0: none).
    pub(crate) async fn put(
        &mut self,
        key: impl Into<Vec<u8>>,
        value: impl Into<Vec<u8>>,
        lease: i64,
    ) -> Result<PutResponse, Status> {
        let request = PutRequest {
            key: key.into(),
            value: value.into(),
            lease,
            ..PutRequest::default()
        };
        Ok(self.kv.put(request).await?.into_inner())
    }

    /// A new lease of `ttl` seconds; its id.
    pub(crate) async fn lease_grant(&mut self, ttl: i64) -> Result<i64, Status> {
        let request = LeaseGrantRequest { ttl, id: 0 };
        Ok(self.lease.lease_grant(request).await?.into_inner().id)
    }

    /// Revokes lease `id` (its keys are deleted).
    pub(crate) async fn lease_revoke(&mut self, id: i64) -> Result<(), Status> {
        self.lease.lease_revoke(LeaseRevokeRequest { id }).await?;
        Ok(())
    }

    /// Lease `id`'s remaining TTL in seconds (-1 when it is gone).
    pub(crate) async fn lease_time_to_live(&mut self, id: i64) -> Result<i64, Status> {
        let request = LeaseTimeToLiveRequest { id, keys: false };
        Ok(self
            .lease
            .lease_time_to_live(request)
            .await?
            .into_inner()
            .ttl)
    }

    /// How many leases exist.
    pub(crate) async fn lease_count(&mut self) -> Result<usize, Status> {
        let reply = self.lease.lease_leases(LeaseLeasesRequest {}).await?;
        Ok(reply.into_inner().leases.len())
    }

    /// The member's status (its leader, its own id in the header).
    pub(crate) async fn status(&mut self) -> Result<StatusResponse, Status> {
        Ok(self
            .maintenance
            .status(StatusRequest {})
            .await?
            .into_inner())
    }
}
