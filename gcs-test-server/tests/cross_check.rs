//! Cross-check against fake-gcs-server, an implementation we did not write:
//! the same wire calls go to both servers and the responses' shapes
//! (status, field names, JSON types) must agree wherever fake-gcs-server
//! follows GCS. Where it is known not to (../shared/INFRA.md, and what this
//! test found), the difference is asserted explicitly, so the test fails
//! when fake-gcs-server changes and the list needs revisiting.
//!
//! Needs `ANYLOCK_TEST_FAKE_GCS_URL` (`scripts/servers start`); skipped
//! without it outside CI, a failure in CI.

mod common;

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

use common::{Gcs, status_json};
use gcs_test_server::GcsTestServer;
use serde_json::{Value, json};

/// One response: status, body, and whether it had a `Date` header.
#[derive(Debug, Clone)]
struct Seen {
    status: u16,
    body: Value,
    dated: bool,
}

async fn seen(response: reqwest::Response) -> Seen {
    let dated = response.headers().contains_key("date");
    let (status, body) = status_json(response).await;
    Seen {
        status,
        body,
        dated,
    }
}

/// Responses by step name.
type Steps = BTreeMap<&'static str, Seen>;

/// The lock cycle's calls, plus the precondition probes, by step name.
async fn scenario(gcs: &Gcs) -> Steps {
    let mut s = Steps::new();
    s.insert("create_bucket", seen(gcs.create_bucket().await).await);
    acquire(gcs, &mut s).await;
    listing(gcs, &mut s).await;
    refresh_and_release(gcs, &mut s).await;
    s
}

/// The backend's `list`: `objects.list` by prefix in pages of one (`maxResults`,
/// `pageToken`), and a prefix full of characters that need percent-encoding.
async fn listing(gcs: &Gcs, s: &mut Steps) {
    let odd = "odd/a%*?[ +&#ü";
    s.insert(
        "odd_insert",
        seen(gcs.media_insert(odd, "", b"").await).await,
    );
    let first = gcs.list_query("prefix=locks%2F&maxResults=1").await;
    s.insert("list_first_page", seen(first).await);
    let token = s["list_first_page"].body["nextPageToken"]
        .as_str()
        .map(common::encode)
        .unwrap_or_default();
    let query = format!("prefix=locks%2F&maxResults=1&pageToken={token}");
    let next = gcs.list_query(&query).await;
    s.insert("list_next_page", seen(next).await);
    s.insert("list_all", seen(gcs.list("locks/").await).await);
    s.insert("list_odd", seen(gcs.list("odd/a%*?[ +&").await).await);
    s.insert("list_none", seen(gcs.list("odd/a%*?[ +&$").await).await);
}

/// Create-if-absent with both upload types, each twice.
async fn acquire(gcs: &Gcs, s: &mut Steps) {
    let create = "ifGenerationMatch=0";
    let media = gcs.media_insert("locks/a", create, b"").await;
    s.insert("media_insert", seen(media).await);
    let media = gcs.media_insert("locks/a", create, b"").await;
    s.insert("media_insert_again", seen(media).await);
    let metadata = json!({"name": "locks/b", "cacheControl": "no-store",
        "metadata": {"owner": "me", "expires": "2030-01-01T00:00:00Z"}});
    let multipart = gcs.multipart_insert("locks/b", create, &metadata).await;
    s.insert("multipart_insert", seen(multipart).await);
    let multipart = gcs.multipart_insert("locks/b", create, &metadata).await;
    s.insert("multipart_insert_again", seen(multipart).await);
}

