//! [`GcsConfig`]: bucket, prefix, endpoint, auth and timeout, from a `gs://` URL.

use std::fmt;
use std::time::Duration;

use lockcore::url::Query;
use lockcore::{Error, LockName, Result};

use crate::auth::GcsAuth;

/// The public GCS JSON API endpoint.
pub const DEFAULT_ENDPOINT: &str = "https://storage.googleapis.com";
/// The per-request timeout (each HTTP call, not a whole acquire).
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(10);
/// The longest object name GCS accepts, in UTF-8 bytes.
pub const MAX_OBJECT_NAME_LEN: usize = 1024;
/// Environment variable naming an emulator endpoint; talked to without auth.
pub const EMULATOR_ENV: &str = "STORAGE_EMULATOR_HOST";
/// Environment variable holding an OAuth2 bearer token for real GCS.
pub const TOKEN_ENV: &str = "GCS_ACCESS_TOKEN";
/// Environment variable holding a shell command that prints a bearer token, run again to
/// renew it ([`GcsAuth::TokenCommand`]).
pub const TOKEN_COMMAND_ENV: &str = "GCS_TOKEN_COMMAND";
/// The URL parameters [`GcsConfig::from_url`] reads.
const KNOWN_PARAMS: &[&str] = &[
    "endpoint",
    "auth",
    "credentials",
    "timeout_ms",
    "max_requests",
];
/// The most operations (so requests) one backend has in flight at once, unless configured
/// otherwise ([`GcsConfig::with_max_requests`]).
pub const DEFAULT_MAX_REQUESTS: usize = 256;
/// The highest [`GcsConfig::with_max_requests`] accepts.
pub const MAX_MAX_REQUESTS: usize = 10_000;
/// The shortest refresh interval real GCS sustains: about one mutation per second per
/// object.
pub const MIN_REFRESH_INTERVAL: Duration = Duration::from_secs(1);

/// Where the lock objects live and how to reach them.
///
/// `Debug` and `Display` never show the access token.
#[derive(Clone, PartialEq, Eq)]
pub struct GcsConfig {
    endpoint: String,
    bucket: String,
    prefix: String,
    timeout: Duration,
    auth: GcsAuth,
    min_refresh: Duration,
    max_requests: usize,
}

impl GcsConfig {
    /// A configuration for `bucket` on real GCS with an empty prefix, reading
    /// [`EMULATOR_ENV`], [`TOKEN_COMMAND_ENV`] and [`TOKEN_ENV`] from the environment.
    /// Auth: none with an emulator, else the command in [`TOKEN_COMMAND_ENV`] when set (it
    /// renews, so it wins), else the token in [`TOKEN_ENV`] when set, else
    /// [`GcsAuth::Google`].
    ///
    /// # Errors
    /// [`InvalidInput`](lockcore::ErrorKind::InvalidInput) for a bad bucket name.
    pub fn new(bucket: impl Into<String>) -> Result<Self> {
        let bucket = bucket.into();
        validate_bucket(&bucket)?;
        let emulator = std::env::var(EMULATOR_ENV).ok().filter(|v| !v.is_empty());
        let token = std::env::var(TOKEN_ENV).ok().filter(|v| !v.is_empty());
        let command = token_command();
        let auth = match (command, token) {
            (Some(command), _) => GcsAuth::TokenCommand(command),
            (None, Some(token)) => GcsAuth::AccessToken(token),
            (None, None) => GcsAuth::Google,
        };
        let config = Self {
            endpoint: DEFAULT_ENDPOINT.to_owned(),
            bucket,
            prefix: String::new(),
            timeout: DEFAULT_TIMEOUT,
            auth,
            min_refresh: MIN_REFRESH_INTERVAL,
            max_requests: DEFAULT_MAX_REQUESTS,
        };
        match emulator {
            Some(host) => config.with_endpoint(&host),
            None => Ok(config),
        }
    }

