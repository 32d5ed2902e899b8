//! The SQL of semaphore permits: a table of its own (`<table>_sem`, one row per live
//! permit, primary key `(name, owner)`) and a fence sequence of its own (`<table>_semf`),
//! next to the lock table, so a semaphore `x` and the lock `x` never touch each other's
//! rows or tokens.
//!
//! Parameters are bound as for locks; only the quoted object names are spliced in. Time is
//! the database's, with the lock statements' rule: `now()` where an earlier instant is the
//! safe side (setting an expiry, judging a permit expired, counting it live), and
//! `clock_timestamp()` where a later one is (refresh, fence, inspect, time left).
//!
//! # Why the acquire is a transaction of two statements
//! Counting the live permits and inserting one must not race. One statement cannot
//! serialize itself: under READ COMMITTED its snapshot is taken when it starts, *before*
//! it waits for any lock it takes, so after waiting it still counts from a snapshot that
//! misses the permit its predecessor just inserted (tried: a statement taking
//! `pg_advisory_xact_lock` in a CTE, or locking a per-name row `FOR UPDATE`, counts 0 rows
//! after a concurrent transaction inserted one and committed while it waited). So the
//! acquire is [`serialize`](PermitStatements::serialize), which waits for the semaphore's
//! transaction-scoped advisory lock, then [`acquire`](PermitStatements::acquire), whose
//! fresh snapshot sees every grant committed before the lock was handed over.

use sqlx::SqlStr;

use crate::names::Names;
use crate::sql::{HOLDER, dollar_quote, refresh_many, refresh_one, sql};

/// How the refresh statement finds a permit's row: one row per holder.
const PERMIT_ROW: &str = "l.name = b.name AND l.owner = b.owner";

/// Every statement of the permit protocol, ready to bind.
#[derive(Debug, Clone)]
pub(crate) struct PermitStatements {
    /// `$1` semaphore name: waits for the semaphore's transaction-scoped advisory lock,
    /// held until the acquire's transaction ends.
    pub(crate) serialize: SqlStr,
    /// `$1` name, `$2` owner, `$3` permits (the limit), `$4` TTL in µs, `$5` note: one row
    /// `(outcome, held_permits, holder columns)`; `outcome` is `granted` (our new grant),
    /// `conflict` (`held_permits` is the limit a live permit was taken with), `busy` (our
    /// own older grant, locked by another transaction) or `held` (the holder that ends
    /// first, live or expired but still locked). Nothing is written unless `granted`.
    pub(crate) acquire: SqlStr,
    /// `$1` name: the live permits, earliest grant (lowest token) first.
    pub(crate) holders: SqlStr,
    /// As the lock's [`refresh`](crate::sql::Statements::refresh), on the permits table.
    pub(crate) refresh: SqlStr,
    /// As the lock's [`refresh_many`](crate::sql::Statements::refresh_many), on the
    /// permits table.
    pub(crate) refresh_many: SqlStr,
    /// `$1` name, `$2` owner, `$3` token, `$4` channel: deletes exactly this grant and
    /// notifies the channel with the semaphore name (the lock's channel: a lock waiter of
    /// the same name wakes spuriously, which is allowed).
    pub(crate) release: SqlStr,
    /// `$1` name, `$2` owner, `$3` token, `$4` idle limit: as the lock's
    /// [`fence`](crate::sql::Statements::fence), on the permit's row.
    pub(crate) fence: SqlStr,
}

impl PermitStatements {
    pub(crate) fn new(names: &Names) -> Self {
        let p = &names.permits;
        let key = dollar_quote(&format!("anylock permits {p} "));
        Self {
            serialize: sql(format!(
                "SELECT pg_advisory_xact_lock(hashtextextended({key} || $1::text, 0))"
            )),
            acquire: sql(acquire(p)),
            holders: sql(format!(
                "SELECT {HOLDER} FROM {p} \
                  WHERE name = $1 AND expires_at > clock_timestamp() ORDER BY token"
            )),
            refresh: refresh_one(p, PERMIT_ROW),
            refresh_many: refresh_many(p, PERMIT_ROW),
            release: sql(format!(
                "WITH released AS ( \
                   DELETE FROM {p} WHERE name = $1 AND owner = $2 AND token = $3 \
                   RETURNING name) \
                 SELECT pg_notify($4, name) FROM released"
            )),
            fence: sql(format!(
                "SELECT token, set_config('idle_in_transaction_session_timeout', $4, true) \
                   FROM {p} \
                  WHERE name = $1 AND owner = $2 AND token = $3 \
                    AND expires_at > clock_timestamp() \
                    FOR KEY SHARE"
            )),
        }
    }
}

