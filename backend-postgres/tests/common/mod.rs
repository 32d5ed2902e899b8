//! Helpers shared by the integration tests: server URLs, fresh schemas, an admin pool, the
//! conformance harness and the private server.

#![allow(dead_code)]

use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use async_trait::async_trait;
use backend_postgres::{PostgresBackend, PostgresConfig};
use conformance::{Cuttable, Harness, Timing};
use lockcore::{Acquire, AcquireRequest, Identity, Lease, LockBackend, LockName};
use sqlx::postgres::{PgPool, PgPoolOptions};
use test_kit::proxy::FaultProxy;
pub(crate) use test_kit::servers::Postgres;
use tokio::sync::{OwnedRwLockReadGuard, RwLock};

/// The shared server's URL (`None`: skip outside CI; panics in CI when unset).
pub(crate) fn shared_url() -> Option<String> {
    test_kit::env::require("ANYLOCK_TEST_POSTGRES_URL", "PostgreSQL")
}

/// A schema name no other run uses.
pub(crate) fn fresh_schema(tag: &str) -> String {
    let random: u64 = rand::random();
    format!("anylock_test_{tag}_{random:016x}")
}

/// Drops a test's schema on the shared server when dropped (also when the test panics).
#[derive(Debug)]
pub(crate) struct DropSchema {
    url: String,
    schema: String,
}

/// Drops `schema` (and everything in it) from `url`'s database at the end of the scope.
pub(crate) fn drop_schema_later(url: &str, schema: &str) -> DropSchema {
    DropSchema {
        url: url.to_owned(),
        schema: schema.to_owned(),
    }
}

impl Drop for DropSchema {
    fn drop(&mut self) {
        let sql = format!(
            "SET lock_timeout = '2s'; DROP SCHEMA IF EXISTS \"{}\" CASCADE",
            self.schema.replace('"', "\"\"")
        );
        let psql = test_kit::servers::pg_bin()
            .expect("PostgreSQL's psql")
            .join("psql");
        let dropped = std::process::Command::new(psql)
            .args(["-X", "-q", &self.url, "-c", &sql])
            .output();
        if !dropped.is_ok_and(|o| o.status.success()) {
            eprintln!("could not drop test schema {:?}", self.schema);
        }
    }
}

/// A lock name no other test uses.
pub(crate) fn fresh_name(tag: &str) -> LockName {
    let random: u64 = rand::random();
    LockName::new(format!("{tag}-{random:016x}")).expect("valid name")
}

/// A config for `url` using `schema`.
pub(crate) fn config(url: &str, schema: &str) -> PostgresConfig {
    PostgresConfig::from_url(url)
        .expect("valid test URL")
        .with_schema(schema)
}

/// A backend on `url` in `schema` (created if missing).
pub(crate) async fn backend(url: &str, schema: &str) -> PostgresBackend {
    PostgresBackend::connect(config(url, schema))
        .await
        .expect("connect to the test server")
}

/// A small pool for the test's own statements (as an operator would run them).
pub(crate) async fn admin(url: &str) -> PgPool {
    PgPoolOptions::new()
        .max_connections(3)
        .connect(url)
        .await
        .expect("admin connection")
}

/// `"schema"."leases"`, quoted for the test's own statements.
pub(crate) fn table(schema: &str) -> String {
    format!("\"{}\".\"leases\"", schema.replace('"', "\"\""))
}

/// One direct attempt.
pub(crate) async fn attempt(
    backend: &dyn LockBackend,
    name: &LockName,
    owner: &Identity,
    ttl: Duration,
) -> Acquire {
    let request = AcquireRequest::new(
        name.clone(),
        owner.clone(),
        lockcore::Ttl::new(ttl).expect("valid TTL"),
    );
    backend.acquire(&request).await.expect("acquire call")
}

/// One direct attempt that must win.
pub(crate) async fn grant(
    backend: &dyn LockBackend,
    name: &LockName,
    owner: &Identity,
    ttl: Duration,
) -> Lease {
    match attempt(backend, name, owner, ttl).await {
        Acquire::Acquired(lease) => lease,
        Acquire::Held(holder) => panic!("{name} unexpectedly held by {}", holder.owner()),
    }
}

/// Deletes a row the way an operator would: no notification.
pub(crate) async fn admin_delete(admin: &PgPool, table: &str, name: &LockName) {
    sqlx::query(sqlx::AssertSqlSafe(format!(
        "DELETE FROM {table} WHERE name = $1"
    )))
    .bind(name.as_str())
    .execute(admin)
    .await
    .expect("admin delete");
}

