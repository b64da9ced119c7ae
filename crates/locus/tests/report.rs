//! `locus report --quick`: all five sections measured, the findings drawn from the cases the
//! runs reported, every plot a well-formed SVG with data in it, and a headless Chromium
//! screenshot of the page that shows every plot.

mod common;

use std::path::Path;
use std::process::Command;

use serde_json::Value;

const SECTIONS: [&str; 5] = ["mbs-lvm", "libpubl", "tyche", "nbm", "udma"];

fn chromium() -> Option<&'static str> {
    ["chromium", "chromium-browser"].into_iter().find(|name| {
        Command::new(name)
            .arg("--version")
            .output()
            .is_ok_and(|o| o.status.success())
    })
}

#[test]
fn the_quick_report_covers_every_seed_and_its_screenshot_shows_every_plot() {
    if !common::require(&["fio", "nbdkit", "qemu-nbd"]) {
        return;
    }
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let locus = env!("CARGO_BIN_EXE_locus");
    // A second trace for the NBM section, made the way a user would.
    let trace = dir.path().join("small.csv");
    common::run(
        locus,
        &[
            "sim",
            "--gen",
            "zipf",
            "--requests",
            "20000",
            "--blocks",
            "8000",
            "--output",
            trace.to_str().unwrap(),
        ],
    );
    let out = dir.path().join("report");
    let output = Command::new(locus)
        .args(["report", "--quick", "--seconds", "0.1", "--output"])
        .arg(&out)
        .arg("--trace")
        .arg(&trace)
        .arg("--preload-library")
        .arg(common::preload_library())
        .arg("--disk-file")
        .arg(dir.path().join("uring.img"))
        .output()
        .unwrap();
    let stdout = common::text(&output.stdout);
    assert!(
        output.status.success(),
        "locus report failed:\n{stdout}\n{}",
        common::text(&output.stderr)
    );
    assert!(stdout.contains("report written to"), "{stdout}");

    let report: Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("report.json")).unwrap()).unwrap();
    let sections = report["sections"].as_array().unwrap();
    let ids: Vec<&str> = sections.iter().map(|s| s["id"].as_str().unwrap()).collect();
    assert_eq!(ids, SECTIONS);
    for section in sections {
        let runs = section["runs"].as_array().unwrap();
        assert!(!runs.is_empty(), "{}: no runs", section["id"]);
        for run in runs {
            assert!(
                run["error"].is_null(),
                "{}: {}",
                section["id"],
                run["error"]
            );
            assert!(!run["cases"].as_array().unwrap().is_empty());
        }
        assert!(
            !section["findings"].as_array().unwrap().is_empty(),
            "{}: no findings",
            section["id"]
        );
    }
    // The NBM section replayed the generated trace and the one given.
    let nbm_runs = sections[3]["runs"].as_array().unwrap();
    assert_eq!(nbm_runs.len(), 2);
    assert!(
        nbm_runs[1]["command"]
            .as_str()
            .unwrap()
            .contains("small.csv")
    );

    // A finding is the ratio of the cases it names: locus over tmpfs at 4 KiB, one job.
    let cases = sections[0]["runs"][0]["cases"].as_array().unwrap();
    let rate = |engine: &str| {
        cases
            .iter()
            .find(|c| c["engine"] == engine && c["bs_bytes"] == 4096 && c["numjobs"] == 1)
            .and_then(|c| c["bytes_per_sec"].as_f64())
            .unwrap_or_else(|| panic!("no {engine} case at 4 KiB, 1 job"))
    };
    let finding = sections[0]["findings"]
        .as_array()
        .unwrap()
        .iter()
        .find(|f| {
            f["what"]
                .as_str()
                .unwrap()
                .starts_with("4 KiB random writes, 1 job")
        })
        .expect("the 4 KiB, 1 job finding");
    let value = finding["value"].as_f64().unwrap();
    assert!(
        (value - rate("locus") / rate("tmpfs")).abs() < 1e-9,
        "{finding} does not match its cases"
    );

    // Every plot: a figure with a well-formed SVG holding data.
    let html = std::fs::read_to_string(out.join("report.html")).unwrap();
    for id in SECTIONS {
        assert!(
            html.contains(&format!("<section id=\"{id}\">")),
            "no section {id}"
        );
    }
    let svgs: Vec<&str> = html
        .split("<figure class=\"plot\"")
        .skip(1)
        .map(|figure| {
            let start = figure.find("<svg").expect("a figure without an SVG");
            let end = figure.find("</svg>").expect("an unterminated SVG") + "</svg>".len();
            &figure[start..end]
        })
        .collect();
    // MBS-LVM 1, Libpubl 3, Tyche 1, NBM one per trace (2), uDMA 1.
    assert_eq!(svgs.len(), 8, "plots in the page");
    for (index, svg) in svgs.iter().enumerate() {
        let document = roxmltree::Document::parse(svg)
            .unwrap_or_else(|e| panic!("plot {index} is not well-formed SVG: {e}"));
        let marks = document
            .descendants()
            .filter(|n| matches!(n.tag_name().name(), "rect" | "polyline" | "circle"))
            .count();
        assert!(marks >= 8, "plot {index} has {marks} marks: no data drawn");
    }

    let Some(browser) = chromium() else {
        assert!(
            std::env::var_os("CI").is_none(),
            "chromium is missing; .ci/run installs it"
        );
        eprintln!("skipping the screenshot: chromium is not installed");
        return;
    };
    let shot = dir.path().join("report.png");
    let output = Command::new(browser)
        .args([
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--hide-scrollbars",
            "--force-device-scale-factor=1",
            "--window-size=1280,20000",
        ])
        .arg(format!("--screenshot={}", shot.display()))
        .arg(format!("file://{}", out.join("report.html").display()))
        .env("HOME", dir.path())
        .output()
        .unwrap();
    assert!(
        output.status.success() && shot.exists(),
        "chromium failed: {}",
        common::text(&output.stderr)
    );
    let image = Image::read(&shot);
    for index in 0..svgs.len() {
        image.check_plot(index);
    }
}

