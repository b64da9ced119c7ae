//! The DRAM index of logged, not yet checkpointed writes of one file: byte ranges mapped to
//! the persistent buffers that hold their newest data. Reads consult it before the extent
//! map; the checkpoint removes a record's pieces once they are part of the file.
//!
//! A newer write replaces the overlapping parts of older pieces, so every byte has at most
//! one piece and it is the newest. The index is split into shards by 2 MiB stretch of the
//! file (pieces are cut at those edges), so writers of different stretches never share a
//! lock.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};

use crate::extent_map::{BLOCK, CHUNK_BLOCKS, SharedTable};

use smallvec::SmallVec;

/// Bytes per shard stretch: one chunk of the block table.
const STRETCH: u64 = 2 << 20;
const _: () = assert!(STRETCH == CHUNK_BLOCKS * BLOCK);
/// Whole pieces [`Overlay::take_records`] finds before it removes them together.
const GROUP_TAKES: usize = 16;
/// Shards per file: a file's stretches up to 512 MiB each have their own. With 16, random
/// writes to a 256 MiB file while the checkpoint kept a thousand or two records pending left
/// a hundred pieces and more in each shard (some of them B-trees), and finding and shifting
/// them was a quarter of the checkpoint's samples; with 256 a fifth
/// (`bench fs --bs 4K --threads 2`).
const SHARDS: usize = 256;
/// Where each tier of shards past shard 0 ends: a tier is made by the first write to any of
/// its shards, so a file holds shards in proportion to its size (a file under 32 MiB at most
/// the first sixteen, as many as it held before there were more).
const TIER_ENDS: [usize; 3] = [16, 64, SHARDS];

/// Newest data for `[start, end)` of a file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Piece {
    /// First byte (file offset).
    pub start: u64,
    /// One past the last byte.
    pub end: u64,
    /// Global address of the byte at `start`.
    pub src: u64,
    /// Order of the log record that wrote it.
    pub order: u64,
}

impl Piece {
    fn clip(&self, from: u64, to: u64) -> Option<Piece> {
        let start = self.start.max(from);
        let end = self.end.min(to);
        (start < end).then(|| Piece {
            start,
            end,
            src: self.src + (start - self.start),
            order: self.order,
        })
    }
}

/// Above this many pieces a shard's sorted vector becomes a B-tree; below
/// [`SMALL_AGAIN`] the B-tree becomes a vector again.
const SMALL_MAX: usize = 128;
/// See [`SMALL_MAX`] (the gap keeps a shard near the limit from switching on every write).
const SMALL_AGAIN: usize = 32;

/// Pieces of one shard, never overlapping, in file order. While the checkpoint keeps up a
/// shard holds a dozen pieces or so, and a sorted vector serves them best: one binary
/// search and a short shift per write, where the B-tree took three descents (a search each
/// side of the write, then the insert) — measured alone, a random 4 KiB write's insert plus
/// its later removal took 121 ns in a B-tree and 41 ns in a vector. A backlog (checkpoints
/// on demand, many writers) can leave thousands of pieces in a shard, where the shifts
/// would cost more than the descents: the B-tree then.
#[derive(Debug)]
enum PieceMap {
    Small(Vec<Piece>),
    Large(BTreeMap<u64, Piece>),
}

impl Default for PieceMap {
    fn default() -> Self {
        Self::Small(Vec::new())
    }
}

impl PieceMap {
    fn is_empty(&self) -> bool {
        match self {
            Self::Small(v) => v.is_empty(),
            Self::Large(m) => m.is_empty(),
        }
    }

    /// Pieces a vector shard has room for (0 for a B-tree).
    #[cfg(test)]
    fn room(&self) -> usize {
        match self {
            Self::Small(v) => v.capacity(),
            Self::Large(_) => 0,
        }
    }

    /// The index range of the pieces overlapping `[from, to)` in a sorted vector: pieces do
    /// not overlap, so their ends are in order as their starts are.
    fn span(v: &[Piece], from: u64, to: u64) -> std::ops::Range<usize> {
        let hi = v.partition_point(|p| p.start < to);
        let lo = v[..hi].partition_point(|p| p.end <= from);
        lo..hi
    }

    fn overlapping(&self, from: u64, to: u64) -> SmallVec<[Piece; 2]> {
        match self {
            Self::Small(v) => v[Self::span(v, from, to)].iter().copied().collect(),
            Self::Large(m) => large_overlapping(m, from, to),
        }
    }

