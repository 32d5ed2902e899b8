//! The serde configuration: the same content as a URL, loadable from TOML.

use std::fmt;
use std::path::Path;
use std::time::Duration;

use lockcore::{Error, ErrorKind, LockOptions, Ttl, WaitMode};
use serde::{Deserialize, Deserializer};

use crate::config_file::read_config_file;
use crate::url::BackendUrl;

/// The URL used when nothing is configured: the embedded backend at its default location.
pub const DEFAULT_URL: &str = "local:";

/// anylock configuration, for example from `~/.config/anylock/config.toml`:
///
/// ```toml
/// backend = "redis://:password@redis.internal:6379/0"
/// ttl = "30s"        # or bare seconds: ttl = 30
/// wait = "5m"        # or "forever"
/// ```
///
/// Durations are read once, at load, by [`lockcore::parse_duration`] (the CLI's parser):
/// a bad one is a [`ErrorKind::Config`] error then, not at first use.
///
/// ```
/// use std::time::Duration;
/// let config = anylock::Config::from_toml("ttl = \"1m\"\nwait = 5")?;
/// let options = config.lock_options()?;
/// assert_eq!(options.ttl(), Duration::from_secs(60));
/// assert_eq!(options.wait(), anylock::WaitMode::Timeout(Duration::from_secs(5)));
/// # Ok::<(), anylock::Error>(())
/// ```
///
/// `Debug` redacts the backend URL's secrets.
#[derive(Clone, Default, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Config {
    /// The backend URL; `None` means the embedded default ([`DEFAULT_URL`]).
    pub backend: Option<String>,
    /// The default lease TTL (`None`: [`DEFAULT_TTL`](lockcore::DEFAULT_TTL)).
    #[serde(default, deserialize_with = "ttl")]
    pub ttl: Option<Ttl>,
    /// The default wait: `"forever"` or a duration (`None`: forever).
    #[serde(default, deserialize_with = "wait")]
    pub wait: Option<WaitMode>,
    /// The default grace between SIGTERM and SIGKILL when a lock is lost (`anylock run`).
    #[serde(default, deserialize_with = "grace")]
    pub grace: Option<Duration>,
}

/// A duration written as text (`"30s"`) or as a number of seconds (`30`, `2.5`).
#[derive(Deserialize)]
#[serde(untagged)]
enum Written {
    Text(String),
    Seconds(f64),
}

impl Written {
    /// Reads the value of `key`; errors name the key.
    fn read<'de, D: Deserializer<'de>>(d: D, key: &str) -> Result<Self, D::Error> {
        Self::deserialize(d).map_err(|_| {
            serde::de::Error::custom(format!(
                "{key}: expected a duration such as \"30s\", \"5m\" or a number of seconds"
            ))
        })
    }

    fn duration(self, key: &str) -> Result<Duration, String> {
        match self {
            Self::Text(text) => {
                lockcore::parse_duration(&text).map_err(|e| format!("{key}: {}", e.message()))
            }
            Self::Seconds(secs) => Duration::try_from_secs_f64(secs).map_err(|_| {
                format!(
                    "{key}: not a usable number of seconds (negative, too large or not a number)"
                )
            }),
        }
    }
}

fn ttl<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Ttl>, D::Error> {
    let ttl = duration(d, "ttl")?.map(Ttl::new).transpose();
    ttl.map_err(|e| serde::de::Error::custom(format!("ttl: {}", e.message())))
}

fn grace<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Duration>, D::Error> {
    duration(d, "grace")
}

fn duration<'de, D: Deserializer<'de>>(d: D, key: &str) -> Result<Option<Duration>, D::Error> {
    let written = Written::read(d, key)?;
    written
        .duration(key)
        .map(Some)
        .map_err(serde::de::Error::custom)
}

fn wait<'de, D: Deserializer<'de>>(d: D) -> Result<Option<WaitMode>, D::Error> {
    match Written::read(d, "wait")? {
        Written::Text(text) if text.trim() == "forever" => Ok(Some(WaitMode::Forever)),
        written => written
            .duration("wait")
            .map(|d| Some(WaitMode::Timeout(d)))
            .map_err(serde::de::Error::custom),
    }
}

impl Config {
    /// A config naming `url` as the backend.
    pub fn with_backend(url: impl Into<String>) -> Self {
        Self {
            backend: Some(url.into()),
            ..Self::default()
        }
    }

