//! The state an open file system shares between threads (`Inner`), its thread slots and
//! their leases, counters; addresses, space and waiting on the checkpoint.

use std::cell::RefCell;
use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{
    Arc, Condvar, Mutex, MutexGuard, OnceLock, RwLock, RwLockReadGuard, RwLockWriteGuard, Weak,
};

use pmem::Region;
use volume::{Extent, GlobalAddress, Volume};

use super::options::FsOptions;
use crate::buffers::{Pool, Recycled};
use crate::checksums::Checksums;
use crate::error::{FsError, Result};
use crate::extent_map::BLOCK;
use crate::inode::Inode;
use crate::journal::{Journal, Kind, MetaOp};
use crate::lock_order::{
    FS_BATCH, FS_GATE, FS_JOURNAL, FS_LOG, FS_RANGE, FS_RENAME, FS_TABLE, Ordered,
};
use crate::log::{Confirmer, LogArea};
use crate::progress::{Pending, Progress, Queue};
use crate::range_lock::{LockMode, RangeGuard, RangeLocks};
use crate::root::{Root, SlotAreas};
use crate::snapshot::{INODE_BYTES, RUN_BYTES, entry_bytes, write_growth_bound};

/// Counters of one slot, on its own cache lines.
#[derive(Debug, Default)]
#[repr(align(128))]
pub(crate) struct SlotCounters {
    pub(crate) caller_bytes: AtomicU64,
    pub(crate) media_bytes: AtomicU64,
    pub(crate) writes: AtomicU64,
    /// Blocks of writes placed in recycled pages.
    recycled: AtomicU64,
    /// What the slot's logged writes may add to the metadata ([`write_growth_bound`] of
    /// each) until the checkpoint moves them: the writer adds to `growth_logged` what it
    /// logs, the checkpoint (under the batch lock) to `growth_moved` what it moved — per
    /// slot, so that writers never share the counters' cache line, and each stored by one
    /// thread at a time, so neither needs a locked instruction.
    growth_logged: AtomicU64,
    growth_moved: AtomicU64,
    /// Single-block overwrites the slot's writer remapped itself: all of them, and those of
    /// them whose page came from a pool buffer rather than the recycled lists (stored by the
    /// writer); all of them the checkpoint has since applied, and how many pool-page remaps
    /// it allows the writer (stored by the checkpoint). See [`SlotCounters::remap_room`].
    remaps: AtomicU64,
    pool_remaps: AtomicU64,
    remaps_applied: AtomicU64,
    pool_remaps_allowed: AtomicU64,
    /// The last sequence of the slot's newest write whose append returned (its data whole):
    /// what [`Inner::confirm_logs`] may confirm. Stored by the writer.
    completed: AtomicU64,
}

impl SlotCounters {
    /// Counts `bytes` written to the media through this slot.
    pub(crate) fn count_media(&self, bytes: u64) {
        add_own(&self.media_bytes, bytes);
    }

    /// Counts a caller's write of `bytes`.
    pub(crate) fn count_write(&self, bytes: u64) {
        add_own(&self.writes, 1);
        add_own(&self.caller_bytes, bytes);
    }

    /// Counts `blocks` blocks of a write placed in recycled pages.
    pub(crate) fn count_recycled(&self, blocks: u64) {
        add_own(&self.recycled, blocks);
    }

    /// The slot's writer logged records that may add `bytes` to the metadata.
    pub(crate) fn log_growth(&self, bytes: u64) {
        add_own(&self.growth_logged, bytes);
    }

    /// The checkpoint moved records whose growth [`SlotCounters::log_growth`] counted as
    /// `bytes`.
    pub(crate) fn move_growth(&self, bytes: u64) {
        add_own(&self.growth_moved, bytes);
    }

    /// What the slot's logged, unmoved records may still add to the metadata. The count
    /// moved is read first: a batch that finishes meanwhile can make the figure high, never
    /// low (it bounds a reserve).
    pub(crate) fn pending_growth(&self) -> u64 {
        let moved = self.growth_moved.load(Ordering::Acquire);
        self.growth_logged
            .load(Ordering::Acquire)
            .saturating_sub(moved)
    }

    /// Whether the writer may remap a single-block overwrite itself: always into a page from
    /// the recycled lists, into a pool page only within what the checkpoint allowed.
    ///
    /// Every block a writer remaps frees the block it replaces into the recycled lists when
    /// the checkpoint applies it, and what the lists cannot take goes back to the volume as a
    /// 4 KiB hole. A page taken from the lists makes the room its own free needs; a pool page
    /// does not, so those remaps are counted against room the checkpoint set aside. (Allowed
    /// by a flag alone, set when a batch found room, writers far ahead of the checkpoint — an
    /// on-demand one, or a background one short of CPU — remapped thousands of pool pages a
    /// batch into lists with room for a thousand, and the overflow cut the volume's free
    /// memory into pages.) A caller's lent buffer ([`crate::Fs::buffer`]) counts as a pool
    /// page even when it came from the lists: nothing records where it came from, and
    /// counting it is only the safe side (what the allowance refuses, the checkpoint remaps
    /// within the room such a page made when it was taken).
    pub(crate) fn may_remap(&self, pool_page: bool) -> bool {
        !pool_page
            || self.pool_remaps.load(Ordering::Relaxed)
                < self.pool_remaps_allowed.load(Ordering::Relaxed)
    }

    /// The writer remapped a block itself (after [`SlotCounters::may_remap`]).
    pub(crate) fn count_remap(&self, pool_page: bool) {
        add_own(&self.remaps, 1);
        if pool_page {
            add_own(&self.pool_remaps, 1);
        }
    }

    /// Room in the recycled lists this slot's writer holds: a free to come for each block it
    /// remapped that the checkpoint has not applied, and a page for each pool-page remap
    /// allowed and not yet made. A writer remapping meanwhile can make the figure one low.
    pub(crate) fn remap_room(&self) -> u64 {
        let unused = self
            .pool_remaps_allowed
            .load(Ordering::Relaxed)
            .saturating_sub(self.pool_remaps.load(Ordering::Acquire));
        self.remaps_owed() + unused
    }

    /// Blocks the writer remapped that the checkpoint has not applied: each frees a block
    /// into the recycled lists when it is.
    pub(crate) fn remaps_owed(&self) -> u64 {
        let applied = self.remaps_applied.load(Ordering::Relaxed);
        self.remaps.load(Ordering::Acquire).saturating_sub(applied)
    }

    /// The checkpoint applied `n` more of the blocks the writer remapped.
    pub(crate) fn apply_remaps(&self, n: u64) {
        add_own(&self.remaps_applied, n);
    }

    /// The writer's append of records through `sequence` returned (a writer of the slot
    /// stores it, after its fence).
    pub(crate) fn complete(&self, sequence: u64) {
        self.completed.store(sequence, Ordering::Release);
    }

    /// The last sequence of the newest write whose append returned.
    pub(crate) fn completed(&self) -> u64 {
        self.completed.load(Ordering::Acquire)
    }

    /// The checkpoint allows the writer `pages` more pool-page remaps from now on (and takes
    /// back what it allowed before and the writer did not use).
    pub(crate) fn allow_pool_remaps(&self, pages: u64) {
        let made = self.pool_remaps.load(Ordering::Acquire);
        self.pool_remaps_allowed
            .store(made + pages, Ordering::Release);
    }
}

/// Adds `n` to a counter only one thread at a time stores to (the thread using its slot,
/// handed over under the lease's or the turn's lock; the checkpoint, under the batch lock),
/// so a load and a store do it, with no locked instruction (a 4 KiB write made five locked
/// adds to these, each waiting for the stores before it to drain). Readers see each store
/// whole.
fn add_own(counter: &AtomicU64, n: u64) {
    counter.store(counter.load(Ordering::Relaxed) + n, Ordering::Release);
}

/// One thread slot: a data log area, a metadata journal, a pool of preliminary buffers.
#[derive(Debug)]
pub(crate) struct Slot {
    pub(crate) index: u32,
    pub(crate) log: Mutex<LogArea>,
    pub(crate) retired: Arc<AtomicU64>,
    pub(crate) journal: Mutex<Journal>,
    /// Its writes waiting for the checkpoint, and its writer's bound.
    pub(crate) queue: Queue,
    pub(crate) pool: Mutex<Pool>,
    pub(crate) counters: SlotCounters,
    /// Stores the log area's confirmation word ([`Inner::confirm_logs`]), apart from the
    /// area's lock.
    pub(crate) confirmer: Confirmer,
    /// The sequence the confirmation word holds (stored only under
    /// [`Inner::confirm_logs`]'s lock).
    pub(crate) confirmed: AtomicU64,
    /// For a shared slot ([`Inner::first_shared_slot`]): whether a thread is using it for an
    /// operation now, and where threads waiting for their turn sleep. Unused by owned slots.
    turn: Mutex<bool>,
    turn_over: Condvar,
}

