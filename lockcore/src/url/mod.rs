//! Backend URLs: the one reader of query parameters, percent-decoding, and redaction.
//!
//! Every backend parses its own URL shape (hosts, paths, buckets), then reads its query
//! through a [`Query`]: each parameter is taken by name with a typed reader whose error
//! names the parameter, and [`Query::finish`] refuses what is left, naming the backend's
//! known parameters. A backend declares only its keys; the messages, the hiding of
//! secrets and of password fragments (`?` in a raw password) are the same everywhere.
//!
//! ```
//! use std::time::Duration;
//! use lockcore::url::Query;
//! let mut query = Query::parse("redis", "prefix=app%2Fa&timeout_ms=250&tls=yes")?;
//! assert_eq!(query.take("prefix").as_deref(), Some("app/a"));
//! assert_eq!(query.take_millis("timeout_ms")?, Some(Duration::from_millis(250)));
//! assert_eq!(query.take_flag("tls")?, Some(true));
//! query.finish(&["prefix", "timeout_ms", "tls"])?;
//!
//! let err = Query::parse("redis", "prefx=a")?.finish(&["prefix"]).unwrap_err();
//! assert_eq!(err.to_string(), "invalid input: unknown redis URL parameter `prefx`; known: prefix");
//! # Ok::<(), lockcore::Error>(())
//! ```

mod query;
mod redact;
mod secret;

pub use query::Query;
pub use redact::redact;
pub use secret::is_secret_param;

use crate::error::Error;

/// Decodes `%XX` escapes of a URL component (RFC 3986: a `+` stays a `+`) into UTF-8 text.
///
/// # Errors
/// [`ErrorKind::InvalidInput`](crate::ErrorKind::InvalidInput) naming `what` (never the
/// text, which may be a password) for a `%` not followed by two hex digits, or bytes that
/// are not UTF-8.
///
/// ```
/// assert_eq!(lockcore::url::percent_decode("a%2Fb+c", "prefix")?, "a/b+c");
/// assert!(lockcore::url::percent_decode("pa%zz", "password").is_err());
/// # Ok::<(), lockcore::Error>(())
/// ```
pub fn percent_decode(text: &str, what: &str) -> Result<String, Error> {
    let bad = || Error::invalid_input(format!("bad percent-encoding in the URL's {what}"));
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let hex = text.get(i + 1..i + 3).ok_or_else(bad)?;
            if !hex.bytes().all(|b| b.is_ascii_hexdigit()) {
                return Err(bad());
            }
            out.push(u8::from_str_radix(hex, 16).map_err(|_| bad())?);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8(out).map_err(|_| bad())
}

/// Percent-encodes `%` and each of the ASCII characters in `special`, so that
/// [`percent_decode`] gives `text` back (for writing a URL a parser will read again).
///
/// ```
/// let written = lockcore::url::percent_encode("50%/a@b", "/@");
/// assert_eq!(written, "50%25%2Fa%40b");
/// assert_eq!(lockcore::url::percent_decode(&written, "x")?, "50%/a@b");
/// # Ok::<(), lockcore::Error>(())
/// ```
pub fn percent_encode(text: &str, special: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for ch in text.chars() {
        if ch == '%' || (ch.is_ascii() && special.contains(ch)) {
            out.push_str(&format!("%{:02X}", u32::from(ch)));
        } else {
            out.push(ch);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decoding_is_strict_and_never_echoes() {
        assert_eq!(percent_decode("%E2%9C%93ok", "x").expect("utf-8"), "✓ok");
        for bad in ["%", "%4", "%G0", "%FF", "a%+1", "%é"] {
            let err = percent_decode(bad, "password").expect_err(bad);
            assert_eq!(
                err.to_string(),
                "invalid input: bad percent-encoding in the URL's password"
            );
        }
    }

    #[test]
    fn encoding_round_trips() {
        for text in ["", "a/b", "%41", "u@h:p", "✓/%"] {
            let written = percent_encode(text, "/@:");
            assert!(!written.contains(['/', '@', ':']), "{written}");
            assert_eq!(percent_decode(&written, "x").expect("ok"), text);
        }
    }
}
