//! [`LocalBackend`]: the [`LockBackend`] implementation over the SQLite lease table.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, UNIX_EPOCH};

use async_trait::async_trait;
use lockcore::{
    Acquire, AcquireRequest, Error, ErrorKind, FenceToken, Guarantees, HeldLock, HolderInfo,
    Identity, Lease, LockBackend, LockName, Note, ReleaseEvents, Result, Ttl,
};

use crate::batch::BATCH;
use crate::client::{Claim, Client, Row};
use crate::config::LocalConfig;
use crate::host::{self, Host, Now, SystemHost};
use crate::liveness::{Held, HolderDir, Probe};

/// Cross-process locks on one machine, with no server: a lease table in a SQLite file.
///
/// - Expiry is judged on the machine's monotonic clock (`CLOCK_MONOTONIC`), which every
///   process shares, which NTP cannot step, and which stops during suspend; the guard's
///   clock counts a suspend, so after a resume the holder gives up before the store frees
///   the lease. Off Linux, the wall clock. A lease written under another boot
///   (before a reboot, or by another host or sandbox sharing the file) lasts until its
///   expiry on the wall clock, the one clock two boots share.
/// - Each holder holds a kernel lock (`flock`) on a file of its own while it holds the
///   lease. A contender of the same boot that can take that kernel lock knows every
///   process that held it is gone (in any PID namespace) and takes the lock over at once
///   instead of waiting for the TTL. Nothing else (an unreadable `/proc`, a pid it cannot see) counts as
///   death. The descriptor is inherited by commands started while the lease is held, so
///   the lease is not taken over while such a command still runs. A lease left to outlive
///   its holder (`LockBackend::detach`) names no file and lasts until its TTL.
/// - Rows are kept on release, so fence tokens only grow, across restarts and reboots.
/// - Semaphores (`acquire_permit`): a row per live permit in a table of their own, and a
///   fence counter per semaphore name that is never deleted (`permits.rs`).
/// - Waiters are woken by the kernel on Linux: an inotify watch sees the holder's liveness
///   file go when its lease is released (`wake.rs`); elsewhere they poll.
#[derive(Debug, Clone)]
pub struct LocalBackend {
    client: Client,
    config: LocalConfig,
    holders: HolderDir,
    /// This machine's boot and clocks.
    host: Arc<dyn Host>,
    /// Our locked liveness files, one per lease we hold.
    held: Arc<Mutex<HashMap<Grant, Held>>>,
    /// Wakes waiters when a holder's liveness file is deleted (its lease was released).
    #[cfg(target_os = "linux")]
    wake: crate::wake::Watcher,
}

/// A grant of ours: a lock's or a semaphore permit's (whose tokens are counted apart from
/// the lock's of the same name), by name and token.
type Grant = (Kind, String, i64);

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum Kind {
    Lock,
    Permit,
}

impl Kind {
    fn of(lease: &Lease) -> Self {
        match lease.permits() {
            Some(_) => Self::Permit,
            None => Self::Lock,
        }
    }
}

impl LocalBackend {
    /// Opens the database in `config`, creating the file and table if needed.
    ///
    /// # Errors
    /// [`ErrorKind::Config`] when the directory or file cannot be created or opened, or,
    /// on Linux, when this process cannot read the boot id (a chroot without `/proc`, a
    /// sandbox): it could then not tell this boot's leases from an earlier boot's;
    /// [`ErrorKind::PermissionDenied`] when it is read-only.
    pub async fn connect(config: LocalConfig) -> Result<Self> {
        Self::connect_on(config, Arc::new(SystemHost)).await
    }

    /// [`connect`](Self::connect) on the machine `host` describes (tests play another boot
    /// or a suspend with it).
    pub(crate) async fn connect_on(config: LocalConfig, host: Arc<dyn Host>) -> Result<Self> {
        host::require_boot_id(host.as_ref())?;
        let (db, holders) = crate::store::prepare(&config, host.as_ref())?;
        let client = Client::open(&config, &db).await?;
        Ok(Self {
            client,
            config,
            #[cfg(target_os = "linux")]
            wake: crate::wake::Watcher::new(holders.path()),
            holders,
            host,
            held: Arc::default(),
        })
    }

    /// The configuration.
    pub fn config(&self) -> &LocalConfig {
        &self.config
    }

