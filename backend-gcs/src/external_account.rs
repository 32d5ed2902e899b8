//! Workload identity federation: an `external_account` credential file (as written by
//! `google-github-actions/auth` or `gcloud iam workload-identity-pools create-cred-config`).
//!
//! Each renewal reads the subject token again (from its file, which may rotate, or from its
//! URL), exchanges it at the Security Token Service (`token_url`) for a federated token,
//! and, when the file names `service_account_impersonation_url`, exchanges that for a
//! service account's token with IAM credentials' `generateAccessToken`. Every endpoint must
//! be `https`, or `http` to a loopback host (a token must not travel in clear).

use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use lockcore::{Error, ErrorKind, Result};
use reqwest::header::{HeaderMap, HeaderName, HeaderValue};
use serde_json::{Map, Value, json};
use url::Url;

use crate::body::Unread;
use crate::error::{broken_reply, missing_fields, refused, unreachable};
use crate::token::{Fresh, STORAGE_SCOPE};

const DEFAULT_TOKEN_URL: &str = "https://sts.googleapis.com/v1/token";
const TOKEN_EXCHANGE: &str = "urn:ietf:params:oauth:grant-type:token-exchange";
const ACCESS_TOKEN: &str = "urn:ietf:params:oauth:token-type:access_token";
const CLOUD_PLATFORM: &str = "https://www.googleapis.com/auth/cloud-platform";
/// The impersonated token's default lifetime, and the range Google accepts.
const DEFAULT_LIFETIME: u64 = 3600;
const LIFETIMES: std::ops::RangeInclusive<u64> = 600..=43_200;

/// Where the subject token comes from.
enum SubjectSource {
    File(PathBuf),
    Url { url: Url, headers: HeaderMap },
}

/// A parsed `external_account` file. Holds no token; the URL source's headers may hold
/// one, so there is no `Debug`.
pub(crate) struct ExternalAccount {
    audience: String,
    subject_token_type: String,
    token_url: Url,
    source: SubjectSource,
    /// `format.subject_token_field_name` when the source's format is `json`.
    json_field: Option<String>,
    impersonation: Option<(Url, u64)>,
    client: Option<(String, String)>,
    user_project: Option<String>,
}

impl ExternalAccount {
    /// Reads an `external_account` file's JSON (`path` only names it in errors).
    ///
    /// # Errors
    /// [`Config`](ErrorKind::Config) naming the first missing or malformed field, or an
    /// endpoint that is plain `http` to a host other than loopback.
    pub(crate) fn parse(path: &Path, file: &Map<String, Value>) -> Result<Self> {
        let field = Fields { path, file };
        let source = field.object("credential_source")?;
        let impersonation = match field.optional_str("service_account_impersonation_url")? {
            None => None,
            Some(url) => Some((
                field.endpoint("service_account_impersonation_url", url)?,
                field.lifetime()?,
            )),
        };
        let client = match field.optional_str("client_id")? {
            Some(id) => Some((
                id.to_owned(),
                field
                    .optional_str("client_secret")?
                    .unwrap_or_default()
                    .to_owned(),
            )),
            None => None,
        };
        Ok(Self {
            audience: field.required_str("audience")?.to_owned(),
            subject_token_type: field.required_str("subject_token_type")?.to_owned(),
            token_url: field.endpoint(
                "token_url",
                field
                    .optional_str("token_url")?
                    .unwrap_or(DEFAULT_TOKEN_URL),
            )?,
            source: field.source(source)?,
            json_field: field.json_field(source)?,
            impersonation,
            client,
            user_project: field
                .optional_str("workforce_pool_user_project")?
                .map(str::to_owned),
        })
    }

    /// A fresh access token: subject token → STS → (optionally) impersonation.
    pub(crate) async fn fetch(&self, http: &reqwest::Client) -> Result<Fresh> {
        let subject = self.subject_token(http).await?;
        let federated = self.exchange(http, &subject).await?;
        match &self.impersonation {
            None => Ok(federated),
            Some((url, lifetime)) => impersonate(http, url, *lifetime, &federated.token).await,
        }
    }