/// Read, refresh (PATCH), release (DELETE) of `locks/b`, with failing
/// preconditions probed on each method.
async fn refresh_and_release(gcs: &Gcs, s: &mut Steps) {
    let created = s["multipart_insert"].body.clone();
    let g = str_field(&created, "generation");
    let m = str_field(&created, "metageneration");
    s.insert("get", seen(gcs.get("locks/b", "").await).await);
    let wrong = gcs.get("locks/b", &format!("ifGenerationMatch={g}1")).await;
    s.insert("get_wrong_generation", seen(wrong).await);
    let patch = json!({"metadata": {"expires": "2031-01-01T00:00:00Z", "owner": null}});
    let patched = gcs
        .patch("locks/b", &format!("ifMetagenerationMatch={m}"), &patch)
        .await;
    s.insert("patch", seen(patched).await);
    s.insert("get_after_patch", seen(gcs.get("locks/b", "").await).await);
    let wrong = gcs
        .patch("locks/b", "ifMetagenerationMatch=99", &json!({}))
        .await;
    s.insert("patch_wrong_metageneration", seen(wrong).await);
    let wrong = gcs.delete("locks/a", "ifGenerationMatch=1").await;
    s.insert("delete_wrong_generation", seen(wrong).await);
    let m_now = str_field(&s["get_after_patch"].body, "metageneration");
    let release = format!("ifGenerationMatch={g}&ifMetagenerationMatch={m_now}");
    s.insert("delete", seen(gcs.delete("locks/b", &release).await).await);
    s.insert("get_deleted", seen(gcs.get("locks/b", "").await).await);
}

fn str_field(resource: &Value, field: &str) -> String {
    resource[field]
        .as_str()
        .unwrap_or_else(|| panic!("{field} not a string in {resource}"))
        .to_owned()
}

/// A field's JSON type, with digit strings told apart (the int64 fields).
fn kind(value: &Value) -> &'static str {
    match value {
        Value::Null => "absent",
        Value::String(s) if !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit()) => {
            "int64-string"
        }
        Value::String(_) => "string",
        Value::Object(map) if map.values().all(Value::is_string) => "string-map",
        Value::Object(_) => "object",
        Value::Array(_) => "array",
        Value::Bool(_) => "bool",
        Value::Number(_) => "number",
    }
}

/// The object-resource fields the backend reads or might, and their types.
const OBJECT_FIELDS: [&str; 12] = [
    "kind",
    "name",
    "bucket",
    "generation",
    "metageneration",
    "size",
    "updated",
    "timeCreated",
    "id",
    "selfLink",
    "contentType",
    "etag",
];

fn object_shape(resource: &Value) -> BTreeMap<&'static str, &'static str> {
    OBJECT_FIELDS
        .iter()
        .map(|f| (*f, kind(&resource[*f])))
        .collect()
}

fn error_shape(body: &Value) -> (&'static str, &'static str, &'static str, &'static str) {
    let error = &body["error"];
    (
        kind(&error["code"]),
        kind(&error["message"]),
        kind(&error["errors"]),
        kind(&error["errors"][0]["reason"]),
    )
}

/// (step, our status, fake-gcs-server's status). A differing pair is a
/// known fake-gcs-server deviation from GCS, named in the comment.
const STATUSES: [(&str, u16, u16); 19] = [
    ("create_bucket", 200, 200),
    ("media_insert", 200, 200),
    ("odd_insert", 200, 200),
    ("list_first_page", 200, 200),
    ("list_next_page", 200, 200),
    ("list_all", 200, 200),
    ("list_odd", 200, 200),
    ("list_none", 200, 200),
    // fake-gcs ignores ifGenerationMatch on media uploads.
    ("media_insert_again", 412, 200),
    ("multipart_insert", 200, 200),
    ("multipart_insert_again", 412, 412),
    ("get", 200, 200),
    // fake-gcs ignores preconditions on GET.
    ("get_wrong_generation", 412, 200),
    ("patch", 200, 200),
    ("get_after_patch", 200, 200),
    // fake-gcs ignores preconditions on PATCH.
    ("patch_wrong_metageneration", 412, 200),
    // fake-gcs ignores preconditions on DELETE (and deletes), answers 200.
    ("delete_wrong_generation", 412, 200),
    // GCS answers 204; fake-gcs 200 with a `null` body.
    ("delete", 204, 200),
    ("get_deleted", 404, 404),
];

