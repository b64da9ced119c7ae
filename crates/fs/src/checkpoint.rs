//! The background checkpoint: moves logged writes into their files, in global order, in
//! batches; writes snapshots when journals fill; and runs the unmount.
//!
//! A batch takes the oldest records of every thread's queue, below a watermark no writer can
//! still take an order under (each writer publishes a lower bound of the order it is about to
//! take). For each record (in file order when that cannot change what is remapped:
//! [`checkpoint_once`]), under a range lock covering it (one for up to [`GROUP_RECORDS`]
//! neighbouring records in a 2 MiB stretch of a file), it takes the parts of the record
//! no newer write replaced (the overlay knows) and
//! - remaps whole 4 KiB blocks whose buffer position is page aligned into the file's block
//!   table (no copy; the blocks the file had there are freed after the batch commits — runs
//!   of fewer than 16 blocks into [`crate::buffers::Recycled`], whole, for the writers' next
//!   writes of up to 15 whole blocks);
//! - copies partial blocks into the file's block in place (a fresh zeroed page for a hole).
//!
//! Whole blocks are copied in place too where remapping must not happen: in a file mapped
//! into memory, on a nearly full volume ([`tight_below`]), and for small overwrites from
//! preliminary buffers while the recycled lists have no room for the blocks they would free
//! (which would otherwise go back to the volume as small holes in its free memory). A write
//! in recycled pages needs no room: its pages leave the lists' circulation as the blocks it
//! replaces enter it.
//!
//! A single-block overwrite whose writer remapped it into the file itself (a chunk the
//! checkpoint shared with the writers once small overwrites remapped blocks there:
//! [`crate::extent_map::ExtentMap::share_chunk`], [`crate::overlay::Overlay::remap_block`])
//! leaves only its mapping to record and the block it replaced to free ([`Cuts`] names
//! the ones a later hole or truncation took back out of the file).
//!
//! Then one journal record commits the batch: every map change, the sizes reached, and the
//! retirement of the records. Until it is durable nothing is freed, so a crash before it
//! leaves the records live, and replaying them redoes the same in-place copies.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use smallvec::SmallVec;
use volume::Extent;

use crate::buffers::{BufferSet, NO_PAGE, RECYCLE_RUN_BLOCKS};
use crate::error::{FsError, Result};
use crate::extent_map::{BLOCK, CHUNK_BLOCKS, ExtentMap, Run};
use crate::fs::{CheckpointMode, Inner, Slot, now_ns};
use crate::inode::Inode;
use crate::journal::{Journal, Kind, MAX_RECORD, MapEntry, MetaOp, SizeEntry};
use crate::overlay::Piece as OverlayPiece;
use crate::pieces::{Piece, alloc_halving};
use crate::progress::{GATHER_RECORDS, Pending, Queue, Remapped, Until};
use crate::range_lock::LockMode;
use crate::snapshot::{
    INDEX_PAGE_BYTES, INDEX_PAGE_PIECES, InodeHead, RUN_BYTES, SnapshotIndex, SnapshotWriter,
    write_growth_bound,
};

/// After a batch, the checkpoint waits this long (or until a queue reaches
/// [`GATHER_RECORDS`] records) for the next one to gather, so that the per-batch work (the
/// journal record, its flush and fence, the wake-ups) is shared by more records — unless it
/// is behind (a full batch, and as many records waiting already).
const GATHER_WAIT: Duration = Duration::from_micros(500);

/// Blocks cut out of files (holes punched, truncations) that records of writers' own remaps
/// ([`crate::overlay::Overlay::remap_block`]) logged before the cut may still name.
///
/// Such a record's block is in the file from the moment its writer remapped it, so a cut
/// after it (which holds the block's range lock, so comes after the write) frees the
/// record's page at once. The checkpoint must then not record the record's mapping: its
/// batch is journaled after the cut, and replay would map the freed page back into the
/// file. It still frees the page the record replaced, which only the record names. A cut
/// is kept with the order the next record would take when it was made (records below it
/// came before it), until every record below that is checkpointed.
#[derive(Debug, Default)]
pub(crate) struct Cuts {
    /// Whether `list` holds any (read per remapped record; the list's lock only then).
    any: AtomicBool,
    list: Mutex<Vec<Cut>>,
}

#[derive(Debug)]
struct Cut {
    ino: u64,
    /// File blocks `[from, to)`.
    from: u64,
    to: u64,
    /// Records below this order were logged before the cut.
    order: u64,
}

impl Cuts {
    /// Notes that blocks `[from, to)` of file `ino` are cut, before records of order
    /// `order` and above. Called under the batch lock (no batch is half done) and the range
    /// lock of the blocks, before they are freed.
    pub(crate) fn note(&self, ino: u64, from: u64, to: u64, order: u64) {
        self.list.lock().expect("cuts").push(Cut {
            ino,
            from,
            to,
            order,
        });
        self.any.store(true, Ordering::Release);
    }

    /// Whether block `block` of file `ino` was cut after the record of order `order`.
    fn cut_after(&self, ino: u64, block: u64, order: u64) -> bool {
        self.any.load(Ordering::Acquire)
            && self
                .list
                .lock()
                .expect("cuts")
                .iter()
                .any(|c| c.ino == ino && c.order > order && (c.from..c.to).contains(&block))
    }

    /// Forgets the cuts that no pending record precedes (every record below `done_below`
    /// is checkpointed).
    fn prune(&self, done_below: u64) {
        if !self.any.load(Ordering::Acquire) {
            return;
        }
        let mut list = self.list.lock().expect("cuts");
        list.retain(|c| c.order > done_below);
        if list.is_empty() {
            self.any.store(false, Ordering::Release);
        }
    }
}

/// Starts the checkpoint thread.
pub(crate) fn spawn(inner: Arc<Inner>) -> Result<std::thread::JoinHandle<()>> {
    std::thread::Builder::new()
        .name("locus-checkpoint".into())
        .spawn(move || run(&inner))
        .map_err(|e| FsError::Shutdown(format!("cannot start the checkpoint thread: {e}")))
}

fn run(inner: &Inner) {
    inner.options.thread_started();
    // A new thread starts at its creator's nice value: the opener's.
    if let Ok(opener) = topology::current_thread_nice() {
        let boost = inner.options.checkpoint_boost;
        let nice = match topology::boost_current_thread(boost) {
            Ok(nice) => {
                tracing::debug!(nice, "checkpoint thread's priority");
                nice
            }
            Err(error) => {
                tracing::debug!(%error, "the checkpoint thread runs at its opener's priority");
                opener
            }
        };
        let raised = u32::try_from(opener - nice).unwrap_or(0);
        let _ = inner.counters.checkpoint_priority.set((nice, raised));
    }
    if let Err(e) = run_loop(inner) {
        tracing::error!(error = %e, "checkpoint failed; the file system stops accepting changes");
        inner.progress.fail(e.to_string());
    }
}

