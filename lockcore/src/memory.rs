//! [`MemoryBackend`]: the in-process reference implementation of the whole contract.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, SystemTime};

use async_trait::async_trait;
use futures_util::stream;
use tokio::sync::broadcast;
use tokio::time::Instant;

use crate::backend::{LockBackend, ReleaseEvents};
use crate::error::{Error, Result};
use crate::guarantees::{
    Durability, Exclusion, ExpiryClock, Fairness, Fencing, Guarantees, Semaphores, Waiting,
};
use crate::identity::Identity;
use crate::name::LockName;
use crate::note::Note;
use crate::permit_table::{Bend, PermitTable};
use crate::types::HeldLock;
use crate::types::{Acquire, AcquireRequest, FenceToken, HolderInfo, Lease};

/// An in-process lock table: monotonic fence tokens, TTL expiry on tokio's clock (so paused
/// test clocks work), release notification and same-identity instant retake.
///
/// It is the reference the conformance suite checks itself against, and the backend for
/// examples and unit tests. Locks exist only inside one process.
#[derive(Debug, Clone, Default)]
pub struct MemoryBackend {
    inner: Arc<Inner>,
    /// [`LockBackend::refresh_batch_limit`]; 0 and 1 both mean no batching.
    refresh_batch: usize,
}

#[derive(Debug)]
struct Inner {
    table: Mutex<Table>,
    released: broadcast::Sender<LockName>,
}

impl Default for Inner {
    fn default() -> Self {
        Self {
            table: Mutex::default(),
            released: broadcast::channel(1024).0,
        }
    }
}

#[derive(Debug, Default)]
struct Table {
    locks: HashMap<LockName, Entry>,
    /// Fence counters; never removed, so tokens stay monotonic across releases.
    counters: HashMap<LockName, u64>,
    /// Semaphores, a namespace of their own.
    permits: PermitTable,
}

#[derive(Debug, Clone)]
struct Entry {
    owner: Identity,
    note: Option<Note>,
    token: u64,
    acquired_at: SystemTime,
    expires: Instant,
}

impl MemoryBackend {
    /// An empty lock table.
    pub fn new() -> Self {
        Self::default()
    }

    /// Lets a [`Locker`](crate::Locker) refresh up to `limit` of this table's leases in one
    /// [`refresh_many`](LockBackend::refresh_many) call (by default each lease is
    /// refreshed on its own, as a backend without a batch call would).
    pub fn with_refresh_batch_limit(mut self, limit: usize) -> Self {
        self.refresh_batch = limit;
        self
    }

    /// Deletes `name` the way an operator would (no notification). Returns whether a lock
    /// was there.
    pub fn admin_delete(&self, name: &LockName) -> bool {
        self.table().locks.remove(name).is_some()
    }

    /// Overwrites `name` with a new owner and grant, the way an operator or a buggy client
    /// would. The new grant gets a fresh fence token.
    pub fn admin_steal(&self, name: &LockName, owner: Identity, ttl: Duration) {
        let mut table = self.table();
        let token = Self::next_token(&mut table, name);
        table
            .locks
            .insert(name.clone(), Entry::new(owner, None, token, ttl));
    }

    /// Grants `request` whoever holds the name (for [`crate::testing::Broken`]).
    #[cfg(any(test, feature = "testing"))]
    pub(crate) fn grant_unchecked(&self, request: &AcquireRequest) -> Lease {
        Self::grant(&mut self.table(), request)
    }

    /// Changes `name`'s entry, expired or not, if there is one (for
    /// [`crate::testing::Broken`]): its expiry, token or note.
    #[cfg(any(test, feature = "testing"))]
    pub(crate) fn edit(
        &self,
        name: &LockName,
        edit: impl FnOnce(&mut Instant, &mut u64, &mut Option<Note>),
    ) {
        if let Some(e) = self.table().locks.get_mut(name) {
            edit(&mut e.expires, &mut e.token, &mut e.note);
        }
    }

    /// Every entry, expired ones included, with whether it expired (for
    /// [`crate::testing::Broken`]).
    #[cfg(any(test, feature = "testing"))]
    pub(crate) fn entries(&self) -> Vec<(HeldLock, bool)> {
        let now = Instant::now();
        let table = self.table();
        let entries = table.locks.iter();
        entries
            .map(|(name, e)| (HeldLock::new(name.clone(), e.holder()), e.expires <= now))
            .collect()
    }

    /// Removes `name` and wakes its waiters when its holder satisfies `doomed`, checked
    /// under the same lock as the removal (for [`crate::testing::Broken`]).
    #[cfg(any(test, feature = "testing"))]
    pub(crate) fn remove_if(&self, name: &LockName, doomed: impl FnOnce(&Identity) -> bool) {
        let mut table = self.table();
        if table.locks.get(name).is_some_and(|e| doomed(&e.owner)) {
            table.locks.remove(name);
            drop(table);
            self.notify(name);
        }
    }

    fn table(&self) -> MutexGuard<'_, Table> {
        self.inner
            .table
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    fn next_token(table: &mut Table, name: &LockName) -> u64 {
        let counter = table.counters.entry(name.clone()).or_insert(0);
        *counter += 1;
        *counter
    }

