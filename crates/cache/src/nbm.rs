//! NBM, the NBM paper's policy: read and write recency kept in two histories, LRR (least
//! recently read) and LRW (least recently written), apart from the cache contents.
//!
//! - DRAM (clean blocks) evicts the block least recently *read*.
//! - NVRAM (dirty blocks) evicts the block least recently *written*, so a block that is read
//!   often but written rarely does not hold NVRAM space (NVLRU's weakness).
//! - A block written back from NVRAM moves into DRAM if it was recently read: DRAM has room,
//!   or its last read is more recent than that of DRAM's least recently read block (which is
//!   then evicted). Its place in DRAM's order is its last read.
//!
//! The histories remember every block ever read or written (memory O(distinct blocks)), so a
//! block keeps its read history while it is dirty in NVRAM and after it leaves the cache.

use crate::block_table::BlockTable;
use crate::lazy_lru::{LazyLru, Time};
use crate::policy::{
    Access, Action, BlockId, Capacity, Discard, Op, Policy, Sink, Tier, WriteBackAhead,
};

#[derive(Debug, Clone, Copy, Default)]
struct Block {
    tier: Option<Tier>,
    last_read: Time,
    last_write: Time,
    /// The block's position in DRAM's LRR order while it is in DRAM.
    dram_key: Time,
}

/// The NBM policy.
#[derive(Debug)]
pub struct Nbm {
    capacity: Capacity,
    now: Time,
    blocks: BlockTable<Block>,
    lrr: LazyLru,
    lrw: LazyLru,
    dram_count: usize,
    nvram_count: usize,
}

impl Nbm {
    /// An empty cache of `capacity`.
    pub fn new(capacity: Capacity) -> Self {
        Self {
            capacity,
            now: 0,
            blocks: BlockTable::default(),
            lrr: LazyLru::default(),
            lrw: LazyLru::default(),
            dram_count: 0,
            nvram_count: 0,
        }
    }

    #[inline]
    fn block(&mut self, id: BlockId) -> &mut Block {
        self.blocks.get_mut(id)
    }

    fn read<S: Sink>(&mut self, id: BlockId, sink: &mut S) {
        let now = self.now;
        let tier = self.block(id).tier;
        match tier {
            Some(tier) => {
                sink.action(Action::ReadHit { block: id, tier });
                let block = self.block(id);
                block.last_read = now;
                if tier == Tier::Dram {
                    block.dram_key = now;
                }
                self.lrr.touch(now, id);
            }
            None if self.capacity.dram_blocks == 0 => sink.action(Action::Bypass { block: id }),
            None => {
                if self.dram_count == self.capacity.dram_blocks {
                    self.evict_dram(sink);
                }
                sink.action(Action::Load { block: id });
                let block = self.block(id);
                block.tier = Some(Tier::Dram);
                block.last_read = now;
                block.dram_key = now;
                self.dram_count += 1;
                self.lrr.touch(now, id);
            }
        }
    }

    fn write<S: Sink>(&mut self, id: BlockId, sink: &mut S) {
        let now = self.now;
        let tier = self.block(id).tier;
        if tier == Some(Tier::Nvram) {
            sink.action(Action::WriteHit { block: id });
            self.block(id).last_write = now;
            self.lrw.touch(now, id);
            return;
        }
        if self.capacity.nvram_blocks == 0 {
            sink.action(Action::WriteThrough { block: id });
            self.block(id).last_write = now;
            return;
        }
        if tier == Some(Tier::Dram) {
            // The clean copy is obsolete: drop it first, freeing its DRAM slot.
            sink.action(Action::EvictClean { block: id });
            self.block(id).tier = None;
            self.dram_count -= 1;
        }
        if self.nvram_count == self.capacity.nvram_blocks {
            self.evict_nvram(sink);
        }
        sink.action(Action::PutDirty { block: id });
        let block = self.block(id);
        block.tier = Some(Tier::Nvram);
        block.last_write = now;
        self.nvram_count += 1;
        self.lrw.touch(now, id);
    }

    /// Writes back NVRAM's least recently written block (which may then move to DRAM).
    fn evict_nvram<S: Sink>(&mut self, sink: &mut S) {
        let blocks = &self.blocks;
        let (_, victim) = self
            .lrw
            .pop_oldest(
                |time, b| {
                    let block = &blocks[b as usize];
                    block.tier == Some(Tier::Nvram) && block.last_write == time
                },
                |_, _| {},
            )
            .expect("a non-empty NVRAM has a least recently written block");
        sink.action(Action::WriteBack { block: victim });
        self.block(victim).tier = None;
        self.nvram_count -= 1;
        self.maybe_move_to_dram(victim, sink);
    }

