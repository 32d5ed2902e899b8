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

const SECRET_PARAMS: &[&str] = &["password", "pass", "token", "secret", "key", "sslpassword"];

/// Replaces the password of every `user:password@host` (also in comma-separated host
/// lists) and the value of secret-looking query parameters with `***`.
pub fn redact(url: &str) -> String {
    let (scheme, rest) = match url.split_once("://") {
        Some((scheme, rest)) => (Some(scheme), rest),
        None => (None, url),
    };
    let end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
    let (authority, tail) = rest.split_at(end);
    let authority: Vec<String> = authority.split(',').map(redact_userinfo).collect();
    let (path, query) = match tail.split_once('?') {
        Some((path, query)) => (path, Some(query)),
        None => (tail, None),
    };
    let mut out = String::new();
    if let Some(scheme) = scheme {
        out.push_str(scheme);
        out.push_str("://");
    }
    out.push_str(&authority.join(","));
    out.push_str(path);
    if let Some(query) = query {
        out.push('?');
        out.push_str(&redact_query(query));
    }
    out
}

fn redact_userinfo(host: &str) -> String {
    match host.rsplit_once('@') {
        Some((userinfo, host)) => match userinfo.split_once(':') {
            Some((user, _)) => format!("{user}:***@{host}"),
            None => format!("{userinfo}@{host}"),
        },
        None => host.to_owned(),
    }
}

fn redact_query(query: &str) -> String {
    let pairs: Vec<String> = query
        .split('&')
        .map(|pair| match pair.split_once('=') {
            Some((key, _)) if SECRET_PARAMS.contains(&key.to_ascii_lowercase().as_str()) => {
                format!("{key}=***")
            }
            _ => pair.to_owned(),
        })
        .collect();
    pairs.join("&")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hides_passwords_in_every_host_and_secret_params() {
        let cases = [
            (
                "redis://:hunter2@127.0.0.1:6379/0",
                "redis://:***@127.0.0.1:6379/0",
            ),
            (
                "postgres://app:s3cr3t@db:5432/locks?sslmode=require",
                "postgres://app:***@db:5432/locks?sslmode=require",
            ),
            (
                "etcd://u:pw1@h1:2379,u:pw2@h2:2379/pfx",
                "etcd://u:***@h1:2379,u:***@h2:2379/pfx",
            ),
            (
                "postgres://db/x?password=p&application_name=a",
                "postgres://db/x?password=***&application_name=a",
            ),
            ("redis://user@host", "redis://user@host"),
            ("local:/tmp/x.db", "local:/tmp/x.db"),
            ("gs://bucket/prefix", "gs://bucket/prefix"),
        ];
        for (input, expected) in cases {
            assert_eq!(redact(input), expected, "{input}");
        }
    }

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
