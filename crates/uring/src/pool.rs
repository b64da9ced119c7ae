//! The uDMA buffer pool: pinned (io_uring-registered) memory chosen by request size.
//!
//! - **small** (≤ 4 KiB): a few statically registered blocks — by default two for writes
//!   (double-buffered: one fills while the other is in flight) and one for reads. When they
//!   are busy, a small request takes medium space rather than waiting.
//! - **medium** (≤ m, default 4 MiB): registered chunks of m bytes, at most M bytes in all
//!   (default 64 MiB). A request gets one contiguous region when one is free, else a
//!   scatter/gather list across chunks. Released regions merge with free neighbours; a chunk
//!   that has been wholly free for longer than t (default 5 s) is unregistered and freed.
//!   A request of exactly m fits one chunk, so "large" starts above m.
//! - **large** (> m): memory registered for the request and unregistered after it.
//!
//! Registration goes through a [`Registrar`] (the ring's sparse buffer table). When it fails
//! (`RLIMIT_MEMLOCK`, old kernels) the memory is used unregistered: one warning, a counter,
//! and the I/O still happens.

#![allow(
    unsafe_code,
    reason = "buffers are raw segments of pinned memory the kernel DMAs into"
)]

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::error::{Result, UringError};
use crate::memory::{ALIGN, Memory};

/// Registers memory in (and removes it from) slots of a fixed-buffer table.
pub trait Registrar {
    /// Puts `memory` in table slot `slot`.
    fn register(&mut self, slot: u16, memory: &Memory) -> std::io::Result<()>;
    /// Empties table slot `slot`.
    fn unregister(&mut self, slot: u16) -> std::io::Result<()>;
}

/// Pool parameters (the uDMA paper's m, M and t, and the small tier's blocks).
#[derive(Debug, Clone)]
pub struct PoolConfig {
    /// Largest small request, and the size of each small block.
    pub small_bytes: usize,
    /// Small blocks for writes (double buffering needs two).
    pub small_write_blocks: usize,
    /// Small blocks for reads.
    pub small_read_blocks: usize,
    /// m: medium chunk size; also the largest medium request.
    pub chunk_bytes: usize,
    /// M: most medium memory registered at once.
    pub max_medium_bytes: usize,
    /// t: how long a wholly free chunk stays registered.
    pub idle: Duration,
    /// Large requests registered at once (table slots kept for them).
    pub large_slots: u16,
    /// Register memory at all (false gives the unregistered baseline).
    pub register: bool,
    /// Every request gets fresh memory registered for it alone (the per-request baseline).
    pub per_request: bool,
    /// NUMA node for the pool's memory (`None`: wherever the kernel puts it).
    pub node: Option<u32>,
}

impl Default for PoolConfig {
    fn default() -> Self {
        Self {
            small_bytes: 4096,
            small_write_blocks: 2,
            small_read_blocks: 1,
            chunk_bytes: 4 << 20,
            max_medium_bytes: 64 << 20,
            idle: Duration::from_secs(5),
            large_slots: 64,
            register: true,
            per_request: false,
            node: None,
        }
    }
}

impl PoolConfig {
    fn validate(&self) -> Result<()> {
        let bad = |problem: String| Err(UringError::Config(problem));
        if self.small_bytes == 0 || !self.small_bytes.is_multiple_of(ALIGN) {
            return bad(format!(
                "small block size {} is not a positive multiple of {ALIGN}",
                self.small_bytes
            ));
        }
        if self.chunk_bytes < self.small_bytes
            || !self.chunk_bytes.is_multiple_of(ALIGN)
            || self.chunk_bytes > 1 << 30
        {
            return bad(format!(
                "chunk size {} must be a multiple of {ALIGN} between the small size and 1 GiB",
                self.chunk_bytes
            ));
        }
        if self.max_medium_bytes < self.chunk_bytes {
            return bad(format!(
                "M ({}) is smaller than one chunk ({})",
                self.max_medium_bytes, self.chunk_bytes
            ));
        }
        if self.table_slots() > u32::from(u16::MAX) {
            return bad("more than 65535 fixed-buffer slots needed; raise m or lower M".into());
        }
        Ok(())
    }

