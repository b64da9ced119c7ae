//! The cache device: a backing store behind an NVRAM tier (dirty blocks, durable once
//! cached) and a DRAM tier (clean blocks), with a `cache` policy deciding every move. The
//! device carries out exactly the actions the policy emits, in order, so it and the
//! simulator cannot disagree about what the policy does.

use std::collections::HashMap;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::thread::JoinHandle;
use std::time::Duration;

use cache::{
    Access, Action, BlockId, Capacity, Counters, Discard, Lru, Nbm, NvLru, Op, Policy, Sink, Tier,
    WriteBackAhead,
};

use crate::backing::Backing;
use crate::error::{CacheError, Result};
use crate::format::{Entry, Header};
use crate::nvram::Nvram;

/// Bytes per cached block.
pub const BLOCK_BYTES: u32 = 4096;

/// Which policy decides.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum PolicyKind {
    /// NBM: separate read and write recency; NVRAM evicts the least recently written block;
    /// a written-back block recently read moves to DRAM.
    #[default]
    Nbm,
    /// LRU over dirty blocks by any access, LRU over clean blocks.
    NvLru,
    /// One LRU over DRAM + NVRAM capacity, ignoring the split: every cached block may be
    /// dirty, so the NVRAM file has room for the whole cache.
    Lru,
}

impl PolicyKind {
    /// The name `locus sim` prints.
    pub fn name(self) -> &'static str {
        match self {
            PolicyKind::Nbm => "nbm",
            PolicyKind::NvLru => "nvlru",
            PolicyKind::Lru => "lru",
        }
    }
}

/// How big the tiers are and who decides.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CacheConfig {
    /// NVRAM (dirty blocks) bytes: a positive multiple of the block.
    pub nvram_bytes: u64,
    /// DRAM (clean blocks) bytes: a multiple of the block (0: reads are not cached).
    pub dram_bytes: u64,
    /// The policy.
    pub policy: PolicyKind,
    /// Background write-back: when more than `high` percent of NVRAM is dirty, a thread
    /// writes blocks back, in the policy's eviction order, until at most `low` percent is.
    /// `None`: blocks are written back only when the policy evicts them (then the device's
    /// backing-store traffic is exactly the simulator's).
    pub writeback: Option<Watermarks>,
}

/// Background write-back thresholds, in percent of NVRAM.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Watermarks {
    /// Start writing back above this.
    pub high: u8,
    /// Stop at or below this.
    pub low: u8,
}

impl Watermarks {
    /// dm-writecache's idea with more room for rewrites: start at 90%, stop at 70%.
    pub const DEFAULT: Watermarks = Watermarks { high: 90, low: 70 };
}

/// Blocks written back per batch: one backing-store sync for all of them.
const WRITEBACK_BATCH: usize = 32;

/// Counters of a cache device.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct CacheStats {
    /// Block accesses.
    pub accesses: u64,
    /// Reads served from DRAM or NVRAM.
    pub read_hits: u64,
    /// Writes to blocks already dirty in NVRAM.
    pub write_hits: u64,
    /// Blocks read from the backing store for the policy (read misses), as done.
    pub backing_reads: u64,
    /// Blocks written to the backing store (write-backs and write-throughs), as done.
    pub writebacks: u64,
    /// Blocks read from the backing store to complete a partial-block write (not policy
    /// accesses: the policy's model has whole blocks).
    pub partial_reads: u64,
    /// Dirty blocks in NVRAM now.
    pub dirty_blocks: u64,
    /// Clean blocks in DRAM now.
    pub clean_blocks: u64,
    /// Backing-store operations (reads, writes, syncs) and their total time.
    pub backing_ops: u64,
    pub backing_ns: u64,
}

/// Any of the selectable policies.
#[derive(Debug)]
enum AnyPolicy {
    Nbm(Nbm),
    NvLru(NvLru),
    Lru(Lru),
}

