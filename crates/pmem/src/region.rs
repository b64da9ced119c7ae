//! `Region`: a bounds-checked window onto persistent memory, and the only way to store to it.
//!
//! Stores are not durable until flushed and fenced: `write` and `store_u64` put data in the
//! CPU cache, `flush` writes lines back, `fence` orders everything before it, and `persist`
//! is flush then fence. `write_nt` bypasses the cache and needs only the fence. Data may
//! become durable at any moment before `persist`, so correctness must come from ordering and
//! checksums, never from "not flushed yet".
//!
//! References into the memory are handed out only for the duration of a closure, and only
//! to callers that keep stores out of the range meanwhile (`lend`, to send from it);
//! otherwise data is copied in and out, and 8-byte commit words are accessed atomically.

#![allow(
    unsafe_code,
    reason = "copies into and out of mapped persistent memory"
)]

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use crate::cpu::{self, CACHE_LINE, FlushInstruction};
use crate::error::{PmemError, Result};
use crate::mapping::Mapping;
use crate::trace::TraceState;

/// How stores to a region become durable.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PersistenceMode {
    /// DAX (device-DAX, or a DAX file mapped with `MAP_SYNC`): flushing cache lines and
    /// fencing makes data durable across power loss.
    CacheFlush(FlushInstruction),
    /// The platform flushes CPU caches on power loss (eADR): fences only, no flushes.
    Eadr,
    /// Emulated persistent memory on tmpfs: survives process crashes, not power loss or
    /// reboots. Flushes are still executed so costs match real persistent memory.
    Emulated(FlushInstruction),
    /// An ordinary file: `msync` writes pages back (slow, but durable on any disk).
    Msync,
    /// A recording region for crash tests: every store, flush and fence is traced.
    Traced,
}

impl std::fmt::Display for PersistenceMode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::CacheFlush(i) => write!(f, "dax ({}+sfence)", i.name()),
            Self::Eadr => f.write_str("dax, eADR (sfence only)"),
            Self::Emulated(i) => write!(
                f,
                "emulated ({}+sfence; survives process crashes, not reboots)",
                i.name()
            ),
            Self::Msync => f.write_str("msync"),
            Self::Traced => f.write_str("traced"),
        }
    }
}

pub(crate) enum Backing {
    Mapped(Mapping),
    Traced {
        state: Arc<std::sync::Mutex<TraceState>>,
        region: usize,
    },
}

pub(crate) struct Inner {
    pub(crate) backing: Backing,
    pub(crate) mode: PersistenceMode,
}

/// A window `[start, start + len)` onto one device's memory. Cheap to clone and to slice.
#[derive(Clone)]
pub struct Region {
    inner: Arc<Inner>,
    start: u64,
    len: u64,
}

impl std::fmt::Debug for Region {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Region")
            .field("start", &self.start)
            .field("len", &self.len)
            .field("mode", &self.inner.mode)
            .finish()
    }
}

impl Region {
    pub(crate) fn new(inner: Inner, len: u64) -> Self {
        Self {
            inner: Arc::new(inner),
            start: 0,
            len,
        }
    }

    /// Length in bytes.
    pub fn len(&self) -> u64 {
        self.len
    }

    /// True for a zero-length region.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// How stores to this region become durable.
    pub fn mode(&self) -> PersistenceMode {
        self.inner.mode
    }

    /// The sub-region `[offset, offset + len)` of this one.
    pub fn slice(&self, offset: u64, len: u64) -> Result<Region> {
        self.check(offset, len)?;
        Ok(Region {
            inner: Arc::clone(&self.inner),
            start: self.start + offset,
            len,
        })
    }

    /// Copies `buf.len()` bytes at `offset` into `buf`.
    pub fn read(&self, offset: u64, buf: &mut [u8]) -> Result<()> {
        let at = self.absolute(offset, buf.len() as u64)?;
        match &self.inner.backing {
            Backing::Mapped(mapping) => {
                // SAFETY: `absolute` checked the range lies inside the mapping; `buf` is a
                // distinct Rust buffer, so the ranges cannot overlap.
                unsafe {
                    std::ptr::copy_nonoverlapping(
                        mapping.base().add(at),
                        buf.as_mut_ptr(),
                        buf.len(),
                    );
                }
            }
            Backing::Traced { state, region } => {
                state.lock().expect("trace lock").read(*region, at, buf);
            }
        }
        Ok(())
    }

