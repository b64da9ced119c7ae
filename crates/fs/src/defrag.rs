//! Idle-time defragmentation of files that small overwrites scattered.
//!
//! An aligned overwrite is remapped, not copied: the checkpoint makes the write's buffer
//! blocks the file's (write amplification near 1, the Libpubl design). The price shows
//! later: a file overwritten at random 4 KiB places ends up in 4 KiB pieces all over the
//! devices, and reading it gathers scattered pages. Measured on this project's 2-core VM
//! (`locus serve`, fio's nbd engine, 64 KiB random reads of a 256 MiB region):
//! 3.1–3.4 GB/s on a freshly written export, 1.8–1.9 GB/s after 5 s of 4 KiB random writes;
//! the server's profile is the kernel copying the scattered pages into the socket.
//!
//! So the checkpoint notes every 2 MiB window of a file into which it remaps fewer blocks
//! than the window holds ([`Defrag::note`]). Once no caller has written for [`IDLE`], this
//! module's thread takes
//! the noted windows in file order and rewrites each one still held in [`MIN_RUNS`] or more
//! pieces into one fresh 2 MiB extent: an ordinary write of the window's own bytes, under
//! the window's range lock from the read to the commit (no writer can slip between), logged
//! and checkpointed like any write — so it is atomic and crash-safe by the write path's own
//! rules, and the checkpoint remaps the new extent whole, freeing the pieces. The write
//! leaves the file's times alone (its record carries the file's current modification time).
//!
//! A window with holes (a sparse file, an export the client trimmed) is rewritten around
//! them: each data range between holes is copied to its place in the extent and committed
//! as one record of the write's group, so holes stay holes, and the extent's blocks under
//! them go back to the volume once the records retire. A window whose holes leave it in more
//! than an eighth as many ranges as pieces is not worth it (the ranges stay apart anyway).
//!
//! It skips, and forgets, a window that still has logged data the checkpoint has not moved,
//! that a shared mapping may point into (its blocks must stay put), or whose blocks fail
//! their data checksums (the damage must stay an error, not be copied into a block with a
//! fresh checksum). When no free 2 MiB extent is left it stops until the next idle spell;
//! a nearly full volume is not defragmented. A write arriving ends the pass at the next
//! window. The rewrites are media writes, counted in the write amplification, but only while
//! the file system is otherwise idle. `FsOptions::defrag` turns it off.
//!
//! Two things pay for rewrites. Writes earn a budget of 1/20 of their bytes
//! ([`BUDGET_SHARE`]), which bounds what scattering costs a write-only workload. Reads earn
//! the rest: a read that gathers its bytes from many small pieces ([`Defrag::read_scattered`])
//! credits each window it touched, and a window whose credit reaches about its own size
//! ([`READ_CREDIT_BYTES`]) is rewritten at the next idle spell whatever the budget says. Gathering scattered pages costs
//! about twice a contiguous copy here (the measurement above; a plain copy of 64 KiB from
//! sixteen random 4 KiB pages of a 1 GiB tmpfs mapping ran at 5.3 GB/s, from one place at
//! 10.2), so by the time a window has been read its size in scattered form, the reads have
//! already lost about what the rewrite costs (a read and a write of the window): rewriting
//! then is the rent-or-buy choice that never pays more than twice the best one in hindsight.

use std::collections::{BTreeSet, HashMap};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, RwLock};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use smallvec::{SmallVec, smallvec};

use crate::buffers::BufferSet;
use crate::error::{FsError, Result};
use crate::extent_map::BLOCK;
use crate::fs::{Inner, Slot};
use crate::inode::Inode;
use crate::journal::Kind;
use crate::range_lock::LockMode;

