//! Listing held locks, and the note stored with a grant.

use std::time::Duration;

use lockcore::{
    Acquire, AcquireRequest, ErrorKind, HeldLock, Identity, LockBackend, LockName, LockOptions,
    Locker, Note, WaitMode,
};

use super::{fresh, grant};
use crate::harness::Harness;
use crate::report::Report;

fn names_of(held: &[HeldLock]) -> Vec<&str> {
    held.iter().map(|h| h.name().as_str()).collect()
}

/// `list(prefix)` returns exactly the held locks under the prefix, sorted, each as
/// `inspect` reports it; pattern characters in the prefix match only themselves; released
/// and expired grants are left out. A backend that does not claim listing must say
/// `Unsupported`.
///
/// Checks: `list` contract. Guards against a prefix passed to a pattern language unescaped
/// (`LIKE 'a_%'` also matching `ab`, Redis `SCAN MATCH a*` matching everything), escaped
/// key layouts returned undecoded (etcd's `%2F`), and expired leases still on the server
/// reported as held (Redis keys awaiting lazy expiry, GCS objects nobody deleted).
pub async fn list_shows_held_locks(h: &dyn Harness) -> Report {
    let backend = h.backend();
    let base = fresh("list");
    if !backend.guarantees().listing {
        let e = backend.list(base.as_str()).await.expect_err("no listing");
        assert_eq!(e.kind(), ErrorKind::Unsupported, "{e}");
        return Report::new();
    }
    let under = |rest: &str| LockName::new(format!("{base}/{rest}")).expect("valid name");
    let ttl = Duration::from_secs(60);
    let held = ["a_1", "ab1", "a%/x", "a*?[z]", "b"].map(under);
    let mut leases = Vec::new();
    for (i, name) in held.iter().enumerate() {
        let note = (i == 0).then(|| Note::new("listed with a note").expect("note"));
        let request =
            AcquireRequest::new(name.clone(), Identity::unique(), super::ttl(ttl)).with_note(note);
        match backend.acquire(&request).await.expect("acquire") {
            Acquire::Acquired(lease) => leases.push(lease),
            Acquire::Held(holder) => panic!("{name} unexpectedly held by {}", holder.owner()),
        }
    }
    let released = under("released");
    let lease = grant(&*backend, &released, &Identity::unique(), ttl).await;
    backend.release(&lease).await.expect("release");
    let expired = under("expired");
    grant(&*backend, &expired, &Identity::unique(), h.timing().ttl).await;
    // A sibling whose name extends the base without the separator is outside `base/`.
    let outside = LockName::new(format!("{base}-outside")).expect("valid name");
    leases.push(grant(&*backend, &outside, &Identity::unique(), ttl).await);
    tokio::time::sleep(h.timing().ttl + h.timing().slack).await;

    let all = backend.list(&format!("{base}/")).await.expect("list");
    let mut expected: Vec<&str> = held.iter().map(LockName::as_str).collect();
    expected.sort_unstable();
    assert_eq!(names_of(&all), expected, "list({base}/)");
    for entry in &all {
        let inspected = backend.inspect(entry.name()).await.expect("inspect");
        let inspected = inspected.expect("a listed lock is held");
        assert_eq!(
            entry.holder().owner(),
            inspected.owner(),
            "{}",
            entry.name()
        );
        assert_eq!(
            entry.holder().token(),
            inspected.token(),
            "{}",
            entry.name()
        );
        assert_eq!(entry.holder().note(), inspected.note(), "{}", entry.name());
        assert_eq!(
            entry.holder().expires_in().is_some(),
            inspected.expires_in().is_some(),
            "{}",
            entry.name()
        );
    }
    for (prefix, only) in [
        ("a_", "a_1"),
        ("a%", "a%/x"),
        ("a*", "a*?[z]"),
        ("a*?[", "a*?[z]"),
    ] {
        let listed = backend
            .list(&format!("{base}/{prefix}"))
            .await
            .expect("list");
        let only = format!("{base}/{only}");
        assert_eq!(names_of(&listed), [only.as_str()], "prefix {prefix:?}");
    }
    let everything = backend.list("").await.expect("list everything");
    for name in held.iter().chain([&outside]) {
        assert!(
            everything.iter().any(|e| e.name() == name),
            "list(\"\") is missing {name}"
        );
    }
    for lease in &leases {
        backend.release(lease).await.expect("release");
    }
    let after = backend.list(base.as_str()).await.expect("list");
    assert!(
        after.is_empty(),
        "released locks still listed: {:?}",
        names_of(&after)
    );
    Report::new().metric("listed", all.len() as f64)
}

