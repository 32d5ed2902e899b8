//! The whole conformance suite against real PostgreSQL.
//!
//! The suite runs on a private server started by this test process (see
//! `common/server.rs`), not on the shared one from `scripts/servers`: `durability_claim`
//! restarts the server, and the shared server must never be restarted under other
//! engineers' tests. Every harness holds a read guard, a restart takes the write guard,
//! so no case runs while the server is down. Each harness uses a fresh schema.

mod common;

conformance::suite!(match common::PgHarness::new().await {
    Some(harness) => harness,
    None => return,
});
