//! The write path: data into persistent buffers (one, or pieces when free memory is
//! fragmented), then one log record per buffer, appended as one group, then the overlay.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use smallvec::{SmallVec, smallvec};
use volume::Extent;

use super::state::{Inner, Slot, Wait, partial_pages};
use super::{MAX_FILE_SIZE, MAX_IO, write_time};
use crate::apply::{self, applied};
use crate::buffers::{BufferSet, NO_PAGE, RECYCLE_RUN_BLOCKS, Reserve, Taken};
use crate::error::{FsError, Result};
use crate::extent_map::BLOCK;
use crate::inode::Inode;
use crate::log::Piece as LogPiece;
use crate::pieces::alloc_halving;
use crate::progress::{Pending, Remapped};
use crate::range_lock::LockMode;
use crate::snapshot::write_growth_bound;

/// Logged records the checkpoint may have to catch up on before writers give way to it
/// ([`Inner::give_way_to_checkpoint`]): four of its gathering thresholds, about a
/// millisecond of its work.
const GIVE_WAY_BACKLOG: u64 = 4 * crate::progress::GATHER_RECORDS as u64;
/// A writer past [`GIVE_WAY_BACKLOG`] gives way on one write in this many (its own count).
const GIVE_WAY_EVERY: u64 = 16;

/// The largest piece whose data is checksummed as it is copied, so that its record can share
/// the data's fence ([`crate::log::Piece::data_sum`]); a larger piece is copied without and
/// fenced before its record. The `crc32` chains beside the copy cost about 13 ns a KiB (the
/// copy's port runs short of them: one thread's 2 MiB writes made 18–19 GB/s with them, 26
/// without), the second fence about 0.2 µs: they break even near 14 KiB. Measured with
/// `bench fs --ops randwrite --threads 1`, builds alternated: writer CPU a write 0.94 µs
/// summed against 1.04 unsummed at 8 KiB, 1.56 against 1.46 at 16 KiB, 2.5 against 2.3 at 32
/// KiB; 64 KiB writes 16.1–16.7 → 19.5–20.6 GB/s, 2 MiB 18.1–19.1 → 25.9–26.2 GB/s.
const SUMMED_PIECE_MAX: u64 = 12 * 1024;

/// Where part of a write's data goes: `len` bytes from offset `at` of the write, at the global
/// address `addr`, in buffer set `set`.
struct Placed {
    at: u64,
    len: u64,
    addr: u64,
    set: Arc<BufferSet>,
    /// The place of the piece's first page in a set of recycled pages (its other pages'
    /// places follow), or [`NO_PAGE`].
    page: u32,
}

/// Where a write's data goes: nearly always one piece, kept inline (no allocation per
/// write on the hot path).
type Placement = SmallVec<[Placed; 1]>;

/// All `len` bytes of a write in one buffer, at `addr` in `set` (its page `page` of a set
/// of recycled pages, or [`NO_PAGE`]).
fn whole(len: u64, addr: u64, set: Arc<BufferSet>, page: u32) -> Placement {
    smallvec![Placed {
        at: 0,
        len,
        addr,
        set,
        page,
    }]
}

impl Inner {
    /// Waits until the slot's log area has `count` free record slots. Only the slot's thread
    /// appends, so the space stays free until it does. Called before taking a range lock:
    /// a writer never waits for the checkpoint while holding one (the checkpoint needs them).
    pub(crate) fn reserve_log(&self, slot: &Slot, count: u64) -> Result<()> {
        loop {
            let log = slot.log();
            if log.pending() + count <= log.capacity() {
                return Ok(());
            }
            drop(log);
            self.wait_for_progress(Wait::Log)?;
        }
    }