    /// Parses TOML text.
    ///
    /// # Errors
    /// [`ErrorKind::Config`] naming the offending key or line.
    pub fn from_toml(text: &str) -> Result<Self, Error> {
        toml::from_str(text).map_err(|e| {
            let message = e.message().to_owned();
            Error::new(
                ErrorKind::Config,
                format!("invalid anylock config: {message}"),
            )
        })
    }

    /// Reads and parses the TOML file at `path`: a regular file of at most
    /// [`MAX_CONFIG_LEN`](crate::MAX_CONFIG_LEN) bytes. It is opened without blocking and checked before it is
    /// read, so a FIFO or a device (`/dev/zero`) is refused rather than waited on or read
    /// forever. A file whose backend URL [holds a secret](crate::holds_secret) (a password,
    /// or a parameter that [`redact`](crate::redact) hides other than a key file's path)
    /// must be readable by its owner only.
    ///
    /// # Errors
    /// [`ErrorKind::Config`], naming the file, when it cannot be read, is not a regular
    /// file, is too large, cannot be parsed, or holds a secret and is readable by group or
    /// others (saying `chmod 600 FILE`).
    pub fn load(path: &Path) -> Result<Self, Error> {
        let (text, mode) = read_config_file(path)?;
        let config = Self::from_toml(&text).map_err(|e| {
            Error::new(
                ErrorKind::Config,
                format!("{}: {}", path.display(), e.message()),
            )
        })?;
        config.refuse_shared_secret(path, mode)?;
        Ok(config)
    }

    /// A backend secret in a file that group or others may read is refused, as libpq
    /// refuses such a `.pgpass` and ssh such a key.
    fn refuse_shared_secret(&self, path: &Path, mode: u32) -> Result<(), Error> {
        let secret = (self.backend.as_deref()).is_some_and(crate::url::holds_secret);
        if !secret || mode & 0o044 == 0 {
            return Ok(());
        }
        let path = path.display();
        Err(Error::new(
            ErrorKind::Config,
            format!(
                "{path} holds the backend URL's password or secret parameter but is readable \
                 by {} (mode {:03o}); make it readable by its owner only: chmod 600 {path}",
                match (mode & 0o040 != 0, mode & 0o004 != 0) {
                    (true, true) => "group and others",
                    (true, false) => "its group",
                    _ => "others",
                },
                mode & 0o777,
            ),
        ))
    }

    /// Lock options from this config: its TTL (or [`DEFAULT_TTL`](lockcore::DEFAULT_TTL)) and wait (or forever),
    /// everything else at lockcore's defaults; so library users need not re-read the
    /// config's durations themselves.
    ///
    /// # Errors
    /// [`ErrorKind::Config`] when the options are invalid (a wait longer than
    /// [`MAX_TTL`](lockcore::MAX_TTL)), naming it. A TTL out of range is refused earlier,
    /// when the file is read.
    pub fn lock_options(&self) -> Result<LockOptions, Error> {
        let options = LockOptions::new(self.ttl.unwrap_or_default().get())
            .with_wait(self.wait.unwrap_or(WaitMode::Forever));
        options.validate().map_err(|e| {
            Error::new(
                ErrorKind::Config,
                format!("invalid anylock config: {}", e.message()),
            )
        })?;
        Ok(options)
    }

    /// The backend URL, or the embedded default.
    pub fn backend_url(&self) -> BackendUrl {
        BackendUrl::new(self.backend.as_deref().unwrap_or(DEFAULT_URL))
    }
}

impl fmt::Debug for Config {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Config")
            .field("backend", &self.backend.as_deref().map(crate::url::redact))
            .field("ttl", &self.ttl)
            .field("wait", &self.wait)
            .field("grace", &self.grace)
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::MAX_CONFIG_LEN;

    #[test]
    fn parses_and_redacts() {
        let config = Config::from_toml("backend = \"redis://:hunter2@h:1/0\"\nttl = \"30s\"\n")
            .expect("valid");
        assert_eq!(config.ttl.map(Ttl::get), Some(Duration::from_secs(30)));
        assert!(!format!("{config:?}").contains("hunter2"));
        assert!(!config.backend_url().to_string().contains("hunter2"));
    }

