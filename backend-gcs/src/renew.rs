//! Tokens this crate obtains and renews itself (workload identity federation, a token
//! command): one cached token, renewed before it expires and after GCS refused it.

use std::time::{Duration, Instant};

use lockcore::Result;
use tokio::sync::Mutex;

/// The most a token is renewed ahead of its expiry: a quarter of its life, at most this.
const MAX_RENEW_MARGIN: Duration = Duration::from_secs(300);
/// The longest life a token is trusted for, whatever its issuer says (Google's access
/// tokens live at most 12 hours).
const MAX_TOKEN_LIFE: Duration = Duration::from_secs(12 * 3600);

/// A token and how long it lives, counted from when its request was sent.
pub(crate) struct Fresh {
    pub(crate) token: String,
    pub(crate) life: Duration,
}

/// Where a renewable token comes from.
pub(crate) enum Source {
    /// An `external_account` credential file (workload identity federation).
    #[cfg(feature = "auth")]
    External(Box<crate::external_account::ExternalAccount>),
    /// `sh -c COMMAND`, whose stdout is the token.
    Command(String),
}

impl Source {
    /// A fresh token within `timeout` (a command that overruns is killed, with what it
    /// started).
    async fn fetch(&self, http: &reqwest::Client, timeout: Duration) -> Result<Fresh> {
        match self {
            #[cfg(feature = "auth")]
            Self::External(account) => tokio::time::timeout(timeout, account.fetch(http))
                .await
                .map_err(|_| {
                    lockcore::Error::unavailable(format!(
                        "getting a workload identity federation token took longer than \
                         {timeout:?}"
                    ))
                })?,
            Self::Command(command) => {
                let _ = http;
                crate::token_command::run(command, timeout).await
            }
        }
    }
}

struct Cached {
    token: String,
    renew_at: Instant,
}

/// One renewable token, fetched by one caller at a time (the others wait for it).
pub(crate) struct Renewing {
    source: Source,
    http: reqwest::Client,
    timeout: Duration,
    cached: Mutex<Option<Cached>>,
}

impl Renewing {
    pub(crate) fn new(source: Source, http: reqwest::Client, timeout: Duration) -> Self {
        Self {
            source,
            http,
            timeout,
            cached: Mutex::new(None),
        }
    }

    /// The cached token, or a fresh one when it is due for renewal.
    ///
    /// # Errors
    /// The source's errors; [`Unavailable`](lockcore::ErrorKind::Unavailable) when getting
    /// a token takes longer than the request timeout.
    ///
    /// # Cancel safety
    /// Cancelling leaves the cache as it was (a command being run is killed).
    pub(crate) async fn token(&self) -> Result<String> {
        let mut cached = self.cached.lock().await;
        if let Some(c) = cached.as_ref().filter(|c| Instant::now() < c.renew_at) {
            return Ok(c.token.clone());
        }
        let sent = Instant::now();
        let fresh = self.source.fetch(&self.http, self.timeout).await?;
        // A token's claimed life is the issuer's word: capped, so a huge `expires_in`
        // cannot overflow the instant (or keep a token past any sane lifetime).
        let life = fresh.life.min(MAX_TOKEN_LIFE);
        let margin = (life / 4).min(MAX_RENEW_MARGIN);
        *cached = Some(Cached {
            token: fresh.token.clone(),
            renew_at: sent + life.saturating_sub(margin),
        });
        Ok(fresh.token)
    }

    /// Forgets `token` if it is still the cached one (GCS refused it), so the next call
    /// fetches another.
    pub(crate) async fn forget(&self, token: &str) {
        let mut cached = self.cached.lock().await;
        if cached.as_ref().is_some_and(|c| c.token == token) {
            *cached = None;
        }
    }
}

/// `text` with every occurrence of each secret replaced by `***`.
#[cfg_attr(not(feature = "auth"), allow(dead_code))]
pub(crate) fn scrub(text: &str, secrets: &[&str]) -> String {
    secrets
        .iter()
        .filter(|s| s.len() >= 4)
        .fold(text.to_owned(), |text, secret| text.replace(secret, "***"))
}

/// At most `max` bytes of `text`, cut at a character boundary, `…` marking a cut.
pub(crate) fn shorten(text: &str, max: usize) -> String {
    if text.len() <= max {
        return text.to_owned();
    }
    let mut end = max;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}…", &text[..end])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scrub_and_shorten() {
        assert_eq!(scrub("a s3cret b", &["s3cret", ""]), "a *** b");
        assert_eq!(shorten("héllo", 2), "h…");
        assert_eq!(shorten("ok", 5), "ok");
    }
}
