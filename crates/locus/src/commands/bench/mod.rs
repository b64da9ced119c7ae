//! `locus bench`: measurements printed as numbers, one suite per file.

pub mod age;
pub mod cache;
mod cleanup;
pub mod fs;
pub mod mount;
pub mod nbd;
pub mod preload;
pub mod sim;
pub mod uring;
pub mod volume;

use anyhow::Result;
use clap::{Args, Subcommand};

use crate::output::outln;

/// Measure locus on this machine and print the numbers (tables, or JSON with --json).
#[derive(Debug, Args)]
pub struct BenchArgs {
    #[command(subcommand)]
    suite: Suite,
}

#[derive(Debug, Subcommand)]
enum Suite {
    Volume(volume::VolumeBenchArgs),
    Age(age::AgeBenchArgs),
    Fs(fs::FsBenchArgs),
    Nbd(nbd::NbdBenchArgs),
    Cache(cache::CacheBenchArgs),
    Mount(mount::MountBenchArgs),
    Preload(preload::PreloadBenchArgs),
    Sim(sim::SimBenchArgs),
    Uring(uring::UringBenchArgs),
}

/// Prints one JSON object per case, one per line (`--json` of every suite).
fn print_json<T: serde::Serialize>(cases: &[T]) -> Result<()> {
    for case in cases {
        outln!("{}", serde_json::to_string(case)?);
    }
    Ok(())
}

/// The run of median `rate` among a case's rounds (the upper one of an even count), given
/// the rounds' range of `rate` by `set_range` when there was more than one.
pub(crate) fn median_run<C>(
    mut runs: Vec<C>,
    rate: impl Fn(&C) -> f64,
    set_range: impl FnOnce(&mut C, [f64; 2]),
) -> C {
    runs.sort_by(|a, b| rate(a).total_cmp(&rate(b)));
    let range = min_max(&runs.iter().map(&rate).collect::<Vec<_>>());
    let count = runs.len();
    let mut median = runs.swap_remove(count / 2);
    if count > 1 {
        set_range(&mut median, range);
    }
    median
}

/// What a table's title adds for `--rounds` (nothing for one round); `per`: "engine", "column".
pub(crate) fn rounds_title(rounds: u32, per: &str) -> String {
    if rounds > 1 {
        format!("; median of {rounds} alternated rounds per {per}, with the rounds' ratios")
    } else {
        String::new()
    }
}

/// The header of the ratio-range column (only with `--rounds` above 1).
pub(crate) fn range_header(rounds: u32) -> &'static str {
    if rounds > 1 { "  ratio range" } else { "" }
}

/// A case's ratio-range cell: empty without one.
pub(crate) fn range_cell(range: Option<[f64; 2]>) -> String {
    range.map_or(String::new(), |[lo, hi]| format!("  {lo:.2}x-{hi:.2}x"))
}

/// The lowest and highest of `values`.
pub(crate) fn min_max(values: &[f64]) -> [f64; 2] {
    values
        .iter()
        .fold([f64::INFINITY, f64::NEG_INFINITY], |[lo, hi], &v| {
            [lo.min(v), hi.max(v)]
        })
}

/// A block size as the tables show it: `4K`, `64K`, `2M`, `1536B`.
pub(crate) fn short_size(bytes: u64) -> String {
    crate::size::format_bytes(bytes)
        .replace(".00 ", "")
        .replace("KiB", "K")
        .replace("MiB", "M")
}

/// A `--client-cpus` value: a CPU list (`0`, `0-1,4`), checked and kept in the kernel's form.
pub(crate) fn parse_client_cpus(text: &str) -> Result<String, String> {
    let cpus = topology::cpulist::parse(text)?;
    if cpus.is_empty() {
        return Err("an empty CPU list".into());
    }
    Ok(topology::cpulist::format(&cpus))
}

/// Keeps fio on `cpus` (a checked CPU list), when given: every server then meets the same
/// pinned client.
fn pin_fio(command: &mut std::process::Command, cpus: Option<&str>) {
    if let Some(cpus) = cpus {
        command.arg(format!("--cpus_allowed={cpus}"));
    }
}

/// How the tables name where fio ran.
fn client_placement(cpus: Option<&str>) -> String {
    match cpus {
        Some(cpus) => format!("fio on CPUs {cpus}"),
        None => "fio unpinned".into(),
    }
}

/// Runs a fio command given `--output-format=json` and returns its report.
fn fio_report(command: &mut std::process::Command) -> Result<serde_json::Value> {
    use anyhow::Context;
    let output = cleanup::output(command).context("running fio")?;
    if !output.status.success() {
        anyhow::bail!(
            "fio failed: {}{}",
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        );
    }
    let text = String::from_utf8_lossy(&output.stdout);
    // fio may print notes before the JSON document.
    let start = text.find('{').context("fio printed no JSON")?;
    serde_json::from_str(&text[start..]).context("parsing fio's JSON")
}

pub fn run(sysfs: &std::path::Path, args: &BenchArgs) -> Result<()> {
    cleanup::on_signals()?;
    match &args.suite {
        Suite::Volume(args) => volume::run(sysfs, args),
        Suite::Age(args) => age::run(sysfs, args),
        Suite::Fs(args) => fs::run(sysfs, args),
        Suite::Nbd(args) => nbd::run(sysfs, args),
        Suite::Mount(args) => mount::run(sysfs, args),
        Suite::Cache(args) => cache::run(args),
        Suite::Preload(args) => preload::run(sysfs, args),
        Suite::Sim(args) => sim::run(args),
        Suite::Uring(args) => uring::run(args),
    }
}
