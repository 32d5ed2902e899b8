//! The batched refresh: one `UPDATE` statement extends every lease of a batch
//! ([`LockBackend::refresh_many`](lockcore::LockBackend::refresh_many)).
//!
//! The batch goes to SQLite as one JSON array bound to one parameter, so the statement's
//! text never changes (it is prepared once per connection and cached) and its cost is one
//! trip to sqlx's worker thread and one commit, whatever the batch's size. `json_each`
//! turns the array into rows, and each row finds its lease row through the primary key,
//! under exactly the condition of the single refresh (`EXTEND` in `client.rs`).
//! Semaphore permits have the same statement on their own table (`EXTEND_PERMITS`), found
//! through its primary key (name, owner); a batch that mixes locks and permits is one
//! statement for each.

use std::collections::{HashMap, HashSet};
use std::fmt::Write as _;

use lockcore::Error;
use sqlx::Row as _;

use crate::client::Client;
use crate::error::map_error;

/// The most leases one refresh statement carries
/// ([`LockBackend::refresh_batch_limit`](lockcore::LockBackend::refresh_batch_limit)):
/// the statement holds the database's write lock while it runs, so every other process's
/// acquire and release waits for it; 250 leases hold it well under a millisecond
/// (`docs/local.md`), and one commit (one sync to disk) then serves 250 refreshes instead
/// of one.
pub(crate) const BATCH: usize = 250;

/// Extends every lease of `?1` (a JSON array of `[name, owner, token, expires_ms,
/// expires_wall_ms]`) that is
/// still ours and unexpired at `?2` on this boot (`?3`), in one statement: the `WHERE` of
/// the single refresh, row by row. It returns the extended rows, which the caller matches
/// to its leases (a `RETURNING` clause may name only the updated table's columns).
const EXTEND_MANY: &str = "UPDATE anylock_leases
    SET expires_ms = batch.expires_ms, expires_wall_ms = batch.expires_wall_ms
    FROM (SELECT value ->> 0 AS name, value ->> 1 AS owner, value ->> 2 AS token,
                 value ->> 3 AS expires_ms, value ->> 4 AS expires_wall_ms
          FROM json_each(?1)) AS batch
    WHERE anylock_leases.name = batch.name AND anylock_leases.owner = batch.owner
      AND anylock_leases.token = batch.token AND anylock_leases.boot_id = ?3
      AND anylock_leases.expires_ms > ?2
    RETURNING name, owner, token";

/// [`EXTEND_MANY`] for semaphore permits, under the single permit refresh's condition
/// (`EXTEND` in `permit_store.rs`).
const EXTEND_PERMITS: &str = "UPDATE anylock_permits
    SET expires_ms = batch.expires_ms, expires_wall_ms = batch.expires_wall_ms
    FROM (SELECT value ->> 0 AS name, value ->> 1 AS owner, value ->> 2 AS token,
                 value ->> 3 AS expires_ms, value ->> 4 AS expires_wall_ms
          FROM json_each(?1)) AS batch
    WHERE anylock_permits.name = batch.name AND anylock_permits.owner = batch.owner
      AND anylock_permits.token = batch.token AND anylock_permits.boot_id = ?3
      AND anylock_permits.expires_ms > ?2
    RETURNING name, owner, token";

/// One lease of a batched refresh.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Extension<'a> {
    pub(crate) name: &'a str,
    pub(crate) owner: &'a str,
    pub(crate) token: i64,
    /// The new expiry, on the expiry clock.
    pub(crate) expires_ms: i64,
    /// The new expiry, on the wall clock (by which other boots judge it).
    pub(crate) expires_wall_ms: i64,
}

