//! Redis restarted from an older RDB snapshot (issue #14): `SAVE` now, and later a
//! `SIGKILL` and a restart that loads the snapshot, taking every key back to it.

use tokio::time::Instant;

use super::{Lane, Servers};

impl Lane {
    /// Redis: `SAVE` (a synchronous RDB snapshot into the node's directory).
    ///
    /// # Errors
    /// When this is not the Redis lane or the server refuses.
    pub async fn snapshot_redis(&self) -> Result<(), String> {
        let Servers::Redis(node) = &self.servers else {
            return Err("not a Redis lane".into());
        };
        node.save().await
    }

    /// Redis: `SIGKILL` and an immediate restart that loads the last snapshot, then the
    /// snapshot file is removed so that later restarts start empty again.
    ///
    /// # Errors
    /// When this is not the Redis lane, no snapshot exists, or Redis does not come back.
    pub async fn restart_redis_from_snapshot(&mut self) -> Result<String, String> {
        let Servers::Redis(node) = &mut self.servers else {
            return Err("not a Redis lane".into());
        };
        let snapshot = node.snapshot_path();
        if !snapshot.exists() {
            return Err(format!("no snapshot at {}", snapshot.display()));
        }
        let started = Instant::now();
        node.try_restart().await?;
        let down = started.elapsed();
        self.discard_redis_snapshot()?;
        Ok(format!(
            "Redis down for {} ms, restarted from the snapshot",
            down.as_millis()
        ))
    }

    /// Redis: removes the snapshot file, if any, so that later restarts start empty.
    ///
    /// # Errors
    /// When this is not the Redis lane or the file cannot be removed.
    pub fn discard_redis_snapshot(&self) -> Result<(), String> {
        let Servers::Redis(node) = &self.servers else {
            return Err("not a Redis lane".into());
        };
        let snapshot = node.snapshot_path();
        match std::fs::remove_file(&snapshot) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                Err(format!("{}: {e}", snapshot.display()))
            }
            _ => Ok(()),
        }
    }
}
