//! anylock backend for Google Cloud Storage: the lock object of Hongli Lai,
//! "A robust distributed locking algorithm based on Google Cloud Storage".
//!
//! Each lock is one empty object, `prefix + name`, created with `ifGenerationMatch=0`
//! (create-if-absent) and metadata naming its owner and TTL. Refresh patches the metadata
//! under `ifGenerationMatch` + `ifMetagenerationMatch`; release deletes under both. The
//! refreshes of many locks that fall due together go as up to 100 such PATCHes in one
//! batch request (`refresh_many`, GCS's `/batch/storage/v1`). The
//! fence token is the object's generation, which GCS raises for every new object of a name.
//! A lapsed lock is detected on the *server's* clock: the object's `updated` plus its TTL
//! against the response's `Date` header. An uncontended cycle is two API calls. A note
//! given at acquire is the metadata key `note` of the create; `list` pages through
//! `objects.list` (one request per 1000 objects under the prefix). A semaphore (permits)
//! keeps one slot object per permit, `prefix + name + TAB + "permit-<i>"` (no lock name
//! has a TAB, so no lock object is ever one), whose generation is the permit's token; an
//! attempt lists the slots, writes one conditionally and lists again to check that no
//! permit of another limit was written meanwhile.
//!
//! See `docs/gcs.md` for the algorithm, costs, auth and limits.
//!
//! # URLs and auth
//! `gs://bucket/prefix[?endpoint=URL&auth=none|google|token|command&credentials=PATH&timeout_ms=N]`.
//! `endpoint` (or `STORAGE_EMULATOR_HOST`) names an emulator, talked to without auth.
//! Otherwise requests go to `https://storage.googleapis.com` authenticated by
//! [`GcsAuth`]: the command in `GCS_TOKEN_COMMAND` if set (renewed), else the token in
//! `GCS_ACCESS_TOKEN` if set, else Google's credential chain
//! through `gcp_auth` (`GOOGLE_APPLICATION_CREDENTIALS`, gcloud application-default
//! credentials, the metadata server, the gcloud CLI; feature `auth`, on by default). A
//! credentials file of `type` `external_account` (workload identity federation, as
//! `google-github-actions/auth` writes it) is handled by this crate: STS exchange, optional
//! service-account impersonation, renewal.
//! `Debug`/`Display` never show a token.
//!
//! # Example
//! ```no_run
//! use std::sync::Arc;
//! use backend_gcs::GcsBackend;
//! use lockcore::Locker;
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), lockcore::Error> {
//! let backend = GcsBackend::from_url("gs://my-locks/app/").await?;
//! let options = backend_gcs::default_options(); // TTL 5 min, refresh every 37 s
//! let locker = Locker::new(Arc::new(backend)).with_options(options);
//! let guard = locker.acquire("nightly-report").await?;
//! println!("fence token {:?}", guard.fence_token());
//! guard.release().await?;
//! # Ok(()) }
//! ```

mod auth;
mod backend;
mod batching;
mod body;
mod client;
mod config;
mod error;
#[cfg(feature = "auth")]
mod external_account;
mod http;
mod object;
mod permit_names;
mod permits;
#[cfg(test)]
mod prop_tests;
mod renew;
mod reply;
mod security;
mod token;
mod token_command;

pub use auth::GcsAuth;
pub use backend::{GcsBackend, default_options, guarantees, validate_options};
pub use config::{
    DEFAULT_ENDPOINT, DEFAULT_MAX_REQUESTS, DEFAULT_TIMEOUT, EMULATOR_ENV, GcsConfig,
    MAX_MAX_REQUESTS, MAX_OBJECT_NAME_LEN, MIN_REFRESH_INTERVAL, TOKEN_COMMAND_ENV, TOKEN_ENV,
};
pub use lockcore;
pub use token::STORAGE_SCOPE;
pub use token_command::PLAIN_TOKEN_LIFE;

/// The URL schemes this crate opens.
pub const SCHEMES: &[&str] = &["gs"];

/// Every reply body this crate reads is bounded: what is bounded, and the most bytes read
/// of it. A reply over its bound is refused before it is read when its `Content-Length`
/// says so, else as soon as it passes the bound (a typed error naming the limit; see
/// `docs/gcs.md`, "Reply limits"). GCS's own error replies are never read.
pub const REPLY_LIMITS: &[(&str, usize)] = &[
    (body::OBJECT.what, body::OBJECT.bytes),
    (body::LIST_PAGE.what, body::LIST_PAGE.bytes),
    (body::BATCH.what, body::BATCH.bytes),
    (body::TOKEN.what, body::TOKEN.bytes),
    (body::COMMAND_OUTPUT.what, body::COMMAND_OUTPUT.bytes),
];

/// Opens the backend `url` names ([`GcsConfig::from_url`], then [`GcsConfig::build`]):
/// connects to the endpoint (TCP, and TLS verified for `https`), sending nothing; the
/// first lock call authenticates and reaches the bucket.
///
/// # Errors
/// As [`GcsConfig::from_url`] and [`GcsBackend::connect`].
pub async fn open(url: &str) -> lockcore::Result<std::sync::Arc<dyn lockcore::LockBackend>> {
    Ok(std::sync::Arc::new(
        GcsConfig::from_url(url)?.build().await?,
    ))
}