    /// After `victim` was written back: keep it in DRAM if it was recently read.
    fn maybe_move_to_dram<S: Sink>(&mut self, victim: BlockId, sink: &mut S) {
        let last_read = self.blocks[victim as usize].last_read;
        if last_read == 0 || self.capacity.dram_blocks == 0 {
            return;
        }
        if self.dram_count == self.capacity.dram_blocks {
            let blocks = &self.blocks;
            let (oldest, _) = self
                .lrr
                .peek_oldest(|time, b| dram_valid(blocks, time, b), |_, _| {})
                .expect("a full DRAM has a least recently read block");
            if last_read <= oldest {
                return;
            }
            self.evict_dram(sink);
        }
        if !self.lrr.may_hold(last_read) {
            // Its read stamp has left the queue (it was read before every block whose stamp
            // is still queued): put it back at its place, so that the block's place in DRAM's
            // order is its last read, whatever the queue's internal state.
            self.lrr.reinsert_old(last_read, victim);
        }
        let key = last_read;
        sink.action(Action::MoveToDram { block: victim });
        let block = self.block(victim);
        block.tier = Some(Tier::Dram);
        block.dram_key = key;
        self.dram_count += 1;
    }

    fn evict_dram<S: Sink>(&mut self, sink: &mut S) {
        let blocks = &self.blocks;
        let (_, victim) = self
            .lrr
            .pop_oldest(|time, b| dram_valid(blocks, time, b), |_, _| {})
            .expect("a full DRAM has a least recently read block");
        sink.action(Action::EvictClean { block: victim });
        self.block(victim).tier = None;
        self.dram_count -= 1;
    }

    fn compact(&mut self) {
        let blocks = &self.blocks;
        // Read history is kept for every block (a written-back block needs it), plus DRAM
        // positions that are not read times (blocks moved in at the current time).
        self.lrr.compact_if_needed(|time, b| {
            let block = &blocks[b as usize];
            block.last_read == time || dram_valid(blocks, time, b)
        });
        self.lrw.compact_if_needed(|time, b| {
            let block = &blocks[b as usize];
            block.tier == Some(Tier::Nvram) && block.last_write == time
        });
    }
}

impl Discard for Nbm {
    fn discard<S: Sink>(&mut self, id: BlockId, sink: &mut S) {
        match self.block(id).tier {
            Some(Tier::Dram) => {
                sink.action(Action::EvictClean { block: id });
                self.dram_count -= 1;
            }
            Some(Tier::Nvram) => {
                sink.action(Action::DropDirty { block: id });
                self.nvram_count -= 1;
            }
            None => return,
        }
        self.block(id).tier = None;
        self.compact();
    }
}

impl WriteBackAhead for Nbm {
    fn write_back_next<S: Sink>(&mut self, sink: &mut S) -> bool {
        if self.nvram_count == 0 {
            return false;
        }
        self.evict_nvram(sink);
        self.compact();
        true
    }
}

#[inline]
fn dram_valid(blocks: &[Block], time: Time, id: BlockId) -> bool {
    let block = &blocks[id as usize];
    block.tier == Some(Tier::Dram) && block.dram_key == time
}

impl Policy for Nbm {
    fn name(&self) -> &'static str {
        "nbm"
    }

    #[inline]
    fn access<S: Sink>(&mut self, access: Access, sink: &mut S) {
        self.now += 1;
        match access.op {
            Op::Read => self.read(access.block, sink),
            Op::Write => self.write(access.block, sink),
        }
        self.compact();
        // The policy's own bound (tests also replay every action against explicit tiers).
        debug_assert!(
            self.dram_count <= self.capacity.dram_blocks
                && self.nvram_count <= self.capacity.nvram_blocks,
            "NBM holds {} clean and {} dirty blocks in {:?}",
            self.dram_count,
            self.nvram_count,
            self.capacity
        );
    }

    fn clean_blocks(&self) -> usize {
        self.dram_count
    }

    fn dirty_blocks(&self) -> usize {
        self.nvram_count
    }
}