/// A decoded RGB screenshot.
struct Image {
    width: usize,
    height: usize,
    rgb: Vec<u8>,
}

impl Image {
    fn read(path: &Path) -> Self {
        let decoder =
            png::Decoder::new(std::io::BufReader::new(std::fs::File::open(path).unwrap()));
        let mut reader = decoder.read_info().unwrap();
        let mut buf = vec![0; reader.output_buffer_size()];
        let info = reader.next_frame(&mut buf).unwrap();
        let channels = match info.color_type {
            png::ColorType::Rgb => 3,
            png::ColorType::Rgba => 4,
            other => panic!("unexpected screenshot colour type {other:?}"),
        };
        assert_eq!(info.bit_depth, png::BitDepth::Eight);
        let rgb = buf[..info.buffer_size()]
            .chunks(channels)
            .flat_map(|p| [p[0], p[1], p[2]])
            .collect();
        Self {
            width: info.width as usize,
            height: info.height as usize,
            rgb,
        }
    }

    fn pixel(&self, x: usize, y: usize) -> (u8, u8, u8) {
        let i = (y * self.width + x) * 3;
        (self.rgb[i], self.rgb[i + 1], self.rgb[i + 2])
    }

    /// The page frames its `index`th plot in its own shade, rgb(200, 210, 222 - index): the
    /// frame must be on screen in full, plot-sized, and hold a drawing, not a blank box.
    fn check_plot(&self, index: usize) {
        let frame = (200, 210, 222 - index as u8);
        let (mut x0, mut y0, mut x1, mut y1, mut count) = (usize::MAX, usize::MAX, 0, 0, 0);
        for y in 0..self.height {
            for x in 0..self.width {
                if self.pixel(x, y) == frame {
                    x0 = x0.min(x);
                    y0 = y0.min(y);
                    x1 = x1.max(x);
                    y1 = y1.max(y);
                    count += 1;
                }
            }
        }
        assert!(
            count > 0,
            "plot {index}: its frame is not in the screenshot"
        );
        let (w, h) = (x1 - x0 + 1, y1 - y0 + 1);
        assert!(
            w >= 300 && h >= 200 && y1 + 1 < self.height,
            "plot {index}: frame {w}x{h} at ({x0}, {y0}) is cut or too small"
        );
        assert!(
            count >= 2 * (w + h),
            "plot {index}: only {count} frame pixels for a {w}x{h} box (covered or cut)"
        );
        let mut drawn = 0usize;
        for y in y0 + 4..y1 - 3 {
            for x in x0 + 4..x1 - 3 {
                if self.pixel(x, y) != (255, 255, 255) {
                    drawn += 1;
                }
            }
        }
        let share = drawn as f64 / ((w - 8) * (h - 8)) as f64;
        assert!(
            share > 0.02,
            "plot {index}: {:.2}% of its box is drawn — blank",
            share * 100.0
        );
    }
}
