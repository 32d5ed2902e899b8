//! What each backend's `Guarantees` descriptor promises under each fault, and whether a
//! measured result agrees. The claims are derived from the descriptor, never written per
//! backend, so a descriptor that over-promises is caught here.

use lockcore::{Durability, Exclusion, Fencing, Guarantees};
use serde::Serialize;

use crate::checker::Counts;
use crate::fault::Fault;

/// How strongly a property is promised.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Claim {
    /// The Guarantees table promises it: a violation fails the run.
    Claimed,
    /// Only the backend's documentation promises it: a violation is reported.
    Documented,
    /// Not promised: violations are the documented behaviour, shown as measured.
    NotClaimed,
}

/// The expected outcome of one backend under one fault.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Expectation {
    /// A fenced register accepts no stale write and loses no update (monotonic fencing).
    pub fenced: Claim,
    /// No double grant (the lock never grants while a holder's checked lease is valid).
    pub exclusion: Claim,
    /// Every Lost signal fires before the lease can expire on the server.
    pub timely_lost: Claim,
    /// Why, in a few words.
    pub why: &'static str,
}

/// The expectation for `guarantees` under `fault`.
pub fn expect(guarantees: &Guarantees, fault: Fault) -> Expectation {
    let (exclusion, why) = exclusion(guarantees, fault);
    let timely_lost = match fault {
        // A stopped process runs no code; a clock running slow postpones the deadline.
        Fault::Pause | Fault::Suspend | Fault::ClockBack => Claim::NotClaimed,
        _ => exclusion,
    };
    Expectation {
        fenced: fencing(guarantees, fault),
        exclusion,
        timely_lost,
        why,
    }
}

/// Monotonic fencing holds under every fault, server restarts and rollbacks included: a
/// backend that loses its data on restart (Redis) must still never repeat a token (it
/// draws tokens from its server clock), so a fenced resource refuses every stale write.
fn fencing(g: &Guarantees, _fault: Fault) -> Claim {
    match g.fencing {
        Fencing::None => Claim::NotClaimed,
        Fencing::Monotonic => Claim::Claimed,
    }
}

fn exclusion(g: &Guarantees, fault: Fault) -> (Claim, &'static str) {
    if fault == Fault::ClockBack {
        return (
            Claim::NotClaimed,
            "a holder measures its lease on its own clock; only fencing protects the resource",
        );
    }
    match g.exclusion {
        Exclusion::TimingDependentQuorum => match fault {
            Fault::None => (Claim::Claimed, "no fault"),
            Fault::RedlockDelayedRestart => (
                Claim::Documented,
                "docs/redis.md: a node kept down longer than the TTL cannot grant twice",
            ),
            _ => (
                Claim::NotClaimed,
                "timing-dependent quorum: safe only while delays, pauses and restarts stay small",
            ),
        },
        Exclusion::InProcess => (Claim::NotClaimed, "in-process only"),
        _ if is_restart(fault) && g.durability == Durability::LostOnRestart => (
            Claim::NotClaimed,
            "locks lost on restart: a restarted server can grant a held lock again",
        ),
        _ => (Claim::Claimed, claimed_why(g.exclusion)),
    }
}

fn claimed_why(exclusion: Exclusion) -> &'static str {
    match exclusion {
        Exclusion::Consensus => "linearizable (consensus)",
        Exclusion::SingleNode => "single node: exclusion holds while the node keeps its data",
        _ => "linearizable (single store)",
    }
}

fn is_restart(fault: Fault) -> bool {
    matches!(
        fault,
        Fault::RedisRestart
            | Fault::RedisSnapshotRollback
            | Fault::PostgresRestart
            | Fault::RedlockRestart
            | Fault::RedlockDelayedRestart
    )
}

/// A measured result that contradicts a promise.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Disagreement {
    /// How strong the broken promise was.
    pub claim: Claim,
    /// What was promised and what was measured.
    pub what: String,
}

/// Compares the unfenced and fenced counts with the expectation.
pub fn disagreements(
    expected: &Expectation,
    unfenced: &Counts,
    fenced: Option<&Counts>,
) -> Vec<Disagreement> {
    let mut found = Vec::new();
    let runs = [("unfenced", Some(unfenced)), ("fenced", fenced)];
    for (label, counts) in runs {
        let Some(c) = counts else { continue };
        if c.double_grants > 0 && expected.exclusion != Claim::NotClaimed {
            let what = match c.limit {
                0 | 1 => "double grant(s)".to_owned(),
                n => format!("over-grant(s) (a permit granted while {n} others were valid)"),
            };
            found.push(Disagreement {
                claim: expected.exclusion,
                what: format!(
                    "{} {what} in the {label} run; expected none ({})",
                    c.double_grants, expected.why
                ),
            });
        }
        if c.lost_late > 0 && expected.timely_lost != Claim::NotClaimed {
            found.push(Disagreement {
                claim: expected.timely_lost,
                what: format!(
                    "{} Lost signal(s) fired too late in the {label} run",
                    c.lost_late
                ),
            });
        }
    }
    found.extend(repeats(expected, unfenced, fenced));
    if let Some(c) = fenced.filter(|_| expected.fenced != Claim::NotClaimed)
        && (c.stale_accepted > 0 || c.lost_updates > 0)
    {
        found.push(Disagreement {
            claim: expected.fenced,
            what: format!(
                "fencing promised, but the fenced register accepted {} stale write(s) and lost {} update(s)",
                c.stale_accepted, c.lost_updates
            ),
        });
    }
    found
}

