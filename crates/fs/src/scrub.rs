//! Scrubs: reading every block of file data a file system names — its files' blocks and
//! the buffers of logged writes not yet moved into them — and checking each against its data
//! checksum, reporting every damaged block by file, offset and address. `Fs::scrub` reads a
//! volume nobody holds, from what recovery loads; `Fs::scrub_live` reads the running file
//! system beside its writers, a window of a file at a time, and [`ScrubRunner`] runs that in
//! the background for servers (`locus mount`, `locus serve`), whose clients watch it.

use std::collections::{BTreeSet, HashMap, HashSet};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use volume::{GlobalAddress, Volume};

use crate::checksums::Checksums;
use crate::error::{FsError, Result};
use crate::extent_map::BLOCK;
use crate::fs::{Fs, ROOT_INO};
use crate::inode::Inode;
use crate::journal::Kind;
use crate::range_lock::LockMode;

/// What a scrub found.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct ScrubReport {
    /// Files whose data was read.
    pub files: u64,
    /// Distinct 4 KiB blocks read and checked.
    pub blocks: u64,
    /// Every damaged block, in file order.
    pub damaged: Vec<DamagedBlock>,
}

/// What `Fs::salvage` cut from damaged journals and logs.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
pub struct SalvageReport {
    /// Every damage found, as check names it.
    pub damage: Vec<String>,
    /// The file system is kept as of this global order: every record up to it, none after.
    pub kept_through_order: u64,
    /// Metadata operations (journal records) dropped.
    pub dropped_journal_records: u64,
    /// Logged writes (records) dropped, and their bytes.
    pub dropped_writes: u64,
    /// Bytes those writes carried.
    pub dropped_write_bytes: u64,
    /// Damaged records dropped unread: what they did is lost, and the files they touched
    /// (a logged write's file, a removal that freed memory others reused) cannot be named.
    pub unreadable_records: u64,
    /// Files the dropped writes were to, as the kept file system has them (`inode N` for a
    /// file open but unlinked); files only dropped operations created are gone with them.
    pub files_losing_writes: Vec<String>,
    /// Files whose kept contents may name memory a dropped operation had freed and a later
    /// write reused: read them before trusting them.
    pub files_at_risk: Vec<String>,
}

/// One block of data that fails its checksum.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct DamagedBlock {
    /// The file's path (or `inode N` for a file removed while open).
    pub path: String,
    /// Its inode number.
    pub ino: u64,
    /// File offset of the first of the file's bytes the block holds.
    pub offset: u64,
    /// How many of the file's bytes the block holds.
    pub len: u64,
    /// The block's global address.
    pub address: String,
    /// What names the block.
    pub held_by: HeldBy,
}

/// What names a block of data.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, serde::Serialize, serde::Deserialize,
)]
pub enum HeldBy {
    /// The file's block table (checkpointed data).
    #[serde(rename = "file block")]
    FileBlock,
    /// A logged write not yet moved into the file (a block of its buffer).
    #[serde(rename = "logged write")]
    LoggedWrite,
}

impl std::fmt::Display for HeldBy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::FileBlock => "file block",
            Self::LoggedWrite => "logged write",
        })
    }
}

/// Scrubs the files of `inodes` (as recovery loaded them: extent maps and the overlays of
/// logged writes) on `volume`: each device's blocks on a thread of their own, near the device
/// ([`per_device`]).
pub(crate) fn scrub(
    volume: &Volume,
    checksums: &Checksums,
    inodes: &crate::inode::InodeTable,
) -> Result<ScrubReport> {
    let paths = paths(inodes);
    let files = files(inodes.values());
    let held = distinct_blocks(&files);
    let found = per_device(volume, &held, |blocks| {
        let mut block = vec![0u8; BLOCK as usize];
        let mut damaged = Vec::new();
        for &index in blocks {
            let physical = held[index].physical;
            read_block(volume, physical, &mut block)?;
            if !checksums.matches(physical, &block)? {
                damaged.push(index);
            }
        }
        Ok(damaged)
    })?;
    let mut damaged: Vec<usize> = found.into_iter().flatten().collect();
    damaged.sort_unstable();
    let damaged = damaged
        .into_iter()
        .map(|index| {
            let held = held[index];
            let ino = files[held.file as usize].ino;
            DamagedBlock {
                path: paths
                    .get(&ino)
                    .cloned()
                    .unwrap_or_else(|| format!("inode {ino}")),
                ino,
                offset: held.offset,
                len: held.len,
                address: GlobalAddress::from_raw(held.physical).to_string(),
                held_by: held.held_by,
            }
        })
        .collect();
    Ok(ScrubReport {
        files: files.len() as u64,
        blocks: held.len() as u64,
        damaged,
    })
}

