//! How requests authenticate: not at all (emulators), with a bearer token given as is, with
//! a token printed by a command (renewed), with workload identity federation (an
//! `external_account` file; renewed), or with Google credentials through the `gcp_auth`
//! crate, which caches and renews tokens.

use std::fmt;
use std::path::PathBuf;
#[cfg(feature = "auth")]
use std::sync::Arc;
use std::time::Duration;

use lockcore::{Error, ErrorKind, Result};

#[cfg(feature = "auth")]
use crate::error::{chain, no_credentials};
use crate::renew::{Renewing, Source};
#[cfg(feature = "auth")]
use crate::token::STORAGE_SCOPE;

/// How the backend authenticates to GCS. `Debug` never shows a token.
#[derive(Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum GcsAuth {
    /// No `Authorization` header: emulators and test servers.
    None,
    /// `Authorization: Bearer <token>` with this token as given (for example from
    /// `gcloud auth print-access-token`). Never renewed: it stops working when it expires.
    AccessToken(String),
    /// Google's credential chain, tried in order: the service-account key file named by
    /// `GOOGLE_APPLICATION_CREDENTIALS`, gcloud's application-default credentials
    /// (`gcloud auth application-default login`), the metadata server (on Google Cloud),
    /// and the `gcloud` CLI on `PATH`. Tokens are cached and renewed before they expire.
    Google,
    /// A credentials file, read when the backend is built; its `type` decides: a
    /// service-account key (`service_account`) or a workload identity federation
    /// configuration (`external_account`, as `google-github-actions/auth` writes it). The
    /// same detection applies to `GOOGLE_APPLICATION_CREDENTIALS` under
    /// [`Google`](Self::Google). Tokens are cached and renewed.
    ServiceAccountKey(PathBuf),
    /// `sh -c COMMAND` prints the token (or JSON `{"access_token","expires_in"}`); it runs
    /// again before the token is due (every 5 minutes for a plain token) and after GCS
    /// answered 401. `Debug` does not show the command.
    TokenCommand(String),
}

impl fmt::Debug for GcsAuth {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::None => f.write_str("None"),
            Self::AccessToken(_) => f.write_str("AccessToken(***)"),
            Self::Google => f.write_str("Google"),
            Self::ServiceAccountKey(path) => {
                f.debug_tuple("ServiceAccountKey").field(path).finish()
            }
            Self::TokenCommand(_) => f.write_str("TokenCommand(***)"),
        }
    }
}

/// Produces the bearer token for each request.
pub(crate) struct Authorizer {
    auth: GcsAuth,
    #[cfg_attr(not(feature = "auth"), allow(dead_code))]
    timeout: Duration,
    #[cfg(feature = "auth")]
    provider: tokio::sync::OnceCell<Arc<dyn gcp_auth::TokenProvider>>,
    /// Tokens this crate renews itself: a token command or an `external_account` file.
    renewing: Option<Renewing>,
}

impl Authorizer {
    /// Reads a credentials file at once (the one given, or the one
    /// `GOOGLE_APPLICATION_CREDENTIALS` names), so a missing or malformed file fails at
    /// construction.
    ///
    /// # Errors
    /// [`ErrorKind::Config`] for an unreadable or malformed credentials file (naming the
    /// field, never a value), an unsupported credential `type`, or Google auth in a build
    /// without the `auth` feature.
    pub(crate) fn new(auth: GcsAuth, timeout: Duration) -> Result<Self> {
        let mut authorizer = Self {
            auth,
            timeout,
            #[cfg(feature = "auth")]
            provider: tokio::sync::OnceCell::new(),
            renewing: None,
        };
        let source = match &authorizer.auth {
            GcsAuth::TokenCommand(command) => Some(Source::Command(command.clone())),
            _ => authorizer.load_key_file()?,
        };
        if let Some(source) = source {
            let builder = reqwest::Client::builder().redirect(reqwest::redirect::Policy::none());
            let http = crate::http::http_client(builder, timeout)?;
            authorizer.renewing = Some(Renewing::new(source, http, timeout));
        }
        Ok(authorizer)
    }

    /// Whether a refused token can be replaced by another (so a 401 is worth one resend).
    pub(crate) fn renews(&self) -> bool {
        self.renewing.is_some()
    }

