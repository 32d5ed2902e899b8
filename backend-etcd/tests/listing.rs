//! Notes and listing, etcd-specific: the note is written by the very Txn that creates
//! (or claims) the key, never by a later write; a listing reports each lock's first
//! contender (never a queued waiter, wherever its key sorts), shows etcdctl/Go holders by
//! their lease, skips keys no anylock name maps to, and reads large ranges in pages at a
//! known RPC cost.

mod common;

use std::sync::Arc;
use std::time::Duration;

use backend_etcd::EtcdBackend;
use lockcore::{Acquire, AcquireRequest, Identity, Lease, LockBackend, LockName, Note};

const LONG: Duration = Duration::from_secs(30);

fn name(s: &str) -> LockName {
    LockName::new(s).expect("valid name")
}

fn note(s: &str) -> Note {
    Note::new(s).expect("valid note")
}

async fn grant(backend: &EtcdBackend, lock: &LockName, owner: &Identity, n: Option<Note>) -> Lease {
    let request = AcquireRequest::new(
        lock.clone(),
        owner.clone(),
        lockcore::Ttl::new(LONG).expect("valid TTL"),
    )
    .with_note(n);
    match backend.acquire(&request).await.expect("acquire") {
        Acquire::Acquired(lease) => lease,
        Acquire::Held(holder) => panic!("{lock} unexpectedly held by {}", holder.owner()),
    }
}

/// The note is in the value of the Put that creates the key: the key was never modified
/// after its creation (version 1, mod revision = create revision = the token). A note
/// written by a second request after the grant (a window where the grant shows no note,
/// or a note left behind if the holder dies in between) fails here. For a queued waiter,
/// the claim Txn that turns its place into the grant writes the note.
#[tokio::test]
async fn the_note_is_written_by_the_txn_that_grants() {
    let Some(endpoints) = common::shared_endpoints() else {
        return;
    };
    let prefix = common::random_prefix("note");
    let backend = Arc::new(common::backend(&endpoints, &prefix).await);
    let mut raw = common::raw(&endpoints).await;
    let lock = name("noted");
    let first = note("deploy #1");
    let lease = grant(&backend, &lock, &Identity::unique(), Some(first.clone())).await;
    let keys = common::keys_under(&mut raw, &backend.lock_prefix(&lock)).await;
    assert_eq!(keys.len(), 1);
    let key = &keys[0];
    assert_eq!(
        key.version, 1,
        "the key was written again after its creation"
    );
    assert_eq!(key.mod_revision, key.create_revision);
    let token = i64::try_from(lease.token().expect("token").get()).expect("fits");
    assert_eq!(key.create_revision, token);
    let value: serde_json::Value = serde_json::from_slice(&key.value).expect("JSON");
    assert_eq!(value["note"], first.as_str());

    // A queued waiter with a note: the claim Txn writes it with the grant.
    let waiter = Identity::unique();
    let second = note("deploy #2");
    let request = AcquireRequest::new(
        lock.clone(),
        waiter.clone(),
        lockcore::Ttl::new(LONG).expect("valid TTL"),
    )
    .with_note(Some(second.clone()));
    assert!(matches!(
        backend.acquire(&request).await.expect("attempt"),
        Acquire::Held(_)
    ));
    let ticket = backend
        .enqueue(&request)
        .await
        .expect("enqueue")
        .expect("queued");
    backend.release(&lease).await.expect("release");
    let queued = match backend.acquire(&request).await.expect("claim") {
        Acquire::Acquired(lease) => lease,
        Acquire::Held(holder) => panic!("still held by {}", holder.owner()),
    };
    let shown = backend
        .inspect(&lock)
        .await
        .expect("inspect")
        .expect("held");
    assert_eq!((shown.owner(), shown.note()), (&waiter, Some(&second)));
    let keys = common::keys_under(&mut raw, &backend.lock_prefix(&lock)).await;
    assert_eq!(keys.len(), 1);
    let value: serde_json::Value = serde_json::from_slice(&keys[0].value).expect("JSON");
    assert_eq!(value["note"], second.as_str());
    drop(ticket);
    backend.release(&queued).await.expect("release");
}

