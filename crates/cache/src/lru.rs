//! Plain LRU over one unified cache of DRAM + NVRAM capacity that ignores reads versus
//! writes: a dirty block may occupy any slot, so it does not keep the NVRAM model's
//! guarantee that every dirty block is in NVRAM. It is the baseline that shows why the split
//! matters. Its actions name `Tier::Nvram` for dirty blocks and `Tier::Dram` for clean ones.

use crate::block_table::BlockTable;
use crate::lazy_lru::{LazyLru, Time};
use crate::policy::{Access, Action, BlockId, Capacity, Discard, Op, Policy, Sink, Tier};

#[derive(Debug, Clone, Copy, Default)]
struct Block {
    cached: bool,
    dirty: bool,
    last_use: Time,
}

/// The unified LRU baseline.
#[derive(Debug)]
pub struct Lru {
    capacity_blocks: usize,
    now: Time,
    blocks: BlockTable<Block>,
    order: LazyLru,
    cached: usize,
    dirty: usize,
}

impl Lru {
    /// An empty cache holding `dram_blocks + nvram_blocks` blocks.
    pub fn new(capacity: Capacity) -> Self {
        Self {
            capacity_blocks: capacity.dram_blocks + capacity.nvram_blocks,
            now: 0,
            blocks: BlockTable::default(),
            order: LazyLru::default(),
            cached: 0,
            dirty: 0,
        }
    }

    #[inline]
    fn block(&mut self, id: BlockId) -> &mut Block {
        self.blocks.get_mut(id)
    }

    fn make_room<S: Sink>(&mut self, sink: &mut S) {
        if self.cached < self.capacity_blocks {
            return;
        }
        let blocks = &self.blocks;
        let (_, victim) = self
            .order
            .pop_oldest(
                |time, b| {
                    let block = &blocks[b as usize];
                    block.cached && block.last_use == time
                },
                |_, _| {},
            )
            .expect("a full cache has a least recently used block");
        let dirty = self.blocks[victim as usize].dirty;
        sink.action(if dirty {
            Action::WriteBack { block: victim }
        } else {
            Action::EvictClean { block: victim }
        });
        if dirty {
            self.dirty -= 1;
        }
        *self.block(victim) = Block::default();
        self.cached -= 1;
    }
}

impl Discard for Lru {
    fn discard<S: Sink>(&mut self, id: BlockId, sink: &mut S) {
        let block = *self.block(id);
        if !block.cached {
            return;
        }
        if block.dirty {
            sink.action(Action::DropDirty { block: id });
            self.dirty -= 1;
        } else {
            sink.action(Action::EvictClean { block: id });
        }
        self.cached -= 1;
        *self.block(id) = Block::default();
    }
}

impl Policy for Lru {
    fn name(&self) -> &'static str {
        "lru"
    }

    #[inline]
    fn access<S: Sink>(&mut self, access: Access, sink: &mut S) {
        self.now += 1;
        let (now, id) = (self.now, access.block);
        let block = *self.block(id);
        match access.op {
            Op::Read if block.cached => {
                let tier = if block.dirty { Tier::Nvram } else { Tier::Dram };
                sink.action(Action::ReadHit { block: id, tier });
            }
            Op::Read if self.capacity_blocks == 0 => {
                sink.action(Action::Bypass { block: id });
                return;
            }
            Op::Read => {
                self.make_room(sink);
                sink.action(Action::Load { block: id });
                *self.block(id) = Block {
                    cached: true,
                    dirty: false,
                    last_use: now,
                };
                self.cached += 1;
            }
            Op::Write if block.cached && block.dirty => sink.action(Action::WriteHit { block: id }),
            Op::Write if block.cached => {
                // Same slot, now dirty: the clean copy goes, the dirty one takes its place.
                sink.action(Action::EvictClean { block: id });
                sink.action(Action::PutDirty { block: id });
                self.dirty += 1;
            }
            Op::Write if self.capacity_blocks == 0 => {
                sink.action(Action::WriteThrough { block: id });
                return;
            }
            Op::Write => {
                self.make_room(sink);
                sink.action(Action::PutDirty { block: id });
                self.cached += 1;
                self.dirty += 1;
            }
        }
        let entry = self.block(id);
        entry.cached = true;
        entry.dirty |= access.op == Op::Write;
        entry.last_use = now;
        self.order.touch(now, id);
        let blocks = &self.blocks;
        self.order.compact_if_needed(|time, b| {
            let block = &blocks[b as usize];
            block.cached && block.last_use == time
        });
    }

    fn clean_blocks(&self) -> usize {
        self.cached - self.dirty
    }

    fn dirty_blocks(&self) -> usize {
        self.dirty
    }
}
