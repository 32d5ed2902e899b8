//! Workload identity federation for tests: Google's Security Token Service
//! token exchange, the IAM credentials API's `generateAccessToken`, and an
//! OIDC token endpoint shaped like GitHub Actions' (the `url` credential
//! source), so a client's `external_account` flow runs end to end.
//!
//! - `POST /sts/v1/token` (form) checks `grant_type` (token exchange),
//!   `requested_token_type` (access token), a known `subject_token_type`, a
//!   storage or cloud-platform `scope`, the configured `audience` and the
//!   current subject token, then grants a federated token. When a service
//!   account must be impersonated, that token is refused by the storage API.
//! - `POST /iamcredentials/v1/projects/-/serviceAccounts/SA:generateAccessToken`
//!   needs a live federated token as bearer and the configured `SA`, reads
//!   `{"scope":[…],"lifetime":"Ns"}` and answers `{accessToken, expireTime}`.
//! - `GET /oidc/token` needs the configured request token as bearer and
//!   answers `{"value": <subject token>}`.
//!
//! Token and federation requests are not in the request log.

use std::time::{Duration, SystemTime};

use hyper::{Method, Response, StatusCode};
use serde_json::{Value, json};

use crate::auth::{AuthState, Federation, OAuthForm, oauth_error, whole_seconds};
use crate::body::{Body, ReadRequest, json_response};

/// The STS token endpoint's path.
pub(crate) const STS_PATH: &str = "/sts/v1/token";
/// The IAM credentials API's service-account path prefix.
pub(crate) const IAM_PREFIX: &str = "/iamcredentials/v1/projects/-/serviceAccounts/";
const IAM_SUFFIX: &str = ":generateAccessToken";
/// The OIDC token endpoint's path (the `url` credential source).
pub(crate) const OIDC_PATH: &str = "/oidc/token";

const TOKEN_EXCHANGE: &str = "urn:ietf:params:oauth:grant-type:token-exchange";
const ACCESS_TOKEN: &str = "urn:ietf:params:oauth:token-type:access_token";
const SUBJECT_TOKEN_TYPES: [&str; 4] = [
    "urn:ietf:params:oauth:token-type:jwt",
    "urn:ietf:params:oauth:token-type:id_token",
    "urn:ietf:params:oauth:token-type:saml2",
    "urn:ietf:params:aws:token-type:aws4_request",
];
/// The longest `lifetime` generateAccessToken accepts (with the org policy
/// that allows more than an hour).
const MAX_IMPERSONATION_LIFETIME: u64 = 43_200;

/// Answers a federation request, or `None` when the path is not one.
pub(crate) fn handle(auth: &mut AuthState, request: &ReadRequest) -> Option<Response<Body>> {
    let path = request.path.as_str();
    if path == STS_PATH {
        Some(exchange(auth, request))
    } else if let Some(account) = path
        .strip_prefix(IAM_PREFIX)
        .and_then(|rest| rest.strip_suffix(IAM_SUFFIX))
    {
        let account = percent_encoding::percent_decode_str(account)
            .decode_utf8_lossy()
            .into_owned();
        Some(impersonate(auth, request, &account))
    } else if path == OIDC_PATH {
        Some(oidc_token(auth, request))
    } else {
        None
    }
}

/// `POST /sts/v1/token`: a federated token for a valid subject token.
fn exchange(auth: &mut AuthState, request: &ReadRequest) -> Response<Body> {
    let form = match OAuthForm::read(request) {
        Ok(form) => form,
        Err(refused) => return *refused,
    };
    let field = |name: &str| form.field(name).unwrap_or_default();
    if let Err((error, why)) = check_exchange(&auth.federation, field) {
        return oauth_error(StatusCode::BAD_REQUEST, error, &why);
    }
    auth.federation.exchanges += 1;
    let storage = auth.federation.service_account.is_none();
    let (token, lifetime) = auth.grant("sts", None, storage, true);
    json_response(
        StatusCode::OK,
        &json!({
            "access_token": token,
            "issued_token_type": ACCESS_TOKEN,
            "token_type": "Bearer",
            "expires_in": whole_seconds(lifetime),
        }),
    )
}

/// `Ok` when the exchange is what Google's STS accepts for the configured provider;
/// otherwise the OAuth2 error code and a description.
fn check_exchange<'a>(
    federation: &Federation,
    field: impl Fn(&str) -> &'a str,
) -> Result<(), (&'static str, String)> {
    if field("grant_type") != TOKEN_EXCHANGE {
        return Err(("unsupported_grant_type", "Invalid grant_type".to_owned()));
    }
    if field("requested_token_type") != ACCESS_TOKEN {
        return Err(("invalid_request", "Invalid requested_token_type".to_owned()));
    }
    if !SUBJECT_TOKEN_TYPES.contains(&field("subject_token_type")) {
        return Err(("invalid_request", "Invalid subject_token_type".to_owned()));
    }
    let scope = field("scope");
    if !scope.contains("devstorage") && !scope.contains("cloud-platform") {
        return Err((
            "invalid_scope",
            format!("scope {scope:?} grants no storage access"),
        ));
    }
    let audience = field("audience");
    if federation.audience.as_deref() != Some(audience) {
        return Err((
            "invalid_target",
            format!("no enabled workload identity pool provider matches the audience {audience:?}"),
        ));
    }
    let subject = field("subject_token");
    if subject.is_empty() || federation.subject_token.as_deref() != Some(subject) {
        return Err((
            "invalid_grant",
            "the subject token is not valid for this provider".to_owned(),
        ));
    }
    Ok(())
}

