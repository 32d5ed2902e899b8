//! The connections lock calls run on: at most `pool_size` of them, opened when needed,
//! kept idle between calls (the most recently used first), pinged before a call when idle
//! for a second or more, closed after ten minutes idle or thirty since they were opened,
//! and dropped whenever a call did not end cleanly.
//!
//! Why not sqlx's pool: it pings every connection as it comes back (a `Sync` and its
//! `ReadyForQuery`, in a task of its own), so each lock statement cost two round trips,
//! and an uncontended acquire + release four where two do (BENCHMARKS.md, the round-trip
//! counts; measured with the bench's loopback tap). That ping is how sqlx learns that a
//! caller dropped a statement half-way; here a connection goes back only from
//! [`Lent::give_back`], which the caller reaches only when its work ended without an
//! error, so a connection left mid-statement (an error, a timeout, a dropped future) is
//! never lent again. The sqlx pool stays for what needs a `'static` transaction or is
//! the user's own ([`PostgresBackend::pool`](crate::PostgresBackend::pool),
//! [`begin_fenced`](crate::PostgresBackend::begin_fenced)); the `LISTEN` connection has
//! a one-connection pool of its own (`notify.rs`).

use std::ops::{Deref, DerefMut};
use std::sync::{Mutex, PoisonError};
use std::time::Duration;

use sqlx::Connection;
use sqlx::postgres::{PgConnectOptions, PgConnection};
use tokio::sync::{Semaphore, SemaphorePermit};
use tokio::time::{Instant, timeout_at};

/// Idle connections used within this long are lent without a ping: after a server restart,
/// one ping per dead idle connection is cheaper than one failed lock call each, and a
/// ping before every call would cost the round trip this module saves.
pub(crate) const PING_IF_IDLE_FOR: Duration = Duration::from_secs(1);

/// Idle connections unused for this long are closed (sqlx's pool's default idle timeout),
/// so a burst's connections do not stay open for ever on the server.
const CLOSE_IF_IDLE_FOR: Duration = Duration::from_secs(600);

/// Connections opened this long ago are closed when they come back (sqlx's pool's default
/// maximum lifetime), so none lives for ever.
const MAX_LIFETIME: Duration = Duration::from_secs(1800);

/// Why no connection was lent.
#[derive(Debug)]
pub(crate) enum NotLent {
    /// All `pool_size` connections stayed busy until the deadline.
    Busy,
    /// Opening a connection (or the ping of an idle one, then opening another) did not
    /// finish by the deadline.
    Slow,
    /// Opening a connection failed.
    Connect(sqlx::Error),
}

/// The lock calls' connections.
pub(crate) struct Conns {
    options: PgConnectOptions,
    slots: Semaphore,
    size: u32,
    idle: Mutex<Vec<Idle<PgConnection>>>,
}

/// An idle connection: since when, and when it was opened.
struct Idle<C> {
    conn: C,
    since: Instant,
    opened: Instant,
}

/// Removes from `idle` (oldest first, most recently used last) the connections idle for
/// [`CLOSE_IF_IDLE_FOR`] or opened [`MAX_LIFETIME`] ago by `now`, and returns them. Every
/// entry is looked at, not only the top: under a steady light load only the most recently
/// used connection is ever lent, and the rest of a burst's would otherwise stay open.
fn expire<C>(idle: &mut Vec<Idle<C>>, now: Instant) -> Vec<C> {
    let stale = |i: &Idle<C>| {
        now.saturating_duration_since(i.since) >= CLOSE_IF_IDLE_FOR
            || now.saturating_duration_since(i.opened) >= MAX_LIFETIME
    };
    if !idle.iter().any(stale) {
        return Vec::new();
    }
    let (gone, kept): (Vec<_>, Vec<_>) = idle.drain(..).partition(stale);
    *idle = kept;
    gone.into_iter().map(|i| i.conn).collect()
}

impl std::fmt::Debug for Conns {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Conns")
            .field("size", &self.size)
            .field("idle", &self.idle().len())
            .finish_non_exhaustive()
    }
}

impl Conns {
    /// At most `size` connections (at least one), opened with `options` when needed.
    pub(crate) fn new(options: PgConnectOptions, size: u32) -> Self {
        let size = size.max(1);
        Self {
            options,
            slots: Semaphore::new(usize::try_from(size).unwrap_or(usize::MAX)),
            size,
            idle: Mutex::default(),
        }
    }

    /// How many connections there can be at once.
    pub(crate) fn size(&self) -> u32 {
        self.size
    }

