//! The one mapping from GCS, token endpoint, reqwest and JSON failures to lockcore errors,
//! and the wording rules for server text quoted in them (shortened, secrets scrubbed).

use lockcore::{Error, ErrorKind};

/// Whether a call may have changed the object (decides timeout → outcome unknown).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Call {
    Read,
    Write,
}

/// What failed: an HTTP status the lock logic does not handle itself, or the transport.
#[derive(Debug)]
pub(crate) enum Failure {
    Status(u16),
    Transport(reqwest::Error),
}

/// The one mapping from GCS failures to lockcore errors.
///
/// | failure | kind | retry |
/// |---|---|---|
/// | 400 | `InvalidInput` | permanent |
/// | 401, 403 | `PermissionDenied` | permanent |
/// | 408, 429, 5xx | `Unavailable` | temporary |
/// | other status | `Protocol` | permanent |
/// | TLS handshake failed (untrusted or misnamed certificate) | `PermissionDenied` | permanent |
/// | connect error (refused, timed out, no such host) | `Unavailable` | temporary |
/// | timeout or broken reply on a write | `OutcomeUnknown` | temporary |
/// | timeout or broken reply on a read | `Unavailable` | temporary |
///
/// 404 and 412 never get here: `send` answers them as `Reply::NotFound` and
/// `Reply::PreconditionFailed`, and the lock logic decides (a missing bucket is noticed
/// by the insert, which has no other reason to see 404).
pub(crate) fn map_error(failure: Failure, call: Call) -> Error {
    match failure {
        Failure::Status(400) => Error::invalid_input("GCS rejected the request as invalid (400)"),
        Failure::Status(code @ (401 | 403)) => Error::new(
            ErrorKind::PermissionDenied,
            format!("GCS refused the credentials ({code}); check the token and bucket IAM"),
        ),
        Failure::Status(code @ (408 | 429 | 500..=599)) => {
            Error::unavailable(format!("GCS answered {code}; retry later"))
        }
        Failure::Status(code) => Error::new(
            ErrorKind::Protocol,
            format!("GCS answered unexpected status {code}"),
        ),
        Failure::Transport(e) => transport(e, call),
    }
}

/// A request that got no HTTP reply. A TLS handshake that failed (an untrusted or misnamed
/// certificate) is [`PermissionDenied`](ErrorKind::PermissionDenied): retrying cannot make the server
/// trusted, so lockcore's loops stop at once instead of retrying in silence. Not reaching
/// the server (refused, timed out, no such host) is a temporary
/// [`Unavailable`](ErrorKind::Unavailable) naming the cause; nothing was sent.
fn transport(e: reqwest::Error, call: Call) -> Error {
    let at = e.url().map(host_port).unwrap_or_default();
    if e.is_connect() {
        // Only while connecting: a TLS error on a connection already made (an alert
        // after our request went out) leaves a write's outcome unknown, as below.
        if let Some(refused) = tls_refusal(&e, &format!("GCS at {at}")) {
            return refused.with_source(e.without_url());
        }
        let cause = connect_cause(&e);
        return Error::unavailable(format!("cannot connect to GCS at {at} ({cause})"))
            .with_source(e.without_url());
    }
    let what = if e.is_timeout() {
        "timed out"
    } else {
        "failed"
    };
    let kind = match call {
        Call::Write => ErrorKind::OutcomeUnknown,
        Call::Read => ErrorKind::Unavailable,
    };
    Error::new(kind, format!("the GCS request to {at} {what}")).with_source(e.without_url())
}

/// `host:port` of a URL (no user, path or query).
pub(crate) fn host_port(url: &url::Url) -> String {
    let host = url.host_str().unwrap_or_default();
    match url.port_or_known_default() {
        Some(port) => format!("{host}:{port}"),
        None => host.to_owned(),
    }
}

/// Why a connection could not be made, in a few words: `connection refused`, `timed out`,
/// or the innermost cause's own text (a name that does not resolve, say).
fn connect_cause(e: &reqwest::Error) -> String {
    if e.is_timeout() {
        return "timed out".to_owned();
    }
    let mut innermost = e.to_string();
    let mut next = std::error::Error::source(e);
    while let Some(cause) = next {
        if let Some(io) = cause.downcast_ref::<std::io::Error>() {
            match io.kind() {
                std::io::ErrorKind::ConnectionRefused => return "connection refused".to_owned(),
                std::io::ErrorKind::TimedOut => return "timed out".to_owned(),
                _ => {}
            }
        }
        innermost = cause.to_string();
        next = cause.source();
    }
    innermost
}

