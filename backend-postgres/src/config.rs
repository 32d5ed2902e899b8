//! [`PostgresConfig`]: how to reach the server and where the lease table lives.
//!
//! A config comes from a URL (`postgres://user:pass@host:port/db?sslmode=...`), plus
//! anylock's own query parameters, and can be adjusted with the `with_*` methods. Nothing is
//! validated against the server until [`PostgresBackend::connect`](crate::PostgresBackend);
//! [`PostgresConfig::validate`] checks everything that can be checked locally.
//!
//! `Debug` and `Display` show the URL with its password replaced by `***`; no error message
//! built from a config ever contains the password.

use std::fmt;
use std::str::FromStr;
use std::time::Duration;

use lockcore::{Error, Result};
use sqlx::postgres::PgConnectOptions;

use crate::error::invalid;
use crate::limits::{self, MAX_STATEMENT_TIMEOUT};
use crate::names::{DEFAULT_APPLICATION_NAME, MAX_IDENTIFIER_LEN, MAX_TABLE_LEN, Names, truncate};
use crate::tls::TlsSetup;

/// The schema used unless the URL or [`PostgresConfig::with_schema`] names another.
pub const DEFAULT_SCHEMA: &str = "anylock";
/// The table used unless the URL or [`PostgresConfig::with_table`] names another.
pub const DEFAULT_TABLE: &str = "leases";
/// The most pooled connections one backend opens (the listener's connection is extra).
pub const DEFAULT_POOL_SIZE: u32 = 10;
/// The client-side bound on one operation: getting a connection plus running it.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(10);
/// Connection settings and table location for [`PostgresBackend`](crate::PostgresBackend).
///
/// ```
/// use backend_postgres::PostgresConfig;
/// let config = PostgresConfig::from_url(
///     "postgres://app:s3cret@db.internal:5432/app?sslmode=require&schema=locks",
/// )?
/// .with_pool_size(4);
/// assert_eq!(config.schema(), "locks");
/// assert!(!config.to_string().contains("s3cret"));
/// # Ok::<(), lockcore::Error>(())
/// ```
#[derive(Clone)]
pub struct PostgresConfig {
    connect: PgConnectOptions,
    redacted: String,
    tls: TlsSetup,
    listen: Option<(PgConnectOptions, String)>,
    schema: String,
    table: String,
    channel: Option<String>,
    pool_size: u32,
    timeout: Duration,
    statement_timeout: Option<Duration>,
    create_schema: bool,
    prepared_statements: bool,
}

impl PostgresConfig {
    /// Uses `schema` for the lease table and its fence sequence (default
    /// [`DEFAULT_SCHEMA`]). Any characters are allowed except NUL and control characters;
    /// the name is always quoted, so case and spaces are kept as given.
    pub fn with_schema(mut self, schema: impl Into<String>) -> Self {
        self.schema = schema.into();
        self
    }

    /// Uses `table` for the leases (default [`DEFAULT_TABLE`]); quoted like the schema, at
    /// most [`MAX_TABLE_LEN`] bytes.
    pub fn with_table(mut self, table: impl Into<String>) -> Self {
        self.table = table.into();
        self
    }

    /// Publishes and listens for releases on `channel` (default `anylock:<schema>.<table>`,
    /// cut to 63 bytes). Tables that share a channel only cause spurious wake-ups.
    pub fn with_channel(mut self, channel: impl Into<String>) -> Self {
        self.channel = Some(channel.into());
        self
    }

    /// Opens at most `size` pooled connections (default [`DEFAULT_POOL_SIZE`]).
    pub fn with_pool_size(mut self, size: u32) -> Self {
        self.pool_size = size;
        self
    }

