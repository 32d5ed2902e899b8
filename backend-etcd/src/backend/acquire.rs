//! The acquire paths that make a new grant: a contender without a queue place
//! (LeaseGrant + create-if-free Txn), the same-owner retake, and giving back a lease that
//! will not be used.

use std::time::Duration;

use anylock_etcd_proto::mvccpb::KeyValue;
use lockcore::{Acquire, AcquireRequest, Error, ErrorKind, FenceToken, Lease, Result, Ttl};

use super::EtcdBackend;
use super::holder::{grant_of, holder_info};
use crate::client::Created;
use crate::keys;

impl EtcdBackend {
    /// The lease of a won attempt. Its TTL is the one asked for, or the shorter one etcd
    /// granted; a granted TTL too short to hold a lease at all is a protocol error.
    pub(super) fn lease_for(
        &self,
        request: &AcquireRequest,
        lease: i64,
        granted: i64,
        rev: i64,
    ) -> Result<Acquire> {
        let granted = Duration::from_secs(u64::try_from(granted).unwrap_or(0));
        let ttl = if granted >= request.ttl.get() {
            request.ttl
        } else {
            Ttl::new(granted).map_err(|_| {
                Error::new(
                    ErrorKind::Protocol,
                    format!("etcd granted a lease of {granted:?}, too short to hold a lock"),
                )
            })?
        };
        let lease = Lease::new(
            request.name.clone(),
            request.owner.clone(),
            ttl,
            grant_of(lease, rev),
        );
        Ok(Acquire::Acquired(lease.with_token(FenceToken::new(
            u64::try_from(rev).unwrap_or(0),
        ))))
    }

    /// Same-owner retake: our own abandoned key owns the lock. Replace it with `lease`'s
    /// key when it is the only key; otherwise it has been deleted (handing the lock to the
    /// next waiter, an `etcdctl lock` or Go client) and the lock is held by that waiter.
    async fn retake(
        &self,
        request: &AcquireRequest,
        lease: (i64, i64),
        head: KeyValue,
    ) -> Result<Acquire> {
        let prefix = self.layout.lock_prefix(&request.name);
        let key = self.layout.key(&request.name, lease.0);
        let value = keys::encode_value(&request.owner, request.note.as_ref());
        let retaken = self
            .client
            .retake(&prefix, &head, &key, &value, lease.0)
            .await;
        match retaken {
            Ok(Some(rev)) => self.lease_for(request, lease.0, lease.1, rev),
            Ok(None) => {
                self.discard(lease.0).await;
                match self.holder(&request.name).await? {
                    Some(holder) => Ok(Acquire::Held(holder)),
                    None => Err(Error::unavailable(
                        "the lock changed hands during a same-owner retake; try again",
                    )),
                }
            }
            Err(err) => {
                self.discard_in_background(lease.0);
                Err(err)
            }
        }
    }

    /// The attempt of a contender without a queue place: LeaseGrant, then one Txn that
    /// creates our key only if the lock has no key at all (2 RPCs). When held: revoke the
    /// unused lease and read the holder's TTL (2 more, concurrently).
    pub(super) async fn acquire_unqueued(&self, request: &AcquireRequest) -> Result<Acquire> {
        let name = &request.name;
        let granted = self.client.grant(request.ttl.as_secs()).await;
        let (lease, granted) = granted?;
        let prefix = self.layout.lock_prefix(name);
        let key = self.layout.key(name, lease);
        let value = keys::encode_value(&request.owner, request.note.as_ref());
        let created = match self
            .client
            .create_if_free(&prefix, &key, &value, lease)
            .await
        {
            Ok(created) => created,
            Err(err) => {
                self.discard_in_background(lease);
                return Err(err);
            }
        };
        match created {
            Created::Won { revision } => self.lease_for(request, lease, granted, revision),
            Created::Held { head } if keys::is_owned_by(&head.value, &request.owner) => {
                self.retake(request, (lease, granted), head).await
            }
            Created::Held { head } => {
                let (_, remaining) = tokio::join!(self.discard(lease), self.remaining(&head));
                Ok(Acquire::Held(holder_info(&head, remaining.ok().flatten())))
            }
        }
    }

    /// Revokes a lease we granted but will not use (it holds no key, or a key nobody will
    /// refresh). Failure is harmless: the lease expires by its TTL.
    async fn discard(&self, lease: i64) {
        if let Err(err) = self.client.revoke(lease).await {
            tracing::debug!(error = %err, lease = %format!("{lease:x}"), "revoking an unused lease failed");
        }
    }

    /// As [`discard`](Self::discard), without waiting: after a failed RPC, so a key that
    /// an RPC with an unknown outcome may have created does not block the lock for a TTL.
    fn discard_in_background(&self, lease: i64) {
        let backend = self.clone();
        tokio::spawn(async move { backend.discard(lease).await });
    }
}