    /// Stores `data` at `offset` through the cache. Not durable until flushed and fenced.
    pub fn write(&self, offset: u64, data: &[u8]) -> Result<()> {
        let at = self.absolute(offset, data.len() as u64)?;
        match &self.inner.backing {
            Backing::Mapped(mapping) => {
                // SAFETY: range checked; `data` is a Rust slice, so it cannot overlap the
                // mapping, which no Rust reference points into.
                unsafe {
                    std::ptr::copy_nonoverlapping(
                        data.as_ptr(),
                        mapping.base().add(at),
                        data.len(),
                    );
                }
            }
            Backing::Traced { state, region } => {
                state
                    .lock()
                    .expect("trace lock")
                    .store(*region, at, data, false);
            }
        }
        Ok(())
    }

    /// Stores `data` at `offset` with non-temporal stores (bulk data); durable after the next
    /// `fence`. Unaligned edges go through the cache and are flushed here. On an ordinary
    /// file (`Msync`), where a fence persists nothing, the range is written back with `msync`
    /// before this returns.
    pub fn write_nt(&self, offset: u64, data: &[u8]) -> Result<()> {
        let at = self.absolute(offset, data.len() as u64)?;
        match &self.inner.backing {
            Backing::Mapped(mapping) => {
                // SAFETY: range checked; `data` is a Rust slice, so it cannot overlap the
                // mapping, which no Rust reference points into.
                unsafe { self.store_nt(mapping, at, data.as_ptr(), data.len()) }
            }
            Backing::Traced { state, region } => {
                state
                    .lock()
                    .expect("trace lock")
                    .store(*region, at, data, true);
                Ok(())
            }
        }
    }

    /// [`Region::write_nt`] that also returns the data checksum ([`crate::data_checksum`]) of
    /// the bytes stored, computed as they are stored (the copy's own registers, not a second
    /// read of `data`). `None` when it cannot vouch for one — the CPU lacks AVX2 or SSE4.2,
    /// the destination is not 8-byte aligned, or the region is an ordinary file (`Msync`,
    /// where the data is written back before this returns, so no checksum is needed): the
    /// bytes are stored all the same, as `write_nt` stores them.
    pub fn write_nt_summed(&self, offset: u64, data: &[u8]) -> Result<Option<u32>> {
        let at = self.absolute(offset, data.len() as u64)?;
        match &self.inner.backing {
            Backing::Mapped(mapping) if self.inner.mode != PersistenceMode::Msync => {
                // SAFETY: range checked; `data` is a Rust slice, so it cannot overlap the
                // mapping, which no Rust reference points into.
                let copied = unsafe {
                    cpu::copy_nontemporal_summed(mapping.base().add(at), data.as_ptr(), data.len())
                };
                let Some((edges, sum)) = copied else {
                    self.write_nt(offset, data)?;
                    return Ok(None);
                };
                if let Some(instruction) = flush_instruction(self.inner.mode) {
                    for (start, edge) in edges {
                        // SAFETY: each edge lies within the range just written.
                        unsafe {
                            cpu::flush_range(
                                instruction,
                                mapping.base() as usize + at + start,
                                edge,
                            );
                        }
                    }
                }
                Ok(Some(sum))
            }
            Backing::Mapped(_) => {
                self.write_nt(offset, data)?;
                Ok(None)
            }
            Backing::Traced { .. } => {
                self.write_nt(offset, data)?;
                Ok(Some(crate::data_checksum(data)))
            }
        }
    }

    /// Copies `len` bytes at `src_offset` of `src` to `offset` of this region as `write_nt`
    /// would store them (the ranges must not overlap). No reference into either mapping is
    /// made, so, unlike `lend`, this needs no promise about other stores.
    pub fn copy_nt_from(&self, offset: u64, src: &Region, src_offset: u64, len: u64) -> Result<()> {
        let from = src.absolute(src_offset, len)?;
        let at = self.absolute(offset, len)?;
        match (&self.inner.backing, &src.inner.backing) {
            (Backing::Mapped(to), Backing::Mapped(source)) => {
                let same = Arc::ptr_eq(&self.inner, &src.inner);
                assert!(
                    !same || from + len as usize <= at || at + len as usize <= from,
                    "copy_nt_from between overlapping ranges"
                );
                // SAFETY: both ranges were checked to lie in their mappings and do not
                // overlap (asserted for one mapping; two mappings are two devices).
                unsafe { self.store_nt(to, at, source.base().add(from), len as usize) }
            }
            _ => {
                let mut bytes = vec![0u8; len as usize];
                src.read(src_offset, &mut bytes)?;
                self.write_nt(offset, &bytes)
            }
        }
    }