    fn small_blocks(&self) -> usize {
        self.small_write_blocks + self.small_read_blocks
    }

    fn max_chunks(&self) -> usize {
        self.max_medium_bytes / self.chunk_bytes
    }

    /// Fixed-buffer table slots the pool uses: small blocks, then chunks, then large.
    pub fn table_slots(&self) -> u32 {
        (self.small_blocks() + self.max_chunks()) as u32 + u32::from(self.large_slots)
    }
}

/// Which tier a buffer came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Tier {
    /// A static small block.
    Small,
    /// Regions of medium chunks.
    Medium,
    /// Registered for this request only.
    Large,
    /// Not registered: registration failed or the pool is exhausted or disabled.
    Unregistered,
}

/// One contiguous piece of a buffer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Segment {
    /// First byte.
    pub address: *mut u8,
    /// Length (a multiple of 4096).
    pub len: usize,
    /// The registered buffer it lies in: (table slot, that buffer's first byte).
    pub fixed: Option<u16>,
}

/// Where a buffer's memory came from. Small and medium buffers hold an `Arc` of the pool
/// memory they point into, so it stays mapped even if the pool is dropped first; large and
/// unregistered ones own theirs.
#[derive(Debug)]
enum Origin {
    Small {
        index: usize,
        _memory: Arc<Memory>,
    },
    /// (chunk, offset, length, the chunk's memory) per region.
    Medium(Vec<(usize, usize, usize, Arc<Memory>)>),
    Large(Memory, Option<u16>),
    Unregistered(Memory),
}

/// A buffer for one request: one or more segments, owned by whoever holds it.
#[derive(Debug)]
pub struct IoBuf {
    segments: Vec<Segment>,
    len: usize,
    tier: Tier,
    origin: Origin,
}

// SAFETY: the segments point into memory this buffer keeps mapped (`origin`), and
// only the holder of the `IoBuf` touches them.
unsafe impl Send for IoBuf {}

impl IoBuf {
    /// A buffer of plain, unregistered memory outside any pool.
    pub fn unregistered(len: usize, node: Option<u32>) -> Result<Self> {
        let memory = Memory::new(len, node)?;
        let segment = Segment {
            address: memory.base(),
            len: memory.len(),
            fixed: None,
        };
        Ok(Self {
            segments: vec![segment],
            len,
            tier: Tier::Unregistered,
            origin: Origin::Unregistered(memory),
        })
    }

    /// Requested length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// True for a zero-length buffer (never handed out).
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The tier it came from.
    pub fn tier(&self) -> Tier {
        self.tier
    }

    /// Its segments, in order; their lengths sum to at least `len()`.
    pub fn segments(&self) -> &[Segment] {
        &self.segments
    }

    /// Copies `data` (at most `len()` bytes) into the buffer from its start.
    pub fn fill_from(&mut self, data: &[u8]) {
        assert!(
            data.len() <= self.len,
            "{} bytes into a buffer of {}",
            data.len(),
            self.len
        );
        let mut done = 0;
        for segment in &self.segments {
            let n = segment.len.min(data.len() - done);
            // SAFETY: `segment` lies in memory this buffer owns exclusively, n <= its length.
            unsafe { crate::memory::copy_in(segment.address, &data[done..done + n]) };
            done += n;
            if done == data.len() {
                break;
            }
        }
    }

    /// Copies the first `len` bytes of `source` into this buffer, segment to segment (one
    /// copy, no temporary).
    pub fn copy_from(&mut self, source: &IoBuf, len: usize) {
        assert!(
            len <= self.len && len <= source.len,
            "{len} bytes between buffers of {} and {}",
            source.len,
            self.len
        );
        let (mut to, mut from) = (0usize, 0usize);
        let (mut to_at, mut from_at) = (0usize, 0usize);
        let mut done = 0;
        while done < len {
            let target = self.segments[to];
            let origin = source.segments[from];
            let n = (target.len - to_at)
                .min(origin.len - from_at)
                .min(len - done);
            // SAFETY: both ranges lie inside segments their buffers own exclusively, and two
            // distinct buffers never share memory.
            unsafe {
                std::ptr::copy_nonoverlapping(
                    origin.address.add(from_at),
                    target.address.add(to_at),
                    n,
                );
            }
            done += n;
            to_at += n;
            from_at += n;
            if to_at == target.len {
                to += 1;
                to_at = 0;
            }
            if from_at == origin.len {
                from += 1;
                from_at = 0;
            }
        }
    }

