//! `POST /batch/storage/v1`: several JSON-API calls in one `multipart/mixed` request,
//! answered in one `multipart/mixed` response, as Google documents batching
//! (<https://cloud.google.com/storage/docs/batch>): each part is `Content-Type:
//! application/http` holding a whole HTTP request with a path-only target; the outer
//! request's headers apply to every call except its `Content-` headers, and a call's own
//! header wins; the answers come in the order of the calls, each a whole HTTP response, and
//! a part with a `Content-ID` gets it back as `response-` + that ID.

use std::sync::atomic::{AtomicU64, Ordering};

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::header::{CONTENT_TYPE, HeaderName, HeaderValue};
use hyper::{HeaderMap, Method, Response, StatusCode};

use crate::body::{Body, ReadRequest, error_response};
use crate::call::{call, log};
use crate::error::ApiError;
use crate::multipart::{self, Part};
use crate::shared::Shared;

/// The batch endpoint's path.
pub(crate) const PATH: &str = "/batch/storage/v1";

/// The most calls one batch may hold: Google says a batch "should not include more than
/// 100 calls". What GCS does with more is not documented; this server answers 400.
pub const MAX_BATCH_CALLS: usize = 100;

/// Answers a batch: each call goes through the same path as a request of its own (an
/// injected 503, the auth check, the endpoint, the log), one after another. The batch
/// request itself is logged too, after its calls.
pub(crate) async fn handle(shared: &Shared, request: &ReadRequest) -> Response<Body> {
    let refused = shared.faults().take_batch_error();
    if let Some(status) = refused {
        let response = error_response(&ApiError::batch_refused(status));
        log(shared, request, response.status().as_u16());
        return response;
    }
    let response = match calls(request) {
        Ok(calls) => {
            let mut answers = Vec::with_capacity(calls.len());
            for (id, call_request) in calls {
                let answer = match call_request {
                    Ok(inner) => call(shared, &inner),
                    Err(e) => error_response(&e),
                };
                answers.push((id, answer));
            }
            let whole = render(shared, answers).await;
            if shared.faults().take_cut_batch_reply() {
                cut(whole).await
            } else {
                whole
            }
        }
        Err(e) => error_response(&e),
    };
    log(shared, request, response.status().as_u16());
    response
}

/// `response` with its body cut to half its bytes (a whole HTTP reply whose multipart
/// body ends mid-answer).
async fn cut(response: Response<Body>) -> Response<Body> {
    let (parts, body) = response.into_parts();
    let bytes = bytes_of(body).await;
    let half = bytes.slice(..bytes.len() / 2);
    Response::from_parts(parts, Full::new(half))
}

/// The bytes of a body the server built whole (a `Full`: ready at once).
async fn bytes_of(body: Body) -> Bytes {
    body.collect()
        .await
        .map(|b| b.to_bytes())
        .unwrap_or_default()
}

/// A call of the batch: its `Content-ID` and its request, or why it cannot be read (then
/// that part alone answers 400).
type Call = (Option<String>, Result<ReadRequest, ApiError>);