    fn idle(&self) -> std::sync::MutexGuard<'_, Vec<Idle<PgConnection>>> {
        self.idle.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// A connection by `deadline`: an idle one (pinged first when idle for
    /// [`PING_IF_IDLE_FOR`]; one whose ping fails is dropped and the next tried), else a new
    /// one. Nothing of a lock call has been sent when this fails.
    pub(crate) async fn lend(&self, deadline: Instant) -> Result<Lent<'_>, NotLent> {
        let permit = match timeout_at(deadline, self.slots.acquire()).await {
            Ok(Ok(permit)) => permit,
            // The semaphore is never closed.
            Ok(Err(_)) | Err(_) => return Err(NotLent::Busy),
        };
        loop {
            let popped = {
                let mut idle = self.idle();
                let gone = expire(&mut idle, Instant::now());
                gone.into_iter().for_each(close_quietly);
                idle.pop()
            };
            let Some(Idle {
                mut conn,
                since,
                opened,
            }) = popped
            else {
                break;
            };
            if since.elapsed() < PING_IF_IDLE_FOR {
                return Ok(Lent::new(conn, opened, self, permit));
            }
            match timeout_at(deadline, conn.ping()).await {
                Ok(Ok(())) => return Ok(Lent::new(conn, opened, self, permit)),
                Ok(Err(err)) => {
                    tracing::debug!(error = %err, "an idle PostgreSQL connection failed its ping; dropped");
                }
                Err(_) => return Err(NotLent::Slow),
            }
        }
        match timeout_at(deadline, PgConnection::connect_with(&self.options)).await {
            Ok(Ok(conn)) => Ok(Lent::new(conn, Instant::now(), self, permit)),
            Ok(Err(err)) => Err(NotLent::Connect(err)),
            Err(_) => Err(NotLent::Slow),
        }
    }

    /// Idle connections right now (for tests).
    #[cfg(test)]
    pub(crate) fn idle_count(&self) -> usize {
        self.idle().len()
    }
}

/// Closes `conn` politely in the background when a runtime is there (a `Terminate`
/// message, so the server does not log a lost client), else just drops it.
fn close_quietly(conn: PgConnection) {
    if let Ok(runtime) = tokio::runtime::Handle::try_current() {
        runtime.spawn(async move {
            let _ = tokio::time::timeout(Duration::from_secs(1), conn.close()).await;
        });
    }
}

/// A lent connection. [`give_back`](Self::give_back) returns it for the next call; dropped
/// without that (the call failed, timed out or was dropped mid-statement), the connection
/// is dropped with it (its socket closed, as sqlx closes a broken one): nothing is known of
/// what it still has to read, so it is never lent again.
pub(crate) struct Lent<'a> {
    conn: Option<PgConnection>,
    opened: Instant,
    conns: &'a Conns,
    _permit: SemaphorePermit<'a>,
}

impl<'a> Lent<'a> {
    fn new(
        conn: PgConnection,
        opened: Instant,
        conns: &'a Conns,
        permit: SemaphorePermit<'a>,
    ) -> Self {
        Self {
            conn: Some(conn),
            opened,
            conns,
            _permit: permit,
        }
    }

    /// Returns the connection for the next call: only after a call that ended cleanly.
    /// Connections past their lifetime, this one or idle ones, are closed instead.
    pub(crate) fn give_back(mut self) {
        if let Some(conn) = self.conn.take() {
            let now = Instant::now();
            let gone = {
                let mut idle = self.conns.idle();
                idle.push(Idle {
                    conn,
                    since: now,
                    opened: self.opened,
                });
                expire(&mut idle, now)
            };
            gone.into_iter().for_each(close_quietly);
        }
    }
}

impl Deref for Lent<'_> {
    type Target = PgConnection;
    fn deref(&self) -> &PgConnection {
        self.conn
            .as_ref()
            .expect("a lent connection is there until given back")
    }
}

impl DerefMut for Lent<'_> {
    fn deref_mut(&mut self) -> &mut PgConnection {
        self.conn
            .as_mut()
            .expect("a lent connection is there until given back")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Options for a port nothing listens on (a connect fails at once).
    fn nowhere() -> PgConnectOptions {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        let port = listener.local_addr().expect("addr").port();
        drop(listener);
        PgConnectOptions::new().host("127.0.0.1").port(port)
    }

    #[tokio::test]
    async fn all_connections_busy_is_busy_and_a_failed_connect_says_why() {
        let conns = Conns::new(nowhere(), 1);
        let held = conns.slots.acquire().await.expect("the one slot");
        let deadline = Instant::now() + Duration::from_millis(50);
        assert!(matches!(conns.lend(deadline).await, Err(NotLent::Busy)));
        drop(held);
        let deadline = Instant::now() + Duration::from_secs(5);
        assert!(matches!(
            conns.lend(deadline).await,
            Err(NotLent::Connect(_))
        ));
        // The failed attempt gave its slot back.
        assert_eq!(conns.slots.available_permits(), 1);
        assert_eq!(conns.idle_count(), 0);
    }

    #[test]
    fn idle_and_old_connections_expire_wherever_they_are_in_the_list() {
        let start = Instant::now();
        let at = |secs: u64| start + Duration::from_secs(secs);
        let idle = |conn: u32, since: u64, opened: u64| Idle {
            conn,
            since: at(since),
            opened: at(opened),
        };
        // A burst's connections at the bottom, the one in steady use on top.
        let mut list = vec![idle(1, 0, 0), idle(2, 0, 0), idle(3, 599, 0)];
        assert!(expire(&mut list, at(599)).is_empty());
        assert_eq!(expire(&mut list, at(600)), [1, 2]);
        assert_eq!(list.iter().map(|i| i.conn).collect::<Vec<_>>(), [3]);
        // In use all along, but opened 30 minutes ago.
        let mut list = vec![idle(4, 1_799, 0), idle(5, 1_799, 100)];
        assert_eq!(expire(&mut list, at(1_800)), [4]);
        assert_eq!(list.len(), 1);
    }

    #[test]
    fn a_size_of_zero_is_one() {
        assert_eq!(Conns::new(nowhere(), 0).size(), 1);
    }
}
