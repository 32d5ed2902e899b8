//! Four workers take turns on one lock; each prints its fencing token and lease health.
//! Then an operator deletes a held lock behind its holder's back, and the holder's guard
//! reports Lost within one refresh interval.
//!
//! Run: `cargo run -q -p lockcore --example quickstart`

use std::sync::Arc;
use std::time::{Duration, Instant};

use lockcore::{LockName, LockOptions, Locker, MemoryBackend};

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), lockcore::Error> {
    let backend = MemoryBackend::new();
    let locker = Locker::new(Arc::new(backend.clone()))
        .with_options(LockOptions::new(Duration::from_millis(800)));

    let workers = (1..=4).map(|worker| {
        let locker = locker.clone();
        tokio::spawn(async move {
            let guard = locker.acquire("publish-repo").await?;
            let token = guard.fence_token().map_or(0, |t| t.get());
            println!("worker {worker}: holding publish-repo with fence token {token}");
            tokio::time::sleep(Duration::from_millis(250)).await;
            println!("worker {worker}: done ({}), releasing", guard.state());
            guard.release().await
        })
    });
    for worker in workers.collect::<Vec<_>>() {
        worker.await.expect("worker task")?;
    }

    let guard = locker.acquire("publish-repo").await?;
    let started = Instant::now();
    backend.admin_delete(&LockName::new("publish-repo")?);
    println!("operator: deleted publish-repo behind its holder's back");
    let reason = guard.lost().await;
    println!("holder: lost after {:?}: {reason}", started.elapsed());
    Ok(())
}
