//! Line charts as SVG (written here, no dependencies) and PNG (the SVG rasterised by
//! `rsvg-convert` from Debian's librsvg2-bin, which renders text with the system's fonts).

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

/// How an axis maps values.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scale {
    Linear,
    Log2,
    Log10,
}

#[derive(Debug, Clone)]
pub struct Series {
    pub label: String,
    pub points: Vec<(f64, f64)>,
}

#[derive(Debug, Clone)]
pub struct Chart {
    pub title: String,
    pub x_label: String,
    pub y_label: String,
    /// Machine, transport and date: always shown under the plot.
    pub caption: String,
    pub x_scale: Scale,
    /// Tick positions and labels on the x axis (e.g. queue depths, block sizes).
    pub x_ticks: Vec<(f64, String)>,
    pub series: Vec<Series>,
    /// Top of the y axis; `None` fits the data.
    pub y_max: Option<f64>,
}

const W: f64 = 960.0;
const H: f64 = 620.0;
const LEFT: f64 = 90.0;
const RIGHT: f64 = 190.0;
const TOP: f64 = 60.0;
const BOTTOM: f64 = 130.0;
const COLORS: [&str; 8] = [
    "#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#17becf",
];

fn tx(s: Scale, v: f64) -> f64 {
    match s {
        Scale::Linear => v,
        Scale::Log2 => v.max(1e-12).log2(),
        Scale::Log10 => v.max(1e-12).log10(),
    }
}

/// Round tick steps (1, 2, 5 x 10^n) covering `0..=max`.
fn nice_ticks(max: f64) -> Vec<f64> {
    if max <= 0.0 || !max.is_finite() {
        return vec![0.0, 1.0];
    }
    let raw = max / 5.0;
    let mag = 10f64.powf(raw.log10().floor());
    let step = [1.0, 2.0, 5.0, 10.0]
        .iter()
        .map(|m| m * mag)
        .find(|s| *s >= raw)
        .unwrap_or(10.0 * mag);
    let n = (max / step).ceil() as usize;
    (0..=n).map(|i| i as f64 * step).collect()
}

fn label_num(v: f64) -> String {
    if v >= 1e6 {
        format!("{}M", trim(v / 1e6))
    } else if v >= 1e3 {
        format!("{}k", trim(v / 1e3))
    } else {
        trim(v)
    }
}

fn trim(v: f64) -> String {
    let s = format!("{v:.2}");
    s.trim_end_matches('0').trim_end_matches('.').to_string()
}

fn esc(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}

