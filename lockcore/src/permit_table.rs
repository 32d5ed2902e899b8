//! The semaphore half of [`MemoryBackend`](crate::MemoryBackend)'s table: live permits per
//! semaphore name, one per owner, with their own fence counters.

use std::collections::HashMap;
use std::time::SystemTime;

use tokio::time::Instant;

use crate::error::{Error, Result};
use crate::identity::Identity;
use crate::name::LockName;
use crate::note::Note;
use crate::permit_count::Permits;
use crate::permits::limit_conflict;
use crate::types::{Acquire, AcquireRequest, FenceToken, HolderInfo, Lease};

/// How a deliberately broken table bends the rules (for [`crate::testing::Broken`]); the
/// default keeps them all.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Bend {
    /// Admits one holder too many.
    pub(crate) over_grant: bool,
    /// Gives an owner a second permit instead of retaking its first.
    pub(crate) ignore_owner: bool,
    /// Admits a request whatever limit the live permits were taken with.
    pub(crate) ignore_limit: bool,
    /// Grants permits that never expire.
    pub(crate) never_expire: bool,
    /// A refresh of a permit that is gone puts it back.
    pub(crate) refresh_recreates: bool,
    /// A refresh answers `Ok` and extends nothing.
    pub(crate) refresh_noop: bool,
    /// A release removes the semaphore's oldest permit, whoever holds it.
    pub(crate) release_oldest: bool,
}

/// Every semaphore's permits; expired ones are dropped when their semaphore is read.
#[derive(Debug, Default)]
pub(crate) struct PermitTable {
    held: HashMap<LockName, Vec<Permit>>,
    /// Fence counters per semaphore name, never removed.
    counters: HashMap<LockName, u64>,
}

#[derive(Debug, Clone)]
struct Permit {
    owner: Identity,
    limit: Permits,
    token: u64,
    note: Option<Note>,
    acquired_at: SystemTime,
    expires: Instant,
}

impl Permit {
    fn holder(&self) -> HolderInfo {
        HolderInfo::new(self.owner.clone())
            .with_acquired_at(self.acquired_at)
            .with_expires_in(self.expires.saturating_duration_since(Instant::now()))
            .with_token(FenceToken::new(self.token))
            .with_note(self.note.clone())
    }

    fn is_grant_of(&self, lease: &Lease) -> bool {
        self.owner == *lease.owner() && self.token.to_string() == lease.grant()
    }
}

impl PermitTable {
    /// The live permits of `name`, expired ones dropped.
    fn live(&mut self, name: &LockName) -> &mut Vec<Permit> {
        let now = Instant::now();
        let permits = self.held.entry(name.clone()).or_default();
        permits.retain(|p| p.expires > now);
        permits
    }

    /// One attempt at a permit (see [`LockBackend::acquire_permit`](crate::LockBackend::acquire_permit)),
    /// bent by `bend`.
    pub(crate) fn acquire(&mut self, request: &AcquireRequest, bend: Bend) -> Result<Acquire> {
        let Some(limit) = request.permits else {
            return Err(Error::new(
                crate::ErrorKind::InvalidInput,
                "a permit request without a number of permits",
            ));
        };
        let name = &request.name;
        let permits = self.live(name);
        if let Some(other) = permits
            .iter()
            .find(|p| p.limit != limit && !bend.ignore_limit)
        {
            return Err(limit_conflict(
                name.as_str(),
                other.limit.get(),
                limit.get(),
            ));
        }
        let others = permits
            .iter()
            .filter(|p| p.owner != request.owner || bend.ignore_owner);
        let taken = others.clone().count();
        let room = limit.get() as usize + usize::from(bend.over_grant);
        if taken >= room {
            let first = others.min_by_key(|p| p.expires).map(Permit::holder);
            return Ok(Acquire::Held(first.expect("a full semaphore has holders")));
        }
        if !bend.ignore_owner {
            permits.retain(|p| p.owner != request.owner);
        }
        let counter = self.counters.entry(name.clone()).or_insert(0);
        *counter += 1;
        let token = *counter;
        let permit = Permit {
            owner: request.owner.clone(),
            limit,
            token,
            note: request.note.clone(),
            acquired_at: SystemTime::now(),
            expires: Instant::now() + request.ttl.get() * if bend.never_expire { 1000 } else { 1 },
        };
        self.held.entry(name.clone()).or_default().push(permit);
        let lease = Lease::new(
            name.clone(),
            request.owner.clone(),
            request.ttl,
            token.to_string(),
        );
        Ok(Acquire::Acquired(
            lease.with_token(FenceToken::new(token)).with_permits(limit),
        ))
    }

