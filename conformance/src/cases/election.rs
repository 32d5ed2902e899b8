//! Leader election (issue 18): lockcore's [`Election`](lockcore::Election) over the
//! backend's lock. One leader at a time, rising terms where the backend fences, a crashed
//! leader replaced within TTL + slack, observers that see each term.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use lockcore::{Fencing, Identity, LockOptions, Locker, Note, WaitMode};
use tokio::sync::Mutex;
use tokio::time::{Instant, timeout};

use super::{fresh, grant, millis};
use crate::harness::Harness;
use crate::report::Report;

const CANDIDATES: usize = 4;
const TERMS: usize = 10;

/// 4 candidates campaign for 10 terms each: never two leaders at once (an in-test
/// register), and where the backend fences each term's number is above the last.
///
/// Checks: leadership is the lock's exclusion; the term is the grant's token. Guards
/// against two leaders after a race, and terms that repeat or go back.
pub async fn one_leader_at_a_time_and_terms_rise(h: &dyn Harness) -> Report {
    let name = fresh("election");
    let leading = Arc::new(AtomicUsize::new(0));
    let overlaps = Arc::new(AtomicUsize::new(0));
    let terms = Arc::new(Mutex::new(Vec::new()));
    let options = LockOptions::new(Duration::from_secs(30)).with_wait(WaitMode::Forever);
    let mut tasks = Vec::new();
    for c in 0..CANDIDATES {
        let locker = Locker::new(h.backend()).with_options(options.clone());
        let election = locker.election(&name).expect("valid name");
        let (leading, overlaps, terms) = (leading.clone(), overlaps.clone(), terms.clone());
        tasks.push(tokio::spawn(async move {
            let value = Note::new(format!("candidate-{c}")).expect("valid note");
            for _ in 0..TERMS {
                let term = election
                    .campaign(Some(value.clone()))
                    .await
                    .expect("elected");
                if leading.fetch_add(1, Ordering::SeqCst) != 0 {
                    overlaps.fetch_add(1, Ordering::SeqCst);
                }
                terms.lock().await.push(term.term());
                tokio::time::sleep(Duration::from_millis(1)).await;
                leading.fetch_sub(1, Ordering::SeqCst);
                term.resign().await.expect("resign");
            }
        }));
    }
    for task in tasks {
        task.await.expect("candidate task");
    }
    assert_eq!(overlaps.load(Ordering::SeqCst), 0, "two leaders at once");
    let terms = terms.lock().await;
    assert_eq!(terms.len(), CANDIDATES * TERMS);
    if h.backend().guarantees().fencing == Fencing::Monotonic {
        let terms: Vec<_> = terms.iter().map(|t| t.expect("fencing claimed")).collect();
        let bad = terms.windows(2).position(|w| w[1] <= w[0]);
        assert!(
            bad.is_none(),
            "a term did not rise, at term {bad:?}: {terms:?}"
        );
    }
    Report::new().metric("terms", (CANDIDATES * TERMS) as f64)
}

/// A leader that crashed (its lease granted, never refreshed nor released) is replaced by a
/// waiting candidate once its TTL has run out, not before, and within TTL + slack.
///
/// Checks: failover time. Guards against leaders that outlive their process, and
/// candidates that take over before the old term could have ended.
pub async fn a_crashed_leader_is_replaced_within_ttl(h: &dyn Harness) -> Report {
    let timing = h.timing();
    let name = fresh("election-crash");
    let sent = Instant::now();
    let crashed = grant(&*h.backend(), &name, &Identity::unique(), timing.ttl).await;
    let locker = Locker::new(h.backend()).with_options(
        LockOptions::new(Duration::from_secs(30))
            .with_wait(WaitMode::Timeout(timing.ttl + timing.slack)),
    );
    let election = locker.election(&name).expect("valid name");
    let leadership = election
        .campaign(None)
        .await
        .expect("elected within TTL + slack");
    let took = sent.elapsed();
    assert!(
        took + timing.expiry_resolution >= timing.ttl,
        "a {:?} term ended after only {took:?}",
        timing.ttl
    );
    if h.backend().guarantees().fencing == Fencing::Monotonic {
        assert!(
            leadership.term() > crashed.token(),
            "the new term is not above the old"
        );
    }
    leadership.resign().await.expect("resign");
    Report::new().metric(
        "failover_overrun_ms",
        millis(took.saturating_sub(timing.ttl)),
    )
}

/// An observer reports each term and each vacancy, in order, with the leader's value and
/// term: A elected, A resigns (nobody), B elected, B's lease deleted by an operator
/// (nobody). Terms are spaced wider than the observe interval.
///
/// Checks: `Observer::next` over this backend's `inspect` and release notifications.
/// Guards against observers that miss a new term, report a stale one, or never see a
/// vacancy.
pub async fn observers_see_each_term(h: &dyn Harness) -> Report {
    let name = fresh("election-observe");
    let locker = Locker::new(h.backend())
        .with_options(LockOptions::new(Duration::from_secs(30)).with_wait(WaitMode::TryOnce));
    let election = (locker.election(&name).expect("valid name"))
        .with_observe_interval(Duration::from_millis(50));
    let mut observer = election.observe();
    let limit = Duration::from_secs(10);
    let next = async |observer: &mut lockcore::Observer| {
        (timeout(limit, observer.next()).await)
            .expect("the observer reported within 10 s")
            .expect("the backend answered")
    };
    assert!(
        next(&mut observer).await.is_none(),
        "a fresh election has no leader"
    );
    let a = (election
        .try_campaign(Some(Note::new("a").expect("note")))
        .await)
        .expect("call")
        .expect("elected");
    let seen = next(&mut observer).await.expect("A leads");
    assert_eq!(seen.owner(), a.guard().lease().owner());
    assert_eq!(seen.term(), a.term());
    assert_eq!(seen.value().map(Note::as_str), Some("a"));
    let a_term = a.term();
    a.resign().await.expect("resign");
    assert!(
        next(&mut observer).await.is_none(),
        "after A resigned, nobody leads"
    );
    let b = (election
        .try_campaign(Some(Note::new("b").expect("note")))
        .await)
        .expect("call")
        .expect("elected");
    let seen = next(&mut observer).await.expect("B leads");
    assert_eq!(seen.owner(), b.guard().lease().owner());
    assert_eq!(seen.value().map(Note::as_str), Some("b"));
    if h.backend().guarantees().fencing == Fencing::Monotonic {
        assert!(seen.term() > a_term, "B's term is not above A's");
    }
    h.admin_delete(&name).await;
    assert!(
        next(&mut observer).await.is_none(),
        "after the delete, nobody leads"
    );
    let lost = timeout(limit + h.timing().ttl * 30, b.lost()).await;
    assert!(lost.is_ok(), "B never learnt it was no longer leader");
    assert!(!b.is_leader());
    Report::new()
}
