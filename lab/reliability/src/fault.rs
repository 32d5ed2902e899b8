//! The faults the harness replays (Kleppmann, "How to do distributed locking"), and which
//! backends each applies to.

use std::fmt;
use std::str::FromStr;

use serde::Serialize;

use crate::backends::Kind;

/// One scripted, time-bounded fault.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Fault {
    /// No fault: the baseline.
    None,
    /// A holder is stopped with `SIGSTOP` right after checking its lease, for longer than
    /// the TTL, then resumed (a GC pause).
    Pause,
    /// A holder is frozen right after checking its lease, for longer than the TTL, and
    /// thawed with its monotonic clock behind by the frozen time (a machine suspend), its
    /// links cut until a TTL after the thaw.
    Suspend,
    /// Every link of a holder to the lock servers drops all packets for 1.5 TTL.
    Blackhole,
    /// Every link of a holder to the lock servers delays packets by one TTL, for 3 TTL.
    Delay,
    /// A waiting client's next acquire attempt is held back on its connection past the
    /// attempt timeout, while its other connections pass (`crate::slow_attempt`).
    SlowAttempt,
    /// A holder's clock jumps back by 3 TTL (lockcore's injectable clock).
    ClockBack,
    /// A holder's clock jumps forward by 3 TTL.
    ClockForward,
    /// The Redis server is killed and restarted at once, without persistence.
    RedisRestart,
    /// Redis takes an RDB snapshot during a grant; after more grants it is killed while
    /// the lock is in use and restarts from that older snapshot (issue #14).
    RedisSnapshotRollback,
    /// Redlock, with client 1 partitioned to nodes A, B, C and client 2 to C, D, E: node C
    /// is killed and restarted at once while client 1 holds the lock.
    RedlockRestart,
    /// As `RedlockRestart`, but C stays down longer than the TTL first (the restart delay
    /// that the Redlock page, "Distributed Locks with Valkey", recommends).
    RedlockDelayedRestart,
    /// PostgreSQL crashes (`SIGQUIT` to the postmaster) and restarts at once; later it
    /// crashes again and stays down for 1.5 TTL.
    PostgresRestart,
    /// The etcd leader is killed (`SIGKILL`); it rejoins later.
    EtcdLeaderKill,
    /// The GCS server answers 503 to every request, in two bursts (0.5 s, then 2 s).
    GcsErrors,
    /// `local:` only: every client runs in a PID namespace of its own with its own `/proc`
    /// (`unshare --pid --fork --mount-proc`), sharing the lock directory, as containers do.
    PidNamespaces,
}

impl Fault {
    /// Every fault, in report order.
    pub const ALL: [Fault; 16] = [
        Fault::None,
        Fault::Pause,
        Fault::Suspend,
        Fault::Blackhole,
        Fault::Delay,
        Fault::SlowAttempt,
        Fault::ClockBack,
        Fault::ClockForward,
        Fault::RedisRestart,
        Fault::RedisSnapshotRollback,
        Fault::RedlockRestart,
        Fault::RedlockDelayedRestart,
        Fault::PostgresRestart,
        Fault::EtcdLeaderKill,
        Fault::GcsErrors,
        Fault::PidNamespaces,
    ];

