//! PostgreSQL: ours on a schema of its own, `SELECT 1` as the raw round trip, and
//! `pg_advisory_lock` through sqlx as the peer.

use std::hash::{DefaultHasher, Hash, Hasher};
use std::sync::Arc;

use async_trait::async_trait;
use lockcore::LockBackend;
use sqlx::pool::PoolConnection;
use sqlx::postgres::{PgPoolOptions, Postgres};
use sqlx::{AssertSqlSafe, PgPool};

use crate::op::{Entry, Held, Lock, Op, Res, Role};
use crate::raw_conns::RawConns;
use crate::system::{Ctx, Kind, Peer, System, host_port, with_param};

/// Connections in ours' pool and the peer's pool: enough that 64 tasks never
/// queue for one (the backend's default pool has 10).
pub(crate) const POOL: u32 = 64;

/// The schema of this run's lease table.
pub(crate) fn schema(run: &str) -> String {
    format!("anylock_bench_{run}")
}

/// Ours alone at `url`, in run `run`'s schema, with a pool of [`POOL`].
pub(crate) async fn ours(url: &str, run: &str) -> Res<Arc<dyn LockBackend>> {
    let ours = with_param(
        &with_param(url, "schema", &schema(run)),
        "pool_size",
        &POOL.to_string(),
    );
    Ok(Arc::new(
        backend_postgres::PostgresBackend::from_url(&ours).await?,
    ))
}

/// PostgreSQL at `url` (`postgres://user@host:port/db`).
pub(crate) async fn connect(url: &str, ctx: &Ctx) -> Res<System> {
    let backend = ours(url, &ctx.run).await?;
    let setup = pool(url, 1).await?;
    let table = format!("\"{}\".raw_writes", schema(&ctx.run));
    let create =
        format!("CREATE TABLE IF NOT EXISTS {table} (name text PRIMARY KEY, v bigint NOT NULL)");
    sqlx::query(AssertSqlSafe(create)).execute(&setup).await?;
    setup.close().await;
    let raw = Arc::new(RawConns::new(url));
    let floor_table = format!("\"{}\".floor_locks", schema(&ctx.run));
    crate::floor::create_pg_table(url, &floor_table).await?;
    let peer = Advisory {
        pool: pool(url, POOL + 2).await?,
        run: ctx.run.clone(),
    };
    Ok(System {
        kind: Kind::Postgres,
        url: url.to_owned(),
        upstreams: host_port(url).into_iter().collect(),
        backend,
        raw: Some(Entry::new(
            "raw SELECT 1",
            Role::Raw,
            Arc::new(Select1(raw.clone())),
        )),
        extras: vec![
            Entry::new(
                "raw upsert + update (2 writes, the least a lease lock needs)",
                Role::Raw,
                Arc::new(TwoWrites {
                    conns: raw.clone(),
                    table,
                }),
            )
            .in_throughput(),
        ],
        peers: vec![Peer::new(
            "pg_advisory_lock (sqlx)",
            Arc::new(peer),
            "queued in the server",
        )],
        floor: Some(crate::floor::postgres(
            raw.clone(),
            url,
            floor_table,
            &ctx.run,
        )),
        counter: None,
        note: String::new(),
    })
}

/// A sqlx pool that never pings a connection before handing it out. It still pings each
/// connection as it comes back (sqlx 0.9, off the caller's path): two round trips per
/// statement. The peer uses it, as an application on sqlx would.
async fn pool(url: &str, size: u32) -> Res<PgPool> {
    Ok(PgPoolOptions::new()
        .max_connections(size)
        .test_before_acquire(false)
        .connect(url)
        .await?)
}

/// `SELECT 1`, a prepared statement on a kept connection.
struct Select1(Arc<RawConns>);

#[async_trait]
impl Op for Select1 {
    async fn run(&self, _: usize) -> Res<()> {
        let mut conn = self.0.take().await?;
        sqlx::query("SELECT 1").execute(&mut conn).await?;
        self.0.give_back(conn);
        Ok(())
    }
}

/// An upsert then an update of one row: the two write statements of any lease-table
/// lock's grant and release, without conditions, tokens or notifications, each on a kept
/// connection as a lock's acquire and release would be.
struct TwoWrites {
    conns: Arc<RawConns>,
    table: String,
}

#[async_trait]
impl Op for TwoWrites {
    async fn run(&self, i: usize) -> Res<()> {
        let name = format!("raw-{}", i % crate::op::NAMES);
        let upsert = format!(
            "INSERT INTO {} (name, v) VALUES ($1, 1) ON CONFLICT (name) DO UPDATE SET v = EXCLUDED.v + 1",
            self.table
        );
        let mut conn = self.conns.take().await?;
        sqlx::query(AssertSqlSafe(upsert))
            .bind(&name)
            .execute(&mut conn)
            .await?;
        self.conns.give_back(conn);
        let update = format!("UPDATE {} SET v = 0 WHERE name = $1", self.table);
        let mut conn = self.conns.take().await?;
        sqlx::query(AssertSqlSafe(update))
            .bind(&name)
            .execute(&mut conn)
            .await?;
        self.conns.give_back(conn);
        Ok(())
    }
}

/// Session advisory locks: `pg_try_advisory_lock` / `pg_advisory_lock` (which waits in
/// the server) and `pg_advisory_unlock`, on a connection kept for the lock's lifetime.
struct Advisory {
    pool: PgPool,
    run: String,
}

impl Advisory {
    fn key(&self, name: &str) -> i64 {
        let mut hasher = DefaultHasher::new();
        (&self.run, name).hash(&mut hasher);
        hasher.finish() as i64
    }
}

#[async_trait]
impl Lock for Advisory {
    async fn acquire(&self, name: &str, wait: bool) -> Res<Option<Held>> {
        let key = self.key(name);
        let mut conn = self.pool.acquire().await?;
        if wait {
            sqlx::query("SELECT pg_advisory_lock($1)")
                .bind(key)
                .execute(&mut *conn)
                .await?;
        } else {
            let got: bool = sqlx::query_scalar("SELECT pg_try_advisory_lock($1)")
                .bind(key)
                .fetch_one(&mut *conn)
                .await?;
            if !got {
                return Ok(None);
            }
        }
        Ok(Some(Box::new((conn, key))))
    }

    async fn release(&self, held: Held) -> Res<()> {
        let held = held
            .downcast::<(PoolConnection<Postgres>, i64)>()
            .map_err(|_| "not an advisory lock")?;
        let (mut conn, key) = *held;
        sqlx::query("SELECT pg_advisory_unlock($1)")
            .bind(key)
            .execute(&mut *conn)
            .await?;
        Ok(())
    }
}

/// Drops this run's schema (its lease table and fence sequence).
pub(crate) async fn cleanup(url: &str, run: &str) -> Res<()> {
    let pool = pool(url, 1).await?;
    sqlx::query(AssertSqlSafe(format!(
        "DROP SCHEMA IF EXISTS \"{}\" CASCADE",
        schema(run)
    )))
    .execute(&pool)
    .await?;
    pool.close().await;
    Ok(())
}
