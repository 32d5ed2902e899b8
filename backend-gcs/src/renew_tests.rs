//! Background renewal survives its runtime: a renewal dropped half-way (its runtime shut
//! down) does not switch background renewal off for good.

use std::time::{Duration, Instant};

use super::{Cached, Renewing, Source};

/// A token due for renewal but still valid for a minute.
async fn due(renewing: &Renewing, token: &str) {
    *renewing.inner.cached.lock().await = Some(Cached {
        token: token.to_owned(),
        renew_at: Instant::now() - Duration::from_secs(1),
        expires_at: Instant::now() + Duration::from_secs(60),
    });
}

#[test]
fn a_renewal_dropped_with_its_runtime_does_not_stop_later_ones() {
    let dir = std::env::temp_dir().join(format!(
        "anylock-renew-{}-{}",
        std::process::id(),
        lockcore::Identity::unique().as_str().replace('/', "_")
    ));
    std::fs::create_dir_all(&dir).expect("scratch dir");
    let gate = dir.join("gate");
    // Hangs until the gate exists, then prints a new token.
    let command = format!(
        "while [ ! -e '{}' ]; do sleep 0.02; done; echo new-token",
        gate.display()
    );
    #[cfg(feature = "tls")]
    let _ = rustls::crypto::ring::default_provider().install_default();
    let http = reqwest::Client::new();
    let renewing = Renewing::new(Source::Command(command), http, Duration::from_secs(10));

    // On a runtime of its own: the still-valid token is served and a background renewal
    // starts, which hangs; then that runtime shuts down with it.
    let first = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    first.block_on(async {
        due(&renewing, "old-token").await;
        assert_eq!(renewing.token().await.expect("served"), "old-token");
        tokio::task::yield_now().await;
    });
    drop(first);

    // Later, on another runtime: the next call past the renewal point renews again.
    std::fs::write(&gate, "").expect("open the gate");
    let second = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    second.block_on(async {
        assert_eq!(renewing.token().await.expect("served"), "old-token");
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let cached = renewing.inner.cached.lock().await;
            if cached.as_ref().is_some_and(|c| c.token == "new-token") {
                break;
            }
            drop(cached);
            assert!(
                Instant::now() < deadline,
                "no background renewal ran after the first one was dropped"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    });
    let _ = std::fs::remove_dir_all(&dir);
}

/// A waiter on one runtime does not hang on a fetch started on another runtime that
/// stalls (parked in blocking code, so the fetch never runs): it gives up after the
/// request timeout plus a second, as `Unavailable`.
#[test]
fn a_waiter_does_not_hang_on_a_fetch_whose_runtime_stalls() {
    #[cfg(feature = "tls")]
    let _ = rustls::crypto::ring::default_provider().install_default();
    let renewing = std::sync::Arc::new(Renewing::new(
        Source::Command("echo fresh-token".to_owned()),
        reqwest::Client::new(),
        Duration::from_millis(500),
    ));
    let (started_tx, started_rx) = std::sync::mpsc::channel();
    let stalled = std::sync::Arc::clone(&renewing);
    let staller = std::thread::spawn(move || {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime");
        runtime.block_on(async {
            // The fetch is spawned on this runtime, which then blocks and never runs it.
            let _outcome = stalled.join_or_start();
            started_tx.send(()).expect("signal");
            std::thread::sleep(Duration::from_secs(6));
        });
    });
    started_rx.recv().expect("the fetch was started");
    let waiter = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let began = Instant::now();
    let err = waiter
        .block_on(renewing.token())
        .expect_err("the stalled fetch never answers");
    assert_eq!(err.kind(), lockcore::ErrorKind::Unavailable, "{err}");
    assert!(
        began.elapsed() < Duration::from_secs(4),
        "waited {:?}",
        began.elapsed()
    );
    staller.join().expect("staller");
}
