//! The serde configuration: the same content as a URL, loadable from TOML.

use std::fmt;
use std::path::Path;
use std::time::Duration;

use lockcore::{Error, ErrorKind, LockOptions, Ttl, WaitMode};
use serde::{Deserialize, Deserializer};

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

    /// Reads and parses the TOML file at `path`.
    ///
    /// # Errors
    /// [`ErrorKind::Config`] when the file cannot be read or parsed.
    pub fn load(path: &Path) -> Result<Self, Error> {
        let text = std::fs::read_to_string(path).map_err(|e| {
            Error::new(ErrorKind::Config, format!("cannot read {}", path.display())).with_source(e)
        })?;
        Self::from_toml(&text).map_err(|e| {
            Error::new(
                ErrorKind::Config,
                format!("{}: {}", path.display(), e.message()),
            )
        })
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

    #[test]
    fn no_backend_means_the_embedded_default() {
        assert_eq!(Config::default().backend_url().expose(), "local:");
    }
}