/// The files of `inodes`, by inode number.
fn files<'a>(inodes: impl Iterator<Item = &'a Arc<Inode>>) -> Vec<&'a Arc<Inode>> {
    let mut files: Vec<&Arc<Inode>> = inodes.filter(|i| i.kind == Kind::File).collect();
    files.sort_by_key(|i| i.ino);
    files
}

/// A block of data a file holds: where it is, and which of the file's bytes it holds.
#[derive(Debug, Clone, Copy)]
struct Held {
    physical: u64,
    /// Index of the file in the list the blocks were gathered from.
    file: u32,
    offset: u64,
    len: u64,
    held_by: HeldBy,
}

/// Every distinct block of data `files` hold ([`data_blocks`]), file by file in file order;
/// a block two files or two logged writes share is listed once, for the first.
fn distinct_blocks(files: &[&Arc<Inode>]) -> Vec<Held> {
    let mut seen = HashSet::new();
    let mut held = Vec::new();
    for (file, inode) in files.iter().enumerate() {
        for (offset, len, physical, held_by) in data_blocks(inode) {
            if seen.insert(physical) {
                held.push(Held {
                    physical,
                    file: file as u32,
                    offset,
                    len,
                    held_by,
                });
            }
        }
    }
    held
}

/// Runs `work` over the blocks of `held` (by their indexes in it) device by device, each device
/// on a thread of its own pinned to the CPUs of the device's node when that node has any — so
/// every device is read from its own node and the devices at once (scrub and turning
/// checksums on read all of a volume's data). Returns each device's result.
fn per_device<T: Send>(
    volume: &Volume,
    held: &[Held],
    work: impl Fn(&[usize]) -> Result<T> + Sync,
) -> Result<Vec<T>> {
    let mut groups: Vec<Vec<usize>> = vec![Vec::new(); volume.device_count() as usize];
    for (index, &block) in held.iter().enumerate() {
        let device = GlobalAddress::from_raw(block.physical).device() as usize;
        groups
            .get_mut(device)
            .ok_or_else(|| {
                FsError::corrupt(
                    "data block address",
                    format!(
                        "{} is on no device of the volume",
                        GlobalAddress::from_raw(block.physical)
                    ),
                )
            })?
            .push(index);
    }
    let work = &work;
    std::thread::scope(|scope| {
        let threads: Vec<_> = groups
            .iter()
            .enumerate()
            .filter(|(_, blocks)| !blocks.is_empty())
            .map(|(device, blocks)| {
                let cpus = volume
                    .device_node(device as u32)
                    .and_then(|node| volume.topology().node(node))
                    .map(|node| node.cpus.clone())
                    .filter(|cpus| !cpus.is_empty());
                scope.spawn(move || {
                    if let Some(cpus) = cpus {
                        // Only placement: a thread left unpinned still does the work.
                        let _ = topology::pin_current_thread(&cpus);
                    }
                    work(blocks)
                })
            })
            .collect();
        threads
            .into_iter()
            .map(|t| t.join().expect("a device's scrub thread panicked"))
            .collect()
    })
}

/// The blocks of data a file's reads can return, as recovery loaded it — its extent map's
/// blocks and the buffer blocks of logged writes still visible over them — as (file offset,
/// file bytes, physical block, held by), in file order: what a data checksum covers.
pub(crate) fn data_blocks(inode: &Inode) -> Vec<(u64, u64, u64, HeldBy)> {
    let runs: Vec<_> = inode.extents.read().expect("extent map").runs().collect();
    let size = inode.size.load(Ordering::Acquire);
    blocks_of(&runs, &inode.overlay.lookup(0, size))
}

