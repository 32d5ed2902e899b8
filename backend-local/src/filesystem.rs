//! Which filesystem a store's directory is on, and whether that one is shared between
//! kernels (a network or host-shared filesystem), from `statfs(2)`.
//!
//! A store on such a filesystem is refused unless the user opts in (`?shared_fs=allow`,
//! `docs/local.md`): SQLite's WAL mode keeps its index in shared memory (the `-shm` file,
//! mapped by every process), which only one kernel can share, and SQLite's byte-range locks
//! and anylock's liveness `flock`s are only as good as the filesystem's lock manager
//! (`nolock` NFS mounts and virtiofs without `posix_lock` keep them local to each client).
//!
//! On Linux the filesystem is told by `f_type`, its magic number; elsewhere by the name
//! `statfs` gives (`f_fstypename` on macOS and the BSDs). Not detected: a shared
//! filesystem under an overlay or a bind mount that reports a local type, a FUSE
//! filesystem on a system that names it otherwise, and a block device shared between
//! machines under a local filesystem (ext4 or XFS on a SAN LUN mounted twice).

use std::io;
use std::path::Path;

/// A filesystem type, as `statfs` reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Filesystem {
    /// Linux: the `f_type` magic number (the low 32 bits, which hold every magic).
    Magic(u32),
    /// Elsewhere: the type's name.
    #[cfg_attr(target_os = "linux", allow(dead_code))]
    Named(String),
}

/// The Linux filesystems shared between kernels, by `f_type` (`linux/magic.h` and each
/// filesystem's own header). FUSE covers virtiofs (Kata), sshfs, GlusterFS, s3fs and
/// every other FUSE filesystem, local ones included, since none can be told apart.
const SHARED_MAGIC: [(u32, &str); 15] = [
    (0x6969, "NFS"),
    (0x517B, "SMB"),
    (0xFF53_4D42, "CIFS"),
    (0xFE53_4D42, "SMB2"),
    (0x6573_5546, "FUSE (virtiofs, sshfs, …)"),
    (0x0102_1997, "9p (v9fs)"),
    (0x00C3_6400, "Ceph"),
    (0x5346_414F, "AFS"),
    (0x6B41_4653, "kAFS"),
    (0x7375_7245, "Coda"),
    (0x0116_1970, "GFS2"),
    (0x7461_636F, "OCFS2"),
    (0x0BD0_0BD0, "Lustre"),
    (0x4750_4653, "GPFS"),
    (0x564C, "NCP"),
];

/// The shared filesystems elsewhere, by the name `statfs` gives.
const SHARED_NAMES: [&str; 12] = [
    "nfs", "smbfs", "cifs", "afpfs", "webdav", "fusefs", "macfuse", "osxfuse", "9p", "p9fs", "afs",
    "ceph",
];

impl Filesystem {
    /// The name of the filesystem when it is one shared between kernels.
    pub(crate) fn shared_name(&self) -> Option<String> {
        match self {
            Self::Magic(magic) => SHARED_MAGIC
                .iter()
                .find(|(known, _)| known == magic)
                .map(|(_, name)| (*name).to_owned()),
            Self::Named(name) => {
                let lower = name.to_ascii_lowercase();
                let shared = SHARED_NAMES.contains(&lower.as_str()) || lower.starts_with("fuse");
                shared.then(|| name.clone())
            }
        }
    }
}

/// The filesystem `dir` is on.
#[cfg(any(target_os = "linux", target_os = "android"))]
pub(crate) fn of(dir: &Path) -> io::Result<Filesystem> {
    let stat = nix::sys::statfs::statfs(dir).map_err(io::Error::from)?;
    // Magic numbers are 32-bit; `f_type` is signed on some targets, so keep the low bits.
    #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
    let magic = stat.filesystem_type().0 as u32;
    Ok(Filesystem::Magic(magic))
}

/// The filesystem `dir` is on.
#[cfg(all(
    unix,
    not(any(target_os = "linux", target_os = "android", target_os = "cygwin"))
))]
pub(crate) fn of(dir: &Path) -> io::Result<Filesystem> {
    let stat = nix::sys::statfs::statfs(dir).map_err(io::Error::from)?;
    Ok(Filesystem::Named(stat.filesystem_type_name().to_owned()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn network_and_shared_filesystems_are_told_from_local_ones() {
        for (magic, name) in [(0x6969, "NFS"), (0xFF53_4D42, "CIFS"), (0x0102_1997, "9p")] {
            let found = Filesystem::Magic(magic).shared_name().expect(name);
            assert!(found.starts_with(name), "{found}");
        }
        assert!(
            Filesystem::Magic(0x6573_5546).shared_name().is_some(),
            "FUSE"
        );
        // ext4, tmpfs, overlay, btrfs, XFS.
        for magic in [0xEF53, 0x0102_1994, 0x794C_7630, 0x9123_683E, 0x5846_5342] {
            assert_eq!(Filesystem::Magic(magic).shared_name(), None, "{magic:#x}");
        }
        for name in ["nfs", "smbfs", "fusefs.sshfs", "macfuse"] {
            assert!(
                Filesystem::Named(name.into()).shared_name().is_some(),
                "{name}"
            );
        }
        for name in ["apfs", "ufs", "zfs", "tmpfs"] {
            assert_eq!(Filesystem::Named(name.into()).shared_name(), None, "{name}");
        }
    }
}