/// Bytes of a window: the volume's largest allocation, so a rewritten window is one extent.
pub(crate) const WINDOW_BYTES: u64 = 2 << 20;
/// Blocks of a window.
pub(crate) const WINDOW_BLOCKS: u64 = WINDOW_BYTES / BLOCK;
/// A window in fewer pieces than this is left alone: runs of 32 KiB or more on average read
/// nearly as fast as one (64 KiB random writes leave 32 pieces; 4 KiB ones, hundreds).
pub(crate) const MIN_RUNS: usize = 64;
/// How long the file system must have been unchanged before a pass starts.
pub(crate) const IDLE: Duration = Duration::from_millis(100);
/// Most windows remembered (noted, and queued by reads); past it, new ones are not queued
/// until some are done.
const MAX_NOTED: usize = 1 << 16;
/// The rewrites' bytes stay within this share of what callers have written since the file
/// system was opened: 1/20, so defragmenting adds at most 0.05 to the write amplification
/// whatever the workload (a database that writes a few dozen scattered blocks per window and
/// pauses would otherwise pay 2 MiB per window per pause).
const BUDGET_SHARE: u64 = 20;
/// A read is scattered when it gathers at least this many pieces ...
pub(crate) const SCATTERED_PIECES: usize = 4;
/// ... of this many bytes or fewer on average (the average piece of a window in
/// [`MIN_RUNS`] pieces).
pub(crate) const SCATTERED_PIECE_BYTES: u64 = WINDOW_BYTES / MIN_RUNS as u64;
/// Scattered bytes read from a window that earn its rewrite: about the window's size (see
/// the module's documentation) — three quarters of it, because a pass over a file often comes
/// in reads a little short of 1 MiB (a FUSE read request is 1 MiB less its 16-byte header),
/// whose windows would otherwise stop 32 bytes short, the rest read apart in one piece.
const READ_CREDIT_BYTES: u64 = WINDOW_BYTES / 4 * 3;

/// The noted windows and the thread's stop flag.
#[derive(Debug, Default)]
pub(crate) struct Defrag {
    state: Mutex<State>,
    changed: Condvar,
    /// Held (shared) through each rewrite; [`crate::Fs::quiesced`] takes it exclusively, so
    /// that no rewrite creates a slot, logs or allocates while a live check reads the media.
    pub(crate) pause: RwLock<()>,
    /// Bytes of rewrites paid from the writes' budget (not those reads earned).
    budget_spent: AtomicU64,
    /// Windows rewritten because reads earned it.
    pub(crate) earned_by_reads: AtomicU64,
}

#[derive(Debug, Default)]
struct State {
    /// (inode, window index), in file order: to look at in the next idle spell.
    noted: BTreeSet<(u64, u64)>,
    /// Windows a pass could not rewrite for want of budget or of a free 2 MiB extent: back
    /// to `noted` once callers have written more or the checkpoint has freed something.
    deferred: BTreeSet<(u64, u64)>,
    /// Scattered bytes read from each window since it last earned a rewrite.
    read_credit: HashMap<(u64, u64), u64>,
    /// Windows whose reads earned a rewrite: taken before `noted`, outside the budget.
    hot: BTreeSet<(u64, u64)>,
    /// Windows ever moved to `hot`: a new one ends a stalled wait.
    hot_added: u64,
    /// Windows [`Defrag::note`] put in `noted` lately, each in the place its hash picks
    /// ([`RECENT_WINDOWS`]), with `taken_from_noted` as it was then: such a window is in
    /// `noted` still while that count has not moved since. A batch of random small
    /// overwrites notes the same windows as the batch before, and looking each one up in
    /// `noted` again was 3–5 % of the checkpoint's samples.
    recent: Vec<Option<(u64, u64, u64)>>,
    /// Times a window left `noted` (taken, deferred, moved to `hot`).
    taken_from_noted: u64,
    stop: bool,
}

/// Places in [`State::recent`]: a file's windows take consecutive places, so a file of up to
/// 8 GiB overwritten at random keeps all of its windows there (128 KiB of DRAM, made by the
/// first note). With room for 512 MiB, a 2 GiB file's windows pushed each other out and
/// every note of one took two B-tree updates: 41 ns of the checkpoint's time per 4 KiB
/// write (`bench fs --bs 4K --size 2G`), a seventh of it.
const RECENT_WINDOWS: usize = 4096;

