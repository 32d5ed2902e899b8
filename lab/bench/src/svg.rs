//! Hand-written SVG plots: a strip plot of latency distributions on a log axis (handoff)
//! and small multiples of line charts (throughput against concurrency).

use std::fmt::Write;

const PALETTE: [&str; 6] = [
    "#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b",
];
const FONT: &str = "font-family=\"sans-serif\" font-size=\"12\"";

/// `text` with XML's special characters escaped.
pub(crate) fn escape(text: &str) -> String {
    text.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

/// One row per label: every sample as a dot on a log-scaled axis of milliseconds, and the
/// median as a bar.
pub(crate) fn strip_plot(title: &str, rows: &[(String, Vec<f64>)]) -> String {
    let (left, width, row_h, top) = (430.0, 520.0, 24.0, 48.0);
    let (d0, d1) = decades(rows.iter().flat_map(|(_, v)| v.iter().copied()));
    let x = |v: f64| left + width * (v.max(1e-9).log10() - d0) / (d1 - d0);
    let height = top + row_h * rows.len() as f64 + 40.0;
    let mut svg = header(left + width + 20.0, height, title);
    for decade in d0 as i32..=d1 as i32 {
        let v = 10f64.powi(decade);
        let px = x(v);
        let _ = write!(
            svg,
            "<line x1=\"{px:.1}\" y1=\"{top}\" x2=\"{px:.1}\" y2=\"{:.1}\" stroke=\"#ddd\"/>\
             <text x=\"{px:.1}\" y=\"{:.1}\" {FONT} text-anchor=\"middle\">{}</text>",
            height - 36.0,
            height - 22.0,
            ms_label(v)
        );
    }
    let _ = write!(
        svg,
        "<text x=\"{:.1}\" y=\"{:.1}\" {FONT} text-anchor=\"middle\">milliseconds from release to next holder (log scale)</text>",
        left + width / 2.0,
        height - 6.0
    );
    for (i, (label, values)) in rows.iter().enumerate() {
        let y = top + row_h * (i as f64 + 0.5);
        let dots: Vec<f64> = values.iter().map(|v| x(*v)).collect();
        strip_row(
            &mut svg,
            (left, y),
            PALETTE[i % PALETTE.len()],
            label,
            &dots,
        );
    }
    svg + "</svg>\n"
}

/// One row of a strip plot at height `y`: the label right-aligned before `left`, a dot at
/// each x position in `dots`, and a bar at their median.
fn strip_row(svg: &mut String, (left, y): (f64, f64), color: &str, label: &str, dots: &[f64]) {
    let _ = write!(
        svg,
        "<text x=\"{:.1}\" y=\"{:.1}\" {FONT} text-anchor=\"end\">{}</text>",
        left - 8.0,
        y + 4.0,
        escape(label)
    );
    for px in dots {
        let _ = write!(
            svg,
            "<circle cx=\"{px:.1}\" cy=\"{y:.1}\" r=\"2.5\" fill=\"{color}\" fill-opacity=\"0.45\"/>"
        );
    }
    let mut sorted = dots.to_vec();
    sorted.sort_by(f64::total_cmp);
    if !sorted.is_empty() {
        let px = crate::stats::percentile(&sorted, 0.5);
        let _ = write!(
            svg,
            "<line x1=\"{px:.1}\" y1=\"{:.1}\" x2=\"{px:.1}\" y2=\"{:.1}\" stroke=\"#000\" stroke-width=\"2\"/>",
            y - 8.0,
            y + 8.0
        );
    }
}

fn ms_label(v: f64) -> String {
    if v >= 1.0 {
        format!("{v:.0}")
    } else {
        format!("{v}")
    }
}

fn header(width: f64, height: f64, title: &str) -> String {
    format!(
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{width:.0}\" height=\"{height:.0}\" \
         viewBox=\"0 0 {width:.0} {height:.0}\"><rect width=\"100%\" height=\"100%\" fill=\"#fff\"/>\
         <text x=\"10\" y=\"22\" font-family=\"sans-serif\" font-size=\"15\" font-weight=\"bold\">{}</text>",
        escape(title)
    )
}

/// One line of a panel: `(x, y)` points.
pub(crate) struct Series {
    /// Legend text.
    pub(crate) label: String,
    /// Points, in x order.
    pub(crate) points: Vec<(f64, f64)>,
}

/// One small chart.
pub(crate) struct Panel {
    /// Its heading.
    pub(crate) title: String,
    /// Its lines.
    pub(crate) series: Vec<Series>,
}

/// Panels in a grid of three columns: x (concurrent tasks) and y (units per second) on log
/// scales with decade grid lines, a legend under each panel.
pub(crate) fn panels(title: &str, panels: &[Panel]) -> String {
    let (pw, ph, legend, cols) = (320.0, 210.0, 80.0, 3usize);
    let rows = panels.len().div_ceil(cols).max(1);
    let mut svg = header(pw * cols as f64, 40.0 + (ph + legend) * rows as f64, title);
    for (i, panel) in panels.iter().enumerate() {
        let ox = pw * (i % cols) as f64;
        let oy = 40.0 + (ph + legend) * (i / cols) as f64;
        draw_panel(&mut svg, panel, ox, oy, (pw, ph));
    }
    svg + "</svg>\n"
}

/// The log-scale decades `[d0, d1]` covering the positive values of `values`.
fn decades(values: impl Iterator<Item = f64>) -> (f64, f64) {
    let (lo, hi) = values
        .filter(|v| *v > 0.0)
        .fold((f64::MAX, f64::MIN), |(a, b), v| (a.min(v), b.max(v)));
    if lo > hi {
        return (0.0, 1.0);
    }
    let d0 = lo.log10().floor();
    (d0, hi.log10().ceil().max(d0 + 1.0))
}

fn draw_panel(svg: &mut String, panel: &Panel, ox: f64, oy: f64, (pw, ph): (f64, f64)) {
    let (l, r, t, b) = (ox + 56.0, ox + pw - 14.0, oy + 24.0, oy + ph - 24.0);
    let points = || panel.series.iter().flat_map(|s| s.points.iter().copied());
    let (x0, x1) = decades(points().map(|p| p.0));
    let (y0, y1) = decades(points().map(|p| p.1));
    let px = |x: f64| l + (r - l) * (x.max(1e-9).log10() - x0) / (x1 - x0);
    let py = |y: f64| b - (b - t) * (y.max(1e-9).log10() - y0) / (y1 - y0);
    let _ = write!(
        svg,
        "<text x=\"{:.1}\" y=\"{:.1}\" {FONT} font-weight=\"bold\">{}</text>\
         <line x1=\"{l:.1}\" y1=\"{b:.1}\" x2=\"{r:.1}\" y2=\"{b:.1}\" stroke=\"#888\"/>\
         <line x1=\"{l:.1}\" y1=\"{t:.1}\" x2=\"{l:.1}\" y2=\"{b:.1}\" stroke=\"#888\"/>",
        ox + 10.0,
        oy + 14.0,
        escape(&panel.title)
    );
    for decade in y0 as i32..=y1 as i32 {
        let y = 10f64.powi(decade);
        let _ = write!(
            svg,
            "<line x1=\"{l:.1}\" y1=\"{0:.1}\" x2=\"{r:.1}\" y2=\"{0:.1}\" stroke=\"#eee\"/>\
             <text x=\"{1:.1}\" y=\"{2:.1}\" {FONT} text-anchor=\"end\">{3}</text>",
            py(y),
            l - 4.0,
            py(y) + 4.0,
            short(y)
        );
    }
    if let Some(first) = panel.series.first() {
        for (x, _) in &first.points {
            let _ = write!(
                svg,
                "<text x=\"{:.1}\" y=\"{:.1}\" {FONT} text-anchor=\"middle\">{x}</text>",
                px(*x),
                b + 14.0
            );
        }
    }
    for (i, series) in panel.series.iter().enumerate() {
        let path: Vec<String> = series
            .points
            .iter()
            .map(|(x, y)| format!("{:.1},{:.1}", px(*x), py(*y)))
            .collect();
        legend_line(
            svg,
            i,
            &path.join(" "),
            (ox + 10.0, b + 32.0),
            &series.label,
        );
    }
}

/// Series `i`: its polyline and its legend entry under the panel at `at`.
fn legend_line(svg: &mut String, i: usize, points: &str, at: (f64, f64), label: &str) {
    let color = PALETTE[i % PALETTE.len()];
    let _ = write!(
        svg,
        "<polyline points=\"{points}\" fill=\"none\" stroke=\"{color}\" stroke-width=\"2\"/>\
         <text x=\"{:.1}\" y=\"{:.1}\" {FONT} fill=\"{color}\">{}</text>",
        at.0,
        at.1 + 14.0 * i as f64,
        escape(label)
    );
}

/// `12k`, `1.5M`, `800`.
fn short(v: f64) -> String {
    if v >= 1e6 {
        format!("{:.1}M", v / 1e6)
    } else if v >= 1e4 {
        format!("{:.0}k", v / 1e3)
    } else if v >= 1e3 {
        format!("{:.1}k", v / 1e3)
    } else {
        format!("{v:.0}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn strip_plots_escape_labels_and_mark_medians() {
        let svg = strip_plot(
            "handoff",
            &[
                ("a <b> & c".to_owned(), vec![0.5, 1.0, 40.0]),
                ("empty".to_owned(), vec![]),
            ],
        );
        assert!(svg.starts_with("<svg") && svg.ends_with("</svg>\n"));
        assert!(svg.contains("a &lt;b&gt; &amp; c"));
        assert_eq!(svg.matches("<circle").count(), 3);
        assert_eq!(
            svg.matches("stroke-width=\"2\"").count(),
            1,
            "one median bar"
        );
        assert!(
            svg.contains(">0.1<") && svg.contains(">100<"),
            "decade ticks"
        );
    }

    #[test]
    fn panels_draw_one_polyline_per_series() {
        let series = |label: &str, k: f64| Series {
            label: label.to_owned(),
            points: vec![(1.0, k), (8.0, 4.0 * k), (64.0, 6.0 * k)],
        };
        let grid = panels(
            "throughput",
            &[
                Panel {
                    title: "redis".to_owned(),
                    series: vec![series("ours", 1e3), series("raw", 2e3)],
                },
                Panel {
                    title: "etcd".to_owned(),
                    series: vec![series("ours", 10.0)],
                },
            ],
        );
        assert_eq!(grid.matches("<polyline").count(), 3);
        assert!(grid.contains(">64<") && grid.contains(">10k<") && grid.contains(">1.0k<"));
        assert_eq!(short(1_500_000.0), "1.5M");
        assert_eq!(short(2_500.0), "2.5k");
    }
}