    /// Parses
    /// `gs://bucket/prefix[?endpoint=URL&auth=MODE&credentials=PATH&timeout_ms=N&max_requests=N]`.
    ///
    /// The object of lock `name` is `prefix + name` (`gs://b/locks/` gives `locks/NAME`).
    /// An `endpoint` parameter (or [`EMULATOR_ENV`]) points at an emulator, without auth.
    /// `auth` overrides the auth mode: `none`, `google` (the credential chain), `token`
    /// (the token in [`TOKEN_ENV`]) or `command` (the command in [`TOKEN_COMMAND_ENV`]: a
    /// command never goes in the URL, which is shown in logs); `credentials=PATH` uses a
    /// credentials file (a service-account key or an `external_account` file).
    /// `max_requests` is [`with_max_requests`](Self::with_max_requests). Unknown parameters
    /// are rejected.
    ///
    /// # Errors
    /// [`InvalidInput`](lockcore::ErrorKind::InvalidInput) for another scheme, a bad bucket,
    /// prefix or parameter, `auth=token` without [`TOKEN_ENV`], or `auth=command` without
    /// [`TOKEN_COMMAND_ENV`].
    pub fn from_url(url: &str) -> Result<Self> {
        let rest = url
            .trim()
            .strip_prefix("gs://")
            .ok_or_else(|| Error::invalid_input("a GCS URL starts with gs://"))?;
        let (path, query) = rest.split_once('?').unwrap_or((rest, ""));
        let (bucket, prefix) = path.split_once('/').unwrap_or((path, ""));
        if bucket.contains(['@', ':']) {
            // Not echoed: it is most likely `user:password@bucket`, or a password with a
            // raw `/` cut at that `/`.
            return Err(Error::invalid_input(
                "a gs:// URL carries no user or password; credentials come from \
                 GOOGLE_APPLICATION_CREDENTIALS, gcloud, the metadata server or \
                 credentials=PATH",
            ));
        }
        let prefix = lockcore::url::percent_decode(prefix, "prefix")?;
        let mut config = Self::new(bucket)?.with_prefix(prefix)?;
        let mut query = Query::parse("gcs", query)?;
        if let Some(endpoint) = query.take("endpoint") {
            config = config.with_endpoint(&endpoint)?;
        }
        if let Some(timeout) = query.take_millis("timeout_ms")? {
            config = config.with_timeout(timeout);
        }
        let requests = format!("a whole number from 1 to {MAX_MAX_REQUESTS}");
        if let Some(n) = query.take_parsed("max_requests", &requests)? {
            config = config.with_max_requests(n)?;
        }
        let mut auth = query
            .take("auth")
            .map(|mode| parse_auth(&mode))
            .transpose()?;
        if let Some(path) = query.take("credentials") {
            if auth.is_some() {
                return Err(Error::invalid_input(
                    "the gcs URL parameters `auth` and `credentials` each choose the \
                     credentials; give one of them",
                ));
            }
            if path.is_empty() {
                return Err(Error::invalid_input(
                    "the gcs URL parameter `credentials` must be a file path",
                ));
            }
            auth = Some(GcsAuth::ServiceAccountKey(path.into()));
        }
        query.finish(KNOWN_PARAMS)?;
        Ok(match auth {
            Some(auth) => config.with_auth(auth),
            None => config,
        })
    }

    /// Talks to `endpoint` (`http://127.0.0.1:4443`, or `host:port` as in
    /// `STORAGE_EMULATOR_HOST`) instead of real GCS, and sets auth to [`GcsAuth::None`]
    /// (call [`with_auth`](Self::with_auth) afterwards for an endpoint that needs auth).
    ///
    /// # Errors
    /// [`InvalidInput`](lockcore::ErrorKind::InvalidInput) when it is not an HTTP(S) URL.
    pub fn with_endpoint(mut self, endpoint: &str) -> Result<Self> {
        let endpoint = endpoint.trim().trim_end_matches('/');
        let endpoint = if endpoint.contains("://") {
            endpoint.to_owned()
        } else {
            format!("http://{endpoint}")
        };
        let parsed = url::Url::parse(&endpoint)
            .map_err(|e| Error::invalid_input(format!("bad GCS endpoint: {e}")))?;
        if !matches!(parsed.scheme(), "http" | "https") || parsed.host().is_none() {
            return Err(Error::invalid_input(
                "a GCS endpoint is an http(s)://host[:port] URL",
            ));
        }
        if !parsed.username().is_empty() || parsed.password().is_some() {
            return Err(Error::invalid_input(
                "a GCS endpoint carries no user or password; use auth= or credentials=",
            ));
        }
        self.endpoint = endpoint;
        self.auth = GcsAuth::None;
        Ok(self)
    }