/// Everything an open file system shares between threads.
#[derive(Debug)]
pub(crate) struct Inner {
    pub(crate) id: u64,
    pub(crate) volume: Arc<Volume>,
    pub(crate) devices: Vec<Region>,
    pub(crate) owner: Region,
    pub(crate) root: Mutex<Root>,
    /// The pieces of the current snapshot when the root names an index (else empty); freed
    /// with it when the next snapshot is durable.
    pub(crate) snapshot_pieces: Mutex<Vec<Extent>>,
    /// Length of the current snapshot, for the writers' reserve.
    pub(crate) snapshot_bytes: AtomicU64,
    /// How much larger than the current snapshot the next may be: the metadata added since
    /// it was written, counted as it is added ([`Inner::grow_snapshot`]).
    pub(crate) snapshot_growth: AtomicU64,
    /// The global order when the file system was opened: an unmount that finds it unmoved
    /// (and every journal sealed, no snapshot owed) has nothing to write
    /// ([`Inner::unchanged_since_sealed`]).
    pub(crate) opened_at_order: u64,
    /// The media lag behind DRAM in something no journal holds — a read moved an access
    /// time ([`Inner::accessed`]), or the root's other copy is damaged and only a root
    /// update rewrites it — so the unmount's snapshot is owed even when nothing was ordered.
    /// Cleared when a snapshot starts.
    pub(crate) snapshot_owed: AtomicBool,
    /// The inodes whose access time a read moved since the last snapshot (once each while
    /// it stays ahead of their other times): an unmount that keeps the journals records
    /// their times there instead of writing a snapshot for them. Cleared when a snapshot
    /// starts.
    pub(crate) accessed_since_snapshot: Mutex<Vec<u64>>,
    /// The root's other copy was damaged when the file system was opened: the unmount
    /// writes a snapshot (whose root update rewrites it) rather than keep the journals.
    pub(crate) damaged_root_copy: bool,
    pub(crate) options: FsOptions,
    pub(crate) inodes: RwLock<crate::inode::InodeTable>,
    pub(crate) next_ino: AtomicU64,
    /// Set once the file system holds (or held, since it was opened) a symbolic link: until
    /// then no path can meet one, and callers skip looking.
    pub(crate) symlinks: AtomicBool,
    /// The global order, and the protocol between writers and the checkpoint.
    pub(crate) progress: Progress,
    /// Metadata operations hold it shared; a snapshot holds it exclusively.
    pub(crate) gate: RwLock<()>,
    pub(crate) rename: Mutex<()>,
    /// Held by a checkpoint batch from its first change to its commit, and by truncation:
    /// a truncation must not free blocks a batch mapped but has not committed.
    pub(crate) batch: Mutex<()>,
    pub(crate) slots: Vec<OnceLock<Arc<Slot>>>,
    pub(crate) slot_in_use: Mutex<Vec<bool>>,
    /// Leases ended so far: a thread taking turns on the shared slots looks for one to own
    /// again when this moved ([`Inner::slot`]).
    pub(crate) lease_ends: AtomicU64,
    /// Slots of threads that wrote after their thread-locals were destroyed, by thread.
    pub(crate) exiting: Mutex<HashMap<std::path::PathBuf, Arc<Slot>>>,
    pub(crate) counters: FsCounters,
    /// The data-checksum tables, when the file system has them.
    pub(crate) checksums: Option<Checksums>,
    /// What recovery replayed at open.
    pub(crate) replayed: ReplaySummary,
    /// With data checksums: fresh pages the checkpoint will need for the partial blocks of
    /// logged writes (it builds them anew instead of copying in place), in bytes — counted
    /// when a write is logged so that the writers' reserve covers them.
    pub(crate) pending_pages: AtomicU64,
    /// Blocks overwrites replaced, kept for single-block writes.
    pub(crate) recycled: Recycled,
    /// Whether writers may remap single-block overwrites into their files themselves
    /// (`Inner::writer_remaps`): set by the checkpoint for each batch, while spare memory is
    /// not tight. Into pool pages only as far as each slot is allowed
    /// ([`SlotCounters::may_remap`]).
    pub(crate) writers_remap: AtomicBool,
    /// Blocks cut from files (holes punched, truncations) that writers' remaps logged
    /// before them may still name ([`crate::checkpoint::Cuts`]).
    pub(crate) cuts: crate::checkpoint::Cuts,
    /// The range locks of every file.
    pub(crate) range_locks: RangeLocks,
    /// Held by the checkpoint through each pass (everything it writes to the media), and
    /// by [`crate::Fs::quiesced`] to keep it between passes.
    pub(crate) checkpoint_hold: Mutex<()>,
    /// Held by [`Inner::confirm_logs`], whose callers (the checkpoint, a cut freeing
    /// blocks) may run at once.
    pub(crate) confirming: Mutex<()>,
    /// Windows of files to defragment when idle ([`crate::defrag`]).
    pub(crate) defrag: crate::defrag::Defrag,
}

#[derive(Debug, Default)]
pub(crate) struct FsCounters {
    pub(crate) checkpoint_batches: AtomicU64,
    pub(crate) checkpointed_records: AtomicU64,
    pub(crate) remapped_blocks: AtomicU64,
    pub(crate) writer_remapped_blocks: AtomicU64,
    pub(crate) copied_bytes: AtomicU64,
    pub(crate) unrecycled_blocks: AtomicU64,
    pub(crate) metadata_bytes: AtomicU64,
    pub(crate) snapshots: AtomicU64,
    /// How long snapshots held metadata operations off (the gate held exclusively), in
    /// nanoseconds: the last one's, the longest one's, and all of them together.
    pub(crate) snapshot_pause_last_ns: AtomicU64,
    pub(crate) snapshot_pause_max_ns: AtomicU64,
    pub(crate) snapshot_pause_total_ns: AtomicU64,
    /// 2 MiB windows of files rewritten into one extent ([`crate::defrag`]).
    pub(crate) defragmented_windows: AtomicU64,
    /// Writers' waits for the checkpoint, by [`Wait`] reason.
    pub(crate) waits: [AtomicU64; Wait::COUNT],
    /// Times a writer far ahead of the checkpoint gave up its time slice to it.
    pub(crate) gave_way: AtomicU64,
    /// Operations done on a turn on a shared slot, and how many of those waited for it.
    pub(crate) turns: AtomicU64,
    pub(crate) turn_waits: AtomicU64,
    /// The checkpoint thread's CPU time, as of its last pass.
    pub(crate) checkpoint_cpu_ns: AtomicU64,
    /// The checkpoint thread's nice value and how many steps below its opener's that is,
    /// once it has set its priority.
    pub(crate) checkpoint_priority: OnceLock<(i32, u32)>,
    /// Thread slots made, and the volume memory their log areas and journals hold.
    pub(crate) slots: AtomicU64,
    pub(crate) slot_bytes: AtomicU64,
}

/// Why a writer waits for the checkpoint.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Wait {
    /// Its slot's log area has no free record slot.
    Log,
    /// Its preliminary buffers are all full of records not yet retired.
    Buffers,
    /// The volume has no memory for it until the checkpoint frees some.
    Space,
    /// A metadata journal is full until the checkpoint writes a snapshot.
    Journal,
}

impl Wait {
    const COUNT: usize = 4;
}