fn run_loop(inner: &Inner) -> Result<()> {
    let checkpoint_slot = inner.slot_at(0)?;
    let mut scratch = Scratch::default();
    let background = inner.options.checkpoint == CheckpointMode::Background;
    // On demand: once asked, keep going until nothing below the watermark is left.
    let mut draining = false;
    loop {
        // A pass writes to the media only while holding this (`Fs::quiesced`).
        let hold = inner
            .checkpoint_hold
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let asked = inner.progress.take_requests();
        if asked.abandon {
            return Ok(());
        }
        draining |= asked.drain;
        let moved = if background || draining || asked.pass || asked.stop {
            checkpoint_once(inner, &checkpoint_slot, &mut scratch)?
        } else {
            0
        };
        if moved == 0 {
            draining = false;
        }
        if asked.snapshot || journals_filling(inner) {
            snapshot(inner)?;
        }
        let slots = created_slots(inner);
        let queues: Vec<&Queue> = slots.iter().map(|s| &s.queue).collect();
        if asked.stop
            && moved == 0
            && inner.progress.pending(queues.iter().copied()) == 0
            && inner.progress.all_quiet(&queues)
        {
            for slot in &slots {
                slot.pool
                    .lock()
                    .expect("buffer pool")
                    .seal_all(&inner.volume)?;
            }
            inner.recycled.drain(&inner.volume)?;
            // Nothing is journaled after this, so the journals are sealed: where they end,
            // keeping their records, when replaying those at the next mount costs less
            // than writing a snapshot now; else the last snapshot empties and seals them.
            // Nothing is written when the sealed state the file system was opened from is
            // still current (a program that only looked).
            if !inner.unchanged_since_sealed() && !seal_journals_where_they_end(inner, &slots)? {
                snapshot_sealing(inner, true)?;
            }
            // Every record is retired, and the metadata saying so is durable: the log areas
            // are sealed, so the next mount reads none of their slots (an area already sealed
            // is not written again).
            for slot in &slots {
                slot.log().seal()?;
            }
            inner.progress.pass_done();
            return Ok(());
        }
        inner.counters.checkpoint_cpu_ns.store(
            topology::thread_cpu_time().map_or(0, |t| t.as_nanos() as u64),
            Ordering::Relaxed,
        );
        inner.progress.pass_done();
        drop(hold);
        // Straight on only while behind: a full batch and a queue's worth waiting already.
        // After a full batch the next one gathers as well: going straight on, that pass
        // found only what was queued while the last one ran (a few hundred records), so
        // every other batch was that small. Measured with two writers of random 4 KiB
        // blocks, four alternated pairs of 3 s runs: the checkpoint's CPU time 0.11 -> 0.09
        // µs a record, 2.01-2.16 M -> 2.12-2.22 M writes a second; in a profile of each,
        // the writers' preemptions and wake-ups 31 -> 15 ns a write.
        let behind = moved >= GATHER_RECORDS
            && inner.progress.pending(queues.iter().copied()) >= GATHER_RECORDS as u64;
        if behind || (moved > 0 && (draining || asked.stop)) {
            continue;
        }
        if moved > 0 {
            inner.progress.gather(GATHER_WAIT, asked);
            continue;
        }
        let until = if asked.stop {
            Until::Quiet
        } else if background {
            Until::Movable
        } else {
            Until::Asked
        };
        inner.progress.sleep(&queues, until, asked);
    }
}

/// A clean unmount keeps the journals' records (seals each journal where it ends) instead of
/// writing a snapshot while they hold at most this fraction of the last snapshot's bytes.
///
/// A snapshot costs in proportion to the whole file system (every inode and name encoded and
/// written: on a volume of 100,000 small files, 45 % of the CPU time of a `touch` through
/// the preload library went to the unmount's snapshot), replaying journal records in
/// proportion to what changed since the last one. Kept records are replayed by every mount
/// until a snapshot folds them in — at an unmount past this share, or when a journal fills —
/// so a run of short programs that each change a little pays, per program, a replay of at
/// most this share instead of a whole snapshot.
const KEEP_JOURNALS_BELOW: u64 = 8;

/// Bytes of a journal record that keeps an access time a read moved (`SetTimes`: header
/// and four times).
const ACCESS_RECORD_BYTES: u64 = 32 + 4 * 8;

/// At a clean unmount (every record checkpointed, the batches durable in slot 0's journal):
/// seals every journal where it ends, keeping the records, when that is cheaper than a
/// snapshot — not asked to fold ([`crate::FsOptions::fold_at_unmount`]), no damaged root
/// copy to rewrite, no journal past the mark where the checkpoint would write one anyway,
/// and all of them together, with a `SetTimes` record for each access time a read moved
/// (which only a snapshot kept before), under [`KEEP_JOURNALS_BELOW`] of the snapshot.
/// Those records go into slot 0's journal first. Returns whether it sealed them all; when
/// not, the caller writes the snapshot (a journal sealed or appended to here is reset by it
/// like the others, and the snapshot holds the times).
fn seal_journals_where_they_end(inner: &Inner, slots: &[Arc<Slot>]) -> Result<bool> {
    if inner.options.fold_at_unmount || inner.damaged_root_copy {
        return Ok(false);
    }
    let _gate = inner.gate_exclusive();
    let mut accessed = std::mem::take(
        &mut *inner
            .accessed_since_snapshot
            .lock()
            .expect("accessed inodes"),
    );
    accessed.sort_unstable();
    accessed.dedup();
    let mut held = accessed.len() as u64 * ACCESS_RECORD_BYTES;
    for slot in slots {
        let journal = slot.journal();
        if journal.past_snapshot_mark(slot.index) {
            return Ok(false);
        }
        held += journal.used();
    }
    if held > inner.snapshot_bytes.load(Ordering::Relaxed) / KEEP_JOURNALS_BELOW {
        return Ok(false);
    }
    let mut journal = slots[0].journal();
    for ino in accessed {
        // A file removed since has no time to keep.
        let Some(inode) = inner.inode(ino) else {
            continue;
        };
        let op = MetaOp::SetTimes {
            ino,
            atime: inode.atime.load(Ordering::Acquire),
            // Unchanged; and the change time as it is (replay only raises it).
            mtime: 0,
            ctime: inode.ctime.load(Ordering::Acquire),
        };
        if journal.append(inner.progress.next_order(), &op)?.is_none() {
            return Ok(false);
        }
    }
    drop(journal);
    for slot in slots {
        if !slot.journal().seal()? {
            return Ok(false);
        }
    }
    Ok(true)
}

/// The slots created so far, indexed by slot number (they are created in index order).
fn created_slots(inner: &Inner) -> Vec<Arc<Slot>> {
    let slots: Vec<Arc<Slot>> = inner.made_slots().cloned().collect();
    debug_assert!(
        inner.slots[slots.len()..].iter().all(|s| s.get().is_none()),
        "slots are created in index order"
    );
    debug_assert!(slots.iter().enumerate().all(|(i, s)| s.index as usize == i));
    slots
}

fn journals_filling(inner: &Inner) -> bool {
    created_slots(inner)
        .iter()
        .any(|slot| slot.journal().past_snapshot_mark(slot.index))
}

/// What a batch fills and leaves empty, kept from batch to batch: a batch of a few hundred
/// records grew these anew each time. With two writers of random 4 KiB blocks the
/// allocator and page faults were 7.5 % of the checkpoint thread's samples, 4.9 % with
/// these kept (`perf record`, 3 s runs of `locus bench fs`).
#[derive(Default)]
struct Scratch {
    maps: Vec<MapEntry>,
    freed: Vec<Run>,
    /// Pages of the batch's retired buffers that no file took.
    untaken: Vec<Extent>,
    /// (file, offset, index in the batch): the order records are applied in.
    order: Vec<(u64, u64, u32)>,
    counting: Counting,
    /// The last batch's record vector, emptied ([`crate::progress::Progress::take_batch_into`]).
    records: Vec<Pending>,
}

/// Most 2 MiB stretches (8 GiB, summed over the batch's files) whose records
/// [`in_file_order`] puts in order by counting; a batch spread wider is sorted.
const COUNTED_STRETCHES: u64 = 4096;
/// Most files whose records [`in_file_order`] puts in order by counting (each record's file
/// is found by a scan of the files seen so far); a batch of more files is sorted.
const COUNTED_FILES: usize = 16;

/// Room for [`in_file_order`]'s counting sort, kept from batch to batch.
#[derive(Default)]
struct Counting {
    sorted: Vec<(u64, u64, u32)>,
    counts: Vec<u32>,
    /// Each record's file, as an index into `files`.
    file_of: Vec<u16>,
    /// Each file seen, in the order seen.
    files: Vec<CountedFile>,
}

/// A file of a batch [`in_file_order`] counts: its stretches and where their buckets begin.
#[derive(Clone, Copy)]
struct CountedFile {
    ino: u64,
    lowest: u64,
    highest: u64,
    /// Its lowest stretch's bucket (files take buckets in ascending order).
    first: u32,
}

