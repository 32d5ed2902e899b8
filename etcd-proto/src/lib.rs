//! etcd's v3 gRPC API as Rust: the prost messages and tonic clients that
//! `backend-etcd` (and the benchmark's etcd baselines) speak to etcd with.
//!
//! The modules are generated from etcd's own API definitions (`proto/`, taken from the
//! etcd-client crate's copy of etcd's repository) by `cargo run -p xtask -- gen-etcd-proto`,
//! which uses protox, a protobuf compiler written in Rust. The generated files are checked
//! in (`src/generated/`), so building this crate needs neither `protoc` nor a build script;
//! the xtask's test `checked_in_etcd_proto_code_is_fresh` fails when they are stale.
//!
//! Client side only: no server traits, no `connect` helpers; bring a
//! `tonic::transport::Channel` (or any `GrpcService`).

#![allow(missing_docs, unreachable_pub, missing_debug_implementations)]
#![allow(clippy::all, clippy::pedantic, rustdoc::all)]

/// etcd's v3 RPCs: `KV`, `Watch`, `Lease`, `Cluster`, `Maintenance` and `Auth`.
pub mod etcdserverpb {
    include!("generated/etcdserverpb.rs");
}

/// etcd's storage types: `KeyValue` and watch `Event`.
pub mod mvccpb {
    include!("generated/mvccpb.rs");
}

/// etcd's authentication types: `User`, `Role`, `Permission`.
pub mod authpb {
    include!("generated/authpb.rs");
}

/// etcd's lock service (`v3lockpb.Lock`), served by etcd itself (`etcdctl lock` uses the
/// client-side recipe instead).
pub mod v3lockpb {
    include!("generated/v3lockpb.rs");
}