async fn both() -> Option<(Steps, Steps)> {
    let fake_url = test_kit::env::require("ANYLOCK_TEST_FAKE_GCS_URL", "GCS")?;
    let server = GcsTestServer::start().await;
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_nanos();
    // The tests of this binary run at once and share fake-gcs-server: the counter keeps
    // their buckets apart even if two read the same clock value.
    static BUCKETS: AtomicUsize = AtomicUsize::new(0);
    let n = BUCKETS.fetch_add(1, Ordering::Relaxed);
    let bucket = format!("xcheck-{}-{n}-{nanos}", std::process::id());
    let ours = scenario(&Gcs::new(&server.url(), &bucket)).await;
    let fake = scenario(&Gcs::new(&fake_url, &bucket)).await;
    Some((ours, fake))
}

#[tokio::test]
async fn statuses_agree_except_known_fake_gcs_deviations() {
    let Some((ours, fake)) = both().await else {
        return;
    };
    for (step, want_ours, want_fake) in STATUSES {
        assert_eq!(
            ours[step].status, want_ours,
            "ours, {step}: {}",
            ours[step].body
        );
        assert_eq!(
            fake[step].status, want_fake,
            "fake-gcs-server changed at {step}: {}; update the expected differences",
            fake[step].body
        );
        assert!(
            ours[step].dated && fake[step].dated,
            "{step}: a response without Date"
        );
    }
}

#[tokio::test]
async fn object_resources_have_the_same_shape() {
    let Some((ours, fake)) = both().await else {
        return;
    };
    for step in ["media_insert", "multipart_insert", "get", "get_after_patch"] {
        assert_eq!(
            object_shape(&ours[step].body),
            object_shape(&fake[step].body),
            "{step}"
        );
        assert_eq!(
            kind(&ours[step].body["generation"]),
            "int64-string",
            "{step}"
        );
    }
    for step in ["multipart_insert", "get"] {
        assert_eq!(
            ours[step].body["metadata"], fake[step].body["metadata"],
            "{step}"
        );
        assert_eq!(
            ours[step].body["cacheControl"], fake[step].body["cacheControl"],
            "{step}"
        );
    }
}

#[tokio::test]
async fn error_bodies_have_the_same_shape() {
    let Some((ours, fake)) = both().await else {
        return;
    };
    for step in ["multipart_insert_again", "get_deleted"] {
        assert_eq!(
            error_shape(&ours[step].body),
            error_shape(&fake[step].body),
            "{step}"
        );
        assert_eq!(
            ours[step].body["error"]["code"], fake[step].body["error"]["code"],
            "{step}"
        );
    }
}

/// fake-gcs-server's PATCH deviations, asserted so a fix there shows up:
/// it never bumps metageneration nor `updated`, turns a null metadata
/// value into "" instead of removing the key, and answers PATCH with a
/// differently shaped body (no `kind`/`metageneration`, `created`).
#[tokio::test]
async fn patch_known_fake_gcs_deviations() {
    let Some((ours, fake)) = both().await else {
        return;
    };
    let (ours_before, ours_after) = (&ours["get"].body, &ours["get_after_patch"].body);
    assert_eq!(ours_after["metageneration"], "2");
    assert_ne!(ours_after["updated"], ours_before["updated"]);
    assert_eq!(
        ours_after["metadata"],
        json!({"expires": "2031-01-01T00:00:00Z"})
    );
    assert_eq!(
        ours["patch"].body, *ours_after,
        "GCS answers PATCH with the resource"
    );

    let (fake_before, fake_after) = (&fake["get"].body, &fake["get_after_patch"].body);
    let changed = "fake-gcs-server changed its PATCH behaviour; update the expected differences";
    assert_eq!(fake_after["metageneration"], "1", "{changed}");
    assert_eq!(fake_after["updated"], fake_before["updated"], "{changed}");
    assert_eq!(fake_after["metadata"]["owner"], "", "{changed}");
    assert_eq!(fake_after["metadata"]["expires"], "2031-01-01T00:00:00Z");
    assert!(
        fake["patch"].body.get("metageneration").is_none(),
        "{changed}"
    );
    assert!(fake["patch"].body.get("created").is_some(), "{changed}");
}

