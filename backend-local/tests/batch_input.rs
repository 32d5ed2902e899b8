//! The batched refresh's input: names and owners that JSON must escape reach the right
//! rows, and a grant twice in one batch ends as refreshing one after another leaves it.
//! (From the hostile review of the `json_each` batch.)

mod common;

use std::time::Duration;

use common::TempDb;
use lockcore::{Acquire, AcquireRequest, Identity, Lease, LockBackend, LockName, Ttl};
use sqlx::{Connection, SqliteConnection};

async fn grant_as(backend: &impl LockBackend, name: &str, owner: Identity, ttl: Duration) -> Lease {
    let request = AcquireRequest::new(
        LockName::new(name).expect("valid name"),
        owner,
        Ttl::new(ttl).expect("ttl"),
    );
    match backend.acquire(&request).await.expect("acquire") {
        Acquire::Acquired(lease) => lease,
        Acquire::Held(_) => panic!("{name} held"),
    }
}

async fn expires(db: &TempDb, name: &str) -> i64 {
    let url = format!("sqlite://{}", db.path().display());
    let mut conn = SqliteConnection::connect(&url).await.expect("connect");
    sqlx::query_scalar("SELECT expires_ms FROM anylock_leases WHERE name = ?1")
        .bind(name)
        .fetch_one(&mut conn)
        .await
        .expect("row")
}

/// Names and owners JSON must escape, or that SQLite's JSON may read differently.
#[tokio::test]
async fn awkward_names_and_owners_refresh_in_a_batch() {
    let db = TempDb::new();
    let backend = db.open().await;
    let long = "é".repeat(120);
    let names = [
        "quote\"name",
        "back\\slash",
        "\\u0041",
        "emoji 🔒 lock",
        "line\u{2028}sep",
        "bom\u{feff}x",
        "nbsp\u{a0}x",
        "zwj\u{200d}x",
        "surrogate-ish \u{fffd}",
        "'single'",
        "[\"json\",1]",
        long.as_str(),
        " leading space",
        "trailing space ",
    ];
    let mut leases = Vec::new();
    for (i, name) in names.iter().enumerate() {
        let owner = Identity::named(&format!("o\"w\\n-{i}-é🔒")).expect("owner");
        leases.push(grant_as(&backend, name, owner, Duration::from_secs(60)).await);
    }
    let results = backend.refresh_many(&leases).await;
    for (name, result) in names.iter().zip(&results) {
        assert!(result.is_ok(), "{name:?}: {result:?}");
    }
}

/// One grant twice in one batch with different TTLs, in either order: both places report
/// `Ok` with their TTL, so the row must give the longer one (it is sent once, at its
/// latest expiry). The second hostile review's case: with the last place winning, the
/// 600 s place was reported while the row kept 2 s, and a rival took the lock 2.5 s later.
#[tokio::test]
async fn a_grant_twice_in_a_batch_keeps_its_longest_expiry() {
    for order in [[2u64, 600], [600, 2]] {
        let db = TempDb::new();
        let backend = db.open().await;
        let lease = grant_as(&backend, "dup", Identity::unique(), Duration::from_secs(60)).await;
        let with_ttl = |s: u64| {
            lease
                .clone()
                .with_ttl(Ttl::new(Duration::from_secs(s)).expect("valid"))
        };
        let batch: Vec<Lease> = order.iter().map(|&s| with_ttl(s)).collect();
        let results = backend.refresh_many(&batch).await;
        assert!(results.iter().all(Result::is_ok), "{results:?}");
        let batched = expires(&db, "dup").await;
        backend.refresh(&with_ttl(600)).await.expect("single");
        let longest = expires(&db, "dup").await;
        assert!(
            (longest - batched).abs() < 2_000,
            "order {order:?}: the batch left {batched}, a 600 s refresh {longest}"
        );
    }
    let db = TempDb::new();
    let backend = db.open().await;
    let lease = grant_as(&backend, "dup", Identity::unique(), Duration::from_secs(60)).await;
    let long = lease
        .clone()
        .with_ttl(Ttl::new(Duration::from_secs(600)).expect("valid"));
    let short = lease.with_ttl(Ttl::new(Duration::from_secs(2)).expect("valid"));
    let results = backend.refresh_many(&[long, short]).await;
    assert!(results.iter().all(Result::is_ok), "{results:?}");
    tokio::time::sleep(Duration::from_millis(2_500)).await;
    let rival = AcquireRequest::new(
        LockName::new("dup").expect("valid name"),
        Identity::unique(),
        Ttl::new(Duration::from_secs(60)).expect("ttl"),
    );
    let rival = backend.acquire(&rival).await.expect("attempt");
    assert!(
        matches!(rival, Acquire::Held(_)),
        "a rival got the lock while a refresh reported 600 s"
    );
}
