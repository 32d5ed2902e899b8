//! The values that cross the [`LockBackend`](crate::LockBackend) boundary.

use std::fmt;
use std::time::{Duration, SystemTime};

use crate::identity::Identity;
use crate::name::LockName;
use crate::note::Note;
use crate::permit_count::Permits;
use crate::ttl::Ttl;

/// A fencing token: strictly increasing per lock name across every grant.
///
/// Pass it to the protected resource with every write; the resource rejects writes whose
/// token is lower than the highest it has seen (Kleppmann, "How to do distributed
/// locking"). Backends without fencing (Redlock) return `None` from
/// [`LockBackend::fence_token`](crate::LockBackend::fence_token).
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct FenceToken(u64);

impl FenceToken {
    /// Wraps a raw token value.
    pub const fn new(value: u64) -> Self {
        Self(value)
    }

    /// The raw value.
    pub const fn get(self) -> u64 {
        self.0
    }
}

impl fmt::Display for FenceToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&self.0, f)
    }
}

impl fmt::Debug for FenceToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "FenceToken({})", self.0)
    }
}

/// One acquisition attempt's input.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct AcquireRequest {
    /// The lock.
    pub name: LockName,
    /// Who asks. A held lock whose stored owner equals this identity may be retaken at once
    /// by backends that support same-identity retake.
    pub owner: Identity,
    /// The lease time-to-live the backend must set (on its own clock where it has one).
    pub ttl: Ttl,
    /// Text to store with the grant for people (`inspect` and `list` show it); a
    /// same-owner retake replaces it.
    pub note: Option<Note>,
    /// `Some(n)`: a permit of the semaphore `name` of `n` permits
    /// ([`LockBackend::acquire_permit`](crate::LockBackend::acquire_permit)), not the lock.
    pub permits: Option<Permits>,
}

impl AcquireRequest {
    /// Builds a request. Callers normally go through [`Locker`](crate::Locker), which
    /// validates the TTL first.
    pub fn new(name: LockName, owner: Identity, ttl: Ttl) -> Self {
        Self {
            name,
            owner,
            ttl,
            note: None,
            permits: None,
        }
    }

    /// Stores `note` with the grant.
    pub fn with_note(mut self, note: Option<Note>) -> Self {
        self.note = note;
        self
    }

    /// Asks for a permit of a semaphore of `permits` permits instead of the lock.
    pub fn with_permits(mut self, permits: Permits) -> Self {
        self.permits = Some(permits);
        self
    }
}

/// A granted lease, as returned by a backend.
///
/// `grant` is opaque backend state that identifies this grant on the server (a Redis
/// value, a GCS generation and metageneration, an etcd lease id). Only the backend that
/// issued a lease interprets it.
#[derive(Clone, PartialEq, Eq)]
pub struct Lease {
    name: LockName,
    owner: Identity,
    ttl: Ttl,
    token: Option<FenceToken>,
    grant: String,
    permits: Option<Permits>,
}

impl Lease {
    /// Builds a lease. `ttl` must be the TTL the server actually set, never more.
    pub fn new(name: LockName, owner: Identity, ttl: Ttl, grant: impl Into<String>) -> Self {
        Self {
            name,
            owner,
            ttl,
            token: None,
            grant: grant.into(),
            permits: None,
        }
    }

    /// Marks the lease as a permit of a semaphore of `permits` permits (set by the backend
    /// that granted it; its `refresh`, `release` and `detach` act on that permit).
    pub fn with_permits(mut self, permits: Permits) -> Self {
        self.permits = Some(permits);
        self
    }

    /// `Some(n)` for a permit of a semaphore of `n` permits, `None` for a lock.
    pub fn permits(&self) -> Option<Permits> {
        self.permits
    }

    /// Sets the fencing token.
    pub fn with_token(mut self, token: FenceToken) -> Self {
        self.token = Some(token);
        self
    }

    /// Replaces the backend's grant state (after a refresh changed it).
    pub fn with_grant(mut self, grant: impl Into<String>) -> Self {
        self.grant = grant.into();
        self
    }

    /// Replaces the TTL (after a refresh granted a different one).
    pub fn with_ttl(mut self, ttl: Ttl) -> Self {
        self.ttl = ttl;
        self
    }

    /// The lock.
    pub fn name(&self) -> &LockName {
        &self.name
    }