    async fn subject_token(&self, http: &reqwest::Client) -> Result<String> {
        let text = match &self.source {
            SubjectSource::File(path) => {
                let bytes = crate::body::read_small_file(path).map_err(|e| {
                    Error::new(
                        ErrorKind::Config,
                        format!(
                            "cannot read the subject token file {} (credential_source.file): {e}",
                            path.display()
                        ),
                    )
                })?;
                String::from_utf8_lossy(&bytes).into_owned()
            }
            SubjectSource::Url { url, headers } => {
                let reply = http.get(url.clone()).headers(headers.clone()).send().await;
                let body =
                    answer(reply, "the subject token URL (credential_source.url)", &[]).await?;
                String::from_utf8_lossy(&body).into_owned()
            }
        };
        let token = match &self.json_field {
            None => text.trim().to_owned(),
            Some(name) => serde_json::from_str::<Value>(&text)
                .ok()
                .and_then(|v| v.get(name).and_then(Value::as_str).map(str::to_owned))
                .ok_or_else(|| {
                    Error::new(
                        ErrorKind::Config,
                        format!(
                            "the subject token is not JSON with a string field {name:?} \
                             (credential_source.format.subject_token_field_name)"
                        ),
                    )
                })?,
        };
        if token.is_empty() {
            return Err(Error::unavailable(
                "the subject token (credential_source) is empty",
            ));
        }
        Ok(token)
    }

    async fn exchange(&self, http: &reqwest::Client, subject: &str) -> Result<Fresh> {
        let scope = if self.impersonation.is_some() {
            CLOUD_PLATFORM
        } else {
            STORAGE_SCOPE
        };
        let mut form = vec![
            ("grant_type", TOKEN_EXCHANGE.to_owned()),
            ("audience", self.audience.clone()),
            ("scope", scope.to_owned()),
            ("requested_token_type", ACCESS_TOKEN.to_owned()),
            ("subject_token", subject.to_owned()),
            ("subject_token_type", self.subject_token_type.clone()),
        ];
        if let Some(project) = &self.user_project {
            form.push(("options", json!({ "userProject": project }).to_string()));
        }
        let body = url::form_urlencoded::Serializer::new(String::new())
            .extend_pairs(&form)
            .finish();
        let mut request = http
            .post(self.token_url.clone())
            .header(
                reqwest::header::CONTENT_TYPE,
                "application/x-www-form-urlencoded",
            )
            .body(body);
        if let Some((id, secret)) = &self.client {
            request = request.basic_auth(id, Some(secret));
        }
        let what = format!(
            "the STS token exchange for audience {:?} (check audience, subject_token_type and \
             the provider's attribute condition)",
            self.audience
        );
        let body = answer(request.send().await, &what, &[subject]).await?;
        let value: Value = serde_json::from_slice(&body).unwrap_or_default();
        let token = value.get("access_token").and_then(Value::as_str);
        let life = value.get("expires_in").and_then(Value::as_u64);
        match (token, life) {
            (Some(token), Some(life)) => Ok(Fresh {
                token: token.to_owned(),
                life: Duration::from_secs(life),
            }),
            _ => Err(missing_fields(
                "the STS token exchange",
                "access_token and expires_in",
            )),
        }
    }
}

/// Exchanges a federated token for the service account's token.
async fn impersonate(
    http: &reqwest::Client,
    url: &Url,
    lifetime: u64,
    federated: &str,
) -> Result<Fresh> {
    let request = http
        .post(url.clone())
        .bearer_auth(federated)
        .json(&json!({ "scope": [STORAGE_SCOPE], "lifetime": format!("{lifetime}s") }));
    let what = "impersonating the service account (service_account_impersonation_url; the \
                pool's principal needs roles/iam.workloadIdentityUser on it)";
    let body = answer(request.send().await, what, &[federated]).await?;
    let value: Value = serde_json::from_slice(&body).unwrap_or_default();
    let token = value.get("accessToken").and_then(Value::as_str);
    let expires = value
        .get("expireTime")
        .and_then(Value::as_str)
        .and_then(crate::object::parse_rfc3339);
    match (token, expires) {
        (Some(token), Some(expires)) => Ok(Fresh {
            token: token.to_owned(),
            // Counted on our clock, and never more than was asked for.
            life: expires
                .duration_since(SystemTime::now())
                .unwrap_or_default()
                .min(Duration::from_secs(lifetime)),
        }),
        _ => Err(missing_fields(
            "generateAccessToken",
            "accessToken and expireTime",
        )),
    }
}