/// The blocks of `runs` (extent map entries) and of the buffers under `pieces` (logged
/// writes), as [`data_blocks`] lists them.
fn blocks_of(
    runs: &[crate::extent_map::Run],
    pieces: &[crate::overlay::Piece],
) -> Vec<(u64, u64, u64, HeldBy)> {
    let mut blocks = Vec::new();
    for run in runs {
        for i in 0..run.blocks {
            blocks.push((
                (run.file_block + i) * BLOCK,
                BLOCK,
                run.addr + i * BLOCK,
                HeldBy::FileBlock,
            ));
        }
    }
    for piece in pieces {
        let mut at = piece.start;
        while at < piece.end {
            let src = piece.src + (at - piece.start);
            let physical = src - src % BLOCK;
            let n = (BLOCK - src % BLOCK).min(piece.end - at);
            blocks.push((at, n, physical, HeldBy::LoggedWrite));
            at += n;
        }
    }
    blocks.sort_unstable();
    blocks
}

/// Gives every block of data the files of `inodes` hold ([`data_blocks`]) its entry in
/// `checksums`, from the bytes it holds now (`Fs::set_data_checksums`: checksums turned on
/// for a file system that had none), each device's blocks on a thread near it
/// ([`per_device`]), each thread fencing its own stores: durable when it returns. Returns the
/// blocks.
pub(crate) fn fill_entries(
    volume: &Volume,
    checksums: &Checksums,
    inodes: &crate::inode::InodeTable,
) -> Result<u64> {
    let held = distinct_blocks(&files(inodes.values()));
    per_device(volume, &held, |blocks| {
        let mut block = vec![0u8; BLOCK as usize];
        for &index in blocks {
            let physical = held[index].physical;
            read_block(volume, physical, &mut block)?;
            checksums.store(physical, &[crate::checksums::block_crc(&block)])?;
        }
        // The entries are non-temporal stores of this thread: only its own fence drains them.
        volume.fence();
        Ok(())
    })?;
    Ok(held.len() as u64)
}

/// Reads the block at `physical` into `block`.
fn read_block(volume: &Volume, physical: u64, block: &mut [u8]) -> Result<()> {
    let at = GlobalAddress::from_raw(physical);
    volume
        .device_region(at.device())?
        .read(at.offset(), block)?;
    Ok(())
}

/// Every linked inode's path.
pub(crate) fn paths(inodes: &crate::inode::InodeTable) -> HashMap<u64, String> {
    paths_of(|ino| inodes.get(&ino).cloned())
}

/// Every linked inode's path, each directory found with `inode`. A running file system's
/// table must not stay locked while a directory's entries are read: a removal holds its
/// directory's entries and then takes the table to forget the inode, so holding the table
/// here while waiting for the entries deadlocks with it (a live scrub that found damage hung
/// beside a program unlinking files).
pub(crate) fn paths_of(inode: impl Fn(u64) -> Option<Arc<Inode>>) -> HashMap<u64, String> {
    let mut paths = HashMap::from([(ROOT_INO, "/".to_owned())]);
    let mut queue = vec![ROOT_INO];
    while let Some(dir) = queue.pop() {
        let Some(inode) = inode(dir) else {
            continue;
        };
        if inode.kind != Kind::Dir {
            continue;
        }
        let base = paths[&dir].clone();
        for (name, ino) in inode.entries().iter() {
            let path = if base == "/" {
                format!("/{name}")
            } else {
                format!("{base}/{name}")
            };
            if paths.insert(*ino, path).is_none() {
                queue.push(*ino);
            }
        }
    }
    paths
}

