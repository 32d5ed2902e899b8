//! anylock's reliability harness (issue #10): Kleppmann's failure scenarios ("How to do
//! distributed locking"), replayed against every backend, with and without fencing.
//!
//! Three client processes contend for one lock (four for two permits of a semaphore, three
//! for leadership of an election) and do read-modify-write cycles on a
//! [fenced register](register) through it, while a [script] applies one
//! [fault](fault::Fault): a holder paused past its TTL, a blackholed or delayed link, a
//! clock jump, a server that crashes and forgets, a killed leader, 5xx bursts. The
//! [checker] turns the register's history into counts of double grants, stale
//! writes and lost updates, and [`expect`] compares them with each backend's `Guarantees`.
//! `scripts/reliability` runs the full table into `RELIABILITY.md`; `--short` is the CI
//! version. See `docs/reliability.md`.
//!
//! | module | what it holds |
//! |---|---|
//! | [`protocol`], [`history`], [`register`] | the register: wire format, history, fenced state and its TCP server |
//! | [`checker`] | history -> counts (pure, unit tested on histories with each violation) |
//! | [`expect`] | what a `Guarantees` descriptor promises per fault, and disagreements |
//! | [`client`] | one client process |
//! | [`primitive`] | what the clients hold: the lock, one of N permits, leadership (issue #18) |
//! | [`group`], [`script`], [`run`], [`suite`] | clients and proxies, fault scripts, one cell, the plan |
//! | [`servers`] | private Redis, PostgreSQL, etcd and GCS servers, stopped by PID |
//! | [`slow_attempt`], [`stall`] | the `slow-attempt` fault and its request-holding relay |
//! | [`report`] | `RELIABILITY.md` |

pub mod backends;
pub mod checker;
pub mod client;
pub mod expect;
pub mod fault;
pub mod group;
pub mod history;
pub mod primitive;
pub mod protocol;
pub mod register;
pub mod report;
pub mod run;
pub mod script;
pub mod servers;
pub mod slow_attempt;
pub mod stall;
pub mod suite;
