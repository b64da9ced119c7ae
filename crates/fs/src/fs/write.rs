//! The write path: data into a persistent buffer, then one log record, then the overlay.

use std::sync::Arc;

use std::sync::atomic::Ordering;
use volume::Extent;

use super::state::{Inner, Slot};
use super::{MAX_FILE_SIZE, MAX_IO, now_ns};
use crate::apply::{self, applied};
use crate::buffers::{BufferSet, Reserve};
use crate::error::{FsError, Result};
use crate::extent_map::BLOCK;
use crate::inode::Inode;
use crate::progress::Pending;
use crate::range_lock::LockMode;
use crate::snapshot::write_growth_bound;

impl Inner {
    /// Waits until the slot's log area has a free record slot. Only the slot's thread
    /// appends, so the space stays free until it does. Called before taking a range lock:
    /// a writer never waits for the checkpoint while holding one (the checkpoint needs them).
    pub(crate) fn reserve_log(&self, slot: &Slot) -> Result<()> {
        loop {
            let log = slot.log();
            if log.pending() < log.capacity() {
                return Ok(());
            }
            drop(log);
            self.wait_for_progress()?;
        }
    }

    /// Commits data already persisted at `buffer` as the bytes `[offset, offset + len)` of
    /// `inode`: one log record, then the overlay. Takes the range lock for exactly that.
    pub(crate) fn commit(
        &self,
        slot: &Slot,
        inode: &Inode,
        offset: u64,
        len: u64,
        buffer: u64,
        set: Arc<BufferSet>,
    ) -> Result<()> {
        let time = now_ns();
        self.reserve_log(slot)?;
        let _range = inode.lock_range(offset, len, LockMode::Exclusive)?;
        let mut log = slot.log();
        // The ticket holds the checkpoint below this write's order until it is queued.
        let mut ticket = self.progress.begin(&slot.queue);
        let order = ticket.order();
        let record = log.append(inode.ino, offset, len, buffer, order, time)?;
        drop(log);
        applied(apply::write(
            inode,
            offset,
            len,
            buffer,
            order,
            record.mtime,
        ));
        self.pending_growth
            .fetch_add(write_growth_bound(offset, len), Ordering::Relaxed);
        ticket.queue(Pending {
            slot: slot.index,
            seq: record.sequence,
            order,
            ino: inode.ino,
            offset,
            len,
            set,
            mtime: record.mtime,
        });
        slot.counters.writes.fetch_add(1, Ordering::Relaxed);
        slot.counters.caller_bytes.fetch_add(len, Ordering::Relaxed);
        slot.counters
            .media_bytes
            .fetch_add(crate::log::RECORD_BYTES, Ordering::Relaxed);
        Ok(())
    }

    pub(crate) fn write_at(
        self: &Arc<Self>,
        inode: &Arc<Inode>,
        data: &[u8],
        offset: u64,
    ) -> Result<()> {
        let len = data.len() as u64;
        check_io(offset, len)?;
        if len == 0 {
            return Ok(());
        }
        let slot = self.slot()?;
        // Buffer space and the copy come before the range lock: the data is private to
        // this thread until its record is committed.
        // A write whose bytes, at the file's in-page offset, would not fit one preliminary
        // buffer gets its own (the pool could never place it).
        let (set, addr) = if offset % BLOCK + len > self.options.prelim_buffer_bytes {
            // Too large for the pool: a buffer of its own, at the file's in-page offset so
            // its whole blocks can be remapped.
            let extent = self.with_space(|| self.alloc_buffer(len + offset % BLOCK))?;
            (
                Arc::new(BufferSet::sealed_with(vec![extent], 1)),
                extent.start.raw() + offset % BLOCK,
            )
        } else {
            loop {
                let reserved = self.with_space(|| {
                    slot.pool.lock().expect("buffer pool").reserve(
                        &self.volume,
                        offset,
                        len,
                        &|bytes| self.alloc_buffer(bytes),
                    )
                })?;
                match reserved {
                    Reserve::Placed(p) => break (p.set, p.addr),
                    Reserve::Wait => self.wait_for_progress()?,
                }
            }
        };
        let (region, at) = self.region_at(addr)?;
        region.write_nt(at, data)?;
        // The data is durable before the record that points at it can be.
        self.volume.fence();
        slot.counters.media_bytes.fetch_add(len, Ordering::Relaxed);
        self.commit(&slot, inode, offset, len, addr, set)
    }

    /// Commits a caller-filled buffer (`len` bytes at the start of `extent`, which it now
    /// owns) as the bytes at `offset`. The caller checked the range ([`check_io`]) and took
    /// its slot before giving up the buffer.
    pub(crate) fn write_buffer(
        &self,
        slot: &Slot,
        inode: &Inode,
        extent: Extent,
        len: u64,
        offset: u64,
    ) -> Result<()> {
        // `Buffer::write` stored with `write_nt` (edges flushed, or msynced on ordinary
        // files): the fence makes the whole buffer durable before its record is written.
        self.volume.fence();
        slot.counters.media_bytes.fetch_add(len, Ordering::Relaxed);
        let set = Arc::new(BufferSet::sealed_with(vec![extent], 1));
        self.commit(slot, inode, offset, len, extent.start.raw(), set)
    }
}

pub(crate) fn check_io(offset: u64, len: u64) -> Result<()> {
    if len > MAX_IO {
        return Err(FsError::Invalid(format!(
            "{len} bytes in one call; at most {MAX_IO}"
        )));
    }
    match offset.checked_add(len) {
        Some(end) if end <= MAX_FILE_SIZE => Ok(()),
        _ => Err(FsError::Invalid(format!(
            "{len} bytes at offset {offset} end beyond the largest file ({MAX_FILE_SIZE})"
        ))),
    }
}