    /// Copies the buffer's first `out.len()` bytes into `out`.
    pub fn copy_to(&self, out: &mut [u8]) {
        assert!(
            out.len() <= self.len,
            "{} bytes out of a buffer of {}",
            out.len(),
            self.len
        );
        let mut done = 0;
        for segment in &self.segments {
            let n = segment.len.min(out.len() - done);
            // SAFETY: as in `fill_from`; nothing writes the buffer while we hold it.
            unsafe { crate::memory::copy_out(segment.address, &mut out[done..done + n]) };
            done += n;
            if done == out.len() {
                break;
            }
        }
    }
}

#[derive(Debug)]
struct SmallBlock {
    memory: Arc<Memory>,
    slot: Option<u16>,
    for_write: bool,
    busy: bool,
}

#[derive(Debug)]
struct Chunk {
    memory: Arc<Memory>,
    slot: Option<u16>,
    /// Free regions: offset → length, never adjacent (merged on release).
    free: BTreeMap<usize, usize>,
    free_bytes: usize,
    /// When it last became wholly free.
    idle_since: Option<Instant>,
}

/// Counters of what the pool did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PoolStats {
    /// Buffers handed out per tier: small, medium, large, unregistered.
    pub served: [u64; 4],
    /// Registrations that failed (the memory was used unregistered).
    pub registration_failures: u64,
    /// Medium requests that found the pool full (served unregistered, or refused by `try_get`).
    pub exhausted: u64,
    /// Medium requests served as scatter/gather lists over several regions.
    pub scattered: u64,
    /// Chunks registered / released after idling.
    pub chunks_added: u64,
    /// See `chunks_added`.
    pub chunks_released: u64,
}

/// The three-tier pool.
#[derive(Debug)]
pub struct BufferPool {
    config: PoolConfig,
    small: Vec<SmallBlock>,
    chunks: Vec<Option<Chunk>>,
    large_slots_free: Vec<u16>,
    stats: PoolStats,
    warned: bool,
}

impl BufferPool {
    /// A pool with its small blocks allocated (and registered if `config.register`).
    pub fn new(config: PoolConfig, registrar: &mut dyn Registrar) -> Result<Self> {
        config.validate()?;
        let mut pool = Self {
            small: Vec::new(),
            chunks: (0..config.max_chunks()).map(|_| None).collect(),
            large_slots_free: Vec::new(),
            stats: PoolStats::default(),
            warned: false,
            config,
        };
        let first_large = (pool.config.small_blocks() + pool.config.max_chunks()) as u16;
        pool.large_slots_free = (first_large..first_large + pool.config.large_slots)
            .rev()
            .collect();
        for index in 0..pool.config.small_blocks() {
            let memory = Memory::new(pool.config.small_bytes, pool.config.node)?;
            let slot = pool.try_register(registrar, index as u16, &memory);
            pool.small.push(SmallBlock {
                memory: Arc::new(memory),
                slot,
                for_write: index < pool.config.small_write_blocks,
                busy: false,
            });
        }
        Ok(pool)
    }

    /// The configuration.
    pub fn config(&self) -> &PoolConfig {
        &self.config
    }

    /// What the pool has done.
    pub fn stats(&self) -> PoolStats {
        self.stats
    }

    /// Bytes of medium chunks held now.
    pub fn medium_bytes(&self) -> usize {
        self.chunks.iter().flatten().count() * self.config.chunk_bytes
    }

    /// A buffer of `len` bytes for a read (`for_write` false) or write; when the medium tier
    /// is full, an unregistered buffer (counted), so the I/O always proceeds.
    pub fn get(
        &mut self,
        len: usize,
        for_write: bool,
        registrar: &mut dyn Registrar,
    ) -> Result<IoBuf> {
        match self.try_get(len, for_write, registrar)? {
            Some(buf) => Ok(buf),
            None => self.unregistered(len),
        }
    }

