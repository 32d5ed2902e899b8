//! The GCS JSON API calls the lock makes; their failures are mapped by [`crate::error`].

use std::time::SystemTime;

use lockcore::{Error, ErrorKind, Result};
use percent_encoding::{AsciiSet, NON_ALPHANUMERIC, utf8_percent_encode};
use reqwest::{Method, RequestBuilder, StatusCode};
use serde_json::{Value, json};
use tokio::sync::{Semaphore, SemaphorePermit};

use crate::auth::Authorizer;
use crate::body;
use crate::config::GcsConfig;
use crate::error::{Call, Failure, malformed_json, map_error, no_bucket, protocol};
use crate::http::{http_client, is_loopback};
use crate::reply::Reply;
use crate::reply::{ReadStatus, parse_object, read_status};

mod batch;

pub(crate) use batch::{BATCH_LIMIT, PartAnswer, PatchCall};

/// Characters left unescaped in a path segment (RFC 3986 unreserved).
const SEGMENT: &AsciiSet = &NON_ALPHANUMERIC
    .remove(b'-')
    .remove(b'.')
    .remove(b'_')
    .remove(b'~');

const BOUNDARY: &str = "anylock-gcs-boundary-7c1f";

/// One reply with the server's clock reading (`Date`).
#[derive(Debug)]
pub(crate) struct Answer {
    pub(crate) reply: Reply,
    pub(crate) date: Option<SystemTime>,
}

/// The object preconditions a call sends as query parameters.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Preconditions {
    pub(crate) generation: Option<u64>,
    pub(crate) metageneration: Option<u64>,
}

impl Preconditions {
    pub(crate) fn exact(generation: u64, metageneration: u64) -> Self {
        Self {
            generation: Some(generation),
            metageneration: Some(metageneration),
        }
    }

    /// The query string (`ifGenerationMatch=…&ifMetagenerationMatch=…`), possibly empty.
    fn query(self) -> String {
        let mut query = Vec::new();
        if let Some(g) = self.generation {
            query.push(format!("ifGenerationMatch={g}"));
        }
        if let Some(m) = self.metageneration {
            query.push(format!("ifMetagenerationMatch={m}"));
        }
        query.join("&")
    }
}

/// A reqwest client bound to one bucket.
#[derive(Debug, Clone)]
pub(crate) struct GcsClient {
    http: reqwest::Client,
    config: GcsConfig,
    auth: std::sync::Arc<Authorizer>,
    /// One permit per backend operation in flight (`max_requests`; see [`Self::slot`]),
    /// shared by the clones.
    slots: std::sync::Arc<Semaphore>,
    /// Whether refreshes are batched; see [`batch`].
    batching: std::sync::Arc<crate::batching::Batching>,
}

impl GcsClient {
    pub(crate) fn new(config: GcsConfig) -> Result<Self> {
        refuse_credentials_in_clear(&config)?;
        #[cfg(feature = "tls")]
        let _ = rustls::crypto::ring::default_provider().install_default();
        // Idle connections beyond the slots would never all be used at once.
        let builder = reqwest::Client::builder().pool_max_idle_per_host(config.max_requests());
        let http = http_client(builder, config.timeout())?;
        let auth = Authorizer::new(config.auth().clone(), config.timeout())?;
        let slots = std::sync::Arc::new(Semaphore::new(config.max_requests()));
        let batching = std::sync::Arc::new(crate::batching::Batching::new(&config));
        Ok(Self {
            http,
            config,
            auth: std::sync::Arc::new(auth),
            slots,
            batching,
        })
    }

    pub(crate) fn config(&self) -> &GcsConfig {
        &self.config
    }

    /// Creates `object` empty with `metadata`, `Cache-Control: no-store`, under
    /// `preconditions` (`ifGenerationMatch=0`: only if absent). A multipart upload.
    pub(crate) async fn insert(
        &self,
        object: &str,
        metadata: Value,
        preconditions: Preconditions,
    ) -> Result<Answer> {
        let resource = json!({
            "name": object,
            "cacheControl": "no-store",
            "contentType": "application/octet-stream",
            "metadata": metadata,
        });
        let body = format!(
            "--{BOUNDARY}\r\nContent-Type: application/json; charset=UTF-8\r\n\r\n{resource}\r\n\
             --{BOUNDARY}\r\nContent-Type: application/octet-stream\r\n\r\n\r\n--{BOUNDARY}--\r\n"
        );
        let url = format!(
            "{}/upload/storage/v1/b/{}/o?uploadType=multipart&{}",
            self.config.endpoint(),
            segment(self.config.bucket()),
            preconditions.query()
        );
        let request = self
            .http
            .post(url)
            .header(
                "Content-Type",
                format!("multipart/related; boundary={BOUNDARY}"),
            )
            .body(body);
        self.send(request, Call::Write).await
    }

