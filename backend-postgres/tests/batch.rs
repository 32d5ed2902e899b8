//! `refresh_many`: one statement refreshes a batch of leases, and each lease's outcome is
//! what refreshing it alone would give (issue #16). The statement count is checked on the
//! private server in `restart.rs`.

mod common;

use std::time::Duration;

use backend_postgres::PostgresBackend;
use common::{admin, admin_delete, fresh_name, fresh_schema, grant, shared_url, table};
use lockcore::{Acquire, AcquireRequest, ErrorKind, Identity, Lease, LockBackend, LockName, Note};
use sqlx::{AssertSqlSafe, PgPool, Row};
use test_kit::proxy::{Fault, FaultProxy};

const LONG: Duration = Duration::from_secs(60);

/// A lock row as the server has it: `(owner, token, expires_at in µs, note)`.
type Stored = (Option<String>, i64, Option<i64>, Option<String>);

/// The row of `name`, or `None` when there is none.
async fn stored(admin: &PgPool, table: &str, name: &LockName) -> Option<Stored> {
    let sql = format!(
        "SELECT owner, token, (extract(epoch FROM expires_at) * 1000000)::bigint AS exp, note \
           FROM {table} WHERE name = $1"
    );
    let row = sqlx::query(AssertSqlSafe(sql))
        .bind(name.as_str())
        .fetch_optional(admin)
        .await
        .expect("read the row")?;
    Some((
        row.get("owner"),
        row.get("token"),
        row.get("exp"),
        row.get("note"),
    ))
}

/// Sets `name`'s expiry `offset_ms` from the database's now (negative: in the past).
async fn set_expiry(admin: &PgPool, table: &str, name: &LockName, offset_ms: i64) {
    let sql = format!(
        "UPDATE {table} SET expires_at = now() + $2::bigint * interval '1 millisecond' \
          WHERE name = $1"
    );
    sqlx::query(AssertSqlSafe(sql))
        .bind(name.as_str())
        .bind(offset_ms)
        .execute(admin)
        .await
        .expect("set the expiry");
}

/// A grant of `name` with `note`.
async fn grant_with_note(backend: &PostgresBackend, name: &LockName, note: &str) -> Lease {
    let ttl = lockcore::Ttl::new(LONG).expect("valid TTL");
    let request = AcquireRequest::new(name.clone(), Identity::unique(), ttl)
        .with_note(Some(Note::new(note).expect("valid note")));
    match backend.acquire(&request).await.expect("acquire") {
        Acquire::Acquired(lease) => lease,
        Acquire::Held(_) => panic!("{name} unexpectedly held"),
    }
}

