//! Whom a store's files may belong to: every permission rule of `local:`, in one place.
//!
//! Anyone who can write a store's database can grant, list and break its locks; anyone who
//! can write its holders directory can swap a holder's liveness file for an unlocked one,
//! and the next contender then takes the lock from a live holder. So a store is used only
//! when nobody but its users can write any of it:
//!
//! - **Private** (the default): the database, the files SQLite keeps beside it (`-wal`,
//!   `-shm`, `-journal`), the holders directory and each liveness file are this user's and
//!   writable by nobody else; the directory holding the database is this user's or root's
//!   and writable by nobody else (not even with the sticky bit, as in `/tmp`: another user
//!   could create a `-wal` there before SQLite does); every directory above it is this
//!   user's or root's and writable by nobody else unless sticky (so nobody can rename it
//!   away). New directories are made `0700` and files `0600`, whatever the umask.
//! - **Group** (`?shared_group=NAME`, for a store all members of one group use): the same,
//!   except that the store's directory, database, holders directory and liveness files
//!   belong to that group (any member may own them) and may be group-writable, never
//!   world-writable; the two directories carry the setgid bit, so that what any member
//!   creates in them belongs to the group. New directories are `2770`, files `0660`,
//!   liveness files `0640` (members probe each other's). Only a member (or root) may ask.
//!
//! No link is followed inside the store: the store's directory is resolved once
//! (`canonicalize`, which follows links in the path given) and SQLite opens that path,
//! which holds no link; the database, the
//! holders directory and SQLite's files beside the database are refused when they are
//! links (SQLite itself opens them with `O_NOFOLLOW`); liveness files are opened with
//! `O_NOFOLLOW`. The checks read `lstat` before SQLite opens a path: only someone who
//! can write the directory could swap it in between, and these rules leave that to the
//! store's own users and root. Entries already this user's but readable by others (made
//! by an older version) are tightened to the modes above.

use std::fs::{self, DirBuilder, File, Metadata, OpenOptions, Permissions};
use std::io;
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::Path;

use lockcore::Error;
use nix::fcntl::OFlag;

use crate::refusal::{Refusal, StoreRefused};

const STICKY: u32 = 0o1000;
const SETGID: u32 = 0o2000;

/// What a path is to its store: the rule it is judged by.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Role {
    /// A directory above the store's directory.
    Ancestor,
    /// The directory holding the database.
    Directory,
    /// The database, or a file SQLite keeps beside it.
    Database,
    /// The holders directory (`<db>.holders`).
    Holders,
    /// A holder's liveness file.
    Liveness,
}

/// Who a store is for, and who is asking.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Trust {
    /// This process's effective uid.
    me: u32,
    /// The store's group, for a group store.
    group: Option<(String, u32)>,
}

impl Trust {
    /// The rules for a private store (`group` `None`) or the group store of `group`.
    ///
    /// # Errors
    /// `Config` ([`StoreRefused`] as the source) when the group does not exist, or when
    /// this user is not one of its members (root may use any group's store).
    pub(crate) fn new(store: &Path, group: Option<&str>) -> Result<Self, Error> {
        let me = nix::unistd::geteuid().as_raw();
        let Some(name) = group else {
            return Ok(Self { me, group: None });
        };
        let refuse = |refusal| StoreRefused::new(store, refusal).into_error();
        let found = nix::unistd::Group::from_name(name).ok().flatten();
        let gid = found.ok_or_else(|| refuse(Refusal::NoSuchGroup { group: name.into() }))?;
        let gid = gid.gid.as_raw();
        if me != 0 && !is_member(gid) {
            return Err(refuse(Refusal::NotAMember { group: name.into() }));
        }
        Ok(Self {
            me,
            group: Some((name.to_owned(), gid)),
        })
    }

    /// The mode of a directory this makes.
    fn dir_mode(&self) -> u32 {
        if self.group.is_some() { 0o2770 } else { 0o700 }
    }

    /// The mode of the database file this makes.
    fn file_mode(&self) -> u32 {
        if self.group.is_some() { 0o660 } else { 0o600 }
    }

