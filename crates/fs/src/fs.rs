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

use std::cell::RefCell;
use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, OnceLock, RwLock, Weak};
use std::time::{SystemTime, UNIX_EPOCH};

use pmem::Region;
use volume::{Extent, GlobalAddress, Volume};

use crate::buffers::{BufferSet, Pool, Reserve};
use crate::error::{FsError, Result};
use crate::extent_map::{BLOCK, ExtentMap, Run};
use crate::journal::{Journal, Kind, MetaOp};
use crate::log::LogArea;
use crate::overlay::Overlay;
use crate::path;
use crate::range_lock::{LockMode, RangeLocks};
use crate::root::{MAX_SLOTS, Root, SlotAreas};

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

/// How a new file system is laid out.
#[derive(Debug, Clone)]
pub struct FormatOptions {
    /// Thread slots (threads using the file system at once), 2..=120; slot 0 is the checkpoint's.
    pub slot_limit: u32,
    /// Records per thread's data log area (64 bytes each).
    pub log_records: u64,
    /// Bytes of each thread's metadata journal (the checkpoint's is 16 times larger).
    pub journal_bytes: u64,
    /// Range-lock granule of files: a power of two in 4 KiB..=2 MiB.
    pub granule: u64,
}

impl Default for FormatOptions {
    fn default() -> Self {
        Self {
            slot_limit: 64,
            log_records: 16 << 10,
            journal_bytes: 1 << 20,
            granule: 4096,
        }
    }
}

impl FormatOptions {
    /// The defaults, with log areas and journals shrunk for a small volume of
    /// `volume_bytes` so the file system's own structures stay a small part of it: a
    /// journal of 1/512 of the volume (64 KiB..=1 MiB; the checkpoint's is 16 times that)
    /// and a log area of one record per 16 KiB (256..=16384 records). From 512 MiB up this
    /// is [`FormatOptions::default`].
    pub fn scaled_to(volume_bytes: u64) -> Self {
        Self {
            log_records: (volume_bytes / (16 << 10)).clamp(256, 16 << 10),
            journal_bytes: (volume_bytes / 512)
                .next_power_of_two()
                .clamp(64 << 10, 1 << 20),
            ..Self::default()
        }
    }
}

/// How to run an open file system.
#[derive(Debug, Clone)]
pub struct FsOptions {
    /// Preliminary buffers per thread (1..=16; the paper varies it from 1 to 16).
    pub prelim_buffers: usize,
    /// Bytes of each preliminary buffer (a multiple of 4 KiB, at least 64 KiB). Writes larger
    /// than this get a buffer of their own.
    pub prelim_buffer_bytes: u64,
    /// Most records one checkpoint batch moves.
    pub checkpoint_batch: usize,
    /// When the checkpoint runs.
    pub checkpoint: CheckpointMode,
}

/// When the checkpoint moves logged writes into files.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum CheckpointMode {
    /// Continuously, in the background (the paper's design).
    #[default]
    Background,
    /// Only when something needs it: a writer out of log space or buffers, a close, a
    /// checkpoint call, a full journal, unmount. Writes stay in the logs meanwhile (reads see
    /// them through the overlay); useful to measure logging alone, and for recovery tests.
    OnDemand,
}

impl Default for FsOptions {
    fn default() -> Self {
        Self {
            prelim_buffers: 4,
            prelim_buffer_bytes: 8 << 20,
            checkpoint_batch: 4096,
            checkpoint: CheckpointMode::Background,
        }
    }
}

pub(crate) fn now_ns() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64)
}

/// Attributes of an inode that change under its lock.
#[derive(Debug, Clone)]
pub(crate) struct Attr {
    pub(crate) mode: u32,
    pub(crate) mtime: u64,
    /// Parent directory (directories only).
    pub(crate) parent: u64,
    /// No longer named by any directory.
    pub(crate) unlinked: bool,
}

/// A file or directory in DRAM.
#[derive(Debug)]
pub(crate) struct Inode {
    pub(crate) ino: u64,
    pub(crate) kind: Kind,
    pub(crate) attr: Mutex<Attr>,
    /// Entries, for directories.
    pub(crate) entries: Mutex<BTreeMap<String, u64>>,
    /// Bytes, including logged writes not yet checkpointed.
    pub(crate) size: AtomicU64,
    pub(crate) extents: RwLock<ExtentMap>,
    /// Set when the file's blocks went back to the volume: nothing may map into it again.
    pub(crate) dead: AtomicBool,
    pub(crate) overlay: Overlay,
    pub(crate) locks: RangeLocks,
    pub(crate) opens: AtomicU64,
}

impl Inode {
    pub(crate) fn new(ino: u64, kind: Kind, attr: Attr, granule: u64) -> Self {
        Self {
            ino,
            kind,
            attr: Mutex::new(attr),
            entries: Mutex::default(),
            size: AtomicU64::new(0),
            extents: RwLock::default(),
            dead: AtomicBool::new(false),
            overlay: Overlay::default(),
            locks: RangeLocks::new(granule).expect("granule checked at open"),
            opens: AtomicU64::new(0),
        }
    }

    fn attr(&self) -> std::sync::MutexGuard<'_, Attr> {
        self.attr.lock().expect("inode attributes")
    }
}

/// A logged write the checkpoint has not moved into its file yet.
#[derive(Debug)]
pub(crate) struct Pending {
    pub(crate) slot: u32,
    pub(crate) seq: u64,
    pub(crate) order: u64,
    pub(crate) ino: u64,
    pub(crate) offset: u64,
    pub(crate) len: u64,
    pub(crate) set: Arc<BufferSet>,
    /// The write's time (0: not recorded, an area of version 1).
    pub(crate) mtime: u64,
}

/// Counters of one slot, on its own cache lines.
#[derive(Debug, Default)]
#[repr(align(128))]
pub(crate) struct SlotCounters {
    pub(crate) caller_bytes: AtomicU64,
    pub(crate) media_bytes: AtomicU64,
    pub(crate) writes: AtomicU64,
}

/// The order a slot's writer is about to take, or `u64::MAX` (on a line of its own).
#[derive(Debug)]
#[repr(align(128))]
pub(crate) struct InFlight(pub(crate) AtomicU64);

/// One thread slot: a data log area, a metadata journal, a pool of preliminary buffers.
#[derive(Debug)]
pub(crate) struct Slot {
    pub(crate) index: u32,
    pub(crate) log: Mutex<LogArea>,
    pub(crate) retired: Arc<AtomicU64>,
    pub(crate) journal: Mutex<Journal>,
    pub(crate) pending: Mutex<VecDeque<Pending>>,
    pub(crate) inflight: InFlight,
    pub(crate) pool: Mutex<Pool>,
    pub(crate) counters: SlotCounters,
}

/// State the checkpoint thread and the threads waiting on it share.
#[derive(Debug, Default)]
pub(crate) struct Signal {
    pub(crate) state: Mutex<SignalState>,
    /// Wakes the checkpoint thread.
    pub(crate) wake: Condvar,
    /// Wakes threads waiting for checkpoint progress.
    pub(crate) progress: Condvar,
    /// The checkpoint thread is waiting on `wake`. Writers read it without the lock, so the
    /// common write takes no shared lock; a wake-up missed in the race costs at most the
    /// thread's 2 ms wait.
    pub(crate) sleeping: AtomicBool,
}