/// Puts `order` (file, offset, index) in file order as far as applying needs it: by file,
/// then by 2 MiB stretch, the records of one stretch in log order (a group's range lock
/// spans its records whatever their order, and [`crate::overlay::Overlay::take_records`]
/// takes them in any order). The common batch — the records of up to [`COUNTED_FILES`]
/// files over at most [`COUNTED_STRETCHES`] stretches of them in all — is put in that
/// order by counting, in three passes; others are sorted. Sorting every batch by offset
/// was a tenth of the checkpoint's time with random 4 KiB writes, to one file or to one
/// file per writer.
fn in_file_order(order: &mut Vec<(u64, u64, u32)>, room: &mut Counting) {
    if !count_files(order, room) {
        order.sort_unstable();
        return;
    }
    let Counting {
        sorted,
        counts,
        file_of,
        files,
    } = room;
    let bucket = |file: u16, offset: u64| {
        let file = files[file as usize];
        file.first as usize + (offset / GROUP_STRETCH - file.lowest) as usize
    };
    for (&(_, offset, _), &file) in order.iter().zip(file_of.iter()) {
        counts[bucket(file, offset) + 1] += 1;
    }
    for i in 1..counts.len() {
        counts[i] += counts[i - 1];
    }
    sorted.clear();
    sorted.resize(order.len(), (0, 0, 0));
    for (&record, &file) in order.iter().zip(file_of.iter()) {
        let at = &mut counts[bucket(file, record.1)];
        sorted[*at as usize] = record;
        *at += 1;
    }
    std::mem::swap(order, sorted);
}

/// The first pass of [`in_file_order`]: each record's file, and each file's stretches and
/// first bucket (files in ascending order), with `counts` zeroed for them. False when the
/// batch is too spread out to count.
fn count_files(order: &[(u64, u64, u32)], room: &mut Counting) -> bool {
    let Counting {
        counts,
        file_of,
        files,
        ..
    } = room;
    files.clear();
    file_of.clear();
    let mut last = 0;
    for &(ino, offset, _) in order {
        let stretch = offset / GROUP_STRETCH;
        if files.get(last).is_none_or(|f| f.ino != ino) {
            match files.iter().position(|f| f.ino == ino) {
                Some(i) => last = i,
                None if files.len() == COUNTED_FILES => return false,
                None => {
                    last = files.len();
                    files.push(CountedFile {
                        ino,
                        lowest: stretch,
                        highest: stretch,
                        first: 0,
                    });
                }
            }
        }
        let file = &mut files[last];
        file.lowest = file.lowest.min(stretch);
        file.highest = file.highest.max(stretch);
        file_of.push(last as u16);
    }
    // Buckets go to the files in ascending order; `file_of` keeps naming them by the
    // order they were seen in.
    let mut ascending: SmallVec<[u16; COUNTED_FILES]> = (0..files.len() as u16).collect();
    ascending.sort_unstable_by_key(|&i| files[i as usize].ino);
    let mut buckets = 0u64;
    for i in ascending {
        let file = &mut files[i as usize];
        file.first = buckets as u32;
        buckets += file.highest - file.lowest + 1;
        if buckets > COUNTED_STRETCHES {
            return false;
        }
    }
    counts.clear();
    counts.resize(buckets as usize + 1, 0);
    true
}

/// One batch. Returns the records moved.
fn checkpoint_once(inner: &Inner, checkpoint_slot: &Slot, scratch: &mut Scratch) -> Result<usize> {
    let _batch = inner.lock_batch();
    // The counter before the list of slots: a slot made after it holds no record below it.
    let mark = inner.progress.mark();
    let slots = created_slots(inner);
    let queues: Vec<&Queue> = slots.iter().map(|s| &s.queue).collect();
    let batch = inner.progress.take_batch_into(
        mark,
        &queues,
        inner.options.checkpoint_batch,
        std::mem::take(&mut scratch.records),
    );
    if batch.records.is_empty() {
        scratch.records = batch.records;
        return Ok(0);
    }
    if !checkpoint_slot.journal().fits(MAX_RECORD) {
        snapshot(inner)?;
    }
    // Before this batch stores to any block in place: every write it holds is confirmed.
    inner.confirm_logs()?;

    // The lists' room the writers hold — the frees their remaps owe, pool-page remaps
    // allowed them — is not this batch's to use ([`crate::fs::SlotCounters::remap_room`]).
    let held: u64 = slots.iter().map(|s| s.counters.remap_room()).sum();
    let mut work = Work {
        copy_overwrites: inner.spare_bytes() < tight_below(inner),
        room: inner.recycled.room().saturating_sub(held),
        maps: std::mem::take(&mut scratch.maps),
        freed: std::mem::take(&mut scratch.freed),
        ..Work::default()
    };
    // Writers remap single-block overwrites themselves while space is not tight, as this
    // batch would ([`apply_record`]); those into pool pages only as far as the lists have
    // room for the blocks they replace (allowed below, once this batch's frees are in).
    inner
        .writers_remap
        .store(!work.copy_overwrites, Ordering::Relaxed);
    // What a record moves is what the overlay still holds of it, which no other record's
    // move changes, so the records may be applied in file order: then the range-lock
    // tables, overlay shards and extent-map nodes of neighbouring records are still in this
    // core's cache (in log order, random writes touch a line the writers last wrote on
    // nearly every record), and one inode look-up serves a file's records. Measured with
    // two writers of random 4 KiB blocks: the checkpoint's CPU time per record fell from
    // 0.64 to 0.52 µs, the writers' from 1.89 to 1.76 µs. Only when the recycled lists
    // have room for every block the batch could remap from buffers, though (a write in
    // recycled pages needs none: [`apply_record`]): when room runs out mid-batch, the
    // records remapped must be the oldest, whose buffers are then used up whole, while the
    // newer ones are copied and their buffers go back whole — remapped in file order, every
    // buffer would go back with holes, and free memory would end in pieces.
    let remappable: u64 = batch
        .records
        .iter()
        .filter(|p| p.remapped.is_none() && p.page == NO_PAGE)
        .map(|p| p.len / BLOCK)
        .sum();
    let mut order = std::mem::take(&mut scratch.order);
    order.clear();
    order.extend(
        batch
            .records
            .iter()
            .enumerate()
            .map(|(i, p)| (p.ino, p.offset, i as u32)),
    );
    if remappable <= work.room {
        in_file_order(&mut order, &mut scratch.counting);
    }
    let mut inode: Option<Arc<Inode>> = None;
    let mut k = 0;
    while k < order.len() {
        let first = &batch.records[order[k].2 as usize];
        if inode.as_ref().is_none_or(|i| i.ino != first.ino) {
            inode = inner.inode(first.ino);
        }
        // A record its writer remapped needs no lock: only its mapping is left to record.
        // Records before and after it in this order are applied before and after it, so the
        // batch's mappings of any one block stay in log order.
        if let Some(remapped) = first.remapped {
            apply_remapped(inner, inode.as_deref(), first, remapped, &mut work);
            k += 1;
            continue;
        }
        let stretch = first.offset / GROUP_STRETCH;
        let group = order[k..]
            .iter()
            .take(GROUP_RECORDS)
            .take_while(|&&(ino, offset, at)| {
                ino == first.ino
                    && offset / GROUP_STRETCH == stretch
                    && batch.records[at as usize].remapped.is_none()
            })
            .count();
        // A file removed since has nothing left to move.
        if let Some(inode) = &inode {
            apply_group(inner, inode, &batch.records, &order[k..], group, &mut work)?;
        }
        k += group;
    }
    scratch.order = order;
    // Partial copies were non-temporal: one fence makes them durable before the commit.
    inner.volume.fence();
    let mut retired: Vec<(u32, u64)> = Vec::new();
    for p in &batch.records {
        match retired.iter_mut().find(|(s, _)| *s == p.slot) {
            Some((_, seq)) => *seq = (*seq).max(p.seq),
            None => retired.push((p.slot, p.seq)),
        }
    }
    let op_maps = work.maps.len() as u64;
    if inner.options.defragments() {
        inner
            .defrag
            .note(work.maps.iter().map(|m| (m.ino, m.file_block, m.blocks)));
    }
    let op = MetaOp::Batch {
        maps: work.maps,
        sizes: merged_sizes(work.sizes),
        retired: retired.clone(),
    };
    let order = inner.progress.next_order();
    let bytes = checkpoint_slot
        .journal()
        .append(order, &op)?
        .ok_or_else(|| {
            FsError::corrupt("checkpoint journal", "a batch did not fit after a snapshot")
        })?;
    if let MetaOp::Batch { mut maps, .. } = op {
        maps.clear();
        scratch.maps = maps;
    }
    inner
        .counters
        .metadata_bytes
        .fetch_add(bytes, Ordering::Relaxed);
    // Each mapping splits at most one run into three: that replaces what the records were
    // counted at when logged.
    inner.grow_snapshot(2 * RUN_BYTES * op_maps);
    // One update per slot: the counters are the writers' cache lines.
    let mut bounds = vec![0u64; slots.len()];
    for p in &batch.records {
        bounds[p.slot as usize] += write_growth_bound(p.offset, p.len);
    }
    for (slot, bound) in slots.iter().zip(bounds) {
        if bound > 0 {
            slot.counters.move_growth(bound);
        }
    }
    // Per slot, whether it wrote in this batch and how many blocks it remapped itself.
    let mut remaps = vec![None::<u64>; slots.len()];
    for p in &batch.records {
        *remaps[p.slot as usize].get_or_insert(0) += u64::from(p.remapped.is_some());
    }
    if inner.checksums.is_some() {
        let pages: u64 = batch
            .records
            .iter()
            .map(|p| crate::fs::partial_pages(p.offset, p.len))
            .sum();
        inner.pending_pages.fetch_sub(pages, Ordering::Relaxed);
    }

    // Durable: retire, free, release.
    for (slot, seq) in retired {
        slots[slot as usize]
            .retired
            .fetch_max(seq, Ordering::AcqRel);
    }
    // Pages the writers may take next: mapped in this process here, off their path (each
    // page first written through a page fault cost a writer more than the write).
    for run in work.freed.iter().filter(|r| r.blocks < RECYCLE_RUN_BLOCKS) {
        inner.populate(run.addr, run.blocks * BLOCK);
    }
    // Retired buffers' pages no file took (records a newer write made void, partial blocks
    // copied) go with them: a page of a recycled set left untaken went back to the volume
    // as a 4 KiB hole (the volume's frees were 5–7 % of the checkpoint's samples with two
    // writers of random 4 KiB blocks), and the lists came up that page short, so a writer
    // later took a page of a pool buffer instead (1.5 % of those writes, 0.9 % now).
    let mut untaken = std::mem::take(&mut scratch.untaken);
    // A slot's records use its sets one after another (64 records to a set of recycled
    // pages), so each slot's run of records in one set releases them with one subtraction:
    // the set's count is on a line its writer last wrote, and an atomic subtraction per
    // record was a tenth of this function's own samples.
    // The recycled pages writers remapped into files are taken here too, a word of bits
    // for the run, before the run's records are released: taken one record at a time as
    // the batch applied them, each was a locked instruction — a full barrier behind the
    // batch's stores — and a fifth of this function's own samples with two writers of
    // random 4 KiB blocks.
    let mut in_set: Vec<Option<(&Arc<BufferSet>, u64, u64)>> = vec![None; slots.len()];
    let mut release = |set: &Arc<BufferSet>, records: u64, places: u64| {
        if places != 0 {
            set.take_places(places);
        }
        if set.release_many(records) {
            set.reclaim_with(|run| {
                untaken.push(run);
                Ok(())
            })?;
        }
        Ok::<_, FsError>(())
    };
    for p in &batch.records {
        // A writer's remap into a recycled page (`apply_remapped` leaves it to here).
        let place = match p.remapped {
            Some(_) if p.page != NO_PAGE => 1 << p.page,
            _ => 0,
        };
        match &mut in_set[p.slot as usize] {
            Some((set, records, places)) if Arc::ptr_eq(set, &p.set) => {
                *records += 1;
                *places |= place;
            }
            last => {
                if let Some((set, records, places)) = last.replace((&p.set, 1, place)) {
                    release(set, records, places)?;
                }
            }
        }
    }
    for (set, records, places) in in_set.into_iter().flatten() {
        release(set, records, places)?;
    }
    let unrecycled = inner
        .recycled
        .free(&inner.volume, work.freed.iter().map(Run::pages))?;
    // Only while the lists are less than half full, though. Pages enter the circulation
    // when a writer finds the lists empty (a pool page) and leave it only when the lists
    // overflow: with every void record's page kept as well, the lists crept up to their
    // cap, where the checkpoint copies small overwrites in place for want of room for the
    // blocks they would replace (write amplification 1.04-1.15 against 1.03 with two
    // writers). Half full, they hold many batches' worth of single-block writes.
    // And never into the room the writers hold (the frees their remaps still owe, pool-page
    // remaps allowed them): with a checkpoint behind its writers, whose remaps this batch
    // did not reach, pages put there made those frees overflow the lists later.
    for (slot, applied) in slots.iter().zip(&remaps) {
        if let Some(n @ 1..) = applied {
            slot.counters.apply_remaps(*n);
        }
    }
    let held: u64 = slots.iter().map(|s| s.counters.remap_room()).sum();
    let cap = inner.recycled.cap();
    let level = (cap / 2).min(cap.saturating_sub(usize::try_from(held).unwrap_or(usize::MAX)));
    inner
        .recycled
        .free_up_to(&inner.volume, untaken.drain(..), level)?;
    allow_pool_remaps(inner, &slots, &remaps, work.copy_overwrites);
    scratch.untaken = untaken;
    work.freed.clear();
    scratch.freed = work.freed;
    let c = &inner.counters;
    c.checkpoint_batches.fetch_add(1, Ordering::Relaxed);
    c.checkpointed_records
        .fetch_add(batch.records.len() as u64, Ordering::Relaxed);
    c.remapped_blocks
        .fetch_add(work.remapped, Ordering::Relaxed);
    c.writer_remapped_blocks
        .fetch_add(work.by_writers, Ordering::Relaxed);
    c.copied_bytes.fetch_add(work.copied, Ordering::Relaxed);
    c.unrecycled_blocks.fetch_add(unrecycled, Ordering::Relaxed);
    inner.progress.finish_batch(&batch);
    inner.cuts.prune(inner.progress.done_below());
    let mut records = batch.records;
    let moved = records.len();
    records.clear();
    scratch.records = records;
    Ok(moved)
}

