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

use pmem::Region;

pub use handles::{Buffer, Buffers, File, Fs, Nameless, Space};
pub use mapped::MappedRun;
pub use options::{CheckpointMode, FormatOptions, FsOptions, OpenOptions};
pub(crate) use options::{check_format, check_options, check_slot_limit};
pub(crate) use state::*;
pub use state::{FsStats, ReplaySummary, ownable_slots, shared_slots};

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

/// Now, in nanoseconds since the epoch (0 before it): the time of writes and changes. Read
/// straight from the kernel's clock (the vDSO): `SystemTime::now().duration_since(UNIX_EPOCH)`
/// gave the same value for 39-42 ns a call here, this for 26-28. (A data write reads it while
/// its stores drain, see `write_at`, where either is hidden behind the fence; a write took
/// no measurably less time.)
///
/// Every time it hands out raises the floor of the coarse times data writes take
/// ([`write_time`]), so that no write's time is older than a time handed out before it.
pub(crate) fn now_ns() -> u64 {
    let now = clock_ns(rustix::time::ClockId::Realtime);
    FINE_FLOOR.fetch_max(now, Ordering::Relaxed);
    now
}

/// The latest time [`now_ns`] handed out.
static FINE_FLOOR: AtomicU64 = AtomicU64::new(0);

fn clock_ns(clock: rustix::time::ClockId) -> u64 {
    let now = rustix::time::clock_gettime(clock);
    u64::try_from(now.tv_sec).map_or(0, |s| {
        s.saturating_mul(1_000_000_000)
            .saturating_add(now.tv_nsec as u64)
    })
}

/// The time of a data write to `inode`: the kernel's coarse clock (its last tick, 4 ms apart
/// here) — raised to the latest fine time handed out — unless the file's times were looked
/// at since they last moved (`Inode::times_seen`), when it is the fine clock's. As the
/// kernel's file systems with multigrain timestamps do: a write after a `stat` always moves
/// the times on, and no write's time is older than a time handed out before it, on this
/// file or another; writes nobody looked at between them share a tick's time. Then a write
/// stores the file's times only when they move, once a tick: two writers of one file had
/// each taken the cache line of its times from the other on every write with two locked
/// instructions, 0.17-0.22 µs a write (`bench fs --bs 4K --threads 2`, three alternated
/// runs against a build that stored them once per 4 ms: 1.26-1.31 against 1.09 µs of the
/// writers' CPU a write).
pub(crate) fn write_time(inode: &crate::inode::Inode) -> u64 {
    if inode.times_seen.load(Ordering::Relaxed) {
        inode.times_seen.store(false, Ordering::Relaxed);
        return now_ns();
    }
    clock_ns(rustix::time::ClockId::RealtimeCoarse).max(FINE_FLOOR.load(Ordering::Relaxed))
}
