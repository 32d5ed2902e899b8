//! Running one case and recording its result as a line of JSON.
//!
//! Each run appends to `<results dir>/<label>.jsonl`, one object per case:
//! `{"run", "backend", "case", "outcome", "duration_ms", "metrics", "notes", "message"}`.
//! The results dir is `$ANYLOCK_RESULTS_DIR`, else `target/conformance` in this workspace.
//! `run` identifies one test process, so a report generator can take each backend's
//! latest run.

use std::collections::BTreeMap;
use std::fs::OpenOptions;
use std::io::Write;
use std::panic::AssertUnwindSafe;
use std::path::PathBuf;
use std::sync::OnceLock;
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use futures_util::FutureExt;
use serde::Serialize;

use crate::harness::Harness;

/// What a passing case measured and noticed.
#[derive(Debug, Default, Clone, Serialize)]
pub struct Report {
    /// Named measurements (milliseconds unless the name says otherwise).
    pub metrics: BTreeMap<String, f64>,
    /// Remarks for people, such as "not claimed by this backend".
    pub notes: Vec<String>,
    /// `true` when the case checks a claim the backend does not make.
    pub not_claimed: bool,
}

impl Report {
    /// An empty report.
    pub fn new() -> Self {
        Self::default()
    }

    /// A report for a claim the backend does not make.
    pub fn not_claimed(note: impl Into<String>) -> Self {
        Self {
            notes: vec![note.into()],
            not_claimed: true,
            ..Self::default()
        }
    }

    /// Adds a measurement.
    pub fn metric(mut self, name: &str, value: f64) -> Self {
        self.metrics.insert(name.to_owned(), value);
        self
    }

    /// Adds a note.
    pub fn note(mut self, note: impl Into<String>) -> Self {
        self.notes.push(note.into());
        self
    }
}

#[derive(Serialize)]
struct Line<'a> {
    run: &'a str,
    backend: &'a str,
    case: &'a str,
    outcome: &'a str,
    duration_ms: f64,
    metrics: &'a BTreeMap<String, f64>,
    notes: &'a [String],
    message: Option<&'a str>,
}

/// Runs `case` against `harness` within the harness's case limit, records the result,
/// and panics (failing the test) when the case failed.
pub async fn run_case<F>(harness: &dyn Harness, name: &str, case: F)
where
    F: AsyncFnOnce(&dyn Harness) -> Report,
{
    let started = Instant::now();
    let limit = harness.timing().case_limit;
    let guarded = AssertUnwindSafe(case(harness)).catch_unwind();
    let outcome = tokio::time::timeout(limit, guarded).await;
    let duration = started.elapsed();
    let (status, report, message) = match outcome {
        Ok(Ok(report)) if report.not_claimed => ("not_claimed", report, None),
        Ok(Ok(report)) => ("passed", report, None),
        Ok(Err(panic)) => ("failed", Report::new(), Some(panic_message(&panic))),
        Err(_) => (
            "failed",
            Report::new(),
            Some(format!("case exceeded its {limit:?} limit")),
        ),
    };
    record(
        harness.label(),
        name,
        status,
        duration,
        &report,
        message.as_deref(),
    );
    if let Some(message) = message {
        panic!(
            "conformance case {name} failed on {}: {message}",
            harness.label()
        );
    }
}

fn panic_message(panic: &Box<dyn std::any::Any + Send>) -> String {
    panic
        .downcast_ref::<String>()
        .cloned()
        .or_else(|| panic.downcast_ref::<&str>().map(|s| (*s).to_owned()))
        .unwrap_or_else(|| "the case panicked".to_owned())
}

fn run_id() -> &'static str {
    static RUN: OnceLock<String> = OnceLock::new();
    RUN.get_or_init(|| {
        let secs = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        format!("{secs}-{}", std::process::id())
    })
}

/// Where result files go.
pub fn results_dir() -> PathBuf {
    match std::env::var_os("ANYLOCK_RESULTS_DIR") {
        Some(dir) => PathBuf::from(dir),
        None => PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../target/conformance"),
    }
}

fn record(
    label: &str,
    case: &str,
    outcome: &str,
    duration: std::time::Duration,
    report: &Report,
    message: Option<&str>,
) {
    let line = Line {
        run: run_id(),
        backend: label,
        case,
        outcome,
        duration_ms: duration.as_secs_f64() * 1e3,
        metrics: &report.metrics,
        notes: &report.notes,
        message,
    };
    let Ok(mut text) = serde_json::to_string(&line) else {
        return;
    };
    text.push('\n');
    let dir = results_dir();
    let written = std::fs::create_dir_all(&dir).and_then(|()| {
        let path = dir.join(format!("{label}.jsonl"));
        let mut file = OpenOptions::new().create(true).append(true).open(path)?;
        file.write_all(text.as_bytes())
    });
    if let Err(err) = written {
        eprintln!("conformance: could not record the result of {case}: {err}");
    }
}
