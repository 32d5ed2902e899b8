//! Resource shape, generations, PATCH merging, `Date` headers, media and
//! the create-if-absent canary, against the documented JSON-API semantics.

mod common;

use std::time::Duration;

use common::{Gcs, int_field, status_json};
use gcs_test_server::GcsTestServer;
use serde_json::{Value, json};

async fn setup() -> (GcsTestServer, Gcs) {
    let server = GcsTestServer::start().await;
    server.create_bucket("bkt");
    let gcs = Gcs::new(&server.url(), "bkt");
    (server, gcs)
}

/// The fields the backend reads, with GCS's JSON types.
#[tokio::test]
async fn object_resource_has_gcs_field_types() {
    let (server, gcs) = setup().await;
    let metadata =
        json!({"name": "locks/a", "cacheControl": "no-store", "metadata": {"owner": "me"}});
    let (status, r) = status_json(
        gcs.multipart_insert("locks/a", "ifGenerationMatch=0", &metadata)
            .await,
    )
    .await;
    assert_eq!(status, 200, "{r}");
    for field in [
        "generation",
        "metageneration",
        "size",
        "id",
        "selfLink",
        "bucket",
        "name",
        "updated",
        "timeCreated",
        "etag",
    ] {
        assert!(r[field].is_string(), "{field} is not a string in {r}");
    }
    assert_eq!(r["kind"], "storage#object");
    assert_eq!(r["name"], "locks/a");
    assert_eq!(r["bucket"], "bkt");
    assert_eq!(r["size"], "0");
    assert_eq!(r["metageneration"], "1");
    assert_eq!(r["cacheControl"], "no-store");
    assert_eq!(r["metadata"], json!({"owner": "me"}));
    assert_eq!(
        r["id"],
        format!("bkt/locks/a/{}", int_field(&r, "generation"))
    );
    assert_eq!(
        r["selfLink"],
        format!("{}/storage/v1/b/bkt/o/locks%2Fa", server.url())
    );
    assert_eq!(
        gcs.resource("locks/a").await,
        r,
        "GET returns what insert returned"
    );
}

/// `updated`/`timeCreated` are RFC 3339 UTC with exactly 3 fraction digits.
#[tokio::test]
async fn timestamps_are_rfc3339_millis() {
    let (_server, gcs) = setup().await;
    let (_, r) = status_json(gcs.media_insert("t", "", b"").await).await;
    for field in ["updated", "timeCreated"] {
        let s = r[field].as_str().unwrap();
        assert_eq!(s.len(), 24, "{field}={s}");
        assert!(
            s.ends_with('Z') && s.as_bytes()[10] == b'T' && s.as_bytes()[19] == b'.',
            "{field}={s}"
        );
    }
}

/// The fence token: a new object of a name always has a higher
/// generation, across delete and recreate, however fast.
#[tokio::test]
async fn generation_strictly_increases_across_delete_and_recreate() {
    let (_server, gcs) = setup().await;
    let mut last = 0;
    for _ in 0..20 {
        let (status, r) =
            status_json(gcs.media_insert("fence", "ifGenerationMatch=0", b"").await).await;
        assert_eq!(status, 200);
        let generation = int_field(&r, "generation");
        assert!(generation > last, "{generation} after {last}");
        last = generation;
        assert_eq!(gcs.delete("fence", "").await.status(), 204);
    }
    let (_, overwrite) = status_json(gcs.media_insert("fence", "", b"").await).await;
    let (_, again) = status_json(gcs.media_insert("fence", "", b"").await).await;
    assert!(int_field(&again, "generation") > int_field(&overwrite, "generation"));
    assert_eq!(
        again["metageneration"], "1",
        "a new generation starts at metageneration 1"
    );
}

/// PATCH merges keys, a null value removes one, metageneration goes up by
/// one, `updated` moves, generation and `timeCreated` stay.
#[tokio::test]
async fn patch_merges_removes_and_bumps_metageneration() {
    let (_server, gcs) = setup().await;
    let created = json!({"name": "p", "metadata": {"a": "1", "b": "2"}});
    let (_, before) = status_json(gcs.multipart_insert("p", "", &created).await).await;
    tokio::time::sleep(Duration::from_millis(5)).await;
    let patch = json!({"metadata": {"b": null, "c": "3"}, "cacheControl": "no-store"});
    let (status, after) =
        status_json(gcs.patch("p", "ifMetagenerationMatch=1", &patch).await).await;
    assert_eq!(status, 200, "{after}");
    assert_eq!(after["metadata"], json!({"a": "1", "c": "3"}));
    assert_eq!(after["cacheControl"], "no-store");
    assert_eq!(int_field(&after, "metageneration"), 2);
    assert_eq!(after["generation"], before["generation"]);
    assert_eq!(after["timeCreated"], before["timeCreated"]);
    assert!(
        after["updated"].as_str() > before["updated"].as_str(),
        "updated did not move"
    );
    assert_eq!(gcs.resource("p").await, after);
}

