//! What went wrong ([`ErrorKind`]) and whether retrying can help ([`RetryStatus`]): the
//! two facts every anylock error carries, shared by [`Error`](crate::Error) and
//! [`Invalid`](crate::Invalid).

use std::fmt;

/// What went wrong, in terms a caller can act on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ErrorKind {
    /// The backend could not be reached or did not answer in time (network, timeout, 5xx,
    /// rate limiting). Usually worth retrying.
    Unavailable,
    /// A conditional write was sent but its outcome is unknown (timed out after sending,
    /// connection dropped before the reply). The write may have taken effect: the next
    /// attempt must be able to recognise its own lock, which same-identity retake does.
    OutcomeUnknown,
    /// The lease is no longer ours: deleted, expired and taken, or owner changed. Abort the
    /// critical section; do not release.
    Lost,
    /// The lock is held by someone else and the caller asked not to wait.
    Held,
    /// The wait deadline passed before the lock could be acquired.
    Timeout,
    /// Bad input: a lock name, TTL, option combination or URL that can never work.
    InvalidInput,
    /// The backend refused our credentials or we lack a permission.
    PermissionDenied,
    /// The backend or client is misconfigured (missing setting, disabled feature).
    Config,
    /// The backend does not support this operation.
    Unsupported,
    /// The backend answered something the protocol does not allow (malformed reply).
    Protocol,
}

impl ErrorKind {
    /// A short lowercase description used in messages.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Unavailable => "backend unavailable",
            Self::OutcomeUnknown => "outcome unknown",
            Self::Lost => "lock lost",
            Self::Held => "lock held by another owner",
            Self::Timeout => "timed out waiting for the lock",
            Self::InvalidInput => "invalid input",
            Self::PermissionDenied => "permission denied",
            Self::Config => "configuration error",
            Self::Unsupported => "unsupported",
            Self::Protocol => "protocol error",
        }
    }

    /// The retry status an error of this kind gets unless a backend says otherwise.
    pub fn default_status(self) -> RetryStatus {
        match self {
            Self::Unavailable | Self::OutcomeUnknown => RetryStatus::Temporary,
            _ => RetryStatus::Permanent,
        }
    }
}

impl fmt::Display for ErrorKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Whether retrying the same operation can succeed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum RetryStatus {
    /// Retrying may succeed (network blip, timeout, 5xx, 429).
    Temporary,
    /// Retrying the same input will fail the same way.
    Permanent,
    /// The error was temporary but retries were exhausted (for example the refresher gave up
    /// after its maximum number of consecutive failures).
    Persistent,
}
