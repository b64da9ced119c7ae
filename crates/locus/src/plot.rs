//! Plots drawn with plotters, as SVG or PNG. Laying out text needs font metrics in both, so a
//! TrueType font is read from the system (DejaVu Sans by default; set LOCUS_PLOT_FONT to use
//! another).

use std::path::Path;

use anyhow::{Context, Result, bail};
use plotters::prelude::*;
use sim::{GridResult, PolicyKind};

const FONT_CANDIDATES: &[&str] = &[
    "/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf",
    "/usr/share/fonts/TTF/DejaVuSans.ttf",
    "/usr/share/fonts/dejavu/DejaVuSans.ttf",
];

/// Checks, before any work, that a plot can be written to `path`: a `.svg` or `.png` name, a
/// font to lay text out with, and a directory that exists and takes a new file there.
pub fn check_target(path: &Path) -> Result<()> {
    let extension = path.extension().and_then(|e| e.to_str());
    if !matches!(extension, Some("svg" | "png")) {
        bail!("--plot {}: use a .svg or .png file name", path.display());
    }
    font_path()?;
    crate::output::check_writable(path)
        .with_context(|| format!("--plot {}: cannot write there", path.display()))
}

/// The NBM paper's Fig. 3: for each policy but NVLRU, storage accesses normalised to NVLRU
/// against NVRAM size (log scale), one line per DRAM size.
pub fn fig3(path: &Path, results: &[GridResult], title: &str) -> Result<()> {
    let panels = fig3_panels(results)?;
    let (width, height) = fig3_size(&panels);
    let extension = path.extension().and_then(|e| e.to_str());
    if !matches!(extension, Some("svg" | "png")) {
        bail!("--plot {}: use a .svg or .png file name", path.display());
    }
    register_font()?;
    if extension == Some("svg") {
        draw(
            &SVGBackend::new(path, (width, height)).into_drawing_area(),
            &panels,
            results,
            title,
        )
    } else {
        draw(
            &BitMapBackend::new(path, (width, height)).into_drawing_area(),
            &panels,
            results,
            title,
        )
    }
}

/// Fig. 3 as an SVG document (for pages that inline their plots, such as `locus report`).
pub fn fig3_svg(results: &[GridResult], title: &str) -> Result<String> {
    let panels = fig3_panels(results)?;
    register_font()?;
    let mut svg = String::new();
    {
        let size = fig3_size(&panels);
        let root = SVGBackend::with_string(&mut svg, size).into_drawing_area();
        draw(&root, &panels, results, title)?;
    }
    Ok(svg)
}

/// The panels of Fig. 3: every policy of the grid but NVLRU, which they are normalised to.
fn fig3_panels(results: &[GridResult]) -> Result<Vec<PolicyKind>> {
    let panels: Vec<PolicyKind> = PolicyKind::ALL
        .into_iter()
        .filter(|p| *p != PolicyKind::NvLru && results.iter().any(|r| r.policy == *p))
        .collect();
    if panels.is_empty() || !results.iter().any(|r| r.normalized_to_nvlru.is_some()) {
        bail!("the plot needs nvlru and at least one other policy in the grid");
    }
    Ok(panels)
}

/// Panels side by side, and below them a strip for the legend (it never covers data).
fn fig3_size(panels: &[PolicyKind]) -> (u32, u32) {
    (420 * panels.len() as u32 + 40, 420 + LEGEND_STRIP)
}

/// Checks that plots can be drawn: a font to lay text out with.
pub fn check_font() -> Result<()> {
    font_path().map(drop)
}

fn font_path() -> Result<String> {
    std::env::var("LOCUS_PLOT_FONT")
        .ok()
        .or_else(|| {
            FONT_CANDIDATES
                .iter()
                .find(|p| Path::new(p).exists())
                .map(|p| (*p).to_owned())
        })
        .context("plots need a TrueType font: install fonts-dejavu-core or set LOCUS_PLOT_FONT")
}

fn register_font() -> Result<()> {
    let path = font_path()?;
    let bytes = std::fs::read(&path).with_context(|| format!("reading font {path}"))?;
    // plotters keeps registered fonts for the life of the process.
    let bytes: &'static [u8] = Box::leak(bytes.into_boxed_slice());
    plotters::style::register_font("sans-serif", FontStyle::Normal, bytes)
        .map_err(|_| anyhow::anyhow!("{path} is not a usable TrueType font"))?;
    Ok(())
}

/// Pixels below the panels for the legend.
const LEGEND_STRIP: u32 = 40;

