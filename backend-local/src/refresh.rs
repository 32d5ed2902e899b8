//! The refresh side of [`LocalBackend`]: how a refresh's outcome is judged, and the
//! batched refresh of a chunk of leases (`batch.rs` has its statements), locks and
//! semaphore permits alike.

use lockcore::{Error, ErrorKind, Lease, Result};

use super::{Kind, LocalBackend, token_of};
use crate::batch::Extension;

impl LocalBackend {
    /// What a refresh of `lease` (grant `token`) that did or did not extend it returns:
    /// a lease we lost also loses its liveness file.
    pub(super) fn refreshed(&self, lease: &Lease, token: i64, extended: bool) -> Result<Lease> {
        if extended {
            return Ok(lease.clone());
        }
        self.forget(lease, token);
        Err(Error::lost(
            "the lease expired, was broken, or was taken over",
        ))
    }

    /// One statement for the locks of `leases` (at most [`BATCH`](crate::batch::BATCH))
    /// and one for its semaphore permits, their claims made (and the clock read) before
    /// them, as a single refresh makes its claim before its statement. A lease this
    /// backend did not issue fails alone; a failed statement fails every lease it
    /// carried, with a temporary error for a busy or unavailable database, and forgets no
    /// liveness file.
    pub(super) async fn refresh_chunk(&self, leases: &[Lease]) -> Vec<Result<Lease>> {
        let tokens: Vec<Result<i64>> = leases.iter().map(token_of).collect();
        let now = self.now();
        let mut outcomes: Vec<Option<Result<bool>>> = leases.iter().map(|_| None).collect();
        for kind in [Kind::Lock, Kind::Permit] {
            let (places, sent): (Vec<usize>, Vec<Extension<'_>>) = leases
                .iter()
                .zip(&tokens)
                .enumerate()
                .filter(|(_, (lease, _))| Kind::of(lease) == kind)
                .filter_map(|(i, (lease, token))| {
                    let token = *token.as_ref().ok()?;
                    let ttl = i64::try_from(lease.ttl().as_millis()).unwrap_or(i64::MAX);
                    let extension = Extension {
                        name: lease.name().as_str(),
                        owner: lease.owner().as_str(),
                        token,
                        expires_ms: now.expiry_ms.saturating_add(ttl),
                        expires_wall_ms: now.wall_ms.saturating_add(ttl),
                    };
                    Some((i, extension))
                })
                .unzip();
            if sent.is_empty() {
                continue;
            }
            let permits = kind == Kind::Permit;
            let extended = self
                .client
                .extend_many(permits, &sent, now.expiry_ms, now.boot_id)
                .await;
            let extended: Vec<Result<bool>> = match extended {
                Ok(extended) => extended.into_iter().map(Ok).collect(),
                Err(err) => err.copies(sent.len()).into_iter().map(Err).collect(),
            };
            for (i, outcome) in places.into_iter().zip(extended) {
                outcomes[i] = Some(outcome);
            }
        }
        leases
            .iter()
            .zip(tokens)
            .zip(outcomes)
            .map(|((lease, token), outcome)| {
                let token = token?;
                let extended = outcome.unwrap_or_else(|| {
                    Err(Error::new(
                        ErrorKind::Protocol,
                        "a lease got no refresh result",
                    ))
                })?;
                self.refreshed(lease, token, extended)
            })
            .collect()
    }
}
