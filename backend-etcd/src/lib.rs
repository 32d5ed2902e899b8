//! anylock backend for etcd: a session lease per TTL shared by the locks one backend
//! holds (Go's `concurrency.Session` model), the lock key created in a transaction only
//! when the lock is free, the key's create revision as the fence token, FIFO waiting in a
//! queue of keys shared with etcd's own lock, and a watch that wakes waiters when a key
//! is deleted.
//!
//! # Key layout (shared with `etcdctl lock` and Go's `concurrency.Mutex`)
//! A lock named `N` under the key prefix `P` (from the URL path) is the set of keys
//! `P + N + "/" + <lease id in hex>`, each bound to its holder's lease; the key with the
//! lowest create revision owns the lock. In `N`, `%` and `/` are written `%25` and `%2F`
//! so that the keys of `a/b` never fall inside the range of `a`. So with
//! `etcd://h:2379/locks`, anylock's lock `deploy` and `etcdctl lock locks/deploy` exclude
//! each other (with no prefix, plain `etcdctl lock deploy` does). A same-owner retake on
//! the same session names its new key `<lease hex>-<old key's create revision>`: Go
//! orders keys by create revision and never parses the name.
//!
//! # Session leases
//! The locks a backend (and its clones) takes with one TTL (in whole seconds) share one
//! etcd lease, granted by the first acquire that needs it and kept alive by the guards'
//! refreshes (one keep-alive per session per batch); an acquire renews it first once an
//! eighth of its TTL has passed since the last confirmed keep-alive, and never reports
//! more time than the session has left. So a lock cycle is two Raft writes (put, delete),
//! and a lost session (expired, revoked) loses every lock on it. A crashed process's locks
//! go when its sessions expire. `detach`/`leave_for` move a key to a lease of its own, so
//! a left lock ends by its own TTL. See `session.rs`.
//!
//! # Operations and their RPCs
//! - acquire: one `Txn` on the session lease (create our key if the lock has no key, else
//!   read the owner); `LeaseGrant` first when the session is new, a keep-alive when it is
//!   old. When held: + `LeaseTimeToLive` of the holder. A key is only ever created when it
//!   owns the lock, so a failed attempt leaves nothing behind.
//! - refresh: a keep-alive of the lease on the backend's shared `LeaseKeepAlive` streams
//!   and a keys-only `Range` of our key in a `Txn`, concurrently: a key deleted by an
//!   operator (or released) turns the guard Lost even while the session lives.
//!   `refresh_many` does the same for up to 512 leases in one round trip: one keep-alive
//!   per distinct etcd lease on the streams, and one `Txn` of Ranges per 128 keys.
//! - release: one `Txn` that deletes our key if it still has its create revision (the
//!   session lives on); a lock on a lease of its own (a queued waiter's grant, a detached
//!   lock): `LeaseRevoke`.
//! - detach (`leave_for`, `detach`): `LeaseGrant` + a `Txn` that rebinds our key to the
//!   new lease (same value, same create revision, so the same token).
//! - waiting (FIFO, lockcore's `enqueue`): a waiting acquire that found the lock held
//!   puts its own key on a lease of its own (`LeaseGrant` + `Txn`), kept alive every
//!   TTL/3 while it waits. Its create revision is its place in the one queue that etcdctl
//!   and Go waiters also join. Its later attempts are one `Txn` that turns the key into
//!   the grant once no older key exists (token = its create revision), plus a keep-alive.
//!   Giving up (timeout, error, cancellation) revokes the queue lease. Woken by a `Watch`
//!   for delete events under `P + N + "/"`.
//! - break (operator): delete the owner key, as `etcdctl del` would.
//! - list (operator): keys-only `Range`s over `P + escape(prefix)`, 500 keys a page;
//!   per lock the key with the lowest create revision is the holder; per holder a `Range`
//!   for its value and a `LeaseTimeToLive`, concurrently.
//!
//! A note given at acquire is an optional `note` field of the key's JSON value, written
//! by the same `Txn` that makes the grant.
//!
//! # Semaphores
//! A permit of the semaphore `N` with `L` permits is a *slot key*
//! `P + "%sem/" + escape(N) + "/" + L + "/" + i` (`i < L`) on the session lease, apart
//! from the lock `N`'s keys (no key of any lock, `etcdctl lock`'s included, falls under
//! `P + "%sem/"`; see `slots.rs`). An attempt is one `Range` over the semaphore's keys and
//! one `Txn`: retake our own slot in place if unchanged, or take the first free one of
//! those the Range saw, only while no slot of another limit exists (`limit_conflict`
//! otherwise). The fence token is the slot's mod revision; refresh, release and detach
//! pin it. `subscribe(N)` watches both the lock's and the semaphore's keys.
//!
//! See `docs/etcd.md` for guarantees, how FIFO waiting works and its caveats, and
//! measurements.
//!
//! ```no_run
//! use std::sync::Arc;
//! use backend_etcd::EtcdBackend;
//! use lockcore::Locker;
//! # async fn demo() -> Result<(), lockcore::Error> {
//! let backend = EtcdBackend::from_url("etcd://10.0.0.1:2379,10.0.0.2:2379/locks").await?;
//! let guard = Locker::new(Arc::new(backend)).acquire("nightly-report").await?;
//! println!("fence token {:?}", guard.fence_token());
//! guard.release().await?;
//! # Ok(()) }
//! ```

mod backend;
mod client;
mod config;
mod error;
#[cfg(test)]
mod error_tests;
mod grpc;
mod keepalive;
mod keys;
#[cfg(test)]
mod prop_tests;
mod queue;
#[cfg(test)]
mod queue_tests;
mod requests;
mod secure;
mod session;
#[cfg(test)]
mod slot_race_tests;
mod slots;
mod stragglers;

pub use backend::{EtcdBackend, guarantees};
pub use config::{DEFAULT_PORT, EtcdConfig, URL_ENV};
pub use lockcore;

/// The URL schemes this crate opens (`etcds` is TLS).
pub const SCHEMES: &[&str] = &[config::SCHEME, config::TLS_SCHEME];

/// Every reply this crate reads is bounded: what is bounded, and the most bytes decoded of
/// it (a larger gRPC message fails the call with a typed error).
pub const REPLY_LIMITS: &[(&str, usize)] = &[
    (
        "one KV reply (a grant, a range, a listing page)",
        grpc::MAX_KV_REPLY,
    ),
    ("one lease, watch or auth reply", grpc::MAX_TONIC_REPLY),
];

/// Opens the backend `url` names: parses it ([`EtcdConfig::from_url`]) and connects to
/// every member ([`EtcdConfig::build`]).
///
/// # Errors
/// As [`EtcdBackend::from_url`].
pub async fn open(url: &str) -> lockcore::Result<std::sync::Arc<dyn lockcore::LockBackend>> {
    Ok(std::sync::Arc::new(
        EtcdConfig::from_url(url)?.build().await?,
    ))
}
