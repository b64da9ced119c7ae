//! `locus bench`: measurements printed as numbers, one suite per file.

pub mod fs;
pub mod nbd;
pub mod sim;
pub mod uring;
pub mod volume;

use anyhow::Result;
use clap::{Args, Subcommand};

/// Measure locus on this machine and print the numbers (tables, or JSON with --json).
#[derive(Debug, Args)]
pub struct BenchArgs {
    #[command(subcommand)]
    suite: Suite,
}

#[derive(Debug, Subcommand)]
enum Suite {
    Volume(volume::VolumeBenchArgs),
    Fs(fs::FsBenchArgs),
    Nbd(nbd::NbdBenchArgs),
    Sim(sim::SimBenchArgs),
    Uring(uring::UringBenchArgs),
}

pub fn run(sysfs: &std::path::Path, args: &BenchArgs) -> Result<()> {
    match &args.suite {
        Suite::Volume(args) => volume::run(sysfs, args),
        Suite::Fs(args) => fs::run(sysfs, args),
        Suite::Nbd(args) => nbd::run(args),
        Suite::Sim(args) => sim::run(args),
        Suite::Uring(args) => uring::run(args),
    }
}
