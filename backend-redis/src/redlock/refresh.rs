//! Redlock's refresh: the grant it extends, and a batch of leases sent to every node at
//! once as one pipeline per node, each lease then decided by the single refresh's rule.

use std::time::Duration;

use futures_util::stream::{FuturesUnordered, StreamExt};
use lockcore::{Error, Lease, Result};
use tokio::time::Instant;

use super::quorum::{self, Vote, Votes};
use crate::client::{Node, RefreshItem};
use crate::keys::{self, LockKeys};
use crate::replies::RefreshReply;

/// A Redlock grant: the TTL asked for (refresh extends by it again) and the stored value.
pub(super) fn encode_grant(ttl_ms: u64, value: &str) -> String {
    format!("{ttl_ms}:{value}")
}

pub(super) fn decode_grant(lease: &Lease) -> Result<(u64, &str)> {
    lease
        .grant()
        .split_once(':')
        .and_then(|(ttl, value)| Some((ttl.parse().ok()?, value)))
        .ok_or_else(|| Error::invalid_input("the lease was not issued by a Redlock backend"))
}

/// One lease's votes, and how long after the start its refresh was decided.
struct Tally {
    votes: Votes<String>,
    decided: Option<Duration>,
}

/// A refresh is decided by a quorum of "extended", by a quorum of "not ours", or once
/// every node answered.
fn decided(votes: &Votes<String>) -> bool {
    votes.has_quorum() || votes.refused_by_quorum() || votes.pending() == 0
}

/// Refreshes `leases` (at most one batch) on every node at once: one pipeline per node,
/// each bounded by the node timeout. Each node's answers are counted as they arrive; a
/// lease is decided as a single refresh would be, at the moment it would be, and the call
/// returns once every lease is decided (pipelines still in flight are dropped).
pub(super) async fn refresh_batch(
    nodes: &[Node],
    prefix: &str,
    leases: &[Lease],
) -> Vec<Result<Lease>> {
    let grants: Vec<Result<(u64, &str)>> = leases.iter().map(decode_grant).collect();
    // The leases this backend issued, in order; the others fail alone, unsent.
    let sent: Vec<(usize, u64)> = (grants.iter().enumerate())
        .filter_map(|(at, grant)| grant.as_ref().ok().map(|(ttl_ms, _)| (at, *ttl_ms)))
        .collect();
    let items: Vec<RefreshItem<'_>> = (grants.iter().zip(leases))
        .filter_map(|(grant, lease)| {
            let (ttl_ms, value) = *grant.as_ref().ok()?;
            let keys = LockKeys::new(prefix, lease.name());
            Some(RefreshItem {
                keys,
                value,
                ttl_ms,
            })
        })
        .collect();
    let mut tallies: Vec<Tally> = (items.iter())
        .map(|_| Tally {
            votes: Votes::new(nodes.len()),
            decided: None,
        })
        .collect();
    let started = Instant::now();
    if !items.is_empty() {
        let mut pending: FuturesUnordered<_> =
            nodes.iter().map(|node| node.refresh_many(&items)).collect();
        let mut open = tallies.len();
        while open > 0 {
            let Some(replies) = pending.next().await else {
                break;
            };
            for (tally, reply) in tallies.iter_mut().zip(replies) {
                if tally.decided.is_some() {
                    continue;
                }
                tally.votes.record(refresh_vote(reply));
                if decided(&tally.votes) {
                    tally.decided = Some(started.elapsed());
                    open -= 1;
                }
            }
        }
    }
    let mut outcomes: Vec<Option<Result<Lease>>> = grants
        .into_iter()
        .map(|grant| grant.err().map(Err))
        .collect();
    for ((at, ttl_ms), tally) in sent.into_iter().zip(tallies) {
        let elapsed = tally.decided.unwrap_or_else(|| started.elapsed());
        outcomes[at] = Some(outcome(&leases[at], ttl_ms, &tally.votes, elapsed));
    }
    outcomes.into_iter().flatten().collect()
}

/// One node's answer to an extension.
fn refresh_vote(reply: Result<RefreshReply>) -> Vote<String> {
    match reply {
        Ok(RefreshReply::Extended) => Vote::Yes,
        Ok(RefreshReply::Missing) => Vote::No("deleted or expired".to_owned()),
        Ok(RefreshReply::Changed(other)) => {
            Vote::No(format!("taken over by {}", keys::owner_of(&other)))
        }
        Err(err) => Vote::Failed(err),
    }
}

/// A lease's result from its votes: with a quorum, the validity left after `elapsed`;
/// `Lost` when a quorum refused; otherwise the nodes' failure.
fn outcome(lease: &Lease, ttl_ms: u64, votes: &Votes<String>, elapsed: Duration) -> Result<Lease> {
    if votes.has_quorum() {
        return match quorum::validity(Duration::from_millis(ttl_ms), elapsed) {
            Some(validity) => Ok(lease.clone().with_ttl(validity)),
            None => Err(Error::unavailable(format!(
                "a quorum extended only after {elapsed:?}"
            ))),
        };
    }
    if votes.refused_by_quorum() {
        let why = votes.no.first().map_or("", String::as_str);
        let (refused, total) = (votes.no.len(), votes.nodes());
        return Err(Error::lost(format!(
            "not ours on {refused} of {total} nodes ({why})"
        )));
    }
    Err(votes.failure("refresh"))
}
