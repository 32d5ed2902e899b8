//! What the clients of a cell take (issue #18): the lock, one permit of an N-permit
//! semaphore, or leadership of an election. Which backend x fault cells each runs in.

use std::fmt;
use std::str::FromStr;

use lockcore::{Guarantees, Semaphores};
use serde::Serialize;

use crate::backends::Kind;
use crate::fault::Fault;

/// The N of the permit cells: clients take one permit of a semaphore of this many.
pub const PERMITS: u32 = 2;

/// Client processes per permit group: twice [`PERMITS`], so that the limit is contended.
pub const PERMIT_CLIENTS: u32 = 4;

/// Client processes per lock or leader group.
pub const LOCK_CLIENTS: u32 = 3;

/// What the clients of a cell hold during a section.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Primitive {
    /// `Locker::acquire`: the lock, one holder at a time.
    Lock,
    /// `Locker::acquire_permit(name, PERMITS)`: one of N permits.
    Permits,
    /// `Locker::election(name)`, `campaign()`, a section while leading, `resign()`.
    Leader,
}

impl Primitive {
    /// Every primitive, in report order.
    pub const ALL: [Primitive; 3] = [Primitive::Lock, Primitive::Permits, Primitive::Leader];

    /// The name on the command line, in directory names and in the report.
    pub fn slug(self) -> &'static str {
        match self {
            Primitive::Lock => "lock",
            Primitive::Permits => "permits",
            Primitive::Leader => "leader",
        }
    }

    /// Client processes per group.
    pub fn clients(self) -> u32 {
        match self {
            Primitive::Permits => PERMIT_CLIENTS,
            Primitive::Lock | Primitive::Leader => LOCK_CLIENTS,
        }
    }

    /// How many sections may be open at once: N for permits, 1 otherwise.
    pub fn limit(self) -> u32 {
        match self {
            Primitive::Permits => PERMITS,
            Primitive::Lock | Primitive::Leader => 1,
        }
    }

    /// Whether a cell of this primitive runs `fault` against `kind`, whose descriptor is
    /// `g`. Permits run every fault of the lock where the descriptor grants semaphores
    /// (`Semaphores::Supported`: "the same exclusion, fencing, expiry clock and waiting as
    /// the backend's locks"). Leader cells run [`leader_faults`].
    pub fn runs(self, kind: Kind, fault: Fault, g: &Guarantees) -> bool {
        if !fault.applies_to(kind) {
            return false;
        }
        match self {
            Primitive::Lock => true,
            Primitive::Permits => g.semaphores == Semaphores::Supported,
            Primitive::Leader => leader_faults(kind).contains(&fault),
        }
    }
}

/// The faults leader cells run: the baseline, a paused leader (the fenced register must
/// refuse the older term), and the backend's own server fault (for `local:`, clients in
/// separate PID namespaces). Leadership is the lock, so the lock cells already cover
/// every other fault through the same acquire path; these show the election's own code
/// (campaign, `is_leader()`, `term()`, `resign()`) under the faults that matter most.
pub fn leader_faults(kind: Kind) -> [Fault; 3] {
    let server = match kind {
        Kind::Local => Fault::PidNamespaces,
        Kind::Redis => Fault::RedisRestart,
        Kind::Redlock => Fault::RedlockDelayedRestart,
        Kind::Postgres => Fault::PostgresRestart,
        Kind::Etcd => Fault::EtcdLeaderKill,
        Kind::Gcs => Fault::GcsErrors,
    };
    [Fault::None, Fault::Pause, server]
}

impl fmt::Display for Primitive {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.slug())
    }
}

impl FromStr for Primitive {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        Primitive::ALL
            .into_iter()
            .find(|p| p.slug() == s)
            .ok_or_else(|| format!("unknown primitive {s:?} (known: lock, permits, leader)"))
    }
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
    fn permits_run_where_the_descriptor_grants_semaphores() {
        for kind in Kind::ALL {
            let g = guarantees(kind.name());
            let runs = Primitive::Permits.runs(kind, Fault::None, &g);
            assert_eq!(runs, kind != Kind::Redlock, "{kind}");
        }
        let redis = guarantees("redis");
        assert!(Primitive::Permits.runs(Kind::Redis, Fault::RedisRestart, &redis));
        assert!(!Primitive::Permits.runs(Kind::Redis, Fault::PostgresRestart, &redis));
    }

    #[test]
    fn leader_faults_apply_to_their_backend() {
        for kind in Kind::ALL {
            for fault in leader_faults(kind) {
                assert!(fault.applies_to(kind), "{kind} {fault}");
            }
        }
    }

    #[test]
    fn the_permit_limit_is_contended() {
        const { assert!(PERMIT_CLIENTS > PERMITS) };
        assert_eq!(Primitive::Lock.limit(), 1);
        for p in Primitive::ALL {
            assert_eq!(p.slug().parse::<Primitive>(), Ok(p));
        }
    }
}
