//! What a token source hands back, and the scope the lock asks for.

use std::time::Duration;

/// The OAuth2 scope the lock needs: read and write objects.
pub const STORAGE_SCOPE: &str = "https://www.googleapis.com/auth/devstorage.read_write";

/// A token and how long it lives, counted from when its request was sent.
pub(crate) struct Fresh {
    pub(crate) token: String,
    pub(crate) life: Duration,
}