/// After a batch's frees (the writers' remaps it applied counted): each slot that wrote in
/// the batch (`batch`: per slot, `None` if it had no record there) is allowed its share of
/// half the recycled lists' room left, less the frees writers' remaps still owe, for remaps
/// into pool pages — the other half stays for this checkpoint's own remaps (of blocks in
/// chunks not shared with the writers). A slot with no record in the batch is allowed none
/// until one of its records is in a batch; none is allowed while space is tight.
fn allow_pool_remaps(inner: &Inner, slots: &[Arc<Slot>], batch: &[Option<u64>], tight: bool) {
    let owed: u64 = slots.iter().map(|s| s.counters.remaps_owed()).sum();
    let writing = batch.iter().filter(|b| b.is_some()).count() as u64;
    let share = if tight || writing == 0 {
        0
    } else {
        inner.recycled.room().saturating_sub(owed) / 2 / writing
    };
    for (slot, wrote) in slots.iter().zip(batch) {
        slot.counters
            .allow_pool_remaps(if wrote.is_some() { share } else { 0 });
    }
}

/// Below this much spare memory the checkpoint copies whole-block overwrites into the
/// blocks the file has instead of remapping them: a remap that splits a run grows the
/// metadata (the next snapshot, which the writers' reserve counts twice), so on a nearly
/// full volume remapped overwrites would eat the last free memory and end in `NoSpace` for
/// writes that replace what they overwrite. A 64th of the volume, at least 1 MiB.
fn tight_below(inner: &Inner) -> u64 {
    (inner.volume.data_bytes() / 64).max(1 << 20)
}

#[derive(Default)]
struct Work {
    /// Whole-block overwrites are copied in place this batch ([`tight_below`]).
    copy_overwrites: bool,
    /// Pages the recycled lists can still take: small overwrites are remapped only while
    /// what they free fits ([`crate::buffers::Recycled`]).
    room: u64,
    maps: Vec<MapEntry>,
    /// Sizes reached, an entry per run of records of one file ([`note_size`]).
    sizes: Vec<SizeEntry>,
    freed: Vec<Run>,
    /// A group's records' pieces, taken from the overlay together (kept for its buffer).
    taken: Vec<SmallVec<[OverlayPiece; 1]>>,
    /// A group's whole-block remaps (file block, blocks, page), entered into the file's
    /// map together at the group's end ([`ExtentMap::map_all`]).
    remaps: Vec<(u64, u64, u64)>,
    /// A chunk of the group's file in which a single-block overwrite was remapped: its
    /// table is shared with the writers at the group's end, so that they remap the next
    /// ones themselves.
    share: Option<u64>,
    remapped: u64,
    /// Of `remapped`, blocks their writers remapped.
    by_writers: u64,
    copied: u64,
}

