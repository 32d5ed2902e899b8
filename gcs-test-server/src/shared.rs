//! The state shared by the server handle and every connection, and the request log.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Mutex, PoisonError};
use std::time::Duration;

use serde_json::{Value, json};

use crate::auth::AuthState;
use crate::fault::{Clock, Fault, RequestFaults};
use crate::store::Store;

/// One API request as the server saw it (admin paths are not logged).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RequestRecord {
    /// `GET`, `POST`, `PATCH`, `DELETE`, …
    pub method: String,
    /// The path as sent, still percent-encoded.
    pub path: String,
    /// The raw query string, if any.
    pub query: Option<String>,
    /// The status the server answered.
    pub status: u16,
}

impl RequestRecord {
    pub(crate) fn to_json(&self) -> Value {
        json!({ "method": self.method, "path": self.path, "query": self.query, "status": self.status })
    }
}

/// State shared by the handle and every connection.
#[derive(Debug)]
pub(crate) struct Shared {
    pub(crate) base_url: String,
    pub(crate) store: Mutex<Store>,
    pub(crate) faults: Mutex<RequestFaults>,
    pub(crate) log: Mutex<Vec<RequestRecord>>,
    pub(crate) clock: Clock,
    pub(crate) auth: Mutex<AuthState>,
    /// API requests being handled now, and the most at once since the log was cleared.
    pub(crate) in_flight: AtomicUsize,
    pub(crate) most_in_flight: AtomicUsize,
}

/// Counts one API request in flight until dropped (hyper drops a request's future when
/// its client goes away).
pub(crate) struct InFlight<'a>(&'a Shared);

impl<'a> InFlight<'a> {
    pub(crate) fn new(shared: &'a Shared) -> Self {
        let now = shared.in_flight.fetch_add(1, Ordering::SeqCst) + 1;
        shared.most_in_flight.fetch_max(now, Ordering::SeqCst);
        Self(shared)
    }
}

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        self.0.in_flight.fetch_sub(1, Ordering::SeqCst);
    }
}

impl Shared {
    pub(crate) fn inject(&self, fault: Fault) {
        match fault {
            Fault::ServerErrors { count } => self.faults().server_errors = count,
            Fault::RateLimit { min_interval } => self.set_rate_limit(Some(min_interval)),
            Fault::Delay(delay) => self.set_delay(Some(delay)),
            Fault::LoseReplies { count } => self.faults().lost_replies = count,
            Fault::NoBatches => self.faults().no_batches = true,
            Fault::BatchErrors { count, status } => {
                let mut faults = self.faults();
                faults.batch_errors = count;
                faults.batch_error_status = status;
            }
            Fault::CutBatchReplies { count } => self.faults().cut_batch_replies = count,
        }
    }

    pub(crate) fn clear_faults(&self) {
        *self.faults() = RequestFaults::default();
        self.set_rate_limit(None);
    }

    pub(crate) fn set_rate_limit(&self, min_interval: Option<Duration>) {
        let mut store = self.store.lock().unwrap_or_else(PoisonError::into_inner);
        store.set_rate_limit(min_interval);
    }

    pub(crate) fn set_delay(&self, delay: Option<Duration>) {
        self.faults().delay = delay;
    }

    pub(crate) fn requests(&self) -> Vec<RequestRecord> {
        self.log
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    pub(crate) fn clear_requests(&self) {
        self.log
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clear();
        let now = self.in_flight.load(Ordering::SeqCst);
        self.most_in_flight.store(now, Ordering::SeqCst);
        // A request that started between the two lines above is counted again.
        let now = self.in_flight.load(Ordering::SeqCst);
        self.most_in_flight.fetch_max(now, Ordering::SeqCst);
    }

    pub(crate) fn auth(&self) -> std::sync::MutexGuard<'_, AuthState> {
        self.auth.lock().unwrap_or_else(PoisonError::into_inner)
    }

    pub(crate) fn faults(&self) -> std::sync::MutexGuard<'_, RequestFaults> {
        self.faults.lock().unwrap_or_else(PoisonError::into_inner)
    }
}
