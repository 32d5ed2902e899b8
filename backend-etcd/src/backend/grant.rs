//! The grant string a lease carries: which etcd lease holds its key, the key's create
//! revision (the fence token), and the key's name when it is not the lease id.
//!
//! - `"<lease hex>:<rev>"`: a lease of the lock's own (a queued waiter's place turned
//!   into the grant); the key is `P + N/<lease hex>`. Released by revoking the lease.
//! - `"<lease hex>:<rev>:<suffix>"`: a lease of the lock's own, key `P + N/<suffix>` (a
//!   key moved off its session by `detach` or `leave_for`). Released by revoking.
//! - `"<lease hex>:<rev>:<suffix>:s"`: the backend's session lease for the lock's TTL,
//!   shared with its other locks of that TTL; key `P + N/<suffix>`. Released by deleting
//!   the key if it still has the create revision; the session is never revoked.

use lockcore::{Error, Lease, LockName, Result};

use crate::keys::Layout;

/// A parsed grant string (see the module docs).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Grant {
    /// The etcd lease the key is bound to.
    pub(crate) lease: i64,
    /// The key's create revision: the fence token.
    pub(crate) revision: i64,
    /// The key's last part, when it is not the lease id in hex.
    suffix: Option<String>,
    /// Whether the lease is a session shared with other locks.
    pub(crate) session: bool,
}

impl Grant {
    /// A key bound to a lease of its own, named after the lease.
    pub(crate) fn own(lease: i64, revision: i64) -> Self {
        Self {
            lease,
            revision,
            suffix: None,
            session: false,
        }
    }

    /// A key named `suffix` bound to the session lease `lease`.
    pub(crate) fn on_session(lease: i64, revision: i64, suffix: String) -> Self {
        Self {
            lease,
            revision,
            suffix: Some(suffix),
            session: true,
        }
    }

    /// This grant's key moved to `lease`, a lease of its own (same key, same revision).
    pub(crate) fn moved_to(&self, lease: i64) -> Self {
        Self {
            lease,
            revision: self.revision,
            suffix: Some(self.suffix()),
            session: false,
        }
    }

    /// The key's last part.
    pub(crate) fn suffix(&self) -> String {
        self.suffix
            .clone()
            .unwrap_or_else(|| format!("{:x}", self.lease))
    }

    /// The key of lock `name` under `layout`.
    pub(crate) fn key(&self, layout: &Layout, name: &LockName) -> Vec<u8> {
        layout.key_named(name, &self.suffix())
    }

    /// The grant string.
    pub(crate) fn encode(&self) -> String {
        let head = format!("{:x}:{}", self.lease, self.revision);
        match (&self.suffix, self.session) {
            (None, false) => head,
            (Some(suffix), false) => format!("{head}:{suffix}"),
            (suffix, true) => format!(
                "{head}:{}:s",
                suffix
                    .clone()
                    .unwrap_or_else(|| format!("{:x}", self.lease))
            ),
        }
    }

    /// Reads a grant string.
    ///
    /// # Errors
    /// `InvalidInput` for a string this backend did not write.
    pub(crate) fn parse(grant: &str) -> Result<Self> {
        let bad = || Error::invalid_input("the lease was not issued by the etcd backend");
        let mut parts = grant.split(':');
        let lease = parts.next().and_then(|id| i64::from_str_radix(id, 16).ok());
        let revision = parts.next().and_then(|rev| rev.parse::<i64>().ok());
        let (Some(lease), Some(revision)) = (lease, revision) else {
            return Err(bad());
        };
        let suffix = parts.next().map(str::to_owned);
        let session = match parts.next() {
            None => false,
            Some("s") => true,
            Some(_) => return Err(bad()),
        };
        if parts.next().is_some()
            || suffix
                .as_deref()
                .is_some_and(|s| s.is_empty() || s.contains('/'))
        {
            return Err(bad());
        }
        Ok(Self {
            lease,
            revision,
            suffix,
            session,
        })
    }
}

/// The grant of a lease this backend issued.
///
/// # Errors
/// `InvalidInput` for a lease from another backend.
pub(crate) fn parse_grant(lease: &Lease) -> Result<Grant> {
    Grant::parse(lease.grant())
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use lockcore::{ErrorKind, Identity};

    fn lease(grant: &str) -> Lease {
        Lease::new(
            LockName::new("x").expect("valid"),
            Identity::unique(),
            lockcore::Ttl::new(Duration::from_secs(1)).expect("valid TTL"),
            grant,
        )
    }

    #[test]
    fn grants_parse_and_foreign_grants_are_rejected() {
        let own = parse_grant(&lease("1f:42")).expect("ours");
        assert_eq!((own.lease, own.revision, own.session), (0x1f, 42, false));
        assert_eq!(own.suffix(), "1f");
        assert_eq!(own, Grant::own(0x1f, 42));
        assert_eq!(own.encode(), "1f:42");
        let shared = parse_grant(&lease("1f:42:1f-29:s")).expect("ours");
        assert_eq!(shared, Grant::on_session(0x1f, 42, "1f-29".into()));
        assert_eq!(shared.encode(), "1f:42:1f-29:s");
        let moved = shared.moved_to(0x20);
        assert_eq!(moved.encode(), "20:42:1f-29");
        assert_eq!(parse_grant(&lease("20:42:1f-29")).expect("ours"), moved);
        let layout = Layout::new("p/");
        let name = LockName::new("x").expect("valid");
        assert_eq!(own.key(&layout, &name), b"p/x/1f");
        assert_eq!(moved.key(&layout, &name), b"p/x/1f-29");
        for bad in [
            "",
            "42",
            "zz:1",
            "1f:",
            "1f:x",
            "1f:42::s",
            "1f:42:a:t",
            "1f:42:a:s:x",
            "1f:42:a/b:s",
        ] {
            let err = parse_grant(&lease(bad)).expect_err(bad);
            assert_eq!(err.kind(), ErrorKind::InvalidInput);
        }
    }
}
