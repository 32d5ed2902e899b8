//! The serde configuration: the same content as a URL, loadable from TOML.

use std::fmt;
use std::path::Path;

use lockcore::{Error, ErrorKind};
use serde::Deserialize;

use crate::url::BackendUrl;

/// anylock configuration, for example from `~/.config/anylock/config.toml`:
///
/// ```toml
/// backend = "redis://:password@redis.internal:6379/0"
/// ttl = "30s"
/// ```
///
/// `Debug` redacts the backend URL's secrets.
#[derive(Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Config {
    /// The backend URL; `None` means the embedded default ([`DEFAULT_URL`](crate::DEFAULT_URL)).
    pub backend: Option<String>,
    /// The default lease TTL, as a human duration (`30s`, `5m`).
    pub ttl: Option<String>,
    /// The default wait, as a human duration, or `"forever"`.
    pub wait: Option<String>,
    /// The default grace between SIGTERM and SIGKILL when a lock is lost (`anylock run`).
    pub grace: Option<String>,
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

    /// The backend URL, or the embedded default.
    pub fn backend_url(&self) -> BackendUrl {
        BackendUrl::new(self.backend.as_deref().unwrap_or(crate::DEFAULT_URL))
    }
}

impl fmt::Debug for Config {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Config")
            .field("backend", &self.backend.as_deref().map(crate::redact))
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
        assert_eq!(config.ttl.as_deref(), Some("30s"));
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
    fn no_backend_means_the_embedded_default() {
        assert_eq!(Config::default().backend_url().expose(), "local:");
    }
}