/// The body of a 2xx reply; a classified error naming `what` otherwise, its server
/// message shortened and scrubbed of `secrets` ([`refused`]).
async fn answer(
    reply: reqwest::Result<reqwest::Response>,
    what: &str,
    secrets: &[&str],
) -> Result<Vec<u8>> {
    let response = reply.map_err(|e| unreachable(what, e))?;
    let status = response.status();
    match crate::body::read(response, crate::body::TOKEN).await {
        Ok(body) if status.is_success() => Ok(body),
        Ok(body) => Err(refused(what, status, &body, secrets)),
        // A refusal is still a refusal; only its details are not read.
        Err(Unread::TooLarge(_)) if !status.is_success() => {
            Err(refused(what, status, b"", secrets))
        }
        Err(Unread::TooLarge(limit)) => Err(Error::new(
            ErrorKind::Protocol,
            format!(
                "{what} failed: the reply is larger than the {} backend-gcs reads from a \
                 token endpoint; it was not read",
                crate::body::size(limit.bytes)
            ),
        )),
        Err(Unread::Transport(e)) => Err(broken_reply(what, e)),
    }
}

/// Field readers whose errors name the file and the field, never a value.
struct Fields<'a> {
    path: &'a Path,
    file: &'a Map<String, Value>,
}

impl<'a> Fields<'a> {
    fn error(&self, field: &str, why: &str) -> Error {
        Error::new(
            ErrorKind::Config,
            format!(
                "the external_account credential file {}: field {field} {why}",
                self.path.display()
            ),
        )
    }

