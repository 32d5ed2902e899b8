//! Stores on network and shared filesystems, with the filesystem type injected (no such
//! mount is needed), and on the local ones this machine has.

use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use lockcore::{ErrorKind, LockOptions, Locker, WaitMode};
use sqlx::Connection as _;

use crate::filesystem::Filesystem;
use crate::host::{Host, SystemHost};
use crate::{LocalBackend, LocalConfig, Refusal, StoreRefused};

const NFS: u32 = 0x6969;
const EXT4: u32 = 0xEF53;
const TMPFS: u32 = 0x0102_1994;
const OVERLAY: u32 = 0x794C_7630;

/// This machine, with every directory on the filesystem `magic`.
#[derive(Debug)]
struct On(u32);

impl Host for On {
    fn boot_id(&self) -> &str {
        SystemHost.boot_id()
    }
    fn monotonic_ms(&self) -> Option<i64> {
        SystemHost.monotonic_ms()
    }
    fn boottime_ms(&self) -> Option<i64> {
        SystemHost.boottime_ms()
    }
    fn wall_ms(&self) -> i64 {
        SystemHost.wall_ms()
    }
    fn filesystem(&self, _dir: &Path) -> io::Result<Filesystem> {
        Ok(Filesystem::Magic(self.0))
    }
}

fn temp_db(what: &str) -> (PathBuf, PathBuf) {
    let dir = std::env::temp_dir().join(format!("anylock-{what}-{:016x}", rand::random::<u64>()));
    let db = dir.join("locks.sqlite3");
    (dir, db)
}

async fn journal_mode(db: &Path) -> String {
    let url = format!("sqlite://{}", db.display());
    let mut conn = sqlx::SqliteConnection::connect(&url)
        .await
        .expect("connect");
    sqlx::query_scalar("PRAGMA journal_mode")
        .fetch_one(&mut conn)
        .await
        .expect("journal mode")
}

/// Guards against a store on NFS (or SMB, FUSE, 9p, virtiofs) opening as if it were
/// local: SQLite's WAL index lives in memory one kernel shares, and the liveness locks are
/// only as good as the filesystem's lock manager, so two hosts sharing a home directory
/// would each hold the lock. Refused with a typed error naming the directory and the way
/// out; accepted with `shared_fs=allow`, in rollback-journal mode.
#[tokio::test]
async fn a_store_on_a_network_filesystem_is_refused_unless_allowed() {
    let (dir, db) = temp_db("nfs");
    let err = LocalBackend::connect_on(LocalConfig::new(&db), Arc::new(On(NFS)))
        .await
        .expect_err("a store on NFS is refused");
    assert_eq!(err.kind(), ErrorKind::Config, "{err}");
    let message = err.to_string();
    for part in [dir.display().to_string().as_str(), "NFS", "shared_fs=allow"] {
        assert!(message.contains(part), "{part:?} missing: {message}");
    }
    let source = std::error::Error::source(&err).expect("a typed source");
    let refused = source.downcast_ref::<StoreRefused>().expect("StoreRefused");
    assert_eq!(refused.path(), dir);
    assert!(
        matches!(refused.refusal(), Refusal::SharedFilesystem { filesystem } if filesystem == "NFS"),
        "{refused:?}"
    );

    let allowed =
        LocalConfig::from_url(&format!("local:{}?shared_fs=allow", db.display())).expect("parses");
    let backend = LocalBackend::connect_on(allowed.clone(), Arc::new(On(NFS)))
        .await
        .expect("accepted when asked for");
    assert_eq!(
        journal_mode(&db).await,
        "delete",
        "no WAL on a shared filesystem"
    );
    let options = LockOptions::new(Duration::from_secs(10)).with_wait(WaitMode::TryOnce);
    let rival = LocalBackend::connect_on(allowed, Arc::new(On(NFS)))
        .await
        .expect("open");
    let guard = Locker::new(Arc::new(backend))
        .with_options(options.clone())
        .acquire("job")
        .await
        .expect("free");
    let rival = Locker::new(Arc::new(rival)).with_options(options);
    assert!(
        rival.try_acquire("job").await.expect("call").is_none(),
        "excluded"
    );
    guard.release().await.expect("release");
    assert!(
        rival.try_acquire("job").await.expect("call").is_some(),
        "free"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// Local filesystems open as before (WAL), whatever the opt-in: ext4, tmpfs and overlay
/// (a container's root) by their magic numbers, and this machine's real `/dev/shm`
/// (tmpfs) and temp directory through `statfs`.
#[tokio::test]
async fn stores_on_local_filesystems_open_in_wal_mode() {
    for magic in [EXT4, TMPFS, OVERLAY] {
        let (dir, db) = temp_db("localfs");
        LocalBackend::connect_on(LocalConfig::new(&db), Arc::new(On(magic)))
            .await
            .unwrap_or_else(|err| panic!("{magic:#x}: {err}"));
        assert_eq!(journal_mode(&db).await, "wal", "{magic:#x}");
        let _ = std::fs::remove_dir_all(&dir);
    }
    let shm = PathBuf::from("/dev/shm").join(format!("anylock-{:016x}", rand::random::<u64>()));
    for dir in [shm, temp_db("realfs").0] {
        let db = dir.join("locks.sqlite3");
        LocalBackend::connect(LocalConfig::new(&db))
            .await
            .unwrap_or_else(|err| panic!("{}: {err}", dir.display()));
        assert_eq!(journal_mode(&db).await, "wal", "{}", dir.display());
        let _ = std::fs::remove_dir_all(&dir);
    }
}