/// A point-in-time view of the file system's counters.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct FsStats {
    /// Bytes callers asked to write.
    pub caller_bytes: u64,
    /// Bytes stored to persistent memory for them: data copied into buffers, log records,
    /// checkpoint copies, journal records and snapshots.
    pub media_bytes: u64,
    /// `media_bytes / caller_bytes` (0 before any write).
    pub write_amplification: f64,
    /// Writes logged.
    pub writes: u64,
    /// Logged writes not yet moved into their files.
    pub records_pending: u64,
    /// Nothing left to do in the background: no logged write waiting for the checkpoint and
    /// no window waiting for the defragmenter to look at it. (What waits for tools that
    /// must not overlap that work, e.g. a benchmark's next timed run.)
    pub idle: bool,
    /// Operations logged since the oldest record the checkpoint has not finished.
    pub checkpoint_lag: u64,
    /// Checkpoint batches committed.
    pub checkpoint_batches: u64,
    /// Records moved into files.
    pub checkpointed_records: u64,
    /// Blocks the checkpoint remapped (no copy).
    pub remapped_blocks: u64,
    /// Of those, blocks their writers had remapped into the file themselves (single-block
    /// overwrites in chunks shared with the writers): the checkpoint only recorded them.
    pub writer_remapped_blocks: u64,
    /// Bytes the checkpoint copied (partial blocks).
    pub copied_bytes: u64,
    /// Blocks of writes placed in pages an earlier overwrite had freed (no allocation).
    pub recycled_blocks: u64,
    /// Blocks that remapped writes replaced (freed in runs shorter than 64 KiB) which the
    /// recycled lists had no room for: returned to the volume as small pieces. Overwrites
    /// are remapped only within the lists' room, so this stays near zero except with data
    /// checksums (whose partial writes are always rebuilt in fresh blocks); a count that
    /// keeps growing means the volume's free memory is being cut into pages.
    pub unrecycled_blocks: u64,
    /// Snapshots written.
    pub snapshots: u64,
    /// Bytes of the newest snapshot (what the next one will cost, about).
    pub snapshot_bytes: u64,
    /// How long the last snapshot held every metadata operation off, in nanoseconds: a
    /// snapshot is encoded and written while the file system's metadata gate is held
    /// (writes are still logged meanwhile; the checkpoint moves them into their files once
    /// the snapshot is done).
    pub snapshot_pause_last_ns: u64,
    /// The longest such pause since the file system was opened.
    pub snapshot_pause_max_ns: u64,
    /// All such pauses since it was opened, together.
    pub snapshot_pause_total_ns: u64,
    /// 2 MiB windows of files that small overwrites had scattered, rewritten into one
    /// extent while the file system was idle (their bytes count in `media_bytes`).
    pub defragmented_windows: u64,
    /// ... of which reads earned the rewrite: read scattered, a window's size of them.
    pub defragmented_for_reads: u64,
    /// Windows noted for that and not yet looked at.
    pub defrag_windows_noted: u64,
    /// Windows put off until callers have written more (the rewrites' budget is 1/20 of
    /// what they wrote), reads earn them a rewrite, or a free 2 MiB extent may exist again.
    pub defrag_windows_deferred: u64,
    /// Times a writer waited for the checkpoint (backpressure): the sum of the four below.
    pub backpressure_waits: u64,
    /// ... because its thread's log area had no free record slot (the checkpoint retires
    /// records slower than the thread logs them).
    pub waits_for_log: u64,
    /// ... because its thread's preliminary buffers were all full of records not yet
    /// retired (buffers are reused only when every write in them is checkpointed).
    pub waits_for_buffers: u64,
    /// ... because the volume had no free memory for it until the checkpoint freed some.
    pub waits_for_space: u64,
    /// ... because a metadata journal was full until the checkpoint wrote a snapshot.
    pub waits_for_journal: u64,
    /// Times a writer found the background checkpoint more than 4096 records behind and
    /// gave up the rest of its time slice (`sched_yield`) so that the checkpoint, if it
    /// waited for a CPU, ran: what keeps the backlog small where writers and the checkpoint
    /// share too few CPUs and the checkpoint's priority could not be raised.
    pub writer_give_ways: u64,
    /// CPU time the checkpoint thread has used (as of its last pass), in nanoseconds: with
    /// `checkpointed_records`, what moving a write costs.
    pub checkpoint_cpu_ns: u64,
    /// The checkpoint thread's nice value (`None` until the thread has started).
    pub checkpoint_nice: Option<i32>,
    /// How many steps below the nice value of the thread that opened the file system that
    /// is: `FsOptions::checkpoint_boost` when the process may lower nice values, fewer (0)
    /// when it may not.
    pub checkpoint_priority_raised: u32,
    /// Files and directories.
    pub inodes: u64,
    /// Thread slots made: one for the checkpoint and one for each thread that has used the
    /// file system while as many others held theirs. A slot's log area and journal stay
    /// the file system's once made (the next thread to come reuses them), so they are
    /// memory that `statfs` does not count free.
    pub slots: u64,
    /// The volume memory those log areas and journals hold.
    pub slot_bytes: u64,
    /// Thread slots the file system may have ([`crate::FormatOptions::slot_limit`]).
    pub slot_limit: u64,
    /// Operations done on a turn on a shared slot: by threads that found every slot a
    /// thread may own owned by another live thread. Many mean the limit is low for the
    /// threads at work (`locus tune --thread-slots` raises it).
    pub slot_turns: u64,
    /// How many of those turns waited for another thread's turn to end.
    pub slot_turn_waits: u64,
    /// Volume memory writers leave free for the checkpoint (its snapshots and the pages
    /// under partial writes into holes): a write needs free memory beyond this.
    pub reserved_bytes: u64,
}

static NEXT_FS_ID: AtomicU64 = AtomicU64::new(1);

/// The fewest records a writer's log area is made with when free memory is in pieces
/// smaller than the format's size ([`Inner::alloc_area`]).
const MIN_SLOT_LOG_RECORDS: u64 = 256;
/// The smallest journal a writer's slot is made with (the smallest the format allows).
const MIN_SLOT_JOURNAL_BYTES: u64 = 64 << 10;

/// The fewest recycled pages kept per device: more than one gathered batch replaces.
const RECYCLE_MIN: usize = 1024;

/// Metadata growth since the last snapshot past which a writer out of space has one taken
/// before it answers `NoSpace` ([`Inner::with_space`]): the reserve counts the growth twice,
/// so a snapshot then can give writers up to twice this back. Below it — or below an eighth
/// of the last snapshot, on a file system whose snapshot is large — a snapshot is not worth
/// its writes for what it could return (writes failing on a full volume while others
/// overwrite, which grows the bound, would otherwise rewrite the metadata again and again).
pub(crate) const SHRINK_RESERVE_GROWTH: u64 = 16 << 10;

/// What recovery found, for the running file system: its state and each slot's areas with
/// the live records they hold.
pub(crate) struct Recovered {
    pub(crate) volume: Arc<Volume>,
    pub(crate) devices: Vec<Region>,
    pub(crate) owner: Region,
    pub(crate) root: Root,
    pub(crate) snapshot_pieces: Vec<Extent>,
    pub(crate) snapshot_bytes: u64,
    pub(crate) inodes: crate::inode::InodeTable,
    pub(crate) next_ino: u64,
    pub(crate) next_order: u64,
    pub(crate) slots: Vec<(LogArea, Journal, VecDeque<Pending>)>,
    pub(crate) checksums: Option<Checksums>,
    pub(crate) replayed: ReplaySummary,
    /// The root's other copy is damaged: the unmount's root update rewrites it, so the
    /// unmount writes a snapshot even when nothing changed.
    pub(crate) damaged_root_copy: bool,
}

/// What recovery replayed at open ([`crate::Fs::replayed`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct ReplaySummary {
    /// Logged writes found in the logs (not yet in their files).
    pub log_records: u64,
    /// Bytes they carry.
    pub log_bytes: u64,
    /// Metadata operations replayed from journals a crash (or kill) left.
    pub journal_records: u64,
    /// Metadata operations replayed from journals a clean unmount sealed where they ended:
    /// kept there instead of folded into a new snapshot, when writing one would have cost
    /// more than replaying them (`crate::checkpoint`). Nothing to report.
    pub kept_records: u64,
    /// Writes a crash cut short after their records were durable but before all of their
    /// data was (both go behind one fence): they never returned, and were dropped.
    pub torn_writes: u64,
}

impl ReplaySummary {
    /// True when there was anything to replay that a clean unmount would not have left:
    /// the file system was not unmounted cleanly.
    pub fn any(&self) -> bool {
        self.log_records + self.journal_records + self.torn_writes > 0
    }
}

/// A thread's claim on a slot of one file system; the slot is released when the thread ends,
/// and its pool's partly filled buffers sealed ([`crate::buffers::Pool::release`]).
struct Lease {
    fs_id: u64,
    fs: Weak<Inner>,
    slot: Arc<Slot>,
}

impl Drop for Lease {
    fn drop(&mut self) {
        if let Some(inner) = self.fs.upgrade() {
            inner.end_lease(&self.slot);
        }
    }
}

/// The part of the checkpoint's reserve ([`Inner::reserve_bytes`]) that does not depend on
/// the metadata: 1/512 of a volume of `data_bytes`, at least 1 MiB.
pub(crate) fn reserve_floor(data_bytes: u64) -> u64 {
    (data_bytes / 512).max(1 << 20)
}

/// How many of a file system's `slot_limit` thread slots no thread owns: the top eighth of
/// the table, at least one. Slot 0 is the checkpoint's; each of the others may be owned by
/// a thread while it lives ([`Inner::slot`]).
pub fn shared_slots(slot_limit: u64) -> u64 {
    (slot_limit / 8).max(1)
}