    /// Like `get`, but `None` when the medium tier is full (the caller may wait for
    /// buffers to come back and retry).
    pub fn try_get(
        &mut self,
        len: usize,
        for_write: bool,
        registrar: &mut dyn Registrar,
    ) -> Result<Option<IoBuf>> {
        if len == 0 {
            return Err(UringError::Config("a zero-length buffer".into()));
        }
        self.trim(Instant::now(), registrar);
        if self.config.per_request {
            return self.large(len, registrar).map(Some);
        }
        if !self.config.register {
            let memory_len = len.div_ceil(ALIGN) * ALIGN;
            return if memory_len <= self.config.chunk_bytes {
                self.medium(len, registrar)
            } else {
                self.unregistered(len).map(Some)
            };
        }
        if len <= self.config.small_bytes
            && let Some(index) = self
                .small
                .iter()
                .position(|b| !b.busy && b.for_write == for_write)
        {
            let block = &mut self.small[index];
            block.busy = true;
            self.stats.served[0] += 1;
            let segment = Segment {
                address: block.memory.base(),
                len: block.memory.len(),
                fixed: block.slot,
            };
            return Ok(Some(IoBuf {
                segments: vec![segment],
                len,
                tier: Tier::Small,
                origin: Origin::Small {
                    index,
                    _memory: Arc::clone(&block.memory),
                },
            }));
        }
        if len <= self.config.chunk_bytes {
            return self.medium(len, registrar);
        }
        self.large(len, registrar).map(Some)
    }

    /// Returns a buffer to the pool.
    pub fn put(&mut self, buf: IoBuf, registrar: &mut dyn Registrar) {
        match buf.origin {
            Origin::Small { index, .. } => {
                assert!(self.small[index].busy, "small block {index} returned twice");
                self.small[index].busy = false;
            }
            Origin::Medium(regions) => {
                let now = Instant::now();
                for (chunk, offset, len, _) in regions {
                    let chunk = self.chunks[chunk]
                        .as_mut()
                        .expect("a region's chunk lives while it is lent");
                    release_region(&mut chunk.free, offset, len);
                    chunk.free_bytes += len;
                    assert!(
                        chunk.free_bytes <= chunk.memory.len(),
                        "chunk freed more than it holds"
                    );
                    if chunk.free_bytes == chunk.memory.len() {
                        chunk.idle_since = Some(now);
                    }
                }
            }
            Origin::Large(memory, slot) => {
                if let Some(slot) = slot {
                    if let Err(error) = registrar.unregister(slot) {
                        tracing::warn!(%error, slot, "unregistering a large buffer failed");
                    }
                    self.large_slots_free.push(slot);
                }
                drop(memory);
            }
            Origin::Unregistered(memory) => drop(memory),
        }
        self.trim(Instant::now(), registrar);
    }

    /// Unregisters and frees chunks that have been wholly free for longer than t.
    pub fn trim(&mut self, now: Instant, registrar: &mut dyn Registrar) {
        for entry in &mut self.chunks {
            let idle = entry.as_ref().is_some_and(|c| {
                c.free_bytes == c.memory.len()
                    && c.idle_since
                        .is_some_and(|since| now.duration_since(since) >= self.config.idle)
            });
            if idle {
                let chunk = entry.take().expect("checked");
                if let Some(slot) = chunk.slot
                    && let Err(error) = registrar.unregister(slot)
                {
                    tracing::warn!(%error, slot, "unregistering an idle chunk failed");
                }
                self.stats.chunks_released += 1;
            }
        }
    }

