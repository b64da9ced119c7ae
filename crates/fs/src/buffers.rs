//! Persistent buffers: the memory a write's data sits in until the checkpoint makes it part of
//! a file — by remapping its whole blocks into the file's extent map, or by copying the
//! partial ones. A [`BufferSet`] is a piece of volume memory shared by the log records that
//! point into it; when the last of them retires and the set is sealed, the pages that were not
//! remapped go back to the volume.
//!
//! Sets come from four places: a thread's pool of *preliminary buffers* (`File::write_at`
//! copies into them), [`Recycled`] pages (runs of blocks overwrites replaced, which writes
//! of up to 15 whole blocks reuse), a caller's own buffer (`Fs::buffer` +
//! `File::write_buffer`, no copy), and recovery (the pages of every record found live in
//! the logs).

use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use smallvec::SmallVec;
use volume::{Extent, GlobalAddress, Volume};

use crate::error::Result;
use crate::extent_map::BLOCK;

const SEALED: u64 = 1 << 63;

/// A record's page in a set of recycled pages when it is in none ([`Placement::page`]).
pub(crate) const NO_PAGE: u32 = u32::MAX;

/// A buffer set's extents: one for nearly every set (a write's own buffer, a pool buffer),
/// kept inline so that a set costs one allocation, the `Arc`'s.
pub(crate) type Extents = SmallVec<[Extent; 1]>;

/// Volume memory referenced by log records.
#[derive(Debug)]
pub(crate) struct BufferSet {
    /// Fixed at creation, except in a set of recycled pages: one is added as each is used.
    extents: Mutex<Extents>,
    /// Pages remapped into files: theirs now, not ours to free (inline: most sets of
    /// one write's buffer have their one page taken).
    taken: Mutex<SmallVec<[u64; 1]>>,
    /// Pages the set can hold: the room `taken` gets at its first page, so that it is
    /// allocated once (grown page by page, a 64-page set of recycled pages was reallocated
    /// six times, 2.6 % of the checkpoint's samples with two writers of 4 KiB blocks).
    pages: u64,
    /// A set of recycled pages: its records each name their page by its place in the set
    /// ([`Placement::page`]), and the pages files took are bits here
    /// ([`BufferSet::take_page_run`]) instead of addresses in `taken`.
    indexed: bool,
    /// Of an `indexed` set, bit `i` set: extent `i` (one page) was taken by a file.
    taken_pages: AtomicU64,
    /// Records still pointing here, plus [`SEALED`] once no more will be added.
    state: AtomicU64,
    reclaimed: AtomicBool,
}

impl BufferSet {
    pub(crate) fn new(extents: Extents) -> Self {
        let pages = extents.iter().map(|e| e.len_bytes / BLOCK).sum();
        Self::holding(extents, pages)
    }

    /// A set of `extents` that will hold `pages` pages (a set of recycled pages gets them one
    /// by one).
    fn holding(extents: Extents, pages: u64) -> Self {
        Self {
            extents: Mutex::new(extents),
            taken: Mutex::default(),
            pages,
            indexed: false,
            taken_pages: AtomicU64::new(0),
            state: AtomicU64::new(0),
            reclaimed: AtomicBool::new(false),
        }
    }

    /// An empty set for [`RECYCLED_SET_PAGES`] recycled pages, added in runs as the writer
    /// takes them ([`BufferSet::add_runs`]) and taken by their place in it.
    fn of_recycled_pages() -> Self {
        Self {
            indexed: true,
            ..Self::holding(
                Extents::with_capacity(RECYCLED_SET_PAGES),
                RECYCLED_SET_PAGES as u64,
            )
        }
    }

    /// A set that will get exactly `records` records (recovered or caller buffers).
    pub(crate) fn sealed_with(extents: Extents, records: u64) -> Self {
        let set = Self::new(extents);
        set.state.store(SEALED | records, Ordering::Relaxed);
        set
    }

    /// Runs of recycled pages join the set, page by page, in order, before records are
    /// placed in them: their places in it follow the ones it had, so a run's pages have
    /// places in a row. A page no record is placed in before the set is reclaimed is freed
    /// with the ones files did not take.
    fn add_runs(&self, runs: &[PageRun]) {
        let mut extents = self.extents.lock().expect("buffer set");
        debug_assert!(
            extents.len() + runs.iter().map(|r| r.blocks as usize).sum::<usize>()
                <= RECYCLED_SET_PAGES
        );
        extents.extend(runs.iter().flat_map(|run| {
            (0..u64::from(run.blocks)).map(|i| Extent {
                start: GlobalAddress::from_raw(run.addr + i * BLOCK),
                len_bytes: BLOCK,
            })
        }));
    }

    /// The `pages` pages from place `page` in a set of recycled pages now belong to a file.
    pub(crate) fn take_page_run(&self, page: u32, pages: u64) {
        debug_assert!(pages >= 1 && u64::from(page) + pages <= RECYCLED_SET_PAGES as u64);
        self.take_places(((1u64 << pages) - 1) << page);
    }

    /// The pages at the places whose bits `places` has, in a set of recycled pages, now
    /// belong to files: one locked instruction for them all (the caller takes them before it
    /// releases the records that used them, so a reclaim sees them).
    pub(crate) fn take_places(&self, places: u64) {
        debug_assert!(self.indexed);
        self.taken_pages.fetch_or(places, Ordering::Relaxed);
    }

    /// One more record points here.
    pub(crate) fn add_record(&self) {
        self.state.fetch_add(1, Ordering::AcqRel);
    }

    /// The `pages` pages from `addr` now belong to a file (of a set not of recycled pages:
    /// those are taken by place, [`BufferSet::take_page_run`]).
    pub(crate) fn take_pages(&self, addr: u64, pages: u64) {
        assert!(
            !self.indexed,
            "a page of a set of recycled pages taken by address"
        );
        let mut taken = self.taken.lock().expect("buffer set");
        if taken.is_empty() {
            taken.reserve_exact((self.pages as usize).max(pages as usize));
        }
        taken.extend((0..pages).map(|i| addr + i * BLOCK));
    }

    /// No more records will point here. Returns true if the caller must reclaim it now.
    pub(crate) fn seal(&self) -> bool {
        self.state.fetch_or(SEALED, Ordering::AcqRel) == 0
    }

    /// A record pointing here retired. Returns true if the caller must reclaim the set now.
    pub(crate) fn release(&self) -> bool {
        self.release_many(1)
    }

    /// `records` records pointing here retired (one atomic subtraction for them all).
    /// Returns true if the caller must reclaim the set now.
    pub(crate) fn release_many(&self, records: u64) -> bool {
        self.state.fetch_sub(records, Ordering::AcqRel) == SEALED | records
    }

    /// True once sealed: no record will be added.
    pub(crate) fn is_sealed(&self) -> bool {
        self.state.load(Ordering::Acquire) & SEALED != 0
    }

    /// True once reclaimed (a preliminary-buffer slot may then be refilled).
    pub(crate) fn is_reclaimed(&self) -> bool {
        self.reclaimed.load(Ordering::Acquire)
    }

    /// Frees every page not taken by a file.
    pub(crate) fn reclaim(&self, volume: &Volume) -> Result<()> {
        self.reclaim_with(|run| Ok(volume.free(run)?))
    }

