//! `locus fsck`: check a volume and report every problem.

use std::path::Path;

use anyhow::{Result, bail};
use clap::Args;

/// Check a volume without changing it, reporting every problem.
///
/// Checks the volume in the --volume directory: every device's superblock (each field by
/// name), that all devices belong to one volume with indexes 0..n-1 each once, and that
/// locus.toml lists them all. Reports every problem, not just the first; exits 1 if any.
/// (File-system checks join this when the file system exists.)
#[derive(Debug, Args)]
pub struct FsckArgs {
    /// Print the report as one JSON object.
    #[arg(long)]
    json: bool,
}

pub fn run(dir: &Path, args: &FsckArgs) -> Result<()> {
    let report = volume::check(dir)?;
    if args.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        println!(
            "volume {}: {} device(s)",
            dir.display(),
            report.devices.len()
        );
        for device in &report.devices {
            let index = device.index.map_or_else(|| "?".into(), |i| i.to_string());
            println!("  {index:>3}  {}  {}", device.path, device.status);
        }
        for warning in &report.warnings {
            println!("warning: {warning}");
        }
        for problem in &report.problems {
            println!("problem: {problem}");
        }
        if report.is_clean() {
            println!("clean");
        }
    }
    if !report.is_clean() {
        bail!(
            "{} problem(s) found in {}",
            report.problems.len(),
            dir.display()
        );
    }
    Ok(())
}
