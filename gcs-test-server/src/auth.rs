//! OAuth2 for tests: a token endpoint that grants bearer tokens for a
//! service-account JWT assertion, and (when required) a bearer-token check on
//! every API request, so a client's real auth flow runs end to end.
//!
//! `POST /token` takes the form Google's endpoint takes
//! (`grant_type=urn:ietf:params:oauth:grant-type:jwt-bearer&assertion=JWT`)
//! and checks the assertion's claims: `iss`, a storage or cloud-platform
//! `scope`, `aud` equal to this endpoint's URL, and `iat < exp <= iat + 1 h`.
//! It does not verify the signature: the server never sees the public key.
//! With auth required, API requests without a granted (or allowed) bearer
//! token get GCS's 401, and so do requests with a token past its lifetime
//! (see [`AuthState::lifetime`]). Workload identity federation's endpoints
//! live in `federation.rs` and grant tokens through [`AuthState::grant`].

use std::collections::HashMap;
use std::time::{Duration, Instant};

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use hyper::{Method, Response, StatusCode};
use serde_json::{Value, json};

use crate::body::{Body, ReadRequest, json_response};
use crate::error::ApiError;

/// The token endpoint's path.
pub(crate) const TOKEN_PATH: &str = "/token";
/// How long a granted token lives by default, as Google reports it.
pub(crate) const DEFAULT_LIFETIME: Duration = Duration::from_secs(3599);
const JWT_BEARER: &str = "urn:ietf:params:oauth:grant-type:jwt-bearer";

/// What a bearer token is good for, and until when.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Grant {
    /// `None`: never expires (a token passed to `allow_token`).
    pub(crate) expires: Option<Instant>,
    /// Whether the storage API accepts it; a federated token of a pool whose
    /// principal must impersonate a service account is good only for that.
    pub(crate) storage: bool,
    /// Whether it may call the IAM credentials API (a federated token).
    pub(crate) federated: bool,
}

impl Grant {
    pub(crate) fn is_live(&self) -> bool {
        self.expires.is_none_or(|at| Instant::now() < at)
    }
}

/// Which bearer tokens the server accepts, and whether it asks for one.
#[derive(Debug)]
pub(crate) struct AuthState {
    pub(crate) required: bool,
    pub(crate) tokens: HashMap<String, Grant>,
    /// Tokens granted by `POST /token` (service-account keys).
    pub(crate) granted: u64,
    /// Every token granted by any endpoint, for unique names.
    pub(crate) sequence: u64,
    /// The lifetime of tokens granted from now on.
    pub(crate) lifetime: Duration,
    pub(crate) federation: Federation,
}

/// The workload identity pool provider the server trusts, and counters (the endpoints
/// in `federation.rs` read and count with it).
#[derive(Debug, Default)]
pub(crate) struct Federation {
    pub(crate) audience: Option<String>,
    pub(crate) subject_token: Option<String>,
    pub(crate) service_account: Option<String>,
    pub(crate) oidc_request_token: Option<String>,
    pub(crate) exchanges: u64,
    pub(crate) impersonations: u64,
}

impl Default for AuthState {
    fn default() -> Self {
        Self {
            required: false,
            tokens: HashMap::new(),
            granted: 0,
            sequence: 0,
            lifetime: DEFAULT_LIFETIME,
            federation: Federation::default(),
        }
    }
}

impl AuthState {
    /// Grants a fresh token named `kind-N` living `lifetime` (capped by the
    /// server's), and returns it with that lifetime.
    pub(crate) fn grant(
        &mut self,
        kind: &str,
        lifetime: Option<Duration>,
        storage: bool,
        federated: bool,
    ) -> (String, Duration) {
        self.sequence += 1;
        let token = format!("gcs-test-{kind}-{}", self.sequence);
        let lifetime = lifetime.map_or(self.lifetime, |l| l.min(self.lifetime));
        let grant = Grant {
            expires: Some(Instant::now() + lifetime),
            storage,
            federated,
        };
        self.tokens.insert(token.clone(), grant);
        (token, lifetime)
    }

