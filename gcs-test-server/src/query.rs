//! A parsed URL query string.

/// The `key=value` pairs of a request's query string, percent-decoded.
#[derive(Debug, Default, Clone)]
pub(crate) struct Query(Vec<(String, String)>);

impl Query {
    /// Parses a raw query string (`None`: no query).
    pub(crate) fn parse(raw: Option<&str>) -> Self {
        let pairs = raw
            .map(|q| form_urlencoded::parse(q.as_bytes()).into_owned().collect())
            .unwrap_or_default();
        Self(pairs)
    }

    /// The first value of `key`, if present.
    pub(crate) fn get(&self, key: &str) -> Option<&str> {
        self.0
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
    }
}
