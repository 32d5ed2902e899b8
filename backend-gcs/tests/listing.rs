//! Notes and listing against the in-process test server: where the note is stored, how
//! `list` pages and encodes its prefix, what it costs, and what it makes of objects it
//! did not write.

mod common;

use std::time::Duration;

use backend_gcs::{GcsBackend, GcsConfig};
use common::Gcs;
use lockcore::{
    Acquire, AcquireRequest, ErrorKind, HeldLock, Identity, Lease, LockBackend, LockName, Note,
};
use serde_json::json;

fn name(text: &str) -> LockName {
    LockName::new(text).expect("valid name")
}

fn note(text: &str) -> Note {
    Note::new(text).expect("valid note")
}

async fn take(backend: &GcsBackend, lock: &str, owner: &Identity, note: Option<Note>) -> Acquire {
    let request = AcquireRequest::new(
        name(lock),
        owner.clone(),
        lockcore::Ttl::new(Duration::from_secs(30)).expect("valid TTL"),
    )
    .with_note(note);
    backend.acquire(&request).await.expect("acquire")
}

async fn grant(backend: &GcsBackend, lock: &str, note: Option<Note>) -> Lease {
    match take(backend, lock, &Identity::unique(), note).await {
        Acquire::Acquired(lease) => lease,
        Acquire::Held(holder) => panic!("{lock} held by {holder:?}"),
    }
}

fn names(held: &[HeldLock]) -> Vec<&str> {
    held.iter().map(|h| h.name().as_str()).collect()
}

/// The note is the metadata key `note`, written by the create itself (one request: the
/// grant and its note in one conditional write), absent when there is no note; `Held`
/// answers, `break_lock` and `list` show it.
#[tokio::test]
async fn the_note_is_a_metadata_key_of_the_grant() {
    let gcs = Gcs::start().await;
    let backend = gcs.backend().await;
    gcs.server.clear_requests();
    let lease = grant(&backend, "noted", Some(note("deploy #7"))).await;
    let calls: Vec<_> = gcs
        .server
        .requests()
        .into_iter()
        .map(|r| r.method)
        .collect();
    assert_eq!(calls, ["POST"], "the note costs no extra request");
    let object = gcs.raw_get("noted").await.expect("object");
    assert_eq!(object["metadata"]["note"], "deploy #7");
    assert_eq!(object["metadata"]["identity"], lease.owner().as_str());

    let Acquire::Held(holder) = take(&backend, "noted", &Identity::unique(), None).await else {
        panic!("a contender got a held lock");
    };
    assert_eq!(
        holder.note(),
        Some(&note("deploy #7")),
        "Held shows the note"
    );
    let listed = backend.list("noted").await.expect("list");
    assert_eq!(listed[0].holder().note(), Some(&note("deploy #7")));
    let broken = backend.break_lock(&name("noted")).await.expect("break");
    assert_eq!(
        broken.and_then(|h| h.note().cloned()),
        Some(note("deploy #7"))
    );

    grant(&backend, "plain", None).await;
    let plain = gcs.raw_get("plain").await.expect("object");
    assert!(plain["metadata"].get("note").is_none(), "{plain}");
}

/// A refresh is a PATCH that merges metadata: it sends no note and the stored one stays
/// (on the server, not only in this client's memory); a same-owner retake is a new object,
/// with the new request's note or none.
#[tokio::test]
async fn refresh_keeps_the_note_and_a_retake_replaces_it() {
    let gcs = Gcs::start().await;
    let backend = gcs.backend().await;
    let owner = Identity::unique();
    let Acquire::Acquired(lease) = take(&backend, "r", &owner, Some(note("first"))).await else {
        panic!("free name");
    };
    backend.refresh(&lease).await.expect("refresh");
    let patch = gcs
        .server
        .requests()
        .into_iter()
        .find(|r| r.method == "PATCH");
    assert!(patch.is_some(), "the refresh was a PATCH");
    let object = gcs.raw_get("r").await.expect("object");
    assert_eq!(object["metageneration"], "2");
    assert_eq!(object["metadata"]["note"], "first");

    take(&backend, "r", &owner, Some(note("second"))).await;
    let shown = backend.inspect(&name("r")).await.expect("inspect");
    assert_eq!(shown.and_then(|h| h.note().cloned()), Some(note("second")));
    take(&backend, "r", &owner, None).await;
    let shown = backend.inspect(&name("r")).await.expect("inspect");
    assert_eq!(shown.expect("held").note(), None, "a retake without a note");
}