impl AnyPolicy {
    fn new(kind: PolicyKind, capacity: Capacity) -> Self {
        match kind {
            PolicyKind::Nbm => AnyPolicy::Nbm(Nbm::new(capacity)),
            PolicyKind::NvLru => AnyPolicy::NvLru(NvLru::new(capacity)),
            PolicyKind::Lru => AnyPolicy::Lru(Lru::new(capacity)),
        }
    }

    fn access<S: Sink>(&mut self, access: Access, sink: &mut S) {
        match self {
            AnyPolicy::Nbm(p) => p.access(access, sink),
            AnyPolicy::NvLru(p) => p.access(access, sink),
            AnyPolicy::Lru(p) => p.access(access, sink),
        }
    }

    fn discard<S: Sink>(&mut self, block: BlockId, sink: &mut S) {
        match self {
            AnyPolicy::Nbm(p) => p.discard(block, sink),
            AnyPolicy::NvLru(p) => p.discard(block, sink),
            AnyPolicy::Lru(p) => p.discard(block, sink),
        }
    }

    /// The policy's next write-back ahead of need (`false`: nothing dirty, or no order).
    fn write_back_next<S: Sink>(&mut self, sink: &mut S) -> bool {
        match self {
            AnyPolicy::Nbm(p) => p.write_back_next(sink),
            AnyPolicy::NvLru(p) => p.write_back_next(sink),
            AnyPolicy::Lru(_) => false,
        }
    }
}

/// A cache device over a backing store.
#[derive(Debug)]
pub struct CacheDevice {
    shared: Arc<Shared>,
    writer: Option<JoinHandle<()>>,
    size: u64,
    policy: PolicyKind,
}

#[derive(Debug)]
struct Shared {
    state: Mutex<State>,
    /// Wakes the background writer (more dirty blocks, or stop).
    wake: Condvar,
    stop: AtomicBool,
    /// Dirty-block counts that start and stop background write-back.
    high_blocks: usize,
    low_blocks: usize,
}

impl Shared {
    fn state(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

impl Drop for CacheDevice {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::Release);
        self.shared.wake.notify_all();
        if let Some(writer) = self.writer.take() {
            let _ = writer.join();
        }
    }
}

/// The background writer: sleeps until NVRAM is fuller than the high watermark, then writes
/// batches back until it is down to the low one, letting requests in between batches.
fn background_writer(shared: &Shared) {
    let mut state = shared.state();
    loop {
        while !shared.stop.load(Ordering::Acquire) && state.dirty.len() <= shared.high_blocks {
            state = shared
                .wake
                .wait_timeout(state, Duration::from_secs(1))
                .unwrap_or_else(PoisonError::into_inner)
                .0;
        }
        if shared.stop.load(Ordering::Acquire) {
            return;
        }
        while state.dirty.len() > shared.low_blocks && !shared.stop.load(Ordering::Acquire) {
            let over = state.dirty.len() - shared.low_blocks;
            match state.write_back_batch(WRITEBACK_BATCH.min(over)) {
                Ok(0) => break,
                Ok(_) => {}
                Err(e) => {
                    tracing::error!(error = %e, "background write-back failed; writes are refused until restart");
                    state.failed = Some(e.to_string());
                    return;
                }
            }
            drop(state);
            state = shared.state();
        }
        if state.failed.is_some() || state.closed {
            return;
        }
    }
}

#[derive(Debug)]
struct State {
    policy: AnyPolicy,
    nvram: Nvram,
    backing: Backing,
    /// Dirty blocks: backing block → NVRAM slot. The authority on what NVRAM holds.
    dirty: HashMap<u64, u32>,
    free_slots: Vec<u32>,
    /// Clean blocks in DRAM.
    clean: HashMap<u64, Box<[u8]>>,
    /// The last write-back's block and data (for `MoveToDram`).
    written_back: Option<(u64, Box<[u8]>)>,
    seq: u64,
    counters: Counters,
    partial_reads: u64,
    actions: Vec<Action>,
    /// Set when a backing-store error left the policy and the tiers apart: writes are
    /// refused from then on (reads stay exact: NVRAM is consulted first and nothing dirty
    /// was dropped). A restart rebuilds everything from NVRAM.
    failed: Option<String>,
    /// Set by [`CacheDevice::write_back_all`]: the device has handed everything to the
    /// backing store and serves nothing more.
    closed: bool,
}

