//! Sample summaries (percentiles, means), and the number formats and Markdown tables the
//! report uses.

use std::time::Duration;

use serde::{Deserialize, Serialize};

/// The summary of one set of latency samples, in microseconds.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub(crate) struct Summary {
    /// How many samples.
    pub(crate) n: usize,
    /// Median.
    pub(crate) p50_us: f64,
    /// 99th percentile.
    pub(crate) p99_us: f64,
    /// Arithmetic mean.
    pub(crate) mean_us: f64,
    /// Largest sample.
    pub(crate) max_us: f64,
}

impl Summary {
    /// Summarises `samples` (any order); all zeros when there are none.
    pub(crate) fn of(samples: &[Duration]) -> Self {
        let mut us: Vec<f64> = samples.iter().map(|d| d.as_secs_f64() * 1e6).collect();
        us.sort_by(f64::total_cmp);
        if us.is_empty() {
            return Self::default();
        }
        Self {
            n: us.len(),
            p50_us: percentile(&us, 0.50),
            p99_us: percentile(&us, 0.99),
            mean_us: us.iter().sum::<f64>() / us.len() as f64,
            max_us: us[us.len() - 1],
        }
    }
}

/// The `q`-quantile (0..=1) of ascending `sorted` values, by the nearest-rank method: the
/// smallest value with at least `q` of the samples at or below it. `NaN` when empty.
pub(crate) fn percentile(sorted: &[f64], q: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let rank = (q.clamp(0.0, 1.0) * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

/// `a / b`, or `None` when either is missing, not finite, or `b` is zero.
pub(crate) fn ratio(a: f64, b: f64) -> Option<f64> {
    (a.is_finite() && b.is_finite() && b > 0.0).then(|| a / b)
}

/// A ratio as the report prints it: `2.4×` (one decimal; two below 1), `—` when missing.
pub(crate) fn fmt_ratio(r: Option<f64>) -> String {
    match r {
        Some(r) if r < 1.0 => format!("{r:.2}×"),
        Some(r) => format!("{r:.1}×"),
        None => "—".to_owned(),
    }
}

/// Microseconds as a short human figure: `87 µs`, `1.42 ms`, `312 ms`, `2.1 s`.
pub(crate) fn fmt_us(us: f64) -> String {
    if !us.is_finite() {
        "—".to_owned()
    } else if us < 1_000.0 {
        format!("{us:.0} µs")
    } else if us < 10_000.0 {
        format!("{:.2} ms", us / 1e3)
    } else if us < 1_000_000.0 {
        format!("{:.0} ms", us / 1e3)
    } else {
        format!("{:.1} s", us / 1e6)
    }
}

/// As [`fmt_us`], but seconds with two decimals (`1.95 s`): failover times, a TTL plus a
/// slack of milliseconds.
pub(crate) fn fmt_long_us(us: f64) -> String {
    if us.is_finite() && us >= 1_000_000.0 {
        format!("{:.2} s", us / 1e6)
    } else {
        fmt_us(us)
    }
}

/// Signed [`fmt_long_us`]: `+12 ms`, `−1.95 s` (a minus sign, not a hyphen), `0 µs`.
pub(crate) fn fmt_signed_us(us: f64) -> String {
    if !us.is_finite() {
        "—".to_owned()
    } else if us.round() == 0.0 {
        fmt_us(0.0)
    } else if us < 0.0 {
        format!("\u{2212}{}", fmt_long_us(-us))
    } else {
        format!("+{}", fmt_long_us(us))
    }
}

/// The `q`-quantile of millisecond samples (any order), in microseconds; `NaN` when
/// there are none.
pub(crate) fn quantile_ms(samples_ms: &[f64], q: f64) -> f64 {
    let mut sorted = samples_ms.to_vec();
    sorted.sort_by(f64::total_cmp);
    percentile(&sorted, q) * 1e3
}

/// `1000`, or `998 (+2 failed)` when some units failed and were left out.
pub(crate) fn with_errors(n: usize, errors: u64) -> String {
    if errors == 0 {
        n.to_string()
    } else {
        format!("{n} (+{errors} failed)")
    }
}

/// A rate as a short figure with thousands separated: `12 345/s`.
pub(crate) fn fmt_rate(per_second: f64) -> String {
    if !per_second.is_finite() {
        return "—".to_owned();
    }
    let whole = per_second.round() as u64;
    let digits = whole.to_string();
    let mut out = String::new();
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push('\u{2009}');
        }
        out.push(c);
    }
    out + "/s"
}