/// Waiters are not holders: with an anylock holder, an anylock queued waiter and a Go
/// waiter whose key sorts *before* the holder's, the listing has one entry, the holder's,
/// exactly as inspect shows it. A Go/etcdctl holder (empty value) is listed by its lease
/// with no note; keys that map to no lock name are skipped, not fatal.
#[tokio::test]
async fn list_reports_first_contenders_and_skips_foreign_keys() {
    let Some(endpoints) = common::shared_endpoints() else {
        return;
    };
    let prefix = common::random_prefix("listq");
    let backend = common::backend(&endpoints, &prefix).await;
    let mut raw = common::raw(&endpoints).await;
    let session = raw.lease_grant(60).await.expect("grant");

    let lock = name("team/deploy");
    let holder = Identity::unique();
    let lease = grant(&backend, &lock, &holder, Some(note("held"))).await;
    let waiter = AcquireRequest::new(
        lock.clone(),
        Identity::unique(),
        lockcore::Ttl::new(LONG).expect("valid TTL"),
    )
    .with_note(Some(note("waiting")));
    let ticket = backend
        .enqueue(&waiter)
        .await
        .expect("enqueue")
        .expect("queued");
    // Lease ids print without leading zeros, so `0000` sorts before every anylock key.
    let lock_prefix = backend.lock_prefix(&lock);
    let go_waiter = format!("{lock_prefix}0000");
    raw.put(go_waiter.as_str(), "", session).await.expect("put");

    let go_lock = name("go");
    let go_key = format!("{}{session:x}", backend.lock_prefix(&go_lock));
    raw.put(go_key.as_str(), "", session).await.expect("put");
    for foreign in ["bad%zz/1", "noslash", "lower%2f/1", "ctl\u{7}/1"] {
        raw.put(format!("{prefix}{foreign}"), "x", session)
            .await
            .expect("put");
    }

    let listed = backend.list("").await.expect("list");
    let names: Vec<&str> = listed.iter().map(|e| e.name().as_str()).collect();
    assert_eq!(names, ["go", "team/deploy"]);
    let inspected = backend
        .inspect(&lock)
        .await
        .expect("inspect")
        .expect("held");
    let entry = listed[1].holder();
    assert_eq!(entry.owner(), &holder);
    assert_eq!(entry.token(), lease.token());
    assert_eq!(entry.note(), Some(&note("held")));
    assert_eq!(
        (
            entry.owner(),
            entry.token(),
            entry.note(),
            entry.acquired_at()
        ),
        (
            inspected.owner(),
            inspected.token(),
            inspected.note(),
            inspected.acquired_at()
        )
    );
    assert!(entry.expires_in().is_some_and(|left| left <= LONG));
    let go = listed[0].holder();
    assert_eq!(go.owner().as_str(), format!("etcd-lease/{session:x}"));
    assert_eq!(go.note(), None);

    assert_eq!(backend.list("team/").await.expect("list").len(), 1);
    assert!(backend.list("team%").await.expect("list").is_empty());
    drop(ticket);
    backend.release(&lease).await.expect("release");
    // The Go waiter is now the first contender: it holds the lock.
    let after = backend.list("team/").await.expect("list");
    assert_eq!(after.len(), 1);
    assert_eq!(
        after[0].holder().owner().as_str(),
        format!("etcd-lease/{session:x}")
    );
    raw.lease_revoke(session).await.expect("revoke");
    assert!(backend.list("").await.expect("list").is_empty());
}

/// More keys than one page: 600 keys of one lock whose owner key sorts last, and 520
/// locks. Each lock appears once with its first contender as holder, sorted; the cost is
/// one Range per 500 keys plus a Range and a LeaseTimeToLive per held lock.
#[tokio::test]
async fn large_ranges_are_read_in_pages() {
    let Some(endpoints) = common::shared_endpoints() else {
        return;
    };
    let prefix = common::random_prefix("listpages");
    let backend = common::backend(&endpoints, &prefix).await;
    let mut raw = common::raw(&endpoints).await;
    let session = raw.lease_grant(120).await.expect("grant");
    let big = backend.lock_prefix(&name("big"));
    let owner = raw.put(format!("{big}zz"), "", session).await.expect("put");
    let owner_rev = owner.header.expect("header").revision;
    for i in 0..600 {
        raw.put(format!("{big}{i:04}"), "", session)
            .await
            .expect("put");
    }
    let before = backend.rpcs_sent();
    let listed = backend.list("big").await.expect("list");
    assert_eq!(
        backend.rpcs_sent() - before,
        2 + 2,
        "2 pages + 2 per held lock"
    );
    assert_eq!(listed.len(), 1);
    let token = listed[0].holder().token().expect("token").get();
    assert_eq!(i64::try_from(token).expect("fits"), owner_rev);

    for i in 0..520 {
        let key = backend.lock_prefix(&name(&format!("l/{i:03}")));
        raw.put(format!("{key}1"), "", session).await.expect("put");
    }
    let listed = backend.list("l/").await.expect("list");
    let names: Vec<String> = listed.iter().map(|e| e.name().to_string()).collect();
    let expected: Vec<String> = (0..520).map(|i| format!("l/{i:03}")).collect();
    assert_eq!(names, expected);
    let everything = backend.list("").await.expect("list");
    assert_eq!(everything.len(), 521);
    raw.lease_revoke(session).await.expect("revoke");
}