/// A TLS failure in `e`'s chain, worded by [`anylock_tls::diagnose`] (see [`tls_refused`]).
#[cfg(feature = "tls")]
pub(crate) fn tls_refusal(e: &(dyn std::error::Error + 'static), at: &str) -> Option<Error> {
    let tls: &(dyn std::error::Error + 'static) = rustls_error(e)?;
    let diagnosed = anylock_tls::diagnose(tls)?;
    // A refused certificate is permanent; anything else TLS met (a corrupted record) is
    // worth another attempt, and stays as anylock-tls worded it.
    if diagnosed.kind() != ErrorKind::PermissionDenied {
        return Some(Error::new(
            diagnosed.kind(),
            format!("{at}: {}", diagnosed.message()),
        ));
    }
    Some(tls_refused(at, diagnosed.message()))
}

/// The rustls error in `e`'s chain. reqwest's connector wraps it in two `io::Error`s, and
/// `io::Error::source` skips what an `io::Error` wraps (it returns the inner error's
/// source), so each `io::Error` is opened with `get_ref` (`anylock_tls::diagnose` opens
/// one only).
#[cfg(feature = "tls")]
fn rustls_error<'a>(e: &'a (dyn std::error::Error + 'static)) -> Option<&'a rustls::Error> {
    let mut next = Some(e);
    while let Some(e) = next {
        let mut inner = e;
        while let Some(wrapped) = inner
            .downcast_ref::<std::io::Error>()
            .and_then(std::io::Error::get_ref)
        {
            inner = wrapped;
        }
        if let Some(tls) = inner.downcast_ref::<rustls::Error>() {
            return Some(tls);
        }
        next = e.source();
    }
    None
}

/// Without TLS no handshake ever fails.
#[cfg(not(feature = "tls"))]
pub(crate) fn tls_refusal(_: &(dyn std::error::Error + 'static), _: &str) -> Option<Error> {
    None
}

/// A failed TLS handshake with `at` (`GCS at host:port`), as anylock-tls words it
/// (`TLS handshake failed: …`): [`PermissionDenied`](ErrorKind::PermissionDenied), never
/// retried. anylock-tls's advice for an untrusted certificate names the URL parameter
/// `ca`, which `gs://` URLs do not take: GCS endpoints are verified against the OS trust
/// store, so the advice says how to trust another CA there.
#[cfg(feature = "tls")]
pub(crate) fn tls_refused(at: &str, message: &str) -> Error {
    const CA_ADVICE: &str = "check the URL parameter `ca`: without it the OS trust store is used";
    const GCS_ADVICE: &str = "GCS endpoints are verified against the OS trust store: add \
        the CA there, or name a PEM file of CAs in SSL_CERT_FILE";
    let message = message.replace(CA_ADVICE, GCS_ADVICE);
    Error::new(ErrorKind::PermissionDenied, format!("{at}: {message}"))
}

/// A reply that breaks the JSON API's promises.
pub(crate) fn protocol(message: impl Into<std::borrow::Cow<'static, str>>) -> Error {
    Error::new(ErrorKind::Protocol, message)
}

/// A body that is not JSON: `GCS answered {what}: {e}` (serde_json's message names a line
/// and column, never the text).
pub(crate) fn malformed_json(what: &str, e: &serde_json::Error) -> Error {
    protocol(format!("GCS answered {what}: {e}"))
}

/// A 404 where only a missing bucket can explain it.
pub(crate) fn no_bucket() -> Error {
    Error::new(ErrorKind::Config, "the GCS bucket does not exist")
}

/// reqwest could not build a client (no TLS backend, say).
pub(crate) fn http_client(e: &reqwest::Error) -> Error {
    Error::new(
        ErrorKind::Config,
        format!("cannot build the HTTP client: {e}"),
    )
}

/// A token endpoint (STS, IAM credentials, a subject token URL) that could not be reached.
#[cfg(feature = "auth")]
pub(crate) fn unreachable(what: &str, e: reqwest::Error) -> Error {
    if e.is_connect()
        && let Some(refused) = tls_refusal(&e, &format!("{what} failed"))
    {
        return refused.with_source(e.without_url());
    }
    Error::unavailable(format!("{what} failed: cannot reach the endpoint"))
        .with_source(e.without_url())
}

/// A token endpoint's reply that broke off.
#[cfg(feature = "auth")]
pub(crate) fn broken_reply(what: &str, e: reqwest::Error) -> Error {
    Error::unavailable(format!("{what} failed: broken reply")).with_source(e.without_url())
}

/// A token endpoint's refusal: 408, 429 and 5xx are temporary, other 4xx refuse the
/// credentials, anything else is a protocol error. The server's message is quoted
/// shortened and scrubbed of `secrets`.
///
/// | status | kind | retry |
/// |---|---|---|
/// | 408, 429, 5xx | `Unavailable` | temporary |
/// | other 4xx | `PermissionDenied` | permanent |
/// | other | `Protocol` | permanent |
#[cfg(feature = "auth")]
pub(crate) fn refused(
    what: &str,
    status: reqwest::StatusCode,
    body: &[u8],
    secrets: &[&str],
) -> Error {
    let detail = scrub(&shorten(&server_message(body), 300), secrets);
    let kind = match status.as_u16() {
        408 | 429 | 500..=599 => ErrorKind::Unavailable,
        400..=499 => ErrorKind::PermissionDenied,
        _ => ErrorKind::Protocol,
    };
    Error::new(kind, format!("{what} was refused ({status}): {detail}"))
}

/// A token endpoint's 2xx reply without the fields it owes.
#[cfg(feature = "auth")]
pub(crate) fn missing_fields(what: &str, fields: &str) -> Error {
    protocol(format!("{what} answered without {fields}"))
}

/// The error text of an OAuth2 (`error`, `error_description`) or Google API
/// (`error.status`, `error.message`) reply.
#[cfg(feature = "auth")]
fn server_message(body: &[u8]) -> String {
    use serde_json::Value;
    let value: Value = serde_json::from_slice(body).unwrap_or_default();
    let text = |v: &Value, key: &str| v.get(key).and_then(Value::as_str).map(str::to_owned);
    match value.get("error") {
        Some(Value::String(code)) => match text(&value, "error_description") {
            Some(description) => format!("{code}: {description}"),
            None => code.clone(),
        },
        Some(error @ Value::Object(_)) => format!(
            "{}: {}",
            text(error, "status").unwrap_or_default(),
            text(error, "message").unwrap_or_default()
        ),
        _ => "no error details".to_owned(),
    }
}

/// Google credentials the `gcp_auth` chain could not find.
#[cfg(feature = "auth")]
pub(crate) fn no_credentials(e: gcp_auth::Error) -> Error {
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
pub(crate) fn chain(error: &(dyn std::error::Error + 'static)) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
}

/// `text` with every occurrence of each secret replaced by `***`.
#[cfg(feature = "auth")]
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
    use lockcore::RetryStatus;

    #[test]
    fn statuses_map_to_kinds_and_retry() {
        let cases = [
            (400, ErrorKind::InvalidInput, RetryStatus::Permanent),
            (401, ErrorKind::PermissionDenied, RetryStatus::Permanent),
            (403, ErrorKind::PermissionDenied, RetryStatus::Permanent),
            (408, ErrorKind::Unavailable, RetryStatus::Temporary),
            (429, ErrorKind::Unavailable, RetryStatus::Temporary),
            (503, ErrorKind::Unavailable, RetryStatus::Temporary),
            (302, ErrorKind::Protocol, RetryStatus::Permanent),
        ];
        for (code, kind, status) in cases {
            let error = map_error(Failure::Status(code), Call::Write);
            assert_eq!((error.kind(), error.status()), (kind, status), "{code}");
        }
    }

    #[cfg(feature = "auth")]
    #[test]
    fn server_messages_of_both_shapes() {
        let oauth = br#"{"error":"invalid_target","error_description":"no such pool"}"#;
        assert_eq!(server_message(oauth), "invalid_target: no such pool");
        let google = br#"{"error":{"code":403,"status":"PERMISSION_DENIED","message":"denied"}}"#;
        assert_eq!(server_message(google), "PERMISSION_DENIED: denied");
        assert_eq!(server_message(b"<html>"), "no error details");
    }

    #[cfg(feature = "auth")]
    #[test]
    fn scrub_hides_secrets() {
        assert_eq!(scrub("a s3cret b", &["s3cret", ""]), "a *** b");
    }

    #[test]
    fn shorten_cuts_at_a_character() {
        assert_eq!(shorten("héllo", 2), "h…");
        assert_eq!(shorten("ok", 5), "ok");
    }
}
