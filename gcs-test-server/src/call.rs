//! One API call, on its own or as a part of a batch: the injected 503, the auth check,
//! the endpoint, the log.

use std::sync::PoisonError;

use hyper::Response;

use crate::api;
use crate::body::{Body, ReadRequest, error_response};
use crate::error::ApiError;
use crate::shared::{RequestRecord, Shared};

/// One API call, on its own or as a part of a batch: an injected 503, else the auth
/// check, else the endpoint; logged with the status it got.
pub(crate) fn call(shared: &Shared, request: &ReadRequest) -> Response<Body> {
    let fail = shared.faults().take_server_error();
    let denied = shared.auth().check(request).err();
    let response = if fail {
        error_response(&ApiError::backend_error())
    } else if let Some(denied) = denied {
        error_response(&denied)
    } else {
        api::route(shared, request)
    };
    log(shared, request, response.status().as_u16());
    response
}

/// Appends one call to the request log.
pub(crate) fn log(shared: &Shared, request: &ReadRequest, status: u16) {
    let record = RequestRecord {
        method: request.method.to_string(),
        path: request.path.clone(),
        query: request.query.clone(),
        status,
    };
    shared
        .log
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .push(record);
}
