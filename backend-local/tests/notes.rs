//! Notes and listing on the embedded backend: a database made by the version before notes
//! is upgraded on open (by many openers at once), notes read back are made safe, release
//! and break clear them, and listing applies `inspect`'s rules (this boot only) and skips
//! rows it cannot name.

mod common;

use std::time::Duration;

use backend_local::LocalBackend;
use common::TempDb;
use lockcore::{Acquire, AcquireRequest, Identity, LockBackend, LockName, Note};
use sqlx::sqlite::SqliteConnection;
use sqlx::{Connection, Row};

const LONG: Duration = Duration::from_secs(60);

fn boot_id() -> String {
    std::fs::read_to_string("/proc/sys/kernel/random/boot_id")
        .expect("boot id")
        .trim()
        .to_owned()
}

async fn connect(db: &TempDb) -> SqliteConnection {
    let url = format!("sqlite://{}?mode=rwc", db.path().display());
    SqliteConnection::connect(&url).await.expect("connect")
}

async fn run(conn: &mut SqliteConnection, statement: &str, bind: &str) {
    sqlx::query(sqlx::AssertSqlSafe(statement.to_owned()))
        .bind(bind)
        .execute(conn)
        .await
        .expect(statement);
}

async fn stored_note(conn: &mut SqliteConnection, name: &LockName) -> Option<String> {
    sqlx::query("SELECT note FROM anylock_leases WHERE name = ?1")
        .bind(name.as_str())
        .fetch_one(conn)
        .await
        .expect("row")
        .get("note")
}

async fn acquire(backend: &LocalBackend, name: &LockName, note: Option<&Note>) -> Acquire {
    let request = AcquireRequest::new(
        name.clone(),
        Identity::unique(),
        lockcore::Ttl::new(LONG).expect("valid TTL"),
    )
    .with_note(note.cloned());
    backend.acquire(&request).await.expect("one attempt")
}

/// The table as the version before notes made it (with the liveness column), one lock held
/// in it this boot and one left from an earlier boot: sixteen openers at once all succeed,
/// the old holder is still held with no note, the other boot's lease is not listed, and
/// new grants store notes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_database_from_before_notes_is_upgraded_by_concurrent_opens() {
    let db = TempDb::new();
    let mut conn = connect(&db).await;
    run(
        &mut conn,
        "CREATE TABLE anylock_leases (name TEXT PRIMARY KEY NOT NULL, owner TEXT, \
         token INTEGER NOT NULL, boot_id TEXT, pid INTEGER, pid_start INTEGER, \
         acquired_ms INTEGER, expires_ms INTEGER, liveness TEXT) STRICT",
        "",
    )
    .await;
    run(
        &mut conn,
        "INSERT INTO anylock_leases VALUES ('old/held', 'old-holder', 3, ?1, NULL, NULL, 0, \
         9223372036854775807, NULL)",
        &boot_id(),
    )
    .await;
    run(
        &mut conn,
        "INSERT INTO anylock_leases VALUES ('old/other-boot', 'gone', 5, ?1, NULL, NULL, 0, \
         9223372036854775807, NULL)",
        "an earlier boot",
    )
    .await;
    let opens: Vec<_> = (0..16)
        .map(|_| {
            let config = db.config();
            tokio::spawn(async move { LocalBackend::connect(config).await })
        })
        .collect();
    let mut backends = Vec::new();
    for open in opens {
        backends.push(open.await.expect("join").expect("a concurrent upgrade"));
    }
    let backend = &backends[0];
    let held = LockName::new("old/held").expect("valid");
    let old = backend
        .inspect(&held)
        .await
        .expect("inspect")
        .expect("held");
    assert_eq!(old.owner().as_str(), "old-holder");
    assert_eq!(old.note(), None);

    let name = LockName::new("old/new").expect("valid");
    let note = Note::new("after the upgrade").expect("note");
    let Acquire::Acquired(lease) = acquire(&backends[1], &name, Some(&note)).await else {
        panic!("free")
    };
    let listed = backend.list("old/").await.expect("list");
    let shown: Vec<_> = listed
        .iter()
        .map(|e| (e.name().as_str(), e.holder().note().map(Note::as_str)))
        .collect();
    assert_eq!(
        shown,
        [("old/held", None), ("old/new", Some("after the upgrade"))]
    );
    backend.release(&lease).await.expect("release");
}

/// A note read back is made safe to show, release and break clear the stored note, and a
/// row whose name is no lock name is left out of a listing instead of failing it.
#[tokio::test]
async fn stored_notes_are_cleaned_and_cleared() {
    let db = TempDb::new();
    let backend = db.open().await;
    let mut conn = connect(&db).await;
    let name = LockName::new("n/job").expect("valid");
    let note = Note::new("job 7").expect("note");
    let Acquire::Acquired(lease) = acquire(&backend, &name, Some(&note)).await else {
        panic!("free")
    };
    assert_eq!(
        stored_note(&mut conn, &name).await.as_deref(),
        Some("job 7")
    );
    run(
        &mut conn,
        "UPDATE anylock_leases SET note = ?1 WHERE name = 'n/job'",
        "a\u{1b}[2Jb",
    )
    .await;
    let shown = backend
        .inspect(&name)
        .await
        .expect("inspect")
        .expect("held");
    assert_eq!(shown.note().map(Note::as_str), Some("a\u{fffd}[2Jb"));
    let Acquire::Held(holder) = acquire(&backend, &name, None).await else {
        panic!("held")
    };
    assert_eq!(holder.note().map(Note::as_str), Some("a\u{fffd}[2Jb"));
    backend.release(&lease).await.expect("release");
    assert_eq!(
        stored_note(&mut conn, &name).await,
        None,
        "release clears it"
    );

    let Acquire::Acquired(_) = acquire(&backend, &name, Some(&note)).await else {
        panic!("free")
    };
    let broken = backend
        .break_lock(&name)
        .await
        .expect("break")
        .expect("held");
    assert_eq!(broken.note(), Some(&note));
    assert_eq!(stored_note(&mut conn, &name).await, None, "break clears it");

    // Written by hand: a name with a control character, held this boot.
    run(
        &mut conn,
        "INSERT INTO anylock_leases (name, owner, token, boot_id, acquired_ms, expires_ms) \
         VALUES (char(110, 47, 10), 'x', 1, ?1, 0, 9223372036854775807)",
        &boot_id(),
    )
    .await;
    let kept = LockName::new("n/kept").expect("valid");
    let Acquire::Acquired(_) = acquire(&backend, &kept, None).await else {
        panic!("free")
    };
    let listed = backend
        .list("n/")
        .await
        .expect("one bad row does not fail the listing");
    let names: Vec<_> = listed.iter().map(|e| e.name().as_str()).collect();
    assert_eq!(names, ["n/kept"]);
}