/// How many of a file system's `slot_limit` thread slots a thread may own: all but the
/// checkpoint's and the [`shared_slots`].
pub fn ownable_slots(slot_limit: u64) -> u64 {
    slot_limit - shared_slots(slot_limit) - 1
}

/// A thread of a file system all of whose ownable slots other threads own: it takes turns
/// on the shared slots, one operation at a time ([`Inner::slot`]).
struct Turn {
    fs_id: u64,
    fs: Weak<Inner>,
    /// The shared slot of the operation under way (nested uses find it here).
    slot: Option<Arc<Slot>>,
    /// Uses of it by the operation under way, nested ones included.
    depth: u32,
    /// [`Inner::lease_ends`] when the thread last found no slot to own: until a lease ends,
    /// looking again would find none.
    ends_seen: u64,
}

thread_local! {
    static LEASES: RefCell<Vec<Lease>> = const { RefCell::new(Vec::new()) };
    static TURNS: RefCell<Vec<Turn>> = const { RefCell::new(Vec::new()) };
    /// A number of the calling thread, different from every other living thread's (so that
    /// threads waiting for a shared slot spread over them).
    static THREAD_NUMBER: usize = {
        static NEXT: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
        NEXT.fetch_add(1, Ordering::Relaxed)
    };
}

/// What a snapshot of `inodes` would take (an upper bound: the fixed fields as written).
fn snapshot_size(inodes: &crate::inode::InodeTable, slots: usize) -> u64 {
    let header = 8 + 4 + 4 + 8 + 8 + 8 + 4 + 8 + 4;
    let per_inode: u64 = inodes
        .values()
        .map(|inode| {
            let entries: u64 = inode.entries().keys().map(|n| entry_bytes(n)).sum();
            let runs = inode.extents.read().expect("extent map").run_count() as u64;
            INODE_BYTES + entries + runs * RUN_BYTES
        })
        .sum();
    header + slots as u64 * 8 + per_inode
}

impl Slot {
    /// The slot's journal, locked (rank [`FS_JOURNAL`]).
    pub(crate) fn journal(&self) -> Ordered<MutexGuard<'_, Journal>> {
        Ordered::take(FS_JOURNAL, || self.journal.lock().expect("journal"))
    }

    /// The slot's log area, locked (rank [`FS_LOG`]).
    pub(crate) fn log(&self) -> Ordered<MutexGuard<'_, LogArea>> {
        Ordered::take(FS_LOG, || self.log.lock().expect("log area"))
    }

    /// Takes the turn on a shared slot if no thread has it.
    fn try_turn(&self) -> bool {
        let mut taken = self.turn.lock().expect("slot turn");
        !std::mem::replace(&mut *taken, true)
    }

    /// Waits for the turn on a shared slot and takes it. Returns true if it had to wait.
    fn wait_turn(&self) -> bool {
        let mut taken = self.turn.lock().expect("slot turn");
        let waited = *taken;
        while *taken {
            taken = self.turn_over.wait(taken).expect("slot turn");
        }
        *taken = true;
        waited
    }

    /// Ends the turn on a shared slot.
    fn end_turn(&self) {
        *self.turn.lock().expect("slot turn") = false;
        self.turn_over.notify_one();
    }
}

/// A thread's use of a slot for one operation ([`Inner::slot`]): its own slot, or a turn on
/// a shared one, which ends when the outermost use of the operation is dropped.
#[derive(Debug)]
pub(crate) struct SlotUse {
    slot: Arc<Slot>,
    /// The file system's id when this is a turn on a shared slot.
    shared: Option<u64>,
}

impl std::ops::Deref for SlotUse {
    type Target = Arc<Slot>;

    fn deref(&self) -> &Arc<Slot> {
        &self.slot
    }
}

impl SlotUse {
    /// The calling thread's own slot.
    fn owned(slot: Arc<Slot>) -> Self {
        Self { slot, shared: None }
    }

    /// A turn on a shared slot of file system `fs_id`.
    fn shared(slot: Arc<Slot>, fs_id: u64) -> Self {
        Self {
            slot,
            shared: Some(fs_id),
        }
    }
}

impl Drop for SlotUse {
    fn drop(&mut self) {
        let Some(id) = self.shared else {
            return;
        };
        // Thread-locals gone: nothing nests any more; the turn ends.
        let outermost = TURNS
            .try_with(|turns| {
                let mut turns = turns.borrow_mut();
                let turn = turns.iter_mut().find(|t| t.fs_id == id)?;
                turn.depth -= 1;
                Some(turn.depth == 0)
            })
            .ok()
            .flatten()
            .unwrap_or(true);
        if outermost {
            self.slot.end_turn();
        }
    }
}

