//! Validated lock names.

use std::fmt;
use std::sync::Arc;

use crate::invalid::Invalid;

/// The longest lock name accepted, in bytes of UTF-8.
///
/// Chosen so that every backend can build its key from the name plus a prefix and suffix
/// (GCS object names may be 1024 bytes, etcd and Redis keys far more).
pub const MAX_NAME_LEN: usize = 512;

/// A lock name: non-empty, at most [`MAX_NAME_LEN`] bytes, no control characters.
///
/// Backends may add stricter rules of their own (for example GCS object naming rules) and
/// report them as [`ErrorKind::InvalidInput`](crate::ErrorKind::InvalidInput).
///
/// ```
/// use lockcore::LockName;
/// let name = LockName::new("publish-repo")?;
/// assert_eq!(name.as_str(), "publish-repo");
/// assert!(LockName::new("").is_err());
/// assert!(LockName::new("bad\nname").is_err());
/// # Ok::<(), lockcore::Error>(())
/// ```
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct LockName(Arc<str>);

impl LockName {
    /// Validates `name`.
    ///
    /// # Errors
    /// [`ErrorKind::InvalidInput`](crate::ErrorKind::InvalidInput) when the name is empty,
    /// longer than [`MAX_NAME_LEN`] bytes, or contains a control character.
    pub fn new(name: impl AsRef<str>) -> Result<Self, Invalid> {
        let name = name.as_ref();
        if name.is_empty() {
            return Err(Invalid::new("lock name is empty"));
        }
        if name.len() > MAX_NAME_LEN {
            return Err(Invalid::new(format!(
                "lock name is {} bytes long; the limit is {MAX_NAME_LEN}",
                name.len()
            )));
        }
        if let Some((pos, ch)) = name.char_indices().find(|(_, c)| c.is_control()) {
            return Err(Invalid::new(format!(
                "lock name contains the control character {ch:?} at byte {pos}"
            )));
        }
        Ok(Self(Arc::from(name)))
    }

    /// The name as a string slice.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for LockName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl fmt::Debug for LockName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&*self.0, f)
    }
}

impl TryFrom<&str> for LockName {
    type Error = Invalid;
    fn try_from(value: &str) -> Result<Self, Invalid> {
        Self::new(value)
    }
}

impl TryFrom<String> for LockName {
    type Error = Invalid;
    fn try_from(value: String) -> Result<Self, Invalid> {
        Self::new(value)
    }
}

impl AsRef<str> for LockName {
    fn as_ref(&self) -> &str {
        &self.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ErrorKind;

    #[test]
    fn accepts_ordinary_names() {
        for ok in [
            "a",
            "publish-repo",
            "team/ci/deploy",
            "ünïcødé",
            &"x".repeat(MAX_NAME_LEN),
        ] {
            assert_eq!(LockName::new(ok).expect(ok).as_str(), ok);
        }
    }

    #[test]
    fn rejects_bad_names_with_clear_messages() {
        let cases = [
            ("", "empty"),
            ("a\nb", "control character '\\n' at byte 1"),
            ("tab\there", "control character '\\t'"),
            ("nul\0", "control character '\\0'"),
            ("del\u{7f}", "control character"),
            ("c1\u{85}", "control character"),
        ];
        for (input, expected) in cases {
            let err = LockName::new(input).expect_err(input);
            assert_eq!(err.kind(), ErrorKind::InvalidInput);
            assert!(err.to_string().contains(expected), "{input:?}: {err}");
        }
        let long = "x".repeat(MAX_NAME_LEN + 1);
        let err = LockName::new(&long).expect_err("too long");
        assert!(err.to_string().contains("513 bytes long"), "{err}");
    }
}
