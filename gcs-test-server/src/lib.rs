//! An in-memory Google Cloud Storage JSON-API server for tests, with GCS's
//! real conditional-write semantics — the part the installable emulators get
//! wrong — plus fault injection, a request log and a shiftable clock.
//!
//! It implements what anylock's GCS backend uses: media and multipart
//! insert, object get (metadata or `alt=media`), metadata PATCH, delete,
//! list (prefix, `maxResults`, `pageToken`), bucket create/get, and batches of
//! those calls (`POST /batch/storage/v1`); the four precondition parameters
//! (`ifGenerationMatch`, `ifGenerationNotMatch`, `ifMetagenerationMatch`,
//! `ifMetagenerationNotMatch`) with GCS's 412 and 404 behaviour; strictly
//! increasing string-typed generations; a `Date` header on every response;
//! optionally, OAuth2 bearer tokens granted by its own token endpoint, with
//! workload identity federation's STS exchange and service-account
//! impersonation, and a token lifetime tests can shorten.
//! See `docs/gcs-test-server.md` for what it leaves out and how it differs
//! from fake-gcs-server.
//!
//! ```no_run
//! # async fn demo() {
//! use gcs_test_server::{Fault, GcsTestServer};
//! let server = GcsTestServer::start().await;
//! server.create_bucket("locks");
//! // point the client at server.url(), e.g. as STORAGE_EMULATOR_HOST
//! server.inject(Fault::gcs_rate_limit());
//! let calls = server.requests().len();
//! # let _ = calls;
//! # }
//! ```

mod admin;
mod api;
mod auth;
mod batch;
mod body;
mod call;
mod error;
mod fault;
mod federation;
mod handler;
mod multipart;
mod object;
mod precondition;
mod query;
mod server;
mod shared;
mod store;
mod wire;

pub use batch::MAX_BATCH_CALLS;
pub use fault::{ClockOffset, Fault, GCS_MUTATION_INTERVAL};
pub use server::GcsTestServer;
pub use shared::RequestRecord;
