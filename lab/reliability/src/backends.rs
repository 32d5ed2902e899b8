//! The backends under test and their timing parameters.

use std::fmt;
use std::str::FromStr;
use std::time::Duration;

use serde::Serialize;

/// A backend the harness runs against (`memory:` is in-process only, so it has no
/// multi-process run).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Kind {
    /// `local:` (SQLite on this machine).
    Local,
    /// `redis://`, one node.
    Redis,
    /// `redlock://`, five nodes.
    Redlock,
    /// `postgres://`.
    Postgres,
    /// `etcd://`, a three-member cluster.
    Etcd,
    /// `gs://`, the GCS test server.
    Gcs,
}

impl Kind {
    /// Every backend, in report order.
    pub const ALL: [Kind; 6] = [
        Kind::Local,
        Kind::Redis,
        Kind::Redlock,
        Kind::Postgres,
        Kind::Etcd,
        Kind::Gcs,
    ];

    /// The backend's name, as `anylock::compiled_guarantees()` spells it.
    pub fn name(self) -> &'static str {
        match self {
            Kind::Local => "local",
            Kind::Redis => "redis",
            Kind::Redlock => "redlock",
            Kind::Postgres => "postgres",
            Kind::Etcd => "etcd",
            Kind::Gcs => "gcs",
        }
    }

    /// The lease TTL used: 2 s (etcd's minimum), 3 s for GCS (its `Date` header has
    /// one-second resolution and staleness allows one second more).
    pub fn ttl(self) -> Duration {
        match self {
            Kind::Gcs => Duration::from_secs(3),
            _ => Duration::from_secs(2),
        }
    }
}

impl fmt::Display for Kind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Kind {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        Kind::ALL
            .into_iter()
            .find(|k| k.name() == s)
            .ok_or_else(|| {
                format!("unknown backend {s:?} (known: local, redis, redlock, postgres, etcd, gcs)")
            })
    }
}

/// What each client does in one critical section.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Workload {
    /// Lease TTL.
    pub ttl: Duration,
    /// Read-modify-write steps per section.
    pub steps: u32,
    /// Time between a step's lease check and its write arriving (the window a pause,
    /// a slow network or a clock jump stretches).
    pub step: Duration,
    /// A step starts only if the lease has at least `step + margin` left.
    pub margin: Duration,
}

impl Workload {
    /// Four steps of TTL/5 each: a section lasts about 0.8 TTL. With `long`, ten steps
    /// (2 TTL), so the lease must be refreshed during the section.
    pub fn for_backend(kind: Kind, long: bool) -> Self {
        let ttl = kind.ttl();
        Self {
            ttl,
            steps: if long { 10 } else { 4 },
            step: ttl / 5,
            margin: Duration::from_millis(50),
        }
    }

    /// Six steps of TTL/40 (a section of 0.15 TTL, with one refresh): many handoffs in
    /// little time, for the baseline.
    pub fn quick(kind: Kind) -> Self {
        Self {
            steps: 6,
            step: kind.ttl() / 40,
            ..Self::for_backend(kind, false)
        }
    }

    /// About how long one section takes.
    pub fn section(&self) -> Duration {
        self.step * self.steps
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_match_the_facade() {
        let compiled: Vec<&str> = anylock::compiled_guarantees()
            .iter()
            .map(|(name, _)| *name)
            .collect();
        for kind in Kind::ALL {
            assert!(
                compiled.contains(&kind.name()),
                "{kind} not in {compiled:?}"
            );
            assert_eq!(kind.name().parse::<Kind>(), Ok(kind));
        }
    }

    #[test]
    fn a_step_fits_the_validity_left_after_a_refresh() {
        for kind in Kind::ALL {
            let w = Workload::for_backend(kind, false);
            // After a refresh at TTL/8 intervals at least 7/8 TTL - drift remains.
            assert!(w.step + w.margin < w.ttl * 7 / 8 - w.ttl / 50, "{kind}");
            assert!(Workload::for_backend(kind, true).section() > w.ttl);
        }
    }
}
