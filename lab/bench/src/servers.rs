//! Server-side call counters (Redis `INFO commandstats`, etcd's gRPC metrics, the GCS test
//! server's request log) and server versions for the report.

use std::collections::BTreeMap;
use std::sync::Arc;

use async_trait::async_trait;
use gcs_test_server::GcsTestServer;

use crate::op::Res;
use crate::procstat;

/// The bucket of the in-process GCS test server.
pub(crate) const BUCKET: &str = "anylock-bench";

/// Starts the in-process GCS test server on a runtime of its own, with one bucket
/// ([`BUCKET`]); its threads are named so their CPU is not counted as the client's.
///
/// # Errors
/// When the runtime cannot be built.
pub(crate) fn gcs_test_server() -> Res<(tokio::runtime::Runtime, Arc<GcsTestServer>)> {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .thread_name(procstat::SERVER_THREADS)
        .enable_all()
        .build()?;
    let server = runtime.block_on(GcsTestServer::start());
    server.create_bucket(BUCKET);
    Ok((runtime, Arc::new(server)))
}

/// The `gs://` URL of the in-process test server's bucket.
pub(crate) fn gcs_url(server: &GcsTestServer) -> String {
    format!("gs://{BUCKET}?endpoint={}", server.url())
}

/// Calls by name, as a server counts them.
pub(crate) type Calls = BTreeMap<String, u64>;

/// Reads a server's cumulative call counters.
#[async_trait]
pub(crate) trait Counter: Send + Sync {
    /// The counters now (cumulative since the server started).
    async fn snapshot(&self) -> Res<Calls>;
}

/// `after - before`, per name, leaving out names that did not move.
pub(crate) fn delta(before: &Calls, after: &Calls) -> Calls {
    after
        .iter()
        .filter_map(|(name, n)| {
            let d = n.saturating_sub(*before.get(name).unwrap_or(&0));
            (d > 0).then(|| (name.clone(), d))
        })
        .collect()
}

/// `evalsha 2, get 2, incr 1` (per cycle, over `cycles`), sorted by count then name.
pub(crate) fn describe(calls: &Calls, cycles: u64) -> String {
    let mut items: Vec<_> = calls.iter().collect();
    items.sort_by(|a, b| b.1.cmp(a.1).then(a.0.cmp(b.0)));
    let per = |n: u64| crate::stats::fmt_count(Some(n as f64 / cycles as f64));
    let parts: Vec<String> = items
        .iter()
        .map(|(k, n)| format!("{k} {}", per(**n)))
        .collect();
    parts.join(", ")
}

/// Redis `INFO commandstats`, summed over nodes; our own `INFO` calls are left out.
pub(crate) struct RedisCommands {
    /// One client per node.
    pub(crate) nodes: Vec<redis::Client>,
}

#[async_trait]
impl Counter for RedisCommands {
    async fn snapshot(&self) -> Res<Calls> {
        let mut calls = Calls::new();
        for node in &self.nodes {
            let mut conn = node.get_multiplexed_async_connection().await?;
            let text: String = redis::cmd("INFO")
                .arg("commandstats")
                .query_async(&mut conn)
                .await?;
            for (name, n) in parse_commandstats(&text) {
                *calls.entry(name).or_default() += n;
            }
        }
        Ok(calls)
    }
}

/// `cmdstat_evalsha:calls=3,usec=…` lines to `("evalsha", 3)`, without `info`.
pub(crate) fn parse_commandstats(text: &str) -> Vec<(String, u64)> {
    text.lines()
        .filter_map(|line| {
            let (name, rest) = line.trim().strip_prefix("cmdstat_")?.split_once(':')?;
            let calls = rest.split(',').find_map(|kv| kv.strip_prefix("calls="))?;
            if name == "info" {
                return None;
            }
            Some((name.to_owned(), calls.parse().ok()?))
        })
        .collect()
}

/// etcd's `grpc_server_started_total` by method, from one member's `/metrics`.
pub(crate) struct EtcdRpcs {
    /// `http://host:port/metrics`.
    pub(crate) url: String,
    /// A plain HTTP client.
    pub(crate) http: reqwest::Client,
}

#[async_trait]
impl Counter for EtcdRpcs {
    async fn snapshot(&self) -> Res<Calls> {
        let text = self.http.get(&self.url).send().await?.text().await?;
        Ok(parse_grpc_started(&text))
    }
}

/// `grpc_server_started_total{grpc_method="Range",…} 12` lines to `Range → 12`.
pub(crate) fn parse_grpc_started(text: &str) -> Calls {
    let mut calls = Calls::new();
    for line in text.lines() {
        let Some(rest) = line.strip_prefix("grpc_server_started_total{") else {
            continue;
        };
        let method = rest
            .split("grpc_method=\"")
            .nth(1)
            .and_then(|m| m.split('"').next());
        let value = rest.rsplit(' ').next().and_then(|v| v.parse::<f64>().ok());
        if let (Some(method), Some(value)) = (method, value) {
            *calls.entry(method.to_owned()).or_default() += value as u64;
        }
    }
    calls
}

/// The in-process GCS test server's request log, by HTTP method.
pub(crate) struct GcsRequests {
    /// The server.
    pub(crate) server: Arc<GcsTestServer>,
}

#[async_trait]
impl Counter for GcsRequests {
    async fn snapshot(&self) -> Res<Calls> {
        let mut calls = Calls::new();
        for record in self.server.requests() {
            *calls.entry(record.method).or_default() += 1;
        }
        Ok(calls)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_commandstats_without_info() {
        let text = "# Commandstats\r\ncmdstat_evalsha:calls=4,usec=10,usec_per_call=2.5\r\n\
                    cmdstat_info:calls=9,usec=1\r\ncmdstat_script|load:calls=1,usec=3\r\n";
        assert_eq!(
            parse_commandstats(text),
            [("evalsha".to_owned(), 4), ("script|load".to_owned(), 1)]
        );
    }

    #[test]
    fn parses_grpc_started_counters() {
        let text = "# TYPE grpc_server_started_total counter\n\
            grpc_server_started_total{grpc_method=\"Range\",grpc_service=\"etcdserverpb.KV\",grpc_type=\"unary\"} 12\n\
            grpc_server_started_total{grpc_method=\"Txn\",grpc_service=\"etcdserverpb.KV\",grpc_type=\"unary\"} 3\n\
            grpc_server_handled_total{grpc_method=\"Range\"} 99\n";
        let calls = parse_grpc_started(text);
        assert_eq!(calls.get("Range"), Some(&12));
        assert_eq!(calls.get("Txn"), Some(&3));
        assert_eq!(calls.len(), 2);
    }

    #[test]
    fn deltas_and_descriptions() {
        let before = Calls::from([("get".into(), 1), ("set".into(), 5)]);
        let after = Calls::from([("get".into(), 5), ("set".into(), 5), ("del".into(), 2)]);
        let d = delta(&before, &after);
        assert_eq!(d, Calls::from([("get".into(), 4), ("del".into(), 2)]));
        assert_eq!(describe(&d, 2), "get 2, del 1");
    }
}
