//! Test plumbing shared by anylock's crates, kept apart from the conformance suite so that
//! the bench, the reliability harness and every crate's tests can use it without the suite:
//!
//! * [`mod@env`]: finding the shared servers started by `scripts/servers` (skip locally, fail
//!   in CI);
//! * [`proxy`]: a TCP fault-injection proxy for network faults on loopback;
//! * [`prop`]: the proptest strategies of every crate's parser property tests;
//! * [`servers`]: private Redis, PostgreSQL and etcd processes a test may crash, stall or
//!   restart;
//! * [`suspend`]: a process whose monotonic clock skips the time it was stopped, as after a
//!   machine suspend.

pub mod env;
pub mod prop;
pub mod proxy;
pub mod servers;
pub mod suspend;