    /// Sets the object-name prefix.
    ///
    /// # Errors
    /// [`InvalidInput`](lockcore::ErrorKind::InvalidInput) when the prefix alone breaks the
    /// GCS naming rules (CR or LF, over 1024 bytes, `.well-known/acme-challenge/`).
    pub fn with_prefix(mut self, prefix: impl Into<String>) -> Result<Self> {
        let prefix = prefix.into();
        if !prefix.is_empty() {
            validate_object_name(&format!("{prefix}x"))?;
        }
        self.prefix = prefix;
        Ok(self)
    }

    /// Sets the per-request timeout (default [`DEFAULT_TIMEOUT`]).
    pub fn with_timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    /// Sends `Authorization: Bearer <token>` with every request, as given.
    pub fn with_access_token(self, token: impl Into<String>) -> Self {
        self.with_auth(GcsAuth::AccessToken(token.into()))
    }

    /// Sets how requests authenticate.
    pub fn with_auth(mut self, auth: GcsAuth) -> Self {
        self.auth = auth;
        self
    }

    /// Sets the shortest refresh interval lock options may ask for (default
    /// [`MIN_REFRESH_INTERVAL`], real GCS's per-object mutation rate). Lower it only for a
    /// test server without that limit.
    pub fn with_min_refresh_interval(mut self, interval: Duration) -> Self {
        self.min_refresh = interval;
        self
    }

    /// Runs at most `n` backend operations at once (default [`DEFAULT_MAX_REQUESTS`]);
    /// more wait their turn in order. An operation (an acquire, refresh, release, …)
    /// sends its requests one after another, so this is also the most requests in
    /// flight, and over HTTP/1.1, where each holds a connection, about the most
    /// connections open: without a bound, a `Locker` whose thousands of leases fall due
    /// together would open one connection per lease (BENCHMARKS.md, "Scale"). An
    /// operation that waits longer than the request timeout (`timeout_ms`) for its turn
    /// fails with [`Unavailable`](lockcore::ErrorKind::Unavailable), nothing sent.
    ///
    /// ```
    /// use backend_gcs::GcsConfig;
    /// let config = GcsConfig::from_url("gs://locks?max_requests=32")?;
    /// assert_eq!(config.max_requests(), 32);
    /// assert!(GcsConfig::new("locks")?.with_max_requests(0).is_err());
    /// # Ok::<(), lockcore::Error>(())
    /// ```
    ///
    /// # Errors
    /// [`InvalidInput`](lockcore::ErrorKind::InvalidInput) for 0 or more than
    /// [`MAX_MAX_REQUESTS`].
    pub fn with_max_requests(mut self, n: usize) -> Result<Self> {
        if !(1..=MAX_MAX_REQUESTS).contains(&n) {
            return Err(Error::invalid_input(format!(
                "max_requests must be a whole number from 1 to {MAX_MAX_REQUESTS}, not {n}"
            )));
        }
        self.max_requests = n;
        Ok(self)
    }

    /// The most backend operations (so requests) in flight at once.
    pub fn max_requests(&self) -> usize {
        self.max_requests
    }

    /// The JSON API base URL.
    pub fn endpoint(&self) -> &str {
        &self.endpoint
    }

    /// The bucket.
    pub fn bucket(&self) -> &str {
        &self.bucket
    }

    /// The object-name prefix.
    pub fn prefix(&self) -> &str {
        &self.prefix
    }

    /// The per-request timeout.
    pub fn timeout(&self) -> Duration {
        self.timeout
    }