    /// The mode of a liveness file: the group's members probe each other's.
    pub(crate) fn liveness_mode(&self) -> u32 {
        if self.group.is_some() { 0o640 } else { 0o600 }
    }

    /// Whether `meta` (of an `lstat`, or an `fstat` of an open file) is fit for `role`.
    pub(crate) fn judge(&self, meta: &Metadata, role: Role) -> Result<(), Refusal> {
        let kind = meta.file_type();
        let directory = matches!(role, Role::Ancestor | Role::Directory | Role::Holders);
        if kind.is_symlink() {
            return Err(Refusal::Symlink);
        }
        if (directory && !kind.is_dir()) || (!directory && !kind.is_file()) {
            return Err(Refusal::WrongType { directory });
        }
        let (uid, gid, mode) = (meta.uid(), meta.gid(), meta.mode() & 0o7777);
        let ours = |gid| self.group.as_ref().is_some_and(|(_, g)| *g == gid);
        match (role, &self.group) {
            (Role::Ancestor, _) => {
                if uid != self.me && uid != 0 {
                    return Err(self.owned_by(uid));
                }
                let group_ok = ours(gid) || mode & 0o020 == 0;
                if mode & STICKY == 0 && (mode & 0o002 != 0 || !group_ok) {
                    return Err(Refusal::WritableByOthers { mode });
                }
            }
            (Role::Directory, None) if uid != self.me && uid != 0 => {
                return Err(self.owned_by(uid));
            }
            (_, None) if role != Role::Directory && uid != self.me => {
                return Err(self.owned_by(uid));
            }
            (_, None) if mode & 0o022 != 0 => return Err(Refusal::WritableByOthers { mode }),
            (_, None) => {}
            (_, Some((name, _))) if !ours(gid) => {
                return Err(Refusal::WrongGroup {
                    gid,
                    group: name.clone(),
                });
            }
            (_, Some(_)) if mode & 0o002 != 0 => {
                return Err(Refusal::WritableByOthers { mode });
            }
            (Role::Directory | Role::Holders, Some(_)) if mode & SETGID == 0 => {
                return Err(Refusal::NotSetgid);
            }
            (_, Some(_)) => {}
        }
        Ok(())
    }

    fn owned_by(&self, uid: u32) -> Refusal {
        let name = nix::unistd::User::from_uid(uid.into())
            .ok()
            .flatten()
            .map(|user| user.name);
        Refusal::OwnedByOther {
            uid,
            name,
            you: self.me,
        }
    }

    /// Makes `dir` and the directories above it that are missing, with [`Self::dir_mode`]
    /// whatever the umask (and the group's ownership). Existing ones are left as they are
    /// (and judged later); one made by a concurrent opener meanwhile is fine.
    pub(crate) fn make_dirs(&self, dir: &Path) -> io::Result<()> {
        let mut missing = Vec::new();
        for at in dir.ancestors().filter(|a| !a.as_os_str().is_empty()) {
            match fs::symlink_metadata(at) {
                Ok(_) => break,
                Err(err) if err.kind() == io::ErrorKind::NotFound => missing.push(at),
                Err(err) => return Err(err),
            }
        }
        for at in missing.into_iter().rev() {
            self.make_dir(at)?;
        }
        Ok(())
    }

    /// Makes one directory with [`Self::dir_mode`]; `Ok` if it exists already.
    fn make_dir(&self, dir: &Path) -> io::Result<()> {
        match DirBuilder::new().mode(self.dir_mode()).create(dir) {
            Ok(()) => {
                let made = open_nofollow(dir)?;
                if let Some((_, gid)) = &self.group {
                    std::os::unix::fs::fchown(&made, None, Some(*gid))?;
                }
                // After the chown, which may clear the setgid bit; and whatever the umask.
                made.set_permissions(Permissions::from_mode(self.dir_mode()))
            }
            Err(err) if err.kind() == io::ErrorKind::AlreadyExists => Ok(()),
            Err(err) => Err(err),
        }
    }