#[derive(Debug, Default)]
pub(crate) struct SignalState {
    pub(crate) snapshot_wanted: bool,
    pub(crate) drain_wanted: bool,
    pub(crate) stop: bool,
    /// Stop at once, leaving logs as a crash would (tests).
    pub(crate) abandon: bool,
    pub(crate) failed: Option<String>,
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
    pub(crate) options: FsOptions,
    pub(crate) inodes: RwLock<HashMap<u64, Arc<Inode>>>,
    pub(crate) next_ino: AtomicU64,
    pub(crate) order: InFlight,
    /// Metadata operations hold it shared; a snapshot holds it exclusively.
    pub(crate) gate: RwLock<()>,
    pub(crate) rename: Mutex<()>,
    /// Held by a checkpoint batch from its first change to its commit, and by truncation:
    /// a truncation must not free blocks a batch mapped but has not committed.
    pub(crate) batch: Mutex<()>,
    pub(crate) slots: Vec<OnceLock<Arc<Slot>>>,
    pub(crate) slot_in_use: Mutex<Vec<bool>>,
    /// Every data record with an order below this is part of its file.
    pub(crate) done_below: AtomicU64,
    pub(crate) pending_records: AtomicU64,
    pub(crate) signal: Signal,
    pub(crate) counters: FsCounters,
}

#[derive(Debug, Default)]
pub(crate) struct FsCounters {
    pub(crate) checkpoint_batches: AtomicU64,
    pub(crate) checkpointed_records: AtomicU64,
    pub(crate) remapped_blocks: AtomicU64,
    pub(crate) copied_bytes: AtomicU64,
    pub(crate) metadata_bytes: AtomicU64,
    pub(crate) snapshots: AtomicU64,
    pub(crate) waits: AtomicU64,
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
    /// Operations logged since the oldest record the checkpoint has not finished.
    pub checkpoint_lag: u64,
    /// Checkpoint batches committed.
    pub checkpoint_batches: u64,
    /// Records moved into files.
    pub checkpointed_records: u64,
    /// Blocks the checkpoint remapped (no copy).
    pub remapped_blocks: u64,
    /// Bytes the checkpoint copied (partial blocks).
    pub copied_bytes: u64,
    /// Snapshots written.
    pub snapshots: u64,
    /// Times a writer waited for the checkpoint (backpressure).
    pub backpressure_waits: u64,
    /// Files and directories.
    pub inodes: u64,
}

/// What `stat` says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Stat {
    /// Inode number.
    pub ino: u64,
    /// File or directory.
    pub kind: Kind,
    /// Permission bits.
    pub mode: u32,
    /// Bytes (files); entries (directories).
    pub size: u64,
    /// Bytes of volume memory held by the file's blocks.
    pub allocated: u64,
    /// Last modification, ns since the Unix epoch.
    pub mtime_ns: u64,
    /// Links: 1 for files, 2 + subdirectories for directories.
    pub nlink: u64,
}

/// One directory entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DirEntry {
    /// Name.
    pub name: String,
    /// Inode number.
    pub ino: u64,
    /// File or directory.
    pub kind: Kind,
}

/// How to open a file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OpenOptions {
    /// Reads allowed.
    pub read: bool,
    /// Writes allowed.
    pub write: bool,
    /// Create the file if missing.
    pub create: bool,
    /// With `create`: fail if it exists.
    pub exclusive: bool,
    /// Cut the file to zero bytes (needs `write`).
    pub truncate: bool,
    /// Permission bits for a created file.
    pub mode: u32,
}

impl Default for OpenOptions {
    fn default() -> Self {
        Self {
            read: true,
            write: false,
            create: false,
            exclusive: false,
            truncate: false,
            mode: 0o644,
        }
    }
}

impl OpenOptions {
    /// Read and write an existing file.
    pub fn read_write() -> Self {
        Self {
            write: true,
            ..Self::default()
        }
    }

    /// Read and write, creating the file if missing.
    pub fn create() -> Self {
        Self {
            write: true,
            create: true,
            ..Self::default()
        }
    }
}

static NEXT_FS_ID: AtomicU64 = AtomicU64::new(1);

/// A thread's claim on a slot of one file system; the slot is released when the thread ends.
struct Lease {
    fs_id: u64,
    fs: Weak<Inner>,
    slot: Arc<Slot>,
}

impl Drop for Lease {
    fn drop(&mut self) {
        if let Some(inner) = self.fs.upgrade() {
            inner.slot_in_use.lock().expect("slot table")[self.slot.index as usize] = false;
        }
    }
}

thread_local! {
    static LEASES: RefCell<Vec<Lease>> = const { RefCell::new(Vec::new()) };
}

