//! The file system: namespace, files, the write and read paths, and thread slots.
//!
//! Every operation is atomic and durable when it returns:
//! - a data write persists its data in a persistent buffer, then one 64-byte log record that
//!   points at it, in the calling thread's log area (no lock shared with other threads), and
//!   publishes the data in the file's overlay index;
//! - a metadata operation takes the directory locks it needs, logs one record in the calling
//!   thread's journal, and applies the change in DRAM.
//!
//! All records carry a place in one global order, taken while the locks that order dependent
//! operations are held; recovery merges every log and journal by it. The background
//! checkpoint (checkpoint.rs) later moves logged data into the files' extent maps.

mod checked;
mod handles;
mod lend;
mod mapped;
mod namespace;
mod options;
mod read;
mod state;
mod write;

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

use pmem::Region;

pub use handles::{Buffer, File, Fs};
pub use mapped::MappedRun;
pub use options::{CheckpointMode, FormatOptions, FsOptions, OpenOptions};
pub(crate) use options::{check_format, check_options};
pub(crate) use state::*;
pub use state::{FsStats, ReplaySummary};

/// Inode number of `/`.
pub const ROOT_INO: u64 = 1;
/// Largest single write or read (one log record).
pub const MAX_IO: u64 = 1 << 30;
/// Largest file size.
pub const MAX_FILE_SIZE: u64 = 1 << 50;
/// Range locks cover whole files up to here.
const WHOLE_FILE: u64 = 1 << 62;
/// Part of a file's byte range: its length, and where its bytes are in persistent memory
/// (region, offset) or `None` for a hole ([`Inner::pieces`]).
pub(crate) type Piece<'a> = (u64, Option<(&'a Region, u64)>);

/// Holes lent by [`File::read_with`] point here.
pub(crate) static ZEROS: [u8; 64 << 10] = [0; 64 << 10];

/// The latest fine-grained time [`now_ns`] handed out: a floor for [`write_time`]'s coarse
/// ones, so that no time given later is older than one given earlier.
static FINE_FLOOR: AtomicU64 = AtomicU64::new(0);

/// The time now, to the nanosecond (metadata operations, and writes whose file's times were
/// looked at).
pub(crate) fn now_ns() -> u64 {
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64);
    FINE_FLOOR.fetch_max(now, Ordering::Relaxed);
    now
}

/// A data write's time (its record's, and so the file's mtime and ctime), multigrain as
/// Linux stamps files since 6.13: the kernel's tick (a few milliseconds grained, and ~5% of
/// a 4 KiB write cheaper than the exact clock here) — unless `inode`'s times were looked at
/// since they last changed, when it is exact, so a program that saw a time always sees the
/// next write change it. Never older than a fine time handed out before (the floor), so
/// files written one after the other keep their order.
pub(crate) fn write_time(inode: &crate::inode::Inode) -> u64 {
    if inode.times_seen.load(Ordering::Relaxed) && inode.times_seen.swap(false, Ordering::AcqRel) {
        return now_ns();
    }
    match topology::realtime_coarse_ns() {
        Some(coarse) => coarse.max(FINE_FLOOR.load(Ordering::Relaxed)),
        None => now_ns(),
    }
}