    /// Commits data already persisted at `buffer` as the bytes `[offset, offset + len)` of
    /// `inode`: one log record, then the overlay.
    pub(crate) fn commit(
        &self,
        slot: &Slot,
        inode: &Inode,
        offset: u64,
        len: u64,
        buffer: u64,
        set: Arc<BufferSet>,
    ) -> Result<()> {
        self.commit_pieces(
            slot,
            inode,
            offset,
            len,
            whole(len, buffer, set, NO_PAGE),
            write_time(inode),
            None,
        )
    }

    /// Commits a write of `[offset, offset + len)` of `inode` into `pieces` (in order,
    /// covering it): one log record per piece, appended as one group, then the overlay.
    /// Takes the range lock for exactly the write. `data`: the write's bytes, which the
    /// pieces do not hold yet (stored behind the records' fence, their checksums in the
    /// records); `None`: the pieces hold them, durable.
    #[allow(clippy::too_many_arguments)]
    fn commit_pieces(
        &self,
        slot: &Slot,
        inode: &Inode,
        offset: u64,
        len: u64,
        pieces: Placement,
        time: u64,
        data: Option<&[u8]>,
    ) -> Result<()> {
        debug_assert_eq!(pieces.iter().map(|p| p.len).sum::<u64>(), len);
        self.give_way_to_checkpoint(slot);
        self.reserve_log(slot, pieces.len() as u64)?;
        let _range = self.lock_range(inode, offset, len, LockMode::Exclusive)?;
        self.append_and_queue(slot, inode, offset, len, pieces, time, true, data)
    }

    /// Commits data persisted in `set` from `buffer` as the `ranges` (`(offset from
    /// `offset`, length)`, in order, the same offsets from `buffer`) of `inode`, one record
    /// each, as one group, for a caller that holds the range lock exclusively and has
    /// reserved a record slot per range, with the records' time `time`, leaving the file's
    /// times as they are (a rewrite of the file's own bytes: [`crate::defrag`]).
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn commit_locked(
        &self,
        slot: &Slot,
        inode: &Inode,
        offset: u64,
        ranges: &[(u64, u64)],
        buffer: u64,
        set: &Arc<BufferSet>,
        time: u64,
    ) -> Result<()> {
        let pieces: Placement = ranges
            .iter()
            .map(|&(at, len)| Placed {
                at,
                len,
                addr: buffer + at,
                set: Arc::clone(set),
                page: NO_PAGE,
            })
            .collect();
        let len = ranges.iter().map(|&(_, len)| len).sum();
        self.append_and_queue(slot, inode, offset, len, pieces, time, false, None)
    }

