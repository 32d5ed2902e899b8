//! The connections lock calls run on: at most `pool_size` of them, opened when needed,
//! kept idle between calls (the most recently used first), pinged before a call when idle
//! for a second or more, and dropped whenever a call did not end cleanly.
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
//! [`begin_fenced`](crate::PostgresBackend::begin_fenced)) and for the `LISTEN`
//! connection.

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

/// Idle connections unused for this long are closed rather than pinged and lent (as
/// sqlx's pool's default idle timeout does), so a burst's connections do not stay open
/// for ever on the server.
const CLOSE_IF_IDLE_FOR: Duration = Duration::from_secs(600);

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
    idle: Mutex<Vec<Idle>>,
}

struct Idle {
    conn: PgConnection,
    since: Instant,
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

    fn idle(&self) -> std::sync::MutexGuard<'_, Vec<Idle>> {
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
            let popped = self.idle().pop();
            let Some(Idle { mut conn, since }) = popped else {
                break;
            };
            let idle_for = since.elapsed();
            if idle_for >= CLOSE_IF_IDLE_FOR {
                close_quietly(conn);
                continue;
            }
            if idle_for < PING_IF_IDLE_FOR {
                return Ok(Lent::new(conn, self, permit));
            }
            match timeout_at(deadline, conn.ping()).await {
                Ok(Ok(())) => return Ok(Lent::new(conn, self, permit)),
                Ok(Err(err)) => {
                    tracing::debug!(error = %err, "an idle PostgreSQL connection failed its ping; dropped");
                }
                Err(_) => return Err(NotLent::Slow),
            }
        }
        match timeout_at(deadline, PgConnection::connect_with(&self.options)).await {
            Ok(Ok(conn)) => Ok(Lent::new(conn, self, permit)),
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
    conns: &'a Conns,
    _permit: SemaphorePermit<'a>,
}

impl<'a> Lent<'a> {
    fn new(conn: PgConnection, conns: &'a Conns, permit: SemaphorePermit<'a>) -> Self {
        Self {
            conn: Some(conn),
            conns,
            _permit: permit,
        }
    }

    /// Returns the connection for the next call: only after a call that ended cleanly.
    pub(crate) fn give_back(mut self) {
        if let Some(conn) = self.conn.take() {
            self.conns.idle().push(Idle {
                conn,
                since: Instant::now(),
            });
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
    fn a_size_of_zero_is_one() {
        assert_eq!(Conns::new(nowhere(), 0).size(), 1);
    }
}
