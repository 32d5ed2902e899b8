//! Server-side bounds on the backend's statements (issue #14): a client that gave up on a
//! statement must not leave it running, for example still waiting for a row lock and then
//! taking a lease for a caller that already reported failure.
//!
//! PostgreSQL's `statement_timeout` and `lock_timeout` carry the bound, set without an
//! extra round trip:
//! - with prepared statements, as startup options of every pooled connection
//!   (`-c statement_timeout=… -c lock_timeout=…`);
//! - without them (the PgBouncer mode: a pooler hands each transaction any server
//!   session, and PgBouncer refuses the `options` startup parameter), as `SET LOCAL` in the
//!   same simple query as the `BEGIN` that already wraps every operation.
//!
//! Fenced transactions begin the same way, so statements run in them are bounded too.

use std::time::Duration;

use sqlx::postgres::PgConnectOptions;
use sqlx::{AssertSqlSafe, SqlSafeStr, SqlStr};

/// PostgreSQL's largest `statement_timeout`: `INT_MAX` milliseconds (about 24.8 days).
pub const MAX_STATEMENT_TIMEOUT: Duration = Duration::from_millis(i32::MAX as u64);

/// `limit` as a GUC value in milliseconds, at least 1 ms (0 would turn the bound off).
fn guc(limit: Duration) -> String {
    let ms = limit
        .as_millis()
        .clamp(1, MAX_STATEMENT_TIMEOUT.as_millis());
    format!("{ms}ms")
}

/// `options` with both timeouts as startup options, when there is a limit.
pub(crate) fn startup_options(
    options: PgConnectOptions,
    limit: Option<Duration>,
) -> PgConnectOptions {
    match limit {
        Some(limit) => {
            let value = guc(limit);
            options.options([
                ("statement_timeout", value.as_str()),
                ("lock_timeout", value.as_str()),
            ])
        }
        None => options,
    }
}

/// The statement that begins every explicit transaction: `BEGIN` and, when there is a
/// limit, both timeouts for this transaction only.
pub(crate) fn begin_statement(limit: Option<Duration>) -> SqlStr {
    let text = match limit {
        Some(limit) => {
            let value = guc(limit);
            format!(
                "BEGIN; SET LOCAL statement_timeout = '{value}'; SET LOCAL lock_timeout = '{value}'"
            )
        }
        None => "BEGIN".to_owned(),
    };
    AssertSqlSafe(text).into_sql_str()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::PostgresConfig;
    use lockcore::ErrorKind;

    #[test]
    fn limits_become_millisecond_settings() {
        let begin = begin_statement(Some(Duration::from_micros(1_500)));
        assert_eq!(
            begin.as_str(),
            "BEGIN; SET LOCAL statement_timeout = '1ms'; SET LOCAL lock_timeout = '1ms'"
        );
        assert_eq!(begin_statement(None).as_str(), "BEGIN");
        assert_eq!(guc(Duration::ZERO), "1ms", "0 would mean no bound");
        assert_eq!(guc(Duration::from_secs(u64::MAX)), "2147483647ms");
        let options = startup_options(PgConnectOptions::new(), Some(Duration::from_secs(2)));
        let shown = options.get_options().unwrap_or_default().to_owned();
        assert!(shown.contains("statement_timeout=2000ms"), "{shown}");
        assert!(shown.contains("lock_timeout=2000ms"), "{shown}");
    }

    #[test]
    fn the_statement_timeout_follows_the_timeout_unless_set() {
        let base = PostgresConfig::from_url("postgres://h/db?timeout_ms=2500").expect("valid");
        assert_eq!(base.statement_timeout(), Some(Duration::from_millis(2500)));
        let own = PostgresConfig::from_url("postgres://h/db?statement_timeout_ms=700");
        assert_eq!(
            own.expect("valid").statement_timeout(),
            Some(Duration::from_millis(700))
        );
        let off = base.clone().with_statement_timeout(Duration::ZERO);
        assert_eq!(off.statement_timeout(), None);
        assert_eq!(off.connect_options().get_options(), None);
        let options = base.connect_options();
        assert!(options.get_options().is_some_and(|o| o.contains("2500ms")));
        let pooled = base.clone().with_prepared_statements(false);
        assert_eq!(
            pooled.connect_options().get_options(),
            None,
            "PgBouncer refuses them"
        );
        let huge = base.with_statement_timeout(Duration::from_secs(30 * 86_400));
        assert_eq!(huge.validate().unwrap_err().kind(), ErrorKind::InvalidInput);
    }
}
