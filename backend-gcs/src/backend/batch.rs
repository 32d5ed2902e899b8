//! `refresh_many`: the leases' PATCHes in batch requests of up to [`BATCH_LIMIT`] calls,
//! each call answered as a lone refresh's PATCH would be.

use futures_util::future::join_all;
use lockcore::{Error, Lease, Result};

use super::GcsBackend;
use crate::client::{BATCH_LIMIT, PartAnswer, PatchCall, Preconditions};
use crate::error::{Call, Failure, map_error};
use crate::object;
use crate::permit_names::Target;

/// A lease ready to batch: the object its grant is pinned to (a lock's or a permit's).
struct Prepared<'a> {
    index: usize,
    lease: &'a Lease,
    target: Target,
}

/// What the batch left to do for one lease.
enum Next {
    Done(Result<Lease>),
    /// 412: an earlier PATCH whose reply was lost may have moved the metageneration;
    /// recover exactly as a lone refresh does.
    Recover,
    /// Send it as a lone refresh: it is alone, the endpoint has no batches, or GCS
    /// refused a token that is renewed (the lone refresh fetches a new one).
    Alone,
}

impl GcsBackend {
    /// Refreshes `leases`: result `i` is what [`refresh`](lockcore::LockBackend::refresh)
    /// of `leases[i]` would return. One batch request per [`BATCH_LIMIT`] leases, at once,
    /// each under one request turn; the few leases that need more (a 412 to recover, a
    /// refused token) then go as lone refreshes, each with a turn of its own.
    pub(super) async fn refresh_leases(&self, leases: &[Lease]) -> Vec<Result<Lease>> {
        let mut results: Vec<Option<Result<Lease>>> = leases.iter().map(|_| None).collect();
        let mut ready = Vec::new();
        for (index, lease) in leases.iter().enumerate() {
            match prepare(self, index, lease) {
                Ok(prepared) => ready.push(prepared),
                Err(e) => results[index] = Some(Err(e)),
            }
        }
        let mut recover = Vec::new();
        let mut alone = Vec::new();
        let batched: &[Prepared<'_>] = if self.client.batches() {
            &ready
        } else {
            alone.extend(ready.iter());
            &[]
        };
        let chunks = batched.chunks(BATCH_LIMIT);
        let answered = join_all(chunks.clone().map(|chunk| self.patch_chunk(chunk))).await;
        for (chunk, nexts) in chunks.zip(answered) {
            for (prepared, next) in chunk.iter().zip(nexts) {
                match next {
                    Next::Done(result) => results[prepared.index] = Some(result),
                    Next::Recover => recover.push(prepared),
                    Next::Alone => alone.push(prepared),
                }
            }
        }
        let recovered = join_all(recover.iter().map(|p| async move {
            let _slot = self.client.slot().await?;
            self.recover_refresh(&p.target, p.lease).await
        }));
        let lone = join_all(alone.iter().map(|p| async move {
            let _slot = self.client.slot().await?;
            self.try_refresh(&p.target, p.lease).await
        }));
        let (recovered, lone) = tokio::join!(recovered, lone);
        for (p, result) in recover.iter().zip(recovered).chain(alone.iter().zip(lone)) {
            results[p.index] = Some(result);
        }
        results
            .into_iter()
            .map(|r| r.unwrap_or_else(|| Err(Error::unavailable("refresh: no result"))))
            .collect()
    }

    /// One batch request for `chunk`, under one request turn; a chunk of one goes as a
    /// lone refresh (a plain PATCH: the same one request, without the batch framing).
    async fn patch_chunk(&self, chunk: &[Prepared<'_>]) -> Vec<Next> {
        if chunk.len() == 1 {
            return vec![Next::Alone];
        }
        let calls: Vec<PatchCall<'_>> = chunk
            .iter()
            .map(|p| PatchCall {
                object: &p.target.object,
                metadata: object::metadata(p.lease.owner(), p.lease.ttl()),
                preconditions: Preconditions::exact(p.target.generation, p.target.metageneration),
            })
            .collect();
        let answers = match self.client.slot().await {
            Ok(_slot) => self.client.patch_batch(&calls).await,
            Err(e) => Err(e),
        };
        match answers {
            Ok(Some(answers)) => chunk
                .iter()
                .zip(answers)
                .map(|(p, answer)| self.next(p, answer))
                .collect(),
            Ok(None) => chunk.iter().map(|_| Next::Alone).collect(),
            Err(e) => e
                .copies(chunk.len())
                .into_iter()
                .map(|e| Next::Done(Err(e)))
                .collect(),
        }
    }

    fn next(&self, prepared: &Prepared<'_>, answer: PartAnswer) -> Next {
        match answer {
            PartAnswer::Reply(reply) => {
                let sent = prepared.target.metageneration;
                match super::extended(reply, prepared.lease, &prepared.target, sent) {
                    Ok(Some(refreshed)) => Next::Done(Ok(refreshed)),
                    Ok(None) => Next::Recover,
                    Err(e) => Next::Done(Err(e)),
                }
            }
            PartAnswer::Status(401) if self.client.renews_tokens() => Next::Alone,
            PartAnswer::Status(code) => {
                Next::Done(Err(map_error(Failure::Status(code), Call::Write)))
            }
            PartAnswer::Unreadable(e) => Next::Done(Err(e)),
        }
    }
}

fn prepare<'a>(backend: &GcsBackend, index: usize, lease: &'a Lease) -> Result<Prepared<'a>> {
    let target = Target::of(backend.config(), lease)?;
    Ok(Prepared {
        index,
        lease,
        target,
    })
}