    /// Bounds one operation, connection checkout included (default [`DEFAULT_TIMEOUT`]).
    /// A write that times out after it was sent reports
    /// [`ErrorKind::OutcomeUnknown`](lockcore::ErrorKind::OutcomeUnknown).
    pub fn with_timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    /// Bounds every statement the backend runs on the server (`statement_timeout` and
    /// `lock_timeout`), so a statement the client gave up on does not run on (default: the
    /// [timeout](Self::with_timeout)). `Duration::ZERO` sets nothing, leaving the
    /// server's and role's settings. Statements in a [`FencedTx`](crate::FencedTx) are
    /// bounded too; raise it, or `SET LOCAL statement_timeout` inside one, for longer work.
    pub fn with_statement_timeout(mut self, limit: Duration) -> Self {
        self.statement_timeout = Some(limit);
        self
    }

    /// Whether [`connect`](crate::PostgresBackend::connect) creates a missing schema, table
    /// and sequence (default `true`). With `false` a missing table is a
    /// [`Config`](lockcore::ErrorKind::Config) error, for roles without `CREATE`.
    pub fn with_create_schema(mut self, create: bool) -> Self {
        self.create_schema = create;
        self
    }

    /// Whether statements are prepared once per connection and reused (default `true`).
    ///
    /// Turn it off behind PgBouncer in transaction mode older than 1.21 (or with
    /// `max_prepared_statements = 0`), which cannot keep named statements. Each operation
    /// then runs its one statement unnamed inside `BEGIN`/`COMMIT`, which keeps PgBouncer
    /// from handing the server connection to another client between sqlx's parse and
    /// execute steps: four round trips instead of one.
    pub fn with_prepared_statements(mut self, prepared: bool) -> Self {
        self.prepared_statements = prepared;
        self
    }

    /// The schema name, unquoted.
    pub fn schema(&self) -> &str {
        &self.schema
    }

    /// The table name, unquoted.
    pub fn table(&self) -> &str {
        &self.table
    }

    /// The notification channel releases are published on.
    pub fn channel(&self) -> String {
        match &self.channel {
            Some(channel) => channel.clone(),
            None => truncate(&format!("anylock:{}.{}", self.schema, self.table)),
        }
    }

    /// The pool size.
    pub fn pool_size(&self) -> u32 {
        self.pool_size
    }

    /// The per-operation timeout.
    pub fn timeout(&self) -> Duration {
        self.timeout
    }

    /// The server-side bound on each statement, `None` when none is set (see
    /// [`with_statement_timeout`](Self::with_statement_timeout)).
    pub fn statement_timeout(&self) -> Option<Duration> {
        match self.statement_timeout {
            None => Some(self.timeout.min(MAX_STATEMENT_TIMEOUT)),
            Some(limit) if limit.is_zero() => None,
            Some(limit) => Some(limit),
        }
    }

    /// Whether a missing table is created on connect.
    pub fn create_schema(&self) -> bool {
        self.create_schema
    }

    /// Whether statements are prepared and cached per connection.
    pub fn prepared_statements(&self) -> bool {
        self.prepared_statements
    }

    /// What the main connections are set up to check and present (TLS).
    pub(crate) fn tls(&self) -> TlsSetup {
        self.tls
    }

    /// The server's `host:port` (or socket path), for reports.
    pub(crate) fn endpoint(&self) -> String {
        match self.connect.get_socket() {
            Some(path) => path.display().to_string(),
            None => format!("{}:{}", self.connect.get_host(), self.connect.get_port()),
        }
    }

    /// The user name the server is asked to authenticate.
    pub(crate) fn user(&self) -> &str {
        self.connect.get_username()
    }

    /// The URL with the password replaced by `***`.
    pub fn redacted_url(&self) -> &str {
        &self.redacted
    }