    /// Appends the records of a write whose range lock the caller holds, updates the
    /// overlay and queues them for the checkpoint. A `caller`'s write moves the file's
    /// times and counts as written by a caller; a rewrite does neither. `data`: as
    /// [`Inner::commit_pieces`] takes it.
    #[allow(clippy::too_many_arguments)]
    fn append_and_queue(
        &self,
        slot: &Slot,
        inode: &Inode,
        offset: u64,
        len: u64,
        pieces: Placement,
        time: u64,
        caller: bool,
        data: Option<&[u8]>,
    ) -> Result<()> {
        let count = pieces.len() as u64;
        let mut log = slot.log();
        // The ticket holds the checkpoint below this write's orders until it is queued.
        let mut ticket = self.progress.begin(&slot.queue);
        let orders = ticket.orders(count);
        // From the data's first store to the records' fence: no locked instruction (an
        // atomic read-modify-write, a lock taken or let go, an `Arc` cloned or dropped). On
        // x86 each one waits, as a fence does, for the non-temporal stores before it to
        // drain, so one here would cost what the fence it saves costs.
        let mut log_pieces: SmallVec<[LogPiece; 1]> = SmallVec::with_capacity(pieces.len());
        let mut unsummed = false;
        for p in &pieces {
            let data_sum = match data {
                Some(data) => {
                    let (region, at) = self.region_at(p.addr)?;
                    let bytes = &data[p.at as usize..(p.at + p.len) as usize];
                    let sum = if p.len <= SUMMED_PIECE_MAX {
                        region.write_nt_summed(at, bytes)?
                    } else {
                        region.write_nt(at, bytes)?;
                        None
                    };
                    unsummed |= sum.is_none();
                    sum
                }
                None => None,
            };
            log_pieces.push(LogPiece {
                offset: offset + p.at,
                length: p.len,
                buffer: p.addr,
                data_sum,
            });
        }
        if unsummed {
            // A piece the copy did not checksum (over `SUMMED_PIECE_MAX`) or could not (a
            // buffer off 8-byte alignment, a CPU without AVX2, an ordinary file): the data is
            // made durable before the records, which then carry no checksum.
            self.volume.fence();
            for piece in &mut log_pieces {
                piece.data_sum = None;
            }
        }
        let records = log.append_group(inode.ino, &log_pieces, orders.start, time)?;
        if let Some(last) = records.last() {
            slot.counters.complete(last.sequence);
        }
        drop(log);
        let touched = if caller { time } else { 0 };
        // The record is durable: a single-block overwrite may now become the file's block
        // at once (the checkpoint then has only the mapping to record).
        let remapped = match &pieces[..] {
            [p] if caller
                && self.writer_remaps(inode, offset, len, p.addr)
                && slot.counters.may_remap(p.page == NO_PAGE) =>
            {
                let remapped = inode.overlay.remap_block(offset, p.addr);
                if remapped.is_some() {
                    slot.counters.count_remap(p.page == NO_PAGE);
                }
                remapped.map(|replaced| Remapped {
                    page: p.addr,
                    replaced,
                })
            }
            _ => None,
        };
        if remapped.is_some() {
            applied(apply::file_written(inode, offset, len, touched));
        } else {
            for r in &records {
                applied(apply::write(
                    inode, r.offset, r.length, r.buffer, r.order, touched,
                ));
            }
        }
        slot.counters.log_growth(
            records
                .iter()
                .map(|r| write_growth_bound(r.offset, r.length))
                .sum(),
        );
        if self.checksums.is_some() {
            self.pending_pages.fetch_add(
                records
                    .iter()
                    .map(|r| partial_pages(r.offset, r.length))
                    .sum(),
                Ordering::Relaxed,
            );
        }
        ticket.queue_all(records.iter().zip(pieces).map(|(r, p)| Pending {
            slot: slot.index,
            page: p.page,
            seq: r.sequence,
            order: r.order,
            ino: inode.ino,
            offset: r.offset,
            len: r.length,
            set: p.set,
            mtime: r.mtime,
            remapped,
        }));
        if caller {
            slot.counters.count_write(len);
        }
        slot.counters.count_media(crate::log::RECORD_BYTES * count);
        Ok(())
    }

