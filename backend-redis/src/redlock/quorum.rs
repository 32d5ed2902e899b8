//! Redlock's arithmetic, free of I/O: quorum, validity, vote counting, the holder to report.

use std::collections::HashMap;
use std::time::Duration;

use lockcore::{Error, ErrorKind, HolderInfo, Ttl};

use crate::keys::{self, Found};

/// A strict majority of `nodes`: N/2 + 1.
pub(crate) fn quorum(nodes: usize) -> usize {
    nodes / 2 + 1
}

/// The clock-drift allowance, TTL × 1% + 2 ms (the Redlock page, "Distributed Locks with
/// Valkey").
pub(crate) fn drift(ttl: Duration) -> Duration {
    ttl / 100 + Duration::from_millis(2)
}

/// The validity left when a quorum took `elapsed`: TTL − elapsed − drift, rounded down to
/// a whole millisecond, if that is still a usable lease (at least [`lockcore::MIN_TTL`]).
pub(crate) fn validity(ttl: Duration, elapsed: Duration) -> Option<Ttl> {
    let left = ttl.checked_sub(elapsed + drift(ttl))?;
    let whole_ms = Duration::from_millis(u64::try_from(left.as_millis()).ok()?);
    Ttl::new(whole_ms).ok()
}

/// One node's answer.
#[derive(Debug)]
pub(crate) enum Vote<R> {
    /// Granted, extended or released as asked.
    Yes,
    /// Refused, with what the node holds instead.
    No(R),
    /// No usable answer (unreachable, timed out, error).
    Failed(Error),
}

/// The answers to one request, counted as they arrive.
#[derive(Debug)]
pub(crate) struct Votes<R> {
    nodes: usize,
    pub(crate) yes: usize,
    pub(crate) no: Vec<R>,
    pub(crate) failed: Vec<Error>,
}

impl<R> Votes<R> {
    pub(crate) fn new(nodes: usize) -> Self {
        Self {
            nodes,
            yes: 0,
            no: Vec::new(),
            failed: Vec::new(),
        }
    }

    pub(crate) fn record(&mut self, vote: Vote<R>) {
        match vote {
            Vote::Yes => self.yes += 1,
            Vote::No(detail) => self.no.push(detail),
            Vote::Failed(err) => self.failed.push(err),
        }
    }

    pub(crate) fn quorum(&self) -> usize {
        quorum(self.nodes)
    }

    /// How many nodes were asked.
    pub(crate) fn nodes(&self) -> usize {
        self.nodes
    }

    /// Nodes that have not answered yet.
    pub(crate) fn pending(&self) -> usize {
        self.nodes - self.yes - self.no.len() - self.failed.len()
    }

    pub(crate) fn has_quorum(&self) -> bool {
        self.yes >= self.quorum()
    }

    /// Even if every pending node says yes, there will be no quorum.
    pub(crate) fn quorum_impossible(&self) -> bool {
        self.yes + self.pending() < self.quorum()
    }

    /// A majority of nodes positively refused (the lease is not ours there).
    pub(crate) fn refused_by_quorum(&self) -> bool {
        self.no.len() >= self.quorum()
    }

    /// The error for a request that got no quorum through failures. A permanent failure
    /// (rejected credentials, a misconfigured node) wins, so it is not retried forever;
    /// otherwise the error is temporary: outcome unknown if any write may have applied.
    pub(crate) fn failure(&self, what: &str) -> Error {
        let permanent = self.failed.iter().find(|e| !e.is_temporary());
        let kind = match permanent {
            Some(err) => err.kind(),
            None if self
                .failed
                .iter()
                .any(|e| e.kind() == ErrorKind::OutcomeUnknown) =>
            {
                ErrorKind::OutcomeUnknown
            }
            None => ErrorKind::Unavailable,
        };
        let mut message = format!(
            "{what}: {} of {} nodes agreed, quorum is {}; {} refused, {} failed",
            self.yes,
            self.nodes,
            self.quorum(),
            self.no.len(),
            self.failed.len()
        );
        let first = permanent.or(self.failed.first());
        if let Some(err) = first {
            message.push_str(&format!("; {}", err.message()));
        }
        Error::new(kind, message)
    }
}

/// The most informative holder among refusals: the owner seen on the most nodes, with the
/// earliest expiry among them (nothing can change before then), and the note bound to its
/// value on any node.
pub(crate) fn best_holder(held: &[Found]) -> Option<HolderInfo> {
    let mut by_owner: HashMap<String, (usize, &Found, i64)> = HashMap::new();
    for found in held {
        let entry = by_owner
            .entry(keys::owner_of(&found.value))
            .or_insert((0, found, found.pttl));
        entry.0 += 1;
        if found.pttl >= 0 && (entry.2 < 0 || found.pttl < entry.2) {
            entry.2 = found.pttl;
        }
    }
    let (_, first, pttl) = by_owner.into_values().max_by_key(|(count, ..)| *count)?;
    let note = held
        .iter()
        .filter(|f| f.value == first.value && !f.note.is_empty())
        .map(|f| f.note.as_str())
        .next()
        .unwrap_or("");
    Some(keys::holder_info(&Found::new(
        first.value.as_str(),
        pttl,
        note,
    )))
}

