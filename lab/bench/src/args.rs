//! Command-line flags, the servers they name, and how much each section measures.

use std::path::PathBuf;
use std::time::Duration;

use clap::Parser;

use crate::op::Res;
use crate::system::Kind;

/// Benchmarks anylock's backends side by side with their servers' raw round trips and
/// with peer lock libraries, and writes the tables and plots of BENCHMARKS.md.
///
/// Every server flag falls back to the variable `scripts/servers` exports. A backend with
/// no URL is skipped, except under `--smoke` in CI (`CI=true`) or with
/// `ANYLOCK_REQUIRE_SERVERS=1`, where it is an error.
#[derive(Debug, Parser)]
#[command(name = "anylock-bench", version)]
pub(crate) struct Args {
    /// Redis for the single-instance backend: `redis://host:port/db`.
    #[arg(long, env = "ANYLOCK_TEST_REDIS_URL")]
    pub(crate) redis: Option<String>,
    /// Redlock nodes: `redlock://h1:p1,h2:p2,…` or `redis://h1:p1,redis://h2:p2,…`.
    #[arg(long, env = "ANYLOCK_TEST_REDLOCK_URLS")]
    pub(crate) redlock: Option<String>,
    /// PostgreSQL: `postgres://user@host:port/db` (a schema `anylock_bench_*` is created
    /// and dropped).
    #[arg(long, env = "ANYLOCK_TEST_POSTGRES_URL")]
    pub(crate) postgres: Option<String>,
    /// etcd: `etcd://h1:p1,…` or `http://h1:p1,…`; every client uses the first member.
    #[arg(long, env = "ANYLOCK_TEST_ETCD_ENDPOINTS")]
    pub(crate) etcd: Option<String>,
    /// GCS: `gs://bucket?endpoint=http://host:port` (a bearer token from
    /// `GCS_ACCESS_TOKEN` when set); default: an in-process gcs-test-server.
    #[arg(long)]
    pub(crate) gcs: Option<String>,
    /// Also benchmark the embedded backend (`local:` in a temporary directory).
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set)]
    pub(crate) local: bool,
    /// Only these backends (comma-separated: redis,redlock,postgres,etcd,gcs,local).
    #[arg(long, value_delimiter = ',')]
    pub(crate) only: Vec<String>,
    /// Tiny iteration counts: every section and backend once, in well under a minute.
    #[arg(long)]
    pub(crate) smoke: bool,
    /// Where to write results.json, tables.md and the SVG plots.
    #[arg(long, default_value = "target/bench")]
    pub(crate) out: PathBuf,
    /// A Markdown file whose `<!-- bench:begin -->`…`<!-- bench:end -->` block is replaced
    /// by the generated tables.
    #[arg(long)]
    pub(crate) doc: Option<PathBuf>,
    /// How the plots are linked from `--doc` (a path relative to it).
    #[arg(long, default_value = "docs/bench")]
    pub(crate) plots_link: String,
    /// The source revision to print in the report.
    #[arg(long, default_value = "")]
    pub(crate) commit: String,
    /// Measure nothing: re-render tables.md, the plots and `--doc` from a results.json
    /// written by an earlier run.
    #[arg(long)]
    pub(crate) from_results: Option<PathBuf>,
    /// Measure nothing else: sample the CPU of one workload in-process and write
    /// `<out>/<workload>[-tasksN]-<profile-tag>.svg` (a flamegraph) and `.txt` (the top
    /// frames). A workload is `<backend>-<who>`: the backend (redis, redlock, postgres,
    /// etcd, gcs, local) and `ours` (`Locker::try_acquire` + `release`, uncontended),
    /// `peer` (the first peer of the backend's tables: rslock, `pg_advisory_lock`, etcd's
    /// Lock RPC with a lease per lock, the gcslock-style loop), `peer2` (etcd's Lock RPC
    /// with one shared lease) or `floor` (PostgreSQL's two-write floor). GCS
    /// runs on an in-process test server whose threads are left out of the client's CPU.
    /// `redis-cycle`, `gcs-cycle` and `gcs-loop` are the older names of `redis-ours`,
    /// `gcs-ours` and `gcs-peer`.
    #[arg(long)]
    pub(crate) profile: Option<String>,
    /// The suffix of the profile's files (`before`, `after`, …).
    #[arg(long, default_value = "latest")]
    pub(crate) profile_tag: String,
    /// Cycles sampled by `--profile` (after one untimed pass over the 1,000 names), in
    /// all: each of `--profile-tasks` tasks runs its share. etcd's profiles run for
    /// `--profile-seconds` instead.
    #[arg(long, default_value_t = 60_000)]
    pub(crate) profile_cycles: usize,
    /// etcd only: the cycles run this long while every member's own CPU profile is read
    /// from its `/debug/pprof` (members started with `--enable-pprof`:
    /// `ANYLOCK_ETCD_PPROF=1 scripts/servers start`), instead of `--profile-cycles`; the members'
    /// profile is written beside the client's as `…-members.txt` and `.svg`.
    #[arg(long, default_value_t = 10, value_parser = clap::value_parser!(u64).range(1..=600))]
    pub(crate) profile_seconds: u64,
    /// Tasks running the profiled cycles at once, each on its own names (the throughput
    /// section's 64-task column is `--profile-tasks 64`).
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u16).range(1..=1000))]
    pub(crate) profile_tasks: u16,
    /// Internal: measure one backend's scale section in this (child) process.
    #[arg(long, hide = true)]
    pub(crate) scale_child: Option<String>,
    /// Internal: lead an election in this (child) process until killed.
    #[arg(long, hide = true)]
    pub(crate) failover_child: Option<String>,
    /// Only these sections (comma-separated: counts,scale,latency,throughput,handoff,
    /// failover,fanout), for a quick look at one; the report then lacks the others, so
    /// leave it out when writing BENCHMARKS.md.
    #[arg(long, value_delimiter = ',', value_parser = SECTIONS)]
    pub(crate) sections: Vec<String>,
}

