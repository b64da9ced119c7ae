//! A file's block table: file blocks (4 KiB) mapped to volume pages.
//!
//! The map is kept per *chunk* of [`CHUNK_BLOCKS`] blocks (2 MiB of file), in one ordered
//! map keyed by chunk number. A chunk is either
//! - part of a [`Chunk::Run`]: whole chunks, every block mapped, their pages consecutive —
//!   what sequential writes leave, one entry however long the file; or
//! - a [`Table`]: one page address per block (or a hole) — what small writes leave.
//!
//! Remapping one block of a table is a store into an array: no search beyond the chunk's,
//! no allocation, whatever the file's history (random 4 KiB overwrites used to leave an
//! ordered-map entry per block, and each remap split and reinserted them). A table whose
//! blocks become one consecutive run turns back into a `Run`, merged with its neighbours.
//! Readers see runs: [`ExtentMap::lookup`] and [`ExtentMap::runs`] coalesce blocks that are
//! consecutive in both the file and memory, whichever writes put them there.
//!
//! Unmapped blocks are holes and read as zeros. Mapping a range replaces whatever was mapped
//! there and hands back the replaced pieces, which the caller frees once the change is
//! durable.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

/// Bytes per file block (and per volume page).
pub const BLOCK: u64 = 4096;

/// Blocks per chunk (2 MiB of file): a table is one page of addresses.
pub const CHUNK_BLOCKS: u64 = 512;

/// A mapped run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Run {
    /// First file block.
    pub file_block: u64,
    /// Blocks in the run.
    pub blocks: u64,
    /// Global address of the first block's page.
    pub addr: u64,
}

impl Run {
    fn end(&self) -> u64 {
        self.file_block + self.blocks
    }

    /// The run's pages, as the volume names them.
    pub(crate) fn pages(&self) -> volume::Extent {
        volume::Extent {
            start: volume::GlobalAddress::from_raw(self.addr),
            len_bytes: self.blocks * BLOCK,
        }
    }

    /// One block.
    fn block(file_block: u64, addr: u64) -> Self {
        Self {
            file_block,
            blocks: 1,
            addr,
        }
    }

    /// A run a decoder of outside bytes may hand on: at least one block, its file blocks
    /// and its pages within `u64` bytes, its pages block aligned (the block table marks
    /// mapped entries in a page address's low bits).
    pub(crate) fn is_sound(&self) -> bool {
        self.blocks != 0
            && self.addr.is_multiple_of(BLOCK)
            && self
                .file_block
                .checked_add(self.blocks)
                .and_then(|end| end.checked_mul(BLOCK))
                .is_some()
            && self
                .blocks
                .checked_mul(BLOCK)
                .and_then(|len| self.addr.checked_add(len))
                .is_some()
    }
}

/// Appends a run to `out`, merging it into the last one when they are consecutive in both
/// the file and memory.
fn push_run(out: &mut Vec<Run>, run: Run) {
    if let Some(last) = out.last_mut()
        && last.end() == run.file_block
        && last.addr + last.blocks * BLOCK == run.addr
    {
        last.blocks += run.blocks;
        return;
    }
    out.push(run);
}

/// One chunk's blocks: `page | 1` for a mapped block (pages are block aligned, so the low
/// bit is free to mark "mapped"), 0 for a hole.
///
/// The entries end at the last mapped one (every entry past the end is a hole): a small
/// file's table holds its few blocks, not the chunk's 512. A whole page of entries per file
/// made every file under 2 MiB cost 4 KiB of DRAM (measured through `locus mount`: 20,000
/// files of 4 KiB took 8.3 KiB each, 3.6 KiB of it the inode). A table grows as blocks are
/// mapped further in (the vector's doubling: at most twice what it holds, and at most one
/// page), so remapping a block stays a store into an array.
struct Table {
    entries: Vec<u64>,
    /// The entries, when the table is shared with the file's writers instead
    /// ([`ExtentMap::share_chunk`]; `entries` is then empty).
    shared: Option<Arc<SharedTable>>,
    /// Mapped entries.
    mapped: u32,
    /// Entries that start a run within the chunk (mapped, and not the page after the
    /// previous entry's). Not kept for a shared table, whose writers change its entries
    /// without the map's lock: it counts each mapped entry as a run there.
    starts: u32,
}

/// A chunk's entries as a table shares them with the file's writers: every entry of the
/// chunk, each an atomic, so that a writer remaps a block it holds the range lock of with a
/// store while the map's other users read other entries ([`SharedTable::remap`]).
///
/// A writer reaches it through the file's overlay shard of the chunk, which holds it too; a
/// chunk whose entries leave the map (made a run, removed, the map rebuilt) is marked no
/// longer live as the map's table drops it, and writers then leave it alone. What the map
/// does to a shared table's entries it does under an exclusive range lock of those blocks,
/// as the writers do, and it drops one only under a range lock over the whole chunk (a chunk
/// remapped or truncated whole), so no writer is between finding the table live and storing.
///
/// The overlay holds a strong reference rather than a weak one that each write would have
/// to upgrade: the upgrade and its release were two locked instructions a write on the
/// `Arc`'s count, a line both writers of a file wrote (`remap_block` 48 ns a write at two
/// threads, 26 at one). A table the map let go of stays allocated until its overlay shard
/// drops it — when a writer next finds it dead, or the checkpoint shares another table there.
pub struct SharedTable {
    entries: Box<[AtomicU64; CHUNK_BLOCKS as usize]>,
    live: AtomicBool,
}

impl std::fmt::Debug for SharedTable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SharedTable")
            .field("live", &self.is_live())
            .finish_non_exhaustive()
    }
}

impl SharedTable {
    /// Whether the file's map still holds the table (its entries are the chunk's).
    pub fn is_live(&self) -> bool {
        self.live.load(Ordering::Acquire)
    }

    /// Makes block `i` of the chunk the page `page`, if it is mapped; returns the page it
    /// had (`None`: a hole, left one). For the holder of the block's exclusive range lock.
    pub fn remap(&self, i: usize, page: u64) -> Option<u64> {
        debug_assert!(
            page.is_multiple_of(BLOCK),
            "page {page:#x} is not block aligned"
        );
        let entry = &self.entries[i];
        let old = entry.load(Ordering::Relaxed);
        if old == 0 {
            return None;
        }
        entry.store(page | MAPPED, Ordering::Relaxed);
        Some(old & !MAPPED)
    }
}

