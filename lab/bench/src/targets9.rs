//! The earlier target table of issue 9, computed from the results: each target with the
//! measured ratio and whether it was met (issue 16's table is `targets`).

use crate::op::Role;
use crate::results::Results;
use crate::stats::{fmt_rate, fmt_ratio, fmt_us, ratio, table};
use crate::targets::{OURS, met};

fn p50(r: &Results, backend: &str, label: &str) -> Option<f64> {
    r.latency
        .iter()
        .find(|l| l.backend == backend && l.label == label)
        .map(|l| l.summary.p50_us)
}

fn raw_p50(r: &Results, backend: &str) -> Option<f64> {
    r.latency
        .iter()
        .find(|l| l.backend == backend && l.role == Role::Raw)
        .map(|l| l.summary.p50_us)
}

/// Every target with its measured figure and verdict.
pub(crate) fn targets(r: &Results) -> String {
    let mut rows = Vec::new();
    for backend in ["redis", "postgres", "etcd"] {
        let x = p50(r, backend, OURS)
            .zip(raw_p50(r, backend))
            .and_then(|(a, b)| ratio(a, b));
        if x.is_some() {
            rows.push(vec![
                format!("{backend}: acquire + release p50 ≤ 2.5× raw round trip"),
                fmt_ratio(x),
                met(x.map(|x| x <= 2.5)),
            ]);
        }
    }
    for label in ["anylock (Locker)", "rslock"] {
        let x = fanout_ratio(r, label);
        if x.is_some() {
            rows.push(vec![
                format!("Redlock, {label}: acquire p50 on all nodes ≤ 1.5× one node"),
                fmt_ratio(x),
                met(x.map(|x| x <= 1.5)),
            ]);
        }
    }
    rows.extend(handoff_rows(r));
    rows.extend(peer_rows(r));
    table(&["target", "measured", "verdict"], &rows)
}

/// Notified handoffs against the raw round trip (and, for context, our own cycle and our
/// own waiter with notifications off; the peers' waiters are in the handoff table).
fn handoff_rows(r: &Results) -> Vec<Vec<String>> {
    let notified = r
        .handoff
        .iter()
        .filter(|h| h.label == "anylock" && h.mode == "notified");
    notified
        .filter_map(|h| {
            // The embedded backend has no round trip: issue 16's table gives it a target.
            let raw = h.raw_p50_us.or_else(|| raw_p50(r, &h.backend))?;
            let rts = ratio(h.summary.p50_us, raw);
            let cycles = h.cycle_p50_us.and_then(|c| ratio(h.summary.p50_us, c));
            let polled = r
                .handoff
                .iter()
                .filter(|p| {
                    p.backend == h.backend && p.label == "anylock" && p.mode.starts_with("polled")
                })
                .map(|p| p.summary.p50_us)
                .fold(f64::NAN, f64::min);
            let text = format!(
                "{} = {} raw round trip, {} our uncontended cycle; polled p50 {}",
                fmt_us(h.summary.p50_us),
                fmt_ratio(rts),
                fmt_ratio(cycles),
                fmt_us(polled)
            );
            let target = format!(
                "{}: notified handoff p50 within a few (≤ 5) round trips",
                h.backend
            );
            Some(vec![target, text, met(rts.map(|x| x <= 5.0))])
        })
        .collect()
}

fn peer_rows(r: &Results) -> Vec<Vec<String>> {
    let mut rows = Vec::new();
    for peer in r.latency.iter().filter(|l| l.role == Role::Peer) {
        let Some(ours) = p50(r, &peer.backend, OURS) else {
            continue;
        };
        let x = ratio(ours, peer.summary.p50_us);
        rows.push(vec![
            format!("{}: latency p50 ≤ {}", peer.backend, peer.label),
            format!(
                "{} ({} vs {})",
                fmt_ratio(x),
                fmt_us(ours),
                fmt_us(peer.summary.p50_us)
            ),
            met(x.map(|x| x <= 1.0)),
        ]);
        let tput = |label: &str| {
            r.throughput
                .iter()
                .filter(|t| t.backend == peer.backend && t.label == label)
                .max_by_key(|t| t.tasks)
                .map(|t| (t.tasks, t.per_second))
        };
        if let (Some((tasks, o)), Some((_, p))) = (tput(OURS), tput(&peer.label)) {
            let x = ratio(o, p);
            rows.push(vec![
                format!(
                    "{}: throughput at {tasks} tasks ≥ {}",
                    peer.backend, peer.label
                ),
                format!("{} ({} vs {})", fmt_ratio(x), fmt_rate(o), fmt_rate(p)),
                met(x.map(|x| x >= 1.0)),
            ]);
        }
    }
    rows
}

fn fanout_ratio(r: &Results, label: &str) -> Option<f64> {
    let rows: Vec<_> = r.fanout.iter().filter(|f| f.label == label).collect();
    let one = rows.iter().find(|f| f.nodes == 1)?;
    let many = rows
        .iter()
        .filter(|f| f.nodes > 1)
        .max_by_key(|f| f.nodes)?;
    ratio(many.acquire.p50_us, one.acquire.p50_us)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::results::{FanoutRow, HandoffRow, LatencyRow};
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

    #[test]
    fn targets_compare_ratios() {
        let mut r = Results::default();
        for (label, role, p) in [
            (OURS, Role::Ours, 300.0),
            ("raw PING", Role::Raw, 100.0),
            ("rslock", Role::Peer, 250.0),
        ] {
            r.latency.push(LatencyRow {
                backend: "redis".into(),
                label: label.into(),
                role,
                summary: summary(p),
                vs_raw_p50: None,
                vs_raw_p99: None,
                errors: 0,
            });
        }
        for (nodes, p) in [(1, 100.0), (5, 120.0)] {
            r.fanout.push(FanoutRow {
                label: OURS.into(),
                nodes,
                acquire: summary(p),
                cycle: summary(p),
                errors: 0,
            });
        }
        let text = targets(&r);
        assert!(
            text.contains(
                "| redis: acquire + release p50 ≤ 2.5× raw round trip | 3.0× | **missed** |"
            ),
            "{text}"
        );
        assert!(text.contains("| 1.2× | met |"), "{text}");
        assert!(
            text.contains("redis: latency p50 ≤ rslock | 1.2× (300 µs vs 250 µs) | **missed**"),
            "{text}"
        );
        assert!(crate::report::render(&r, "docs/bench").contains("### 5. Redlock"));
    }

    #[test]
    fn the_polled_handoff_figure_is_our_own_waiter() {
        let mut r = Results::default();
        for (label, mode, p) in [
            ("anylock", "notified", 500.0),
            ("anylock", "polled (notifications off)", 51_000.0),
            ("rslock", "polled: retries 0–200 ms apart", 42_000.0),
        ] {
            r.handoff.push(HandoffRow {
                backend: "redis".into(),
                label: label.into(),
                mode: mode.into(),
                summary: summary(p),
                samples_ms: Vec::new(),
                raw_p50_us: Some(100.0),
                cycle_p50_us: Some(250.0),
                errors: 0,
            });
        }
        let text = targets(&r);
        assert!(text.contains("polled p50 51 ms"), "{text}");
    }
}