/// The deciding statement of an acquire, run under the semaphore's advisory lock. It
/// never waits for a row lock but `seen`'s (see there): rows it would have to wait for
/// are skipped and counted as held.
///
/// - `seen` reads every row of the semaphore `FOR SHARE`. The lock makes READ COMMITTED
///   wait for a refresh or release in flight and return the row as it committed, so a
///   permit refreshed just before it would have expired is counted as the live permit it
///   is (a plain read would judge the old version expired and admit one holder too many).
///   Inserts need no such care: only acquires insert, and they hold the advisory lock.
///   `FOR SHARE` does not conflict with a fenced transaction's `FOR KEY SHARE`.
/// - `conflict`: a live permit taken with another limit; then nothing is granted.
/// - `room`: no conflict and fewer than `$3` other owners hold a live permit. Only then
///   does `free` lock anything.
/// - `free` locks `FOR UPDATE SKIP LOCKED` the rows a grant would rewrite: our own row
///   and the other owners' expired ones. A row another transaction holds (a fenced
///   transaction's `FOR KEY SHARE` on an expired permit, or on our own older grant) is
///   skipped, never waited for, and lands in `busy`.
/// - `admit`: room, our own row not busy, and fewer than `$3` other owners live *or
///   busy*: an expired permit whose fenced transaction may still be writing keeps its
///   place until that transaction ends.
/// - Only when admitted, `expired` deletes the other owners' free expired rows and
///   `granted` inserts our permit; our own row (live or expired) is replaced with a new
///   grant and token (`ON CONFLICT (name, owner)`): one permit per owner. The token is
///   the sequence value the insert drew, so it is drawn under the advisory lock, in grant
///   order. A refusal writes nothing (its only trace, row locks, ends at its `COMMIT`).
/// - the last branches report our own busy row (`busy`: the backend answers a temporary
///   error), or, when nothing was granted, the holder that ends first among the live and
///   the busy expired ones (a busy expired one, whose expiry has passed, comes first).
fn acquire(p: &str) -> String {
    format!(
        "WITH seen AS MATERIALIZED ( \
           SELECT owner, permits, token, note, acquired_at, expires_at FROM {p} \
            WHERE name = $1::text FOR SHARE), \
         live AS (SELECT * FROM seen WHERE expires_at > now()), \
         conflict AS ( \
           SELECT permits FROM live WHERE permits <> $3::integer ORDER BY token LIMIT 1), \
         room AS MATERIALIZED ( \
           SELECT NOT EXISTS (SELECT 1 FROM conflict) \
              AND (SELECT count(*) FROM live WHERE owner <> $2::text) < $3::integer AS ok), \
         free AS MATERIALIZED ( \
           SELECT x.owner FROM {p} AS x \
            WHERE x.name = $1::text AND (x.owner = $2::text OR x.expires_at <= now()) \
              AND (SELECT ok FROM room) \
              FOR UPDATE SKIP LOCKED), \
         busy AS MATERIALIZED ( \
           SELECT * FROM seen \
            WHERE (owner = $2::text OR expires_at <= now()) AND (SELECT ok FROM room) \
              AND owner NOT IN (SELECT owner FROM free)), \
         verdict AS MATERIALIZED ( \
           SELECT (SELECT ok FROM room) \
              AND NOT EXISTS (SELECT 1 FROM busy WHERE owner = $2::text) \
              AND (SELECT count(*) FROM live WHERE owner <> $2::text) \
                + (SELECT count(*) FROM busy WHERE owner <> $2::text) < $3::integer \
              AS admit), \
         expired AS ( \
           DELETE FROM {p} AS x USING free AS f \
            WHERE x.name = $1::text AND x.owner = f.owner AND f.owner <> $2::text \
              AND x.expires_at <= now() AND (SELECT admit FROM verdict) \
           RETURNING x.owner), \
         granted AS ( \
           INSERT INTO {p} AS x (name, owner, permits, acquired_at, expires_at, note) \
           SELECT $1::text, $2::text, $3::integer, now(), \
                  now() + $4::bigint * interval '1 microsecond', $5::text \
            WHERE (SELECT admit FROM verdict) \
           ON CONFLICT (name, owner) DO UPDATE \
              SET permits = EXCLUDED.permits, token = EXCLUDED.token, \
                  acquired_at = EXCLUDED.acquired_at, expires_at = EXCLUDED.expires_at, \
                  note = EXCLUDED.note \
           RETURNING x.owner, x.token, x.note, x.acquired_at, x.expires_at) \
         SELECT outcome, held_permits, {HOLDER} FROM ( \
           SELECT 'granted' AS outcome, NULL::integer AS held_permits, * FROM granted \
           UNION ALL \
           SELECT 'conflict', permits, NULL, NULL, NULL, NULL, NULL FROM conflict \
           UNION ALL \
           SELECT 'busy', NULL, owner, token, note, acquired_at, expires_at FROM busy \
            WHERE owner = $2::text \
           UNION ALL \
           (SELECT 'held', NULL, owner, token, note, acquired_at, expires_at FROM ( \
              SELECT * FROM live WHERE owner <> $2::text \
              UNION ALL SELECT * FROM busy WHERE owner <> $2::text) AS h \
             WHERE NOT (SELECT admit FROM verdict) AND NOT EXISTS (SELECT 1 FROM conflict) \
               AND NOT EXISTS (SELECT 1 FROM busy WHERE owner = $2::text) \
             ORDER BY expires_at, token LIMIT 1)) AS outcome"
    )
}

