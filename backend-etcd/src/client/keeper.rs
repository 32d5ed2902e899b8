//! The long-lived keep-alive stream: every keep-alive this client sends (single
//! refreshes, batches of refreshes, queued waiters' places) goes over one
//! `LeaseKeepAlive` stream to the current member, as Go's clientv3 does.
//!
//! The stream is opened on first use (one RPC, counted by `rpcs_sent`) and lives until it
//! breaks: etcd ends it (an error renewing a lease, a member without a leader, the member
//! going down), the connection drops, a keep-alive goes unanswered for the request timeout,
//! or the current member changes. The next keep-alive then opens a new one on the current
//! member. A stream that is replaced is closed gracefully (its request side ends, so etcd
//! still answers what was sent on it), never reset.
//!
//! etcd answers one stream's requests in order, one reply per request, naming the lease:
//! replies are matched to requests by lease id, oldest request first, so one lease may
//! be kept alive by several callers at once.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use anylock_etcd_proto::etcdserverpb::LeaseKeepAliveRequest;
use futures_util::future::join_all;
use lockcore::Result;
use tokio::sync::{mpsc, oneshot};
use tokio::task::JoinHandle;

use super::EtcdClient;
use crate::error::{Failure, Op, map_error};
use crate::grpc::{Connection, RpcError};

/// What a keep-alive request gets: the lease's TTL as etcd answered (`<= 0`: the lease
/// does not exist), or why the stream ended first.
type Reply = oneshot::Sender<Result<i64, RpcError>>;

/// The client's keep-alive stream, when one is open.
#[derive(Default)]
pub(super) struct Keeper {
    live: Mutex<Option<Arc<Live>>>,
}

/// One open keep-alive stream. Dropping it ends the request side (etcd then answers what
/// was sent and ends the stream); the driver task delivers those replies and exits.
struct Live {
    connection: Connection,
    requests: mpsc::UnboundedSender<LeaseKeepAliveRequest>,
    waiting: Arc<Waiting>,
    driver: JoinHandle<()>,
}

/// The requests sent and not yet answered, by lease id, oldest first; `None` once the
/// stream ended.
struct Waiting(Mutex<Option<HashMap<i64, VecDeque<Reply>>>>);

