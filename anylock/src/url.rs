//! Backend URLs: scheme lookup and secret redaction.

use std::fmt;

/// A backend URL whose `Display` and `Debug` never show a password or token.
#[derive(Clone, PartialEq, Eq)]
pub struct BackendUrl(String);

impl BackendUrl {
    /// Wraps `url` (not validated here; [`connect`](crate::connect) does that).
    pub fn new(url: impl Into<String>) -> Self {
        Self(url.into().trim().to_owned())
    }

    /// The scheme, lowercased: the part before the first `:`.
    pub fn scheme(&self) -> String {
        self.0
            .split_once(':')
            .map_or_else(String::new, |(scheme, _)| scheme.to_ascii_lowercase())
    }

    /// The full URL, secrets included. Never log or print this.
    pub fn expose(&self) -> &str {
        &self.0
    }

    /// The URL with passwords and secret query values replaced by `***`.
    pub fn redacted(&self) -> String {
        redact(&self.0)
    }
}

impl fmt::Display for BackendUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.redacted())
    }
}

impl fmt::Debug for BackendUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "BackendUrl({:?})", self.redacted())
    }
}

pub use lockcore::url::redact;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn display_and_debug_are_redacted() {
        let url = BackendUrl::new("redis://:hunter2@h:1");
        assert!(!url.to_string().contains("hunter2"));
        assert!(!format!("{url:?}").contains("hunter2"));
        assert!(url.expose().contains("hunter2"));
        assert_eq!(url.scheme(), "redis");
        assert_eq!(BackendUrl::new("LOCAL:").scheme(), "local");
    }
}