/// The part of a file one step of a live scrub holds still: at most 64 blocks read and
/// summed under its shared range lock, so a writer of the window waits at most that long
/// (~60 µs here). Measured (fio, two jobs of random 4 KiB writes into a 200 MiB file through
/// `locus mount` while `locus scrub` of the 1.2 GiB volume ran in a loop, two runs each):
/// windows of 2 MiB gave 166 k and 152 k IOPS, p99 42 and 50 µs, against 183 k and 179 k,
/// p99 35 and 30 µs, with these; the scrub took 0.31 s either way.
const LIVE_WINDOW: u64 = 256 << 10;

/// How many nice steps a [`ScrubRunner`]'s scrub runs below the thread that started it:
/// on a busy machine it takes what the threads serving requests leave, and on an idle one
/// all it needs. Measured as above (256 KiB windows): at the same priority the writers'
/// p99.9 was 510–518 µs against 84–116 µs without a scrub (the scrub held one of the two
/// CPUs); ten steps below, 98–153 µs, while the scrub took 2–3 s instead of 0.7 s under load
/// (0.31 s alone).
const SCRUB_NICE_STEPS: i32 = 10;

/// How far a live scrub has come, for whoever watches it, and its stop switch. A scrub
/// given it counts from zero.
#[derive(Debug, Default)]
pub struct ScrubProgress {
    files_total: AtomicU64,
    files_done: AtomicU64,
    blocks: AtomicU64,
    stop: AtomicBool,
}

impl ScrubProgress {
    /// Files the scrub will read (those there when it started).
    pub fn files_total(&self) -> u64 {
        self.files_total.load(Ordering::Relaxed)
    }

    /// Files it has read.
    pub fn files_done(&self) -> u64 {
        self.files_done.load(Ordering::Relaxed)
    }

    /// Blocks it has read and checked.
    pub fn blocks(&self) -> u64 {
        self.blocks.load(Ordering::Relaxed)
    }

    /// Asks the scrub to stop: it ends at its next window with [`FsError::Shutdown`].
    pub fn stop(&self) {
        self.stop.store(true, Ordering::Release);
    }
}

impl Fs {
    /// Scrubs the running file system beside its writers: every block of data its files
    /// name when the scrub reaches them — their blocks and the buffers of logged writes —
    /// read and checked against its data checksum, as [`Fs::scrub`] does for a volume
    /// nobody holds. A file is read a 256 KiB window at a time under the window's shared
    /// range lock (a read's lock: while the scrub reads the window, its writers, the
    /// checkpoint and truncations wait; nothing else does), so what it reads holds still and
    /// a block it finds damaged is damaged, never one caught changing. Data written to a
    /// window after the scrub left it is not read, and a file removed meanwhile is skipped.
    /// `progress` counts as it goes and can stop it. An error when the file system has no
    /// data checksums.
    pub fn scrub_live(&self, progress: &ScrubProgress) -> Result<ScrubReport> {
        let inner = &self.inner;
        if inner.checksums.is_none() {
            return Err(no_checksums());
        }
        // The files only: a table of a million inodes is not copied.
        let files: Vec<Arc<Inode>> = files(inner.table().values()).into_iter().cloned().collect();
        progress
            .files_total
            .store(files.len() as u64, Ordering::Relaxed);
        progress.files_done.store(0, Ordering::Relaxed);
        progress.blocks.store(0, Ordering::Relaxed);
        // A buffer block of logged writes may hold bytes of several windows; it is read
        // once. File blocks belong to one file at one place, and need no such set.
        let mut logged = HashSet::new();
        let mut found = Vec::new();
        let mut block = vec![0u8; BLOCK as usize];
        let mut blocks = 0u64;
        for inode in &files {
            'file: for window in windows(inode) {
                if progress.stop.load(Ordering::Acquire) {
                    return Err(FsError::Shutdown("the scrub was stopped".into()));
                }
                let _range = inner.lock_range(inode, window, LIVE_WINDOW, LockMode::Shared)?;
                // Held while the window is read. A file removed and closed meanwhile
                // (`Inner::destroy`, which takes no range lock) leaves the inode table, is
                // marked dead and has its map emptied under this lock's write side, and its
                // logged writes dropped after that: the checkpoint retires the records of a
                // file no longer in the table without the range lock, so their buffers may
                // already hold other data. A dead file is left at once.
                let extents = inode.extents.read().expect("extent map");
                if inode.dead.load(Ordering::Acquire) {
                    break 'file;
                }
                let runs = extents.lookup(window / BLOCK, (window + LIVE_WINDOW) / BLOCK);
                let pieces = inode.overlay.lookup(window, window + LIVE_WINDOW);
                for (offset, len, physical, held_by) in blocks_of(&runs, &pieces) {
                    if held_by == HeldBy::LoggedWrite && !logged.insert(physical) {
                        continue;
                    }
                    blocks += 1;
                    if !inner.read_block_checked(physical, &mut block)? {
                        found.push((inode.ino, offset, len, physical, held_by));
                    }
                }
                drop(extents);
                progress.blocks.store(blocks, Ordering::Relaxed);
            }
            progress.files_done.fetch_add(1, Ordering::Relaxed);
        }
        let paths = if found.is_empty() {
            HashMap::new()
        } else {
            paths_of(|ino| inner.table().get(&ino).cloned())
        };
        let damaged = found
            .into_iter()
            .map(|(ino, offset, len, physical, held_by)| DamagedBlock {
                path: paths
                    .get(&ino)
                    .cloned()
                    .unwrap_or_else(|| format!("inode {ino}")),
                ino,
                offset,
                len,
                address: GlobalAddress::from_raw(physical).to_string(),
                held_by,
            })
            .collect();
        Ok(ScrubReport {
            files: files.len() as u64,
            blocks,
            damaged,
        })
    }
}