    /// Hands every run of pages not taken by a file to `free` (the checkpoint gives the
    /// short ones to the recycled lists while they are under half full: mostly pages of
    /// records a newer write made void, which would go back to the volume as 4 KiB holes).
    pub(crate) fn reclaim_with(&self, mut free: impl FnMut(Extent) -> Result<()>) -> Result<()> {
        let mut extents = self.extents.lock().expect("buffer set");
        // A set of recycled pages, taken by place: the pages whose bits are clear are the ones
        // to free, in a pass without sorting (sorting its pages and the taken ones, for the
        // four sets in ten with a page a newer write made void, was 7 % of the checkpoint's
        // samples with two writers of random 4 KiB blocks).
        if self.indexed {
            // Neighbouring places whose pages are neighbours too (a run the set took whole)
            // go as one run.
            let by_place = self.taken_pages.load(Ordering::Acquire);
            let mut run: Option<Extent> = None;
            for (i, extent) in extents.iter().enumerate() {
                let untaken = by_place & (1 << i) == 0;
                match &mut run {
                    Some(r) if untaken && r.start.raw() + r.len_bytes == extent.start.raw() => {
                        r.len_bytes += extent.len_bytes;
                    }
                    _ => {
                        if let Some(done) = run.take() {
                            free(done)?;
                        }
                        if untaken {
                            run = Some(*extent);
                        }
                    }
                }
            }
            if let Some(done) = run {
                free(done)?;
            }
            self.reclaimed.store(true, Ordering::Release);
            return Ok(());
        }
        let mut taken = std::mem::take(&mut *self.taken.lock().expect("buffer set"));
        // Every use of a page is taken at most once (a record's whole blocks are its own
        // bytes), so when files took as many pages as the set's extents hold, nothing is
        // left to free, and nothing needs sorting: a set of small overwrites that no newer
        // write made void before the checkpoint moved them.
        let used: u64 = extents.iter().map(|e| e.len_bytes / BLOCK).sum();
        debug_assert!(
            taken.len() as u64 <= used,
            "a buffer set's pages were taken more often than used"
        );
        if taken.len() as u64 >= used {
            self.reclaimed.store(true, Ordering::Release);
            return Ok(());
        }
        taken.sort_unstable();
        // Both in address order, walked together: a set of recycled pages has an extent
        // per page, and a search of the taken pages for each was 6 % of the checkpoint's
        // samples with two writers of 4 KiB blocks.
        //
        // A recycled page can be in one set more than once: a file took it, a newer write
        // replaced it, and the checkpoint recycled it into the set still being filled. Every
        // use but the last was taken (else the page would not have come back), so the page
        // is the set's to free when it was taken fewer times than used: each single-page
        // extent answers for one taking of its page.
        extents.sort_unstable_by_key(|e| e.start.raw());
        let mut rest: &[u64] = &taken;
        for extent in extents.iter() {
            let start = extent.start.raw();
            let before = rest.iter().take_while(|&&p| p < start).count();
            rest = &rest[before..];
            let inside = rest
                .iter()
                .take_while(|&&p| p < start + extent.len_bytes)
                .count();
            let mine = if extent.len_bytes == BLOCK {
                inside.min(1)
            } else {
                inside
            };
            for run in untaken_runs(extent, &rest[..mine]) {
                free(run)?;
            }
            rest = &rest[mine..];
        }
        self.reclaimed.store(true, Ordering::Release);
        Ok(())
    }
}

/// The parts of `extent` not covered by the sorted page addresses in `taken`.
fn untaken_runs(extent: &Extent, taken: &[u64]) -> SmallVec<[Extent; 2]> {
    let start = extent.start.raw();
    let end = start + extent.len_bytes;
    let first = taken.partition_point(|&p| p < start);
    let mut runs = SmallVec::new();
    let mut at = start;
    for &page in taken[first..].iter().take_while(|&&p| p < end) {
        if page > at {
            runs.push(Extent {
                start: GlobalAddress::from_raw(at),
                len_bytes: page - at,
            });
        }
        at = at.max(page + BLOCK);
    }
    if at < end {
        runs.push(Extent {
            start: GlobalAddress::from_raw(at),
            len_bytes: end - at,
        });
    }
    runs
}

/// Freed runs shorter than this many blocks are recycled page by page; longer ones go
/// back to the volume whole.
pub(crate) const RECYCLE_RUN_BLOCKS: u64 = 16;

/// Most buffers one pool's ring grows to when free memory is in small pieces ([`Pool`]).
const MAX_POOL_BUFFERS: usize = 256;

/// Recycled pages in one set: records of the same set retire together, so the set is
/// reclaimed (any page whose record a newer write made void returned) in one go.
const RECYCLED_SET_PAGES: usize = 64;
// Each page's taking is a bit of one word (`BufferSet::taken_pages`).
const _: () = assert!(RECYCLED_SET_PAGES <= u64::BITS as usize);

/// Recycled pages a writer moves from the lists into its set at a time ([`Recycled::take`]):
/// one list lock and one lock of the set's pages for up to this many single-block writes.
/// Taken one by one, those two locks (four locked instructions, their lines last written by
/// the checkpoint) were 40 ns of a 4 KiB write's 0.7 µs. Pages the writer has not used yet
/// stay its set's: counted free ([`Pool::unused_bytes`]), and given back when the set is
/// sealed — full, trimmed for a writer that found the volume short, or at the thread's end.
/// (A writer that moves to another node may still use up to seven pages of the one it left.)
pub(crate) const RECYCLED_TAKE: usize = 8;

/// Pages the checkpoint freed in small runs — file blocks that small overwrites replaced —
/// kept, run by run, for the writers' writes of 1 to 15 whole blocks
/// (`Inner::place_in_recycled` in `fs/write.rs`) instead of going back to the volume. A 4 KiB
/// overwrite then costs no allocator work on either side (its block is remapped into the
/// file, the block it replaced holds the next one), and random overwrites do not cut the
/// volume's free memory into 4 KiB pieces that no buffer, journal or log area can use: the
/// checkpoint remaps a small overwrite only while the lists have room for what it frees
/// ([`Recycled::room`]), and copies it in place otherwise.
///
/// What it costs on the 2-core development VM (tmpfs-emulated device, 4 KiB host pages):
/// a 4 KiB write into a page scattered over the volume costs its writer more than one into
/// the sequential pool buffer — the same with one writer (1.38 against 1.31 µs), 2.02
/// against 1.39 µs each with two (`locus bench fs --bs 4K --rounds 3`, a build whose
/// writers took no recycled pages). Taking pages 16 per lock did not change that: it is
/// the scattered addresses, not the lists' lock. Without the lists the checkpoint copies
/// every such overwrite in place instead (1.6–1.7 µs per write, write amplification 1.94),
/// so the lists stay.
///
/// Per device, so that a writer takes pages of its own node; a writer takes a few pages at a
/// time ([`RECYCLED_TAKE`]), which a trim gives back when the volume runs short. Each device's
/// pages are split over [`RECYCLED_SHARDS`] lists on cache lines of their own, and a
/// writer takes from the list of its slot first: with one list per device, every writer's
/// every single-block write took the same lock, and with two writers through the preload
/// library that lock's cache line moving between the CPUs was about 5 % of each writer's
/// time. In DRAM only:
/// nothing on media names a page here, so after a crash the volume's allocator (rebuilt at
/// open from what the file system names) has it free. Bounded; what does not fit, and
/// everything when an allocation finds the volume short ([`Recycled::drain`]), goes back
/// to the volume.
#[derive(Debug)]
pub(crate) struct Recycled {
    /// Per device, its lists.
    devices: Vec<[Shard; RECYCLED_SHARDS]>,
    /// The node of each device.
    nodes: Vec<Option<u32>>,
    /// Pages one device's lists hold at most, together.
    cap: usize,
}

/// Lists one device's recycled pages are split over ([`Recycled`]): a writer takes from
/// list `slot % RECYCLED_SHARDS` first, so up to this many writers never share one.
pub(crate) const RECYCLED_SHARDS: usize = 4;

/// One list of a device's recycled pages, alone on its cache lines.
#[derive(Debug, Default)]
#[repr(align(128))]
struct Shard(Mutex<Pages>);

impl Shard {
    fn lock(&self) -> std::sync::MutexGuard<'_, Pages> {
        self.0.lock().expect("recycled pages")
    }
}

/// How many pages each of a device's lists holds.
fn lens(shards: &[Shard; RECYCLED_SHARDS]) -> [usize; RECYCLED_SHARDS] {
    std::array::from_fn(|i| shards[i].lock().pages)
}

/// A run of recycled pages: `blocks` pages (fewer than [`RECYCLE_RUN_BLOCKS`]) from `addr`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct PageRun {
    pub(crate) addr: u64,
    pub(crate) blocks: u32,
}

impl PageRun {
    /// The run as the volume names it.
    fn extent(self) -> Extent {
        Extent {
            start: GlobalAddress::from_raw(self.addr),
            len_bytes: u64::from(self.blocks) * BLOCK,
        }
    }
}

/// Runs of recycled pages handed to a writer at once ([`Recycled::take`]): inline, as
/// many as the most pages one take hands out.
pub(crate) type Taken = SmallVec<[PageRun; RECYCLE_RUN_BLOCKS as usize]>;

/// One list's recycled pages, in runs as the checkpoint freed them.
#[derive(Debug, Default)]
struct Pages {
    free: Vec<PageRun>,
    /// The pages of the runs in `free`.
    pages: usize,
}

