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
    /// A symbolic link where the store keeps a file or directory: never followed.
    Symlink,
    /// Not a directory where one belongs, or not a regular file where one belongs.
    WrongType {
        /// Whether a directory belongs there.
        directory: bool,
    },
    /// Owned by another user, who could then take or break this user's locks.
    OwnedByOther {
        /// The owner.
        uid: u32,
        /// The owner's name, when it has one.
        name: Option<String>,
        /// This process's effective uid.
        you: u32,
    },
    /// Writable by users other than the store's (its mode, with the file type bits off).
    WritableByOthers {
        /// The permission bits.
        mode: u32,
    },
    /// A group store's path that does not belong to its group.
    WrongGroup {
        /// The path's group.
        gid: u32,
        /// The store's group.
        group: String,
    },
    /// A group store's directory without the setgid bit, so that what members create in
    /// it would not belong to the group.
    NotSetgid,
    /// `?shared_group=` names no group.
    NoSuchGroup {
        /// The name given.
        group: String,
    },
    /// `?shared_group=` names a group this user is not a member of.
    NotAMember {
        /// The name given.
        group: String,
    },
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

    /// As a lockcore error (permanent), with this as its source: `Config` for a store on
    /// a shared filesystem or a group that cannot be used, `PermissionDenied` for a path
    /// that others could change.
    pub(crate) fn into_error(self) -> lockcore::Error {
        let kind = match self.refusal {
            Refusal::SharedFilesystem { .. }
            | Refusal::SharedFilesystemUnsupported
            | Refusal::NoSuchGroup { .. }
            | Refusal::NotAMember { .. } => lockcore::ErrorKind::Config,
            _ => lockcore::ErrorKind::PermissionDenied,
        };
        lockcore::Error::new(kind, self.to_string()).with_source(self)
    }
}

impl fmt::Display for StoreRefused {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let path = self.path.display();
        write!(f, "refusing the local: store at {path}: {}", self.refusal)
    }
}

/// What is wrong, and what to do instead.
impl fmt::Display for Refusal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::SharedFilesystem { filesystem } => write!(
                f,
                "it is on {filesystem}, a network or shared filesystem, where SQLite's locks \
                 and anylock's liveness checks may not hold between machines; move the \
                 store to a local disk, or add ?shared_fs=allow to the URL after reading \
                 \"Shared filesystems\" in docs/local.md"
            ),
            Self::SharedFilesystemUnsupported => f.write_str(
                "shared_fs=allow needs Linux (a boot id tells the sharing machines apart); \
                 move the store to a local disk, or use a server backend",
            ),
            Self::NoSuchGroup { group } => write!(
                f,
                "shared_group={group} names no group on this machine; create it (groupadd \
                 {group}) or name an existing one"
            ),
            Self::NotAMember { group } => write!(
                f,
                "you are not a member of the group {group} named by shared_group; ask an \
                 administrator to add you (usermod -aG {group} USER, then log in again), \
                 or use a store of your own"
            ),
            _ => self.fmt_permission(f),
        }
    }
}

impl Refusal {
    /// [`Display`](fmt::Display) of the refusals of a path other users could change.
    fn fmt_permission(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Symlink => f.write_str(
                "it is a symbolic link, which local: never follows (whoever controls the \
                 target could take or break your locks); name the real path, or remove the \
                 link",
            ),
            Self::WrongType { directory: true } => {
                f.write_str("it is not a directory; remove it, or name another store")
            }
            Self::WrongType { directory: false } => {
                f.write_str("it is not a regular file; remove it, or name another store")
            }
            Self::OwnedByOther { uid, name, you } => {
                let owner = name
                    .as_deref()
                    .map_or_else(String::new, |n| format!(" ({n})"));
                write!(
                    f,
                    "it is owned by uid {uid}{owner}, not by you (uid {you}), and its owner \
                     could take or break your locks; remove it if nobody needs it, or use \
                     a store of your own (local: alone is ~/.local/state/anylock/\
                     locks.sqlite3); for a store shared by a group, add \
                     ?shared_group=GROUP (docs/local.md)"
                )
            }
            // A sticky directory (/tmp) is shared on purpose: never advise changing it.
            Self::WritableByOthers { mode } if mode & 0o1000 != 0 => write!(
                f,
                "its mode {mode:04o} lets other users create files in it (a shared \
                 directory such as /tmp), and they could take or break your locks; use a \
                 directory only you can write (local: alone is \
                 ~/.local/state/anylock/locks.sqlite3); for a store shared by a group, \
                 add ?shared_group=GROUP (docs/local.md)"
            ),
            Self::WritableByOthers { mode } => write!(
                f,
                "its mode {mode:04o} lets other users write it, and they could take or \
                 break your locks; run chmod go-w on it, or use a directory only you can \
                 write (local: alone is ~/.local/state/anylock/locks.sqlite3); for a store \
                 shared by a group, add ?shared_group=GROUP (docs/local.md)"
            ),
            Self::WrongGroup { gid, group } => write!(
                f,
                "it belongs to gid {gid}, not to the store's group {group}; run chgrp \
                 {group} on it (and chmod g+s on a directory)"
            ),
            Self::NotSetgid => f.write_str(
                "this group store's directory lacks the setgid bit, so files members \
                 create in it would not belong to the group; run chmod g+s on it",
            ),
            // The others are written by `fmt`.
            _ => Ok(()),
        }
    }
}

impl std::error::Error for StoreRefused {}

/// [`ErrorKind::Config`](lockcore::ErrorKind::Config): the file system refused to `what`
/// `path`.
pub(crate) fn cannot(what: &str, path: &std::path::Path, err: std::io::Error) -> lockcore::Error {
    lockcore::Error::new(
        lockcore::ErrorKind::Config,
        format!("cannot {what} {}", path.display()),
    )
    .with_source(err)
}
