//! `locus fsck`: check a volume and its file system, report every problem, and repair what
//! is safe to repair.

use std::path::Path;
use std::sync::Arc;

use anyhow::{Context, Result, bail};
use clap::Args;
use serde::Serialize;

use super::volume::FsState;

use crate::output::outln;

/// Check a volume and its file system, reporting every problem.
///
/// Checks the volume in the --volume directory: every device's superblock (each field by
/// name), that all devices belong to one volume with indexes 0..n-1 each once, and that
/// locus.toml lists them all. Then, if the volume is sound, its file system, without
/// changing anything: the root, the snapshot, every journal and log area (checksums,
/// sequence), the replay of their records, the directory tree, and that no memory is claimed
/// twice or lies outside the volume. Exits 1 if anything is wrong.
///
/// With --repair, a file system that checks clean is opened and closed: recovery replays
/// every logged write and journal record into the files and writes a fresh snapshot, which
/// also rewrites the older root copy. A damaged journal or log area (a record that fails its
/// checksum with whole records after it, a gap, a record that does not replay) is cut back
/// to what provably precedes the damage: the file system is kept as it was just before the
/// first damaged record, everything after it in any journal or log is dropped, and the
/// report names what was dropped, the files that lost writes, and the files at risk (whose
/// kept contents may name memory a dropped operation had freed). Damage to the root in use,
/// the snapshot or the volume is reported and not repaired: nothing could be kept without
/// guessing.
#[derive(Debug, Args)]
pub struct FsckArgs {
    #[command(flatten)]
    pub volume: crate::commands::volume::VolumeDir,

    /// Print the report as one JSON object.
    #[arg(long)]
    json: bool,

    /// Replay pending logs and journals into a fresh snapshot when the file system is sound.
    #[arg(long)]
    repair: bool,
}

#[derive(Debug, Serialize)]
struct Report {
    #[serde(flatten)]
    volume: volume::CheckReport,
    /// Absent when the volume itself has problems (the file system is not looked at then).
    fs: Option<FsState>,
    /// What --repair did.
    repaired: Option<String>,
    /// What --repair cut from damaged journals and logs.
    salvaged: Option<fs::SalvageReport>,
    /// Why --repair could not repair the damage.
    not_repaired: Option<String>,
}

