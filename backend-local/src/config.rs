//! Configuration: where the lock database lives and how long to wait for it.

use std::ffi::OsString;
use std::fmt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use lockcore::Error;

/// The URL scheme of the embedded backend.
pub(crate) const SCHEME: &str = "local";

/// The URL parameter that accepts a store on a network or shared filesystem.
const SHARED_FS: &str = "shared_fs";
/// The URL parameter that names the group of a store shared by its members.
const SHARED_GROUP: &str = "shared_group";

/// Where the embedded backend keeps its lock table.
///
/// Every process that should exclude each other must use the same file, on a local
/// filesystem: a store on a network or shared one (NFS, SMB, FUSE, 9p, virtiofs, …) is
/// refused unless [`with_shared_filesystem`](Self::with_shared_filesystem) accepts it.
#[derive(Clone, PartialEq, Eq)]
pub struct LocalConfig {
    path: PathBuf,
    busy_timeout: Duration,
    shared_fs: bool,
    shared_group: Option<String>,
}

impl LocalConfig {
    /// A config for the database file at `path`.
    pub fn new(path: impl Into<PathBuf>) -> Self {
        Self {
            path: path.into(),
            busy_timeout: Duration::from_secs(5),
            shared_fs: false,
            shared_group: None,
        }
    }

    /// The default database: `$ANYLOCK_LOCAL_DB`, else
    /// `$XDG_STATE_HOME/anylock/locks.sqlite3`, else `~/.local/state/anylock/locks.sqlite3`.
    ///
    /// # Errors
    /// [`ErrorKind::Config`](lockcore::ErrorKind::Config) when none of `ANYLOCK_LOCAL_DB`,
    /// `XDG_STATE_HOME` and `HOME` is set. There is no fallback to the temp directory: it
    /// is cleaned (fence tokens would start again at 1) and often private to one service
    /// (`PrivateTmp`), so locks there would neither fence nor exclude.
    pub fn default_location() -> Result<Self, Error> {
        Self::default_location_in(|var| std::env::var_os(var))
    }

    /// [`default_location`](Self::default_location) with the environment read by `var`.
    fn default_location_in(var: impl Fn(&str) -> Option<OsString>) -> Result<Self, Error> {
        let env = |name| var(name).filter(|v| !v.is_empty()).map(PathBuf::from);
        if let Some(path) = env("ANYLOCK_LOCAL_DB") {
            return Ok(Self::new(path));
        }
        let state = env("XDG_STATE_HOME")
            .or_else(|| env("HOME").map(|home| home.join(".local/state")))
            .ok_or_else(|| {
                Error::new(
                    lockcore::ErrorKind::Config,
                    "no place for the default lock database: HOME, XDG_STATE_HOME and \
                     ANYLOCK_LOCAL_DB are all unset; set ANYLOCK_LOCAL_DB or name the file \
                     (local:/var/lib/anylock/locks.sqlite3)",
                )
            })?;
        Ok(Self::new(state.join("anylock/locks.sqlite3")))
    }

    /// Parses `local:` (the default location) or `local:PATH` / `local://PATH`, with an
    /// optional query after the first `?`: `shared_fs=allow` accepts a store on a network
    /// or shared filesystem ([`with_shared_filesystem`](Self::with_shared_filesystem)),
    /// `shared_group=NAME` makes it a store of the group `NAME`
    /// ([`with_shared_group`](Self::with_shared_group)).
    /// The path is percent-decoded (`%3F` for a `?` in a file name, `%25` for a `%`).
    ///
    /// # Errors
    /// [`ErrorKind::InvalidInput`](lockcore::ErrorKind::InvalidInput) for another scheme, a
    /// path with a NUL byte or a bad percent-encoding, an unknown parameter or a value
    /// other than `allow`;
    /// [`ErrorKind::Config`](lockcore::ErrorKind::Config) for `local:` when there is no
    /// default location (see [`default_location`](Self::default_location)).
    pub fn from_url(url: &str) -> Result<Self, Error> {
        let rest = url
            .strip_prefix("local:")
            // Never echo the URL: another scheme's URL may carry a password.
            .ok_or_else(|| Error::invalid_input("not a local: URL (expected local:PATH)"))?;
        let (path, query) = rest.split_once('?').unwrap_or((rest, ""));
        let path = path.strip_prefix("//").unwrap_or(path);
        let path = lockcore::url::percent_decode(path, "path")?;
        if path.contains('\0') {
            return Err(Error::invalid_input(
                "the local database path contains a NUL byte",
            ));
        }
        let config = if path.is_empty() {
            Self::default_location()?
        } else {
            Self::new(path)
        };
        config.with_query(query)
    }