    fn optional_str(&self, field: &str) -> Result<Option<&'a str>> {
        match self.file.get(field) {
            None | Some(Value::Null) => Ok(None),
            Some(Value::String(s)) if !s.is_empty() => Ok(Some(s)),
            Some(_) => Err(self.error(field, "must be a non-empty string")),
        }
    }

    fn required_str(&self, field: &str) -> Result<&'a str> {
        self.optional_str(field)?
            .ok_or_else(|| self.error(field, "is missing"))
    }

    fn object(&self, field: &str) -> Result<&'a Map<String, Value>> {
        match self.file.get(field) {
            Some(Value::Object(map)) => Ok(map),
            None => Err(self.error(field, "is missing")),
            Some(_) => Err(self.error(field, "must be an object")),
        }
    }

    /// `text` as an endpoint URL: https, or http to loopback.
    fn endpoint(&self, field: &str, text: &str) -> Result<Url> {
        let url = Url::parse(text).map_err(|_| self.error(field, "is not a URL"))?;
        match url.scheme() {
            "https" => Ok(url),
            "http" if crate::http::is_loopback(&url) => Ok(url),
            "http" => Err(self.error(
                field,
                "is plain http to a host that is not loopback; use https (a token must not \
                 travel in clear)",
            )),
            _ => Err(self.error(field, "must be an https URL")),
        }
    }

    fn lifetime(&self) -> Result<u64> {
        let field = "service_account_impersonation.token_lifetime_seconds";
        let value = self
            .file
            .get("service_account_impersonation")
            .and_then(|v| v.get("token_lifetime_seconds"));
        match value {
            None | Some(Value::Null) => Ok(DEFAULT_LIFETIME),
            Some(v) => v
                .as_u64()
                .filter(|s| LIFETIMES.contains(s))
                .ok_or_else(|| self.error(field, "must be a whole number from 600 to 43200")),
        }
    }

    fn source(&self, source: &Map<String, Value>) -> Result<SubjectSource> {
        let text = |key: &str| {
            source
                .get(key)
                .and_then(Value::as_str)
                .filter(|s| !s.is_empty())
        };
        for unsupported in ["executable", "environment_id", "aws"] {
            if source.contains_key(unsupported) {
                return Err(self.error(
                    &format!("credential_source.{unsupported}"),
                    "is not supported (supported sources: file, url)",
                ));
            }
        }
        match (text("file"), text("url")) {
            (Some(file), None) => Ok(SubjectSource::File(PathBuf::from(file))),
            (None, Some(url)) => Ok(SubjectSource::Url {
                url: self.endpoint("credential_source.url", url)?,
                headers: self.headers(source.get("headers"))?,
            }),
            _ => Err(self.error(
                "credential_source",
                "must have exactly one of file or url (a non-empty string)",
            )),
        }
    }

    fn headers(&self, headers: Option<&Value>) -> Result<HeaderMap> {
        let field = "credential_source.headers";
        let mut map = HeaderMap::new();
        let Some(headers) = headers.filter(|h| !h.is_null()) else {
            return Ok(map);
        };
        let headers = headers
            .as_object()
            .ok_or_else(|| self.error(field, "must be an object of strings"))?;
        for (name, value) in headers {
            let name = HeaderName::try_from(name.as_str());
            let value = value.as_str().map(HeaderValue::try_from);
            match (name, value) {
                (Ok(name), Some(Ok(mut value))) => {
                    value.set_sensitive(true);
                    map.insert(name, value);
                }
                _ => return Err(self.error(field, "holds a header that is not valid HTTP")),
            }
        }
        Ok(map)
    }

    fn json_field(&self, source: &Map<String, Value>) -> Result<Option<String>> {
        let Some(format) = source.get("format").filter(|f| !f.is_null()) else {
            return Ok(None);
        };
        let kind = format.get("type").and_then(Value::as_str).unwrap_or("text");
        match kind {
            "text" => Ok(None),
            "json" => format
                .get("subject_token_field_name")
                .and_then(Value::as_str)
                .filter(|s| !s.is_empty())
                .map(|s| Some(s.to_owned()))
                .ok_or_else(|| {
                    self.error(
                        "credential_source.format.subject_token_field_name",
                        "is needed with format type json",
                    )
                }),
            _ => Err(self.error("credential_source.format.type", "must be text or json")),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file(value: Value) -> Map<String, Value> {
        value.as_object().cloned().expect("object")
    }

    fn good() -> Value {
        json!({
            "type": "external_account",
            "audience": "//iam.googleapis.com/projects/1/locations/global/workloadIdentityPools/p/providers/r",
            "subject_token_type": "urn:ietf:params:oauth:token-type:jwt",
            "token_url": "https://sts.googleapis.com/v1/token",
            "credential_source": { "url": "https://token.actions.example/x",
                "headers": { "Authorization": "Bearer s3cret" },
                "format": { "type": "json", "subject_token_field_name": "value" } },
            "service_account_impersonation_url": "https://iamcredentials.googleapis.com/v1/projects/-/serviceAccounts/sa@p.iam.gserviceaccount.com:generateAccessToken",
            "service_account_impersonation": { "token_lifetime_seconds": 1200 }
        })
    }

    #[test]
    fn parses_a_github_actions_file() {
        let account = ExternalAccount::parse(Path::new("f.json"), &file(good())).expect("ok");
        assert_eq!(account.json_field.as_deref(), Some("value"));
        assert_eq!(account.impersonation.as_ref().map(|i| i.1), Some(1200));
    }

    #[test]
    fn each_broken_field_is_named_and_no_value_is_echoed() {
        let cases: [(&str, Value, &str); 8] = [
            ("audience", Value::Null, "field audience"),
            ("subject_token_type", json!(3), "field subject_token_type"),
            (
                "token_url",
                json!("http://sts.example.com/v1/token"),
                "field token_url",
            ),
            (
                "credential_source",
                json!({"executable": {"command": "x"}}),
                "credential_source.executable",
            ),
            (
                "credential_source",
                json!({"file": "a", "url": "https://b"}),
                "credential_source must",
            ),
            (
                "credential_source",
                json!({"file": "a", "format": {"type": "json"}}),
                "subject_token_field_name",
            ),
            (
                "service_account_impersonation",
                json!({"token_lifetime_seconds": 5}),
                "token_lifetime_seconds",
            ),
            (
                "service_account_impersonation_url",
                json!("ftp://x"),
                "service_account_impersonation_url",
            ),
        ];
        for (key, value, expected) in cases {
            let mut broken = good();
            broken[key] = value;
            let err = ExternalAccount::parse(Path::new("f.json"), &file(broken))
                .err()
                .expect(key);
            assert_eq!(err.kind(), ErrorKind::Config, "{key}");
            let text = err.to_string();
            assert!(text.contains(expected) && text.contains("f.json"), "{text}");
            assert!(!text.contains("s3cret"), "{text}");
        }
    }

    #[test]
    fn plain_http_is_only_for_loopback() {
        for (url, ok) in [
            ("http://127.0.0.1:9/t", true),
            ("http://[::1]:9/t", true),
            ("http://localhost/t", true),
            ("http://10.0.0.1/t", false),
            ("http://sts.googleapis.com/v1/token", false),
        ] {
            let mut value = good();
            value["token_url"] = json!(url);
            let parsed = ExternalAccount::parse(Path::new("f"), &file(value));
            assert_eq!(parsed.is_ok(), ok, "{url}");
        }
    }
}
