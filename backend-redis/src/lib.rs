//! anylock backends for Redis.
//!
//! - [`RedisBackend`]: one Redis server. Acquire, refresh and release are one script call
//!   (one round trip) each; a batch of up to 1,000 refreshes
//!   ([`refresh_many`](lockcore::LockBackend::refresh_many)) is one pipeline (one round
//!   trip); every grant gets a fencing token from a counter key that is
//!   never deleted; a release publishes a notification so waiters wake at once.
//!   Semaphores (at most N holders of a name,
//!   [`acquire_permit`](lockcore::LockBackend::acquire_permit)) take one script call per
//!   operation too, on keys of their own ([`PermitKeys`]).
//! - [`RedlockBackend`]: Redlock ("Distributed Locks with Valkey") over N independent
//!   servers: a quorum of N/2+1, validity = TTL − elapsed − drift, release everywhere on
//!   failure. No fencing tokens, and no semaphores (a count kept on independent nodes
//!   has no single point where it is decided; see its
//!   [`guarantees`](redlock_guarantees)).
//!
//! # Which one to use
//! - **Efficiency locks** (a lock that saves duplicate work; a rare double grant costs a
//!   little): use [`RedisBackend`]. It is the cheapest lock here, and Redlock's five
//!   servers buy little for this use (Kleppmann, "How to do distributed locking").
//! - **Correctness locks** (a double grant corrupts data): neither Redis mode is safe by
//!   itself. Redlock is *not* the answer: its safety depends on timing and it has no
//!   fencing token (Kleppmann, same post). Use a consensus or transactional backend (etcd,
//!   PostgreSQL), or [`RedisBackend`] with the protected resource rejecting writes whose
//!   [fence token](lockcore::LockBackend::fence_token) is lower than one it has seen, on a
//!   node that keeps its data (`appendfsync always`, no failover to an async replica).
//!
//! See `docs/redis.md` for the key layout, the scripts and measured costs.
//!
//! # URLs
//! - Single instance: `redis://[user:password@]host[:port][/db][?params]`, or `rediss://`
//!   for TLS (`#insecure` skips certificate verification: test servers only, and only
//!   with the `tls-insecure` cargo feature).
//! - Redlock: `redlock://[user:password@]host1:port1,host2:port2,…[/db][?params]`
//!   (`redlocks://` for TLS), or a comma-separated list of full node URLs
//!   (`redis://a:6379,redis://b:6379,…`) when the nodes differ in credentials or database.
//!
//! Parameters: `prefix` (key prefix, default `anylock`), `timeout_ms` (per call; per node
//! under Redlock; defaults [`DEFAULT_TIMEOUT`] and [`DEFAULT_NODE_TIMEOUT`]),
//! `connect_timeout_ms` ([`DEFAULT_CONNECT_TIMEOUT`]), `protocol` (`resp2`/`resp3`,
//! passed to the client), and on TLS URLs `ca`, `cert` and `key` (PEM files: the only CAs
//! trusted instead of the OS trust store, and a client certificate; read and checked at
//! parse time, refused on `redis://` and `redlock://`, as is `#insecure`; see
//! `docs/tls-and-auth.md`). A Redlock node list that mixes `rediss://` and `redis://`
//! nodes is refused unless every node URL carries `allow_mixed_tls=true` (never the
//! default: the plaintext nodes get the password unencrypted). Unknown parameters are rejected, so a typo cannot silently change
//! behaviour. `Debug` and `Display` of the configurations show the password as `***`, and
//! no error message contains it.
//!
//! # Example
//! ```no_run
//! use std::{sync::Arc, time::Duration};
//! use backend_redis::{RedisBackend, RedisConfig};
//! use lockcore::{LockOptions, Locker};
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), lockcore::Error> {
//! let config = RedisConfig::from_url("redis://127.0.0.1:6379/0?prefix=myapp")?;
//! let backend = RedisBackend::connect(config).await?;
//! let locker = Locker::new(Arc::new(backend))
//!     .with_options(LockOptions::new(Duration::from_secs(30)));
//! let guard = locker.acquire("nightly-report").await?;
//! let token = guard.fence_token().expect("the single-instance backend fences");
//! println!("send fence token {token} with every write to the report store");
//! guard.release().await?;
//! # Ok(()) }
//! ```
//!
//! Refreshing many leases at once, as the `Locker` does for the guards whose refreshes fall
//! due together (each result is what `refresh` of that lease alone would return):
//! ```no_run
//! use backend_redis::RedisBackend;
//! use lockcore::{ErrorKind, Lease, LockBackend};
//! # async fn refresh_all(backend: &RedisBackend, leases: &[Lease]) {
//! assert_eq!(backend.refresh_batch_limit(), 1000);
//! for (lease, result) in leases.iter().zip(backend.refresh_many(leases).await) {
//!     match result {
//!         Ok(_) => {}
//!         Err(err) if err.kind() == ErrorKind::Lost => println!("{} is gone", lease.name()),
//!         Err(err) => println!("{}: try again ({err})", lease.name()),
//!     }
//! }
//! # }
//! ```
//!
//! Redlock, from one URL listing the nodes:
//! ```no_run
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), lockcore::Error> {
//! let url = "redlock://h1:6379,h2:6379,h3:6379,h4:6379,h5:6379";
//! let backend = backend_redis::open(url).await?;
//! assert_eq!(backend.backend_name(), "redlock");
//! # Ok(()) }
//! ```

mod backend;
mod bounded;
mod client;
mod config;
#[cfg(test)]
mod config_tests;
mod error;
mod eviction;
mod frames;
mod keys;
mod limits;
mod link;
mod listing;
mod node_url;
mod notify;
mod permit_scripts;
mod permits;
mod pipeline;
#[cfg(test)]
mod prop_tests;
mod redlock;
mod replies;
mod scripts;

use std::sync::Arc;

use lockcore::{LockBackend, Result};

pub use backend::{RedisBackend, guarantees};
pub use config::{
    DEFAULT_CONNECT_TIMEOUT, DEFAULT_NODE_TIMEOUT, DEFAULT_PREFIX, DEFAULT_TIMEOUT, MAX_PREFIX_LEN,
    RedisConfig,
};
pub use keys::{LockKeys, PermitKeys};
pub use lockcore;
pub use redlock::{RedlockBackend, RedlockConfig, guarantees as redlock_guarantees};

/// What the client bounds in a server's replies, and the bound: bytes, or elements (the
/// last two: locks and pages of one listing).
///
/// A reply over a limit fails the call with a [`Protocol`](lockcore::ErrorKind::Protocol)
/// error that names the limit ("the server's reply exceeds 1 MiB (a value); is this a
/// Redis server?") and closes the connection before the client allocates for it; the next
/// call opens a new one. The largest legitimate replies are a semaphore's 10,000 permits
/// with their notes (about 11 MB, 40,001 values) and a listing page (about 500 keys); see
/// `docs/redis.md`, "Reply limits". Each limit is in bytes, or a count where its name
/// ends in "(count)".
pub const REPLY_LIMITS: &[(&str, usize)] = limits::ALL;

/// URL schemes of the single-instance backend (`rediss` is TLS).
pub const SCHEMES: &[&str] = &["redis", "rediss"];
/// URL schemes of the Redlock backend (`redlocks` is TLS).
pub const REDLOCK_SCHEMES: &[&str] = &["redlock", "redlocks"];

/// Opens the backend a URL names: `redis://`/`rediss://` for one server;
/// `redlock://`/`redlocks://`, or several comma-separated `redis://` URLs, for Redlock.
///
/// # Errors
/// As [`RedisConfig::from_url`] and [`RedisConfig::build`], or [`RedlockConfig::from_url`]
/// and [`RedlockConfig::build`].
///
/// # Cancel safety
/// Cancel safe.
pub async fn open(url: &str) -> Result<Arc<dyn LockBackend>> {
    let url = url.trim();
    let redlock = REDLOCK_SCHEMES
        .iter()
        .any(|scheme| url.starts_with(&format!("{scheme}://")))
        || SCHEMES
            .iter()
            .any(|scheme| url.contains(&format!(",{scheme}://")));
    if redlock {
        Ok(Arc::new(RedlockConfig::from_url(url)?.build().await?))
    } else {
        Ok(Arc::new(RedisConfig::from_url(url)?.build().await?))
    }
}