impl Inner {
    pub(crate) fn new_id() -> u64 {
        NEXT_FS_ID.fetch_add(1, Ordering::Relaxed)
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

    pub(crate) fn read_pmem(&self, addr: u64, buf: &mut [u8]) -> Result<()> {
        let (region, offset) = self.region_at(addr)?;
        region.read(offset, buf)?;
        Ok(())
    }

    /// Allocates `len` bytes on the calling thread's node for a writer's buffer, leaving the
    /// checkpoint its reserve ([`Inner::reserve_bytes`]): `NoSpace`, without waiting, when
    /// the allocation would cut into it.
    pub(crate) fn alloc_buffer(&self, len: u64) -> Result<Extent> {
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
    /// room for two snapshots (the next is written before the last is freed) and for fresh
    /// pages under partial writes into holes — at least 1 MiB, and 1/512 of the volume.
    pub(crate) fn reserve_bytes(&self) -> u64 {
        2 * self
            .snapshot_bytes
            .load(Ordering::Relaxed)
            .next_multiple_of(BLOCK)
            + (self.volume.data_bytes() / 512).max(1 << 20)
    }

    /// Runs an allocation `f` until it succeeds or fails for a reason other than space. Out
    /// of space while the checkpoint holds records — whose buffers, and the blocks they
    /// replace, it frees as it moves them — the writer waits for it and tries again rather
    /// than fail a write that will fit in a moment; `NoSpace` when nothing is left to free.
    /// Never called with a range lock held (the checkpoint takes range locks).
    pub(crate) fn with_space<T>(&self, mut f: impl FnMut() -> Result<T>) -> Result<T> {
        loop {
            match f() {
                Err(FsError::Volume(volume::VolumeError::NoSpace { .. }))
                    if self.pending_records.load(Ordering::Acquire) > 0 =>
                {
                    self.wait_for_progress()?;
                }
                other => return other,
            }
        }
    }

    /// Copies `len` bytes of persistent memory from `src` to `dst` with non-temporal stores
    /// (durable at the next fence); the ranges must not overlap.
    pub(crate) fn copy_pmem(&self, src: u64, dst: u64, len: u64) -> Result<()> {
        let (from, from_at) = self.region_at(src)?;
        let (to, to_at) = self.region_at(dst)?;
        to.copy_nt_from(to_at, from, from_at, len)?;
        Ok(())
    }

    pub(crate) fn next_order(&self) -> u64 {
        self.order.0.fetch_add(1, Ordering::SeqCst)
    }

    pub(crate) fn inode(&self, ino: u64) -> Option<Arc<Inode>> {
        self.inodes.read().expect("inode table").get(&ino).cloned()
    }

    pub(crate) fn check_running(&self) -> Result<()> {
        let state = self.signal.state.lock().expect("checkpoint state");
        if let Some(why) = &state.failed {
            return Err(FsError::Shutdown(why.clone()));
        }
        if state.stop {
            return Err(FsError::Shutdown("unmounted".into()));
        }
        Ok(())
    }

    /// The calling thread's slot, claiming a free one on first use.
    pub(crate) fn slot(self: &Arc<Self>) -> Result<Arc<Slot>> {
        let found = LEASES.with(|leases| {
            leases
                .borrow()
                .iter()
                .find(|l| l.fs_id == self.id)
                .map(|l| Arc::clone(&l.slot))
        });
        if let Some(slot) = found {
            return Ok(slot);
        }
        let index = {
            let mut in_use = self.slot_in_use.lock().expect("slot table");
            let index = (1..in_use.len())
                .find(|&i| !in_use[i])
                .ok_or(FsError::TooManyThreads(in_use.len() as u32 - 1))?;
            in_use[index] = true;
            index
        };
        let slot = match self.slot_at(index as u32) {
            Ok(slot) => slot,
            Err(e) => {
                self.slot_in_use.lock().expect("slot table")[index] = false;
                return Err(e);
            }
        };
        LEASES.with(|leases| {
            let mut leases = leases.borrow_mut();
            leases.retain(|l| l.fs.strong_count() > 0);
            leases.push(Lease {
                fs_id: self.id,
                fs: Arc::downgrade(self),
                slot: Arc::clone(&slot),
            });
        });
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

    fn create_slot(&self, root: &mut Root, index: u32) -> Result<()> {
        debug_assert_eq!(root.slots.len() as u32, index);
        let journal_len = if index == 0 {
            root.journal_bytes * 16
        } else {
            root.journal_bytes
        };
        let log_len = LogArea::bytes_for(root.log_records).next_multiple_of(BLOCK);
        let log_extent = self.volume.alloc_local(log_len)?;
        let journal_extent = match self.volume.alloc_local(journal_len) {
            Ok(e) => e,
            Err(e) => {
                self.volume.free(log_extent)?;
                return Err(e.into());
            }
        };
        let log = LogArea::format(self.volume.region(&log_extent)?, index)?;
        let mut journal = Journal::new(self.volume.region(&journal_extent)?, index, root.epoch);
        journal.reset(root.epoch)?;
        let mut next = root.clone();
        next.generation += 1;
        next.slots.push(SlotAreas {
            log_addr: log_extent.start.raw(),
            log_len,
            journal_addr: journal_extent.start.raw(),
            journal_len,
        });
        next.write(&self.owner)?;
        *root = next;
        let slot = self.make_slot(index, log, journal, VecDeque::new());
        self.slots[index as usize]
            .set(slot)
            .expect("slot created once, under the root lock");
        Ok(())
    }

    pub(crate) fn make_slot(
        &self,
        index: u32,
        log: LogArea,
        journal: Journal,
        pending: VecDeque<Pending>,
    ) -> Arc<Slot> {
        Arc::new(Slot {
            index,
            retired: log.retired_handle(),
            log: Mutex::new(log),
            journal: Mutex::new(journal),
            pending: Mutex::new(pending),
            inflight: InFlight(AtomicU64::new(u64::MAX)),
            pool: Mutex::new(Pool::new(
                self.options.prelim_buffers,
                self.options.prelim_buffer_bytes,
            )),
            counters: SlotCounters::default(),
        })
    }

    /// Logs a metadata operation in the calling thread's journal; the caller holds the gate
    /// shared and the locks that order the operation. Returns false when the journal is full
    /// (the caller drops its locks, waits for a snapshot, and tries again).
    fn journal(&self, slot: &Slot, op: &MetaOp) -> Result<bool> {
        let mut journal = slot.journal.lock().expect("journal");
        let order = self.next_order();
        match journal.append(order, op)? {
            Some(bytes) => {
                slot.counters
                    .media_bytes
                    .fetch_add(bytes, Ordering::Relaxed);
                Ok(true)
            }
            None => Ok(false),
        }
    }

    /// Asks the checkpoint thread for a snapshot and waits until the epoch changes.
    fn wait_for_snapshot(&self) -> Result<()> {
        let epoch = self.root.lock().expect("root").epoch;
        let mut state = self.signal.state.lock().expect("checkpoint state");
        state.snapshot_wanted = true;
        self.signal.wake.notify_all();
        loop {
            if let Some(why) = &state.failed {
                return Err(FsError::Shutdown(why.clone()));
            }
            if self.root.lock().expect("root").epoch != epoch {
                return Ok(());
            }
            state = self
                .signal
                .progress
                .wait_timeout(state, std::time::Duration::from_millis(10))
                .expect("checkpoint state")
                .0;
        }
    }

    /// Waits until every data record logged before now is part of its file.
    pub(crate) fn drain(&self) -> Result<()> {
        let target = self.order.0.load(Ordering::SeqCst);
        let mut state = self.signal.state.lock().expect("checkpoint state");
        while self.done_below.load(Ordering::Acquire) < target {
            if let Some(why) = &state.failed {
                return Err(FsError::Shutdown(why.clone()));
            }
            state.drain_wanted = true;
            if self.signal.sleeping.load(Ordering::Acquire) {
                self.signal.wake.notify_all();
            }
            state = self
                .signal
                .progress
                .wait_timeout(state, std::time::Duration::from_millis(10))
                .expect("checkpoint state")
                .0;
        }
        Ok(())
    }

    /// Waits for checkpoint progress (a writer out of log space or buffers).
    fn wait_for_progress(&self) -> Result<()> {
        self.counters.waits.fetch_add(1, Ordering::Relaxed);
        let mut state = self.signal.state.lock().expect("checkpoint state");
        if let Some(why) = &state.failed {
            return Err(FsError::Shutdown(why.clone()));
        }
        state.drain_wanted = true;
        self.signal.wake.notify_all();
        drop(
            self.signal
                .progress
                .wait_timeout(state, std::time::Duration::from_millis(5))
                .expect("checkpoint state"),
        );
        Ok(())
    }

    fn wake_checkpoint(&self) {
        if self.signal.sleeping.load(Ordering::Acquire) {
            let _state = self.signal.state.lock().expect("checkpoint state");
            self.signal.wake.notify_all();
        }
    }

    // ---- namespace ----

    fn lookup_in(&self, dir: &Inode, name: &str, shown: &str) -> Result<Arc<Inode>> {
        if dir.kind != Kind::Dir {
            return Err(FsError::NotDir(shown.to_owned()));
        }
        let ino = dir
            .entries
            .lock()
            .expect("directory")
            .get(name)
            .copied()
            .ok_or_else(|| FsError::NotFound(shown.to_owned()))?;
        self.inode(ino)
            .ok_or_else(|| FsError::NotFound(shown.to_owned()))
    }

    pub(crate) fn resolve(&self, path: &str) -> Result<Arc<Inode>> {
        let mut at = self.inode(ROOT_INO).expect("root directory");
        for name in path::components(path)? {
            at = self.lookup_in(&at, name, path)?;
        }
        Ok(at)
    }

    /// The directory holding the last name of `path`, and that name.
    fn resolve_parent<'p>(&self, path: &'p str) -> Result<(Arc<Inode>, &'p str)> {
        let mut names = path::components(path)?;
        let name = names.pop().ok_or_else(|| {
            FsError::Invalid("the root directory cannot be changed this way".into())
        })?;
        let mut at = self.inode(ROOT_INO).expect("root directory");
        for n in names {
            at = self.lookup_in(&at, n, path)?;
        }
        if at.kind != Kind::Dir {
            return Err(FsError::NotDir(path.to_owned()));
        }
        Ok((at, name))
    }

    /// Runs a metadata operation, retrying after a snapshot if the journal was full.
    fn metadata<T>(
        self: &Arc<Self>,
        mut op: impl FnMut(&Self, &Slot) -> Result<Option<T>>,
    ) -> Result<T> {
        self.check_running()?;
        let slot = self.slot()?;
        loop {
            let gate = self.gate.read().expect("metadata gate");
            let done = op(self, &slot)?;
            drop(gate);
            match done {
                Some(value) => return Ok(value),
                None => self.wait_for_snapshot()?,
            }
        }
    }

    fn create(self: &Arc<Self>, path: &str, kind: Kind, mode: u32) -> Result<Arc<Inode>> {
        self.metadata(|fs, slot| {
            let (parent, name) = fs.resolve_parent(path)?;
            let mut entries = parent.entries.lock().expect("directory");
            if parent.attr().unlinked {
                return Err(FsError::NotFound(path.to_owned()));
            }
            if entries.contains_key(name) {
                return Err(FsError::Exists(path.to_owned()));
            }
            let ino = fs.next_ino.fetch_add(1, Ordering::Relaxed);
            let time = now_ns();
            let op = MetaOp::Create {
                parent: parent.ino,
                ino,
                kind,
                mode,
                time,
                name: name.to_owned(),
            };
            if !fs.journal(slot, &op)? {
                return Ok(None);
            }
            let inode = Arc::new(Inode::new(
                ino,
                kind,
                Attr {
                    mode,
                    mtime: time,
                    parent: if kind == Kind::Dir { parent.ino } else { 0 },
                    unlinked: false,
                },
                fs.root.lock().expect("root").granule,
            ));
            fs.inodes
                .write()
                .expect("inode table")
                .insert(ino, Arc::clone(&inode));
            entries.insert(name.to_owned(), ino);
            parent.attr().mtime = time;
            Ok(Some(inode))
        })
    }

    fn remove(self: &Arc<Self>, path: &str, dir: bool) -> Result<()> {
        self.metadata(|fs, slot| {
            // rmdir locks parent then child; renames (which lock directories in inode order)
            // are kept out by the rename lock.
            let _rename = dir.then(|| fs.rename.lock().expect("rename lock"));
            let (parent, name) = fs.resolve_parent(path)?;
            let mut entries = parent.entries.lock().expect("directory");
            let ino = *entries
                .get(name)
                .ok_or_else(|| FsError::NotFound(path.to_owned()))?;
            let target = fs
                .inode(ino)
                .ok_or_else(|| FsError::NotFound(path.to_owned()))?;
            match (dir, target.kind) {
                (true, Kind::File) => return Err(FsError::NotDir(path.to_owned())),
                (false, Kind::Dir) => return Err(FsError::IsDir(path.to_owned())),
                _ => {}
            }
            let child_entries = dir.then(|| target.entries.lock().expect("directory"));
            if child_entries.as_ref().is_some_and(|e| !e.is_empty()) {
                return Err(FsError::NotEmpty(path.to_owned()));
            }
            let time = now_ns();
            let op = MetaOp::Remove {
                parent: parent.ino,
                ino,
                name: name.to_owned(),
                time,
            };
            if !fs.journal(slot, &op)? {
                return Ok(None);
            }
            entries.remove(name);
            parent.attr().mtime = time;
            drop(child_entries);
            fs.unlinked(&target)?;
            Ok(Some(()))
        })
    }

    /// `inode` lost its name: forget it now, or at its last close.
    fn unlinked(&self, inode: &Arc<Inode>) -> Result<()> {
        inode.attr().unlinked = true;
        if inode.opens.load(Ordering::Acquire) == 0 {
            self.destroy(inode)?;
        }
        Ok(())
    }

    /// Drops an unlinked, closed inode and frees its blocks. Its removal is durable already,
    /// so after a crash nothing owns these blocks either.
    pub(crate) fn destroy(&self, inode: &Arc<Inode>) -> Result<()> {
        if self
            .inodes
            .write()
            .expect("inode table")
            .remove(&inode.ino)
            .is_none()
        {
            return Ok(());
        }
        let mut extents = inode.extents.write().expect("extent map");
        inode.dead.store(true, Ordering::Release);
        let runs = extents.truncate(0);
        drop(extents);
        inode.overlay.truncate(0);
        self.free_runs(&runs)
    }

    pub(crate) fn free_runs(&self, runs: &[Run]) -> Result<()> {
        for run in runs {
            self.volume.free(Extent {
                start: GlobalAddress::from_raw(run.addr),
                len_bytes: run.blocks * BLOCK,
            })?;
        }
        Ok(())
    }

    fn rename(self: &Arc<Self>, from: &str, to: &str) -> Result<()> {
        self.metadata(|fs, slot| {
            let _rename = fs.rename.lock().expect("rename lock");
            let (src, src_name) = fs.resolve_parent(from)?;
            let (dst, dst_name) = fs.resolve_parent(to)?;
            // Lock both directories in inode order.
            let (first, second) = if src.ino <= dst.ino {
                (&src, &dst)
            } else {
                (&dst, &src)
            };
            let mut first_entries = first.entries.lock().expect("directory");
            let mut second_entries =
                (first.ino != second.ino).then(|| second.entries.lock().expect("directory"));
            macro_rules! entries_of {
                ($dir:expr) => {
                    if $dir.ino == first.ino {
                        &mut *first_entries
                    } else {
                        &mut **second_entries.as_mut().expect("two directories")
                    }
                };
            }
            let ino = *entries_of!(src)
                .get(src_name)
                .ok_or_else(|| FsError::NotFound(from.to_owned()))?;
            let moving = fs
                .inode(ino)
                .ok_or_else(|| FsError::NotFound(from.to_owned()))?;
            if dst.attr().unlinked {
                return Err(FsError::NotFound(to.to_owned()));
            }
            if moving.kind == Kind::Dir {
                // The target directory must not be the moving one or inside it.
                let mut at = dst.ino;
                loop {
                    if at == ino {
                        return Err(FsError::Invalid(format!(
                            "cannot move {from} into itself ({to})"
                        )));
                    }
                    if at == ROOT_INO {
                        break;
                    }
                    at = fs.inode(at).map_or(ROOT_INO, |i| i.attr().parent);
                }
            }
            let replaced = entries_of!(dst).get(dst_name).copied();
            if replaced == Some(ino) {
                return Ok(Some(()));
            }
            let target = replaced.and_then(|r| fs.inode(r));
            let target_entries = match (&target, moving.kind) {
                (Some(t), Kind::Dir) if t.kind == Kind::File => {
                    return Err(FsError::NotDir(to.to_owned()));
                }
                (Some(t), Kind::File) if t.kind == Kind::Dir => {
                    return Err(FsError::IsDir(to.to_owned()));
                }
                (Some(t), Kind::Dir) => {
                    let e = t.entries.lock().expect("directory");
                    if !e.is_empty() {
                        return Err(FsError::NotEmpty(to.to_owned()));
                    }
                    Some(e)
                }
                _ => None,
            };
            let op = MetaOp::Rename {
                src_parent: src.ino,
                src_name: src_name.to_owned(),
                dst_parent: dst.ino,
                dst_name: dst_name.to_owned(),
                ino,
                replaced: replaced.unwrap_or(0),
                time: now_ns(),
            };
            if !fs.journal(slot, &op)? {
                return Ok(None);
            }
            let MetaOp::Rename { time, .. } = op else {
                unreachable!("built above")
            };
            drop(target_entries);
            entries_of!(src).remove(src_name);
            entries_of!(dst).insert(dst_name.to_owned(), ino);
            if moving.kind == Kind::Dir {
                moving.attr().parent = dst.ino;
            }
            src.attr().mtime = time;
            dst.attr().mtime = time;
            if let Some(t) = target {
                fs.unlinked(&t)?;
            }
            Ok(Some(()))
        })
    }

    fn set_len(self: &Arc<Self>, inode: &Arc<Inode>, size: u64) -> Result<()> {
        if size > MAX_FILE_SIZE {
            return Err(FsError::Invalid(format!(
                "size {size} is over the largest file ({MAX_FILE_SIZE})"
            )));
        }
        self.check_running()?;
        let slot = self.slot()?;
        loop {
            // Keep writers, readers and the checkpoint off the whole file; dropped (with the
            // gate) before waiting for a snapshot, which the checkpoint could not take
            // otherwise.
            let batch = self.batch.lock().expect("batch lock");
            let range = inode.locks.lock(0, WHOLE_FILE, LockMode::Exclusive)?;
            let gate = self.gate.read().expect("metadata gate");
            let done = self.truncate_locked(&slot, inode, size)?;
            drop(gate);
            drop(range);
            drop(batch);
            if done {
                return Ok(());
            }
            self.wait_for_snapshot()?;
        }
    }

    fn punch_hole(self: &Arc<Self>, inode: &Arc<Inode>, offset: u64, len: u64) -> Result<()> {
        let end = (offset + len).min(inode.size.load(Ordering::Acquire));
        if offset >= end {
            return Ok(());
        }
        let (first, last) = (offset.div_ceil(BLOCK), end / BLOCK);
        if first >= last {
            // Inside one block: zeros are all it takes.
            return self.write_at(inode, &ZEROS[..(end - offset) as usize], offset);
        }
        // The partial blocks at the edges get zeros, as writes; they are logged before the
        // hole's record, so replay orders them the same way.
        if offset < first * BLOCK {
            self.write_at(inode, &ZEROS[..(first * BLOCK - offset) as usize], offset)?;
        }
        if last * BLOCK < end {
            self.write_at(inode, &ZEROS[..(end - last * BLOCK) as usize], last * BLOCK)?;
        }
        self.check_running()?;
        let slot = self.slot()?;
        loop {
            // As truncation: no batch half done, writers and readers off the range.
            let batch = self.batch.lock().expect("batch lock");
            let range =
                inode
                    .locks
                    .lock(first * BLOCK, (last - first) * BLOCK, LockMode::Exclusive)?;
            let gate = self.gate.read().expect("metadata gate");
            let time = now_ns();
            let op = MetaOp::Punch {
                ino: inode.ino,
                first_block: first,
                blocks: last - first,
                time,
            };
            if self.journal(&slot, &op)? {
                let freed = inode
                    .extents
                    .write()
                    .expect("extent map")
                    .punch(first, last);
                inode.overlay.punch(first * BLOCK, last * BLOCK);
                inode.attr().mtime = time;
                drop(gate);
                drop(range);
                drop(batch);
                return self.free_runs(&freed);
            }
            drop(gate);
            drop(range);
            drop(batch);
            self.wait_for_snapshot()?;
        }
    }

    fn truncate_locked(&self, slot: &Slot, inode: &Inode, size: u64) -> Result<bool> {
        let fs = self;
        {
            let old = inode.size.load(Ordering::Acquire);
            // Shrinking into the middle of a block: the block's kept bytes go to a fresh page,
            // mapped by the same record, so the old block is never changed in place.
            let mut tail = 0u64;
            if size < old && !size.is_multiple_of(BLOCK) {
                let block = size / BLOCK;
                let mut bytes = vec![0u8; BLOCK as usize];
                fs.read_into(inode, block * BLOCK, &mut bytes[..(size % BLOCK) as usize])?;
                let extent = fs.volume.alloc_local(BLOCK)?;
                let (region, offset) = fs.region_at(extent.start.raw())?;
                region.write_nt(offset, &bytes)?;
                fs.volume.fence();
                slot.counters
                    .media_bytes
                    .fetch_add(BLOCK, Ordering::Relaxed);
                tail = extent.start.raw();
            }
            let time = now_ns();
            let op = MetaOp::Truncate {
                ino: inode.ino,
                size,
                time,
                tail,
            };
            if !fs.journal(slot, &op)? {
                if tail != 0 {
                    fs.free_runs(&[Run {
                        file_block: 0,
                        blocks: 1,
                        addr: tail,
                    }])?;
                }
                return Ok(false);
            }
            let mut extents = inode.extents.write().expect("extent map");
            let mut freed = extents.truncate(size.div_ceil(BLOCK));
            if tail != 0 {
                freed.extend(extents.map(size / BLOCK, 1, tail));
            }
            inode.overlay.truncate(size);
            inode.size.store(size, Ordering::Release);
            inode.attr().mtime = time;
            drop(extents);
            fs.free_runs(&freed)?;
            Ok(true)
        }
    }

    fn set_mode(self: &Arc<Self>, path: &str, mode: u32) -> Result<()> {
        self.metadata(|fs, slot| {
            let inode = fs.resolve(path)?;
            let mut attr = inode.attr();
            let op = MetaOp::SetMode {
                ino: inode.ino,
                mode,
            };
            if !fs.journal(slot, &op)? {
                return Ok(None);
            }
            attr.mode = mode;
            Ok(Some(()))
        })
    }

    fn stat_of(&self, inode: &Inode) -> Stat {
        let attr = inode.attr().clone();
        let (size, nlink) = match inode.kind {
            Kind::File => (inode.size.load(Ordering::Acquire), 1),
            Kind::Dir => {
                let entries = inode.entries.lock().expect("directory");
                let subdirs = entries
                    .values()
                    .filter(|&&i| self.inode(i).is_some_and(|c| c.kind == Kind::Dir))
                    .count() as u64;
                (entries.len() as u64, 2 + subdirs)
            }
        };
        Stat {
            ino: inode.ino,
            kind: inode.kind,
            mode: attr.mode,
            size,
            allocated: inode.extents.read().expect("extent map").mapped_blocks() * BLOCK,
            mtime_ns: attr.mtime,
            nlink,
        }
    }

    // ---- data ----

    /// Reads `buf.len()` bytes at `offset` as the file holds them now (the caller clamps to
    /// the size and holds the range shared).
    pub(crate) fn read_into(&self, inode: &Inode, offset: u64, buf: &mut [u8]) -> Result<()> {
        let mut at = 0;
        for (len, source) in self.pieces(inode, offset, buf.len() as u64)? {
            let out = &mut buf[at..at + len as usize];
            match source {
                Some((region, region_offset)) => region.read(region_offset, out)?,
                None => out.fill(0),
            }
            at += len as usize;
        }
        Ok(())
    }

    /// Where the bytes `[offset, offset + len)` of `inode` are now, in file order: pieces of
    /// `(length, Some((region, offset)))` in persistent memory (newest logged data over
    /// checkpointed extents) or `(length, None)` for holes. The caller holds the range lock,
    /// so the answer stays true while it does.
    pub(crate) fn pieces(&self, inode: &Inode, offset: u64, len: u64) -> Result<Vec<Piece<'_>>> {
        let end = offset + len;
        let runs = inode
            .extents
            .read()
            .expect("extent map")
            .lookup(offset / BLOCK, end.div_ceil(BLOCK));
        let pieces = inode.overlay.lookup(offset, end);
        // (file start, file end, source address or None for zeros), covering the range.
        let mut segments: Vec<(u64, u64, Option<u64>)> = Vec::new();
        let mut runs = runs.iter().peekable();
        let mut base = |from: u64, to: u64, out: &mut Vec<(u64, u64, Option<u64>)>| {
            let mut at = from;
            while at < to {
                while runs
                    .peek()
                    .is_some_and(|r| (r.file_block + r.blocks) * BLOCK <= at)
                {
                    runs.next();
                }
                match runs.peek() {
                    Some(run) if run.file_block * BLOCK <= at => {
                        let run_end = ((run.file_block + run.blocks) * BLOCK).min(to);
                        out.push((at, run_end, Some(run.addr + (at - run.file_block * BLOCK))));
                        at = run_end;
                    }
                    next => {
                        let hole_end = next.map_or(to, |r| (r.file_block * BLOCK).min(to));
                        out.push((at, hole_end, None));
                        at = hole_end;
                    }
                }
            }
        };
        let mut at = offset;
        for piece in &pieces {
            base(at, piece.start, &mut segments);
            segments.push((piece.start, piece.end, Some(piece.src)));
            at = piece.end;
        }
        base(at, end, &mut segments);

        segments
            .into_iter()
            .map(|(start, stop, source)| {
                let place = match source {
                    Some(addr) => Some(self.region_at(addr)?),
                    None => None,
                };
                Ok((stop - start, place))
            })
            .collect()
    }

    /// Waits until the slot's log area has a free record slot. Only the slot's thread
    /// appends, so the space stays free until it does. Called before taking a range lock:
    /// a writer never waits for the checkpoint while holding one (the checkpoint needs them).
    fn reserve_log(&self, slot: &Slot) -> Result<()> {
        loop {
            let log = slot.log.lock().expect("log area");
            if log.pending() < log.capacity() {
                return Ok(());
            }
            drop(log);
            self.wait_for_progress()?;
        }
    }

    /// Commits data already persisted at `buffer` as the bytes `[offset, offset + len)` of
    /// `inode`: one log record, then the overlay. Takes the range lock for exactly that.
    fn commit(
        &self,
        slot: &Slot,
        inode: &Inode,
        offset: u64,
        len: u64,
        buffer: u64,
        set: Arc<BufferSet>,
    ) -> Result<()> {
        let time = now_ns();
        self.reserve_log(slot)?;
        let _range = inode.locks.lock(offset, len, LockMode::Exclusive)?;
        let mut log = slot.log.lock().expect("log area");
        // Publish a lower bound of the order about to be taken, so the checkpoint never
        // passes it before the record is queued.
        slot.inflight
            .0
            .store(self.order.0.load(Ordering::SeqCst), Ordering::SeqCst);
        let order = self.next_order();
        let record = match log.append(inode.ino, offset, len, buffer, order, time) {
            Ok(record) => record,
            Err(e) => {
                slot.inflight.0.store(u64::MAX, Ordering::SeqCst);
                return Err(e);
            }
        };
        drop(log);
        inode.overlay.insert(offset, len, buffer, order);
        inode.size.fetch_max(offset + len, Ordering::AcqRel);
        if record.mtime != 0 {
            // Recovery takes the largest time of the records it replays: so does this.
            let mut attr = inode.attr();
            attr.mtime = attr.mtime.max(record.mtime);
        }
        let depth = {
            let mut pending = slot.pending.lock().expect("pending queue");
            pending.push_back(Pending {
                slot: slot.index,
                seq: record.sequence,
                order,
                ino: inode.ino,
                offset,
                len,
                set,
                mtime: record.mtime,
            });
            pending.len()
        };
        slot.inflight.0.store(u64::MAX, Ordering::SeqCst);
        self.pending_records.fetch_add(1, Ordering::Relaxed);
        slot.counters.writes.fetch_add(1, Ordering::Relaxed);
        slot.counters.caller_bytes.fetch_add(len, Ordering::Relaxed);
        slot.counters
            .media_bytes
            .fetch_add(crate::log::SLOT_BYTES, Ordering::Relaxed);
        if depth.is_multiple_of(crate::checkpoint::GATHER_RECORDS) {
            self.wake_checkpoint();
        }
        Ok(())
    }

    fn write_at(self: &Arc<Self>, inode: &Arc<Inode>, data: &[u8], offset: u64) -> Result<()> {
        let len = data.len() as u64;
        check_io(offset, len)?;
        if len == 0 {
            return Ok(());
        }
        let slot = self.slot()?;
        // Buffer space and the copy come before the range lock: the data is private to
        // this thread until its record is committed.
        let (set, addr) = if len > self.options.prelim_buffer_bytes {
            // Too large for the pool: a buffer of its own, at the file's in-page offset so
            // its whole blocks can be remapped.
            let extent = self.with_space(|| self.alloc_buffer(len + offset % BLOCK))?;
            (
                Arc::new(BufferSet::sealed_with(vec![extent], 1)),
                extent.start.raw() + offset % BLOCK,
            )
        } else {
            loop {
                let reserved = self.with_space(|| {
                    slot.pool.lock().expect("buffer pool").reserve(
                        &self.volume,
                        offset,
                        len,
                        &|bytes| self.alloc_buffer(bytes),
                    )
                })?;
                match reserved {
                    Reserve::Placed(p) => break (p.set, p.addr),
                    Reserve::Wait => self.wait_for_progress()?,
                }
            }
        };
        let (region, at) = self.region_at(addr)?;
        region.write_nt(at, data)?;
        // The data is durable before the record that points at it can be.
        self.volume.fence();
        slot.counters.media_bytes.fetch_add(len, Ordering::Relaxed);
        self.commit(&slot, inode, offset, len, addr, set)
    }

    fn write_buffer(
        self: &Arc<Self>,
        inode: &Arc<Inode>,
        buffer: Buffer,
        offset: u64,
    ) -> Result<()> {
        let len = buffer.len;
        check_io(offset, len)?;
        let slot = self.slot()?;
        // `Buffer::write` stored with `write_nt` (edges flushed, or msynced on ordinary
        // files): the fence makes the whole buffer durable before its record is written.
        self.volume.fence();
        slot.counters.media_bytes.fetch_add(len, Ordering::Relaxed);
        let extent = buffer.into_extent();
        let set = Arc::new(BufferSet::sealed_with(vec![extent], 1));
        self.commit(&slot, inode, offset, len, extent.start.raw(), set)
    }

    pub(crate) fn stats(&self) -> FsStats {
        let mut caller_bytes = 0;
        let mut media_bytes = 0;
        let mut writes = 0;
        for slot in self.slots.iter().filter_map(OnceLock::get) {
            caller_bytes += slot.counters.caller_bytes.load(Ordering::Relaxed);
            media_bytes += slot.counters.media_bytes.load(Ordering::Relaxed);
            writes += slot.counters.writes.load(Ordering::Relaxed);
        }
        let c = &self.counters;
        media_bytes +=
            c.copied_bytes.load(Ordering::Relaxed) + c.metadata_bytes.load(Ordering::Relaxed);
        FsStats {
            caller_bytes,
            media_bytes,
            write_amplification: if caller_bytes == 0 {
                0.0
            } else {
                media_bytes as f64 / caller_bytes as f64
            },
            writes,
            records_pending: self.pending_records.load(Ordering::Relaxed),
            checkpoint_lag: self
                .order
                .0
                .load(Ordering::Relaxed)
                .saturating_sub(self.done_below.load(Ordering::Relaxed)),
            checkpoint_batches: c.checkpoint_batches.load(Ordering::Relaxed),
            checkpointed_records: c.checkpointed_records.load(Ordering::Relaxed),
            remapped_blocks: c.remapped_blocks.load(Ordering::Relaxed),
            copied_bytes: c.copied_bytes.load(Ordering::Relaxed),
            snapshots: c.snapshots.load(Ordering::Relaxed),
            backpressure_waits: c.waits.load(Ordering::Relaxed),
            inodes: self.inodes.read().expect("inode table").len() as u64,
        }
    }
}

fn check_io(offset: u64, len: u64) -> Result<()> {
    if len > MAX_IO {
        return Err(FsError::Invalid(format!(
            "{len} bytes in one call; at most {MAX_IO}"
        )));
    }
    match offset.checked_add(len) {
        Some(end) if end <= MAX_FILE_SIZE => Ok(()),
        _ => Err(FsError::Invalid(format!(
            "{len} bytes at offset {offset} end beyond the largest file ({MAX_FILE_SIZE})"
        ))),
    }
}

/// Stops the checkpoint and writes the final snapshot when the last handle goes.
#[derive(Debug)]
pub(crate) struct Mount {
    pub(crate) inner: Arc<Inner>,
    pub(crate) thread: Mutex<Option<std::thread::JoinHandle<()>>>,
}

impl Drop for Mount {
    fn drop(&mut self) {
        if let Err(e) = crate::checkpoint::unmount(&self.inner, &self.thread) {
            tracing::error!(error = %e, "unmount failed; recovery will replay the logs at next open");
        }
    }
}

/// An open file system. Cheap to clone; the last clone (with every [`File`]) unmounts it:
/// everything is checkpointed and a final snapshot is written.
#[derive(Debug, Clone)]
pub struct Fs {
    pub(crate) inner: Arc<Inner>,
    pub(crate) mount: Arc<Mount>,
}

impl Fs {
    /// Opens `path`. See [`OpenOptions`].
    pub fn open_file(&self, path: &str, options: OpenOptions) -> Result<File> {
        let inode = match self.inner.resolve(path) {
            Ok(inode) if options.create && options.exclusive => {
                let _ = inode;
                return Err(FsError::Exists(path.to_owned()));
            }
            Ok(inode) => inode,
            Err(FsError::NotFound(_)) if options.create => {
                match self.inner.create(path, Kind::File, options.mode) {
                    Ok(inode) => inode,
                    // Lost a race with another creator: open theirs.
                    Err(FsError::Exists(_)) if !options.exclusive => self.inner.resolve(path)?,
                    Err(e) => return Err(e),
                }
            }
            Err(e) => return Err(e),
        };
        if inode.kind == Kind::Dir && options.write {
            return Err(FsError::IsDir(path.to_owned()));
        }
        inode.opens.fetch_add(1, Ordering::AcqRel);
        let file = File {
            fs: self.clone(),
            inode,
            read: options.read,
            write: options.write,
        };
        if options.truncate {
            if !options.write {
                return Err(FsError::BadHandle(format!(
                    "{path}: truncate needs write access"
                )));
            }
            file.set_len(0)?;
        }
        Ok(file)
    }