/// The calls of a batch request; an error fails the whole batch.
fn calls(request: &ReadRequest) -> Result<Vec<Call>, ApiError> {
    if request.method != Method::POST {
        return Err(ApiError::not_routed(request.method.as_str(), PATH));
    }
    let content_type = request
        .headers
        .get(CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default();
    let boundary = multipart::boundary(content_type, "multipart/mixed", "a batch request")?;
    let parts = multipart::parts(&request.body, &boundary)?;
    if parts.is_empty() {
        return Err(ApiError::bad_request("a batch request holds no calls"));
    }
    if parts.len() > MAX_BATCH_CALLS {
        return Err(ApiError::bad_request(format!(
            "a batch request holds {} calls; at most {MAX_BATCH_CALLS} are allowed",
            parts.len()
        )));
    }
    parts
        .into_iter()
        .map(|part| {
            let is_http = part.content_type.as_deref().is_some_and(|t| {
                t.split(';')
                    .next()
                    .is_some_and(|k| k.trim().eq_ignore_ascii_case("application/http"))
            });
            if !is_http {
                return Err(ApiError::bad_request(
                    "each part of a batch request needs Content-Type: application/http",
                ));
            }
            Ok((part.content_id.clone(), inner(&part, &request.headers)))
        })
        .collect()
}

/// The HTTP request one part holds: `METHOD /path?query HTTP/1.1`, headers, a blank line,
/// and a body of `Content-Length` bytes (the rest of the part without one). Headers are
/// the outer request's (but its `Content-` ones) overridden by the part's own.
fn inner(part: &Part, outer: &HeaderMap) -> Result<ReadRequest, ApiError> {
    let raw = &part.body;
    let bad = |what: &str| ApiError::bad_request(format!("batch part: {what}"));
    let (head_end, body_start) = match multipart::find(raw, b"\r\n\r\n", 0) {
        Some(at) => (at, at + 4),
        None => multipart::find(raw, b"\n\n", 0)
            .map(|at| (at, at + 2))
            .ok_or_else(|| bad("the request has no end of headers"))?,
    };
    let head = std::str::from_utf8(&raw[..head_end]).map_err(|_| bad("headers not UTF-8"))?;
    let mut lines = head.lines();
    let request_line = lines.next().unwrap_or_default();
    let mut words = request_line.split(' ');
    let (Some(method), Some(target), Some(version), None) =
        (words.next(), words.next(), words.next(), words.next())
    else {
        return Err(bad("the request line is not `METHOD /path HTTP/1.1`"));
    };
    if !version.starts_with("HTTP/1.") || !target.starts_with('/') {
        return Err(bad(
            "the request line needs a path-only target and HTTP/1.x",
        ));
    }
    let method = Method::from_bytes(method.as_bytes()).map_err(|_| bad("unknown method"))?;
    let mut headers = outer.clone();
    let outer_names: Vec<HeaderName> = headers.keys().cloned().collect();
    for name in outer_names {
        if name.as_str().starts_with("content-") {
            headers.remove(&name);
        }
    }
    for line in lines {
        let (name, value) = line
            .split_once(':')
            .ok_or_else(|| bad("a malformed header"))?;
        let name = HeaderName::from_bytes(name.trim().as_bytes()).map_err(|_| bad("header"))?;
        let value = HeaderValue::from_str(value.trim()).map_err(|_| bad("header value"))?;
        headers.insert(name, value);
    }
    let rest = raw.slice(body_start.min(raw.len())..);
    let body = match headers.get("content-length").and_then(|v| v.to_str().ok()) {
        Some(len) => {
            let len: usize = len.parse().map_err(|_| bad("Content-Length"))?;
            if len > rest.len() {
                return Err(bad("the body is shorter than its Content-Length"));
            }
            rest.slice(..len)
        }
        None => rest,
    };
    let (path, query) = match target.split_once('?') {
        Some((path, query)) => (path.to_owned(), Some(query.to_owned())),
        None => (target.to_owned(), None),
    };
    if path == PATH {
        return Err(bad("a batch cannot hold a batch"));
    }
    Ok(ReadRequest {
        method,
        path,
        query,
        headers,
        body,
    })
}

/// The `multipart/mixed` response: one `application/http` part per call, in order.
async fn render(shared: &Shared, answers: Vec<(Option<String>, Response<Body>)>) -> Response<Body> {
    static BATCHES: AtomicU64 = AtomicU64::new(0);
    let boundary = format!("batch_anylock{}", BATCHES.fetch_add(1, Ordering::Relaxed));
    let date = httpdate::fmt_http_date(shared.clock.now());
    let mut out = Vec::new();
    for (id, answer) in answers {
        let (parts, body) = answer.into_parts();
        let body = bytes_of(body).await;
        out.extend_from_slice(
            format!("--{boundary}\r\nContent-Type: application/http\r\n").as_bytes(),
        );
        if let Some(id) = id {
            let id = id.trim().trim_start_matches('<').trim_end_matches('>');
            out.extend_from_slice(format!("Content-ID: <response-{id}>\r\n").as_bytes());
        }
        let status = parts.status;
        let reason = status.canonical_reason().unwrap_or("");
        out.extend_from_slice(format!("\r\nHTTP/1.1 {} {reason}\r\n", status.as_u16()).as_bytes());
        for (name, value) in &parts.headers {
            out.extend_from_slice(name.as_str().as_bytes());
            out.extend_from_slice(b": ");
            out.extend_from_slice(value.as_bytes());
            out.extend_from_slice(b"\r\n");
        }
        out.extend_from_slice(
            format!("Date: {date}\r\nContent-Length: {}\r\n\r\n", body.len()).as_bytes(),
        );
        out.extend_from_slice(&body);
        out.extend_from_slice(b"\r\n");
    }
    out.extend_from_slice(format!("--{boundary}--\r\n").as_bytes());
    let mut response = Response::new(Full::new(Bytes::from(out)));
    *response.status_mut() = StatusCode::OK;
    if let Ok(value) = HeaderValue::from_str(&format!("multipart/mixed; boundary={boundary}")) {
        response.headers_mut().insert(CONTENT_TYPE, value);
    }
    response
}
