//! The short (CI) version of the reliability harness, as part of `cargo test`.
//!
//! It starts its own private servers (redis-server, PostgreSQL, etcd: `scripts/servers
//! install` puts them on the machine) and fails when any backend breaks a guarantee its
//! `Guarantees` descriptor claims, or when a server is missing. It runs in CI (`CI=true`),
//! with `ANYLOCK_REQUIRE_SERVERS=1`, or with `ANYLOCK_TEST_RELIABILITY=1`; elsewhere it
//! prints one `SKIPPED:` line (it takes about a minute). `scripts/reliability --short` runs
//! the same cells from the command line: the lock under a dozen faults, the baseline with
//! permits of a semaphore of two on every backend with semaphores (an over-grant fails it),
//! and a paused leader on Redis (issue #18).

use std::path::PathBuf;

use anylock_reliability::report::{self, Meta};
use anylock_reliability::suite::{self, Plan, Suite, summary};

/// In CI (`CI=true`) or with `ANYLOCK_REQUIRE_SERVERS=1` the harness runs and a missing
/// server fails it, like every other server-backed test; `ANYLOCK_TEST_RELIABILITY=1` opts
/// in elsewhere.
fn wanted() -> bool {
    test_kit::env::servers_required()
        || std::env::var("ANYLOCK_TEST_RELIABILITY").as_deref() == Ok("1")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_short_harness_finds_no_violation_of_a_claimed_guarantee() {
    if !wanted() {
        eprintln!(
            "SKIPPED: the reliability harness runs in CI (CI=true), with \
             ANYLOCK_REQUIRE_SERVERS=1 or with ANYLOCK_TEST_RELIABILITY=1 (or run \
             scripts/reliability --short)"
        );
        return;
    }
    let out_dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("reliability-short");
    let _ = std::fs::remove_dir_all(&out_dir);
    let suite = Suite {
        plan: Plan::short(),
        exe: PathBuf::from(env!("CARGO_BIN_EXE_anylock-reliability")),
        out_dir: out_dir.clone(),
        jobs: 3,
    };
    let started = std::time::Instant::now();
    let results = suite::run(&suite).await.expect("run the harness");
    let meta = Meta {
        command: "cargo test -p anylock-reliability --test short".into(),
        date: String::new(),
        seconds: started.elapsed().as_secs_f64(),
        jobs: suite.jobs,
        results: out_dir.display().to_string(),
        short: true,
    };
    let text = report::render(&results, &meta);
    std::fs::write(out_dir.join("report.md"), &text).expect("write the report");
    for result in &results {
        println!("{}", summary(result));
    }
    assert_eq!(results.len(), suite.plan.cells.len());
    assert!(
        !report::failed(&results),
        "a claimed guarantee was violated or a run could not complete; report in {}:\n{text}",
        out_dir.display()
    );
}