    /// Checks everything that can be checked without a server.
    ///
    /// # Errors
    /// [`ErrorKind::InvalidInput`](lockcore::ErrorKind::InvalidInput) for a bad schema,
    /// table or channel name, a zero pool size, a zero timeout or a statement timeout above
    /// [`MAX_STATEMENT_TIMEOUT`].
    pub fn validate(&self) -> Result<()> {
        check_identifier("schema", &self.schema, MAX_IDENTIFIER_LEN)?;
        if self.schema.starts_with("pg_") {
            return Err(invalid(format!(
                "schema name {:?} is reserved: names starting with pg_ belong to PostgreSQL",
                self.schema
            )));
        }
        check_identifier("table", &self.table, MAX_TABLE_LEN)?;
        check_identifier("channel", &self.channel(), MAX_IDENTIFIER_LEN)?;
        if self.pool_size == 0 {
            return Err(invalid("pool_size must be at least 1"));
        }
        if self.timeout.is_zero() {
            return Err(invalid("timeout must be greater than zero"));
        }
        if self.statement_timeout > Some(MAX_STATEMENT_TIMEOUT) {
            return Err(invalid(format!(
                "statement_timeout must be at most {} ms (PostgreSQL's limit), or 0 to set none",
                MAX_STATEMENT_TIMEOUT.as_millis()
            )));
        }
        Ok(())
    }

    /// The sqlx options for the pool: with prepared statements, the statement timeout
    /// travels as startup options (see [`limits`](crate::limits)).
    pub(crate) fn connect_options(&self) -> PgConnectOptions {
        let options = self.connect.clone();
        if self.prepared_statements {
            return limits::startup_options(options, self.statement_timeout());
        }
        options
    }

    /// The sqlx options for the `LISTEN` connection, with `(listen)` added to the
    /// application name so operators can tell it apart in `pg_stat_activity`.
    pub(crate) fn listen_options(&self) -> PgConnectOptions {
        let base = self.listen.as_ref().map_or(&self.connect, |(o, _)| o);
        let app = base
            .get_application_name()
            .unwrap_or(DEFAULT_APPLICATION_NAME);
        base.clone()
            .application_name(&truncate(&format!("{app} (listen)")))
    }

    /// The quoted names of the schema, table and fence sequence.
    pub(crate) fn names(&self) -> Names {
        Names::new(&self.schema, &self.table)
    }

    /// A config with the defaults for the server `connect` reaches (`redacted` shows its
    /// URL, `tls` what its connections check).
    pub(crate) fn with_defaults(
        connect: PgConnectOptions,
        redacted: String,
        tls: TlsSetup,
    ) -> Self {
        Self {
            connect,
            redacted,
            tls,
            listen: None,
            schema: DEFAULT_SCHEMA.to_owned(),
            table: DEFAULT_TABLE.to_owned(),
            channel: None,
            pool_size: DEFAULT_POOL_SIZE,
            timeout: DEFAULT_TIMEOUT,
            statement_timeout: None,
            create_schema: true,
            prepared_statements: true,
        }
    }

    /// Opens the `LISTEN` connection with `options` (`redacted` shows its URL).
    pub(crate) fn with_listen(mut self, options: PgConnectOptions, redacted: String) -> Self {
        self.listen = Some((options, redacted));
        self
    }
}

impl fmt::Debug for PostgresConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PostgresConfig")
            .field("url", &self.redacted)
            .field("listen_url", &self.listen.as_ref().map(|(_, r)| r))
            .field("schema", &self.schema)
            .field("table", &self.table)
            .field("channel", &self.channel())
            .field("pool_size", &self.pool_size)
            .field("timeout", &self.timeout)
            .field("statement_timeout", &self.statement_timeout())
            .field("create_schema", &self.create_schema)
            .field("prepared_statements", &self.prepared_statements)
            .finish()
    }
}

impl fmt::Display for PostgresConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} (table {:?}.{:?})",
            self.redacted, self.schema, self.table
        )
    }
}

impl FromStr for PostgresConfig {
    type Err = Error;

    fn from_str(url: &str) -> Result<Self> {
        Self::from_url(url)
    }
}

