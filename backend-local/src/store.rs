//! Getting a store ready before SQLite opens it: its directories and database file made
//! with private modes, its filesystem checked, every path of it judged by the permission
//! rules (`trust.rs`).

use std::ffi::OsString;
use std::path::{Path, PathBuf};

use lockcore::{Error, ErrorKind};

use crate::config::LocalConfig;
use crate::host::Host;
use crate::liveness::HolderDir;
use crate::refusal::{Refusal, StoreRefused};
use crate::trust::{Role, Trust};

/// The files SQLite keeps beside a database.
const SIDECARS: [&str; 3] = ["-wal", "-shm", "-journal"];

/// Makes the store's directories and database file if needed and checks all of it;
/// returns the database path SQLite is to open (its directory resolved, so that it holds
/// no symbolic link) and the store's holders directory.
///
/// # Errors
/// `Config` when a directory or the file cannot be made or read, or its filesystem cannot
/// be told; a [`StoreRefused`] source (`Config` or `PermissionDenied`) when the store is on
/// a network or shared filesystem without `shared_fs=allow`, or one of its paths breaks
/// the permission rules.
pub(crate) fn prepare(
    config: &LocalConfig,
    host: &dyn Host,
) -> Result<(PathBuf, HolderDir), Error> {
    let path = config.path();
    let trust = Trust::new(path, config.shared_group())?;
    let Some(file) = path.file_name() else {
        return Err(Error::new(
            ErrorKind::Config,
            format!("the local: store {} names no file", path.display()),
        ));
    };
    let dir = path.parent().filter(|d| !d.as_os_str().is_empty());
    let dir = dir.unwrap_or(Path::new("."));
    trust
        .make_dirs(dir)
        .map_err(|e| crate::refusal::cannot("create", dir, e))?;
    let dir = std::fs::canonicalize(dir).map_err(|e| crate::refusal::cannot("resolve", dir, e))?;
    check_filesystem(&dir, config, host)?;
    trust.check_directories(&dir)?;
    let db = dir.join(file);
    trust.make_database(&db)?;
    for suffix in SIDECARS {
        trust.check(&with_suffix(&db, suffix), Role::Database)?;
    }
    let holders = HolderDir::for_database(&db, trust);
    holders.trust().make_holders(holders.path())?;
    Ok((db, holders))
}

/// `path` with `suffix` appended to its last component.
fn with_suffix(path: &Path, suffix: &str) -> PathBuf {
    let mut name = OsString::from(path.as_os_str());
    name.push(suffix);
    name.into()
}

/// Refuses a directory on a network or shared filesystem unless the config accepts one.
fn check_filesystem(dir: &Path, config: &LocalConfig, host: &dyn Host) -> Result<(), Error> {
    let filesystem = host
        .filesystem(dir)
        .map_err(|e| crate::refusal::cannot("tell the filesystem of", dir, e))?;
    let Some(filesystem) = filesystem.shared_name() else {
        return Ok(());
    };
    if !config.shared_filesystem() {
        let refused = StoreRefused::new(dir, Refusal::SharedFilesystem { filesystem });
        return Err(refused.into_error());
    }
    if !cfg!(target_os = "linux") {
        let refused = StoreRefused::new(dir, Refusal::SharedFilesystemUnsupported);
        return Err(refused.into_error());
    }
    tracing::info!(dir = %dir.display(), %filesystem,
        "local: store on a shared filesystem (shared_fs=allow): rollback journal, every commit synced");
    Ok(())
}

/// "cannot `what` `path`", a `Config` error with the cause.
#[cfg(test)]
#[path = "store_tests.rs"]
mod tests;
