//! Shared mappings, DAX-style: a caller maps a file's own blocks — the persistent memory the
//! extent map names — into its address space, so stores through the mapping are stores to
//! the file. The file system's side of the contract:
//!
//! - **Setting up** ([`File::map_shared`]): every logged write is folded into the file first
//!   (a full checkpoint), and the holes of the range are filled with zeroed blocks (one
//!   journaled batch of map entries, as the checkpoint writes), so every page of the range
//!   within the file's size has a block to map. The file counts as mapped from then on.
//! - **While mapped** ([`Inode::mapped`] > 0) a block of the file never moves: the
//!   checkpoint copies logged writes into the blocks the file has instead of remapping
//!   buffers in (only a hole still gets a fresh page: nothing maps a hole), a write is
//!   checkpointed before it returns (so the mapping sees it), and a punched hole is written
//!   as zeros instead of unmapping blocks. Truncation still frees the blocks past the new
//!   size: the caller must first stop mapping them (the preload library maps the pages
//!   past the end of the file to an empty file, so they fault with `SIGBUS`).
//! - **Durability** ([`File::sync_mapped`]): stores through a mapping are plain stores to
//!   persistent memory, durable once their cache lines are written back — `msync` and
//!   `munmap` do that for the range. They are not atomic and not ordered with the file's
//!   logged writes; after a crash a block holds whatever of them reached the media.
//! - Volumes with data checksums refuse shared mappings: a store through a mapping would
//!   leave the block's checksum behind it. (The preload library then maps a copy of the
//!   file in memory, written back through ordinary writes.)

use std::sync::Arc;
use std::sync::atomic::Ordering;

use super::WHOLE_FILE;
use super::handles::File;
use super::state::Inner;
use crate::error::{FsError, Result};
use crate::extent_map::BLOCK;
use crate::inode::Inode;
use crate::journal::{MapEntry, MetaOp};
use crate::range_lock::LockMode;
use crate::snapshot::RUN_BYTES;

/// Part of a shared mapping: `len` bytes of the file from `offset` are the persistent
/// memory at process address `addr` (a device's mapping in this process).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MappedRun {
    /// File offset (a multiple of 4 KiB).
    pub offset: u64,
    /// Bytes (a multiple of 4 KiB).
    pub len: u64,
    /// Address of the first byte in this process.
    pub addr: usize,
}

impl File {
    /// Prepares `[offset, offset + len)` of the file for a shared mapping and returns where
    /// its blocks are, for the part within the file's size (rounded up to whole blocks): see
    /// the module documentation. `offset` must be a multiple of 4 KiB. Every successful call
    /// counts the file as mapped until a matching [`File::unmap_shared`].
    pub fn map_shared(&self, offset: u64, len: u64) -> Result<Vec<MappedRun>> {
        let inner = &self.fs.inner;
        inner.check_running()?;
        if inner.checksums.is_some() {
            return Err(FsError::NotSupported(
                "shared mappings of a volume with data checksums (a store through a mapping \
                 would bypass the block's checksum)"
                    .into(),
            ));
        }
        if !offset.is_multiple_of(BLOCK) || len == 0 {
            return Err(FsError::Invalid(format!(
                "a shared mapping of {len} bytes at offset {offset} (the offset must be a \
                 multiple of {BLOCK}, the length above 0)"
            )));
        }
        self.inode.mapped.fetch_add(1, Ordering::AcqRel);
        let runs = self.prepare(offset, len);
        if runs.is_err() {
            self.inode.mapped.fetch_sub(1, Ordering::AcqRel);
        }
        runs
    }