    /// The non-temporal store path of `write_nt` for a mapped region: copy, flush the
    /// edges that went through the cache, and on `Msync` write the range back.
    ///
    /// # Safety
    /// `at..at + len` must lie inside `mapping` (this region's), and `src` must be valid for
    /// reads of `len` bytes that do not overlap it.
    unsafe fn store_nt(
        &self,
        mapping: &Mapping,
        at: usize,
        src: *const u8,
        len: usize,
    ) -> Result<()> {
        let mode = self.inner.mode;
        if mode == PersistenceMode::Msync {
            // SAFETY: the caller's contract.
            unsafe { std::ptr::copy_nonoverlapping(src, mapping.base().add(at), len) };
            return mapping.msync(at, len).map_err(|source| PmemError::Io {
                path: "mapped file".into(),
                action: "msync",
                source,
            });
        }
        // SAFETY: the caller's contract.
        let edges = unsafe { cpu::copy_nontemporal(mapping.base().add(at), src, len) };
        if let Some(instruction) = flush_instruction(mode) {
            for (start, edge) in edges {
                // SAFETY: each edge lies within the range just written.
                unsafe {
                    cpu::flush_range(instruction, mapping.base() as usize + at + start, edge);
                }
            }
        }
        Ok(())
    }

    /// Lends the bytes of several ranges, each `(region, offset, len)`, to `f` as slices of
    /// the mapped memory itself, in the order given — for sending persistent data to a
    /// socket without copying it first (traced regions lend copies). `f` should be short:
    /// the caller keeps writers out meanwhile.
    ///
    /// # Safety
    /// While `f` runs, nothing may store to any lent range: not through any `Region` of the
    /// device (every one of them can write), not through another mapping of the same memory,
    /// not from another thread or process. The slices are shared references, which promise
    /// that the bytes do not change. (To copy persistent data, use `read` or
    /// `copy_nt_from`, which need no such promise.)
    pub unsafe fn lend<R>(
        parts: &[(&Region, u64, u64)],
        f: impl FnOnce(&[&[u8]]) -> R,
    ) -> Result<R> {
        // Traced regions are read first (checking every range), so that mapped ranges can
        // then be lent in the same pass that collects the slices; `copies` stays empty (no
        // allocation) unless a region is traced.
        let mut copies: Vec<Vec<u8>> = Vec::new();
        for &(region, offset, len) in parts {
            let at = region.absolute(offset, len)?;
            if let Backing::Traced { state, region } = &region.inner.backing {
                let mut bytes = vec![0u8; len as usize];
                state
                    .lock()
                    .expect("trace lock")
                    .read(*region, at, &mut bytes);
                copies.push(bytes);
            }
        }
        let mut copies = copies.iter();
        let mut slices: Vec<&[u8]> = Vec::with_capacity(parts.len());
        for &(region, offset, len) in parts {
            match &region.inner.backing {
                Backing::Mapped(mapping) => {
                    let at = region.absolute(offset, len)?;
                    // SAFETY: `absolute` checked the range lies inside the mapping, which
                    // stays mapped while `parts` borrows its region (each holds an `Arc` of
                    // it); the slices do not outlive `f`, and the caller's contract keeps
                    // stores out of the range meanwhile, so the bytes do not change under
                    // the shared reference.
                    slices.push(unsafe {
                        std::slice::from_raw_parts(mapping.base().add(at), len as usize)
                    });
                }
                Backing::Traced { .. } => {
                    slices.push(copies.next().expect("one copy per traced part"));
                }
            }
        }
        Ok(f(&slices))
    }

    /// Sets `len` bytes at `offset` to `byte` (through the cache).
    pub fn fill(&self, offset: u64, len: u64, byte: u8) -> Result<()> {
        const CHUNK: usize = 64 * 1024;
        let chunk = vec![byte; CHUNK.min(len as usize)];
        let mut done = 0u64;
        while done < len {
            let n = chunk.len().min((len - done) as usize);
            self.write(offset + done, &chunk[..n])?;
            done += n as u64;
        }
        Ok(())
    }

    /// Stores one aligned 8-byte word atomically (the commit primitive).
    pub fn store_u64(&self, offset: u64, value: u64) -> Result<()> {
        let at = self.absolute_aligned(offset)?;
        match &self.inner.backing {
            Backing::Mapped(mapping) => {
                // SAFETY: in bounds and 8-byte aligned (mappings are page aligned); accessed
                // only atomically or by raw copies, never through a Rust reference to u64.
                let word = unsafe { &*mapping.base().add(at).cast::<AtomicU64>() };
                word.store(value.to_le(), Ordering::Release);
            }
            Backing::Traced { state, region } => {
                state
                    .lock()
                    .expect("trace lock")
                    .store(*region, at, &value.to_le_bytes(), false);
            }
        }
        Ok(())
    }