/// Locks written by the previous version (no `note` key) read as having no note; a note
/// written by another tool is cleaned (control characters never reach a terminal) and an
/// empty one is none.
#[tokio::test]
async fn stored_notes_are_read_back_safely() {
    let gcs = Gcs::start().await;
    let backend = gcs.backend().await;
    let owner = Identity::unique();
    gcs.raw_put("old", &owner, Duration::from_secs(30)).await;
    let mut meta = json!({"identity": owner.as_str(), "ttl_ms": "30000"});
    meta["note"] = json!("evil\u{1b}[2J\u{7}");
    gcs.raw_put_metadata("evil", meta.clone()).await;
    meta["note"] = json!("");
    gcs.raw_put_metadata("empty", meta).await;
    let listed = backend.list("").await.expect("list");
    let notes: Vec<_> = listed
        .iter()
        .map(|h| (h.name().as_str(), h.holder().note().map(Note::as_str)))
        .collect();
    assert_eq!(
        notes,
        [
            ("empty", None),
            ("evil", Some("evil\u{fffd}[2J\u{fffd}")),
            ("old", None)
        ]
    );
    let old = backend.inspect(&name("old")).await.expect("inspect");
    assert_eq!(old.expect("held").owner(), &owner);
}

/// The prefix travels percent-encoded as one query value: `%41` is not `A`, `+` is not a
/// space, `#` does not end the URL, `&` starts no parameter, `%2F` is not `/`. With the
/// prefix sent raw, each of these lists the wrong lock (or none).
#[tokio::test]
async fn prefixes_round_trip_through_the_query_string() {
    let gcs = Gcs::start().await;
    let backend = gcs.backend().await;
    let locks = [
        "p%41", "pA", "a+b", "a b", "h#1", "h", "q&x=1", "q", "s%2Fx", "s/x", "ü*?[", "ü",
    ];
    for lock in locks {
        grant(&backend, lock, None).await;
    }
    for lock in locks {
        let listed = backend.list(lock).await.expect("list");
        let want: Vec<&str> = {
            let mut w: Vec<&str> = locks
                .iter()
                .copied()
                .filter(|l| l.starts_with(lock))
                .collect();
            w.sort_unstable();
            w
        };
        assert_eq!(names(&listed), want, "prefix {lock:?}");
    }
    let all = backend.list("").await.expect("list");
    let mut sorted = locks;
    sorted.sort_unstable();
    assert_eq!(names(&all), sorted, "byte order, names once");
}

/// More locks than one page holds: `list` follows `nextPageToken` (GCS pages hold at most
/// 1000 objects) and costs one GET per page, never one per object.
#[tokio::test]
async fn list_follows_the_page_token_one_request_per_page() {
    let gcs = Gcs::start().await;
    let backend = gcs.backend().await;
    for i in 0..1001 {
        grant(&backend, &format!("many/{i:04}"), None).await;
    }
    grant(&backend, "other", None).await;
    gcs.server.clear_requests();
    let listed = backend.list("many/").await.expect("list");
    assert_eq!(listed.len(), 1001);
    assert_eq!(listed[0].name().as_str(), "many/0000");
    assert_eq!(listed[1000].name().as_str(), "many/1000");
    let requests = gcs.server.requests();
    assert_eq!(requests.len(), 2, "{requests:?}");
    for request in &requests {
        assert_eq!(request.method, "GET");
        let query = request.query.as_deref().unwrap_or_default();
        assert!(query.contains("maxResults=1000"), "{query}");
        assert!(query.contains("projection=noAcl"), "{query}");
    }
    let second = requests[1].query.as_deref().unwrap_or_default();
    assert!(second.contains("pageToken="), "{second}");
    assert!(
        !requests[0]
            .query
            .as_deref()
            .unwrap_or_default()
            .contains("pageToken")
    );
}

