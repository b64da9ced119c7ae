//! What every policy shares: block accesses in, actions out, and the counters the simulator
//! reports.
//!
//! The model (the NBM paper's): every write goes to NVRAM, so every dirty block lives in
//! NVRAM and a write is durable once cached; clean blocks live in DRAM; a block is in at most
//! one of the two. The cost is storage accesses: reads that miss, plus write-backs of dirty
//! blocks leaving NVRAM. Dirty blocks still cached at the end are reported separately (the
//! final flush). With no NVRAM at all, writes go straight to storage (write-through).

/// A block, as a dense index `0..blocks` (the simulator maps trace block numbers to these).
pub type BlockId = u32;

/// The kind of a block access.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Op {
    /// Read the whole block.
    Read,
    /// Overwrite the whole block.
    Write,
}

/// One block access.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Access {
    /// The block.
    pub block: BlockId,
    /// Read or write.
    pub op: Op,
}

/// Where a cached block lives.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Tier {
    /// Volatile cache: clean blocks.
    Dram,
    /// Non-volatile cache: dirty blocks.
    Nvram,
}

/// What a policy does in answer to an access; a cache device carries these out in order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action {
    /// A read served from the cache.
    ReadHit { block: BlockId, tier: Tier },
    /// A write to a block already dirty in NVRAM, overwritten in place.
    WriteHit { block: BlockId },
    /// Read miss: read the block from storage into DRAM (one storage access).
    Load { block: BlockId },
    /// Read miss served from storage without caching the block (one storage access).
    Bypass { block: BlockId },
    /// Drop a clean block from DRAM (free: storage has it).
    EvictClean { block: BlockId },
    /// A written block placed in NVRAM as dirty. A clean copy in DRAM is dropped first with
    /// `EvictClean`, before any other action of the same access.
    PutDirty { block: BlockId },
    /// Write a dirty block back to storage and remove it from NVRAM (one storage access).
    WriteBack { block: BlockId },
    /// Move a block just written back into DRAM as a clean block.
    MoveToDram { block: BlockId },
    /// No NVRAM: the write goes straight to storage (one storage access).
    WriteThrough { block: BlockId },
    /// A discarded (trimmed) dirty block leaves NVRAM without a write-back (free).
    DropDirty { block: BlockId },
}

/// Receives a policy's actions.
pub trait Sink {
    /// Called once per action, in the order the cache must carry them out.
    fn action(&mut self, action: Action);
}

/// Counts storage accesses and hits: the simulator's sink.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Counters {
    /// Block accesses seen.
    pub accesses: u64,
    /// Read hits.
    pub read_hits: u64,
    /// Write hits.
    pub write_hits: u64,
    /// Reads from storage (read misses).
    pub storage_reads: u64,
    /// Writes to storage (write-backs and write-throughs).
    pub writebacks: u64,
    /// Blocks moved from NVRAM to DRAM after write-back.
    pub moves_to_dram: u64,
}

impl Counters {
    /// Storage accesses: the paper's metric.
    pub fn storage_accesses(&self) -> u64 {
        self.storage_reads + self.writebacks
    }
}

impl Sink for Counters {
    #[inline]
    fn action(&mut self, action: Action) {
        match action {
            Action::ReadHit { .. } => self.read_hits += 1,
            Action::WriteHit { .. } => self.write_hits += 1,
            Action::Load { .. } | Action::Bypass { .. } => self.storage_reads += 1,
            Action::WriteBack { .. } | Action::WriteThrough { .. } => self.writebacks += 1,
            Action::MoveToDram { .. } => self.moves_to_dram += 1,
            Action::EvictClean { .. } | Action::PutDirty { .. } | Action::DropDirty { .. } => {}
        }
    }
}

/// Records every action (for tests and for a cache device's log).
impl Sink for Vec<Action> {
    fn action(&mut self, action: Action) {
        self.push(action);
    }
}

/// Cache sizes in blocks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Capacity {
    /// DRAM (clean) blocks.
    pub dram_blocks: usize,
    /// NVRAM (dirty) blocks.
    pub nvram_blocks: usize,
}

/// A policy that can write a dirty block back before NVRAM is full: a cache device's
/// background write-back, between a high and a low watermark, asks for the blocks in the
/// order the policy would evict them anyway.
pub trait WriteBackAhead: Policy {
    /// Writes back the dirty block the policy would evict from NVRAM next: reports
    /// `WriteBack` and whatever follows it (NBM may `MoveToDram`, after an `EvictClean`).
    /// Returns `false`, reporting nothing, when no block is dirty.
    fn write_back_next<S: Sink>(&mut self, sink: &mut S) -> bool;
}

/// A policy that can forget a block (a TRIM: its contents no longer matter).
pub trait Discard: Policy {
    /// Removes `block` from the cache without a storage access: `EvictClean` if it is clean
    /// in DRAM, `DropDirty` if it is dirty in NVRAM, nothing if it is not cached. The
    /// block's history (recency) is kept.
    fn discard<S: Sink>(&mut self, block: BlockId, sink: &mut S);
}

/// A replacement policy over DRAM and NVRAM.
pub trait Policy {
    /// The policy's name as the simulator prints it.
    fn name(&self) -> &'static str;

    /// Handles one access, reporting what the cache must do to `sink`.
    fn access<S: Sink>(&mut self, access: Access, sink: &mut S);

    /// Clean blocks cached now.
    fn clean_blocks(&self) -> usize;

    /// Dirty blocks cached now (the final flush, at the end of a trace).
    fn dirty_blocks(&self) -> usize;
}