    /// Cuts `[from, to)` out of every piece, keeping the parts outside, and puts `piece`
    /// (which lies inside `[from, to)`), if any, in their place.
    fn replace(&mut self, from: u64, to: u64, piece: Option<Piece>) {
        match self {
            Self::Small(v) => {
                let span = Self::span(v, from, to);
                if span.is_empty() {
                    // Nothing overlaps (the common case): an insert or nothing.
                    if let Some(piece) = piece {
                        v.insert(span.start, piece);
                    }
                } else {
                    // Only the first and the last overlapping piece can reach outside.
                    let first = v[span.start];
                    let last = v[span.end - 1];
                    let kept_before = first.clip(first.start, from);
                    let kept_after = last.clip(to, last.end);
                    v.splice(span, [kept_before, piece, kept_after].into_iter().flatten());
                }
            }
            Self::Large(m) => {
                for old in large_overlapping(m, from, to) {
                    m.remove(&old.start);
                    for keep in [old.clip(old.start, from), old.clip(to, old.end)]
                        .into_iter()
                        .flatten()
                    {
                        m.insert(keep.start, keep);
                    }
                }
                if let Some(piece) = piece {
                    m.insert(piece.start, piece);
                }
            }
        }
        self.settle();
    }

    /// Every piece, in file order.
    fn each(&self, f: impl FnMut(&Piece)) {
        match self {
            Self::Small(v) => v.iter().for_each(f),
            Self::Large(m) => m.values().for_each(f),
        }
    }

    /// Cuts `[from, to)` out of every piece, keeping the parts outside.
    fn cut(&mut self, from: u64, to: u64) {
        self.replace(from, to, None);
    }

    fn insert(&mut self, piece: Piece) {
        self.replace(piece.start, piece.end, Some(piece));
    }

    /// In a B-tree shard, takes out the piece that is exactly `[start, end)` written by
    /// `order`, if there is one (a vector shard finds it with [`PieceMap::whole_at`]).
    fn take_whole_from_tree(&mut self, start: u64, end: u64, order: u64) -> Option<Piece> {
        let Self::Large(m) = self else {
            return None;
        };
        let taken = match m.entry(start) {
            std::collections::btree_map::Entry::Occupied(whole)
                if whole.get().end == end && whole.get().order == order =>
            {
                Some(whole.remove())
            }
            _ => None,
        };
        self.settle();
        taken
    }

    /// In a vector shard, the piece that is exactly `[start, end)` written by `order` and
    /// its index, if there is one (left in place: [`PieceMap::remove_all`]).
    fn whole_at(&self, start: u64, end: u64, order: u64) -> Option<(usize, Piece)> {
        let Self::Small(v) = self else {
            return None;
        };
        let at = v.binary_search_by_key(&start, |p| p.start).ok()?;
        (v[at].end == end && v[at].order == order).then_some((at, v[at]))
    }

    /// Removes the pieces at `gone` (distinct indices, from [`PieceMap::whole_at`], in any
    /// order) from a vector shard in one pass, and empties `gone`: one shift of the pieces
    /// after the first, where removing them one by one shifted the tail once per piece.
    fn remove_all(&mut self, gone: &mut SmallVec<[usize; GROUP_TAKES]>) {
        if gone.is_empty() {
            return;
        }
        if let Self::Small(v) = self {
            gone.sort_unstable();
            let mut kept = gone[0];
            let mut next = 0;
            for at in gone[0]..v.len() {
                if next < gone.len() && gone[next] == at {
                    next += 1;
                    continue;
                }
                v[kept] = v[at];
                kept += 1;
            }
            v.truncate(kept);
        }
        gone.clear();
        self.settle();
    }

    /// Switches form across the thresholds. An emptied vector keeps up to
    /// [`KEPT_PIECES`] of room (see there); [`PieceMap::release`] gives it back.
    fn settle(&mut self) {
        match self {
            Self::Small(v) if v.len() > SMALL_MAX => {
                *self = Self::Large(v.drain(..).map(|p| (p.start, p)).collect());
            }
            Self::Small(v) if v.is_empty() && v.capacity() > KEPT_PIECES => *v = Vec::new(),
            Self::Large(m) if m.len() < SMALL_AGAIN => {
                *self = Self::Small(std::mem::take(m).into_values().collect());
            }
            _ => {}
        }
    }

    /// An emptied vector gives its memory back.
    fn release(&mut self) {
        if let Self::Small(v) = self
            && v.is_empty()
            && v.capacity() > 0
        {
            *v = Vec::new();
        }
    }
}

/// Room for this many pieces stays with a shard past shard 0 when the checkpoint empties
/// it. Freed instead, the vector went back from the checkpoint's thread into the writer's
/// malloc arena (taking that arena's lock) and the writer's next write into the shard grew
/// a new one from nothing: with two writers of random 4 KiB blocks over a 256 MiB file
/// (a dozen pending pieces per shard between batches), the frees were 2.7 % of the
/// checkpoint's samples and the regrowth 3 % of each writer's. Shard 0 — every file's,
/// and a small file's only one — gives its memory back as before, so files written once
/// keep none; the others exist only in files over 2 MiB, and keep at most a KiB per 2 MiB
/// stretch written since the open.
const KEPT_PIECES: usize = 32;