/// The sections, in run order.
pub(crate) const SECTIONS: [&str; 7] = [
    "counts",
    "scale",
    "latency",
    "throughput",
    "handoff",
    "failover",
    "fanout",
];

/// The backends to run and where their servers are.
#[derive(Debug, Default)]
pub(crate) struct Targets {
    /// `(kind, url)`; GCS with `None` means the in-process test server.
    pub(crate) list: Vec<(Kind, Option<String>)>,
}

impl Args {
    /// The backends to run, with normalised URLs.
    ///
    /// # Errors
    /// Under `--smoke` when servers are required (`CI=true` or `ANYLOCK_REQUIRE_SERVERS=1`,
    /// see [`test_kit::env::servers_required`]), a server backend without a URL.
    pub(crate) fn targets(&self) -> Res<Targets> {
        let strict = test_kit::env::servers_required();
        let wanted =
            |kind: Kind| self.only.is_empty() || self.only.iter().any(|o| o == kind.name());
        let mut list = Vec::new();
        let mut missing = Vec::new();
        let servers = [
            (Kind::Redis, "ANYLOCK_TEST_REDIS_URL"),
            (Kind::Redlock, "ANYLOCK_TEST_REDLOCK_URLS"),
            (Kind::Postgres, "ANYLOCK_TEST_POSTGRES_URL"),
            (Kind::Etcd, "ANYLOCK_TEST_ETCD_ENDPOINTS"),
        ]
        .map(|(kind, var)| (kind, self.server_url(kind), var));
        for (kind, url, var) in servers.into_iter().filter(|s| wanted(s.0)) {
            match url {
                Some(url) if !url.trim().is_empty() => list.push((kind, Some(url))),
                _ => missing.push(format!("--{} / {var}", kind.name())),
            }
        }
        if wanted(Kind::Gcs) {
            list.push((Kind::Gcs, self.gcs.clone()));
        }
        if wanted(Kind::Local) && self.local {
            list.push((Kind::Local, None));
        }
        require(&missing, strict && self.smoke)?;
        Ok(Targets { list })
    }

    /// The URL the flags (or their variables) give for a server backend, normalised:
    /// Redlock's nodes as a list of `redis://` URLs, etcd's first member alone. `None` for
    /// GCS, `local:` and a backend with no URL.
    pub(crate) fn server_url(&self, kind: Kind) -> Option<String> {
        let given = match kind {
            Kind::Redis => &self.redis,
            Kind::Redlock => &self.redlock,
            Kind::Postgres => &self.postgres,
            Kind::Etcd => &self.etcd,
            Kind::Gcs | Kind::Local => &None,
        };
        let given = given.as_deref().filter(|url| !url.trim().is_empty())?;
        Some(match kind {
            Kind::Redlock => redlock_nodes(given),
            Kind::Etcd => first_etcd(given),
            _ => given.to_owned(),
        })
    }

    /// How much each section measures.
    pub(crate) fn plan(&self) -> Plan {
        let mut plan = if self.smoke {
            Plan::smoke()
        } else {
            Plan::full()
        };
        plan.sections = if self.sections.is_empty() {
            SECTIONS.to_vec()
        } else {
            SECTIONS
                .into_iter()
                .filter(|s| self.sections.iter().any(|w| w == s))
                .collect()
        };
        plan
    }
}

