//! The raw handoff floors: the least a notified handoff needs on each server, written
//! with the backend's own client crate and the server's plain commands (no scripts, no
//! fencing, no owner check), timed in the handoff section beside ours. What our notified
//! handoff costs beyond its floor is ours; the floor itself, in raw round trips, is what
//! the machine costs (each step wakes a thread or a server process that sat idle for
//! the 50–150 ms the holder held the lock).

use std::sync::Arc;

use async_trait::async_trait;
use futures_util::StreamExt;
use redis::aio::MultiplexedConnection;
use sqlx::postgres::PgListener;
use sqlx::{AssertSqlSafe, Connection};

use crate::op::{Held, Lock, Res};
use crate::raw_conns::RawConns;
use crate::system::PREFIX;
use crate::system::Peer;

/// What the handoff table calls a floor.
pub(crate) const LABEL: &str = "raw floor";

/// Redis: `SET key NX PX` to take; `DEL` + `PUBLISH` (one pipeline) to release; a waiter
/// subscribes first, then tries `SET NX` at every message.
pub(crate) fn redis(client: redis::Client, conn: MultiplexedConnection, run: &str) -> Peer {
    Peer::new(
        LABEL,
        Arc::new(RedisFloor {
            client,
            conn,
            run: run.to_owned(),
        }),
        "notified: DEL + PUBLISH, the subscriber's SET NX",
    )
}

struct RedisFloor {
    client: redis::Client,
    conn: MultiplexedConnection,
    run: String,
}

impl RedisFloor {
    fn key(&self, name: &str) -> String {
        format!("{PREFIX}-floor:{}:{name}", self.run)
    }

    async fn take(&self, key: &str) -> Res<bool> {
        let mut conn = self.conn.clone();
        let set: Option<String> = redis::cmd("SET")
            .arg(key)
            .arg("v")
            .arg("NX")
            .arg("PX")
            .arg(30_000)
            .query_async(&mut conn)
            .await?;
        Ok(set.is_some())
    }
}

#[async_trait]
impl Lock for RedisFloor {
    async fn acquire(&self, name: &str, wait: bool) -> Res<Option<Held>> {
        let key = self.key(name);
        if !wait {
            return Ok(self.take(&key).await?.then(|| Box::new(key) as Held));
        }
        let mut pubsub = self.client.get_async_pubsub().await?;
        pubsub.subscribe(format!("{key}:released")).await?;
        let mut messages = pubsub.on_message();
        loop {
            if self.take(&key).await? {
                return Ok(Some(Box::new(key)));
            }
            messages
                .next()
                .await
                .ok_or("the floor's subscription ended")?;
        }
    }

    async fn release(&self, held: Held) -> Res<()> {
        let key = held.downcast::<String>().map_err(|_| "not a floor key")?;
        let mut conn = self.conn.clone();
        redis::pipe()
            .cmd("DEL")
            .arg(key.as_str())
            .ignore()
            .cmd("PUBLISH")
            .arg(format!("{key}:released"))
            .arg("released")
            .ignore()
            .query_async::<()>(&mut conn)
            .await?;
        Ok(())
    }
}

/// PostgreSQL: an `INSERT … ON CONFLICT DO NOTHING` of the name to take; one statement
/// that deletes it and calls `pg_notify` to release; a waiter `LISTEN`s first, then tries
/// the insert at every notification. Statements on kept connections, as the raw entries.
pub(crate) fn postgres(conns: Arc<RawConns>, url: &str, table: String, run: &str) -> Peer {
    Peer::new(
        LABEL,
        Arc::new(PgFloor {
            conns,
            url: url.to_owned(),
            table,
            channel: format!("anylock_bench_floor_{run}"),
        }),
        "notified: DELETE + pg_notify, the listener's INSERT",
    )
}

struct PgFloor {
    conns: Arc<RawConns>,
    url: String,
    table: String,
    channel: String,
}

impl PgFloor {
    async fn take(&self, name: &str) -> Res<bool> {
        let insert = format!(
            "INSERT INTO {} (name) VALUES ($1) ON CONFLICT DO NOTHING RETURNING 1",
            self.table
        );
        let mut conn = self.conns.take().await?;
        let row: Option<i32> = sqlx::query_scalar(AssertSqlSafe(insert))
            .bind(name)
            .fetch_optional(&mut conn)
            .await?;
        self.conns.give_back(conn);
        Ok(row.is_some())
    }
}

#[async_trait]
impl Lock for PgFloor {
    async fn acquire(&self, name: &str, wait: bool) -> Res<Option<Held>> {
        if !wait {
            return Ok(self
                .take(name)
                .await?
                .then(|| Box::new(name.to_owned()) as Held));
        }
        let mut listener = PgListener::connect(&self.url).await?;
        listener.listen(&self.channel).await?;
        loop {
            if self.take(name).await? {
                return Ok(Some(Box::new(name.to_owned())));
            }
            listener.recv().await?;
        }
    }

    async fn release(&self, held: Held) -> Res<()> {
        let name = held.downcast::<String>().map_err(|_| "not a floor name")?;
        let release = format!(
            "WITH gone AS (DELETE FROM {} WHERE name = $1 RETURNING name) \
             SELECT pg_notify($2, name) FROM gone",
            self.table
        );
        let mut conn = self.conns.take().await?;
        sqlx::query(AssertSqlSafe(release))
            .bind(name.as_str())
            .bind(&self.channel)
            .execute(&mut conn)
            .await?;
        self.conns.give_back(conn);
        Ok(())
    }
}

/// Creates the PostgreSQL floor's table (one column, the name) in `schema`.
pub(crate) async fn create_pg_table(url: &str, table: &str) -> Res<()> {
    let mut conn = sqlx::PgConnection::connect(url).await?;
    let create = format!("CREATE TABLE IF NOT EXISTS {table} (name text PRIMARY KEY)");
    sqlx::query(AssertSqlSafe(create))
        .execute(&mut conn)
        .await?;
    conn.close().await?;
    Ok(())
}
