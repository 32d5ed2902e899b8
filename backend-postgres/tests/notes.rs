//! Notes and listing on the shared server: a table made by the version before notes is
//! upgraded on connect (by many processes at once, and never by a role that cannot), notes
//! read back are made safe, release and break clear them, and listing skips rows it cannot
//! name.

mod common;

use std::time::Duration;

use backend_postgres::PostgresBackend;
use common::{admin, backend, fresh_name, fresh_schema, grant, shared_url, table};
use lockcore::{
    Acquire, AcquireRequest, ErrorKind, Identity, LockBackend, LockName, Note, RetryStatus,
};
use sqlx::{AssertSqlSafe, Row};

const LONG: Duration = Duration::from_secs(60);

/// The schema, sequence and table exactly as the version before notes created them, with
/// one lock held in it (written as that version wrote it).
async fn old_schema(admin: &sqlx::PgPool, schema: &str, held: &LockName, owner: &Identity) {
    let q = format!("\"{schema}\"");
    for statement in [
        format!("CREATE SCHEMA {q}"),
        format!("CREATE SEQUENCE {q}.\"leases_fence\" AS bigint MINVALUE 1 NO CYCLE"),
        format!(
            "CREATE TABLE {q}.\"leases\" ( \
               name        text PRIMARY KEY, \
               owner       text, \
               token       bigint NOT NULL UNIQUE \
                           DEFAULT nextval('{q}.\"leases_fence\"'::regclass), \
               acquired_at timestamptz, \
               expires_at  timestamptz, \
               CHECK ((owner IS NULL) = (expires_at IS NULL) \
                  AND (owner IS NULL) = (acquired_at IS NULL)))"
        ),
    ] {
        sqlx::query(AssertSqlSafe(statement))
            .execute(admin)
            .await
            .expect("old schema");
    }
    sqlx::query(AssertSqlSafe(format!(
        "INSERT INTO {} (name, owner, acquired_at, expires_at) \
         VALUES ($1, $2, now(), now() + interval '1 minute')",
        table(schema)
    )))
    .bind(held.as_str())
    .bind(owner.as_str())
    .execute(admin)
    .await
    .expect("old row");
}

async fn has_note_column(admin: &sqlx::PgPool, schema: &str) -> bool {
    sqlx::query(
        "SELECT count(*) AS n FROM information_schema.columns \
          WHERE table_schema = $1 AND table_name = 'leases' AND column_name = 'note'",
    )
    .bind(schema)
    .fetch_one(admin)
    .await
    .expect("catalog")
    .get::<i64, _>("n")
        == 1
}

/// A database made by the previous version: eight processes connecting at once all
/// succeed, the column is added once, the lock held in the old row is still held (no
/// note), and notes and listing work on it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_old_table_is_upgraded_by_concurrent_connects() {
    let Some(url) = shared_url() else { return };
    let admin = admin(&url).await;
    let schema = fresh_schema("old");
    let _cleanup = common::drop_schema_later(&url, &schema);
    let (held, old_owner) = (fresh_name("old"), Identity::unique());
    old_schema(&admin, &schema, &held, &old_owner).await;
    assert!(!has_note_column(&admin, &schema).await);

    let connects =
        (0..8).map(|_| tokio::spawn(PostgresBackend::connect(common::config(&url, &schema))));
    let mut backends = Vec::new();
    for connect in connects {
        backends.push(connect.await.expect("join").expect("upgrade on connect"));
    }
    assert!(has_note_column(&admin, &schema).await);
    let backend = &backends[0];

    let old = backend
        .inspect(&held)
        .await
        .expect("inspect")
        .expect("still held");
    assert_eq!(old.owner(), &old_owner);
    assert_eq!(old.note(), None);
    let rival = AcquireRequest::new(
        held.clone(),
        Identity::unique(),
        lockcore::Ttl::new(LONG).expect("valid TTL"),
    );
    assert!(matches!(
        backend.acquire(&rival).await.expect("attempt"),
        Acquire::Held(_)
    ));

    let name = fresh_name("new");
    let note = Note::new("after the upgrade").expect("note");
    let request = AcquireRequest::new(
        name.clone(),
        Identity::unique(),
        lockcore::Ttl::new(LONG).expect("valid TTL"),
    )
    .with_note(Some(note.clone()));
    let Acquire::Acquired(lease) = backends[1].acquire(&request).await.expect("acquire") else {
        panic!("free lock")
    };
    let listed = backend.list("").await.expect("list");
    let shown: Vec<_> = listed
        .iter()
        .map(|e| (e.name().as_str(), e.holder().note().map(Note::as_str)))
        .collect();
    let mut expected = vec![
        (held.as_str(), None),
        (name.as_str(), Some("after the upgrade")),
    ];
    expected.sort();
    assert_eq!(shown, expected);
    backend.release(&lease).await.expect("release");
}

