//! A throwaway lock database for one test.

#![allow(dead_code, unreachable_pub)]

use std::path::PathBuf;

use backend_local::{LocalBackend, LocalConfig};

/// A temp directory removed on drop, holding one lock database.
#[derive(Debug)]
pub struct TempDb {
    pub dir: PathBuf,
}

impl TempDb {
    pub fn new() -> Self {
        let random: u64 = rand::random();
        let dir = std::env::temp_dir().join(format!("anylock-local-test-{random:016x}"));
        std::fs::create_dir_all(&dir).expect("temp dir");
        Self { dir }
    }

    pub fn path(&self) -> PathBuf {
        self.dir.join("locks.sqlite3")
    }

    pub fn config(&self) -> LocalConfig {
        LocalConfig::new(self.path())
    }

    pub async fn open(&self) -> LocalBackend {
        LocalBackend::connect(self.config())
            .await
            .expect("open the lock database")
    }
}

impl Drop for TempDb {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
