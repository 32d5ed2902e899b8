//! A thin JSON-API client over reqwest, shared by the server tests and the
//! fake-gcs-server cross-check, so both send byte-identical requests.

#![allow(dead_code, unreachable_pub)]

use reqwest::{Client, Response};
use serde_json::Value;

/// Query parameter name for a precondition.
pub const PRECONDITIONS: [&str; 4] = [
    "ifGenerationMatch",
    "ifGenerationNotMatch",
    "ifMetagenerationMatch",
    "ifMetagenerationNotMatch",
];

/// One bucket on one server.
#[derive(Debug, Clone)]
pub struct Gcs {
    pub http: Client,
    pub base: String,
    pub bucket: String,
}

/// Percent-encodes an object name as one path segment.
pub fn encode(name: &str) -> String {
    name.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'.' | b'_' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

fn with_query(url: String, query: &str) -> String {
    if query.is_empty() {
        url
    } else if url.contains('?') {
        format!("{url}&{query}")
    } else {
        format!("{url}?{query}")
    }
}

/// A plain-HTTP test client. In a workspace build, cargo unifies reqwest's features with
/// backend-gcs's `rustls-no-provider`, and every client then needs a rustls crypto provider
/// installed, even for `http://`; install ring's (a no-op when one is already installed).
pub fn http_client() -> Client {
    let _ = rustls::crypto::ring::default_provider().install_default();
    Client::builder()
        .no_proxy()
        .build()
        .expect("reqwest client")
}

impl Gcs {
    pub fn new(base: &str, bucket: &str) -> Self {
        let http = http_client();
        Self {
            http,
            base: base.trim_end_matches('/').to_owned(),
            bucket: bucket.to_owned(),
        }
    }

    fn object_url(&self, name: &str, query: &str) -> String {
        let url = format!(
            "{}/storage/v1/b/{}/o/{}",
            self.base,
            self.bucket,
            encode(name)
        );
        with_query(url, query)
    }

    fn upload_url(&self, upload_type: &str, name: &str, query: &str) -> String {
        let url = format!(
            "{}/upload/storage/v1/b/{}/o?uploadType={upload_type}&name={}",
            self.base,
            self.bucket,
            encode(name)
        );
        with_query(url, query)
    }

    /// `POST /storage/v1/b` creating this bucket.
    pub async fn create_bucket(&self) -> Response {
        let url = format!("{}/storage/v1/b?project=test", self.base);
        let body = serde_json::json!({ "name": self.bucket });
        self.http
            .post(url)
            .json(&body)
            .send()
            .await
            .expect("create bucket")
    }

    /// `uploadType=media` insert of `data`.
    pub async fn media_insert(&self, name: &str, query: &str, data: &'static [u8]) -> Response {
        let url = self.upload_url("media", name, query);
        let request = self
            .http
            .post(url)
            .header("content-type", "text/plain")
            .body(data);
        request.send().await.expect("media insert")
    }

    /// `uploadType=multipart` insert with a JSON metadata part and empty content.
    pub async fn multipart_insert(&self, name: &str, query: &str, metadata: &Value) -> Response {
        let boundary = "anylock_boundary_7f3a";
        let body = format!(
            "--{boundary}\r\nContent-Type: application/json; charset=UTF-8\r\n\r\n{metadata}\r\n\
             --{boundary}\r\nContent-Type: application/octet-stream\r\n\r\n\r\n--{boundary}--\r\n"
        );
        let url = self.upload_url("multipart", name, query);
        let content_type = format!("multipart/related; boundary={boundary}");
        let request = self
            .http
            .post(url)
            .header("content-type", content_type)
            .body(body);
        request.send().await.expect("multipart insert")
    }

    pub async fn get(&self, name: &str, query: &str) -> Response {
        self.http
            .get(self.object_url(name, query))
            .send()
            .await
            .expect("get")
    }

    pub async fn patch(&self, name: &str, query: &str, body: &Value) -> Response {
        let request = self.http.patch(self.object_url(name, query)).json(body);
        request.send().await.expect("patch")
    }

    /// A patch whose transport failure is returned, not a panic (lost replies).
    pub async fn try_patch(
        &self,
        name: &str,
        query: &str,
        body: &Value,
    ) -> reqwest::Result<Response> {
        let request = self.http.patch(self.object_url(name, query)).json(body);
        request.send().await
    }

    pub async fn delete(&self, name: &str, query: &str) -> Response {
        self.http
            .delete(self.object_url(name, query))
            .send()
            .await
            .expect("delete")
    }

    pub async fn list(&self, prefix: &str) -> Response {
        self.list_query(&format!("prefix={}", encode(prefix))).await
    }

    /// `objects.list` with a raw query string (already encoded).
    pub async fn list_query(&self, query: &str) -> Response {
        let url = format!("{}/storage/v1/b/{}/o", self.base, self.bucket);
        let url = with_query(url, query);
        self.http.get(url).send().await.expect("list")
    }

    /// Every object name under `prefix`, following `nextPageToken` with `maxResults`
    /// per page; also the number of pages.
    pub async fn list_all(&self, prefix: &str, max_results: u32) -> (Vec<String>, usize) {
        let (mut names, mut pages, mut token) = (Vec::new(), 0, None::<String>);
        loop {
            let mut query = format!("prefix={}&maxResults={max_results}", encode(prefix));
            if let Some(token) = &token {
                query.push_str(&format!("&pageToken={}", encode(token)));
            }
            let (status, page) = status_json(self.list_query(&query).await).await;
            assert_eq!(status, 200, "{page}");
            pages += 1;
            let items = page["items"].as_array().cloned().unwrap_or_default();
            names.extend(items.iter().map(|o| o["name"].as_str().unwrap().to_owned()));
            match page["nextPageToken"].as_str() {
                Some(next) => token = Some(next.to_owned()),
                None => return (names, pages),
            }
            assert!(pages < 10_000, "pagination does not end");
        }
    }

    /// A request to the test server's admin path `/_test/{path}`.
    pub async fn admin(
        &self,
        method: reqwest::Method,
        path: &str,
        body: Option<Value>,
    ) -> Response {
        let url = format!("{}/_test/{path}", self.base);
        let mut request = self.http.request(method, url);
        if let Some(body) = body {
            request = request.json(&body);
        }
        request.send().await.expect("admin request")
    }

    /// The object's resource; panics unless the GET answers 200.
    pub async fn resource(&self, name: &str) -> Value {
        let response = self.get(name, "").await;
        assert_eq!(response.status(), 200, "GET {name}");
        response.json().await.expect("object JSON")
    }
}

/// A JSON string field parsed as an integer (generation, metageneration, size).
pub fn int_field(resource: &Value, field: &str) -> i64 {
    resource[field]
        .as_str()
        .unwrap_or_else(|| panic!("{field} is not a JSON string in {resource}"))
        .parse()
        .unwrap_or_else(|e| panic!("{field} is not an integer: {e}"))
}

/// Status and JSON body of a response.
pub async fn status_json(response: Response) -> (u16, Value) {
    let status = response.status().as_u16();
    let text = response.text().await.expect("body");
    (status, serde_json::from_str(&text).unwrap_or(Value::Null))
}

/// One call of a batch: method, object name, query, JSON body (PATCH only).
pub struct BatchCall<'a> {
    pub method: &'a str,
    pub name: &'a str,
    pub query: &'a str,
    pub body: Option<Value>,
}

