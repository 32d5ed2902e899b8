//! Session leases, as Go's `concurrency.Session` has them: the locks one backend (and its
//! clones) takes with one TTL share one etcd lease, granted when first needed, so an
//! uncontended lock cycle is two Raft writes (the key's put and its delete) instead of
//! four RPCs (LeaseGrant, Txn, LeaseRevoke).
//!
//! Nothing runs in the background: the guards' refreshes keep a session alive (their
//! keep-alives, one per session per batch), and [`Sessions::session`] keeps it alive (or
//! grants a new one) when an acquire finds it has used up an eighth of its TTL since the
//! last keep-alive anyone confirmed. So a process that dies, or drops its backend without
//! releasing, loses its locks when their session expires: one TTL after the last grant or
//! keep-alive of the session (an acquire between keep-alives renews nothing, so up to an
//! eighth of the TTL sooner than one TTL after it; never sooner than the lease it reported).
//!
//! Time left is measured on the local monotonic clock from the *send* time of the last
//! confirmed grant or keep-alive, so an acquire never reports more than the server gives:
//! etcd renews a lease to its full TTL when it receives the keep-alive, which is later.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use lockcore::{Error, Result};

use crate::client::EtcdClient;
use crate::stragglers::Stragglers;

/// One session lease as this client last confirmed it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Session {
    /// The etcd lease id.
    pub(crate) id: i64,
    /// The TTL etcd granted (and renews to), in whole seconds.
    pub(crate) granted: i64,
    /// When the last grant or keep-alive that etcd confirmed was sent.
    pub(crate) confirmed: Instant,
}

impl Session {
    /// The granted TTL.
    pub(crate) fn ttl(&self) -> Duration {
        Duration::from_secs(u64::try_from(self.granted).unwrap_or(0))
    }

    /// What the server gives the lease at least, from `at` on: the granted TTL from the
    /// last confirmed send, less the time since.
    pub(crate) fn left_at(&self, at: Instant) -> Duration {
        match self.confirmed.checked_add(self.ttl()) {
            Some(end) => end.saturating_duration_since(at),
            // A TTL past what the clock can count: all of it is left.
            None => self.ttl(),
        }
    }
}

/// The session of one TTL: the lease, while one is known alive, and a lock so that one
/// caller at a time grants or renews it.
#[derive(Default)]
struct Slot {
    current: Mutex<Option<Session>>,
    renewing: tokio::sync::Mutex<()>,
}

impl Slot {
    fn current(&self) -> MutexGuard<'_, Option<Session>> {
        self.current.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn get(&self) -> Option<Session> {
        *self.current()
    }
}

/// The session leases of one backend and its clones, one per requested TTL in seconds.
pub(crate) struct Sessions {
    client: Arc<EtcdClient>,
    slots: Mutex<HashMap<i64, Arc<Slot>>>,
    /// Keys a failed release or move left on a session, deleted by later sweeps.
    pub(crate) stragglers: Stragglers,
}

/// Whether a session with `left` of its `ttl` needs a keep-alive before it backs a grant:
/// once an eighth of its TTL is used (lockcore's refresh interval), an acquire renews it
/// (one keep-alive on the shared streams) so the grant reports the full TTL. Between
/// renewals a grant reports what is left, at least seven eighths of the TTL.
fn stale(left: Duration, ttl: Duration) -> bool {
    left < ttl - ttl / 8
}

/// Whether a session with `left` of its `ttl` is too old to back a grant at all without
/// waiting for a renewal another caller is making.
fn too_old(left: Duration, ttl: Duration) -> bool {
    left < ttl / 2
}

impl Sessions {
    /// No sessions yet.
    pub(crate) fn new(client: Arc<EtcdClient>) -> Self {
        Self {
            stragglers: Stragglers::new(Arc::clone(&client)),
            client,
            slots: Mutex::new(HashMap::new()),
        }
    }

    fn slots(&self) -> MutexGuard<'_, HashMap<i64, Arc<Slot>>> {
        self.slots.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn slot(&self, ttl_secs: i64) -> Arc<Slot> {
        Arc::clone(self.slots().entry(ttl_secs).or_default())
    }

