//! The SQL the backend sends, built once per backend from the quoted table names.
//!
//! Parameters are always bound (`$1`...): lock names, owners and tokens never become part
//! of a statement's text. Only the schema, table and sequence names are spliced in, and only
//! after [`quote_identifier`](crate::names::quote_identifier).
//!
//! Time is always the database's: `now()` (the statement's start) where an earlier instant
//! is the safe side (setting an expiry, deciding that a lease has expired and may be taken
//! over), `clock_timestamp()` where a later instant is (deciding that a lease is still live
//! when refreshing it, fencing a write, reporting what is left).

use sqlx::{AssertSqlSafe, SqlSafeStr, SqlStr};

use crate::names::Names;

/// Columns describing a holder: identity, token, note, grant time and time left, both in
/// microseconds so no date-time crate is needed.
///
/// The time left is read by `clock_timestamp()`, after the statement judged the lease live
/// by `now()`, its transaction's start (for a permit, before the name's advisory lock was
/// waited for): a lease that ended in between still reports 1 µs (rounded up,
/// never zero), as `HolderInfo::with_expires_in` asks of a live lease, so a waiter wakes at
/// once rather than after its backoff. Only a lease already over at `now()` (a permit whose
/// row a fenced transaction holds) reports 0.
pub(crate) const HOLDER: &str = "owner, token, note, \
    (extract(epoch FROM acquired_at) * 1000000)::bigint AS acquired_at_us, \
    CASE WHEN expires_at > now() \
         THEN greatest(1, ceil(extract(epoch FROM expires_at - clock_timestamp()) * 1000000)) \
         ELSE 0 END::bigint AS expires_in_us";

/// Every statement of the lock protocol, ready to bind.
#[derive(Debug, Clone)]
pub(crate) struct Statements {
    /// `$1` name, `$2` owner, `$3` TTL in µs, `$4` note (NULL for none). Takes a free,
    /// expired or own row, or inserts a new one, writing the note with the grant; one row
    /// `(acquired, owner, token, note, acquired_at_us, expires_in_us)`, or no row when the
    /// lock changed hands during the statement.
    pub(crate) acquire: SqlStr,
    /// `$1` name: the live holder, if any (inspect, and acquire's second read).
    pub(crate) holder: SqlStr,
    /// `$1` name, `$2` owner, `$3` token, `$4` TTL in µs: one row
    /// `(i, refreshed, owner, token, live)`, the last three from the row as it was.
    /// [`refresh_many`](Self::refresh_many) for one lease, with a cheaper plan.
    pub(crate) refresh: SqlStr,
    /// `$1` names, `$2` owners, `$3` tokens, `$4` TTLs in µs (arrays, one element per
    /// lease): one row per lease, in order, as [`refresh`](Self::refresh) gives for one.
    pub(crate) refresh_many: SqlStr,
    /// `$1` name, `$2` owner, `$3` token, `$4` channel: clears our grant, keeps the row
    /// (and so the last token) and notifies the channel with the lock name.
    pub(crate) release: SqlStr,
    /// `$1` name, `$2` owner, `$3` token, `$4` idle limit: verifies the live grant and
    /// locks its row `FOR KEY SHARE` until the transaction ends.
    pub(crate) fence: SqlStr,
    /// `$1` name, `$2` channel: clears whatever grant the row holds (an operator's break),
    /// keeps the token, notifies, and returns the removed holder with `live`.
    pub(crate) break_lock: SqlStr,
    /// `$1` prefix: every live grant whose name starts with the prefix, byte for byte,
    /// `(name, holder columns)` in byte order of the names.
    pub(crate) list: SqlStr,
}

impl Statements {
    pub(crate) fn new(names: &Names) -> Self {
        let t = &names.table;
        Self {
            acquire: sql(acquire(t)),
            holder: sql(format!(
                "SELECT {HOLDER} FROM {t} \
                 WHERE name = $1 AND owner IS NOT NULL AND expires_at > clock_timestamp()"
            )),
            refresh: refresh_one(t, LOCK_ROW),
            refresh_many: refresh_many(t, LOCK_ROW),
            release: sql(format!(
                "WITH released AS ( \
                   UPDATE {t} SET owner = NULL, acquired_at = NULL, expires_at = NULL, \
                          note = NULL \
                    WHERE name = $1 AND owner = $2 AND token = $3 \
                   RETURNING name) \
                 SELECT pg_notify($4, name) FROM released"
            )),
            break_lock: sql(break_lock(t)),
            list: sql(list(t)),
            fence: sql(format!(
                "SELECT token, set_config('idle_in_transaction_session_timeout', $4, true) \
                   FROM {t} \
                  WHERE name = $1 AND owner = $2 AND token = $3 \
                    AND expires_at > clock_timestamp() \
                    FOR KEY SHARE"
            )),
        }
    }
}

