//! Issue #14 (Low): a queued waiter whose queue key is lost (deleted by an operator, or its
//! lease expired) must be able to notice and queue again. These run against the shared
//! cluster; they need the crate's internals (the ticket's place), so they live here.

use std::time::Duration;

use futures_util::StreamExt;
use lockcore::{Acquire, AcquireRequest, Identity, LockBackend, LockName};

use crate::grpc::{Connection, Settings};
use crate::{EtcdBackend, EtcdConfig, requests};

async fn setup(what: &str) -> Option<(EtcdBackend, Connection)> {
    let endpoints = test_kit::env::require("ANYLOCK_TEST_ETCD_ENDPOINTS", "etcd")?;
    let endpoints: Vec<String> = endpoints.split(',').map(|s| s.trim().to_owned()).collect();
    let prefix = format!("anylock-test/{what}-{:016x}/", rand::random::<u64>());
    let config = EtcdConfig::new(&endpoints)
        .expect("endpoints")
        .with_prefix(&prefix);
    let backend = EtcdBackend::connect(config).await.expect("connect");
    let settings = Settings {
        connect_timeout: Duration::from_secs(5),
        credentials: None,
        #[cfg(feature = "tls")]
        tls: None,
    };
    let raw = Connection::connect(&endpoints[0], &settings)
        .await
        .expect("raw client");
    Some((backend, raw))
}

/// A holder and a waiter that got `Held`, for one lock.
async fn held(backend: &EtcdBackend) -> (AcquireRequest, AcquireRequest) {
    let name = LockName::new("q").expect("name");
    let ttl = Duration::from_secs(30);
    let holder = AcquireRequest::new(
        name.clone(),
        Identity::unique(),
        lockcore::Ttl::new(ttl).expect("valid TTL"),
    );
    let waiter = AcquireRequest::new(
        name,
        Identity::unique(),
        lockcore::Ttl::new(ttl).expect("valid TTL"),
    );
    let granted = backend.acquire(&holder).await.expect("acquire");
    assert!(matches!(granted, Acquire::Acquired(_)), "{granted:?}");
    let rival = backend.acquire(&waiter).await.expect("attempt");
    assert!(matches!(rival, Acquire::Held(_)), "{rival:?}");
    (holder, waiter)
}

/// Deleting the waiter's queue key ends the ticket's wake-up stream (so lockcore can tell
/// the place is gone), while a release of another key only wakes it; and the owner can
/// then queue again.
#[tokio::test]
async fn a_lost_queue_key_ends_the_waiters_wake_ups() {
    let Some((backend, raw)) = setup("queue-lost").await else {
        return;
    };
    let (_holder, waiter) = held(&backend).await;
    let ticket = backend
        .queue
        .join(&waiter, 30)
        .await
        .expect("join")
        .expect("queued");
    let mut events = backend
        .queue_events(&waiter.name, &ticket)
        .await
        .expect("events");
    let key = ticket.key().to_vec();
    raw.kv()
        .delete_range(requests::delete(&key))
        .await
        .expect("operator deletes the queue key");
    let ended = tokio::time::timeout(Duration::from_secs(5), async {
        while events.next().await.is_some() {}
    })
    .await;
    assert!(
        ended.is_ok(),
        "the ticket's wake-ups go on after its queue key was deleted"
    );
    let again = backend.queue.join(&waiter, 30).await.expect("join again");
    assert!(again.is_some(), "the owner cannot queue again");
}

/// A release by the holder wakes the waiter and the stream goes on.
#[tokio::test]
async fn a_release_wakes_the_queued_waiter_without_ending_its_wake_ups() {
    let Some((backend, raw)) = setup("queue-wake").await else {
        return;
    };
    let (holder, waiter) = held(&backend).await;
    let ticket = backend
        .queue
        .join(&waiter, 30)
        .await
        .expect("join")
        .expect("queued");
    let mut events = backend
        .queue_events(&waiter.name, &ticket)
        .await
        .expect("events");
    let prefix = backend.lock_prefix(&holder.name);
    let kvs = raw
        .kv()
        .range(requests::first_created(prefix.as_bytes()))
        .await
        .expect("range")
        .into_inner()
        .kvs;
    raw.kv()
        .delete_range(requests::delete(&kvs[0].key))
        .await
        .expect("holder's key deleted");
    let woken = tokio::time::timeout(Duration::from_secs(5), events.next()).await;
    assert_eq!(woken.expect("no wake-up"), Some(()));
    assert_ne!(ticket.key(), kvs[0].key.as_slice());
}
