//! The long-lived keep-alive stream (used through `client/keeper.rs`): every keep-alive
//! the client sends (single refreshes, batches of refreshes, queued waiters' places) goes
//! over one `LeaseKeepAlive` stream to the current member, as Go's clientv3 does.
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
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use anylock_etcd_proto::etcdserverpb::LeaseKeepAliveRequest;
use tokio::sync::{mpsc, oneshot};
use tokio::task::JoinHandle;

use crate::grpc::{Connection, RpcError};

/// What a keep-alive request gets: the lease's TTL as etcd answered (`<= 0`: the lease
/// does not exist), or why the stream ended first.
type Reply = oneshot::Sender<Result<i64, RpcError>>;

/// The client's keep-alive stream, when one is open.
#[derive(Default)]
pub(crate) struct Keeper {
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

/// The error of a request whose stream ended before its reply.
pub(crate) fn stream_closed() -> RpcError {
    RpcError::LeaseKeepAlive("the keep-alive stream closed before its reply".into())
}

impl Keeper {
    fn live(&self) -> MutexGuard<'_, Option<Arc<Live>>> {
        self.live.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Registers a reply for each of `ids` on the stream to `connection`'s member (opening
    /// one when there is none, or it ended, or it is on another member, and counting it in
    /// `opened`), then sends them.
    pub(crate) fn send(
        &self,
        opened: &AtomicU64,
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
                opened.fetch_add(1, Ordering::Relaxed);
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
    pub(crate) fn discard(&self) {
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