    /// The live entry for `name`, dropping it if expired.
    fn live<'t>(table: &'t mut Table, name: &LockName) -> Option<&'t mut Entry> {
        let expired = table
            .locks
            .get(name)
            .is_some_and(|e| e.expires <= Instant::now());
        if expired {
            table.locks.remove(name);
        }
        table.locks.get_mut(name)
    }

    fn grant(table: &mut Table, request: &AcquireRequest) -> Lease {
        let token = Self::next_token(table, &request.name);
        let note = request.note.clone();
        let entry = Entry::new(request.owner.clone(), note, token, request.ttl.get());
        table.locks.insert(request.name.clone(), entry);
        Lease::new(
            request.name.clone(),
            request.owner.clone(),
            request.ttl,
            token.to_string(),
        )
        .with_token(FenceToken::new(token))
    }

    fn notify(&self, name: &LockName) {
        // No receivers is fine: nobody is waiting.
        let _ = self.inner.released.send(name.clone());
    }
}

impl Entry {
    fn new(owner: Identity, note: Option<Note>, token: u64, ttl: Duration) -> Self {
        Self {
            owner,
            note,
            token,
            acquired_at: SystemTime::now(),
            expires: Instant::now() + ttl,
        }
    }

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

impl MemoryBackend {
    /// A permit attempt bent by `bend` (for [`crate::testing::Broken`]).
    #[cfg(any(test, feature = "testing"))]
    pub(crate) fn bent_acquire_permit(
        &self,
        request: &AcquireRequest,
        bend: Bend,
    ) -> Result<Acquire> {
        self.table().permits.acquire(request, bend)
    }

    /// A permit refresh bent by `bend` (for [`crate::testing::Broken`]).
    #[cfg(any(test, feature = "testing"))]
    pub(crate) fn bent_refresh_permit(&self, lease: &Lease, bend: Bend) -> Result<Lease> {
        self.table().permits.refresh(lease, bend)
    }

    /// A permit release bent by `bend`, notifying waiters only when `notify` (for
    /// [`crate::testing::Broken`]).
    #[cfg(any(test, feature = "testing"))]
    pub(crate) fn bent_release_permit(&self, lease: &Lease, bend: Bend, notify: bool) {
        let released = self.table().permits.release(lease, bend);
        if released && notify {
            self.notify(lease.name());
        }
    }

    /// Extends `lease` if `table` still holds exactly that grant.
    fn refresh_in(table: &mut Table, lease: &Lease) -> Result<Lease> {
        if lease.permits().is_some() {
            return table.permits.refresh(lease, Bend::default());
        }
        match Self::live(table, lease.name()) {
            Some(entry) if entry.is_grant_of(lease) => {
                entry.expires = Instant::now() + lease.ttl().get();
                Ok(lease.clone())
            }
            Some(entry) => Err(Error::lost(format!("taken over by {}", entry.owner))),
            None => Err(Error::lost("the lock was deleted or expired")),
        }
    }
}

#[async_trait]
impl LockBackend for MemoryBackend {
    fn backend_name(&self) -> &str {
        "memory"
    }

    async fn acquire(&self, request: &AcquireRequest) -> Result<Acquire> {
        let mut table = self.table();
        if let Some(entry) = Self::live(&mut table, &request.name)
            && entry.owner != request.owner
        {
            return Ok(Acquire::Held(entry.holder()));
        }
        Ok(Acquire::Acquired(Self::grant(&mut table, request)))
    }

    async fn refresh(&self, lease: &Lease) -> Result<Lease> {
        Self::refresh_in(&mut self.table(), lease)
    }

    async fn refresh_many(&self, leases: &[Lease]) -> Vec<Result<Lease>> {
        let mut table = self.table();
        leases
            .iter()
            .map(|lease| Self::refresh_in(&mut table, lease))
            .collect()
    }

    fn refresh_batch_limit(&self) -> usize {
        self.refresh_batch.max(1)
    }

    async fn release(&self, lease: &Lease) -> Result<()> {
        let mut table = self.table();
        if lease.permits().is_some() {
            let released = table.permits.release(lease, Bend::default());
            drop(table);
            if released {
                self.notify(lease.name());
            }
            return Ok(());
        }
        let ours = table
            .locks
            .get(lease.name())
            .is_some_and(|entry| entry.is_grant_of(lease));
        if ours {
            table.locks.remove(lease.name());
            drop(table);
            self.notify(lease.name());
        }
        Ok(())
    }

    async fn inspect(&self, name: &LockName) -> Result<Option<HolderInfo>> {
        Ok(Self::live(&mut self.table(), name).map(|e| e.holder()))
    }

    async fn acquire_permit(&self, request: &AcquireRequest) -> Result<Acquire> {
        self.table().permits.acquire(request, Bend::default())
    }

    async fn inspect_permits(&self, name: &LockName) -> Result<Vec<HolderInfo>> {
        Ok(self.table().permits.holders(name))
    }