impl State {
    /// The place of `(ino, window)` in `recent`.
    fn recent_place(ino: u64, window: u64) -> usize {
        (ino.wrapping_mul(0x9e37_79b9_7f4a_7c15).wrapping_add(window) % RECENT_WINDOWS as u64)
            as usize
    }
}

/// What a window's rewrite did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Outcome {
    /// Rewritten into one extent.
    Rewritten,
    /// Left as it is (gone, in few pieces, cut up by holes, logged data or a mapping).
    Skipped,
    /// No free extent of a window's size: the pass stops.
    NoSpace,
    /// The rewrites have used their share of what callers wrote ([`BUDGET_SHARE`]).
    OverBudget,
    /// A window reads paid for still has logged data over it: the pass stops, the window
    /// waits (still paid for) until the checkpoint has finished another batch.
    Logged,
}

impl Defrag {
    /// Notes the windows of `ino` that blocks `[block, block + blocks)` touch, after the
    /// checkpoint remapped them there.
    pub(crate) fn note(&self, maps: impl Iterator<Item = (u64, u64, u64)>) {
        let mut state = self.state.lock().expect("defrag state");
        let state = &mut *state;
        let before = state.noted.len();
        if state.recent.is_empty() {
            state.recent = vec![None; RECENT_WINDOWS];
        }
        // The checkpoint's maps come in file order: neighbours often share a window, which
        // is then noted once (two B-tree look-ups saved per map).
        let mut last = None;
        for (ino, block, blocks) in maps {
            if blocks >= WINDOW_BLOCKS {
                continue;
            }
            for window in block / WINDOW_BLOCKS..=(block + blocks - 1) / WINDOW_BLOCKS {
                if last == Some((ino, window)) {
                    continue;
                }
                last = Some((ino, window));
                let place = State::recent_place(ino, window);
                let noted_lately = Some((ino, window, state.taken_from_noted));
                if state.recent[place] == noted_lately {
                    continue;
                }
                if state.noted.len() >= MAX_NOTED {
                    break;
                }
                state.deferred.remove(&(ino, window));
                state.noted.insert((ino, window));
                state.recent[place] = noted_lately;
            }
        }
        if before == 0 && !state.noted.is_empty() {
            self.changed.notify_all();
        }
    }

    /// Looks at where a read of `ino` found its bytes (`(file start, file end, source)`
    /// segments in file order, as [`Inner::pieces`] makes them) and credits each window whose
    /// part of the read was scattered ([`SCATTERED_PIECES`] or more pieces of
    /// [`SCATTERED_PIECE_BYTES`] or less on average) with that part's bytes. A window whose
    /// credit reaches [`READ_CREDIT_BYTES`] is queued for rewriting outside the budget.
    pub(crate) fn read_scattered(&self, ino: u64, segments: &[(u64, u64, Option<u64>)]) {
        // (window, bytes, pieces) of the read, in file order.
        let mut parts: SmallVec<[(u64, u64, u64); 4]> = SmallVec::new();
        for &(start, stop, _) in segments {
            let mut at = start;
            while at < stop {
                let window = at / WINDOW_BYTES;
                let to = stop.min((window + 1) * WINDOW_BYTES);
                match parts.last_mut() {
                    Some(last) if last.0 == window => {
                        last.1 += to - at;
                        last.2 += 1;
                    }
                    _ => parts.push((window, to - at, 1)),
                }
                at = to;
            }
        }
        parts.retain(|&mut (_, bytes, pieces)| {
            pieces >= SCATTERED_PIECES as u64 && bytes < pieces * SCATTERED_PIECE_BYTES
        });
        if parts.is_empty() {
            return;
        }
        let mut state = self.state.lock().expect("defrag state");
        let state = &mut *state;
        let mut woke = false;
        for (window, bytes, _) in parts {
            let key = (ino, window);
            if state.hot.contains(&key) || state.hot.len() >= MAX_NOTED {
                continue;
            }
            // Credits of files since removed, or read scattered once long ago, would fill the
            // table for good: when it is full, every partial credit starts over (which only
            // delays those windows' rewrites).
            if state.read_credit.len() >= MAX_NOTED && !state.read_credit.contains_key(&key) {
                state.read_credit.clear();
            }
            let credit = state.read_credit.entry(key).or_default();
            *credit += bytes;
            if *credit >= READ_CREDIT_BYTES {
                state.read_credit.remove(&key);
                state.taken_from_noted += u64::from(state.noted.remove(&key));
                state.deferred.remove(&key);
                state.hot.insert(key);
                state.hot_added += 1;
                woke = true;
            }
        }
        if woke {
            self.changed.notify_all();
        }
    }