    /// Opens an existing file for reading.
    pub fn open_read(&self, path: &str) -> Result<File> {
        self.open_file(path, OpenOptions::default())
    }

    /// Creates (or opens and keeps) a file for reading and writing.
    pub fn create(&self, path: &str) -> Result<File> {
        self.open_file(path, OpenOptions::create())
    }

    /// Makes a directory.
    pub fn mkdir(&self, path: &str, mode: u32) -> Result<()> {
        self.inner.create(path, Kind::Dir, mode).map(drop)
    }

    /// Removes an empty directory.
    pub fn rmdir(&self, path: &str) -> Result<()> {
        self.inner.remove(path, true)
    }

    /// Removes a file's name; its blocks are freed when the last handle closes.
    pub fn unlink(&self, path: &str) -> Result<()> {
        self.inner.remove(path, false)
    }

    /// Moves `from` to `to` atomically, replacing a file there (or an empty directory, when
    /// moving a directory).
    pub fn rename(&self, from: &str, to: &str) -> Result<()> {
        self.inner.rename(from, to)
    }

    /// Sets the size of the file at `path`.
    pub fn truncate(&self, path: &str, size: u64) -> Result<()> {
        let inode = self.inner.resolve(path)?;
        if inode.kind == Kind::Dir {
            return Err(FsError::IsDir(path.to_owned()));
        }
        self.inner.set_len(&inode, size)
    }