impl Inner {
    /// The batch lock (rank [`FS_BATCH`]).
    pub(crate) fn lock_batch(&self) -> Ordered<MutexGuard<'_, ()>> {
        Ordered::take(FS_BATCH, || self.batch.lock().expect("batch lock"))
    }

    /// `[offset, offset + len)` of `inode`, locked in the file system's range locks (rank
    /// [`FS_RANGE`]).
    pub(crate) fn lock_range(
        &self,
        inode: &Inode,
        offset: u64,
        len: u64,
        mode: LockMode,
    ) -> Result<Ordered<RangeGuard<'_>>> {
        Ordered::try_take(FS_RANGE, || {
            self.range_locks.lock(inode.ino, offset, len, mode)
        })
    }

    /// The inode table, for looking up (rank [`FS_TABLE`]: take nothing ranked while it
    /// is held).
    pub(crate) fn table(&self) -> Ordered<RwLockReadGuard<'_, crate::inode::InodeTable>> {
        Ordered::take(FS_TABLE, || self.inodes.read().expect("inode table"))
    }

    /// The inode table, for adding or dropping an inode (rank [`FS_TABLE`]).
    pub(crate) fn table_mut(&self) -> Ordered<RwLockWriteGuard<'_, crate::inode::InodeTable>> {
        Ordered::take(FS_TABLE, || self.inodes.write().expect("inode table"))
    }

    /// The metadata gate, shared (rank [`FS_GATE`]).
    pub(crate) fn gate_shared(&self) -> Ordered<RwLockReadGuard<'_, ()>> {
        Ordered::take(FS_GATE, || self.gate.read().expect("metadata gate"))
    }

    /// The metadata gate, exclusive (rank [`FS_GATE`]): a snapshot.
    pub(crate) fn gate_exclusive(&self) -> Ordered<RwLockWriteGuard<'_, ()>> {
        Ordered::take(FS_GATE, || self.gate.write().expect("metadata gate"))
    }

    /// The rename lock (rank [`FS_RENAME`]).
    pub(crate) fn lock_rename(&self) -> Ordered<MutexGuard<'_, ()>> {
        Ordered::take(FS_RENAME, || self.rename.lock().expect("rename lock"))
    }

    /// The shared state of the file system recovery found, with its slots.
    pub(crate) fn assemble(recovered: Recovered, options: FsOptions) -> Arc<Inner> {
        let Recovered {
            volume,
            devices,
            owner,
            root,
            snapshot_pieces,
            snapshot_bytes,
            inodes,
            next_ino,
            next_order,
            slots,
            checksums,
            replayed,
            damaged_root_copy,
        } = recovered;
        let slot_limit = root.slot_limit as usize;
        let slots_made = root.slots.len() as u64;
        let slot_bytes = root.slots.iter().map(SlotAreas::bytes).sum();
        let next_snapshot = snapshot_size(&inodes, root.slots.len());
        let pending_pages = if checksums.is_some() {
            slots
                .iter()
                .flat_map(|s| s.2.iter())
                .map(|p| partial_pages(p.offset, p.len))
                .sum()
        } else {
            0
        };
        let device_nodes = (0..devices.len() as u32)
            .map(|d| volume.device_node(d))
            .collect();
        // A 32nd of the volume (given back whenever an allocation finds the volume short),
        // at least a batch's worth of blocks ([`RECYCLE_MIN`]), at most 256 MiB per device.
        let recycle_cap =
            ((volume.data_bytes() / 32 / BLOCK) as usize).clamp(RECYCLE_MIN, 64 << 10);
        let range_locks =
            RangeLocks::new(root.granule).expect("the granule was checked when the root was read");
        let inner = Arc::new(Inner {
            id: NEXT_FS_ID.fetch_add(1, Ordering::Relaxed),
            volume,
            devices,
            owner,
            root: Mutex::new(root),
            snapshot_pieces: Mutex::new(snapshot_pieces),
            snapshot_bytes: AtomicU64::new(snapshot_bytes),
            // What replaying the journals added to the snapshot's metadata.
            snapshot_growth: AtomicU64::new(next_snapshot.saturating_sub(snapshot_bytes)),
            opened_at_order: next_order,
            snapshot_owed: AtomicBool::new(damaged_root_copy),
            accessed_since_snapshot: Mutex::default(),
            damaged_root_copy,
            options,
            symlinks: AtomicBool::new(inodes.values().any(|i| i.kind == Kind::Symlink)),
            inodes: RwLock::new(inodes),
            next_ino: AtomicU64::new(next_ino),
            progress: Progress::new(next_order),
            gate: RwLock::new(()),
            rename: Mutex::new(()),
            batch: Mutex::new(()),
            slots: (0..slot_limit).map(|_| OnceLock::new()).collect(),
            slot_in_use: Mutex::new(vec![false; slot_limit]),
            lease_ends: AtomicU64::new(0),
            exiting: Mutex::default(),
            counters: FsCounters {
                slots: AtomicU64::new(slots_made),
                slot_bytes: AtomicU64::new(slot_bytes),
                ..FsCounters::default()
            },
            checksums,
            pending_pages: AtomicU64::new(pending_pages),
            replayed,
            recycled: Recycled::new(device_nodes, recycle_cap),
            writers_remap: AtomicBool::new(false),
            cuts: crate::checkpoint::Cuts::default(),
            range_locks,
            checkpoint_hold: Mutex::new(()),
            confirming: Mutex::new(()),
            defrag: crate::defrag::Defrag::default(),
        });
        for (index, (log, journal, queue)) in slots.into_iter().enumerate() {
            let slot = inner.make_slot(index as u32, log, journal, queue);
            inner.slots[index].set(slot).expect("each slot once");
        }
        inner
    }

    /// A read of `inode`: its access time may move ([`crate::inode::Inode::accessed`]), and
    /// then the next snapshot has it to keep.
    pub(crate) fn accessed(&self, inode: &Inode) {
        if inode.accessed() {
            self.accessed_since_snapshot
                .lock()
                .expect("accessed inodes")
                .push(inode.ino);
            self.snapshot_owed.store(true, Ordering::Release);
        }
    }

    /// Whether the media already hold everything this file system knows: nothing was
    /// ordered (written, journaled) since it was opened, every journal still holds only the
    /// sealed marker of a clean unmount, and no snapshot is owed ([`Inner::snapshot_owed`]).
    /// Its unmount then writes nothing: the sealed snapshot it was opened from is current.
    pub(crate) fn unchanged_since_sealed(&self) -> bool {
        self.progress.current_order() == self.opened_at_order
            && !self.snapshot_owed.load(Ordering::Acquire)
            && self.made_slots().all(|slot| slot.journal().is_sealed())
    }

    pub(crate) fn region_at(&self, addr: u64) -> Result<(&Region, u64)> {
        let at = GlobalAddress::from_raw(addr);
        let region = self.devices.get(at.device() as usize).ok_or_else(|| {
            FsError::corrupt(
                "file-system address",
                format!("{at} names a device the volume does not have"),
            )
        })?;
        Ok((region, at.offset()))
    }

    /// Confirms in each slot's log area the newest write whose append returned
    /// ([`crate::log::Confirmer`]): after this, recovery takes those writes' data as whole,
    /// so their pages may be stored to in place or given away. Called before a checkpoint
    /// batch stores to any block in place — copying a later write into a block whose page a
    /// writer's remap made the file's, say — and before a cut (a hole punched, a file cut
    /// short or removed) frees blocks, one of which may be such a page: without it, a crash
    /// could leave that write the newest of its log with its page changed, which recovery
    /// would take for a write cut short and drop. Every record of a batch was queued after
    /// its write returned, and a block's page is stored to in place only for a write newer
    /// than the one that made it the file's (the range lock orders them), so what this
    /// confirms covers every page the batch touches. One fence for all the slots' words.
    pub(crate) fn confirm_logs(&self) -> Result<()> {
        let _confirming = self.confirming.lock().expect("confirming");
        let mut stored = false;
        for slot in self.slots.iter().filter_map(OnceLock::get) {
            let completed = slot.counters.completed();
            if completed > slot.confirmed.load(Ordering::Relaxed) {
                slot.confirmer.store(completed)?;
                slot.confirmed.store(completed, Ordering::Relaxed);
                stored = true;
            }
        }
        if stored {
            self.volume.fence();
        }
        Ok(())
    }

    /// A buffer for a writer to fill ([`Inner::alloc_buffer`]), its pages mapped for
    /// writing in one call ([`Region::populate_for_writes`]) rather than one page fault
    /// each as the copy reaches them.
    pub(crate) fn alloc_write_buffer(&self, len: u64) -> Result<Extent> {
        let extent = self.alloc_buffer(len)?;
        self.populate(extent.start.raw(), extent.len_bytes);
        Ok(extent)
    }

    /// Maps the pages of `len` bytes at `addr` for writing in this process now
    /// ([`Region::populate_for_writes`]).
    pub(crate) fn populate(&self, addr: u64, len: u64) {
        if let Ok((region, at)) = self.region_at(addr) {
            region.populate_for_writes(at, len);
        }
    }

    pub(crate) fn read_pmem(&self, addr: u64, buf: &mut [u8]) -> Result<()> {
        let (region, offset) = self.region_at(addr)?;
        region.read(offset, buf)?;
        Ok(())
    }

    /// Allocates `len` bytes on the calling thread's node for a writer's buffer, leaving the
    /// checkpoint its reserve ([`Inner::reserve_bytes`]): `NoSpace`, without waiting, when
    /// the allocation would cut into it even with the recycled pages given back.
    pub(crate) fn alloc_buffer(&self, len: u64) -> Result<Extent> {
        self.unless_recycled(|| self.alloc_buffer_once(len))
    }

    /// A buffer of `len` bytes for a caller to fill and commit ([`super::Fs::buffer`]): of
    /// a block or less, a recycled page of the calling thread's node when the lists have
    /// one. Without this, overwrites committed from such buffers (every NBD write of 4 KiB)
    /// would only ever add to the lists: once they are full the checkpoint copies small
    /// overwrites in place instead of remapping them ([`crate::buffers::Recycled`]), twice
    /// the media writes, and every write costs an allocation and a free.
    pub(crate) fn alloc_lent_buffer(self: &Arc<Self>, len: u64) -> Result<Extent> {
        if len <= BLOCK {
            let slot = self.slot()?;
            if let Some(run) = self
                .recycled
                .take(self.volume.current_node(), slot.index, 1)
                .pop()
            {
                slot.counters.count_recycled(1);
                return Ok(Extent {
                    start: GlobalAddress::from_raw(run.addr),
                    len_bytes: BLOCK,
                });
            }
        }
        self.with_space(|| self.alloc_buffer(len))
    }

    /// Runs the allocation `alloc`; when the volume is short, gives the recycled pages
    /// back to it ([`Recycled::drain`]) and tries once more. Every allocation of the file
    /// system goes through here: recycled pages are free memory, held only for speed.
    pub(crate) fn unless_recycled<T>(&self, alloc: impl Fn() -> Result<T>) -> Result<T> {
        match alloc() {
            Err(FsError::Volume(volume::VolumeError::NoSpace { .. }))
                if self.recycled.drain(&self.volume)? =>
            {
                alloc()
            }
            other => other,
        }
    }

    /// `len` bytes on the calling thread's node (the volume's `alloc_local`), with the
    /// recycled pages given back first if the volume is short.
    pub(crate) fn alloc_local(&self, len: u64) -> Result<Extent> {
        self.unless_recycled(|| Ok(self.volume.alloc_local(len)?))
    }

    /// [`Inner::alloc_buffer`] without the recycled pages.
    pub(crate) fn alloc_buffer_once(&self, len: u64) -> Result<Extent> {
        let needed = self.reserve_bytes() + len.next_multiple_of(BLOCK);
        // The published figure is within 1/256 of each device of the truth: count exactly
        // (every allocator lock) only when it is close.
        let published = self.volume.free_bytes_published();
        if published < needed + self.volume.data_bytes() / 128 && self.volume.free_bytes() < needed
        {
            return Err(FsError::Volume(volume::VolumeError::NoSpace {
                len_bytes: len,
            }));
        }
        Ok(self.volume.alloc_local(len)?)
    }

    /// Memory writers leave free for the checkpoint, which must never fail for want of it:
    /// room for the next snapshot twice over (it may have to go into pieces, with an index),
    /// however much the metadata grew since the last, and for fresh pages under partial
    /// writes into holes — at least 1 MiB, and 1/512 of the volume.
    pub(crate) fn reserve_bytes(&self) -> u64 {
        2 * self.next_snapshot_bound().next_multiple_of(BLOCK)
            + self.pending_pages.load(Ordering::Relaxed)
            + reserve_floor(self.volume.data_bytes())
    }

    /// The most bytes the next snapshot may take: the last one's, what the metadata grew
    /// since, and what the logged writes not yet checkpointed may add.
    pub(crate) fn next_snapshot_bound(&self) -> u64 {
        self.snapshot_bytes.load(Ordering::Relaxed)
            + self.snapshot_growth.load(Ordering::Relaxed)
            + self
                .made_slots()
                .map(|s| s.counters.pending_growth())
                .sum::<u64>()
    }

    /// Free memory beyond the checkpoint's reserve (the published figure: within 1/256 of
    /// each device of the truth).
    pub(crate) fn spare_bytes(&self) -> u64 {
        self.volume
            .free_bytes_published()
            .saturating_sub(self.reserve_bytes())
    }

    /// The next snapshot may be up to `bytes` larger: metadata was added (an inode, a name,
    /// extent runs).
    pub(crate) fn grow_snapshot(&self, bytes: u64) {
        self.snapshot_growth.fetch_add(bytes, Ordering::Relaxed);
    }

    /// Runs an allocation `f` until it succeeds or fails for a reason other than space. Out
    /// of space while the checkpoint holds records — whose buffers, and the blocks they
    /// replace, it frees as it moves them — the writer waits for it and tries again rather
    /// than fail a write that will fit in a moment; `NoSpace` when nothing is left to free.
    /// Never called with a range lock held (the checkpoint takes range locks).
    /// A batch that finished between the failed attempt and the look at `pending` freed its
    /// memory after the attempt: the writer tries again rather than report a full volume.
    /// With nothing pending, the unused room of every thread's buffer being filled is given
    /// back ([`Inner::trim_buffers`]) before the write fails: memory one thread holds is
    /// never `NoSpace` for another. Last, when the metadata grew by at least
    /// [`SHRINK_RESERVE_GROWTH`] (and an eighth of the last snapshot) since the last
    /// snapshot, one snapshot is taken: the reserve
    /// counts that growth at its bound (every write split a run, every freed file still
    /// named), twice, until a snapshot measures it, and on a full volume room a removal or
    /// a truncation had just freed could stay behind that bound
    /// (`a_writer_out_of_room_has_the_metadata_growth_measured_first`).
    pub(crate) fn with_space<T>(&self, mut f: impl FnMut() -> Result<T>) -> Result<T> {
        let mut snapshot_taken = false;
        loop {
            let finished = self.progress.batches_finished();
            match f() {
                Err(FsError::Volume(volume::VolumeError::NoSpace { .. })) if self.pending() > 0 => {
                    self.wait_for_progress(Wait::Space)?;
                }
                Err(FsError::Volume(volume::VolumeError::NoSpace { .. }))
                    if self.progress.batches_finished() != finished => {}
                Err(FsError::Volume(volume::VolumeError::NoSpace { .. }))
                    if self.trim_buffers()? => {}
                Err(FsError::Volume(volume::VolumeError::NoSpace { .. }))
                    if !snapshot_taken
                        && self.snapshot_growth.load(Ordering::Relaxed)
                            >= SHRINK_RESERVE_GROWTH
                                .max(self.snapshot_bytes.load(Ordering::Relaxed) / 8) =>
                {
                    snapshot_taken = true;
                    self.wait_for_snapshot()?;
                }
                other => return other,
            }
        }
    }

    /// Logged writes not yet moved into their files ([`Progress::pending`]).
    pub(crate) fn pending(&self) -> u64 {
        self.progress.pending(self.made_slots().map(|s| &s.queue))
    }

    /// The slots made so far (they are made in index order).
    pub(crate) fn made_slots(&self) -> impl Iterator<Item = &Arc<Slot>> {
        self.slots.iter().map_while(OnceLock::get)
    }

    /// Seals the buffer each thread slot is filling where it has unused room
    /// ([`crate::buffers::Pool::trim`]); whether any was. Takes each slot's pool lock in
    /// turn, so the caller holds none.
    pub(crate) fn trim_buffers(&self) -> Result<bool> {
        let mut trimmed = false;
        for slot in self.made_slots() {
            trimmed |= slot.pool.lock().expect("buffer pool").trim(&self.volume)?;
        }
        Ok(trimmed)
    }

    /// Bytes of the buffers being filled that no write has taken yet, over every slot
    /// ([`crate::buffers::Pool::unused_bytes`]).
    pub(crate) fn unused_buffer_bytes(&self) -> u64 {
        self.made_slots()
            .map(|slot| slot.pool.lock().expect("buffer pool").unused_bytes())
            .sum()
    }

    /// Copies `len` bytes of persistent memory from `src` to `dst` with non-temporal stores
    /// (durable at the next fence); the ranges must not overlap.
    pub(crate) fn copy_pmem(&self, src: u64, dst: u64, len: u64) -> Result<()> {
        let (from, from_at) = self.region_at(src)?;
        let (to, to_at) = self.region_at(dst)?;
        to.copy_nt_from(to_at, from, from_at, len)?;
        Ok(())
    }

    pub(crate) fn inode(&self, ino: u64) -> Option<Arc<Inode>> {
        self.table().get(&ino).cloned()
    }

    pub(crate) fn check_running(&self) -> Result<()> {
        self.progress.check_running()
    }

    /// The calling thread's slot for the operation it begins: its own, claiming a free one
    /// on first use; or, while every slot a thread may own is owned by a live thread, a
    /// turn on one of the shared slots for as long as the returned use (and any nested in
    /// it) lives. A process may so have more threads changing the file system than it has
    /// slots (a thread pool as large as a big server's CPUs, a mount's serving thread per
    /// CPU): the threads beyond take turns, and none is refused.
    pub(crate) fn slot(self: &Arc<Self>) -> Result<SlotUse> {
        // An operation asks for its slot before it takes any lock of the file system: a
        // thread waiting for a turn then holds none that the thread whose turn it is could
        // wait for.
        crate::lock_order::assert_none_from(FS_BATCH, "a thread slot");
        let found = LEASES.try_with(|leases| {
            leases
                .borrow()
                .iter()
                .find(|l| l.fs_id == self.id)
                .map(|l| Arc::clone(&l.slot))
        });
        match found {
            Ok(Some(slot)) => return Ok(SlotUse::owned(slot)),
            Ok(None) => {}
            // The thread is exiting and its thread-locals are gone (a stdio stream flushed by
            // an exit handler writes now): a slot kept for it by its thread id, or a turn.
            Err(_) => {
                return match self.exiting_thread_slot() {
                    Err(FsError::TooManyThreads(_)) => self.take_turn(),
                    other => other.map(SlotUse::owned),
                };
            }
        }
        // A thread taking turns: a nested use shares the operation's turn; a new operation
        // looks for a slot to own only when a lease has ended since it last found none.
        let ends = self.lease_ends.load(Ordering::Acquire);
        let turn = TURNS.with(|turns| {
            let mut turns = turns.borrow_mut();
            let turn = turns.iter_mut().find(|t| t.fs_id == self.id)?;
            match &turn.slot {
                Some(slot) if turn.depth > 0 => {
                    turn.depth += 1;
                    Some(Some(Arc::clone(slot)))
                }
                _ if turn.ends_seen == ends => Some(None),
                _ => None,
            }
        });
        match turn {
            Some(Some(slot)) => return Ok(SlotUse::shared(slot, self.id)),
            Some(None) => return self.take_turn(),
            None => {}
        }
        match self.claim_slot() {
            Ok(slot) => {
                TURNS.with(|turns| turns.borrow_mut().retain(|t| t.fs_id != self.id));
                LEASES.with(|leases| {
                    let mut leases = leases.borrow_mut();
                    leases.retain(|l| l.fs.strong_count() > 0);
                    leases.push(Lease {
                        fs_id: self.id,
                        fs: Arc::downgrade(self),
                        slot: Arc::clone(&slot),
                    });
                });
                Ok(SlotUse::owned(slot))
            }
            Err(FsError::TooManyThreads(_)) => {
                TURNS.with(|turns| {
                    let mut turns = turns.borrow_mut();
                    turns.retain(|t| t.fs_id != self.id && t.fs.strong_count() > 0);
                    turns.push(Turn {
                        fs_id: self.id,
                        fs: Arc::downgrade(self),
                        slot: None,
                        depth: 0,
                        ends_seen: ends,
                    });
                });
                self.take_turn()
            }
            Err(e) => Err(e),
        }
    }

    /// The first of the slots no thread owns ([`shared_slots`]), after the checkpoint's
    /// and the [`ownable_slots`].
    pub(crate) fn first_shared_slot(&self) -> usize {
        1 + ownable_slots(self.slots.len() as u64) as usize
    }

    /// A turn on a shared slot for the calling thread's operation (its [`Turn`] recorded):
    /// the first made whose turn is free; else the next one, made now (so as many exist as
    /// threads ever took turns at once, at most); when every one is made and taken, or the
    /// volume has no room to make another, waits for one of those made, picked by the
    /// thread's number.
    fn take_turn(self: &Arc<Self>) -> Result<SlotUse> {
        let shared = self.first_shared_slot()..self.slots.len();
        let mut taken = None;
        for index in shared.clone() {
            let slot = match self.slots[index].get() {
                Some(slot) => Arc::clone(slot),
                None => match self.slot_at(index as u32) {
                    Ok(slot) => slot,
                    Err(e) if index == shared.start => return Err(e),
                    Err(_) => break,
                },
            };
            if slot.try_turn() {
                taken = Some(slot);
                break;
            }
        }
        let slot = match taken {
            Some(slot) => slot,
            None => {
                let made = shared
                    .clone()
                    .take_while(|&i| self.slots[i].get().is_some())
                    .count();
                let number = THREAD_NUMBER.try_with(|n| *n).unwrap_or(0);
                let slot = self.slot_at((shared.start + number % made) as u32)?;
                if slot.wait_turn() {
                    self.counters.turn_waits.fetch_add(1, Ordering::Relaxed);
                }
                slot
            }
        };
        self.counters.turns.fetch_add(1, Ordering::Relaxed);
        // (An exiting thread whose thread-locals are gone has no `Turn`: its turn ends with
        // the use.)
        let _ = TURNS.try_with(|turns| {
            let mut turns = turns.borrow_mut();
            if let Some(turn) = turns.iter_mut().find(|t| t.fs_id == self.id) {
                turn.slot = Some(Arc::clone(&slot));
                turn.depth = 1;
            }
        });
        Ok(SlotUse::shared(slot, self.id))
    }

    /// A free slot, marked in use (its areas made if this is its first use); the number is
    /// free again if making them fails.
    fn claim_slot(&self) -> Result<Arc<Slot>> {
        let index = self.claim_slot_index()?;
        self.slot_at(index as u32).inspect_err(|_| {
            self.slot_in_use.lock().expect("slot table")[index] = false;
        })
    }

    /// Marks a free slot number in use and returns it (never a shared one).
    fn claim_slot_index(&self) -> Result<usize> {
        let owned = 1..self.first_shared_slot();
        let mut in_use = self.slot_in_use.lock().expect("slot table");
        let index = owned
            .clone()
            .find(|&i| !in_use[i])
            .ok_or(FsError::TooManyThreads(owned.len() as u32))?;
        in_use[index] = true;
        Ok(index)
    }

    /// A thread's claim on `slot` ends (the thread ended): the pool's partly filled buffers
    /// are sealed before the slot is free, so that a thread claiming it next finds the pool
    /// as this one left it, not half way through.
    fn end_lease(&self, slot: &Slot) {
        let sealed = slot.pool.lock().expect("buffer pool").release(&self.volume);
        if let Err(e) = sealed {
            tracing::error!(error = %e, slot = slot.index, "sealing an ended thread's buffers failed");
        }
        self.slot_in_use.lock().expect("slot table")[slot.index as usize] = false;
        self.lease_ends.fetch_add(1, Ordering::AcqRel);
    }

    /// The slot of a thread whose thread-locals were destroyed, claimed once per thread
    /// (found by its kernel thread id, `/proc/thread-self`, which needs no thread-local)
    /// and kept while the thread lives: the slots of such threads that have ended since are
    /// given back first, so that a program whose every thread writes at its end (a stdio
    /// stream flushed by a destructor) does not run out of slots.
    fn exiting_thread_slot(&self) -> Result<Arc<Slot>> {
        let tid = std::fs::read_link("/proc/thread-self")
            .map_err(|e| FsError::Shutdown(format!("identifying an exiting thread: {e}")))?;
        let mut exiting = self.exiting.lock().expect("exiting threads");
        if let Some(slot) = exiting.get(&tid) {
            return Ok(Arc::clone(slot));
        }
        exiting.retain(|thread, slot| {
            let lives = std::path::Path::new("/proc").join(thread).exists();
            if !lives {
                self.end_lease(slot);
            }
            lives
        });
        let slot = self.claim_slot()?;
        exiting.insert(tid, Arc::clone(&slot));
        Ok(slot)
    }

    /// Slot `index`, creating its areas (and recording them in the root) the first time.
    pub(crate) fn slot_at(&self, index: u32) -> Result<Arc<Slot>> {
        if let Some(slot) = self.slots[index as usize].get() {
            return Ok(Arc::clone(slot));
        }
        let mut root = self.root.lock().expect("root");
        if let Some(slot) = self.slots[index as usize].get() {
            return Ok(Arc::clone(slot));
        }
        // Slots are created in index order, so the root's table stays dense.
        for earlier in root.slots.len() as u32..index {
            self.create_slot(&mut root, earlier)?;
        }
        self.create_slot(&mut root, index)?;
        Ok(Arc::clone(
            self.slots[index as usize].get().expect("created"),
        ))
    }

    pub(crate) fn create_slot(&self, root: &mut Root, index: u32) -> Result<()> {
        debug_assert_eq!(root.slots.len() as u32, index);
        let journal_len = if index == 0 {
            root.journal_bytes * 16
        } else {
            root.journal_bytes
        };
        let log_len = LogArea::bytes_for(root.log_records).next_multiple_of(BLOCK);
        // A writer's areas may be smaller than the format asks (slot 0, the checkpoint's,
        // is made at format on an empty volume and needs its full journal for batches).
        let (log_floor, journal_floor) = if index == 0 {
            (log_len, journal_len)
        } else {
            (
                LogArea::bytes_for(MIN_SLOT_LOG_RECORDS.min(root.log_records))
                    .next_multiple_of(BLOCK)
                    .min(log_len),
                MIN_SLOT_JOURNAL_BYTES.min(journal_len),
            )
        };
        let log_extent = self.alloc_area(log_len, log_floor)?;
        let journal_extent = match self.alloc_area(journal_len, journal_floor) {
            Ok(e) => e,
            Err(e) => {
                self.volume.free(log_extent)?;
                return Err(e);
            }
        };
        let (log_len, journal_len) = (log_extent.len_bytes, journal_extent.len_bytes);
        let log = LogArea::format(self.volume.region(&log_extent)?, index)?;
        let journal = Journal::fresh(self.volume.region(&journal_extent)?, root.epoch)?;
        let mut next = root.clone();
        next.generation += 1;
        let areas = SlotAreas {
            log_addr: log_extent.start.raw(),
            log_len,
            journal_addr: journal_extent.start.raw(),
            journal_len,
        };
        next.slots.push(areas);
        next.write(&self.owner)?;
        self.counters.slots.fetch_add(1, Ordering::Relaxed);
        self.counters
            .slot_bytes
            .fetch_add(areas.bytes(), Ordering::Relaxed);
        *root = next;
        let slot = self.make_slot(index, log, journal, VecDeque::new());
        self.slots[index as usize]
            .set(slot)
            .expect("slot created once, under the root lock");
        Ok(())
    }

    /// A contiguous area of `len` bytes for a new slot's log or journal — or, when free
    /// memory has no piece that large, the first of `len` halved (in whole blocks), halved
    /// again and so on down to `floor`, that it has. Remapped overwrites free the blocks they replace wherever those
    /// were, so an aged volume can have most of its memory free in pieces of 64 KiB: a
    /// thread that starts writing there gets a log of fewer records (its writes wait for the
    /// checkpoint sooner) and a journal that asks for snapshots sooner, instead of `NoSpace`
    /// with the volume half empty. Areas record their own lengths (`SlotAreas`), and a log
    /// area its capacity, so recovery reads them at whatever size they were made. No wait
    /// for the checkpoint here: the caller holds the root, which a snapshot takes.
    fn alloc_area(&self, len: u64, floor: u64) -> Result<Extent> {
        let mut size = len;
        loop {
            match self.alloc_buffer(size) {
                Err(e) if e.kind() == crate::ErrorKind::NoSpace && size > floor => {
                    size = (size / 2).next_multiple_of(BLOCK).max(floor);
                }
                // Only the smallest area out of the checkpoint's reserve, and only when
                // nothing else is left: a thread needs a log and a journal even to remove
                // files from a full volume, but each byte it takes from the reserve is one
                // writers wait to see repaid.
                Err(e) if e.kind() == crate::ErrorKind::NoSpace => return self.alloc_local(floor),
                other => return other,
            }
        }
    }

    fn make_slot(
        &self,
        index: u32,
        log: LogArea,
        journal: Journal,
        pending: VecDeque<Pending>,
    ) -> Arc<Slot> {
        let counters = SlotCounters::default();
        // Every record recovery kept is whole: checked, or covered by the confirmation.
        let completed = log.next_sequence() - 1;
        counters.complete(completed);
        let confirmed = if log.confirms(completed) {
            completed
        } else {
            0
        };
        counters.log_growth(
            pending
                .iter()
                .map(|p| write_growth_bound(p.offset, p.len))
                .sum(),
        );
        Arc::new(Slot {
            index,
            retired: log.retired_handle(),
            confirmer: log.confirmer(),
            confirmed: AtomicU64::new(confirmed),
            log: Mutex::new(log),
            journal: Mutex::new(journal),
            queue: Queue::with(pending),
            pool: Mutex::new(Pool::new(
                self.options.prelim_buffers,
                self.options.prelim_buffer_bytes,
                self.checksums.is_some(),
            )),
            counters,
            turn: Mutex::new(false),
            turn_over: Condvar::new(),
        })
    }

    /// Logs a metadata operation in the calling thread's journal; the caller holds the gate
    /// shared and the locks that order the operation. Returns false when the journal is full
    /// (the caller drops its locks, waits for a snapshot, and tries again). A journal that
    /// passes the checkpoint's mark asks for a snapshot, so that it rarely fills.
    pub(crate) fn journal(&self, slot: &Slot, op: &MetaOp) -> Result<bool> {
        let mut journal = slot.journal();
        let order = self.progress.next_order();
        let was_filling = journal.past_snapshot_mark(slot.index);
        match journal.append(order, op)? {
            Some(bytes) => {
                slot.counters.count_media(bytes);
                if !was_filling && journal.past_snapshot_mark(slot.index) {
                    drop(journal);
                    self.progress.request_snapshot();
                }
                Ok(true)
            }
            None => Ok(false),
        }
    }

    /// Asks the checkpoint thread for a snapshot and waits until the epoch changes.
    pub(crate) fn wait_for_snapshot(&self) -> Result<()> {
        let epoch = self.root.lock().expect("root").epoch;
        while self.root.lock().expect("root").epoch == epoch {
            self.count_wait(Wait::Journal);
            self.progress.await_pass(|asked| asked.snapshot = true)?;
        }
        Ok(())
    }

    /// Waits until every data record logged before now is part of its file.
    pub(crate) fn drain(&self) -> Result<()> {
        self.progress.drain()
    }

    /// Waits for a checkpoint pass (a writer out of log space, buffers or memory).
    pub(crate) fn wait_for_progress(&self, why: Wait) -> Result<()> {
        self.count_wait(why);
        self.progress.await_pass(|asked| asked.drain = true)
    }

    fn count_wait(&self, why: Wait) {
        self.counters.waits[why as usize].fetch_add(1, Ordering::Relaxed);
    }
}

