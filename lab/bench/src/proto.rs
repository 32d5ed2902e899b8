//! Prototypes of the batched refresh that item 4 asks for, written against the servers'
//! plain clients (the backends are not changed here): one shared etcd lease for all of a
//! process's locks; Redis refresh scripts pipelined 1,000 to a round trip; one PostgreSQL
//! `UPDATE` per 1,000 leases. They keep the same lease semantics as the backends
//! (refresh only our value / owner and token, only while live) and report what the same
//! load would cost. GCS has no batch call for conditional metadata patches: no prototype.

use std::sync::Arc;

use redis::aio::MultiplexedConnection;
use sqlx::{AssertSqlSafe, PgPool};
use tokio::sync::Mutex;

use futures_util::future::try_join_all;
use futures_util::{StreamExt, TryStreamExt, stream};
use tokio::time::Instant;

use anylock_etcd_proto::etcdserverpb::LeaseKeepAliveRequest;

use crate::args::Plan;
use crate::common::CONCURRENCY;
use crate::etcd_grpc::Etcd;
use crate::op::Res;
use crate::procstat::rss_bytes;
use crate::results::ScaleRow;
use crate::scale::Window;
use crate::system::PREFIX;
use crate::system::{Ctx, Kind, System};

/// Leases per pipelined batch or statement.
const CHUNK: usize = 1_000;

/// What the refresh rounds did.
#[derive(Debug, Default, Clone, Copy)]
struct Tally {
    refreshes: u64,
    round_trips: u64,
    failures: u64,
}

impl std::ops::AddAssign for Tally {
    fn add_assign(&mut self, other: Self) {
        self.refreshes += other.refreshes;
        self.round_trips += other.round_trips;
        self.failures += other.failures;
    }
}

/// Runs the prototype for `system`'s backend, if it has one.
pub(crate) async fn run(system: &System, ctx: &Ctx, plan: &Plan) -> Res<Option<ScaleRow>> {
    Ok(match system.kind {
        Kind::Etcd => Some(etcd(system, ctx, plan).await?),
        Kind::Redis | Kind::Redlock => Some(redis(system, ctx, plan).await?),
        Kind::Postgres => Some(postgres(system, ctx, plan).await?),
        Kind::Gcs | Kind::Local => None,
    })
}

/// Runs `round` at the end of each of `plan.scale_intervals` refresh intervals.
async fn rounds<F, Fut>(plan: &Plan, mut round: F) -> Res<(Window, Tally)>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Res<Tally>>,
{
    let interval = plan.scale_ttl / 8;
    let length = interval * plan.scale_intervals;
    let work = async {
        let mut total = Tally::default();
        let mut next = Instant::now();
        for _ in 0..plan.scale_intervals {
            next += interval;
            tokio::time::sleep_until(next).await;
            total += round().await?;
        }
        Res::Ok(total)
    };
    let (window, total) = Window::measure(length, work).await;
    Ok((window, total?))
}

fn row(
    system: &System,
    plan: &Plan,
    variant: &str,
    acquire_s: Option<f64>,
    rss: u64,
    run: (Window, Tally),
) -> ScaleRow {
    let (window, tally) = run;
    let seconds = window.length.as_secs_f64();
    ScaleRow {
        backend: system.kind.name().to_owned(),
        variant: variant.to_owned(),
        leases: plan.leases,
        ttl_s: plan.scale_ttl.as_secs_f64(),
        interval_s: (plan.scale_ttl / 8).as_secs_f64(),
        acquire_s,
        rss_per_lease: Some(rss as f64 / plan.leases as f64),
        refreshes_per_s: tally.refreshes as f64 / seconds,
        refresh_calls_per_s: None,
        batch_limit: None,
        round_trips_per_s: Some(tally.round_trips as f64 / seconds),
        cpu_percent: window.cpu_percent(),
        failures: tally.failures,
        lost: 0,
        error: None,
    }
}

