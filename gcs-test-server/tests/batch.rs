//! The batch endpoint (`POST /batch/storage/v1`) as Google documents it: every call is
//! answered in order with its `Content-ID` echoed as `response-…`, each with the same
//! precondition semantics, faults, auth and log entry as a request of its own.

mod common;

use common::{BatchCall, Gcs, int_field, status_json};
use gcs_test_server::{Fault, GcsTestServer, MAX_BATCH_CALLS};
use serde_json::{Value, json};

async fn setup() -> (GcsTestServer, Gcs) {
    let server = GcsTestServer::start().await;
    server.create_bucket("bkt");
    let gcs = Gcs::new(&server.url(), "bkt");
    (server, gcs)
}

fn patch<'a>(name: &'a str, query: &'a str) -> BatchCall<'a> {
    BatchCall {
        method: "PATCH",
        name,
        query,
        body: Some(json!({ "metadata": { "k": name } })),
    }
}

async fn create(gcs: &Gcs, name: &str) -> Value {
    let (status, resource) =
        status_json(gcs.media_insert(name, "ifGenerationMatch=0", b"").await).await;
    assert_eq!(status, 200, "{resource}");
    resource
}

#[tokio::test]
async fn each_call_is_answered_in_order_with_its_own_preconditions() {
    let (server, gcs) = setup().await;
    let a = create(&gcs, "locks/a").await;
    create(&gcs, "locks/b").await;
    let generation = int_field(&a, "generation");
    let exact = format!("ifGenerationMatch={generation}&ifMetagenerationMatch=1");
    server.clear_requests();
    let answers = gcs
        .batch(&[
            patch("locks/a", &exact),
            patch("locks/a", &exact), // the first call moved the metageneration
            patch("locks/b", "ifMetagenerationMatch=1"),
            patch("locks/none", ""),
        ])
        .await;
    let statuses: Vec<u16> = answers.iter().map(|a| a.status).collect();
    assert_eq!(statuses, vec![200, 412, 200, 404]);
    let ids: Vec<_> = answers
        .iter()
        .map(|a| a.content_id.clone().unwrap_or_default())
        .collect();
    assert_eq!(
        ids,
        [
            "<response-t+0>",
            "<response-t+1>",
            "<response-t+2>",
            "<response-t+3>"
        ]
    );
    assert_eq!(int_field(&answers[0].body, "metageneration"), 2);
    assert_eq!(answers[0].body["metadata"]["k"], "locks/a");
    assert_eq!(answers[1].body["error"]["code"], 412);
    let logged: Vec<(String, u16)> = server
        .requests()
        .iter()
        .map(|r| (r.method.clone(), r.status))
        .collect();
    let expected = [
        ("PATCH", 200),
        ("PATCH", 412),
        ("PATCH", 200),
        ("PATCH", 404),
        ("POST", 200),
    ];
    let expected: Vec<(String, u16)> = expected
        .iter()
        .map(|(m, s)| ((*m).to_owned(), *s))
        .collect();
    assert_eq!(logged, expected, "each call logged, then the batch");
    assert_eq!(
        int_field(&gcs.resource("locks/a").await, "metageneration"),
        2
    );
}

#[tokio::test]
async fn an_injected_server_error_fails_one_call_not_the_batch() {
    let (server, gcs) = setup().await;
    create(&gcs, "locks/a").await;
    create(&gcs, "locks/b").await;
    server.inject(Fault::ServerErrors { count: 1 });
    let answers = gcs
        .batch(&[patch("locks/a", ""), patch("locks/b", "")])
        .await;
    assert_eq!(answers[0].status, 503);
    assert_eq!(answers[1].status, 200);
    assert_eq!(
        int_field(&gcs.resource("locks/a").await, "metageneration"),
        1,
        "untouched"
    );
}

#[tokio::test]
async fn a_lost_batch_reply_loses_every_answer_after_every_call_applied() {
    let (server, gcs) = setup().await;
    create(&gcs, "locks/a").await;
    create(&gcs, "locks/b").await;
    server.inject(Fault::LoseReplies { count: 1 });
    let body = gcs.batch_body("q", &[patch("locks/a", ""), patch("locks/b", "")]);
    let sent = gcs
        .http
        .post(format!("{}/batch/storage/v1", gcs.base))
        .header("Content-Type", "multipart/mixed; boundary=q")
        .body(body)
        .send()
        .await;
    assert!(sent.is_err(), "the reply was lost: {sent:?}");
    for name in ["locks/a", "locks/b"] {
        assert_eq!(
            int_field(&gcs.resource(name).await, "metageneration"),
            2,
            "{name}"
        );
    }
}