/// Equal when they map the same blocks to the same pages, however held.
impl PartialEq for Table {
    fn eq(&self, other: &Self) -> bool {
        self.mapped == other.mapped
            && (0..self.len().max(other.len())).all(|i| self.entry(i) == other.entry(i))
    }
}

impl Eq for Table {}

/// A shared table leaves the writers' hands with the map's table (see [`SharedTable`]).
impl Drop for Table {
    fn drop(&mut self) {
        if let Some(shared) = &self.shared {
            shared.live.store(false, Ordering::Release);
        }
    }
}

impl std::fmt::Debug for Table {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Table")
            .field("mapped", &self.mapped)
            .field("starts", &self.starts)
            .field("shared", &self.shared.is_some())
            .finish_non_exhaustive()
    }
}

const MAPPED: u64 = 1;

impl Table {
    fn empty() -> Box<Self> {
        Box::new(Self {
            entries: Vec::new(),
            shared: None,
            mapped: 0,
            starts: 0,
        })
    }

    /// A table of a whole consecutive run from `addr`.
    fn contiguous(addr: u64) -> Box<Self> {
        Box::new(Self {
            entries: (0..CHUNK_BLOCKS)
                .map(|i| (addr + i * BLOCK) | MAPPED)
                .collect(),
            shared: None,
            mapped: CHUNK_BLOCKS as u32,
            starts: 1,
        })
    }

    /// Entry `i` (0, a hole, past the end).
    fn entry(&self, i: usize) -> u64 {
        match &self.shared {
            Some(shared) => shared
                .entries
                .get(i)
                .map_or(0, |e| e.load(Ordering::Relaxed)),
            None => self.entries.get(i).copied().unwrap_or(0),
        }
    }

    /// Entries held (every one past them is a hole).
    fn len(&self) -> usize {
        match self.shared {
            Some(_) => CHUNK_BLOCKS as usize,
            None => self.entries.len(),
        }
    }

    /// Runs as [`ExtentMap::run_count`] counts them.
    fn runs(&self) -> u32 {
        match self.shared {
            Some(_) => self.mapped,
            None => self.starts,
        }
    }

    /// Sets `mapped` and `starts` from the entries.
    fn count(&mut self) {
        self.mapped = (0..self.len()).filter(|&i| self.entry(i) != 0).count() as u32;
        self.starts = (0..self.len()).filter(|&i| self.starts_run(i)).count() as u32;
    }

    fn page(&self, i: usize) -> Option<u64> {
        let e = self.entry(i);
        (e != 0).then_some(e & !MAPPED)
    }

    fn starts_run(&self, i: usize) -> bool {
        let e = self.entry(i);
        e != 0
            && (i == 0
                || self.entry(i - 1) == 0
                || (self.entry(i - 1) & !MAPPED) + BLOCK != e & !MAPPED)
    }

    /// Sets entry `i` to `page` (`None`: a hole); returns the page it replaced, if any (not
    /// the same page set again).
    fn set(&mut self, i: usize, page: Option<u64>) -> Option<u64> {
        let new = page.map_or(0, |p| {
            debug_assert!(p.is_multiple_of(BLOCK), "page {p:#x} is not block aligned");
            p | MAPPED
        });
        let old = self.entry(i);
        if old == new {
            return None;
        }
        if let Some(shared) = &self.shared {
            shared.entries[i].store(new, Ordering::Relaxed);
            self.mapped = self.mapped + u32::from(new != 0) - u32::from(old != 0);
            return (old != 0).then_some(old & !MAPPED);
        }
        let around = |t: &Self| {
            u32::from(t.starts_run(i))
                + u32::from(i + 1 < CHUNK_BLOCKS as usize && t.starts_run(i + 1))
        };
        let before = around(self);
        if i >= self.entries.len() {
            self.entries.resize(i + 1, 0);
        }
        self.entries[i] = new;
        // The entries end at the last mapped one.
        while self.entries.last() == Some(&0) {
            self.entries.pop();
        }
        self.starts = self.starts - before + around(self);
        self.mapped = self.mapped + u32::from(new != 0) - u32::from(old != 0);
        (old != 0).then_some(old & !MAPPED)
    }

    /// The single run the table is, if it is one: every block mapped, pages consecutive.
    fn as_run(&self) -> Option<u64> {
        // A shared table stays one: its writers hold its entries.
        (self.shared.is_none() && self.mapped == CHUNK_BLOCKS as u32 && self.starts == 1)
            .then(|| self.entry(0) & !MAPPED)
    }

    /// Hands the mapped blocks of entries `[from, to)` to `sink` one by one (first file
    /// block of the chunk: `base`).
    fn pieces(&self, base: u64, from: usize, to: usize, sink: &mut impl FnMut(Run)) {
        for i in from..to.min(self.len()) {
            if let Some(page) = self.page(i) {
                sink(Run::block(base + i as u64, page));
            }
        }
    }
}

/// An entry of the chunk map.
#[derive(Debug, PartialEq, Eq)]
enum Chunk {
    /// `chunks` whole chunks from the key on, every block mapped, pages consecutive from
    /// `addr`.
    Run { chunks: u64, addr: u64 },
    /// One chunk, block by block.
    Table(Box<Table>),
}

impl Chunk {
    /// Chunks covered.
    fn chunks(&self) -> u64 {
        match self {
            Chunk::Run { chunks, .. } => *chunks,
            Chunk::Table(_) => 1,
        }
    }

    fn blocks(&self) -> u64 {
        match self {
            Chunk::Run { chunks, .. } => chunks * CHUNK_BLOCKS,
            Chunk::Table(t) => u64::from(t.mapped),
        }
    }

    /// Runs as counted by [`ExtentMap::run_count`].
    fn runs(&self) -> u64 {
        match self {
            Chunk::Run { .. } => 1,
            Chunk::Table(t) => u64::from(t.runs()),
        }
    }
}

/// The chunk map's entries by first chunk. Most files have one entry — a small file's
/// table, or one run however long the file — held in place; a second entry moves them into
/// an ordered map. (An ordered map's first node is a few hundred bytes: it was about a
/// quarter of a small file's DRAM, and its allocation a tenth of a mount's time.)
#[derive(Debug)]
enum Chunks {
    One(Option<(u64, Chunk)>),
    Many(BTreeMap<u64, Chunk>),
}

impl Default for Chunks {
    fn default() -> Self {
        Self::One(None)
    }
}

