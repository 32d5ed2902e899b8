//! Fault injection, the request log, the shifted clock and the admin path.

mod common;

use std::time::{Duration, Instant, SystemTime};

use common::{Gcs, int_field, status_json};
use gcs_test_server::{ClockOffset, Fault, GcsTestServer, RequestRecord};
use reqwest::Method;
use serde_json::{Value, json};

async fn setup() -> (GcsTestServer, Gcs) {
    let server = GcsTestServer::start().await;
    server.create_bucket("bkt");
    let gcs = Gcs::new(&server.url(), "bkt");
    (server, gcs)
}

/// The next N requests answer 503 without touching state; then service resumes.
#[tokio::test]
async fn server_errors_fail_the_next_requests_only() {
    let (server, gcs) = setup().await;
    server.inject(Fault::ServerErrors { count: 2 });
    let (status, body) = status_json(gcs.media_insert("o", "ifGenerationMatch=0", b"").await).await;
    assert_eq!((status, body["error"]["code"].clone()), (503, json!(503)));
    assert!(gcs.get("o", "").await.status() == 503);
    assert_eq!(
        gcs.get("o", "").await.status(),
        404,
        "the failed insert wrote nothing"
    );
    assert_eq!(
        gcs.media_insert("o", "ifGenerationMatch=0", b"")
            .await
            .status(),
        200
    );
}

/// A lost reply: the write is applied, but the client gets a closed connection instead of
/// an answer; the next request is answered normally.
#[tokio::test]
async fn lost_replies_apply_the_write_but_answer_nothing() {
    let (server, gcs) = setup().await;
    assert_eq!(gcs.media_insert("o", "", b"").await.status(), 200);
    server.inject(Fault::LoseReplies { count: 1 });
    let lost = gcs
        .try_patch("o", "", &json!({"metadata": {"k": "v"}}))
        .await;
    assert!(lost.is_err(), "the reply arrived: {lost:?}");
    let resource = gcs.resource("o").await;
    assert_eq!(
        int_field(&resource, "metageneration"),
        2,
        "the patch applied"
    );
    assert_eq!(resource["metadata"]["k"], "v");
    let patches: Vec<_> = server
        .requests()
        .into_iter()
        .filter(|r| r.method == "PATCH")
        .map(|r| r.status)
        .collect();
    assert_eq!(
        patches,
        [200],
        "logged with the status it would have answered"
    );
}

/// Off by default: a lock cycle can mutate one name back to back.
#[tokio::test]
async fn rate_limit_is_off_by_default() {
    let (_server, gcs) = setup().await;
    for _ in 0..5 {
        assert_eq!(gcs.media_insert("o", "", b"").await.status(), 200);
        assert_eq!(gcs.patch("o", "", &json!({})).await.status(), 200);
        assert_eq!(gcs.delete("o", "").await.status(), 204);
    }
}

/// On: a second mutation of a name within the interval is a 429 that
/// changes nothing; reads and other names are not limited; after the
/// interval a mutation succeeds again.
#[tokio::test]
async fn rate_limit_answers_429_per_object_name() {
    let (server, gcs) = setup().await;
    server.inject(Fault::RateLimit {
        min_interval: Duration::from_millis(600),
    });
    assert_eq!(gcs.media_insert("o", "", b"").await.status(), 200);
    let (status, body) =
        status_json(gcs.patch("o", "", &json!({"metadata": {"k": "v"}})).await).await;
    assert_eq!(status, 429);
    assert_eq!(body["error"]["errors"][0]["reason"], "rateLimitExceeded");
    assert_eq!(gcs.delete("o", "").await.status(), 429);
    assert_eq!(gcs.media_insert("o", "", b"").await.status(), 429);
    let resource = gcs.resource("o").await;
    assert_eq!(
        int_field(&resource, "metageneration"),
        1,
        "the 429 patch changed nothing"
    );
    assert_eq!(gcs.media_insert("other", "", b"").await.status(), 200);
    tokio::time::sleep(Duration::from_millis(650)).await;
    assert_eq!(gcs.patch("o", "", &json!({})).await.status(), 200);
    server.clear_faults();
    assert_eq!(
        gcs.patch("o", "", &json!({})).await.status(),
        200,
        "cleared"
    );
}

/// GCS's own rate: one mutation per second.
#[test]
fn gcs_rate_limit_is_one_per_second() {
    assert_eq!(
        Fault::gcs_rate_limit(),
        Fault::RateLimit {
            min_interval: Duration::from_secs(1)
        }
    );
}

/// A delay holds every API request at least that long.
#[tokio::test]
async fn delay_holds_requests() {
    let (server, gcs) = setup().await;
    server.inject(Fault::Delay(Duration::from_millis(300)));
    let started = Instant::now();
    assert_eq!(gcs.get("missing", "").await.status(), 404);
    assert!(
        started.elapsed() >= Duration::from_millis(300),
        "{:?}",
        started.elapsed()
    );
    server.clear_faults();
    let started = Instant::now();
    gcs.get("missing", "").await;
    assert!(started.elapsed() < Duration::from_millis(300));
}