    /// Whether the writer of `[offset, offset + len)` from `page` (holding its exclusive
    /// range lock, its record durable) may remap it into the file's block table itself
    /// instead of the overlay ([`crate::overlay::Overlay::remap_block`]): one whole block,
    /// in a page of its own, of a file no process maps (a mapped file's blocks stay where
    /// the mappings point; a new mapping counts itself before it takes the range lock), on a
    /// file system without data checksums (whose blocks are never stored to in place, nor
    /// remapped unchecked), while the checkpoint finds room to recycle what such writes
    /// replace and space is not tight ([`Inner::writers_remap`]). The block must be mapped
    /// in a chunk the checkpoint shared with the writers; `remap_block` checks that.
    fn writer_remaps(&self, inode: &Inode, offset: u64, len: u64, page: u64) -> bool {
        len == BLOCK
            && offset.is_multiple_of(BLOCK)
            && page.is_multiple_of(BLOCK)
            && self.checksums.is_none()
            && self.writers_remap.load(Ordering::Relaxed)
            && inode.mapped.load(Ordering::Acquire) == 0
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
        // The lines this write will store to that another writer may hold (its range-lock
        // table, the overlay shard it remaps under, the order counter), asked for now, while
        // the buffer is found: with two writers of random blocks the other CPU wrote each
        // last about half the time. In a leaf profile of two writers over the whole file,
        // taking the range lock fell from 46 to 33 ns a write; the order counter's `lock
        // xadd` stayed at about 40 (the other writer takes that line back first). Measured
        // with `bench fs --bs 4K --threads 1,2`, builds alternated, medians of six pairs:
        // one thread 1.51 → 1.53 M writes a second, two 2.40 M both. Within this machine's
        // noise, and free.
        self.range_locks.prefetch(inode.ino, offset);
        inode.overlay.prefetch(offset);
        self.progress.prefetch_order();
        // Buffer space comes before the range lock (a writer may wait for the checkpoint
        // for it, and never waits holding a range lock, which the checkpoint needs).
        let pieces = match self.place(&slot, offset, len) {
            Err(e) if e.kind() == crate::ErrorKind::NoSpace => {
                self.place_in_pieces(&slot, offset, len)?
            }
            placed => placed?,
        };
        let time = write_time(inode);
        slot.counters.count_media(len);
        if self.checksums.is_some() {
            // Data checksums are noted per block as the data is stored, which takes locks:
            // the data is stored and fenced first, its records then carry no checksum.
            for piece in &pieces {
                let (region, at) = self.region_at(piece.addr)?;
                let bytes = &data[piece.at as usize..(piece.at + piece.len) as usize];
                region.write_nt(at, bytes)?;
                self.note_filled(piece.addr, bytes)?;
            }
            self.volume.fence();
            return self.commit_pieces(&slot, inode, offset, len, pieces, time, None);
        }
        // The data is stored under the range lock, right before its records, behind their
        // fence, with its checksum in them ([`crate::log::Piece::data_sum`]): one fence
        // per write, not one for the data and another for the records. A 4 KiB write
        // spends most of its time waiting for its stores to drain; with two fences it
        // waited twice (measured with `bench fs --bs 4K --threads 1,2`, three alternated
        // runs: 1.09–1.11 M writes a second on one thread and 1.67–1.71 M on two with two
        // fences; 1.37–1.43 M and 2.04–2.08 M with one). Pieces over `SUMMED_PIECE_MAX`
        // are the exception: their checksum would cost more than the fence it saves.
        self.commit_pieces(&slot, inode, offset, len, pieces, time, Some(data))
    }

    /// A writer far ahead of the background checkpoint gives up the rest of its time slice
    /// now and then (`sched_yield`), so that a checkpoint waiting for a CPU behind it runs.
    ///
    /// Where writers and the checkpoint share too few CPUs and the checkpoint cannot be given
    /// a higher priority (see [`crate::FsOptions::checkpoint_boost`]: that needs a privilege),
    /// the scheduler otherwise lets writers run whole slices while the checkpoint waits; the
    /// backlog then grows to tens of thousands of records, each write's overlay update gets
    /// dearer, and writers end up waiting for buffers while a CPU idles. Measured without the
    /// privilege (`bench fs --bs 4K --threads 2`, two CPUs, alternated runs): 0.93–1.28 M
    /// IOPS and 66–412 waits for buffers per run without giving way, 1.17–1.44 M and none with
    /// it (one run of seven at 0.70 M), about what the raised priority gives. A yield with
    /// nothing else to run on this CPU returns at once; one in [`GIVE_WAY_EVERY`] writes
    /// bounds what that costs when the checkpoint is busy elsewhere.
    fn give_way_to_checkpoint(&self, slot: &Slot) {
        if self.options.checkpoint == crate::CheckpointMode::Background
            && slot
                .counters
                .writes
                .load(Ordering::Relaxed)
                .is_multiple_of(GIVE_WAY_EVERY)
            && self.pending() > GIVE_WAY_BACKLOG
        {
            self.counters.gave_way.fetch_add(1, Ordering::Relaxed);
            std::thread::yield_now();
        }
    }

