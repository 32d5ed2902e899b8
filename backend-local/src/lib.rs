//! anylock's embedded backend: locks shared by every process on one machine, with no
//! server to run. It is the zero-setup default of the `anylock` CLI.
//!
//! The lock table is a SQLite file (see [`LocalConfig`] for where it lives). Why SQLite
//! rather than OS file locks: a lease table gives the same semantics as the server
//! backends (TTL, refresh, compare-and-delete release, durable fence tokens kept in the
//! row), and it survives the holder's process; `flock` locks vanish with the process but
//! have no TTL (a hung holder blocks forever) and no place for a durable counter. Dead
//! holders are still recovered at once: each holder also holds a `flock` on a file of its
//! own, and a contender that can take that kernel lock knows the holder (and every command
//! it started while holding the lease) is gone, in whatever PID namespace it ran.
//! Semaphores (at most N holders of a name, `LockBackend::acquire_permit`) are a table of
//! their own in the same file, with the same liveness files.
//!
//! A store is one user's: one that another user could change (a file or directory of
//! theirs, or writable by them, or a symbolic link) is refused with a [`StoreRefused`]
//! error, as is one on a network or shared filesystem; `?shared_group=NAME` and
//! `?shared_fs=allow` open those cases knowingly (`docs/local.md`).
//!
//! ```no_run
//! use std::sync::Arc;
//! use backend_local::{LocalBackend, LocalConfig};
//! use lockcore::Locker;
//! # async fn demo() -> Result<(), lockcore::Error> {
//! let backend: LocalBackend = LocalConfig::from_url("local:/srv/demo/locks.sqlite3")?.build().await?;
//! let guard = Locker::new(Arc::new(backend)).acquire("nightly-report").await?;
//! guard.release().await?;
//! # Ok(()) }
//! ```

mod backend;
mod batch;
mod client;
mod config;
mod error;
mod filesystem;
mod guarantees;
mod host;
mod liveness;
mod permit_store;
#[cfg(test)]
mod prop_tests;
mod refusal;
mod schema;
mod store;
#[cfg(test)]
mod suspend_tests;
mod trust;
#[cfg(target_os = "linux")]
mod wake;

pub use backend::LocalBackend;
pub use config::LocalConfig;
pub use guarantees::guarantees;
pub use lockcore;
pub use refusal::{Refusal, StoreRefused};

use std::sync::Arc;

use lockcore::{LockBackend, Result};

/// The URL schemes this crate opens.
pub const SCHEMES: &[&str] = &[config::SCHEME];

/// No reply comes from a server: the store is a file of this machine, opened only when it
/// passes the ownership and permission checks (`docs/local.md`).
pub const REPLY_LIMITS: &[(&str, usize)] = &[];

/// Opens the backend `url` names (`local:` or `local:/path/locks.sqlite3`): parses it
/// ([`LocalConfig::from_url`]) and opens the database ([`LocalConfig::build`]).
///
/// # Errors
/// As [`LocalConfig::from_url`] and [`LocalBackend::connect`].
pub async fn open(url: &str) -> Result<Arc<dyn LockBackend>> {
    Ok(Arc::new(LocalConfig::from_url(url)?.build().await?))
}
