//! The target table of issue 16, computed from the results: each target, the measured
//! figure with the two figures it divides (ours and the peer or floor of the same run),
//! and whether it was met. Issue 9's earlier targets are in `targets9`.

use crate::counts::REFRESH;
use crate::op::Role;
use crate::results::{HandoffRow, Results, ScaleRow};
use crate::stats::{fmt_rate, fmt_ratio, fmt_us, ratio, table};

/// Label of ours through `Locker` in every section.
pub(crate) const OURS: &str = "anylock (Locker)";

/// A rate with a decimal below 100/s, where whole numbers would hide the ratio.
fn small_rate(per_second: f64) -> String {
    if per_second < 100.0 {
        format!("{per_second:.1}/s")
    } else {
        fmt_rate(per_second)
    }
}

/// `10 000` (a thin space between thousands).
fn thousands(n: usize) -> String {
    fmt_rate(n as f64).trim_end_matches("/s").to_owned()
}

/// The verdict cell.
pub(crate) fn met(ok: Option<bool>) -> String {
    match ok {
        Some(true) => "met".to_owned(),
        Some(false) => "**missed**".to_owned(),
        None => "—".to_owned(),
    }
}

/// The label of the first `backend` row of `rows` whose label starts with `prefix`.
fn label<'a>(
    mut labels: impl Iterator<Item = (&'a str, &'a str)>,
    backend: &str,
    prefix: &str,
) -> Option<&'a str> {
    labels
        .find(|(b, l)| *b == backend && l.starts_with(prefix))
        .map(|(_, l)| l)
}

fn p50(r: &Results, backend: &str, prefix: &str) -> Option<(f64, String)> {
    let labels = r
        .latency
        .iter()
        .map(|l| (l.backend.as_str(), l.label.as_str()));
    let found = label(labels, backend, prefix)?;
    r.latency
        .iter()
        .find(|l| l.backend == backend && l.label == found)
        .map(|l| (l.summary.p50_us, found.to_owned()))
}

/// The rate of `prefix`'s entry at the most tasks measured: `(tasks, rate, label)`.
fn widest(r: &Results, backend: &str, prefix: &str) -> Option<(usize, f64, String)> {
    let labels = r
        .throughput
        .iter()
        .map(|t| (t.backend.as_str(), t.label.as_str()));
    let found = label(labels, backend, prefix)?;
    r.throughput
        .iter()
        .filter(|t| t.backend == backend && t.label == found)
        .max_by_key(|t| t.tasks)
        .map(|t| (t.tasks, t.per_second, found.to_owned()))
}

/// A latency row: ours' cycle p50 over `peer`'s, at most `limit`.
fn latency_row(r: &Results, what: &str, backend: &str, peer: &str, limit: f64) -> Vec<String> {
    let target = format!("{what}: cycle p50 vs {peer} ≤ {limit:.1}×");
    let (Some((ours, _)), Some((theirs, _))) = (p50(r, backend, OURS), p50(r, backend, peer))
    else {
        return vec![target, "not measured".to_owned(), met(None)];
    };
    let x = ratio(ours, theirs);
    vec![
        target,
        format!("{} ({} vs {})", fmt_ratio(x), fmt_us(ours), fmt_us(theirs)),
        met(x.map(|x| x <= limit)),
    ]
}

/// A throughput row: ours' rate at the most tasks over `peer`'s at as many, at least
/// `limit`.
fn throughput_row(r: &Results, what: &str, backend: &str, peer: &str, limit: f64) -> Vec<String> {
    let ours = widest(r, backend, OURS);
    let theirs = widest(r, backend, peer);
    let tasks = ours.as_ref().map_or(64, |o| o.0);
    let target = format!("{what}: throughput at {tasks} tasks vs {peer} ≥ {limit:.1}×");
    match (ours, theirs) {
        (Some((n, o, _)), Some((m, p, _))) if n == m => {
            let x = ratio(o, p);
            vec![
                target,
                format!("{} ({} vs {})", fmt_ratio(x), fmt_rate(o), fmt_rate(p)),
                met(x.map(|x| x >= limit)),
            ]
        }
        _ => vec![target, "not measured".to_owned(), met(None)],
    }
}

