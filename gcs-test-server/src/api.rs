//! The JSON-API endpoints: routing and one function per endpoint.

use std::sync::{MutexGuard, PoisonError};

use hyper::header::{CONTENT_TYPE, HeaderValue};
use hyper::{Method, Response, StatusCode};
use percent_encoding::percent_decode_str;
use serde_json::json;

use crate::body::{Body, ReadRequest, error_response, json_response, no_content};
use crate::error::ApiError;
use crate::multipart;
use crate::object::NewObject;
use crate::precondition::Preconditions;
use crate::query::Query;
use crate::shared::Shared;
use crate::store::Store;
use crate::wire;

/// What a request path names.
#[derive(Debug, PartialEq, Eq)]
enum Target {
    Buckets,
    Bucket(String),
    Objects(String),
    Object(String, String),
    Upload(String),
    Download(String, String),
}

/// Routes an API request and renders its outcome.
pub(crate) fn route(shared: &Shared, request: &ReadRequest) -> Response<Body> {
    let query = Query::parse(request.query.as_deref());
    let outcome = match (&request.method, target(&request.path)) {
        (&Method::POST, Some(Target::Buckets)) => create_bucket(shared, request),
        (&Method::GET, Some(Target::Bucket(b))) => get_bucket(shared, &b),
        (&Method::GET, Some(Target::Objects(b))) => list(shared, &b, &query),
        (&Method::POST, Some(Target::Upload(b))) => insert(shared, &b, request, &query),
        (&Method::GET, Some(Target::Object(b, o))) => get(shared, &b, &o, &query),
        (&Method::GET, Some(Target::Download(b, o))) => media(shared, &b, &o, &query),
        (&Method::PATCH, Some(Target::Object(b, o))) => patch(shared, &b, &o, request, &query),
        (&Method::DELETE, Some(Target::Object(b, o))) => delete(shared, &b, &o, &query),
        (method, _) => Err(ApiError::not_routed(method.as_str(), &request.path)),
    };
    outcome.unwrap_or_else(|e| error_response(&e))
}

fn target(path: &str) -> Option<Target> {
    let decode = |s: &str| percent_decode_str(s).decode_utf8_lossy().into_owned();
    if path == "/storage/v1/b" {
        return Some(Target::Buckets);
    }
    if let Some(rest) = path.strip_prefix("/upload/storage/v1/b/") {
        let bucket = rest.strip_suffix("/o")?;
        return Some(Target::Upload(decode(bucket)));
    }
    if let Some(rest) = path.strip_prefix("/download/storage/v1/b/") {
        let (bucket, object) = rest.split_once("/o/")?;
        return Some(Target::Download(decode(bucket), decode(object)));
    }
    let rest = path.strip_prefix("/storage/v1/b/")?;
    Some(match rest.split_once("/o") {
        None => Target::Bucket(decode(rest)),
        Some((bucket, "")) => Target::Objects(decode(bucket)),
        Some((bucket, object)) => Target::Object(decode(bucket), decode(object.strip_prefix('/')?)),
    })
}

fn store(shared: &Shared) -> MutexGuard<'_, Store> {
    shared.store.lock().unwrap_or_else(PoisonError::into_inner)
}

fn create_bucket(shared: &Shared, request: &ReadRequest) -> Result<Response<Body>, ApiError> {
    let body: serde_json::Value = serde_json::from_slice(&request.body)
        .map_err(|e| ApiError::bad_request(format!("invalid bucket JSON: {e}")))?;
    let name = body["name"]
        .as_str()
        .filter(|n| !n.is_empty())
        .ok_or_else(|| ApiError::bad_request("bucket name is required"))?;
    let now = shared.clock.now();
    store(shared).create_bucket(name, now)?;
    Ok(json_response(
        StatusCode::OK,
        &wire::bucket_json(name, now, &shared.base_url),
    ))
}

fn get_bucket(shared: &Shared, bucket: &str) -> Result<Response<Body>, ApiError> {
    let created = store(shared).bucket(bucket)?;
    Ok(json_response(
        StatusCode::OK,
        &wire::bucket_json(bucket, created, &shared.base_url),
    ))
}

/// The most items one list page holds: GCS uses `maxResults` "or 1,000 items, whichever
/// is smaller".
pub(crate) const MAX_LIST_PAGE: usize = 1000;