    /// How requests authenticate.
    pub fn auth(&self) -> &GcsAuth {
        &self.auth
    }

    /// The shortest refresh interval lock options may ask for.
    pub fn min_refresh_interval(&self) -> Duration {
        self.min_refresh
    }

    /// The object name of lock `name`: `prefix + name`, checked against GCS's rules.
    ///
    /// # Errors
    /// [`InvalidInput`](lockcore::ErrorKind::InvalidInput) when the result is not a valid
    /// GCS object name.
    pub fn object_name(&self, name: &LockName) -> Result<String> {
        let object = format!("{}{}", self.prefix, name.as_str());
        validate_object_name(&object)?;
        Ok(object)
    }
}

fn parse_auth(value: &str) -> Result<GcsAuth> {
    match value {
        "none" => Ok(GcsAuth::None),
        "google" => Ok(GcsAuth::Google),
        "token" => std::env::var(TOKEN_ENV)
            .ok()
            .filter(|t| !t.is_empty())
            .map(GcsAuth::AccessToken)
            .ok_or_else(|| Error::invalid_input(format!("auth=token needs {TOKEN_ENV} set"))),
        "command" => token_command().map(GcsAuth::TokenCommand).ok_or_else(|| {
            Error::invalid_input(format!(
                "auth=command needs {TOKEN_COMMAND_ENV} set to a command that prints a token"
            ))
        }),
        _ => Err(Error::invalid_input(
            "the gcs URL parameter `auth` must be none, google, token or command (or give \
             credentials=PATH)",
        )),
    }
}

/// The command in [`TOKEN_COMMAND_ENV`], when set and not blank.
fn token_command() -> Option<String> {
    std::env::var(TOKEN_COMMAND_ENV)
        .ok()
        .filter(|c| !c.trim().is_empty())
}

/// GCS object naming rules (cloud.google.com/storage/docs/objects#naming).
pub(crate) fn validate_object_name(object: &str) -> Result<()> {
    let problem = if object.is_empty() {
        Some("is empty".to_owned())
    } else if object.len() > MAX_OBJECT_NAME_LEN {
        Some(format!(
            "is {} bytes; GCS allows {MAX_OBJECT_NAME_LEN}",
            object.len()
        ))
    } else if object.contains(['\r', '\n']) {
        Some("contains a carriage return or line feed".to_owned())
    } else if object == "." || object == ".." {
        Some("is \".\" or \"..\"".to_owned())
    } else if object.starts_with(".well-known/acme-challenge/") {
        Some("starts with \".well-known/acme-challenge/\"".to_owned())
    } else {
        None
    };
    match problem {
        Some(why) => Err(Error::invalid_input(format!(
            "GCS object name {object:?} {why}"
        ))),
        None => Ok(()),
    }
}

/// GCS bucket naming rules, the common subset: 3–222 characters of lowercase letters,
/// digits, `-`, `_` and `.`, starting and ending with a letter or digit.
fn validate_bucket(bucket: &str) -> Result<()> {
    if bucket.contains(['@', ':']) {
        return Err(Error::invalid_input(
            "a GCS bucket name has no '@' or ':' (and a gs:// URL no user or password)",
        ));
    }
    let ok_char = |c: char| c.is_ascii_lowercase() || c.is_ascii_digit() || "-_.".contains(c);
    let edge = |c: Option<char>| c.is_some_and(|c| c.is_ascii_lowercase() || c.is_ascii_digit());
    if (3..=222).contains(&bucket.len())
        && bucket.chars().all(ok_char)
        && edge(bucket.chars().next())
        && edge(bucket.chars().last())
    {
        Ok(())
    } else {
        Err(Error::invalid_input(format!(
            "{bucket:?} is not a valid GCS bucket name (3-222 of a-z 0-9 - _ .)"
        )))
    }
}

impl fmt::Display for GcsConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "gs://{}/{}", self.bucket, self.prefix)?;
        if self.endpoint != DEFAULT_ENDPOINT {
            write!(f, "?endpoint={}", self.endpoint)?;
        }
        Ok(())
    }
}

