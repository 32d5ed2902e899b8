//! Getting a store ready before SQLite opens it: its directory made, its filesystem
//! checked.

use std::path::{Path, PathBuf};

use lockcore::{Error, ErrorKind};

use crate::config::LocalConfig;
use crate::host::Host;
use crate::refusal::{Refusal, StoreRefused};

/// Makes the store's directory if needed and checks where it is; returns the database
/// path SQLite is to open.
///
/// # Errors
/// `Config` when the directory cannot be made or its filesystem cannot be told, and
/// [`StoreRefused`] (as the source) when the store is on a network or shared filesystem
/// and `shared_fs=allow` was not given.
pub(crate) fn prepare(config: &LocalConfig, host: &dyn Host) -> Result<PathBuf, Error> {
    let path = config.path();
    let dir = match path.parent().filter(|d| !d.as_os_str().is_empty()) {
        Some(dir) => {
            std::fs::create_dir_all(dir).map_err(|e| cannot("create", dir, e))?;
            dir
        }
        None => Path::new("."),
    };
    check_filesystem(dir, config, host)?;
    Ok(path.to_owned())
}

/// Refuses a directory on a network or shared filesystem unless the config accepts one.
fn check_filesystem(dir: &Path, config: &LocalConfig, host: &dyn Host) -> Result<(), Error> {
    let filesystem = host
        .filesystem(dir)
        .map_err(|e| cannot("tell the filesystem of", dir, e))?;
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
pub(crate) fn cannot(what: &str, path: &Path, err: std::io::Error) -> Error {
    Error::new(
        ErrorKind::Config,
        format!("cannot {what} {}", path.display()),
    )
    .with_source(err)
}

#[cfg(test)]
#[path = "store_tests.rs"]
mod tests;
