//! GCS-shaped API errors: a status, a reason and a message, rendered as
//! `{"error":{"code":…,"message":…,"errors":[{…}]}}` like the JSON API.

use serde_json::{Value, json};

/// One failed request, as the JSON API reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ApiError {
    pub(crate) status: u16,
    pub(crate) reason: &'static str,
    pub(crate) message: String,
}

impl ApiError {
    fn new(status: u16, reason: &'static str, message: impl Into<String>) -> Self {
        Self {
            status,
            reason,
            message: message.into(),
        }
    }

    /// 404 for a missing object, with GCS's message.
    pub(crate) fn no_such_object(bucket: &str, name: &str) -> Self {
        Self::new(404, "notFound", format!("No such object: {bucket}/{name}"))
    }

    /// 404 for a missing bucket, with GCS's message.
    pub(crate) fn no_such_bucket() -> Self {
        Self::new(404, "notFound", "The specified bucket does not exist.")
    }

    /// 412: a precondition parameter did not hold.
    pub(crate) fn precondition_failed() -> Self {
        Self::new(
            412,
            "conditionNotMet",
            "At least one of the pre-conditions you specified did not hold.",
        )
    }

    /// 400 with a message naming what was wrong.
    pub(crate) fn bad_request(message: impl Into<String>) -> Self {
        Self::new(400, "invalid", message)
    }

    /// 409 for creating a bucket that exists.
    pub(crate) fn bucket_conflict() -> Self {
        Self::new(
            409,
            "conflict",
            "Your previous request to create the named bucket succeeded and you already own it.",
        )
    }

    /// 429: the per-object mutation rate limit was exceeded.
    pub(crate) fn rate_limited() -> Self {
        Self::new(
            429,
            "rateLimitExceeded",
            "The object exceeded the rate limit for object mutation operations \
             (create, update, and delete). Please reduce your request rate. \
             See https://cloud.google.com/storage/docs/gcs429.",
        )
    }

    /// 401 for a request without a bearer token, with GCS's message.
    pub(crate) fn anonymous_caller() -> Self {
        Self::new(
            401,
            "required",
            "Anonymous caller does not have storage.objects access to the Google Cloud Storage object.",
        )
    }

    /// 401 for a bearer token the server never granted.
    pub(crate) fn invalid_credentials() -> Self {
        Self::new(401, "authError", "Invalid Credentials")
    }

    /// 503: an injected server error.
    pub(crate) fn backend_error() -> Self {
        Self::new(503, "backendError", "Backend Error")
    }

    /// An injected failure of a whole batch request with `status`.
    pub(crate) fn batch_refused(status: u16) -> Self {
        Self::new(status, "batchRefused", format!("Batch refused ({status})"))
    }

    /// 404 for a path the server does not route.
    pub(crate) fn not_routed(method: &str, path: &str) -> Self {
        Self::new(404, "notFound", format!("Not Found: {method} {path}"))
    }

    /// The JSON body GCS sends with this error.
    pub(crate) fn body(&self) -> Value {
        let mut detail = json!({
            "domain": "global",
            "reason": self.reason,
            "message": self.message,
        });
        if self.status == 412 {
            detail["locationType"] = json!("header");
            detail["location"] = json!("If-Match");
        }
        json!({
            "error": {
                "code": self.status,
                "message": self.message,
                "errors": [detail],
            }
        })
    }
}