    fn medium(&mut self, len: usize, registrar: &mut dyn Registrar) -> Result<Option<IoBuf>> {
        let need = len.div_ceil(ALIGN) * ALIGN;
        let region = self.chunks.iter().enumerate().find_map(|(index, chunk)| {
            let chunk = chunk.as_ref()?;
            let (&offset, _) = chunk.free.iter().find(|&(_, &free)| free >= need)?;
            Some((index, offset))
        });
        let region = match region {
            Some(found) => Some(found),
            None => match self.chunks.iter().position(Option::is_none) {
                Some(index) => {
                    self.add_chunk(index, registrar)?;
                    Some((index, 0))
                }
                None => None,
            },
        };
        if let Some((index, offset)) = region {
            let segment = self.take(index, offset, need);
            self.stats.served[if segment.fixed.is_some() { 1 } else { 3 }] += 1;
            return Ok(Some(IoBuf {
                segments: vec![segment],
                len,
                tier: if segment.fixed.is_some() {
                    Tier::Medium
                } else {
                    Tier::Unregistered
                },
                origin: Origin::Medium(vec![(index, offset, need, self.chunk_memory(index))]),
            }));
        }
        // No single region: gather the largest free regions if together they suffice.
        let total_free: usize = self.chunks.iter().flatten().map(|c| c.free_bytes).sum();
        if total_free < need {
            self.stats.exhausted += 1;
            return Ok(None);
        }
        let mut candidates: Vec<(usize, usize, usize)> = self
            .chunks
            .iter()
            .enumerate()
            .filter_map(|(i, c)| c.as_ref().map(|c| (i, c)))
            .flat_map(|(i, c)| c.free.iter().map(move |(&offset, &free)| (i, offset, free)))
            .collect();
        candidates.sort_by(|a, b| b.2.cmp(&a.2).then(a.0.cmp(&b.0)).then(a.1.cmp(&b.1)));
        let mut segments = Vec::new();
        let mut regions = Vec::new();
        let mut remaining = need;
        for (index, offset, free) in candidates {
            let take = free.min(remaining);
            segments.push(self.take(index, offset, take));
            regions.push((index, offset, take, self.chunk_memory(index)));
            remaining -= take;
            if remaining == 0 {
                break;
            }
        }
        self.stats.served[1] += 1;
        self.stats.scattered += 1;
        let tier = if segments.iter().all(|s| s.fixed.is_some()) {
            Tier::Medium
        } else {
            Tier::Unregistered
        };
        Ok(Some(IoBuf {
            segments,
            len,
            tier,
            origin: Origin::Medium(regions),
        }))
    }

    fn chunk_memory(&self, index: usize) -> Arc<Memory> {
        Arc::clone(&self.chunks[index].as_ref().expect("a live chunk").memory)
    }

    /// Carves `len` bytes at `offset` out of a free region of chunk `index`.
    fn take(&mut self, index: usize, offset: usize, len: usize) -> Segment {
        let chunk = self.chunks[index]
            .as_mut()
            .expect("taking from a live chunk");
        let free = chunk
            .free
            .remove(&offset)
            .expect("taking from a free region");
        assert!(free >= len, "region of {free} bytes cannot give {len}");
        if free > len {
            chunk.free.insert(offset + len, free - len);
        }
        chunk.free_bytes -= len;
        chunk.idle_since = None;
        // SAFETY-free arithmetic: `offset + len <= chunk length`, so the address stays inside.
        let address = chunk.memory.base().wrapping_add(offset);
        Segment {
            address,
            len,
            fixed: chunk.slot,
        }
    }

    fn add_chunk(&mut self, index: usize, registrar: &mut dyn Registrar) -> Result<()> {
        let memory = Memory::new(self.config.chunk_bytes, self.config.node)?;
        let slot = if self.config.register {
            self.try_register(
                registrar,
                (self.config.small_blocks() + index) as u16,
                &memory,
            )
        } else {
            None
        };
        let len = memory.len();
        self.chunks[index] = Some(Chunk {
            memory: Arc::new(memory),
            slot,
            free: BTreeMap::from([(0, len)]),
            free_bytes: len,
            idle_since: None,
        });
        self.stats.chunks_added += 1;
        Ok(())
    }