#[tokio::test]
async fn the_outer_authorization_applies_to_every_call() {
    let (server, gcs) = setup().await;
    create(&gcs, "locks/a").await;
    server.require_auth();
    server.allow_token("good");
    let body = gcs.batch_body("q", &[patch("locks/a", ""), patch("locks/a", "")]);
    let send = |token: Option<&'static str>| {
        let mut request = gcs
            .http
            .post(format!("{}/batch/storage/v1", gcs.base))
            .header("Content-Type", "multipart/mixed; boundary=q")
            .body(body.clone());
        if let Some(token) = token {
            request = request.bearer_auth(token);
        }
        request.send()
    };
    let denied = common::batch_answers(send(None).await.expect("sent")).await;
    assert_eq!(
        denied.iter().map(|a| a.status).collect::<Vec<_>>(),
        vec![401, 401]
    );
    let allowed = common::batch_answers(send(Some("good")).await.expect("sent")).await;
    assert_eq!(
        allowed.iter().map(|a| a.status).collect::<Vec<_>>(),
        vec![200, 200]
    );
}

#[tokio::test]
async fn malformed_batches_are_refused_whole() {
    let (_server, gcs) = setup().await;
    create(&gcs, "locks/a").await;
    let too_many: Vec<BatchCall<'_>> = (0..=MAX_BATCH_CALLS)
        .map(|_| patch("locks/a", ""))
        .collect();
    let cases = [
        (
            "multipart/mixed; boundary=q",
            gcs.batch_body("q", &too_many),
            "101 calls",
        ),
        (
            "multipart/mixed; boundary=q",
            "--q--\r\n".to_owned(),
            "no calls",
        ),
        (
            "multipart/related; boundary=q",
            gcs.batch_body("q", &[patch("locks/a", "")]),
            "not mixed",
        ),
        (
            "multipart/mixed; boundary=q",
            "--q\r\nContent-Type: text/plain\r\n\r\nPATCH /x HTTP/1.1\r\n\r\n\r\n--q--\r\n"
                .to_owned(),
            "a part that is not application/http",
        ),
    ];
    for (content_type, body, what) in cases {
        let (status, error) = status_json(gcs.batch_raw(content_type, body).await).await;
        assert_eq!(status, 400, "{what}: {error}");
        assert_eq!(error["error"]["code"], 400, "{what}");
    }
    assert_eq!(
        int_field(&gcs.resource("locks/a").await, "metageneration"),
        1,
        "nothing applied"
    );
}

#[tokio::test]
async fn a_malformed_call_fails_alone() {
    let (_server, gcs) = setup().await;
    create(&gcs, "locks/a").await;
    let good = gcs.batch_body("q", &[patch("locks/a", "")]);
    let good = good.trim_end_matches("--q--\r\n");
    let body = format!(
        "{good}--q\r\nContent-Type: application/http\r\n\r\nPATCH http://elsewhere/x HTTP/1.1\r\n\r\n\r\n\
         --q\r\nContent-Type: application/http\r\n\r\nPOST /batch/storage/v1 HTTP/1.1\r\n\r\n\r\n--q--\r\n"
    );
    let response = gcs.batch_raw("multipart/mixed; boundary=q", body).await;
    assert_eq!(response.status(), 200);
    let answers = common::batch_answers(response).await;
    let statuses: Vec<u16> = answers.iter().map(|a| a.status).collect();
    assert_eq!(
        statuses,
        vec![200, 400, 400],
        "a full URL and a nested batch fail alone"
    );
    assert!(
        answers[1].content_id.is_none(),
        "no Content-ID sent, none echoed"
    );
}

#[tokio::test]
async fn batch_faults_refuse_the_whole_request_or_cut_its_reply() {
    let (server, gcs) = setup().await;
    create(&gcs, "locks/a").await;
    server.inject(Fault::BatchErrors {
        count: 1,
        status: 503,
    });
    server.clear_requests();
    let body = gcs.batch_body("q", &[patch("locks/a", "")]);
    let (status, error) = status_json(
        gcs.batch_raw("multipart/mixed; boundary=q", body.clone())
            .await,
    )
    .await;
    assert_eq!(status, 503, "{error}");
    let logged: Vec<String> = server.requests().into_iter().map(|r| r.method).collect();
    assert_eq!(logged, ["POST"], "no call ran");
    assert_eq!(
        int_field(&gcs.resource("locks/a").await, "metageneration"),
        1
    );

    server.inject(Fault::CutBatchReplies { count: 1 });
    let cut = gcs
        .batch_raw("multipart/mixed; boundary=q", body.clone())
        .await;
    assert_eq!(cut.status(), 200);
    let text = cut.text().await.expect("a whole HTTP reply");
    assert!(!text.contains("--\r\n"), "no close delimiter: {text}");
    assert_eq!(
        int_field(&gcs.resource("locks/a").await, "metageneration"),
        2,
        "applied"
    );
    let whole = gcs.batch_raw("multipart/mixed; boundary=q", body).await;
    assert!(
        whole
            .text()
            .await
            .expect("reply")
            .trim_end()
            .ends_with("--"),
        "one reply cut"
    );
}
