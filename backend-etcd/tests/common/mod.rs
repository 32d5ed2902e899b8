//! Helpers shared by the etcd test binaries: the shared cluster's settings, random key
//! prefixes and a raw etcd client for operator actions. Private clusters that a test may
//! kill and restart are `test_kit::servers::Etcd`.

#![allow(dead_code)]

pub(crate) mod raw;

use std::time::Duration;

use backend_etcd::{EtcdBackend, EtcdConfig};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::time::Instant;

/// The shared cluster's endpoints, or `None` (skip) outside CI when it is not running.
pub(crate) fn shared_endpoints() -> Option<Vec<String>> {
    let value = test_kit::env::require("ANYLOCK_TEST_ETCD_ENDPOINTS", "etcd")?;
    Some(value.split(',').map(|s| s.trim().to_owned()).collect())
}

/// A fresh key prefix, so runs and tests never see each other's keys.
pub(crate) fn random_prefix(what: &str) -> String {
    let random = rand_u64();
    format!("anylock-test/{what}-{random:016x}/")
}

/// 64 random bits.
pub(crate) fn rand_u64() -> u64 {
    rand::random()
}

/// A backend on `endpoints` under `prefix`.
pub(crate) async fn backend(endpoints: &[String], prefix: &str) -> EtcdBackend {
    let config = EtcdConfig::new(endpoints)
        .expect("endpoints")
        .with_prefix(prefix);
    EtcdBackend::connect(config).await.expect("connect")
}

/// A raw etcd client, for acting as an operator or another client would.
pub(crate) async fn raw(endpoints: &[String]) -> raw::Raw {
    raw::Raw::connect(endpoints)
}

/// Every key (and value) under `prefix`, lowest create revision first.
pub(crate) async fn keys_under(
    raw: &mut raw::Raw,
    prefix: &str,
) -> Vec<anylock_etcd_proto::mvccpb::KeyValue> {
    raw.by_creation(prefix, 0, false).await.expect("range")
}

/// Polls `check` every 50 ms until it holds (`true`) or `limit` passes (`false`).
pub(crate) async fn eventually(limit: Duration, mut check: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + limit;
    while Instant::now() < deadline {
        if check() {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    check()
}

/// `GET path` over plain HTTP/1.0 on `127.0.0.1:port`; the body.
pub(crate) async fn http_get(port: u16, path: &str) -> std::io::Result<String> {
    let mut stream = TcpStream::connect(("127.0.0.1", port)).await?;
    let request = format!("GET {path} HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n");
    stream.write_all(request.as_bytes()).await?;
    let mut response = String::new();
    stream.read_to_string(&mut response).await?;
    Ok(response
        .split_once("\r\n\r\n")
        .map_or(String::new(), |(_, body)| body.to_owned()))
}

/// The sum per gRPC method of one of etcd's Prometheus counters (`grpc_server_started_total`,
/// `grpc_server_msg_received_total`) on the member whose client port is `port`.
pub(crate) async fn grpc_metric(
    port: u16,
    metric: &str,
) -> std::collections::BTreeMap<String, u64> {
    let body = http_get(port, "/metrics").await.expect("metrics");
    let mut counts = std::collections::BTreeMap::new();
    let start = format!("{metric}{{");
    for line in body.lines().filter(|l| l.starts_with(&start)) {
        let method = line
            .split("grpc_method=\"")
            .nth(1)
            .and_then(|rest| rest.split('"').next());
        let value = line.rsplit(' ').next().and_then(|v| v.parse::<f64>().ok());
        if let (Some(method), Some(value)) = (method, value) {
            *counts.entry(method.to_owned()).or_default() += value as u64;
        }
    }
    counts
}

/// What happened between two metric snapshots: method -> count, zero counts left out.
pub(crate) fn metric_diff(
    before: &std::collections::BTreeMap<String, u64>,
    after: &std::collections::BTreeMap<String, u64>,
) -> std::collections::BTreeMap<String, u64> {
    after
        .iter()
        .map(|(method, n)| (method.clone(), n - before.get(method).copied().unwrap_or(0)))
        .filter(|(_, n)| *n > 0)
        .collect()
}
