//! Shared test support: an in-process GCS test server with a fresh bucket, and raw
//! operator calls that bypass the backend.

#![allow(dead_code, unreachable_pub)]

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use backend_gcs::{GcsBackend, GcsConfig};
use gcs_test_server::GcsTestServer;
use lockcore::Identity;
use serde_json::{Value, json};

pub mod huge;
pub mod pki;
pub mod tls_front;

/// A test server with one bucket and a random prefix; the bucket's helpers (`Bucket`)
/// are reachable through `Deref`.
pub struct Gcs {
    pub server: GcsTestServer,
    objects: Bucket,
}

/// A bucket and object prefix on any JSON-API endpoint (the test server or
/// fake-gcs-server), with a backend for it and raw operator calls that bypass it.
pub struct Bucket {
    pub url: String,
    pub bucket: String,
    pub prefix: String,
    http: reqwest::Client,
}

impl std::ops::Deref for Gcs {
    type Target = Bucket;
    fn deref(&self) -> &Bucket {
        &self.objects
    }
}

impl Gcs {
    pub async fn start() -> Self {
        static NEXT: AtomicU64 = AtomicU64::new(0);
        let server = GcsTestServer::start().await;
        let nanos = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap_or_default()
            .subsec_nanos();
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let bucket = format!("anylock-test-{nanos}-{n}");
        assert!(server.create_bucket(&bucket));
        // Building a backend first installs the rustls crypto provider that a plain
        // `reqwest::Client` needs under the `tls` feature.
        drop(
            GcsBackend::from_url(&format!("gs://{bucket}/?endpoint={}", server.url()))
                .await
                .expect("backend"),
        );
        let objects = Bucket::new(&server.url(), &bucket, &format!("locks-{nanos}/"));
        Self { server, objects }
    }
}

impl Bucket {
    /// Helpers for objects under `prefix` in `bucket` at `url`.
    pub fn new(url: &str, bucket: &str, prefix: &str) -> Self {
        Self {
            url: url.to_owned(),
            bucket: bucket.to_owned(),
            prefix: prefix.to_owned(),
            http: reqwest::Client::new(),
        }
    }

    /// A backend talking to `endpoint` (the server, or a proxy in front of it).
    pub async fn backend_at(&self, endpoint: &str) -> GcsBackend {
        let config = GcsConfig::new(&self.bucket)
            .and_then(|c| c.with_endpoint(endpoint))
            .and_then(|c| c.with_prefix(&self.prefix))
            .expect("valid config")
            .with_timeout(Duration::from_secs(5))
            // The test server has no mutation rate limit unless a test injects one, and
            // the conformance TTL of 3 s refreshes every 375 ms.
            .with_min_refresh_interval(Duration::from_millis(100));
        GcsBackend::connect(config).await.expect("backend")
    }

    pub async fn backend(&self) -> GcsBackend {
        self.backend_at(&self.url).await
    }

    fn object_url(&self, name: &str) -> String {
        let object = format!("{}{name}", self.prefix);
        let object =
            percent_encoding::utf8_percent_encode(&object, percent_encoding::NON_ALPHANUMERIC);
        format!("{}/storage/v1/b/{}/o/{object}", self.url, self.bucket)
    }

    /// The object resource, or `None` on 404.
    pub async fn raw_get(&self, name: &str) -> Option<Value> {
        let response = self
            .http
            .get(self.object_url(name))
            .send()
            .await
            .expect("GET");
        if response.status() == 404 {
            return None;
        }
        assert!(response.status().is_success(), "GET {}", response.status());
        Some(response.json().await.expect("JSON"))
    }

    /// Deletes the object without preconditions, as an operator would.
    pub async fn raw_delete(&self, name: &str) {
        let response = self
            .http
            .delete(self.object_url(name))
            .send()
            .await
            .expect("DELETE");
        assert!(
            response.status().is_success() || response.status() == 404,
            "DELETE {}",
            response.status()
        );
    }

    /// Overwrites the object (a new generation) so `owner` holds it for `ttl`.
    pub async fn raw_put(&self, name: &str, owner: &Identity, ttl: Duration) {
        let metadata = json!({"identity": owner.as_str(), "ttl_ms": ttl.as_millis().to_string()});
        self.raw_put_metadata(name, metadata).await;
    }

    /// Overwrites the object (a new generation) with `metadata`, as another tool (or an
    /// older anylock) would write it.
    pub async fn raw_put_metadata(&self, name: &str, metadata: Value) {
        let resource = json!({"name": format!("{}{name}", self.prefix), "metadata": metadata});
        let body = format!(
            "--b\r\nContent-Type: application/json\r\n\r\n{resource}\r\n--b\r\n\
             Content-Type: application/octet-stream\r\n\r\n\r\n--b--\r\n"
        );
        let url = format!(
            "{}/upload/storage/v1/b/{}/o?uploadType=multipart",
            self.url, self.bucket
        );
        let response = self
            .http
            .post(url)
            .header("Content-Type", "multipart/related; boundary=b")
            .body(body)
            .send()
            .await
            .expect("insert");
        assert!(
            response.status().is_success(),
            "insert {}",
            response.status()
        );
    }
}

impl Bucket {
    /// Patches the object's metadata without preconditions (bumps metageneration).
    pub async fn raw_patch(&self, name: &str, metadata: Value) {
        let response = self
            .http
            .patch(self.object_url(name))
            .json(&json!({ "metadata": metadata }))
            .send()
            .await
            .expect("PATCH");
        assert!(
            response.status().is_success(),
            "PATCH {}",
            response.status()
        );
    }
}