/// Fails when `strict` and some server is `missing`; otherwise says which backends are
/// skipped.
///
/// # Errors
/// Naming every missing flag and variable.
pub(crate) fn require(missing: &[String], strict: bool) -> Res<()> {
    if missing.is_empty() {
        return Ok(());
    }
    let text = format!("no server for {}", missing.join(", "));
    if strict {
        return Err(format!(
            "{text}: a smoke run in CI (or with ANYLOCK_REQUIRE_SERVERS=1) needs every backend (run scripts/servers start, then source .servers/env)"
        )
        .into());
    }
    eprintln!("anylock-bench: skipping backends: {text}");
    Ok(())
}

/// `redlock://[auth@]h1:p1,h2:p2[/db]` to `redis://[auth@]h1:p1[/db],…`; a list of
/// `redis://` URLs is kept as it is.
pub(crate) fn redlock_nodes(url: &str) -> String {
    let Some(rest) = url.trim().strip_prefix("redlock://") else {
        return url.trim().to_owned();
    };
    let end = rest.find(['/', '?']).unwrap_or(rest.len());
    let (hosts, tail) = rest.split_at(end);
    let tail = tail.split('?').next().unwrap_or("");
    let (auth, hosts) = hosts.rsplit_once('@').map_or(("", hosts), |(a, h)| (a, h));
    let auth = if auth.is_empty() {
        String::new()
    } else {
        format!("{auth}@")
    };
    let nodes: Vec<String> = hosts
        .split(',')
        .map(|h| format!("redis://{auth}{h}{tail}"))
        .collect();
    nodes.join(",")
}

/// Every member of `etcd://h1:p1,h2:p2/prefix` or `http://h1:p1,http://h2:p2`, each as
/// `http://h:p`, without any `user:password@` (these URLs go into error messages).
#[cfg_attr(not(target_os = "linux"), allow(dead_code))] // `--profile` is Linux's only
pub(crate) fn etcd_members(url: &str) -> Vec<String> {
    url.split(',')
        .map(|part| {
            let part = part.trim();
            let rest = part.split_once("://").map_or(part, |(_, r)| r);
            let host = rest.split(['/', '?']).next().unwrap_or(rest);
            host.rsplit_once('@').map_or(host, |(_, h)| h).to_owned()
        })
        .filter(|host| !host.is_empty())
        .map(|host| format!("http://{host}"))
        .collect()
}

/// The first member of `etcd://h1:p1,h2:p2/prefix` or `http://h1:p1,http://h2:p2`, as
/// `http://h1:p1`.
pub(crate) fn first_etcd(url: &str) -> String {
    etcd_members(url)
        .into_iter()
        .next()
        .unwrap_or_else(|| "http://".to_owned())
}

/// Iteration counts and durations of each section.
#[derive(Debug, Clone)]
pub(crate) struct Plan {
    /// `full` or `smoke`.
    pub(crate) mode: &'static str,
    /// Latency: interleaved batches, and cycles per batch and entry.
    pub(crate) batches: usize,
    /// Cycles per batch and entry.
    pub(crate) per_batch: usize,
    /// Counting: batches (the quietest one counts) and cycles per batch.
    pub(crate) count_batches: usize,
    /// Cycles per counting batch.
    pub(crate) count_cycles: usize,
    /// Counting: leases in one batched refresh (`refresh_many`), at most the backend's
    /// limit.
    pub(crate) batch_leases: usize,
    /// Throughput: concurrent tasks.
    pub(crate) tasks: Vec<usize>,
    /// Throughput: time per measurement.
    pub(crate) throughput_for: Duration,
    /// Throughput: interleaved rounds.
    pub(crate) throughput_rounds: usize,
    /// Handoff samples per waiter kind.
    pub(crate) handoffs: usize,
    /// Scale: leases held at once.
    pub(crate) leases: usize,
    /// Scale: lease TTL (refreshed every TTL/8).
    pub(crate) scale_ttl: Duration,
    /// Scale: measured refresh intervals.
    pub(crate) scale_intervals: u32,
    /// Redlock fan-out: interleaved batches and acquisitions per batch.
    pub(crate) fanout_batches: usize,
    /// Acquisitions per fan-out batch.
    pub(crate) fanout_per_batch: usize,
    /// Failover: resignations per backend.
    pub(crate) resign_failovers: usize,
    /// Failover: crashes per backend (each waits out a lease's TTL).
    pub(crate) crash_failovers: usize,
    /// The sections to run ([`SECTIONS`], all unless `--sections` says otherwise).
    pub(crate) sections: Vec<&'static str>,
}

impl Plan {
    /// Whether the section `name` runs.
    pub(crate) fn runs(&self, name: &str) -> bool {
        self.sections.contains(&name)
    }
}

