//! Runtime fault knobs and the server's (shiftable) clock.

use std::sync::atomic::{AtomicI64, Ordering};
use std::time::{Duration, SystemTime};

/// GCS's sustained mutation rate for one object name: about one per second.
pub const GCS_MUTATION_INTERVAL: Duration = Duration::from_secs(1);

/// A fault to inject with [`GcsTestServer::inject`](crate::GcsTestServer::inject).
/// Faults stay in force until [`clear_faults`](crate::GcsTestServer::clear_faults)
/// (`ServerErrors` also wears off by itself).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Fault {
    /// The next `count` API requests answer 503 `backendError` without
    /// touching any object (replaces an earlier count).
    ServerErrors {
        /// How many requests fail.
        count: u32,
    },
    /// Enforce a per-object mutation rate limit: an insert, patch or delete
    /// of a name less than `min_interval` after the last accepted mutation
    /// of that name answers 429 `rateLimitExceeded` and changes nothing.
    /// Off by default; [`Fault::gcs_rate_limit`] gives GCS's rate.
    RateLimit {
        /// Least time between two accepted mutations of one name.
        min_interval: Duration,
    },
    /// Hold every API request this long before handling it.
    Delay(Duration),
    /// The next `count` API requests are handled (a write is applied) but get no
    /// reply: the server closes the connection instead, as when a reply is lost on
    /// the network (replaces an earlier count).
    LoseReplies {
        /// How many replies are lost.
        count: u32,
    },
    /// The next `count` batch requests answer `status` (with a GCS-style error body) as a
    /// whole, before any of their calls runs (replaces an earlier count): 503 as a
    /// passing outage, 413 or 400 as a proxy or server that refuses the batch itself.
    BatchErrors {
        /// How many batch requests fail.
        count: u32,
        /// The status they answer (4xx or 5xx).
        status: u16,
    },
    /// The next `count` batch replies are cut to half their bytes after every call was
    /// applied: the HTTP reply is whole (its `Content-Length` says so), the multipart body
    /// in it ends mid-answer without its close delimiter (replaces an earlier count).
    CutBatchReplies {
        /// How many batch replies are cut.
        count: u32,
    },
    /// The batch endpoint is not there: `POST /batch/storage/v1` answers 404 like any
    /// path the server does not route, as on an emulator without batches.
    NoBatches,
}

impl Fault {
    /// GCS's rate limit: one mutation per object name per second.
    pub const fn gcs_rate_limit() -> Self {
        Self::RateLimit {
            min_interval: GCS_MUTATION_INTERVAL,
        }
    }
}

/// How far the server's clock is from the machine's.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ClockOffset {
    /// The server's clock reads later than the machine's.
    Ahead(Duration),
    /// The server's clock reads earlier than the machine's.
    Behind(Duration),
}

impl ClockOffset {
    /// The offset in signed milliseconds (positive: ahead).
    pub fn as_millis(self) -> i64 {
        match self {
            Self::Ahead(d) => i64::try_from(d.as_millis()).unwrap_or(i64::MAX),
            Self::Behind(d) => -i64::try_from(d.as_millis()).unwrap_or(i64::MAX),
        }
    }

    /// The offset for signed milliseconds (positive: ahead).
    pub fn from_millis(millis: i64) -> Self {
        let magnitude = Duration::from_millis(millis.unsigned_abs());
        if millis < 0 {
            Self::Behind(magnitude)
        } else {
            Self::Ahead(magnitude)
        }
    }
}

/// The request-level faults: pending 503s, pending lost replies and a delay.
#[derive(Debug, Default)]
pub(crate) struct RequestFaults {
    pub(crate) server_errors: u32,
    pub(crate) lost_replies: u32,
    pub(crate) delay: Option<Duration>,
    pub(crate) no_batches: bool,
    pub(crate) batch_errors: u32,
    pub(crate) batch_error_status: u16,
    pub(crate) cut_batch_replies: u32,
}

impl RequestFaults {
    /// Whether this request should fail with 503 (uses one up).
    pub(crate) fn take_server_error(&mut self) -> bool {
        if self.server_errors == 0 {
            return false;
        }
        self.server_errors -= 1;
        true
    }

    /// The status this batch request should fail with as a whole, if any (uses one up).
    pub(crate) fn take_batch_error(&mut self) -> Option<u16> {
        take(&mut self.batch_errors).then_some(self.batch_error_status)
    }

    /// Whether this batch reply should be cut short (uses one up).
    pub(crate) fn take_cut_batch_reply(&mut self) -> bool {
        take(&mut self.cut_batch_replies)
    }

    /// Whether this request's reply should be lost (uses one up).
    pub(crate) fn take_lost_reply(&mut self) -> bool {
        if self.lost_replies == 0 {
            return false;
        }
        self.lost_replies -= 1;
        true
    }
}

/// Uses one of `count` up: whether there was one.
fn take(count: &mut u32) -> bool {
    if *count == 0 {
        return false;
    }
    *count -= 1;
    true
}

/// The server's clock: the machine's clock plus an offset in milliseconds.
#[derive(Debug, Default)]
pub(crate) struct Clock {
    offset_millis: AtomicI64,
}

impl Clock {
    /// Sets the offset.
    pub(crate) fn set(&self, offset: ClockOffset) {
        self.offset_millis
            .store(offset.as_millis(), Ordering::Relaxed);
    }

    /// The server's current time.
    pub(crate) fn now(&self) -> SystemTime {
        let now = SystemTime::now();
        let offset = self.offset_millis.load(Ordering::Relaxed);
        let magnitude = Duration::from_millis(offset.unsigned_abs());
        if offset < 0 {
            now - magnitude
        } else {
            now + magnitude
        }
    }
}