/// The one-statement acquire.
///
/// `taken` updates an existing row that is free, expired or ours; `created` inserts the
/// first row of a name (`ON CONFLICT DO NOTHING` settles a race between two first
/// inserts); the last branch reports the live holder when neither happened. Tokens come
/// from the sequence (the column default), drawn after the row is locked, so they rise
/// per name in grant order and survive releases, deletes of rows and restarts. An UPDATE
/// only locks rows whose snapshot version passes its WHERE, so an attempt on a live lease
/// never waits behind the holder's fenced transaction.
fn acquire(t: &str) -> String {
    let expiry = "now() + $3::bigint * interval '1 microsecond'";
    format!(
        "WITH taken AS ( \
           UPDATE {t} AS l \
              SET owner = $2, token = DEFAULT, acquired_at = now(), expires_at = {expiry}, \
                  note = $4 \
            WHERE l.name = $1 \
              AND (l.owner IS NULL OR l.expires_at <= now() OR l.owner = $2) \
           RETURNING l.owner, l.token, l.note, l.acquired_at, l.expires_at), \
         created AS ( \
           INSERT INTO {t} AS l (name, owner, acquired_at, expires_at, note) \
           SELECT $1, $2, now(), {expiry}, $4 \
            WHERE NOT EXISTS (SELECT 1 FROM {t} WHERE name = $1) \
           ON CONFLICT (name) DO NOTHING \
           RETURNING l.owner, l.token, l.note, l.acquired_at, l.expires_at), \
         mine AS (SELECT * FROM taken UNION ALL SELECT * FROM created) \
         SELECT acquired, {HOLDER} FROM ( \
           SELECT true AS acquired, * FROM mine \
           UNION ALL \
           SELECT false, owner, token, note, acquired_at, expires_at FROM {t} \
            WHERE name = $1 AND owner IS NOT NULL AND expires_at > now() \
              AND NOT EXISTS (SELECT 1 FROM mine)) AS outcome"
    )
}

/// How a refresh statement gets its leases; the rest of the statement, and the code that
/// reads its rows, are the same for one lease and for many.
struct Leases {
    /// The leases, as rows `(name, owner, token, ttl_us, i)` numbered from 1 in order.
    rows: &'static str,
    /// The leases the `UPDATE` joins: one per grant (see [`refresh`]).
    distinct: &'static str,
    /// How the leases are joined to the refreshed rows (see [`refresh`]).
    join: &'static str,
}

/// A single refresh: one row from scalar parameters, which cannot repeat a grant, joined
/// by a nested loop over one row. It costs what a statement written for one lease cost
/// (13–14 µs on the server, `docs/postgres.md`); the batch form over one-element arrays
/// costs 18.
const ONE_LEASE: Leases = Leases {
    rows: "VALUES ($1::text, $2::text, $3::bigint, $4::bigint, 1::bigint)",
    distinct: "batch",
    join: "LEFT JOIN",
};

/// A batch: one row per array element, numbered by `WITH ORDINALITY`.
const MANY_LEASES: Leases = Leases {
    rows: "SELECT * FROM unnest($1::text[], $2::text[], $3::bigint[], $4::bigint[]) \
           WITH ORDINALITY",
    distinct: "(SELECT DISTINCT ON (name, owner, token) * FROM batch \
                ORDER BY name, owner, token, i DESC)",
    join: "FULL JOIN",
};

/// How the refresh statement finds a lock's row, to report why a lease was not refreshed.
const LOCK_ROW: &str = "l.name = b.name";

/// The refresh statement for one lease of the table `t`, whose row `row` finds (an `ON`
/// condition over the table `l` and the lease `b`).
pub(crate) fn refresh_one(t: &str, row: &str) -> SqlStr {
    sql(refresh(t, &ONE_LEASE, row))
}

/// The refresh statement for a batch of leases of the table `t` ([`refresh_one`]).
pub(crate) fn refresh_many(t: &str, row: &str) -> SqlStr {
    sql(refresh(t, &MANY_LEASES, row))
}