    fn large(&mut self, len: usize, registrar: &mut dyn Registrar) -> Result<IoBuf> {
        let memory = Memory::new(len, self.config.node)?;
        let slot = match self.large_slots_free.pop() {
            Some(slot) => {
                let registered = self.try_register(registrar, slot, &memory);
                if registered.is_none() {
                    self.large_slots_free.push(slot);
                }
                registered
            }
            None => None,
        };
        let segment = Segment {
            address: memory.base(),
            len: memory.len(),
            fixed: slot,
        };
        let tier = if slot.is_some() {
            Tier::Large
        } else {
            Tier::Unregistered
        };
        self.stats.served[if slot.is_some() { 2 } else { 3 }] += 1;
        Ok(IoBuf {
            segments: vec![segment],
            len,
            tier,
            origin: Origin::Large(memory, slot),
        })
    }

    fn unregistered(&mut self, len: usize) -> Result<IoBuf> {
        let memory = Memory::new(len, self.config.node)?;
        self.stats.served[3] += 1;
        let segment = Segment {
            address: memory.base(),
            len: memory.len(),
            fixed: None,
        };
        Ok(IoBuf {
            segments: vec![segment],
            len,
            tier: Tier::Unregistered,
            origin: Origin::Unregistered(memory),
        })
    }

    fn try_register(
        &mut self,
        registrar: &mut dyn Registrar,
        slot: u16,
        memory: &Memory,
    ) -> Option<u16> {
        if !self.config.register {
            return None;
        }
        match registrar.register(slot, memory) {
            Ok(()) => Some(slot),
            Err(error) => {
                self.stats.registration_failures += 1;
                if !self.warned {
                    self.warned = true;
                    tracing::warn!(
                        %error,
                        "registering I/O buffers failed (RLIMIT_MEMLOCK?); continuing with unregistered buffers"
                    );
                }
                None
            }
        }
    }
}

