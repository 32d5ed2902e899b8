//! The one error type every anylock crate returns.
//!
//! An [`Error`] carries a [`ErrorKind`] (what went wrong), a [`RetryStatus`] (whether trying
//! again can help), the backend and lock it concerns, a human-readable message and an
//! optional source. Backends map their client errors to it in one place each; the acquire
//! loop and the lease refresher decide what to do from the kind and status alone.
//!
//! Messages never contain secrets: backends build them from redacted URLs and never from
//! credentials or server replies that may echo them.

use std::borrow::Cow;
use std::error::Error as StdError;
use std::fmt;

use crate::invalid::Invalid;
pub(crate) use crate::kind::{ErrorKind, RetryStatus};
use crate::name::LockName;
use crate::types::HolderInfo;

/// The anylock error: a kind, a retry status, context and an optional source.
pub struct Error {
    kind: ErrorKind,
    status: RetryStatus,
    backend: Option<Cow<'static, str>>,
    lock: Option<LockName>,
    message: Cow<'static, str>,
    holder: Option<Box<HolderInfo>>,
    source: Option<Box<dyn StdError + Send + Sync + 'static>>,
}

/// The result type used throughout anylock.
pub type Result<T, E = Error> = std::result::Result<T, E>;

impl Error {
    /// Creates an error of `kind` with a message; the retry status is the kind's default.
    pub fn new(kind: ErrorKind, message: impl Into<Cow<'static, str>>) -> Self {
        Self {
            kind,
            status: kind.default_status(),
            backend: None,
            lock: None,
            message: message.into(),
            holder: None,
            source: None,
        }
    }

    /// `n` copies of this error, for a batch call whose one failure fails each of its items
    /// ([`LockBackend::refresh_many`](crate::LockBackend::refresh_many)): the same kind,
    /// retry status, context and message; one source, shared.
    pub fn copies(self, n: usize) -> Vec<Error> {
        if n <= 1 {
            return if n == 1 { vec![self] } else { Vec::new() };
        }
        let Error {
            kind,
            status,
            backend,
            lock,
            message,
            holder,
            source,
        } = self;
        let source = source.map(std::sync::Arc::<dyn StdError + Send + Sync>::from);
        (0..n)
            .map(|_| Error {
                kind,
                status,
                backend: backend.clone(),
                lock: lock.clone(),
                message: message.clone(),
                holder: holder.clone(),
                source: source.clone().map(|s| {
                    Box::new(SharedSource(s)) as Box<dyn StdError + Send + Sync + 'static>
                }),
            })
            .collect()
    }

    /// Shorthand for an [`ErrorKind::InvalidInput`] error.
    pub fn invalid_input(message: impl Into<Cow<'static, str>>) -> Self {
        Self::new(ErrorKind::InvalidInput, message)
    }

    /// Shorthand for an [`ErrorKind::Unavailable`] error.
    pub fn unavailable(message: impl Into<Cow<'static, str>>) -> Self {
        Self::new(ErrorKind::Unavailable, message)
    }

    /// Shorthand for an [`ErrorKind::Lost`] error.
    pub fn lost(message: impl Into<Cow<'static, str>>) -> Self {
        Self::new(ErrorKind::Lost, message)
    }

    /// Sets the backend name (`"redis"`, `"memory"`, …).
    pub fn with_backend(mut self, backend: impl Into<Cow<'static, str>>) -> Self {
        self.backend = Some(backend.into());
        self
    }

    /// Sets the lock the error concerns.
    pub fn with_lock(mut self, lock: &LockName) -> Self {
        self.lock = Some(lock.clone());
        self
    }

    /// Overrides the retry status.
    pub fn with_status(mut self, status: RetryStatus) -> Self {
        self.status = status;
        self
    }

    /// Attaches the current holder (for [`ErrorKind::Held`] and [`ErrorKind::Timeout`]).
    pub fn with_holder(mut self, holder: HolderInfo) -> Self {
        self.holder = Some(Box::new(holder));
        self
    }

    /// Attaches the underlying cause. The source's `Display` must not contain secrets.
    pub fn with_source(mut self, source: impl StdError + Send + Sync + 'static) -> Self {
        self.source = Some(Box::new(source));
        self
    }

    /// What went wrong.
    pub fn kind(&self) -> ErrorKind {
        self.kind
    }

    /// Whether retrying can help.
    pub fn status(&self) -> RetryStatus {
        self.status
    }

    /// `true` when the status is [`RetryStatus::Temporary`].
    pub fn is_temporary(&self) -> bool {
        self.status == RetryStatus::Temporary
    }

    /// The backend name, when known.
    pub fn backend(&self) -> Option<&str> {
        self.backend.as_deref()
    }

    /// The lock the error concerns, when known.
    pub fn lock(&self) -> Option<&LockName> {
        self.lock.as_ref()
    }

    /// The message without context.
    pub fn message(&self) -> &str {
        &self.message
    }