/// Repeated fencing tokens in either run break the fencing promise, whatever the register
/// made of them: a resource that accepts a token equal to the highest it has seen lets the
/// two holders of that token both write.
fn repeats(
    expected: &Expectation,
    unfenced: &Counts,
    fenced: Option<&Counts>,
) -> Vec<Disagreement> {
    if expected.fenced == Claim::NotClaimed {
        return Vec::new();
    }
    let runs = [("unfenced", Some(unfenced)), ("fenced", fenced)];
    runs.into_iter()
        .filter_map(|(label, counts)| Some((label, counts?.token_repeats)))
        .filter(|(_, n)| *n > 0)
        .map(|(label, n)| Disagreement {
            claim: expected.fenced,
            what: format!(
                "fencing promised, but {n} section(s) of the {label} run began with a token \
                 an earlier section had used"
            ),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn guarantees(name: &str) -> Guarantees {
        anylock::compiled_guarantees()
            .into_iter()
            .find(|(n, _)| *n == name)
            .map(|(_, g)| g)
            .unwrap_or_else(|| panic!("{name} compiled in"))
    }

    #[test]
    fn claims_follow_the_descriptors() {
        let etcd = guarantees("etcd");
        assert_eq!(
            expect(&etcd, Fault::EtcdLeaderKill).exclusion,
            Claim::Claimed
        );
        assert_eq!(expect(&etcd, Fault::Pause).exclusion, Claim::Claimed);
        assert_eq!(expect(&etcd, Fault::Pause).timely_lost, Claim::NotClaimed);
        assert_eq!(expect(&etcd, Fault::ClockBack).exclusion, Claim::NotClaimed);
        assert_eq!(expect(&etcd, Fault::None).fenced, Claim::Claimed);
        let redis = guarantees("redis");
        assert_eq!(
            expect(&redis, Fault::RedisRestart).exclusion,
            Claim::NotClaimed
        );
        assert_eq!(expect(&redis, Fault::Blackhole).exclusion, Claim::Claimed);
        assert_eq!(
            expect(&redis, Fault::RedisRestart).fenced,
            Claim::Claimed,
            "Redis tokens survive a restart that forgets them"
        );
        assert_eq!(expect(&redis, Fault::Pause).fenced, Claim::Claimed);
        let pg = guarantees("postgres");
        assert_eq!(
            expect(&pg, Fault::PostgresRestart).exclusion,
            Claim::Claimed
        );
        let redlock = guarantees("redlock");
        assert_eq!(expect(&redlock, Fault::None).fenced, Claim::NotClaimed);
        assert_eq!(expect(&redlock, Fault::Pause).exclusion, Claim::NotClaimed);
        assert_eq!(
            expect(&redlock, Fault::RedlockDelayedRestart).exclusion,
            Claim::Documented
        );
    }

    #[test]
    fn violations_of_claims_are_reported_and_others_are_not() {
        let etcd = expect(&guarantees("etcd"), Fault::EtcdLeaderKill);
        let bad = Counts {
            double_grants: 1,
            ..Counts::default()
        };
        let stale = Counts {
            stale_accepted: 2,
            ..Counts::default()
        };
        let clean = Counts::default();
        assert_eq!(disagreements(&etcd, &clean, Some(&clean)), vec![]);
        let found = disagreements(&etcd, &bad, Some(&stale));
        assert_eq!(found.len(), 2, "{found:?}");
        assert!(
            found[0]
                .what
                .contains("1 double grant(s) in the unfenced run")
        );
        assert!(found[1].what.contains("accepted 2 stale write(s)"));
        let redis_restart = expect(&guarantees("redis"), Fault::RedisRestart);
        assert_eq!(disagreements(&redis_restart, &bad, Some(&clean)), vec![]);
        let redlock = expect(&guarantees("redlock"), Fault::Pause);
        assert_eq!(disagreements(&redlock, &stale, None), vec![]);
    }

    #[test]
    fn over_grants_of_permits_break_the_exclusion_claim() {
        let over = Counts {
            limit: 2,
            double_grants: 1,
            ..Counts::default()
        };
        let etcd = expect(&guarantees("etcd"), Fault::EtcdLeaderKill);
        let found = disagreements(&etcd, &over, None);
        assert_eq!(found.len(), 1, "{found:?}");
        assert_eq!(found[0].claim, Claim::Claimed);
        assert!(found[0].what.starts_with("1 over-grant(s)"), "{found:?}");
        let pause = expect(&guarantees("etcd"), Fault::ClockBack);
        assert_eq!(disagreements(&pause, &over, None), vec![]);
    }

    #[test]
    fn repeated_tokens_break_the_fencing_promise() {
        let rollback = expect(&guarantees("redis"), Fault::RedisSnapshotRollback);
        assert_eq!(rollback.fenced, Claim::Claimed, "tokens never repeat");
        let repeated = Counts {
            token_repeats: 3,
            ..Counts::default()
        };
        let clean = Counts::default();
        assert_eq!(disagreements(&rollback, &clean, Some(&clean)), vec![]);
        let found = disagreements(&rollback, &clean, Some(&repeated));
        assert_eq!(found.len(), 1, "{found:?}");
        assert!(
            found[0].what.contains("3 section(s) of the fenced run"),
            "{found:?}"
        );
        let redlock = expect(&guarantees("redlock"), Fault::None);
        assert_eq!(disagreements(&redlock, &repeated, None), vec![]);
    }
}