/// A per-cycle count: `2` when whole, `2.5` otherwise, `—` when missing.
pub(crate) fn fmt_count(count: Option<f64>) -> String {
    match count {
        Some(c) if (c - c.round()).abs() < 0.05 => format!("{}", c.round() as i64),
        Some(c) => format!("{c:.1}"),
        None => "—".to_owned(),
    }
}

/// A Markdown table.
pub(crate) fn table(headers: &[&str], rows: &[Vec<String>]) -> String {
    let mut out = format!(
        "| {} |\n|{}\n",
        headers.join(" | "),
        "---|".repeat(headers.len())
    );
    for row in rows {
        out.push_str(&format!("| {} |\n", row.join(" | ")));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(values: &[u64]) -> Vec<Duration> {
        values.iter().map(|v| Duration::from_millis(*v)).collect()
    }

    #[test]
    fn nearest_rank_percentiles() {
        let sorted: Vec<f64> = (1..=100).map(f64::from).collect();
        assert_eq!(percentile(&sorted, 0.5), 50.0);
        assert_eq!(percentile(&sorted, 0.99), 99.0);
        assert_eq!(percentile(&sorted, 1.0), 100.0);
        assert_eq!(percentile(&sorted, 0.0), 1.0);
        assert_eq!(percentile(&[7.0], 0.99), 7.0);
        assert!(percentile(&[], 0.5).is_nan());
    }

    #[test]
    fn summary_sorts_and_averages() {
        let s = Summary::of(&ms(&[3, 1, 2, 10]));
        assert_eq!(s.n, 4);
        assert_eq!(s.p50_us, 2_000.0);
        assert_eq!(s.p99_us, 10_000.0);
        assert_eq!(s.mean_us, 4_000.0);
        assert_eq!(s.max_us, 10_000.0);
        assert_eq!(Summary::of(&[]), Summary::default());
    }

    #[test]
    fn ratios_refuse_missing_or_zero_denominators() {
        assert_eq!(ratio(3.0, 2.0), Some(1.5));
        assert_eq!(ratio(3.0, 0.0), None);
        assert_eq!(ratio(f64::NAN, 2.0), None);
        assert_eq!(fmt_ratio(Some(2.449)), "2.4×");
        assert_eq!(fmt_ratio(Some(0.834)), "0.83×");
        assert_eq!(fmt_ratio(None), "—");
    }

    #[test]
    fn human_figures() {
        assert_eq!(fmt_us(87.4), "87 µs");
        assert_eq!(fmt_us(1_420.0), "1.42 ms");
        assert_eq!(fmt_us(312_000.0), "312 ms");
        assert_eq!(fmt_us(2_100_000.0), "2.1 s");
        assert_eq!(fmt_rate(12_345.4), "12\u{2009}345/s");
        assert_eq!(fmt_rate(999.0), "999/s");
        assert_eq!(fmt_count(Some(2.0)), "2");
        assert_eq!(fmt_count(Some(2.5)), "2.5");
        assert_eq!(fmt_count(None), "—");
        assert_eq!(fmt_signed_us(-180_000.0), "\u{2212}180 ms");
        assert_eq!(fmt_signed_us(12_000.0), "+12 ms");
        assert_eq!(fmt_signed_us(0.2), "0 µs");
        assert_eq!(fmt_signed_us(-1_945_000.0), "\u{2212}1.95 s");
        assert_eq!(fmt_long_us(2_160_000.0), "2.16 s");
        assert_eq!(fmt_long_us(212_000.0), "212 ms");
        assert_eq!(quantile_ms(&[3.0, 1.0, 2.0], 0.5), 2_000.0);
        assert!(quantile_ms(&[], 0.5).is_nan());
    }

    #[test]
    fn failed_units_are_shown_beside_the_count() {
        assert_eq!(with_errors(1000, 0), "1000");
        assert_eq!(with_errors(998, 2), "998 (+2 failed)");
    }

    #[test]
    fn tables_have_a_rule_per_column() {
        let t = table(&["a", "b"], &[vec!["1".into(), "2".into()]]);
        assert_eq!(t, "| a | b |\n|---|---|\n| 1 | 2 |\n");
    }
}