    /// Overwrites `name` so that `owner` holds it for `ttl`, with a new token, whoever
    /// holds it now. For tests and emergencies; prefer `LockBackend::break_lock`.
    ///
    /// # Errors
    /// Database errors, as for every call.
    #[doc(hidden)]
    pub async fn force_owner(
        &self,
        name: &LockName,
        owner: &Identity,
        ttl: Duration,
    ) -> Result<()> {
        let forced = async {
            let claim = self.claim(name, owner, Ttl::new(ttl)?, None, None);
            self.client.force(&claim).await
        };
        // Called outside a Locker: name backend and lock here.
        forced.await.map_err(|e| e.in_context("local", name))
    }

    /// Closes the connection pool.
    pub async fn close(&self) {
        self.client.close().await;
    }

    /// Now, on the clock that decides expiry.
    fn now_ms(&self) -> i64 {
        host::expiry_now_ms(self.host.as_ref())
    }

    /// Now, on both clocks, for judging leases of this boot and of others.
    fn now(&self) -> Now<'_> {
        Now {
            boot_id: self.host.boot_id(),
            expiry_ms: self.now_ms(),
            wall_ms: self.host.wall_ms(),
        }
    }

    fn claim<'a>(
        &'a self,
        name: &'a LockName,
        owner: &'a Identity,
        ttl: Ttl,
        liveness: Option<&'a Held>,
        note: Option<&'a Note>,
    ) -> Claim<'a> {
        Claim {
            name: name.as_str(),
            owner: owner.as_str(),
            boot_id: self.host.boot_id(),
            liveness: liveness.map(Held::key),
            note: note.map(Note::as_str),
            now_ms: self.now_ms(),
            ttl,
            wall_ms: self.host.wall_ms(),
        }
    }

    fn held(&self) -> std::sync::MutexGuard<'_, HashMap<Grant, Held>> {
        self.held.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Our liveness file for the next claim. Without one the grant still happens, but
    /// contenders cannot prove our death and wait for the TTL instead.
    fn hold_liveness(&self, name: &LockName) -> Option<Held> {
        self.holders
            .hold()
            .map_err(|err| {
                tracing::warn!(lock = %name, %err, dir = %self.holders.path().display(),
                    "no liveness file: if this process dies, the lock waits for its TTL");
            })
            .ok()
    }

    /// Keeps `liveness` locked for as long as `lease` (the grant `token` of a lock or of a
    /// semaphore permit) is ours.
    fn granted(&self, lease: Lease, token: i64, liveness: Option<Held>) -> Acquire {
        if let Some(held) = liveness {
            let grant = (Kind::of(&lease), lease.name().as_str().to_owned(), token);
            self.held().insert(grant, held);
        }
        Acquire::Acquired(lease)
    }

    /// Unlocks and removes our liveness file for the grant `token` of `lease`.
    fn forget(&self, lease: &Lease, token: i64) {
        let grant = (Kind::of(lease), lease.name().as_str().to_owned(), token);
        let held = self.held().remove(&grant);
        drop(held);
    }

    /// The lock is held by `row`'s holder: takes it over if that holder is provably dead.
    /// Only a holder of this boot can be: another boot's holder ran on another kernel (or
    /// before a reboot), whose kernel locks prove nothing here.
    async fn take_over_if_dead(
        &self,
        claim: &Claim<'_>,
        row: &Row,
        name: &LockName,
    ) -> Result<Option<i64>> {
        if !claim.now().is_this_boot(row.boot_id.as_deref()) {
            return Ok(None);
        }
        let Probe::Dead(dead) = self.holders.probe(row.liveness.as_deref()) else {
            return Ok(None);
        };
        let token = match self.client.take_over(claim, row).await {
            Ok(token) => token,
            Err(err) => {
                // The row may still name the dead file: keep it for the next contender.
                dead.unlock_only();
                return Err(err);
            }
        };
        if token.is_some() {
            tracing::info!(lock = %name, "took over from a dead holder");
        }
        // The row names it no more (taken over, or changed since we read it): remove the
        // dead file, and only then unlock it.
        drop(dead);
        Ok(token)
    }
}

