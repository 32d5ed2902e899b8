//! The reference backend's own checks, which every backend's must match: a refresh or a
//! release touches only the exact grant it is given (never the same owner's newer one),
//! and every holder of a semaphore uses one limit.

use std::time::Duration;

use super::{bounded, ms};
use crate::{
    Acquire, AcquireRequest, ErrorKind, Identity, Lease, LockBackend, LockName, MemoryBackend,
    Permits, Ttl,
};

fn request(name: &str, owner: &Identity, ttl: Duration, permits: Option<u32>) -> AcquireRequest {
    let name = LockName::new(name).expect("valid");
    let mut request = AcquireRequest::new(name, owner.clone(), Ttl::new(ttl).expect("valid"));
    request.permits = permits.map(|n| Permits::new(n).expect("valid"));
    request
}

async fn granted(backend: &MemoryBackend, request: &AcquireRequest) -> Lease {
    let outcome = match request.permits {
        Some(_) => backend.acquire_permit(request).await,
        None => backend.acquire(request).await,
    };
    match outcome.expect("call") {
        Acquire::Acquired(lease) => lease,
        Acquire::Held(holder) => panic!("held by {}", holder.owner()),
    }
}

/// An owner that retook its lock (a new grant) keeps it when its superseded lease is
/// released: the release compares the grant, not only the owner.
#[test]
fn releasing_a_superseded_lease_keeps_the_owners_new_grant() {
    bounded(|| async {
        let backend = MemoryBackend::new();
        let owner = Identity::unique();
        let old = granted(&backend, &request("x", &owner, ms(1000), None)).await;
        let new = granted(&backend, &request("x", &owner, ms(1000), None)).await;
        backend
            .release(&old)
            .await
            .expect("a stale release is fine");
        let holder = backend.inspect(old.name()).await.expect("call");
        assert_eq!(
            holder.and_then(|h| h.token()),
            new.token(),
            "the new grant stays"
        );
    });
}

/// A permit that expired and was taken again by the same owner is a new grant: the old
/// lease can neither refresh nor release it.
#[test]
fn a_superseded_permit_lease_touches_not_the_owners_new_permit() {
    bounded(|| async {
        let backend = MemoryBackend::new();
        let owner = Identity::unique();
        let old = granted(&backend, &request("pool", &owner, ms(100), Some(1))).await;
        tokio::time::advance(ms(100)).await;
        let new = granted(&backend, &request("pool", &owner, ms(1000), Some(1))).await;
        assert!(new.token() > old.token());
        let err = backend.refresh(&old).await.expect_err("superseded");
        assert_eq!(err.kind(), ErrorKind::Lost, "{err}");
        backend
            .release(&old)
            .await
            .expect("a stale release is fine");
        let holders = backend.inspect_permits(old.name()).await.expect("call");
        let tokens: Vec<_> = holders.iter().map(|h| h.token()).collect();
        assert_eq!(tokens, vec![new.token()], "the new permit stays");
        backend
            .refresh(&new)
            .await
            .expect("the new permit refreshes");
    });
}

/// Permits asked with another limit than the live ones were taken with are refused.
#[test]
fn permits_with_another_limit_are_refused() {
    bounded(|| async {
        let backend = MemoryBackend::new();
        granted(
            &backend,
            &request("pool", &Identity::unique(), ms(1000), Some(3)),
        )
        .await;
        let other = request("pool", &Identity::unique(), ms(1000), Some(2));
        let err = backend
            .acquire_permit(&other)
            .await
            .expect_err("limit 2 against 3");
        assert_eq!(err.kind(), ErrorKind::InvalidInput, "{err}");
        assert!(err.to_string().contains("same limit"), "{err}");
    });
}