fn draw<B: DrawingBackend>(
    root: &DrawingArea<B, plotters::coord::Shift>,
    panels: &[PolicyKind],
    results: &[GridResult],
    title: &str,
) -> Result<()>
where
    B::ErrorType: 'static,
{
    let err = |e: DrawingAreaErrorKind<B::ErrorType>| anyhow::anyhow!("drawing the plot: {e}");
    root.fill(&WHITE).map_err(err)?;
    // The panels, and a strip under them for the legend (so it never covers data).
    let (_, full_height) = root.dim_in_pixel();
    let (top, legend_area) = root.split_vertically(full_height - LEGEND_STRIP);
    let root = top
        .titled(
            &format!("Storage accesses normalised to NVLRU — {title}"),
            ("sans-serif", 18),
        )
        .map_err(err)?;
    let mut dram: Vec<u64> = results.iter().map(|r| r.dram_bytes).collect();
    dram.sort_unstable();
    dram.dedup();
    let mut nvram: Vec<u64> = results
        .iter()
        .map(|r| r.nvram_bytes)
        .filter(|&n| n > 0)
        .collect();
    nvram.sort_unstable();
    nvram.dedup();
    // NVRAM sizes are evenly spaced categories (the grid is usually geometric), labelled with
    // their sizes; plotters' log-scale ticks would not land on them.
    let x_max = (nvram.len().max(2) - 1) as f64;
    let label = |index: f64| -> String {
        let i = index.round();
        if (index - i).abs() > 0.01 || i < 0.0 {
            return String::new();
        }
        nvram.get(i as usize).map_or_else(String::new, |&n| {
            crate::size::format_bytes(n).replace(".00", "")
        })
    };
    let y_max = results
        .iter()
        .filter_map(|r| r.normalized_to_nvlru)
        .fold(1.0f64, f64::max)
        * 1.1;
    let panels_area = &root;
    // Lines that coincide (several DRAM sizes giving the same counts) would hide each other:
    // each series is nudged sideways a little and has its own marker.
    let nudge = |index: usize| (index as f64 - (dram.len() as f64 - 1.0) / 2.0) * 0.05;
    for (area, policy) in panels_area
        .split_evenly((1, panels.len()))
        .iter()
        .zip(panels)
    {
        let mut chart = ChartBuilder::on(area)
            .caption(policy.name().to_uppercase(), ("sans-serif", 16))
            .margin(10)
            .x_label_area_size(35)
            .y_label_area_size(45)
            .build_cartesian_2d(-0.2..x_max + 0.2, 0.0..y_max)
            .map_err(err)?;
        chart
            .configure_mesh()
            .x_desc("NVRAM size")
            .y_desc("storage accesses / NVLRU")
            .x_labels(nvram.len() * 4 + 1)
            .x_label_formatter(&|v| label(*v))
            .disable_x_mesh()
            .draw()
            .map_err(err)?;
        for (index, &d) in dram.iter().enumerate() {
            let color = Palette99::pick(index).to_rgba();
            let points: Vec<(f64, f64)> = nvram
                .iter()
                .enumerate()
                .filter_map(|(x, &n)| {
                    results
                        .iter()
                        .find(|r| r.policy == *policy && r.dram_bytes == d && r.nvram_bytes == n)
                        .and_then(|r| r.normalized_to_nvlru)
                        .map(|y| (x as f64 + nudge(index), y))
                })
                .collect();
            chart
                .draw_series(LineSeries::new(points.clone(), color.stroke_width(2)))
                .map_err(err)?;
            chart
                .draw_series(points.into_iter().map(|p| marker(index, p, color)))
                .map_err(err)?;
        }
        chart
            .draw_series(LineSeries::new(
                vec![(-0.2, 1.0), (x_max + 0.2, 1.0)],
                BLACK.mix(0.4),
            ))
            .map_err(err)?;
    }
    // The legend: one entry per DRAM size, in a row under the panels.
    let labels: Vec<String> = dram
        .iter()
        .map(|&d| format!("DRAM {}", crate::size::format_bytes(d).replace(".00", "")))
        .collect();
    legend(&legend_area, &labels, 24, |index, x, y| {
        let color = Palette99::pick(index).to_rgba();
        legend_area
            .draw(&PathElement::new(
                vec![(x, y), (x + 24, y)],
                color.stroke_width(2),
            ))
            .map_err(err)?;
        legend_area
            .draw(&marker(index, (x + 12, y), color))
            .map_err(err)
    })?;
    legend_area.present().map_err(err)?;
    Ok(())
}

