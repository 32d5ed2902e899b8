//! The `slow-attempt` fault (issue #14): a waiting client's acquire attempt reaches the
//! server after the client's attempt timeout, and after a later attempt of the same
//! acquisition has been answered.
//!
//! lockcore used to give up on such an attempt (`OutcomeUnknown`), start a second one with
//! the same owner, and, when the first landed later, see it retake the lock the second had
//! been granted (same-owner retake, new token) and release that late grant itself: the
//! lock free while the guard reported Healthy. Every client of the cell runs with a short
//! attempt timeout ([`ATTEMPT_TIMEOUT`]) behind [`StallLinks`](crate::stall::StallLinks);
//! at every holder's last check before its release, each *waiting* client's next request
//! is held back for [`hold`] on the connection that carries it, while its other
//! connections pass. Whether a later request can overtake the held one depends on the
//! transport (a pool's other connection, another endpoint), and the relays count it.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use tokio::sync::broadcast::error::RecvError;
use tokio::time::{Instant, sleep};

use crate::backends::{Kind, Workload};
use crate::group::Group;
use crate::history::Op;
use crate::protocol::SectionId;
use crate::stall::{Scope, StallStats};

/// The clients' attempt timeout in this cell: well below [`hold`].
pub const ATTEMPT_TIMEOUT: Duration = Duration::from_millis(150);

/// How long a held request waits: 0.4 TTL (800 ms; 1.2 s for GCS), longer than the
/// attempt timeout plus a backoff step and a handoff, below Redis's 1 s reply timeout.
pub fn hold(w: Workload) -> Duration {
    w.ttl * 2 / 5
}

/// Which connections one arming holds back: an attempt goes to every Redlock node, and to
/// one connection of the other backends.
pub fn scope(kind: Kind) -> Scope {
    match kind {
        Kind::Redlock => Scope::EveryEndpoint,
        _ => Scope::FirstConnection,
    }
}

/// Two steps of TTL/5: the holder releases one step after its last check, time enough for
/// a waiter's held attempt to time out and a second one to be sent.
pub fn workload(kind: Kind) -> Workload {
    Workload {
        steps: 2,
        ..Workload::for_backend(kind, false)
    }
}

/// Arms the waiters at every holder's last check until every group has completed
/// `sections` more sections (or `limit` passed); returns what was done.
///
/// # Errors
/// When no request was ever held (the fault was never applied).
pub async fn apply(
    groups: &[Group],
    w: Workload,
    sections: u64,
    limit: Duration,
) -> Result<Vec<String>, String> {
    let targets: Vec<u64> = groups.iter().map(|g| g.completed() + sections).collect();
    let rounds: Vec<AtomicU64> = groups.iter().map(|_| AtomicU64::new(0)).collect();
    let arming = async {
        match groups {
            [a, b] => {
                tokio::join!(
                    arm_at_last_checks(a, w, &rounds[0]),
                    arm_at_last_checks(b, w, &rounds[1])
                );
            }
            [a] => arm_at_last_checks(a, w, &rounds[0]).await,
            _ => std::future::pending().await,
        }
    };
    let reached = tokio::select! {
        () = arming => false,
        reached = all_reach(groups, &targets, limit) => reached,
    };
    let mut notes = Vec::new();
    for (group, rounds) in groups.iter().zip(&rounds) {
        let rounds = rounds.load(Ordering::SeqCst);
        let mut stats = StallStats::default();
        for links in &group.links {
            if let Some(stall) = &links.stall {
                stall.disarm();
                stats += stall.stats();
            }
        }
        if stats.held == 0 {
            return Err(format!(
                "{}: no request was held back: the fault was never applied",
                group.mode.as_str()
            ));
        }
        notes.push(format!(
            "{}: {rounds} handoffs armed; {} requests held {} ms (attempt timeout {} ms), {} of them overtaken by a later request of the same client",
            group.mode.as_str(),
            stats.held,
            hold(w).as_millis(),
            ATTEMPT_TIMEOUT.as_millis(),
            stats.overtaken
        ));
    }
    if !reached {
        notes.push(format!(
            "fewer than {sections} sections per group completed under the fault within {limit:?}"
        ));
    }
    Ok(notes)
}

/// At each holder's last check (the one before its final write and release), arms every
/// other client of `group`; counts the handoffs armed.
async fn arm_at_last_checks(group: &Group, w: Workload, rounds: &AtomicU64) {
    let needed = u64::try_from((w.step + w.margin).as_millis()).unwrap_or(u64::MAX);
    let mut checks: HashMap<SectionId, u32> = HashMap::new();
    let mut events = group.register.subscribe();
    loop {
        let event = match events.recv().await {
            Ok(event) => event,
            Err(RecvError::Lagged(_)) => continue,
            Err(RecvError::Closed) => return std::future::pending().await,
        };
        let Op::Check {
            held: true,
            remaining_ms,
        } = event.op
        else {
            continue;
        };
        let seen = checks.entry(event.id).or_default();
        *seen += 1;
        if *seen < w.steps || remaining_ms < needed {
            continue;
        }
        for client in &group.clients {
            let links = &group.links[index(client.id)];
            if let (true, Some(stall)) = (client.id != event.id.client, &links.stall) {
                stall.arm(hold(w));
            }
        }
        rounds.fetch_add(1, Ordering::SeqCst);
    }
}

/// Whether every group reached its target before `limit`.
async fn all_reach(groups: &[Group], targets: &[u64], limit: Duration) -> bool {
    let deadline = Instant::now() + limit;
    loop {
        let done = groups.iter().zip(targets).all(|(g, t)| g.completed() >= *t);
        if done {
            return true;
        }
        if Instant::now() > deadline {
            return false;
        }
        sleep(Duration::from_millis(100)).await;
    }
}

fn index(client: u32) -> usize {
    usize::try_from(client.saturating_sub(1)).unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_held_attempt_outlasts_the_attempt_timeout_and_a_backoff_step() {
        for kind in Kind::ALL {
            let w = workload(kind);
            // The held attempt must still be in flight after the timeout, the 200 ms
            // backoff cap and a second attempt; and the holder must not release before a
            // waiter's first held attempt has timed out.
            assert!(
                hold(w) >= ATTEMPT_TIMEOUT + Duration::from_millis(500),
                "{kind}"
            );
            assert!(w.step >= ATTEMPT_TIMEOUT * 2, "{kind}");
            assert!(
                hold(w) < Duration::from_secs(1) || kind == Kind::Gcs,
                "{kind}"
            );
        }
    }

    #[test]
    fn exclusion_is_judged_wherever_the_descriptor_claims_it() {
        use crate::expect::{Claim, expect};
        use crate::fault::Fault;
        for (name, g) in anylock::compiled_guarantees() {
            let expected = match name {
                "redlock" => Claim::NotClaimed,
                "memory" | "local" => continue,
                _ => Claim::Claimed,
            };
            assert_eq!(expect(&g, Fault::SlowAttempt).exclusion, expected, "{name}");
        }
        assert_eq!(scope(Kind::Redlock), Scope::EveryEndpoint);
        assert_eq!(scope(Kind::Postgres), Scope::FirstConnection);
    }
}