impl Client {
    /// Extends each lease of `batch` (all semaphore permits when `permits`, else all
    /// locks) that is still ours and unexpired at `now_ms` on the boot `boot_id`, in one
    /// statement (one commit, so one sync to disk); `true` for each lease extended, in
    /// order. A failure fails the whole batch and changes nothing.
    pub(crate) async fn extend_many(
        &self,
        permits: bool,
        batch: &[Extension<'_>],
        now_ms: i64,
        boot_id: &str,
    ) -> Result<Vec<bool>, Error> {
        let statement = if permits { EXTEND_PERMITS } else { EXTEND_MANY };
        let rows = sqlx::query(statement)
            .bind(encode(&longest_of_each_grant(batch)))
            .bind(now_ms)
            .bind(boot_id)
            .fetch_all(self.pool())
            .await
            .map_err(map_error)?;
        // The grants (name, owner, token) extended: each lease whose grant is among them
        // was extended (a row is one name, or one name and owner, so that is exactly the
        // single refresh's condition).
        let mut extended: HashSet<(String, String, i64)> = HashSet::with_capacity(rows.len());
        for row in rows {
            let name: String = row.try_get(0).map_err(map_error)?;
            let owner: String = row.try_get(1).map_err(map_error)?;
            let token: i64 = row.try_get(2).map_err(map_error)?;
            extended.insert((name, owner, token));
        }
        Ok(batch
            .iter()
            .map(|lease| {
                let grant = (lease.name.to_owned(), lease.owner.to_owned(), lease.token);
                extended.contains(&grant)
            })
            .collect())
    }
}

/// `batch` with each grant (name, owner, token) once, at the latest expiry any of its
/// places asks for: every place then reports a TTL the row gives at least (one place
/// reporting a long TTL while the row kept a shorter one would be a lease claimed that
/// nobody holds). SQLite's `UPDATE ... FROM` would pick an arbitrary one of several
/// source rows for one target row.
fn longest_of_each_grant<'a>(batch: &[Extension<'a>]) -> Vec<Extension<'a>> {
    let mut longest: HashMap<(&str, &str, i64), usize> = HashMap::with_capacity(batch.len());
    for (i, lease) in batch.iter().enumerate() {
        longest
            .entry((lease.name, lease.owner, lease.token))
            .and_modify(|at| {
                if lease.expires_ms > batch[*at].expires_ms {
                    *at = i;
                }
            })
            .or_insert(i);
    }
    batch
        .iter()
        .enumerate()
        .filter(|(i, lease)| longest.get(&(lease.name, lease.owner, lease.token)) == Some(i))
        .map(|(_, lease)| *lease)
        .collect()
}

/// `batch` as a JSON array of `[name, owner, token, expires_ms, expires_wall_ms]`.
fn encode(batch: &[Extension<'_>]) -> String {
    let size: usize = batch
        .iter()
        .map(|e| e.name.len() + e.owner.len() + 72)
        .sum();
    let mut json = String::with_capacity(size + 2);
    json.push('[');
    for (i, lease) in batch.iter().enumerate() {
        if i > 0 {
            json.push(',');
        }
        json.push('[');
        push_string(&mut json, lease.name);
        json.push(',');
        push_string(&mut json, lease.owner);
        // Writing to a String cannot fail.
        let _ = write!(
            json,
            ",{},{},{}]",
            lease.token, lease.expires_ms, lease.expires_wall_ms
        );
    }
    json.push(']');
    json
}

/// `text` as a JSON string: quotes, backslashes and control characters escaped, the rest
/// (any Unicode) as is.
fn push_string(json: &mut String, text: &str) {
    json.push('"');
    for ch in text.chars() {
        match ch {
            '"' => json.push_str("\\\""),
            '\\' => json.push_str("\\\\"),
            ch if u32::from(ch) < 0x20 => {
                let _ = write!(json, "\\u{:04x}", u32::from(ch));
            }
            ch => json.push(ch),
        }
    }
    json.push('"');
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_grant_twice_is_sent_once_with_its_latest_expiry() {
        let at = |name, token, expires_ms| Extension {
            name,
            owner: "o",
            token,
            expires_ms,
            expires_wall_ms: expires_ms + 1000,
        };
        let batch = [
            at("a", 1, 10),
            at("b", 1, 20),
            at("a", 1, 30),
            at("a", 2, 40),
        ];
        let sent: Vec<(&str, i64, i64)> = longest_of_each_grant(&batch)
            .iter()
            .map(|e| (e.name, e.token, e.expires_ms))
            .collect();
        assert_eq!(sent, [("b", 1, 20), ("a", 1, 30), ("a", 2, 40)]);
    }

    #[test]
    fn strings_are_escaped_as_json() {
        let lease = Extension {
            name: "a\"b\\c\u{1}d é 🔒",
            owner: "host/1",
            token: 7,
            expires_ms: -3,
            expires_wall_ms: 9,
        };
        assert_eq!(
            encode(&[lease, lease]),
            r#"[["a\"b\\c\u0001d é 🔒","host/1",7,-3,9],["a\"b\\c\u0001d é 🔒","host/1",7,-3,9]]"#
        );
        assert_eq!(encode(&[]), "[]");
    }
}