/// What [`CacheDevice::write_back_all`] did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct WriteBackReport {
    /// Dirty blocks written to the backing store.
    pub blocks: u64,
}

impl CacheDevice {
    /// Opens the cache of `backing` whose NVRAM is the file `nvram_path` of `fs` (created if
    /// absent; an existing one is recovered: its dirty blocks are cached again, in the order
    /// they were written).
    pub fn open(
        fs: &fs::Fs,
        nvram_path: &str,
        backing: &Path,
        config: &CacheConfig,
    ) -> Result<Self> {
        let block = u64::from(BLOCK_BYTES);
        for (what, bytes) in [("nvram", config.nvram_bytes), ("dram", config.dram_bytes)] {
            if !bytes.is_multiple_of(block) {
                return Err(CacheError::Config(format!(
                    "{what}={bytes} is not a multiple of the {block}-byte block"
                )));
            }
        }
        if let Some(w) = config.writeback {
            if config.policy == PolicyKind::Lru {
                return Err(CacheError::Config(
                    "lru has no write-back order of its own (one LRU over clean and dirty \
                     blocks): background write-back needs nbm or nvlru"
                        .into(),
                ));
            }
            if !(w.low < w.high && w.high <= 100) {
                return Err(CacheError::Config(format!(
                    "write-back watermarks {}:{}: the low one must be below the high one, \
                     both percentages",
                    w.high, w.low
                )));
            }
        }
        if config.nvram_bytes == 0 {
            return Err(CacheError::Config(
                "nvram must hold at least one block (a cache without NVRAM has nowhere to keep \
                 writes)"
                    .into(),
            ));
        }
        let capacity = Capacity {
            dram_blocks: usize::try_from(config.dram_bytes / block)
                .map_err(|_| CacheError::Config("dram is too large".into()))?,
            nvram_blocks: usize::try_from(config.nvram_bytes / block)
                .map_err(|_| CacheError::Config("nvram is too large".into()))?,
        };
        let slots = match config.policy {
            PolicyKind::Lru => capacity.nvram_blocks + capacity.dram_blocks,
            _ => capacity.nvram_blocks,
        };
        let slots = u32::try_from(slots)
            .map_err(|_| CacheError::Config(format!("{slots} NVRAM slots are too many")))?;
        let backing = Backing::open(backing, BLOCK_BYTES)?;
        let size = backing.size();
        if size / block > u64::from(BlockId::MAX) {
            return Err(CacheError::Config(format!(
                "the backing store has {} blocks; the cache handles up to {}",
                size / block,
                BlockId::MAX
            )));
        }
        let want = Header {
            block_bytes: BLOCK_BYTES,
            slots,
            backing_bytes: size,
        };
        let (nvram, entries) = Nvram::open(fs, nvram_path, want)?;
        let mut state = State {
            policy: AnyPolicy::new(config.policy, capacity),
            nvram,
            backing,
            dirty: HashMap::new(),
            free_slots: Vec::new(),
            clean: HashMap::new(),
            written_back: None,
            seq: 0,
            counters: Counters::default(),
            partial_reads: 0,
            actions: Vec::new(),
            failed: None,
            closed: false,
        };
        state.recover(&entries)?;
        let (high_blocks, low_blocks) = match config.writeback {
            Some(w) => (
                capacity.nvram_blocks * usize::from(w.high) / 100,
                capacity.nvram_blocks * usize::from(w.low) / 100,
            ),
            None => (usize::MAX, usize::MAX),
        };
        let shared = Arc::new(Shared {
            state: Mutex::new(state),
            wake: Condvar::new(),
            stop: AtomicBool::new(false),
            high_blocks,
            low_blocks,
        });
        let writer = if config.writeback.is_some() {
            let shared = Arc::clone(&shared);
            Some(
                std::thread::Builder::new()
                    .name("locus-writeback".into())
                    .spawn(move || background_writer(&shared))
                    .map_err(|e| {
                        CacheError::Config(format!("starting the write-back thread: {e}"))
                    })?,
            )
        } else {
            None
        };
        // Recovered dirty blocks above the high watermark are written back from the start.
        shared.wake.notify_all();
        Ok(CacheDevice {
            shared,
            writer,
            size,
            policy: config.policy,
        })
    }

