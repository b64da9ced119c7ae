//! `locus tune`: change settings `locus format` chose, keeping the volume's files.

use std::path::Path;

use anyhow::{Context, Result};
use clap::Args;

use crate::output::outln;
use crate::size::format_bytes;

/// Change settings of the volume's file system that `locus format` chose, keeping its files.
///
/// The volume in the --volume directory must not be in use (`locus mount`, `locus serve` or a
/// program through the preload library holds it: stop it first). The file system must load
/// as it would at a mount — a damaged one is refused; `locus fsck` reports the damage and
/// `fsck --repair` repairs what it can. Every setting given is checked before any is
/// changed, and all change in one new file-system root, written the way every root change is
/// (into the copy not in use, then persisted), so a crash leaves them all as they were or all
/// changed, and every file as it was.
#[derive(Debug, Args)]
pub struct TuneArgs {
    #[command(flatten)]
    pub volume: crate::commands::volume::VolumeDir,

    /// Thread slots the file system may have, 2 to 120 (`locus format --thread-slots`):
    /// raise it when more threads change the file system at once than slots a thread may
    /// own (the limit less its top eighth and the checkpoint's slot), e.g. a `locus mount`
    /// on a machine with more CPUs, so that each owns one instead of taking turns on the
    /// shared ones. It may go down to the number of slots that have their areas already
    /// (`locus status` shows it); lowering it bounds the memory slots may take.
    #[arg(long, value_name = "N", required_unless_present = "data_checksums",
          value_parser = clap::value_parser!(u32).range(2..=i64::from(fs::MAX_SLOTS)))]
    thread_slots: Option<u32>,

    /// Data checksums (`locus format --data-checksums`: a crc32c of every 4 KiB block of file
    /// data, verified on every read and by `locus scrub`), on or off. On reads every block of
    /// data the files hold — a full read of the volume's data — and gives it its entry from
    /// the bytes it holds now (damage already there is blessed, not found: check what matters
    /// first); the tables take 0.1% of each device, and the volume must keep the checkpoint's
    /// reserve free beyond them. Off forgets the tables (free memory at the next open); the
    /// costs and the refusal of shared mappings go with them.
    #[arg(long, value_name = "on|off", value_parser = ["on", "off"])]
    data_checksums: Option<String>,
}

pub fn run(dir: &Path, sysfs: &Path, args: &TuneArgs) -> Result<()> {
    let topology = super::volume::read_topology(sysfs)?;
    let volume = super::volume::open(dir, &topology, false)?;
    let tune = fs::Tune {
        slot_limit: args.thread_slots,
        data_checksums: args.data_checksums.as_deref().map(|state| state == "on"),
    };
    let spinner = crate::progress::spinner(
        if tune.data_checksums == Some(true) {
            "giving every block of data its checksum"
        } else {
            "changing the file system's root"
        }
        .to_owned(),
        true,
    );
    let tuned =
        fs::Fs::tune(&volume, &tune).with_context(|| format!("tuning {}", dir.display()))?;
    spinner.finish_and_clear();
    if let Some(change) = tuned.slots {
        let after = u64::from(change.after);
        let now = format!(
            "{after} ({} a thread may own, the rest shared); {} made so far",
            fs::ownable_slots(after),
            change.made
        );
        if change.before == change.after {
            outln!("thread slots: already {now}");
        } else {
            outln!("thread slots: {} -> {now}", change.before);
        }
    }
    if let Some(change) = tuned.checksums {
        let said = match (change.before, change.after) {
            (false, true) => format!(
                "off -> on ({} block(s) of data given their entry, {} of tables); `locus \
                 scrub` checks them",
                change.blocks,
                format_bytes(change.table_bytes)
            ),
            (true, false) => "on -> off (the tables are free memory at the next open)".into(),
            (_, true) => "already on".into(),
            (_, false) => "already off".into(),
        };
        outln!("data checksums: {said}");
    }
    Ok(())
}