    /// Changes permission bits.
    pub fn chmod(&self, path: &str, mode: u32) -> Result<()> {
        self.inner.set_mode(path, mode)
    }

    /// Attributes of `path`.
    pub fn stat(&self, path: &str) -> Result<Stat> {
        let inode = self.inner.resolve(path)?;
        Ok(self.inner.stat_of(&inode))
    }

    /// The entries of a directory, sorted by name.
    pub fn readdir(&self, path: &str) -> Result<Vec<DirEntry>> {
        let dir = self.inner.resolve(path)?;
        if dir.kind != Kind::Dir {
            return Err(FsError::NotDir(path.to_owned()));
        }
        let entries = dir.entries.lock().expect("directory").clone();
        Ok(entries
            .into_iter()
            .filter_map(|(name, ino)| {
                let kind = self.inner.inode(ino)?.kind;
                Some(DirEntry { name, ino, kind })
            })
            .collect())
    }

    /// A persistent buffer of `len` bytes on the calling thread's node, to fill and commit
    /// with [`File::write_buffer`] without a copy.
    pub fn buffer(&self, len: u64) -> Result<Buffer> {
        if len == 0 || len > MAX_IO {
            return Err(FsError::Invalid(format!(
                "buffer of {len} bytes; 1..={MAX_IO}"
            )));
        }
        let extent = self.inner.with_space(|| self.inner.alloc_buffer(len))?;
        let (region, offset) = self.inner.region_at(extent.start.raw())?;
        Ok(Buffer {
            fs: self.clone(),
            region: region.slice(offset, len)?,
            extent: Some(extent),
            len,
        })
    }

