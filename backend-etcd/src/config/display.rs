//! How a config shows itself: as a URL that parses back to it (the password replaced by
//! `***`), and a `Debug` that hides the password.

use std::fmt;
use std::time::Duration;

use lockcore::url::percent_encode;

use super::{EtcdConfig, SCHEME, TLS_SCHEME};

impl EtcdConfig {
    /// The query parameters that differ from the defaults, as written in a URL.
    fn options_for_display(&self) -> Vec<String> {
        let mut options = Vec::new();
        let default = Self::new(["x"]).expect("a literal endpoint is valid");
        if self.request_timeout != default.request_timeout {
            options.push(format!("timeout={}", show_duration(self.request_timeout)));
        }
        if self.connect_timeout != default.connect_timeout {
            options.push(format!(
                "connect_timeout={}",
                show_duration(self.connect_timeout)
            ));
        }
        for (name, path) in self.tls_files.params() {
            options.push(format!("{name}={}", percent_encode(&path, "&?")));
        }
        options
    }
}

/// Shows the config as a URL with the password replaced by `***`; with the password put
/// back, it parses to the same config.
impl fmt::Display for EtcdConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let scheme = if self.tls { TLS_SCHEME } else { SCHEME };
        write!(f, "{scheme}://")?;
        if let Some(user) = &self.user {
            f.write_str(&percent_encode(user, "@:/?"))?;
            if self.password.as_deref().is_some_and(|p| !p.is_empty()) {
                f.write_str(":***")?;
            }
            f.write_str("@")?;
        }
        write!(
            f,
            "{}/{}",
            self.hosts.join(","),
            percent_encode(&self.prefix, "?")
        )?;
        let options = self.options_for_display();
        if !options.is_empty() {
            write!(f, "?{}", options.join("&"))?;
        }
        Ok(())
    }
}

impl fmt::Debug for EtcdConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("EtcdConfig")
            .field("endpoints", &self.endpoints())
            .field("prefix", &self.prefix)
            .field("user", &self.user)
            .field("password", &self.password.as_ref().map(|_| "***"))
            .field("tls", &self.tls)
            .field("tls_files", &self.tls_files)
            .field("request_timeout", &self.request_timeout)
            .field("connect_timeout", &self.connect_timeout)
            .finish()
    }
}

/// A duration as the URL's `timeout` parameters take it back (`5s`, `250ms`; see
/// [`Query::take_duration`](lockcore::url::Query::take_duration)). lockcore has a
/// reader of durations but no writer, so this one stays.
fn show_duration(d: Duration) -> String {
    if d.subsec_millis() == 0 {
        format!("{}s", d.as_secs())
    } else {
        format!("{}ms", d.as_millis())
    }
}