/// List parameters GCS has that this server does not implement: refused with 400 rather
/// than ignored, so a client relying on one never gets a silently wrong answer.
const UNSUPPORTED_LIST_PARAMETERS: [&str; 7] = [
    "delimiter",
    "startOffset",
    "endOffset",
    "matchGlob",
    "includeTrailingDelimiter",
    "includeFoldersAsPrefixes",
    "softDeleted",
];

/// `objects.list`: `prefix` (byte-wise, no pattern characters), `maxResults`, `pageToken`
/// and `projection`; sorted by name, `items` left out when empty, `nextPageToken` only
/// when more items follow.
fn list(shared: &Shared, bucket: &str, query: &Query) -> Result<Response<Body>, ApiError> {
    if let Some(unsupported) = UNSUPPORTED_LIST_PARAMETERS
        .iter()
        .find(|p| query.get(p).is_some())
    {
        return Err(ApiError::bad_request(format!(
            "gcs-test-server does not implement the list parameter {unsupported}"
        )));
    }
    if query.get("versions").is_some_and(|v| v != "false") {
        return Err(ApiError::bad_request(
            "gcs-test-server keeps no versions (versions=true)",
        ));
    }
    match query.get("projection") {
        None | Some("full" | "noAcl") => {}
        Some(other) => {
            return Err(ApiError::bad_request(format!(
                "Invalid value for projection: {other:?}"
            )));
        }
    }
    let max = match query.get("maxResults") {
        None => MAX_LIST_PAGE,
        Some(text) => match text.parse::<u32>() {
            // An unset proto3 integer is 0: the default page.
            Ok(0) => MAX_LIST_PAGE,
            Ok(n) => usize::try_from(n)
                .unwrap_or(MAX_LIST_PAGE)
                .min(MAX_LIST_PAGE),
            Err(_) => {
                return Err(ApiError::bad_request(format!(
                    "Invalid value for maxResults: {text:?}"
                )));
            }
        },
    };
    // An empty token is no token, as for any unset string parameter.
    let token = query.get("pageToken").filter(|t| !t.is_empty());
    let after = token.map(page_token_name).transpose()?;
    let prefix = query.get("prefix").unwrap_or("");
    let (objects, more) = store(shared).list(bucket, prefix, after.as_deref(), max)?;
    let mut body = json!({ "kind": "storage#objects" });
    if let (true, Some(last)) = (more, objects.last()) {
        body["nextPageToken"] = json!(page_token(&last.name));
    }
    if !objects.is_empty() {
        let items = objects
            .iter()
            .map(|o| wire::object_json(o, &shared.base_url));
        body["items"] = items.collect();
    }
    Ok(json_response(StatusCode::OK, &body))
}

/// The opaque continuation token naming the last object of a page.
fn page_token(last: &str) -> String {
    use base64::Engine as _;
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(format!("after:{last}"))
}

/// The last object name a page token stands for; 400 for a token this server never made.
fn page_token_name(token: &str) -> Result<String, ApiError> {
    use base64::Engine as _;
    base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(token)
        .ok()
        .and_then(|bytes| String::from_utf8(bytes).ok())
        .and_then(|text| text.strip_prefix("after:").map(str::to_owned))
        .ok_or_else(|| ApiError::bad_request("Invalid page token"))
}

/// `200 OK` with the object's JSON resource.
fn object_ok(shared: &Shared, object: &crate::object::Object) -> Response<Body> {
    json_response(StatusCode::OK, &wire::object_json(object, &shared.base_url))
}

fn insert(
    shared: &Shared,
    bucket: &str,
    request: &ReadRequest,
    query: &Query,
) -> Result<Response<Body>, ApiError> {
    let pre = Preconditions::from_query(query)?;
    let new = new_object(request, query)?;
    let now = shared.clock.now();
    let object = store(shared).insert(bucket, new, pre, now)?;
    Ok(object_ok(shared, &object))
}