    /// Judges the store's directory `dir` (resolved: no links) and every one above it.
    pub(crate) fn check_directories(&self, dir: &Path) -> Result<(), Error> {
        for (i, at) in dir.ancestors().enumerate() {
            let role = if i == 0 {
                Role::Directory
            } else {
                Role::Ancestor
            };
            self.check(at, role)?;
        }
        Ok(())
    }

    /// Creates the database file `db` if it is missing (so that SQLite, and the files it
    /// makes beside it with the database's mode, get [`Self::file_mode`]), then judges it.
    pub(crate) fn make_database(&self, db: &Path) -> Result<(), Error> {
        let created = OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .mode(self.file_mode())
            .custom_flags(OFlag::O_NOFOLLOW.bits())
            .open(db);
        match created {
            Ok(file) => {
                if let Some((_, gid)) = &self.group {
                    std::os::unix::fs::fchown(&file, None, Some(*gid))
                        .map_err(|e| crate::refusal::cannot("set the group of", db, e))?;
                }
                file.set_permissions(Permissions::from_mode(self.file_mode()))
                    .map_err(|e| crate::refusal::cannot("set the mode of", db, e))?;
            }
            Err(err) if err.kind() == io::ErrorKind::AlreadyExists => {}
            Err(err) => return Err(crate::refusal::cannot("create", db, err)),
        }
        self.check(db, Role::Database)
    }

    /// Makes the holders directory if it is missing, then judges it.
    pub(crate) fn make_holders(&self, dir: &Path) -> Result<(), Error> {
        self.make_dir(dir)
            .map_err(|e| crate::refusal::cannot("create", dir, e))?;
        self.check(dir, Role::Holders)
    }

    /// Judges `path` in `role` if it exists (`lstat`), and tightens it when it is ours and
    /// readable by more than the rules give it.
    pub(crate) fn check(&self, path: &Path, role: Role) -> Result<(), Error> {
        let meta = match fs::symlink_metadata(path) {
            Ok(meta) => meta,
            Err(err) if err.kind() == io::ErrorKind::NotFound => return Ok(()),
            Err(err) => return Err(crate::refusal::cannot("read", path, err)),
        };
        self.judge(&meta, role)
            .map_err(|refusal| StoreRefused::new(path, refusal).into_error())?;
        self.tighten(path, &meta, role);
        Ok(())
    }

    /// Takes the read bits that the rules do not give from `path` (ours, judged fit),
    /// made readable to everyone by an older version. A failure only warns.
    fn tighten(&self, path: &Path, meta: &Metadata, role: Role) {
        let extra = match self.group {
            None => 0o077,
            Some(_) => 0o007,
        };
        let mode = meta.mode() & 0o7777;
        if !matches!(role, Role::Database | Role::Holders) || meta.uid() != self.me {
            return;
        }
        if mode & extra == 0 {
            return;
        }
        let tightened = open_nofollow(path)
            .and_then(|file| file.set_permissions(Permissions::from_mode(mode & !extra)));
        if let Err(err) = tightened {
            tracing::warn!(path = %path.display(), %err, "could not make a store file private");
        }
    }
}

/// Opens `path` read-only without following a link (or blocking on a FIFO), to read or
/// change what is there.
pub(crate) fn open_nofollow(path: &Path) -> io::Result<File> {
    OpenOptions::new()
        .read(true)
        .custom_flags((OFlag::O_NOFOLLOW | OFlag::O_NONBLOCK).bits())
        .open(path)
}

/// Whether this process is a member of the group `gid`.
#[cfg(not(target_vendor = "apple"))]
fn is_member(gid: u32) -> bool {
    let gid = nix::unistd::Gid::from_raw(gid);
    nix::unistd::getegid() == gid || nix::unistd::getgroups().is_ok_and(|g| g.contains(&gid))
}

/// Whether this process is a member of the group `gid` (macOS has no reliable
/// `getgroups`: the kernel's own checks decide).
#[cfg(target_vendor = "apple")]
fn is_member(_gid: u32) -> bool {
    true
}

#[cfg(test)]
#[path = "trust_tests.rs"]
mod tests;