/// A legend in a row across `area`: each label after its swatch, which `swatch(index, x, y)`
/// draws `swatch_width` pixels wide from `x`, centred on `y`.
fn legend<B: DrawingBackend>(
    area: &DrawingArea<B, plotters::coord::Shift>,
    labels: &[String],
    swatch_width: i32,
    mut swatch: impl FnMut(usize, i32, i32) -> Result<()>,
) -> Result<()>
where
    B::ErrorType: 'static,
{
    let (mut x, y) = (20i32, (LEGEND_STRIP / 2) as i32);
    for (index, label) in labels.iter().enumerate() {
        swatch(index, x, y)?;
        area.draw(&Text::new(
            label.clone(),
            (x + swatch_width + 6, y - 7),
            ("sans-serif", 14).into_font(),
        ))
        .map_err(|e| anyhow::anyhow!("drawing the plot: {e}"))?;
        x += swatch_width + 6 + 9 * label.len() as i32 + 24;
    }
    Ok(())
}

/// The marker of series `index`: filled circle, triangle, cross, hollow circle, in turn.
fn marker<DB: DrawingBackend, C: Clone + 'static>(
    index: usize,
    at: C,
    color: RGBAColor,
) -> DynElement<'static, DB, C> {
    match index % 4 {
        0 => Circle::new(at, 3, color.filled()).into_dyn(),
        1 => TriangleMarker::new(at, 4, color.filled()).into_dyn(),
        2 => Cross::new(at, 4, color.stroke_width(2)).into_dyn(),
        _ => Circle::new(at, 4, color.stroke_width(2)).into_dyn(),
    }
}

/// One bar per case: `values[i]` over `labels[i]`, with a reference line at 1 (for ratios
/// of locus to a baseline measured in the same run).
pub fn ratio_bars(
    path: &Path,
    title: &str,
    y_desc: &str,
    labels: &[String],
    values: &[f64],
) -> Result<()> {
    let extension = path.extension().and_then(|e| e.to_str());
    if !matches!(extension, Some("svg" | "png")) {
        bail!("--plot {}: use a .svg or .png file name", path.display());
    }
    if labels.is_empty() {
        bail!("nothing to plot");
    }
    register_font()?;
    let size = (60 + 36 * labels.len() as u32, 520);
    if extension == Some("svg") {
        draw_bars(
            &SVGBackend::new(path, size).into_drawing_area(),
            title,
            y_desc,
            labels,
            values,
        )
    } else {
        draw_bars(
            &BitMapBackend::new(path, size).into_drawing_area(),
            title,
            y_desc,
            labels,
            values,
        )
    }
}

fn draw_bars<B: DrawingBackend>(
    root: &DrawingArea<B, plotters::coord::Shift>,
    title: &str,
    y_desc: &str,
    labels: &[String],
    values: &[f64],
) -> Result<()>
where
    B::ErrorType: 'static,
{
    let err = |e: DrawingAreaErrorKind<B::ErrorType>| anyhow::anyhow!("drawing the plot: {e}");
    root.fill(&WHITE).map_err(err)?;
    let y_max = values.iter().copied().fold(1.0f64, f64::max) * 1.15;
    let n = labels.len();
    let mut chart = ChartBuilder::on(root)
        .caption(title, ("sans-serif", 18))
        .margin(12)
        .x_label_area_size(130)
        .y_label_area_size(50)
        .build_cartesian_2d(-0.5..n as f64 - 0.5, 0.0..y_max)
        .map_err(err)?;
    chart
        .configure_mesh()
        .y_desc(y_desc)
        .x_labels(n)
        .x_label_formatter(&|v| {
            let i = v.round();
            if (v - i).abs() > 0.01 || i < 0.0 {
                return String::new();
            }
            labels.get(i as usize).cloned().unwrap_or_default()
        })
        .x_label_style(
            ("sans-serif", 11)
                .into_font()
                .transform(FontTransform::Rotate90),
        )
        .disable_x_mesh()
        .draw()
        .map_err(err)?;
    chart
        .draw_series(values.iter().enumerate().map(|(i, &v)| {
            let color = if v >= 1.0 {
                BLUE.mix(0.7)
            } else {
                RED.mix(0.7)
            };
            Rectangle::new(
                [(i as f64 - 0.35, 0.0), (i as f64 + 0.35, v)],
                color.filled(),
            )
        }))
        .map_err(err)?;
    chart
        .draw_series(LineSeries::new(
            vec![(-0.5, 1.0), (n as f64 - 0.5, 1.0)],
            BLACK.mix(0.5),
        ))
        .map_err(err)?;
    root.present().map_err(err)?;
    Ok(())
}