/// The object an upload describes: `uploadType=media` takes the name from
/// the query and the body as content; `multipart` reads the JSON part.
fn new_object(request: &ReadRequest, query: &Query) -> Result<NewObject, ApiError> {
    let header_type = request
        .headers
        .get(CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default();
    let mut new = NewObject {
        name: query.get("name").unwrap_or_default().to_owned(),
        ..NewObject::default()
    };
    match query.get("uploadType") {
        Some("media") => {
            new.data = request.body.clone();
            new.content_type = Some(header_type)
                .filter(|t| !t.is_empty())
                .map(str::to_owned);
        }
        Some("multipart") => {
            let parts = multipart::parts(
                &request.body,
                &multipart::boundary(header_type, "multipart/related", "uploadType=multipart")?,
            )?;
            let [metadata, media] = parts.as_slice() else {
                return Err(ApiError::bad_request(
                    "multipart upload needs exactly two parts",
                ));
            };
            new.content_type = media.content_type.clone();
            wire::read_insert_metadata(&metadata.body, &mut new)?;
            new.data = media.body.clone();
        }
        other => {
            let message = format!("unsupported uploadType {other:?} (media and multipart are)");
            return Err(ApiError::bad_request(message));
        }
    }
    if new.name.is_empty() {
        return Err(ApiError::bad_request("Required: object name"));
    }
    Ok(new)
}

fn get(
    shared: &Shared,
    bucket: &str,
    name: &str,
    query: &Query,
) -> Result<Response<Body>, ApiError> {
    if query.get("alt") == Some("media") {
        return media(shared, bucket, name, query);
    }
    let pre = Preconditions::from_query(query)?;
    let object = store(shared).get(bucket, name, pre)?;
    Ok(object_ok(shared, &object))
}

fn media(
    shared: &Shared,
    bucket: &str,
    name: &str,
    query: &Query,
) -> Result<Response<Body>, ApiError> {
    let pre = Preconditions::from_query(query)?;
    let object = store(shared).get(bucket, name, pre)?;
    let mut response = Response::new(Body::new(object.data.clone()));
    let headers = response.headers_mut();
    let typed = HeaderValue::from_str(&object.content_type);
    headers.insert(
        CONTENT_TYPE,
        typed.unwrap_or(HeaderValue::from_static("application/octet-stream")),
    );
    headers.insert("x-goog-generation", HeaderValue::from(object.generation));
    headers.insert(
        "x-goog-metageneration",
        HeaderValue::from(object.metageneration),
    );
    if let Some(cache_control) = object
        .cache_control
        .as_deref()
        .and_then(|c| HeaderValue::from_str(c).ok())
    {
        headers.insert(hyper::header::CACHE_CONTROL, cache_control);
    }
    Ok(response)
}

fn patch(
    shared: &Shared,
    bucket: &str,
    name: &str,
    request: &ReadRequest,
    query: &Query,
) -> Result<Response<Body>, ApiError> {
    let pre = Preconditions::from_query(query)?;
    let patch = wire::read_patch(&request.body)?;
    let now = shared.clock.now();
    let object = store(shared).patch(bucket, name, patch, pre, now)?;
    Ok(object_ok(shared, &object))
}

fn delete(
    shared: &Shared,
    bucket: &str,
    name: &str,
    query: &Query,
) -> Result<Response<Body>, ApiError> {
    let pre = Preconditions::from_query(query)?;
    store(shared).delete(bucket, name, pre)?;
    Ok(no_content())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn page_tokens_round_trip_and_reject_strangers() {
        for name in ["", "locks/a", "a%/x?&=+ #[*]", "ünï"] {
            assert_eq!(page_token_name(&page_token(name)).unwrap(), name);
        }
        for bad in ["!!", "bm90IGEgdG9rZW4"] {
            assert_eq!(page_token_name(bad).unwrap_err().status, 400, "{bad}");
        }
    }

    #[test]
    fn routes_encoded_object_names() {
        let t = |p: &str| target(p);
        assert_eq!(t("/storage/v1/b"), Some(Target::Buckets));
        assert_eq!(t("/storage/v1/b/bk"), Some(Target::Bucket("bk".into())));
        assert_eq!(t("/storage/v1/b/bk/o"), Some(Target::Objects("bk".into())));
        assert_eq!(
            t("/storage/v1/b/bk/o/locks%2Fa%20b"),
            Some(Target::Object("bk".into(), "locks/a b".into()))
        );
        assert_eq!(
            t("/upload/storage/v1/b/bk/o"),
            Some(Target::Upload("bk".into()))
        );
        assert_eq!(t("/elsewhere"), None);
    }
}