impl Pages {
    /// Takes whole runs off the top of the list into `into` while they add up to at most
    /// `most` pages — and when the top one alone holds more, its front (`split`: the take
    /// has nothing yet; its rest stays on top, for the next take). Runs are kept whole so
    /// that a write of as many blocks as the write that freed one finds it whole: split
    /// wherever a take's count of 8 ended, runs of 3 would come out as 3, 3, 2 and 1, and
    /// the writes of 3 blocks after them in two pieces. Returns how many pages it took.
    fn take(&mut self, most: usize, split: bool, into: &mut Taken) -> usize {
        let mut took = 0;
        while let Some(top) = self.free.last_mut() {
            let left = (most - took) as u32;
            if top.blocks <= left {
                into.push(*top);
                took += top.blocks as usize;
                self.free.pop();
            } else {
                if split && took == 0 {
                    into.push(PageRun {
                        addr: top.addr,
                        blocks: left,
                    });
                    top.addr += u64::from(left) * BLOCK;
                    top.blocks -= left;
                    took = left as usize;
                }
                break;
            }
        }
        self.pages -= took;
        took
    }
}

/// How many of `pages` new pages each list gets so that the lists, holding `lens` now,
/// come out as even as they can: the shortest lists are filled to a common level.
fn even_shares(lens: [usize; RECYCLED_SHARDS], pages: usize) -> [usize; RECYCLED_SHARDS] {
    let mut order: [usize; RECYCLED_SHARDS] = std::array::from_fn(|i| i);
    order.sort_by_key(|&i| lens[i]);
    // The `filled` shortest lists reach `(sum + pages) / filled`: one more joins them
    // while that level is above its length.
    let mut filled = 1;
    let mut sum = lens[order[0]];
    while filled < RECYCLED_SHARDS && (sum + pages) / filled > lens[order[filled]] {
        sum += lens[order[filled]];
        filled += 1;
    }
    let level = (sum + pages) / filled;
    let odd = (sum + pages) % filled;
    let mut give = [0; RECYCLED_SHARDS];
    for (j, &i) in order[..filled].iter().enumerate() {
        give[i] = level - lens[i] + usize::from(j < odd);
    }
    give
}

/// Which of `runs` each list gets (`lens`: the pages each holds now): a stretch of them in
/// a row each, of about its [`even_shares`] of their pages — runs are not split, so a list
/// may get up to half a run's pages more or less, which the next list's share makes up
/// (the last list takes whatever is left). In a row, not dealt out run by run: a batch frees
/// runs in file order, and a writer's next pages from one list are then neighbours in the
/// file's old layout — dealt out, writers of single blocks were 10–15 % slower.
fn share_out(
    lens: [usize; RECYCLED_SHARDS],
    runs: &[PageRun],
) -> [std::ops::Range<usize>; RECYCLED_SHARDS] {
    let pages = runs.iter().map(|r| r.blocks as usize).sum();
    let give = even_shares(lens, pages);
    let mut at = 0;
    // Pages given beyond the shares so far (negative: short of them).
    let mut over: isize = 0;
    std::array::from_fn(|i| {
        let from = at;
        if i == RECYCLED_SHARDS - 1 {
            at = runs.len();
        } else {
            // A run goes to this list if that leaves it nearer its share than without.
            let mut got = 0isize;
            while at < runs.len()
                && 2 * (over + got) + (runs[at].blocks as isize) < 2 * give[i] as isize
            {
                got += runs[at].blocks as isize;
                at += 1;
            }
            over += got - give[i] as isize;
        }
        from..at
    })
}

impl Recycled {
    /// Lists for devices on `nodes` (one entry per device) of at most `cap` pages each.
    pub(crate) fn new(nodes: Vec<Option<u32>>, cap: usize) -> Self {
        Self {
            devices: nodes.iter().map(|_| Default::default()).collect(),
            nodes,
            cap,
        }
    }

    /// Frees `runs` (blocks a committed batch replaced, pages of its retired buffers no file
    /// took): the pages of runs shorter than [`RECYCLE_RUN_BLOCKS`] into their device's
    /// lists while they have room, everything else back to `volume`.
    ///
    /// Each list's lock is held for one look at its length and one copy of pages, not
    /// while the runs are sorted out or the volume frees the rest: writers take a page from
    /// these lists on every single-block write, and a batch's worth of runs under the lock
    /// made them sleep on it. Only this (the checkpoint) adds pages; writers and
    /// [`Recycled::drain`] only take them, so the room seen first can only have grown by
    /// the time the pages go in. The pages go to the lists holding fewest.
    ///
    /// Returns the blocks of short runs the lists had no room for: they went back to the
    /// volume in pieces.
    pub(crate) fn free(
        &self,
        volume: &Volume,
        runs: impl IntoIterator<Item = Extent>,
    ) -> Result<u64> {
        self.free_up_to(volume, runs, self.cap)
    }

    /// [`Recycled::free`], with each device's lists filled only up to `level` pages.
    pub(crate) fn free_up_to(
        &self,
        volume: &Volume,
        runs: impl IntoIterator<Item = Extent>,
        level: usize,
    ) -> Result<u64> {
        let level = level.min(self.cap);
        let lens: Vec<[usize; RECYCLED_SHARDS]> = self.devices.iter().map(lens).collect();
        let mut room: Vec<usize> = lens
            .iter()
            .map(|lens| level.saturating_sub(lens.iter().sum()))
            .collect();
        let mut kept: Vec<Vec<PageRun>> = self.devices.iter().map(|_| Vec::new()).collect();
        let mut rest: Vec<Extent> = Vec::new();
        for run in runs {
            let blocks = run.len_bytes / BLOCK;
            let device = run.start.device() as usize;
            match room.get_mut(device) {
                Some(left) if blocks < RECYCLE_RUN_BLOCKS && blocks as usize <= *left => {
                    *left -= blocks as usize;
                    kept[device].push(PageRun {
                        addr: run.start.raw(),
                        blocks: blocks as u32,
                    });
                }
                _ => rest.push(run),
            }
        }
        for ((shards, lens), runs) in self.devices.iter().zip(lens).zip(&kept) {
            if runs.is_empty() {
                continue;
            }
            for (shard, share) in shards.iter().zip(share_out(lens, runs)) {
                let mine = &runs[share];
                if !mine.is_empty() {
                    let pages: usize = mine.iter().map(|r| r.blocks as usize).sum();
                    let mut list = shard.lock();
                    list.free.extend_from_slice(mine);
                    list.pages += pages;
                }
            }
        }
        let mut unrecycled = 0;
        for run in rest {
            let blocks = run.len_bytes / BLOCK;
            if blocks < RECYCLE_RUN_BLOCKS {
                unrecycled += blocks;
            }
            volume.free(run)?;
        }
        Ok(unrecycled)
    }

    /// Pages each device's lists hold at most.
    pub(crate) fn cap(&self) -> usize {
        self.cap
    }

    /// Pages the lists hold (free memory the volume's allocator counts as used).
    pub(crate) fn held(&self) -> u64 {
        self.devices
            .iter()
            .flatten()
            .map(|shard| shard.lock().pages as u64)
            .sum()
    }

    /// Pages the lists can still take.
    pub(crate) fn room(&self) -> u64 {
        self.devices
            .iter()
            .map(|shards| self.cap.saturating_sub(lens(shards).iter().sum()) as u64)
            .sum()
    }

    /// Up to `most` pages (at most [`RECYCLE_RUN_BLOCKS`]) on devices of `node` for the
    /// writer of slot `slot`, in whole runs: from its own list first, then the next ones
    /// while they have runs that fit what is left; none if the lists of the node's devices
    /// are empty. Only a run longer than `most` is split, when no other was taken: its
    /// front is taken, its rest stays.
    pub(crate) fn take(&self, node: u32, slot: u32, most: usize) -> Taken {
        let most = most.min(RECYCLE_RUN_BLOCKS as usize);
        let first = slot as usize % RECYCLED_SHARDS;
        let mut runs = Taken::new();
        let mut took = 0;
        let devices = || {
            self.devices
                .iter()
                .zip(&self.nodes)
                .filter(move |(_, n)| **n == Some(node))
                .map(|(shards, _)| shards)
        };
        // Whole runs first; a run split only if no list had one that fits.
        for split in [false, true] {
            for shards in devices() {
                for i in 0..RECYCLED_SHARDS {
                    if took == most || split && took > 0 {
                        return runs;
                    }
                    took += shards[(first + i) % RECYCLED_SHARDS].lock().take(
                        most - took,
                        split,
                        &mut runs,
                    );
                }
            }
        }
        runs
    }