impl LocalConfig {
    /// Opens the database this config names, with [`LocalBackend::connect`] (here rather
    /// than in the config's module, which the backend depends on).
    ///
    /// # Errors
    /// As [`LocalBackend::connect`].
    pub async fn build(self) -> Result<LocalBackend> {
        LocalBackend::connect(self).await
    }
}

/// The holder described by `row`, or `None` when the row is free at `now` (the rule of
/// [`Now::left_ms`]: another boot's lease by its wall-clock expiry).
fn holder_info(row: &Row, now: &Now<'_>) -> Option<HolderInfo> {
    let owner = row.owner.as_ref()?;
    let left = row.left_ms(now)?;
    let left = Duration::from_millis(u64::try_from(left).unwrap_or(0));
    let mut info = HolderInfo::new(Identity::from_stored(owner.as_str()))
        .with_expires_in(left)
        .with_token(FenceToken::new(u64::try_from(row.token).unwrap_or(0)))
        .with_note(row.note.as_deref().and_then(Note::from_stored));
    if let Some(ms) = row.acquired_ms.and_then(|ms| u64::try_from(ms).ok()) {
        info = info.with_acquired_at(UNIX_EPOCH + Duration::from_millis(ms));
    }
    Some(info)
}

fn token_of(lease: &Lease) -> Result<i64> {
    lease.grant().parse().map_err(|_| {
        Error::new(
            ErrorKind::InvalidInput,
            "this lease was not issued by the local backend",
        )
    })
}

/// The lease of the grant `token` of `request` (a permit's is marked as one by its caller).
fn lease(request: &AcquireRequest, token: i64) -> Lease {
    let fence = FenceToken::new(u64::try_from(token).unwrap_or(0));
    Lease::new(
        request.name.clone(),
        request.owner.clone(),
        request.ttl,
        token.to_string(),
    )
    .with_token(fence)
}

#[async_trait]
impl LockBackend for LocalBackend {
    fn backend_name(&self) -> &str {
        "local"
    }

    async fn acquire(&self, request: &AcquireRequest) -> Result<Acquire> {
        // Locked before the claim is written: a row never names an unlocked file.
        let liveness = self.hold_liveness(&request.name);
        let claim = self.claim(
            &request.name,
            &request.owner,
            request.ttl,
            liveness.as_ref(),
            request.note.as_ref(),
        );
        if let Some(token) = self.client.grant(&claim).await? {
            return Ok(self.granted(lease(request, token), token, liveness));
        }
        let row = self.client.read(claim.name).await?;
        let Some(row) = row else {
            return Err(Error::unavailable(
                "the lock row vanished during the attempt",
            ));
        };
        let Some(holder) = holder_info(&row, &claim.now()) else {
            // Freed between the two statements: say so, the caller retries at once.
            return Err(Error::unavailable(
                "the lock was released during the attempt",
            ));
        };
        let taken = self.take_over_if_dead(&claim, &row, &request.name).await;
        if let Some(token) = taken? {
            return Ok(self.granted(lease(request, token), token, liveness));
        }
        Ok(Acquire::Held(holder))
    }

    async fn refresh(&self, lease: &Lease) -> Result<Lease> {
        let token = token_of(lease)?;
        let claim = self.claim(lease.name(), lease.owner(), lease.ttl(), None, None);
        let extended = match Kind::of(lease) {
            Kind::Lock => self.client.extend(&claim, token).await?,
            Kind::Permit => self.client.extend_permit(&claim, token).await?,
        };
        self.refreshed(lease, token, extended)
    }

    /// One statement (one commit, one sync to disk) per 250 leases
    /// (`refresh_batch_limit`), each lease refreshed under the condition a single refresh
    /// uses and judged by the rule a single refresh uses; a chunk that mixes locks and
    /// semaphore permits is one statement for each.
    async fn refresh_many(&self, leases: &[Lease]) -> Vec<Result<Lease>> {
        let mut results = Vec::with_capacity(leases.len());
        for chunk in leases.chunks(BATCH) {
            results.extend(self.refresh_chunk(chunk).await);
        }
        results
    }

    fn refresh_batch_limit(&self) -> usize {
        BATCH
    }

