//! The holder's liveness signal: a kernel lock (`flock`) on a file of its own.
//!
//! Before each grant, the claimant creates a fresh file in the holders directory next to
//! the database (`<db>.holders/<key>`), locks it exclusively, and only then writes `key`
//! into the lease row. A contender that finds the lease held and unexpired tries the same
//! kernel lock without blocking: if it gets it, every process that held that file is gone
//! (the kernel drops a `flock` lock when the last descriptor on it closes, also when the
//! process is killed, and whatever PID namespace it ran in), so the holder is provably
//! dead. Anything else (the lock is busy, the file is missing or unreadable, the row
//! names no file) is no proof, and the lease runs out its TTL.
//!
//! One file per grant, not per name: a lease that expired by its TTL is granted to a new
//! holder while the old, hung one may still hold its file, so a name's file could not tell
//! whose lock it is.
//!
//! The holder's descriptor is inheritable (not close-on-exec): a command the holder starts
//! while it holds the lease inherits the lock, which then lasts until the holder and every
//! process that inherited it have exited (the `anylock run` case). Release unlocks it
//! explicitly, which also unlocks it for those children.

use std::fs::{File, OpenOptions, Permissions};
use std::io;
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

use nix::fcntl::{FcntlArg, FdFlag, OFlag, fcntl};

use crate::trust::{Role, Trust};

/// The directory of liveness files that belongs to one database.
#[derive(Debug, Clone)]
pub(crate) struct HolderDir {
    dir: PathBuf,
    /// The store's permission rules, which every file probed must meet.
    trust: Trust,
}

/// A liveness file this process has locked: our own while we hold a lease, or a dead
/// holder's during a takeover. Dropping it removes the file and unlocks it.
#[derive(Debug)]
pub(crate) struct Held {
    file: File,
    path: PathBuf,
    key: String,
    /// Whether dropping removes the file (else it only unlocks it).
    remove: bool,
}

/// What a contender learned about a holder's liveness file.
#[derive(Debug)]
pub(crate) enum Probe {
    /// Someone holds the kernel lock: the holder, or a command it started, still runs.
    Alive,
    /// We got the lock: every process that held it is gone. Keep this until the takeover
    /// is written, so that nobody else sees the file as dead at the same time.
    Dead(Held),
    /// No proof either way (no file named, the file is missing or unreadable).
    Unknown,
}

impl HolderDir {
    /// The holders directory of the database at `db`: `<db>.holders`, under `trust`'s
    /// rules.
    pub(crate) fn for_database(db: &Path, trust: Trust) -> Self {
        let mut dir = db.as_os_str().to_owned();
        dir.push(".holders");
        Self {
            dir: dir.into(),
            trust,
        }
    }

    /// The directory.
    pub(crate) fn path(&self) -> &Path {
        &self.dir
    }

    /// The store's permission rules.
    pub(crate) fn trust(&self) -> &Trust {
        &self.trust
    }

    /// Creates a fresh liveness file, locks it and makes the descriptor inheritable.
    pub(crate) fn hold(&self) -> io::Result<Held> {
        let key = format!("{:032x}", rand::random::<u128>());
        let path = self.dir.join(&key);
        let mode = self.trust.liveness_mode();
        let file = OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(mode)
            .custom_flags(OFlag::O_NOFOLLOW.bits())
            .open(&path)?;
        let held = Held {
            file,
            path,
            key,
            remove: true,
        };
        // Whatever the umask: private (0600), or readable by the group of a group store,
        // whose members probe each other's files.
        held.file.set_permissions(Permissions::from_mode(mode))?;
        held.file.try_lock().map_err(io::Error::from)?;
        fcntl(&held.file, FcntlArg::F_SETFD(FdFlag::empty())).map_err(io::Error::from)?;
        Ok(held)
    }

    /// Removes the liveness file `key` names, if it is one of ours (a broken holder's).
    pub(crate) fn remove(&self, key: Option<&str>) {
        if let Some(key) = key.filter(|k| is_key(k)) {
            let _ = std::fs::remove_file(self.dir.join(key));
        }
    }

    /// Tries, without waiting, the kernel lock of the holder whose row names `key`. A
    /// file that breaks the store's rules (a link, another user's, writable by others:
    /// someone may have swapped the holder's file for one nobody locks) is no proof.
    pub(crate) fn probe(&self, key: Option<&str>) -> Probe {
        let Some(key) = key.filter(|k| is_key(k)) else {
            return Probe::Unknown;
        };
        let path = self.dir.join(key);
        let Ok(file) = crate::trust::open_nofollow(&path) else {
            return Probe::Unknown;
        };
        let judged = file.metadata().map_err(|e| e.to_string()).and_then(|meta| {
            let judged = self.trust.judge(&meta, Role::Liveness);
            judged.map_err(|refusal| format!("{refusal:?}"))
        });
        if let Err(why) = judged {
            tracing::warn!(path = %path.display(), %why,
                "a liveness file breaks the store's rules: no proof of its holder's death");
            return Probe::Unknown;
        }
        match file.try_lock() {
            Ok(()) => Probe::Dead(Held {
                file,
                path,
                key: key.to_owned(),
                remove: true,
            }),
            Err(std::fs::TryLockError::WouldBlock) => Probe::Alive,
            Err(std::fs::TryLockError::Error(_)) => Probe::Unknown,
        }
    }
}

