//! [`Broken`]: a [`MemoryBackend`] with one deliberate bug, so the conformance suite can
//! prove that each of its cases is able to fail. The bugs live here, outside the memory
//! backend's own paths, which stay those of a correct backend.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use async_trait::async_trait;
use tokio::time::Instant;

use crate::backend::{LockBackend, ReleaseEvents};
use crate::error::Result;
use crate::guarantees::Guarantees;
use crate::identity::Identity;
use crate::memory::MemoryBackend;
use crate::name::LockName;
use crate::note::Note;
use crate::permit_table::Bend;
use crate::types::{Acquire, AcquireRequest, FenceToken, HeldLock, HolderInfo, Lease};

/// Deliberate bugs for [`Broken`], so the conformance suite can prove that each of its
/// cases is able to fail. Never use them outside tests.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Defect {
    /// `release` deletes the lock whoever holds it.
    ReleaseIgnoresOwner,
    /// `release` deletes the lock when the owner matches, whatever the grant (a backend
    /// that stores only the owner): a stale release of an owner removes its newer grant.
    ReleaseChecksOwnerOnly,
    /// Leases never expire.
    NeverExpires,
    /// Every grant gets fence token 1.
    NonMonotonicTokens,
    /// `refresh` succeeds even after the lock was stolen or deleted (and re-creates it).
    RefreshIgnoresOwner,
    /// `refresh_many` extends each lease's lock by name, whoever holds it, and answers
    /// every lease with success (a pipelined `PEXPIRE` without the owner check).
    BatchRefreshMatchesName,
    /// `refresh_many` answers in reverse order.
    BatchAnswersReversed,
    /// `acquire` checks, yields, then writes: two contenders can both win.
    RacyAcquire,
    /// `list` reports leases that expired but were not yet removed.
    ListsExpired,
    /// `list` reads `_` in the prefix as "any character", as an unescaped SQL `LIKE` does.
    ListReadsPatterns,
    /// `refresh` rewrites the stored grant without its note.
    RefreshDropsNote,
    /// A grant without a note shows the note of the name's previous grant (a note stored
    /// beside the lock and never deleted).
    NoteOutlivesGrant,
    /// `acquire_permit` admits one holder more than the semaphore's permits.
    PermitOverGrant,
    /// Releasing a permit answers `Ok` and leaves it held until its TTL (a leaked permit).
    PermitReleaseKeeps,
    /// `acquire_permit` gives an owner a second permit instead of retaking its first.
    PermitIgnoresOwner,
    /// `acquire_permit` admits a request whatever limit the live permits were taken with.
    PermitIgnoresLimit,
    /// Permits never expire.
    PermitNeverExpires,
    /// Refreshing a permit that is gone puts it back.
    PermitRefreshRecreates,
    /// Refreshing a permit answers `Ok` and extends nothing.
    PermitRefreshNoop,
    /// Releasing a permit removes the semaphore's oldest permit, whoever holds it.
    PermitReleaseOldest,
    /// Releasing a permit wakes nobody.
    PermitReleaseSilent,
    /// A live permit of a name makes the lock of that name look held (one namespace).
    PermitBlocksLock,
}

/// A [`MemoryBackend`] with one [`Defect`]; every call the defect does not concern is the
/// memory backend's own.
#[derive(Debug, Clone)]
pub struct Broken {
    memory: MemoryBackend,
    defect: Defect,
    /// The last note per name, for [`Defect::NoteOutlivesGrant`].
    stale_notes: Arc<Mutex<HashMap<LockName, Note>>>,
}

/// How far away "never" is for [`Defect::NeverExpires`].
const NEVER: Duration = Duration::from_secs(365 * 24 * 3600);

impl Broken {
    /// An empty lock table with `defect`.
    pub fn new(defect: Defect) -> Self {
        Self {
            memory: MemoryBackend::new(),
            defect,
            stale_notes: Arc::default(),
        }
    }

