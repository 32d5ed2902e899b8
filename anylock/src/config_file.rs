//! Reading a config file safely: a bounded regular file, which only its owner (or root)
//! controls.

use std::path::Path;

use lockcore::{Error, ErrorKind};

/// The largest config file read: a config is a few lines.
pub const MAX_CONFIG_LEN: u64 = 1 << 20;

/// The text and permission bits of the config file at `path`.
///
/// Opened with `O_NONBLOCK`, so that opening a FIFO returns at once instead of waiting for
/// a writer, then checked with `fstat` on the open file (no race with a rename): only a
/// regular file is read, at most [`MAX_CONFIG_LEN`] bytes of it.
pub(crate) fn read_config_file(path: &Path) -> Result<(String, u32), Error> {
    use std::io::Read as _;
    let cannot = || format!("cannot read {}", path.display());
    let refuse = |why: &str| Error::new(ErrorKind::Config, format!("{}: {why}", cannot()));
    let io = |e: std::io::Error| Error::new(ErrorKind::Config, cannot()).with_source(e);
    let file = open_nonblocking(path).map_err(io)?;
    let meta = file.metadata().map_err(io)?;
    if !meta.is_file() {
        return Err(refuse(
            "not a regular file (a FIFO, device or directory cannot be a config file)",
        ));
    }
    refuse_others_control(&meta).map_err(|why| refuse(&why))?;
    let too_big = || refuse("larger than 1 MiB, the most a config file may hold");
    if meta.len() > MAX_CONFIG_LEN {
        return Err(too_big());
    }
    let mut bytes = Vec::new();
    (file.take(MAX_CONFIG_LEN + 1).read_to_end(&mut bytes)).map_err(io)?;
    if bytes.len() as u64 > MAX_CONFIG_LEN {
        return Err(too_big());
    }
    let text = String::from_utf8(bytes).map_err(|_| refuse("not UTF-8 text"))?;
    Ok((text, permission_bits(&meta)))
}

/// Whoever can write the config file chooses the backend anylock locks on (their own
/// server, another store): a file another user owns (but root), or that group or others
/// may write, is refused, as ssh refuses such a config.
#[cfg(unix)]
fn refuse_others_control(meta: &std::fs::Metadata) -> Result<(), String> {
    use std::os::unix::fs::MetadataExt as _;
    let me = nix::unistd::geteuid().as_raw();
    if meta.uid() != me && meta.uid() != 0 {
        return Err(format!(
            "owned by another user (uid {}): whoever owns it chooses the backend; use a \
             config file of your own",
            meta.uid()
        ));
    }
    if meta.mode() & 0o002 != 0 || (meta.mode() & 0o020 != 0 && !private_group(meta)) {
        return Err(format!(
            "writable by {} (mode {:03o}): whoever can write it chooses the backend; \
             chmod go-w the file",
            if meta.mode() & 0o002 != 0 {
                "others"
            } else {
                "its group"
            },
            meta.mode() & 0o777
        ));
    }
    Ok(())
}

/// Whether the file's group is its owner's own (a user private group, as Debian makes:
/// named after the user, with no other members), so that group write gives no one else
/// the file.
#[cfg(unix)]
fn private_group(meta: &std::fs::Metadata) -> bool {
    use nix::unistd::{Gid, Group, Uid, User};
    use std::os::unix::fs::MetadataExt as _;
    let Ok(Some(user)) = User::from_uid(Uid::from_raw(meta.uid())) else {
        return false;
    };
    let Ok(Some(group)) = Group::from_gid(Gid::from_raw(meta.gid())) else {
        return false;
    };
    user.gid.as_raw() == meta.gid()
        && group.name == user.name
        && group.mem.iter().all(|member| *member == user.name)
}

#[cfg(not(unix))]
fn refuse_others_control(_: &std::fs::Metadata) -> Result<(), String> {
    Ok(())
}

#[cfg(unix)]
fn open_nonblocking(path: &Path) -> std::io::Result<std::fs::File> {
    use std::os::unix::fs::OpenOptionsExt as _;
    (std::fs::OpenOptions::new().read(true))
        .custom_flags(libc::O_NONBLOCK | libc::O_NOCTTY)
        .open(path)
}

#[cfg(not(unix))]
fn open_nonblocking(path: &Path) -> std::io::Result<std::fs::File> {
    std::fs::File::open(path)
}

#[cfg(unix)]
fn permission_bits(meta: &std::fs::Metadata) -> u32 {
    use std::os::unix::fs::PermissionsExt as _;
    meta.permissions().mode()
}

/// No group or other permission bits to check.
#[cfg(not(unix))]
fn permission_bits(_: &std::fs::Metadata) -> u32 {
    0
}
