//! Elections: one attempt, resigning, and the leader as observers read it.

use std::sync::Arc;
use std::time::SystemTime;

use super::{bounded, ms};
use crate::testing::{Fault, FaultyBackend, Op};
use crate::{ErrorKind, LockBackend, LockOptions, Locker, MemoryBackend, Note};

fn candidates(backend: &Arc<dyn LockBackend>) -> (Locker, Locker) {
    let options = LockOptions::new(ms(1000));
    (
        Locker::new(Arc::clone(backend)).with_options(options.clone()),
        Locker::new(Arc::clone(backend)).with_options(options),
    )
}

/// One attempt: a free election is won, a led one is `Ok(None)`, and a backend error is
/// an error, not "someone else leads".
#[test]
fn a_single_campaign_wins_a_free_election_and_reports_a_led_one_or_an_error() {
    bounded(|| async {
        let memory: Arc<dyn LockBackend> = Arc::new(MemoryBackend::new());
        let faulty = Arc::new(FaultyBackend::new(memory));
        let backend: Arc<dyn LockBackend> = faulty.clone();
        let (a, b) = candidates(&backend);
        let leading = a.election("e").expect("name").try_campaign(None).await;
        let leading = leading.expect("free").expect("won");
        assert!(leading.is_leader());
        let other = b.election("e").expect("name").try_campaign(None).await;
        assert!(other.expect("led: not an error").is_none());
        faulty.set(Op::Acquire, Fault::Fail(ErrorKind::Unavailable));
        let err = b
            .election("e")
            .expect("name")
            .try_campaign(None)
            .await
            .expect_err("an outage is an error");
        assert_eq!(err.kind(), ErrorKind::Unavailable);
        faulty.set(Op::Acquire, Fault::Pass);
        leading.resign().await.expect("resigned");
    });
}

/// Resigning releases the lock: another candidate wins at once, and nobody leads
/// meanwhile.
#[test]
fn a_resigned_leader_leaves_the_election_free() {
    bounded(|| async {
        let backend: Arc<dyn LockBackend> = Arc::new(MemoryBackend::new());
        let (a, b) = candidates(&backend);
        let election = a.election("e").expect("name");
        let leading = election.campaign(None).await.expect("won");
        leading.resign().await.expect("resigned");
        assert!(election.leader().await.expect("read").is_none());
        let next = b.election("e").expect("name").try_campaign(None).await;
        assert!(next.expect("free").expect("won at once").is_leader());
    });
}

/// The leader as an observer reads it: who, which term, since when, with which value, and
/// how long its lease lasts; its `Debug` names the owner, term and value.
#[test]
fn the_leader_reads_back_its_owner_term_start_value_and_lease() {
    bounded(|| async {
        let backend: Arc<dyn LockBackend> = Arc::new(MemoryBackend::new());
        let (a, b) = candidates(&backend);
        let before = SystemTime::now();
        let value = Note::new("http://10.0.0.7:8080").expect("note");
        let leading = a
            .election("e")
            .expect("name")
            .campaign(Some(value.clone()))
            .await
            .expect("won");
        let leader = b.election("e").expect("name").leader().await;
        let leader = leader.expect("read").expect("someone leads");
        assert_eq!(leader.owner(), leading.guard().lease().owner());
        assert_eq!(leader.term(), leading.term());
        assert!(leader.term().is_some());
        assert!(leader.since().expect("recorded") >= before);
        assert_eq!(leader.value(), Some(&value));
        assert_eq!(leader.expires_in(), Some(ms(1000)));
        let debug = format!("{leader:?}");
        assert!(
            debug.starts_with("Leader { owner: ")
                && debug.contains(&format!("term: {:?}", leader.term()))
                && debug.contains("10.0.0.7:8080"),
            "{debug}"
        );
        let observer = b.election("e").expect("name").observe();
        let debug = format!("{observer:?}");
        assert_eq!(debug, "Observer { election: \"e\", notified: false, .. }");
        leading.resign().await.expect("resigned");
    });
}