    /// Windows noted (by the checkpoint or by reads) and not yet looked at.
    pub(crate) fn noted(&self) -> usize {
        let state = self.state.lock().expect("defrag state");
        state.noted.len() + state.hot.len()
    }

    /// Puts a window reads paid for back in their queue (see [`Outcome::Logged`]).
    fn queue_hot(&self, window: (u64, u64)) {
        self.state.lock().expect("defrag state").hot.insert(window);
    }

    /// Windows that reads have ever queued for rewriting.
    fn hot_added(&self) -> u64 {
        self.state.lock().expect("defrag state").hot_added
    }

    /// Windows waiting for budget or free space.
    pub(crate) fn deferred(&self) -> usize {
        self.state.lock().expect("defrag state").deferred.len()
    }

    /// Puts `window` and every window still noted off: what stopped this one (the budget,
    /// free space) stops them all.
    fn defer_all(&self, window: (u64, u64)) {
        let mut state = self.state.lock().expect("defrag state");
        state.deferred.insert(window);
        let noted = std::mem::take(&mut state.noted);
        state.taken_from_noted += noted.len() as u64;
        state.deferred.extend(noted);
    }

    fn requeue_deferred(&self) {
        let mut state = self.state.lock().expect("defrag state");
        let deferred = std::mem::take(&mut state.deferred);
        state.noted.extend(deferred);
    }

    fn request_stop(&self) {
        self.state.lock().expect("defrag state").stop = true;
        self.changed.notify_all();
    }

    /// Waits up to `wait` (forever when nothing is noted); true when asked to stop.
    fn wait(&self, wait: Duration) -> bool {
        let state = self.state.lock().expect("defrag state");
        let state = if state.noted.is_empty() && state.hot.is_empty() && !state.stop {
            self.changed
                .wait_while(state, |s| s.noted.is_empty() && s.hot.is_empty() && !s.stop)
                .expect("defrag state")
        } else {
            self.changed
                .wait_timeout_while(state, wait, |s| !s.stop)
                .expect("defrag state")
                .0
        };
        state.stop
    }

    fn stopping(&self) -> bool {
        self.state.lock().expect("defrag state").stop
    }

    /// The next window to look at, and whether reads earned its rewrite.
    fn take_first(&self) -> Option<((u64, u64), bool)> {
        let mut state = self.state.lock().expect("defrag state");
        match state.hot.pop_first() {
            Some(window) => Some((window, true)),
            None => {
                let window = state.noted.pop_first()?;
                state.taken_from_noted += 1;
                Some((window, false))
            }
        }
    }
}

/// The defragmenting thread; [`Defragmenter::stop`] (or drop) ends it.
#[derive(Debug)]
pub(crate) struct Defragmenter {
    inner: Arc<Inner>,
    thread: Option<JoinHandle<()>>,
}