/// A note given at acquire is stored with the grant: `inspect`, a rival's `Held` answer
/// (and `list`, where claimed) show it, also after the lease was refreshed past its first
/// TTL; a same-owner retake replaces it; the next grant without a note shows none, after a
/// release and after a break.
///
/// Checks: `AcquireRequest::note` and `HolderInfo::note`. Guards against notes lost on
/// refresh (a rewrite of the stored value that drops the field, a note key whose own
/// expiry is not extended) and a note outliving its grant (a CI run URL shown for the
/// wrong run).
pub async fn note_is_stored_with_the_grant(h: &dyn Harness) -> Report {
    let backend = h.backend();
    let timing = h.timing();
    let name = fresh("note");
    let note = Note::new("run https://ci.example/run/42?attempt=1 — ünïcode ✓").expect("note");
    let options = LockOptions::new(timing.ttl)
        .with_wait(WaitMode::TryOnce)
        .with_note(note.clone());
    let owner = Identity::unique();
    let locker = Locker::new(backend.clone()).with_identity(owner.clone());
    let guard = locker
        .acquire_with(&name, &options)
        .await
        .expect("free name");
    let shown = |info: Option<lockcore::HolderInfo>| info.and_then(|i| i.note().cloned());
    assert_eq!(
        shown(backend.inspect(&name).await.expect("inspect")),
        Some(note.clone())
    );
    let rival = AcquireRequest::new(name.clone(), Identity::unique(), super::ttl(timing.ttl));
    match backend.acquire(&rival).await.expect("rival attempt") {
        Acquire::Held(holder) => assert_eq!(holder.note(), Some(&note), "Held without the note"),
        Acquire::Acquired(_) => panic!("a rival took a held lock"),
    }

    // The guard refreshes every TTL/8; two TTLs later the note must still be there.
    tokio::time::sleep(timing.ttl * 2 + timing.slack).await;
    assert!(guard.is_held(), "the guard lost its lease");
    assert_eq!(
        shown(backend.inspect(&name).await.expect("inspect")),
        Some(note.clone()),
        "the note was lost by a refresh"
    );
    if backend.guarantees().listing {
        let listed = backend.list(name.as_str()).await.expect("list");
        let notes: Vec<_> = listed.iter().map(|e| e.holder().note().cloned()).collect();
        assert_eq!(notes, [Some(note.clone())], "list shows the note");
    }
    if backend.guarantees().same_owner_retake {
        // A restarted worker with the same identity takes its lock over with a new note.
        let second = Note::new("retry 2").expect("note");
        let request = AcquireRequest::new(name.clone(), owner, super::ttl(Duration::from_secs(30)))
            .with_note(Some(second.clone()));
        let retake = match backend.acquire(&request).await.expect("retake") {
            Acquire::Acquired(lease) => lease,
            Acquire::Held(holder) => panic!("same-owner retake refused: {}", holder.owner()),
        };
        assert_eq!(
            shown(backend.inspect(&name).await.expect("inspect")),
            Some(second),
            "a retake keeps the old note"
        );
        drop(guard);
        backend.release(&retake).await.expect("release");
    } else {
        guard.release().await.expect("release");
    }
    next_grant_has_no_note(&*backend, &name, "the previous grant's note outlived it").await;

    // A break removes the grant with its note.
    let noted = AcquireRequest::new(
        name.clone(),
        Identity::unique(),
        super::ttl(Duration::from_secs(30)),
    )
    .with_note(Some(note.clone()));
    let Acquire::Acquired(lease) = backend.acquire(&noted).await.expect("acquire") else {
        panic!("{name} is held after its release");
    };
    match backend.break_lock(&name).await {
        Ok(removed) => {
            let removed = removed.and_then(|h| h.note().cloned());
            assert_eq!(
                removed,
                Some(note),
                "break reports the removed grant's note"
            );
            next_grant_has_no_note(&*backend, &name, "the broken grant's note outlived it").await;
        }
        Err(e) if e.kind() == ErrorKind::Unsupported => {
            backend.release(&lease).await.expect("release");
        }
        Err(e) => panic!("break: {e}"),
    }
    Report::new()
}

/// A grant without a note on the free `name` shows none (`why` says whose note would have
/// outlived its grant); released at once.
async fn next_grant_has_no_note(backend: &dyn LockBackend, name: &LockName, why: &str) {
    let plain = grant(backend, name, &Identity::unique(), Duration::from_secs(30)).await;
    let holder = backend.inspect(name).await.expect("inspect").expect("held");
    assert_eq!(holder.note(), None, "{why}");
    backend.release(&plain).await.expect("release");
}
