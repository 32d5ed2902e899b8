//! Refreshing leases: one statement for up to [`BATCH`] leases, and what its rows mean. A
//! single refresh is a batch of one, sent in the statement's one-lease form (scalar
//! parameters, the plan of a statement written for one lease); both forms come from one
//! template (`sql::refresh`) and their rows are read here, so the two cannot drift apart.
//!
//! Semaphore permits live in a table of their own: a batch is split by
//! [`Lease::permits`], locks and permits go in statements of their own (run side by side),
//! and the results are put back in the batch's order.

use lockcore::{Error, ErrorKind, Lease, Result};
use sqlx::Row;
use sqlx::postgres::PgRow;

use crate::client::Client;
use crate::error::Effect;

/// The most leases one refresh statement carries ([`LockBackend::refresh_batch_limit`]).
///
/// 10,000 held leases take 10 statements per refresh round, 0.1 % of one statement per
/// lease. A chunk of 1,000 is 100–200 KB of parameters for names and owners of 40–80 bytes
/// (four arrays, so PostgreSQL's limit of 65,535 bound parameters never applies) and runs in milliseconds
/// (`docs/postgres.md` has the measurements). Larger chunks would hold their row locks
/// longer and make one slow or failed statement cost more leases a refresh round, for a
/// saving already below the goal.
///
/// [`LockBackend::refresh_batch_limit`]: lockcore::LockBackend::refresh_batch_limit
pub(crate) const BATCH: usize = 1000;

/// Which table a lease's grant lives in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Lock,
    Permit,
}

impl Kind {
    fn of(lease: &Lease) -> Self {
        if lease.permits().is_some() {
            Self::Permit
        } else {
            Self::Lock
        }
    }
}

/// Refreshes `leases`, [`BATCH`] at a time, one statement each: one result per lease, in
/// order. Locks and permits go in separate statements (at most one of each kind per
/// [`BATCH`] leases of that kind), run concurrently. A lease whose grant this backend did
/// not issue fails alone; a statement that fails fails each lease it carried with the
/// error a single refresh would get.
pub(crate) async fn refresh_leases(c: &Client, leases: &[Lease]) -> Vec<Result<Lease>> {
    let (locks, permits): (Vec<usize>, Vec<usize>) =
        (0..leases.len()).partition(|&i| Kind::of(&leases[i]) == Kind::Lock);
    let pick = |indices: &[usize]| indices.iter().map(|&i| &leases[i]).collect::<Vec<_>>();
    let (lock_results, permit_results) = futures_util::future::join(
        refresh_kind(c, Kind::Lock, &pick(&locks)),
        refresh_kind(c, Kind::Permit, &pick(&permits)),
    )
    .await;
    let mut results: Vec<Option<Result<Lease>>> = leases.iter().map(|_| None).collect();
    let answered = locks.iter().zip(lock_results);
    for (&i, result) in answered.chain(permits.iter().zip(permit_results)) {
        results[i] = Some(result);
    }
    results
        .into_iter()
        .map(|result| {
            result.unwrap_or_else(|| {
                Err(Error::new(
                    ErrorKind::Protocol,
                    "a lease got no refresh result",
                ))
            })
        })
        .collect()
}

/// [`refresh_leases`] for leases of one kind.
async fn refresh_kind(c: &Client, kind: Kind, leases: &[&Lease]) -> Vec<Result<Lease>> {
    let mut results = Vec::with_capacity(leases.len());
    for chunk in leases.chunks(BATCH) {
        results.extend(refresh_chunk(c, kind, chunk).await);
    }
    results
}

/// One statement for `leases` (at most [`BATCH`], all of `kind`).
async fn refresh_chunk(c: &Client, kind: Kind, leases: &[&Lease]) -> Vec<Result<Lease>> {
    let tokens: Vec<Result<i64>> = leases.iter().map(|lease| grant_token(lease)).collect();
    // The leases sent, by their index in `leases`, with their tokens.
    let sent: Vec<(usize, i64)> = tokens
        .iter()
        .enumerate()
        .filter_map(|(i, token)| token.as_ref().ok().map(|&token| (i, token)))
        .collect();
    let outcomes: Vec<Result<Lease>> = if sent.is_empty() {
        Vec::new()
    } else {
        match seen(c, kind, leases, &sent).await {
            Ok(seen) => sent
                .iter()
                .zip(seen)
                .map(|(&(i, token), seen)| seen.outcome(kind, leases[i], token))
                .collect(),
            Err(err) => err.copies(sent.len()).into_iter().map(Err).collect(),
        }
    };
    // One outcome per lease sent, in order: the others failed alone.
    let mut outcomes = outcomes.into_iter();
    tokens
        .into_iter()
        .map(|token| {
            token.and_then(|_| {
                outcomes.next().unwrap_or_else(|| {
                    Err(Error::new(
                        ErrorKind::Protocol,
                        "a lease got no refresh result",
                    ))
                })
            })
        })
        .collect()
}