impl Defragmenter {
    /// Starts the thread: none when `FsOptions::defrag` is off or the checkpoint runs on
    /// demand (whose logs hold only what callers wrote, for measurements and tests).
    pub(crate) fn start(inner: &Arc<Inner>) -> Result<Option<Self>> {
        if !inner.options.defragments() {
            return Ok(None);
        }
        let for_thread = Arc::clone(inner);
        let thread = std::thread::Builder::new()
            .name("locus-defrag".into())
            .spawn(move || {
                for_thread.options.thread_started();
                run(&for_thread);
            })
            .map_err(|e| FsError::Shutdown(format!("cannot start the defrag thread: {e}")))?;
        Ok(Some(Self {
            inner: Arc::clone(inner),
            thread: Some(thread),
        }))
    }

    /// Ends the thread after the window it is rewriting, if any.
    pub(crate) fn stop(&mut self) {
        if let Some(thread) = self.thread.take() {
            self.inner.defrag.request_stop();
            if thread.join().is_err() {
                tracing::error!("the defrag thread panicked");
            }
        }
    }
}

impl Drop for Defragmenter {
    fn drop(&mut self) {
        self.stop();
    }
}

fn run(inner: &Arc<Inner>) {
    let defrag = &inner.defrag;
    let mut seen = inner.caller_writes();
    let mut quiet_since = Instant::now();
    // After a pass stopped short (no free window-sized extent, or the budget used up): the
    // checkpoint batches finished, the caller bytes written and the windows reads queued
    // then. Nothing is tried again until one has moved (a batch may have freed a window's
    // worth; writes add budget; reads earn a window its rewrite).
    let mut stalled_at: Option<(u64, u64, u64)> = None;
    let progress = || {
        (
            inner.progress.batches_finished(),
            inner.caller_bytes(),
            defrag.hot_added(),
        )
    };
    loop {
        if defrag.wait(IDLE / 2) {
            return;
        }
        let now = inner.caller_writes();
        if now != seen {
            seen = now;
            quiet_since = Instant::now();
            continue;
        }
        if quiet_since.elapsed() < IDLE
            || inner.check_running().is_err()
            || stalled_at == Some(progress())
        {
            continue;
        }
        if stalled_at.take().is_some() {
            defrag.requeue_deferred();
        }
        // A pass: windows in file order until something else changes the file system.
        while !defrag.stopping() {
            if inner.caller_writes() != seen {
                break;
            }
            let Some(((ino, window), earned)) = defrag.take_first() else {
                break;
            };
            match inner.rewrite_window(ino, window, earned) {
                Ok(Outcome::Rewritten | Outcome::Skipped) => continue,
                Ok(Outcome::Logged) => defrag.queue_hot((ino, window)),
                Ok(Outcome::NoSpace | Outcome::OverBudget) => defrag.defer_all((ino, window)),
                Err(e) => {
                    tracing::debug!(ino, window, error = %e, "window not defragmented");
                    continue;
                }
            }
            // Stopped short: wait for something to move before the next try.
            stalled_at = Some(progress());
            break;
        }
        quiet_since = Instant::now();
    }
}

