//! [`PostgresConfig::from_url`]: a URL read by [`crate::url`] made into a config, with
//! anylock's own parameters applied through the `with_*` builders.

use lockcore::Result;

use crate::config::PostgresConfig;
use crate::error::config_error;
use crate::url::{Own, connection};

impl PostgresConfig {
    /// Parses a `postgres://` or `postgresql://` URL.
    ///
    /// Standard parameters (`sslmode`, `sslrootcert`, `sslcert`, `sslkey`,
    /// `application_name`, `options`, `host`, `port`, `user`, `password`, `dbname`) go to
    /// sqlx. anylock reads `schema`, `table`, `channel`, `pool_size`, `timeout_ms`,
    /// `statement_timeout_ms`, `create_schema` (`true`/`false`) and `prepared_statements`
    /// (`true`/`false`).
    ///
    /// # Errors
    /// [`ErrorKind::InvalidInput`](lockcore::ErrorKind::InvalidInput) for an unparseable
    /// URL, another scheme, or a bad parameter value. The message never shows the password.
    pub fn from_url(url: &str) -> Result<Self> {
        let parsed = connection(url)?;
        let config = Self::with_defaults(parsed.options, parsed.redacted, parsed.tls);
        Ok(apply(config, parsed.own))
    }

    /// Reads the URL from `ANYLOCK_POSTGRES_URL`.
    ///
    /// # Errors
    /// [`ErrorKind::Config`](lockcore::ErrorKind::Config) when the variable is unset; as
    /// [`from_url`](Self::from_url) otherwise.
    pub fn from_env() -> Result<Self> {
        match std::env::var("ANYLOCK_POSTGRES_URL") {
            Ok(url) => Self::from_url(&url),
            Err(_) => Err(config_error("ANYLOCK_POSTGRES_URL is not set")),
        }
    }

    /// Opens the `LISTEN` connection with `url` instead of the main URL. `LISTEN` needs a
    /// session of its own: behind PgBouncer in transaction mode, point this at the server
    /// or at a session-mode pool.
    ///
    /// # Errors
    /// As [`from_url`](Self::from_url).
    pub fn with_listen_url(self, url: &str) -> Result<Self> {
        let parsed = connection(url)?;
        Ok(self.with_listen(parsed.options, parsed.redacted))
    }
}

/// The config with each parameter the URL gave applied.
fn apply(mut config: PostgresConfig, own: Own) -> PostgresConfig {
    if let Some(schema) = own.schema {
        config = config.with_schema(schema);
    }
    if let Some(table) = own.table {
        config = config.with_table(table);
    }
    if let Some(channel) = own.channel {
        config = config.with_channel(channel);
    }
    if let Some(size) = own.pool_size {
        config = config.with_pool_size(size);
    }
    if let Some(timeout) = own.timeout {
        config = config.with_timeout(timeout);
    }
    if let Some(limit) = own.statement_timeout {
        config = config.with_statement_timeout(limit);
    }
    if let Some(create) = own.create_schema {
        config = config.with_create_schema(create);
    }
    if let Some(prepared) = own.prepared_statements {
        config = config.with_prepared_statements(prepared);
    }
    config
}
