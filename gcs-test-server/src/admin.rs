//! The admin paths under `/_test/`, for a harness that runs the server as a
//! separate process (the conformance hooks): they set faults and the clock
//! and read the request log. They bypass faults and are not logged.
//!
//! - `POST /_test/faults` with any of `{"serverErrors": N, "rateLimitMs": N,
//!   "delayMs": N, "clockOffsetMs": ±N}`; `rateLimitMs`/`delayMs` of 0 turn
//!   that fault off.
//! - `DELETE /_test/faults`: clear every fault (not the clock offset).
//! - `GET /_test/requests`: the request log as a JSON array of
//!   `{"method","path","query","status"}`; `DELETE /_test/requests` clears it.

use std::time::Duration;

use hyper::{Method, Response, StatusCode};
use serde_json::{Value, json};

use crate::body::{Body, ReadRequest, error_response, json_response, no_content};
use crate::error::ApiError;
use crate::fault::{ClockOffset, Fault};
use crate::shared::Shared;

/// Every admin path starts with this.
pub(crate) const PREFIX: &str = "/_test/";

/// Handles an admin request.
pub(crate) fn handle(shared: &Shared, request: &ReadRequest) -> Response<Body> {
    let outcome = match (&request.method, &request.path[PREFIX.len()..]) {
        (&Method::POST, "faults") => set_faults(shared, &request.body),
        (&Method::DELETE, "faults") => {
            shared.clear_faults();
            Ok(no_content())
        }
        (&Method::GET, "requests") => {
            let log: Vec<Value> = shared
                .requests()
                .iter()
                .map(|r| json!(r.to_json()))
                .collect();
            Ok(json_response(StatusCode::OK, &Value::Array(log)))
        }
        (&Method::DELETE, "requests") => {
            shared.clear_requests();
            Ok(no_content())
        }
        (method, _) => Err(ApiError::not_routed(method.as_str(), &request.path)),
    };
    outcome.unwrap_or_else(|e| error_response(&e))
}

fn set_faults(shared: &Shared, body: &[u8]) -> Result<Response<Body>, ApiError> {
    let fields: Value = serde_json::from_slice(body)
        .map_err(|e| ApiError::bad_request(format!("invalid JSON: {e}")))?;
    let number = |key: &str| -> Result<Option<i64>, ApiError> {
        match fields.get(key) {
            None => Ok(None),
            Some(v) => v
                .as_i64()
                .map(Some)
                .ok_or_else(|| ApiError::bad_request(format!("{key} must be an integer"))),
        }
    };
    let millis = |n: i64| Duration::from_millis(n.unsigned_abs());
    if let Some(count) = number("serverErrors")? {
        let count =
            u32::try_from(count).map_err(|_| ApiError::bad_request("serverErrors out of range"))?;
        shared.inject(Fault::ServerErrors { count });
    }
    if let Some(count) = number("lostReplies")? {
        let count =
            u32::try_from(count).map_err(|_| ApiError::bad_request("lostReplies out of range"))?;
        shared.inject(Fault::LoseReplies { count });
    }
    match fields.get("noBatches") {
        None | Some(Value::Bool(false)) => {}
        Some(Value::Bool(true)) => shared.inject(Fault::NoBatches),
        Some(_) => return Err(ApiError::bad_request("noBatches must be true or false")),
    }
    if let Some(count) = number("batchErrors")? {
        let count =
            u32::try_from(count).map_err(|_| ApiError::bad_request("batchErrors out of range"))?;
        let status = match number("batchErrorStatus")? {
            None => 503,
            Some(code @ 400..=599) => u16::try_from(code).unwrap_or(503),
            Some(_) => return Err(ApiError::bad_request("batchErrorStatus must be 400-599")),
        };
        shared.inject(Fault::BatchErrors { count, status });
    }
    if let Some(count) = number("cutBatchReplies")? {
        let count = u32::try_from(count)
            .map_err(|_| ApiError::bad_request("cutBatchReplies out of range"))?;
        shared.inject(Fault::CutBatchReplies { count });
    }
    if let Some(ms) = number("rateLimitMs")? {
        shared.set_rate_limit((ms > 0).then(|| millis(ms)));
    }
    if let Some(ms) = number("delayMs")? {
        shared.set_delay((ms > 0).then(|| millis(ms)));
    }
    if let Some(ms) = number("clockOffsetMs")? {
        shared.clock.set(ClockOffset::from_millis(ms));
    }
    Ok(no_content())
}
