//! `locus fsck`: check a volume and its file system, report every problem, and repair what
//! is safe to repair.

use std::path::Path;
use std::sync::Arc;

use anyhow::{Context, Result, bail};
use clap::Args;
use fs::control::LiveCheck;
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
///
/// A volume that `locus mount`, `locus serve` or a program through the preload library holds
/// is checked by that process: it holds its writes (every request of a mount, every
/// export's changes, every locus call of the program) and its checkpoint while it reads the
/// media (milliseconds), so the report is what recovery would find at that moment, and
/// names the holder. --repair needs the volume to itself: it is refused, naming the holder
/// and what frees the volume.
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
    /// The `locus mount` server the check was made through (a mounted volume).
    #[serde(skip_serializing_if = "Option::is_none")]
    served_by: Option<ServedBy>,
    /// The process the check was made by (a volume `locus serve` or a program through the
    /// preload library holds): its `server` ("serve" or "preload"), `pid` and, for a
    /// program, its command line.
    #[serde(skip_serializing_if = "Option::is_none")]
    held_by: Option<serde_json::Value>,
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

impl Report {
    /// The report of a check, before any repair.
    fn of(volume: volume::CheckReport, fs: Option<FsState>) -> Self {
        Self {
            served_by: None,
            held_by: None,
            volume,
            fs,
            repaired: None,
            salvaged: None,
            not_repaired: None,
        }
    }
}

#[derive(Debug, Serialize)]
struct ServedBy {
    pid: u32,
    mountpoint: std::path::PathBuf,
}

/// The check a `locus mount` server makes of its own volume for `fsck` (the mount's
/// checker, run with no request in flight and the checkpoint held): the volume's devices as
/// `fsck` checks them, then the file system on a second, read-only view of the media —
/// exactly what recovery would find if the server died now. JSON, read back by [`run`].
pub fn live_check(dir: &Path, topology: &topology::Topology) -> Vec<u8> {
    serde_json::to_vec(&fs::control::check_held(dir, topology)).unwrap_or_default()
}

/// Checks a volume that `locus mount` holds, through its check file.
fn through_mount(dir: &Path, served: &volume::Served, args: &FsckArgs) -> Result<Report> {
    if args.repair {
        bail!(
            "volume {} is served by `locus mount` (pid {}) at {}: --repair needs the volume \
             to itself; unmount it first (`umount {}`). Without --repair, fsck checks it \
             through the mount",
            dir.display(),
            served.pid,
            served.mountpoint.display(),
            served.mountpoint.display()
        );
    }
    let file = served.mountpoint.join(mount::CHECK_NAME);
    let bytes = std::fs::read(&file).with_context(|| {
        format!(
            "asking the mount server (pid {}) for a check through {}",
            served.pid,
            file.display()
        )
    })?;
    let live: LiveCheck = serde_json::from_slice(&bytes)
        .with_context(|| format!("the mount server's check in {}", file.display()))?;
    match live {
        LiveCheck::Checked { volume, fs } => Ok(Report {
            served_by: Some(ServedBy {
                pid: served.pid,
                mountpoint: served.mountpoint.clone(),
            }),
            ..Report::of(volume, fs.map(|fs| *fs))
        }),
        LiveCheck::Failed(why) => bail!(
            "the mount server (pid {}) could not check volume {}: {why}",
            served.pid,
            dir.display()
        ),
    }
}

/// Checks a volume that `locus serve` or a program through the preload library holds
/// (`status` is what it answered on the control socket): the holder stops its own I/O and
/// checks it.
fn through_holder(dir: &Path, status: &serde_json::Value, args: &FsckArgs) -> Result<Report> {
    use super::serve::control;
    let held_by = control::held_by(status);
    if args.repair {
        bail!(
            "volume {} is {held_by}: --repair needs the volume to itself; {}, and run fsck \
             --repair again. Without --repair, fsck checks it through its holder",
            dir.display(),
            control::how_to_stop(status)
        );
    }
    let answer = match control::ask_for(dir, control::CHECK_REQUEST) {
        Some(Ok(answer)) => answer,
        Some(Err(e)) => bail!(
            "volume {} is {held_by}, which could not check it ({e:#}); {} for fsck to open \
             the volume itself",
            dir.display(),
            control::how_to_stop(status)
        ),
        None => bail!(
            "volume {} was {held_by}, which stopped answering on its control socket; run \
             fsck again",
            dir.display()
        ),
    };
    let live: LiveCheck = serde_json::from_value(answer)
        .with_context(|| format!("the check of volume {} by its holder", dir.display()))?;
    match live {
        LiveCheck::Checked { volume, fs } => Ok(Report {
            held_by: Some(serde_json::json!({
                "server": status["server"],
                "pid": status["server_pid"],
                "program": status["program"],
            })),
            ..Report::of(volume, fs.map(|fs| *fs))
        }),
        LiveCheck::Failed(why) => bail!(
            "volume {} is {held_by}, which could not check it: {why}",
            dir.display()
        ),
    }
}

pub fn run(dir: &Path, sysfs: &Path, args: &FsckArgs) -> Result<()> {
    let mut report = if let Some(served) = volume::find_served(dir) {
        through_mount(dir, &served, args)?
    } else if let Some(Ok(live)) = super::serve::control::ask(dir) {
        through_holder(dir, &live, args)?
    } else {
        Report::of(
            super::volume::after_stopping_server(dir, || volume::check(dir))?,
            None,
        )
    };
    if report.served_by.is_none() && report.held_by.is_none() && report.volume.is_clean() {
        let topology = super::volume::read_topology(sysfs)?;
        let volume = super::volume::open(dir, &topology, false)?;
        let mut state = FsState::of(&volume);
        if args.repair && matches!(state, FsState::Damaged { .. }) {
            drop(volume);
            let volume = super::volume::open(dir, &super::volume::read_topology(sysfs)?, false)?;
            match fs::Fs::salvage(&volume) {
                Ok(salvage) => {
                    drop(volume);
                    let volume =
                        super::volume::open(dir, &super::volume::read_topology(sysfs)?, false)?;
                    let fs = fs::Fs::open(Arc::new(volume), checking_options())
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
                        super::volume::open(dir, &super::volume::read_topology(sysfs)?, false)?;
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
            let volume = super::volume::open(dir, &super::volume::read_topology(sysfs)?, false)?;
            let fs = fs::Fs::open(Arc::new(volume), checking_options())
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
        if let Some(served) = &report.served_by {
            outln!(
                "checked through `locus mount` (pid {}) at {}, its requests held while the \
                 media were read",
                served.pid,
                served.mountpoint.display()
            );
        }
        if let Some(holder) = &report.held_by {
            let status = serde_json::json!({
                "server": holder["server"],
                "server_pid": holder["pid"],
                "program": holder["program"],
            });
            outln!(
                "checked by {}, its writes held while the media were read",
                super::serve::control::holder(&status)
            );
        }
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
            Some(state) => outln!("{}", super::volume::describe_fs(state)),
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

/// A check opens the file system only to look at it: no idle-time rewrites.
fn checking_options() -> fs::FsOptions {
    fs::FsOptions {
        defrag: false,
        // A repair folds what it replayed into a new snapshot, whatever its size.
        fold_at_unmount: true,
        ..fs::FsOptions::default()
    }
}