/// Every issue-16 target with its measured figure and verdict.
pub(crate) fn targets(r: &Results) -> String {
    let mut rows = vec![
        latency_row(r, "Redis, with fencing", "redis", "rslock", 1.0),
        throughput_row(r, "Redis", "redis", "rslock", 1.2),
        latency_row(r, "Redlock, 5 nodes", "redlock", "rslock", 0.9),
        throughput_row(r, "Redlock, 5 nodes", "redlock", "rslock", 1.2),
        latency_row(
            r,
            "PostgreSQL lease",
            "postgres",
            "raw upsert + update",
            1.1,
        ),
        throughput_row(r, "PostgreSQL", "postgres", "raw upsert + update", 0.9),
        latency_row(r, "etcd", "etcd", "etcd Lock RPC, one shared lease", 1.0),
        throughput_row(r, "etcd", "etcd", "etcd Lock RPC, one shared lease", 1.0),
        latency_row(r, "GCS", "gcs", "gcslock-style loop", 1.1),
    ];
    for backend in ["redis", "redlock", "postgres", "etcd"] {
        rows.push(handoff_row(r, backend));
    }
    rows.push(local_handoff_row(r));
    for backend in ["redis", "redlock", "postgres", "etcd", "local"] {
        rows.push(refresh_row(r, backend));
    }
    for s in r.scale.iter().filter(|s| s.variant.starts_with("anylock")) {
        rows.push(cpu_row(s));
    }
    table(&["target", "measured", "verdict"], &rows)
}

/// Our notified waiter's handoff p50 in raw round trips (timed between the handoffs).
fn handoff_row(r: &Results, backend: &str) -> Vec<String> {
    let target =
        format!("{backend}: notified handoff p50, release → next holder ≤ 4 raw round trips");
    let h = r
        .handoff
        .iter()
        .find(|h| h.backend == backend && h.label == "anylock" && h.mode == "notified");
    let Some(h) = h else {
        return vec![target, "not measured".to_owned(), met(None)];
    };
    let raw = h.raw_p50_us.or_else(|| {
        r.latency
            .iter()
            .find(|l| l.backend == backend && l.role == Role::Raw)
            .map(|l| l.summary.p50_us)
    });
    let x = raw.and_then(|raw| ratio(h.summary.p50_us, raw));
    let mut text = format!(
        "{} round trips ({} vs raw {})",
        fmt_ratio(x).trim_end_matches('×'),
        fmt_us(h.summary.p50_us),
        raw.map_or("—".to_owned(), fmt_us)
    );
    // The same handoff with the server's plain commands, in the same minutes: what the
    // machine costs, apart from what anylock adds.
    let floor = r
        .handoff
        .iter()
        .find(|f| f.backend == backend && f.label == crate::floor::LABEL);
    if let Some(floor) = floor {
        let f = raw.and_then(|raw| ratio(floor.summary.p50_us, raw));
        text.push_str(&format!(
            "; the raw floor {} ({})",
            fmt_ratio(f).trim_end_matches('×'),
            fmt_us(floor.summary.p50_us)
        ));
    }
    vec![target, text, met(x.map(|x| x <= 4.0))]
}

/// The embedded backend's own waiter (it has no round trip): p50 at most 1 ms.
fn local_handoff_row(r: &Results) -> Vec<String> {
    let target = "local: handoff p50, release → next holder ≤ 1 ms".to_owned();
    let ours: Vec<&HandoffRow> = r
        .handoff
        .iter()
        .filter(|h| h.backend == "local" && h.label == "anylock")
        .collect();
    // The notified waiter, or the only one when the backend reports no notification.
    let h = ours
        .iter()
        .find(|h| h.mode == "notified")
        .or_else(|| ours.iter().find(|h| !h.mode.contains("notifications off")));
    match h {
        Some(h) => vec![
            target,
            format!("{} ({})", fmt_us(h.summary.p50_us), h.mode),
            met(Some(h.summary.p50_us <= 1_000.0)),
        ],
        None => vec![target, "not measured".to_owned(), met(None)],
    }
}

