//! `locus scrub`: read every block of file data and check it against its data checksum.

use std::path::Path;

use anyhow::{Context, Result, bail};
use clap::Args;

use crate::output::outln;
use crate::size::format_bytes;

/// Read every block of file data on the volume and check its data checksum.
///
/// Reads the file system in the --volume directory without changing anything: every block
/// of every file, and the buffers of logged writes not yet moved into their files, each
/// checked against the crc32c kept for it (the file system must have been formatted with
/// `locus format --data-checksums`). Reports every damaged block by path, file offset and
/// address, and exits 1 if there is one. The volume must not be in use (`locus serve` or a
/// program through the preload library holds it); metadata damage is `locus fsck`'s to
/// report, and stops the scrub with the same message.
#[derive(Debug, Args)]
pub struct ScrubArgs {
    #[command(flatten)]
    pub volume: crate::commands::volume::VolumeDir,

    /// Print the report as one JSON object.
    #[arg(long)]
    json: bool,
}

pub fn run(dir: &Path, sysfs: &Path, args: &ScrubArgs) -> Result<()> {
    let topology = super::volume::read_topology(sysfs)?;
    let volume = super::volume::open(dir, &topology, false)?;
    let spinner = crate::progress::spinner("scrubbing file data".to_owned(), !args.json);
    let report = fs::Fs::scrub(&volume)
        .with_context(|| format!("scrubbing the file system at {}", dir.display()))?;
    spinner.finish_and_clear();
    if args.json {
        outln!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        outln!(
            "scrubbed {} file(s): {} block(s), {}",
            report.files,
            report.blocks,
            format_bytes(report.blocks * 4096)
        );
        for bad in &report.damaged {
            outln!(
                "damaged: {} bytes {}..{} ({}, block at {})",
                bad.path,
                bad.offset,
                bad.offset + bad.len,
                bad.held_by,
                bad.address
            );
        }
        if report.damaged.is_empty() {
            outln!("clean");
        }
    }
    if !report.damaged.is_empty() {
        bail!(
            "{} damaged block(s) in {}",
            report.damaged.len(),
            dir.display()
        );
    }
    Ok(())
}
