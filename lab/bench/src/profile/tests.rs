//! Tests of `--profile`: workload names and the text files.

use std::time::Duration;

use super::text::{
    Measured, Members, Stack, clean, crate_of, go_package, members_summary, summary,
};
use super::*;
use crate::go_pprof::CpuProfile;

fn stack(thread: &str, frames: &[&str], samples: u64) -> Stack {
    Stack {
        thread: thread.to_owned(),
        frames: frames.iter().map(|f| (*f).to_owned()).collect(),
        samples,
    }
}

#[test]
fn frames_belong_to_the_crate_of_their_path() {
    assert_eq!(
        crate_of("<backend_redis::B as lockcore::L>::acquire"),
        "backend_redis"
    );
    assert_eq!(crate_of("lockcore::locker::Locker::acquire"), "lockcore");
    assert_eq!(crate_of("epoll_wait"), "C (libc, system calls)");
}

#[test]
fn hashes_are_dropped_from_names() {
    assert_eq!(clean("a::b::h0123456789abcdef"), "a::b");
    assert_eq!(clean("a::hello"), "a::hello");
}

#[test]
fn shares_count_self_once_and_inclusive_once_per_stack() {
    let stacks = [
        stack(
            "bench-worker",
            &[
                "__GI___writev",
                "lockcore::send",
                "lockcore::send",
                "lockcore::main",
            ],
            3,
        ),
        stack(
            "main",
            &[
                "<redis::Parser as X>::parse",
                "tokio::park",
                "lockcore::main",
            ],
            1,
        ),
    ];
    let measured = Measured {
        wall_s: 1.0,
        cpu_s: 0.5,
        cycles: 2,
        failed: 1,
    };
    let text = summary("t", &stacks, measured);
    assert!(
        text.contains("2 cycles (1 failed) in 1.00 s, 2 a second"),
        "{text}"
    );
    assert!(text.contains(" 75.0 %  bench-worker"), "{text}");
    assert!(text.contains(" 75.0 %  C (libc, system calls)"), "{text}");
    assert!(text.contains(" 75.0 %  __GI___writev"), "{text}");
    // `send` appears twice in one stack but counts its samples once.
    assert!(text.contains(" 75.0 %  lockcore::send"), "{text}");
    assert!(text.contains("100.0 %  lockcore::main"), "{text}");
    assert!(!text.contains("%  tokio::park"), "{text}");
    assert!(
        text.contains(" 75.0 %  __GI___writev ← lockcore::send"),
        "{text}"
    );
    assert!(
        text.contains("250000.0 µs of process CPU per cycle (50 % of a core"),
        "{text}"
    );
    assert!(text.contains("4 samples at 997 Hz"), "{text}");
}

#[test]
fn client_sections_leave_the_test_servers_threads_out() {
    let stacks = [
        stack("bench-worker-1", &["__GI___writev", "backend_gcs::send"], 3),
        stack(
            "anylock-bench",
            &["lockcore::acquire", "backend_gcs::send"],
            1,
        ),
        stack("gcs-server-0", &["gcs_test_server::handle"], 4),
    ];
    let measured = Measured {
        wall_s: 1.0,
        cpu_s: 0.5,
        cycles: 2,
        failed: 0,
    };
    // 0.5 s of client CPU over 2 cycles: 250,000 µs per cycle, split 3:1.
    let text = summary("t", &stacks, measured);
    let client = &text[text.find("## client threads only").expect("client part")..];
    assert!(
        client.contains("187500.0  C (libc, system calls)"),
        "{client}"
    );
    assert!(client.contains("\n62500.0  lockcore\n"), "{client}");
    assert!(client.contains("250000.0  backend_gcs::send"), "{client}");
    assert!(!client.contains("gcs_test_server"), "{client}");
    // With the server in another process every thread is the client's, and the
    // sections still price each line per cycle, so two profiles compare line by line.
    let alone = summary("t", &stacks[..2], measured);
    let client = &alone[alone.find("## client threads only").expect("client part")..];
    assert!(client.contains("250000.0  backend_gcs::send"), "{client}");
}