    /// Gives every page back to `volume` (neighbours as one extent); true if there was any.
    pub(crate) fn drain(&self, volume: &Volume) -> Result<bool> {
        let mut any = false;
        for shards in &self.devices {
            let mut runs: Vec<PageRun> = shards
                .iter()
                .flat_map(|shard| {
                    let mut list = shard.lock();
                    list.pages = 0;
                    std::mem::take(&mut list.free)
                })
                .collect();
            any |= !runs.is_empty();
            runs.sort_unstable_by_key(|r| r.addr);
            let mut at = 0;
            while at < runs.len() {
                let mut extent = runs[at].extent();
                at += 1;
                while at < runs.len() && runs[at].addr == extent.start.raw() + extent.len_bytes {
                    extent.len_bytes += runs[at].extent().len_bytes;
                    at += 1;
                }
                volume.free(extent)?;
            }
        }
        Ok(any)
    }
}

/// Where a write's data goes in a thread's preliminary buffers.
#[derive(Debug)]
pub(crate) struct Placement {
    pub(crate) set: std::sync::Arc<BufferSet>,
    pub(crate) addr: u64,
    /// In a set of recycled pages, the place of its first page in it (the others' follow:
    /// [`BufferSet::take_page_run`]); [`NO_PAGE`] otherwise.
    pub(crate) page: u32,
}

/// One thread slot's pool of preliminary buffers (the paper's "# preliminary buffers"). The
/// writer fills one buffer front to back; a full buffer is sealed and the next one used, once
/// the checkpoint has retired every record in it (the writer waits otherwise: backpressure).
///
/// What the pool may hold is bytes, not buffers: `count × buffer_bytes`. When free memory is
/// in pieces smaller than a buffer (an aged volume), buffers come out smaller, and the ring
/// takes more of them rather than making the writer wait with a fraction of its bytes in
/// flight (`aged.rs`: 64 KiB writes with free memory in 64 KiB pieces waited 18 times in 64,
/// 3 with the byte bound).
#[derive(Debug)]
pub(crate) struct Pool {
    /// Each buffer: its set, its address, its capacity (`buffer_bytes`, or less when free
    /// memory was too fragmented for a whole one).
    buffers: Vec<Option<(std::sync::Arc<BufferSet>, u64, u64)>>,
    /// Most bytes the buffers not yet reclaimed may hold.
    budget: u64,
    current: usize,
    cursor: u64,
    buffer_bytes: u64,
    whole_blocks: bool,
    /// The set of recycled pages single-block writes (and short runs of whole blocks, a page
    /// a block) go into first.
    recycled: Option<RecycledSet>,
}

/// A pool's set of recycled pages being filled: the runs of pages it holds that no write
/// used yet, each with its first page's place in the set (the next one last), and how many
/// pages it holds in all.
#[derive(Debug)]
struct RecycledSet {
    set: std::sync::Arc<BufferSet>,
    unused: SmallVec<[(PageRun, u32); RECYCLE_RUN_BLOCKS as usize]>,
    added: usize,
}

/// What a placement attempt needs from the caller.
#[derive(Debug)]
pub(crate) enum Reserve {
    Placed(Placement),
    /// The next buffer is still in use: wait for the checkpoint, then try again.
    Wait,
}

impl Pool {
    /// `whole_blocks`: every write starts in a block of its own, so no block is written
    /// again once a record names it (data checksums need it: `crate::checksums`).
    pub(crate) fn new(count: usize, buffer_bytes: u64, whole_blocks: bool) -> Self {
        Self {
            buffers: (0..count).map(|_| None).collect(),
            budget: count as u64 * buffer_bytes,
            current: 0,
            cursor: 0,
            buffer_bytes,
            whole_blocks,
            recycled: None,
        }
    }

    /// Space for `len` bytes destined for file offset `offset`. A write holding at least one
    /// whole block is placed at the same offset within a page as in the file, so the
    /// checkpoint can remap its whole blocks; smaller writes are packed.
    /// A single aligned block goes into a recycled page (from `recycle`) while there are any.
    /// New buffers come from `alloc`; `spare` says how much free memory is beyond the
    /// checkpoint's reserve (asked only when a buffer must be allocated).
    pub(crate) fn reserve(
        &mut self,
        volume: &Volume,
        offset: u64,
        len: u64,
        spare: &dyn Fn() -> u64,
        alloc: &dyn Fn(u64) -> Result<Extent>,
        recycle: &dyn Fn(usize) -> Taken,
    ) -> Result<Reserve> {
        if len == BLOCK
            && offset.is_multiple_of(BLOCK)
            && let Some((placed, _)) = self.place_recycled(volume, 1, recycle)?
        {
            return Ok(Reserve::Placed(placed));
        }
        let has_whole_block = offset.next_multiple_of(BLOCK) + BLOCK <= offset + len;
        // At the file's in-page offset a write needs this much of a fresh buffer; more than a
        // whole one could never be placed (the caller gives such writes buffers of their own).
        let needs = if has_whole_block { offset % BLOCK } else { 0 } + len;
        if needs > self.buffer_bytes {
            return Err(crate::error::FsError::Invalid(format!(
                "{len} bytes at in-page offset {} do not fit a preliminary buffer of {} bytes",
                offset % BLOCK,
                self.buffer_bytes
            )));
        }
        // What a fresh buffer must hold for it, in whole blocks.
        let needed = (offset % BLOCK + len).next_multiple_of(BLOCK);
        // Each turn either places the write, moves to the next buffer, or fills an empty one
        // (which then places it): a bounded number of turns.
        for _ in 0..=3 * self.buffers.len() {
            match &self.buffers[self.current] {
                Some((set, base, capacity)) if !set.is_sealed() => {
                    if self.whole_blocks {
                        self.cursor = self.cursor.next_multiple_of(BLOCK);
                    }
                    let at = if has_whole_block || self.whole_blocks {
                        // The first position at or after the cursor with the file's in-page
                        // offset.
                        let (within, c) = (offset % BLOCK, self.cursor % BLOCK);
                        self.cursor - c + within + if c > within { BLOCK } else { 0 }
                    } else {
                        self.cursor.next_multiple_of(64)
                    };
                    if at + len <= *capacity {
                        self.cursor = at + len;
                        set.add_record();
                        return Ok(Reserve::Placed(Placement {
                            set: std::sync::Arc::clone(set),
                            addr: base + at,
                            page: NO_PAGE,
                        }));
                    }
                    // Full: seal it and move on to the next buffer.
                    self.seal_current(volume)?;
                }
                // Sealed, with records the checkpoint has not retired yet: wait — unless
                // smaller buffers left room in the budget, which a new one takes (in the
                // ring before this one, so the order of reuse stays the order of filling).
                Some((set, _, _)) if !set.is_reclaimed() => {
                    if self.buffers.len() >= MAX_POOL_BUFFERS
                        || self.held_bytes() + needed > self.budget
                    {
                        return Ok(Reserve::Wait);
                    }
                    self.buffers.insert(self.current, None);
                }
                _ => {
                    // A whole buffer if free memory has one; else the largest power-of-two
                    // fraction of one it has, down to what this write needs — but never more
                    // than an eighth of what is spare: a buffer holds all of its memory until
                    // the last of its records is retired, and other writes need some too.
                    // And no more than the budget has left (a ring grown while memory was
                    // in pieces does not fill every slot with a whole buffer later).
                    let cap = (spare() / 8).max(needed);
                    let room = (self.budget.saturating_sub(self.held_bytes()) / BLOCK) * BLOCK;
                    let mut size = self
                        .buffer_bytes
                        .min(cap.next_power_of_two())
                        .min(room)
                        .max(needed);
                    let extent = loop {
                        match alloc(size) {
                            Err(crate::error::FsError::Volume(volume::VolumeError::NoSpace {
                                ..
                            })) if size > needed => {
                                size = (size / 2).next_multiple_of(BLOCK).max(needed);
                            }
                            other => break other?,
                        }
                    };
                    let set = std::sync::Arc::new(BufferSet::new(smallvec::smallvec![extent]));
                    self.buffers[self.current] = Some((set, extent.start.raw(), extent.len_bytes));
                    self.cursor = 0;
                }
            }
        }
        unreachable!("a fresh preliminary buffer of at least {needs} bytes places the write")
    }

    /// Bytes of the buffers whose records the checkpoint has not all retired.
    fn held_bytes(&self) -> u64 {
        self.buffers
            .iter()
            .flatten()
            .filter(|(set, _, _)| !set.is_reclaimed())
            .map(|(_, _, capacity)| capacity)
            .sum()
    }