/// Round trips per second of the leases' refreshes, against one refresh call per lease
/// per interval priced at the counted round trips of one `refresh` (one call on the
/// embedded backend): at most 1 %.
fn refresh_row(r: &Results, backend: &str) -> Vec<String> {
    let s = r
        .scale
        .iter()
        .find(|s| s.backend == backend && s.variant.starts_with("anylock"));
    let leases = s.map_or(10_000, |s| s.leases);
    let unit = if backend == "local" {
        "refresh calls"
    } else {
        "refresh round trips"
    };
    let target = format!(
        "{backend}: {} held leases: {unit} per second ≤ 1 % of one per lease",
        thousands(leases)
    );
    let per_refresh = if backend == "local" {
        Some(1.0)
    } else {
        r.counts
            .iter()
            .find(|c| c.backend == backend && c.label == REFRESH)
            .and_then(|c| c.round_trips)
    };
    let Some((s, per_refresh)) = s.zip(per_refresh) else {
        return vec![target, "not measured".to_owned(), met(None)];
    };
    let one_per_lease = s.leases as f64 / s.interval_s * per_refresh;
    let Some(ours) = s.round_trips_per_s.filter(|_| s.acquire_s.is_some()) else {
        let why = s
            .error
            .clone()
            .unwrap_or_else(|| "no round-trip count".to_owned());
        return vec![target, why.replace('|', "/"), met(None)];
    };
    let x = ratio(ours, one_per_lease);
    let text = format!(
        "{} ({} vs {})",
        x.map_or("—".to_owned(), |x| format!("{:.2} %", 100.0 * x)),
        small_rate(ours),
        fmt_rate(one_per_lease)
    );
    vec![target, text, met(x.map(|x| x <= 0.01))]
}

