//! Authentication and privilege failures worded for a person: who was refused, what is
//! missing, and the statement or setting that fixes it. Never the password.

use crate::names::{Names, quote_identifier};
use crate::tls::TlsSetup;

/// Who the backend connects as, how, and which objects it uses, for the fixes it suggests.
#[derive(Debug, Clone)]
pub(crate) struct Who {
    /// The role name.
    pub(crate) user: String,
    /// The quoted schema, table and sequence names.
    pub(crate) names: Names,
    /// The TLS setup, for what to do when TLS fails.
    pub(crate) tls: TlsSetup,
}

/// The message for SQLSTATE `code` (server text `message`) when it is an authentication or
/// privilege failure; `None` otherwise.
pub(crate) fn hint(code: &str, message: &str, who: Option<&Who>) -> Option<String> {
    let user = who.map_or_else(
        || "the configured user".to_owned(),
        |w| format!("user {:?}", w.user),
    );
    match code {
        "28P01" => Some(format!(
            "authentication as {user} failed: {message} (SQLSTATE 28P01); check the user name \
             and password in the URL"
        )),
        "28000" => Some(format!(
            "authentication as {user} refused: {message} (SQLSTATE 28000); the server's \
             pg_hba.conf has no rule for this user, database and connection type, or it \
             requires a client certificate (URL parameters `cert` and `key`) the server trusts"
        )),
        "42501" if message.starts_with("must be owner of table") => {
            Some(owner_needed(message, &user, who))
        }
        "42501" => Some(privilege(message, &user, who)),
        _ => None,
    }
}

/// `permission denied for <kind> <name>`, with the grant that fixes it.
fn privilege(message: &str, user: &str, who: Option<&Who>) -> String {
    let role = who.map_or_else(|| "<role>".to_owned(), |w| quote(&w.user));
    let object = message
        .strip_prefix("permission denied for ")
        .and_then(|rest| rest.split_once(' '));
    let fix = match (object, who) {
        (Some(("database", db)), Some(w)) => format!(
            "the backend creates its schema {schema} on first use, which needs CREATE on the \
             database: GRANT CREATE ON DATABASE {db} TO {role}; or have the owner create the \
             schema, table and sequence once and grant this role USAGE on the schema, \
             SELECT, INSERT, UPDATE on {table} and USAGE on {sequence} \
             (docs/tls-and-auth.md, least privilege)",
            db = quote(db),
            schema = w.names.schema,
            table = w.names.table,
            sequence = w.names.sequence,
        ),
        (Some(("schema", schema)), Some(w)) => format!(
            "GRANT USAGE ON SCHEMA {schema} TO {role} (and CREATE ON SCHEMA if this role must \
             create {table})",
            schema = quote(schema),
            table = w.names.table,
        ),
        (Some(("table", table)), Some(w)) if table == w.names.permit_objects[0] => format!(
            "GRANT SELECT, INSERT, UPDATE, DELETE ON {permits} TO {role} (semaphore permits)",
            permits = w.names.permits
        ),
        (Some(("sequence", sequence)), Some(w)) if sequence == w.names.permit_objects[1] => {
            format!(
                "GRANT USAGE ON SEQUENCE {sequence} TO {role} (semaphore permits)",
                sequence = w.names.permit_sequence
            )
        }
        (Some(("table", _)), Some(w)) => format!(
            "GRANT SELECT, INSERT, UPDATE ON {table} TO {role}",
            table = w.names.table
        ),
        (Some(("sequence", _)), Some(w)) => format!(
            "GRANT USAGE ON SEQUENCE {sequence} TO {role}",
            sequence = w.names.sequence
        ),
        _ => "see docs/tls-and-auth.md for the privileges the backend needs".to_owned(),
    };
    format!("{user} lacks a privilege: {message} (SQLSTATE 42501); fix: {fix}")
}

/// Adding the `note` column to a table made by an older version needs its owner.
fn owner_needed(message: &str, user: &str, who: Option<&Who>) -> String {
    let table = who.map_or_else(|| "<table>".to_owned(), |w| w.names.table.clone());
    format!(
        "{user} cannot upgrade the lease table: {message} (SQLSTATE 42501); the table was made \
         by an older version and lacks the `note` column; as the table's owner run once: \
         ALTER TABLE {table} ADD COLUMN IF NOT EXISTS note text (docs/postgres.md, upgrading)"
    )
}

/// An identifier as SQL needs it.
fn quote(name: &str) -> String {
    quote_identifier(name)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn who() -> Who {
        let config = crate::PostgresConfig::from_url("postgres://app@h/db").expect("valid");
        Who {
            user: "app".into(),
            names: config.names(),
            tls: config.tls(),
        }
    }

    #[test]
    fn a_missing_database_privilege_names_the_grant_and_the_alternative() {
        let shown = hint("42501", "permission denied for database db", Some(&who()))
            .expect("a privilege failure");
        assert!(
            shown.contains("GRANT CREATE ON DATABASE \"db\" TO \"app\""),
            "{shown}"
        );
        assert!(shown.contains("USAGE on the schema"), "{shown}");
    }

    #[test]
    fn table_schema_and_sequence_privileges_name_their_grant() {
        let w = who();
        for (message, grant) in [
            (
                "permission denied for schema anylock",
                "GRANT USAGE ON SCHEMA",
            ),
            (
                "permission denied for table leases",
                "GRANT SELECT, INSERT, UPDATE ON",
            ),
            (
                "permission denied for sequence leases_fence",
                "GRANT USAGE ON SEQUENCE",
            ),
            (
                "permission denied for table leases_sem",
                "GRANT SELECT, INSERT, UPDATE, DELETE ON \"anylock\".\"leases_sem\"",
            ),
            (
                "permission denied for sequence leases_semf",
                "GRANT USAGE ON SEQUENCE \"anylock\".\"leases_semf\"",
            ),
        ] {
            let shown = hint("42501", message, Some(&w)).expect("denied");
            assert!(shown.contains(grant), "{shown}");
        }
    }

    #[test]
    fn authentication_failures_name_the_user() {
        let shown = hint(
            "28000",
            "connection requires a valid client certificate",
            Some(&who()),
        )
        .expect("auth");
        assert!(shown.contains("user \"app\""), "{shown}");
        assert!(shown.contains("authentication"), "{shown}");
        assert!(hint("23505", "duplicate key", Some(&who())).is_none());
    }
}