    /// Loads one aligned 8-byte word atomically.
    pub fn load_u64(&self, offset: u64) -> Result<u64> {
        let at = self.absolute_aligned(offset)?;
        match &self.inner.backing {
            Backing::Mapped(mapping) => {
                // SAFETY: as in `store_u64`.
                let word = unsafe { &*mapping.base().add(at).cast::<AtomicU64>() };
                Ok(u64::from_le(word.load(Ordering::Acquire)))
            }
            Backing::Traced { state, region } => {
                let mut bytes = [0u8; 8];
                state
                    .lock()
                    .expect("trace lock")
                    .read(*region, at, &mut bytes);
                Ok(u64::from_le_bytes(bytes))
            }
        }
    }

    /// Faults every page of the mapping in for writing (traced regions: nothing to do).
    pub(crate) fn populate(&self) -> std::io::Result<()> {
        match &self.inner.backing {
            Backing::Mapped(mapping) => mapping.populate(),
            Backing::Traced { .. } => Ok(()),
        }
    }

    /// Maps the pages of `[offset, offset + len)` for writing now, in one call, for memory
    /// about to be written page after page (a fresh buffer): on an emulated device each
    /// first store to a page not yet in this process's page tables is otherwise a page
    /// fault of its own — measured through the preload library (fio, random 4 KiB writes),
    /// one fault every 28 writes and 4 % of the writer's time. Only emulated devices, as
    /// [`crate::Device::prefault`]: an ordinary file's pages would be dirtied (and written
    /// back by the next `msync`), and DAX mappings fault in large pages. Nothing to do when
    /// the whole device was mapped at open. A hint: a kernel without the call (before 5.14)
    /// leaves the pages to fault in as they are written, and a range past the region's end
    /// stops at it.
    #[inline]
    pub fn populate_for_writes(&self, offset: u64, len: u64) {
        if !matches!(self.inner.mode, PersistenceMode::Emulated(_)) {
            return;
        }
        let Backing::Mapped(mapping) = &self.inner.backing else {
            return;
        };
        // Within the region: a hint past its end asks for what it holds.
        let len = len.min(self.len.saturating_sub(offset));
        let Ok(at) = self.absolute(offset, len) else {
            return;
        };
        if let Err(error) = mapping.populate_range(at, len as usize) {
            tracing::debug!(%error, "could not populate a range of an emulated device");
        }
    }

    /// Writes back the cache lines of `[offset, offset + len)`. Not ordered until `fence`.
    pub fn flush(&self, offset: u64, len: u64) -> Result<()> {
        let at = self.absolute(offset, len)?;
        match (&self.inner.backing, self.inner.mode) {
            (Backing::Mapped(mapping), PersistenceMode::Msync) => {
                mapping
                    .msync(at, len as usize)
                    .map_err(|source| PmemError::Io {
                        path: "mapped file".into(),
                        action: "msync",
                        source,
                    })?;
            }
            (Backing::Mapped(mapping), mode) => {
                if let Some(instruction) = flush_instruction(mode) {
                    // SAFETY: range checked to lie within the mapping.
                    unsafe {
                        cpu::flush_range(instruction, mapping.base() as usize + at, len as usize);
                    };
                }
            }
            (Backing::Traced { state, region }, _) => {
                state
                    .lock()
                    .expect("trace lock")
                    .flush(*region, at, len as usize);
            }
        }
        Ok(())
    }

    /// Orders every earlier store and flush before any later store (`sfence`): for a mapped
    /// region a fence of the whole CPU, for a traced one of its tracer. Layers above fence
    /// through [`fence_all`] (one fence for every device of a volume).
    pub(crate) fn fence(&self) {
        match &self.inner.backing {
            Backing::Mapped(_) => cpu::store_fence(),
            Backing::Traced { state, .. } => state.lock().expect("trace lock").fence(),
        }
    }

    /// `flush` then `fence`: `[offset, offset + len)` is durable on return.
    pub fn persist(&self, offset: u64, len: u64) -> Result<()> {
        self.flush(offset, len)?;
        self.fence();
        Ok(())
    }

    /// Absolute address of `offset` in the mapping, for NUMA page queries. `None` for traced
    /// regions.
    pub fn address_of(&self, offset: u64) -> Option<usize> {
        let at = self.absolute(offset, 0).ok()?;
        match &self.inner.backing {
            Backing::Mapped(mapping) => Some(mapping.base() as usize + at),
            Backing::Traced { .. } => None,
        }
    }