    /// One buffer for a write: in the slot's pool, or — a write whose bytes, at the file's
    /// in-page offset, would not fit one preliminary buffer — one of its own; a short run
    /// of whole blocks goes into recycled pages while there are any
    /// ([`Inner::place_in_recycled`]).
    fn place(&self, slot: &Slot, offset: u64, len: u64) -> Result<Placement> {
        let blocks = len / BLOCK;
        if offset.is_multiple_of(BLOCK)
            && len.is_multiple_of(BLOCK)
            && (2..RECYCLE_RUN_BLOCKS).contains(&blocks)
        {
            return self.place_in_recycled(slot, offset, len);
        }
        self.place_in_buffer(slot, offset, len)
    }

    /// [`Inner::place`] in the slot's pool or a buffer of the write's own.
    fn place_in_buffer(&self, slot: &Slot, offset: u64, len: u64) -> Result<Placement> {
        let skew = offset % BLOCK;
        if skew + len > self.options.prelim_buffer_bytes {
            // At the file's in-page offset, so its whole blocks can be remapped.
            let extent = self.with_space(|| self.alloc_write_buffer(len + skew))?;
            let addr = extent.start.raw() + skew;
            return Ok(whole(
                len,
                addr,
                Arc::new(BufferSet::sealed_with(smallvec![extent], 1)),
                NO_PAGE,
            ));
        }
        let reserve = || {
            let spare = || self.spare_bytes();
            slot.pool.lock().expect("buffer pool").reserve(
                &self.volume,
                offset,
                len,
                &spare,
                &|bytes| self.alloc_write_buffer(bytes),
                &|most| self.take_recycled(slot, most),
            )
        };
        loop {
            let reserved = match reserve() {
                // Free memory is there, in pieces smaller than this write (an aged volume:
                // random overwrites free blocks wherever they were). Waiting for the
                // checkpoint would not make a larger piece appear — it frees blocks where
                // they are — so the write goes into pieces at once (`write_at`). Twice the
                // write: the published free figure is approximate.
                Err(e)
                    if e.kind() == crate::ErrorKind::NoSpace && self.spare_bytes() >= 2 * len =>
                {
                    return Err(e);
                }
                Err(e) if e.kind() == crate::ErrorKind::NoSpace => self.with_space(reserve)?,
                other => other?,
            };
            match reserved {
                Reserve::Placed(p) => {
                    if p.page != NO_PAGE {
                        slot.counters.count_recycled(1);
                    }
                    return Ok(whole(len, p.addr, p.set, p.page));
                }
                Reserve::Wait => self.wait_for_progress(Wait::Buffers)?,
            }
        }
    }

    /// A write of 2 to 15 whole blocks, in runs of recycled pages while the pool or the
    /// recycled lists have them, the rest (all of it, when they have none) in a buffer.
    ///
    /// The checkpoint frees the blocks such a write replaces into the recycled lists, run
    /// by run (runs under [`RECYCLE_RUN_BLOCKS`] would otherwise cut the volume's free
    /// memory into small pieces), and it remaps a write from a buffer into the file only
    /// while the lists have room for what that frees. Before, only single-block writes took
    /// pages from the lists: with random 8–60 KiB overwrites the lists filled, and the
    /// checkpoint copied every such write into the file's blocks — write amplification
    /// 1.93–1.96, and the checkpoint spending more time a write than its writer (`bench fs
    /// --bs 8K,16K,32K,48K --threads 1`: 1.06, 1.99, 3.64 and 4.98 µs a write against the
    /// writer's 0.98, 1.47, 2.15 and 2.92).
    ///
    /// Each run is a piece of the write, with a record of its own in the write's one group.
    /// Taken page by page, a 32 KiB write was eight records and a copy into eight scattered
    /// pages (its writer 4.4–5.0 µs against 2.2 in a buffer); overwrites of one size at the
    /// places of earlier ones of that size free runs of it, which the next such writes take
    /// whole: one record and one copy each (`bench fs --bs 16K` and `--bs 32K`, one thread
    /// alone on a fresh file: 1.3–1.5 and 2.0–2.3 µs a write).
    fn place_in_recycled(&self, slot: &Slot, offset: u64, len: u64) -> Result<Placement> {
        let mut pieces = Placement::new();
        match self.fill_in_recycled(slot, offset, len, &mut pieces) {
            Ok(()) => Ok(pieces),
            Err(e) => {
                // The pages go back: no record will point at them.
                for p in pieces {
                    if p.set.release() {
                        p.set.reclaim(&self.volume)?;
                    }
                }
                Err(e)
            }
        }
    }