/// The pieces of a B-tree shard overlapping `[from, to)`, in order.
fn large_overlapping(m: &BTreeMap<u64, Piece>, from: u64, to: u64) -> SmallVec<[Piece; 2]> {
    let mut out = SmallVec::new();
    if let Some((_, p)) = m.range(..from).next_back()
        && p.end > from
    {
        out.push(*p);
    }
    out.extend(m.range(from..to).map(|(_, p)| *p));
    out
}

/// A shard, locked. Shard 0, let go empty, gives its vector's memory back
/// ([`KEPT_PIECES`]): one rule wherever pieces leave a shard (the checkpoint, truncation,
/// holes punched).
struct Locked<'a> {
    map: MutexGuard<'a, Shard>,
    first: bool,
}

impl std::ops::Deref for Locked<'_> {
    type Target = PieceMap;

    fn deref(&self) -> &PieceMap {
        &self.map.pieces
    }
}

impl std::ops::DerefMut for Locked<'_> {
    fn deref_mut(&mut self) -> &mut PieceMap {
        &mut self.map.pieces
    }
}

impl Drop for Locked<'_> {
    fn drop(&mut self) {
        if self.first {
            self.map.pieces.release();
        }
    }
}

/// One shard: its pieces, and the block tables of its chunks (2 MiB stretches) that the
/// file's map shares with its writers ([`crate::extent_map::ExtentMap::share_chunk`]).
#[derive(Debug, Default)]
struct Shard {
    pieces: PieceMap,
    tables: SharedTables,
}

/// A shard's shared block tables by chunk, in chunk order. A file under 512 MiB has at most
/// one chunk per shard; a larger one has one per 512 MiB in each (chunks [`SHARDS`] apart
/// share a shard), and all of them stay here: with only the last one shared kept, writers
/// of a 2 GiB file found their chunk's table on a quarter of their single-block overwrites
/// and the checkpoint remapped the rest, four times its work per write (`bench fs --size
/// 2G`). A table the map let go of leaves when a writer misses it or a new one comes; until
/// then it keeps its 4 KiB of entries (at most one table per 2 MiB chunk of the file:
/// a 512th of the file's size, in DRAM).
#[derive(Debug, Default)]
struct SharedTables(SmallVec<[(u64, Arc<SharedTable>); 1]>);

impl SharedTables {
    /// Chunk `chunk`'s table, if it is shared and the map still holds it; one the map let
    /// go of is dropped here.
    fn get(&mut self, chunk: u64) -> Option<&SharedTable> {
        let at = self.0.binary_search_by_key(&chunk, |(c, _)| *c).ok()?;
        if !self.0[at].1.is_live() {
            self.0.remove(at);
            return None;
        }
        Some(&self.0[at].1)
    }

    /// Keeps `table` as chunk `chunk`'s, dropping tables the map let go of. (The checkpoint
    /// hands a chunk's table over again with every group that remaps a block there: the
    /// same table costs a look-up.)
    fn insert(&mut self, chunk: u64, table: Arc<SharedTable>) {
        match self.0.binary_search_by_key(&chunk, |(c, _)| *c) {
            Ok(at) if Arc::ptr_eq(&self.0[at].1, &table) => return,
            Ok(at) => self.0[at].1 = table,
            Err(at) => self.0.insert(at, (chunk, table)),
        }
        self.0.retain(|(_, t)| t.is_live());
    }
}

/// The overlay of one file. Its shards are made by the file's first logged write in them: a
/// directory, or a file never written since the file system was opened, holds none (they
/// were half a KiB of every inode's DRAM), and a file under 2 MiB — whose every byte is in
/// shard 0's first stretch — only that one (sixteen were 0.6 KiB of each small file
/// written since the open, a long-running mount's or a file-making program's). Past shard
/// 0 they come in tiers ([`TIER_ENDS`]), each made whole by the first write into it.
#[derive(Debug, Default)]
pub struct Overlay {
    /// Shard 0: stretches 0, 256, 512, …
    first: OnceLock<Box<Mutex<Shard>>>,
    /// Shards 1 to 15, 16 to 63 and 64 to 255.
    tiers: [OnceLock<Box<[Mutex<Shard>]>>; TIER_ENDS.len()],
}

/// The tier of shard `i` (past 0) and where the tier starts.
fn tier_of(i: usize) -> (usize, usize) {
    let tier = TIER_ENDS.partition_point(|&end| end <= i);
    (tier, if tier == 0 { 1 } else { TIER_ENDS[tier - 1] })
}

/// `[from, to)` cut at stretch edges, with the shard of each part.
fn stretches(from: u64, to: u64) -> impl Iterator<Item = (usize, u64, u64)> {
    let mut at = from;
    std::iter::from_fn(move || {
        (at < to).then(|| {
            let stretch = at / STRETCH;
            let end = ((stretch + 1) * STRETCH).min(to);
            let part = ((stretch % SHARDS as u64) as usize, at, end);
            at = end;
            part
        })
    })
}