    /// Reads the object resource.
    pub(crate) async fn get(&self, object: &str) -> Result<Answer> {
        let request = self
            .http
            .get(self.object_url(object, Preconditions::default()));
        self.send(request, Call::Read).await
    }

    /// Merges `metadata` into the object's metadata under `preconditions`.
    pub(crate) async fn patch(
        &self,
        object: &str,
        metadata: Value,
        preconditions: Preconditions,
    ) -> Result<Answer> {
        let request = self
            .http
            .request(Method::PATCH, self.object_url(object, preconditions))
            .json(&json!({ "metadata": metadata }));
        self.send(request, Call::Write).await
    }

    /// Deletes the object under `preconditions`.
    pub(crate) async fn delete(
        &self,
        object: &str,
        preconditions: Preconditions,
    ) -> Result<Answer> {
        let request = self.http.delete(self.object_url(object, preconditions));
        self.send(request, Call::Write).await
    }

    fn object_url(&self, object: &str, preconditions: Preconditions) -> String {
        format!(
            "{}/storage/v1/b/{}/o/{}?{}",
            self.config.endpoint(),
            segment(self.config.bucket()),
            segment(object),
            preconditions.query()
        )
    }

    /// One page of `objects.list` for the object names starting with `prefix`, after the
    /// page `page_token` ended (`None`: the first page). `projection=noAcl` (GCS's
    /// default, said explicitly) returns each object's `metadata`, so no GET per object.
    pub(crate) async fn list(&self, prefix: &str, page_token: Option<&str>) -> Result<ListPage> {
        let mut url = format!(
            "{}/storage/v1/b/{}/o?prefix={}&maxResults={LIST_PAGE}&projection=noAcl",
            self.config.endpoint(),
            segment(self.config.bucket()),
            segment(prefix),
        );
        if let Some(token) = page_token {
            url.push_str("&pageToken=");
            url.push_str(&segment(token));
        }
        let response = self.exchange(self.http.get(url), Call::Read).await?;
        let date = date_of(&response);
        match response.status() {
            StatusCode::NOT_FOUND => return Err(no_bucket()),
            s if s.is_success() => {}
            s => return Err(map_error(Failure::Status(s.as_u16()), Call::Read)),
        }
        let body = read_body(response, body::LIST_PAGE, Call::Read).await?;
        ListPage::parse(&body, date)
    }

    async fn send(&self, request: RequestBuilder, call: Call) -> Result<Answer> {
        let response = self.exchange(request, call).await?;
        self.answer(response, call).await
    }

    /// A turn for one backend operation (an acquire's up to five requests, a refresh's
    /// up to three, one list with all its pages): held until the operation ends, so at
    /// most `max_requests` operations, and as many requests, are in flight at once, and
    /// none waits at the back of the queue again half-way through. Waiting is bounded by
    /// the request timeout; when it runs out the operation has sent nothing.
    pub(crate) async fn slot(&self) -> Result<SemaphorePermit<'_>> {
        let timeout = self.config.timeout();
        match tokio::time::timeout(timeout, self.slots.acquire()).await {
            Ok(Ok(permit)) => Ok(permit),
            // The semaphore is never closed; an error here would be a bug, not a reason
            // to panic.
            Ok(Err(_)) | Err(_) => Err(Error::unavailable(format!(
                "all {} GCS request slots stayed busy for {timeout:?}; nothing was sent \
                 (raise max_requests or timeout_ms in the gs:// URL)",
                self.config.max_requests()
            ))),
        }
    }

    /// Sends `request`. A renewable token GCS refuses (revoked, or expired early) is
    /// replaced and the call sent once more: a 401 changed nothing, so resending is safe.
    async fn exchange(&self, request: RequestBuilder, call: Call) -> Result<reqwest::Response> {
        Ok(self.exchange_keeping_token(request, call).await?.0)
    }

    /// As [`Self::exchange`], also returning the token the answer was given for.
    async fn exchange_keeping_token(
        &self,
        request: RequestBuilder,
        call: Call,
    ) -> Result<(reqwest::Response, Option<String>)> {
        let resend = if self.auth.renews() {
            request.try_clone()
        } else {
            None
        };
        let (response, token) = self.dispatch(request, call).await?;
        if response.status() == StatusCode::UNAUTHORIZED
            && let (Some(resend), Some(refused)) = (resend, token.as_deref())
        {
            self.auth.forget(refused).await;
            return self.dispatch(resend, call).await;
        }
        Ok((response, token))
    }

    /// Sends `request` with the current token; returns the reply and the token sent.
    async fn dispatch(
        &self,
        mut request: RequestBuilder,
        call: Call,
    ) -> Result<(reqwest::Response, Option<String>)> {
        let token = self.auth.bearer().await?;
        if let Some(token) = &token {
            request = request.bearer_auth(token);
        }
        let response = request
            .send()
            .await
            .map_err(|e| map_error(Failure::Transport(e), call))?;
        Ok((response, token))
    }

    async fn answer(&self, response: reqwest::Response, call: Call) -> Result<Answer> {
        let date = date_of(&response);
        let status = response.status();
        let reply = match read_status(status.as_u16()) {
            ReadStatus::Decided(reply) => reply,
            ReadStatus::Object => {
                let body = read_body(response, body::OBJECT, call).await?;
                Reply::Ok(parse_object(&body)?)
            }
            ReadStatus::Failed(code) => return Err(map_error(Failure::Status(code), call)),
        };
        Ok(Answer { reply, date })
    }
}