pub fn run(dir: &Path, sysfs: &Path, args: &FsckArgs) -> Result<()> {
    if let Some(served) = volume::find_served(dir) {
        bail!(
            "volume {} is served by `locus mount` (pid {}) at {}: fsck needs the volume to \
             itself; unmount it first (`umount {}`), or see `locus status` for the live view",
            dir.display(),
            served.pid,
            served.mountpoint.display(),
            served.mountpoint.display()
        );
    }
    let volume_report = volume::check(dir)?;
    let mut report = Report {
        fs: None,
        repaired: None,
        salvaged: None,
        not_repaired: None,
        volume: volume_report,
    };
    if report.volume.is_clean() {
        let topology = super::volume::read_topology(sysfs)?;
        let volume = super::volume::open(dir, topology, false)?;
        let mut state = FsState::of(&volume);
        if args.repair && matches!(state, FsState::Damaged { .. }) {
            drop(volume);
            let volume = super::volume::open(dir, super::volume::read_topology(sysfs)?, false)?;
            match fs::Fs::salvage(&volume) {
                Ok(salvage) => {
                    drop(volume);
                    let volume =
                        super::volume::open(dir, super::volume::read_topology(sysfs)?, false)?;
                    let fs = fs::Fs::open(Arc::new(volume), fs::FsOptions::default())
                        .context("opening the file system cut back to before the damage")?;
                    fs.unmount().context("writing the repaired file system")?;
                    report.repaired = Some(format!(
                        "cut the journals and logs back to before the damage: dropped {} \
                         metadata operation(s) and {} logged write(s) ({} bytes); the rest is in \
                         a new snapshot",
                        salvage.dropped_journal_records,
                        salvage.dropped_writes,
                        salvage.dropped_write_bytes
                    ));
                    report.salvaged = Some(salvage);
                    let volume =
                        super::volume::open(dir, super::volume::read_topology(sysfs)?, false)?;
                    state = FsState::of(&volume);
                }
                Err(e) => report.not_repaired = Some(e.to_string()),
            }
        } else if args.repair
            && let FsState::Present(check) = &state
        {
            // The check marked the file system's memory owned; recovery wants a volume
            // that owns nothing yet.
            drop(volume);
            let volume = super::volume::open(dir, super::volume::read_topology(sysfs)?, false)?;
            let fs = fs::Fs::open(Arc::new(volume), fs::FsOptions::default())
                .context("opening the file system to repair it")?;
            fs.unmount().context("writing the repaired file system")?;
            report.repaired = Some(format!(
                "replayed {} logged write(s) and {} journal record(s) into a new snapshot{}",
                check.log_records,
                check.journal_records,
                if check.damaged_root_copy.is_some() {
                    "; the damaged root copy is rewritten"
                } else {
                    ""
                }
            ));
        }
        report.fs = Some(state);
    }
    let fs_damaged = matches!(report.fs, Some(FsState::Damaged { .. }));
    // A damaged spare root copy is media damage too, though harmless; repair rewrites it.
    let root_copy_damage = match &report.fs {
        Some(FsState::Present(check)) if report.repaired.is_none() => {
            check.damaged_root_copy.clone()
        }
        _ => None,
    };
    if args.json {
        outln!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        outln!(
            "volume {}: {} device(s)",
            dir.display(),
            report.volume.devices.len()
        );
        for device in &report.volume.devices {
            let index = device.index.map_or_else(|| "?".into(), |i| i.to_string());
            outln!("  {index:>3}  {}  {}", device.path, device.status);
        }
        for warning in &report.volume.warnings {
            outln!("warning: {warning}");
        }
        for problem in &report.volume.problems {
            outln!("problem: {problem}");
        }
        match &report.fs {
            Some(FsState::Damaged { error }) => outln!("problem: file system: {error}"),
            Some(state) => outln!("{}", state.describe()),
            None => outln!("file system: not checked (the volume has problems)"),
        }
        if let Some(salvage) = &report.salvaged {
            for damage in &salvage.damage {
                outln!("damaged: {damage}");
            }
        }
        if let Some(repaired) = &report.repaired {
            outln!("repaired: {repaired}");
        }
        if let Some(salvage) = &report.salvaged {
            if !salvage.files_losing_writes.is_empty() {
                outln!("writes lost in: {}", salvage.files_losing_writes.join(", "));
            }
            if salvage.unreadable_records > 0 {
                outln!(
                    "{} damaged record(s) dropped unread: what they did, and the files they \
                     touched, cannot be named",
                    salvage.unreadable_records
                );
            }
            if !salvage.files_at_risk.is_empty() {
                outln!(
                    "at risk (may hold data from memory a dropped operation freed; read \
                     them before trusting them): {}",
                    salvage.files_at_risk.join(", ")
                );
            }
        }
        if let Some(why) = &report.not_repaired {
            outln!("cannot repair: {why}");
        }
        if let Some(damage) = &root_copy_damage {
            outln!(
                "problem: file system: the root copy not in use is damaged ({damage}); \
                 `locus fsck --repair` rewrites it"
            );
        }
        if report.volume.is_clean() && !fs_damaged && root_copy_damage.is_none() {
            outln!("clean");
        }
    }
    if !report.volume.is_clean() {
        bail!(
            "{} problem(s) found in {}",
            report.volume.problems.len(),
            dir.display()
        );
    }
    if fs_damaged {
        bail!("the file system in {} is damaged", dir.display());
    }
    if root_copy_damage.is_some() {
        bail!(
            "a root copy of the file system in {} is damaged",
            dir.display()
        );
    }
    Ok(())
}