/// Records of one file within one stretch of it are applied together, at most this many:
/// one range lock, one hold of the extent map and one of the overlay shard for all of them
/// (per record, those three were a third of the checkpoint's samples with random 4 KiB
/// writes). More would keep writers off a stretch longer for little: measured with `bench
/// fs --bs 4K --threads 2`, six alternated runs each, the checkpoint's CPU time per record
/// was 0.42-0.47 µs one record at a time, 0.37 (five of six runs) in groups of 8 and
/// 0.37-0.40 in groups of 16.
const GROUP_RECORDS: usize = 8;
/// The part of a file whose records may share a range lock (the range locks' stretch: one
/// table).
const GROUP_STRETCH: u64 = crate::range_lock::MAX_GRANULE;

/// Moves what is left of `group` records of one file (the first `group` of `order`, which
/// name them in `records`) into it, under one range lock over all of them and one hold of
/// its extent map.
fn apply_group(
    inner: &Inner,
    inode: &Inode,
    records: &[Pending],
    order: &[(u64, u64, u32)],
    group: usize,
    work: &mut Work,
) -> Result<()> {
    let first = &records[order[0].2 as usize];
    if inode.kind != Kind::File {
        return Err(FsError::corrupt(
            format!("log record {} of slot {}", first.seq, first.slot),
            format!("inode {} is not a file ({:?})", first.ino, inode.kind),
        ));
    }
    let (start, end) = order[..group]
        .iter()
        .map(|&(_, _, at)| &records[at as usize])
        .fold((u64::MAX, 0), |(start, end), r| {
            (start.min(r.offset), end.max(r.offset + r.len))
        });
    let _range = inner.lock_range(inode, start, end - start, LockMode::Exclusive)?;
    // The pieces leave the overlay and enter the map under the map's lock: `stat`, which
    // counts both under it, sees each block in one of them.
    let mut extents = inode.extents.write().expect("extent map");
    // Read once for the group: they share cache lines with the times every write stores,
    // and loaded per record they were a quarter of the checkpoint's own samples. None
    // changes under the group in a way that matters: `dead` is set under the extent map's
    // lock held here, no truncation runs during a batch (sizes only grow meanwhile), and a
    // new shared mapping counts itself and then waits for the checkpoint to fold every
    // logged write in.
    let file = FileNow {
        size: inode.size.load(Ordering::Acquire),
        dead: inode.dead.load(Ordering::Acquire),
        mapped: inode.mapped.load(Ordering::Acquire) > 0,
    };
    // The records' block-table entries, fetched while their pieces leave the overlay (the
    // load of an entry was the checkpoint's largest single stall, ~16 % of its samples
    // with random 4 KiB overwrites).
    extents.prefetch_all(
        order[..group]
            .iter()
            .map(|&(_, _, at)| records[at as usize].offset / BLOCK),
    );
    let mut taken = std::mem::take(&mut work.taken);
    taken.clear();
    inode.overlay.take_records(
        order[..group].iter().map(|&(_, _, at)| {
            let r = &records[at as usize];
            (r.offset, r.len, r.order)
        }),
        &mut taken,
    );
    let mut applied = Ok(());
    for (&(_, _, at), pieces) in order[..group].iter().zip(taken.drain(..)) {
        applied = apply_record(
            inner,
            inode,
            &file,
            &mut extents,
            &records[at as usize],
            pieces,
            work,
        );
        if applied.is_err() {
            break;
        }
    }
    // The group's whole-block remaps, entered together (one chunk look-up for those of a
    // chunk). Deferring them to here changes nothing the records above saw: a block that
    // one record remaps whole holds no byte of any other record of the batch (what each
    // moves is what the overlay still held of it), so none of them looked it up.
    extents.map_all(&work.remaps, &mut work.freed);
    work.remaps.clear();
    if let Some(chunk) = work.share.take()
        && let Some(table) = extents.share_chunk(chunk)
    {
        inode.overlay.share_table(chunk, table);
    }
    work.taken = taken;
    applied
}

/// What [`apply_group`] reads of a file once for its records.
struct FileNow {
    size: u64,
    dead: bool,
    mapped: bool,
}

/// Moves what is left of one record into its file (whose range lock and extent map the
/// caller holds; `file`: what it read of the file under them).
fn apply_record(
    inner: &Inner,
    inode: &Inode,
    file: &FileNow,
    extents: &mut ExtentMap,
    record: &Pending,
    pieces: SmallVec<[OverlayPiece; 1]>,
    work: &mut Work,
) -> Result<()> {
    // The size the write reached, as far as the file still has it: a later truncation
    // (which cannot run during a batch) cut it, a punched hole or a newer write did not —
    // even when neither left any of its bytes to move.
    let reached = (record.offset + record.len).min(file.size);
    if pieces.is_empty() {
        if !file.dead {
            note_size(work, inode.ino, reached, record);
        }
        return Ok(());
    }
    if file.dead {
        return Ok(());
    }
    let mut end = reached;
    // With data checksums no block a file or record names is ever stored to: whole blocks
    // are always remapped and partial ones rebuilt in fresh pages (`crate::checksums`).
    let checked = inner.checksums.is_some();
    // A mapped file's blocks stay where the mappings point (`crate::fs::mapped`).
    let mapped = file.mapped;
    for piece in pieces {
        end = end.max(piece.end);
        let mut pos = piece.start;
        while pos < piece.end {
            let block = pos / BLOCK;
            let block_start = block * BLOCK;
            let src = piece.src + (pos - piece.start);
            if pos == block_start && piece.end - pos >= BLOCK && src.is_multiple_of(BLOCK) {
                let blocks = (piece.end - pos) / BLOCK;
                // A write in recycled pages needs no room: its pages leave the lists'
                // circulation as the blocks it replaces enter it.
                let needs_room = blocks < RECYCLE_RUN_BLOCKS && record.page == NO_PAGE;
                if checked || !(mapped || work.copy_overwrites || needs_room && work.room < blocks)
                {
                    if needs_room {
                        work.room = work.room.saturating_sub(blocks);
                    }
                    if blocks == 1 && !checked && extents.get(block).is_some() {
                        work.share = Some(block / CHUNK_BLOCKS);
                    }
                    remap(inode.ino, record, block, blocks, src, work);
                } else {
                    // A mapped file (whose blocks stay where the mappings point), a
                    // nearly full volume, or no room to recycle what a small overwrite
                    // frees: copied into the blocks the file has; remapped only where the
                    // file has a hole.
                    let mut i = 0;
                    while i < blocks {
                        if let Some(target) = extents.get(block + i) {
                            inner.copy_pmem(src + i * BLOCK, target, BLOCK)?;
                            work.copied += BLOCK;
                            i += 1;
                            continue;
                        }
                        let holes = (i..blocks)
                            .take_while(|&j| extents.get(block + j).is_none())
                            .count() as u64;
                        remap(inode.ino, record, block + i, holes, src + i * BLOCK, work);
                        i += holes;
                    }
                }
                pos += blocks * BLOCK;
                continue;
            }
            let to = piece.end.min(block_start + BLOCK);
            let within = (pos - block_start) as usize;
            let len = (to - pos) as usize;
            if checked {
                rebuild_block(inner, inode.ino, extents, block, within, src, len, work)?;
                pos = to;
                continue;
            }
            match extents.get(block) {
                Some(target) => {
                    inner.copy_pmem(src, target + within as u64, len as u64)?;
                    work.copied += len as u64;
                }
                None => {
                    // A hole: a fresh page, zeros around the record's bytes.
                    let mut page = vec![0u8; BLOCK as usize];
                    inner.read_pmem(src, &mut page[within..within + len])?;
                    map_fresh_page(inner, inode.ino, extents, block, src, &page, work)?;
                }
            }
            pos = to;
        }
    }
    note_size(work, inode.ino, end, record);
    Ok(())
}