    /// Drops `token` from the cache after GCS refused it.
    pub(crate) async fn forget(&self, token: &str) {
        if let Some(renewing) = &self.renewing {
            renewing.forget(token).await;
        }
    }

    /// The token to send, or `None` without auth.
    ///
    /// # Errors
    /// [`ErrorKind::Config`] when no credentials can be found (permanent);
    /// [`ErrorKind::Unavailable`] when the token endpoint fails or does not answer within
    /// the request timeout (temporary: no write was sent).
    pub(crate) async fn bearer(&self) -> Result<Option<String>> {
        if let Some(renewing) = &self.renewing {
            return renewing.token().await.map(Some);
        }
        match &self.auth {
            GcsAuth::None => Ok(None),
            GcsAuth::AccessToken(token) => Ok(Some(token.clone())),
            GcsAuth::Google | GcsAuth::ServiceAccountKey(_) | GcsAuth::TokenCommand(_) => {
                self.fetch().await.map(Some)
            }
        }
    }

    /// Reads the credentials file and decides by its `type`: a service-account key goes
    /// to gcp_auth, an `external_account` file becomes a source this crate renews.
    /// Under [`GcsAuth::Google`] an unreadable `GOOGLE_APPLICATION_CREDENTIALS` file is
    /// left to gcp_auth's chain, which reports it.
    #[cfg(feature = "auth")]
    fn load_key_file(&self) -> Result<Option<Source>> {
        let (path, given) = match &self.auth {
            GcsAuth::ServiceAccountKey(path) => (path.clone(), true),
            GcsAuth::Google => match std::env::var_os("GOOGLE_APPLICATION_CREDENTIALS") {
                Some(path) if !path.is_empty() => (PathBuf::from(path), false),
                _ => return Ok(None),
            },
            _ => return Ok(None),
        };
        let file = match read_credentials(&path) {
            Ok(file) => file,
            Err(_) if !given => return Ok(None),
            Err(e) => return Err(e),
        };
        match file.get("type").and_then(serde_json::Value::as_str) {
            Some("external_account") => {
                crate::external_account::ExternalAccount::parse(&path, &file)
                    .map(|account| Some(Source::External(Box::new(account))))
            }
            Some("service_account") if given => self.load_service_account(&path).map(|()| None),
            Some("service_account") => Ok(None),
            other => Err(Error::new(
                ErrorKind::Config,
                format!(
                    "the credentials file {}: field type is {:?}; supported: service_account \
                     (a key), external_account (workload identity federation)",
                    path.display(),
                    crate::error::shorten(other.unwrap_or("missing"), 40)
                ),
            )),
        }
    }

    #[cfg(feature = "auth")]
    fn load_service_account(&self, path: &std::path::Path) -> Result<()> {
        let account = gcp_auth::CustomServiceAccount::from_file(path).map_err(|e| {
            Error::new(
                ErrorKind::Config,
                format!(
                    "cannot use the service-account key {}: {}",
                    path.display(),
                    chain(&e)
                ),
            )
        })?;
        let provider: Arc<dyn gcp_auth::TokenProvider> = Arc::new(account);
        let _ = self.provider.set(provider);
        Ok(())
    }

    #[cfg(not(feature = "auth"))]
    fn load_key_file(&self) -> Result<Option<Source>> {
        match self.auth {
            GcsAuth::None | GcsAuth::AccessToken(_) | GcsAuth::TokenCommand(_) => Ok(None),
            _ => Err(no_auth_feature()),
        }
    }

    #[cfg(feature = "auth")]
    async fn fetch(&self) -> Result<String> {
        let work = async {
            let provider = self
                .provider
                .get_or_try_init(|| async { gcp_auth::provider().await.map_err(no_credentials) })
                .await?;
            provider
                .token(&[STORAGE_SCOPE])
                .await
                .map(|token| token.as_str().to_owned())
                .map_err(|e| {
                    Error::unavailable(format!(
                        "could not get a Google access token: {}",
                        chain(&e)
                    ))
                })
        };
        match tokio::time::timeout(self.timeout, work).await {
            Ok(result) => result,
            Err(_) => Err(Error::unavailable(format!(
                "getting a Google access token took longer than {:?}",
                self.timeout
            ))),
        }
    }

