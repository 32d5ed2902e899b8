//! Private server processes for tests that crash, stall, restart or reconfigure a server
//! (the shared servers of `scripts/servers` must never be touched): [`Redis`],
//! [`Postgres`] and an [`Etcd`] cluster.
//!
//! Each runs in a directory of its own on loopback, on a free port unless told one, waits
//! until it answers before it is handed out, and is stopped by PID (never by name): on
//! drop (Redis, etcd), or by a watchdog once the test process exits, however it exits
//! (PostgreSQL, and everything registered with a [`Reaper`]). The plain constructors
//! (`Redis::start()`, `Postgres::start()`, `Etcd::start(…)`) panic with the reason, as
//! tests want; `options()` builds fallible starts with fixed ports, directories and a
//! [`Reaper`], as the reliability harness wants.

mod etcd;
mod postgres;
pub mod process;
mod redis;

pub use etcd::{Etcd, EtcdOptions};
pub use postgres::{Postgres, PostgresOptions, pg_bin};
pub use process::{Reaper, is_root, on_exit};
pub use redis::{Redis, RedisOptions};