    /// Waits until every write logged so far is part of its file.
    pub fn checkpoint(&self) -> Result<()> {
        self.inner.drain()
    }

    /// Counters.
    pub fn stats(&self) -> FsStats {
        self.inner.stats()
    }

    /// Stops the checkpoint thread where it is, without moving what is logged or writing a
    /// snapshot: the media is left as a crash after the last returned operation would leave
    /// it. For recovery tests.
    #[doc(hidden)]
    pub fn abandon(self) {
        {
            let mut state = self.inner.signal.state.lock().expect("checkpoint state");
            state.abandon = true;
            state.stop = true;
            self.inner.signal.wake.notify_all();
        }
        if let Some(handle) = self.mount.thread.lock().expect("checkpoint thread").take() {
            let _ = handle.join();
        }
    }

    /// The volume under the file system.
    pub fn volume(&self) -> &Arc<Volume> {
        &self.inner.volume
    }

    /// Checkpoints everything, writes a final snapshot and stops the checkpoint thread. Other
    /// clones of this handle and open files fail with `Shutdown` afterwards.
    pub fn unmount(self) -> Result<()> {
        crate::checkpoint::unmount(&self.mount.inner, &self.mount.thread)
    }
}

/// An open file. Reads and writes are positional; every write is atomic and durable when it
/// returns. Closing (or dropping) checkpoints what was logged.
#[derive(Debug)]
pub struct File {
    fs: Fs,
    inode: Arc<Inode>,
    read: bool,
    write: bool,
}

impl File {
    fn writable(&self) -> Result<()> {
        if !self.write {
            return Err(FsError::BadHandle(
                "the file is not open for writing".into(),
            ));
        }
        self.fs.inner.check_running()
    }