    async fn detach(&self, lease: &Lease) -> Result<()> {
        let token = token_of(lease)?;
        let claim = self.claim(lease.name(), lease.owner(), lease.ttl(), None, None);
        let detached = match Kind::of(lease) {
            Kind::Lock => self.client.detach(&claim, token).await?,
            Kind::Permit => self.client.detach_permit(&claim, token).await?,
        };
        if !detached {
            return Err(Error::lost(
                "the lease expired, was broken, or was taken over",
            ));
        }
        // The row names our liveness file no more: unlock and remove it.
        self.forget(lease, token);
        Ok(())
    }

    async fn release(&self, lease: &Lease) -> Result<()> {
        let token = token_of(lease)?;
        let (name, owner) = (lease.name().as_str(), lease.owner().as_str());
        let cleared = match Kind::of(lease) {
            Kind::Lock => self.client.clear(name, owner, token).await,
            Kind::Permit => self.client.delete_permit(name, owner, token).await,
        };
        // Even when the clear failed: a missing liveness file only makes contenders wait
        // for the TTL, which is safe. Its removal wakes the waiters (`wake.rs`).
        self.forget(lease, token);
        cleared.map(drop)
    }

    async fn subscribe(&self, name: &LockName) -> Result<Option<ReleaseEvents>> {
        #[cfg(target_os = "linux")]
        return Ok(Some(self.wake.subscribe(name.clone(), self.clone())));
        #[cfg(not(target_os = "linux"))]
        {
            let _ = name;
            Ok(None)
        }
    }

    async fn inspect(&self, name: &LockName) -> Result<Option<HolderInfo>> {
        let row = self.client.read(name.as_str()).await?;
        Ok(row.and_then(|row| holder_info(&row, &self.now())))
    }

    /// One streamed read of the held rows under the prefix, through the primary key's
    /// index; each is judged exactly as `inspect` judges it (a holder whose process died is
    /// listed until a contender takes it over, as `inspect` shows it). A row whose name is
    /// not a lock name is skipped.
    async fn list(&self, prefix: &str) -> Result<Vec<HeldLock>> {
        let now = self.now();
        let held = self
            .client
            .list(prefix, |name, row| {
                let holder = holder_info(&row, &now)?;
                match LockName::new(&name) {
                    Ok(name) => Some(HeldLock::new(name, holder)),
                    Err(err) => {
                        tracing::warn!(name = %name.escape_debug(), %err,
                            "list: skipping a row whose name is not a lock name");
                        None
                    }
                }
            })
            .await?;
        Ok(held)
    }

    async fn break_lock(&self, name: &LockName) -> Result<Option<HolderInfo>> {
        let row = self.client.read(name.as_str()).await?;
        let Some((row, holder)) = row.and_then(|r| holder_info(&r, &self.now()).map(|h| (r, h)))
        else {
            return Ok(None);
        };
        let owner = row.owner.as_deref().unwrap_or_default();
        let cleared = self.client.clear(name.as_str(), owner, row.token).await?;
        if !cleared {
            // The holder changed between the read and the clear. `Ok(None)` would claim
            // nobody held it; say what happened instead (as the GCS backend does).
            return Err(Error::unavailable(
                "the holder changed while breaking the lock; run the break again",
            ));
        }
        // The broken holder's file goes too: that wakes waiters (their watch sees it), and
        // the row no longer names it, so no prober reads it. Its holder's own removal later
        // finds nothing, which it ignores.
        self.holders.remove(row.liveness.as_deref());
        Ok(Some(holder))
    }

    async fn acquire_permit(&self, request: &AcquireRequest) -> Result<Acquire> {
        self.attempt_permit(request).await
    }

    async fn inspect_permits(&self, name: &LockName) -> Result<Vec<HolderInfo>> {
        self.permit_holders(name).await
    }

    fn guarantees(&self) -> Guarantees {
        crate::guarantees::guarantees()
    }

    async fn connection_security(&self) -> Result<Vec<lockcore::ConnectionSecurity>> {
        Ok(vec![lockcore::ConnectionSecurity::new(
            self.config.path().display().to_string(),
            lockcore::Transport::Local,
        )])
    }
}

#[cfg(test)]
#[path = "boot_tests.rs"]
mod boot_tests;
#[path = "permits.rs"]
mod permits;
#[path = "refresh.rs"]
mod refresh;
#[cfg(test)]
#[path = "backend_tests.rs"]
mod tests;