    /// Up to `blocks` recycled pages in a row, from the pool's set of them — which takes
    /// more from `recycle` (asked for at most that many) when it has used all it holds —
    /// and how many it placed; `None` when there are none. The placement's `page` is the
    /// first page's place in the set, the others' follow it. A set whose every page is used
    /// is sealed at once: its last record's retirement reclaims it. (For a single aligned
    /// block, and for a short aligned write run by run: `Inner::place_in_recycled` in
    /// `fs/write.rs`.)
    pub(crate) fn place_recycled(
        &mut self,
        volume: &Volume,
        blocks: u64,
        recycle: &dyn Fn(usize) -> Taken,
    ) -> Result<Option<(Placement, u64)>> {
        if self.recycled.as_ref().is_none_or(|r| r.unused.is_empty()) {
            // A set with less room left than the write needs is sealed as it is, and the
            // write goes whole into a new one: filled to the last place, a set split one write
            // in four of 15 blocks over two records.
            if self
                .recycled
                .as_ref()
                .is_some_and(|r| RECYCLED_SET_PAGES - r.added < blocks as usize)
            {
                self.seal_recycled(volume)?;
            }
            let room = self
                .recycled
                .as_ref()
                .map_or(RECYCLED_SET_PAGES, |r| RECYCLED_SET_PAGES - r.added);
            // A few writes' worth, or the whole of a longer write.
            let want = (blocks as usize).max(RECYCLED_TAKE).min(room);
            let runs = recycle(want);
            if runs.is_empty() {
                return Ok(None);
            }
            let r = self.recycled.get_or_insert_with(|| RecycledSet {
                // Room for every page it will get: the writer adds them without growing
                // it, and the memory is allocated once (the checkpoint frees it, and a
                // free into another thread's malloc arena takes that arena's lock).
                set: std::sync::Arc::new(BufferSet::of_recycled_pages()),
                unused: SmallVec::new(),
                added: 0,
            });
            r.set.add_runs(&runs);
            for run in &runs {
                r.unused.push((*run, r.added as u32));
                r.added += run.blocks as usize;
            }
            r.unused.reverse();
        }
        let r = self.recycled.as_mut().expect("a set with an unused page");
        // The run that fits the write most tightly, else the longest (the write's rest goes
        // to the next); of equals, the one taken first. A write of as many blocks as a
        // freed run takes that run whole.
        // (The next one is taken without a look at the others when it fits exactly: the
        // look was 3 % of a writer's samples with single-block writes.)
        let last = r.unused.len() - 1;
        if u64::from(r.unused[last].0.blocks) != blocks {
            let fits = |run: &PageRun| u64::from(run.blocks) >= blocks;
            let best = (0..r.unused.len())
                .rev()
                .min_by_key(|&i| {
                    let run = &r.unused[i].0;
                    (
                        !fits(run),
                        if fits(run) {
                            run.blocks
                        } else {
                            u32::MAX - run.blocks
                        },
                    )
                })
                .expect("an unused run");
            r.unused.swap(best, last);
        }
        let (run, place) = r.unused.last_mut().expect("an unused run");
        let placed = blocks.min(u64::from(run.blocks));
        let (addr, page) = (run.addr, *place);
        run.addr += placed * BLOCK;
        run.blocks -= placed as u32;
        *place += placed as u32;
        if run.blocks == 0 {
            r.unused.pop();
        }
        r.set.add_record();
        let set = std::sync::Arc::clone(&r.set);
        if r.unused.is_empty() && r.added == RECYCLED_SET_PAGES {
            self.recycled = None;
            if set.seal() {
                set.reclaim(volume)?;
            }
        }
        Ok(Some((Placement { set, addr, page }, placed)))
    }

    /// Bytes of the buffer being filled that no write has taken yet, in whole blocks, and
    /// of the recycled pages the pool took but used for no write yet: free memory in all but
    /// name, which [`Pool::trim`] gives back when another thread needs it.
    pub(crate) fn unused_bytes(&self) -> u64 {
        let pages = self.recycled.as_ref().map_or(0, |r| {
            r.unused.iter().map(|(run, _)| u64::from(run.blocks)).sum()
        }) * BLOCK;
        pages + self.unused_buffer_bytes()
    }

    /// The buffer part of [`Pool::unused_bytes`].
    fn unused_buffer_bytes(&self) -> u64 {
        match &self.buffers[self.current] {
            Some((set, _, capacity)) if !set.is_sealed() => {
                let used = self.cursor.next_multiple_of(BLOCK);
                capacity.saturating_sub(used)
            }
            _ => 0,
        }
    }

    /// Seals the buffer being filled if it has a block or more no write has taken, as a
    /// full one is sealed: the memory its records do not hold goes back to the volume when
    /// the last of them is retired — at once if none is pending. For a writer of another
    /// thread that found the volume full: without this, a write failed with `NoSpace` while
    /// this thread's buffer had room, and the same write sent to this thread succeeded.
    /// The set of recycled pages being filled is sealed too: a page in it whose record a
    /// newer write made void, or whose block the checkpoint copied in place, is free memory
    /// that would otherwise wait for the set's last page to be used. Returns whether it
    /// sealed anything.
    pub(crate) fn trim(&mut self, volume: &Volume) -> Result<bool> {
        let recycled = self.seal_recycled(volume)?;
        if self.unused_buffer_bytes() == 0 {
            return Ok(recycled);
        }
        self.seal_current(volume)?;
        Ok(true)
    }

    /// The thread filling this pool ended: seals the buffer being filled and the set of
    /// recycled pages, so that what their records did not hand to files — blocks copied in
    /// place, records a newer write made void, room no write took — goes back to the volume
    /// as their last records retire, not when a later thread of the slot fills them. The
    /// ring stays: its sealed buffers still count against the budget until reclaimed.
    pub(crate) fn release(&mut self, volume: &Volume) -> Result<()> {
        self.seal_recycled(volume)?;
        if matches!(&self.buffers[self.current], Some((set, _, _)) if !set.is_sealed()) {
            self.seal_current(volume)?;
        }
        Ok(())
    }

    /// Seals the set of recycled pages being filled, if there is one: reclaimed at once if
    /// none of its records is pending. Returns whether there was one.
    fn seal_recycled(&mut self, volume: &Volume) -> Result<bool> {
        let Some(RecycledSet { set, .. }) = self.recycled.take() else {
            return Ok(false);
        };
        if set.seal() {
            set.reclaim(volume)?;
        }
        Ok(true)
    }

    /// Seals the buffer being filled — reclaimed at once if none of its records is pending,
    /// else when the checkpoint retires the last — and moves on to the next one.
    fn seal_current(&mut self, volume: &Volume) -> Result<()> {
        if let Some((set, _, _)) = &self.buffers[self.current]
            && set.seal()
        {
            set.reclaim(volume)?;
        }
        self.current = (self.current + 1) % self.buffers.len();
        self.cursor = 0;
        Ok(())
    }