/// One answer of a batch reply: the part's `Content-ID`, the status and JSON body of
/// the HTTP response it holds.
#[derive(Debug, Clone)]
pub struct BatchAnswer {
    pub content_id: Option<String>,
    pub status: u16,
    pub body: Value,
}

impl Gcs {
    /// The `multipart/mixed` body of a batch of `calls`, call `i` with `Content-ID: <t+i>`.
    pub fn batch_body(&self, boundary: &str, calls: &[BatchCall<'_>]) -> String {
        let mut out = String::new();
        for (i, call) in calls.iter().enumerate() {
            let path = format!("/storage/v1/b/{}/o/{}", self.bucket, encode(call.name));
            let target = with_query(path, call.query);
            let body = call.body.as_ref().map(Value::to_string).unwrap_or_default();
            out.push_str(&format!(
                "--{boundary}\r\nContent-Type: application/http\r\nContent-ID: <t+{i}>\r\n\r\n\
                 {} {target} HTTP/1.1\r\nContent-Type: application/json\r\n\
                 Content-Length: {}\r\n\r\n{body}\r\n",
                call.method,
                body.len()
            ));
        }
        out.push_str(&format!("--{boundary}--\r\n"));
        out
    }

    /// Sends a raw batch request body with the given content type.
    pub async fn batch_raw(&self, content_type: &str, body: String) -> Response {
        self.http
            .post(format!("{}/batch/storage/v1", self.base))
            .header("Content-Type", content_type)
            .body(body)
            .send()
            .await
            .expect("batch request")
    }

    /// Sends `calls` as one batch and reads its answers.
    pub async fn batch(&self, calls: &[BatchCall<'_>]) -> Vec<BatchAnswer> {
        let body = self.batch_body("b0undary", calls);
        let response = self
            .batch_raw("multipart/mixed; boundary=b0undary", body)
            .await;
        assert_eq!(response.status(), 200, "batch status");
        batch_answers(response).await
    }
}

/// The answers of a batch reply, in the order sent.
pub async fn batch_answers(response: Response) -> Vec<BatchAnswer> {
    let content_type = response.headers()["content-type"]
        .to_str()
        .expect("content type")
        .to_owned();
    let boundary = content_type
        .split("boundary=")
        .nth(1)
        .expect("a multipart/mixed boundary")
        .trim_matches('"')
        .to_owned();
    assert!(
        content_type.starts_with("multipart/mixed"),
        "{content_type}"
    );
    let text = response.text().await.expect("batch body");
    let delimiter = format!("--{boundary}");
    text.split(delimiter.as_str())
        .skip(1)
        .take_while(|part| !part.starts_with("--"))
        .map(|part| {
            let (headers, http) = part.trim_start().split_once("\r\n\r\n").expect("part head");
            let header = |name: &str| {
                headers.lines().find_map(|l| {
                    let (k, v) = l.split_once(':')?;
                    k.trim()
                        .eq_ignore_ascii_case(name)
                        .then(|| v.trim().to_owned())
                })
            };
            assert_eq!(
                header("content-type").as_deref(),
                Some("application/http"),
                "part {headers}"
            );
            let (head, body) = http.split_once("\r\n\r\n").expect("response head");
            let status = head
                .split(' ')
                .nth(1)
                .expect("status")
                .parse()
                .expect("code");
            BatchAnswer {
                content_id: header("content-id"),
                status,
                body: serde_json::from_str(body.trim()).unwrap_or(Value::Null),
            }
        })
        .collect()
}