    /// The live grant of `Authorization: Bearer <token>`, if any.
    pub(crate) fn bearer(&self, request: &ReadRequest) -> Option<Grant> {
        let token = request
            .headers
            .get(hyper::header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(|h| h.strip_prefix("Bearer "))?;
        self.tokens.get(token).copied().filter(Grant::is_live)
    }

    /// `Ok` when the request may proceed; GCS's 401 otherwise.
    pub(crate) fn check(&self, request: &ReadRequest) -> Result<(), ApiError> {
        if !self.required {
            return Ok(());
        }
        let header = request
            .headers
            .get(hyper::header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok());
        match header.and_then(|h| h.strip_prefix("Bearer ")) {
            None => Err(ApiError::anonymous_caller()),
            Some(token)
                if self
                    .tokens
                    .get(token)
                    .is_some_and(|g| g.storage && g.is_live()) =>
            {
                Ok(())
            }
            Some(_) => Err(ApiError::invalid_credentials()),
        }
    }

    /// Answers `POST /token`: grants a fresh token for a well-formed assertion.
    pub(crate) fn token(&mut self, request: &ReadRequest, token_url: &str) -> Response<Body> {
        let form = match OAuthForm::read(request) {
            Ok(form) => form,
            Err(refused) => return *refused,
        };
        let field = |name: &str| form.field(name);
        if field("grant_type") != Some(JWT_BEARER) {
            return oauth_error(
                StatusCode::BAD_REQUEST,
                "unsupported_grant_type",
                "Invalid grant_type",
            );
        }
        let checked = field("assertion").map(|a| check_claims(a, token_url));
        match checked {
            Some(Ok(())) => {}
            Some(Err(why)) => return oauth_error(StatusCode::BAD_REQUEST, "invalid_grant", &why),
            None => {
                return oauth_error(
                    StatusCode::BAD_REQUEST,
                    "invalid_request",
                    "Missing assertion",
                );
            }
        }
        self.granted += 1;
        let (token, lifetime) = self.grant("token", None, true, false);
        json_response(
            StatusCode::OK,
            &json!({ "access_token": token, "expires_in": whole_seconds(lifetime), "token_type": "Bearer" }),
        )
    }
}

/// `Ok` when the assertion's claims are what Google's endpoint requires.
fn check_claims(assertion: &str, token_url: &str) -> Result<(), String> {
    let mut parts = assertion.split('.');
    let (Some(_header), Some(payload), Some(_signature), None) =
        (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return Err("the assertion is not a signed JWT (header.payload.signature)".to_owned());
    };
    let bytes = URL_SAFE_NO_PAD
        .decode(payload.trim_end_matches('='))
        .map_err(|e| format!("the JWT payload is not base64url: {e}"))?;
    let claims: Value =
        serde_json::from_slice(&bytes).map_err(|e| format!("the JWT payload is not JSON: {e}"))?;
    let text = |key: &str| claims.get(key).and_then(Value::as_str).unwrap_or_default();
    let number = |key: &str| claims.get(key).and_then(Value::as_u64);
    if text("iss").is_empty() {
        return Err("the JWT has no iss claim".to_owned());
    }
    let scope = text("scope");
    if !scope.contains("devstorage") && !scope.contains("cloud-platform") {
        return Err(format!("scope {scope:?} grants no storage access"));
    }
    if text("aud") != token_url {
        return Err(format!("aud {:?} is not {token_url:?}", text("aud")));
    }
    match (number("iat"), number("exp")) {
        (Some(iat), Some(exp)) if iat < exp && exp <= iat + 3600 => Ok(()),
        _ => Err("iat and exp must satisfy iat < exp <= iat + 3600".to_owned()),
    }
}

/// A lifetime as OAuth2's `expires_in`: whole seconds, at least 1.
pub(crate) fn whole_seconds(lifetime: Duration) -> u64 {
    lifetime.as_secs().max(1)
}

/// An OAuth2 error reply: `{"error","error_description"}`.
/// The fields of an OAuth2 token request (`application/x-www-form-urlencoded`), for both
/// token endpoints.
pub(crate) struct OAuthForm(Vec<(String, String)>);

impl OAuthForm {
    /// The form of a `POST`; the OAuth2 error reply for any other method.
    pub(crate) fn read(request: &ReadRequest) -> Result<Self, Box<Response<Body>>> {
        if request.method != Method::POST {
            return Err(Box::new(oauth_error(
                StatusCode::METHOD_NOT_ALLOWED,
                "invalid_request",
                "POST only",
            )));
        }
        Ok(Self(
            form_urlencoded::parse(&request.body)
                .map(|(k, v)| (k.into_owned(), v.into_owned()))
                .collect(),
        ))
    }

    /// The first value of `name`, if sent.
    pub(crate) fn field(&self, name: &str) -> Option<&str> {
        self.0
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    }
}

pub(crate) fn oauth_error(status: StatusCode, error: &str, description: &str) -> Response<Body> {
    json_response(
        status,
        &json!({ "error": error, "error_description": description }),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    const URL: &str = "http://127.0.0.1:1/token";

    fn jwt(claims: &Value) -> String {
        let payload = URL_SAFE_NO_PAD.encode(claims.to_string());
        format!("e30.{payload}.c2ln")
    }

    fn good() -> Value {
        json!({
            "iss": "sa@p.iam.gserviceaccount.com",
            "scope": "https://www.googleapis.com/auth/devstorage.read_write",
            "aud": URL, "iat": 1000, "exp": 4600
        })
    }

    #[test]
    fn accepts_a_well_formed_assertion() {
        assert!(check_claims(&jwt(&good()), URL).is_ok());
    }

    #[test]
    fn rejects_each_broken_claim() {
        for (key, value) in [
            ("iss", json!("")),
            ("scope", json!("https://www.googleapis.com/auth/bigquery")),
            ("aud", json!("https://oauth2.googleapis.com/token")),
            ("exp", json!(999)),
            ("exp", json!(4601)),
        ] {
            let mut c = good();
            c[key] = value;
            assert!(check_claims(&jwt(&c), URL).is_err(), "{key}");
        }
        assert!(check_claims("only.two", URL).is_err());
        assert!(check_claims("a.!!!.c", URL).is_err());
    }
}