/// `"metadata": null` removes every key; `"cacheControl": null` clears it.
#[tokio::test]
async fn patch_null_map_clears_metadata() {
    let (_server, gcs) = setup().await;
    let created = json!({"name": "p", "cacheControl": "no-store", "metadata": {"a": "1"}});
    gcs.multipart_insert("p", "", &created).await;
    let (_, r) = status_json(
        gcs.patch("p", "", &json!({"metadata": null, "cacheControl": null}))
            .await,
    )
    .await;
    assert!(r.get("metadata").is_none(), "{r}");
    assert!(r.get("cacheControl").is_none(), "{r}");
    assert_eq!(r["metageneration"], "2");
}

/// Every response carries an HTTP-date `Date` header, errors included.
#[tokio::test]
async fn every_response_has_a_date_header() {
    let (_server, gcs) = setup().await;
    let responses = [
        gcs.media_insert("d", "ifGenerationMatch=0", b"").await,
        gcs.media_insert("d", "ifGenerationMatch=0", b"").await,
        gcs.get("d", "").await,
        gcs.get("missing", "").await,
        gcs.patch("d", "", &json!({})).await,
        gcs.delete("d", "").await,
        gcs.list("").await,
    ];
    let statuses: Vec<u16> = responses.iter().map(|r| r.status().as_u16()).collect();
    assert_eq!(statuses, [200, 412, 200, 404, 200, 204, 200]);
    for response in &responses {
        let date = response.headers().get("date").expect("Date header");
        let date = date.to_str().unwrap();
        assert!(date.ends_with(" GMT") && date.len() == 29, "{date}");
    }
}

/// `alt=media` returns the content; the media upload keeps its type.
#[tokio::test]
async fn alt_media_returns_content() {
    let (_server, gcs) = setup().await;
    gcs.media_insert("m", "", b"hello").await;
    let response = gcs.get("m", "alt=media").await;
    assert_eq!(response.status(), 200);
    assert_eq!(response.headers()["content-type"], "text/plain");
    assert_eq!(response.text().await.unwrap(), "hello");
    assert_eq!(gcs.resource("m").await["size"], "5");
}

/// Objects need an existing bucket, as on GCS.
#[tokio::test]
async fn missing_bucket_is_404() {
    let (server, _) = setup().await;
    let other = Gcs::new(&server.url(), "no-such-bucket");
    assert_eq!(other.media_insert("x", "", b"").await.status(), 404);
    assert_eq!(other.get("x", "").await.status(), 404);
    assert_eq!(other.create_bucket().await.status(), 200);
    assert_eq!(other.create_bucket().await.status(), 409);
    assert_eq!(other.media_insert("x", "", b"").await.status(), 200);
}

/// List filters by prefix and omits `items` when empty.
#[tokio::test]
async fn list_by_prefix() {
    let (_server, gcs) = setup().await;
    for name in ["locks/a", "locks/b", "other"] {
        gcs.media_insert(name, "", b"").await;
    }
    let (_, r) = status_json(gcs.list("locks/").await).await;
    let names: Vec<&Value> = r["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|o| &o["name"])
        .collect();
    assert_eq!(names, [&json!("locks/a"), &json!("locks/b")]);
    let (_, empty) = status_json(gcs.list("zzz").await).await;
    assert!(empty.get("items").is_none());
}

/// The canary: two simultaneous create-if-absent inserts of one name
/// produce exactly one 200 and one 412, every time.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn canary_concurrent_create_if_absent_has_one_winner() {
    let (_server, gcs) = setup().await;
    for round in 0..50 {
        let name = format!("canary-{round}");
        let (a, b) = tokio::join!(
            tokio::spawn({
                let (gcs, name) = (gcs.clone(), name.clone());
                async move {
                    gcs.media_insert(&name, "ifGenerationMatch=0", b"")
                        .await
                        .status()
                        .as_u16()
                }
            }),
            tokio::spawn({
                let (gcs, name) = (gcs.clone(), name.clone());
                async move {
                    let metadata = json!({"name": name});
                    gcs.multipart_insert(&name, "ifGenerationMatch=0", &metadata)
                        .await
                        .status()
                        .as_u16()
                }
            }),
        );
        let mut statuses = [a.unwrap(), b.unwrap()];
        statuses.sort_unstable();
        assert_eq!(statuses, [200, 412], "round {round}");
    }
}