/// The upgrade needs the table's owner. A role with only the documented grants on an old
/// table is told the one statement that fixes it; once the owner ran it, that role
/// connects with no DDL and uses notes. With schema creation off, an old table is a
/// config error naming the same statement.
#[tokio::test]
async fn an_old_table_needs_its_owner_to_upgrade() {
    let Some(url) = shared_url() else { return };
    let admin = admin(&url).await;
    let run = async |sql: String| {
        sqlx::query(AssertSqlSafe(sql))
            .execute(&admin)
            .await
            .expect("admin")
    };
    let schema = fresh_schema("oldpriv");
    let _cleanup = common::drop_schema_later(&url, &schema);
    old_schema(&admin, &schema, &fresh_name("old"), &Identity::unique()).await;
    let role = format!("anylock_notes_{:08x}", rand::random::<u32>());
    run(format!("CREATE ROLE {role} LOGIN")).await;
    let q = format!("\"{schema}\"");
    run(format!("GRANT USAGE ON SCHEMA {q} TO {role}")).await;
    run(format!(
        "GRANT SELECT, INSERT, UPDATE ON {q}.leases TO {role}"
    ))
    .await;
    run(format!(
        "GRANT USAGE ON SEQUENCE {q}.leases_fence TO {role}"
    ))
    .await;
    let as_role = url.replacen("postgres@", &format!("{role}@"), 1);

    let refused = PostgresBackend::connect(common::config(&as_role, &schema)).await;
    let off =
        PostgresBackend::connect(common::config(&url, &schema).with_create_schema(false)).await;
    let stays_old = !has_note_column(&admin, &schema).await;
    run(format!(
        "ALTER TABLE {q}.leases ADD COLUMN IF NOT EXISTS note text"
    ))
    .await;
    let upgraded = PostgresBackend::connect(common::config(&as_role, &schema)).await;
    let used = match &upgraded {
        Ok(backend) => {
            let name = fresh_name("lp");
            let note = Note::new("least privilege").expect("note");
            let request = AcquireRequest::new(
                name.clone(),
                Identity::unique(),
                lockcore::Ttl::new(LONG).expect("valid TTL"),
            )
            .with_note(Some(note.clone()));
            let acquired = backend.acquire(&request).await;
            let shown = backend.list(name.as_str()).await;
            if let Ok(Acquire::Acquired(lease)) = &acquired {
                backend.release(lease).await.expect("release");
            }
            Some((
                acquired.map(|a| matches!(a, Acquire::Acquired(_))),
                shown.map(|l| {
                    l.into_iter()
                        .map(|e| e.holder().note().cloned())
                        .collect::<Vec<_>>()
                }),
                note,
            ))
        }
        Err(_) => None,
    };
    drop(upgraded);
    run(format!("DROP OWNED BY {role}")).await;
    run(format!("DROP ROLE {role}")).await;

    let err = refused.expect_err("a role that does not own the table cannot add the column");
    assert_eq!(err.kind(), ErrorKind::PermissionDenied, "{err}");
    assert_eq!(err.status(), RetryStatus::Permanent);
    assert!(
        err.to_string()
            .contains("ADD COLUMN IF NOT EXISTS note text"),
        "{err}"
    );
    let err = off.expect_err("schema creation off");
    assert_eq!(err.kind(), ErrorKind::Config, "{err}");
    assert!(
        err.to_string()
            .contains("ADD COLUMN IF NOT EXISTS note text"),
        "{err}"
    );
    assert!(stays_old, "nothing was altered by a refused connect");
    let (acquired, shown, note) = used.expect("the role connects once the column exists");
    assert!(acquired.expect("acquire"), "free lock");
    assert_eq!(shown.expect("list"), [Some(note)]);
}