/// The permits' sequence and table, created idempotently in the schema creation's
/// advisory-locked transaction (`crate::client`), after the lock's objects.
///
/// `token` is `UNIQUE`, as the lock table's, so that a retake (a new token) is a key
/// update a fenced transaction's `FOR KEY SHARE` blocks while refreshes pass.
pub(crate) fn create_statements(names: &Names) -> Vec<SqlStr> {
    let Names {
        permits,
        permit_sequence,
        ..
    } = names;
    let seq = dollar_quote(permit_sequence);
    vec![
        sql(format!(
            "CREATE SEQUENCE IF NOT EXISTS {permit_sequence} AS bigint MINVALUE 1 NO CYCLE"
        )),
        sql(format!(
            "CREATE TABLE IF NOT EXISTS {permits} ( \
               name        text NOT NULL, \
               owner       text NOT NULL, \
               permits     integer NOT NULL, \
               token       bigint NOT NULL UNIQUE DEFAULT nextval({seq}::regclass), \
               acquired_at timestamptz NOT NULL, \
               expires_at  timestamptz NOT NULL, \
               note        text, \
               PRIMARY KEY (name, owner))"
        )),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::PostgresConfig;

    #[test]
    fn permits_have_objects_of_their_own() {
        let config = PostgresConfig::from_url("postgres://h/db")
            .expect("valid")
            .with_schema("S\"x")
            .with_table("it's");
        let names = config.names();
        assert_eq!(names.permits, "\"S\"\"x\".\"it's_sem\"");
        assert_eq!(names.permit_sequence, "\"S\"\"x\".\"it's_semf\"");
        let s = PermitStatements::new(&names);
        for statement in [&s.acquire, &s.holders, &s.release, &s.fence, &s.refresh] {
            assert!(statement.as_str().contains(&names.permits), "{statement:?}");
            assert!(!statement.as_str().contains("\"it's\" "), "{statement:?}");
        }
        assert!(
            s.serialize
                .as_str()
                .contains("$n$anylock permits \"S\"\"x\".\"it's_sem\" $n$ || $1::text")
        );
        let ddl = create_statements(&names);
        assert!(
            ddl[1]
                .as_str()
                .contains("nextval($n$\"S\"\"x\".\"it's_semf\"$n$::regclass)")
        );
    }
}