impl Overlay {
    /// Shard `i`, if a write made it.
    fn shard(&self, i: usize) -> Option<&Mutex<Shard>> {
        if i == 0 {
            return self.first.get().map(|first| &**first);
        }
        let (tier, start) = tier_of(i);
        self.tiers[tier].get().map(|shards| &shards[i - start])
    }

    /// Shard `i`, made (with its tier) if no write made it yet.
    fn shard_made(&self, i: usize) -> &Mutex<Shard> {
        if i == 0 {
            return self.first.get_or_init(Box::default);
        }
        let (tier, start) = tier_of(i);
        &self.tiers[tier]
            .get_or_init(|| (start..TIER_ENDS[tier]).map(|_| Mutex::default()).collect())[i - start]
    }

    /// `shard` (one of this overlay's), locked.
    fn lock<'a>(&'a self, shard: &'a Mutex<Shard>) -> Locked<'a> {
        Locked {
            map: shard.lock().expect("overlay shard"),
            first: self
                .first
                .get()
                .is_some_and(|first| std::ptr::eq(&**first, shard)),
        }
    }

    /// Every shard made.
    fn shards(&self) -> impl Iterator<Item = &Mutex<Shard>> {
        let tiers = self
            .tiers
            .iter()
            .filter_map(OnceLock::get)
            .flat_map(|shards| shards.iter());
        self.first
            .get()
            .map(|first| &**first)
            .into_iter()
            .chain(tiers)
    }

    /// True when no write made any shard.
    fn unwritten(&self) -> bool {
        self.first.get().is_none() && self.tiers.iter().all(|t| t.get().is_none())
    }

    /// Records that `[offset, offset + len)` now reads from `src` (written by `order`).
    pub fn insert(&self, offset: u64, len: u64, src: u64, order: u64) {
        for (shard, start, end) in stretches(offset, offset + len) {
            self.lock(self.shard_made(shard)).insert(Piece {
                start,
                end,
                src: src + (start - offset),
                order,
            });
        }
    }

    /// Remaps the whole block at `offset` (block aligned) to `page` in the file's block
    /// table instead of logging a piece of it here: when the block's chunk shares its table
    /// with the writers and the block is mapped. Older pieces over the block are cut (the
    /// write replaces them). Returns the page the block had, which the caller's record then
    /// frees once it is checkpointed; `None` leaves everything as it was. For the holder of
    /// the block's exclusive range lock, after its record is durable.
    pub fn remap_block(&self, offset: u64, page: u64) -> Option<u64> {
        debug_assert!(offset.is_multiple_of(BLOCK));
        let stretch = offset / STRETCH;
        let shard = self.shard((stretch % SHARDS as u64) as usize)?;
        let mut locked = self.lock(shard);
        let table = locked.map.tables.get(stretch)?;
        let replaced = table.remap(((offset / BLOCK) % CHUNK_BLOCKS) as usize, page)?;
        if !locked.is_empty() {
            locked.replace(offset, offset + BLOCK, None);
        }
        Some(replaced)
    }

    /// Brings the lock of the shard of the block at `offset` into this CPU's cache, owned,
    /// ahead of a [`Overlay::remap_block`] there.
    pub fn prefetch(&self, offset: u64) {
        let stretch = offset / STRETCH;
        if let Some(shard) = self.shard((stretch % SHARDS as u64) as usize) {
            pmem::prefetch_for_write(shard);
        }
    }

    /// Hands the writers of chunk `chunk` its shared table ([`Overlay::remap_block`]).
    pub fn share_table(&self, chunk: u64, table: Arc<SharedTable>) {
        let shard = self.shard_made((chunk % SHARDS as u64) as usize);
        self.lock(shard).map.tables.insert(chunk, table);
    }

    /// The pieces inside `[from, to)`, clipped, in file order.
    pub fn lookup(&self, from: u64, to: u64) -> Vec<Piece> {
        let mut out = Vec::new();
        if self.unwritten() {
            return out;
        }
        for (shard, start, end) in stretches(from, to) {
            let Some(shard) = self.shard(shard) else {
                continue;
            };
            out.extend(
                self.lock(shard)
                    .overlapping(start, end)
                    .into_iter()
                    .filter_map(|p| p.clip(start, end)),
            );
        }
        out
    }

    /// Takes out the pieces of `[offset, offset + len)` still written by `order` (the parts
    /// no newer write replaced) and returns them: what the checkpoint must move into the file.
    #[cfg(test)]
    pub fn take_record(&self, offset: u64, len: u64, order: u64) -> SmallVec<[Piece; 1]> {
        let mut out = Vec::with_capacity(1);
        self.take_records([(offset, len, order)], &mut out);
        out.pop().unwrap_or_default()
    }