impl Inner {
    /// Rewrites window `window` of file `ino` into one fresh extent when it is in [`MIN_RUNS`]
    /// or more pieces that its holes split into at most an eighth as many data ranges, with
    /// nothing logged over it and no shared mapping. Each data range becomes one piece of the
    /// extent, at its place in the window; holes stay holes.
    /// `earned`: reads paid for it ([`Defrag::read_scattered`]), so the writes' budget is not
    /// asked.
    pub(crate) fn rewrite_window(
        self: &Arc<Self>,
        ino: u64,
        window: u64,
        earned: bool,
    ) -> Result<Outcome> {
        let Some(inode) = self.inode(ino) else {
            return Ok(Outcome::Skipped);
        };
        if inode.kind != Kind::File {
            return Ok(Outcome::Skipped);
        }
        let offset = window * WINDOW_BYTES;
        let first = window * WINDOW_BLOCKS;
        let fragmented = |inode: &Inode| {
            let size = inode.size.load(Ordering::Acquire);
            if offset + WINDOW_BYTES > size
                || inode.dead.load(Ordering::Acquire)
                || inode.mapped.load(Ordering::Acquire) > 0
            {
                return false;
            }
            let runs = inode
                .extents
                .read()
                .expect("extent map")
                .lookup(first, first + WINDOW_BLOCKS);
            runs.len() >= MIN_RUNS
                && data_ranges(&runs, first).len() * 8 <= runs.len()
                && inode
                    .overlay
                    .lookup(offset, offset + WINDOW_BYTES)
                    .is_empty()
        };
        // Logged data the checkpoint has not moved yet is passing: a window reads paid for
        // waits for it rather than being forgotten (the checkpoint notes the window again when
        // it moves the data, but as one for the writes' budget).
        if earned
            && !inode.dead.load(Ordering::Acquire)
            && !inode
                .overlay
                .lookup(offset, offset + WINDOW_BYTES)
                .is_empty()
        {
            return Ok(Outcome::Logged);
        }
        // A cheap look before taking space and a record slot; the answer is checked again
        // under the range lock.
        if !fragmented(&inode) {
            return Ok(Outcome::Skipped);
        }
        let _running = self
            .defrag
            .pause
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let spent = self.defrag.budget_spent.load(Ordering::Relaxed);
        if !earned && (spent + WINDOW_BYTES) * BUDGET_SHARE > self.caller_bytes() {
            return Ok(Outcome::OverBudget);
        }
        let slot = self.slot()?;
        // One record per data range, and a window rewritten has at most an eighth as many
        // ranges as its at most `WINDOW_BLOCKS` pieces.
        self.reserve_log(&slot, WINDOW_BLOCKS / 8)?;
        // Not `alloc_buffer`: a window is not worth emptying the recycled lists for.
        let extent = match self.alloc_buffer_once(WINDOW_BYTES) {
            Ok(extent) => extent,
            Err(e) if e.kind() == crate::ErrorKind::NoSpace => return Ok(Outcome::NoSpace),
            Err(e) => return Err(e),
        };
        let dest = extent.start.raw();
        // Sealed with one record per data range once they are known, under the range lock.
        let set = Arc::new(BufferSet::new(smallvec![extent]));
        match self.copy_and_commit(&slot, &inode, window, dest, &set, &fragmented) {
            Ok(Some(bytes)) => {
                if earned {
                    self.defrag.earned_by_reads.fetch_add(1, Ordering::Relaxed);
                } else {
                    self.defrag.budget_spent.fetch_add(bytes, Ordering::Relaxed);
                }
                Ok(Outcome::Rewritten)
            }
            // Nothing refers to the extent unless a record does: freed here otherwise (a set
            // sealed with no record is its sealer's to reclaim).
            outcome => {
                if !set.is_sealed() && set.seal() {
                    set.reclaim(&self.volume)?;
                }
                outcome.map(|_| Outcome::Skipped)
            }
        }
    }