/// Runs the refresh statement for the `sent` leases: one [`Seen`] each, in order. One
/// lease goes with scalar parameters, more as arrays; the rows mean the same.
async fn seen(
    c: &Client,
    kind: Kind,
    leases: &[&Lease],
    sent: &[(usize, i64)],
) -> Result<Vec<Seen>> {
    let (one, many) = match kind {
        Kind::Lock => (&c.statements.refresh, &c.statements.refresh_many),
        Kind::Permit => (&c.permits.refresh, &c.permits.refresh_many),
    };
    let query = match sent {
        &[(i, token)] => {
            let lease = leases[i];
            c.query(one)
                .bind(lease.name().as_str())
                .bind(lease.owner().as_str())
                .bind(token)
                .bind(lease.ttl().as_micros())
        }
        _ => {
            let lease = |&(i, _): &(usize, i64)| leases[i];
            let names: Vec<&str> = sent.iter().map(|s| lease(s).name().as_str()).collect();
            let owners: Vec<&str> = sent.iter().map(|s| lease(s).owner().as_str()).collect();
            let tokens: Vec<i64> = sent.iter().map(|&(_, token)| token).collect();
            let ttls: Vec<i64> = sent.iter().map(|s| lease(s).ttl().as_micros()).collect();
            c.query(many)
                .bind(names)
                .bind(owners)
                .bind(tokens)
                .bind(ttls)
        }
    };
    c.run(Effect::Write, async |conn| {
        let rows = query.fetch_all(conn).await?;
        let seen = rows
            .iter()
            .map(Seen::from_row)
            .collect::<Result<Vec<_>, _>>()?;
        // One row per lease, numbered 1, 2, … in order: anything else is not our reply.
        let in_order =
            seen.len() == sent.len() && seen.iter().zip(1..).all(|(seen, i)| seen.index == i);
        if in_order {
            Ok(seen)
        } else {
            Err(sqlx::Error::Protocol(format!(
                "the refresh of {} leases returned {} rows, not one per lease in order",
                sent.len(),
                seen.len()
            )))
        }
    })
    .await
}

/// One lease's row as the refresh statement found it.
struct Seen {
    /// The lease's place in the batch, from 1.
    index: i64,
    refreshed: bool,
    owner: Option<String>,
    token: Option<i64>,
    live: bool,
}

impl Seen {
    fn from_row(row: &PgRow) -> Result<Self, sqlx::Error> {
        Ok(Self {
            index: row.try_get("i")?,
            refreshed: row.try_get("refreshed")?,
            owner: row.try_get("owner")?,
            token: row.try_get("token")?,
            live: row.try_get("live")?,
        })
    }

    /// The refresh's outcome for `lease` (grant `token`, of `kind`).
    fn outcome(&self, kind: Kind, lease: &Lease, token: i64) -> Result<Lease> {
        if self.refreshed {
            Ok(lease.clone())
        } else if kind == Kind::Permit {
            Err(Error::lost(self.why_not_permit(token)))
        } else {
            Err(Error::lost(self.why_not(lease, token)))
        }
    }

    /// Why a refresh of a permit (grant `token`) changed nothing. The statement read the
    /// row of the lease's semaphore *and owner*, so a row found is the owner's.
    fn why_not_permit(&self, token: i64) -> String {
        match self.token {
            None => "the permit was released, or removed after it expired".to_owned(),
            Some(t) if t == token && self.live => {
                "the permit changed during the refresh".to_owned()
            }
            Some(t) if t == token => {
                "the permit expired on the database clock before this refresh".to_owned()
            }
            Some(t) => format!("the permit was replaced by a newer grant of its owner (token {t})"),
        }
    }

    /// Why a refresh of `lease` (grant `token`) changed nothing.
    fn why_not(&self, lease: &Lease, token: i64) -> String {
        match (&self.owner, self.token) {
            (None, None) => "the lock row was deleted".to_owned(),
            (None, _) => "the lock was released".to_owned(),
            (Some(owner), Some(t)) if owner == lease.owner().as_str() && t == token => {
                if self.live {
                    "the lease changed during the refresh".to_owned()
                } else {
                    "the lease expired on the database clock before this refresh".to_owned()
                }
            }
            (Some(owner), t) => format!(
                "taken over by {owner} (token {})",
                t.map_or_else(|| "?".to_owned(), |t| t.to_string())
            ),
        }
    }
}

/// The token this backend stored in `lease`'s grant.
pub(crate) fn grant_token(lease: &Lease) -> Result<i64> {
    lease
        .grant()
        .parse::<i64>()
        .map_err(|_| Error::invalid_input("the lease was not issued by the postgres backend"))
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use lockcore::{Identity, LockName};

    use super::*;

    #[test]
    fn foreign_grants_are_rejected() {
        let name = LockName::new("x").expect("valid");
        let ttl = lockcore::Ttl::new(Duration::from_secs(1)).expect("valid");
        let lease = Lease::new(name, Identity::unique(), ttl, "r:abc");
        let err = grant_token(&lease).expect_err("not ours");
        assert_eq!(err.kind(), lockcore::ErrorKind::InvalidInput);
    }
}
