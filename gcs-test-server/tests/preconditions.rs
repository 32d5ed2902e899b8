//! Each precondition parameter on each method, passing and failing, and
//! GCS's 404-before-412 rule, against the documented JSON-API semantics.

mod common;

use common::{Gcs, PRECONDITIONS, int_field, status_json};
use gcs_test_server::GcsTestServer;
use serde_json::json;

#[derive(Debug, Clone, Copy)]
enum Method {
    MediaInsert,
    MultipartInsert,
    Get,
    Patch,
    Delete,
}

async fn setup() -> (GcsTestServer, Gcs) {
    let server = GcsTestServer::start().await;
    server.create_bucket("bkt");
    let gcs = Gcs::new(&server.url(), "bkt");
    (server, gcs)
}

async fn call(gcs: &Gcs, method: Method, name: &str, query: &str) -> u16 {
    let response = match method {
        Method::MediaInsert => gcs.media_insert(name, query, b"x").await,
        Method::MultipartInsert => {
            gcs.multipart_insert(name, query, &json!({"name": name}))
                .await
        }
        Method::Get => gcs.get(name, query).await,
        Method::Patch => {
            gcs.patch(name, query, &json!({"metadata": {"k": "v"}}))
                .await
        }
        Method::Delete => gcs.delete(name, query).await,
    };
    response.status().as_u16()
}

fn success_status(method: Method) -> u16 {
    if matches!(method, Method::Delete) {
        204
    } else {
        200
    }
}

/// A live object at generation g, metageneration 2 (so generation and
/// metageneration values never coincide by accident).
async fn live_object(gcs: &Gcs, name: &str) -> (i64, i64) {
    assert_eq!(gcs.media_insert(name, "", b"v").await.status(), 200);
    assert_eq!(gcs.patch(name, "", &json!({})).await.status(), 200);
    let resource = gcs.resource(name).await;
    (
        int_field(&resource, "generation"),
        int_field(&resource, "metageneration"),
    )
}

