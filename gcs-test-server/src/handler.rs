//! The per-request pipeline: admin paths bypass it; API requests get the
//! injected delay and 503s, are routed, logged, and every response gets a
//! `Date` header from the server's clock, unless the reply is to be lost.

use std::fmt;
use std::sync::Arc;

use http_body_util::BodyExt;
use hyper::body::Incoming;
use hyper::header::{DATE, HeaderValue};
use hyper::{Request, Response};

use crate::body::{Body, ReadRequest};
use crate::shared::{InFlight, Shared};
use crate::{admin, auth, batch, call, federation};

/// The error that makes hyper close the connection without a reply: an injected
/// [`Fault::LoseReplies`](crate::Fault::LoseReplies).
#[derive(Debug)]
pub(crate) struct ReplyLost;

impl fmt::Display for ReplyLost {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("reply lost by an injected fault")
    }
}

impl std::error::Error for ReplyLost {}

/// Handles one request; fails at the HTTP level (closing the connection after the
/// request took effect) only when a lost reply was injected.
pub(crate) async fn handle(
    shared: Arc<Shared>,
    request: Request<Incoming>,
) -> Result<Response<Body>, ReplyLost> {
    let (parts, body) = request.into_parts();
    let body = body.collect().await.map(|b| b.to_bytes());
    let request = ReadRequest {
        method: parts.method,
        path: parts.uri.path().to_owned(),
        query: parts.uri.query().map(str::to_owned),
        headers: parts.headers,
        body: body.unwrap_or_default(),
    };
    let mut response = if request.path.starts_with(admin::PREFIX) {
        admin::handle(&shared, &request)
    } else if request.path == auth::TOKEN_PATH {
        let url = format!("{}{}", shared.base_url, auth::TOKEN_PATH);
        shared.auth().token(&request, &url)
    } else if let Some(response) = federation::handle(&mut shared.auth(), &request) {
        response
    } else {
        let response = api_request(&shared, &request).await;
        if shared.faults().take_lost_reply() {
            return Err(ReplyLost);
        }
        response
    };
    let date = httpdate::fmt_http_date(shared.clock.now());
    if let Ok(value) = HeaderValue::from_str(&date) {
        response.headers_mut().insert(DATE, value);
    }
    Ok(response)
}

async fn api_request(shared: &Shared, request: &ReadRequest) -> Response<Body> {
    let _counted = InFlight::new(shared);
    let (delay, no_batches) = {
        let faults = shared.faults();
        (faults.delay, faults.no_batches)
    };
    if let Some(delay) = delay {
        tokio::time::sleep(delay).await;
    }
    if request.path == batch::PATH && !no_batches {
        return batch::handle(shared, request).await;
    }
    call::call(shared, request)
}