/// Overwrites a row with another owner and a fresh token, the way an operator would.
pub(crate) async fn admin_steal(
    admin: &PgPool,
    table: &str,
    name: &LockName,
    owner: &Identity,
    ttl: Duration,
) {
    sqlx::query(sqlx::AssertSqlSafe(format!(
        "INSERT INTO {table} AS l (name, owner, acquired_at, expires_at) \
         VALUES ($1, $2, now(), now() + $3::bigint * interval '1 microsecond') \
         ON CONFLICT (name) DO UPDATE SET owner = EXCLUDED.owner, token = DEFAULT, \
           acquired_at = now(), expires_at = EXCLUDED.expires_at"
    )))
    .bind(name.as_str())
    .bind(owner.as_str())
    .bind(ttl.as_micros() as i64)
    .execute(admin)
    .await
    .expect("admin steal");
}

/// Serializes server restarts against every other harness of this test process: each
/// harness holds a read guard for its life, a restart takes the write side.
static RESTART: std::sync::LazyLock<Arc<RwLock<()>>> =
    std::sync::LazyLock::new(|| Arc::new(RwLock::new(())));

/// Exclusive use of the private server (no harness of this process runs meanwhile), for
/// tests that restart it or read its global statistics.
pub(crate) async fn exclusive() -> tokio::sync::OwnedRwLockWriteGuard<()> {
    RESTART.clone().write_owned().await
}

/// The private server of this test process, started on first use.
static PRIVATE: tokio::sync::OnceCell<Arc<Postgres>> = tokio::sync::OnceCell::const_new();

/// The private server of this test process.
pub(crate) async fn private_server() -> Arc<Postgres> {
    PRIVATE
        .get_or_init(|| async {
            let started = tokio::task::spawn_blocking(Postgres::start).await;
            Arc::new(started.expect("start the private PostgreSQL server"))
        })
        .await
        .clone()
}

/// The conformance harness: a fresh schema on the private server, a cuttable second
/// backend through a fault proxy, and restarts of the private server.
pub(crate) struct PgHarness {
    server: Arc<Postgres>,
    schema: String,
    backend: PostgresBackend,
    admin: PgPool,
    proxies: Mutex<Vec<FaultProxy>>,
    guard: tokio::sync::Mutex<Option<OwnedRwLockReadGuard<()>>>,
}

impl PgHarness {
    /// A harness with a fresh schema on the private server; `None` (skip) outside CI
    /// when the project's servers are not set up.
    pub(crate) async fn new() -> Option<PgHarness> {
        shared_url()?;
        let server = private_server().await;
        let guard = RESTART.clone().read_owned().await;
        let schema = fresh_schema("conf");
        let backend = backend(&server.url(), &schema).await;
        let admin = admin(&server.url()).await;
        Some(PgHarness {
            server,
            schema,
            backend,
            admin,
            proxies: Mutex::new(Vec::new()),
            guard: tokio::sync::Mutex::new(Some(guard)),
        })
    }

    fn table(&self) -> String {
        table(&self.schema)
    }
}

#[async_trait]
impl Harness for PgHarness {
    fn label(&self) -> &str {
        "postgres"
    }

    fn backend(&self) -> Arc<dyn LockBackend> {
        Arc::new(self.backend.clone())
    }

    fn timing(&self) -> Timing {
        Timing::default().with_slack(Duration::from_secs(2))
    }

    async fn admin_delete(&self, name: &LockName) {
        admin_delete(&self.admin, &self.table(), name).await;
    }

    async fn admin_steal(&self, name: &LockName, owner: &Identity, ttl: Duration) {
        admin_steal(&self.admin, &self.table(), name, owner, ttl).await;
    }

    async fn cuttable(&self) -> Option<Cuttable> {
        let proxy = FaultProxy::start(self.server.addr()).await.expect("proxy");
        let url = self.server.url().replace(
            &self.server.addr().to_string(),
            &proxy.local_addr().to_string(),
        );
        let backend = backend(&url, &self.schema).await;
        let outage = Arc::new(proxy.handle());
        self.proxies
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push(proxy);
        Some(Cuttable {
            backend: Arc::new(backend),
            outage,
        })
    }

    async fn restart_server(&self) -> Option<()> {
        let mut own = self.guard.lock().await;
        own.take();
        let exclusive = RESTART.clone().write_owned().await;
        let server = self.server.clone();
        tokio::task::spawn_blocking(move || server.restart())
            .await
            .expect("restart the private server");
        drop(exclusive);
        *own = Some(RESTART.clone().read_owned().await);
        Some(())
    }
}