/// Smaller wire differences the backend must tolerate either way:
/// fake-gcs writes Go `RFC3339Nano` timestamps (microseconds with trailing
/// zeros trimmed, so 1 to 6 fraction digits; GCS: always 3), omits the
/// generation from `id`, and its DELETE body is `null`.
#[tokio::test]
async fn format_known_fake_gcs_deviations() {
    let Some((ours, fake)) = both().await else {
        return;
    };
    let fraction = |v: &Value| {
        v.as_str()
            .and_then(|s| s.split_once('.'))
            .map_or(0, |(_, f)| f.len() - 1)
    };
    let stamps = |s: &Steps| -> Vec<usize> {
        let resources = ["media_insert", "multipart_insert", "get", "get_after_patch"];
        let fields = ["updated", "timeCreated", "timeStorageClassUpdated"];
        let each = resources
            .iter()
            .flat_map(|r| fields.iter().map(move |f| (*r, *f)));
        each.map(|(r, f)| fraction(&s[r].body[f])).collect()
    };
    assert!(
        stamps(&ours).iter().all(|&digits| digits == 3),
        "{:?}",
        stamps(&ours)
    );
    let fake_digits = stamps(&fake);
    assert!(
        fake_digits.iter().all(|&d| d <= 6) && fake_digits.iter().any(|&d| d > 3),
        "fake-gcs-server timestamp precision changed: {fake_digits:?}"
    );
    let g = str_field(&ours["get"].body, "generation");
    assert!(str_field(&ours["get"].body, "id").ends_with(&format!("/{g}")));
    let fake_g = str_field(&fake["get"].body, "generation");
    assert!(
        !str_field(&fake["get"].body, "id").ends_with(&fake_g),
        "fake-gcs-server now puts the generation in id"
    );
    assert_eq!(ours["delete"].body, Value::Null, "204 has no body");
}

fn listed(page: &Value) -> Vec<&str> {
    page["items"]
        .as_array()
        .map(|items| items.iter().filter_map(|o| o["name"].as_str()).collect())
        .unwrap_or_default()
}

/// `objects.list` agrees: the same names in the same pages, `nextPageToken` only while
/// more follow, `items` left out when empty, prefixes decoded and matched literally, and
/// each item an object resource of the same shape with the custom metadata, so a listing
/// needs no GET per object. Page tokens are opaque and differ.
#[tokio::test]
async fn listings_agree() {
    let Some((ours, fake)) = both().await else {
        return;
    };
    for (label, s) in [("ours", &ours), ("fake-gcs-server", &fake)] {
        let body = |step: &str| &s[step].body;
        assert_eq!(listed(body("list_first_page")), ["locks/a"], "{label}");
        assert!(
            body("list_first_page")["nextPageToken"].is_string(),
            "{label}"
        );
        assert_eq!(listed(body("list_next_page")), ["locks/b"], "{label}");
        assert!(
            body("list_next_page").get("nextPageToken").is_none(),
            "{label}: a token on the last page: {}",
            body("list_next_page")
        );
        assert_eq!(listed(body("list_all")), ["locks/a", "locks/b"], "{label}");
        assert_eq!(listed(body("list_odd")), ["odd/a%*?[ +&#ü"], "{label}");
        assert!(body("list_none").get("items").is_none(), "{label}");
        assert_eq!(body("list_all")["kind"], "storage#objects", "{label}");
    }
    let item = |s: &Steps| s["list_all"].body["items"][1].clone();
    assert_eq!(object_shape(&item(&ours)), object_shape(&item(&fake)));
    assert_eq!(item(&ours)["metadata"], item(&fake)["metadata"]);
    assert_eq!(
        item(&ours)["metadata"],
        ours["multipart_insert"].body["metadata"]
    );
}