impl Plan {
    /// The published run (about five minutes on a 2-core machine).
    pub(crate) fn full() -> Self {
        Self {
            mode: "full",
            batches: 10,
            per_batch: 100,
            count_batches: 5,
            count_cycles: 20,
            batch_leases: 1_000,
            tasks: vec![1, 8, 64],
            throughput_for: Duration::from_millis(1_000),
            throughput_rounds: 2,
            handoffs: 30,
            leases: 10_000,
            scale_ttl: Duration::from_secs(30),
            scale_intervals: 2,
            fanout_batches: 10,
            fanout_per_batch: 100,
            resign_failovers: 20,
            crash_failovers: 3,
            sections: SECTIONS.to_vec(),
        }
    }

    /// Every code path once or twice, for CI.
    pub(crate) fn smoke() -> Self {
        Self {
            mode: "smoke",
            batches: 2,
            per_batch: 10,
            count_batches: 2,
            count_cycles: 5,
            batch_leases: 50,
            tasks: vec![1, 8, 64],
            throughput_for: Duration::from_millis(100),
            throughput_rounds: 1,
            handoffs: 2,
            leases: 200,
            // Refreshed every second: GCS refuses a shorter interval (about one mutation
            // per second per object), and the scale section's wrapper passes the check on.
            scale_ttl: Duration::from_secs(8),
            scale_intervals: 2,
            fanout_batches: 2,
            fanout_per_batch: 10,
            resign_failovers: 2,
            crash_failovers: 1,
            sections: SECTIONS.to_vec(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn redlock_urls_become_node_lists() {
        assert_eq!(
            redlock_nodes("redlock://:pw@a:1,b:2/0?prefix=x"),
            "redis://:pw@a:1/0,redis://:pw@b:2/0"
        );
        assert_eq!(
            redlock_nodes("redis://a:1,redis://b:2"),
            "redis://a:1,redis://b:2"
        );
    }

    #[test]
    fn etcd_urls_list_every_member() {
        assert_eq!(
            etcd_members("etcd://h1:2379,h2:2379/locks?x=1"),
            ["http://h1:2379", "http://h2:2379"]
        );
        assert_eq!(
            etcd_members(" http://127.0.0.1:27379, http://127.0.0.1:27380 "),
            ["http://127.0.0.1:27379", "http://127.0.0.1:27380"]
        );
        assert!(etcd_members("").is_empty());
        // A password in the URL never reaches a member URL (nor the errors that name it).
        assert_eq!(
            etcd_members("http://root:s3cret@h1:1,http://root:s3cret@h2:2"),
            ["http://h1:1", "http://h2:2"]
        );
    }

    #[test]
    fn a_blank_server_url_is_no_url() {
        let args = Args::parse_from(["anylock-bench", "--redis", " ", "--etcd", ""]);
        assert_eq!(args.server_url(Kind::Redis), None);
        assert_eq!(args.server_url(Kind::Etcd), None);
        let args = Args::parse_from(["anylock-bench", "--etcd", "etcd://h1:1,h2:2/p"]);
        assert_eq!(args.server_url(Kind::Etcd).as_deref(), Some("http://h1:1"));
    }

    #[test]
    fn etcd_urls_keep_the_first_member() {
        assert_eq!(first_etcd("etcd://h1:2379,h2:2379/locks"), "http://h1:2379");
        assert_eq!(
            first_etcd("http://127.0.0.1:27379,http://127.0.0.1:27380"),
            "http://127.0.0.1:27379"
        );
    }

    #[test]
    fn a_missing_server_fails_only_when_strict() {
        let missing = ["--postgres / ANYLOCK_TEST_POSTGRES_URL".to_owned()];
        let err = require(&missing, true).expect_err("strict").to_string();
        assert!(err.contains("ANYLOCK_TEST_POSTGRES_URL"), "{err}");
        assert!(require(&missing, false).is_ok());
        assert!(require(&[], true).is_ok());
    }

    #[test]
    fn sections_keep_run_order() {
        let args = Args::parse_from(["anylock-bench", "--sections", "failover,counts"]);
        assert_eq!(args.plan().sections, ["counts", "failover"]);
        assert!(Args::parse_from(["anylock-bench"]).plan().runs("fanout"));
        assert!(Args::try_parse_from(["anylock-bench", "--sections", "nope"]).is_err());
    }

    #[test]
    fn only_limits_the_backends() {
        let args = Args::parse_from(["anylock-bench", "--only", "gcs,local"]);
        let kinds: Vec<Kind> = args
            .targets()
            .expect("targets")
            .list
            .into_iter()
            .map(|t| t.0)
            .collect();
        assert_eq!(kinds, [Kind::Gcs, Kind::Local]);
    }
}
