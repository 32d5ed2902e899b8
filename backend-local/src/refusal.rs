//! [`StoreRefused`]: why `local:` would not open a store, as a value callers can match on
//! (it is the source of the `lockcore::Error` that `connect` returns).

use std::fmt;
use std::path::{Path, PathBuf};

/// What is wrong with a path of a store.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Refusal {
    /// The directory is on a network or shared filesystem (its name), and the store was
    /// not opened with `?shared_fs=allow`.
    SharedFilesystem {
        /// The filesystem, as `statfs` identified it.
        filesystem: String,
    },
    /// `?shared_fs=allow` on a system where the backend has no boot id to tell the
    /// sharing machines apart (anything but Linux).
    SharedFilesystemUnsupported,
}

/// The typed error behind every refusal to open a store: the path and what is wrong with
/// it. Its `Display` says what to do instead.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoreRefused {
    path: PathBuf,
    refusal: Refusal,
}

impl StoreRefused {
    pub(crate) fn new(path: impl Into<PathBuf>, refusal: Refusal) -> Self {
        Self {
            path: path.into(),
            refusal,
        }
    }

    /// The path refused.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// What is wrong with it.
    pub fn refusal(&self) -> &Refusal {
        &self.refusal
    }

    /// As a lockcore error: `Config` (permanent), with this as its source.
    pub(crate) fn into_error(self) -> lockcore::Error {
        let kind = match self.refusal {
            Refusal::SharedFilesystem { .. } | Refusal::SharedFilesystemUnsupported => {
                lockcore::ErrorKind::Config
            }
        };
        lockcore::Error::new(kind, self.to_string()).with_source(self)
    }
}

impl fmt::Display for StoreRefused {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let path = self.path.display();
        write!(f, "refusing the local: store at {path}: ")?;
        match &self.refusal {
            Refusal::SharedFilesystem { filesystem } => write!(
                f,
                "it is on {filesystem}, a network or shared filesystem, where SQLite's locks \
                 and anylock's liveness checks may not hold between machines; move the \
                 store to a local disk, or add ?shared_fs=allow to the URL after reading \
                 \"Shared filesystems\" in docs/local.md"
            ),
            Refusal::SharedFilesystemUnsupported => f.write_str(
                "shared_fs=allow needs Linux (a boot id tells the sharing machines apart); \
                 move the store to a local disk, or use a server backend",
            ),
        }
    }
}

impl std::error::Error for StoreRefused {}
