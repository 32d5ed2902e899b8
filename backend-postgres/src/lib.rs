//! anylock's PostgreSQL backend: a lease table whose expiry is decided by the database
//! clock, fence tokens that never go back, `LISTEN`/`NOTIFY` wake-ups, and fenced writes
//! that commit only while the lease is still held.
//!
//! ```no_run
//! use std::{sync::Arc, time::Duration};
//! use backend_postgres::{PostgresBackend, PostgresConfig};
//! use lockcore::{LockOptions, Locker};
//! # #[tokio::main] async fn main() -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
//! let config = PostgresConfig::from_url("postgres://app@db.internal/app?sslmode=verify-full")?;
//! let backend = PostgresBackend::connect(config).await?;
//! let locker = Locker::new(Arc::new(backend.clone()))
//!     .with_options(LockOptions::new(Duration::from_secs(30)));
//!
//! let guard = locker.acquire("nightly-report").await?;
//! // The write commits only if the lease still holds this grant at that point.
//! let mut tx = backend.begin_fenced(&guard.lease()).await?;
//! sqlx::query("INSERT INTO reports (day, fence) VALUES (current_date, $1)")
//!     .bind(tx.token().get() as i64)
//!     .execute(&mut *tx)
//!     .await?;
//! tx.commit().await?;
//! guard.release().await?;
//! # Ok(()) }
//! ```
//!
//! # Crate map
//! - [`PostgresConfig`]: URL, TLS mode, schema and table, pool size, timeouts.
//! - [`PostgresBackend`]: the [`LockBackend`](lockcore::LockBackend) implementation.
//! - [`FencedTx`]: a transaction fenced by a lease ([`PostgresBackend::begin_fenced`]).
//! - Semaphore permits ([`LockBackend::acquire_permit`](lockcore::LockBackend::acquire_permit)):
//!   a table and token sequence of their own next to the lock table.
//!
//! `docs/postgres.md` in the repository has the table layout, every statement, the
//! guarantees and what PgBouncer users must configure.

mod backend;
mod client;
mod config;
mod conns;
mod denied;
mod error;
pub mod fenced;
mod from_url;
mod holder;
mod limits;
mod names;
mod notify;
mod permit_sql;
mod permits;
#[cfg(test)]
mod prop_tests;
mod refresh;
mod sql;
mod tls;
mod url;

pub use backend::{PostgresBackend, guarantees};
pub use config::{
    DEFAULT_POOL_SIZE, DEFAULT_SCHEMA, DEFAULT_TABLE, DEFAULT_TIMEOUT, PostgresConfig,
};
pub use error::error_from_sqlx;
pub use fenced::FencedTx;
pub use limits::MAX_STATEMENT_TIMEOUT;
pub use names::{DEFAULT_APPLICATION_NAME, MAX_IDENTIFIER_LEN, MAX_TABLE_LEN};
pub use notify::KEEPALIVE;
pub use {lockcore, sqlx};

/// What the backend bounds in a server's replies, each with the most bytes it may take,
/// for `anylock check` and docs/postgres.md ("Reply limits").
///
/// Both hold before the server is verified, whenever the connection asks for TLS: the
/// server's answer to the `SSLRequest` is one byte (sqlx reads no more), and rustls
/// refuses a TLS handshake message over 64 KiB (its `MAX_HANDSHAKE_SIZE`). Under
/// `verify-full` and `verify-ca` (`verify-full` is the default over TCP), nothing else
/// is read from a server whose certificate did not verify, so an impostor can make the
/// client hold little more than this.
///
/// Nothing else is bounded: sqlx 0.9 reads each PostgreSQL message whole, whatever
/// length its header claims (up to 4 GiB), before the backend sees it, and offers no
/// hook to stop it. A verified server, and any server under an explicit `disable`,
/// `require` or `prefer`, can make the client buffer what it
/// sends (twice over in plaintext); inside TLS sqlx zero-fills the buffer a header
/// announces, so a header alone costs 4 GiB (measured in docs/postgres.md).
pub const REPLY_LIMITS: &[(&str, usize)] = &[
    ("server's answer to the SSLRequest", 1),
    (
        "one TLS handshake message before the server is verified (rustls)",
        65_535,
    ),
];

/// The URL schemes this crate opens.
pub const SCHEMES: &[&str] = &["postgres", "postgresql"];

/// Opens the backend `url` names: parses it ([`PostgresConfig::from_url`]) and connects
/// ([`PostgresConfig::build`]).
///
/// # Errors
/// As [`PostgresConfig::from_url`] and [`PostgresBackend::connect`].
pub async fn open(url: &str) -> lockcore::Result<std::sync::Arc<dyn lockcore::LockBackend>> {
    Ok(std::sync::Arc::new(
        PostgresConfig::from_url(url)?.build().await?,
    ))
}
