//! Reading `postgres://` URLs: the scheme check, anylock's own query parameters, the
//! options handed to sqlx, and the password-free form used in every message.

use std::str::FromStr;
use std::time::Duration;

use lockcore::Result;
use lockcore::url::Query;
use sqlx::postgres::PgConnectOptions;
use url::Url;

use crate::error::{BACKEND, invalid};
use crate::names::DEFAULT_APPLICATION_NAME;
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

/// anylock's own parameters of one URL, each read by its typed reader.
#[derive(Debug, Default)]
pub(crate) struct Own {
    pub(crate) schema: Option<String>,
    pub(crate) table: Option<String>,
    pub(crate) channel: Option<String>,
    pub(crate) pool_size: Option<u32>,
    pub(crate) timeout: Option<Duration>,
    pub(crate) statement_timeout: Option<Duration>,
    pub(crate) create_schema: Option<bool>,
    pub(crate) prepared_statements: Option<bool>,
}

impl Own {
    /// Takes anylock's own parameters out of `query`.
    ///
    /// # Errors
    /// [`ErrorKind::InvalidInput`](lockcore::ErrorKind::InvalidInput) naming the parameter
    /// whose value does not read (never the value).
    fn take(query: &mut Query) -> Result<Self> {
        Ok(Self {
            schema: query.take("schema"),
            table: query.take("table"),
            channel: query.take("channel"),
            pool_size: query.take_parsed("pool_size", "a whole number")?,
            timeout: query.take_millis("timeout_ms")?,
            statement_timeout: query
                .take_parsed::<u64>(
                    "statement_timeout_ms",
                    "a whole number of milliseconds (0 sets none)",
                )?
                .map(Duration::from_millis),
            create_schema: query.take_flag("create_schema")?,
            prepared_statements: query.take_flag("prepared_statements")?,
        })
    }
}

/// A URL's query, sorted: anylock's own parameters, the TLS files, and a URL holding only
/// what sqlx reads.
#[derive(Debug)]
pub(crate) struct Params {
    pub(crate) own: Own,
    pub(crate) tls: TlsParams,
    pub(crate) driver: Url,
}

/// Sorts the query's parameters; refuses any that neither anylock nor sqlx reads, naming
/// it (never its value: a misspelled `password` holds a secret) and listing the known ones.
///
/// # Errors
/// [`ErrorKind::InvalidInput`](lockcore::ErrorKind::InvalidInput) for an unknown,
/// unsupported or repeated parameter, a bad value, or a TLS file given twice.
pub(crate) fn split_params(url: &Url) -> Result<Params> {
    let mut query = Query::parse(BACKEND, url.query().unwrap_or(""))?;
    let own = Own::take(&mut query)?;
    let driver_pairs = query.take_matching(|k| DRIVER_PARAMS.contains(&k) || is_startup_option(k));
    let explicit_mode = driver_pairs
        .iter()
        .any(|(k, _)| matches!(k.as_str(), "sslmode" | "ssl-mode"));
    let tls = TlsParams::read(&mut query, explicit_mode)?;
    refuse_unsupported(&mut query)?;
    query.finish(&known_params())?;
    let mut driver = url.clone();
    driver.set_query(None);
    if !driver_pairs.is_empty() {
        driver.query_pairs_mut().extend_pairs(driver_pairs);
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
fn known_params() -> Vec<&'static str> {
    let tls = crate::tls::ALIASES.iter().map(|(alias, _)| *alias);
    OWN_PARAMS
        .iter()
        .copied()
        .chain(["ca", "cert", "key"])
        .chain(tls)
        .chain(DRIVER_PARAMS.iter().copied())
        .chain(["options[NAME]"])
        .collect()
}

/// Refuses `sslpassword` and the libpq parameters the driver does not implement with the
/// reason, rather than as unknown.
fn refuse_unsupported(query: &mut Query) -> Result<()> {
    let mut unsupported =
        query.take_matching(|k| k == "sslpassword" || LIBPQ_UNSUPPORTED.contains(&k));
    let Some((key, _)) = unsupported.drain(..).next() else {
        return Ok(());
    };
    let why = if key == "sslpassword" {
        "the driver (sqlx) cannot decrypt an encrypted client key; decrypt it once \
         (`openssl pkey -in key.pem -out key-plain.pem`), protect the file (chmod 600) and \
         pass it with `key`"
    } else {
        "it is a libpq parameter the driver (sqlx) does not implement"
    };
    Err(invalid(format!(
        "the {BACKEND} URL parameter `{key}` is not supported: {why}"
    )))
}

/// What one URL means: sqlx's options (TLS files applied), the redacted URL, anylock's own
/// parameters and the TLS setup.
#[derive(Debug)]
pub(crate) struct Connection {
    pub(crate) options: PgConnectOptions,
    pub(crate) redacted: String,
    pub(crate) own: Own,
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

/// The URL with the password (in the user info or a secret-looking parameter) replaced:
/// [`lockcore::url::redact`].
pub(crate) fn redact(url: &Url) -> String {
    lockcore::url::redact(url.as_str())
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
    fn parameters_are_read_by_the_shared_reader() {
        for (query, message) in [
            (
                "timeout_ms=soon",
                "the postgres URL parameter `timeout_ms` must be a positive whole number of \
                 milliseconds",
            ),
            (
                "create_schema=maybe",
                "the postgres URL parameter `create_schema` must be true or false",
            ),
            (
                "pool_size=-1",
                "the postgres URL parameter `pool_size` must be a whole number",
            ),
            (
                "schema=a&schema=b",
                "the postgres URL parameter `schema` is given twice; give it once",
            ),
            (
                "sslcrl=/crl.pem",
                "the postgres URL parameter `sslcrl` is not supported: it is a libpq parameter \
                 the driver (sqlx) does not implement",
            ),
        ] {
            let url = Url::parse(&format!("postgres://h/db?{query}")).expect("url");
            let err = super::split_params(&url).expect_err(query);
            assert_eq!(err.kind(), ErrorKind::InvalidInput, "{query}");
            assert_eq!(err.message(), message, "{query}");
        }
        let url = Url::parse("postgres://h/db?sslmod=S3CRET").expect("url");
        let err = super::split_params(&url).expect_err("unknown");
        assert!(
            err.message()
                .starts_with("unknown postgres URL parameter `sslmod`; known: schema, table"),
            "{err}"
        );
        assert!(!err.to_string().contains("S3CRET"), "{err}");
        let url = Url::parse("postgres://h/db?statement_timeout_ms=0&prepared_statements=off")
            .expect("url");
        let own = super::split_params(&url).expect("valid").own;
        assert_eq!(own.statement_timeout, Some(std::time::Duration::ZERO));
        assert_eq!(own.prepared_statements, Some(false));
    }

    #[test]
    fn own_parameters_are_not_passed_to_sqlx() {
        let url = Url::parse("postgres://h/db?schema=s&sslmode=disable&table=t").expect("url");
        let params = super::split_params(&url).expect("known");
        assert_eq!(params.own.schema.as_deref(), Some("s"));
        assert_eq!(params.own.table.as_deref(), Some("t"));
        assert_eq!(params.driver.query(), Some("sslmode=disable"));
    }
}
