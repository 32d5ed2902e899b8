//! The batch endpoint cross-checked against fake-gcs-server (an implementation we did not
//! write, which has handled `POST /batch/storage/v1` since its PR #677): the same batch goes
//! to both servers and the reply's framing (`multipart/mixed`, one `application/http` part
//! per call, in order, `Content-ID: <response-…>`), the statuses and the bodies must agree
//! wherever fake-gcs-server follows GCS. Its one known deviation here (it ignores
//! preconditions on PATCH, as outside a batch: `cross_check.rs`) is asserted explicitly.
//!
//! Needs `ANYLOCK_TEST_FAKE_GCS_URL` (`scripts/servers start`); skipped without it outside
//! CI, a failure in CI.

mod common;

use std::time::{SystemTime, UNIX_EPOCH};

use common::{BatchAnswer, BatchCall, Gcs, status_json};
use gcs_test_server::GcsTestServer;
use serde_json::{Value, json};

/// The same batch on one server: two objects, then a PATCH under exact preconditions, the
/// same PATCH again (its metageneration is stale now), a PATCH of a missing object and an
/// unconditional PATCH.
async fn scenario(gcs: &Gcs) -> (Vec<BatchAnswer>, bool) {
    assert_eq!(gcs.create_bucket().await.status(), 200, "bucket");
    let mut generation = String::new();
    for name in ["locks/a", "locks/b"] {
        let (status, resource) =
            status_json(gcs.media_insert(name, "ifGenerationMatch=0", b"").await).await;
        assert_eq!(status, 200, "{resource}");
        if name == "locks/a" {
            generation = resource["generation"]
                .as_str()
                .unwrap_or_default()
                .to_owned();
        }
    }
    let exact = format!("ifGenerationMatch={generation}&ifMetagenerationMatch=1");
    let patch = |name: &'static str, query: &'static str| BatchCall {
        method: "PATCH",
        name,
        query,
        body: Some(json!({ "metadata": { "identity": name } })),
    };
    let mut calls = [
        patch("locks/a", ""),
        patch("locks/a", ""),
        patch("locks/none", ""),
        patch("locks/b", ""),
    ];
    calls[0].query = &exact;
    calls[1].query = &exact;
    let body = gcs.batch_body("xb0undary", &calls);
    let response = gcs
        .batch_raw("multipart/mixed; boundary=xb0undary", body)
        .await;
    assert_eq!(response.status(), 200);
    let dated = response.headers().contains_key("date");
    (common::batch_answers(response).await, dated)
}

async fn both() -> Option<((Vec<BatchAnswer>, bool), (Vec<BatchAnswer>, bool))> {
    let fake_url = test_kit::env::require("ANYLOCK_TEST_FAKE_GCS_URL", "GCS")?;
    let server = GcsTestServer::start().await;
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default()
        .as_nanos();
    let bucket = format!("xbatch-{}-{nanos}", std::process::id());
    let ours = scenario(&Gcs::new(&server.url(), &bucket)).await;
    let fake = scenario(&Gcs::new(&fake_url, &bucket)).await;
    Some((ours, fake))
}

fn error_shape(body: &Value) -> (Value, bool, bool) {
    let error = &body["error"];
    (
        error["code"].clone(),
        error["message"].is_string(),
        error["errors"].is_array(),
    )
}

#[tokio::test]
async fn batch_replies_agree_except_known_fake_gcs_deviations() {
    let Some(((ours, ours_dated), (fake, fake_dated))) = both().await else {
        return;
    };
    assert!(ours_dated && fake_dated, "a batch reply without Date");
    let statuses = |answers: &[BatchAnswer]| answers.iter().map(|a| a.status).collect::<Vec<_>>();
    assert_eq!(statuses(&ours), vec![200, 412, 404, 200], "ours");
    assert_eq!(
        statuses(&fake),
        // fake-gcs ignores preconditions on PATCH: the stale second call succeeds.
        vec![200, 200, 404, 200],
        "fake-gcs-server changed its batch answers; update the expected differences"
    );
    let ids = |answers: &[BatchAnswer]| {
        answers
            .iter()
            .map(|a| a.content_id.clone().unwrap_or_default())
            .collect::<Vec<_>>()
    };
    let expected: Vec<String> = (0..4).map(|i| format!("<response-t+{i}>")).collect();
    assert_eq!(ids(&ours), expected, "ours");
    assert_eq!(ids(&fake), expected, "fake-gcs-server");
    assert_eq!(
        error_shape(&ours[2].body),
        error_shape(&fake[2].body),
        "404 body"
    );
    for (i, name) in [(0, "locks/a"), (3, "locks/b")] {
        for (who, answers) in [("ours", &ours), ("fake", &fake)] {
            let resource = &answers[i].body;
            assert_eq!(resource["name"], name, "{who} call {i}");
            assert_eq!(resource["metadata"]["identity"], name, "{who} call {i}");
            assert!(
                resource["generation"].is_string(),
                "{who} call {i}: {resource}"
            );
        }
    }
}