    /// Under the window's range lock: checks it is still worth rewriting, copies its blocks
    /// into `dest` (the whole of the unsealed `set`, each block at its place in the window)
    /// and commits each data range as one record of one group. The bytes rewritten, or
    /// `None` when the window no longer qualifies (then `set` has no record and is not
    /// sealed).
    fn copy_and_commit(
        &self,
        slot: &Slot,
        inode: &Inode,
        window: u64,
        dest: u64,
        set: &Arc<BufferSet>,
        fragmented: &impl Fn(&Inode) -> bool,
    ) -> Result<Option<u64>> {
        let (offset, first) = (window * WINDOW_BYTES, window * WINDOW_BLOCKS);
        let _range = self.lock_range(inode, offset, WINDOW_BYTES, LockMode::Exclusive)?;
        if !fragmented(inode) {
            return Ok(None);
        }
        let runs = inode
            .extents
            .read()
            .expect("extent map")
            .lookup(first, first + WINDOW_BLOCKS);
        for run in &runs {
            let from = run.file_block.max(first);
            let to = (run.file_block + run.blocks).min(first + WINDOW_BLOCKS);
            let src = run.addr + (from - run.file_block) * BLOCK;
            let len = (to - from) * BLOCK;
            // A damaged block is not copied (it would get a fresh, valid checksum).
            self.verify_data(inode.ino, from * BLOCK, src, len)?;
            self.copy_pmem(src, dest + (from - first) * BLOCK, len)?;
        }
        // (window offset, length) of each data range.
        let ranges = data_ranges(&runs, first);
        for &(at, len) in &ranges {
            self.note_filled_in_place(dest + at, len)?;
        }
        // The copy is durable before the records that point at it can be.
        self.volume.fence();
        // The record's time moves neither time: the checkpoint and recovery only raise a
        // file's modification and change times to a record's (0 would mean "now").
        let time = inode
            .mtime
            .load(Ordering::Acquire)
            .min(inode.ctime.load(Ordering::Acquire))
            .max(1);
        for _ in &ranges {
            set.add_record();
        }
        set.seal();
        if let Err(e) = self.commit_locked(slot, inode, offset, &ranges, dest, set, time) {
            // A group is appended whole or not at all: no record points at the extent.
            let mut last = false;
            for _ in &ranges {
                last |= set.release();
            }
            if last {
                set.reclaim(&self.volume)?;
            }
            return Err(e);
        }
        let bytes = ranges.iter().map(|&(_, len)| len).sum();
        slot.counters.count_media(bytes);
        self.counters
            .defragmented_windows
            .fetch_add(1, Ordering::Relaxed);
        Ok(Some(bytes))
    }
}

/// The data ranges of a window whose first block is `first`, as `(offset in the window,
/// length)` in bytes: its extent-map `runs` (in file order), clipped to the window, with
/// touching runs joined. Holes separate ranges.
fn data_ranges(runs: &[crate::extent_map::Run], first: u64) -> SmallVec<[(u64, u64); 4]> {
    let mut ranges: SmallVec<[(u64, u64); 4]> = SmallVec::new();
    for run in runs {
        let from = run.file_block.max(first) - first;
        let to = (run.file_block + run.blocks).min(first + WINDOW_BLOCKS) - first;
        if to <= from {
            continue;
        }
        match ranges.last_mut() {
            Some((at, len)) if *at + *len == from * BLOCK => *len += (to - from) * BLOCK,
            _ => ranges.push((from * BLOCK, (to - from) * BLOCK)),
        }
    }
    ranges
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A window the checkpoint notes again after it left the noted set — taken by a pass,
    /// or deferred — is noted again, although it was noted lately; while it stays noted,
    /// noting it again changes nothing.
    #[test]
    fn a_window_noted_lately_is_noted_again_once_it_left() {
        let defrag = Defrag::default();
        let maps = |windows: &[u64]| {
            windows
                .iter()
                .map(|&w| (7, w * WINDOW_BLOCKS + 3, 1))
                .collect::<Vec<_>>()
        };
        defrag.note(maps(&[0, 1, 2]).into_iter());
        defrag.note(maps(&[0, 1, 2]).into_iter());
        assert_eq!(defrag.noted(), 3);
        assert_eq!(defrag.take_first(), Some(((7, 0), false)));
        assert_eq!(defrag.noted(), 2);
        defrag.note(maps(&[0, 1]).into_iter());
        assert_eq!(
            defrag.noted(),
            3,
            "the window a pass took was not noted again"
        );
        defrag.defer_all((7, 5));
        assert_eq!((defrag.noted(), defrag.deferred()), (0, 4));
        defrag.note(maps(&[1]).into_iter());
        assert_eq!(
            (defrag.noted(), defrag.deferred()),
            (1, 3),
            "a deferred window written again goes back to the noted ones"
        );
    }
}