/// Adds `[offset, offset + len)` to a free map, merging with adjacent free regions.
fn release_region(free: &mut BTreeMap<usize, usize>, mut offset: usize, mut len: usize) {
    if let Some((&before, &before_len)) = free.range(..offset).next_back() {
        assert!(
            before + before_len <= offset,
            "region {offset}+{len} overlaps free space (double release)"
        );
        if before + before_len == offset {
            free.remove(&before);
            offset = before;
            len += before_len;
        }
    }
    if let Some((&after, &after_len)) = free.range(offset..).next() {
        assert!(
            offset + len <= after,
            "region {offset}+{len} overlaps free space (double release)"
        );
        if offset + len == after {
            free.remove(&after);
            len += after_len;
        }
    }
    free.insert(offset, len);
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Records registrations; fails when told to.
    #[derive(Debug, Default)]
    struct FakeTable {
        slots: BTreeMap<u16, usize>,
        fail: bool,
    }

    impl Registrar for FakeTable {
        fn register(&mut self, slot: u16, memory: &Memory) -> std::io::Result<()> {
            if self.fail {
                return Err(std::io::Error::from_raw_os_error(libc::ENOMEM));
            }
            assert!(
                self.slots.insert(slot, memory.base() as usize).is_none(),
                "slot {slot} registered twice"
            );
            Ok(())
        }
        fn unregister(&mut self, slot: u16) -> std::io::Result<()> {
            assert!(self.slots.remove(&slot).is_some(), "slot {slot} was empty");
            Ok(())
        }
    }

    fn config() -> PoolConfig {
        PoolConfig {
            chunk_bytes: 64 << 10,
            max_medium_bytes: 256 << 10,
            idle: Duration::from_millis(0),
            ..PoolConfig::default()
        }
    }

    /// Buffers of every tier stay usable when the pool that gave them is dropped first: each
    /// keeps the memory it points into mapped (before, `fill_from` wrote to unmapped memory).
    #[test]
    fn buffers_outlive_their_pool() {
        let mut table = FakeTable::default();
        let mut pool = long_idle_pool(&mut table);
        let mut small = pool.get(4096, true, &mut table).unwrap();
        let mut regions: Vec<IoBuf> = fragment(&mut pool, &mut table);
        let mut gathered = pool.get(64 << 10, true, &mut table).unwrap();
        let mut large = pool.get(1 << 20, true, &mut table).unwrap();
        assert_eq!(
            (small.tier(), regions[0].tier(), large.tier()),
            (Tier::Small, Tier::Medium, Tier::Large)
        );
        assert!(gathered.segments().len() > 1, "a scatter/gather buffer");
        drop(pool);
        for buf in [&mut small, &mut gathered, &mut large]
            .into_iter()
            .chain(regions.iter_mut())
        {
            let data: Vec<u8> = (0..buf.len()).map(|i| (i * 7 + 3) as u8).collect();
            buf.fill_from(&data);
            let mut back = vec![0u8; buf.len()];
            buf.copy_to(&mut back);
            assert!(back == data);
        }
    }

    /// A pool whose chunks stay registered while a test runs.
    fn long_idle_pool(table: &mut FakeTable) -> BufferPool {
        let config = PoolConfig {
            idle: Duration::from_secs(60),
            ..config()
        };
        BufferPool::new(config, table).unwrap()
    }

    /// Fills the medium tier with 16 KiB buffers and frees every other one: eight 16 KiB
    /// holes and no larger region. Returns the buffers still held.
    fn fragment(pool: &mut BufferPool, table: &mut FakeTable) -> Vec<IoBuf> {
        let held: Vec<IoBuf> = (0..16)
            .map(|_| pool.get(16 << 10, true, table).unwrap())
            .collect();
        let mut kept = Vec::new();
        for (i, buf) in held.into_iter().enumerate() {
            if i % 2 == 0 {
                pool.put(buf, table);
            } else {
                kept.push(buf);
            }
        }
        kept
    }

    #[test]
    fn tiers_by_size_and_small_blocks_fall_through_when_busy() {
        let mut table = FakeTable::default();
        let mut pool = long_idle_pool(&mut table);
        assert_eq!(
            table.slots.len(),
            3,
            "two write blocks and one read block registered up front"
        );
        let read = pool.get(512, false, &mut table).unwrap();
        assert_eq!(read.tier(), Tier::Small);
        let second_read = pool.get(4096, false, &mut table).unwrap();
        assert_eq!(
            second_read.tier(),
            Tier::Medium,
            "the single read block is busy"
        );
        let w1 = pool.get(4096, true, &mut table).unwrap();
        let w2 = pool.get(4096, true, &mut table).unwrap();
        assert_eq!(
            (w1.tier(), w2.tier()),
            (Tier::Small, Tier::Small),
            "double-buffered writes"
        );
        let big = pool.get(65 << 10, true, &mut table).unwrap();
        assert_eq!(big.tier(), Tier::Large);
        assert!(table.slots.len() >= 5);
        for buf in [read, second_read, w1, w2, big] {
            pool.put(buf, &mut table);
        }
        assert_eq!(pool.stats().served, [3, 1, 1, 0]);
    }

    #[test]
    fn regions_never_overlap_merge_on_release_and_respect_the_cap() {
        let mut table = FakeTable::default();
        let mut pool = long_idle_pool(&mut table);
        let mut held = Vec::new();
        // 256 KiB cap of 64 KiB chunks: sixteen 16 KiB buffers fill it exactly.
        for _ in 0..16 {
            held.push(pool.get(16 << 10, true, &mut table).unwrap());
        }
        assert_eq!(pool.medium_bytes(), 256 << 10, "M is the cap");
        let mut ranges: Vec<(usize, usize)> = held
            .iter()
            .flat_map(|b| b.segments().iter().map(|s| (s.address as usize, s.len)))
            .collect();
        ranges.sort_unstable();
        assert!(
            ranges.windows(2).all(|w| w[0].0 + w[0].1 <= w[1].0),
            "overlapping buffers"
        );
        assert!(
            pool.try_get(8 << 10, true, &mut table).unwrap().is_none(),
            "full: try_get refuses"
        );
        let fallback = pool.get(8 << 10, true, &mut table).unwrap();
        assert_eq!(fallback.tier(), Tier::Unregistered, "full: get falls back");
        assert_eq!(pool.stats().exhausted, 2);
        pool.put(fallback, &mut table);

        // Free every other buffer: 8 holes of 16 KiB, no 32 KiB region anywhere.
        let mut kept = Vec::new();
        for (i, buf) in held.into_iter().enumerate() {
            if i % 2 == 0 {
                pool.put(buf, &mut table);
            } else {
                kept.push(buf);
            }
        }
        let scattered = pool.get(48 << 10, true, &mut table).unwrap();
        assert_eq!(
            scattered.segments().len(),
            3,
            "a scatter/gather list over three holes"
        );
        assert_eq!(pool.stats().scattered, 1);
        pool.put(scattered, &mut table);
        for buf in kept {
            pool.put(buf, &mut table);
        }
        // Everything back: each chunk is one merged region again.
        let whole = pool.get(64 << 10, true, &mut table).unwrap();
        assert_eq!(
            whole.segments().len(),
            1,
            "released regions merged back into a whole chunk"
        );
        pool.put(whole, &mut table);
    }

    #[test]
    fn idle_chunks_are_released_and_unregistered() {
        let mut table = FakeTable::default();
        let mut pool = BufferPool::new(config(), &mut table).unwrap();
        let buf = pool.get(32 << 10, false, &mut table).unwrap();
        assert_eq!(table.slots.len(), 4, "three small blocks and one chunk");
        pool.put(buf, &mut table);
        assert_eq!(
            pool.medium_bytes(),
            0,
            "t = 0: the chunk goes as soon as it is wholly free"
        );
        assert_eq!(table.slots.len(), 3);
        assert_eq!(pool.stats().chunks_released, 1);
    }

    #[test]
    fn failed_registration_still_serves_buffers() {
        let mut table = FakeTable {
            fail: true,
            ..FakeTable::default()
        };
        let mut pool = BufferPool::new(config(), &mut table).unwrap();
        let small = pool.get(4096, true, &mut table).unwrap();
        let medium = pool.get(32 << 10, true, &mut table).unwrap();
        let large = pool.get(1 << 20, true, &mut table).unwrap();
        assert!(small.segments()[0].fixed.is_none());
        assert_eq!(
            (medium.tier(), large.tier()),
            (Tier::Unregistered, Tier::Unregistered)
        );
        assert!(pool.stats().registration_failures >= 5);
        for buf in [small, medium, large] {
            pool.put(buf, &mut table);
        }
    }

    #[test]
    fn data_round_trips_through_scattered_segments() {
        let mut table = FakeTable::default();
        let mut pool = BufferPool::new(config(), &mut table).unwrap();
        let mut buf = pool.get(40_000, true, &mut table).unwrap();
        let data: Vec<u8> = (0..40_000u32).map(|i| (i % 251) as u8).collect();
        buf.fill_from(&data);
        let mut back = vec![0u8; 40_000];
        buf.copy_to(&mut back);
        assert_eq!(back, data);
        pool.put(buf, &mut table);
    }

    #[test]
    fn copies_between_differently_segmented_buffers() {
        let mut table = FakeTable::default();
        let mut pool = long_idle_pool(&mut table);
        // Fragment the medium tier so one buffer is scattered.
        let kept = fragment(&mut pool, &mut table);
        let mut scattered = pool.get(40_000, true, &mut table).unwrap();
        assert!(scattered.segments().len() > 1);
        let mut plain = IoBuf::unregistered(40_000, None).unwrap();
        let data: Vec<u8> = (0..40_000u32).map(|i| (i * 7 % 253) as u8).collect();
        plain.fill_from(&data);
        scattered.copy_from(&plain, 40_000);
        let mut back = IoBuf::unregistered(40_000, None).unwrap();
        back.copy_from(&scattered, 40_000);
        let mut out = vec![0u8; 40_000];
        back.copy_to(&mut out);
        assert_eq!(out, data);
        pool.put(scattered, &mut table);
        for buf in kept {
            pool.put(buf, &mut table);
        }
    }

    #[test]
    fn bad_settings_are_refused() {
        let mut table = FakeTable::default();
        let config = PoolConfig {
            chunk_bytes: 1000,
            ..PoolConfig::default()
        };
        assert!(matches!(
            BufferPool::new(config, &mut table),
            Err(UringError::Config(_))
        ));
    }
}