impl Inner {
    /// A slot counter summed over the slots that exist.
    fn slot_sum(&self, counter: impl Fn(&SlotCounters) -> &AtomicU64) -> u64 {
        self.made_slots()
            .map(|slot| counter(&slot.counters).load(Ordering::Relaxed))
            .sum()
    }

    /// Writes callers have logged so far (a rewrite of a file's own bytes is not one).
    pub(crate) fn caller_writes(&self) -> u64 {
        self.slot_sum(|c| &c.writes)
    }

    /// Bytes callers have written so far.
    pub(crate) fn caller_bytes(&self) -> u64 {
        self.slot_sum(|c| &c.caller_bytes)
    }

    pub(crate) fn stats(&self) -> FsStats {
        let caller_bytes = self.caller_bytes();
        let writes = self.caller_writes();
        let mut media_bytes = self.slot_sum(|c| &c.media_bytes);
        let waits = self
            .counters
            .waits
            .each_ref()
            .map(|w| w.load(Ordering::Relaxed));
        let c = &self.counters;
        media_bytes +=
            c.copied_bytes.load(Ordering::Relaxed) + c.metadata_bytes.load(Ordering::Relaxed);
        let mut stats = FsStats {
            caller_bytes,
            media_bytes,
            write_amplification: if caller_bytes == 0 {
                0.0
            } else {
                media_bytes as f64 / caller_bytes as f64
            },
            writes,
            records_pending: self.pending(),
            idle: false,
            checkpoint_lag: self
                .progress
                .current_order()
                .saturating_sub(self.progress.done_below()),
            checkpoint_batches: c.checkpoint_batches.load(Ordering::Relaxed),
            checkpointed_records: c.checkpointed_records.load(Ordering::Relaxed),
            remapped_blocks: c.remapped_blocks.load(Ordering::Relaxed),
            writer_remapped_blocks: c.writer_remapped_blocks.load(Ordering::Relaxed),
            copied_bytes: c.copied_bytes.load(Ordering::Relaxed),
            recycled_blocks: self.slot_sum(|c| &c.recycled),
            unrecycled_blocks: c.unrecycled_blocks.load(Ordering::Relaxed),
            snapshots: c.snapshots.load(Ordering::Relaxed),
            snapshot_bytes: self.snapshot_bytes.load(Ordering::Relaxed),
            snapshot_pause_last_ns: c.snapshot_pause_last_ns.load(Ordering::Relaxed),
            snapshot_pause_max_ns: c.snapshot_pause_max_ns.load(Ordering::Relaxed),
            snapshot_pause_total_ns: c.snapshot_pause_total_ns.load(Ordering::Relaxed),
            defragmented_windows: c.defragmented_windows.load(Ordering::Relaxed),
            defragmented_for_reads: self.defrag.earned_by_reads.load(Ordering::Relaxed),
            defrag_windows_noted: self.defrag.noted() as u64,
            defrag_windows_deferred: self.defrag.deferred() as u64,
            backpressure_waits: waits.iter().sum(),
            waits_for_log: waits[Wait::Log as usize],
            waits_for_buffers: waits[Wait::Buffers as usize],
            waits_for_space: waits[Wait::Space as usize],
            waits_for_journal: waits[Wait::Journal as usize],
            writer_give_ways: c.gave_way.load(Ordering::Relaxed),
            checkpoint_cpu_ns: c.checkpoint_cpu_ns.load(Ordering::Relaxed),
            checkpoint_nice: c.checkpoint_priority.get().map(|&(nice, _)| nice),
            checkpoint_priority_raised: c.checkpoint_priority.get().map_or(0, |&(_, by)| by),
            inodes: self.table().len() as u64,
            slots: c.slots.load(Ordering::Relaxed),
            slot_bytes: c.slot_bytes.load(Ordering::Relaxed),
            slot_limit: self.slots.len() as u64,
            slot_turns: c.turns.load(Ordering::Relaxed),
            slot_turn_waits: c.turn_waits.load(Ordering::Relaxed),
            reserved_bytes: self.reserve_bytes(),
        };
        stats.idle = stats.records_pending == 0 && stats.defrag_windows_noted == 0;
        stats
    }
}

