//! [`System`]: one backend under test with everything measured beside it: its server's raw
//! round trip, peer libraries, and a server-side call counter. The `sys_*` modules build
//! systems from these types, and `connect` (which holds `System::connect`) picks one by
//! kind, so the types here depend on neither.

use std::sync::Arc;
use std::time::Duration;

use gcs_test_server::GcsTestServer;
use lockcore::{LockBackend, Semaphores, Waiting};

use crate::op::{Bare, Entry, Lock, Ours, OursPermit, Role};
use crate::servers::Counter;

/// The key prefix of our locks (`{anylock-bench:NAME}:lock`), so a run's keys are easy to
/// find and remove.
pub(crate) const PREFIX: &str = "anylock-bench";

/// Which backend.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    /// Redis, single instance.
    Redis,
    /// Redlock over several Redis nodes.
    Redlock,
    /// PostgreSQL.
    Postgres,
    /// etcd.
    Etcd,
    /// Google Cloud Storage (the in-process test server by default).
    Gcs,
    /// The embedded SQLite backend (no server).
    Local,
}

impl Kind {
    /// The backend's name in tables.
    pub(crate) fn name(self) -> &'static str {
        match self {
            Self::Redis => "redis",
            Self::Redlock => "redlock",
            Self::Postgres => "postgres",
            Self::Etcd => "etcd",
            Self::Gcs => "gcs",
            Self::Local => "local",
        }
    }

    /// The kind called `name`.
    pub(crate) fn from_name(name: &str) -> Option<Self> {
        [
            Self::Redis,
            Self::Redlock,
            Self::Postgres,
            Self::Etcd,
            Self::Gcs,
            Self::Local,
        ]
        .into_iter()
        .find(|k| k.name() == name)
    }
}

/// What every system of one run shares.
#[derive(Clone)]
pub(crate) struct Ctx {
    /// A tag unique to this run, used in every lock name, key prefix and schema.
    pub(crate) run: String,
    /// The lease TTL of latency, throughput and handoff cycles.
    pub(crate) ttl: Duration,
    /// The in-process GCS test server, when this run started one.
    pub(crate) gcs_server: Option<Arc<GcsTestServer>>,
}

/// One backend and its companions, connected.
pub(crate) struct System {
    /// Which backend.
    pub(crate) kind: Kind,
    /// The URL it was connected with (servers' addresses can be swapped for taps).
    pub(crate) url: String,
    /// The `host:port` of every server in `url`.
    pub(crate) upstreams: Vec<String>,
    /// Ours.
    pub(crate) backend: Arc<dyn LockBackend>,
    /// The server's raw round trip, and what it is (`PING`).
    pub(crate) raw: Option<Entry>,
    /// Further raw reference points (`SET NX PX + DEL`).
    pub(crate) extras: Vec<Entry>,
    /// Peer locks.
    pub(crate) peers: Vec<Peer>,
    /// The raw handoff floor ([`crate::floor`]), where the harness has one: timed in the
    /// handoff section only.
    pub(crate) floor: Option<Peer>,
    /// The server's own call counter.
    pub(crate) counter: Option<Arc<dyn Counter>>,
    /// A remark for the report (which etcd member answered, and so on).
    pub(crate) note: String,
}

/// A peer lock library (or the server's native lock).
pub(crate) struct Peer {
    /// What the report calls it.
    pub(crate) label: String,
    /// The lock.
    pub(crate) lock: Arc<dyn Lock>,
    /// How its waiters learn of a release, or `None` when its waiting acquire is no fair
    /// handoff benchmark (two holders on one shared etcd lease share one key).
    pub(crate) waiting: Option<&'static str>,
}

impl Peer {
    /// A peer whose waiters learn of a release as `waiting` says.
    pub(crate) fn new(
        label: impl Into<String>,
        lock: Arc<dyn Lock>,
        waiting: &'static str,
    ) -> Self {
        Self {
            label: label.into(),
            lock,
            waiting: Some(waiting),
        }
    }
}

/// The semaphore size of [`System::permit_entry`].
pub(crate) const PERMITS: u32 = 3;