impl Held {
    /// The key stored in the lease row.
    pub(crate) fn key(&self) -> &str {
        &self.key
    }

    /// Unlocks without removing the file: for a dead holder's file when it is unknown
    /// whether the row still names it (a failed takeover), so the next contender can
    /// still prove the death.
    pub(crate) fn unlock_only(mut self) {
        self.remove = false;
    }
}

impl Drop for Held {
    fn drop(&mut self) {
        // Remove first: a contender that opens the path from now on finds nothing, which
        // is no proof of death. Then unlock explicitly, which also unlocks the copies a
        // started command inherited (closing our descriptor alone would not).
        if self.remove {
            let _ = std::fs::remove_file(&self.path);
        }
        let _ = self.file.unlock();
    }
}

/// Only keys this module made: 32 lowercase hex digits (never a path from the database).
pub(crate) fn is_key(key: &str) -> bool {
    key.len() == 32 && key.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn temp_dir() -> HolderDir {
        let random: u64 = rand::random();
        let db = std::env::temp_dir().join(format!("anylock-liveness-{random:016x}.sqlite3"));
        let trust = Trust::new(&db, None).expect("private");
        let dir = HolderDir::for_database(&db, trust);
        std::fs::create_dir(dir.path()).expect("create");
        dir
    }

    #[test]
    fn a_held_file_is_alive_and_a_released_one_is_unknown() {
        let dir = temp_dir();
        let held = dir.hold().expect("hold");
        let key = held.key().to_owned();
        assert!(matches!(dir.probe(Some(&key)), Probe::Alive));
        drop(held);
        assert!(matches!(dir.probe(Some(&key)), Probe::Unknown));
        let _ = std::fs::remove_dir_all(dir.path());
    }

    #[test]
    fn a_file_nobody_locks_is_dead_and_probing_it_locks_it() {
        let dir = temp_dir();
        let key = "0123456789abcdef0123456789abcdef";
        std::fs::write(dir.path().join(key), b"").expect("write");
        let Probe::Dead(dead) = dir.probe(Some(key)) else {
            panic!("an unlocked file is a dead holder's");
        };
        assert!(matches!(dir.probe(Some(key)), Probe::Alive));
        drop(dead);
        assert!(!dir.path().join(key).exists(), "the dead file is removed");
        let _ = std::fs::remove_dir_all(dir.path());
    }

    #[test]
    fn a_failed_takeover_leaves_the_dead_file_for_the_next_contender() {
        let dir = temp_dir();
        // The holder dies without cleaning up: its file stays, unlocked.
        let key = dir.hold().map(|mut held| {
            held.remove = false;
            held.key().to_owned()
        });
        let key = key.expect("hold");
        let Probe::Dead(dead) = dir.probe(Some(&key)) else {
            panic!("dead");
        };
        dead.unlock_only();
        assert!(
            matches!(dir.probe(Some(&key)), Probe::Dead(_)),
            "the next contender can still prove the death"
        );
        let _ = std::fs::remove_dir_all(dir.path());
    }

    /// Guards against a liveness file that someone else could have put in place (writable
    /// by others, or a link to a file nobody locks) counting as proof of death: the
    /// review's attack replaced a live holder's file with an unlocked one.
    #[test]
    fn a_file_that_breaks_the_rules_proves_nothing() {
        let dir = temp_dir();
        let planted = "0123456789abcdef0123456789abcdef";
        std::fs::write(dir.path().join(planted), b"").expect("write");
        std::fs::set_permissions(dir.path().join(planted), Permissions::from_mode(0o666))
            .expect("chmod");
        assert!(
            matches!(dir.probe(Some(planted)), Probe::Unknown),
            "world-writable"
        );
        let linked = "fedcba9876543210fedcba9876543210";
        let elsewhere = dir.path().with_extension("elsewhere");
        std::fs::write(&elsewhere, b"").expect("write");
        std::os::unix::fs::symlink(&elsewhere, dir.path().join(linked)).expect("symlink");
        assert!(matches!(dir.probe(Some(linked)), Probe::Unknown), "a link");
        let _ = std::fs::remove_file(&elsewhere);
        let _ = std::fs::remove_dir_all(dir.path());
    }

    #[test]
    fn keys_that_are_not_ours_are_never_opened() {
        let dir = temp_dir();
        for key in [None, Some("../../etc/passwd"), Some(""), Some("ABC")] {
            assert!(matches!(dir.probe(key), Probe::Unknown), "{key:?}");
        }
        let _ = std::fs::remove_dir_all(dir.path());
    }
}