/// Bytes of the fresh pages the checkpoint builds for a write of `[offset, offset + len)`
/// with data checksums on: one per partial block at either end.
pub(crate) fn partial_pages(offset: u64, len: u64) -> u64 {
    let end = offset + len;
    if len == 0 {
        return 0;
    }
    let (first, last) = (offset / BLOCK, (end - 1) / BLOCK);
    let head = !offset.is_multiple_of(BLOCK) || (first == last && !end.is_multiple_of(BLOCK));
    let tail = last > first && !end.is_multiple_of(BLOCK);
    (u64::from(head) + u64::from(tail)) * BLOCK
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A slot's pending growth is what its writer logged less what the checkpoint moved,
    /// and never below nothing.
    #[test]
    fn a_slots_pending_growth_is_logged_less_moved() {
        let counters = SlotCounters::default();
        counters.log_growth(100);
        counters.log_growth(20);
        assert_eq!(counters.pending_growth(), 120);
        counters.move_growth(50);
        assert_eq!(counters.pending_growth(), 70);
        counters.move_growth(70);
        assert_eq!(counters.pending_growth(), 0);
        counters.count_write(4096);
        counters.count_write(512);
        counters.count_media(8192);
        assert_eq!(counters.writes.load(Ordering::Relaxed), 2);
        assert_eq!(counters.caller_bytes.load(Ordering::Relaxed), 4608);
        assert_eq!(counters.media_bytes.load(Ordering::Relaxed), 8192);
    }
}