    /// Unreachable in practice (`new` refuses Google modes without the feature), but never
    /// a token either.
    #[cfg(not(feature = "auth"))]
    async fn fetch(&self) -> Result<String> {
        Err(no_auth_feature())
    }
}

/// A credentials file as a JSON object.
#[cfg(feature = "auth")]
fn read_credentials(path: &std::path::Path) -> Result<serde_json::Map<String, serde_json::Value>> {
    let config = |why: String| {
        Error::new(
            ErrorKind::Config,
            format!("cannot use the credentials file {}: {why}", path.display()),
        )
    };
    let bytes = crate::body::read_small_file(path).map_err(|e| config(e.to_string()))?;
    match serde_json::from_slice(&bytes) {
        Ok(serde_json::Value::Object(file)) => Ok(file),
        // serde_json's message names a line and column, never the text.
        Ok(_) => Err(config("it is not a JSON object".to_owned())),
        Err(e) => Err(config(format!("it is not JSON ({e})"))),
    }
}

#[cfg(not(feature = "auth"))]
fn no_auth_feature() -> Error {
    Error::new(
        ErrorKind::Config,
        "Google credentials need backend-gcs's `auth` feature; this build has only emulators \
         and GCS_ACCESS_TOKEN",
    )
}

impl fmt::Debug for Authorizer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Authorizer")
            .field("auth", &self.auth)
            .finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn debug_hides_tokens() {
        let auth = GcsAuth::AccessToken("ya29.s3cr3t".into());
        assert!(!format!("{auth:?}").contains("s3cr3t"));
        let authorizer = Authorizer::new(auth, Duration::from_secs(1)).expect("no file");
        assert!(!format!("{authorizer:?}").contains("s3cr3t"));
    }

    #[cfg(feature = "auth")]
    #[test]
    fn a_missing_key_file_is_a_config_error_naming_it() {
        let path = PathBuf::from("/nonexistent/anylock-key.json");
        let err = Authorizer::new(GcsAuth::ServiceAccountKey(path), Duration::from_secs(1))
            .expect_err("no such file");
        assert_eq!(err.kind(), ErrorKind::Config);
        assert!(
            err.to_string().contains("/nonexistent/anylock-key.json"),
            "{err}"
        );
    }

    /// A FIFO would hang the start and `/dev/zero` fill memory: both are refused at once,
    /// as is a file over the limit.
    #[cfg(all(feature = "auth", unix))]
    #[test]
    fn a_credentials_file_that_is_no_small_regular_file_is_refused() {
        let dir = std::env::temp_dir().join(format!("anylock-gcs-creds-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("dir");
        let fifo = dir.join("fifo.json");
        let _ = std::fs::remove_file(&fifo);
        let made = std::process::Command::new("mkfifo").arg(&fifo).status();
        assert!(made.expect("mkfifo").success());
        let big = dir.join("big.json");
        std::fs::File::create(&big)
            .and_then(|f| f.set_len(crate::body::MAX_CREDENTIALS_FILE + 1))
            .expect("sparse file");
        for (path, why) in [
            (fifo.clone(), "not a regular file"),
            (PathBuf::from("/dev/zero"), "not a regular file"),
            (big.clone(), "more than the 1048576"),
        ] {
            let auth = GcsAuth::ServiceAccountKey(path.clone());
            let err = Authorizer::new(auth, Duration::from_secs(1)).expect_err("refused");
            assert_eq!(err.kind(), ErrorKind::Config);
            assert!(err.to_string().contains(why), "{path:?}: {err}");
        }
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[tokio::test]
    async fn no_auth_sends_no_header_and_a_given_token_is_sent_as_is() {
        let none = Authorizer::new(GcsAuth::None, Duration::from_secs(1)).expect("ok");
        assert_eq!(none.bearer().await.expect("ok"), None);
        let given = Authorizer::new(GcsAuth::AccessToken("t".into()), Duration::from_secs(1));
        assert_eq!(
            given.expect("ok").bearer().await.expect("ok"),
            Some("t".into())
        );
    }
}