    /// The session for locks of `ttl_secs`, alive with at least seven eighths of its
    /// TTL left (by [`Session::left_at`]) when it can be had without waiting: as known
    /// (no RPC), else kept alive (a keep-alive on the shared streams), else a new lease
    /// (`LeaseGrant`). When another caller is renewing it and half its TTL is left, it is
    /// used as it is: the caller reports what is left.
    ///
    /// # Errors
    /// As `LeaseGrant`; a keep-alive's failure is an error only when less than half the
    /// TTL is left.
    pub(crate) async fn session(&self, ttl_secs: i64) -> Result<Session> {
        self.stragglers.sweep();
        let slot = self.slot(ttl_secs);
        if let Some(session) = slot.get()
            && !stale(session.left_at(Instant::now()), session.ttl())
        {
            return Ok(session);
        }
        let _renewing = match slot.renewing.try_lock() {
            Ok(renewing) => renewing,
            Err(_) => {
                if let Some(session) = slot.get()
                    && !too_old(session.left_at(Instant::now()), session.ttl())
                {
                    return Ok(session);
                }
                slot.renewing.lock().await
            }
        };
        if let Some(session) = slot.get() {
            if !stale(session.left_at(Instant::now()), session.ttl()) {
                return Ok(session);
            }
            match self.keep_alive(&slot, session).await {
                Ok(Some(renewed)) => return Ok(renewed),
                Ok(None) => {}
                // Nothing left by our count: the lease may be gone on the server too, so
                // the session is not waited for but replaced (a keep-alive stream that
                // keeps failing must not keep every acquire failing).
                Err(_) if session.left_at(Instant::now()).is_zero() => {
                    let mut current = slot.current();
                    if current.is_some_and(|s| s.id == session.id) {
                        *current = None;
                    }
                }
                Err(err) if too_old(session.left_at(Instant::now()), session.ttl()) => {
                    return Err(err);
                }
                Err(err) => {
                    tracing::debug!(error = %err, "renewing a session lease failed; using what is left");
                    return Ok(session);
                }
            }
        }
        let sent = Instant::now();
        let (id, granted) = self.client.grant(ttl_secs).await?;
        if granted <= 0 {
            return Err(Error::new(
                lockcore::ErrorKind::Protocol,
                format!("etcd granted a session lease with TTL {granted} s; it holds nothing"),
            ));
        }
        let session = Session {
            id,
            granted,
            confirmed: sent,
        };
        *slot.current() = Some(session);
        Ok(session)
    }

    /// One keep-alive of `session`: the renewed session, or `None` (and forgotten) when
    /// etcd says the lease is gone.
    async fn keep_alive(&self, slot: &Slot, session: Session) -> Result<Option<Session>> {
        let sent = Instant::now();
        let ttls = self.client.keep_alive_many(&[session.id]).await?;
        let ttl = ttls.first().copied().ok_or_else(|| {
            Error::unavailable("a session keep-alive got no answer for its lease")
        })?;
        let mut current = slot.current();
        if ttl <= 0 {
            if current.is_some_and(|s| s.id == session.id) {
                *current = None;
            }
            return Ok(None);
        }
        let renewed = Session {
            id: session.id,
            granted: ttl,
            confirmed: sent,
        };
        match *current {
            Some(s) if s.id == session.id && s.confirmed < sent => *current = Some(renewed),
            _ => {}
        }
        Ok(Some(renewed))
    }

    /// A keep-alive of lease `id` sent at `sent` was answered with `ttl` (by a refresh):
    /// a session with that id is alive for `ttl` from `sent` (`ttl > 0`), or gone.
    pub(crate) fn confirm(&self, id: i64, sent: Instant, ttl: i64) {
        let slots: Vec<Arc<Slot>> = self.slots().values().cloned().collect();
        for slot in slots {
            let mut current = slot.current();
            let Some(session) = *current else {
                continue;
            };
            if session.id != id {
                continue;
            }
            if ttl <= 0 {
                *current = None;
                self.stragglers.forget_lease(id);
            } else if session.confirmed < sent {
                *current = Some(Session {
                    id,
                    granted: ttl,
                    confirmed: sent,
                });
            }
        }
    }

    /// Lease `id` is gone (etcd refused a write on it): a session with that id is dropped,
    /// so the next acquire grants a new one.
    pub(crate) fn forget(&self, id: i64) {
        self.confirm(id, Instant::now(), 0);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn time_left_runs_from_the_send_of_the_last_confirmed_keep_alive() {
        let sent = Instant::now();
        let session = Session {
            id: 1,
            granted: 10,
            confirmed: sent,
        };
        assert_eq!(session.left_at(sent), Duration::from_secs(10));
        assert_eq!(
            session.left_at(sent + Duration::from_secs(4)),
            Duration::from_secs(6)
        );
        assert_eq!(
            session.left_at(sent + Duration::from_secs(11)),
            Duration::ZERO
        );
        let ttl = session.ttl();
        assert!(!stale(Duration::from_millis(8_750), ttl));
        assert!(stale(Duration::from_millis(8_749), ttl));
        assert!(!too_old(Duration::from_secs(5), ttl));
        assert!(too_old(Duration::from_millis(4_999), ttl));
    }

    /// A TTL a broken server could send (i64::MAX seconds) is arithmetic, never a panic.
    #[test]
    fn an_absurd_ttl_does_not_overflow() {
        let session = Session {
            id: 1,
            granted: i64::MAX,
            confirmed: Instant::now(),
        };
        let ttl = session.ttl();
        let left = session.left_at(Instant::now());
        assert_eq!(left, ttl);
        assert!(!stale(left, ttl));
        assert!(!too_old(left, ttl));
    }
}
