//! How requests authenticate: not at all (emulators), with a bearer token given as is, or
//! with Google credentials through the `gcp_auth` crate, which caches and renews tokens.

use std::fmt;
use std::path::PathBuf;
#[cfg(feature = "auth")]
use std::sync::Arc;
use std::time::Duration;

use lockcore::{Error, ErrorKind, Result};

/// The OAuth2 scope the lock needs: read and write objects.
pub const STORAGE_SCOPE: &str = "https://www.googleapis.com/auth/devstorage.read_write";

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
    /// A service-account JSON key file. Its tokens are cached and renewed.
    ServiceAccountKey(PathBuf),
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
}

impl Authorizer {
    /// Reads a key file at once, so a missing or malformed key fails at construction.
    ///
    /// # Errors
    /// [`ErrorKind::Config`] for an unreadable key file, or Google auth in a build without
    /// the `auth` feature.
    pub(crate) fn new(auth: GcsAuth, timeout: Duration) -> Result<Self> {
        let authorizer = Self {
            auth,
            timeout,
            #[cfg(feature = "auth")]
            provider: tokio::sync::OnceCell::new(),
        };
        authorizer.load_key_file()?;
        Ok(authorizer)
    }

    /// The token to send, or `None` without auth.
    ///
    /// # Errors
    /// [`ErrorKind::Config`] when no credentials can be found (permanent);
    /// [`ErrorKind::Unavailable`] when the token endpoint fails or does not answer within
    /// the request timeout (temporary: no write was sent).
    pub(crate) async fn bearer(&self) -> Result<Option<String>> {
        match &self.auth {
            GcsAuth::None => Ok(None),
            GcsAuth::AccessToken(token) => Ok(Some(token.clone())),
            GcsAuth::Google | GcsAuth::ServiceAccountKey(_) => self.fetch().await.map(Some),
        }
    }

    #[cfg(feature = "auth")]
    fn load_key_file(&self) -> Result<()> {
        let GcsAuth::ServiceAccountKey(path) = &self.auth else {
            return Ok(());
        };
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
    fn load_key_file(&self) -> Result<()> {
        match self.auth {
            GcsAuth::None | GcsAuth::AccessToken(_) => Ok(()),
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

#[cfg(not(feature = "auth"))]
fn no_auth_feature() -> Error {
    Error::new(
        ErrorKind::Config,
        "Google credentials need backend-gcs's `auth` feature; this build has only emulators \
         and GCS_ACCESS_TOKEN",
    )
}

#[cfg(feature = "auth")]
fn no_credentials(e: gcp_auth::Error) -> Error {
    Error::new(
        ErrorKind::Config,
        format!(
            "no Google credentials found ({}). Set GOOGLE_APPLICATION_CREDENTIALS to a \
             service-account key file, run `gcloud auth application-default login`, run on \
             Google Cloud, or pass a token in GCS_ACCESS_TOKEN with ?auth=token; for an \
             emulator set STORAGE_EMULATOR_HOST or ?endpoint=",
            chain(&e)
        ),
    )
}

/// An error and its sources on one line. gcp_auth's messages name files and steps, never
/// key material or tokens.
#[cfg(feature = "auth")]
fn chain(error: &(dyn std::error::Error + 'static)) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
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
