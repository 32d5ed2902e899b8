//! The anylock conformance suite (work in progress).

pub mod proxy;
