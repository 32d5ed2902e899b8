//! `refresh_many`: one transaction refreshes a batch of leases, and each lease's outcome is
//! what refreshing it alone would give, liveness files included (issue #16).

mod common;

use std::path::PathBuf;
use std::time::Duration;

use backend_local::LocalBackend;
use common::TempDb;
use lockcore::{Acquire, AcquireRequest, ErrorKind, Identity, Lease, LockBackend, LockName, Note};
use sqlx::{Connection, Row, SqliteConnection};

const LONG: Duration = Duration::from_secs(60);

/// A lock row as stored: `(owner, token, expires_ms, liveness, note)`.
type Stored = (
    Option<String>,
    i64,
    Option<i64>,
    Option<String>,
    Option<String>,
);

async fn conn(db: &TempDb) -> SqliteConnection {
    let url = format!("sqlite://{}", db.path().display());
    SqliteConnection::connect(&url).await.expect("connect")
}

async fn stored(conn: &mut SqliteConnection, name: &LockName) -> Option<Stored> {
    let row = sqlx::query(
        "SELECT owner, token, expires_ms, liveness, note FROM anylock_leases WHERE name = ?1",
    )
    .bind(name.as_str())
    .fetch_optional(&mut *conn)
    .await
    .expect("read the row")?;
    Some((
        row.get("owner"),
        row.get("token"),
        row.get("expires_ms"),
        row.get("liveness"),
        row.get("note"),
    ))
}

/// Moves `name`'s expiry by `delta_ms` (negative: earlier).
async fn shift_expiry(conn: &mut SqliteConnection, name: &LockName, delta_ms: i64) {
    sqlx::query("UPDATE anylock_leases SET expires_ms = expires_ms + ?2 WHERE name = ?1")
        .bind(name.as_str())
        .bind(delta_ms)
        .execute(&mut *conn)
        .await
        .expect("shift the expiry");
}

/// The liveness file a row names.
fn liveness_file(db: &TempDb, key: &str) -> PathBuf {
    let mut dir = db.path().into_os_string();
    dir.push(".holders");
    PathBuf::from(dir).join(key)
}

async fn grant(backend: &LocalBackend, name: &str, note: Option<&str>) -> Lease {
    let request = AcquireRequest::new(
        LockName::new(name).expect("valid name"),
        Identity::unique(),
        lockcore::Ttl::new(LONG).expect("valid TTL"),
    )
    .with_note(note.map(|n| Note::new(n).expect("valid note")));
    match backend.acquire(&request).await.expect("acquire") {
        Acquire::Acquired(lease) => lease,
        Acquire::Held(_) => panic!("{name} unexpectedly held"),
    }
}

/// A mixed batch: a live lease (extended), a released one (not re-taken), a stale one
/// whose name a rival holds now (the rival untouched, our liveness file gone, as after a
/// single refresh), one with a note (kept), and the live one twice.
#[tokio::test]
async fn a_mixed_batch_gives_each_lease_its_own_refresh() {
    let db = TempDb::new();
    let backend = db.open().await;
    let mut conn = conn(&db).await;

    let live = grant(&backend, "live", None).await;
    shift_expiry(&mut conn, live.name(), -50_000).await;
    let before = stored(&mut conn, live.name()).await.expect("row");

    let released = grant(&backend, "released", None).await;
    backend.release(&released).await.expect("release");

    let stale = grant(&backend, "stale", None).await;
    let stale_file = liveness_file(
        &db,
        &stored(&mut conn, stale.name())
            .await
            .expect("row")
            .3
            .expect("file"),
    );
    shift_expiry(&mut conn, stale.name(), -61_000).await;
    let rival_backend = db.open().await;
    let rival = grant(&rival_backend, "stale", None).await;
    assert_ne!(rival.grant(), stale.grant());
    let rival_before = stored(&mut conn, stale.name()).await.expect("row");
    assert!(stale_file.exists(), "the stale holder still holds its file");

    let noted = grant(&backend, "noted", Some("deploy 42")).await;
    shift_expiry(&mut conn, noted.name(), -50_000).await;

    let batch = [
        live.clone(),
        released.clone(),
        stale.clone(),
        noted.clone(),
        live.clone(),
    ];
    let results = backend.refresh_many(&batch).await;
    assert_eq!(results.len(), batch.len(), "one result per lease");
    for i in [0, 3, 4] {
        let lease = results[i].as_ref().expect("a live lease refreshes");
        assert_eq!(lease.grant(), batch[i].grant(), "result {i} is its lease's");
        assert_eq!(lease.name(), batch[i].name());
    }
    assert!(
        !stale_file.exists(),
        "a lost lease's liveness file goes in the batch, as after a refresh"
    );
    for i in [1, 2] {
        let err = results[i].as_ref().expect_err("lost");
        assert_eq!(err.kind(), ErrorKind::Lost, "result {i}: {err}");
        let alone = backend
            .refresh(&batch[i])
            .await
            .expect_err("lost alone too");
        assert_eq!(
            alone.message(),
            err.message(),
            "the batch says what a refresh says"
        );
    }

    let after = stored(&mut conn, live.name()).await.expect("row");
    let (before_exp, after_exp) = (before.2.expect("expiry"), after.2.expect("expiry"));
    assert!(
        after_exp >= before_exp + 50_000,
        "extended: {before_exp} -> {after_exp}"
    );
    assert_eq!(
        (&after.0, after.1, &after.3),
        (&before.0, before.1, &before.3),
        "same grant"
    );
    assert!(liveness_file(&db, after.3.as_deref().expect("file")).exists());
    let released_row = stored(&mut conn, released.name()).await.expect("row kept");
    assert_eq!(
        (released_row.0, released_row.2),
        (None, None),
        "not re-taken"
    );
    assert_eq!(
        stored(&mut conn, stale.name()).await,
        Some(rival_before),
        "the rival is untouched"
    );
    let noted_row = stored(&mut conn, noted.name()).await.expect("row");
    assert_eq!(noted_row.4.as_deref(), Some("deploy 42"), "the note stays");
    assert!(noted_row.2.expect("expiry") >= before_exp + 50_000);
}