    /// For each `(offset, len, order)` of `records` in turn, takes out the pieces of that
    /// range still written by `order` (the parts no newer write replaced: what the
    /// checkpoint must move into the file) and pushes them to `out`. Records of one stretch
    /// (the checkpoint's groups of neighbouring records) take its shard's lock once between
    /// them, never two shards' locks at a time.
    pub fn take_records(
        &self,
        records: impl IntoIterator<Item = (u64, u64, u64)>,
        out: &mut Vec<SmallVec<[Piece; 1]>>,
    ) {
        let mut held: Option<(usize, Locked<'_>)> = None;
        // Whole pieces found in the held vector shard, removed together when it is let go,
        // is searched some other way, or holds GROUP_TAKES of them.
        let mut gone: SmallVec<[usize; GROUP_TAKES]> = SmallVec::new();
        for (offset, len, order) in records {
            // Mostly one piece: inline, no allocation per record.
            let mut taken = SmallVec::new();
            for (index, start, end) in stretches(offset, offset + len) {
                let map = match &mut held {
                    Some((i, map)) if *i == index => map,
                    _ => {
                        if let Some((_, map)) = &mut held {
                            map.remove_all(&mut gone);
                        }
                        held = None;
                        let Some(shard) = self.shard(index) else {
                            continue;
                        };
                        &mut held.insert((index, self.lock(shard))).1
                    }
                };
                // Mostly the record's piece is still whole: one search finds it.
                if gone.len() == GROUP_TAKES {
                    map.remove_all(&mut gone);
                }
                if let Some((at, whole)) = map.whole_at(start, end, order) {
                    taken.push(whole);
                    gone.push(at);
                    continue;
                }
                map.remove_all(&mut gone);
                if let Some(whole) = map.take_whole_from_tree(start, end, order) {
                    taken.push(whole);
                } else {
                    for piece in map.overlapping(start, end) {
                        if piece.order != order {
                            continue;
                        }
                        let Some(part) = piece.clip(start, end) else {
                            continue;
                        };
                        map.cut(part.start, part.end);
                        taken.push(part);
                    }
                }
            }
            out.push(taken);
        }
        if let Some((_, map)) = &mut held {
            map.remove_all(&mut gone);
        }
    }

    /// Drops every piece at or beyond `size` (truncation).
    pub fn truncate(&self, size: u64) {
        for shard in self.shards() {
            self.lock(shard).cut(size, u64::MAX);
        }
    }

    /// Drops every piece inside `[from, to)` (a hole punched), keeping the parts outside.
    pub fn punch(&self, from: u64, to: u64) {
        if self.unwritten() {
            return;
        }
        if to - from >= STRETCH * SHARDS as u64 {
            // Every shard is touched: cut each once over the whole range (pieces never
            // cross a stretch edge, so each shard holds only its own stretches).
            for shard in self.shards() {
                self.lock(shard).cut(from, to);
            }
            return;
        }
        for (shard, start, end) in stretches(from, to) {
            if let Some(shard) = self.shard(shard) {
                self.lock(shard).cut(start, end);
            }
        }
    }

    /// Blocks of `block` bytes that pending pieces touch and `mapped` does not count: what
    /// the file will hold once they are checkpointed, beyond the blocks it holds now.
    /// `mapped(from, to)` counts the blocks of `[from, to)` the file already has.
    pub fn unmapped_blocks(&self, block: u64, mut mapped: impl FnMut(u64, u64) -> u64) -> u64 {
        let mut total = 0;
        // Pieces never cross a stretch edge, a whole number of blocks: the blocks one
        // shard's pieces touch are no other shard's, and within a shard, in file order,
        // only neighbours can share one.
        for shard in self.shards() {
            let mut counted_to = 0;
            self.lock(shard).each(|piece| {
                let from = (piece.start / block).max(counted_to);
                let to = piece.end.div_ceil(block);
                if from < to {
                    total += (to - from) - mapped(from, to);
                    counted_to = to;
                }
            });
        }
        total
    }

    /// True when no piece is pending.
    #[cfg(test)]
    pub fn is_empty(&self) -> bool {
        self.shards().all(|s| self.lock(s).is_empty())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Blocks shared by neighbouring pieces count once, blocks in different stretches each,
    /// and blocks the file already has not at all.
    #[test]
    fn pending_blocks_are_counted_once_and_only_outside_the_file() {
        let overlay = Overlay::default();
        assert_eq!(overlay.unmapped_blocks(4096, |_, _| 0), 0);
        // Block 0 twice (two partial writes), blocks 2..4, and block 512 (the next stretch).
        overlay.insert(10, 100, 1 << 20, 1);
        overlay.insert(3000, 100, 2 << 20, 2);
        overlay.insert(2 * 4096, 2 * 4096, 3 << 20, 3);
        overlay.insert(STRETCH + 5, 10, 4 << 20, 4);
        assert_eq!(overlay.unmapped_blocks(4096, |_, _| 0), 4);
        // The file has blocks 0..3: blocks 0 and 2 are not counted again.
        let have = |from: u64, to: u64| (from..to).filter(|b| *b < 3).count() as u64;
        assert_eq!(overlay.unmapped_blocks(4096, have), 2);
        // A piece across a block edge touches both blocks.
        let overlay = Overlay::default();
        overlay.insert(4000, 200, 1 << 20, 1);
        assert_eq!(overlay.unmapped_blocks(4096, |_, _| 0), 2);
    }

    /// Chunks that share a shard (SHARDS apart, a file past 512 MiB) keep their shared
    /// tables side by side: a writer finds its chunk's whichever was shared last, and a
    /// table the map let go of is no longer written through.
    #[test]
    fn chunks_sharing_a_shard_keep_each_its_shared_table() {
        use crate::extent_map::ExtentMap;
        let mut map = ExtentMap::default();
        let overlay = Overlay::default();
        let chunks = [3, 3 + SHARDS as u64, 3 + 2 * SHARDS as u64];
        let mut replaced = Vec::new();
        for (n, &chunk) in chunks.iter().enumerate() {
            // Two scattered blocks make the chunk a table.
            let first = chunk * CHUNK_BLOCKS;
            map.map(first, 1, (100 + 10 * n as u64) * BLOCK, &mut replaced);
            map.map(first + 7, 1, (101 + 10 * n as u64) * BLOCK, &mut replaced);
            let table = map.share_chunk(chunk).expect("a table");
            overlay.share_table(chunk, table.clone());
            // Handed over again (the checkpoint does so with every group): no change.
            overlay.share_table(chunk, table);
        }
        for (n, &chunk) in chunks.iter().enumerate() {
            let offset = chunk * STRETCH;
            let page = (5000 + n as u64) * BLOCK;
            assert_eq!(
                overlay.remap_block(offset, page),
                Some((100 + 10 * n as u64) * BLOCK),
                "chunk {chunk}"
            );
            assert_eq!(map.get(chunk * CHUNK_BLOCKS), Some(page));
            // A hole stays a hole.
            assert_eq!(overlay.remap_block(offset + 3 * BLOCK, page), None);
        }
        // The map lets the middle chunk's table go (remapped whole): writers no longer
        // reach it, and the others still work.
        map.map(
            chunks[1] * CHUNK_BLOCKS,
            CHUNK_BLOCKS,
            1 << 30,
            &mut replaced,
        );
        assert_eq!(overlay.remap_block(chunks[1] * STRETCH, 6000 * BLOCK), None);
        // The miss dropped it from the shard.
        let shard = overlay.shard(3).expect("made");
        assert_eq!(
            overlay
                .lock(shard)
                .map
                .tables
                .0
                .iter()
                .map(|(c, _)| *c)
                .collect::<Vec<_>>(),
            [chunks[0], chunks[2]]
        );
        assert_eq!(
            overlay.remap_block(chunks[2] * STRETCH + 7 * BLOCK, 6001 * BLOCK),
            Some(121 * BLOCK)
        );
        assert_eq!(map.get(chunks[2] * CHUNK_BLOCKS + 7), Some(6001 * BLOCK));
    }

    /// The checkpoint emptying a shard past shard 0 leaves its room for the next writes, up
    /// to KEPT_PIECES; shard 0 and a shard grown past that give their memory back.
    #[test]
    fn emptied_shards_past_the_first_keep_a_little_room() {
        let overlay = Overlay::default();
        let room = |i: usize| overlay.lock(overlay.shard(i).unwrap()).room();
        let pieces = |shard: u64, n: u64| {
            (0..n).map(move |k| (shard * STRETCH + k * 8192, 4096, shard * 1000 + k + 1))
        };
        let written = [(0, 8), (1, 8), (2, KEPT_PIECES as u64 + 1)];
        for &(shard, n) in &written {
            for (at, len, order) in pieces(shard, n) {
                overlay.insert(at, len, 1 << 30, order);
            }
        }
        assert!(room(0) >= 8 && room(1) >= 8 && room(2) > KEPT_PIECES);
        let mut out = Vec::new();
        overlay.take_records(written.iter().flat_map(|&(s, n)| pieces(s, n)), &mut out);
        assert!(out.iter().all(|taken| taken.len() == 1), "{out:?}");
        assert!(overlay.is_empty());
        assert_eq!(room(0), 0, "shard 0 kept its vector");
        assert!(room(1) >= 8, "shard 1 gave its vector back");
        assert_eq!(room(2), 0, "a shard grown past KEPT_PIECES kept it");
        // Cuts empty shard 0 the same way.
        overlay.insert(0, 4096, 1 << 30, 9999);
        assert!(room(0) > 0);
        overlay.truncate(0);
        assert_eq!(room(0), 0, "a truncation left shard 0 its vector");
    }

    #[test]
    fn newer_writes_shadow_older_ones_and_checkpoint_takes_only_what_is_left() {
        let overlay = Overlay::default();
        overlay.insert(0, 8192, 1 << 20, 1);
        overlay.insert(1000, 100, 9 << 20, 2);
        let pieces = overlay.lookup(0, 8192);
        assert_eq!(pieces.len(), 3);
        assert_eq!(pieces[1].src, 9 << 20);
        assert_eq!(pieces[2].src, (1 << 20) + 1100);
        let taken = overlay.take_record(0, 8192, 1);
        assert_eq!(taken.len(), 2, "{taken:?}");
        assert_eq!(overlay.lookup(0, 8192).len(), 1);
        assert_eq!(overlay.take_record(1000, 100, 2).len(), 1);
        assert!(overlay.is_empty());
    }

    #[test]
    fn an_overlay_holds_no_shards_until_a_write() {
        let overlay = Overlay::default();
        assert!(overlay.lookup(0, 1 << 30).is_empty());
        assert!(overlay.take_record(0, 4096, 1).is_empty());
        overlay.truncate(0);
        overlay.punch(0, 1 << 40);
        assert!(overlay.unwritten(), "reads and cuts made shards");
        // A file under 2 MiB is all in shard 0: the others are not made.
        overlay.insert(4096, 10, 1 << 20, 1);
        overlay.insert(STRETCH - 10, 10, 2 << 20, 2);
        assert_eq!(overlay.shards().count(), 1);
        assert_eq!(overlay.lookup(0, 1 << 30).len(), 2);
        // Past it, a tier is made whole by its first write; SHARDS stretches on is shard 0
        // again.
        overlay.insert(STRETCH * SHARDS as u64, 10, 3 << 20, 3);
        assert_eq!(overlay.shards().count(), 1);
        overlay.insert(STRETCH - 10, 20, 4 << 20, 4);
        assert_eq!(overlay.shards().count(), 16);
        overlay.insert(STRETCH * 70, 10, 5 << 20, 5);
        assert_eq!(
            overlay.shards().count(),
            16 + (SHARDS - 64),
            "the third tier alone"
        );
        overlay.insert(STRETCH * 63, 10, 6 << 20, 6);
        assert_eq!(overlay.shards().count(), SHARDS);
        assert_eq!(overlay.lookup(0, 1 << 40).len(), 6);
        for (at, order) in [(STRETCH * 70, 5), (STRETCH * 63, 6)] {
            assert_eq!(overlay.take_record(at, 10, order).len(), 1);
        }
        assert_eq!(overlay.lookup(0, 1 << 40).len(), 4);
        // Only the shards a write made: a piece in shard 0 alone is found and taken.
        let overlay = Overlay::default();
        overlay.insert(100, 10, 1 << 20, 1);
        assert_eq!(overlay.take_record(0, 3 * STRETCH, 1).len(), 1);
        assert!(overlay.is_empty());
    }

    #[test]
    fn pieces_are_cut_at_stretch_edges_and_found_across_them() {
        let overlay = Overlay::default();
        let start = STRETCH - 4096;
        overlay.insert(start, 3 * STRETCH, 7 << 30, 5);
        let pieces = overlay.lookup(0, 5 * STRETCH);
        assert_eq!(pieces.len(), 4);
        assert_eq!(
            pieces.iter().map(|p| p.end - p.start).sum::<u64>(),
            3 * STRETCH
        );
        for p in &pieces {
            assert_eq!(p.src - (7 << 30), p.start - start);
        }
        overlay.truncate(STRETCH);
        assert_eq!(overlay.lookup(0, 8 * STRETCH).len(), 1);
    }

    #[test]
    fn a_punch_keeps_what_lies_outside_it_short_or_spanning_every_shard() {
        for (from, to) in [(5000, 9000), (100, 100 + 20 * STRETCH)] {
            let overlay = Overlay::default();
            // Pieces in 40 stretches, each straddling a stretch edge.
            for i in 0..40 {
                overlay.insert(i * STRETCH + STRETCH - 3000, 6000, (i + 1) << 32, i + 1);
            }
            overlay.insert(4000, 6000, 99 << 32, 99);
            let before = overlay.lookup(0, 50 * STRETCH);
            overlay.punch(from, to);
            let after = overlay.lookup(0, 50 * STRETCH);
            let bytes = |pieces: &[Piece], inside: bool| -> u64 {
                pieces
                    .iter()
                    .map(|p| {
                        let (s, e) = (p.start.max(from), p.end.min(to));
                        let within = e.saturating_sub(s);
                        if inside {
                            within
                        } else {
                            p.end - p.start - within
                        }
                    })
                    .sum()
            };
            assert_eq!(
                bytes(&after, true),
                0,
                "punch [{from}, {to}) left bytes inside"
            );
            assert_eq!(
                bytes(&after, false),
                bytes(&before, false),
                "[{from}, {to})"
            );
        }
    }

    /// Byte-level model: after random writes, lookups give every byte's newest writer, and
    /// taking each record returns exactly the bytes it still owns.
    fn check_against_a_byte_model(
        writes: &[(u64, u64)],
        bytes: usize,
    ) -> Result<(), proptest::test_runner::TestCaseError> {
        let overlay = Overlay::default();
        let mut model = vec![0u64; bytes];
        for (i, (offset, len)) in writes.iter().enumerate() {
            let order = i as u64 + 1;
            overlay.insert(*offset, *len, order << 32, order);
            for b in *offset..offset + len {
                model[b as usize] = order;
            }
        }
        let mut seen = vec![0u64; bytes];
        for p in overlay.lookup(0, bytes as u64) {
            for b in p.start..p.end {
                proptest::prop_assert_eq!(seen[b as usize], 0);
                seen[b as usize] = p.order;
            }
        }
        proptest::prop_assert_eq!(&seen, &model);
        for (i, (offset, len)) in writes.iter().enumerate() {
            let order = i as u64 + 1;
            for p in overlay.take_record(*offset, *len, order) {
                proptest::prop_assert_eq!(p.src - (order << 32), p.start - offset);
                for b in p.start..p.end {
                    proptest::prop_assert_eq!(model[b as usize], order);
                    model[b as usize] = 0;
                }
            }
        }
        proptest::prop_assert!(model.iter().all(|&o| o == 0));
        proptest::prop_assert!(overlay.is_empty());
        Ok(())
    }

    proptest::proptest! {
        /// Records taken in groups (the checkpoint's), across stretch edges and shards,
        /// return exactly the bytes each still owns, as taken one at a time.
        #[test]
        fn records_taken_in_groups_return_what_each_owns(
            writes in proptest::collection::vec((0usize..5, 0u64..18_000, 1u64..9000), 1..40),
            group in 1usize..9,
        ) {
            let overlay = Overlay::default();
            let mut model = std::collections::HashMap::new();
            let records: Vec<(u64, u64, u64)> = writes
                .iter()
                .enumerate()
                .map(|(i, &(edge, delta, len))| {
                    // Around a stretch edge: the file's start, where the second and the
                    // third tier of shards begin, and past the last shard (stretches 257
                    // and 320 share shards 1 and 64 with stretches 1 and 64).
                    let edge = [0, 16, 64, 257, 320][edge];
                    let offset = (edge * STRETCH).saturating_sub(9000) + delta;
                    (offset, len, i as u64 + 1)
                })
                .collect();
            for &(offset, len, order) in &records {
                overlay.insert(offset, len, order << 32, order);
                for b in offset..offset + len {
                    model.insert(b, order);
                }
            }
            let mut taken = Vec::new();
            for chunk in records.chunks(group) {
                taken.clear();
                overlay.take_records(chunk.iter().copied(), &mut taken);
                proptest::prop_assert_eq!(taken.len(), chunk.len());
                for (&(offset, _, order), pieces) in chunk.iter().zip(&taken) {
                    for p in pieces {
                        proptest::prop_assert_eq!(p.src - (order << 32), p.start - offset);
                        for b in p.start..p.end {
                            proptest::prop_assert_eq!(model.remove(&b), Some(order));
                        }
                    }
                }
            }
            proptest::prop_assert!(model.is_empty(), "{} bytes not taken", model.len());
            proptest::prop_assert!(overlay.is_empty());
        }

        #[test]
        fn agrees_with_a_byte_model(writes in proptest::collection::vec((0u64..40_000, 1u64..9000), 1..30)) {
            check_against_a_byte_model(&writes, 50_000)?;
        }

        /// Enough short writes in one stretch that its shard becomes a B-tree, and turns back
        /// into a vector as the records are taken.
        #[test]
        fn agrees_with_a_byte_model_past_the_vector_limit(
            writes in proptest::collection::vec((0u64..300_000, 1u64..2000), SMALL_MAX..3 * SMALL_MAX)
        ) {
            check_against_a_byte_model(&writes, 310_000)?;
        }
    }

    #[test]
    fn a_shard_switches_to_a_tree_past_the_limit_and_back_below_the_lower_one() {
        let overlay = Overlay::default();
        let count = SMALL_MAX as u64 + 10;
        for i in 0..count {
            overlay.insert(i * 8192, 4096, (i + 1) << 32, i + 1);
        }
        let form = |o: &Overlay| match &*o.lock(o.shard(0).expect("written")) {
            PieceMap::Small(v) => ("vector", v.len()),
            PieceMap::Large(m) => ("tree", m.len()),
        };
        assert_eq!(form(&overlay), ("tree", count as usize));
        for i in 0..count - SMALL_AGAIN as u64 {
            assert_eq!(overlay.take_record(i * 8192, 4096, i + 1).len(), 1);
        }
        assert_eq!(form(&overlay), ("tree", SMALL_AGAIN));
        let i = count - SMALL_AGAIN as u64;
        assert_eq!(overlay.take_record(i * 8192, 4096, i + 1).len(), 1);
        assert_eq!(form(&overlay), ("vector", SMALL_AGAIN - 1));
        assert_eq!(overlay.lookup(0, count * 8192).len(), SMALL_AGAIN - 1);
    }
}
