//! NVLRU, the NBM paper's baseline: dirty blocks in NVRAM under one LRU ordered by every
//! access (reads and writes), clean blocks in DRAM under LRU. A block written back from
//! NVRAM leaves the cache.

use crate::block_table::BlockTable;
use crate::lazy_lru::{LazyLru, Time};
use crate::policy::{
    Access, Action, BlockId, Capacity, Discard, Op, Policy, Sink, Tier, WriteBackAhead,
};

#[derive(Debug, Clone, Copy, Default)]
struct Block {
    tier: Option<Tier>,
    last_use: Time,
}

/// The NVLRU policy.
#[derive(Debug)]
pub struct NvLru {
    capacity: Capacity,
    now: Time,
    blocks: BlockTable<Block>,
    dram: LazyLru,
    nvram: LazyLru,
    dram_count: usize,
    nvram_count: usize,
}

impl NvLru {
    /// An empty cache of `capacity`.
    pub fn new(capacity: Capacity) -> Self {
        Self {
            capacity,
            now: 0,
            blocks: BlockTable::default(),
            dram: LazyLru::default(),
            nvram: LazyLru::default(),
            dram_count: 0,
            nvram_count: 0,
        }
    }

    #[inline]
    fn block(&mut self, id: BlockId) -> &mut Block {
        self.blocks.get_mut(id)
    }

    fn evict<S: Sink>(&mut self, tier: Tier, sink: &mut S) -> BlockId {
        let blocks = &self.blocks;
        let queue = if tier == Tier::Dram {
            &mut self.dram
        } else {
            &mut self.nvram
        };
        let (_, victim) = queue
            .pop_oldest(
                |time, b| {
                    let block = &blocks[b as usize];
                    block.tier == Some(tier) && block.last_use == time
                },
                |_, _| {},
            )
            .expect("a full tier has a least recently used block");
        sink.action(match tier {
            Tier::Dram => Action::EvictClean { block: victim },
            Tier::Nvram => Action::WriteBack { block: victim },
        });
        self.block(victim).tier = None;
        match tier {
            Tier::Dram => self.dram_count -= 1,
            Tier::Nvram => self.nvram_count -= 1,
        }
        victim
    }
}

impl NvLru {
    fn compact(&mut self) {
        let blocks = &self.blocks;
        let live = |tier: Tier| {
            move |time: Time, b: BlockId| {
                let block = &blocks[b as usize];
                block.tier == Some(tier) && block.last_use == time
            }
        };
        self.dram.compact_if_needed(live(Tier::Dram));
        self.nvram.compact_if_needed(live(Tier::Nvram));
    }
}

impl Discard for NvLru {
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

impl WriteBackAhead for NvLru {
    fn write_back_next<S: Sink>(&mut self, sink: &mut S) -> bool {
        if self.nvram_count == 0 {
            return false;
        }
        // A written-back block leaves the cache, as on eviction.
        self.evict(Tier::Nvram, sink);
        self.compact();
        true
    }
}

impl Policy for NvLru {
    fn name(&self) -> &'static str {
        "nvlru"
    }

    #[inline]
    fn access<S: Sink>(&mut self, access: Access, sink: &mut S) {
        self.now += 1;
        let (now, id) = (self.now, access.block);
        let tier = self.block(id).tier;
        match (access.op, tier) {
            (Op::Read, Some(tier)) => {
                sink.action(Action::ReadHit { block: id, tier });
                self.block(id).last_use = now;
                match tier {
                    Tier::Dram => self.dram.touch(now, id),
                    Tier::Nvram => self.nvram.touch(now, id),
                }
            }
            (Op::Read, None) if self.capacity.dram_blocks == 0 => {
                sink.action(Action::Bypass { block: id });
            }
            (Op::Read, None) => {
                if self.dram_count == self.capacity.dram_blocks {
                    self.evict(Tier::Dram, sink);
                }
                sink.action(Action::Load { block: id });
                *self.block(id) = Block {
                    tier: Some(Tier::Dram),
                    last_use: now,
                };
                self.dram_count += 1;
                self.dram.touch(now, id);
            }
            (Op::Write, Some(Tier::Nvram)) => {
                sink.action(Action::WriteHit { block: id });
                self.block(id).last_use = now;
                self.nvram.touch(now, id);
            }
            (Op::Write, _) if self.capacity.nvram_blocks == 0 => {
                sink.action(Action::WriteThrough { block: id });
            }
            (Op::Write, _) => {
                if tier == Some(Tier::Dram) {
                    // The clean copy is obsolete: drop it first, freeing its DRAM slot.
                    sink.action(Action::EvictClean { block: id });
                    self.block(id).tier = None;
                    self.dram_count -= 1;
                }
                if self.nvram_count == self.capacity.nvram_blocks {
                    self.evict(Tier::Nvram, sink);
                }
                sink.action(Action::PutDirty { block: id });
                *self.block(id) = Block {
                    tier: Some(Tier::Nvram),
                    last_use: now,
                };
                self.nvram_count += 1;
                self.nvram.touch(now, id);
            }
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