/// The log records method, raw path, query and status, in order, so a test
/// can count the API calls of one lock cycle.
#[tokio::test]
async fn request_log_counts_api_calls() {
    let (server, gcs) = setup().await;
    gcs.media_insert("locks/a", "ifGenerationMatch=0", b"")
        .await;
    gcs.delete("locks/a", "ifGenerationMatch=1").await;
    let log = server.requests();
    assert_eq!(log.len(), 2);
    assert_eq!(
        log[0],
        RequestRecord {
            method: "POST".into(),
            path: "/upload/storage/v1/b/bkt/o".into(),
            query: Some("uploadType=media&name=locks%2Fa&ifGenerationMatch=0".into()),
            status: 200,
        }
    );
    assert_eq!(
        (log[1].method.as_str(), log[1].path.as_str(), log[1].status),
        ("DELETE", "/storage/v1/b/bkt/o/locks%2Fa", 412)
    );
    server.clear_requests();
    assert!(server.requests().is_empty());
}

fn parse_date(response: &reqwest::Response) -> SystemTime {
    let date = response.headers()["date"].to_str().unwrap();
    httpdate::parse_http_date(date).unwrap()
}

fn rfc3339_to_system(s: &str) -> SystemTime {
    humantime::parse_rfc3339(s).unwrap()
}

fn off_by(a: SystemTime, b: SystemTime) -> i64 {
    match a.duration_since(b) {
        Ok(d) => d.as_secs() as i64,
        Err(e) => -(e.duration().as_secs() as i64),
    }
}

/// A shifted server clock shows in `updated`, `timeCreated` and `Date`,
/// so a backend judging staleness by the server clock can be tested.
#[tokio::test]
async fn clock_offset_shows_in_updated_and_date() {
    let (server, gcs) = setup().await;
    for (offset, want) in [
        (ClockOffset::Ahead(Duration::from_secs(3600)), 3600),
        (ClockOffset::Behind(Duration::from_secs(600)), -600),
    ] {
        server.set_clock_offset(offset);
        let response = gcs.media_insert("c", "", b"").await;
        let date = parse_date(&response);
        let resource: Value = response.json().await.unwrap();
        let now = SystemTime::now();
        for (what, t) in [
            ("Date", date),
            (
                "updated",
                rfc3339_to_system(resource["updated"].as_str().unwrap()),
            ),
            (
                "timeCreated",
                rfc3339_to_system(resource["timeCreated"].as_str().unwrap()),
            ),
        ] {
            let skew = off_by(t, now);
            assert!(
                (skew - want).abs() <= 2,
                "{what} is {skew}s off, want {want}s"
            );
        }
    }
}

/// The admin path injects 503s and shifts the clock for a server in
/// another process; the log it serves leaves admin calls out.
#[tokio::test]
async fn admin_path_sets_faults_and_clock() {
    let (_server, gcs) = setup().await;
    let faults = json!({"serverErrors": 1, "clockOffsetMs": 7_200_000});
    assert_eq!(
        gcs.admin(Method::POST, "faults", Some(faults))
            .await
            .status(),
        204
    );
    assert_eq!(gcs.get("x", "").await.status(), 503);
    let response = gcs.get("x", "").await;
    assert_eq!(response.status(), 404);
    assert!((off_by(parse_date(&response), SystemTime::now()) - 7200).abs() <= 2);
    let log: Value = gcs
        .admin(Method::GET, "requests", None)
        .await
        .json()
        .await
        .unwrap();
    let statuses: Vec<&Value> = log
        .as_array()
        .unwrap()
        .iter()
        .map(|r| &r["status"])
        .collect();
    assert_eq!(
        statuses,
        [&json!(503), &json!(404)],
        "admin calls are logged: {log}"
    );
}

/// The admin path turns the rate limit on and off and clears the log.
#[tokio::test]
async fn admin_path_sets_rate_limit_and_clears() {
    let (server, gcs) = setup().await;
    let limit = json!({"rateLimitMs": 60_000});
    assert_eq!(
        gcs.admin(Method::POST, "faults", Some(limit))
            .await
            .status(),
        204
    );
    gcs.media_insert("r", "", b"").await;
    assert_eq!(gcs.media_insert("r", "", b"").await.status(), 429);
    assert_eq!(
        gcs.admin(Method::DELETE, "faults", None).await.status(),
        204
    );
    assert_eq!(gcs.media_insert("r", "", b"").await.status(), 200);
    assert_eq!(
        gcs.admin(Method::DELETE, "requests", None).await.status(),
        204
    );
    assert!(server.requests().is_empty());
}

/// Dropping the handle stops the server.
#[tokio::test]
async fn drop_stops_the_server() {
    let (server, gcs) = setup().await;
    assert_eq!(gcs.get("x", "").await.status(), 404);
    drop(server);
    tokio::time::sleep(Duration::from_millis(50)).await;
    let fresh = common::http_client();
    let url = format!("{}/storage/v1/b/bkt/o/x", gcs.base);
    assert!(
        fresh.get(url).send().await.is_err(),
        "still answering after drop"
    );
}