    /// Extends the permit `lease` if it is still live and exactly that grant, bent by
    /// `bend`.
    pub(crate) fn refresh(&mut self, lease: &Lease, bend: Bend) -> Result<Lease> {
        let expires = Instant::now() + lease.ttl().get();
        let live = self.live(lease.name());
        match live.iter_mut().find(|p| p.is_grant_of(lease)) {
            Some(_) if bend.refresh_noop => Ok(lease.clone()),
            Some(permit) => {
                permit.expires = expires;
                Ok(lease.clone())
            }
            None if bend.refresh_recreates => {
                live.push(Permit {
                    owner: lease.owner().clone(),
                    limit: lease.permits().unwrap_or(Permits::MIN),
                    token: lease.grant().parse().unwrap_or(0),
                    note: None,
                    acquired_at: SystemTime::now(),
                    expires,
                });
                Ok(lease.clone())
            }
            None => Err(Error::lost(
                "the permit was released, expired or taken over",
            )),
        }
    }

    /// Removes the permit `lease` if it is exactly that grant (bent by `bend`); `true`
    /// when it was there.
    pub(crate) fn release(&mut self, lease: &Lease, bend: Bend) -> bool {
        let Some(permits) = self.held.get_mut(lease.name()) else {
            return false;
        };
        let before = permits.len();
        if bend.release_oldest {
            if let Some(oldest) = (0..permits.len()).min_by_key(|&i| permits[i].token) {
                permits.remove(oldest);
            }
        } else {
            permits.retain(|p| !p.is_grant_of(lease));
        }
        let released = permits.len() < before;
        if permits.is_empty() {
            self.held.remove(lease.name());
        }
        released
    }

    /// The live permits of `name`, earliest grant first.
    pub(crate) fn holders(&mut self, name: &LockName) -> Vec<HolderInfo> {
        let mut permits = self.live(name).clone();
        if permits.is_empty() {
            self.held.remove(name);
        }
        permits.sort_by_key(|p| p.token);
        permits.iter().map(Permit::holder).collect()
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::Ttl;

    /// A semaphore whose permits are all gone leaves no entry behind (a long-lived process
    /// reading many names must not grow), and reading an unknown name adds none.
    #[tokio::test]
    async fn empty_semaphores_leave_no_entry() {
        let mut table = PermitTable::default();
        let name = LockName::new("s").expect("name");
        let ttl = Ttl::new(Duration::from_secs(30)).expect("ttl");
        let request = AcquireRequest::new(name.clone(), Identity::unique(), ttl)
            .with_permits(Permits::new(2).expect("2"));
        let Ok(Acquire::Acquired(lease)) = table.acquire(&request, Bend::default()) else {
            panic!("a free semaphore");
        };
        assert!(table.release(&lease, Bend::default()));
        assert!(table.held.is_empty(), "released: {:?}", table.held);
        assert!(
            table
                .holders(&LockName::new("other").expect("name"))
                .is_empty()
        );
        assert!(table.held.is_empty(), "read: {:?}", table.held);
        assert_eq!(table.counters.len(), 1, "the counter stays");
    }
}