/// The one-statement refresh of one lease or a batch.
///
/// The same template serves the permits table (`crate::permit_sql`): there `row` also
/// matches the owner, since a semaphore has one row per holder.
///
/// Extends only each live grant `(name, owner, token)`, never re-creates a row, and reports
/// each lease's row as it was so a failure can say why. The leases are numbered (`i`), so
/// the same lock may appear more than once and each lease gets its own row, in order.
///
/// In a batch: an `UPDATE … FROM` updates a row once even when several leases match it
/// (the same grant twice), so `DISTINCT ON` hands it the last one, as refreshing one after
/// another would, and every lease of a refreshed grant reads as refreshed. `FULL JOIN
/// refreshed` means `LEFT JOIN` here (every refreshed row comes from a lease of the batch),
/// but it can only run as a hash or merge join. A `LEFT JOIN` ran as a nested loop in the
/// generic plan of the prepared statement, whose estimates (10 leases, 1 refreshed row) do
/// not know the arrays: every lease compared with every refreshed row, 84 ms instead of
/// 12 ms for 1,000 leases (`EXPLAIN ANALYZE` with `plan_cache_mode = force_generic_plan`).
fn refresh(t: &str, leases: &Leases, row: &str) -> String {
    let Leases {
        rows,
        distinct,
        join,
    } = leases;
    format!(
        "WITH batch (name, owner, token, ttl_us, i) AS ({rows}), \
         refreshed AS ( \
           UPDATE {t} AS l SET expires_at = now() + b.ttl_us * interval '1 microsecond' \
             FROM {distinct} AS b \
            WHERE l.name = b.name AND l.owner = b.owner AND l.token = b.token \
              AND l.expires_at > clock_timestamp() \
           RETURNING l.name, l.owner, l.token) \
         SELECT b.i, r.token IS NOT NULL AS refreshed, \
                l.owner, l.token, coalesce(l.expires_at > clock_timestamp(), false) AS live \
           FROM batch AS b \
           {join} refreshed AS r \
             ON r.name = b.name AND r.owner = b.owner AND r.token = b.token \
           LEFT JOIN {t} AS l ON {row} \
          ORDER BY b.i"
    )
}

/// The one-statement operator break. The `FOR UPDATE` subquery reads the grant as it is
/// when locked, so the removed holder is reported exactly; the row and its token stay.
fn break_lock(t: &str) -> String {
    format!(
        "WITH old AS ( \
           SELECT name, owner, token, note, acquired_at, expires_at FROM {t} \
            WHERE name = $1 AND owner IS NOT NULL FOR UPDATE), \
         broken AS ( \
           UPDATE {t} AS l SET owner = NULL, acquired_at = NULL, expires_at = NULL, \
                  note = NULL \
             FROM old WHERE l.name = old.name \
           RETURNING old.*) \
         SELECT {HOLDER}, expires_at > clock_timestamp() AS live, pg_notify($2, name) \
           FROM broken"
    )
}

/// The listing: one statement, so one snapshot. `left(…) = $1 COLLATE "C"` compares bytes
/// (no pattern characters, unlike `LIKE`), and `COLLATE "C"` orders by bytes whatever the
/// database's collation. Liveness is judged as `inspect` judges it.
fn list(t: &str) -> String {
    format!(
        "SELECT name, {HOLDER} FROM {t} \
          WHERE owner IS NOT NULL AND expires_at > clock_timestamp() \
            AND left(name, char_length($1::text)) = $1::text COLLATE \"C\" \
          ORDER BY name COLLATE \"C\""
    )
}

/// The schema objects (the schema first), created idempotently inside one transaction
/// that first takes a transaction-scoped advisory lock ([`CREATE_LOCK`]), so concurrent
/// creators queue instead of failing on the catalog's unique indexes.
pub(crate) fn create_statements(names: &Names) -> Vec<SqlStr> {
    let Names {
        schema,
        table,
        sequence,
        ..
    } = names;
    let seq = dollar_quote(sequence);
    vec![
        sql(format!("CREATE SCHEMA IF NOT EXISTS {schema}")),
        sql(format!(
            "CREATE SEQUENCE IF NOT EXISTS {sequence} AS bigint MINVALUE 1 NO CYCLE"
        )),
        // `token` is UNIQUE on purpose: it makes a token change a key update, which a
        // fenced transaction's FOR KEY SHARE lock blocks while refreshes pass. Its default
        // names the sequence by OID, so statements never spell the sequence's name.
        sql(format!(
            "CREATE TABLE IF NOT EXISTS {table} ( \
               name        text PRIMARY KEY, \
               owner       text, \
               token       bigint NOT NULL UNIQUE DEFAULT nextval({seq}::regclass), \
               acquired_at timestamptz, \
               expires_at  timestamptz, \
               note        text, \
               CHECK ((owner IS NULL) = (expires_at IS NULL) \
                  AND (owner IS NULL) = (acquired_at IS NULL)))"
        )),
    ]
}