    async fn list(&self, prefix: &str) -> Result<Vec<HeldLock>> {
        let now = Instant::now();
        let table = self.table();
        let mut held: Vec<_> = table
            .locks
            .iter()
            .filter(|(name, e)| name.as_str().starts_with(prefix) && e.expires > now)
            .map(|(name, e)| HeldLock::new(name.clone(), e.holder()))
            .collect();
        held.sort_by(|a, b| a.name().cmp(b.name()));
        Ok(held)
    }

    async fn break_lock(&self, name: &LockName) -> Result<Option<HolderInfo>> {
        let mut table = self.table();
        let holder = Self::live(&mut table, name).map(|e| e.holder());
        table.locks.remove(name);
        drop(table);
        if holder.is_some() {
            self.notify(name);
        }
        Ok(holder)
    }

    async fn connection_security(&self) -> Result<Vec<crate::ConnectionSecurity>> {
        Ok(vec![crate::ConnectionSecurity::new(
            "memory",
            crate::Transport::Local,
        )])
    }

    fn guarantees(&self) -> Guarantees {
        Guarantees::new(
            Exclusion::InProcess,
            Fencing::Monotonic,
            ExpiryClock::Server,
        )
        .with_waiting(Waiting::Notified)
        .with_fairness(Fairness::None)
        .with_same_owner_retake(true)
        .with_durability(Durability::LostOnRestart)
        .with_listing(true)
        .with_semaphores(Semaphores::Supported)
        .with_notes("Reference backend: locks live in one process and vanish with it.")
    }

    async fn subscribe(&self, name: &LockName) -> Result<Option<ReleaseEvents>> {
        let rx = self.inner.released.subscribe();
        let name = name.clone();
        let events = stream::unfold((rx, name), |(mut rx, name)| async move {
            loop {
                match rx.recv().await {
                    Ok(released) if released == name => return Some(((), (rx, name))),
                    Ok(_) => continue,
                    // Lagged: we may have missed ours; a spurious wake-up is allowed.
                    Err(broadcast::error::RecvError::Lagged(_)) => return Some(((), (rx, name))),
                    Err(broadcast::error::RecvError::Closed) => return None,
                }
            }
        });
        Ok(Some(Box::pin(events)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Ttl;

    fn request(name: &str, owner: &Identity, ttl_ms: u64) -> AcquireRequest {
        let name = LockName::new(name).expect("valid");
        AcquireRequest::new(
            name,
            owner.clone(),
            Ttl::new(Duration::from_millis(ttl_ms)).expect("valid"),
        )
    }

    fn acquired(outcome: Acquire) -> Lease {
        match outcome {
            Acquire::Acquired(lease) => lease,
            Acquire::Held(h) => panic!("expected Acquired, held by {}", h.owner()),
        }
    }

    #[test]
    fn grants_exclusively_and_reports_the_holder() {
        crate::tests::bounded(grants_exclusively_and_reports_the_holder_body);
    }

    async fn grants_exclusively_and_reports_the_holder_body() {
        let backend = MemoryBackend::new();
        let (a, b) = (Identity::unique(), Identity::unique());
        let lease = acquired(backend.acquire(&request("x", &a, 1000)).await.expect("ok"));
        assert_eq!(lease.token(), Some(FenceToken::new(1)));
        match backend.acquire(&request("x", &b, 1000)).await.expect("ok") {
            Acquire::Held(h) => {
                assert_eq!(h.owner(), &a);
                assert_eq!(h.expires_in(), Some(Duration::from_millis(1000)));
            }
            Acquire::Acquired(_) => panic!("double grant"),
        }
    }

    #[test]
    fn expiry_frees_the_lock_and_tokens_keep_increasing() {
        crate::tests::bounded(expiry_frees_the_lock_and_tokens_keep_increasing_body);
    }

    async fn expiry_frees_the_lock_and_tokens_keep_increasing_body() {
        let backend = MemoryBackend::new();
        let (a, b) = (Identity::unique(), Identity::unique());
        let first = acquired(backend.acquire(&request("x", &a, 100)).await.expect("ok"));
        tokio::time::advance(Duration::from_millis(100)).await;
        let second = acquired(backend.acquire(&request("x", &b, 100)).await.expect("ok"));
        assert!(second.token() > first.token());
        let err = backend.refresh(&first).await.expect_err("stale lease");
        assert_eq!(err.kind(), crate::ErrorKind::Lost);
        backend.release(&first).await.expect("stale release is ok");
        assert_eq!(
            backend
                .inspect(second.name())
                .await
                .expect("ok")
                .map(|h| h.owner().clone()),
            Some(b)
        );
    }

    #[test]
    fn same_identity_retakes_with_a_new_token() {
        crate::tests::bounded(same_identity_retakes_with_a_new_token_body);
    }

    async fn same_identity_retakes_with_a_new_token_body() {
        let backend = MemoryBackend::new();
        let a = Identity::unique();
        let first = acquired(backend.acquire(&request("x", &a, 1000)).await.expect("ok"));
        let again = acquired(backend.acquire(&request("x", &a, 1000)).await.expect("ok"));
        assert!(again.token() > first.token());
        assert!(
            backend.refresh(&first).await.is_err(),
            "old grant is superseded"
        );
    }
}