    fn check(&self, offset: u64, len: u64) -> Result<()> {
        match offset.checked_add(len) {
            Some(end) if end <= self.len => Ok(()),
            _ => Err(PmemError::OutOfBounds {
                offset,
                len,
                region_len: self.len,
            }),
        }
    }

    /// Checks the access and returns its offset from the start of the mapping.
    fn absolute(&self, offset: u64, len: u64) -> Result<usize> {
        self.check(offset, len)?;
        let at = self.start + offset;
        if let Backing::Mapped(mapping) = &self.inner.backing {
            debug_assert!(at + len <= mapping.len() as u64);
        }
        Ok(at as usize)
    }

    fn absolute_aligned(&self, offset: u64) -> Result<usize> {
        let at = self.absolute(offset, 8)?;
        if at % 8 != 0 {
            return Err(PmemError::Misaligned { offset: at as u64 });
        }
        Ok(at)
    }
}

/// Orders every earlier store and flush to any of `regions` before any later store: one CPU
/// store fence if any of them is mapped, and one fence per distinct tracer of traced ones.
/// A fence is a property of the CPU (and of a recording), not of one region, which is why
/// this is not a method.
pub fn fence_all<'a>(regions: impl IntoIterator<Item = &'a Region>) {
    let mut mapped = false;
    let mut tracers: Vec<&Arc<std::sync::Mutex<TraceState>>> = Vec::new();
    for region in regions {
        match &region.inner.backing {
            Backing::Mapped(_) => mapped = true,
            Backing::Traced { state, .. } => {
                if !tracers.iter().any(|t| Arc::ptr_eq(t, state)) {
                    tracers.push(state);
                }
            }
        }
    }
    if mapped {
        cpu::store_fence();
    }
    for state in tracers {
        state.lock().expect("trace lock").fence();
    }
}

fn flush_instruction(mode: PersistenceMode) -> Option<FlushInstruction> {
    match mode {
        PersistenceMode::CacheFlush(i) | PersistenceMode::Emulated(i) => Some(i),
        PersistenceMode::Eadr | PersistenceMode::Msync | PersistenceMode::Traced => None,
    }
}

/// Cache lines touched by `[offset, offset + len)`, as line-aligned offsets.
pub(crate) fn lines(offset: usize, len: usize) -> impl Iterator<Item = usize> {
    let first = offset - offset % CACHE_LINE;
    let end = offset + len;
    (first..end).step_by(CACHE_LINE)
}

#[cfg(test)]
mod tests {
    use crate::Tracer;

    use super::Region;

    #[test]
    fn lend_hands_out_the_ranges_in_order_and_checks_bounds() {
        let tracer = Tracer::new();
        let a = tracer.region_with((0..=255).collect());
        let b = tracer.region_with(vec![7; 16]);
        // SAFETY: nothing else holds these test regions, so nothing stores to them.
        let joined = unsafe {
            Region::lend(&[(&a, 250, 6), (&b, 3, 2), (&a, 0, 1)], |slices| {
                slices.concat()
            })
        }
        .unwrap();
        assert_eq!(joined, [250, 251, 252, 253, 254, 255, 7, 7, 0]);
        // SAFETY: as above.
        assert!(unsafe { Region::lend(&[(&a, 0, 1), (&b, 10, 7)], |_| ()) }.is_err());
    }

    #[test]
    fn fence_all_fences_each_tracer_once() {
        let (one, two) = (Tracer::new(), Tracer::new());
        let a = one.region_with(vec![0; 64]);
        let b = one.region_with(vec![0; 64]);
        let c = two.region_with(vec![0; 64]);
        super::fence_all([&a, &b, &c, &a]);
        assert_eq!((one.fence_count(), two.fence_count()), (1, 1));
        super::fence_all([&c]);
        assert_eq!((one.fence_count(), two.fence_count()), (1, 2));
    }

    #[test]
    fn copy_nt_from_copies_between_and_within_regions_and_refuses_overlap() {
        let tracer = Tracer::new();
        let a = tracer.region_with((0..=255).collect());
        let b = tracer.region_with(vec![0; 64]);
        b.copy_nt_from(8, &a, 100, 16).unwrap();
        let mut out = [0u8; 32];
        b.read(0, &mut out).unwrap();
        assert_eq!(&out[8..24], &(100..116).collect::<Vec<u8>>()[..]);
        assert_eq!(out[..8], [0; 8]);
        assert!(b.copy_nt_from(60, &a, 0, 8).is_err(), "past the end");
        assert!(
            b.copy_nt_from(0, &a, 250, 8).is_err(),
            "past the source's end"
        );
    }
}
