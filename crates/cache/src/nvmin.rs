//! NV-MIN, the NBM paper's offline policy: it knows every block's next read and next write.
//! The paper calls it the optimum; it is not one (below).
//!
//! - Read miss: cache the block in DRAM if there is room, else in place of a DRAM block whose
//!   next access is a write (it will move to NVRAM before it is read, so dropping it costs
//!   nothing), else in place of the DRAM block read furthest in the future — unless the new
//!   block itself is read furthest, in which case it is served without caching (Belady).
//! - Write miss: the block goes to NVRAM; when NVRAM is full, the block written furthest in
//!   the future is written back (ties: the one read furthest in the future). If that block
//!   will be read again before it is written, it moves to DRAM by the same rules as a read
//!   miss.
//! - With no DRAM at all, nothing can absorb a written-back block's reads, and every access
//!   to a block outside NVRAM costs one storage access (a read from storage, or a later
//!   write-back to make room); NVRAM then evicts the block whose next access of either kind
//!   is furthest (Belady). The paper's write-only rule loses to NBM there (found by the
//!   property test: `W3 W2 W6 W0 W5 W1 W4 R5 R6`, NVRAM 3, no DRAM).
//!
//! Not an optimum. With no DRAM, reads cannot bring a block in, so a block's worth is the
//! reads it serves before its next write. With DRAM too: NVRAM evicts the dirty block whose
//! next *write* is furthest, ignoring that dirty blocks also serve reads, and a read miss
//! caches a block whose next access is a write, displacing a useful one —
//! `W a, W b, W c, R d, R b, R d, R d, R b, W a` with one DRAM block and two NVRAM blocks costs
//! NV-MIN 4 storage accesses and NBM or NVLRU 3 (`hand_computed_traces.rs`). It is a
//! clairvoyant baseline, reported as the paper defines it.
//!
//! The next-access times come from [`futures`], one backward pass over the accesses.

use std::collections::BinaryHeap;

use crate::block_table::BlockTable;
use crate::policy::{Access, Action, BlockId, Capacity, Op, Policy, Sink, Tier};

/// "Never again."
pub const NEVER: u32 = u32::MAX;

/// For one access: the positions of the same block's next read and next write after it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Future {
    /// Position of the next read, or `NEVER`.
    pub next_read: u32,
    /// Position of the next write, or `NEVER`.
    pub next_write: u32,
}

/// Next-read and next-write positions for every access, in one backward pass. Positions are
/// u32, so a trace may hold at most `u32::MAX - 1` block accesses; `None` beyond that.
pub fn futures(accesses: &[Access]) -> Option<Vec<Future>> {
    if accesses.len() >= NEVER as usize {
        return None;
    }
    let blocks = accesses
        .iter()
        .map(|a| a.block as usize + 1)
        .max()
        .unwrap_or(0);
    let mut next_read = vec![NEVER; blocks];
    let mut next_write = vec![NEVER; blocks];
    let mut out = vec![
        Future {
            next_read: NEVER,
            next_write: NEVER
        };
        accesses.len()
    ];
    for (position, access) in accesses.iter().enumerate().rev() {
        let block = access.block as usize;
        out[position] = Future {
            next_read: next_read[block],
            next_write: next_write[block],
        };
        match access.op {
            Op::Read => next_read[block] = position as u32,
            Op::Write => next_write[block] = position as u32,
        }
    }
    Some(out)
}

#[derive(Debug, Clone, Copy)]
struct Block {
    tier: Option<Tier>,
    next_read: u32,
    next_write: u32,
}

impl Default for Block {
    fn default() -> Self {
        Self {
            tier: None,
            next_read: NEVER,
            next_write: NEVER,
        }
    }
}

impl Block {
    /// Its next access is a write: caching it clean is useless. (True only with NVRAM: with
    /// none, a write goes through to storage and the clean copy stays valid.)
    fn written_before_read(&self) -> bool {
        self.next_write < self.next_read
    }

