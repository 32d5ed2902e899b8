//! The acquire paths that make a new grant: a contender without a queue place (a key on
//! the session lease of its TTL, created only if the lock is free), the same-owner retake,
//! and cleaning up after a grant whose outcome is unknown.

use std::time::{Duration, Instant};

use anylock_etcd_proto::mvccpb::KeyValue;
use lockcore::{Acquire, AcquireRequest, Error, ErrorKind, FenceToken, Lease, Result, Ttl};

use super::EtcdBackend;
use super::grant::Grant;
use super::holder::holder_info;
use crate::client::Created;
use crate::keys;
use crate::session::Session;

impl EtcdBackend {
    /// The lease of a won attempt, bound to `grant`'s etcd lease, which the server keeps
    /// for at least `limit` from when the attempt began. Its TTL is the one asked for or
    /// `limit`, whichever is shorter; a limit too short to hold a lease at all is a
    /// protocol error.
    pub(super) fn lease_for(
        &self,
        request: &AcquireRequest,
        grant: &Grant,
        limit: Duration,
    ) -> Result<Acquire> {
        let ttl = if limit >= request.ttl.get() {
            request.ttl
        } else {
            Ttl::new(limit).map_err(|_| {
                Error::new(
                    ErrorKind::Protocol,
                    format!("etcd keeps the lease for {limit:?}, too short to hold a lock"),
                )
            })?
        };
        let lease = Lease::new(
            request.name.clone(),
            request.owner.clone(),
            ttl,
            grant.encode(),
        );
        Ok(Acquire::Acquired(lease.with_token(FenceToken::new(
            u64::try_from(grant.revision).unwrap_or(0),
        ))))
    }

    /// A won attempt on `session`, begun at `start`: what the session has left from then.
    fn session_lease(
        &self,
        request: &AcquireRequest,
        session: Session,
        (revision, suffix): (i64, String),
        start: Instant,
    ) -> Result<Acquire> {
        let limit = session.left_at(start).min(session.ttl());
        let grant = Grant::on_session(session.id, revision, suffix);
        self.lease_for(request, &grant, limit)
    }

    /// The attempt of a contender without a queue place: the session lease of the
    /// request's TTL (no RPC while it is fresh), then one Txn that creates our key on it
    /// only if the lock has no key at all (1 RPC). When held: the holder's TTL (1 more).
    /// If etcd refuses the put because the session lease is gone (revoked, or expired
    /// while nothing used it), the session is dropped and the attempt made once more on a
    /// new one; nothing was written by the refused Txn.
    pub(super) async fn acquire_unqueued(&self, request: &AcquireRequest) -> Result<Acquire> {
        let start = Instant::now();
        let ttl_secs = request.ttl.as_secs();
        let session = self.sessions.session(ttl_secs).await?;
        match self.attempt_on(request, session, start).await {
            Err(err) if err.kind() == ErrorKind::Lost => {
                tracing::debug!(lease = %format!("{:x}", session.id), "the session lease is gone; granting a new one");
                self.sessions.forget(session.id);
                let session = self.sessions.session(ttl_secs).await?;
                self.attempt_on(request, session, start)
                    .await
                    .map_err(|err| self.session_gone(err, session))
            }
            other => other,
        }
    }

    /// One create-if-free Txn on `session`; `Lost` only when etcd says the lease is gone.
    async fn attempt_on(
        &self,
        request: &AcquireRequest,
        session: Session,
        start: Instant,
    ) -> Result<Acquire> {
        let name = &request.name;
        let prefix = self.layout.lock_prefix(name);
        let suffix = format!("{:x}", session.id);
        let key = self.layout.key_named(name, &suffix);
        let value = keys::encode_value(&request.owner, request.note.as_ref());
        let created = self
            .client
            .create_if_free(&prefix, &key, &value, session.id)
            .await;
        let created = match created {
            Ok(created) => created,
            Err(err) => {
                if err.kind() != ErrorKind::Lost {
                    self.clean_up_in_background(key, value);
                }
                return Err(err);
            }
        };
        match created {
            Created::Won { revision } => {
                self.session_lease(request, session, (revision, suffix), start)
            }
            Created::Held { head } if keys::is_owned_by(&head.value, &request.owner) => {
                self.retake(request, session, head, start).await
            }
            Created::Held { head } => {
                let remaining = self.remaining(&head).await;
                Ok(Acquire::Held(holder_info(&head, remaining.ok().flatten())))
            }
        }
    }

    /// Same-owner retake: our own abandoned key owns the lock. Replace it with a key on
    /// `session` when it is the only key; otherwise it has been deleted (handing the lock
    /// to the next waiter, an `etcdctl lock` or Go client) and the lock is held by that
    /// waiter. The new key is named after the session, unless the abandoned key already
    /// is (both on this session): then `<session hex>-<old create revision>`, since one
    /// Txn cannot delete and put the same key.
    async fn retake(
        &self,
        request: &AcquireRequest,
        session: Session,
        head: KeyValue,
        start: Instant,
    ) -> Result<Acquire> {
        let name = &request.name;
        let prefix = self.layout.lock_prefix(name);
        let mut suffix = format!("{:x}", session.id);
        if head.key == self.layout.key_named(name, &suffix) {
            suffix = format!("{suffix}-{}", head.create_revision);
        }
        let key = self.layout.key_named(name, &suffix);
        let value = keys::encode_value(&request.owner, request.note.as_ref());
        let retaken = self
            .client
            .retake(&prefix, &head, &key, &value, session.id)
            .await;
        match retaken {
            Ok(Some(revision)) => self.session_lease(request, session, (revision, suffix), start),
            Ok(None) => match self.holder(name).await? {
                Some(holder) => Ok(Acquire::Held(holder)),
                None => Err(Error::unavailable(
                    "the lock changed hands during a same-owner retake; try again",
                )),
            },
            Err(err) => {
                if err.kind() != ErrorKind::Lost {
                    self.clean_up_in_background(key, value);
                }
                Err(err)
            }
        }
    }

    /// An attempt's `Lost` means etcd refused the put on `session` (the lease is gone):
    /// the session is dropped and the caller told to try again (a temporary error, never
    /// `Lost`, which an acquire must not answer).
    pub(super) fn session_gone(&self, err: Error, session: Session) -> Error {
        if err.kind() != ErrorKind::Lost {
            return err;
        }
        self.sessions.forget(session.id);
        Error::unavailable(format!(
            "the session lease expired during the attempt ({}); the next attempt grants a new one",
            err.message()
        ))
    }

    /// After a grant Txn whose outcome is unknown: deletes `key` if it holds exactly
    /// `value` (the key that Txn may have written; the value carries the owner and the
    /// time in milliseconds), now and once more a request timeout later, for a Txn that
    /// was still on its way. On a session lease such a key would otherwise last as long
    /// as the session. Failure is harmless for the holder (a later attempt with the same
    /// owner retakes the key) and costs the lock at most the session's life.
    fn clean_up_in_background(&self, key: Vec<u8>, value: Vec<u8>) {
        let client = std::sync::Arc::clone(&self.client);
        let later = self.config.request_timeout();
        tokio::spawn(async move {
            for pause in [Duration::ZERO, later] {
                tokio::time::sleep(pause).await;
                if let Err(err) = client.delete_if_value(&key, &value).await {
                    tracing::debug!(error = %err, "cleaning up after an unknown grant failed");
                }
            }
        });
    }
}