/// Accepts 1 to `max` bytes without NUL or control characters.
fn check_identifier(what: &str, name: &str, max: usize) -> Result<()> {
    if name.is_empty() {
        return Err(invalid(format!("{what} name is empty")));
    }
    if name.len() > max {
        return Err(invalid(format!(
            "{what} name {name:?} is {} bytes long; the limit is {max}",
            name.len()
        )));
    }
    if name.chars().any(char::is_control) {
        return Err(invalid(format!(
            "{what} name {name:?} contains a control character"
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::names::quote_identifier;
    use lockcore::ErrorKind;

    const URL: &str = "postgres://app:pa%40ss@db.example:6543/locks?sslmode=require";

    #[test]
    fn parses_connection_settings_and_own_parameters() {
        let config = PostgresConfig::from_url(&format!(
            "{URL}&application_name=worker&schema=My%20Schema&table=t&pool_size=3&timeout_ms=250\
             &create_schema=false&prepared_statements=off"
        ))
        .expect("valid");
        let options = config.connect_options();
        assert_eq!(options.get_host(), "db.example");
        assert_eq!(options.get_port(), 6543);
        assert_eq!(options.get_username(), "app");
        assert_eq!(options.get_database(), Some("locks"));
        assert_eq!(options.get_application_name(), Some("worker"));
        assert!(matches!(
            options.get_ssl_mode(),
            sqlx::postgres::PgSslMode::Require
        ));
        assert_eq!(config.schema(), "My Schema");
        assert_eq!(config.table(), "t");
        assert_eq!(config.pool_size(), 3);
        assert_eq!(config.timeout(), Duration::from_millis(250));
        assert!(!config.create_schema());
        assert!(!config.prepared_statements());
        assert_eq!(config.channel(), "anylock:My Schema.t");
        config.validate().expect("valid");
    }

    #[test]
    fn defaults_name_the_application_and_the_listener() {
        let config = PostgresConfig::from_url("postgresql://localhost/db").expect("valid");
        assert_eq!(
            config.connect_options().get_application_name(),
            Some(DEFAULT_APPLICATION_NAME)
        );
        assert_eq!(
            config.listen_options().get_application_name(),
            Some("anylock (listen)")
        );
        assert_eq!(config.schema(), DEFAULT_SCHEMA);
        assert_eq!(config.table(), DEFAULT_TABLE);
    }

    #[test]
    fn rejects_other_schemes_and_bad_values() {
        for url in [
            "mysql://h/db",
            "not a url",
            "postgres://h/db?pool_size=-1",
            "postgres://h/db?timeout_ms=soon",
            "postgres://h/db?create_schema=maybe",
        ] {
            let err = PostgresConfig::from_url(url).expect_err(url);
            assert_eq!(err.kind(), ErrorKind::InvalidInput, "{url}: {err}");
        }
    }

    #[test]
    fn validates_identifiers() {
        let base = PostgresConfig::from_url("postgres://h/db").expect("valid");
        let odd = base
            .clone()
            .with_schema("we\"ird; DROP")
            .with_table("ünï cødé");
        odd.validate().expect("odd but valid names");
        for bad in [
            base.clone().with_schema(""),
            base.clone().with_schema("pg_catalog"),
            base.clone().with_schema("a\0b"),
            base.clone().with_table("x".repeat(MAX_TABLE_LEN + 1)),
            base.clone().with_table("tab\tle"),
            base.clone().with_channel("c".repeat(64)),
            base.clone().with_pool_size(0),
            base.clone().with_timeout(Duration::ZERO),
        ] {
            let err = bad.validate().expect_err("invalid");
            assert_eq!(err.kind(), ErrorKind::InvalidInput, "{err}");
        }
    }

    #[test]
    fn quotes_identifiers_and_truncates_channels_on_char_boundaries() {
        assert_eq!(quote_identifier("a\"b"), "\"a\"\"b\"");
        let long = "é".repeat(40);
        let config = PostgresConfig::from_url("postgres://h/db")
            .expect("valid")
            .with_table(long);
        let channel = config.channel();
        assert!(channel.len() <= MAX_IDENTIFIER_LEN);
        assert!(channel.starts_with("anylock:anylock.é"));
    }
}