/// One lease for every key: acquire is one create-if-absent Txn per key, a refresh round
/// is one keep-alive on a long-lived stream plus one count of the keys (did an operator
/// delete one?), release is one revoke.
async fn etcd(system: &System, ctx: &Ctx, plan: &Plan) -> Res<ScaleRow> {
    let client = Etcd::connect(&system.url)?;
    let ttl = plan.scale_ttl.as_secs().max(2) as i64;
    let (rss, start) = (rss_bytes(), Instant::now());
    let lease = client.lease_grant(ttl).await?;
    let prefix = format!("anylock-bench-proto-{}/", ctx.run);
    stream::iter(0..plan.leases)
        .map(|i| {
            let (client, key) = (client.clone(), format!("{prefix}{i}/{lease:x}"));
            async move {
                let done = client.create_if_absent(&key, lease).await?;
                if done {
                    Ok(())
                } else {
                    Err(crate::op::BoxError::from("key exists"))
                }
            }
        })
        .buffer_unordered(CONCURRENCY)
        .try_collect::<Vec<()>>()
        .await?;
    let acquire_s = start.elapsed().as_secs_f64();
    let added = rss_bytes().saturating_sub(rss);
    let stream = Arc::new(Mutex::new(client.lease_keep_alive(lease).await?));
    let leases = plan.leases as u64;
    let measured = rounds(plan, || {
        let (stream, client, prefix) = (stream.clone(), client.clone(), prefix.clone());
        async move {
            let mut stream = stream.lock().await;
            let (keeper, replies) = &mut *stream;
            keeper.send(LeaseKeepAliveRequest { id: lease }).await?;
            replies.message().await?.ok_or("keep-alive stream ended")?;
            let count = client.count(&prefix).await? as u64;
            Ok(Tally {
                refreshes: leases,
                round_trips: 2,
                failures: leases.saturating_sub(count),
            })
        }
    })
    .await?;
    client.lease_revoke(lease).await?;
    Ok(row(
        system,
        plan,
        "prototype: one shared lease",
        Some(acquire_s),
        added,
        measured,
    ))
}

/// Compare-and-`PEXPIRE`, as the backend's refresh script does (without the report of
/// who holds it instead).
const REFRESH_SCRIPT: &str = "if redis.call('GET', KEYS[1]) == ARGV[1] then \
    return redis.call('PEXPIRE', KEYS[1], ARGV[2]) else return 0 end";

/// Keys set once with `SET NX PX`; each refresh round pipelines the refresh script for
/// 1,000 keys per round trip, on every node at once.
async fn redis(system: &System, ctx: &Ctx, plan: &Plan) -> Res<ScaleRow> {
    let ttl_ms = plan.scale_ttl.as_millis() as u64;
    let mut conns = Vec::new();
    for url in system.url.split(',') {
        conns.push(crate::sys_redis::connection(url.trim()).await?);
    }
    let keys: Vec<(String, String)> = (0..plan.leases)
        .map(|i| {
            let key = format!("{{{PREFIX}:{}-proto-{i}}}:lock", ctx.run);
            (key, format!("{i}:{}", ctx.run))
        })
        .collect();
    let rss = rss_bytes();
    let mut sha = String::new();
    for conn in &mut conns {
        sha = redis_set_all(conn, &keys, ttl_ms).await?;
    }
    let added = rss_bytes().saturating_sub(rss);
    let measured = rounds(plan, || {
        redis_round(conns.clone(), &keys, sha.clone(), ttl_ms)
    })
    .await?;
    for conn in &mut conns {
        for chunk in keys.chunks(CHUNK) {
            let names: Vec<&String> = chunk.iter().map(|(k, _)| k).collect();
            redis::cmd("DEL")
                .arg(names)
                .query_async::<u64>(conn)
                .await?;
        }
    }
    let variant = "prototype: refresh scripts pipelined, 1,000 per round trip";
    Ok(row(system, plan, variant, None, added, measured))
}

/// Loads the refresh script and sets every key, 1,000 per pipeline; the script's SHA.
async fn redis_set_all(
    conn: &mut MultiplexedConnection,
    keys: &[(String, String)],
    ttl_ms: u64,
) -> Res<String> {
    let sha = redis::cmd("SCRIPT")
        .arg("LOAD")
        .arg(REFRESH_SCRIPT)
        .query_async(conn)
        .await?;
    for chunk in keys.chunks(CHUNK) {
        let mut pipe = redis::pipe();
        for (key, value) in chunk {
            pipe.cmd("SET")
                .arg(key)
                .arg(value)
                .arg("NX")
                .arg("PX")
                .arg(ttl_ms)
                .ignore();
        }
        pipe.query_async::<()>(conn).await?;
    }
    Ok(sha)
}

/// One refresh round: every key on every node, 1,000 scripts per pipelined round trip.
async fn redis_round(
    conns: Vec<MultiplexedConnection>,
    keys: &[(String, String)],
    sha: String,
    ttl_ms: u64,
) -> Res<Tally> {
    let per_node = try_join_all(conns.into_iter().map(|mut conn| {
        let sha = sha.clone();
        async move {
            let mut tally = Tally::default();
            for chunk in keys.chunks(CHUNK) {
                let mut pipe = redis::pipe();
                for (key, value) in chunk {
                    pipe.cmd("EVALSHA")
                        .arg(&sha)
                        .arg(1)
                        .arg(key)
                        .arg(value)
                        .arg(ttl_ms);
                }
                let done: Vec<i64> = pipe.query_async(&mut conn).await?;
                tally.round_trips += 1;
                tally.failures += done.iter().filter(|d| **d == 0).count() as u64;
            }
            Res::Ok(tally)
        }
    }))
    .await?;
    let mut total = Tally {
        refreshes: keys.len() as u64,
        ..Tally::default()
    };
    for node in per_node {
        total.round_trips += node.round_trips;
        total.failures += node.failures;
    }
    Ok(total)
}