    /// Applies the URL query `query` (see [`from_url`](Self::from_url)).
    fn with_query(mut self, query: &str) -> Result<Self, Error> {
        let mut query = lockcore::url::Query::parse("local", query)?;
        if let Some(value) = query.take(SHARED_FS) {
            if value != "allow" {
                return Err(Error::invalid_input(
                    "the local: URL parameter shared_fs takes one value, `allow` (a store \
                     on a network or shared filesystem, see docs/local.md)",
                ));
            }
            self.shared_fs = true;
        }
        if let Some(group) = query.take(SHARED_GROUP) {
            if group.is_empty() {
                return Err(Error::invalid_input(
                    "the local: URL parameter shared_group needs a group name",
                ));
            }
            self.shared_group = Some(group);
        }
        query.finish(&[SHARED_FS, SHARED_GROUP])?;
        Ok(self)
    }

    /// Accepts a store on a network or shared filesystem (NFS, SMB/CIFS, FUSE, 9p,
    /// virtiofs, Ceph, AFS, …), which is refused by default (`?shared_fs=allow` in a URL).
    /// The store then runs in SQLite's rollback-journal mode with every commit synced,
    /// and exclusion holds only as far as that filesystem's byte-range locks hold across
    /// its clients: see `docs/local.md`, "Shared filesystems". Linux only: elsewhere the
    /// backend has no boot id to tell its hosts apart, and such a store is refused anyway.
    pub fn with_shared_filesystem(mut self, allow: bool) -> Self {
        self.shared_fs = allow;
        self
    }

    /// Whether a store on a network or shared filesystem is accepted.
    pub fn shared_filesystem(&self) -> bool {
        self.shared_fs
    }

    /// Makes the store one that the members of the group `group` share
    /// (`?shared_group=NAME` in a URL); by default a store is this user's alone, and one
    /// that other users could write is refused. A group store's directory, database,
    /// holders directory and liveness files belong to that group and may be
    /// group-writable, never world-writable; its directories carry the setgid bit. What
    /// anylock creates for it gets those modes (`2770` directories, `0660` database,
    /// `0640` liveness files). Only a member of the group (or root) may open it. See
    /// `docs/local.md`, "Who may use a store".
    pub fn with_shared_group(mut self, group: impl Into<String>) -> Self {
        self.shared_group = Some(group.into());
        self
    }

    /// The group of a group store, if this is one.
    pub fn shared_group(&self) -> Option<&str> {
        self.shared_group.as_deref()
    }

    /// Sets how long a call waits for another process's write to finish (default 5 s).
    pub fn with_busy_timeout(mut self, timeout: Duration) -> Self {
        self.busy_timeout = timeout;
        self
    }

    /// The database file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// How long a call waits for the database's write lock.
    pub fn busy_timeout(&self) -> Duration {
        self.busy_timeout
    }
}

/// Shows `local:PATH`, or `local://PATH` when the path itself starts with `//` (which
/// parsing would otherwise strip), with `%`, `?` and `#` percent-encoded, so the output
/// parses back to the same path; then the query of the options that differ from the
/// defaults.
impl fmt::Display for LocalConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let path = lockcore::url::percent_encode(&self.path.display().to_string(), "?#");
        let slashes = if path.starts_with("//") { "//" } else { "" };
        write!(f, "local:{slashes}{path}")?;
        let mut sep = '?';
        if self.shared_fs {
            write!(f, "{sep}{SHARED_FS}=allow")?;
            sep = '&';
        }
        if let Some(group) = &self.shared_group {
            let group = lockcore::url::percent_encode(group, "&=#+ ");
            write!(f, "{sep}{SHARED_GROUP}={group}")?;
        }
        Ok(())
    }
}

