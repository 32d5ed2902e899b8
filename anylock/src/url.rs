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

/// Parameters whose value is a file's path: [`redact`] hides them out of caution (`key=`
/// names a private key file), but the path is no secret; the file's own permissions
/// protect what it holds.
const PATH_PARAMS: &[&str] = &["key", "sslkey", "ssl-key"];

/// Whether `url` holds a secret that must not be shown to other users: a password, or the
/// value of any parameter [`redact`] hides except a key file's path (`key`, `sslkey`,
/// `ssl-key`). The CLI refuses such a URL on its command line, and
/// [`Config::load`](crate::Config::load) in a file that group or others can read.
///
/// ```
/// assert!(anylock::holds_secret("redis://:hunter2@h:6379/0"));
/// assert!(anylock::holds_secret("postgres://db/x?pasword=hunter2&sslkey=/k.pem"));
/// assert!(!anylock::holds_secret("etcds://h/p?ca=/ca.pem&cert=/c.pem&key=/k.pem"));
/// assert!(!anylock::holds_secret("redis://user@h:6379/0"));
/// ```
pub fn holds_secret(url: &str) -> bool {
    redact(url) != mask_path_params(url)
}

/// `url` with the values of [`PATH_PARAMS`] replaced by `***`, scanned as [`redact`]
/// scans parameters, so the two agree when nothing else is secret.
fn mask_path_params(url: &str) -> String {
    let mut out = String::with_capacity(url.len());
    let mut done = 0;
    let mut search = 0;
    while let Some(found) = url[search..].find(['?', '&']) {
        let start = search + found + 1;
        search = start;
        let param = &url[start..];
        let Some(eq) = param.find('=') else { continue };
        if !lockcore::is_secret_param(&param[..eq]) {
            continue;
        }
        // Past a secret parameter's value, as `redact` continues.
        let end = param.find('&').map_or(url.len(), |amp| start + amp);
        if PATH_PARAMS.contains(&param[..eq].to_ascii_lowercase().as_str()) {
            out.push_str(&url[done..=start + eq]);
            out.push_str("***");
            done = end;
        }
        search = end;
    }
    out.push_str(&url[done..]);
    out
}

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

    #[test]
    fn a_key_files_path_is_no_secret_but_everything_else_redacted_is() {
        for url in [
            "redis://:hunter2@h/0",
            "rediss://u:pw@h/0?key=/k.pem",
            "postgres://db/x?key=/k.pem&password=pw",
            "postgres://db/x?ke%79=/k.pem",
            "gs://b/?access_token=t",
        ] {
            assert!(holds_secret(url), "{url}");
        }
        for url in [
            "etcds://h/p?ca=/ca.pem&cert=/c.pem&key=/k.pem",
            "postgres://u@db/x?sslmode=verify-full&sslkey=/k.pem&SSL-KEY=/k2.pem",
            "rediss://h/0?key=/k.pem#insecure",
            "local:/tmp/x.sqlite3",
        ] {
            assert!(!holds_secret(url), "{url}");
        }
    }
}