    /// Who held the lock, for [`ErrorKind::Held`] and [`ErrorKind::Timeout`].
    pub fn holder(&self) -> Option<&HolderInfo> {
        self.holder.as_deref()
    }

    /// Names `backend` unless the error already names one: how code that calls a
    /// [`LockBackend`](crate::LockBackend) outside a [`Locker`](crate::Locker) gives its
    /// errors the context the `Locker` would.
    #[must_use]
    pub fn in_backend(mut self, backend: &str) -> Self {
        if self.backend.is_none() {
            self.backend = Some(Cow::Owned(backend.to_owned()));
        }
        self
    }

    /// Names `backend` and `lock` unless the error already names them: what the
    /// [`Locker`](crate::Locker) does, for a backend's own public calls outside it (a
    /// fenced transaction, say).
    #[must_use]
    pub fn in_context(mut self, backend: &str, lock: &LockName) -> Self {
        if self.lock.is_none() {
            self.lock = Some(lock.clone());
        }
        self.in_backend(backend)
    }
}

impl From<Invalid> for Error {
    fn from(invalid: Invalid) -> Self {
        Self::invalid_input(invalid.into_message())
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if let Some(backend) = &self.backend {
            write!(f, "{backend}: ")?;
        }
        if let Some(lock) = &self.lock {
            write!(f, "lock {lock:?}: ")?;
        }
        write!(f, "{}: {}", self.kind, self.message)?;
        if self.status == RetryStatus::Persistent {
            f.write_str(" (retries exhausted)")?;
        }
        Ok(())
    }
}

impl fmt::Debug for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut d = f.debug_struct("Error");
        d.field("kind", &self.kind)
            .field("status", &self.status)
            .field("backend", &self.backend)
            .field("lock", &self.lock)
            .field("message", &self.message);
        if let Some(holder) = &self.holder {
            d.field("holder", holder);
        }
        if let Some(source) = &self.source {
            d.field("source", &format_args!("{source}"));
        }
        d.finish()
    }
}

impl StdError for Error {
    fn source(&self) -> Option<&(dyn StdError + 'static)> {
        self.source
            .as_deref()
            .map(|s| s as &(dyn StdError + 'static))
    }
}

/// A source shared by the copies [`Error::copies`] makes; it reads as the original.
struct SharedSource(std::sync::Arc<dyn StdError + Send + Sync + 'static>);

impl fmt::Debug for SharedSource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&*self.0, f)
    }
}

impl fmt::Display for SharedSource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&*self.0, f)
    }
}

impl StdError for SharedSource {
    fn source(&self) -> Option<&(dyn StdError + 'static)> {
        self.0.source()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn copies_keep_kind_status_context_message_and_source() {
        let name = LockName::new("job").expect("valid");
        let err = Error::new(ErrorKind::OutcomeUnknown, "no answer")
            .with_source(std::io::Error::other("reset by peer"))
            .in_context("redis", &name);
        let shown = err.to_string();
        assert_eq!(Error::unavailable("x").copies(0).len(), 0);
        let copies = err.copies(3);
        assert_eq!(copies.len(), 3);
        for copy in &copies {
            assert_eq!(copy.kind(), ErrorKind::OutcomeUnknown);
            assert!(copy.is_temporary());
            assert_eq!((copy.backend(), copy.lock()), (Some("redis"), Some(&name)));
            assert_eq!(copy.to_string(), shown);
            let source = StdError::source(copy).map(ToString::to_string);
            assert_eq!(source.as_deref(), Some("reset by peer"));
        }
    }

    #[test]
    fn display_names_backend_lock_and_kind() {
        let name = LockName::new("deploy").expect("valid");
        let err = Error::unavailable("connection refused")
            .with_backend("redis")
            .with_lock(&name);
        assert_eq!(
            err.to_string(),
            "redis: lock \"deploy\": backend unavailable: connection refused"
        );
        assert!(err.is_temporary());
    }

    #[test]
    fn kinds_have_sensible_default_status() {
        assert_eq!(
            ErrorKind::Unavailable.default_status(),
            RetryStatus::Temporary
        );
        assert_eq!(
            ErrorKind::OutcomeUnknown.default_status(),
            RetryStatus::Temporary
        );
        assert_eq!(ErrorKind::Lost.default_status(), RetryStatus::Permanent);
        assert_eq!(
            ErrorKind::InvalidInput.default_status(),
            RetryStatus::Permanent
        );
    }

    #[test]
    fn persistent_status_is_visible() {
        let err = Error::unavailable("timeout").with_status(RetryStatus::Persistent);
        assert!(err.to_string().ends_with("(retries exhausted)"));
        assert!(!err.is_temporary());
    }

    #[test]
    fn source_is_exposed() {
        let io = std::io::Error::other("boom");
        let err = Error::unavailable("read failed").with_source(io);
        assert_eq!(
            StdError::source(&err).map(|s| s.to_string()),
            Some("boom".into())
        );
    }
}