    /// The owner.
    pub fn owner(&self) -> &Identity {
        &self.owner
    }

    /// The TTL the server set.
    pub fn ttl(&self) -> Ttl {
        self.ttl
    }

    /// The fencing token, when the backend has one.
    pub fn token(&self) -> Option<FenceToken> {
        self.token
    }

    /// The backend's opaque grant state.
    pub fn grant(&self) -> &str {
        &self.grant
    }
}

impl fmt::Debug for Lease {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Lease")
            .field("name", &self.name)
            .field("owner", &self.owner)
            .field("ttl", &self.ttl)
            .field("token", &self.token)
            .field("permits", &self.permits)
            .finish_non_exhaustive()
    }
}

/// Who holds a lock, as far as the backend knows.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HolderInfo {
    owner: Identity,
    acquired_at: Option<SystemTime>,
    expires_in: Option<Duration>,
    token: Option<FenceToken>,
    note: Option<Note>,
}

impl HolderInfo {
    /// A holder known only by identity.
    pub fn new(owner: Identity) -> Self {
        Self {
            owner,
            acquired_at: None,
            expires_in: None,
            token: None,
            note: None,
        }
    }

    /// Sets when the current grant was made (wall clock, for people).
    pub fn with_acquired_at(mut self, at: SystemTime) -> Self {
        self.acquired_at = Some(at);
        self
    }

    /// Sets how long until the lease expires unless refreshed, on the backend's clock.
    ///
    /// A backend rounds a live lease's time left up, never to zero: zero means expired
    /// but not yet removed, and a waiter does not let such a holder cap its sleep (it
    /// would poll every millisecond), so a live holder reported at zero makes waiters
    /// sleep their whole backoff past its end.
    pub fn with_expires_in(mut self, remaining: Duration) -> Self {
        self.expires_in = Some(remaining);
        self
    }

    /// Sets the holder's fencing token.
    pub fn with_token(mut self, token: FenceToken) -> Self {
        self.token = Some(token);
        self
    }

    /// Sets the note stored with the grant (`None` leaves it unset).
    pub fn with_note(mut self, note: Option<Note>) -> Self {
        self.note = note;
        self
    }

    /// The holder's identity.
    pub fn owner(&self) -> &Identity {
        &self.owner
    }

    /// When the current grant was made, when known.
    pub fn acquired_at(&self) -> Option<SystemTime> {
        self.acquired_at
    }

    /// How long until the lease expires unless refreshed, when known.
    pub fn expires_in(&self) -> Option<Duration> {
        self.expires_in
    }

    /// The holder's fencing token, when known.
    pub fn token(&self) -> Option<FenceToken> {
        self.token
    }

    /// The note stored with the grant, if the holder gave one.
    pub fn note(&self) -> Option<&Note> {
        self.note.as_ref()
    }
}

/// The outcome of one acquisition attempt.
#[derive(Debug, Clone)]
pub enum Acquire {
    /// The lock is ours.
    Acquired(Lease),
    /// Someone else holds it.
    Held(HolderInfo),
}

/// One held lock in a listing: its name and its holder, as
/// [`inspect`](crate::LockBackend::inspect) would report it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HeldLock {
    name: LockName,
    holder: HolderInfo,
}

impl HeldLock {
    /// `name` held by `holder`.
    pub fn new(name: LockName, holder: HolderInfo) -> Self {
        Self { name, holder }
    }

    /// The lock.
    pub fn name(&self) -> &LockName {
        &self.name
    }

    /// Who holds it.
    pub fn holder(&self) -> &HolderInfo {
        &self.holder
    }

    /// Both parts.
    pub fn into_parts(self) -> (LockName, HolderInfo) {
        (self.name, self.holder)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fence_tokens_order_by_value() {
        assert!(FenceToken::new(2) > FenceToken::new(1));
        assert_eq!(FenceToken::new(7).get(), 7);
        assert_eq!(FenceToken::new(7).to_string(), "7");
    }

    #[test]
    fn lease_debug_hides_grant() {
        let name = LockName::new("x").expect("valid");
        let lease = Lease::new(
            name,
            Identity::unique(),
            Ttl::new(Duration::from_secs(1)).expect("valid"),
            "s3cr3t-nonce",
        );
        assert!(!format!("{lease:?}").contains("s3cr3t"));
    }
}