/// Client CPU while the leases are held and refreshed: at most 2 % of one core.
fn cpu_row(s: &ScaleRow) -> Vec<String> {
    let target = format!(
        "{}: {} held leases: client CPU ≤ 2 % of a core",
        s.backend,
        thousands(s.leases)
    );
    if s.acquire_s.is_none() {
        let why = s.error.clone().unwrap_or_else(|| "not measured".to_owned());
        return vec![target, why.replace('|', "/"), met(None)];
    }
    vec![
        target,
        format!("{:.1} %", s.cpu_percent),
        met(Some(s.cpu_percent <= 2.0)),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::results::{CountRow, HandoffRow, LatencyRow, ThroughputRow};
    use crate::stats::Summary;

    fn summary(p50_us: f64) -> Summary {
        Summary {
            n: 10,
            p50_us,
            p99_us: 2.0 * p50_us,
            mean_us: p50_us,
            max_us: 3.0 * p50_us,
        }
    }

    fn latency(r: &mut Results, backend: &str, label: &str, role: Role, p50: f64) {
        r.latency.push(LatencyRow {
            backend: backend.into(),
            label: label.into(),
            role,
            summary: summary(p50),
            vs_raw_p50: None,
            vs_raw_p99: None,
            errors: 0,
        });
    }

    fn rate(r: &mut Results, backend: &str, label: &str, tasks: usize, per_second: f64) {
        r.throughput.push(ThroughputRow {
            backend: backend.into(),
            label: label.into(),
            role: Role::Ours,
            tasks,
            per_second,
            errors: 0,
            client_cpu_us: None,
            other_cpu_us: None,
        });
    }

    fn scale(backend: &str, variant: &str, round_trips: f64, cpu: f64) -> ScaleRow {
        ScaleRow {
            backend: backend.into(),
            variant: variant.into(),
            leases: 10_000,
            ttl_s: 30.0,
            interval_s: 3.75,
            acquire_s: Some(3.0),
            rss_per_lease: None,
            refreshes_per_s: 2_667.0,
            refresh_calls_per_s: Some(round_trips),
            batch_limit: Some(1_000),
            round_trips_per_s: Some(round_trips),
            cpu_percent: cpu,
            failures: 0,
            lost: 0,
            error: None,
        }
    }

    fn row<'a>(text: &'a str, starts: &str) -> &'a str {
        text.lines()
            .find(|l| l.starts_with(&format!("| {starts}")))
            .unwrap_or_else(|| panic!("no row {starts} in\n{text}"))
    }

    #[test]
    fn peer_rows_divide_two_figures_of_the_run() {
        let mut r = Results::default();
        latency(&mut r, "redis", OURS, Role::Ours, 150.0);
        latency(&mut r, "redis", "rslock", Role::Peer, 140.0);
        latency(&mut r, "postgres", OURS, Role::Ours, 220.0);
        let floor = "raw upsert + update (2 writes, the least a lease lock needs)";
        latency(&mut r, "postgres", floor, Role::Raw, 210.0);
        for (tasks, ours, floor_rate) in [(1, 10.0, 20.0), (64, 5_000.0, 5_400.0)] {
            rate(&mut r, "postgres", OURS, tasks, ours);
            rate(&mut r, "postgres", floor, tasks, floor_rate);
        }
        let text = targets(&r);
        assert_eq!(
            row(&text, "Redis, with fencing"),
            "| Redis, with fencing: cycle p50 vs rslock ≤ 1.0× | 1.1× (150 µs vs 140 µs) | **missed** |"
        );
        assert_eq!(
            row(&text, "PostgreSQL lease"),
            "| PostgreSQL lease: cycle p50 vs raw upsert + update ≤ 1.1× | 1.0× (220 µs vs 210 µs) | met |"
        );
        assert_eq!(
            row(&text, "PostgreSQL: throughput"),
            "| PostgreSQL: throughput at 64 tasks vs raw upsert + update ≥ 0.9× | 0.93× (5\u{2009}000/s vs 5\u{2009}400/s) | met |"
        );
        assert!(
            row(&text, "etcd: cycle").contains("not measured | — |"),
            "{text}"
        );
    }

    #[test]
    fn handoff_rows_count_raw_round_trips_and_local_milliseconds() {
        let mut r = Results::default();
        for (backend, mode, p50) in [
            ("redis", "notified", 400.0),
            ("redis", "polled (notifications off): backoff", 40_000.0),
            ("etcd", "notified", 2_500.0),
            ("local", "notified", 800.0),
        ] {
            r.handoff.push(HandoffRow {
                backend: backend.into(),
                label: "anylock".into(),
                mode: mode.into(),
                summary: summary(p50),
                samples_ms: Vec::new(),
                raw_p50_us: Some(if backend == "etcd" { 500.0 } else { 100.0 }),
                cycle_p50_us: None,
                errors: 0,
            });
        }
        let text = targets(&r);
        assert!(
            row(&text, "redis: notified")
                .ends_with("| 4.0 round trips (400 µs vs raw 100 µs) | met |"),
            "{text}"
        );
        assert!(
            row(&text, "etcd: notified").ends_with("| **missed** |"),
            "{text}"
        );
        assert!(
            row(&text, "local: handoff").contains("800 µs (notified) | met"),
            "{text}"
        );
        // With a raw floor in the same run, the row says what it costs.
        r.handoff.push(HandoffRow {
            backend: "redis".into(),
            label: crate::floor::LABEL.into(),
            mode: "notified: DEL + PUBLISH, the subscriber's SET NX".into(),
            summary: summary(350.0),
            samples_ms: Vec::new(),
            raw_p50_us: Some(100.0),
            cycle_p50_us: None,
            errors: 0,
        });
        let text = targets(&r);
        assert!(
            row(&text, "redis: notified").ends_with(
                "| 4.0 round trips (400 µs vs raw 100 µs); the raw floor 3.5 (350 µs) | met |"
            ),
            "{text}"
        );
    }

    #[test]
    fn scale_rows_compare_round_trips_with_one_per_lease() {
        let mut r = Results::default();
        r.counts.push(CountRow {
            backend: "postgres".into(),
            label: REFRESH.into(),
            round_trips: Some(2.0),
            statements: Some(1.0),
            server_calls: None,
            server_detail: String::new(),
        });
        r.scale.push(scale(
            "postgres",
            "anylock (Locker): refresh_many",
            40.0,
            1.5,
        ));
        r.scale
            .push(scale("local", "anylock (Locker): refresh_many", 80.0, 2.5));
        r.scale
            .push(scale("postgres", "prototype: one UPDATE", 2.0, 0.1));
        let text = targets(&r);
        // One per lease: 10,000 / 3.75 s × 2 round trips = 5,333/s; 40/s is 0.75 %.
        assert!(
            row(&text, "postgres: 10").contains("round trips per second ≤ 1 % of one per lease | 0.75 % (40.0/s vs 5\u{2009}333/s) | met |"),
            "{text}"
        );
        // Local: calls, one per lease is 2,667/s; 80/s is 3 %.
        assert!(
            row(&text, "local: 10").contains("refresh calls per second ≤ 1 % of one per lease | 3.00 % (80.0/s vs 2\u{2009}667/s) | **missed** |"),
            "{text}"
        );
        let cpu = |backend: &str| {
            text.lines()
                .find(|l| l.starts_with(&format!("| {backend}: ")) && l.contains("client CPU"))
                .unwrap_or_default()
                .to_owned()
        };
        assert!(
            cpu("postgres").ends_with("held leases: client CPU ≤ 2 % of a core | 1.5 % | met |"),
            "{text}"
        );
        assert!(cpu("local").ends_with("| 2.5 % | **missed** |"), "{text}");
        // The prototypes are references, not targets.
        assert_eq!(text.matches("client CPU").count(), 2, "{text}");
    }
}