    /// Seals every buffer (at unmount): the checkpoint reclaims each when its records retire.
    pub(crate) fn seal_all(&mut self, volume: &Volume) -> Result<()> {
        self.seal_recycled(volume)?;
        for (set, _, _) in self.buffers.iter_mut().flatten() {
            if !set.is_reclaimed() && set.seal() {
                set.reclaim(volume)?;
            }
        }
        self.buffers.iter_mut().for_each(|b| *b = None);
        self.cursor = 0;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::extent_map::Run;

    #[test]
    fn untaken_runs_skip_taken_pages() {
        let e = Extent {
            start: GlobalAddress::new(0, 1 << 21),
            len_bytes: 8 * BLOCK,
        };
        let base = e.start.raw();
        let runs = untaken_runs(&e, &[base + BLOCK, base + 2 * BLOCK, base + 7 * BLOCK]);
        let spans: Vec<(u64, u64)> = runs
            .iter()
            .map(|r| ((r.start.raw() - base) / BLOCK, r.len_bytes / BLOCK))
            .collect();
        assert_eq!(spans, vec![(0, 1), (3, 4)]);
        assert_eq!(untaken_runs(&e, &[]).len(), 1);
    }

    impl BufferSet {
        /// One recycled page joins the set; returns its place in it.
        fn add_page(&self, page: u64) -> u32 {
            let place = self.extents.lock().expect("buffer set").len() as u32;
            self.add_runs(&[PageRun {
                addr: page,
                blocks: 1,
            }]);
            place
        }
    }

    fn free_bytes(volume: &Volume) -> u64 {
        volume.stats().iter().map(|d| d.free_bytes).sum()
    }

    /// A pool whose thread wrote one block into a buffer and one into a recycled page, both
    /// records retired and neither remapped into a file (copied in place, or made void).
    /// One block at `offset` placed in `pool`: in a recycled page from `recycle` (asked
    /// for at most that many) if it gives one, else in a buffer from `volume`.
    fn place_block(
        pool: &mut Pool,
        volume: &Volume,
        offset: u64,
        recycle: &dyn Fn(usize) -> Taken,
    ) -> Placement {
        match pool
            .reserve(
                volume,
                offset,
                BLOCK,
                &|| 1 << 30,
                &|len| Ok(volume.alloc_local(len)?),
                recycle,
            )
            .unwrap()
        {
            Reserve::Placed(placed) => placed,
            Reserve::Wait => panic!("an empty pool waits"),
        }
    }

    fn pool_with_untaken_pages(volume: &Volume) -> (Pool, u64) {
        let mut pool = Pool::new(2, 8 * BLOCK, true);
        let page = volume.alloc_local(BLOCK).unwrap().start.raw();
        let before = free_bytes(volume);
        let recycle = std::cell::Cell::new(Some(page));
        let placed = |pool: &mut Pool, offset| {
            place_block(pool, volume, offset, &|_| {
                recycle
                    .take()
                    .map(|addr| PageRun { addr, blocks: 1 })
                    .into_iter()
                    .collect()
            })
        };
        let in_page = placed(&mut pool, 0);
        assert_eq!(
            in_page.addr, page,
            "an aligned block goes into the recycled page"
        );
        let in_buffer = placed(&mut pool, BLOCK);
        assert_eq!(
            free_bytes(volume),
            before - 8 * BLOCK,
            "the buffer came from the volume"
        );
        for placed in [in_page, in_buffer] {
            assert!(!placed.set.release(), "an unsealed set waits for its seal");
        }
        (pool, before + BLOCK)
    }

    #[test]
    fn an_ended_threads_pool_gives_back_what_files_did_not_take() {
        let shm = testkit::shm_volume("pool-release", 16 << 20);
        let volume = testkit::open_volume(&shm.dir);
        let (mut pool, all_back) = pool_with_untaken_pages(&volume);
        pool.release(&volume).unwrap();
        assert_eq!(free_bytes(&volume), all_back);
        pool.release(&volume).unwrap();
        assert_eq!(
            free_bytes(&volume),
            all_back,
            "a second release frees nothing twice"
        );
    }

    #[test]
    fn a_trim_seals_the_recycled_pages_as_well_as_the_buffer() {
        let shm = testkit::shm_volume("pool-trim", 16 << 20);
        let volume = testkit::open_volume(&shm.dir);
        let (mut pool, all_back) = pool_with_untaken_pages(&volume);
        assert!(pool.trim(&volume).unwrap());
        assert_eq!(free_bytes(&volume), all_back);
        assert!(!pool.trim(&volume).unwrap(), "nothing left to seal");
    }

    /// Recycled lists for `volume`'s devices, of `cap` pages per device.
    fn recycled_lists(volume: &Volume, cap: usize) -> Recycled {
        let nodes = (0..volume.stats().len() as u32)
            .map(|d| volume.device_node(d))
            .collect();
        Recycled::new(nodes, cap)
    }

    /// A run of `blocks` blocks allocated on `volume`, as a batch frees it.
    fn freed_run(volume: &Volume, blocks: u64) -> Run {
        let e = volume.alloc_local(blocks * BLOCK).unwrap();
        Run {
            file_block: 0,
            blocks,
            addr: e.start.raw(),
        }
    }

    /// Freed runs: short ones into the list while whole runs fit under its cap (a run that
    /// does not fit goes to the volume whole, a later one that fits still into the list),
    /// long ones to the volume; every page taken back is one that went in.
    #[test]
    fn recycled_lists_keep_short_runs_up_to_their_cap() {
        let shm = testkit::shm_volume("recycled-free", 16 << 20);
        let volume = testkit::open_volume(&shm.dir);
        let node = volume.current_node();
        let recycled = recycled_lists(&volume, 6);
        let run = |blocks: u64| freed_run(&volume, blocks);
        let runs = [run(4), run(3), run(RECYCLE_RUN_BLOCKS), run(2), run(1)];
        let before = free_bytes(&volume);
        recycled.free(&volume, runs.iter().map(Run::pages)).unwrap();
        assert_eq!(
            recycled.held(),
            6,
            "4 + 2 fit; the run of 3 and the long one do not"
        );
        assert_eq!(
            free_bytes(&volume),
            before + (3 + RECYCLE_RUN_BLOCKS + 1) * BLOCK,
            "what did not fit went back to the volume"
        );
        assert_eq!(recycled.room(), 0);
        let mut taken: Vec<u64> =
            std::iter::from_fn(|| recycled.take(node, 0, 1).pop().map(|r| r.addr)).collect();
        taken.sort_unstable();
        let mut expected: Vec<u64> = [&runs[0], &runs[3]]
            .iter()
            .flat_map(|r| (0..r.blocks).map(move |i| r.addr + i * BLOCK))
            .collect();
        expected.sort_unstable();
        assert_eq!(taken, expected);
        assert_eq!(recycled.room(), 6);
    }

    /// Freed up to a level below the cap: the lists fill to that level (what they held
    /// counts), the rest goes back to the volume, and a later free up to the cap still fills
    /// them.
    #[test]
    fn recycled_lists_fill_only_up_to_the_level_asked() {
        let shm = testkit::shm_volume("recycled-level", 16 << 20);
        let volume = testkit::open_volume(&shm.dir);
        let recycled = recycled_lists(&volume, 8);
        let pages = |n: usize| -> Vec<Run> { (0..n).map(|_| freed_run(&volume, 1)).collect() };
        recycled
            .free(&volume, pages(2).iter().map(Run::pages))
            .unwrap();
        let five = pages(5);
        let before = free_bytes(&volume);
        recycled
            .free_up_to(&volume, five.iter().map(Run::pages), 4)
            .unwrap();
        assert_eq!(recycled.held(), 4, "2 held + 2 up to the level");
        assert_eq!(free_bytes(&volume), before + 3 * BLOCK, "3 to the volume");
        recycled
            .free(&volume, pages(5).iter().map(Run::pages))
            .unwrap();
        assert_eq!(recycled.held(), 8, "then up to the cap");
    }

    /// A batch's runs go to the lists holding fewest pages, whole; a writer takes from its
    /// slot's list while it has pages, then from the next ones, splitting a run that holds
    /// more than it asked for (the rest stays on top of its list).
    #[test]
    fn recycled_runs_are_shared_over_the_lists_and_taken_from_the_slots_first() {
        let shm = testkit::shm_volume("recycled-shards", 16 << 20);
        let volume = testkit::open_volume(&shm.dir);
        let node = volume.current_node();
        let recycled = recycled_lists(&volume, 64);
        let run = |blocks: u64| freed_run(&volume, blocks);
        let first = [run(2), run(2), run(2), run(2)];
        let device = GlobalAddress::from_raw(first[0].addr).device() as usize;
        let lists = || lens(&recycled.devices[device]);
        recycled
            .free(&volume, first.iter().map(Run::pages))
            .unwrap();
        assert_eq!(lists(), [2, 2, 2, 2], "a run each, in order");
        let take = |slot: u32, most: usize| recycled.take(node, slot, most).into_vec();
        let whole = |r: &Run| PageRun {
            addr: r.addr,
            blocks: r.blocks as u32,
        };
        let part = |addr: u64, blocks: u32| PageRun { addr, blocks };
        // Slot 5's list is list 1. No list has a run of one page: the front of its own.
        assert_eq!(take(5, 1), [part(first[1].addr, 1)]);
        assert_eq!(lists(), [2, 1, 2, 2]);
        // Three pages: the rest of that run, then the next list's run whole.
        assert_eq!(
            take(5, 3),
            [part(first[1].addr + BLOCK, 1), whole(&first[2])],
            "an empty list sends the writer to the next"
        );
        assert_eq!(lists(), [2, 0, 0, 2]);
        assert_eq!(take(3, 2), [whole(&first[3])]);
        assert_eq!(take(0, 1), [part(first[0].addr, 1)]);
        assert_eq!(lists(), [1, 0, 0, 0]);
        let second = [run(4), run(1), run(2)];
        recycled
            .free(&volume, second.iter().map(Run::pages))
            .unwrap();
        assert_eq!(lists(), [1, 4, 1, 2], "new runs go to the shortest lists");
        assert_eq!(recycled.held(), 8);
        assert_eq!(recycled.room(), 56);
        let before = free_bytes(&volume);
        assert!(recycled.drain(&volume).unwrap());
        assert_eq!(recycled.held(), 0);
        assert_eq!(lists(), [0, 0, 0, 0]);
        assert_eq!(free_bytes(&volume), before + 8 * BLOCK);
        // Every page the lists held is free, and none of the pages handed out.
        let page = |addr: u64| Extent {
            start: GlobalAddress::from_raw(addr),
            len_bytes: BLOCK,
        };
        assert!(volume.free(page(first[0].addr + BLOCK)).is_err());
        assert!(volume.free(page(second[0].addr + 3 * BLOCK)).is_err());
        assert!(volume.free(page(first[0].addr)).is_ok(), "handed out");
        assert!(
            volume.free(page(first[2].addr + BLOCK)).is_ok(),
            "handed out"
        );
    }

    /// Single-block writes take recycled pages into the pool's set a few at a time: the
    /// lists give up to [`RECYCLED_TAKE`] at once (fewer near the set's end), the pages not
    /// used yet count as free in the pool, each is used once and at its own place, and a
    /// trim gives back the ones no write used.
    #[test]
    fn a_pool_takes_recycled_pages_a_few_at_a_time_and_gives_back_the_unused() {
        let shm = testkit::shm_volume("pool-recycled-take", 16 << 20);
        let volume = testkit::open_volume(&shm.dir);
        let node = volume.current_node();
        let recycled = recycled_lists(&volume, 256);
        let freed: Vec<Run> = (0..RECYCLED_SET_PAGES + 4)
            .map(|_| freed_run(&volume, 1))
            .collect();
        recycled
            .free(&volume, freed.iter().map(Run::pages))
            .unwrap();
        let all = freed.len() as u64;
        let mut pool = Pool::new(2, 8 * BLOCK, true);
        let asked = std::cell::RefCell::new(Vec::new());
        let place = |pool: &mut Pool, offset: u64| {
            place_block(pool, &volume, offset, &|most| {
                asked.borrow_mut().push(most);
                recycled.take(node, 0, most)
            })
        };
        let first = place(&mut pool, 0);
        assert_eq!(recycled.held(), all - RECYCLED_TAKE as u64);
        assert_eq!(pool.unused_bytes(), (RECYCLED_TAKE as u64 - 1) * BLOCK);
        let mut placed = vec![first];
        for i in 1..RECYCLED_SET_PAGES as u64 {
            placed.push(place(&mut pool, i * BLOCK));
        }
        assert_eq!(
            *asked.borrow(),
            vec![RECYCLED_TAKE; RECYCLED_SET_PAGES / RECYCLED_TAKE],
            "asked once per {RECYCLED_TAKE} pages"
        );
        let mut pages: Vec<u64> = placed.iter().map(|p| p.addr).collect();
        pages.sort_unstable();
        pages.dedup();
        assert_eq!(pages.len(), RECYCLED_SET_PAGES, "a page is used once");
        for (i, p) in placed.iter().enumerate() {
            assert_eq!(p.page as usize, i, "places follow the pages' use");
            assert!(std::sync::Arc::ptr_eq(&p.set, &placed[0].set));
        }
        assert!(
            placed[0].set.is_sealed(),
            "a set whose every page is used is sealed"
        );
        // A new set, which takes the 4 pages left and uses one.
        let next = place(&mut pool, 0);
        assert_eq!(next.page, 0);
        assert_eq!(recycled.held(), 0);
        assert_eq!(pool.unused_bytes(), 3 * BLOCK);
        // Its one record retires with its page taken by a file; the trim frees the other 3.
        next.set.take_page_run(next.page, 1);
        assert!(!next.set.release());
        let before = free_bytes(&volume);
        assert!(pool.trim(&volume).unwrap());
        assert_eq!(free_bytes(&volume), before + 3 * BLOCK);
        assert_eq!(pool.unused_bytes(), 0);
    }

    /// A write of several blocks takes a run of recycled pages in a row, at places in a
    /// row; one asking for more than the run left holds gets what is left, and the next
    /// take starts a new run. The reclaim hands back what files did not take in runs, not
    /// page by page.
    #[test]
    fn a_pool_places_short_writes_in_runs_and_gives_back_runs() {
        let shm = testkit::shm_volume("pool-recycled-runs", 16 << 20);
        let volume = testkit::open_volume(&shm.dir);
        let node = volume.current_node();
        let recycled = recycled_lists(&volume, 256);
        let freed: Vec<Run> = [5, 3].iter().map(|&b| freed_run(&volume, b)).collect();
        recycled
            .free(&volume, freed.iter().map(Run::pages))
            .unwrap();
        let mut pool = Pool::new(2, 8 * BLOCK, true);
        let mut place = |blocks: u64| {
            pool.place_recycled(&volume, blocks, &|most| recycled.take(node, 0, most))
                .unwrap()
        };
        // One take of 8 pages: the run of 5 (list 0), the run of 3 (list 1).
        let (a, n) = place(4).unwrap();
        assert_eq!(
            (a.addr, a.page, n),
            (freed[0].addr, 0, 4),
            "the run that fits"
        );
        let (b, n) = place(1).unwrap();
        assert_eq!(
            (b.addr, b.page, n),
            (freed[0].addr + 4 * BLOCK, 4, 1),
            "the run left of the first, which fits best"
        );
        let (c, n) = place(2).unwrap();
        assert_eq!((c.addr, c.page, n), (freed[1].addr, 5, 2));
        let (d, n) = place(2).unwrap();
        assert_eq!(
            (d.addr, d.page, n),
            (freed[1].addr + 2 * BLOCK, 7, 1),
            "none fits: what there is"
        );
        assert!(place(1).is_none(), "the lists are empty");
        assert!(std::sync::Arc::ptr_eq(&a.set, &d.set));
        // Files took the first write's middle two pages and the third write's two.
        a.set.take_page_run(1, 2);
        c.set.take_page_run(5, 2);
        let mut handed = Vec::new();
        for p in [&a, &b, &c, &d] {
            assert!(!p.set.release());
        }
        assert!(a.set.seal());
        a.set
            .reclaim_with(|run| {
                handed.push((run.start.raw(), run.len_bytes / BLOCK));
                Ok(())
            })
            .unwrap();
        let base = freed[0].addr;
        assert_eq!(
            handed,
            vec![(base, 1), (base + 3 * BLOCK, 2), (d.addr, 1)],
            "the untaken pages, neighbours as one run"
        );
    }

    /// A reclaimed set frees exactly the pages no file took, whatever order its extents
    /// joined it in (recycled pages join one by one, anywhere on the volume).
    #[test]
    fn a_reclaimed_set_frees_exactly_its_untaken_pages() {
        let shm = testkit::shm_volume("reclaim-walk", 16 << 20);
        let volume = testkit::open_volume(&shm.dir);
        let extents: Vec<Extent> = [1, 1, 4, 1, 2, 1]
            .iter()
            .map(|&pages| volume.alloc_local(pages * BLOCK).unwrap())
            .collect();
        // Scrambled: neither the order allocated nor address order.
        let mut scrambled: Extents = [3, 0, 5, 2, 4, 1].iter().map(|&i| extents[i]).collect();
        scrambled.swap(1, 4);
        let set = BufferSet::new(scrambled);
        // Files took the second and fourth pages of the 4-page extent, the 2-page extent's
        // first page and two single pages.
        let four = extents[2].start.raw();
        set.take_pages(extents[5].start.raw(), 1);
        set.take_pages(four + BLOCK, 1);
        set.take_pages(extents[4].start.raw(), 1);
        set.take_pages(four + 3 * BLOCK, 1);
        set.take_pages(extents[0].start.raw(), 1);
        let before = free_bytes(&volume);
        assert!(set.seal());
        set.reclaim(&volume).unwrap();
        assert_eq!(free_bytes(&volume), before + 5 * BLOCK, "10 pages, 5 taken");
        // The untaken pages are free again; the taken ones are not.
        for (page, free) in [
            (extents[1].start.raw(), true),
            (extents[3].start.raw(), true),
            (four, true),
            (four + 2 * BLOCK, true),
            (extents[4].start.raw() + BLOCK, true),
            (extents[0].start.raw(), false),
            (four + BLOCK, false),
            (four + 3 * BLOCK, false),
        ] {
            let extent = Extent {
                start: GlobalAddress::from_raw(page),
                len_bytes: BLOCK,
            };
            let refused = volume.free(extent).is_err();
            assert_eq!(
                refused, free,
                "page {page:#x}: freed by the reclaim: {free}"
            );
        }
    }

    /// A page recycled into the set it was used in before: taken both times, it is a file's
    /// (not freed); taken the first time only, the set frees it once.
    #[test]
    fn a_page_used_twice_in_a_set_is_freed_only_if_its_last_use_was_not_taken() {
        let shm = testkit::shm_volume("reclaim-twice", 16 << 20);
        let volume = testkit::open_volume(&shm.dir);
        for taken_again in [true, false] {
            let page = volume.alloc_local(BLOCK).unwrap();
            let other = volume.alloc_local(BLOCK).unwrap();
            let set = BufferSet::holding(Extents::new(), 3);
            set.add_page(page.start.raw());
            set.add_page(other.start.raw());
            set.take_pages(page.start.raw(), 1);
            // The file gave the page back (an overwrite), and the writer used it again.
            set.add_page(page.start.raw());
            if taken_again {
                set.take_pages(page.start.raw(), 1);
            }
            let before = free_bytes(&volume);
            assert!(set.seal());
            set.reclaim(&volume).unwrap();
            let freed = if taken_again { 1 } else { 2 };
            assert_eq!(
                free_bytes(&volume),
                before + freed * BLOCK,
                "taken again: {taken_again}"
            );
            let page_freed = volume.free(page).is_err();
            assert_eq!(page_freed, !taken_again, "taken again: {taken_again}");
        }
    }

    /// A set of recycled pages frees the pages at the places no file took — a page used
    /// twice once for its untaken use — by place, without looking at addresses.
    #[test]
    fn a_set_of_recycled_pages_frees_the_places_not_taken() {
        let shm = testkit::shm_volume("reclaim-places", 16 << 20);
        let volume = testkit::open_volume(&shm.dir);
        for taken_again in [true, false] {
            let page = volume.alloc_local(BLOCK).unwrap();
            let others: Vec<Extent> = (0..5).map(|_| volume.alloc_local(BLOCK).unwrap()).collect();
            let set = BufferSet::of_recycled_pages();
            let first = set.add_page(page.start.raw());
            let places: Vec<u32> = others.iter().map(|e| set.add_page(e.start.raw())).collect();
            set.take_page_run(first, 1);
            // The file gave the page back (an overwrite), and the writer used it again.
            let again = set.add_page(page.start.raw());
            assert_eq!((first, again), (0, 6));
            if taken_again {
                set.take_page_run(again, 1);
            }
            // Of the others, the records of 0, 2 and 4 were made void by newer writes.
            set.take_page_run(places[1], 1);
            set.take_page_run(places[3], 1);
            let before = free_bytes(&volume);
            assert!(set.seal());
            set.reclaim(&volume).unwrap();
            let freed = 3 + u64::from(!taken_again);
            assert_eq!(
                free_bytes(&volume),
                before + freed * BLOCK,
                "taken again: {taken_again}"
            );
            for (i, other) in others.iter().enumerate() {
                let refused = volume.free(*other).is_err();
                assert_eq!(refused, i % 2 == 0, "page {i}: freed by the reclaim");
            }
            assert_eq!(volume.free(page).is_err(), !taken_again);
        }
    }

    /// A set whose every page use a file took frees nothing, whatever the order of the
    /// takings and even when a page was used (and taken) twice; one untaken use among them
    /// frees exactly that page.
    #[test]
    fn a_set_taken_whole_frees_nothing() {
        let shm = testkit::shm_volume("reclaim-whole", 16 << 20);
        let volume = testkit::open_volume(&shm.dir);
        for leave_one in [false, true] {
            let pool = volume.alloc_local(4 * BLOCK).unwrap();
            let single = volume.alloc_local(BLOCK).unwrap();
            let set = BufferSet::holding(std::iter::once(pool).collect(), 6);
            set.add_page(single.start.raw());
            set.take_pages(single.start.raw(), 1);
            // The file gave the single page back and the writer used it again.
            set.add_page(single.start.raw());
            set.take_pages(single.start.raw(), 1);
            let base = pool.start.raw();
            set.take_pages(base + 2 * BLOCK, 2);
            set.take_pages(base + BLOCK, 1);
            if !leave_one {
                set.take_pages(base, 1);
            }
            let before = free_bytes(&volume);
            assert!(set.seal());
            set.reclaim(&volume).unwrap();
            let freed = u64::from(leave_one);
            assert_eq!(
                free_bytes(&volume),
                before + freed * BLOCK,
                "one left: {leave_one}"
            );
            let first = Extent {
                start: pool.start,
                len_bytes: BLOCK,
            };
            assert_eq!(
                volume.free(first).is_ok(),
                !leave_one,
                "one left: {leave_one}"
            );
            assert!(
                volume.free(single).is_ok(),
                "the single page stays a file's"
            );
        }
    }

    /// New pages even the lists out as far as they go, and every page goes somewhere.
    #[test]
    fn pages_are_shared_out_to_the_shortest_lists() {
        assert_eq!(even_shares([0, 0, 0, 0], 8), [2, 2, 2, 2]);
        assert_eq!(even_shares([2, 0, 1, 2], 3), [0, 2, 1, 0]);
        assert_eq!(even_shares([9, 0, 5, 1], 4), [0, 3, 0, 1]);
        assert_eq!(even_shares([9, 0, 5, 1], 0), [0, 0, 0, 0]);
        for lens in [[3, 1, 4, 1], [0, 7, 7, 2], [5, 5, 5, 5]] {
            for pages in 0..40 {
                let give = even_shares(lens, pages);
                assert_eq!(give.iter().sum::<usize>(), pages);
                let after: Vec<usize> = lens.iter().zip(give).map(|(l, g)| l + g).collect();
                let low = *after.iter().min().unwrap();
                // A list that got pages is at most one above the lowest.
                for (i, &g) in give.iter().enumerate() {
                    assert!(
                        g == 0 || after[i] <= low + 1,
                        "{lens:?} + {pages}: {give:?}"
                    );
                }
            }
        }
    }

    /// Runs go to the lists in stretches in a row, whole, every one somewhere, each list
    /// within a run's pages of its even share.
    #[test]
    fn runs_are_shared_out_in_stretches_of_about_even_shares() {
        let runs = |blocks: &[u32]| -> Vec<PageRun> {
            blocks
                .iter()
                .map(|&blocks| PageRun { addr: 0, blocks })
                .collect()
        };
        assert_eq!(
            share_out([0, 0, 0, 0], &runs(&[2, 2, 2, 2])),
            [0..1, 1..2, 2..3, 3..4]
        );
        assert_eq!(
            share_out([2, 0, 1, 2], &runs(&[1, 1, 1])),
            [0..0, 0..2, 2..3, 3..3]
        );
        assert_eq!(
            share_out([9, 0, 5, 1], &runs(&[4, 3])),
            [0..0, 0..1, 1..1, 1..2]
        );
        for lens in [[3, 1, 4, 1], [0, 7, 7, 2], [5, 5, 5, 5]] {
            for n in 0..40u32 {
                let given = runs(&(0..n).map(|i| 1 + i * 7 % 15).collect::<Vec<_>>());
                let shares = share_out(lens, &given);
                let pages = |r: std::ops::Range<usize>| -> usize {
                    given[r].iter().map(|r| r.blocks as usize).sum()
                };
                let even = even_shares(lens, pages(0..given.len()));
                let mut next = 0;
                for (i, share) in shares.iter().enumerate() {
                    assert_eq!(share.start, next, "{lens:?} + {n}: {shares:?}");
                    next = share.end;
                    let got = pages(share.clone()) as isize;
                    assert!(
                        (got - even[i] as isize).abs() < RECYCLE_RUN_BLOCKS as isize,
                        "{lens:?} + {n}: {shares:?}, even {even:?}"
                    );
                }
                assert_eq!(next, given.len(), "every run goes to a list");
            }
        }
    }

    #[test]
    fn a_set_is_reclaimed_once_sealed_and_released() {
        let set = BufferSet::new(Extents::new());
        set.add_record();
        set.add_record();
        assert!(!set.seal());
        assert!(!set.release());
        assert!(set.release());
        let empty = BufferSet::new(Extents::new());
        assert!(empty.seal(), "sealing an unused set reclaims at once");
    }
}