    /// NVRAM eviction key, largest evicted first: next write then next read, or with no DRAM
    /// the next access of either kind then the next write.
    fn nvram_key(&self, has_dram: bool) -> u64 {
        let (first, second) = if has_dram {
            (self.next_write, self.next_read)
        } else {
            (self.next_read.min(self.next_write), self.next_write)
        };
        u64::from(first) << 32 | u64::from(second)
    }
}

/// The NV-MIN policy over one known access sequence.
#[derive(Debug)]
pub struct NvMin<'a> {
    capacity: Capacity,
    futures: &'a [Future],
    position: usize,
    blocks: BlockTable<Block>,
    /// DRAM blocks by next read, furthest first (stale entries skipped).
    dram_by_read: BinaryHeap<(u32, BlockId)>,
    /// DRAM blocks whose next access is a write (stale entries skipped).
    dram_write_first: Vec<BlockId>,
    /// NVRAM blocks by eviction key, furthest first (stale entries skipped).
    nvram_by_write: BinaryHeap<(u64, BlockId)>,
    dram_count: usize,
    nvram_count: usize,
    compact_at: usize,
}

impl<'a> NvMin<'a> {
    /// An empty cache of `capacity` that will see exactly the accesses `futures` was computed
    /// from, in order.
    pub fn new(capacity: Capacity, futures: &'a [Future]) -> Self {
        Self {
            capacity,
            futures,
            position: 0,
            blocks: BlockTable::default(),
            dram_by_read: BinaryHeap::new(),
            dram_write_first: Vec::new(),
            nvram_by_write: BinaryHeap::new(),
            dram_count: 0,
            nvram_count: 0,
            compact_at: 4096,
        }
    }

    #[inline]
    fn block(&mut self, id: BlockId) -> &mut Block {
        self.blocks.get_mut(id)
    }

    /// Records `id` as being in DRAM with its current next accesses.
    fn index_dram(&mut self, id: BlockId) {
        let block = self.blocks[id as usize];
        self.dram_by_read.push((block.next_read, id));
        if self.capacity.nvram_blocks > 0 && block.written_before_read() {
            self.dram_write_first.push(id);
        }
    }

    fn pop_write_first(&mut self) -> Option<BlockId> {
        while let Some(id) = self.dram_write_first.pop() {
            let block = &self.blocks[id as usize];
            if block.tier == Some(Tier::Dram) && block.written_before_read() {
                return Some(id);
            }
        }
        None
    }

    /// The DRAM block read furthest in the future, left in place.
    fn furthest_read(&mut self) -> Option<(u32, BlockId)> {
        while let Some(&(key, id)) = self.dram_by_read.peek() {
            let block = &self.blocks[id as usize];
            if block.tier == Some(Tier::Dram) && block.next_read == key {
                return Some((key, id));
            }
            self.dram_by_read.pop();
        }
        None
    }

    fn drop_clean<S: Sink>(&mut self, id: BlockId, sink: &mut S) {
        sink.action(Action::EvictClean { block: id });
        self.block(id).tier = None;
        self.dram_count -= 1;
    }

    /// Finds DRAM room for a block whose next read is `next_read`; false if the block should
    /// not be cached (every DRAM block is read sooner).
    fn make_dram_room<S: Sink>(&mut self, next_read: u32, sink: &mut S) -> bool {
        if self.dram_count < self.capacity.dram_blocks {
            return true;
        }
        if let Some(id) = self.pop_write_first() {
            self.drop_clean(id, sink);
            return true;
        }
        match self.furthest_read() {
            Some((key, id)) if next_read < key => {
                self.dram_by_read.pop();
                self.drop_clean(id, sink);
                true
            }
            _ => false,
        }
    }

    fn read<S: Sink>(&mut self, id: BlockId, sink: &mut S) {
        let block = self.blocks[id as usize];
        if let Some(tier) = block.tier {
            sink.action(Action::ReadHit { block: id, tier });
            return;
        }
        if self.capacity.dram_blocks == 0 || !self.make_dram_room(block.next_read, sink) {
            sink.action(Action::Bypass { block: id });
            return;
        }
        sink.action(Action::Load { block: id });
        self.block(id).tier = Some(Tier::Dram);
        self.dram_count += 1;
        self.index_dram(id);
    }