    /// Writes `data` at `offset`: copied into a preliminary buffer with non-temporal stores,
    /// then committed by one log record.
    pub fn write_at(&self, data: &[u8], offset: u64) -> Result<()> {
        self.writable()?;
        self.fs.inner.write_at(&self.inode, data, offset)
    }

    /// Commits a filled persistent buffer as the bytes at `offset`, without copying it. Its
    /// whole blocks are later remapped into the file when `offset` is 4 KiB aligned.
    pub fn write_buffer(&self, buffer: Buffer, offset: u64) -> Result<()> {
        self.writable()?;
        self.fs.inner.write_buffer(&self.inode, buffer, offset)
    }

    /// Reads at `offset`; returns the bytes read (short at the end of the file).
    pub fn read_at(&self, buf: &mut [u8], offset: u64) -> Result<usize> {
        if !self.read {
            return Err(FsError::BadHandle(
                "the file is not open for reading".into(),
            ));
        }
        let size = self.inode.size.load(Ordering::Acquire);
        if offset >= size || buf.is_empty() {
            return Ok(0);
        }
        let n = (buf.len() as u64).min(size - offset).min(MAX_IO);
        let _range = self.inode.locks.lock(offset, n, LockMode::Shared)?;
        // The size may have shrunk while waiting.
        let size = self.inode.size.load(Ordering::Acquire);
        let n = n.min(size.saturating_sub(offset));
        self.fs
            .inner
            .read_into(&self.inode, offset, &mut buf[..n as usize])?;
        Ok(n as usize)
    }

    /// Lends the bytes of `[offset, offset + len)`, clipped to the file, to `f` as slices in
    /// file order — the persistent memory that holds them, not a copy (holes lend zeros) —
    /// and returns how many bytes they cover with what `f` returned. Writers of the range
    /// and the checkpoint wait while `f` runs, so it should only hand the bytes on (a
    /// socket send that would block should copy what is left and return).
    pub fn read_with<R>(
        &self,
        offset: u64,
        len: u64,
        f: impl FnOnce(&[&[u8]]) -> R,
    ) -> Result<(u64, R)> {
        if !self.read {
            return Err(FsError::BadHandle(
                "the file is not open for reading".into(),
            ));
        }
        let size = self.inode.size.load(Ordering::Acquire);
        let n = len.min(size.saturating_sub(offset)).min(MAX_IO);
        if n == 0 {
            return Ok((0, f(&[])));
        }
        let range = self.inode.locks.lock(offset, n, LockMode::Shared)?;
        let size = self.inode.size.load(Ordering::Acquire);
        let n = n.min(size.saturating_sub(offset));
        let result = crate::lend::lend(&self.fs.inner, &self.inode, &range, offset, n, f)?;
        Ok((n, result))
    }

