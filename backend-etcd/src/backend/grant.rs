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
//!
//! A semaphore permit's lease (marked with `Lease::permits`) carries the same strings,
//! with `<rev>` its slot key's *mod* revision (a same-owner retake rewrites a slot in
//! place, so the create revision does not tell grants apart) and `<suffix>` the slot's
//! index: the key is `P + "%sem/" + escape(N) + "/" + <permits> + "/" + <index>` (see
//! `slots.rs`). A permit moved to a lease of its own gets the move's revision in its grant
//! string; its fence token (the lease's) stays the one it was granted.

use lockcore::{Error, Lease, LockName, Result};

use crate::keys::Layout;
use crate::requests::Pin;

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
    /// For a semaphore permit, the semaphore's number of permits (the suffix is then the
    /// slot's index and the revision the slot's mod revision).
    permits: Option<u32>,
}

impl Grant {
    /// A key bound to a lease of its own, named after the lease.
    pub(crate) fn own(lease: i64, revision: i64) -> Self {
        Self {
            lease,
            revision,
            suffix: None,
            session: false,
            permits: None,
        }
    }

    /// A key named `suffix` bound to the session lease `lease`.
    pub(crate) fn on_session(lease: i64, revision: i64, suffix: String) -> Self {
        Self {
            lease,
            revision,
            suffix: Some(suffix),
            session: true,
            permits: None,
        }
    }

    /// Slot `index` of a semaphore of `permits`, written at `revision` (its mod revision),
    /// bound to the session lease `lease`.
    pub(crate) fn permit_on_session(lease: i64, revision: i64, index: u32, permits: u32) -> Self {
        Self {
            lease,
            revision,
            suffix: Some(index.to_string()),
            session: true,
            permits: Some(permits),
        }
    }

    /// This grant's key moved to `lease`, a lease of its own, by a write at `revision`
    /// (same key; a lock's grant keeps its create revision, a permit's pins the move's
    /// mod revision).
    pub(crate) fn moved_to(&self, lease: i64, revision: i64) -> Self {
        Self {
            lease,
            revision: if self.permits.is_some() {
                revision
            } else {
                self.revision
            },
            suffix: Some(self.suffix()),
            session: false,
            permits: self.permits,
        }
    }

    /// The revision of the key that identifies this grant.
    pub(crate) fn pin(&self) -> Pin {
        match self.permits {
            Some(_) => Pin::Modified(self.revision),
            None => Pin::Created(self.revision),
        }
    }

    /// The key's last part.
    pub(crate) fn suffix(&self) -> String {
        self.suffix
            .clone()
            .unwrap_or_else(|| format!("{:x}", self.lease))
    }

    /// The key of lock (or semaphore) `name` under `layout`.
    pub(crate) fn key(&self, layout: &Layout, name: &LockName) -> Vec<u8> {
        match self.permits {
            Some(permits) => {
                let index = self.suffix().parse().unwrap_or(u32::MAX);
                layout.slot_key(name, permits, index)
            }
            None => layout.key_named(name, &self.suffix()),
        }
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
            permits: None,
        })
    }
}

/// The grant of a lease this backend issued (a lock's, or a permit's when the lease is
/// marked with `Lease::permits`).
///
/// # Errors
/// `InvalidInput` for a lease from another backend, and for a permit's lease whose grant
/// names no slot of its semaphore.
pub(crate) fn parse_grant(lease: &Lease) -> Result<Grant> {
    let mut grant = Grant::parse(lease.grant())?;
    if let Some(permits) = lease.permits() {
        let permits = permits.get();
        let index = grant.suffix.as_deref().and_then(|s| s.parse::<u32>().ok());
        if !index.is_some_and(|i| i < permits && Some(i.to_string()) == grant.suffix) {
            return Err(Error::invalid_input(
                "the permit's lease was not issued by the etcd backend",
            ));
        }
        grant.permits = Some(permits);
    }
    Ok(grant)
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
        let moved = shared.moved_to(0x20, 50);
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

    fn permit(grant: &str) -> Lease {
        lease(grant).with_permits(lockcore::Permits::new(3).expect("valid"))
    }

    /// A permit's grant names its slot and pins the slot's mod revision; a move pins the
    /// move's revision (the fence token, on the lease, is not the grant's business).
    #[test]
    fn permit_grants_name_their_slot_and_pin_the_mod_revision() {
        let granted = Grant::permit_on_session(0x1f, 42, 2, 3);
        assert_eq!(granted.encode(), "1f:42:2:s");
        let parsed = parse_grant(&permit("1f:42:2:s")).expect("ours");
        assert_eq!(parsed, granted);
        assert_eq!(parsed.pin(), Pin::Modified(42));
        let layout = Layout::new("p/");
        let name = LockName::new("x").expect("valid");
        assert_eq!(parsed.key(&layout, &name), b"p/%sem/x/3/2");
        let moved = parsed.moved_to(0x20, 50);
        assert_eq!(moved.encode(), "20:50:2");
        assert_eq!(parse_grant(&permit("20:50:2")).expect("ours"), moved);
        assert_eq!(moved.pin(), Pin::Modified(50));
        // A lock's grant keeps its create revision through a move.
        let lock = parse_grant(&lease("1f:42:1f:s")).expect("ours");
        assert_eq!(lock.pin(), Pin::Created(42));
        assert_eq!(lock.moved_to(0x20, 50).pin(), Pin::Created(42));
        for bad in [
            "1f:42",
            "1f:42:3:s",
            "1f:42:02:s",
            "1f:42:x:s",
            "1f:42:-1:s",
        ] {
            let err = parse_grant(&permit(bad)).expect_err(bad);
            assert_eq!(err.kind(), ErrorKind::InvalidInput, "{bad}");
        }
    }
}
