//! One line per backend for the report: server version and how it was reached.

use crate::op::Res;
use crate::system::{Kind, System};

/// `redis: Redis 7.0.15 at 127.0.0.1:27101` and the like; the error text when the
/// version cannot be read.
pub(crate) async fn describe(system: &System) -> String {
    let version = match version(system).await {
        Ok(v) => v,
        Err(e) => format!("version unknown ({e})"),
    };
    let mut line = format!("{}: {version}", system.kind.name());
    if !system.upstreams.is_empty() {
        line.push_str(&format!(" at {}", system.upstreams.join(", ")));
    }
    if !system.note.is_empty() {
        line.push_str(&format!("; {}", system.note));
    }
    line
}

async fn version(system: &System) -> Res<String> {
    let first = system.url.split(',').next().unwrap_or_default().trim();
    Ok(match system.kind {
        Kind::Redis | Kind::Redlock => {
            let mut conn = redis::Client::open(first)?
                .get_multiplexed_async_connection()
                .await?;
            let info: String = redis::cmd("INFO")
                .arg("server")
                .query_async(&mut conn)
                .await?;
            let v = info
                .lines()
                .find_map(|l| l.strip_prefix("redis_version:"))
                .unwrap_or("?");
            let nodes = system.upstreams.len();
            format!(
                "Redis {}{}",
                v.trim(),
                if nodes > 1 {
                    format!(", {nodes} independent nodes")
                } else {
                    String::new()
                }
            )
        }
        Kind::Postgres => {
            let pool = sqlx::postgres::PgPoolOptions::new()
                .max_connections(1)
                .connect(first)
                .await?;
            let v: String = sqlx::query_scalar("SHOW server_version")
                .fetch_one(&pool)
                .await?;
            pool.close().await;
            format!("PostgreSQL {v}")
        }
        Kind::Etcd => {
            let url = format!("{}/version", first.trim_end_matches('/'));
            let body: serde_json::Value =
                serde_json::from_str(&reqwest::get(url).await?.text().await?)?;
            format!("etcd {}", body["etcdserver"].as_str().unwrap_or("?"))
        }
        Kind::Gcs if first.contains("endpoint=http://127.0.0.1") => {
            "gcs-test-server (in this process, its own 1-thread runtime)".to_owned()
        }
        Kind::Gcs => "Google Cloud Storage JSON API".to_owned(),
        Kind::Local => "SQLite (embedded, no server)".to_owned(),
    })
}