    #[test]
    fn unknown_keys_and_bad_toml_are_clear_errors() {
        let err = Config::from_toml("backnd = \"x\"").expect_err("typo");
        assert_eq!(err.kind(), ErrorKind::Config);
        assert!(err.to_string().contains("backnd"), "{err}");
        assert!(Config::from_toml("backend = ").is_err());
    }

    #[test]
    fn durations_are_read_at_load() {
        let config =
            Config::from_toml("ttl = 90\nwait = \"forever\"\ngrace = \"2.5\"").expect("ok");
        assert_eq!(config.ttl.map(Ttl::get), Some(Duration::from_secs(90)));
        assert_eq!(config.wait, Some(WaitMode::Forever));
        assert_eq!(config.grace, Some(Duration::from_millis(2500)));
        let err = Config::from_toml("ttl = \"soon\"").expect_err("bad");
        assert_eq!(err.kind(), ErrorKind::Config);
        assert!(
            err.to_string().contains("\"soon\" is not a duration"),
            "{err}"
        );
        let err = Config::from_toml("ttl = -1").expect_err("negative");
        assert_eq!(err.kind(), ErrorKind::Config);
        let err = Config::from_toml("ttl = \"1ms\"").expect_err("too short");
        assert_eq!(err.kind(), ErrorKind::Config);
        assert!(err.to_string().contains("ttl: TTL 1ms is outside"), "{err}");
        assert_eq!(
            Config::default().lock_options().expect("ok").ttl(),
            lockcore::DEFAULT_TTL
        );
    }

    /// A scratch directory, removed on drop.
    struct Scratch(std::path::PathBuf);

    impl Scratch {
        fn new() -> Self {
            let dir = std::env::temp_dir().join(format!("anylock-config-{:016x}", rand_suffix()));
            std::fs::create_dir_all(&dir).expect("scratch dir");
            Self(dir)
        }