/// The stored value seen on the most nodes and on how many (`("", 0)` when none).
pub(crate) fn leading_grant(seen: &[Found]) -> (String, usize) {
    let mut counts: HashMap<&str, usize> = HashMap::new();
    for found in seen {
        *counts.entry(found.value.as_str()).or_default() += 1;
    }
    counts
        .into_iter()
        .max_by_key(|(_, count)| *count)
        .map_or((String::new(), 0), |(value, count)| {
            (value.to_owned(), count)
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quorum_is_a_strict_majority() {
        assert_eq!([1, 2, 3, 4, 5, 6, 7].map(quorum), [1, 2, 2, 3, 3, 4, 4]);
    }

    #[test]
    fn validity_subtracts_elapsed_and_drift() {
        let ttl = Duration::from_secs(10);
        assert_eq!(drift(ttl), Duration::from_millis(102));
        assert_eq!(
            validity(ttl, Duration::from_millis(98)).map(Ttl::get),
            Some(Duration::from_millis(9800))
        );
        let just_under = validity(ttl, Duration::from_nanos(97_999_999)).map(Ttl::get);
        assert_eq!(
            just_under,
            Some(Duration::from_millis(9800)),
            "rounded down"
        );
        let too_short = validity(ttl, Duration::from_millis(9889));
        assert_eq!(too_short, None, "9 ms is no lease");
        assert!(validity(ttl, Duration::from_millis(9888)).is_some());
        assert_eq!(validity(ttl, Duration::from_millis(9898)), None);
        assert_eq!(validity(ttl, Duration::from_secs(11)), None);
    }

    #[test]
    fn votes_decide_as_early_as_possible() {
        let mut votes: Votes<()> = Votes::new(5);
        votes.record(Vote::Yes);
        votes.record(Vote::Yes);
        assert!(!votes.has_quorum() && !votes.quorum_impossible());
        votes.record(Vote::Yes);
        assert!(votes.has_quorum());
        let mut votes: Votes<()> = Votes::new(5);
        votes.record(Vote::No(()));
        votes.record(Vote::Failed(Error::unavailable("down")));
        assert!(!votes.quorum_impossible(), "3 pending could still agree");
        votes.record(Vote::No(()));
        assert!(votes.quorum_impossible());
        assert!(!votes.refused_by_quorum());
        assert_eq!(votes.pending(), 2);
    }

    #[test]
    fn failures_prefer_permanent_kinds_then_outcome_unknown() {
        let mut votes: Votes<()> = Votes::new(3);
        votes.record(Vote::Failed(Error::unavailable("refused")));
        votes.record(Vote::Failed(Error::new(
            ErrorKind::OutcomeUnknown,
            "lost reply",
        )));
        assert_eq!(votes.failure("acquire").kind(), ErrorKind::OutcomeUnknown);
        votes.record(Vote::Failed(Error::new(
            ErrorKind::PermissionDenied,
            "WRONGPASS",
        )));
        let err = votes.failure("acquire");
        assert_eq!(err.kind(), ErrorKind::PermissionDenied);
        assert!(err.message().contains("WRONGPASS"), "{err}");
        assert!(
            err.message().contains("0 of 3 nodes agreed, quorum is 2"),
            "{err}"
        );
    }

    #[test]
    fn best_holder_is_the_most_common_owner_with_its_earliest_expiry() {
        let a = "0:1:ab:owner-a";
        let b = "0:1:cd:owner-b";
        let held = [
            Found::new(a, 900, ""),
            Found::new(b, 100, "b's note"),
            Found::new(a, 500, "a's note"),
            Found::new(a, -1, ""),
        ];
        let holder = best_holder(&held).expect("someone");
        assert_eq!(holder.owner().as_str(), "owner-a");
        assert_eq!(holder.expires_in(), Some(Duration::from_millis(500)));
        assert_eq!(holder.token(), None);
        assert_eq!(holder.note().map(lockcore::Note::as_str), Some("a's note"));
        assert!(best_holder(&[]).is_none());
    }

    #[test]
    fn leading_grant_counts_identical_values() {
        let seen = [
            Found::new("a", 1, ""),
            Found::new("b", 1, ""),
            Found::new("a", 2, ""),
        ];
        assert_eq!(leading_grant(&seen), ("a".to_owned(), 2));
        assert_eq!(leading_grant(&[]), (String::new(), 0));
    }
}
