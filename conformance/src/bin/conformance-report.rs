//! Prints a Markdown table of the latest result of every conformance case per backend, from
//! `target/conformance/*.jsonl` (or `$ANYLOCK_RESULTS_DIR`).
//!
//! `cargo run -q -p anylock-conformance --bin conformance-report`

use std::collections::BTreeMap;
use std::process::ExitCode;

use serde::Deserialize;

#[derive(Debug, Deserialize)]
struct Line {
    backend: String,
    case: String,
    outcome: String,
    #[serde(default)]
    metrics: BTreeMap<String, f64>,
}

/// The metrics shown, as (case, metric, column title).
const COLUMNS: &[(&str, &str, &str)] = &[
    ("handoff_latency", "handoff_p50_ms", "handoff p50 (ms)"),
    ("handoff_latency", "handoff_p95_ms", "handoff p95 (ms)"),
    (
        "mutual_exclusion_under_contention",
        "grants_per_second",
        "contended grants/s",
    ),
    (
        "deleted_lock_turns_the_guard_lost",
        "detect_ms",
        "delete noticed (ms)",
    ),
    (
        "unreachable_backend_degrades_then_loses",
        "lost_after_cut_ms",
        "Lost after cut (ms)",
    ),
];

/// The latest result of every case: a backend's cases may run in several test processes
/// (a private server for durability, say), so "latest" is per case, not per process.
/// Results are appended as cases finish, so the last line of a case is its latest (run
/// ids, `secs-pid`, do not sort by time as strings).
fn latest_per_case(lines: Vec<Line>) -> Vec<Line> {
    let mut latest: BTreeMap<String, Line> = BTreeMap::new();
    for line in lines {
        latest.insert(line.case.clone(), line);
    }
    latest.into_values().collect()
}

fn row(backend: &str, lines: &[Line]) -> String {
    let count = |outcome: &str| lines.iter().filter(|l| l.outcome == outcome).count();
    let mut cells = vec![
        format!("`{backend}`"),
        count("passed").to_string(),
        count("failed").to_string(),
        count("not_claimed").to_string(),
    ];
    for (case, metric, _) in COLUMNS {
        let value = lines
            .iter()
            .find(|l| l.case == *case)
            .and_then(|l| l.metrics.get(*metric));
        cells.push(value.map_or_else(
            || "–".to_owned(),
            |v| {
                if *v < 10.0 {
                    format!("{v:.1}")
                } else {
                    format!("{v:.0}")
                }
            },
        ));
    }
    format!("| {} |", cells.join(" | "))
}

fn main() -> ExitCode {
    let dir = conformance::report::results_dir();
    let Ok(entries) = std::fs::read_dir(&dir) else {
        eprintln!("no conformance results in {}", dir.display());
        return ExitCode::FAILURE;
    };
    let mut rows = Vec::new();
    let mut paths: Vec<_> = entries.filter_map(Result::ok).map(|e| e.path()).collect();
    paths.sort();
    for path in paths
        .iter()
        .filter(|p| p.extension().is_some_and(|e| e == "jsonl"))
    {
        let text = std::fs::read_to_string(path).unwrap_or_default();
        let lines: Vec<Line> = text
            .lines()
            .filter_map(|l| serde_json::from_str(l).ok())
            .collect();
        let Some(backend) = lines.first().map(|l| l.backend.clone()) else {
            continue;
        };
        if backend.ends_with("-defect") {
            continue;
        }
        rows.push(row(&backend, &latest_per_case(lines)));
    }
    let titles: Vec<&str> = COLUMNS.iter().map(|(_, _, title)| *title).collect();
    println!(
        "| backend | passed | failed | not claimed | {} |",
        titles.join(" | ")
    );
    println!("|---|---|---|---|{}", "---|".repeat(COLUMNS.len()));
    for row in rows {
        println!("{row}");
    }
    ExitCode::SUCCESS
}