/// One lease row: name, owner, fence token.
type LeaseRow = (String, String, i64);

/// The columns of `rows`, as arrays for `unnest`.
fn columns(rows: &[LeaseRow]) -> (Vec<String>, Vec<String>, Vec<i64>) {
    let names = rows.iter().map(|r| r.0.clone()).collect();
    let owners = rows.iter().map(|r| r.1.clone()).collect();
    let tokens = rows.iter().map(|r| r.2).collect();
    (names, owners, tokens)
}

/// Rows inserted once; each refresh round is one `UPDATE` per 1,000 leases, conditioned
/// on owner, token and a live lease like the backend's refresh.
async fn postgres(system: &System, ctx: &Ctx, plan: &Plan) -> Res<ScaleRow> {
    let pool = sqlx::postgres::PgPoolOptions::new()
        .max_connections(2)
        .test_before_acquire(false)
        .connect(&system.url)
        .await?;
    let table = format!("\"{}\".proto_leases", crate::sys_pg::schema(&ctx.run));
    let ttl_us = plan.scale_ttl.as_micros() as i64;
    let rows: Vec<LeaseRow> = (0..plan.leases)
        .map(|i| (format!("proto-{i}"), format!("owner-{i}"), i as i64 + 1))
        .collect();
    let rss = rss_bytes();
    pg_insert_all(&pool, &table, &rows, ttl_us).await?;
    let added = rss_bytes().saturating_sub(rss);
    let update = format!(
        "UPDATE {table} AS l SET expires_at = now() + $4 * interval '1 microsecond' \
         FROM unnest($1::text[], $2::text[], $3::bigint[]) AS u (n, o, t) \
         WHERE l.name = u.n AND l.owner = u.o AND l.token = u.t AND l.expires_at > clock_timestamp()"
    );
    let measured = rounds(plan, || {
        pg_round(pool.clone(), &rows, update.clone(), ttl_us)
    })
    .await?;
    sqlx::query(AssertSqlSafe(format!("DROP TABLE {table}")))
        .execute(&pool)
        .await?;
    pool.close().await;
    let variant = "prototype: one UPDATE per 1,000 leases";
    Ok(row(system, plan, variant, None, added, measured))
}

/// Creates the prototype's table and inserts every lease, 1,000 per statement.
async fn pg_insert_all(pool: &PgPool, table: &str, rows: &[LeaseRow], ttl_us: i64) -> Res<()> {
    let create = format!(
        "CREATE TABLE {table} (name text PRIMARY KEY, owner text NOT NULL, \
         token bigint NOT NULL, expires_at timestamptz NOT NULL)"
    );
    sqlx::query(AssertSqlSafe(create)).execute(pool).await?;
    let insert = format!(
        "INSERT INTO {table} SELECT n, o, t, now() + $4 * interval '1 microsecond' \
         FROM unnest($1::text[], $2::text[], $3::bigint[]) AS u (n, o, t)"
    );
    for chunk in rows.chunks(CHUNK) {
        let (names, owners, tokens) = columns(chunk);
        let query = sqlx::query(AssertSqlSafe(insert.clone()));
        query
            .bind(names)
            .bind(owners)
            .bind(tokens)
            .bind(ttl_us)
            .execute(pool)
            .await?;
    }
    Ok(())
}

/// One refresh round: one conditional `UPDATE` per 1,000 leases.
async fn pg_round(pool: PgPool, rows: &[LeaseRow], update: String, ttl_us: i64) -> Res<Tally> {
    let mut tally = Tally {
        refreshes: rows.len() as u64,
        ..Tally::default()
    };
    for chunk in rows.chunks(CHUNK) {
        let (names, owners, tokens) = columns(chunk);
        let query = sqlx::query(AssertSqlSafe(update.clone()));
        let done = query
            .bind(names)
            .bind(owners)
            .bind(tokens)
            .bind(ttl_us)
            .execute(&pool)
            .await?;
        tally.round_trips += 1;
        tally.failures += chunk.len() as u64 - done.rows_affected();
    }
    Ok(tally)
}
