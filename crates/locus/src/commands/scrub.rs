//! `locus scrub`: read every block of file data and check it against its data checksum.

use std::path::Path;
use std::time::Duration;

use anyhow::{Context, Result, bail};
use clap::Args;

use crate::output::outln;
use crate::size::format_bytes;

/// Read every block of file data on the volume and check its data checksum.
///
/// Every block of every file, and the buffers of logged writes not yet moved into them, are
/// read and checked against the crc32c kept for each (the file system must have data
/// checksums: `locus format --data-checksums`, or `locus tune --data-checksums on`).
/// Reports every damaged block by path, file offset and address, and exits 1 if there is
/// one. Nothing is written.
///
/// A volume nobody holds is read from the media by this command. A volume that `locus mount`
/// or `locus serve` holds is scrubbed by its server, beside its clients' requests, below
/// their priority: a file is read 256 KiB at a time while that part's writers wait (~60 µs),
/// so nothing else stops, and a block is only ever reported damaged when it is; data written
/// to a part of a file after the scrub passed it is not read. So is a volume a program holds
/// through the preload library: the library's control thread in that program scrubs it (and
/// stops if the program forks or exits). This command starts the holder's scrub (or joins
/// the one running), shows its progress and prints its report; interrupted, the holder's
/// scrub goes on to its end. Metadata damage is `locus fsck`'s to report, and stops the
/// scrub with the same message.
#[derive(Debug, Args)]
pub struct ScrubArgs {
    #[command(flatten)]
    pub volume: crate::commands::volume::VolumeDir,

    /// Print the report as one JSON object.
    #[arg(long)]
    json: bool,
}

/// How often the server's scrub is asked how far it is.
const POLL: Duration = Duration::from_millis(100);

/// Scrubs through the server that holds the volume: `ask` returns the status of the scrub
/// — its first answer that of the scrub it started or joined — and is polled until that
/// scrub ends.
fn through_server(
    server: &str,
    json: bool,
    ask: &mut dyn FnMut() -> Result<fs::ScrubStatus>,
) -> Result<fs::ScrubReport> {
    let started = ask()?;
    let spinner = crate::progress::spinner(format!("scrubbing file data through {server}"), !json);
    let mut status = started.clone();
    while status.running {
        spinner.set_message(format!(
            "scrubbing file data through {server}: {} of {} file(s), {}",
            status.files_done,
            status.files_total,
            format_bytes(status.blocks * 4096)
        ));
        std::thread::sleep(POLL);
        status = ask()?;
    }
    spinner.finish_and_clear();
    if status.id < started.id {
        bail!(
            "the scrub through {server} stopped before its end: the holder stopped answering \
             for the volume meanwhile and answers again now (a program through the preload \
             library stops its scrub when it forks, and answers again at its next file call); \
             run `locus scrub` again"
        );
    }
    if status.id != started.id {
        bail!(
            "another scrub started through {server} after scrub {} ended, and its report is gone; \
             run `locus scrub` again",
            started.id
        );
    }
    match (status.report, status.error) {
        (Some(report), _) => Ok(report),
        (None, Some(error)) => bail!("the scrub through {server} failed: {error}"),
        (None, None) => bail!("the scrub through {server} ended without a report"),
    }
}

/// The scrub file of a mount: each read of the open file is the status of its scrub.
fn scrub_file_status(file: &std::fs::File, path: &Path) -> Result<fs::ScrubStatus> {
    use std::os::unix::fs::FileExt;
    let mut bytes = Vec::new();
    let mut chunk = vec![0u8; 64 << 10];
    loop {
        let n = file
            .read_at(&mut chunk, bytes.len() as u64)
            .with_context(|| format!("reading {}", path.display()))?;
        if n == 0 {
            break;
        }
        bytes.extend_from_slice(&chunk[..n]);
    }
    serde_json::from_slice(&bytes)
        .with_context(|| format!("the scrub status in {}", path.display()))
}

/// A reply of the holder's control socket (`locus serve`, a program through the preload
/// library), as a scrub status.
fn control_status(reply: Option<Result<serde_json::Value>>) -> Result<fs::ScrubStatus> {
    let mut reply = reply.context(
        "the volume's holder stopped answering on its control socket (a program through the \
         preload library stops its scrub when it forks or exits)",
    )??;
    serde_json::from_value(reply["scrub"].take()).context("the server's scrub status")
}

fn report(dir: &Path, sysfs: &Path, args: &ScrubArgs) -> Result<(fs::ScrubReport, Option<String>)> {
    use crate::commands::serve::control;
    if let Some(served) = volume::find_served(dir) {
        let server = format!(
            "`locus mount` (pid {}) at {}",
            served.pid,
            served.mountpoint.display()
        );
        let path = served.mountpoint.join(mount::SCRUB_NAME);
        let file = std::fs::File::open(&path)
            .with_context(|| format!("asking the mount server (pid {}) to scrub", served.pid))?;
        let report = through_server(&server, args.json, &mut || {
            scrub_file_status(&file, &path).with_context(|| {
                format!(
                    "asking the mount server (pid {}) how the scrub goes (a server killed \
                     meanwhile: `umount -l {}`, then `locus mount` again recovers the volume)",
                    served.pid,
                    served.mountpoint.display()
                )
            })
        })?;
        return Ok((report, Some(server)));
    }
    if let Some(started) = control::ask_for(dir, control::SCRUB_REQUEST) {
        let mut started = Some(started);
        let server = control::ask(dir)
            .and_then(Result::ok)
            .map_or_else(|| "the volume's holder".to_owned(), |s| control::holder(&s));
        let report = through_server(&server, args.json, &mut || {
            control_status(
                started
                    .take()
                    .or_else(|| control::ask_for(dir, control::SCRUB_STATUS_REQUEST)),
            )
        })?;
        return Ok((report, Some(server)));
    }
    Ok((offline(dir, sysfs, args)?, None))
}

/// Scrubs the volume nobody holds, from the media.
fn offline(dir: &Path, sysfs: &Path, args: &ScrubArgs) -> Result<fs::ScrubReport> {
    let topology = super::volume::read_topology(sysfs)?;
    let volume = super::volume::open(dir, &topology, false)?;
    let spinner = crate::progress::spinner("scrubbing file data".to_owned(), !args.json);
    let report = fs::Fs::scrub(&volume)
        .with_context(|| format!("scrubbing the file system at {}", dir.display()))?;
    spinner.finish_and_clear();
    Ok(report)
}

pub fn run(dir: &Path, sysfs: &Path, args: &ScrubArgs) -> Result<()> {
    let (report, server) = report(dir, sysfs, args)?;
    if args.json {
        let mut json = serde_json::to_value(&report)?;
        if let Some(server) = &server {
            json["scrubbed_by"] = serde_json::Value::String(server.clone());
        }
        outln!("{}", serde_json::to_string_pretty(&json)?);
    } else {
        let by = server.map(|s| format!(" through {s}")).unwrap_or_default();
        outln!(
            "scrubbed {} file(s){by}: {} block(s), {}",
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
