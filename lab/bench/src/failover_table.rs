//! The failover section's tables (issue 18), from [`Results`].

use crate::results::Results;
use crate::stats::{fmt_long_us, fmt_signed_us, quantile_ms, table, with_errors};

/// The two failover tables: after a resignation (with the observers' lag), after a crash.
pub(crate) fn failover(r: &Results) -> String {
    if r.resign_failover.is_empty() && r.crash_failover.is_empty() {
        return "Not measured in this run.\n".to_owned();
    }
    let q = |ms: &[f64], q: f64| fmt_long_us(quantile_ms(ms, q));
    let resign: Vec<Vec<String>> = r
        .resign_failover
        .iter()
        .map(|f| {
            let (lag, n) = (&f.observer_lag_ms, f.samples_ms.len());
            let missed = match f.observer_missed {
                0 => String::new(),
                m => format!(" ({m} not seen in 30 s)"),
            };
            vec![
                f.backend.clone(),
                f.wakes.clone(),
                q(&f.samples_ms, 0.5),
                q(&f.samples_ms, 0.95),
                q(&f.samples_ms, 1.0),
                format!(
                    "{} / {} / {}{missed}",
                    fmt_signed_us(quantile_ms(lag, 0.5)),
                    fmt_signed_us(quantile_ms(lag, 0.95)),
                    fmt_signed_us(quantile_ms(lag, 1.0)),
                ),
                with_errors(n, f.errors),
            ]
        })
        .collect();
    let interval = r
        .resign_failover
        .first()
        .map_or(500.0, |f| f.observe_interval_ms);
    let head = crate::crash::HEAD_START.as_millis();
    let resign = table(
        &[
            "backend",
            "how the candidate learns",
            "resign → new leader p50",
            "p95",
            "max",
            "observer lag p50 / p95 / max",
            "samples",
        ],
        &resign,
    );
    let crash: Vec<Vec<String>> = r
        .crash_failover
        .iter()
        .map(|f| {
            let beyond = &f.beyond_ttl_ms;
            vec![
                f.backend.clone(),
                fmt_long_us(f.ttl_ms * 1e3),
                q(&f.samples_ms, 0.5),
                q(&f.samples_ms, 1.0),
                fmt_signed_us(quantile_ms(beyond, 0.5)),
                fmt_signed_us(quantile_ms(beyond, 1.0)),
                with_errors(f.samples_ms.len(), f.errors),
            ]
        })
        .collect();
    let crash = table(
        &[
            "backend",
            "lease TTL",
            "kill → new leader p50",
            "max",
            "beyond the TTL p50",
            "max",
            "crashes",
        ],
        &crash,
    );
    format!(
        "**Resign.** The leader resigns 50–150 ms after a candidate starts campaigning; \
         from `resign()` called to the candidate's `campaign()` returning. Observer lag: \
         from that return to `Observer::next()` on another locker reporting the new leader \
         (observe interval {interval:.0} ms; negative when it read the new leader first).\n\n\
         {resign}\n**Crash.** The leader, a child process, takes the lease and never \
         refreshes it; a candidate campaigns, and {head} ms later the child gets SIGKILL. From \
         the kill to the candidate's `campaign()` returning; beyond the TTL: from the \
         child's grant (its last lease write) to that return, less the TTL (negative: the \
         holder was proven dead before its lease ran out).\n\n{crash}"
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn failover_tables_render_signed_slack() {
        assert_eq!(failover(&Results::default()), "Not measured in this run.\n");
        let mut r = Results::default();
        r.crash_failover.push(crate::results::CrashRow {
            backend: "local".into(),
            ttl_ms: 2_000.0,
            samples_ms: vec![25.0, 31.0, 20.0],
            beyond_ttl_ms: vec![-1_920.0, -1_915.0, -1_925.0],
            errors: 0,
        });
        let text = failover(&r);
        assert!(
            text.contains(
                "| local | 2.00 s | 25 ms | 31 ms | \u{2212}1.92 s | \u{2212}1.92 s | 3 |"
            ),
            "{text}"
        );
    }
}