    /// Bytes of the device (the backing store's size).
    pub fn size(&self) -> u64 {
        self.size
    }

    /// The policy deciding.
    pub fn policy(&self) -> PolicyKind {
        self.policy
    }

    fn state(&self) -> MutexGuard<'_, State> {
        self.shared.state()
    }

    fn check(&self, offset: u64, len: usize) -> Result<()> {
        match offset.checked_add(len as u64) {
            Some(end) if end <= self.size => Ok(()),
            _ => Err(CacheError::OutOfRange {
                offset,
                len: len as u64,
                size: self.size,
            }),
        }
    }

    /// Reads `out.len()` bytes at `offset`.
    pub fn read(&self, offset: u64, out: &mut [u8]) -> Result<()> {
        self.check(offset, out.len())?;
        let block = u64::from(BLOCK_BYTES);
        let mut state = self.state();
        if state.closed {
            return Err(closed());
        }
        let mut buf = vec![0u8; BLOCK_BYTES as usize];
        let mut done = 0;
        while done < out.len() {
            let at = offset + done as u64;
            let (b, within) = (at / block, (at % block) as usize);
            let n = (BLOCK_BYTES as usize - within).min(out.len() - done);
            if within == 0 && n == BLOCK_BYTES as usize {
                state.read_block(b, &mut out[done..done + n])?;
            } else {
                state.read_block(b, &mut buf)?;
                out[done..done + n].copy_from_slice(&buf[within..within + n]);
            }
            done += n;
        }
        Ok(())
    }

    /// Writes `data` at `offset`; durable when it returns (every block is in NVRAM with its
    /// index entry, or written through and synced). A partial block is read, merged and
    /// written whole.
    pub fn write(&self, offset: u64, data: &[u8]) -> Result<()> {
        self.check(offset, data.len())?;
        let block = u64::from(BLOCK_BYTES);
        let mut state = self.state();
        state.takes_writes()?;
        let mut buf = vec![0u8; BLOCK_BYTES as usize];
        let mut done = 0;
        while done < data.len() {
            let at = offset + done as u64;
            let (b, within) = (at / block, (at % block) as usize);
            let n = (BLOCK_BYTES as usize - within).min(data.len() - done);
            if within == 0 && n == BLOCK_BYTES as usize {
                state.write_block(b, &data[done..done + n])?;
            } else {
                state.current(b, &mut buf)?;
                buf[within..within + n].copy_from_slice(&data[done..done + n]);
                state.write_block(b, &buf)?;
            }
            done += n;
        }
        if state.dirty.len() > self.shared.high_blocks {
            self.shared.wake.notify_one();
        }
        Ok(())
    }

    /// Discards `[offset, offset + len)` (TRIM): its whole blocks read as zeros afterwards.
    /// The backing store's range is zeroed (a hole in a file, `BLKZEROOUT` on a device) and
    /// synced first, then the blocks leave both tiers — so a crash in between leaves the
    /// acknowledged data, never older data. Partial blocks at the edges are left as they are.
    pub fn discard(&self, offset: u64, len: u64) -> Result<()> {
        self.check(offset, usize::try_from(len).unwrap_or(usize::MAX))?;
        let block = u64::from(BLOCK_BYTES);
        let first = offset.div_ceil(block);
        let end = (offset + len) / block;
        if first >= end {
            return Ok(());
        }
        let mut state = self.state();
        state.takes_writes()?;
        state.discard_blocks(first, end)
    }

    /// Writes zeros over `[offset, offset + len)`: whole blocks as [`CacheDevice::discard`]
    /// (the zeros reach the backing store at once), partial blocks through the cache.
    pub fn write_zeroes(&self, offset: u64, len: u64) -> Result<()> {
        self.check(offset, usize::try_from(len).unwrap_or(usize::MAX))?;
        let block = u64::from(BLOCK_BYTES);
        let (first, end) = (
            offset.div_ceil(block) * block,
            (offset + len) / block * block,
        );
        if first >= end {
            return self.write(offset, &vec![0u8; len as usize]);
        }
        if offset < first {
            self.write(offset, &vec![0u8; (first - offset) as usize])?;
        }
        self.discard(first, end - first)?;
        if end < offset + len {
            self.write(end, &vec![0u8; (offset + len - end) as usize])?;
        }
        Ok(())
    }

    /// Writes every dirty block back (in block order, one sync at the end), then frees their
    /// NVRAM slots, so the backing store alone holds everything; the device serves nothing
    /// more afterwards (it is for a clean stop: the policy's state is left behind). A failure
    /// leaves NVRAM holding every block not yet freed.
    pub fn write_back_all(&self) -> Result<WriteBackReport> {
        let mut state = self.state();
        state.closed = true;
        let mut dirty: Vec<(u64, u32)> = state.dirty.iter().map(|(&b, &s)| (b, s)).collect();
        dirty.sort_unstable();
        let mut copy = vec![0u8; BLOCK_BYTES as usize];
        for &(block, slot) in &dirty {
            state.nvram.read_slot(slot, &mut copy)?;
            state.backing.write_block(block, &copy)?;
        }
        state.backing.sync()?;
        for &(block, slot) in &dirty {
            state.nvram.write_entry(slot, Entry::Free)?;
            state.dirty.remove(&block);
            state.free_slots.push(slot);
        }
        Ok(WriteBackReport {
            blocks: dirty.len() as u64,
        })
    }

    /// The counters now.
    pub fn stats(&self) -> CacheStats {
        let state = self.state();
        let c = state.counters;
        CacheStats {
            accesses: c.accesses,
            read_hits: c.read_hits,
            write_hits: c.write_hits,
            // What the backing store really did (the policy's counts are `policy_counters`).
            backing_reads: state.backing.reads - state.partial_reads,
            writebacks: state.backing.writes,
            partial_reads: state.partial_reads,
            dirty_blocks: state.dirty.len() as u64,
            clean_blocks: state.clean.len() as u64,
            backing_ops: state.backing.ops,
            backing_ns: u64::try_from(state.backing.busy.as_nanos()).unwrap_or(u64::MAX),
        }
    }

    /// The policy's counters (what `locus sim` reports for the same accesses).
    pub fn policy_counters(&self) -> Counters {
        self.state().counters
    }
}

