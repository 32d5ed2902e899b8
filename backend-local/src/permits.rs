//! Semaphore permits on [`LocalBackend`] (`LockBackend::acquire_permit`,
//! `inspect_permits`), and what a waiter on a name waits for: its lock's holder and, when
//! the semaphore is full, its permits' holders (`wake.rs`).
//!
//! A permit is a row of `anylock_permits` (`permit_store.rs`), with a liveness file of its
//! own exactly as a lock's lease has (`liveness.rs`): a holder proven dead frees its
//! place at the next attempt that needs it. Refresh, release and detach of a permit are
//! routed by [`Lease::permits`](lockcore::Lease::permits) in `backend.rs`.

use std::time::{Duration, UNIX_EPOCH};

use lockcore::{
    Acquire, AcquireRequest, Error, ErrorKind, FenceToken, HolderInfo, Identity, LockName, Note,
    Result,
};

use super::LocalBackend;
use crate::host::Now;
use crate::permit_store::{PermitAttempt, PermitRow};

impl LocalBackend {
    /// One attempt at a permit of `request.name` among `request.permits`: one write
    /// transaction (`Client::acquire_permit`), our liveness file locked before it, as for a
    /// lock.
    pub(super) async fn attempt_permit(&self, request: &AcquireRequest) -> Result<Acquire> {
        let Some(permits) = request.permits else {
            return Err(Error::new(
                ErrorKind::InvalidInput,
                "a permit request without a number of permits",
            ));
        };
        // Locked before the claim is written: a row never names an unlocked file.
        let liveness = self.hold_liveness(&request.name);
        let claim = self.claim(
            &request.name,
            &request.owner,
            request.ttl,
            liveness.as_ref(),
            request.note.as_ref(),
        );
        let attempt = self
            .client
            .acquire_permit(&claim, permits.get(), &self.holders)
            .await?;
        match attempt {
            PermitAttempt::Granted(token) => {
                let lease = super::lease(request, token).with_permits(permits);
                Ok(self.granted(lease, token, liveness))
            }
            PermitAttempt::Full(first) => Ok(Acquire::Held(permit_holder(&first, &claim.now()))),
            PermitAttempt::Conflict(held) => Err(lockcore::limit_conflict(
                request.name.as_str(),
                held,
                permits.get(),
            )),
        }
    }

    /// The live permits of `name`, earliest grant first (one `SELECT`). Like `inspect`, a
    /// holder whose process died is listed until an attempt that needs its place frees it.
    pub(super) async fn permit_holders(&self, name: &LockName) -> Result<Vec<HolderInfo>> {
        let now = self.now();
        let rows = self.client.live_permits(name.as_str(), &now).await?;
        Ok(rows.iter().map(|row| permit_holder(row, &now)).collect())
    }
}

/// The holder of the live permit `row` at `now`.
fn permit_holder(row: &PermitRow, now: &Now<'_>) -> HolderInfo {
    let left = row.left_ms(now).unwrap_or(0);
    let left = Duration::from_millis(u64::try_from(left).unwrap_or(0));
    let mut info = HolderInfo::new(Identity::from_stored(row.owner.as_str()))
        .with_expires_in(left)
        .with_token(FenceToken::new(u64::try_from(row.token).unwrap_or(0)))
        .with_note(row.note.as_deref().and_then(Note::from_stored));
    if let Some(ms) = row.acquired_ms.and_then(|ms| u64::try_from(ms).ok()) {
        info = info.with_acquired_at(UNIX_EPOCH + Duration::from_millis(ms));
    }
    info
}

/// Whom a waiter on the name waits for (`wake.rs`): the lock's holder, when a new owner's
/// grant of the lock would not go through `row` now (the `WHERE` of the grant's upsert,
/// less the same-owner retake), and every permit holder, when the live `permits` fill
/// the semaphore; free when neither.
#[cfg(target_os = "linux")]
fn waited_for(
    row: Option<&crate::client::Row>,
    permits: &[PermitRow],
    now: &Now<'_>,
) -> crate::wake::Holder {
    let mut keys = std::collections::HashSet::new();
    let mut unnamed = false;
    let mut busy = false;
    let mut wait_for = |key: &Option<String>| match key {
        Some(key) => {
            keys.insert(key.clone());
        }
        None => unnamed = true,
    };
    if let Some(row) = row.filter(|row| {
        row.owner.is_some()
            && if now.is_this_boot(row.boot_id.as_deref()) {
                row.expires_ms.is_none_or(|expires| expires > now.expiry_ms)
            } else {
                row.expires_wall_ms
                    .is_some_and(|expires| expires > now.wall_ms)
            }
    }) {
        busy = true;
        wait_for(&row.liveness);
    }
    let limit = permits.iter().filter_map(|p| p.limit().ok()).min();
    if limit.is_some_and(|n| permits.len() >= usize::try_from(n).unwrap_or(usize::MAX)) {
        busy = true;
        for permit in permits {
            wait_for(&permit.liveness);
        }
    }
    match busy {
        true => crate::wake::Holder::Held { keys, unnamed },
        false => crate::wake::Holder::Free,
    }
}

#[cfg(target_os = "linux")]
impl crate::wake::ReadHolder for LocalBackend {
    async fn holder(&self, name: &LockName) -> Option<crate::wake::Holder> {
        let row = self.client.read(name.as_str()).await.ok()?;
        let now = self.now();
        let permits = self.client.live_permits(name.as_str(), &now);
        let permits = permits.await.ok()?;
        Some(waited_for(row.as_ref(), &permits, &now))
    }
}
