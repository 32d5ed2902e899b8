//! The objects of a semaphore (permits, see `docs/gcs.md`, "Semaphores"), and the object a
//! lease's grant is pinned to: a lock's object, or one slot of a semaphore.
//!
//! The semaphore `name` keeps its objects under `prefix + name + TAB`: its slots
//! `… TAB permit-<i>` (`i` from 0 to the limit − 1, in decimal). A lock's object is `prefix + name` and a lock name has no control
//! character ([`LockName`]), so no lock object ever has a TAB after the prefix: a semaphore
//! and a lock can never share an object, and `list` skips the semaphores' objects (their
//! names are no lock names). The TAB ends the name, so the objects of `x` are never under
//! the prefix of `xy`'s, nor `x/y`'s under `x`'s. GCS allows a TAB in object names (only CR
//! and LF are refused), and XML 1.0 allows it too, so the XML API can list it.

use lockcore::{Lease, LockName, Result};

use crate::config::{GcsConfig, validate_object_name};
use crate::object::{self, LockObject};

/// What ends the semaphore name inside its objects' names: a character no lock name has.
pub(crate) const SEPARATOR: char = '\t';
/// Slot objects are named this followed by the slot index in decimal.
pub(crate) const SLOT: &str = "permit-";

/// The object names of one semaphore.
#[derive(Debug, Clone)]
pub(crate) struct PermitNames {
    /// `prefix + name + TAB`: every object of the semaphore, and only those, start so.
    base: String,
}

/// What an object under a semaphore's prefix is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Part {
    /// The slot of this index.
    Slot(u32),
}

impl PermitNames {
    /// The names of semaphore `name`, checked against GCS's object naming rules.
    ///
    /// # Errors
    /// [`InvalidInput`](lockcore::ErrorKind::InvalidInput) when the longest of them (the
    /// slot of the largest limit) breaks them, before any request.
    pub(crate) fn new(config: &GcsConfig, name: &LockName) -> Result<Self> {
        let base = format!("{}{}{SEPARATOR}", config.prefix(), name.as_str());
        // The slot of the largest index is the longest; they all share the start the
        // other rules look at.
        let longest = lockcore::MAX_PERMITS - 1;
        validate_object_name(&format!("{base}{SLOT}{longest}"))?;
        Ok(Self { base })
    }

    /// The list prefix: the semaphore's objects and no others.
    pub(crate) fn prefix(&self) -> &str {
        &self.base
    }

    /// The object of slot `index`.
    pub(crate) fn slot(&self, index: u32) -> String {
        format!("{}{SLOT}{index}", self.base)
    }

    /// What `object` is; `None` for a name this version never writes (such objects are
    /// left alone: a later version may add some).
    pub(crate) fn part(&self, object: &str) -> Option<Part> {
        let rest = object.strip_prefix(&self.base)?;
        let digits = rest.strip_prefix(SLOT)?;
        // One spelling per index: no sign, no leading zero.
        let canonical = !digits.is_empty()
            && digits.bytes().all(|b| b.is_ascii_digit())
            && (digits == "0" || !digits.starts_with('0'));
        canonical
            .then(|| digits.parse().ok())
            .flatten()
            .map(Part::Slot)
    }
}

/// The object a lease's grant is pinned to, with the generation and metageneration the
/// grant names: the lock's object (grant `generation:metageneration`), or for a permit
/// lease ([`Lease::permits`]) its slot object (grant `slot:generation:metageneration`).
#[derive(Debug, Clone)]
pub(crate) struct Target {
    pub(crate) object: String,
    /// The permit's slot index; `None` for a lock.
    pub(crate) slot: Option<u32>,
    pub(crate) generation: u64,
    pub(crate) metageneration: u64,
}

impl Target {
    /// The object `lease` holds.
    ///
    /// # Errors
    /// [`InvalidInput`](lockcore::ErrorKind::InvalidInput) for a grant this backend never
    /// issued, or a name GCS refuses.
    pub(crate) fn of(config: &GcsConfig, lease: &Lease) -> Result<Self> {
        if lease.permits().is_none() {
            let (generation, metageneration) = object::parse_grant(lease.grant())?;
            return Ok(Self {
                object: config.object_name(lease.name())?,
                slot: None,
                generation,
                metageneration,
            });
        }
        let (slot, rest) = lease.grant().split_once(':').unwrap_or(("", ""));
        let slot: u32 = slot.parse().map_err(|_| not_ours())?;
        let (generation, metageneration) = object::parse_grant(rest)?;
        Ok(Self {
            object: PermitNames::new(config, lease.name())?.slot(slot),
            slot: Some(slot),
            generation,
            metageneration,
        })
    }