    fn write<S: Sink>(&mut self, id: BlockId, sink: &mut S) {
        let tier = self.blocks[id as usize].tier;
        if tier == Some(Tier::Nvram) {
            sink.action(Action::WriteHit { block: id });
            return;
        }
        if self.capacity.nvram_blocks == 0 {
            sink.action(Action::WriteThrough { block: id });
            return;
        }
        if tier == Some(Tier::Dram) {
            // The clean copy is obsolete: drop it first, freeing its DRAM slot.
            self.drop_clean(id, sink);
        }
        if self.nvram_count == self.capacity.nvram_blocks {
            let has_dram = self.capacity.dram_blocks > 0;
            let victim = loop {
                let (key, candidate) = self.nvram_by_write.pop().expect("a full NVRAM has a block");
                let block = &self.blocks[candidate as usize];
                if block.tier == Some(Tier::Nvram) && block.nvram_key(has_dram) == key {
                    break candidate;
                }
            };
            sink.action(Action::WriteBack { block: victim });
            self.block(victim).tier = None;
            self.nvram_count -= 1;
            let block = self.blocks[victim as usize];
            if block.next_read != NEVER
                && !block.written_before_read()
                && self.capacity.dram_blocks > 0
                && self.make_dram_room(block.next_read, sink)
            {
                sink.action(Action::MoveToDram { block: victim });
                self.block(victim).tier = Some(Tier::Dram);
                self.dram_count += 1;
                self.index_dram(victim);
            }
        }
        sink.action(Action::PutDirty { block: id });
        self.block(id).tier = Some(Tier::Nvram);
        self.nvram_count += 1;
        let key = self.blocks[id as usize].nvram_key(self.capacity.dram_blocks > 0);
        self.nvram_by_write.push((key, id));
    }

    fn compact(&mut self) {
        let total =
            self.dram_by_read.len() + self.dram_write_first.len() + self.nvram_by_write.len();
        if total <= self.compact_at {
            return;
        }
        let blocks = &self.blocks;
        self.dram_by_read.retain(|&(key, id)| {
            let b = &blocks[id as usize];
            b.tier == Some(Tier::Dram) && b.next_read == key
        });
        self.dram_write_first.retain(|&id| {
            let b = &blocks[id as usize];
            b.tier == Some(Tier::Dram) && b.written_before_read()
        });
        self.dram_write_first.sort_unstable();
        self.dram_write_first.dedup();
        let has_dram = self.capacity.dram_blocks > 0;
        self.nvram_by_write.retain(|&(key, id)| {
            let b = &blocks[id as usize];
            b.tier == Some(Tier::Nvram) && b.nvram_key(has_dram) == key
        });
        let live =
            self.dram_by_read.len() + self.dram_write_first.len() + self.nvram_by_write.len();
        self.compact_at = 2 * live + 4096;
    }
}

impl Policy for NvMin<'_> {
    fn name(&self) -> &'static str {
        "nvmin"
    }

    #[inline]
    fn access<S: Sink>(&mut self, access: Access, sink: &mut S) {
        let future = *self
            .futures
            .get(self.position)
            .expect("NV-MIN sees more accesses than its futures were computed for");
        self.position += 1;
        let id = access.block;
        let has_dram = self.capacity.dram_blocks > 0;
        let block = self.block(id);
        block.next_read = future.next_read;
        block.next_write = future.next_write;
        // A cached block's next accesses changed: re-index it under the new keys.
        match block.tier {
            Some(Tier::Dram) => self.index_dram(id),
            Some(Tier::Nvram) => {
                let key = block.nvram_key(has_dram);
                self.nvram_by_write.push((key, id));
            }
            None => {}
        }
        match access.op {
            Op::Read => self.read(id, sink),
            Op::Write => self.write(id, sink),
        }
        self.compact();
    }

    fn clean_blocks(&self) -> usize {
        self.dram_count
    }

    fn dirty_blocks(&self) -> usize {
        self.nvram_count
    }
}
