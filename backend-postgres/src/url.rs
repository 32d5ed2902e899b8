//! Reading `postgres://` URLs: the scheme check, anylock's own query parameters, the
//! options handed to sqlx, and the password-free form used in every message.

use std::str::FromStr;

use lockcore::Result;
use sqlx::postgres::PgConnectOptions;
use url::Url;

use crate::config::{DEFAULT_APPLICATION_NAME, invalid};

/// URL query parameters that anylock reads itself (the rest go to sqlx).
const OWN_PARAMS: &[&str] = &[
    "schema",
    "table",
    "channel",
    "pool_size",
    "timeout_ms",
    "statement_timeout_ms",
    "create_schema",
    "prepared_statements",
];

pub(crate) fn parse_url(url: &str) -> Result<Url> {
    // The url crate's errors never echo the input, so the password cannot leak here.
    let parsed = Url::parse(url).map_err(|e| {
        invalid(format!(
            "invalid PostgreSQL URL ({e}); expected postgres://user:password@host:port/database"
        ))
    })?;
    match parsed.scheme() {
        "postgres" | "postgresql" => Ok(parsed),
        other => Err(invalid(format!(
            "unsupported URL scheme {other:?}; expected postgres:// or postgresql://"
        ))),
    }
}

/// Splits the query into anylock's own parameters and everything else.
pub(crate) fn split_params(url: &Url) -> (Vec<(String, String)>, Url) {
    let mut own = Vec::new();
    let mut rest = Vec::new();
    for (key, value) in url.query_pairs() {
        let pair = (key.into_owned(), value.into_owned());
        if OWN_PARAMS.contains(&pair.0.as_str()) {
            own.push(pair);
        } else {
            rest.push(pair);
        }
    }
    let mut stripped = url.clone();
    stripped.set_query(None);
    if !rest.is_empty() {
        stripped.query_pairs_mut().extend_pairs(rest);
    }
    (own, stripped)
}

pub(crate) fn connect_options(url: &Url, redacted: &str) -> Result<PgConnectOptions> {
    let options = PgConnectOptions::from_str(url.as_str()).map_err(|e| {
        // sqlx's configuration errors describe the bad value, never the password.
        invalid(format!("invalid PostgreSQL URL {redacted}: {e}"))
    })?;
    Ok(match options.get_application_name() {
        Some(_) => options,
        None => options.application_name(DEFAULT_APPLICATION_NAME),
    })
}

/// Query parameters whose values are hidden, matched without regard to case (a user may
/// write `PASSWORD=`, which the driver ignores but the message would still show).
/// The same names as `anylock::redact` hides.
const SECRET_PARAMS: &[&str] = &["password", "pass", "token", "secret", "key", "sslpassword"];

fn is_secret(key: &str) -> bool {
    SECRET_PARAMS.iter().any(|s| key.eq_ignore_ascii_case(s))
}

/// The URL with the password (in the user info or a secret-looking parameter) replaced.
pub(crate) fn redact(url: &Url) -> String {
    let mut shown = url.clone();
    if shown.password().is_some() {
        // Fails only for URLs that cannot carry a password at all.
        let _ = shown.set_password(Some("***"));
    }
    if url.query_pairs().any(|(k, _)| is_secret(&k)) {
        let pairs: Vec<(String, String)> = url
            .query_pairs()
            .map(|(k, v)| {
                let v = if is_secret(&k) { "***".into() } else { v };
                (k.into_owned(), v.into_owned())
            })
            .collect();
        shown.set_query(None);
        shown.query_pairs_mut().extend_pairs(pairs);
    }
    shown.to_string()
}

#[cfg(test)]
mod tests {
    use lockcore::ErrorKind;
    use url::Url;

    use crate::PostgresConfig;

    const URL: &str = "postgres://app:pa%40ss@db.example:6543/locks?sslmode=require";

    #[test]
    fn secret_parameters_are_hidden_whatever_their_case() {
        let url = Url::parse("postgres://h/db?PASSWORD=s3cret&Token=t0ken&pool_size=2").unwrap();
        let shown = super::redact(&url);
        assert!(
            !shown.contains("s3cret") && !shown.contains("t0ken"),
            "{shown}"
        );
        assert!(shown.contains("pool_size=2"), "{shown}");
    }

    #[test]
    fn the_password_never_shows() {
        let config = PostgresConfig::from_url(&format!("{URL}&password=other-secret"))
            .expect("valid")
            .with_listen_url("postgres://u:listen-secret@h/db")
            .expect("valid");
        for shown in [format!("{config}"), format!("{config:?}")] {
            assert!(
                !shown.contains("pa%40ss") && !shown.contains("pa@ss"),
                "{shown}"
            );
            assert!(!shown.contains("other-secret"), "{shown}");
            assert!(!shown.contains("listen-secret"), "{shown}");
            assert!(shown.contains("***"), "{shown}");
        }
        let bad = "postgres://app:hunter2@db:notaport/x";
        let err = PostgresConfig::from_url(bad).expect_err("bad port");
        assert_eq!(err.kind(), ErrorKind::InvalidInput);
        assert!(!format!("{err} {err:?}").contains("hunter2"), "{err:?}");
        let bad = "postgres://app:hunter2@db/x?sslmode=sometimes";
        let err = PostgresConfig::from_url(bad).expect_err("bad sslmode");
        assert!(!format!("{err} {err:?}").contains("hunter2"), "{err:?}");
    }

    #[test]
    fn own_parameters_are_not_passed_to_sqlx() {
        let url = Url::parse("postgres://h/db?schema=s&sslmode=disable&table=t").expect("url");
        let (own, rest) = super::split_params(&url);
        assert_eq!(own.len(), 2);
        assert_eq!(rest.query(), Some("sslmode=disable"));
    }
}
