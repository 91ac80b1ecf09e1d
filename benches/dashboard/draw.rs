//! The picture: the dashboard's grid of panels in one SVG, in Grafana's dark theme. Stats show
//! their last value over a sparkline, time series their lines with a legend below; a panel
//! with no series says "No data", as Grafana does.

use std::path::Path;

use anyhow::anyhow;
use plotters::coord::Shift;
use plotters::prelude::*;

use super::panels::{Kind, Panel};
use super::query::{last, Points};

const WIDTH: u32 = 1500;
/// Height of one unit of Grafana's grid.
const UNIT: u32 = 30;
const HEADER: u32 = 64;
const GAP: i32 = 4;

const BACKGROUND: RGBColor = RGBColor(17, 18, 23);
const PANEL: RGBColor = RGBColor(24, 27, 31);
const BORDER: RGBColor = RGBColor(44, 50, 53);
const TEXT: RGBColor = RGBColor(204, 204, 220);
const DIM: RGBColor = RGBColor(142, 142, 160);
const GRID: RGBColor = RGBColor(40, 44, 48);
/// Grafana's classic palette.
const PALETTE: [RGBColor; 10] = [
    RGBColor(115, 191, 105),
    RGBColor(242, 204, 12),
    RGBColor(138, 184, 255),
    RGBColor(255, 120, 10),
    RGBColor(242, 73, 92),
    RGBColor(87, 148, 242),
    RGBColor(184, 119, 217),
    RGBColor(112, 93, 160),
    RGBColor(55, 135, 45),
    RGBColor(250, 222, 42),
];

type Area<'a> = DrawingArea<SVGBackend<'a>, Shift>;

fn font(size: u32, color: &RGBColor) -> TextStyle<'static> {
    ("sans-serif", size).into_font().color(color)
}

/// Draws `panels` under `title` and `subtitle` into `path`; `duration` is the run's length in
/// seconds (every time axis spans it).
pub fn draw(
    path: &Path,
    title: &str,
    subtitle: &str,
    panels: &[Panel],
    duration: f64,
) -> anyhow::Result<()> {
    let plot = |e| anyhow!("drawing {}: {e:?}", path.display());
    let rows = panels.iter().map(|p| p.y + p.h).max().unwrap_or(0);
    let height = HEADER + rows * UNIT + 8;
    let root = SVGBackend::new(path, (WIDTH, height)).into_drawing_area();
    root.fill(&BACKGROUND).map_err(plot)?;
    root.draw(&Text::new(title.to_string(), (12, 12), font(20, &TEXT)))
        .map_err(plot)?;
    root.draw(&Text::new(subtitle.to_string(), (12, 40), font(12, &DIM)))
        .map_err(plot)?;
    let col = (WIDTH - 16) as f64 / 24.0;
    for panel in panels {
        let x = 8 + (panel.x as f64 * col) as i32;
        let y = (HEADER + panel.y * UNIT) as i32;
        let w = (panel.w as f64 * col) as i32 - GAP;
        let h = (panel.h * UNIT) as i32 - GAP;
        if panel.kind == Kind::Row {
            root.draw(&Text::new(
                format!("▾ {}", panel.title),
                (x + 2, y + 8),
                font(15, &TEXT),
            ))
            .map_err(plot)?;
            continue;
        }
        root.draw(&Rectangle::new([(x, y), (x + w, y + h)], PANEL.filled()))
            .map_err(plot)?;
        root.draw(&Rectangle::new(
            [(x, y), (x + w, y + h)],
            BORDER.stroke_width(1),
        ))
        .map_err(plot)?;
        root.draw(&Text::new(
            panel.title.clone(),
            (x + 8, y + 7),
            font(13, &TEXT),
        ))
        .map_err(plot)?;
        let inner = root
            .clone()
            .shrink((x + 1, y + 26), (w as u32 - 2, h as u32 - 27));
        if panel.lines.values().all(|p| last(p).is_none()) {
            let (iw, ih) = inner.dim_in_pixel();
            inner
                .draw(&Text::new(
                    "No data",
                    (iw as i32 / 2 - 24, ih as i32 / 2 - 10),
                    font(14, &DIM),
                ))
                .map_err(plot)?;
            continue;
        }
        match panel.kind {
            Kind::Stat => stat(&inner, panel, duration).map_err(plot)?,
            _ => series(&inner, panel, duration).map_err(plot)?,
        }
    }
    root.present().map_err(plot)?;
    Ok(())
}

type DrawResult =
    Result<(), DrawingAreaErrorKind<<SVGBackend<'static> as DrawingBackend>::ErrorType>>;

