//! The whole conformance suite against the embedded backend, on a fresh database file.

mod common;

use std::sync::{Arc, RwLock};
use std::time::Duration;

use async_trait::async_trait;
use backend_local::LocalBackend;
use common::TempDb;
use conformance::{Cuttable, Harness, Outage};
use lockcore::{
    Acquire, AcquireRequest, Guarantees, HeldLock, HolderInfo, Identity, Lease, LockBackend,
    LockName, ReleaseEvents, Result,
};
use sqlx::Connection;
use sqlx::sqlite::SqliteConnection;
use tokio::sync::watch;

/// A `LocalBackend` that can be closed and reopened on the same file: a process restart,
/// as far as the lock table is concerned.
#[derive(Debug)]
struct Reopenable {
    current: RwLock<LocalBackend>,
}

impl Reopenable {
    fn get(&self) -> LocalBackend {
        self.current.read().expect("lock").clone()
    }
}

#[async_trait]
impl LockBackend for Reopenable {
    fn backend_name(&self) -> &str {
        "local"
    }
    async fn acquire(&self, request: &AcquireRequest) -> Result<Acquire> {
        self.get().acquire(request).await
    }
    async fn refresh(&self, lease: &Lease) -> Result<Lease> {
        self.get().refresh(lease).await
    }
    async fn release(&self, lease: &Lease) -> Result<()> {
        self.get().release(lease).await
    }
    async fn inspect(&self, name: &LockName) -> Result<Option<HolderInfo>> {
        self.get().inspect(name).await
    }
    async fn break_lock(&self, name: &LockName) -> Result<Option<HolderInfo>> {
        self.get().break_lock(name).await
    }
    fn guarantees(&self) -> Guarantees {
        self.get().guarantees()
    }
    async fn list(&self, prefix: &str) -> Result<Vec<HeldLock>> {
        self.get().list(prefix).await
    }
    async fn subscribe(&self, name: &LockName) -> Result<Option<ReleaseEvents>> {
        self.get().subscribe(name).await
    }
    async fn acquire_permit(&self, request: &AcquireRequest) -> Result<Acquire> {
        self.get().acquire_permit(request).await
    }
    async fn inspect_permits(&self, name: &LockName) -> Result<Vec<HolderInfo>> {
        self.get().inspect_permits(name).await
    }
}

struct LocalHarness {
    db: TempDb,
    backend: Arc<Reopenable>,
}

async fn harness() -> LocalHarness {
    let db = TempDb::new();
    let backend = db.open().await;
    LocalHarness {
        db,
        backend: Arc::new(Reopenable {
            current: RwLock::new(backend),
        }),
    }
}

/// Cuts the database off the way a stuck writer would: another connection holds the write
/// lock (`BEGIN EXCLUSIVE`) until restored.
struct WriterHold(watch::Sender<bool>);

impl Outage for WriterHold {
    fn cut(&self) {
        self.0.send_replace(true);
    }
    fn restore(&self) {
        self.0.send_replace(false);
    }
}

async fn hold_writer(url: String, mut cut: watch::Receiver<bool>) {
    let mut conn = SqliteConnection::connect(&url)
        .await
        .expect("admin connection");
    while cut.changed().await.is_ok() {
        let statement = if *cut.borrow_and_update() {
            "BEGIN EXCLUSIVE"
        } else {
            "ROLLBACK"
        };
        sqlx::query(statement)
            .execute(&mut conn)
            .await
            .expect(statement);
    }
}

#[async_trait]
impl Harness for LocalHarness {
    fn label(&self) -> &str {
        "local"
    }

    fn backend(&self) -> Arc<dyn LockBackend> {
        self.backend.clone()
    }

    async fn admin_delete(&self, name: &LockName) {
        self.backend.get().break_lock(name).await.expect("break");
    }

    async fn admin_steal(&self, name: &LockName, owner: &Identity, ttl: Duration) {
        self.backend
            .get()
            .force_owner(name, owner, ttl)
            .await
            .expect("force owner");
    }

    async fn cuttable(&self) -> Option<Cuttable> {
        let config = self
            .db
            .config()
            .with_busy_timeout(Duration::from_millis(100));
        let backend = LocalBackend::connect(config).await.expect("second backend");
        let (tx, rx) = watch::channel(false);
        let url = format!("sqlite://{}", self.db.path().display());
        tokio::spawn(hold_writer(url, rx));
        Some(Cuttable {
            backend: Arc::new(backend),
            outage: Arc::new(WriterHold(tx)),
        })
    }

    async fn restart_server(&self) -> Option<()> {
        let old = self.backend.get();
        old.close().await;
        let fresh = self.db.open().await;
        *self.backend.current.write().expect("lock") = fresh;
        Some(())
    }
}

conformance::suite!(harness().await);