/// Equal when they hold the same entries, however held.
impl PartialEq for Chunks {
    fn eq(&self, other: &Self) -> bool {
        self.len() == other.len() && self.range(0, u64::MAX).eq(other.range(0, u64::MAX))
    }
}

impl Eq for Chunks {}

impl Chunks {
    fn len(&self) -> usize {
        match self {
            Self::One(one) => usize::from(one.is_some()),
            Self::Many(map) => map.len(),
        }
    }

    fn get(&self, c: u64) -> Option<&Chunk> {
        match self {
            Self::One(Some((key, chunk))) if *key == c => Some(chunk),
            Self::One(_) => None,
            Self::Many(map) => map.get(&c),
        }
    }

    fn get_mut(&mut self, c: u64) -> Option<&mut Chunk> {
        match self {
            Self::One(Some((key, chunk))) if *key == c => Some(chunk),
            Self::One(_) => None,
            Self::Many(map) => map.get_mut(&c),
        }
    }

    /// The last entry whose key is at most `c`.
    fn at_or_before(&self, c: u64) -> Option<(u64, &Chunk)> {
        match self {
            Self::One(Some((key, chunk))) if *key <= c => Some((*key, chunk)),
            Self::One(_) => None,
            Self::Many(map) => map.range(..=c).next_back().map(|(&k, v)| (k, v)),
        }
    }

    /// The last entry whose key is below `c`.
    fn before(&self, c: u64) -> Option<(u64, &Chunk)> {
        c.checked_sub(1).and_then(|c| self.at_or_before(c))
    }

    /// The entries with keys in `[from, last]`, in order.
    fn range(&self, from: u64, last: u64) -> ChunkRange<'_> {
        match self {
            Self::One(one) => ChunkRange::One(
                one.as_ref()
                    .filter(|(key, _)| (from..=last).contains(key))
                    .map(|(key, chunk)| (*key, chunk)),
            ),
            Self::Many(map) => ChunkRange::Many(map.range(from..=last)),
        }
    }

    fn insert(&mut self, c: u64, chunk: Chunk) {
        match self {
            Self::One(one @ None) => *one = Some((c, chunk)),
            Self::One(Some((key, held))) if *key == c => *held = chunk,
            Self::One(one) => {
                let (key, held) = one.take().expect("one entry");
                *self = Self::Many(BTreeMap::from([(key, held), (c, chunk)]));
            }
            Self::Many(map) => {
                map.insert(c, chunk);
            }
        }
    }

    fn remove(&mut self, c: u64) -> Option<Chunk> {
        match self {
            Self::One(one) if one.as_ref().is_some_and(|(key, _)| *key == c) => {
                one.take().map(|(_, chunk)| chunk)
            }
            Self::One(_) => None,
            Self::Many(map) => {
                let removed = map.remove(&c);
                if map.len() <= 1 {
                    *self = Self::One(std::mem::take(map).into_iter().next());
                }
                removed
            }
        }
    }
}

