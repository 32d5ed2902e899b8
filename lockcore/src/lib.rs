//! The anylock contract and the machinery every backend shares.
//!
//! An application builds a [`Locker`] over an `Arc<dyn LockBackend>` and calls
//! [`Locker::acquire`]; it gets a [`LockGuard`] whose lease a background task refreshes
//! every TTL/8 and whose [`Health`] turns `Lost` when the lease can no longer be trusted.
//!
//! ```
//! use std::{sync::Arc, time::Duration};
//! use lockcore::{LockOptions, Locker, MemoryBackend};
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), lockcore::Error> {
//! let locker = Locker::new(Arc::new(MemoryBackend::new()))
//!     .with_options(LockOptions::new(Duration::from_secs(30)));
//! let guard = locker.acquire("nightly-report").await?;
//! println!("holding with fence token {:?}", guard.fence_token());
//! guard.release().await?;
//! # Ok(()) }
//! ```
//!
//! # Crate map
//! - [`LockBackend`]: the object-safe trait every backend implements (single attempts).
//! - [`Locker`]: the shared acquire loop (waiting, backoff, deadlines, cancel safety).
//! - [`LockGuard`]: a held lease with its [`Health`], refreshed in the background.
//! - [`state`]: the pure health state machine; the refresher drives it.
//! - [`MemoryBackend`]: the in-process reference backend.
//! - [`Clock`]: the clock guards follow (it counts a machine suspend), adjustable to replay
//!   clock faults.
//! - [`Error`]: one error type with an [`ErrorKind`] and a [`RetryStatus`].

mod attempt;
mod backend;
mod backoff;
mod clock;
mod duration;
mod election;
mod error;
mod grid;
mod guarantees;
mod guard;
mod held;
mod identity;
mod invalid;
mod keeper;
mod kind;
mod locker;
mod mailbox;
mod memory;
mod name;
mod note;
mod options;
mod permit_count;
mod permit_table;
mod permits;
mod security;
#[cfg(feature = "serde")]
mod serialize;
pub mod state;
mod suspend;
#[cfg(any(test, feature = "testing"))]
pub mod testing;
#[cfg(test)]
mod tests;
mod ttl;
mod types;
pub mod url;
mod wait;

pub use backend::{LockBackend, QueueTicket, ReleaseEvents};
pub use backoff::{Backoff, Jitter, MAX_BACKOFF_CAP};
pub use clock::{Clock, ClockControl, RESUME_CHECK};
pub use duration::parse_duration;
pub use election::{DEFAULT_OBSERVE_INTERVAL, Election, Leader, Leadership, Observer};
pub use error::{Error, Result};
pub use guarantees::{
    Durability, Exclusion, ExpiryClock, Fairness, Fencing, Guarantees, Semaphores, Waiting,
};
pub use guard::{Deadline, LockGuard};
pub use identity::{AUTO_PREFIX, Identity, MAX_NAMED_LEN, MAX_TASK_LEN, NAMED_PREFIX};
pub use invalid::Invalid;
pub use kind::{ErrorKind, RetryStatus};
pub use locker::Locker;
pub use memory::MemoryBackend;
pub use name::{LockName, MAX_NAME_LEN};
pub use note::{MAX_NOTE_LEN, Note, display_safe, is_unsafe_to_show, validate_prefix};
pub use options::{DEFAULT_MARGIN, LockOptions, MAX_REFRESH_FAILURES, WaitMode};
pub use permit_count::{MAX_PERMITS, Permits};
pub use permits::limit_conflict;
pub use security::{ConnectionSecurity, TlsDetails, Transport, Verification};
pub use state::{Health, LostReason};
#[cfg(any(test, feature = "testing"))]
pub use testing::Defect;
pub use ttl::{DEFAULT_TTL, MAX_TTL, MIN_TTL, Ttl};
pub use types::{Acquire, AcquireRequest, FenceToken, HeldLock, HolderInfo, Lease};
pub use url::is_secret_param;
