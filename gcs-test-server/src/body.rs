//! The request and response types every endpoint shares: a request with its body read,
//! and the JSON, error and empty responses.

use bytes::Bytes;
use http_body_util::Full;
use hyper::header::{CONTENT_TYPE, HeaderValue};
use hyper::{Response, StatusCode};
use serde_json::Value;

use crate::error::ApiError;

/// A response body.
pub(crate) type Body = Full<Bytes>;

/// A request with its body read.
#[derive(Debug)]
pub(crate) struct ReadRequest {
    pub(crate) method: hyper::Method,
    pub(crate) path: String,
    pub(crate) query: Option<String>,
    pub(crate) headers: hyper::HeaderMap,
    pub(crate) body: Bytes,
}

/// A JSON response.
pub(crate) fn json_response(status: StatusCode, value: &Value) -> Response<Body> {
    let mut response = Response::new(Full::new(Bytes::from(value.to_string())));
    *response.status_mut() = status;
    response.headers_mut().insert(
        CONTENT_TYPE,
        HeaderValue::from_static("application/json; charset=UTF-8"),
    );
    response
}

/// The JSON error response for `error`.
pub(crate) fn error_response(error: &ApiError) -> Response<Body> {
    let status = StatusCode::from_u16(error.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    json_response(status, &error.body())
}

/// 204 with no body.
pub(crate) fn no_content() -> Response<Body> {
    let mut response = Response::new(Full::new(Bytes::new()));
    *response.status_mut() = StatusCode::NO_CONTENT;
    response
}