/// Entries in key order from [`Chunks::range`].
enum ChunkRange<'a> {
    One(Option<(u64, &'a Chunk)>),
    Many(std::collections::btree_map::Range<'a, u64, Chunk>),
}

impl<'a> Iterator for ChunkRange<'a> {
    type Item = (u64, &'a Chunk);
    fn next(&mut self) -> Option<Self::Item> {
        match self {
            Self::One(one) => one.take(),
            Self::Many(range) => range.next().map(|(&k, v)| (k, v)),
        }
    }
}

/// Entries appended in key order.
impl FromIterator<(u64, Chunk)> for Chunks {
    fn from_iter<I: IntoIterator<Item = (u64, Chunk)>>(entries: I) -> Self {
        let mut entries = entries.into_iter();
        let Some(first) = entries.next() else {
            return Self::One(None);
        };
        match entries.next() {
            None => Self::One(Some(first)),
            Some(second) => Self::Many([first, second].into_iter().chain(entries).collect()),
        }
    }
}

/// The block table of one file.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct ExtentMap {
    /// Keyed by first chunk; entries never overlap.
    chunks: Chunks,
    blocks: u64,
    runs: u64,
}

impl ExtentMap {
    /// An empty map (a file of holes).
    pub fn new() -> Self {
        Self::default()
    }

    /// Mapped blocks.
    pub fn mapped_blocks(&self) -> u64 {
        self.blocks
    }

    /// Runs, counted per entry: a run that continues from one chunk's table into the next
    /// entry counts once in each. An upper bound of what [`ExtentMap::runs`] yields, kept
    /// without a scan.
    pub fn run_count(&self) -> usize {
        self.runs as usize
    }

    /// Every run, in file order, coalesced.
    pub fn runs(&self) -> impl Iterator<Item = Run> + '_ {
        self.lookup(0, u64::MAX).into_iter()
    }

    /// Maps `blocks` blocks from `file_block` to the pages at `addr`; appends the pieces that
    /// were mapped there before (to free once the change is durable) to `replaced`.
    pub fn map(&mut self, file_block: u64, blocks: u64, addr: u64, replaced: &mut Vec<Run>) {
        self.replace(file_block, file_block + blocks, Some(addr), replaced);
    }

    /// Maps each `(file_block, blocks, addr)` of `maps` as [`ExtentMap::map`] would, one
    /// after another, appending what they replaced to `replaced` in that order. Neighbours
    /// in `maps` that each lie inside one chunk, the same one, are entered under one search
    /// of the chunk map and one settling of its table: the checkpoint's groups of small
    /// overwrites (one stretch of a file each) looked their chunk up once per record, a
    /// tenth of its time with random 4 KiB writes.
    pub fn map_all(&mut self, maps: &[(u64, u64, u64)], replaced: &mut Vec<Run>) {
        // Part of chunk `c` (a whole chunk becomes a run entry, not a table entry).
        let within = |c: u64| {
            move |&&(block, blocks, _): &&(u64, u64, u64)| {
                (1..CHUNK_BLOCKS).contains(&blocks)
                    && block / CHUNK_BLOCKS == c
                    && (block + blocks - 1) / CHUNK_BLOCKS == c
            }
        };
        let mut k = 0;
        while k < maps.len() {
            let (block, blocks, addr) = maps[k];
            let c = block / CHUNK_BLOCKS;
            let n = maps[k..].iter().take_while(within(c)).count();
            if n == 0 {
                self.map(block, blocks, addr, replaced);
                k += 1;
                continue;
            }
            let base = c * CHUNK_BLOCKS;
            self.edit(c, |table| {
                for &(block, blocks, addr) in &maps[k..k + n] {
                    for i in 0..blocks {
                        let at = (block + i - base) as usize;
                        if let Some(old) = table.set(at, Some(addr + i * BLOCK)) {
                            push_run(replaced, Run::block(block + i, old));
                        }
                    }
                }
            });
            k += n;
        }
    }

    /// The map of `runs` — in file order, none overlapping another — built in one pass: the
    /// map that mapping them one by one ([`ExtentMap::map`]) gives, without its searches
    /// and edits (a mount builds one per file of the snapshot: mapped one by one, that was a
    /// fifth of the mount of a volume of small files). `None` when the runs are out of
    /// order, overlap or are not sound; the caller then maps them one by one, which names a
    /// block mapped twice.
    pub fn from_sorted_runs(runs: &[Run]) -> Option<Self> {
        let mut built = Build::default();
        let mut end = 0;
        for run in runs {
            if !run.is_sound() || run.file_block < end {
                return None;
            }
            end = run.end();
            let mut b = run.file_block;
            while b < end {
                let c = b / CHUNK_BLOCKS;
                let base = c * CHUNK_BLOCKS;
                let addr = run.addr + (b - run.file_block) * BLOCK;
                if b == base && end - b >= CHUNK_BLOCKS {
                    // No earlier run maps into chunk `c`: they end at or before `b`.
                    let n = (end - b) / CHUNK_BLOCKS;
                    built.run(c, n, addr);
                    b += n * CHUNK_BLOCKS;
                    continue;
                }
                let stop = end.min(base + CHUNK_BLOCKS);
                let table = built.table(c);
                let (first, last) = ((b - base) as usize, (stop - base) as usize);
                table.entries.resize(last, 0);
                for (i, entry) in table.entries[first..last].iter_mut().enumerate() {
                    *entry = (addr + i as u64 * BLOCK) | MAPPED;
                }
                b = stop;
            }
        }
        Some(built.finish())
    }

    /// Removes every mapping at or beyond `file_block` (truncation); returns what was mapped.
    pub fn truncate(&mut self, file_block: u64) -> Vec<Run> {
        let mut removed = Vec::new();
        self.replace(file_block, u64::MAX, None, &mut removed);
        removed
    }

    /// Removes every mapping of blocks `[from, to)` (a hole punched); returns what was mapped.
    pub fn punch(&mut self, from: u64, to: u64) -> Vec<Run> {
        let mut removed = Vec::new();
        self.replace(from, to, None, &mut removed);
        removed
    }

    /// Asks the CPU to bring in the cache lines of these blocks' table entries (a hint:
    /// nothing changes), looking each chunk up once for neighbours in it. The checkpoint
    /// calls it for a group of records before it takes their pieces from the overlay, so
    /// that the entries' cache misses overlap that work instead of stalling the remaps.
    pub fn prefetch_all(&self, file_blocks: impl IntoIterator<Item = u64>) {
        let mut table: Option<(u64, Option<&Table>)> = None;
        for block in file_blocks {
            let c = block / CHUNK_BLOCKS;
            if table.is_none_or(|(at, _)| at != c) {
                let found = match self.chunks.get(c) {
                    Some(Chunk::Table(t)) => Some(&**t),
                    _ => None,
                };
                table = Some((c, found));
            }
            if let Some((_, Some(t))) = table {
                let i = (block % CHUNK_BLOCKS) as usize;
                match &t.shared {
                    Some(shared) => pmem::prefetch(std::ptr::from_ref(&shared.entries[i])),
                    None => {
                        if let Some(entry) = t.entries.get(i) {
                            pmem::prefetch(std::ptr::from_ref(entry));
                        }
                    }
                }
            }
        }
    }

    /// Shares chunk `c`'s table with the file's writers, if the chunk is a table: its
    /// entries become a [`SharedTable`] (the one it has, if shared already), which the
    /// caller hands to the writers. The caller holds the map's lock and an exclusive range
    /// lock within the chunk. `None` for a run or a hole.
    pub fn share_chunk(&mut self, c: u64) -> Option<Arc<SharedTable>> {
        let Some(Chunk::Table(t)) = self.chunks.get_mut(c) else {
            return None;
        };
        if let Some(shared) = &t.shared {
            return Some(Arc::clone(shared));
        }
        let shared = Arc::new(SharedTable {
            entries: Box::new(std::array::from_fn(|i| {
                AtomicU64::new(t.entries.get(i).copied().unwrap_or(0))
            })),
            live: AtomicBool::new(true),
        });
        let handed = Arc::clone(&shared);
        let starts = t.starts;
        t.entries = Vec::new();
        t.shared = Some(shared);
        self.runs = self.runs - u64::from(starts) + u64::from(t.mapped);
        Some(handed)
    }

    /// The page of one block, or `None` for a hole.
    pub fn get(&self, file_block: u64) -> Option<u64> {
        let c = file_block / CHUNK_BLOCKS;
        let (key, chunk) = self.chunks.at_or_before(c)?;
        match chunk {
            Chunk::Table(t) if key == c => t.page((file_block % CHUNK_BLOCKS) as usize),
            Chunk::Run { chunks, addr } if c < key + chunks => {
                Some(addr + (file_block - key * CHUNK_BLOCKS) * BLOCK)
            }
            _ => None,
        }
    }

    /// The mapped pieces inside `[from, to)` (file blocks), in order, coalesced; gaps are
    /// holes.
    pub fn lookup(&self, from: u64, to: u64) -> Vec<Run> {
        let mut out = Vec::new();
        self.visit(from, to, &mut |run| push_run(&mut out, run));
        out
    }

    /// Mapped blocks inside `[from, to)` (file blocks).
    pub fn mapped_in(&self, from: u64, to: u64) -> u64 {
        let mut blocks = 0;
        self.visit(from, to, &mut |run| blocks += run.blocks);
        blocks
    }

    /// Calls `f` with every run, in file order, coalesced — [`ExtentMap::runs`] without
    /// collecting them (a mount walks every file's).
    pub fn each_run(&self, mut f: impl FnMut(Run)) {
        let mut pending: Option<Run> = None;
        self.visit(0, u64::MAX, &mut |run| match &mut pending {
            Some(last)
                if last.end() == run.file_block && last.addr + last.blocks * BLOCK == run.addr =>
            {
                last.blocks += run.blocks;
            }
            _ => {
                if let Some(done) = pending.replace(run) {
                    f(done);
                }
            }
        });
        if let Some(done) = pending {
            f(done);
        }
    }

    /// Hands the mapped pieces inside `[from, to)` to `sink` in order: a run entry's part
    /// whole, a table's blocks one by one.
    fn visit(&self, from: u64, to: u64, sink: &mut impl FnMut(Run)) {
        if from >= to {
            return;
        }
        let (first, last) = (from / CHUNK_BLOCKS, (to - 1) / CHUNK_BLOCKS);
        let before = self.chunks.before(first);
        for (key, chunk) in before.into_iter().chain(self.chunks.range(first, last)) {
            let base = key * CHUNK_BLOCKS;
            match chunk {
                Chunk::Run { chunks, addr } => {
                    let start = base.max(from);
                    let end = (base + chunks * CHUNK_BLOCKS).min(to);
                    if start < end {
                        sink(Run {
                            file_block: start,
                            blocks: end - start,
                            addr: addr + (start - base) * BLOCK,
                        });
                    }
                }
                Chunk::Table(_) if key < first => {}
                Chunk::Table(t) => {
                    let lo = from.saturating_sub(base) as usize;
                    let hi = (to - base).min(CHUNK_BLOCKS) as usize;
                    t.pieces(base, lo, hi, sink);
                }
            }
        }
    }

    /// Maps `[from, to)` to consecutive pages from `addr` (`None`: unmaps it), appending what
    /// was mapped there to `replaced`. Whole chunks become one run entry; the others are
    /// edited entry by entry in their tables.
    fn replace(&mut self, from: u64, to: u64, addr: Option<u64>, replaced: &mut Vec<Run>) {
        let mut b = from;
        while b < to {
            let c = b / CHUNK_BLOCKS;
            let base = c * CHUNK_BLOCKS;
            if b == base && to - b >= CHUNK_BLOCKS {
                let n = (to - b) / CHUNK_BLOCKS;
                self.remove_chunks(c, c + n, replaced);
                if let Some(a) = addr {
                    self.insert_run(c, n, a + (b - from) * BLOCK);
                }
                b += n * CHUNK_BLOCKS;
                continue;
            }
            let end = to.min(base.saturating_add(CHUNK_BLOCKS));
            if addr.is_some() || self.covers(c) {
                self.edit(c, |table| {
                    for i in b..end {
                        let page = addr.map(|a| a + (i - from) * BLOCK);
                        if let Some(old) = table.set((i - base) as usize, page) {
                            push_run(replaced, Run::block(i, old));
                        }
                    }
                });
            }
            b = end;
        }
    }

    /// True if some entry covers chunk `c`.
    fn covers(&self, c: u64) -> bool {
        self.chunks
            .at_or_before(c)
            .is_some_and(|(key, chunk)| c < key + chunk.chunks())
    }

    /// Makes chunk `c` start an entry: a run entry across it is cut in two.
    fn split_at(&mut self, c: u64) {
        let Some((key, &Chunk::Run { chunks, addr })) = self.chunks.before(c) else {
            return;
        };
        if c >= key + chunks {
            return;
        }
        let head = c - key;
        self.chunks.insert(key, Chunk::Run { chunks: head, addr });
        self.chunks.insert(
            c,
            Chunk::Run {
                chunks: chunks - head,
                addr: addr + head * CHUNK_BLOCKS * BLOCK,
            },
        );
        self.runs += 1;
    }

    /// Removes chunks `[c1, c2)`, appending what they mapped to `removed`.
    fn remove_chunks(&mut self, c1: u64, c2: u64, removed: &mut Vec<Run>) {
        self.split_at(c1);
        self.split_at(c2);
        while let Some((key, _)) = c2
            .checked_sub(1)
            .and_then(|last| self.chunks.range(c1, last).next())
        {
            let chunk = self.chunks.remove(key).expect("just found");
            self.blocks -= chunk.blocks();
            self.runs -= chunk.runs();
            let base = key * CHUNK_BLOCKS;
            match chunk {
                Chunk::Run { chunks, addr } => push_run(
                    removed,
                    Run {
                        file_block: base,
                        blocks: chunks * CHUNK_BLOCKS,
                        addr,
                    },
                ),
                Chunk::Table(t) => {
                    t.pieces(base, 0, CHUNK_BLOCKS as usize, &mut |r| {
                        push_run(removed, r);
                    });
                }
            }
        }
    }

    /// Adds a run entry of `chunks` whole chunks from `c` (nothing mapped there), merged with
    /// the runs it continues.
    fn insert_run(&mut self, c: u64, chunks: u64, addr: u64) {
        self.chunks.insert(c, Chunk::Run { chunks, addr });
        self.blocks += chunks * CHUNK_BLOCKS;
        self.runs += 1;
        self.merge_around(c);
    }

    /// Merges the run entry at `c` with a run entry it continues and one that continues it.
    fn merge_around(&mut self, mut c: u64) {
        let Some(&Chunk::Run {
            mut chunks,
            mut addr,
        }) = self.chunks.get(c)
        else {
            return;
        };
        if let Some((key, &Chunk::Run { chunks: n, addr: a })) = self.chunks.before(c)
            && key + n == c
            && a + n * CHUNK_BLOCKS * BLOCK == addr
        {
            self.chunks.remove(c);
            (c, chunks, addr) = (key, n + chunks, a);
            self.chunks.insert(c, Chunk::Run { chunks, addr });
            self.runs -= 1;
        }
        let next = c + chunks;
        if let Some(&Chunk::Run { chunks: n, addr: a }) = self.chunks.get(next)
            && addr + chunks * CHUNK_BLOCKS * BLOCK == a
        {
            self.chunks.remove(next);
            self.chunks.insert(
                c,
                Chunk::Run {
                    chunks: chunks + n,
                    addr,
                },
            );
            self.runs -= 1;
        }
    }

    /// Runs `f` on chunk `c` as a table (made one if it is part of a run or absent), then
    /// settles it: an empty table is dropped, one that became a single run is one again.
    fn edit(&mut self, c: u64, f: impl FnOnce(&mut Table)) {
        // The common case, a chunk small writes made a table already: one search.
        if let Some(Chunk::Table(t)) = self.chunks.get_mut(c) {
            let before = (t.mapped, t.runs());
            f(t);
            let after = (t.mapped, t.runs(), t.as_run());
            return self.settle(c, before, after);
        }
        self.split_at(c);
        self.split_at(c + 1);
        let mut table = match self.chunks.remove(c) {
            Some(Chunk::Run { addr, .. }) => Table::contiguous(addr),
            _ => Table::empty(),
        };
        // Counters unchanged so far: a whole-run table has the run's blocks and one start.
        let before = (table.mapped, table.starts);
        f(&mut table);
        let after = (table.mapped, table.starts, table.as_run());
        self.chunks.insert(c, Chunk::Table(table));
        self.settle(c, before, after);
    }

    /// Chunk `c`, a table, went from `before` (mapped, starts) to `after` (mapped, starts,
    /// the run it is if it is one): the counters follow, and it is dropped when empty or
    /// made a run entry when it is one run.
    fn settle(&mut self, c: u64, before: (u32, u32), after: (u32, u32, Option<u64>)) {
        let (mapped, starts, run) = after;
        self.blocks = self.blocks + u64::from(mapped) - u64::from(before.0);
        self.runs = self.runs + u64::from(starts) - u64::from(before.1);
        if mapped == 0 {
            self.chunks.remove(c);
        } else if let Some(addr) = run {
            self.chunks.insert(c, Chunk::Run { chunks: 1, addr });
            self.merge_around(c);
        }
    }
}

/// [`ExtentMap::from_sorted_runs`]'s entries, appended in chunk order.
#[derive(Default)]
struct Build {
    /// Inline for one: most files of a large file system are small, and a mount builds every
    /// file's map (a vector here was an allocation and a free per file).
    chunks: smallvec::SmallVec<[(u64, Chunk); 1]>,
    /// The chunk being filled block by block, appended once the runs move past it.
    table: Option<(u64, Box<Table>)>,
}

impl Build {
    /// The table of chunk `c` (the chunk before it, if one was being filled, is done).
    fn table(&mut self, c: u64) -> &mut Table {
        if self.table.as_ref().is_some_and(|&(t, _)| t != c) {
            self.end_table();
        }
        &mut self.table.get_or_insert_with(|| (c, Table::empty())).1
    }

    /// Appends the table being filled: as a run entry if it is one run, else counted.
    fn end_table(&mut self) {
        let Some((c, mut table)) = self.table.take() else {
            return;
        };
        table.count();
        match table.as_run() {
            Some(addr) => self.push_run(c, 1, addr),
            None => self.chunks.push((c, Chunk::Table(table))),
        }
    }

    /// `chunks` whole chunks from `c`, mapped to consecutive pages from `addr`.
    fn run(&mut self, c: u64, chunks: u64, addr: u64) {
        self.end_table();
        self.push_run(c, chunks, addr);
    }

    /// Appends a run entry, merged into the last entry when that run continues into it.
    fn push_run(&mut self, c: u64, chunks: u64, addr: u64) {
        if let Some((key, Chunk::Run { chunks: n, addr: a })) = self.chunks.last_mut()
            && *key + *n == c
            && *a + *n * CHUNK_BLOCKS * BLOCK == addr
        {
            *n += chunks;
            return;
        }
        self.chunks.push((c, Chunk::Run { chunks, addr }));
    }

    fn finish(mut self) -> ExtentMap {
        self.end_table();
        ExtentMap {
            blocks: self.chunks.iter().map(|(_, c)| c.blocks()).sum(),
            runs: self.chunks.iter().map(|(_, c)| c.runs()).sum(),
            chunks: self.chunks.into_iter().collect(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mapped(map: &mut ExtentMap, file_block: u64, blocks: u64, addr: u64) -> Vec<Run> {
        let mut replaced = Vec::new();
        map.map(file_block, blocks, addr, &mut replaced);
        replaced
    }

    /// Built in one pass from a map's runs, a map equals the one they give mapped one by one
    /// (and the map they came from), also cut in pieces: random histories of mappings and
    /// punched holes over a few blocks to several chunks, pages consecutive with the file's
    /// (whole-chunk runs; pieces that fill a chunk's table into one run) or scattered.
    #[test]
    fn a_map_built_from_sorted_runs_equals_one_mapped_run_by_run() {
        use rand::{Rng, SeedableRng};
        let mut rng = rand::rngs::StdRng::seed_from_u64(7);
        for round in 0..400 {
            let span = [40, 1200, 3 * CHUNK_BLOCKS + 7][round % 3];
            let mut map = ExtentMap::new();
            for _ in 0..rng.random_range(1..40) {
                let from = rng.random_range(0..span);
                let blocks = rng.random_range(1..=span - from);
                if rng.random_bool(0.2) {
                    map.punch(from, from + blocks);
                } else if rng.random_bool(0.6) {
                    mapped(&mut map, from, blocks, (1 << 30) + from * BLOCK);
                } else {
                    mapped(&mut map, from, blocks, rng.random_range(0..1 << 20) * BLOCK);
                }
            }
            let runs: Vec<Run> = map.runs().collect();
            let mut one_by_one = ExtentMap::new();
            for r in &runs {
                assert!(mapped(&mut one_by_one, r.file_block, r.blocks, r.addr).is_empty());
            }
            let built = ExtentMap::from_sorted_runs(&runs).expect("runs in order");
            assert_eq!(built, one_by_one, "round {round}: {runs:?}");
            assert_eq!(built, map, "round {round}");
            assert_eq!(built.runs().collect::<Vec<_>>(), runs);
            let mut each = Vec::new();
            map.each_run(|r| each.push(r));
            assert_eq!(each, runs, "round {round}");
            // The same runs cut in pieces (a chunk then fills run by run).
            let mut pieces = Vec::new();
            for r in &runs {
                let mut at = 0;
                while at < r.blocks {
                    let n = rng.random_range(1..=r.blocks - at);
                    pieces.push(Run {
                        file_block: r.file_block + at,
                        blocks: n,
                        addr: r.addr + at * BLOCK,
                    });
                    at += n;
                }
            }
            let built = ExtentMap::from_sorted_runs(&pieces).expect("pieces in order");
            assert_eq!(built, map, "round {round}: {pieces:?}");
        }
    }

    #[test]
    fn runs_out_of_order_or_overlapping_are_left_to_be_mapped_one_by_one() {
        let run = |file_block, blocks, addr| Run {
            file_block,
            blocks,
            addr,
        };
        assert!(ExtentMap::from_sorted_runs(&[run(10, 2, 0), run(0, 1, 1 << 20)]).is_none());
        assert!(ExtentMap::from_sorted_runs(&[run(0, 4, 0), run(3, 1, 1 << 20)]).is_none());
        assert!(ExtentMap::from_sorted_runs(&[run(0, 0, 0)]).is_none());
        assert!(ExtentMap::from_sorted_runs(&[run(0, 1, 5)]).is_none());
        assert_eq!(ExtentMap::from_sorted_runs(&[]), Some(ExtentMap::new()));
    }

    /// A map of one entry (a small file's table, or one run) holds it in place; a second
    /// entry moves them to an ordered map, and removing down to one moves it back.
    #[test]
    fn a_map_of_one_entry_needs_no_ordered_map() {
        let mut map = ExtentMap::new();
        mapped(&mut map, 0, 3, 1 << 20);
        assert!(matches!(
            map.chunks,
            Chunks::One(Some((0, Chunk::Table(_))))
        ));
        mapped(&mut map, 0, 3 * CHUNK_BLOCKS, 1 << 30);
        assert!(matches!(
            map.chunks,
            Chunks::One(Some((0, Chunk::Run { chunks: 3, .. })))
        ));
        mapped(&mut map, CHUNK_BLOCKS + 1, 1, 5 << 20);
        assert!(
            matches!(&map.chunks, Chunks::Many(m) if m.len() == 3),
            "{map:?}"
        );
        assert_eq!(map.get(CHUNK_BLOCKS + 1), Some(5 << 20));
        assert_eq!(map.truncate(CHUNK_BLOCKS).len(), 3);
        assert!(matches!(
            map.chunks,
            Chunks::One(Some((0, Chunk::Run { chunks: 1, .. })))
        ));
        assert_eq!(map.punch(0, CHUNK_BLOCKS).len(), 1);
        assert_eq!(map.chunks, Chunks::One(None));
        assert_eq!(map, ExtentMap::new());
    }

    #[test]
    fn mapping_over_runs_splits_them_and_returns_the_replaced_pages() {
        let mut map = ExtentMap::new();
        assert!(mapped(&mut map, 0, 10, 1 << 20).is_empty());
        let replaced = mapped(&mut map, 3, 2, 9 << 20);
        assert_eq!(
            replaced,
            vec![Run {
                file_block: 3,
                blocks: 2,
                addr: (1 << 20) + 3 * BLOCK
            }]
        );
        assert_eq!(map.get(2), Some((1 << 20) + 2 * BLOCK));
        assert_eq!(map.get(3), Some(9 << 20));
        assert_eq!(map.get(4), Some((9 << 20) + BLOCK));
        assert_eq!(map.get(5), Some((1 << 20) + 5 * BLOCK));
        assert_eq!(map.get(10), None);
        assert_eq!(map.mapped_blocks(), 10);
        assert_eq!(map.runs().count(), 3);
        assert_eq!(map.run_count(), 3);
    }

    /// Entries held by chunk 0's table (`None`: it is not a table).
    fn table_len(map: &ExtentMap) -> Option<usize> {
        match map.chunks.get(0) {
            Some(Chunk::Table(t)) => Some(t.entries.len()),
            _ => None,
        }
    }

    #[test]
    fn a_small_files_table_holds_its_blocks_not_the_chunks() {
        let mut map = ExtentMap::new();
        // A file of three scattered pages.
        for (b, page) in [(0, 7), (1, 3), (2, 9)] {
            mapped(&mut map, b, 1, page << 20);
        }
        assert_eq!(table_len(&map), Some(3));
        // A block further in grows it; punching that block out shrinks it back.
        mapped(&mut map, 100, 1, 5 << 20);
        assert_eq!(table_len(&map), Some(101));
        assert_eq!(map.get(50), None);
        assert_eq!(map.punch(100, 101).len(), 1);
        assert_eq!(table_len(&map), Some(3));
        assert_eq!(map.get(100), None);
        assert_eq!(map.lookup(0, CHUNK_BLOCKS).len(), 3);
        // A run cut by a punch becomes a table of what is left: a hole at the end holds
        // no entries.
        let mut map = ExtentMap::new();
        mapped(&mut map, 0, CHUNK_BLOCKS, 1 << 30);
        assert_eq!(table_len(&map), None);
        let punched: u64 = map.punch(10, CHUNK_BLOCKS).iter().map(|r| r.blocks).sum();
        assert_eq!(punched, CHUNK_BLOCKS - 10);
        assert_eq!(table_len(&map), Some(10));
        assert_eq!(map.run_count(), 1);
    }

    #[test]
    fn truncate_returns_everything_beyond() {
        let mut map = ExtentMap::new();
        mapped(&mut map, 0, 4, 0x10000);
        mapped(&mut map, 8, 4, 0x90000);
        let freed: u64 = map.truncate(2).iter().map(|r| r.blocks).sum();
        assert_eq!(freed, 6);
        assert_eq!(map.mapped_blocks(), 2);
        assert_eq!(map.get(1), Some(0x10000 + BLOCK));
        assert_eq!(map.get(2), None);
        assert_eq!(map.lookup(0, 100).len(), 1);
    }

    #[test]
    fn block_by_block_writes_of_consecutive_pages_become_one_run_entry() {
        let mut map = ExtentMap::new();
        let base = 1u64 << 30;
        // Three chunks' worth, written block by block in a scrambled order.
        let blocks = 3 * CHUNK_BLOCKS;
        for i in 0..blocks {
            let b = (i * 7) % blocks;
            assert!(mapped(&mut map, b, 1, base + b * BLOCK).is_empty());
        }
        assert_eq!(map.mapped_blocks(), blocks);
        assert_eq!(
            map.chunks.len(),
            1,
            "the tables became one run: {:?}",
            map.chunks
        );
        assert_eq!(map.run_count(), 1);
        assert_eq!(
            map.runs().collect::<Vec<_>>(),
            vec![Run {
                file_block: 0,
                blocks,
                addr: base
            }]
        );
        // One block elsewhere: its chunk is a table again, the rest stays runs.
        let replaced = mapped(&mut map, CHUNK_BLOCKS + 5, 1, 7 << 20);
        assert_eq!(replaced[0].addr, base + (CHUNK_BLOCKS + 5) * BLOCK);
        assert_eq!(map.chunks.len(), 3);
        assert_eq!(map.runs().count(), 3);
        assert_eq!(map.get(CHUNK_BLOCKS + 5), Some(7 << 20));
        assert_eq!(
            map.get(CHUNK_BLOCKS + 6),
            Some(base + (CHUNK_BLOCKS + 6) * BLOCK)
        );
    }

    #[test]
    fn a_huge_run_is_one_entry_and_splits_where_it_is_cut() {
        let mut map = ExtentMap::new();
        let blocks = 1u64 << 40;
        mapped(&mut map, 0, blocks, 1 << 20);
        assert_eq!(map.chunks.len(), 1);
        assert_eq!(map.mapped_blocks(), blocks);
        let freed = map.punch(1 << 30, (1 << 30) + 1);
        assert_eq!(freed.len(), 1);
        assert_eq!(
            map.get((1 << 30) + 1),
            Some((1 << 20) + ((1 << 30) + 1) * BLOCK)
        );
        assert_eq!(map.get(1 << 30), None);
        assert_eq!(map.mapped_blocks(), blocks - 1);
        let freed: u64 = map.truncate(5).iter().map(|r| r.blocks).sum();
        assert_eq!(freed, blocks - 6);
        assert_eq!(map.mapped_blocks(), 5);
    }

    proptest::proptest! {
        /// Mapping a list at once is mapping it one by one: the same map, entry for entry
        /// (tables, run entries and counters), and the same pages handed back in the same
        /// order — from maps of whatever shape over whatever the file held, small ones
        /// within a chunk most of all, overlapping or not.
        #[test]
        fn mapping_a_list_at_once_is_mapping_it_one_by_one(
            before in proptest::collection::vec((0u64..1600, 1u64..1100), 0..6),
            maps in proptest::collection::vec(
                (
                    proptest::prop_oneof![0u64..1600, 500u64..540, 1020u64..1030],
                    proptest::prop_oneof![3 => 1u64..4, 1 => 0u64..1100, 1 => proptest::strategy::Just(CHUNK_BLOCKS)],
                    0u8..3,
                ),
                0..40,
            ),
        ) {
            let (mut one_by_one, mut at_once) = (ExtentMap::new(), ExtentMap::new());
            let mut addr = 1u64 << 30;
            for (start, len) in before {
                mapped(&mut one_by_one, start, len, addr);
                mapped(&mut at_once, start, len, addr);
                addr += len * BLOCK;
            }
            // Some maps continue the pages of the one before: runs form and merge.
            let list: Vec<(u64, u64, u64)> = maps
                .into_iter()
                .map(|(block, blocks, kind)| {
                    let page = if kind == 0 { addr } else { addr + 7 * BLOCK };
                    addr = page + blocks * BLOCK;
                    (block, blocks, page)
                })
                .collect();
            let mut expect = Vec::new();
            for &(block, blocks, page) in &list {
                one_by_one.map(block, blocks, page, &mut expect);
            }
            let mut got = Vec::new();
            at_once.map_all(&list, &mut got);
            proptest::prop_assert_eq!(got, expect);
            proptest::prop_assert_eq!(at_once, one_by_one);
        }

        /// Random maps, punches and truncations across chunk edges agree with a per-block
        /// model; every page handed back is one the model held; runs are coalesced and cover
        /// exactly the mapped blocks.
        #[test]
        fn agrees_with_a_block_model(ops in proptest::collection::vec((0u64..1600, 1u64..1100, 0u8..8), 1..40)) {
            const SPAN: u64 = 3000;
            let mut map = ExtentMap::new();
            let mut model: Vec<Option<u64>> = vec![None; SPAN as usize];
            let mut next_addr = 1u64 << 30;
            let mut last_end = 0;
            for (start, len, kind) in ops {
                let mut expect_freed: Vec<u64> = Vec::new();
                let freed = match kind {
                    0 => {
                        for slot in model.iter_mut().skip(start as usize) {
                            expect_freed.extend(slot.take());
                        }
                        map.truncate(start)
                    }
                    1 => {
                        for slot in &mut model[start as usize..(start + len) as usize] {
                            expect_freed.extend(slot.take());
                        }
                        map.punch(start, start + len)
                    }
                    _ => {
                        // Some writes continue the previous one, in the file and in memory,
                        // as a sequential writer's do.
                        let start = if kind < 5 { start } else { last_end.min(1600) };
                        let addr = next_addr;
                        next_addr += len * BLOCK;
                        last_end = start + len;
                        for b in start..start + len {
                            expect_freed.extend(model[b as usize].replace(addr + (b - start) * BLOCK));
                        }
                        mapped(&mut map, start, len, addr)
                    }
                };
                let mut got: Vec<u64> = freed
                    .iter()
                    .flat_map(|r| (0..r.blocks).map(move |i| r.addr + i * BLOCK))
                    .collect();
                got.sort_unstable();
                expect_freed.sort_unstable();
                proptest::prop_assert_eq!(got, expect_freed);
                let now: Vec<Option<u64>> = (0..SPAN).map(|b| map.get(b)).collect();
                proptest::prop_assert_eq!(&now, &model);
                let held = model.iter().filter(|m| m.is_some()).count() as u64;
                proptest::prop_assert_eq!(map.mapped_blocks(), held);
                let runs: Vec<Run> = map.runs().collect();
                proptest::prop_assert!(runs.len() <= map.run_count());
                let mut covered = 0;
                for pair in runs.windows(2) {
                    let (a, b) = (pair[0], pair[1]);
                    proptest::prop_assert!(a.end() <= b.file_block);
                    proptest::prop_assert!(
                        a.end() != b.file_block || a.addr + a.blocks * BLOCK != b.addr,
                        "runs {:?} and {:?} were not coalesced", a, b
                    );
                }
                for run in &runs {
                    for i in 0..run.blocks {
                        proptest::prop_assert_eq!(model[(run.file_block + i) as usize], Some(run.addr + i * BLOCK));
                    }
                    covered += run.blocks;
                }
                proptest::prop_assert_eq!(covered, held);
                let (from, to) = (start.min(SPAN - 1), (start + len).min(SPAN));
                let pieces = map.lookup(from, to);
                let covered: u64 = pieces.iter().map(|r| r.blocks).sum();
                let expect = model[from as usize..to as usize].iter().filter(|m| m.is_some()).count() as u64;
                proptest::prop_assert_eq!(covered, expect);
            }
        }
    }
}
