//! [`Invalid`]: the error of the validated value types ([`LockName`](crate::LockName),
//! [`Identity`](crate::Identity), [`Note`](crate::Note), [`Ttl`](crate::Ttl), durations).

use std::borrow::Cow;
use std::fmt;

use crate::kind::{ErrorKind, RetryStatus};

/// A value that breaks the rules of its type, and which rule. It converts into
/// [`Error`](crate::Error) (kind [`ErrorKind::InvalidInput`]), so `?` works in functions
/// that return anylock's error.
///
/// ```
/// use lockcore::{ErrorKind, LockName};
/// let err = LockName::new("").unwrap_err();
/// assert_eq!(err.kind(), ErrorKind::InvalidInput);
/// assert_eq!(err.to_string(), "invalid input: lock name is empty");
/// let err: lockcore::Error = err.into();
/// assert_eq!(err.message(), "lock name is empty");
/// ```
#[derive(Clone, PartialEq, Eq)]
pub struct Invalid {
    message: Cow<'static, str>,
}

impl Invalid {
    /// A value broke the rule `message` describes.
    pub fn new(message: impl Into<Cow<'static, str>>) -> Self {
        Self {
            message: message.into(),
        }
    }

    /// Always [`ErrorKind::InvalidInput`].
    pub fn kind(&self) -> ErrorKind {
        ErrorKind::InvalidInput
    }

    /// Always [`RetryStatus::Permanent`]: the same value fails the same way.
    pub fn status(&self) -> RetryStatus {
        RetryStatus::Permanent
    }

    /// The rule broken, without the `invalid input:` prefix.
    pub fn message(&self) -> &str {
        &self.message
    }

    /// The same rule with `context` in front (`bad prefix: lock name is empty`).
    #[must_use]
    pub fn context(self, context: &str) -> Self {
        Self::new(format!("{context}: {}", self.message))
    }

    pub(crate) fn into_message(self) -> Cow<'static, str> {
        self.message
    }
}

impl fmt::Display for Invalid {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", ErrorKind::InvalidInput, self.message)
    }
}

impl fmt::Debug for Invalid {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("Invalid").field(&self.message).finish()
    }
}

impl std::error::Error for Invalid {}
