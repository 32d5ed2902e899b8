//! The one way this crate builds an HTTP client, and the rule for where credentials may
//! travel in clear.

use std::time::Duration;

use lockcore::Result;

/// `builder` with every request and connect bounded by `timeout`: the one way this crate
/// builds an HTTP client (storage calls, and token sources with redirects off).
pub(crate) fn http_client(
    builder: reqwest::ClientBuilder,
    timeout: Duration,
) -> Result<reqwest::Client> {
    builder
        .timeout(timeout)
        .connect_timeout(timeout)
        .build()
        .map_err(|e| crate::error::http_client(&e))
}

/// Whether `url` names this machine (`localhost`, 127.0.0.0/8, ::1): the only place
/// credentials may travel over plain http.
pub(crate) fn is_loopback(url: &url::Url) -> bool {
    match url.host() {
        Some(url::Host::Domain(host)) => host == "localhost",
        Some(url::Host::Ipv4(ip)) => ip.is_loopback(),
        Some(url::Host::Ipv6(ip)) => ip.is_loopback(),
        None => false,
    }
}