    /// [`Inner::place_in_recycled`]'s pieces, into `pieces` (what it placed stays there
    /// when it fails).
    fn fill_in_recycled(
        &self,
        slot: &Slot,
        offset: u64,
        len: u64,
        pieces: &mut Placement,
    ) -> Result<()> {
        {
            let mut pool = slot.pool.lock().expect("buffer pool");
            let mut done = 0;
            while done < len {
                let Some((p, blocks)) =
                    pool.place_recycled(&self.volume, (len - done) / BLOCK, &|most| {
                        self.take_recycled(slot, most)
                    })?
                else {
                    break;
                };
                slot.counters.count_recycled(blocks);
                pieces.push(Placed {
                    at: done,
                    len: blocks * BLOCK,
                    addr: p.addr,
                    set: p.set,
                    page: p.page,
                });
                done += blocks * BLOCK;
            }
        }
        let done: u64 = pieces.iter().map(|p| p.len).sum();
        if done < len {
            let rest = self.place_in_buffer(slot, offset + done, len - done)?;
            pieces.extend(rest.into_iter().map(|p| Placed {
                at: p.at + done,
                ..p
            }));
        }
        Ok(())
    }

    /// Up to `most` recycled pages for the writer of `slot`, on its CPU's node.
    fn take_recycled(&self, slot: &Slot, most: usize) -> Taken {
        self.recycled
            .take(self.volume.current_node(), slot.index, most)
    }

    /// Buffers for a write that no single free extent can hold: pieces of the largest
    /// power-of-two size free memory still has, down to one block, over the write's blocks
    /// of the file — so each piece holds whole file blocks at their in-page offsets (a
    /// piece of one block fits any free block, and whole blocks stay remappable). At most
    /// half the slot's log area (a group of records must fit it); `NoSpace` beyond that, or
    /// when the free blocks beyond the reserve do not add up to the write.
    fn place_in_pieces(&self, slot: &Slot, offset: u64, len: u64) -> Result<Placement> {
        let most = (slot.log().capacity() / 2).clamp(1, u64::from(u16::MAX)) as usize;
        let skew = offset % BLOCK;
        let span = skew + len;
        self.with_space(|| {
            let mut pieces = Vec::new();
            let placed = alloc_halving(span, BLOCK, most, &mut pieces, |_, n| self.alloc_buffer(n));
            if let Err(e) = placed {
                for piece in pieces {
                    self.volume.free(piece.item)?;
                }
                return Err(e);
            }
            Ok(pieces
                .into_iter()
                .map(|p| {
                    // The write's bytes in this piece (the first starts `skew` in).
                    let from = p.at.max(skew);
                    Placed {
                        at: from - skew,
                        len: p.at + p.len - from,
                        addr: p.item.start.raw() + (from - p.at),
                        set: Arc::new(BufferSet::sealed_with(smallvec![p.item], 1)),
                        page: NO_PAGE,
                    }
                })
                .collect())
        })
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
        self.note_filled_in_place(extent.start.raw(), len)?;
        self.volume.fence();
        slot.counters.count_media(len);
        let set = Arc::new(BufferSet::sealed_with(smallvec![extent], 1));
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
        _ => Err(FsError::TooLarge(format!(
            "{len} bytes at offset {offset} end beyond the largest file ({MAX_FILE_SIZE})"
        ))),
    }
}