/// The error of a scrub of a file system without data checksums.
pub(crate) fn no_checksums() -> FsError {
    FsError::Invalid(
        "the file system has no data checksums (they are chosen at format: `locus format \
         --data-checksums`, or later with `locus tune --data-checksums on`); `locus fsck` \
         checks its metadata"
            .into(),
    )
}

/// The starts of the [`LIVE_WINDOW`]s of `inode` that hold data now: where its extent map
/// maps blocks, and where logged writes lie.
fn windows(inode: &Inode) -> BTreeSet<u64> {
    let runs: Vec<_> = inode.extents.read().expect("extent map").runs().collect();
    let size = inode.size.load(Ordering::Acquire);
    let pieces = inode.overlay.lookup(0, size);
    let spans = runs
        .iter()
        .map(|r| (r.file_block * BLOCK, (r.file_block + r.blocks) * BLOCK))
        .chain(pieces.iter().map(|p| (p.start, p.end)));
    let mut windows = BTreeSet::new();
    for (from, to) in spans {
        let mut window = from - from % LIVE_WINDOW;
        while window < to {
            windows.insert(window);
            window += LIVE_WINDOW;
        }
    }
    windows
}

/// What a [`ScrubRunner`] says about its scrub: the last one started, running or ended.
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct ScrubStatus {
    /// Which scrub: numbered from 1 across every runner of the process, so that a client
    /// asking a runner that replaced the one it started its scrub on (a program through the
    /// preload library makes a new one at each mount) sees a smaller number, 0 while that
    /// runner has started none.
    pub id: u64,
    /// Still reading.
    pub running: bool,
    /// Files it reads (those there when it started).
    pub files_total: u64,
    /// Files read so far.
    pub files_done: u64,
    /// Blocks read and checked so far.
    pub blocks: u64,
    /// Seconds it has run, or ran.
    pub seconds: f64,
    /// Seconds since it ended (none while it runs).
    pub ended_seconds_ago: Option<f64>,
    /// What it found, once it ended.
    pub report: Option<ScrubReport>,
    /// Why it ended without a report.
    pub error: Option<String>,
}

/// The next [`ScrubStatus::id`] of the process.
static NEXT_SCRUB_ID: AtomicU64 = AtomicU64::new(1);

/// One live scrub at a time on a thread of its own, for a server whose clients start it and
/// then ask how far it is: a start while one runs joins it. Dropping the runner stops the
/// scrub and waits for its thread.
#[derive(Debug, Default)]
pub struct ScrubRunner {
    state: Mutex<RunnerState>,
}