/// A record whose writer remapped its block into the file itself (`inode`: the file, if
/// it still is one): its page is the file's (or was, until a cut or the file's removal
/// freed it — never its buffer set's to reuse), the page it replaced is freed once the
/// batch commits, and the mapping is recorded unless the file is gone or a later cut took
/// the block back out ([`Cuts`]). A newer write of the block may have replaced this one's
/// page in the table already: recording this mapping first is still right, as the newer
/// record's mapping (or its replay) follows it. A file removed after this is read has its
/// entries skipped by replay (its removal is durable first), as for any other record.
fn apply_remapped(
    inner: &Inner,
    inode: Option<&Inode>,
    record: &Pending,
    remapped: Remapped,
    work: &mut Work,
) {
    let block = record.offset / BLOCK;
    // A recycled page is taken with its run of records as the batch releases them
    // ([`checkpoint_once`]).
    if record.page == NO_PAGE {
        record.set.take_pages(remapped.page, 1);
    }
    work.freed.push(Run {
        file_block: block,
        blocks: 1,
        addr: remapped.replaced,
    });
    let Some(inode) = inode.filter(|i| !i.dead.load(Ordering::Acquire)) else {
        return;
    };
    let ino = inode.ino;
    let end = record.offset + record.len;
    if inner.cuts.cut_after(ino, block, record.order) {
        // As far as the file still has it.
        let size = inode.size.load(Ordering::Acquire);
        note_size(work, ino, end.min(size), record);
        return;
    }
    work.maps.push(MapEntry {
        ino,
        file_block: block,
        blocks: 1,
        addr: remapped.page,
    });
    work.remapped += 1;
    work.by_writers += 1;
    note_size(work, ino, end, record);
}

/// With data checksums: builds block `block` of file `ino` anew in a fresh page — the bytes
/// it has (zeros for a hole) with `len` bytes of a record's buffer at `src` stored at
/// `within` — with its checksum entry, and maps it; the block it replaces is freed once the
/// batch commits. When the old block or the record's bytes fail their check, the new
/// block's entry is poisoned: the damage stays an error on read instead of being blessed by
/// a fresh checksum.
#[allow(clippy::too_many_arguments)]
fn rebuild_block(
    inner: &Inner,
    ino: u64,
    extents: &mut ExtentMap,
    block: u64,
    within: usize,
    src: u64,
    len: usize,
    work: &mut Work,
) -> Result<()> {
    let checksums = inner
        .checksums
        .as_ref()
        .expect("called with data checksums only");
    let mut page = vec![0u8; 2 * BLOCK as usize];
    let (page, scratch) = page.split_at_mut(BLOCK as usize);
    let mut sound = true;
    if let Some(target) = extents.get(block) {
        sound &= inner.read_block_checked(target, page)?;
    }
    // The record's bytes may straddle two blocks of its buffer (a caller's buffer starts at a
    // block whatever the file offset).
    let mut done = 0;
    while done < len {
        let at = src + done as u64;
        let source_block = at - at % BLOCK;
        let from = (at - source_block) as usize;
        let n = (BLOCK as usize - from).min(len - done);
        sound &= inner.read_block_checked(source_block, scratch)?;
        page[within + done..within + done + n].copy_from_slice(&scratch[from..from + n]);
        done += n;
    }
    let crc = crate::checksums::block_crc(page);
    let entry = if sound {
        crc
    } else {
        tracing::error!(
            ino,
            offset = block * BLOCK,
            "data checksum mismatch while moving a write into its file: the block stays marked damaged"
        );
        crate::checksums::poisoned(crc)
    };
    let fresh = map_fresh_page(inner, ino, extents, block, src, page, work)?;
    checksums.store(fresh, &[entry])
}

/// Writes `page` to a fresh block on the device of `near` (the record's buffer, so on the
/// writer's node) and makes it block `block` of file `ino`; the block it replaces, if any,
/// is freed once the batch commits. Returns the fresh block's address.
fn map_fresh_page(
    inner: &Inner,
    ino: u64,
    extents: &mut ExtentMap,
    block: u64,
    near: u64,
    page: &[u8],
    work: &mut Work,
) -> Result<u64> {
    let node = inner
        .volume
        .device_node(volume::GlobalAddress::from_raw(near).device())
        .unwrap_or_else(|| inner.volume.current_node());
    let fresh: Extent = inner.unless_recycled(|| Ok(inner.volume.alloc(BLOCK, node)?))?;
    let (region, at) = inner.region_at(fresh.start.raw())?;
    region.write_nt(at, page)?;
    extents.map(block, 1, fresh.start.raw(), &mut work.freed);
    work.maps.push(MapEntry {
        ino,
        file_block: block,
        blocks: 1,
        addr: fresh.start.raw(),
    });
    work.copied += BLOCK;
    Ok(fresh.start.raw())
}

/// The batch records that file `ino` is at least `size` bytes, modified at the latest of its
/// records' times (now, for records of areas that did not record times), and that record's
/// order (so replay knows whether a later `SetTimes` overrides the time).
///
/// Records mostly come in file order, so a record of the file the last one noted raises
/// that entry; another file's starts a new one ([`merged_sizes`] folds a file's entries
/// together). A map from file to entry cost a search per record: 3 % of the checkpoint's
/// samples with two writers of random 4 KiB blocks.
fn note_size(work: &mut Work, ino: u64, size: u64, record: &Pending) {
    let mtime = if record.mtime == 0 {
        now_ns()
    } else {
        record.mtime
    };
    let noted = SizeEntry {
        ino,
        size,
        mtime,
        order: record.order,
    };
    match work.sizes.last_mut() {
        Some(last) if last.ino == ino => raise(last, &noted),
        _ => work.sizes.push(noted),
    }
}

/// `entry` raised to `by` in size, time and order.
fn raise(entry: &mut SizeEntry, by: &SizeEntry) {
    entry.size = entry.size.max(by.size);
    entry.mtime = entry.mtime.max(by.mtime);
    entry.order = entry.order.max(by.order);
}

/// [`note_size`]'s entries as the batch records them: one per file, in inode order.
fn merged_sizes(mut sizes: Vec<SizeEntry>) -> Vec<SizeEntry> {
    sizes.sort_by_key(|s| s.ino);
    sizes.dedup_by(|later, kept| {
        let same = later.ino == kept.ino;
        if same {
            raise(kept, later);
        }
        same
    });
    sizes
}

/// Makes `blocks` whole blocks of a record's buffer at `src` the file's blocks from `block`
/// on (no copy), entered into the file's map at the end of the record's group
/// ([`apply_group`]); the blocks they replace are freed once the batch is committed.
fn remap(ino: u64, record: &Pending, block: u64, blocks: u64, src: u64, work: &mut Work) {
    work.remaps.push((block, blocks, src));
    if record.page == NO_PAGE {
        record.set.take_pages(src, blocks);
    } else {
        // A write in a run of recycled pages (block-aligned, a page a block, their places
        // in a row from `record.page`).
        let first = record.page + (block - record.offset / BLOCK) as u32;
        record.set.take_page_run(first, blocks);
    }
    work.maps.push(MapEntry {
        ino,
        file_block: block,
        blocks,
        addr: src,
    });
    work.remapped += blocks;
}

/// Writes the whole metadata to a fresh extent, names it in a new root (a new epoch), and
/// empties every journal.
pub(crate) fn snapshot(inner: &Inner) -> Result<()> {
    snapshot_sealing(inner, false)
}

/// How many inodes ahead a snapshot prefetches the one it will encode. Measured on 200,000
/// files made in one process, six snapshots of 22 MiB a run, three alternated runs each:
/// 30–65 ms (mean 39.9) held with it, 37–65 ms (mean 45.9) without; 16 ahead no better.
const SNAPSHOT_PREFETCH_AHEAD: usize = 8;