/// `POST …/serviceAccounts/SA:generateAccessToken`: a token of the service account.
fn impersonate(auth: &mut AuthState, request: &ReadRequest, account: &str) -> Response<Body> {
    if request.method != Method::POST {
        return google_error(StatusCode::METHOD_NOT_ALLOWED, "POST only");
    }
    if !auth.bearer(request).is_some_and(|grant| grant.federated) {
        return google_error(
            StatusCode::UNAUTHORIZED,
            "Request had invalid authentication credentials.",
        );
    }
    if auth.federation.service_account.as_deref() != Some(account) {
        return google_error(
            StatusCode::FORBIDDEN,
            &format!("Permission 'iam.serviceAccounts.getAccessToken' denied on {account:?}"),
        );
    }
    let lifetime = match read_impersonation(&request.body) {
        Ok(lifetime) => lifetime,
        Err(why) => return google_error(StatusCode::BAD_REQUEST, &why),
    };
    auth.federation.impersonations += 1;
    let (token, lifetime) = auth.grant("sa", Some(lifetime), true, false);
    let expire = crate::wire::rfc3339_millis(SystemTime::now() + lifetime);
    json_response(
        StatusCode::OK,
        &json!({ "accessToken": token, "expireTime": expire }),
    )
}

/// The requested lifetime (default 1 h) of a well-formed generateAccessToken body.
fn read_impersonation(body: &[u8]) -> Result<Duration, String> {
    let value: Value =
        serde_json::from_slice(body).map_err(|e| format!("the body is not JSON: {e}"))?;
    let scopes = value.get("scope").and_then(Value::as_array);
    let storage = scopes.is_some_and(|s| {
        s.iter()
            .filter_map(Value::as_str)
            .any(|s| s.contains("devstorage") || s.contains("cloud-platform"))
    });
    if !storage {
        return Err("scope must list a storage or cloud-platform scope".to_owned());
    }
    let Some(lifetime) = value.get("lifetime") else {
        return Ok(Duration::from_secs(3600));
    };
    let seconds = lifetime
        .as_str()
        .and_then(|l| l.strip_suffix('s'))
        .and_then(|l| l.parse::<u64>().ok())
        .filter(|s| (1..=MAX_IMPERSONATION_LIFETIME).contains(s))
        .ok_or_else(|| format!("lifetime {lifetime} is not \"Ns\" with 1 <= N <= 43200"))?;
    Ok(Duration::from_secs(seconds))
}

/// `GET /oidc/token`: the current subject token, for the configured request token.
fn oidc_token(auth: &AuthState, request: &ReadRequest) -> Response<Body> {
    let bearer = request
        .headers
        .get(hyper::header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|h| h.strip_prefix("Bearer "));
    let federation = &auth.federation;
    match (&federation.oidc_request_token, &federation.subject_token) {
        (Some(expected), Some(subject)) if bearer == Some(expected.as_str()) => {
            json_response(StatusCode::OK, &json!({ "count": 1, "value": subject }))
        }
        _ => json_response(
            StatusCode::UNAUTHORIZED,
            &json!({ "message": "Bad credentials" }),
        ),
    }
}

/// A Google API error body: `{"error":{"code","message","status"}}`.
fn google_error(status: StatusCode, message: &str) -> Response<Body> {
    let name = match status {
        StatusCode::UNAUTHORIZED => "UNAUTHENTICATED",
        StatusCode::FORBIDDEN => "PERMISSION_DENIED",
        _ => "INVALID_ARGUMENT",
    };
    json_response(
        status,
        &json!({ "error": { "code": status.as_u16(), "message": message, "status": name } }),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn federation() -> Federation {
        Federation {
            audience: Some("//iam/p".into()),
            subject_token: Some("subject".into()),
            ..Federation::default()
        }
    }

    fn good(name: &str) -> &'static str {
        match name {
            "grant_type" => TOKEN_EXCHANGE,
            "requested_token_type" => ACCESS_TOKEN,
            "subject_token_type" => SUBJECT_TOKEN_TYPES[0],
            "scope" => "https://www.googleapis.com/auth/cloud-platform",
            "audience" => "//iam/p",
            "subject_token" => "subject",
            _ => "",
        }
    }

    #[test]
    fn accepts_a_well_formed_exchange_and_refuses_each_broken_field() {
        let f = federation();
        assert!(check_exchange(&f, good).is_ok());
        for broken in [
            "grant_type",
            "requested_token_type",
            "subject_token_type",
            "scope",
            "audience",
            "subject_token",
        ] {
            let field = |name: &str| if name == broken { "x" } else { good(name) };
            assert!(check_exchange(&f, field).is_err(), "{broken}");
        }
    }

    #[test]
    fn reads_the_impersonation_lifetime() {
        let ok = br#"{"scope":["https://www.googleapis.com/auth/devstorage.read_write"],"lifetime":"600s"}"#;
        assert_eq!(read_impersonation(ok), Ok(Duration::from_secs(600)));
        for bad in [
            &br#"{"scope":[]}"#[..],
            br#"{"scope":["https://www.googleapis.com/auth/cloud-platform"],"lifetime":"0s"}"#,
            br#"{"scope":["https://www.googleapis.com/auth/cloud-platform"],"lifetime":600}"#,
            b"nope",
        ] {
            assert!(read_impersonation(bad).is_err());
        }
    }
}