impl EtcdClient {
    /// Keeps every lease in `ids` alive over the shared keep-alive stream: one request
    /// each, sent at once, answered in one round trip. Returns each lease's TTL as etcd
    /// answered, in order (`<= 0`: the lease does not exist).
    ///
    /// # Errors
    /// The whole call fails (never with `Lost`) when the stream cannot be opened, breaks
    /// before every reply came, or the replies take longer than the request timeout;
    /// after a temporary failure the stream is dropped, so the next call opens a new one.
    pub(crate) async fn keep_alive_many(&self, ids: &[i64]) -> Result<Vec<i64>> {
        if ids.is_empty() {
            return Ok(Vec::new());
        }
        let send = |connection: Connection, ids: Arc<[i64]>| async move {
            self.send_keep_alives(connection, &ids).await
        };
        let result = self.run(Op::KeepAlive, Arc::<[i64]>::from(ids), send).await;
        if matches!(&result, Err(err) if err.is_temporary()) {
            self.keeper.discard();
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
    ) -> Result<Vec<i64>, RpcError> {
        let replies = self.keeper.send(self, connection, ids)?;
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

fn stream_closed() -> RpcError {
    RpcError::LeaseKeepAlive("the keep-alive stream closed before its reply".into())
}

impl Keeper {
    fn live(&self) -> MutexGuard<'_, Option<Arc<Live>>> {
        self.live.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Registers a reply for each of `ids` on the stream to `connection`'s member (opening
    /// one when there is none, or it ended, or it is on another member), then sends them.
    fn send(
        &self,
        client: &EtcdClient,
        connection: Connection,
        ids: &[i64],
    ) -> Result<Vec<oneshot::Receiver<Result<i64, RpcError>>>, RpcError> {
        let mut slot = self.live();
        let reusable = slot.as_ref().filter(|live| live.serves(&connection));
        let (live, replies) = match reusable.and_then(|live| Some((live, live.waiting.wait(ids)?)))
        {
            Some((live, replies)) => (Arc::clone(live), replies),
            None => {
                let live = Arc::new(Live::open(connection));
                client.rpcs.fetch_add(1, Ordering::Relaxed);
                let replies = live.waiting.wait(ids).ok_or_else(stream_closed)?;
                *slot = Some(Arc::clone(&live));
                (live, replies)
            }
        };
        drop(slot);
        for &id in ids {
            if live.requests.send(LeaseKeepAliveRequest { id }).is_err() {
                return Err(stream_closed());
            }
        }
        Ok(replies)
    }

    /// Drops the stream (after a failure), so the next keep-alive opens a new one.
    fn discard(&self) {
        let dropped = self.live().take();
        drop(dropped);
    }
}

impl Live {
    /// Starts a keep-alive stream on `connection`: the driver task sends the RPC and
    /// delivers its replies. etcd sends the stream's headers with its first reply, so
    /// the first requests ride along with the opening.
    fn open(connection: Connection) -> Self {
        let (requests, receiver) = mpsc::unbounded_channel::<LeaseKeepAliveRequest>();
        let stream = futures_util::stream::unfold(receiver, |mut receiver| async move {
            receiver.recv().await.map(|request| (request, receiver))
        });
        let waiting = Arc::new(Waiting(Mutex::new(Some(HashMap::new()))));
        let driver = tokio::spawn(drive(connection.clone(), stream, Arc::clone(&waiting)));
        Self {
            connection,
            requests,
            waiting,
            driver,
        }
    }

    /// Whether this stream is open and on `connection`'s member.
    fn serves(&self, connection: &Connection) -> bool {
        self.connection.same_channel(connection) && !self.driver.is_finished()
    }
}

impl Waiting {
    fn map(&self) -> MutexGuard<'_, Option<HashMap<i64, VecDeque<Reply>>>> {
        self.0.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// A reply slot for each of `ids`, in order; `None` when the stream already ended.
    fn wait(&self, ids: &[i64]) -> Option<Vec<oneshot::Receiver<Result<i64, RpcError>>>> {
        let mut map = self.map();
        let map = map.as_mut()?;
        let replies = ids.iter().map(|id| {
            let (reply, receiver) = oneshot::channel();
            map.entry(*id).or_default().push_back(reply);
            receiver
        });
        Some(replies.collect())
    }

    /// Delivers etcd's reply for lease `id` to its oldest request.
    fn answer(&self, id: i64, ttl: i64) {
        let mut map = self.map();
        let Some(queue) = map.as_mut().and_then(|map| map.get_mut(&id)) else {
            tracing::debug!(lease = %format!("{id:x}"), "a keep-alive reply nobody waits for");
            return;
        };
        let reply = queue.pop_front();
        if queue.is_empty()
            && let Some(map) = map.as_mut()
        {
            map.remove(&id);
        }
        drop(map);
        if let Some(reply) = reply {
            let _ = reply.send(Ok(ttl));
        }
    }

    /// Marks the stream ended and fails every request still waiting with `why`.
    fn close(&self, why: impl Fn() -> RpcError) {
        let waiting = self.map().take().unwrap_or_default();
        for reply in waiting.into_values().flatten() {
            let _ = reply.send(Err(why()));
        }
    }
}

/// Runs one keep-alive stream: opens it, delivers each reply, and when it ends (etcd
/// ended it, it failed, or our side closed and etcd answered everything) fails whatever
/// still waits.
async fn drive(
    mut connection: Connection,
    requests: impl futures_util::Stream<Item = LeaseKeepAliveRequest> + Send + 'static,
    waiting: Arc<Waiting>,
) {
    let end = match connection.lease.lease_keep_alive(requests).await {
        Err(status) => Some(status),
        Ok(replies) => {
            let mut replies = replies.into_inner();
            loop {
                match replies.message().await {
                    Ok(Some(reply)) => waiting.answer(reply.id, reply.ttl),
                    Ok(None) => break None,
                    Err(status) => break Some(status),
                }
            }
        }
    };
    if let Some(status) = &end {
        tracing::debug!(%status, "the etcd keep-alive stream ended");
    }
    waiting.close(|| match &end {
        Some(status) => RpcError::Status(status.clone()),
        None => stream_closed(),
    });
}