/// [`snapshot`], sealing the emptied journals when `seal` (the unmount's last snapshot:
/// `Journal::reset`).
fn snapshot_sealing(inner: &Inner, seal: bool) -> Result<()> {
    let _gate = inner.gate_exclusive();
    // Dropped before the gate (declared after it): times the hold, failures included.
    let _pause = PauseTimer::start(&inner.counters);
    // Cleared before the times are read: a read that moves one after this is noted again.
    inner.snapshot_owed.store(false, Ordering::Release);
    inner
        .accessed_since_snapshot
        .lock()
        .expect("accessed inodes")
        .clear();
    // Sorted by the number beside each inode, not through it: comparing through the
    // pointers missed the cache at every step (on 340,000 files the sort was a quarter of
    // the checkpoint thread's time; a snapshot of 400,000, 159-231 ms against 225-267).
    let mut table: Vec<(u64, Arc<Inode>)> = inner
        .table()
        .iter()
        .map(|(&ino, inode)| (ino, Arc::clone(inode)))
        .collect();
    table.sort_unstable_by_key(|&(ino, _)| ino);
    // Room for what the snapshot may take (a bound, often loose: capped at twice the last
    // snapshot and 1 MiB).
    let last = inner.snapshot_bytes.load(Ordering::Relaxed);
    let room = inner.next_snapshot_bound().min(2 * last + (1 << 20));
    let mut writer = SnapshotWriter::with_capacity(usize::try_from(room).unwrap_or(usize::MAX));
    // Each inode encoded from its locks, one at a time (on a volume of 100,000 small files,
    // an image of each — names and runs copied, then dropped — was most of the snapshot's
    // time, and the gate holds every metadata operation off meanwhile). Inodes lie
    // scattered over the heap: each one a few inodes ahead is fetched into the cache while
    // this one is encoded.
    for k in 0..table.len() {
        if let Some((_, ahead)) = table.get(k + SNAPSHOT_PREFETCH_AHEAD) {
            let at = Arc::as_ptr(ahead).cast::<u8>();
            for line in (0..size_of::<Inode>()).step_by(pmem::CACHE_LINE) {
                pmem::prefetch(at.wrapping_add(line));
            }
        }
        let inode = &table[k].1;
        let attr = inode.attr.lock().expect("inode attributes").clone();
        // An unnamed file stays: later journal records may name it.
        if attr.unlinked && !attr.unnamed {
            continue;
        }
        writer.inode(&InodeHead {
            ino: inode.ino,
            kind: inode.kind,
            mode: attr.mode,
            uid: attr.uid,
            gid: attr.gid,
            mtime: inode.mtime.load(Ordering::Acquire),
            atime: inode.atime.load(Ordering::Acquire),
            ctime: inode.ctime.load(Ordering::Acquire),
            size: inode.size.load(Ordering::Acquire),
            parent: if attr.unnamed {
                crate::snapshot::UNNAMED
            } else {
                attr.parent
            },
            target: &inode.target,
            rdev: inode.rdev,
        });
        for (name, ino) in inode.entries().iter() {
            writer.entry(name, *ino);
        }
        inode
            .extents
            .read()
            .expect("extent map")
            .each_run(|run| writer.run(run));
        for (name, value) in inode.xattrs.lock().expect("extended attributes").iter() {
            writer.xattr(name, value);
        }
    }
    let mut root = inner.root.lock().expect("root");
    let retired: Vec<u64> = (0..root.slots.len())
        .map(|i| {
            inner.slots[i]
                .get()
                .map_or(0, |s| s.retired.load(Ordering::Acquire))
        })
        .collect();
    let bytes = writer.finish(
        root.epoch + 1,
        inner.next_ino.load(Ordering::Acquire),
        inner.progress.current_order(),
        &retired,
    );
    let written = write_snapshot(inner, &bytes)?;
    inner
        .snapshot_bytes
        .store(bytes.len() as u64, Ordering::Relaxed);
    // Metadata operations are held off by the gate and batches run on this thread: nothing
    // grew since the image was taken.
    inner.snapshot_growth.store(0, Ordering::Relaxed);
    inner.volume.fence();
    let old = Extent {
        start: volume::GlobalAddress::from_raw(root.snapshot_addr),
        len_bytes: root.snapshot_len.next_multiple_of(BLOCK),
    };
    let mut next = root.clone();
    next.generation += 1;
    next.epoch += 1;
    next.snapshot_addr = written.named.start.raw();
    next.snapshot_len = written.named_len;
    let slots = created_slots(inner);
    // An unmount's snapshot grows none: the next open starts from it with the journals it
    // finds.
    let mut grown = if seal {
        Vec::new()
    } else {
        grown_journals(inner, &slots, &mut next, bytes.len() as u64)
    };
    next.write(&inner.owner)?;
    for slot in &slots {
        match grown.iter().position(|g| g.slot == slot.index) {
            Some(at) => {
                let g = grown.swap_remove(at);
                let added = g.journal.capacity() - g.old.len_bytes;
                *slot.journal() = g.journal;
                // The root no longer names the area it replaced.
                inner.volume.free(g.old)?;
                inner
                    .counters
                    .slot_bytes
                    .fetch_add(added, Ordering::Relaxed);
            }
            None => slot.journal().reset(next.epoch, seal)?,
        }
    }
    *root = next;
    drop(root);
    let old_pieces = std::mem::replace(
        &mut *inner.snapshot_pieces.lock().expect("snapshot pieces"),
        written.pieces,
    );
    inner.volume.free(old)?;
    for piece in old_pieces {
        inner.volume.free(piece)?;
    }
    inner.counters.metadata_bytes.fetch_add(
        written.named_len + written.pieces_bytes + crate::root::ROOT_BYTES,
        Ordering::Relaxed,
    );
    inner.counters.snapshots.fetch_add(1, Ordering::Relaxed);
    Ok(())
}

/// Counts how long a snapshot held the gate, when dropped
/// ([`crate::FsStats::snapshot_pause_last_ns`] and the two beside it).
struct PauseTimer<'a> {
    counters: &'a crate::fs::FsCounters,
    started: std::time::Instant,
}

impl<'a> PauseTimer<'a> {
    fn start(counters: &'a crate::fs::FsCounters) -> Self {
        Self {
            counters,
            started: std::time::Instant::now(),
        }
    }
}

impl Drop for PauseTimer<'_> {
    fn drop(&mut self) {
        let ns = u64::try_from(self.started.elapsed().as_nanos()).unwrap_or(u64::MAX);
        let c = self.counters;
        c.snapshot_pause_last_ns.store(ns, Ordering::Relaxed);
        c.snapshot_pause_max_ns.fetch_max(ns, Ordering::Relaxed);
        c.snapshot_pause_total_ns.fetch_add(ns, Ordering::Relaxed);
    }
}

/// Largest journal a writer's slot grows to ([`grown_journals`]).
const MAX_GROWN_JOURNAL: u64 = 64 << 20;

/// A writer's journal made larger at a snapshot, ready to take the old one's place once the
/// root that names it is written.
struct GrownJournal {
    slot: u32,
    journal: Journal,
    old: Extent,
}

/// Writers' journals grow with the file system: each snapshot asks for one when a writer's
/// journal passes its mark, so with journals of a fixed size a file system of many files
/// paid a whole snapshot — the gate holding every metadata operation off — for every few
/// thousand operations, and the cost of an operation grew with the files there were
/// (creating files through the preload library: 19 µs each on an empty volume, 44 µs on one
/// of 320,000 files, with stalls of 200 ms). A writer's journal is grown to a quarter of the
/// snapshot just written (a power of two, up to [`MAX_GROWN_JOURNAL`]; all writers'
/// journals together within a 32nd of the volume), so that snapshots come after a share of
/// metadata operations proportional to what they cost. Each new area
/// is zeroed and starts the next epoch before the root names it (`next`, written by the
/// caller): a crash before that write leaves the old journal named and this area unowned;
/// after it, the new one. A journal is never shrunk. Growth is skipped, never an error,
/// when the volume has little room to spare (the areas come straight from the volume: the
/// checkpoint must not wait for writers to give room back while it holds the gate).
fn grown_journals(
    inner: &Inner,
    slots: &[Arc<Slot>],
    next: &mut crate::root::Root,
    snapshot_len: u64,
) -> Vec<GrownJournal> {
    let want = (snapshot_len / 4)
        .next_power_of_two()
        .clamp(next.journal_bytes, MAX_GROWN_JOURNAL);
    let mut grown = Vec::new();
    for slot in slots.iter().filter(|s| s.index != 0) {
        let areas = &next.slots[slot.index as usize];
        if areas.journal_len >= want {
            continue;
        }
        // Room for it eight times over beside the checkpoint's reserve, and writers'
        // journals within a 32nd of the volume (many threads on a large file system), or
        // none is grown.
        let journals: u64 = next.slots[1..].iter().map(|a| a.journal_len).sum();
        if inner.volume.free_bytes() < inner.reserve_bytes() + 8 * want
            || journals + (want - areas.journal_len) > inner.volume.data_bytes() / 32
        {
            break;
        }
        let Ok(extent) = inner.volume.alloc_local(want) else {
            break;
        };
        let made = inner
            .volume
            .region(&extent)
            .map_err(FsError::from)
            .and_then(|region| Journal::fresh(region, next.epoch));
        let journal = match made {
            Ok(journal) => journal,
            Err(error) => {
                tracing::warn!(%error, slot = slot.index, "a larger journal could not be made");
                let _ = inner.volume.free(extent);
                break;
            }
        };
        let areas = &mut next.slots[slot.index as usize];
        let old = Extent {
            start: volume::GlobalAddress::from_raw(areas.journal_addr),
            len_bytes: areas.journal_len.next_multiple_of(BLOCK),
        };
        areas.journal_addr = extent.start.raw();
        areas.journal_len = want;
        grown.push(GrownJournal {
            slot: slot.index,
            journal,
            old,
        });
    }
    grown
}

