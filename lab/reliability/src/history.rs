//! The register's history: every request it answered, stamped by its one clock.

use serde::{Deserialize, Serialize};

use crate::protocol::{Outcome, SectionId};

/// One answered request, in the order the register handled them.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Event {
    /// Position in the history (0-based, gapless).
    pub seq: u64,
    /// When the register handled it, in microseconds on the register's monotonic clock.
    pub at_us: u64,
    /// Whose section.
    pub id: SectionId,
    /// What happened.
    pub op: Op,
}

/// What a client did, and what the register decided.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "kebab-case")]
pub enum Op {
    /// Entered the critical section with this token.
    Begin {
        /// The grant's fencing token.
        token: Option<u64>,
        /// `false` when a fenced register refused the token.
        accepted: bool,
    },
    /// Read the counter.
    Read {
        /// The token sent.
        token: Option<u64>,
        /// `false` when refused.
        accepted: bool,
        /// The value returned (the current value even when refused, for the record).
        value: u64,
    },
    /// Checked the lease just after the previous reply.
    Check {
        /// The guard said it still held the lease.
        held: bool,
        /// The validity it reported left, in milliseconds.
        remaining_ms: u64,
    },
    /// Wrote `new`, computed from `read`.
    Write {
        /// The token sent.
        token: Option<u64>,
        /// `false` when refused.
        accepted: bool,
        /// The value the client had read.
        read: u64,
        /// The value it wrote.
        new: u64,
    },
    /// Left the critical section.
    End {
        /// How the section ended.
        outcome: Outcome,
    },
    /// The guard's `lost()` fired.
    Lost {
        /// Client-side margin before the earliest server expiry (negative: after).
        margin_ms: i64,
        /// The `LostReason` as one word.
        reason: String,
    },
}
