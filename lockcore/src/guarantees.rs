//! The guarantees descriptor: what a backend promises, in types.
//!
//! Every promise here is checked by the conformance suite, and the README's comparison table
//! is generated from these descriptors plus the suite's measured results.

use std::fmt;

/// What a backend promises about mutual exclusion, fencing, expiry, waiting and durability.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Guarantees {
    /// How mutual exclusion is decided.
    pub exclusion: Exclusion,
    /// Whether fencing tokens are issued.
    pub fencing: Fencing,
    /// Whose clock decides that a lease has expired.
    pub expiry_clock: ExpiryClock,
    /// How waiters learn that a lock was released.
    pub waiting: Waiting,
    /// Whether waiters are served in arrival order.
    pub fairness: Fairness,
    /// Whether an owner with the same identity may retake its own abandoned lock at once.
    pub same_owner_retake: bool,
    /// What happens to held leases and fence counters when the server restarts.
    pub durability: Durability,
    /// Whether [`LockBackend::list`](crate::LockBackend::list) enumerates held locks.
    pub listing: bool,
    /// Whether the backend grants semaphore permits
    /// ([`LockBackend::acquire_permit`](crate::LockBackend::acquire_permit)).
    pub semaphores: Semaphores,
    /// A sentence or two of caveats, for people.
    pub notes: &'static str,
}

impl Guarantees {
    /// A descriptor with the three fields every backend must state; the rest default to the
    /// weakest promise (polled, unfair, no retake, lost on restart, no listing) until a `with_*` method
    /// says otherwise. (The struct is non-exhaustive, so backends build it this way.)
    pub fn new(exclusion: Exclusion, fencing: Fencing, expiry_clock: ExpiryClock) -> Self {
        Self {
            exclusion,
            fencing,
            expiry_clock,
            waiting: Waiting::Polled,
            fairness: Fairness::None,
            same_owner_retake: false,
            durability: Durability::LostOnRestart,
            listing: false,
            semaphores: Semaphores::Unsupported("not built for this backend yet"),
            notes: "",
        }
    }

    /// Sets how waiters learn of releases.
    pub fn with_waiting(mut self, waiting: Waiting) -> Self {
        self.waiting = waiting;
        self
    }

    /// Sets fairness.
    pub fn with_fairness(mut self, fairness: Fairness) -> Self {
        self.fairness = fairness;
        self
    }

    /// Declares same-identity instant retake.
    pub fn with_same_owner_retake(mut self, retake: bool) -> Self {
        self.same_owner_retake = retake;
        self
    }

    /// Sets durability across a server restart.
    pub fn with_durability(mut self, durability: Durability) -> Self {
        self.durability = durability;
        self
    }

    /// Declares that [`LockBackend::list`](crate::LockBackend::list) works.
    pub fn with_listing(mut self, listing: bool) -> Self {
        self.listing = listing;
        self
    }

    /// Sets whether semaphore permits are granted.
    pub fn with_semaphores(mut self, semaphores: Semaphores) -> Self {
        self.semaphores = semaphores;
        self
    }

    /// Sets the caveats sentence.
    pub fn with_notes(mut self, notes: &'static str) -> Self {
        self.notes = notes;
        self
    }
}

/// How mutual exclusion is decided.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Exclusion {
    /// Linearizable through a consensus protocol (etcd's Raft): survives the loss of a
    /// minority of members, including the leader.
    Consensus,
    /// Linearizable on one strongly consistent store (a PostgreSQL primary, GCS, a local
    /// database file). Safe while that store keeps its data.
    SingleStore,
    /// One node that keeps locks in memory (single Redis): a crash or failover without
    /// `fsync=always` can grant the lock twice.
    SingleNode,
    /// A quorum of independent nodes whose safety depends on bounded clock drift, network
    /// delay and process pauses (Redlock).
    TimingDependentQuorum,
    /// In one process only ([`MemoryBackend`](crate::MemoryBackend)).
    InProcess,
}

/// Whether fencing tokens are issued.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Fencing {
    /// Every grant of a name gets a token strictly greater than every earlier grant's.
    Monotonic,
    /// No tokens: the protected resource cannot reject a stale holder.
    None,
}

/// Whose clock decides expiry.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ExpiryClock {
    /// The server's clock: client clock skew cannot expire a lease early or late.
    Server,
    /// The clients' clocks: skew between clients shifts expiry.
    Client,
}

/// How waiters learn that a lock was released.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Waiting {
    /// The backend pushes a notification; waiters wake at once.
    Notified,
    /// Waiters poll with bounded, jittered backoff.
    Polled,
}

/// Whether waiters are served in arrival order.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Fairness {
    /// First come, first served.
    Fifo,
    /// Whoever retries first after a release wins.
    None,
}

/// What a server restart does to held leases and fence counters.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Durability {
    /// Held leases and fence counters survive a restart.
    SurvivesRestart,
    /// A restart forgets held leases (a second holder may be granted the lock). Fence
    /// tokens must still never repeat or go backwards: a backend with
    /// [`Fencing::Monotonic`] and this durability restores its counter from a source that
    /// survives the restart (Redis: the server clock), and says so in its notes.
    LostOnRestart,
}

/// Whether a backend grants semaphore permits (at most N holders of a name).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Semaphores {
    /// Permits are granted with the same exclusion, fencing, expiry clock and waiting as
    /// the backend's locks: never more than N live permits, checked by the conformance
    /// suite's semaphore cases.
    Supported,
    /// No permits, and why.
    Unsupported(&'static str),
}

impl fmt::Display for Semaphores {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Supported => f.write_str("yes"),
            Self::Unsupported(why) => write!(f, "no ({why})"),
        }
    }
}

impl fmt::Display for Exclusion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Consensus => "linearizable (consensus)",
            Self::SingleStore => "linearizable (single store)",
            Self::SingleNode => "single node, lost on crash or failover",
            Self::TimingDependentQuorum => "timing-dependent quorum",
            Self::InProcess => "in-process",
        })
    }
}
