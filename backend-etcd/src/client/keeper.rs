//! Keep-alives for the client's callers, on the shared pool of keep-alive streams
//! (`keepalive.rs`): a batch of leases in one round trip, under the request timeout.

use std::sync::{Arc, Mutex, PoisonError};

use futures_util::future::join_all;
use lockcore::Result;

use super::EtcdClient;
use crate::error::{Failure, Op, map_error};
use crate::grpc::{Connection, RpcError};
use crate::keepalive::{Used, stream_closed};

impl EtcdClient {
    /// Keeps every lease in `ids` alive over the shared keep-alive streams (each lease on
    /// its own stream of the pool): one request each, sent at once, answered in one round
    /// trip. Returns each lease's TTL as etcd
    /// answered, in order (`<= 0`: the lease does not exist).
    ///
    /// # Errors
    /// The whole call fails (never with `Lost`) when the stream cannot be opened, breaks
    /// before every reply came, or the replies take longer than the request timeout;
    /// after a temporary failure the streams this call used are dropped (unless another
    /// caller already replaced them), so the next call opens new ones.
    pub(crate) async fn keep_alive_many(&self, ids: &[i64]) -> Result<Vec<i64>> {
        if ids.is_empty() {
            return Ok(Vec::new());
        }
        let used = Mutex::new(Vec::new());
        let send = |connection: Connection, ids: Arc<[i64]>| {
            let used = &used;
            async move { self.send_keep_alives(connection, &ids, used).await }
        };
        let result = self.run(Op::KeepAlive, Arc::<[i64]>::from(ids), send).await;
        if matches!(&result, Err(err) if err.is_temporary()) {
            let used = used.into_inner().unwrap_or_else(PoisonError::into_inner);
            self.keeper.discard(&used);
        }
        result.map_err(never_lost)
    }

    /// One keep-alive: `Lost` when etcd answers that the lease does not exist.
    pub(crate) async fn keep_alive(&self, lease: i64) -> Result<()> {
        let ttls = self.keep_alive_many(&[lease]).await?;
        if ttls.first().is_some_and(|ttl| *ttl > 0) {
            Ok(())
        } else {
            Err(lease_not_found())
        }
    }

    async fn send_keep_alives(
        &self,
        connection: Connection,
        ids: &[i64],
        used: &Mutex<Vec<Used>>,
    ) -> Result<Vec<i64>, RpcError> {
        let mut streams = Vec::new();
        let sent = self.keeper.send(&self.rpcs, &connection, ids, &mut streams);
        used.lock()
            .unwrap_or_else(PoisonError::into_inner)
            .extend(streams);
        let replies = sent?;
        let mut ttls = Vec::with_capacity(ids.len());
        for reply in join_all(replies).await {
            match reply {
                Ok(Ok(ttl)) => ttls.push(ttl),
                Ok(Err(err)) => return Err(err),
                Err(_) => return Err(stream_closed()),
            }
        }
        Ok(ttls)
    }
}

/// The error a keep-alive answered with TTL 0 stands for: the lease does not exist.
pub(crate) fn lease_not_found() -> lockcore::Error {
    let gone = RpcError::LeaseKeepAlive("lease not found".into());
    map_error(Op::KeepAlive, Failure::Etcd(gone))
}

/// A failure of the whole stream says nothing about any one lease: a stream etcd ended
/// with `NotFound` is unavailable, not `Lost`.
fn never_lost(err: lockcore::Error) -> lockcore::Error {
    if err.kind() == lockcore::ErrorKind::Lost {
        lockcore::Error::unavailable(err.message().to_owned())
    } else {
        err
    }
}
