//! Takeover and detach of a holder that died the hard way.

use lockcore::{Acquire, AcquireRequest, Identity, LockBackend, LockName};

use super::*;

/// This process dies the hard way (SIGKILL: no destructor runs): its liveness files
/// stay on disk, unlocked.
fn die(backend: &LocalBackend) {
    for (_, held) in backend.held().drain() {
        held.unlock_only();
    }
}

async fn acquire(backend: &LocalBackend, owner: &Identity) -> Acquire {
    let name = LockName::new("job").expect("valid");
    let request = AcquireRequest::new(
        name,
        owner.clone(),
        lockcore::Ttl::new(Duration::from_secs(60)).expect("valid TTL"),
    );
    backend.acquire(&request).await.expect("one attempt")
}

/// A holder that died the hard way is still listed, exactly as `inspect` shows it,
/// until a contender takes it over; then the new holder and its note are.
#[tokio::test]
async fn a_dead_holder_is_listed_as_inspect_shows_it() {
    let dir = std::env::temp_dir().join(format!("anylock-list-{:016x}", rand::random::<u64>()));
    let config = LocalConfig::new(dir.join("locks.sqlite3"));
    let holder = LocalBackend::connect(config.clone()).await.expect("open");
    let contender = LocalBackend::connect(config).await.expect("open");
    let name = LockName::new("job").expect("valid");
    let note = Note::new("first").expect("note");
    let request = AcquireRequest::new(
        name.clone(),
        Identity::unique(),
        lockcore::Ttl::new(Duration::from_secs(60)).expect("valid TTL"),
    )
    .with_note(Some(note.clone()));
    let Acquire::Acquired(_) = holder.acquire(&request).await.expect("attempt") else {
        panic!("free")
    };
    die(&holder);
    let listed = contender.list("").await.expect("list");
    let inspected = contender
        .inspect(&name)
        .await
        .expect("inspect")
        .expect("held");
    assert_eq!(listed.len(), 1);
    assert_eq!(listed[0].holder().owner(), inspected.owner());
    assert_eq!(listed[0].holder().token(), inspected.token());
    assert_eq!(listed[0].holder().note(), Some(&note));

    let second = Note::new("second").expect("note");
    let request = AcquireRequest::new(
        name.clone(),
        Identity::unique(),
        lockcore::Ttl::new(Duration::from_secs(60)).expect("valid TTL"),
    )
    .with_note(Some(second.clone()));
    let Acquire::Acquired(lease) = contender.acquire(&request).await.expect("attempt") else {
        panic!("a dead holder is taken over at once")
    };
    let listed = contender.list("jo").await.expect("list");
    assert_eq!(listed.len(), 1);
    assert_eq!(listed[0].holder().token(), lease.token());
    assert_eq!(
        listed[0].holder().note(),
        Some(&second),
        "the takeover stores its note"
    );
    contender.release(&lease).await.expect("release");
    let _ = std::fs::remove_dir_all(&dir);
}

/// `anylock acquire` leaves a lease for later CI steps and exits; a SIGKILL at that
/// moment (a cancelled job) must not hand the lock to the next contender at once.
#[tokio::test]
async fn a_detached_lease_outlives_the_holders_death_until_its_ttl() {
    let dir = std::env::temp_dir().join(format!("anylock-detach-{:016x}", rand::random::<u64>()));
    let config = LocalConfig::new(dir.join("locks.sqlite3"));
    let contender = LocalBackend::connect(config.clone()).await.expect("open");
    let (a, b) = (
        Identity::named("a").expect("ok"),
        Identity::named("b").expect("ok"),
    );

    // The control: without detach, a dead holder is taken over at once.
    let holder = LocalBackend::connect(config.clone()).await.expect("open");
    let Acquire::Acquired(lease) = acquire(&holder, &a).await else {
        panic!("free")
    };
    die(&holder);
    let Acquire::Acquired(taken) = acquire(&contender, &b).await else {
        panic!("a dead holder's lock is taken over at once")
    };
    assert!(taken.token() > lease.token());
    contender.release(&taken).await.expect("released");

    let holder = LocalBackend::connect(config).await.expect("open");
    let Acquire::Acquired(lease) = acquire(&holder, &a).await else {
        panic!("free")
    };
    holder.detach(&lease).await.expect("detached");
    die(&holder);
    assert!(
        matches!(acquire(&contender, &b).await, Acquire::Held(_)),
        "held for its TTL"
    );
    let _ = std::fs::remove_dir_all(&dir);
}
