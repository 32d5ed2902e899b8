//! Tokens this crate obtains and renews itself (workload identity federation, a token
//! command): one cached token, renewed before it expires and after GCS refused it.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, PoisonError};
use std::time::{Duration, Instant};

use lockcore::Result;
use tokio::sync::{Mutex, watch};

use crate::token::Fresh;

/// The most a token is renewed ahead of its expiry: a quarter of its life, at most this.
const MAX_RENEW_MARGIN: Duration = Duration::from_secs(300);
/// The longest life a token is trusted for, whatever its issuer says (Google's access
/// tokens live at most 12 hours).
const MAX_TOKEN_LIFE: Duration = Duration::from_secs(12 * 3600);

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
    /// From here on the token is renewed in the background while it is still used.
    renew_at: Instant,
    /// From here on it is not used.
    expires_at: Instant,
}

/// One renewable token. Renewal starts a quarter of the token's life (at most 5 min)
/// before it expires, in a task of its own, while callers go on with the still-valid
/// token: a slow source (gcloud, a vault CLI, a slow STS) never delays a lease refresh,
/// whose budget is only TTL/8. Only a missing or expired token is waited for, and even
/// then the fetch runs in its own task, so a caller that gives up (a refresh past its
/// budget) does not kill it: its token serves the next call.
pub(crate) struct Renewing {
    inner: Arc<Inner>,
}

struct Inner {
    source: Source,
    http: reqwest::Client,
    timeout: Duration,
    cached: Mutex<Option<Cached>>,
    /// A background renewal is running.
    renewing: AtomicBool,
    /// The fetch that callers without a usable token wait for, while it runs: operations
    /// that need a token at the same time (a new backend's first calls, a batch's
    /// refreshes after a 401) share it instead of each starting their own, and a caller
    /// that gives up leaves it running for the others.
    pending: std::sync::Mutex<Option<watch::Receiver<Option<Fetched>>>>,
}

/// How a waited-for fetch ended: the token, or the error's kind, retry status and message
/// (an `Error` is not `Clone`), handed to every caller that waited for it.
type Fetched = std::result::Result<String, Failure>;

/// A failed fetch, as every caller that waited for it gets it.
#[derive(Clone)]
struct Failure {
    kind: lockcore::ErrorKind,
    status: lockcore::RetryStatus,
    message: String,
}

impl Renewing {
    pub(crate) fn new(source: Source, http: reqwest::Client, timeout: Duration) -> Self {
        Self {
            inner: Arc::new(Inner {
                source,
                http,
                timeout,
                cached: Mutex::new(None),
                renewing: AtomicBool::new(false),
                pending: std::sync::Mutex::new(None),
            }),
        }
    }

    /// The cached token (renewed in the background once due), or a fresh one when there
    /// is none or it expired. Callers that need a fresh one at the same time share one
    /// fetch.
    ///
    /// # Errors
    /// The source's errors; [`Unavailable`](lockcore::ErrorKind::Unavailable) when getting
    /// a token takes longer than the request timeout. Every caller that waited for a fetch
    /// gets its error (rebuilt: the kind, retry status and message).
    ///
    /// # Cancel safety
    /// Cancelling leaves the fetch running in its task; the callers still waiting get its
    /// outcome, and its token is cached for the next call.
    pub(crate) async fn token(&self) -> Result<String> {
        if let Some(token) = self.usable().await {
            return Ok(token);
        }
        let mut outcome = self.join_or_start();
        // The fetch bounds itself by the request timeout, on the runtime that started it;
        // a waiter on another runtime does not wait past that (plus a second) if that
        // runtime stalls.
        let bound = self.inner.timeout + Duration::from_secs(1);
        let fetched = match tokio::time::timeout(bound, outcome.wait_for(Option::is_some)).await {
            Ok(Ok(fetched)) => fetched.clone(),
            Ok(Err(_)) => None,
            Err(_) => {
                return Err(lockcore::Error::unavailable(format!(
                    "getting a token took longer than {bound:?}"
                )));
            }
        };
        match fetched {
            Some(Ok(token)) => Ok(token),
            Some(Err(failure)) => {
                Err(lockcore::Error::new(failure.kind, failure.message).with_status(failure.status))
            }
            None => Err(lockcore::Error::unavailable(
                "the token fetch ended without a result",
            )),
        }
    }

    /// The running fetch's outcome, or a fetch started now in a task of its own.
    fn join_or_start(&self) -> watch::Receiver<Option<Fetched>> {
        let mut pending = self
            .inner
            .pending
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        // A fetch whose task ended without an outcome (it panicked, or its runtime shut
        // down) is not joined: a new one starts.
        if let Some(outcome) = pending.as_ref()
            && outcome.has_changed().is_ok()
        {
            return outcome.clone();
        }
        let (done, outcome) = watch::channel(None);
        *pending = Some(outcome.clone());
        let inner = Arc::clone(&self.inner);
        tokio::spawn(async move {
            let fetched = inner.renew().await.map_err(|e| Failure {
                kind: e.kind(),
                status: e.status(),
                message: e.message().to_owned(),
            });
            // The ones waiting (and any that join before the slot is cleared) get this
            // outcome; callers from then on find the token cached (or start a new fetch
            // after a failure).
            let _ = done.send(Some(fetched));
            *inner.pending.lock().unwrap_or_else(PoisonError::into_inner) = None;
        });
        outcome
    }

    /// The cached token while it has not expired (starting its renewal in the background
    /// once due).
    async fn usable(&self) -> Option<String> {
        let now = Instant::now();
        let cached = self.inner.cached.lock().await;
        let c = cached.as_ref()?;
        if now < c.renew_at {
            return Some(c.token.clone());
        }
        if now < c.expires_at {
            self.renew_in_background();
            return Some(c.token.clone());
        }
        None
    }

    fn renew_in_background(&self) {
        if self.inner.renewing.swap(true, Ordering::AcqRel) {
            return;
        }
        /// Clears the flag however the renewal ends (a panic, or its runtime shutting
        /// down, included), so background renewal is never switched off for good.
        struct Renewed(Arc<Inner>);
        impl Drop for Renewed {
            fn drop(&mut self) {
                self.0.renewing.store(false, Ordering::Release);
            }
        }
        let inner = Renewed(Arc::clone(&self.inner));
        tokio::spawn(async move {
            // A failure leaves the still-valid token serving; the next call past the
            // renewal point tries again, and an expired token is waited for (and its
            // error reported) by the caller.
            let _ = inner.0.renew().await;
        });
    }

    /// Forgets `token` if it is still the cached one (GCS refused it), so the next call
    /// fetches another.
    pub(crate) async fn forget(&self, token: &str) {
        let mut cached = self.inner.cached.lock().await;
        if cached.as_ref().is_some_and(|c| c.token == token) {
            *cached = None;
        }
    }
}

impl Inner {
    async fn renew(&self) -> Result<String> {
        let sent = Instant::now();
        let fresh = self.source.fetch(&self.http, self.timeout).await?;
        // A token's claimed life is the issuer's word: capped, so a huge `expires_in`
        // cannot overflow the instant (or keep a token past any sane lifetime).
        let life = fresh.life.min(MAX_TOKEN_LIFE);
        let margin = (life / 4).min(MAX_RENEW_MARGIN);
        *self.cached.lock().await = Some(Cached {
            token: fresh.token.clone(),
            renew_at: sent + life.saturating_sub(margin),
            expires_at: sent + life,
        });
        Ok(fresh.token)
    }
}

#[cfg(test)]
#[path = "renew_tests.rs"]
mod renew_tests;
