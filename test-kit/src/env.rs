//! Finding the real servers started by `scripts/servers`.
//!
//! A backend's tests call [`require`] for each setting they need. In CI (`CI=true`) a
//! missing setting is a test failure with a message saying how to fix it; on a developer
//! machine the test prints one clear line and skips, so `cargo test` works without servers.

/// The value of `var`, set by `scripts/servers start` (source `.servers/env`).
///
/// # Panics
/// When `var` is unset and `CI` is `true` (or `ANYLOCK_REQUIRE_SERVERS=1`): a backend
/// whose server is missing must fail loudly in CI, never skip silently.
pub fn require(var: &str, what: &str) -> Option<String> {
    match std::env::var(var) {
        Ok(value) if !value.trim().is_empty() => Some(value),
        _ if servers_required() => panic!(
            "{var} is not set, so the {what} tests cannot reach a server: run \
             `scripts/servers start` and source `.servers/env` (CI runs `scripts/test`, \
             which does both)"
        ),
        _ => {
            eprintln!("SKIPPED: {var} is not set; no {what} server (run scripts/servers start)");
            None
        }
    }
}

/// Whether a missing server is a failure: in CI, or when asked explicitly.
pub fn servers_required() -> bool {
    let set = |var: &str| {
        std::env::var(var).is_ok_and(|v| matches!(v.as_str(), "1" | "true" | "TRUE" | "yes"))
    };
    set("CI") || set("ANYLOCK_REQUIRE_SERVERS")
}

/// `host:port` of a URL like `redis://user:pass@127.0.0.1:27101/0` or
/// `http://127.0.0.1:27379`.
pub fn host_port(url: &str) -> Option<&str> {
    let rest = url.split_once("://").map_or(url, |(_, rest)| rest);
    let authority = rest.split(['/', '?']).next()?;
    let host_port = authority.rsplit_once('@').map_or(authority, |(_, hp)| hp);
    (!host_port.is_empty()).then_some(host_port)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn host_port_strips_scheme_credentials_and_path() {
        assert_eq!(
            host_port("redis://127.0.0.1:27101/0"),
            Some("127.0.0.1:27101")
        );
        assert_eq!(host_port("postgres://u:p@h:5/db?x=1"), Some("h:5"));
        assert_eq!(host_port("http://127.0.0.1:27379"), Some("127.0.0.1:27379"));
        assert_eq!(host_port("h:1"), Some("h:1"));
        assert_eq!(host_port("redis:///0"), None);
    }
}