fn closed() -> CacheError {
    CacheError::Config("the cache was written back and closed".into())
}

impl State {
    /// Whether writes may change the cache: not after it was closed, nor after a
    /// backing-store error left the policy and the tiers apart.
    fn takes_writes(&self) -> Result<()> {
        if self.closed {
            return Err(closed());
        }
        if let Some(why) = &self.failed {
            return Err(CacheError::Config(format!(
                "the cache stopped taking writes after a backing-store error ({why}); restart \
                 it to recover from NVRAM"
            )));
        }
        Ok(())
    }

    /// Rebuilds the dirty set from the NVRAM index: the policy is told of each dirty block
    /// as a write, oldest first, and must only place them (the NVRAM holds them already).
    fn recover(&mut self, entries: &[Entry]) -> Result<()> {
        let blocks = self.backing.size() / u64::from(BLOCK_BYTES);
        let mut newest: HashMap<u64, (u64, u32)> = HashMap::new();
        let mut stale = Vec::new();
        for (slot, entry) in entries.iter().enumerate() {
            let slot = slot as u32;
            match *entry {
                Entry::Free => self.free_slots.push(slot),
                Entry::Dirty { block, seq } => {
                    if block >= blocks {
                        return Err(CacheError::Format {
                            problem: format!(
                                "index entry {slot}: block {block} is past the end of the \
                                 {blocks}-block backing store"
                            ),
                        });
                    }
                    // Two slots for one block (never written so, but harmless to read): the
                    // newer holds the data, the older is freed on media before any reuse.
                    match newest.get(&block).copied() {
                        Some((older_seq, older_slot)) if older_seq < seq => {
                            stale.push(older_slot);
                            newest.insert(block, (seq, slot));
                        }
                        Some(_) => stale.push(slot),
                        None => {
                            newest.insert(block, (seq, slot));
                        }
                    }
                }
            }
        }
        for slot in stale {
            self.nvram.write_entry(slot, Entry::Free)?;
            self.free_slots.push(slot);
        }
        let mut dirty: Vec<(u64, u64, u32)> = newest
            .into_iter()
            .map(|(block, (seq, slot))| (seq, block, slot))
            .collect();
        dirty.sort_unstable();
        // Hand slots out lowest first.
        self.free_slots.sort_unstable_by(|a, b| b.cmp(a));
        for &(seq, block, slot) in &dirty {
            self.actions.clear();
            self.policy.access(
                Access {
                    block: block as BlockId,
                    op: Op::Write,
                },
                &mut self.actions,
            );
            if self.actions
                != [Action::PutDirty {
                    block: block as BlockId,
                }]
            {
                return Err(CacheError::Format {
                    problem: format!(
                        "recovering block {block} (slot {slot}): the policy asked for {:?}, \
                         not to place it; the NVRAM holds more dirty blocks than the \
                         configuration allows",
                        self.actions
                    ),
                });
            }
            self.dirty.insert(block, slot);
            self.seq = self.seq.max(seq);
        }
        self.actions.clear();
        Ok(())
    }