#[test]
fn go_functions_belong_to_their_package() {
    assert_eq!(
        go_package("go.etcd.io/etcd/mvcc.(*keyIndex).Less"),
        "go.etcd.io/etcd/mvcc"
    );
    assert_eq!(
        go_package("google.golang.org/grpc/internal/transport.(*loopyWriter).run.func1"),
        "google.golang.org/grpc/internal/transport"
    );
    assert_eq!(go_package("runtime.futex"), "runtime");
    assert_eq!(go_package("cmpbody"), "cmpbody");
}

#[test]
fn the_members_text_prices_each_line_per_cycle() {
    let ms = |ms: u64| Duration::from_millis(ms);
    let mut profile = CpuProfile {
        duration: ms(10_000),
        cpu: ms(30),
        samples: 3,
        stacks: vec![(
            vec![
                "runtime.futex".to_owned(),
                "go.etcd.io/etcd/mvcc.put".to_owned(),
            ],
            20_000_000,
        )],
    };
    profile.merge(CpuProfile {
        duration: ms(10_000),
        cpu: ms(10),
        samples: 1,
        stacks: vec![(vec!["go.etcd.io/etcd/mvcc.put".to_owned()], 10_000_000)],
    });
    // Half a µs per cycle: listed by self, below the inclusive list's floor.
    profile.stacks.push((vec!["raft.tiny".to_owned()], 500_000));
    let members = Members {
        profile,
        each: vec![
            ("http://a".to_owned(), ms(30)),
            ("http://b".to_owned(), ms(10)),
        ],
        rest_of_machine: Some(ms(100)),
    };
    // 40 ms over 1,000 cycles: 40 µs per cycle, 30 of them in `put` itself or below.
    let text = members_summary("t", &members, 1_000);
    assert!(
        text.contains("(4 samples of 10.0 ms): 40.0 µs per cycle (http://a 30.0, http://b 10.0)"),
        "{text}"
    );
    assert!(
        text.contains("over the same cycles: 100.0 µs per cycle"),
        "{text}"
    );
    let packages = &text[text.find("## by Go package").expect("packages")..];
    assert!(packages.contains("   20.0      2  runtime\n"), "{packages}");
    assert!(
        packages.contains("   10.0      1  go.etcd.io/etcd/mvcc\n"),
        "{packages}"
    );
    let inclusive = &text[text.find("(inclusive)").expect("inclusive")..];
    assert!(
        inclusive.contains("   30.0      3  go.etcd.io/etcd/mvcc.put\n"),
        "{inclusive}"
    );
    assert!(!inclusive.contains("raft.tiny"), "{inclusive}");
    assert!(text.contains("    0.5      0  raft.tiny\n"), "{text}");
}

#[test]
fn workloads_name_a_backend_and_whose_cycle() {
    let parsed = |name| Workload::parse(name).expect(name);
    assert_eq!(
        parsed("postgres-floor"),
        Workload {
            kind: Kind::Postgres,
            who: Who::Floor
        }
    );
    assert_eq!(parsed("redis-peer").who, Who::Peer(0));
    assert_eq!(parsed("etcd-peer2").who, Who::Peer(1));
    assert_eq!(parsed("etcd-ours").kind, Kind::Etcd);
    // The older names of the Redis and GCS profiles still work.
    assert_eq!(parsed("redis-cycle"), parsed("redis-ours"));
    assert_eq!(parsed("gcs-cycle"), parsed("gcs-ours"));
    assert_eq!(parsed("gcs-loop"), parsed("gcs-peer"));
    for bad in [
        "redis",
        "postgres-loop",
        "mysql-ours",
        "",
        "-ours",
        "etcd-cycle",
    ] {
        let err = Workload::parse(bad).expect_err(bad).to_string();
        assert!(err.contains("name a backend"), "{bad}: {err}");
    }
}