/// (parameter, holding value, failing value) for a live object.
fn cases(generation: i64, metageneration: i64) -> [(&'static str, i64, i64); 4] {
    [
        (PRECONDITIONS[0], generation, generation + 1),
        (PRECONDITIONS[1], generation + 1, generation),
        (PRECONDITIONS[2], metageneration, metageneration + 1),
        (PRECONDITIONS[3], metageneration + 1, metageneration),
    ]
}

async fn check_live_object_preconditions(method: Method) {
    let (_server, gcs) = setup().await;
    let mut failures = Vec::new();
    for (i, param) in PRECONDITIONS.iter().enumerate() {
        let name = format!("held-{i}");
        let (g, m) = live_object(&gcs, &name).await;
        let (_, pass, fail) = cases(g, m)[i];
        let status = call(&gcs, method, &name, &format!("{param}={fail}")).await;
        if status != 412 {
            failures.push(format!(
                "{method:?} {param}={fail} (failing) answered {status}, want 412"
            ));
        }
        let after = gcs.resource(&name).await;
        if (
            int_field(&after, "generation"),
            int_field(&after, "metageneration"),
        ) != (g, m)
        {
            failures.push(format!(
                "{method:?} {param}={fail} changed the object: {after}"
            ));
        }
        let status = call(&gcs, method, &name, &format!("{param}={pass}")).await;
        if status != success_status(method) {
            failures.push(format!(
                "{method:?} {param}={pass} (holding) answered {status}"
            ));
        }
    }
    assert!(failures.is_empty(), "{failures:#?}");
}

#[tokio::test]
async fn media_insert_preconditions_on_a_live_object() {
    check_live_object_preconditions(Method::MediaInsert).await;
}

#[tokio::test]
async fn multipart_insert_preconditions_on_a_live_object() {
    check_live_object_preconditions(Method::MultipartInsert).await;
}

#[tokio::test]
async fn get_preconditions_on_a_live_object() {
    check_live_object_preconditions(Method::Get).await;
}

#[tokio::test]
async fn patch_preconditions_on_a_live_object() {
    check_live_object_preconditions(Method::Patch).await;
}

#[tokio::test]
async fn delete_preconditions_on_a_live_object() {
    check_live_object_preconditions(Method::Delete).await;
}

/// The lock's acquire: create-if-absent holds on a missing name and fails
/// (412) on a live one, for both upload types.
#[tokio::test]
async fn generation_match_zero_is_create_if_absent() {
    let (_server, gcs) = setup().await;
    for method in [Method::MediaInsert, Method::MultipartInsert] {
        let name = format!("{method:?}");
        assert_eq!(call(&gcs, method, &name, "ifGenerationMatch=0").await, 200);
        assert_eq!(call(&gcs, method, &name, "ifGenerationMatch=0").await, 412);
    }
}

/// On a missing name, every precondition but ifGenerationMatch=0 fails
/// with 412 on insert (GCS: "If no live object exists, the precondition
/// fails"), and nothing is created.
#[tokio::test]
async fn insert_of_a_missing_name_fails_other_preconditions() {
    let (_server, gcs) = setup().await;
    let queries = [
        "ifGenerationMatch=5",
        "ifGenerationNotMatch=0",
        "ifGenerationNotMatch=5",
        "ifMetagenerationMatch=1",
        "ifMetagenerationNotMatch=1",
    ];
    for method in [Method::MediaInsert, Method::MultipartInsert] {
        for query in queries {
            let status = call(&gcs, method, "absent", query).await;
            assert_eq!(status, 412, "{method:?} {query}");
            assert_eq!(
                gcs.get("absent", "").await.status(),
                404,
                "{method:?} {query} created it"
            );
        }
    }
}

/// Get, patch and delete of a missing object answer 404, with or without a
/// precondition (a lock refresh must see "gone", not "someone else's").
#[tokio::test]
async fn missing_object_is_404_before_any_precondition() {
    let (_server, gcs) = setup().await;
    for method in [Method::Get, Method::Patch, Method::Delete] {
        for query in [
            "",
            "ifGenerationMatch=0",
            "ifGenerationMatch=1",
            "ifMetagenerationMatch=1",
            "ifMetagenerationNotMatch=1",
        ] {
            assert_eq!(
                call(&gcs, method, "absent", query).await,
                404,
                "{method:?} {query}"
            );
        }
    }
}

/// A deleted object is missing too: 404 after delete, not 412.
#[tokio::test]
async fn deleted_object_is_404() {
    let (_server, gcs) = setup().await;
    let (g, _) = live_object(&gcs, "gone").await;
    assert_eq!(
        gcs.delete("gone", &format!("ifGenerationMatch={g}"))
            .await
            .status(),
        204
    );
    assert_eq!(
        call(
            &gcs,
            Method::Delete,
            "gone",
            &format!("ifGenerationMatch={g}")
        )
        .await,
        404
    );
    assert_eq!(
        call(&gcs, Method::Patch, "gone", "ifMetagenerationMatch=2").await,
        404
    );
}

/// A 412 carries GCS's JSON error body.
#[tokio::test]
async fn precondition_failure_has_the_gcs_error_body() {
    let (_server, gcs) = setup().await;
    live_object(&gcs, "obj").await;
    let (status, body) =
        status_json(gcs.media_insert("obj", "ifGenerationMatch=0", b"x").await).await;
    assert_eq!(status, 412);
    assert_eq!(body["error"]["code"], 412);
    assert_eq!(body["error"]["errors"][0]["reason"], "conditionNotMet");
    assert!(body["error"]["message"].is_string());
}

/// Two preconditions must both hold.
#[tokio::test]
async fn combined_preconditions_must_all_hold() {
    let (_server, gcs) = setup().await;
    let (g, m) = live_object(&gcs, "obj").await;
    let both = format!("ifGenerationMatch={g}&ifMetagenerationMatch={}", m + 1);
    assert_eq!(gcs.delete("obj", &both).await.status(), 412);
    let both = format!("ifGenerationMatch={g}&ifMetagenerationMatch={m}");
    assert_eq!(gcs.delete("obj", &both).await.status(), 204);
}

/// A precondition that is not an integer is a 400, not silently ignored.
#[tokio::test]
async fn malformed_precondition_is_400() {
    let (_server, gcs) = setup().await;
    live_object(&gcs, "obj").await;
    assert_eq!(
        gcs.delete("obj", "ifGenerationMatch=abc").await.status(),
        400
    );
    assert_eq!(gcs.get("obj", "").await.status(), 200);
}
