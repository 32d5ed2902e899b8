//! [`Permits`]: how many holders a semaphore admits, (1 to [`MAX_PERMITS`]).

use std::fmt;
use std::num::NonZeroU32;

use crate::invalid::Invalid;

/// The most permits a semaphore may have.
pub const MAX_PERMITS: u32 = 10_000;

/// How many holders a semaphore admits at once: 1 to [`MAX_PERMITS`].
///
/// ```
/// use lockcore::Permits;
/// assert_eq!(Permits::new(3).unwrap().get(), 3);
/// assert!(Permits::new(0).is_err());
/// ```
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Permits(NonZeroU32);

impl Permits {
    /// One permit.
    pub const MIN: Self = Self(NonZeroU32::MIN);

    /// `n` permits.
    ///
    /// # Errors
    /// [`Invalid`] for 0 or more than [`MAX_PERMITS`].
    pub fn new(n: u32) -> std::result::Result<Self, Invalid> {
        match NonZeroU32::new(n) {
            Some(n) if n.get() <= MAX_PERMITS => Ok(Self(n)),
            _ => Err(Invalid::new(format!(
                "a semaphore has 1 to {MAX_PERMITS} permits, not {n}"
            ))),
        }
    }

    /// The number of permits.
    pub const fn get(self) -> u32 {
        self.0.get()
    }
}

impl fmt::Debug for Permits {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Permits({})", self.0)
    }
}

impl fmt::Display for Permits {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&self.0, f)
    }
}