impl fmt::Debug for GcsConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("GcsConfig")
            .field("endpoint", &self.endpoint)
            .field("bucket", &self.bucket)
            .field("prefix", &self.prefix)
            .field("timeout", &self.timeout)
            .field("auth", &self.auth)
            .field("min_refresh", &self.min_refresh)
            .field("max_requests", &self.max_requests)
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(url: &str) -> GcsConfig {
        GcsConfig::from_url(url).expect("valid")
    }

    #[test]
    fn parses_bucket_prefix_and_params() {
        let c = config("gs://locks-1/app/?endpoint=http://127.0.0.1:4443&timeout_ms=250");
        assert_eq!(c.bucket(), "locks-1");
        assert_eq!(c.prefix(), "app/");
        assert_eq!(c.endpoint(), "http://127.0.0.1:4443");
        assert_eq!(c.timeout(), Duration::from_millis(250));
        let name = LockName::new("job").unwrap();
        assert_eq!(c.object_name(&name).unwrap(), "app/job");
        assert_eq!(config("gs://locks-1").prefix(), "");
    }

    #[test]
    fn rejects_bad_urls() {
        for url in [
            "s3://b/p",
            "gs://UPPER/p",
            "gs://ab",
            "gs://b-ok/p?nope=1",
            "gs://b-ok/p?timeout_ms=0",
            "gs://b-ok/p?endpoint=ftp://x",
            "gs://b-ok/p?auth=magic",
            "gs://b-ok/p?credentials=",
            "gs://u:pw@b-ok/p",
            "gs://b-ok/p?endpoint=http://u:pw@127.0.0.1:1",
            "gs://b-ok/.well-known/acme-challenge/",
            "gs://b-ok/p?credentials=/k.json&auth=none",
            "gs://b-ok/p?auth=google&credentials=/k.json",
            "gs://b-ok/p?credentials=/100%.json",
        ] {
            let err = GcsConfig::from_url(url).expect_err(url);
            assert_eq!(err.kind(), lockcore::ErrorKind::InvalidInput, "{url}");
        }
    }

    #[test]
    fn a_plus_in_a_value_is_a_plus() {
        let c = config("gs://b-ok/p?credentials=/keys/a+b.json");
        assert_eq!(
            c.auth(),
            &GcsAuth::ServiceAccountKey("/keys/a+b.json".into())
        );
    }

    #[test]
    fn object_names_follow_gcs_rules() {
        let c = config("gs://bucket");
        for bad in [".", "..", ".well-known/acme-challenge/x"] {
            let name = LockName::new(bad).unwrap();
            assert!(c.object_name(&name).is_err(), "{bad}");
        }
        let long = config(&format!("gs://bucket/{}", "p".repeat(900)));
        let name = LockName::new("n".repeat(200)).unwrap();
        assert!(long.object_name(&name).is_err(), "over 1024 bytes");
        assert!(c.object_name(&LockName::new(".x").unwrap()).is_ok());
    }

    #[test]
    fn auth_follows_the_endpoint_and_the_auth_parameters() {
        let emulator = config("gs://bucket/p?endpoint=http://127.0.0.1:1");
        assert_eq!(emulator.auth(), &GcsAuth::None);
        let both = config("gs://bucket/p?auth=google&endpoint=http://127.0.0.1:1");
        assert_eq!(
            both.auth(),
            &GcsAuth::Google,
            "auth wins whatever the order"
        );
        let key = config("gs://bucket/p?credentials=/etc/anylock/key.json");
        assert_eq!(
            key.auth(),
            &GcsAuth::ServiceAccountKey("/etc/anylock/key.json".into())
        );
        assert_eq!(config("gs://bucket/p?auth=none").auth(), &GcsAuth::None);
    }

    #[test]
    fn debug_and_display_hide_the_token() {
        let c = config("gs://bucket/p").with_access_token("ya29.s3cr3t");
        assert!(!format!("{c:?}").contains("s3cr3t"));
        assert!(!format!("{c}").contains("s3cr3t"));
        assert!(format!("{c:?}").contains("***"));
    }
}