/// `list` reports what `inspect` does for every object under the prefix: a foreign object
/// (no identity, no TTL) blocks the name, so both show it held by `(unknown)`; objects
/// whose names are no lock name, or whose resource is malformed, are skipped rather than
/// failing the listing; objects outside the backend's prefix never appear.
#[tokio::test]
async fn list_agrees_with_inspect_and_skips_what_is_no_lock() {
    let gcs = Gcs::start().await;
    let backend = gcs.backend().await;
    let lease = grant(&backend, "mine", Some(note("n"))).await;
    gcs.raw_put_metadata("foreign", json!({"purpose": "not a lock"}))
        .await;
    gcs.raw_put_metadata("bell\u{7}", json!({"identity": "x", "ttl_ms": "30000"}))
        .await;
    let outside = common::Bucket::new(&gcs.url, &gcs.bucket, "elsewhere/");
    outside
        .raw_put("mine2", &Identity::unique(), Duration::from_secs(30))
        .await;
    let listed = backend.list("").await.expect("list");
    assert_eq!(names(&listed), ["foreign", "mine"]);
    for entry in &listed {
        let inspected = backend.inspect(entry.name()).await.expect("inspect");
        let inspected = inspected.expect("listed means held");
        assert_eq!(entry.holder().owner(), inspected.owner());
        assert_eq!(entry.holder().token(), inspected.token());
        assert_eq!(entry.holder().note(), inspected.note());
        assert_eq!(entry.holder().acquired_at(), inspected.acquired_at());
    }
    assert_eq!(listed[1].holder().owner(), lease.owner());
    assert_eq!(listed[1].holder().token(), lease.token());
    assert!(listed[1].holder().expires_in().is_some());
    assert_eq!(listed[0].holder().owner().as_str(), "(unknown)");
}

/// Expiry is judged on the server's clock (the list reply's `Date`), as `inspect` does:
/// a client clock far ahead or behind changes nothing, a server clock moved past the TTL
/// ends the listing of the lock.
#[tokio::test]
async fn list_judges_expiry_on_the_server_clock() {
    let gcs = Gcs::start().await;
    let backend = gcs.backend().await;
    grant(&backend, "timed", None).await;
    assert_eq!(names(&backend.list("").await.expect("list")), ["timed"]);
    gcs.server
        .set_clock_offset(gcs_test_server::ClockOffset::Ahead(Duration::from_secs(29)));
    assert_eq!(names(&backend.list("").await.expect("list")), ["timed"]);
    gcs.server
        .set_clock_offset(gcs_test_server::ClockOffset::Ahead(Duration::from_secs(33)));
    assert!(backend.list("").await.expect("list").is_empty());
    assert_eq!(
        backend.inspect(&name("timed")).await.expect("inspect"),
        None
    );
}

/// A missing bucket is a configuration error, as for acquire.
#[tokio::test]
async fn list_in_a_missing_bucket_is_a_config_error() {
    let gcs = Gcs::start().await;
    let config = GcsConfig::new("no-such-bucket")
        .and_then(|c| c.with_endpoint(&gcs.url))
        .expect("config");
    let backend = GcsBackend::connect(config).await.expect("backend");
    let err = backend.list("").await.expect_err("no bucket");
    assert_eq!(err.kind(), ErrorKind::Config, "{err}");
}
