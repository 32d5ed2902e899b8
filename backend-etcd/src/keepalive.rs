//! The long-lived keep-alive streams (used through `client/keeper.rs`): every keep-alive
//! the client sends (single refreshes, batches of refreshes, queued waiters' places) goes
//! over one of a small fixed pool of `LeaseKeepAlive` streams to the current member, each
//! lease always on the same stream (chosen from its id).
//!
//! Why a pool: etcd renews one stream's keep-alives one after another, and a follower
//! forwards each renewal to the leader and waits for its answer, so one stream's batch
//! takes a round trip between members per lease. Streams are served concurrently, so
//! [`STREAMS`] streams renew that many leases at a time (measured in docs/etcd.md).
//!
//! Each stream is opened on first use (one RPC, counted by `rpcs_sent`) and lives until it
//! breaks: etcd ends it (an error renewing a lease, a member without a leader, the member
//! going down), the connection drops, a keep-alive goes unanswered for the request timeout,
//! or the current member changes. The next keep-alive on it then opens a new one on the
//! current member. A stream that is replaced is closed gracefully (its request side ends,
//! so etcd still answers what was sent on it), never reset.
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

/// How many keep-alive streams a client keeps. 8: measured through a follower on
/// loopback, `refresh_many` of 2,048 leases takes 0.6x one stream's time, and 16 streams
/// were no better there (bound by the members' CPU); where the round trip between
/// members dominates, 8 streams renew 8 leases per round trip instead of 1 (see
/// docs/etcd.md). Each stream costs one gRPC stream on the member.
pub(crate) const STREAMS: usize = 8;

/// The stream of the pool that keeps lease `id` alive. etcd's lease ids end in a counter;
/// mixing the bits spreads any id scheme evenly.
pub(crate) fn slot_of(id: i64) -> usize {
    let mixed = u64::from_ne_bytes(id.to_ne_bytes()).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    usize::try_from(mixed >> 32).unwrap_or(0) % STREAMS
}

/// The client's pool of keep-alive streams: a slot per stream, each holding its stream
/// while one is open.
#[derive(Default)]
pub(crate) struct Keeper {
    slots: [Mutex<Option<Arc<Live>>>; STREAMS],
    /// The last stream opened's number: each stream gets a new one.
    opened: AtomicU64,
}

/// A stream a caller sent on: its slot, and which stream of that slot it was.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Used {
    slot: usize,
    generation: u64,
}

/// The reply to one keep-alive request.
pub(crate) type Answer = oneshot::Receiver<Result<i64, RpcError>>;

/// One open keep-alive stream. Dropping it ends the request side (etcd then answers what
/// was sent and ends the stream); the driver task delivers those replies and exits.
struct Live {
    generation: u64,
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
    fn slot(&self, slot: usize) -> MutexGuard<'_, Option<Arc<Live>>> {
        self.slots[slot]
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// Sends a keep-alive for each of `ids`, each on its lease's stream of the pool to
    /// `connection`'s member (see [`send_on`](Self::send_on)); the replies in order.
    /// Every stream sent on is added to `used`, before any reply comes.
    pub(crate) fn send(
        &self,
        opened: &AtomicU64,
        connection: &Connection,
        ids: &[i64],
        used: &mut Vec<Used>,
    ) -> Result<Vec<Answer>, RpcError> {
        let mut shards: [Vec<usize>; STREAMS] = Default::default();
        for (i, id) in ids.iter().enumerate() {
            shards[slot_of(*id)].push(i);
        }
        let mut answers: Vec<Option<Answer>> = ids.iter().map(|_| None).collect();
        for (slot, shard) in shards.iter().enumerate() {
            if shard.is_empty() {
                continue;
            }
            let shard_ids: Vec<i64> = shard.iter().map(|&i| ids[i]).collect();
            let replies = self.send_on(slot, opened, connection, &shard_ids, used)?;
            for (&i, reply) in shard.iter().zip(replies) {
                answers[i] = Some(reply);
            }
        }
        Ok(answers.into_iter().flatten().collect())
    }