    /// The parts of `[offset, offset + len)` (clipped to the file) that hold written data, as
    /// sorted, disjoint `[start, end)` byte ranges; everything else is a hole that reads as
    /// zeros and uses no memory. Ranges follow the 4 KiB blocks of checkpointed extents and
    /// the exact bytes of writes still in the logs.
    pub fn data_ranges(&self, offset: u64, len: u64) -> Result<Vec<std::ops::Range<u64>>> {
        let end = offset.saturating_add(len).min(self.len());
        if offset >= end {
            return Ok(Vec::new());
        }
        // The checkpoint moves a write from the overlay to the extents under its range lock.
        let _range = self
            .inode
            .locks
            .lock(offset, end - offset, LockMode::Shared)?;
        let mut ranges: Vec<std::ops::Range<u64>> = self
            .inode
            .extents
            .read()
            .expect("extent map")
            .lookup(offset / BLOCK, end.div_ceil(BLOCK))
            .into_iter()
            .map(|run| {
                let start = run.file_block * BLOCK;
                start.max(offset)..(start + run.blocks * BLOCK).min(end)
            })
            .collect();
        ranges.extend(
            self.inode
                .overlay
                .lookup(offset, end)
                .into_iter()
                .map(|piece| piece.start..piece.end),
        );
        ranges.sort_unstable_by_key(|r| r.start);
        let mut merged: Vec<std::ops::Range<u64>> = Vec::with_capacity(ranges.len());
        for range in ranges.into_iter().filter(|r| r.start < r.end) {
            match merged.last_mut() {
                Some(last) if range.start <= last.end => last.end = last.end.max(range.end),
                _ => merged.push(range),
            }
        }
        Ok(merged)
    }

    /// Makes `[offset, offset + len)` read as zeros and gives the memory of the whole blocks
    /// inside it back to the volume (a hole, as `fallocate(PUNCH_HOLE | KEEP_SIZE)`): those
    /// blocks are unmapped by one journal record, the partial blocks at the edges get zeros
    /// written. The size never changes; the part of the range beyond the end is ignored.
    /// Not bounded by [`MAX_IO`]: no data moves.
    pub fn punch_hole(&self, offset: u64, len: u64) -> Result<()> {
        self.writable()?;
        if offset
            .checked_add(len)
            .is_none_or(|end| end > MAX_FILE_SIZE)
        {
            return Err(FsError::Invalid(format!(
                "{len} bytes at offset {offset} end beyond the largest file ({MAX_FILE_SIZE})"
            )));
        }
        self.fs.inner.punch_hole(&self.inode, offset, len)
    }

    /// Sets the size (grow with zeros or shrink).
    pub fn set_len(&self, size: u64) -> Result<()> {
        self.writable()?;
        self.fs.inner.set_len(&self.inode, size)
    }

    /// Bytes in the file.
    pub fn len(&self) -> u64 {
        self.inode.size.load(Ordering::Acquire)
    }

    /// True for an empty file.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Attributes.
    pub fn stat(&self) -> Stat {
        self.fs.inner.stat_of(&self.inode)
    }

    /// A barrier: every write returned before is durable (they were at return already).
    pub fn sync_all(&self) -> Result<()> {
        std::sync::atomic::fence(Ordering::SeqCst);
        self.fs.inner.check_running()
    }

    /// The inode number.
    pub fn ino(&self) -> u64 {
        self.inode.ino
    }

    /// The file system this file belongs to.
    pub fn fs(&self) -> &Fs {
        &self.fs
    }

    /// Closes the file after checkpointing everything logged so far.
    pub fn close(self) -> Result<()> {
        let result = if self.write {
            self.fs.inner.drain()
        } else {
            Ok(())
        };
        drop(self);
        result
    }
}

impl Drop for File {
    fn drop(&mut self) {
        if self.inode.opens.fetch_sub(1, Ordering::AcqRel) == 1
            && self.inode.attr().unlinked
            && let Err(e) = self.fs.inner.destroy(&self.inode)
        {
            tracing::error!(error = %e, ino = self.inode.ino, "freeing an unlinked file failed");
        }
    }
}

/// A persistent buffer from [`Fs::buffer`]: fill it, then commit it with
/// [`File::write_buffer`]. Dropped uncommitted, its memory goes back to the volume.
#[derive(Debug)]
pub struct Buffer {
    fs: Fs,
    region: Region,
    extent: Option<Extent>,
    len: u64,
}

impl Buffer {
    /// Length in bytes.
    pub fn len(&self) -> u64 {
        self.len
    }

    /// True for an empty buffer (never: buffers hold at least one byte).
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Copies `data` in at `offset` (non-temporal stores).
    pub fn write(&mut self, offset: u64, data: &[u8]) -> Result<()> {
        self.region.write_nt(offset, data)?;
        Ok(())
    }

    /// Copies out.
    pub fn read(&self, offset: u64, buf: &mut [u8]) -> Result<()> {
        self.region.read(offset, buf)?;
        Ok(())
    }

    /// The node the buffer's memory is on, if known.
    pub fn node(&self) -> Option<u32> {
        self.extent
            .and_then(|e| self.fs.inner.volume.device_node(e.device()))
    }

    fn into_extent(mut self) -> Extent {
        self.extent
            .take()
            .expect("an uncommitted buffer has its extent")
    }
}

impl Drop for Buffer {
    fn drop(&mut self) {
        if let Some(extent) = self.extent.take()
            && let Err(e) = self.fs.inner.volume.free(extent)
        {
            tracing::error!(error = %e, "freeing an uncommitted buffer failed");
        }
    }
}

/// Checks a format request.
pub(crate) fn check_format(options: &FormatOptions) -> Result<()> {
    if !(2..=MAX_SLOTS).contains(&options.slot_limit) {
        return Err(FsError::Invalid(format!(
            "slot limit {}: 2..={MAX_SLOTS}",
            options.slot_limit
        )));
    }
    if !(64..=crate::log::MAX_RECORDS).contains(&options.log_records) {
        return Err(FsError::Invalid(format!(
            "log records {}: 64..={}",
            options.log_records,
            crate::log::MAX_RECORDS
        )));
    }
    if options.journal_bytes < (64 << 10) || options.journal_bytes > (1 << 30) {
        return Err(FsError::Invalid(format!(
            "journal bytes {}: 64 KiB..=1 GiB",
            options.journal_bytes
        )));
    }
    RangeLocks::new(options.granule)?;
    Ok(())
}

/// Checks run options.
pub(crate) fn check_options(options: &FsOptions) -> Result<()> {
    if !(1..=16).contains(&options.prelim_buffers) {
        return Err(FsError::Invalid(format!(
            "preliminary buffers {}: 1..=16",
            options.prelim_buffers
        )));
    }
    if options.prelim_buffer_bytes < (64 << 10)
        || !options.prelim_buffer_bytes.is_multiple_of(BLOCK)
        || options.prelim_buffer_bytes > MAX_IO
    {
        return Err(FsError::Invalid(format!(
            "preliminary buffer bytes {}: a multiple of 4 KiB in 64 KiB..=1 GiB",
            options.prelim_buffer_bytes
        )));
    }
    if options.checkpoint_batch == 0 {
        return Err(FsError::Invalid("checkpoint batch of 0 records".into()));
    }
    Ok(())
}