/// Bars in groups, for `locus report`: one group per category, one bar per series in each
/// (`None`: that series was not measured there), a legend strip below, and an optional
/// horizontal reference line (1 when the bars are ratios to a baseline).
pub struct Bars<'a> {
    pub title: &'a str,
    pub y_desc: &'a str,
    pub categories: &'a [String],
    pub series: &'a [(String, Vec<Option<f64>>)],
    pub reference: Option<f64>,
}

/// Draws `bars` as an SVG document.
pub fn bars_svg(bars: &Bars<'_>) -> Result<String> {
    if bars.categories.is_empty() || bars.series.is_empty() {
        bail!("nothing to plot for `{}`", bars.title);
    }
    register_font()?;
    let group = 16 * bars.series.len() as u32 + 28;
    let size = (
        (90 + group * bars.categories.len() as u32).max(560),
        340 + LEGEND_STRIP,
    );
    let mut svg = String::new();
    {
        let root = SVGBackend::with_string(&mut svg, size).into_drawing_area();
        draw_grouped(&root, bars)?;
    }
    Ok(svg)
}

/// A bar's value as its label: three significant figures at most.
fn bar_label(value: f64) -> String {
    match value.abs() {
        v if v >= 100.0 => format!("{value:.0}"),
        v if v >= 10.0 => format!("{value:.1}"),
        _ => format!("{value:.2}"),
    }
}

fn draw_grouped<B: DrawingBackend>(
    root: &DrawingArea<B, plotters::coord::Shift>,
    bars: &Bars<'_>,
) -> Result<()>
where
    B::ErrorType: 'static,
{
    let err = |e: DrawingAreaErrorKind<B::ErrorType>| anyhow::anyhow!("drawing the plot: {e}");
    root.fill(&WHITE).map_err(err)?;
    let (_, full_height) = root.dim_in_pixel();
    let (top, legend_area) = root.split_vertically(full_height - LEGEND_STRIP);
    let n = bars.categories.len();
    let k = bars.series.len();
    let y_max = bars
        .series
        .iter()
        .flat_map(|(_, values)| values.iter().flatten().copied())
        .chain(bars.reference)
        .fold(0.0f64, f64::max)
        .max(f64::MIN_POSITIVE)
        * 1.18;
    let mut chart = ChartBuilder::on(&top)
        .caption(bars.title, ("sans-serif", 16))
        .margin(12)
        .x_label_area_size(30)
        .y_label_area_size(60)
        .build_cartesian_2d(-0.5..n as f64 - 0.5, 0.0..y_max)
        .map_err(err)?;
    chart
        .configure_mesh()
        .y_desc(bars.y_desc)
        .x_labels(n)
        .x_label_formatter(&|v| {
            let i = v.round();
            if (v - i).abs() > 0.01 || i < 0.0 {
                return String::new();
            }
            bars.categories.get(i as usize).cloned().unwrap_or_default()
        })
        .x_label_style(("sans-serif", 12))
        .disable_x_mesh()
        .draw()
        .map_err(err)?;
    let width = 0.8 / k as f64;
    let labelled = n * k <= 40;
    let label_style = ("sans-serif", 10).into_font().into_text_style(&top).pos(
        plotters::style::text_anchor::Pos::new(
            plotters::style::text_anchor::HPos::Center,
            plotters::style::text_anchor::VPos::Bottom,
        ),
    );
    for (j, (_, values)) in bars.series.iter().enumerate() {
        let color = Palette99::pick(j).to_rgba();
        let placed: Vec<(f64, f64)> = values
            .iter()
            .enumerate()
            .filter_map(|(i, v)| v.map(|v| (i as f64 - 0.4 + j as f64 * width, v)))
            .collect();
        chart
            .draw_series(
                placed.iter().map(|&(x, v)| {
                    Rectangle::new([(x, 0.0), (x + width * 0.9, v)], color.filled())
                }),
            )
            .map_err(err)?;
        if labelled {
            chart
                .draw_series(placed.iter().map(|&(x, v)| {
                    Text::new(bar_label(v), (x + width * 0.45, v), label_style.clone())
                }))
                .map_err(err)?;
        }
    }
    if let Some(reference) = bars.reference {
        chart
            .draw_series(LineSeries::new(
                vec![(-0.5, reference), (n as f64 - 0.5, reference)],
                BLACK.mix(0.5).stroke_width(1),
            ))
            .map_err(err)?;
    }
    let labels: Vec<String> = bars.series.iter().map(|(name, _)| name.clone()).collect();
    legend(&legend_area, &labels, 14, |j, x, y| {
        legend_area
            .draw(&Rectangle::new(
                [(x, y - 6), (x + 14, y + 6)],
                Palette99::pick(j).to_rgba().filled(),
            ))
            .map_err(err)
    })?;
    root.present().map_err(err)?;
    Ok(())
}
