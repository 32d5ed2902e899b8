//! The harness's real servers answer, and the fault proxy cuts a real server the way the
//! suite's outage cases expect. In CI a missing server fails here first, with a message
//! that names the setting and the fix.

use std::time::Duration;

use test_kit::env::{host_port, require};
use test_kit::proxy::{Fault, FaultProxy};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::time::timeout;

const PATIENCE: Duration = Duration::from_secs(5);

async fn connect(url: &str) -> TcpStream {
    let addr = host_port(url).unwrap_or_else(|| panic!("no host:port in {url}"));
    timeout(PATIENCE, TcpStream::connect(addr))
        .await
        .unwrap_or_else(|_| panic!("connecting to {addr} timed out"))
        .unwrap_or_else(|e| panic!("cannot connect to {addr}: {e}"))
}

/// Writes `request` and reads until `expected` appears in the reply.
async fn exchange(stream: &mut TcpStream, request: &[u8], expected: &str) -> Result<(), String> {
    stream.write_all(request).await.map_err(|e| e.to_string())?;
    let mut reply = Vec::new();
    let mut buf = [0u8; 4096];
    while !String::from_utf8_lossy(&reply).contains(expected) {
        let n = stream.read(&mut buf).await.map_err(|e| e.to_string())?;
        if n == 0 {
            return Err(format!(
                "closed after {:?}",
                String::from_utf8_lossy(&reply)
            ));
        }
        reply.extend_from_slice(&buf[..n]);
    }
    Ok(())
}

async fn http_get(url: &str, path: &str, expected: &str) {
    let mut stream = connect(url).await;
    let host = host_port(url).unwrap_or_default();
    let request = format!("GET {path} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n");
    timeout(
        PATIENCE,
        exchange(&mut stream, request.as_bytes(), expected),
    )
    .await
    .unwrap_or_else(|_| panic!("{url}{path}: no {expected:?} within {PATIENCE:?}"))
    .unwrap_or_else(|e| panic!("{url}{path}: {e}"));
}

#[tokio::test]
async fn every_redis_node_answers_ping() {
    let Some(urls) = require("ANYLOCK_TEST_REDLOCK_URLS", "Redis") else {
        return;
    };
    let urls: Vec<&str> = urls.split(',').collect();
    assert_eq!(
        urls.len(),
        5,
        "Redlock tests need 5 independent nodes: {urls:?}"
    );
    for url in urls {
        let mut stream = connect(url).await;
        timeout(PATIENCE, exchange(&mut stream, b"PING\r\n", "+PONG"))
            .await
            .expect("PING timed out")
            .unwrap_or_else(|e| panic!("{url}: {e}"));
    }
}

#[tokio::test]
async fn postgres_accepts_connections() {
    let Some(url) = require("ANYLOCK_TEST_POSTGRES_URL", "PostgreSQL") else {
        return;
    };
    let mut stream = connect(&url).await;
    // An SSLRequest: PostgreSQL answers with one byte, 'S' or 'N'.
    let ssl_request = [0u8, 0, 0, 8, 0x04, 0xd2, 0x16, 0x2f];
    stream.write_all(&ssl_request).await.expect("write");
    let answer = timeout(PATIENCE, stream.read_u8())
        .await
        .expect("no answer")
        .expect("read");
    assert!(
        matches!(answer, b'S' | b'N'),
        "not a PostgreSQL server: {answer:#x}"
    );
}

#[tokio::test]
async fn every_etcd_member_is_healthy() {
    let Some(endpoints) = require("ANYLOCK_TEST_ETCD_ENDPOINTS", "etcd") else {
        return;
    };
    let endpoints: Vec<&str> = endpoints.split(',').collect();
    assert_eq!(
        endpoints.len(),
        3,
        "the etcd tests need a 3-member cluster: {endpoints:?}"
    );
    for endpoint in endpoints {
        http_get(endpoint, "/health", "\"health\":\"true\"").await;
    }
}

#[tokio::test]
async fn fake_gcs_answers_the_json_api() {
    let Some(url) = require("ANYLOCK_TEST_FAKE_GCS_URL", "GCS") else {
        return;
    };
    http_get(&url, "/storage/v1/b", "200 OK").await;
}

/// The suite's outage cases rely on this: a blackhole makes calls hang (not fail fast),
/// and after it ends a new connection works at once.
#[tokio::test]
async fn the_proxy_blackholes_a_real_redis_and_recovers() {
    let Some(url) = require("ANYLOCK_TEST_REDIS_URL", "Redis") else {
        return;
    };
    let upstream = host_port(&url)
        .expect("host:port")
        .parse()
        .expect("socket address");
    let proxy = FaultProxy::start(upstream).await.expect("proxy");
    let mut client = TcpStream::connect(proxy.local_addr())
        .await
        .expect("connect");
    exchange(&mut client, b"PING\r\n", "+PONG")
        .await
        .expect("through the proxy");
    proxy.set_fault(Fault::Blackhole);
    let hung = timeout(
        Duration::from_millis(500),
        exchange(&mut client, b"PING\r\n", "+PONG"),
    )
    .await;
    assert!(hung.is_err(), "a blackholed PING was answered: {hung:?}");
    proxy.set_fault(Fault::Pass);
    let mut fresh = TcpStream::connect(proxy.local_addr())
        .await
        .expect("reconnect");
    timeout(PATIENCE, exchange(&mut fresh, b"PING\r\n", "+PONG"))
        .await
        .expect("PING after recovery timed out")
        .expect("PING after recovery");
    proxy.shutdown().await;
}
