//! Reading `postgres://` URLs: the scheme check, anylock's own query parameters, the
//! options handed to sqlx, and the password-free form used in every message.

use std::str::FromStr;

use lockcore::Result;
use sqlx::postgres::PgConnectOptions;
use url::Url;

use crate::config::{DEFAULT_APPLICATION_NAME, invalid};
use crate::tls::{TlsParams, TlsSetup};

/// URL query parameters that anylock reads itself.
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

/// URL query parameters sqlx 0.9 reads itself (sqlx-postgres `src/options/parse.rs`),
/// besides the TLS files, which anylock reads ([`crate::tls::ALIASES`]). `options[NAME]` is
/// accepted too. sqlx logs and ignores anything else, so anything else is refused here.
const DRIVER_PARAMS: &[&str] = &[
    "sslmode",
    "ssl-mode",
    "host",
    "hostaddr",
    "port",
    "dbname",
    "user",
    "password",
    "application_name",
    "options",
    "statement-cache-capacity",
];

/// libpq parameters the driver does not implement, refused with that reason.
const LIBPQ_UNSUPPORTED: &[&str] = &[
    "sslcrl",
    "sslcrldir",
    "sslcompression",
    "sslsni",
    "sslnegotiation",
    "sslcertmode",
    "ssl_min_protocol_version",
    "ssl_max_protocol_version",
    "connect_timeout",
    "target_session_attrs",
    "load_balance_hosts",
    "gssencmode",
    "channel_binding",
    "require_auth",
    "passfile",
    "service",
    "keepalives",
    "keepalives_idle",
    "keepalives_interval",
    "keepalives_count",
    "tcp_user_timeout",
    "krbsrvname",
    "gsslib",
    "requirepeer",
    "client_encoding",
    "fallback_application_name",
    "replication",
];

/// A URL's query, sorted: anylock's own parameters, the TLS files, and a URL holding only
/// what sqlx reads.
#[derive(Debug)]
pub(crate) struct Params {
    pub(crate) own: Vec<(String, String)>,
    pub(crate) tls: TlsParams,
    pub(crate) driver: Url,
}

/// Sorts the query's parameters; refuses any that neither anylock nor sqlx reads, naming
/// it (never its value: a misspelled `password` holds a secret) and listing the known ones.
///
/// # Errors
/// [`ErrorKind::InvalidInput`](lockcore::ErrorKind::InvalidInput) for an unknown or
/// unsupported parameter, or a TLS file given twice.
pub(crate) fn split_params(url: &Url) -> Result<Params> {
    let mut own = Vec::new();
    let mut tls = TlsParams::default();
    let mut rest = Vec::new();
    for (key, value) in url.query_pairs() {
        let (key, value) = (key.into_owned(), value.into_owned());
        if OWN_PARAMS.contains(&key.as_str()) {
            own.push((key, value));
        } else if tls.take(&key, &value)? {
        } else if DRIVER_PARAMS.contains(&key.as_str()) || is_startup_option(&key) {
            rest.push((key, value));
        } else {
            return Err(unknown_param(&key));
        }
    }
    tls.take_env()?;
    let mut driver = url.clone();
    driver.set_query(None);
    if !rest.is_empty() {
        driver.query_pairs_mut().extend_pairs(rest);
    }
    Ok(Params { own, tls, driver })
}

/// `options[NAME]`: a server setting sent at startup.
fn is_startup_option(key: &str) -> bool {
    key.strip_prefix("options[")
        .and_then(|k| k.strip_suffix(']'))
        .is_some_and(|k| !k.is_empty())
}

/// The names this backend reads, for "unknown parameter" messages.
pub(crate) fn known_params() -> String {
    let tls = crate::tls::ALIASES.iter().map(|(alias, _)| *alias);
    let all: Vec<&str> = OWN_PARAMS
        .iter()
        .copied()
        .chain(["ca", "cert", "key"])
        .chain(tls)
        .chain(DRIVER_PARAMS.iter().copied())
        .chain(["options[NAME]"])
        .collect();
    all.join(", ")
}

fn unknown_param(key: &str) -> lockcore::Error {
    if key.contains('@') {
        // Not echoed: most likely the rest of a password with a raw '?'.
        return invalid(
            "unknown PostgreSQL URL parameter (not shown: it holds '@'); percent-encode '?', \
             '#' and '@' in a password as %3F, %23 and %40",
        );
    }
    let why = if key == "sslpassword" {
        "the driver (sqlx) cannot decrypt an encrypted client key; decrypt it once \
         (`openssl pkey -in key.pem -out key-plain.pem`), protect the file (chmod 600) and \
         pass it with `key`"
            .to_owned()
    } else if LIBPQ_UNSUPPORTED.contains(&key) {
        "it is a libpq parameter the driver (sqlx) does not implement".to_owned()
    } else {
        format!("known parameters: {}", known_params())
    };
    invalid(format!(
        "unknown PostgreSQL URL parameter `{key}` refused: {why}"
    ))
}

/// What one URL means: sqlx's options (TLS files applied), the redacted URL, anylock's own
/// parameters and the TLS setup.
#[derive(Debug)]
pub(crate) struct Connection {
    pub(crate) options: PgConnectOptions,
    pub(crate) redacted: String,
    pub(crate) own: Vec<(String, String)>,
    pub(crate) tls: TlsSetup,
}

/// Parses `url`, refuses unknown parameters, reads the TLS files and builds sqlx's options.
///
/// # Errors
/// As [`parse_url`], [`split_params`] and [`TlsParams::apply`].
pub(crate) fn connection(url: &str) -> Result<Connection> {
    let parsed = parse_url(url)?;
    let redacted = redact(&parsed);
    let params = split_params(&parsed)?;
    let options = connect_options(&params.driver, &redacted)?;
    let (options, tls) = params.tls.apply(options)?;
    Ok(Connection {
        options,
        redacted,
        own: params.own,
        tls,
    })
}

fn connect_options(url: &Url, redacted: &str) -> Result<PgConnectOptions> {
    let options = PgConnectOptions::from_str(url.as_str()).map_err(|e| {
        // sqlx's configuration errors describe the bad value, never the password.
        invalid(format!("invalid PostgreSQL URL {redacted}: {e}"))
    })?;
    Ok(match options.get_application_name() {
        Some(_) => options,
        None => options.application_name(DEFAULT_APPLICATION_NAME),
    })
}

/// The URL with the password (in the user info or a secret-looking parameter) replaced.
pub(crate) fn redact(url: &Url) -> String {
    let mut shown = url.clone();
    if shown.password().is_some() {
        // Fails only for URLs that cannot carry a password at all.
        let _ = shown.set_password(Some("***"));
    }
    if url
        .query_pairs()
        .any(|(k, _)| lockcore::is_secret_param(&k))
    {
        let pairs: Vec<(String, String)> = url
            .query_pairs()
            .map(|(k, v)| {
                let v = if lockcore::is_secret_param(&k) {
                    "***".into()
                } else {
                    v
                };
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

    #[test]
    fn the_rest_of_a_password_with_a_raw_question_mark_is_not_echoed() {
        let url = "postgres://app:5432?topsecretpw@127.0.0.1:5432/db";
        let err = PostgresConfig::from_url(url).expect_err("not a usable URL");
        assert_eq!(err.kind(), ErrorKind::InvalidInput);
        let shown = format!("{err} {err:?}");
        assert!(!shown.contains("topsecret"), "{shown}");
    }

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
        let params = super::split_params(&url).expect("known");
        assert_eq!(params.own.len(), 2);
        assert_eq!(params.driver.query(), Some("sslmode=disable"));
    }
}