    /// The table underneath, for operator actions (`admin_delete`, `admin_steal`).
    pub fn memory(&self) -> &MemoryBackend {
        &self.memory
    }

    /// The defect.
    pub fn defect(&self) -> Defect {
        self.defect
    }

    /// What the memory backend granted, bent by the defect.
    fn bend_grant(&self, request: &AcquireRequest, lease: Lease) -> Lease {
        let name = &request.name;
        match self.defect {
            Defect::NonMonotonicTokens => {
                self.memory.edit(name, |_, token, _| *token = 1);
                let lease = Lease::new(name.clone(), request.owner.clone(), request.ttl, "1");
                lease.with_token(FenceToken::new(1))
            }
            Defect::NeverExpires => {
                self.memory
                    .edit(name, |expires, _, _| *expires = Instant::now() + NEVER);
                lease
            }
            Defect::NoteOutlivesGrant => {
                let mut stale = self
                    .stale_notes
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner);
                match &request.note {
                    Some(note) => drop(stale.insert(name.clone(), note.clone())),
                    None => {
                        let old = stale.get(name).cloned();
                        self.memory.edit(name, |_, _, note| *note = old);
                    }
                }
                lease
            }
            _ => lease,
        }
    }

    /// How the defect bends the semaphore rules.
    fn bend(&self) -> Bend {
        let mut bend = Bend::default();
        match self.defect {
            Defect::PermitOverGrant => bend.over_grant = true,
            Defect::PermitIgnoresOwner => bend.ignore_owner = true,
            Defect::PermitIgnoresLimit => bend.ignore_limit = true,
            Defect::PermitNeverExpires => bend.never_expire = true,
            Defect::PermitRefreshRecreates => bend.refresh_recreates = true,
            Defect::PermitRefreshNoop => bend.refresh_noop = true,
            Defect::PermitReleaseOldest => bend.release_oldest = true,
            _ => {}
        }
        bend
    }

    fn listed(&self, prefix: &str, keep_expired: bool) -> Vec<HeldLock> {
        let patterns = self.defect == Defect::ListReadsPatterns;
        let mut held: Vec<HeldLock> = (self.memory.entries().into_iter())
            .filter(|(lock, expired)| {
                matches_prefix(lock.name().as_str(), prefix, patterns) && (keep_expired || !expired)
            })
            .map(|(lock, _)| lock)
            .collect();
        held.sort_by(|a, b| a.name().cmp(b.name()));
        held
    }
}

/// Whether `name` starts with `prefix`, with `_` matching any one character when
/// `patterns` (as an unescaped SQL `LIKE` reads it).
fn matches_prefix(name: &str, prefix: &str, patterns: bool) -> bool {
    if !patterns {
        return name.starts_with(prefix);
    }
    let mut chars = name.chars();
    prefix
        .chars()
        .all(|p| chars.next().is_some_and(|c| p == '_' || p == c))
}

#[async_trait]
impl LockBackend for Broken {
    fn backend_name(&self) -> &str {
        self.memory.backend_name()
    }

    async fn acquire(&self, request: &AcquireRequest) -> Result<Acquire> {
        if self.defect == Defect::PermitBlocksLock {
            let permits = self.memory.inspect_permits(&request.name).await?;
            if let Some(holder) = permits.into_iter().next() {
                return Ok(Acquire::Held(holder));
            }
        }
        if self.defect == Defect::RacyAcquire {
            let free = self.memory.inspect(&request.name).await?.is_none();
            tokio::task::yield_now().await;
            if !free {
                return Ok(Acquire::Held(HolderInfo::new(Identity::from_stored("?"))));
            }
            return Ok(Acquire::Acquired(self.memory.grant_unchecked(request)));
        }
        match self.memory.acquire(request).await? {
            Acquire::Acquired(lease) => Ok(Acquire::Acquired(self.bend_grant(request, lease))),
            held => Ok(held),
        }
    }

