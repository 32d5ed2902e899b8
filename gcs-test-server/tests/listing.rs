//! `objects.list` as Google documents it
//! (<https://cloud.google.com/storage/docs/json_api/v1/objects/list>): objects "ordered
//! in the list lexicographically by name", `prefix` filtering by plain byte prefix,
//! `maxResults` capped at "1,000 items, whichever is smaller", `nextPageToken` only while
//! more results follow, and `projection` defaulting to `noAcl`, which keeps the custom
//! `metadata` in every item.

mod common;

use common::{Gcs, encode, status_json};
use gcs_test_server::GcsTestServer;
use serde_json::{Value, json};

async fn setup() -> (GcsTestServer, Gcs) {
    let server = GcsTestServer::start().await;
    server.create_bucket("bkt");
    let gcs = Gcs::new(&server.url(), "bkt");
    (server, gcs)
}

fn item_names(page: &Value) -> Vec<&str> {
    page["items"]
        .as_array()
        .map(|items| items.iter().filter_map(|o| o["name"].as_str()).collect())
        .unwrap_or_default()
}

/// Pages of `maxResults` in name order, a `nextPageToken` on every page but the last,
/// and the pages together are the whole listing, each name once.
#[tokio::test]
async fn pages_follow_the_token_in_name_order() {
    let (_server, gcs) = setup().await;
    let mut all: Vec<String> = (0..23).map(|i| format!("p/{i:02}")).collect();
    for name in all.iter().rev() {
        gcs.media_insert(name, "", b"").await;
    }
    gcs.media_insert("q", "", b"").await;
    let (names, pages) = gcs.list_all("p/", 5).await;
    all.sort();
    assert_eq!(names, all);
    assert_eq!(pages, 5, "23 objects in pages of 5");

    let (_, first) = status_json(gcs.list_query("prefix=p%2F&maxResults=5").await).await;
    assert_eq!(item_names(&first), ["p/00", "p/01", "p/02", "p/03", "p/04"]);
    assert!(first["nextPageToken"].is_string(), "{first}");
    let (_, whole) = status_json(gcs.list_query("prefix=p%2F&maxResults=23").await).await;
    assert_eq!(item_names(&whole).len(), 23);
    assert!(
        whole.get("nextPageToken").is_none(),
        "no token when nothing follows: {whole}"
    );
}

/// A page holds at most 1000 items whatever `maxResults` asks, and 1000 without it.
#[tokio::test]
async fn pages_hold_at_most_a_thousand() {
    let (_server, gcs) = setup().await;
    for i in 0..1003 {
        gcs.media_insert(&format!("n{i:04}"), "", b"").await;
    }
    for query in ["", "maxResults=5000", "maxResults=0"] {
        let (status, page) = status_json(gcs.list_query(query).await).await;
        assert_eq!(status, 200, "{query}: {page}");
        assert_eq!(item_names(&page).len(), 1000, "{query}");
        assert!(page["nextPageToken"].is_string(), "{query}");
    }
    let (names, pages) = gcs.list_all("", 1000).await;
    assert_eq!((names.len(), pages), (1003, 2));
}

/// An object deleted or created between pages does not disturb the rest: the token
/// stands for the last name returned, not a position.
#[tokio::test]
async fn a_page_token_survives_changes_between_pages() {
    let (_server, gcs) = setup().await;
    for name in ["a", "b", "c", "d", "e"] {
        gcs.media_insert(name, "", b"").await;
    }
    let (_, first) = status_json(gcs.list_query("maxResults=2").await).await;
    assert_eq!(item_names(&first), ["a", "b"]);
    gcs.delete("b", "").await;
    gcs.delete("c", "").await;
    gcs.media_insert("bb", "", b"").await;
    let token = encode(first["nextPageToken"].as_str().unwrap());
    let (_, rest) = status_json(gcs.list_query(&format!("pageToken={token}")).await).await;
    assert_eq!(item_names(&rest), ["bb", "d", "e"]);
}

/// The prefix is one URL-decoded query value matched byte for byte: `%25` is `%`, `%2B`
/// is `+` (a raw `+` is a space, form encoding), `%26` does not split the query, and
/// `*`, `?`, `[` and `_` are plain characters, never patterns.
#[tokio::test]
async fn the_prefix_is_decoded_and_matched_literally() {
    let (_server, gcs) = setup().await;
    let names = [
        "a%/x", "a%41", "aA", "a*?[z]", "a_1", "ab1", "a+b", "a b", "a&b=c", "a#h", "ü/1",
    ];
    for name in names {
        let (status, _) = status_json(gcs.media_insert(name, "", b"").await).await;
        assert_eq!(status, 200, "{name}");
    }
    for (prefix, want) in [
        ("a%", vec!["a%/x", "a%41"]),
        ("a%41", vec!["a%41"]),
        ("a*", vec!["a*?[z]"]),
        ("a*?[", vec!["a*?[z]"]),
        ("a_", vec!["a_1"]),
        ("a+", vec!["a+b"]),
        ("a ", vec!["a b"]),
        ("a&b=", vec!["a&b=c"]),
        ("a#", vec!["a#h"]),
        ("ü/", vec!["ü/1"]),
    ] {
        let (status, page) = status_json(gcs.list(prefix).await).await;
        assert_eq!(status, 200, "{prefix}: {page}");
        assert_eq!(item_names(&page), want, "prefix {prefix:?}");
    }
    let (_, plus) = status_json(gcs.list_query("prefix=a+").await).await;
    assert_eq!(item_names(&plus), ["a b"], "a raw + is a space");
}

/// Items are full object resources with their custom metadata, under either projection.
#[tokio::test]
async fn items_carry_the_metadata() {
    let (_server, gcs) = setup().await;
    let metadata = json!({"name": "locks/m", "metadata": {"identity": "me", "note": "n ✓"}});
    gcs.multipart_insert("locks/m", "ifGenerationMatch=0", &metadata)
        .await;
    let resource = gcs.resource("locks/m").await;
    for query in [
        "prefix=locks%2F",
        "prefix=locks%2F&projection=noAcl",
        "projection=full",
    ] {
        let (status, page) = status_json(gcs.list_query(query).await).await;
        assert_eq!(status, 200, "{query}: {page}");
        assert_eq!(page["kind"], "storage#objects");
        assert_eq!(
            page["items"][0], resource,
            "{query}: an item is the resource"
        );
        assert_eq!(page["items"][0]["metadata"]["note"], "n ✓");
    }
}

/// Malformed values are 400 `invalid`, as on GCS; list parameters this server does not
/// implement are refused (400) rather than ignored, so no client gets a silently wrong
/// listing; a missing bucket is 404.
#[tokio::test]
async fn bad_or_unsupported_list_parameters_are_refused() {
    let (server, gcs) = setup().await;
    gcs.media_insert("x", "", b"").await;
    for query in [
        "maxResults=-1",
        "maxResults=ten",
        "projection=some",
        "pageToken=not-a-token",
        "delimiter=%2F",
        "matchGlob=**",
        "startOffset=a",
        "endOffset=z",
        "versions=true",
    ] {
        let (status, body) = status_json(gcs.list_query(query).await).await;
        assert_eq!(status, 400, "{query}: {body}");
        assert_eq!(body["error"]["errors"][0]["reason"], "invalid", "{query}");
    }
    let (status, _) = status_json(gcs.list_query("versions=false&pageToken=").await).await;
    assert_eq!(status, 200);
    let other = Gcs::new(&server.url(), "no-such-bucket");
    assert_eq!(other.list("").await.status(), 404);
}
