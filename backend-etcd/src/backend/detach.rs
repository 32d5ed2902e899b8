//! Letting a lock outlive its holder (`LockGuard::leave_for`, `detach`), and releasing.
//!
//! A key on a session lease lives as long as the session, which the backend's other
//! locks keep alive: a lock left to expire by its own TTL must leave the session first.
//! Its key is moved to a lease of its own (`LeaseGrant` + one `Txn` that rebinds the key
//! if it still has its create revision and is still on the old lease, keeping its value
//! and create revision, so the fence token is unchanged). Nothing then keeps that lease
//! alive, so the lock ends by the TTL it was granted with. A semaphore permit moves the
//! same way, pinned by its slot's mod revision: the move writes the slot, so the moved
//! grant pins the move's revision, and its fence token (the lease's) stays the same.

use std::sync::Arc;
use std::time::Instant;

use lockcore::{Error, Lease, Result, Ttl};

use super::EtcdBackend;
use super::grant::{Grant, parse_grant};

impl EtcdBackend {
    /// Moves the key of `lease` (its grant `grant`) to a new lease of `ttl` (in whole
    /// seconds, rounded up): `LeaseGrant` + `Txn`. The lease returned carries the new
    /// grant and the TTL etcd granted (at most `ttl`), from when the new lease was asked
    /// for. A lease of its own that held the key is revoked in the background (it holds
    /// nothing now); a session is left alone.
    ///
    /// # Errors
    /// `Lost` when the key is gone or no longer this grant's (the new lease is then
    /// revoked in the background); as `LeaseGrant` and `Txn` otherwise (the new lease is
    /// left to expire by its TTL: after a `Txn` whose outcome is unknown it may hold the
    /// key, and leaving never releases).
    pub(super) async fn move_key(&self, lease: &Lease, grant: &Grant, ttl: Ttl) -> Result<Lease> {
        let key = grant.key(&self.layout, lease.name());
        // Until the move has a definite outcome (also if this call fails, times out or is
        // dropped), the key may stay on the session: it is then deleted once the TTL it
        // is left for has run out (on the new lease it expires by then anyway).
        let pending = grant.session.then(|| {
            let left_until = Instant::now() + ttl.get();
            let stragglers = &self.sessions.stragglers;
            stragglers.pending(key.clone(), grant.pin(), grant.lease, left_until)
        });
        let (id, granted) = self.client.grant(ttl.as_secs()).await?;
        let moved = self.client.rebind(&key, grant.pin(), grant.lease, id).await;
        // Moved, or the key was gone or replaced: either way nothing to delete later.
        if let (Ok(_), Some(pending)) = (&moved, pending) {
            pending.settled();
        }
        let revision = match moved {
            Ok(Some(revision)) => revision,
            Ok(None) => {
                self.revoke_in_background(id);
                return Err(Error::lost("our lock key was deleted or replaced"));
            }
            // The outcome may be unknown: the key may be on the new lease now, and
            // revoking it would delete the lock. It stays recorded above.
            Err(err) => return Err(err),
        };
        if !grant.session {
            self.revoke_in_background(grant.lease);
        }
        let granted = std::time::Duration::from_secs(u64::try_from(granted).unwrap_or(0));
        let ttl = match Ttl::new(granted) {
            Ok(short) if granted < ttl.get() => short,
            _ => ttl,
        };
        Ok(lease
            .clone()
            .with_grant(grant.moved_to(id, revision).encode())
            .with_ttl(ttl))
    }

    /// `detach`: a lock on a session moves to a lease of its own with its TTL (so it ends
    /// by that TTL from now, not from its last refresh: later, never earlier); a lock on a
    /// lease of its own already ends by its TTL.
    pub(super) async fn detach_lease(&self, lease: &Lease) -> Result<()> {
        let grant = parse_grant(lease)?;
        if !grant.session {
            return Ok(());
        }
        self.move_key(lease, &grant, lease.ttl()).await.map(drop)
    }

    /// `release`: a key on a session is deleted if it still has its grant's revision (a
    /// lock key's create revision, a permit's slot's mod revision; 1 Txn; the session
    /// lives on); a lease of its own is revoked, which deletes exactly its key (1
    /// `LeaseRevoke`). Already gone is `Ok`.
    pub(super) async fn release_lease(&self, lease: &Lease) -> Result<()> {
        let grant = parse_grant(lease)?;
        if grant.session {
            let key = grant.key(&self.layout, lease.name());
            // The session outlives this lock: without a definite answer (this call fails,
            // times out or is dropped), a later sweep deletes the key.
            let stragglers = &self.sessions.stragglers;
            let pending = stragglers.pending(key.clone(), grant.pin(), grant.lease, Instant::now());
            let deleted = self.client.delete_pinned(&key, grant.pin()).await;
            if deleted.is_ok() {
                pending.settled();
            }
            deleted
        } else {
            self.client.revoke(grant.lease).await
        }
    }

    /// Revokes `lease` without waiting; failure is harmless (it expires by its TTL).
    fn revoke_in_background(&self, lease: i64) {
        let client = Arc::clone(&self.client);
        tokio::spawn(async move {
            if let Err(err) = client.revoke(lease).await {
                tracing::debug!(error = %err, lease = %format!("{lease:x}"), "revoking an unused lease failed");
            }
        });
    }
}