/// More leases than one transaction carries, the same lease many times and a lost one
/// among them: every lease gets its result, in order.
#[tokio::test]
async fn a_batch_larger_than_the_limit_is_split() {
    let db = TempDb::new();
    let backend = db.open().await;
    let limit = backend.refresh_batch_limit();
    assert!(limit > 1, "the backend batches");
    let lease = grant(&backend, "split", None).await;
    let gone = grant(&backend, "gone", None).await;
    backend.release(&gone).await.expect("release");
    let batch: Vec<Lease> = (0..limit * 2 + 7)
        .map(|i| {
            if i % 3 == 2 {
                gone.clone()
            } else {
                lease.clone()
            }
        })
        .collect();
    let results = backend.refresh_many(&batch).await;
    assert_eq!(results.len(), batch.len());
    for (i, result) in results.iter().enumerate() {
        assert_eq!(result.is_ok(), i % 3 != 2, "result {i}: {result:?}");
    }
}

/// A batch that cannot get the database's write lock (another connection holds it past
/// the busy timeout) fails every lease with a temporary error, never `Lost`, and keeps
/// every liveness file; once the lock is free the same batch works.
#[tokio::test]
async fn a_busy_database_fails_every_lease_temporarily() {
    let db = TempDb::new();
    let backend = LocalBackend::connect(db.config().with_busy_timeout(Duration::from_millis(200)))
        .await
        .expect("open");
    let a = grant(&backend, "a", None).await;
    let b = grant(&backend, "b", None).await;
    let gone = grant(&backend, "gone", None).await;
    backend.release(&gone).await.expect("release");
    let mut conn = conn(&db).await;
    let file = liveness_file(
        &db,
        &stored(&mut conn, a.name())
            .await
            .expect("row")
            .3
            .expect("file"),
    );

    let writer = conn
        .begin_with("BEGIN IMMEDIATE")
        .await
        .expect("take the write lock");
    let batch = [a.clone(), b.clone(), gone.clone()];
    let results = backend.refresh_many(&batch).await;
    assert_eq!(results.len(), batch.len());
    for result in &results {
        let err = result.as_ref().expect_err("busy");
        assert_eq!(err.kind(), ErrorKind::Unavailable, "{err}");
        assert!(err.is_temporary(), "{err}");
    }
    assert!(file.exists(), "a failed batch forgets no liveness file");
    writer.rollback().await.expect("rollback");

    let ok: Vec<bool> = backend
        .refresh_many(&batch)
        .await
        .iter()
        .map(Result::is_ok)
        .collect();
    assert_eq!(ok, [true, true, false]);
}

/// Each part of the single refresh's condition holds in a batch: a lease whose row
/// expired (not re-taken), one whose row is from an earlier boot, and one with the right
/// name and token but another owner are `Lost`, as alone, and their rows keep their
/// expiry; a live lease beside them is extended.
#[tokio::test]
async fn a_batch_keeps_every_part_of_the_refresh_condition() {
    let db = TempDb::new();
    let backend = db.open().await;
    let mut conn = conn(&db).await;
    let live = grant(&backend, "live", None).await;
    let expired = grant(&backend, "expired", None).await;
    shift_expiry(&mut conn, expired.name(), -61_000).await;
    let rebooted = grant(&backend, "rebooted", None).await;
    sqlx::query("UPDATE anylock_leases SET boot_id = 'an-earlier-boot' WHERE name = ?1")
        .bind(rebooted.name().as_str())
        .execute(&mut conn)
        .await
        .expect("age the boot");
    let real = grant(&backend, "forged", None).await;
    let forged = Lease::new(
        real.name().clone(),
        Identity::unique(),
        real.ttl(),
        real.grant(),
    );
    let before: Vec<Option<Stored>> = {
        let mut rows = Vec::new();
        for lease in [&expired, &rebooted, &real] {
            rows.push(stored(&mut conn, lease.name()).await);
        }
        rows
    };

    let batch = [
        live.clone(),
        expired.clone(),
        rebooted.clone(),
        forged.clone(),
    ];
    let results = backend.refresh_many(&batch).await;
    assert!(results[0].is_ok(), "{:?}", results[0]);
    for (i, result) in results.iter().enumerate().skip(1) {
        let err = result.as_ref().expect_err("not ours any more");
        assert_eq!(err.kind(), ErrorKind::Lost, "lease {i}: {err}");
    }
    for (lease, before) in [&expired, &rebooted, &real].into_iter().zip(before) {
        assert_eq!(
            stored(&mut conn, lease.name()).await,
            before,
            "{} untouched",
            lease.name()
        );
    }
    for lease in &batch[1..] {
        let alone = backend.refresh(lease).await.expect_err("lost alone too");
        assert_eq!(alone.kind(), ErrorKind::Lost);
    }
}
