//! Whether a backend sends its refreshes in GCS batch requests (`client/batch.rs`).

use std::sync::PoisonError;
use std::time::{Duration, Instant};

/// How long an endpoint that answered the batch endpoint with 404, 405 or 501 gets lone
/// refreshes before a batch is tried again (a proxy's passing hiccup must not turn
/// batching off for the life of the process).
const NO_BATCHES_FOR: Duration = Duration::from_secs(600);

/// Whether refreshes are batched: never for an endpoint with a path (behind a proxy that
/// strips a path prefix, the batch request would arrive but its calls' paths, which carry
/// the prefix, would not: every call 404, every lease `Lost`), and not for a while after
/// the endpoint showed it has no batch endpoint.
#[derive(Debug)]
pub(crate) struct Batching {
    endpoint_has_path: bool,
    refused_at: std::sync::Mutex<Option<Instant>>,
}

impl Batching {
    pub(crate) fn new(config: &crate::config::GcsConfig) -> Self {
        let endpoint_has_path = url::Url::parse(config.endpoint())
            .map_or(true, |u| !u.path().trim_matches('/').is_empty());
        Self {
            endpoint_has_path,
            refused_at: std::sync::Mutex::new(None),
        }
    }

    /// Whether the endpoint is ever batched: not when it has a path.
    pub(crate) fn endpoint_allows(&self) -> bool {
        !self.endpoint_has_path
    }

    /// Whether to batch now: the endpoint allows it, and it did not refuse a batch in
    /// the last [`NO_BATCHES_FOR`].
    pub(crate) fn allowed(&self) -> bool {
        if self.endpoint_has_path {
            return false;
        }
        let refused_at = self
            .refused_at
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        refused_at.is_none_or(|at| at.elapsed() >= NO_BATCHES_FOR)
    }

    pub(crate) fn refused(&self) {
        *self
            .refused_at
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = Some(Instant::now());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn endpoints_with_a_path_are_never_batched_and_a_refusal_pauses_batching() {
        let batching = |endpoint: &str| {
            let config = crate::GcsConfig::new("bkt")
                .and_then(|c| c.with_endpoint(endpoint))
                .expect("config");
            Batching::new(&config)
        };
        assert!(batching("http://127.0.0.1:4443").allowed());
        assert!(batching("http://127.0.0.1:4443/").allowed());
        assert!(!batching("http://127.0.0.1:4443/gcs").allowed());
        assert!(!batching("https://proxy.example/storage-proxy/").allowed());
        let refused = batching("http://127.0.0.1:4443");
        refused.refused();
        assert!(!refused.allowed());
        *refused.refused_at.lock().unwrap() = Some(Instant::now() - NO_BATCHES_FOR);
        assert!(refused.allowed(), "tried again after a while");
    }
}