    /// The grant of a lease on `obj`, the same object (a new metageneration after a
    /// refresh).
    pub(crate) fn grant(&self, obj: &LockObject) -> String {
        match self.slot {
            Some(slot) => permit_grant(slot, obj),
            None => obj.grant(),
        }
    }
}

/// The grant of a permit in slot `slot` on the slot object `obj`.
pub(crate) fn permit_grant(slot: u32, obj: &LockObject) -> String {
    format!("{slot}:{}", obj.grant())
}

fn not_ours() -> lockcore::Error {
    lockcore::Error::invalid_input("the permit lease was not issued by the GCS backend")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(prefix: &str) -> GcsConfig {
        GcsConfig::new("bucket")
            .and_then(|c| c.with_prefix(prefix))
            .expect("config")
    }

    #[test]
    fn semaphore_objects_are_never_lock_objects() {
        let c = config("locks/");
        let name = LockName::new("jobs").expect("name");
        let names = PermitNames::new(&c, &name).expect("names");
        assert_eq!(names.slot(3), "locks/jobs\tpermit-3");
        for object in [names.slot(0), names.slot(9999)] {
            let rest = object.strip_prefix("locks/").expect("under the prefix");
            assert!(LockName::new(rest).is_err(), "{rest:?} is a lock name");
        }
        assert_eq!(names.part(&names.slot(42)), Some(Part::Slot(42)));
        assert_eq!(names.part("locks/jobs\tpermit-fence"), None);
        for other in [
            "locks/jobs",
            "locks/jobs\tpermit-01",
            "locks/jobs\tpermit-",
            "locks/jobs\tpermit-+1",
            "locks/jobs\tpermit-99999999999",
            "locks/jobsx\tpermit-1",
            "locks/jobs\tnote",
        ] {
            assert_eq!(names.part(other), None, "{other:?}");
        }
        let nested = PermitNames::new(&c, &LockName::new("jobs/a").expect("name"));
        assert!(!nested.expect("names").slot(0).starts_with(names.prefix()));
    }

    #[test]
    fn names_follow_gcs_rules_before_any_request() {
        let long = config(&"p".repeat(501));
        // 501 + 512 + TAB + `permit-9999`: 1,025 bytes.
        let name = LockName::new("n".repeat(512)).expect("name");
        assert!(PermitNames::new(&long, &name).is_err(), "over 1024 bytes");
        let name = LockName::new("n".repeat(500)).expect("name");
        assert!(PermitNames::new(&long, &name).is_ok());
        let acme = LockName::new(".well-known/acme-challenge/x").expect("name");
        assert!(PermitNames::new(&config(""), &acme).is_err());
        let dot = LockName::new(".").expect("name");
        assert!(
            PermitNames::new(&config(""), &dot).is_ok(),
            "\".\\t…\" is fine"
        );
    }

    #[test]
    fn permit_grants_name_their_slot() {
        let c = config("l/");
        let ttl = lockcore::Ttl::new(std::time::Duration::from_secs(5)).expect("ttl");
        let owner = lockcore::Identity::unique();
        let name = LockName::new("s").expect("name");
        let permits = lockcore::Permits::new(2).expect("permits");
        let lease = Lease::new(name.clone(), owner.clone(), ttl, "1:7:2").with_permits(permits);
        let target = Target::of(&c, &lease).expect("ours");
        assert_eq!(target.object, "l/s\tpermit-1");
        assert_eq!(
            (target.slot, target.generation, target.metageneration),
            (Some(1), 7, 2)
        );
        let lock = Lease::new(name.clone(), owner.clone(), ttl, "7:2");
        assert_eq!(Target::of(&c, &lock).expect("lock").object, "l/s");
        for bad in ["7:2", "x:7:2", "1:7", ""] {
            let lease = Lease::new(name.clone(), owner.clone(), ttl, bad).with_permits(permits);
            assert!(Target::of(&c, &lease).is_err(), "{bad}");
        }
    }
}
