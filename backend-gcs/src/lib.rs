//! anylock backend for Google Cloud Storage: seed 000's lock object.
//!
//! Each lock is one empty object, `prefix + name`, created with `ifGenerationMatch=0`
//! (create-if-absent) and metadata naming its owner and TTL. Refresh patches the metadata
//! under `ifGenerationMatch` + `ifMetagenerationMatch`; release deletes under both. The
//! fence token is the object's generation, which GCS raises for every new object of a name.
//! A lapsed lock is detected on the *server's* clock: the object's `updated` plus its TTL
//! against the response's `Date` header. An uncontended cycle is two API calls.
//!
//! See `docs/gcs.md` for the algorithm, costs, auth and limits.
//!
//! # URLs
//! `gs://bucket/prefix[?endpoint=http://host:port&timeout_ms=N]`. Without `endpoint`,
//! `STORAGE_EMULATOR_HOST` (if set) names an emulator, talked to without auth; otherwise
//! requests go to `https://storage.googleapis.com` with the bearer token in
//! `GCS_ACCESS_TOKEN` (if set). `Debug`/`Display` never show the token.
//!
//! # Example
//! ```no_run
//! use std::sync::Arc;
//! use backend_gcs::GcsBackend;
//! use lockcore::Locker;
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), lockcore::Error> {
//! let backend = GcsBackend::from_url("gs://my-locks/app/")?;
//! let options = backend_gcs::default_options();
//! backend_gcs::validate_options(&options)?;
//! let locker = Locker::new(Arc::new(backend)).with_options(options);
//! let guard = locker.acquire("nightly-report").await?;
//! println!("fence token {:?}", guard.fence_token());
//! guard.release().await?;
//! # Ok(()) }
//! ```

mod backend;
mod client;
mod config;
mod object;

pub use backend::{
    GcsBackend, MIN_REFRESH_INTERVAL, default_options, guarantees, validate_options,
};
pub use config::{
    DEFAULT_ENDPOINT, DEFAULT_TIMEOUT, EMULATOR_ENV, GcsConfig, MAX_OBJECT_NAME_LEN, TOKEN_ENV,
};
pub use lockcore;

/// The URL scheme of this backend.
pub const SCHEMES: &[&str] = &["gs"];