/// A mixed batch, with prepared statements or without (the PgBouncer mode): a live lease
/// (extended on the server), a released one, a deleted one, a stale one whose name a rival
/// holds now, one with a note, and the live one twice. Each result is in order, the lost
/// ones carry the message a single refresh gives, and nothing the batch may not touch
/// changes.
async fn mixed_batch(prepared: bool) {
    let Some(url) = shared_url() else { return };
    let schema = fresh_schema("batch");
    let _cleanup = common::drop_schema_later(&url, &schema);
    let config = common::config(&url, &schema).with_prepared_statements(prepared);
    let backend = PostgresBackend::connect(config).await.expect("connect");
    let admin = admin(&url).await;
    let t = table(&schema);

    let live = grant(&backend, &fresh_name("live"), &Identity::unique(), LONG).await;
    set_expiry(&admin, &t, live.name(), 5_000).await;
    let before = stored(&admin, &t, live.name()).await.expect("row");

    let released = grant(&backend, &fresh_name("released"), &Identity::unique(), LONG).await;
    backend.release(&released).await.expect("release");

    let deleted = grant(&backend, &fresh_name("deleted"), &Identity::unique(), LONG).await;
    admin_delete(&admin, &t, deleted.name()).await;

    let stale = grant(&backend, &fresh_name("stale"), &Identity::unique(), LONG).await;
    set_expiry(&admin, &t, stale.name(), -1_000).await;
    let rival = grant(&backend, stale.name(), &Identity::unique(), LONG).await;
    let rival_before = stored(&admin, &t, stale.name()).await.expect("row");

    let noted = grant_with_note(&backend, &fresh_name("noted"), "deploy 42").await;
    set_expiry(&admin, &t, noted.name(), 5_000).await;

    let batch = [
        live.clone(),
        released.clone(),
        deleted.clone(),
        stale.clone(),
        noted.clone(),
        live.clone(),
    ];
    let results = backend.refresh_many(&batch).await;
    assert_eq!(results.len(), batch.len(), "one result per lease");

    for i in [0, 4, 5] {
        let lease = results[i].as_ref().expect("a live lease refreshes");
        assert_eq!(lease.grant(), batch[i].grant(), "result {i} is its lease's");
        assert_eq!(lease.name(), batch[i].name());
    }
    let lost = |i: usize| match &results[i] {
        Err(err) => {
            assert_eq!(err.kind(), ErrorKind::Lost, "result {i}: {err}");
            err.message().to_owned()
        }
        Ok(_) => panic!("result {i} refreshed a lease the server no longer holds"),
    };
    assert_eq!(lost(1), "the lock was released");
    assert_eq!(lost(2), "the lock row was deleted");
    assert!(lost(3).starts_with("taken over by "), "{}", lost(3));
    for (i, lease) in batch.iter().enumerate().take(4).skip(1) {
        let alone = backend.refresh(lease).await.expect_err("lost alone too");
        assert_eq!(
            alone.message(),
            lost(i),
            "the batch says what a refresh says"
        );
    }

    let after = stored(&admin, &t, live.name()).await.expect("row");
    let (before_exp, after_exp) = (before.2.expect("expiry"), after.2.expect("expiry"));
    assert!(
        after_exp >= before_exp + 50_000_000,
        "the live lease was extended by its TTL: {before_exp} -> {after_exp}"
    );
    assert_eq!((after.0, after.1), (before.0, before.1), "same grant");
    let released_row = stored(&admin, &t, released.name()).await.expect("row kept");
    assert_eq!(
        (released_row.0, released_row.2),
        (None, None),
        "not re-taken"
    );
    assert!(
        stored(&admin, &t, deleted.name()).await.is_none(),
        "a deleted lock is never re-created"
    );
    let rival_after = stored(&admin, &t, stale.name()).await.expect("row");
    assert_eq!(rival_after, rival_before, "the rival's grant is untouched");
    assert_eq!(
        rival_after.0.as_deref(),
        Some(rival.owner().as_str()),
        "the rival still holds it"
    );
    let noted_row = stored(&admin, &t, noted.name()).await.expect("row");
    assert_eq!(noted_row.3.as_deref(), Some("deploy 42"), "the note stays");
    assert!(noted_row.2.expect("expiry") >= before_exp + 50_000_000);
    let holder = backend.inspect(noted.name()).await.expect("inspect");
    let note = holder.and_then(|h| h.note().map(|n| n.as_str().to_owned()));
    assert_eq!(note.as_deref(), Some("deploy 42"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_mixed_batch_gives_each_lease_its_own_refresh() {
    mixed_batch(true).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_mixed_batch_without_prepared_statements() {
    mixed_batch(false).await;
}

/// Two grants of one name in one batch (the current one and an older one of the same
/// owner, taken over by a same-owner retake): each gets its own result, in either order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_lock_twice_with_different_grants() {
    let Some(url) = shared_url() else { return };
    let schema = fresh_schema("batch_twice");
    let _cleanup = common::drop_schema_later(&url, &schema);
    let backend = common::backend(&url, &schema).await;
    let name = fresh_name("twice");
    let owner = Identity::unique();
    let old = grant(&backend, &name, &owner, LONG).await;
    let new = grant(&backend, &name, &owner, LONG).await;
    assert_ne!(old.grant(), new.grant(), "a retake is a new grant");
    for batch in [[old.clone(), new.clone()], [new.clone(), old.clone()]] {
        let results = backend.refresh_many(&batch).await;
        for (lease, result) in batch.iter().zip(&results) {
            if lease.grant() == new.grant() {
                assert_eq!(result.as_ref().expect("current").grant(), new.grant());
            } else {
                let err = result.as_ref().expect_err("the old grant is lost");
                assert_eq!(err.kind(), ErrorKind::Lost);
                assert!(err.message().starts_with("taken over by "), "{err}");
            }
        }
    }
}

/// More leases than one statement carries: every lease gets its result, in order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_larger_than_the_limit_is_split() {
    let Some(url) = shared_url() else { return };
    let schema = fresh_schema("batch_split");
    let _cleanup = common::drop_schema_later(&url, &schema);
    let backend = common::backend(&url, &schema).await;
    let limit = backend.refresh_batch_limit();
    assert_eq!(limit, 1000);
    let lease = grant(&backend, &fresh_name("split"), &Identity::unique(), LONG).await;
    let gone = grant(&backend, &fresh_name("gone"), &Identity::unique(), LONG).await;
    backend.release(&gone).await.expect("release");
    // The same two grants over and over, the lost one at every third place.
    let batch: Vec<Lease> = (0..limit + 7)
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

/// A statement that gets no answer fails every lease with the temporary error a single
/// refresh gets (the write was sent, its outcome is unknown), never `Lost`; afterwards the
/// same batch works.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_statement_fails_every_lease_temporarily() {
    let Some(url) = shared_url() else { return };
    let schema = fresh_schema("batch_cut");
    let _cleanup = common::drop_schema_later(&url, &schema);
    let upstream = test_kit::env::host_port(&url).expect("host:port");
    let proxy = FaultProxy::start(upstream.parse().expect("address"))
        .await
        .expect("proxy");
    let through = url.replace(upstream, &proxy.local_addr().to_string());
    // A pool of one: the batch below must find the connection the release used idle.
    let config = common::config(&through, &schema)
        .with_timeout(Duration::from_secs(1))
        .with_pool_size(1);
    let backend = PostgresBackend::connect(config).await.expect("connect");
    let mut batch = Vec::new();
    for _ in 0..3 {
        batch.push(grant(&backend, &fresh_name("cut"), &Identity::unique(), LONG).await);
    }
    let gone = grant(&backend, &fresh_name("cut-gone"), &Identity::unique(), LONG).await;
    backend.release(&gone).await.expect("release");
    batch.push(gone);
    // The release's connection is idle again before the release returns (sqlx's pool gave
    // it back in a task of its own after a ping, and a blackhole set before that left no
    // idle connection: the batch failed as `Unavailable`, nothing sent, every time with a
    // pool of one, instead of the sent write this test is about).

    proxy.set_fault(Fault::Blackhole);
    let results = backend.refresh_many(&batch).await;
    assert_eq!(results.len(), batch.len());
    for result in &results {
        let err = result.as_ref().expect_err("no answer");
        assert_ne!(err.kind(), ErrorKind::Lost, "{err}");
        assert!(err.is_temporary(), "{err}");
        // What a single refresh on a pooled connection gets: the write was sent.
        assert_eq!(err.kind(), ErrorKind::OutcomeUnknown, "{err}");
        assert_eq!(err.message(), "no answer within 1s (waiting for the reply)");
    }

    proxy.set_fault(Fault::Pass);
    let results = backend.refresh_many(&batch).await;
    let ok: Vec<bool> = results.iter().map(Result::is_ok).collect();
    assert_eq!(ok, [true, true, true, false], "{results:?}");
}