/// Renders the chart as an SVG document.
pub fn svg(c: &Chart) -> String {
    let pts = c.series.iter().flat_map(|s| s.points.iter());
    let (mut xmin, mut xmax, mut ymax) = (f64::INFINITY, f64::NEG_INFINITY, 0f64);
    for &(x, y) in pts.clone() {
        xmin = xmin.min(tx(c.x_scale, x));
        xmax = xmax.max(tx(c.x_scale, x));
        ymax = ymax.max(y);
    }
    for (x, _) in &c.x_ticks {
        xmin = xmin.min(tx(c.x_scale, *x));
        xmax = xmax.max(tx(c.x_scale, *x));
    }
    if !xmin.is_finite() || xmin == xmax {
        (xmin, xmax) = (xmin.min(0.0), xmin.max(0.0) + 1.0);
    }
    let yt = nice_ticks(c.y_max.unwrap_or(ymax * 1.05));
    let ytop = *yt.last().unwrap_or(&1.0);
    let (pw, ph) = (W - LEFT - RIGHT, H - TOP - BOTTOM);
    let px = |x: f64| LEFT + (tx(c.x_scale, x) - xmin) / (xmax - xmin) * pw;
    let py = |y: f64| TOP + ph - y / ytop * ph;
    let caption = wrap(&c.caption, CAPTION_CHARS);
    // Three caption lines fit under the plot; the picture grows for more.
    let height = H + caption.len().saturating_sub(3) as f64 * 16.0;
    let mut o = String::new();
    let _ = write!(
        o,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{height}" viewBox="0 0 {W} {height}" font-family="DejaVu Sans, sans-serif">"#
    );
    let _ = write!(o, r#"<rect width="100%" height="100%" fill="white"/>"#);
    let _ = write!(
        o,
        r#"<text x="{}" y="34" font-size="20" text-anchor="middle" font-weight="bold">{}</text>"#,
        LEFT + pw / 2.0,
        esc(&c.title)
    );
    for y in &yt {
        let yy = py(*y);
        let _ = write!(
            o,
            r##"<line x1="{LEFT}" y1="{yy:.1}" x2="{:.1}" y2="{yy:.1}" stroke="#e0e0e0"/>"##,
            LEFT + pw
        );
        let _ = write!(
            o,
            r#"<text x="{:.1}" y="{:.1}" font-size="13" text-anchor="end">{}</text>"#,
            LEFT - 8.0,
            yy + 4.0,
            label_num(*y)
        );
    }
    for (x, l) in &c.x_ticks {
        let xx = px(*x);
        let _ = write!(
            o,
            r##"<line x1="{xx:.1}" y1="{TOP}" x2="{xx:.1}" y2="{:.1}" stroke="#f0f0f0"/>"##,
            TOP + ph
        );
        let _ = write!(
            o,
            r#"<text x="{xx:.1}" y="{:.1}" font-size="13" text-anchor="middle">{}</text>"#,
            TOP + ph + 20.0,
            esc(l)
        );
    }
    let _ = write!(
        o,
        r#"<rect x="{LEFT}" y="{TOP}" width="{pw}" height="{ph}" fill="none" stroke="black"/>"#
    );
    let _ = write!(
        o,
        r#"<text x="{:.1}" y="{:.1}" font-size="15" text-anchor="middle">{}</text>"#,
        LEFT + pw / 2.0,
        TOP + ph + 48.0,
        esc(&c.x_label)
    );
    let _ = write!(
        o,
        r#"<text x="22" y="{:.1}" font-size="15" text-anchor="middle" transform="rotate(-90 22 {:.1})">{}</text>"#,
        TOP + ph / 2.0,
        TOP + ph / 2.0,
        esc(&c.y_label)
    );
    for (i, s) in c.series.iter().enumerate() {
        let col = COLORS[i % COLORS.len()];
        let path: Vec<String> = s
            .points
            .iter()
            .map(|&(x, y)| format!("{:.1},{:.1}", px(x), py(y)))
            .collect();
        let _ = write!(
            o,
            r#"<polyline points="{}" fill="none" stroke="{col}" stroke-width="2.5"/>"#,
            path.join(" ")
        );
        if s.points.len() <= 40 {
            for &(x, y) in &s.points {
                let _ = write!(
                    o,
                    r#"<circle cx="{:.1}" cy="{:.1}" r="3.5" fill="{col}"/>"#,
                    px(x),
                    py(y)
                );
            }
        }
        let ly = TOP + 14.0 + i as f64 * 24.0;
        let _ = write!(
            o,
            r#"<line x1="{:.1}" y1="{ly:.1}" x2="{:.1}" y2="{ly:.1}" stroke="{col}" stroke-width="3"/>"#,
            W - RIGHT + 16.0,
            W - RIGHT + 44.0
        );
        let _ = write!(
            o,
            r#"<text x="{:.1}" y="{:.1}" font-size="14">{}</text>"#,
            W - RIGHT + 52.0,
            ly + 5.0,
            esc(&s.label)
        );
    }
    for (k, line) in caption.iter().enumerate() {
        let _ = write!(
            o,
            r##"<text x="{LEFT}" y="{:.1}" font-size="12" fill="#444">{}</text>"##,
            H - 50.0 + k as f64 * 16.0,
            esc(line)
        );
    }
    o.push_str("</svg>\n");
    o
}

/// Longest caption line, in characters, that fits the picture's width at 12 px.
const CAPTION_CHARS: usize = 125;

/// The caption's lines, each broken at spaces to at most `max` characters (a word longer
/// than that stands alone).
fn wrap(text: &str, max: usize) -> Vec<String> {
    let mut out = Vec::new();
    for line in text.lines() {
        let mut cur = String::new();
        for word in line.split(' ') {
            if !cur.is_empty() && cur.chars().count() + 1 + word.chars().count() > max {
                out.push(std::mem::take(&mut cur));
                cur.push_str("    ");
            } else if !cur.is_empty() {
                cur.push(' ');
            }
            cur.push_str(word);
        }
        out.push(cur);
    }
    out
}

/// Why a chart could not be written.
#[derive(Debug, thiserror::Error)]
pub enum ChartError {
    #[error("{path}: {source}")]
    Write {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("rsvg-convert (Debian package librsvg2-bin) is needed for PNG charts: {0}")]
    NoConverter(std::io::Error),
    #[error("rsvg-convert failed on {0}")]
    ConvertFailed(PathBuf),
}

/// Writes `<stem>.svg` and `<stem>.png`; returns the files written.
pub fn write(c: &Chart, stem: &Path) -> Result<Vec<PathBuf>, ChartError> {
    let svg_path = stem.with_extension("svg");
    std::fs::write(&svg_path, svg(c)).map_err(|source| ChartError::Write {
        path: svg_path.clone(),
        source,
    })?;
    let png_path = stem.with_extension("png");
    let st = std::process::Command::new("rsvg-convert")
        .arg("-o")
        .arg(&png_path)
        .arg(&svg_path)
        .status()
        .map_err(ChartError::NoConverter)?;
    if !st.success() {
        return Err(ChartError::ConvertFailed(svg_path));
    }
    Ok(vec![svg_path, png_path])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn long_caption_lines_wrap_and_the_picture_grows() {
        let long = "links: ".to_string() + &"node 1 ucx over sysv/memory+tcp/lo, ".repeat(8);
        let lines = wrap(&format!("short\n{long}"), 60);
        assert!(lines.len() > 3, "{lines:?}");
        assert!(lines.iter().all(|l| l.chars().count() <= 60), "{lines:?}");
        assert_eq!(lines[0], "short");
        let c = Chart {
            title: "t".into(),
            x_label: "x".into(),
            y_label: "y".into(),
            caption: format!("a\nb\n{long}"),
            x_scale: Scale::Linear,
            x_ticks: vec![],
            series: vec![],
            y_max: None,
        };
        let svg = svg(&c);
        assert!(
            !svg.contains(&format!("height=\"{H}\"")),
            "the picture did not grow"
        );
    }

    #[test]
    fn svg_has_every_series_and_the_caption() {
        let c = Chart {
            title: "IOPS <vs> depth".into(),
            x_label: "queue depth".into(),
            y_label: "IOPS".into(),
            caption: "host, 2 CPUs\ntransport tcp".into(),
            x_scale: Scale::Log2,
            x_ticks: vec![(1.0, "1".into()), (32.0, "32".into())],
            series: vec![
                Series {
                    label: "4K".into(),
                    points: vec![(1.0, 10_000.0), (32.0, 48_000.0)],
                },
                Series {
                    label: "64K".into(),
                    points: vec![(1.0, 5_000.0), (32.0, 9_000.0)],
                },
            ],
            y_max: None,
        };
        let s = svg(&c);
        assert_eq!(s.matches("<polyline").count(), 2);
        assert!(
            s.contains("IOPS &lt;vs&gt; depth")
                && s.contains("transport tcp")
                && s.contains(">40k<")
        );
        assert_eq!(
            nice_ticks(48_000.0 * 1.05),
            vec![0.0, 20_000.0, 40_000.0, 60_000.0]
        );
    }
}