        /// Writes `text` to `name` with permission bits `mode`.
        fn file(&self, name: &str, text: &str, mode: u32) -> std::path::PathBuf {
            use std::os::unix::fs::PermissionsExt as _;
            let path = self.0.join(name);
            std::fs::write(&path, text).expect("write");
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode)).expect("chmod");
            path
        }
    }

    impl Drop for Scratch {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    fn rand_suffix() -> u64 {
        let t = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as u64);
        t ^ u64::from(std::process::id()) << 32
    }

    /// `Config::load(path)` on a thread, or `None` if it has not returned within 5 s.
    fn load_within_5s(path: &Path) -> Option<Result<Config, Error>> {
        let (tx, rx) = std::sync::mpsc::channel();
        let path = path.to_owned();
        std::thread::spawn(move || tx.send(Config::load(&path)));
        rx.recv_timeout(Duration::from_secs(5)).ok()
    }

    /// A FIFO (nobody writing) would block `open` forever, and `/dev/zero` would be read
    /// until memory runs out: both are refused at once as not regular files.
    #[test]
    fn only_regular_files_are_read_and_a_fifo_does_not_block() {
        let scratch = Scratch::new();
        let fifo = scratch.0.join("fifo.toml");
        let made = std::process::Command::new("mkfifo")
            .arg(&fifo)
            .status()
            .expect("mkfifo");
        assert!(made.success());
        for path in [fifo.as_path(), Path::new("/dev/zero"), scratch.0.as_path()] {
            let result = load_within_5s(path)
                .unwrap_or_else(|| panic!("Config::load({}) blocked", path.display()));
            let err = result.expect_err("not a regular file");
            assert_eq!(err.kind(), ErrorKind::Config, "{err}");
            let text = err.to_string();
            assert!(text.contains("not a regular file"), "{text}");
            assert!(text.contains(&path.display().to_string()), "{text}");
        }
    }

    /// A config file is a few lines: more than 1 MiB is refused, unread.
    #[test]
    fn a_config_file_larger_than_the_cap_is_refused() {
        const CAP: u64 = 1 << 20;
        assert_eq!(CAP, MAX_CONFIG_LEN);
        let scratch = Scratch::new();
        let at_cap = {
            let mut text = "ttl = \"1m\"\n#".to_owned();
            text.push_str(&"x".repeat(CAP as usize - text.len()));
            scratch.file("at-cap.toml", &text, 0o600)
        };
        let config = Config::load(&at_cap).expect("a file of exactly the cap loads");
        assert_eq!(config.ttl.map(Ttl::get), Some(Duration::from_secs(60)));
        let big = scratch.0.join("big.toml");
        let file = std::fs::File::create(&big).expect("create");
        file.set_len(CAP + 1).expect("sparse");
        let err = Config::load(&big).expect_err("too big");
        assert_eq!(err.kind(), ErrorKind::Config, "{err}");
        let text = err.to_string();
        assert!(
            text.contains("1 MiB") && text.contains("big.toml"),
            "{text}"
        );
    }

    /// Whoever can write the config file chooses the backend: a file others may write, a
    /// shared group may write, or another user owns, is refused (the group and owner cases
    /// need root, as CI runs them).
    #[test]
    fn a_file_others_can_write_or_own_is_refused() {
        let scratch = Scratch::new();
        for mode in [0o602, 0o666] {
            let path = scratch.file(&format!("w-{mode:o}.toml"), "backend = \"local:\"", mode);
            let err = Config::load(&path).expect_err("writable by others");
            assert_eq!(err.kind(), ErrorKind::Config, "{err}");
            assert!(err.to_string().contains("chmod go-w"), "{err}");
        }
        let root = nix::unistd::geteuid().is_root();
        assert!(
            root || std::env::var_os("CI").is_none(),
            "CI runs this as root"
        );
        if !root {
            return;
        }
        // Group write: refused for a shared group, taken for the owner's private group
        // (root's own here, as a user's own on Debian).
        let shared = scratch.file("g-shared.toml", "backend = \"local:\"", 0o664);
        std::os::unix::fs::chown(&shared, None, Some(65534)).expect("chgrp");
        let err = Config::load(&shared).expect_err("writable by a shared group");
        assert!(err.to_string().contains("chmod go-w"), "{err}");
        let private = scratch.file("g-private.toml", "backend = \"local:\"", 0o664);
        Config::load(&private).expect("the owner's private group");
        let theirs = scratch.file("theirs.toml", "backend = \"local:\"", 0o644);
        std::os::unix::fs::chown(&theirs, Some(65534), None).expect("chown");
        let err = Config::load(&theirs).expect_err("another user's");
        assert!(err.to_string().contains("owned by another user"), "{err}");
    }

    /// A backend secret in a file that group or others can read is refused, naming the file
    /// and the fix; the same file owner-only loads, and a file with no secret may be shared.
    #[test]
    fn a_secret_in_a_file_others_can_read_is_refused() {
        let scratch = Scratch::new();
        let secrets = [
            "backend = \"redis://:hunter2@h:1/0\"",
            "backend = \"postgres://app:hunter2@db/locks\"",
            "backend = \"postgres://db/locks?password=hunter2\"",
            "backend = \"etcd://h:2379/p?pasword=hunter2\"",
        ];
        for (i, text) in secrets.iter().enumerate() {
            for mode in [0o644, 0o640, 0o604] {
                let path = scratch.file(&format!("s{i}-{mode:o}.toml"), text, mode);
                let err = Config::load(&path).expect_err("readable by others");
                assert_eq!(err.kind(), ErrorKind::Config, "{err}");
                let shown = err.to_string();
                assert!(
                    shown.contains(&format!("chmod 600 {}", path.display())),
                    "{shown}"
                );
                assert!(!shown.contains("hunter2"), "{shown}");
            }
            for mode in [0o600, 0o400, 0o700] {
                let path = scratch.file(&format!("ok{i}-{mode:o}.toml"), text, mode);
                let config = Config::load(&path).unwrap_or_else(|e| panic!("{mode:o}: {e}"));
                assert!(config.backend.is_some_and(|b| b.contains("hunter2")));
            }
        }
        for (i, url) in [
            "redis://h:1/0",
            "etcds://h/p?ca=/ca.pem&cert=/c.pem&key=/k.pem",
        ]
        .iter()
        .enumerate()
        {
            let text = format!("backend = {url:?}");
            let shared = scratch.file(&format!("shared{i}.toml"), &text, 0o644);
            Config::load(&shared).expect("no secret (a key's path is none): may be shared");
        }
    }

    #[test]
    fn no_backend_means_the_embedded_default() {
        assert_eq!(Config::default().backend_url().expose(), "local:");
    }
}