impl fmt::Debug for LocalConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LocalConfig")
            .field("path", &self.path)
            .field("busy_timeout", &self.busy_timeout)
            .field("shared_fs", &self.shared_fs)
            .field("shared_group", &self.shared_group)
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_the_url_forms() {
        assert_eq!(
            LocalConfig::from_url("local:/tmp/x.db").expect("ok").path(),
            Path::new("/tmp/x.db")
        );
        assert_eq!(
            LocalConfig::from_url("local:///tmp/x.db")
                .expect("ok")
                .path(),
            Path::new("/tmp/x.db")
        );
        assert_eq!(
            LocalConfig::from_url("local:rel/x.db").expect("ok").path(),
            Path::new("rel/x.db")
        );
        let default = LocalConfig::from_url("local:").expect("ok");
        assert!(
            default.path().ends_with("anylock/locks.sqlite3"),
            "{default}"
        );
        assert!(LocalConfig::from_url("redis://x").is_err());
        assert!(LocalConfig::from_url("local:/a\0b").is_err());
        assert!(LocalConfig::from_url("local:/a%00b").is_err());
        assert!(
            LocalConfig::from_url("local:/100%.db").is_err(),
            "bad escape"
        );
        assert_eq!(
            LocalConfig::from_url("local:/a%3Fb%25.db")
                .expect("ok")
                .path(),
            Path::new("/a?b%.db")
        );
    }

    fn env(vars: &[(&str, &str)]) -> impl Fn(&str) -> Option<OsString> {
        let vars: Vec<(String, String)> = vars
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect();
        move |name| {
            vars.iter()
                .find(|(k, _)| k == name)
                .map(|(_, v)| OsString::from(v))
        }
    }

    #[test]
    fn the_default_location_follows_the_environment() {
        let at = |vars: &[(&str, &str)]| {
            LocalConfig::default_location_in(env(vars)).map(|c| c.path().to_owned())
        };
        assert_eq!(
            at(&[("ANYLOCK_LOCAL_DB", "/db"), ("HOME", "/h")]).expect("set"),
            Path::new("/db")
        );
        assert_eq!(
            at(&[("XDG_STATE_HOME", "/s"), ("HOME", "/h")]).expect("set"),
            Path::new("/s/anylock/locks.sqlite3")
        );
        assert_eq!(
            at(&[("HOME", "/h"), ("XDG_STATE_HOME", "")]).expect("set"),
            Path::new("/h/.local/state/anylock/locks.sqlite3")
        );
    }

    #[test]
    fn the_default_location_never_falls_back_to_the_temp_dir() {
        // A temp dir is cleaned (tokens restart at 1) and differs between users and
        // services (PrivateTmp): locks there would neither exclude nor fence.
        let err = LocalConfig::default_location_in(env(&[("HOME", "")]))
            .expect_err("no HOME, no XDG_STATE_HOME, no ANYLOCK_LOCAL_DB");
        assert_eq!(err.kind(), lockcore::ErrorKind::Config, "{err}");
        assert!(err.message().contains("ANYLOCK_LOCAL_DB"), "{err}");
    }

    #[test]
    fn displays_as_a_url() {
        assert_eq!(
            LocalConfig::new("/var/lib/anylock.db").to_string(),
            "local:/var/lib/anylock.db"
        );
        let shared = "local:/mnt/nfs/locks.sqlite3?shared_fs=allow";
        let config = LocalConfig::from_url(shared).expect("parses");
        assert!(config.shared_filesystem());
        assert_eq!(config.path(), Path::new("/mnt/nfs/locks.sqlite3"));
        assert_eq!(config.to_string(), shared);
        let team = "local:/srv/locks.sqlite3?shared_fs=allow&shared_group=my%20team";
        let config = LocalConfig::from_url(team).expect("parses");
        assert_eq!(config.shared_group(), Some("my team"));
        assert_eq!(config.to_string(), team);
        assert!(LocalConfig::from_url("local:/x.db?shared_group=").is_err());
    }

    #[test]
    fn the_shared_filesystem_opt_in_is_spelled_out() {
        for url in [
            "local:/x.db?shared_fs=yes",
            "local:/x.db?shared_fs=",
            "local:/x.db?shared=allow",
            "local:/x.db?shared_fs=allow&nfs=1",
        ] {
            let err = LocalConfig::from_url(url).expect_err(url);
            assert_eq!(
                err.kind(),
                lockcore::ErrorKind::InvalidInput,
                "{url}: {err}"
            );
        }
        assert!(
            !LocalConfig::from_url("local:/x.db")
                .expect("ok")
                .shared_filesystem()
        );
    }
}