/// Where a snapshot went: the extent the root names (the snapshot, or an index of its
/// pieces) and its length, and the pieces.
struct Written {
    named: Extent,
    named_len: u64,
    pieces: Vec<Extent>,
    pieces_bytes: u64,
}

/// Writes a snapshot's bytes (non-temporal; durable at the caller's fence) into one fresh
/// extent, or — when free memory is left only in smaller pieces, as after many small
/// frees — into as few pieces as it can get ([`alloc_halving`]), named by an index. A
/// snapshot that cannot be placed must not stop the file system for want of one contiguous
/// extent.
fn write_snapshot(inner: &Inner, bytes: &[u8]) -> Result<Written> {
    let len = bytes.len() as u64;
    let mut pieces: Vec<Piece<Extent>> = Vec::new();
    let placed = alloc_halving(
        len,
        BLOCK,
        crate::snapshot::MAX_PIECES as usize,
        &mut pieces,
        |_, n| inner.alloc_local(n.next_multiple_of(BLOCK)),
    )
    .and_then(|()| {
        for piece in &pieces {
            let (region, at) = inner.region_at(piece.item.start.raw())?;
            region.write_nt(
                at,
                &bytes[piece.at as usize..(piece.at + piece.len) as usize],
            )?;
        }
        Ok(())
    });
    let give_back = |pieces: Vec<Piece<Extent>>| {
        for piece in pieces {
            if let Err(e) = inner.volume.free(piece.item) {
                tracing::error!(error = %e, "returning a snapshot piece failed");
            }
        }
    };
    if let Err(e) = placed {
        give_back(pieces);
        return Err(e);
    }
    if let [whole] = pieces.as_slice() {
        return Ok(Written {
            named: whole.item,
            named_len: len,
            pieces: Vec::new(),
            pieces_bytes: 0,
        });
    }
    // The index, in pages of one block each (a block is the one size fragmented memory is
    // sure to have), each naming the next; the root names the first.
    let chunks: Vec<&[Piece<Extent>]> = pieces.chunks(INDEX_PAGE_PIECES).collect();
    let mut pages: Vec<Extent> = Vec::with_capacity(chunks.len());
    let written = chunks
        .iter()
        .try_for_each(|_| {
            pages.push(inner.alloc_local(INDEX_PAGE_BYTES)?);
            Ok(())
        })
        .and_then(|()| {
            let encoded: Vec<Vec<u8>> = (0..chunks.len())
                .rev()
                .scan(None, |next: &mut Option<(u64, u64)>, i| {
                    let bytes = SnapshotIndex {
                        total: len,
                        pieces: chunks[i]
                            .iter()
                            .map(|p| (p.item.start.raw(), p.len))
                            .collect(),
                        next: *next,
                    }
                    .encode();
                    *next = Some((pages[i].start.raw(), bytes.len() as u64));
                    Some(bytes)
                })
                .collect();
            for (page, bytes) in pages.iter().zip(encoded.iter().rev()) {
                let (region, at) = inner.region_at(page.start.raw())?;
                region.write_nt(at, bytes)?;
            }
            Ok(encoded.last().map_or(0, |first| first.len() as u64))
        });
    let first_len = match written {
        Ok(first_len) => first_len,
        Err(e) => {
            for page in pages {
                if let Err(e) = inner.volume.free(page) {
                    tracing::error!(error = %e, "returning a snapshot index page failed");
                }
            }
            give_back(pieces);
            return Err(e);
        }
    };
    tracing::info!(
        bytes = len,
        pieces = pieces.len(),
        "snapshot written in pieces: no single free extent could hold it"
    );
    let named = pages[0];
    let more_pages = (pages.len() as u64 - 1) * INDEX_PAGE_BYTES;
    Ok(Written {
        named,
        named_len: first_len,
        pieces: pieces
            .into_iter()
            .map(|p| p.item)
            .chain(pages.into_iter().skip(1))
            .collect(),
        pieces_bytes: len + more_pages,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Entries noted per run of a file's records (files interleaved, as records in log
    /// order are) come out one per file, in inode order, each at its runs' largest size,
    /// time and order.
    #[test]
    fn sizes_noted_per_run_merge_to_one_entry_per_file() {
        let e = |ino, size, mtime, order| SizeEntry {
            ino,
            size,
            mtime,
            order,
        };
        let noted = vec![
            e(7, 100, 5, 1),
            e(3, 10, 9, 2),
            e(7, 50, 8, 3),
            e(3, 20, 1, 4),
            e(5, 1, 1, 5),
        ];
        assert_eq!(
            merged_sizes(noted),
            vec![e(3, 20, 9, 4), e(5, 1, 1, 5), e(7, 100, 8, 3)]
        );
    }

    /// What applying needs of the order: a permutation of the batch, files and their
    /// stretches each together and ascending; counted (few files over few stretches), a
    /// stretch's records in log order.
    fn check_file_order(
        records: &[(u64, u64)],
    ) -> Result<(), proptest::test_runner::TestCaseError> {
        let mut order: Vec<(u64, u64, u32)> = records
            .iter()
            .enumerate()
            .map(|(i, &(ino, offset))| (ino, offset, i as u32))
            .collect();
        in_file_order(&mut order, &mut Counting::default());
        let mut seen: Vec<u32> = order.iter().map(|&(_, _, i)| i).collect();
        seen.sort_unstable();
        proptest::prop_assert_eq!(seen, (0..records.len() as u32).collect::<Vec<_>>());
        for &(ino, offset, i) in &order {
            proptest::prop_assert_eq!(records[i as usize], (ino, offset));
        }
        let mut spans: std::collections::BTreeMap<u64, (u64, u64)> = Default::default();
        for &(ino, offset) in records {
            let stretch = offset / GROUP_STRETCH;
            let span = spans.entry(ino).or_insert((stretch, stretch));
            *span = (span.0.min(stretch), span.1.max(stretch));
        }
        let stretches: u64 = spans.values().map(|(low, high)| high - low + 1).sum();
        let counted = spans.len() <= COUNTED_FILES && stretches <= COUNTED_STRETCHES;
        for pair in order.windows(2) {
            let key = |&(ino, offset, _): &(u64, u64, u32)| (ino, offset / GROUP_STRETCH);
            proptest::prop_assert!(key(&pair[0]) <= key(&pair[1]), "{:?}", pair);
            if counted && key(&pair[0]) == key(&pair[1]) {
                proptest::prop_assert!(
                    pair[0].2 < pair[1].2,
                    "log order within a stretch: {:?}",
                    pair
                );
            }
        }
        Ok(())
    }

    proptest::proptest! {
        #[test]
        fn one_files_batch_is_counted_into_stretch_order(
            offsets in proptest::collection::vec(0u64..(64 * GROUP_STRETCH), 0..300),
        ) {
            let records: Vec<(u64, u64)> = offsets.iter().map(|&o| (7, o)).collect();
            check_file_order(&records)?;
        }

        #[test]
        fn a_few_files_batch_is_counted_into_file_and_stretch_order(
            records in proptest::collection::vec(
                (proptest::prop_oneof![1u64..4, 0u64..u64::MAX], 0u64..(64 * GROUP_STRETCH)),
                0..300,
            ),
        ) {
            check_file_order(&records)?;
        }

        #[test]
        fn batches_of_many_files_or_wide_spans_are_sorted(
            records in proptest::collection::vec(
                (
                    proptest::prop_oneof![1u64..4, 0u64..(2 * COUNTED_FILES as u64)],
                    proptest::prop_oneof![0u64..(4 * GROUP_STRETCH), 0u64..u64::MAX / 2],
                ),
                0..300,
            ),
        ) {
            check_file_order(&records)?;
        }
    }
}