    async fn refresh(&self, lease: &Lease) -> Result<Lease> {
        let name = lease.name();
        if lease.permits().is_some() {
            return self.memory.bent_refresh_permit(lease, self.bend());
        }
        match self.defect {
            Defect::RefreshIgnoresOwner => {
                let token = lease.token().map_or(0, FenceToken::get);
                self.memory
                    .admin_steal(name, lease.owner().clone(), lease.ttl().get());
                self.memory.edit(name, |_, t, _| *t = token);
                Ok(lease.clone())
            }
            Defect::RefreshDropsNote => {
                let refreshed = self.memory.refresh(lease).await?;
                self.memory.edit(name, |_, _, note| *note = None);
                Ok(refreshed)
            }
            Defect::NeverExpires => {
                let refreshed = self.memory.refresh(lease).await?;
                self.memory
                    .edit(name, |expires, _, _| *expires = Instant::now() + NEVER);
                Ok(refreshed)
            }
            _ => self.memory.refresh(lease).await,
        }
    }

    async fn refresh_many(&self, leases: &[Lease]) -> Vec<Result<Lease>> {
        if self.defect != Defect::BatchRefreshMatchesName {
            let mut results = Vec::with_capacity(leases.len());
            for lease in leases {
                results.push(self.refresh(lease).await);
            }
            if self.defect == Defect::BatchAnswersReversed {
                results.reverse();
            }
            return results;
        }
        let now = Instant::now();
        (leases.iter())
            .map(|lease| {
                let ttl = lease.ttl().get();
                self.memory
                    .edit(lease.name(), |expires, _, _| *expires = now + ttl);
                Ok(lease.clone())
            })
            .collect()
    }

    async fn release(&self, lease: &Lease) -> Result<()> {
        // Each defect's check and delete happen under one lock of the table, so a defect
        // never also deletes a third owner's grant taken in between.
        let name = lease.name();
        if lease.permits().is_some() {
            if self.defect != Defect::PermitReleaseKeeps {
                let notify = self.defect != Defect::PermitReleaseSilent;
                self.memory.bent_release_permit(lease, self.bend(), notify);
            }
            return Ok(());
        }
        match self.defect {
            Defect::ReleaseIgnoresOwner => self.memory.remove_if(name, |_| true),
            Defect::ReleaseChecksOwnerOnly => {
                self.memory.remove_if(name, |owner| owner == lease.owner());
            }
            _ => return self.memory.release(lease).await,
        }
        Ok(())
    }

    fn fence_token(&self, lease: &Lease) -> Option<FenceToken> {
        self.memory.fence_token(lease)
    }

    async fn inspect(&self, name: &LockName) -> Result<Option<HolderInfo>> {
        self.memory.inspect(name).await
    }

    async fn acquire_permit(&self, request: &AcquireRequest) -> Result<Acquire> {
        self.memory.bent_acquire_permit(request, self.bend())
    }

    async fn inspect_permits(&self, name: &LockName) -> Result<Vec<HolderInfo>> {
        self.memory.inspect_permits(name).await
    }

    fn guarantees(&self) -> Guarantees {
        self.memory.guarantees()
    }

    async fn list(&self, prefix: &str) -> Result<Vec<HeldLock>> {
        match self.defect {
            Defect::ListsExpired | Defect::NeverExpires => Ok(self.listed(prefix, true)),
            Defect::ListReadsPatterns => Ok(self.listed(prefix, false)),
            _ => self.memory.list(prefix).await,
        }
    }

    async fn break_lock(&self, name: &LockName) -> Result<Option<HolderInfo>> {
        self.memory.break_lock(name).await
    }

    async fn subscribe(&self, name: &LockName) -> Result<Option<ReleaseEvents>> {
        self.memory.subscribe(name).await
    }

    async fn connection_security(&self) -> Result<Vec<crate::ConnectionSecurity>> {
        self.memory.connection_security().await
    }
}