/// The body of a GCS reply, at most `limit` of it ([`body::read`]).
pub(crate) async fn read_body(
    response: reqwest::Response,
    limit: body::Limit,
    call: Call,
) -> Result<Vec<u8>> {
    body::read(response, limit)
        .await
        .map_err(|unread| match unread {
            body::Unread::TooLarge(limit) => body::too_large(limit, call),
            body::Unread::Transport(e) => map_error(Failure::Transport(e), call),
        })
}

/// The server's clock reading: the reply's `Date` header.
fn date_of(response: &reqwest::Response) -> Option<SystemTime> {
    response
        .headers()
        .get(reqwest::header::DATE)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| httpdate::parse_http_date(v).ok())
}

/// Objects asked for per list page: GCS's most ("1,000 items, whichever is smaller").
pub(crate) const LIST_PAGE: usize = 1000;

/// One page of `objects.list`: its items as sent (each parsed by the caller, so one
/// malformed item never spoils the page), the continuation token, and the reply's `Date`.
#[derive(Debug)]
pub(crate) struct ListPage {
    pub(crate) items: Vec<Value>,
    pub(crate) next_page_token: Option<String>,
    pub(crate) date: SystemTime,
}

impl ListPage {
    fn parse(body: &[u8], date: Option<SystemTime>) -> Result<Self> {
        let mut value: Value = serde_json::from_slice(body)
            .map_err(|e| malformed_json("a list with malformed JSON", &e))?;
        let items = match value.get_mut("items").map(Value::take) {
            None | Some(Value::Null) => Vec::new(),
            Some(Value::Array(items)) => items,
            Some(_) => return Err(protocol("the list reply's `items` is not an array")),
        };
        let next_page_token = value
            .get("nextPageToken")
            .and_then(Value::as_str)
            .filter(|t| !t.is_empty())
            .map(str::to_owned);
        let date = date.ok_or_else(|| protocol("GCS sent no Date header"))?;
        Ok(Self {
            items,
            next_page_token,
            date,
        })
    }
}

fn segment(text: &str) -> String {
    utf8_percent_encode(text, SEGMENT).to_string()
}

/// Credentials travel only over https, or plain http to this machine (emulators and test
/// servers): a token sent in clear to another host could be read and replayed.
fn refuse_credentials_in_clear(config: &GcsConfig) -> Result<()> {
    if matches!(config.auth(), crate::GcsAuth::None) {
        return Ok(());
    }
    let Ok(endpoint) = url::Url::parse(config.endpoint()) else {
        return Ok(());
    };
    if endpoint.scheme() == "http" && !is_loopback(&endpoint) {
        return Err(Error::new(
            ErrorKind::Config,
            "GCS credentials would be sent unencrypted: the endpoint is plain http to \
             another machine; use https, or auth=none for an emulator",
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn credentials_never_travel_in_clear_to_another_machine() {
        let config = |endpoint: &str, auth: crate::GcsAuth| {
            GcsConfig::new("bucket")
                .and_then(|c| c.with_endpoint(endpoint))
                .map(|c| c.with_auth(auth))
                .expect("a valid config")
        };
        let token = || crate::GcsAuth::AccessToken("ya29.secret".to_owned());
        let err = GcsClient::new(config("http://192.0.2.1:80", token())).expect_err("in clear");
        assert_eq!(err.kind(), ErrorKind::Config);
        assert!(!err.to_string().contains("ya29"), "{err}");
        GcsClient::new(config("http://127.0.0.1:4443", token())).expect("loopback");
        GcsClient::new(config("http://[::1]:4443", token())).expect("loopback");
        GcsClient::new(config("http://192.0.2.1:80", crate::GcsAuth::None)).expect("no auth");
        GcsClient::new(config("https://storage.example", token())).expect("https");
    }

    #[test]
    fn names_are_escaped_as_one_segment() {
        assert_eq!(segment("locks/a b~c"), "locks%2Fa%20b~c");
    }
}
