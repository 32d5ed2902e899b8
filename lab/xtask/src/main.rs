//! anylock's development tasks, run with `cargo run -p xtask -- <task>`.
//!
//! - `gen-etcd-proto`: compiles etcd's API definitions (`etcd-proto/proto`) with protox,
//!   a protobuf compiler written in Rust (no `protoc`), and writes the prost messages and
//!   tonic clients to `etcd-proto/src/generated`. The generated files are checked in, so
//!   building anylock never compiles a `.proto` file; a test here fails when they are stale.
//! - `structure`: lists the files under a member's `src/` over 500 lines and the import
//!   circles between the files of one crate; exits 1 when it finds any (see [`structure`]).

mod structure;

use std::error::Error;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

/// The files to compile, relative to `etcd-proto/proto`; their imports are found there too.
const PROTO_FILES: &[&str] = &[
    "etcd/api/etcdserverpb/rpc.proto",
    "etcd/server/etcdserver/api/v3lock/v3lockpb/v3lock.proto",
];

/// The protobuf packages to generate Rust for. The others in the compiled set
/// (`google.api`, the OpenAPI options, `versionpb`, `google.protobuf`) only annotate
/// etcd's definitions with options that the generated code does not use.
const PACKAGES: &[&str] = &["etcdserverpb", "mvccpb", "authpb", "v3lockpb"];

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let result = match args
        .iter()
        .map(String::as_str)
        .collect::<Vec<_>>()
        .as_slice()
    {
        ["gen-etcd-proto"] => gen_etcd_proto(&generated_dir()),
        ["structure"] => {
            return match structure::run(&workspace_root()) {
                Ok(true) => ExitCode::SUCCESS,
                Ok(false) => ExitCode::FAILURE,
                Err(err) => {
                    eprintln!("xtask: {err}");
                    ExitCode::from(2)
                }
            };
        }
        _ => {
            eprintln!("usage: cargo run -p xtask -- gen-etcd-proto | structure");
            return ExitCode::from(2);
        }
    };
    match result {
        Ok(()) => {
            println!("wrote {}", generated_dir().display());
            ExitCode::SUCCESS
        }
        Err(err) => {
            eprintln!("xtask: {err}");
            ExitCode::FAILURE
        }
    }
}

/// The workspace root (two levels above this crate's directory, `lab/xtask`).
fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .ancestors()
        .nth(2)
        .expect("xtask lives in lab/ of the workspace")
        .to_path_buf()
}

/// Where the checked-in generated code lives.
fn generated_dir() -> PathBuf {
    workspace_root().join("etcd-proto/src/generated")
}

/// Compiles etcd's `.proto` files with protox and writes one Rust file per package in
/// [`PACKAGES`] into `out_dir` (client side only: messages and tonic clients).
///
/// # Errors
/// A `.proto` file that does not parse or resolve, or a file that cannot be written.
fn gen_etcd_proto(out_dir: &Path) -> Result<(), Box<dyn Error>> {
    let proto_root = workspace_root().join("etcd-proto/proto");
    let mut fds = protox::compile(PROTO_FILES, [&proto_root])?;
    fds.file
        .retain(|file| PACKAGES.contains(&file.package.as_deref().unwrap_or_default()));
    std::fs::create_dir_all(out_dir)?;
    tonic_prost_build::configure()
        .build_server(false)
        .build_client(true)
        .build_transport(false)
        .out_dir(out_dir)
        .compile_fds(fds)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The checked-in code is what the `.proto` files and the generator make today: a
    /// changed `.proto` file, a generator upgrade or a hand edit shows here, not in a
    /// review. Runs without `protoc`.
    #[test]
    fn checked_in_etcd_proto_code_is_fresh() {
        let fresh = std::env::temp_dir().join(format!(
            "anylock-etcd-proto-{}-{:?}",
            std::process::id(),
            std::time::SystemTime::now()
        ));
        gen_etcd_proto(&fresh).expect("generate");
        let stale = compare(&fresh, &generated_dir());
        let _ = std::fs::remove_dir_all(&fresh);
        assert!(
            stale.is_empty(),
            "etcd-proto/src/generated is stale ({}): run `cargo run -p xtask -- gen-etcd-proto` \
             and commit the result",
            stale.join(", ")
        );
    }

    /// The names of the files that differ between the two directories or exist in one only.
    fn compare(fresh: &Path, checked_in: &Path) -> Vec<String> {
        let names = |dir: &Path| -> Vec<String> {
            let mut names: Vec<String> = std::fs::read_dir(dir)
                .map(|entries| {
                    entries
                        .filter_map(|e| e.ok()?.file_name().into_string().ok())
                        .collect()
                })
                .unwrap_or_default();
            names.sort();
            names
        };
        let mut all = names(fresh);
        all.extend(names(checked_in));
        all.sort();
        all.dedup();
        all.into_iter()
            .filter(|name| {
                let read = |dir: &Path| std::fs::read(dir.join(name)).ok();
                read(fresh).is_none() || read(fresh) != read(checked_in)
            })
            .collect()
    }
}