/// `$1` table, `$2` sequence, `$3` permits table, `$4` permits sequence (quoted,
/// qualified): whether the lock table and sequence exist already, whether the table has
/// the `note` column (added after the first release), the sequence's `CACHE` (NULL when it
/// does not exist), and the same for the permits table and its sequence (added with
/// semaphores). Catalog reads only: no privilege on the objects is needed.
pub(crate) const EXISTS: &str = "SELECT to_regclass($1) IS NOT NULL AND to_regclass($2) IS NOT NULL AS present, \
            EXISTS (SELECT 1 FROM pg_catalog.pg_attribute \
                     WHERE attrelid = to_regclass($1) AND attname = 'note' \
                       AND NOT attisdropped) AS has_note, \
            (SELECT seqcache FROM pg_catalog.pg_sequence WHERE seqrelid = to_regclass($2)) \
            AS cache, \
            to_regclass($3) IS NOT NULL AND to_regclass($4) IS NOT NULL AS permits, \
            (SELECT seqcache FROM pg_catalog.pg_sequence WHERE seqrelid = to_regclass($4)) \
            AS permit_cache";

/// Upgrades a table made by a version without notes. A nullable column without a default
/// is a catalog change only (no table rewrite), but it needs the table's owner and briefly
/// takes an `ACCESS EXCLUSIVE` lock, so it runs only when the column is missing.
pub(crate) fn add_note_column(names: &Names) -> SqlStr {
    sql(format!(
        "ALTER TABLE {} ADD COLUMN IF NOT EXISTS note text",
        names.table
    ))
}

/// This session's TLS state (`ssl` is NULL only when the row is missing) and role.
pub(crate) const CONNECTION_SECURITY: &str = "SELECT s.ssl, s.version, s.cipher, s.client_dn, \
    current_user::text AS user \
    FROM (SELECT 1) AS one \
    LEFT JOIN pg_catalog.pg_stat_ssl AS s ON s.pid = pg_catalog.pg_backend_pid()";

/// `$1` schema (quoted): whether it exists already.
pub(crate) const SCHEMA_EXISTS: &str = "SELECT to_regnamespace($1) IS NOT NULL AS present";

/// `$1` key text: serializes schema creators in this database until commit.
pub(crate) const CREATE_LOCK: &str = "SELECT pg_advisory_xact_lock(hashtextextended($1, 0))";

/// A string literal that means `text` whatever `standard_conforming_strings` says: dollar
/// quoting with a tag that does not occur in `text`.
pub(crate) fn dollar_quote(text: &str) -> String {
    let mut tag = String::from("$n$");
    // The first occurrence of the tag after the opening one must be the closing one.
    while format!("{text}{tag}").find(&tag) != Some(text.len()) {
        tag.insert(1, 'n');
    }
    format!("{tag}{text}{tag}")
}

pub(crate) fn sql(text: String) -> SqlStr {
    AssertSqlSafe(std::sync::Arc::<str>::from(text)).into_sql_str()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::PostgresConfig;

    #[test]
    fn names_are_quoted_and_qualified() {
        let config = PostgresConfig::from_url("postgres://h/db")
            .expect("valid")
            .with_schema("S\"x")
            .with_table("it's");
        let names = config.names();
        assert_eq!(names.schema, "\"S\"\"x\"");
        assert_eq!(names.table, "\"S\"\"x\".\"it's\"");
        assert_eq!(names.sequence, "\"S\"\"x\".\"it's_fence\"");
        let ddl = create_statements(&names);
        assert!(
            ddl[2]
                .as_str()
                .contains("nextval($n$\"S\"\"x\".\"it's_fence\"$n$::regclass)")
        );
        assert_eq!(dollar_quote("a$n$b"), "$nn$a$n$b$nn$");
        assert_eq!(dollar_quote("$nn$$n$"), "$nnn$$nn$$n$$nnn$");
        assert_eq!(dollar_quote("a$n"), "$nn$a$n$nn$");
    }

    #[test]
    fn lock_data_is_always_bound() {
        let config = PostgresConfig::from_url("postgres://h/db").expect("valid");
        let s = Statements::new(&config.names());
        for statement in [&s.acquire, &s.holder, &s.release, &s.fence, &s.break_lock] {
            assert!(statement.as_str().contains("name = $1"), "{statement:?}");
        }
        assert!(s.refresh.as_str().contains("VALUES ($1::text, $2::text"));
        assert!(
            s.refresh_many
                .as_str()
                .contains("unnest($1::text[], $2::text[]")
        );
        // Linear whatever the plan (see `refresh`): never a nested loop over `refreshed`.
        assert!(s.refresh_many.as_str().contains("FULL JOIN refreshed"));
    }
}
