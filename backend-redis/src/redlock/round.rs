//! One round of calls to every node at once, and how its answers are counted: the votes
//! of acquire, the reads of inspect, list and break, and the memory-settings
//! check at connect.

use std::future::Future;

use futures_util::future::join_all;
use futures_util::stream::{FuturesUnordered, StreamExt};
use lockcore::{Error, ErrorKind, HolderInfo, Result};

use super::quorum::{self, Vote, Votes};
use crate::client::Node;
use crate::eviction;
use crate::keys::{Found, LockKeys};
use crate::replies::AcquireReply;

/// Refuses the first node that may evict lock keys; a node that stopped answering since
/// its `PING` is logged and left to the quorum, like an unreachable one.
pub(super) async fn check_eviction(nodes: &[&Node]) -> Result<()> {
    let checks = join_all(nodes.iter().map(|node| eviction::check(node))).await;
    for (node, check) in nodes.iter().zip(checks) {
        match check {
            Err(err) if err.kind() == ErrorKind::Config => return Err(err),
            Err(err) => tracing::warn!(node = node.label(), error = %err, "memory settings unread"),
            Ok(()) => {}
        }
    }
    Ok(())
}

/// Counts the answers of requests sent to every node at once until `decided`. Requests
/// still in flight then are dropped; each is bounded by the node timeout.
pub(super) async fn gather<R, Fut>(requests: Vec<Fut>, decided: fn(&Votes<R>) -> bool) -> Votes<R>
where
    Fut: Future<Output = Vote<R>>,
{
    let mut votes = Votes::new(requests.len());
    let mut pending: FuturesUnordered<Fut> = requests.into_iter().collect();
    while let Some(vote) = pending.next().await {
        votes.record(vote);
        if decided(&votes) {
            break;
        }
    }
    votes
}

/// One node's answer to an acquisition whose value is `value`.
pub(super) async fn acquire_vote(
    node: &Node,
    keys: &LockKeys,
    ttl_ms: u64,
    owner: &str,
    value: &str,
    note: &str,
) -> Vote<Found> {
    let suffix = &value[1..];
    match node.acquire(keys, false, ttl_ms, owner, suffix, note).await {
        Ok(AcquireReply::Granted(stored)) if stored == value => Vote::Yes,
        Ok(AcquireReply::Granted(_)) => Vote::Failed(Error::new(
            ErrorKind::Protocol,
            format!("acquire on {}: stored an unexpected value", node.label()),
        )),
        Ok(AcquireReply::Held(found)) => Vote::No(found),
        Err(err) => Vote::Failed(err),
    }
}

/// Counts per-node reads of `(value, PTTL, note)`: answered nodes are yes votes.
pub(super) fn tally_found(replies: Vec<Result<Option<Found>>>) -> (Votes<()>, Vec<Found>) {
    let mut votes = Votes::new(replies.len());
    let mut seen = Vec::new();
    for reply in replies {
        match reply {
            Ok(found) => {
                votes.record(Vote::Yes);
                seen.extend(found);
            }
            Err(err) => votes.record(Vote::Failed(err)),
        }
    }
    (votes, seen)
}

/// The holder whose value is on at least `quorum` nodes (keys on a minority hold nothing).
pub(super) fn quorum_holder(seen: &[Found], quorum: usize) -> Option<HolderInfo> {
    let (leader, count) = quorum::leading_grant(seen);
    if count < quorum {
        return None;
    }
    let same: Vec<_> = seen.iter().filter(|f| f.value == leader).cloned().collect();
    quorum::best_holder(&same)
}

/// Whether the nodes that did not answer (`failed` of them) could complete a quorum for a
/// grant seen on only `count` nodes: then nobody can say whether it is held.
pub(super) fn undecided(count: usize, failed: usize, quorum: usize) -> bool {
    count < quorum && count + failed >= quorum
}