/// A note read back is made safe to show (control characters replaced), release and
/// break clear the stored note, and a row whose name is no lock name is left out of a
/// listing instead of failing it.
#[tokio::test]
async fn stored_notes_are_cleaned_and_cleared() {
    let Some(url) = shared_url() else { return };
    let admin = admin(&url).await;
    let schema = fresh_schema("notes");
    let _cleanup = common::drop_schema_later(&url, &schema);
    let backend = backend(&url, &schema).await;
    let stored = async |name: &LockName| -> Option<String> {
        sqlx::query(AssertSqlSafe(format!(
            "SELECT note FROM {} WHERE name = $1",
            table(&schema)
        )))
        .bind(name.as_str())
        .fetch_one(&admin)
        .await
        .expect("row")
        .get("note")
    };
    let note = Note::new("job 7").expect("note");
    let name = fresh_name("n");
    let request = AcquireRequest::new(
        name.clone(),
        Identity::unique(),
        lockcore::Ttl::new(LONG).expect("valid TTL"),
    )
    .with_note(Some(note.clone()));
    let Acquire::Acquired(lease) = backend.acquire(&request).await.expect("acquire") else {
        panic!("free")
    };
    assert_eq!(stored(&name).await.as_deref(), Some("job 7"));
    sqlx::query(AssertSqlSafe(format!(
        "UPDATE {} SET note = $2 WHERE name = $1",
        table(&schema)
    )))
    .bind(name.as_str())
    .bind("a\u{1b}[2Jb")
    .execute(&admin)
    .await
    .expect("forged note");
    let shown = backend
        .inspect(&name)
        .await
        .expect("inspect")
        .expect("held");
    assert_eq!(shown.note().map(Note::as_str), Some("a\u{fffd}[2Jb"));
    let rival = AcquireRequest::new(
        name.clone(),
        Identity::unique(),
        lockcore::Ttl::new(LONG).expect("valid TTL"),
    );
    let Acquire::Held(holder) = backend.acquire(&rival).await.expect("attempt") else {
        panic!("held")
    };
    assert_eq!(holder.note().map(Note::as_str), Some("a\u{fffd}[2Jb"));
    backend.release(&lease).await.expect("release");
    assert_eq!(stored(&name).await, None, "release clears the note");

    let request = request.with_note(Some(note.clone()));
    let Acquire::Acquired(_) = backend.acquire(&request).await.expect("acquire") else {
        panic!("free")
    };
    let broken = backend
        .break_lock(&name)
        .await
        .expect("break")
        .expect("held");
    assert_eq!(broken.note(), Some(&note));
    assert_eq!(stored(&name).await, None, "break clears the note");

    // A row an operator wrote by hand whose name is no lock name (a control character).
    sqlx::query(AssertSqlSafe(format!(
        "INSERT INTO {} (name, owner, acquired_at, expires_at) \
         VALUES (E'bad\\nname', 'x', now(), now() + interval '1 minute')",
        table(&schema)
    )))
    .execute(&admin)
    .await
    .expect("foreign row");
    let kept = grant(&backend, &fresh_name("kept"), &Identity::unique(), LONG).await;
    let listed = backend
        .list("")
        .await
        .expect("one bad row does not fail the listing");
    let names: Vec<_> = listed.iter().map(|e| e.name().as_str()).collect();
    assert_eq!(names, [kept.name().as_str()]);
}

/// The upgrade's `ALTER TABLE` waits for its `ACCESS EXCLUSIVE` lock only briefly at a
/// time: while one client keeps a transaction open on an old table, a new version's
/// connect must not hold every other client's statement on the table behind its waiting
/// `ALTER` (for the whole 10 s client timeout, which would lose short leases fleet-wide).
/// Once the transaction ends, the connect completes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_upgrade_does_not_stall_other_clients_behind_a_long_transaction() {
    let Some(url) = shared_url() else { return };
    let admin = admin(&url).await;
    let schema = fresh_schema("busy");
    let _cleanup = common::drop_schema_later(&url, &schema);
    let (held, owner) = (fresh_name("busy"), Identity::unique());
    old_schema(&admin, &schema, &held, &owner).await;
    let table = table(&schema);

    // A client of the old version in a long transaction on the table (ACCESS SHARE).
    let mut long = admin.begin().await.expect("begin");
    sqlx::query(AssertSqlSafe(format!("SELECT count(*) FROM {table}")))
        .execute(&mut *long)
        .await
        .expect("read in the long transaction");

    let connect = tokio::spawn(PostgresBackend::connect(common::config(&url, &schema)));
    tokio::time::sleep(Duration::from_millis(300)).await;
    // Another client reads the table over and over for 1.5 s; none of its reads may wait
    // long behind the queued ALTER (200 ms per attempt, 100 ms apart).
    let mut worst = Duration::ZERO;
    let until = tokio::time::Instant::now() + Duration::from_millis(1500);
    while tokio::time::Instant::now() < until {
        let started = tokio::time::Instant::now();
        sqlx::query(AssertSqlSafe(format!("SELECT count(*) FROM {table}")))
            .execute(&admin)
            .await
            .expect("other client's read");
        worst = worst.max(started.elapsed());
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    long.commit().await.expect("end the long transaction");
    let backend = connect
        .await
        .expect("join")
        .expect("the connect completes once the table is free");
    assert!(has_note_column(&admin, &schema).await);
    assert!(
        worst < Duration::from_millis(1000),
        "another client's read waited {worst:?} behind the upgrade"
    );
    assert!(backend.inspect(&held).await.expect("inspect").is_some());
}