    /// The fault's name on the command line and in the report.
    pub fn slug(self) -> &'static str {
        match self {
            Fault::None => "none",
            Fault::Pause => "pause",
            Fault::Suspend => "suspend",
            Fault::Blackhole => "blackhole",
            Fault::Delay => "delay",
            Fault::SlowAttempt => "slow-attempt",
            Fault::ClockBack => "clock-back",
            Fault::ClockForward => "clock-forward",
            Fault::RedisRestart => "redis-restart",
            Fault::RedisSnapshotRollback => "redis-snapshot-rollback",
            Fault::RedlockRestart => "node-restart",
            Fault::RedlockDelayedRestart => "node-restart-delayed",
            Fault::PostgresRestart => "postgres-restart",
            Fault::EtcdLeaderKill => "leader-kill",
            Fault::GcsErrors => "5xx-bursts",
            Fault::PidNamespaces => "pid-namespaces",
        }
    }

    /// One line for the report.
    pub fn describe(self) -> &'static str {
        match self {
            Fault::None => "no fault (baseline)",
            Fault::Pause => "a holder is SIGSTOPped right after its lease check, for 2.5 TTL",
            Fault::Suspend => {
                "a holder is frozen (cgroup freezer) right after its lease check, for 1.5 TTL; \
                 its monotonic clock skips the frozen time, its boot clock does not (a machine \
                 suspend), and its links stay cut until a TTL after the thaw"
            }
            Fault::Blackhole => "a holder's links to the servers drop every packet for 1.5 TTL",
            Fault::Delay => {
                "a holder's links to the servers delay every packet by 1 TTL, for 3 TTL"
            }
            Fault::SlowAttempt => {
                "at each holder's last check, each waiter's next request is held back on its \
                 connection for 0.4 TTL (attempt timeout 150 ms); its other connections pass"
            }
            Fault::ClockBack => {
                "a holder's clock (lockcore::ClockControl) jumps back by 3 TTL right after its lease check"
            }
            Fault::ClockForward => {
                "a holder's clock jumps forward by 3 TTL right after its lease check"
            }
            Fault::RedisRestart => "Redis is SIGKILLed and restarted at once (no persistence)",
            Fault::RedisSnapshotRollback => {
                "Redis SAVEs at a grant; 2 grants later it is SIGKILLed after a lease check and \
                 restarts from that snapshot (3 rounds)"
            }
            Fault::RedlockRestart => {
                "partition {1: A,B,C} {2: C,D,E} {3: all}; C is SIGKILLed and restarted at once"
            }
            Fault::RedlockDelayedRestart => {
                "same partition; C is SIGKILLed and restarted after 1.5 TTL (the recommended delay)"
            }
            Fault::PostgresRestart => {
                "PostgreSQL crashes (SIGQUIT) and restarts on its data at once; later it crashes \
                 again and stays down for 1.5 TTL"
            }
            Fault::EtcdLeaderKill => "the etcd leader is SIGKILLed; it rejoins after 3 TTL",
            Fault::GcsErrors => "every GCS request answers 503 for 0.5 s, then for 2 s",
            Fault::PidNamespaces => {
                "each client runs in its own PID namespace (unshare --pid --fork --mount-proc), \
                 sharing the lock directory"
            }
        }
    }

    /// Whether the fault stretches the window between a holder's check and its write:
    /// the client-side faults that no lease can survive without fencing (Kleppmann).
    pub fn is_client_timing(self) -> bool {
        matches!(self, Fault::Pause | Fault::Suspend | Fault::ClockBack)
    }

    /// Whether the fault acts on the network between clients and servers.
    pub fn is_network(self) -> bool {
        matches!(self, Fault::Blackhole | Fault::Delay | Fault::SlowAttempt)
    }

    /// Whether the fault applies to `kind`.
    pub fn applies_to(self, kind: Kind) -> bool {
        match self {
            Fault::None | Fault::Pause | Fault::ClockBack | Fault::ClockForward => true,
            // `local:` measures its leases on this machine's monotonic clock, which a real
            // suspend stops for every process at once; the emulation skips the holder's only.
            Fault::Suspend => kind != Kind::Local,
            Fault::Blackhole | Fault::Delay | Fault::SlowAttempt => kind != Kind::Local,
            Fault::RedisRestart | Fault::RedisSnapshotRollback => kind == Kind::Redis,
            Fault::RedlockRestart | Fault::RedlockDelayedRestart => kind == Kind::Redlock,
            Fault::PostgresRestart => kind == Kind::Postgres,
            Fault::EtcdLeaderKill => kind == Kind::Etcd,
            Fault::GcsErrors => kind == Kind::Gcs,
            Fault::PidNamespaces => kind == Kind::Local,
        }
    }

    /// Whether a client's critical section must outlast its TTL for the fault to bite
    /// (a clock jump only matters to a lease held long enough to need refreshing).
    pub fn needs_long_sections(self) -> bool {
        matches!(self, Fault::ClockBack | Fault::ClockForward)
    }
}

impl fmt::Display for Fault {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.slug())
    }
}

impl FromStr for Fault {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        Fault::ALL
            .into_iter()
            .find(|f| f.slug() == s)
            .ok_or_else(|| {
                let known: Vec<_> = Fault::ALL.iter().map(|f| f.slug()).collect();
                format!("unknown fault {s:?} (known: {})", known.join(", "))
            })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slugs_round_trip_and_are_unique() {
        for fault in Fault::ALL {
            assert_eq!(fault.slug().parse::<Fault>(), Ok(fault));
        }
        let mut slugs: Vec<_> = Fault::ALL.iter().map(|f| f.slug()).collect();
        slugs.dedup();
        assert_eq!(slugs.len(), Fault::ALL.len());
        assert!("gc".parse::<Fault>().unwrap_err().contains("pause"));
    }

    #[test]
    fn server_faults_apply_to_their_backend_only() {
        assert!(Fault::RedisRestart.applies_to(Kind::Redis));
        assert!(!Fault::RedisRestart.applies_to(Kind::Redlock));
        assert!(
            !Fault::Blackhole.applies_to(Kind::Local),
            "local has no network"
        );
        assert!(Fault::Pause.applies_to(Kind::Local));
        assert!(!Fault::Suspend.applies_to(Kind::Local));
        assert!(Fault::Suspend.applies_to(Kind::Redis));
        assert!(Fault::PidNamespaces.applies_to(Kind::Local));
        assert!(!Fault::PidNamespaces.applies_to(Kind::Postgres));
        let gcs: Vec<_> = Fault::ALL
            .into_iter()
            .filter(|f| f.applies_to(Kind::Gcs))
            .collect();
        assert_eq!(gcs.len(), 9, "{gcs:?}");
    }
}