/// The last value, large, over the line as a sparkline.
fn stat(area: &Area, panel: &Panel, duration: f64) -> DrawResult {
    let color = PALETTE[0];
    let (points, value) = panel
        .lines
        .values()
        .find_map(|p| last(p).map(|v| (p, v)))
        .expect("a stat with data");
    let (w, h) = area.dim_in_pixel();
    let spark = area.clone().shrink((0, h / 2), (w, h - h / 2));
    let y_max = max_of(std::slice::from_ref(points)).max(1e-9) * 1.1;
    let mut chart = ChartBuilder::on(&spark).build_cartesian_2d(0.0..duration, 0.0..y_max)?;
    for segment in segments(points) {
        let mut polygon = segment.clone();
        polygon.push((segment[segment.len() - 1].0, 0.0));
        polygon.push((segment[0].0, 0.0));
        chart.draw_series(std::iter::once(Polygon::new(
            polygon,
            color.mix(0.18).filled(),
        )))?;
        chart.draw_series(LineSeries::new(segment, color.stroke_width(1)))?;
    }
    area.draw(&Text::new(
        format_value(&panel.unit, value),
        (12, 2),
        font(30, &color),
    ))?;
    Ok(())
}

/// Lines over the run, with a legend below.
fn series(area: &Area, panel: &Panel, duration: f64) -> DrawResult {
    let (w, h) = area.dim_in_pixel();
    // The legend: entries side by side, wrapped to the panel's width.
    let mut entries = Vec::new();
    let (mut lx, mut ly) = (10_i32, 0_i32);
    for (i, legend) in panel.lines.keys().enumerate() {
        let text = if legend.is_empty() { "value" } else { legend };
        let width = 22 + (text.chars().count() as f64 * 6.3) as i32 + 14;
        if lx + width > w as i32 - 8 && lx > 10 {
            lx = 10;
            ly += 16;
        }
        entries.push((text.to_string(), PALETTE[i % PALETTE.len()], lx, ly));
        lx += width;
    }
    let legend_h = (ly + 22) as u32;
    let plot = area.clone().shrink((0, 0), (w, h - legend_h));
    let legend = area.clone().shrink((0, h - legend_h), (w, legend_h));
    let lines: Vec<&Points> = panel.lines.values().collect();
    let y_max = nice_max(max_of(
        &lines.iter().map(|p| (*p).clone()).collect::<Vec<_>>(),
    ));
    let mut chart = ChartBuilder::on(&plot)
        .margin_right(14)
        .margin_top(4)
        .x_label_area_size(20)
        .y_label_area_size(64)
        .build_cartesian_2d(0.0..duration, 0.0..y_max)?;
    let unit = panel.unit.clone();
    chart
        .configure_mesh()
        .bold_line_style(GRID)
        .light_line_style(TRANSPARENT)
        .axis_style(BORDER)
        .label_style(font(10, &DIM))
        .x_labels(8)
        .y_labels(5)
        .x_label_formatter(&|t| format!("{}:{:02}", *t as u64 / 60, *t as u64 % 60))
        .y_label_formatter(&|v| format_value(&unit, *v))
        .draw()?;
    for (points, (_, color, _, _)) in lines.iter().zip(&entries) {
        for segment in segments(points) {
            chart.draw_series(LineSeries::new(segment, color.stroke_width(2)))?;
        }
    }
    for (text, color, x, y) in &entries {
        let y = y + 4;
        legend.draw(&PathElement::new(
            vec![(*x, y + 6), (*x + 16, y + 6)],
            color.stroke_width(3),
        ))?;
        legend.draw(&Text::new(text.clone(), (*x + 22, y), font(11, &TEXT)))?;
    }
    Ok(())
}

/// The runs of a line between its gaps.
fn segments(points: &Points) -> Vec<Vec<(f64, f64)>> {
    let mut out = vec![Vec::new()];
    for &(t, v) in points {
        if v.is_finite() {
            out.last_mut().expect("never empty").push((t, v));
        } else if !out.last().expect("never empty").is_empty() {
            out.push(Vec::new());
        }
    }
    out.retain(|s| !s.is_empty());
    out
}

fn max_of(lines: &[Points]) -> f64 {
    lines
        .iter()
        .flatten()
        .map(|p| p.1)
        .filter(|v| v.is_finite())
        .fold(0.0, f64::max)
}

/// A round top for an axis: 1, 2 or 5 times a power of ten, above `max`.
fn nice_max(max: f64) -> f64 {
    if max <= 0.0 {
        return 1.0;
    }
    let power = 10f64.powf((max * 1.05).log10().floor());
    [1.0, 2.0, 2.5, 5.0, 10.0]
        .iter()
        .map(|m| m * power)
        .find(|top| *top >= max * 1.05)
        .unwrap_or(10.0 * power)
}

/// A value in a Grafana unit, as Grafana writes it.
pub fn format_value(unit: &str, v: f64) -> String {
    let short = |v: f64| {
        if v.abs() >= 1000.0 {
            format!("{:.1}K", v / 1000.0)
        } else if (v - v.round()).abs() < 1e-9 || v.abs() >= 10.0 {
            format!("{v:.0}")
        } else {
            format!("{v:.2}")
        }
    };
    match unit {
        "reqps" => format!("{} req/s", short(v)),
        "percentunit" => format!("{:.1}%", v * 100.0),
        "s" if v == 0.0 => "0 s".to_string(),
        "s" if v < 0.001 => format!("{:.0} µs", v * 1e6),
        "s" if v < 1.0 => format!("{:.1} ms", v * 1e3),
        "s" => format!("{v:.1} s"),
        _ => short(v),
    }
}