    /// Blocks `first..end` leave the cache after the backing store's range is zeroed.
    fn discard_blocks(&mut self, first: u64, end: u64) -> Result<()> {
        let block = u64::from(BLOCK_BYTES);
        self.backing
            .zero_range(first * block, (end - first) * block)?;
        let mut cached: Vec<u64> = self
            .dirty
            .keys()
            .chain(self.clean.keys())
            .copied()
            .filter(|b| (first..end).contains(b))
            .collect();
        cached.sort_unstable();
        let mut actions = std::mem::take(&mut self.actions);
        let mut result = Ok(());
        for b in cached {
            actions.clear();
            self.policy.discard(b as BlockId, &mut actions);
            for &action in &actions {
                self.counters.action(action);
                if let Err(e) = self.apply(action, None, None) {
                    self.failed = Some(e.to_string());
                    result = Err(e);
                    break;
                }
            }
            if result.is_err() {
                break;
            }
        }
        self.actions = actions;
        result
    }

    /// Background write-back of up to `n` blocks the policy picks: each is written to the
    /// backing store, then one sync for all, then their NVRAM entries are freed. Until the
    /// sync, the blocks stay in the dirty map (the authority for reads), so a failure drops
    /// nothing. Returns how many were written back.
    fn write_back_batch(&mut self, n: usize) -> Result<usize> {
        if self.failed.is_some() || self.closed {
            return Ok(0);
        }
        let mut actions = std::mem::take(&mut self.actions);
        actions.clear();
        let mut pending: Vec<(u64, u32)> = Vec::with_capacity(n);
        let mut result = Ok(());
        'batch: for _ in 0..n {
            let from = actions.len();
            if !self.policy.write_back_next(&mut actions) {
                break;
            }
            for &action in &actions[from..] {
                self.counters.action(action);
                let done = match action {
                    Action::WriteBack { block } => {
                        let block = u64::from(block);
                        self.write_back_data(block)
                            .map(|slot| pending.push((block, slot)))
                    }
                    other => self.apply(other, None, None),
                };
                if let Err(e) = done {
                    result = Err(e);
                    break 'batch;
                }
            }
        }
        self.actions = actions;
        result?;
        if pending.is_empty() {
            return Ok(0);
        }
        self.backing.sync()?;
        for &(block, slot) in &pending {
            self.nvram.write_entry(slot, Entry::Free)?;
            self.dirty.remove(&block);
            self.free_slots.push(slot);
        }
        Ok(pending.len())
    }

    /// Writes dirty `block`'s data to the backing store (not synced), keeping it for a
    /// following `MoveToDram`; returns its slot.
    fn write_back_data(&mut self, block: u64) -> Result<u32> {
        let slot = *self.dirty.get(&block).ok_or_else(|| CacheError::Format {
            problem: format!("the policy and the cache disagree: block {block} is not dirty"),
        })?;
        let mut copy = vec![0u8; BLOCK_BYTES as usize].into_boxed_slice();
        self.nvram.read_slot(slot, &mut copy)?;
        self.backing.write_block(block, &copy)?;
        self.written_back = Some((block, copy));
        Ok(slot)
    }

    /// The block's current bytes without a policy access (for a partial write).
    fn current(&mut self, block: u64, out: &mut [u8]) -> Result<()> {
        if let Some(&slot) = self.dirty.get(&block) {
            return self.nvram.read_slot(slot, out);
        }
        if let Some(data) = self.clean.get(&block) {
            out.copy_from_slice(data);
            return Ok(());
        }
        self.partial_reads += 1;
        self.backing.read_block(block, out)
    }

    fn read_block(&mut self, block: u64, out: &mut [u8]) -> Result<()> {
        if self.failed.is_some() {
            // The policy may no longer match the tiers: serve from the tiers directly.
            return self.current(block, out);
        }
        self.run(block, Op::Read, None, Some(out))
    }

    fn write_block(&mut self, block: u64, data: &[u8]) -> Result<()> {
        self.run(block, Op::Write, Some(data), None)
    }

    /// One access: the policy decides, the device carries the actions out in order.
    fn run(
        &mut self,
        block: u64,
        op: Op,
        data: Option<&[u8]>,
        mut out: Option<&mut [u8]>,
    ) -> Result<()> {
        let mut actions = std::mem::take(&mut self.actions);
        actions.clear();
        self.policy.access(
            Access {
                block: block as BlockId,
                op,
            },
            &mut actions,
        );
        self.counters.accesses += 1;
        let mut result = Ok(());
        for &action in &actions {
            self.counters.action(action);
            if let Err(e) = self.apply(action, data, out.as_deref_mut()) {
                tracing::error!(error = %e, ?action, "the cache device failed an action");
                self.failed = Some(e.to_string());
                result = Err(e);
                break;
            }
        }
        self.actions = actions;
        result
    }

    fn apply(&mut self, action: Action, data: Option<&[u8]>, out: Option<&mut [u8]>) -> Result<()> {
        let bug = |what: String| CacheError::Format {
            problem: format!("the policy and the cache disagree: {what}"),
        };
        match action {
            Action::ReadHit { block, tier } => {
                let block = u64::from(block);
                let out = out.ok_or_else(|| bug("a read hit on a write".into()))?;
                match tier {
                    Tier::Nvram => {
                        let slot = *self
                            .dirty
                            .get(&block)
                            .ok_or_else(|| bug(format!("block {block} is not in NVRAM")))?;
                        self.nvram.read_slot(slot, out)
                    }
                    Tier::Dram => {
                        let data = self
                            .clean
                            .get(&block)
                            .ok_or_else(|| bug(format!("block {block} is not in DRAM")))?;
                        out.copy_from_slice(data);
                        Ok(())
                    }
                }
            }
            Action::WriteHit { block } => {
                let block = u64::from(block);
                let data = data.ok_or_else(|| bug("a write hit on a read".into()))?;
                let slot = *self
                    .dirty
                    .get(&block)
                    .ok_or_else(|| bug(format!("block {block} is not in NVRAM")))?;
                // In place: the file system's write is atomic, and the entry already names
                // the block.
                self.nvram.write_slot(slot, data)
            }
            Action::Load { block } => {
                let block = u64::from(block);
                let mut copy = vec![0u8; BLOCK_BYTES as usize].into_boxed_slice();
                self.backing.read_block(block, &mut copy)?;
                if let Some(out) = out {
                    out.copy_from_slice(&copy);
                }
                self.clean.insert(block, copy);
                Ok(())
            }
            Action::Bypass { block } => {
                let out = out.ok_or_else(|| bug("a bypass on a write".into()))?;
                self.backing.read_block(u64::from(block), out)
            }
            Action::EvictClean { block } => {
                self.clean.remove(&u64::from(block));
                Ok(())
            }
            Action::PutDirty { block } => {
                let block = u64::from(block);
                let data = data.ok_or_else(|| bug("a dirty block from a read".into()))?;
                let slot = self
                    .free_slots
                    .pop()
                    .ok_or_else(|| bug(format!("no free NVRAM slot for block {block}")))?;
                // Data first, then the entry naming it: a crash between leaves the slot free.
                let placed = self.nvram.write_slot(slot, data).and_then(|()| {
                    self.seq += 1;
                    self.nvram.write_entry(
                        slot,
                        Entry::Dirty {
                            block,
                            seq: self.seq,
                        },
                    )
                });
                if let Err(e) = placed {
                    self.free_slots.push(slot);
                    return Err(e);
                }
                self.dirty.insert(block, slot);
                Ok(())
            }
            Action::WriteBack { block } => {
                let block = u64::from(block);
                let slot = *self
                    .dirty
                    .get(&block)
                    .ok_or_else(|| bug(format!("block {block} is not dirty")))?;
                let mut copy = vec![0u8; BLOCK_BYTES as usize].into_boxed_slice();
                self.nvram.read_slot(slot, &mut copy)?;
                // The backing store has the block durably before NVRAM lets it go.
                self.backing.write_block(block, &copy)?;
                self.backing.sync()?;
                self.nvram.write_entry(slot, Entry::Free)?;
                self.dirty.remove(&block);
                self.free_slots.push(slot);
                self.written_back = Some((block, copy));
                Ok(())
            }
            Action::MoveToDram { block } => {
                let block = u64::from(block);
                match self.written_back.take() {
                    Some((b, copy)) if b == block => {
                        self.clean.insert(block, copy);
                        Ok(())
                    }
                    _ => Err(bug(format!(
                        "block {block} moves to DRAM without a write-back"
                    ))),
                }
            }
            Action::DropDirty { block } => {
                let block = u64::from(block);
                let slot = *self
                    .dirty
                    .get(&block)
                    .ok_or_else(|| bug(format!("block {block} is not dirty")))?;
                self.nvram.write_entry(slot, Entry::Free)?;
                self.dirty.remove(&block);
                self.free_slots.push(slot);
                Ok(())
            }
            Action::WriteThrough { block } => {
                let data = data.ok_or_else(|| bug("a write-through of a read".into()))?;
                self.backing.write_block(u64::from(block), data)?;
                self.backing.sync()
            }
        }
    }
}
