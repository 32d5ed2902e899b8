//! anylock backend for etcd.
//!
//! This crate is a placeholder: the backend lands with its own issue. It depends on
//! [`lockcore`] so the workspace's dependency direction is fixed from the start.

pub use lockcore;