/// What the report calls [`System::permit_entry`].
pub(crate) const PERMIT_LABEL: &str = "anylock permit, semaphore of 3 (Locker)";

/// How many of [`System::lock_entries`] are ours (the rest are peers).
pub(crate) const OURS_ENTRIES: usize = 3;

impl System {
    /// Whether waiters are woken by the backend.
    pub(crate) fn notified(&self) -> bool {
        self.backend.guarantees().waiting == Waiting::Notified
    }

    /// Ours through `Locker` (try-acquire, then a waiting acquire), ours through bare
    /// backend calls ([`OURS_ENTRIES`] in all), then the peers, as cycles.
    pub(crate) fn lock_entries(&self, ctx: &Ctx) -> Vec<Entry> {
        let prefix = format!("{}-{}", ctx.run, self.kind.name());
        let mut entries = vec![
            Entry::cycle("anylock (Locker)", Role::Ours, self.ours(ctx), &prefix),
            Entry::waiting_cycle(
                "anylock (Locker, waiting acquire)",
                Role::Ours,
                self.ours(ctx),
                &prefix,
            ),
            Entry::cycle(
                "anylock (backend calls)",
                Role::Ours,
                Arc::new(Bare::new(self.backend.clone(), ctx.ttl)),
                &prefix,
            ),
        ];
        for peer in &self.peers {
            entries.push(Entry::cycle(
                &peer.label,
                Role::Peer,
                peer.lock.clone(),
                &prefix,
            ));
        }
        entries
    }

    /// A permit of a semaphore of [`PERMITS`] through `Locker`, as a cycle, on a backend
    /// with semaphores.
    pub(crate) fn permit_entry(&self, ctx: &Ctx) -> Option<Entry> {
        if !matches!(self.backend.guarantees().semaphores, Semaphores::Supported) {
            return None;
        }
        let prefix = format!("{}-{}", ctx.run, self.kind.name());
        let lock = Arc::new(OursPermit::new(self.backend.clone(), ctx.ttl, PERMITS));
        Some(Entry::cycle(PERMIT_LABEL, Role::Ours, lock, &prefix))
    }

    /// Ours through `Locker` with the run's TTL.
    pub(crate) fn ours(&self, ctx: &Ctx) -> Arc<dyn Lock> {
        Arc::new(Ours::new(self.backend.clone(), ctx.ttl))
    }
}

/// `url` with `key=value` appended as a query parameter, unless `key` is already set.
pub(crate) fn with_param(url: &str, key: &str, value: &str) -> String {
    let query = url.split_once('?').map_or("", |(_, q)| q);
    if query.split('&').any(|kv| kv.split('=').next() == Some(key)) {
        return url.to_owned();
    }
    let sep = if url.contains('?') { '&' } else { '?' };
    format!("{url}{sep}{key}={value}")
}

/// The `host:port` of a `scheme://[user@]host:port[/…][?…]` URL.
pub(crate) fn host_port(url: &str) -> Option<String> {
    let rest = url.split_once("://")?.1;
    let authority = rest.split(['/', '?', '#']).next()?;
    let host = authority.rsplit_once('@').map_or(authority, |(_, h)| h);
    host.contains(':').then(|| host.to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn params_are_appended_once() {
        assert_eq!(
            with_param("redis://h:1/0", "prefix", "b"),
            "redis://h:1/0?prefix=b"
        );
        assert_eq!(
            with_param("pg://h/db?a=1", "schema", "s"),
            "pg://h/db?a=1&schema=s"
        );
        assert_eq!(
            with_param("pg://h/db?schema=x", "schema", "s"),
            "pg://h/db?schema=x"
        );
    }

    #[test]
    fn host_port_skips_credentials_and_paths() {
        assert_eq!(
            host_port("redis://:pw@127.0.0.1:27101/0").as_deref(),
            Some("127.0.0.1:27101")
        );
        assert_eq!(host_port("http://h:2379").as_deref(), Some("h:2379"));
        assert_eq!(host_port("postgres://u@db/x"), None);
    }
}