#[derive(Debug, Default)]
struct RunnerState {
    id: u64,
    progress: Arc<ScrubProgress>,
    thread: Option<JoinHandle<Ran>>,
    /// When the last scrub started, and how long it ran once it ended.
    started: Option<Instant>,
    ran: Option<Duration>,
    /// How the last scrub ended, once its thread is joined.
    ended: Option<std::result::Result<ScrubReport, String>>,
}

impl ScrubRunner {
    /// A runner with no scrub yet.
    pub fn new() -> Self {
        Self::default()
    }

    /// Starts a scrub of `fs` unless one is running, and returns the running one's status.
    pub fn start(&self, fs: &Fs) -> Result<ScrubStatus> {
        let mut state = self.lock();
        state.reap();
        if state.thread.is_none() {
            let progress = Arc::new(ScrubProgress::default());
            let thread = {
                let (fs, progress) = (fs.clone(), Arc::clone(&progress));
                std::thread::Builder::new()
                    .name("locus-scrub".into())
                    .spawn(move || {
                        fs.inner.options.thread_started();
                        let started = Instant::now();
                        // Only priority: a scrub that cannot lower it still does its work.
                        if let Ok(nice) = topology::current_thread_nice() {
                            let _ = topology::set_current_thread_nice(
                                (nice + SCRUB_NICE_STEPS).min(19),
                            );
                        }
                        (fs.scrub_live(&progress), started.elapsed())
                    })
                    .map_err(|e| FsError::Invalid(format!("starting the scrub's thread: {e}")))?
            };
            state.id = NEXT_SCRUB_ID.fetch_add(1, Ordering::Relaxed);
            state.progress = progress;
            state.thread = Some(thread);
            state.started = Some(Instant::now());
            state.ran = None;
            state.ended = None;
        }
        Ok(state.status())
    }

    /// The status of the last scrub started.
    pub fn status(&self) -> ScrubStatus {
        let mut state = self.lock();
        state.reap();
        state.status()
    }

    /// Stops a running scrub and waits for its thread.
    pub fn stop(&self) {
        let mut state = self.lock();
        state.progress.stop();
        if let Some(thread) = state.thread.take() {
            state.end(thread);
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, RunnerState> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

impl Drop for ScrubRunner {
    fn drop(&mut self) {
        self.stop();
    }
}

impl RunnerState {
    /// Joins the scrub's thread if it ended.
    fn reap(&mut self) {
        if self.thread.as_ref().is_some_and(JoinHandle::is_finished)
            && let Some(thread) = self.thread.take()
        {
            self.end(thread);
        }
    }

    /// Joins the scrub's thread and keeps how it ended and how long it ran (measured by
    /// the thread: it may be joined long after).
    fn end(&mut self, thread: JoinHandle<Ran>) {
        let (ended, ran) = match thread.join() {
            Ok((result, ran)) => (result.map_err(|e| e.to_string()), Some(ran)),
            Err(_) => (Err("the scrub's thread panicked".into()), None),
        };
        self.ended = Some(ended);
        self.ran = ran.or_else(|| self.started.map(|at| at.elapsed()));
    }

    fn status(&self) -> ScrubStatus {
        let (report, error) = match &self.ended {
            Some(Ok(report)) => (Some(report.clone()), None),
            Some(Err(e)) => (None, Some(e.clone())),
            None => (None, None),
        };
        ScrubStatus {
            id: self.id,
            running: self.thread.is_some(),
            files_total: self.progress.files_total(),
            files_done: self.progress.files_done(),
            blocks: self.progress.blocks(),
            seconds: self
                .ran
                .or_else(|| self.started.map(|at| at.elapsed()))
                .map_or(0.0, |d| d.as_secs_f64()),
            ended_seconds_ago: self
                .started
                .zip(self.ran)
                .map(|(at, ran)| at.elapsed().saturating_sub(ran).as_secs_f64()),
            report,
            error,
        }
    }
}

/// What a scrub's thread returns: its report or error, and how long it ran.
type Ran = (Result<ScrubReport>, Duration);