    /// Registers a reply for each of `ids` on stream `slot` (opening one when there is
    /// none, or it ended, or it is on another member than `connection`'s, and counting it
    /// in `opened`), then sends them.
    fn send_on(
        &self,
        slot: usize,
        opened: &AtomicU64,
        connection: &Connection,
        ids: &[i64],
        used: &mut Vec<Used>,
    ) -> Result<Vec<Answer>, RpcError> {
        let mut held = self.slot(slot);
        let reusable = held.as_ref().filter(|live| live.serves(connection));
        let (live, replies) = match reusable.and_then(|live| Some((live, live.waiting.wait(ids)?)))
        {
            Some((live, replies)) => (Arc::clone(live), replies),
            None => {
                let generation = self.opened.fetch_add(1, Ordering::Relaxed) + 1;
                let live = Arc::new(Live::open(generation, connection.clone()));
                opened.fetch_add(1, Ordering::Relaxed);
                let replies = live.waiting.wait(ids).ok_or_else(stream_closed)?;
                *held = Some(Arc::clone(&live));
                (live, replies)
            }
        };
        drop(held);
        used.push(Used {
            slot,
            generation: live.generation,
        });
        for &id in ids {
            if live.requests.send(LeaseKeepAliveRequest { id }).is_err() {
                return Err(stream_closed());
            }
        }
        Ok(replies)
    }

    /// Drops the streams a failed call `used` (so the next keep-alive on their slots opens
    /// new ones), each only if it is still in its slot: a stream another caller opened
    /// since is left alone.
    pub(crate) fn discard(&self, used: &[Used]) {
        for used in used {
            let mut held = self.slot(used.slot);
            if held
                .as_ref()
                .is_some_and(|live| live.generation == used.generation)
            {
                let dropped = held.take();
                drop(held);
                drop(dropped);
            }
        }
    }
}

impl Live {
    /// Starts a keep-alive stream on `connection`: the driver task sends the RPC and
    /// delivers its replies. etcd sends the stream's headers with its first reply, so
    /// the first requests ride along with the opening.
    fn open(generation: u64, connection: Connection) -> Self {
        let (requests, receiver) = mpsc::unbounded_channel::<LeaseKeepAliveRequest>();
        let stream = futures_util::stream::unfold(receiver, |mut receiver| async move {
            receiver.recv().await.map(|request| (request, receiver))
        });
        let waiting = Arc::new(Waiting(Mutex::new(Some(HashMap::new()))));
        let driver = tokio::spawn(drive(connection.clone(), stream, Arc::clone(&waiting)));
        Self {
            generation,
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
    connection: Connection,
    requests: impl futures_util::Stream<Item = LeaseKeepAliveRequest> + Send + 'static,
    waiting: Arc<Waiting>,
) {
    let end = match connection.lease().lease_keep_alive(requests).await {
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

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::grpc::Settings;

    /// etcd's lease ids: the member's id in the top bits, a counter at the bottom.
    #[test]
    fn consecutive_lease_ids_spread_evenly_over_the_pool() {
        let base = 0x694d_9a7c_2b1e_0000_i64;
        let mut per_slot = [0_usize; STREAMS];
        for id in base..base + 512 {
            per_slot[slot_of(id)] += 1;
        }
        for count in per_slot {
            assert!((48..=80).contains(&count), "{per_slot:?}");
        }
        assert_eq!(slot_of(base), slot_of(base), "a lease keeps its stream");
    }

    fn generation_in(keeper: &Keeper, slot: usize) -> Option<u64> {
        keeper.slot(slot).as_ref().map(|live| live.generation)
    }

    /// A caller whose call failed drops only the stream it used: not one another caller
    /// opened in the same slot since (which would cost that caller a stream).
    #[tokio::test]
    async fn a_late_discard_leaves_a_newer_stream_alone() {
        let settings = Settings {
            connect_timeout: Duration::from_secs(1),
            credentials: None,
            #[cfg(feature = "tls")]
            tls: None,
        };
        // Nothing listens there; the channel connects lazily, so the streams only fail
        // once their drivers run.
        let connection = Connection::connect("http://127.0.0.1:1", &settings)
            .await
            .expect("a lazy channel");
        let keeper = Keeper::default();
        let opened = AtomicU64::new(0);
        let (id, slot) = (7, slot_of(7));
        let mut first = Vec::new();
        let _ = keeper.send(&opened, &connection, &[id], &mut first);
        let mut late = Vec::new();
        let _ = keeper.send(&opened, &connection, &[id], &mut late);
        assert_eq!(first, late, "one stream, reused");

        keeper.discard(&first);
        assert_eq!(generation_in(&keeper, slot), None);
        let mut second = Vec::new();
        let _ = keeper.send(&opened, &connection, &[id], &mut second);
        assert_ne!(first, second);
        keeper.discard(&late);
        assert_eq!(
            generation_in(&keeper, slot),
            Some(second[0].generation),
            "the late caller dropped the new stream"
        );
        keeper.discard(&second);
        assert_eq!(generation_in(&keeper, slot), None);
        assert_eq!(opened.load(Ordering::Relaxed), 2);
    }
}