    fn prepare(&self, offset: u64, len: u64) -> Result<Vec<MappedRun>> {
        let inner = &self.fs.inner;
        // Fold every logged write in: from now on the checkpoint copies in place.
        inner.drain()?;
        inner.fill_holes(&self.inode, offset, len)?;
        let end = offset.saturating_add(len);
        let _range = inner.lock_range(&self.inode, offset, end - offset, LockMode::Shared)?;
        let size = self.inode.size.load(Ordering::Acquire);
        let last = end.min(size).div_ceil(BLOCK);
        let extents = self.inode.extents.read().expect("extent map");
        let mut runs: Vec<MappedRun> = Vec::new();
        for block in offset / BLOCK..last {
            let Some(addr) = extents.get(block) else {
                // Filled above; only a truncation and regrowth racing this call leaves one.
                return Err(FsError::Invalid(format!(
                    "block {block} of inode {} became a hole while being mapped",
                    self.inode.ino
                )));
            };
            let (region, at) = inner.region_at(addr)?;
            let Some(address) = region.address_of(at) else {
                return Err(FsError::NotSupported(
                    "shared mappings of a volume that is not memory-mapped".into(),
                ));
            };
            match runs.last_mut() {
                Some(run) if run.addr + run.len as usize == address => run.len += BLOCK,
                _ => runs.push(MappedRun {
                    offset: block * BLOCK,
                    len: BLOCK,
                    addr: address,
                }),
            }
        }
        Ok(runs)
    }

    /// Ends one shared mapping of the file (after its stores were synced).
    pub fn unmap_shared(&self) {
        let was = self.inode.mapped.fetch_sub(1, Ordering::AcqRel);
        debug_assert!(was > 0, "unmap_shared without map_shared");
    }

    /// Whether the file has shared mappings.
    pub fn is_mapped(&self) -> bool {
        self.inode.mapped.load(Ordering::Acquire) > 0
    }

    /// Makes stores through a shared mapping to `[offset, offset + len)` durable: writes back
    /// the cache lines of the file's blocks there (`msync`, `munmap`).
    pub fn sync_mapped(&self, offset: u64, len: u64) -> Result<()> {
        let inner = &self.fs.inner;
        inner.check_running()?;
        let end = offset
            .saturating_add(len)
            .min(self.inode.size.load(Ordering::Acquire));
        if offset >= end {
            return Ok(());
        }
        let extents = self.inode.extents.read().expect("extent map");
        for block in offset / BLOCK..end.div_ceil(BLOCK) {
            if let Some(addr) = extents.get(block) {
                let (region, at) = inner.region_at(addr)?;
                region.flush(at, BLOCK)?;
            }
        }
        drop(extents);
        inner.volume.fence();
        Ok(())
    }
}

impl Inner {
    /// Gives every hole of `[offset, offset + len)` within the file's size a zeroed block:
    /// one journaled batch of map entries per attempt (no size change, nothing retired).
    fn fill_holes(self: &Arc<Self>, inode: &Arc<Inode>, offset: u64, len: u64) -> Result<()> {
        let slot = self.slot()?;
        loop {
            // As truncation: no batch half done, writers and readers off the file.
            let batch = self.lock_batch();
            let range = self.lock_range(inode, 0, WHOLE_FILE, LockMode::Exclusive)?;
            let gate = self.gate_shared();
            let size = inode.size.load(Ordering::Acquire);
            let last = offset.saturating_add(len).min(size).div_ceil(BLOCK);
            let mut extents = inode.extents.write().expect("extent map");
            let holes = super::namespace::holes(&extents, offset / BLOCK, last);
            if holes.is_empty() {
                return Ok(());
            }
            let allocated = self.zeroed_runs(&holes)?;
            let maps: Vec<MapEntry> = allocated
                .iter()
                .map(|run| MapEntry {
                    ino: inode.ino,
                    file_block: run.file_block,
                    blocks: run.blocks,
                    addr: run.addr,
                })
                .collect();
            let op = MetaOp::Batch {
                maps: maps.clone(),
                sizes: Vec::new(),
                retired: Vec::new(),
            };
            if self.journal(&slot, &op)? {
                let mut replaced = Vec::new();
                for m in &maps {
                    extents.map(m.file_block, m.blocks, m.addr, &mut replaced);
                }
                debug_assert!(replaced.is_empty(), "only holes are filled");
                self.grow_snapshot(2 * RUN_BYTES * maps.len() as u64);
                return Ok(());
            }
            self.free_runs(&allocated)?;
            drop(extents);
            drop(gate);
            drop(range);
            drop(batch);
            self.wait_for_snapshot()?;
        }
    }
}
