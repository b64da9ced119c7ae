//! The ordering protocol between writers and the checkpoint, in one type both sides call.
//!
//! Every log and journal record takes a place in one global order ([`Progress::next_order`]).
//! The checkpoint moves logged writes into their files strictly by that order, so it must
//! never pass a write that has taken (or is about to take) an order but is not queued yet:
//!
//! - a writer opens a [`Ticket`] on its slot's [`Queue`] before it takes its order: the
//!   ticket publishes a lower bound of the order in the queue (the end of the orders the
//!   slot took last: the counter only rises, so any order the writer takes is above it —
//!   the counter's own value would be a load of the cache line every writer adds to, on
//!   every write, and nothing below needs the bound to be close);
//!   [`Ticket::queue`] appends the write's [`Pending`] record and withdraws the bound, and
//!   dropping an unqueued ticket (a failed append) withdraws it too;
//! - the checkpoint's watermark ([`Progress::take_batch_into`]) is the least of the counter and
//!   every published bound: every record below it is queued, so a batch of the queued records
//!   below it, merged by order, is a prefix of what will ever be logged below it (a writer
//!   that took its order before the counter was read had published its bound before, and
//!   one that took it after has an order at least the counter's). The counter
//!   is read *before* the list of queues is taken ([`Progress::mark`]): a slot made after the
//!   list was taken has no record below a counter read before it (its writer made the slot,
//!   then took its order), while with the list taken first, a slot made in between held a
//!   record below the counter that no batch saw, and `done_below` passed it;
//! - `done_below` (every data record below it is part of its file) only rises, and only the
//!   checkpoint raises it ([`Progress::finish_batch`]).
//!
//! Wake-ups, never polling: the checkpoint sleeps until a writer finishes (when it is idle),
//! until a queue reaches [`GATHER_RECORDS`] (while it lets a small batch gather, a timed wait
//! that is batching, not polling), or until someone asks for something. Threads waiting on the
//! checkpoint (a drain, a snapshot, a writer out of space) wait for the end of its next pass.
//! A writer that finishes checks the checkpoint's sleep mode with one atomic load; the
//! checkpoint sets that mode and then looks for work again before it sleeps (both
//! sequentially consistent), so either the writer sees it sleeping and wakes it, or the
//! checkpoint sees the writer's record.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicU8, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::Duration;

use crate::buffers::BufferSet;
use crate::error::{FsError, Result};

/// A queue this deep wakes a checkpoint that is letting a batch gather. Larger batches
/// share the per-batch work (the journal record and its fence, the wake-ups) among more
/// records, and put more neighbouring records of a file in one of the
/// checkpoint's groups: measured with `bench fs --bs 4K --threads 2`, the checkpoint's CPU
/// time per record was 0.38 µs (medians of runs) at 256, 0.32-0.35 at 1024 and 0.31-0.34
/// at 4096, the writers' time unchanged. 1024 records of 4 KiB are 4 MiB, an eighth of a
/// writer's preliminary buffers.
pub(crate) const GATHER_RECORDS: usize = 1024;

/// The order counter as [`Progress::mark`] read it, before a list of queues was taken.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Mark(u64);

/// No writer of the slot is between taking an order and queueing its record.
const NO_BOUND: u64 = u64::MAX;

/// The checkpoint is working.
const AWAKE: u8 = 0;
/// The checkpoint lets a small batch gather: a queue reaching [`GATHER_RECORDS`] wakes it.
const GATHERING: u8 = 1;
/// The checkpoint has nothing to do: any writer that finishes wakes it.
const IDLE: u8 = 2;
/// The checkpoint moves records only on request: writers never wake it.
const WAITING_FOR_REQUESTS: u8 = 3;

/// A logged write the checkpoint has not moved into its file yet.
#[derive(Debug)]
pub(crate) struct Pending {
    pub(crate) slot: u32,
    /// The place of the record's first page in a set of recycled pages (its other pages'
    /// follow; [`crate::buffers::NO_PAGE`]: its buffer is not one; beside `slot`, it costs
    /// no room).
    pub(crate) page: u32,
    pub(crate) seq: u64,
    pub(crate) order: u64,
    pub(crate) ino: u64,
    pub(crate) offset: u64,
    pub(crate) len: u64,
    pub(crate) set: Arc<BufferSet>,
    /// The write's time (0: not recorded, an area of version 1).
    pub(crate) mtime: u64,
    /// Set when the writer remapped the write's block into the file's block table itself
    /// (`crate::overlay::Overlay::remap_block`): the checkpoint then only records the
    /// mapping and frees the block it replaced.
    pub(crate) remapped: Option<Remapped>,
}

/// A single-block write its writer made the file's block: the page now mapped, and the one
/// it replaced.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Remapped {
    pub(crate) page: u64,
    pub(crate) replaced: u64,
}

/// An atomic on cache lines of its own (no false sharing with its neighbours).
#[derive(Debug)]
#[repr(align(128))]
struct PaddedU64(AtomicU64);

/// What a slot's writer publishes on every write, on cache lines of their own: its writer
/// is the only thread that stores to them, so neither needs a locked instruction to count.
#[derive(Debug)]
#[repr(align(128))]
struct Published {
    /// The bound of an open ticket, or [`NO_BOUND`].
    bound: AtomicU64,
    /// Past every order this slot's writer took (0 before its first): the bound its next
    /// ticket publishes.
    floor: AtomicU64,
    /// Records ever queued here (recovery's included). With the checkpoint's count of
    /// records moved, this is how many are pending ([`Progress::pending`]): a count shared
    /// by every writer was a locked add on one contended cache line per write (about 5 % of
    /// each writer's time with two writers through the preload library).
    queued: AtomicU64,
}

/// One slot's side of the protocol: the bound its writer published, and its logged writes
/// waiting for the checkpoint, in order.
#[derive(Debug)]
pub(crate) struct Queue {
    published: Published,
    records: Mutex<VecDeque<Pending>>,
}

impl Queue {
    /// A queue holding `records` (recovery's live records of the slot, in order).
    pub(crate) fn with(records: VecDeque<Pending>) -> Self {
        debug_assert!(
            records
                .iter()
                .zip(records.iter().skip(1))
                .all(|(a, b)| a.order < b.order)
        );
        Self {
            published: Published {
                bound: AtomicU64::new(NO_BOUND),
                floor: AtomicU64::new(records.back().map_or(0, |p| p.order + 1)),
                queued: AtomicU64::new(records.len() as u64),
            },
            records: Mutex::new(records),
        }
    }

    fn records(&self) -> MutexGuard<'_, VecDeque<Pending>> {
        self.records.lock().expect("pending queue")
    }

    fn bound(&self) -> u64 {
        self.published.bound.load(Ordering::SeqCst)
    }

    fn queued(&self) -> u64 {
        self.published.queued.load(Ordering::Acquire)
    }
}

/// What the checkpoint was asked for, taken by it at the start of a pass.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Requests {
    pub(crate) snapshot: bool,
    /// Move everything (a writer out of room): passes until one moves nothing.
    pub(crate) drain: bool,
    /// One pass ([`Progress::drain`] asks for passes until its target is reached). Not
    /// `drain`: with the checkpoint on demand, a drain's passes went on until one found
    /// nothing, and took in writes made after the caller's drain had returned.
    pub(crate) pass: bool,
    pub(crate) stop: bool,
    /// Stop at once, leaving logs as a crash would (tests).
    pub(crate) abandon: bool,
}

#[derive(Debug, Default)]
struct State {
    asked: Requests,
    failed: Option<String>,
    /// Passes the checkpoint finished: waiters wait for it to change.
    passes: u64,
    /// Threads in [`Progress::await_pass`]: a pass with none wakes nobody (a `notify_all`
    /// is a `futex` call even when no one waits, and the checkpoint ends thousands of
    /// passes a second).
    awaiting: u32,
}

/// The records of one checkpoint batch, in order, and the `done_below` it earns.
#[derive(Debug)]
pub(crate) struct Batch {
    pub(crate) records: Vec<Pending>,
    pub(crate) done_below: u64,
}

/// The protocol's shared state: the order counter, `done_below`, the count of records moved,
/// requests and wake-ups.
#[derive(Debug)]
pub(crate) struct Progress {
    order: PaddedU64,
    done_below: AtomicU64,
    /// Records the checkpoint moved into their files (only it adds to this).
    moved: AtomicU64,
    /// Batches finished: raised *before* `moved` rises, so a writer that saw the pending
    /// count fall also sees the batch (and the memory it freed) counted here.
    finished: AtomicU64,
    state: Mutex<State>,
    /// Wakes the checkpoint.
    wake: Condvar,
    /// Wakes threads waiting for the end of a pass.
    passed: Condvar,
    /// How the checkpoint sleeps ([`AWAKE`], [`GATHERING`], [`IDLE`], ...).
    sleep: AtomicU8,
    /// Set (under the state lock) once the checkpoint failed or was asked to stop: every
    /// call checks it, and a load keeps the state's lock off their path.
    stopping: AtomicBool,
    /// Empty queues (each with the capacity of one taken before) that
    /// [`Progress::take_batch_into`] takes a queue's run of records into, or swaps for a queue
    /// it takes whole.
    spares: Mutex<Vec<VecDeque<Pending>>>,
}

/// A writer's claim on a place in the order, open from before it takes the order until its
/// record is queued (or it gave up).
#[must_use = "a ticket holds the checkpoint back until it is queued or dropped"]
pub(crate) struct Ticket<'a> {
    progress: &'a Progress,
    queue: &'a Queue,
    orders: Option<std::ops::Range<u64>>,
    closed: bool,
}

impl Progress {
    /// Orders continue from `next_order` (recovery's records are in their queues already,
    /// [`Queue::with`]).
    pub(crate) fn new(next_order: u64) -> Self {
        Self {
            order: PaddedU64(AtomicU64::new(next_order)),
            done_below: AtomicU64::new(0),
            moved: AtomicU64::new(0),
            finished: AtomicU64::new(0),
            state: Mutex::default(),
            wake: Condvar::new(),
            passed: Condvar::new(),
            sleep: AtomicU8::new(AWAKE),
            stopping: AtomicBool::new(false),
            spares: Mutex::default(),
        }
    }

    fn state(&self) -> MutexGuard<'_, State> {
        self.state.lock().expect("checkpoint state")
    }

    /// Takes the next place in the global order (journal records; data records take theirs
    /// through a [`Ticket`]).
    pub(crate) fn next_order(&self) -> u64 {
        self.order.0.fetch_add(1, Ordering::SeqCst)
    }

    /// Brings the order counter's line into this CPU's cache, owned, ahead of a
    /// [`Ticket::orders`].
    pub(crate) fn prefetch_order(&self) {
        pmem::prefetch_for_write(&self.order.0);
    }

    /// The next order to be taken.
    pub(crate) fn current_order(&self) -> u64 {
        self.order.0.load(Ordering::SeqCst)
    }

    /// Every data record below this is part of its file.
    pub(crate) fn done_below(&self) -> u64 {
        self.done_below.load(Ordering::Acquire)
    }

    /// Logged writes not yet moved into their files, of `queues` (every slot's).
    ///
    /// The queues' counts are read before the count moved: a batch that finishes between
    /// the two can make the figure low (never high), and then it also raised
    /// [`Progress::batches_finished`], which a caller deciding whether to wait for memory
    /// reads next. Read by the checkpoint itself (which alone moves records), it is exact.
    pub(crate) fn pending<'q>(&self, queues: impl IntoIterator<Item = &'q Queue>) -> u64 {
        let queued: u64 = queues.into_iter().map(Queue::queued).sum();
        queued.saturating_sub(self.moved.load(Ordering::Acquire))
    }

    /// Batches finished so far (each freed what it replaced before it was counted).
    pub(crate) fn batches_finished(&self) -> u64 {
        self.finished.load(Ordering::Acquire)
    }

    // ---- writers ----

    /// Opens a ticket on `queue` (one writer per slot at a time): publishes a lower bound
    /// of the order the writer is about to take (past the slot's last orders).
    pub(crate) fn begin<'a>(&'a self, queue: &'a Queue) -> Ticket<'a> {
        let floor = queue.published.floor.load(Ordering::Relaxed);
        let before = queue.published.bound.swap(floor, Ordering::SeqCst);
        assert_eq!(
            before, NO_BOUND,
            "two writers hold tickets on one slot's queue"
        );
        Ticket {
            progress: self,
            queue,
            orders: None,
            closed: false,
        }
    }

    /// A writer finished (queued a record, or gave up): wake the checkpoint if it sleeps
    /// waiting for that.
    /// `filled`: its queue just reached a multiple of [`GATHER_RECORDS`].
    ///
    /// Only the writer that moves the mode from `IDLE` (or `GATHERING`) to `AWAKE` wakes it:
    /// a woken thread takes tens of microseconds to run, and every other writer finishing
    /// meanwhile would otherwise make a `futex` wake call of its own — measured with two
    /// writers of random 4 KiB blocks, about 21 000 such calls a second, one per 36 writes.
    /// The wake still happens under the state lock, so it cannot fall between the
    /// checkpoint's last look for work and its wait.
    fn finished(&self, filled: bool) {
        let from = match self.sleep.load(Ordering::SeqCst) {
            IDLE => IDLE,
            GATHERING if filled => GATHERING,
            _ => return,
        };
        let wake = self
            .sleep
            .compare_exchange(from, AWAKE, Ordering::SeqCst, Ordering::SeqCst)
            .is_ok();
        if wake {
            let _state = self.state();
            self.wake.notify_all();
        }
    }

    // ---- threads waiting on the checkpoint ----

    /// Fails when the checkpoint failed or the file system is unmounting.
    pub(crate) fn check_running(&self) -> Result<()> {
        if !self.stopping.load(Ordering::Acquire) {
            return Ok(());
        }
        Self::running(&self.state())
    }

    fn running(state: &State) -> Result<()> {
        if let Some(why) = &state.failed {
            return Err(FsError::Shutdown(why.clone()));
        }
        if state.asked.stop {
            return Err(FsError::Shutdown("unmounted".into()));
        }
        Ok(())
    }

    /// Asks the checkpoint for `ask` (a snapshot, a drain) and waits until it finishes a
    /// pass begun after the request. The caller checks whether what it waits for happened
    /// and asks again if not.
    pub(crate) fn await_pass(&self, ask: impl FnOnce(&mut Requests)) -> Result<()> {
        // The checkpoint takes every file-system lock; waiting for it holding one could
        // wait forever.
        crate::lock_order::assert_none_from(crate::lock_order::FS_BATCH, "the checkpoint");
        let mut state = self.state();
        if let Some(why) = &state.failed {
            return Err(FsError::Shutdown(why.clone()));
        }
        ask(&mut state.asked);
        let seen = state.passes;
        self.wake.notify_all();
        while state.passes == seen {
            if let Some(why) = &state.failed {
                return Err(FsError::Shutdown(why.clone()));
            }
            state.awaiting += 1;
            state = self.passed.wait(state).expect("checkpoint state");
            state.awaiting -= 1;
        }
        Ok(())
    }

    /// Waits until every data record logged before now is part of its file.
    pub(crate) fn drain(&self) -> Result<()> {
        let target = self.current_order();
        while self.done_below() < target {
            self.await_pass(|asked| asked.pass = true)?;
        }
        Ok(())
    }

    /// Asks for a snapshot without waiting for it (a journal filling up).
    pub(crate) fn request_snapshot(&self) {
        let mut state = self.state();
        state.asked.snapshot = true;
        self.wake.notify_all();
    }

    /// Tells the checkpoint to stop: after moving everything and writing a final snapshot,
    /// or, `abandon`, at once (tests).
    pub(crate) fn request_stop(&self, abandon: bool) {
        let mut state = self.state();
        state.asked.stop = true;
        state.asked.abandon |= abandon;
        self.stopping.store(true, Ordering::Release);
        self.wake.notify_all();
    }

    /// Why the checkpoint failed, if it did.
    pub(crate) fn failure(&self) -> Option<String> {
        self.state().failed.clone()
    }

    // ---- the checkpoint ----

    /// Takes what was asked since the last pass (the stop request stays).
    pub(crate) fn take_requests(&self) -> Requests {
        let mut state = self.state();
        let asked = state.asked;
        state.asked.snapshot = false;
        state.asked.drain = false;
        state.asked.pass = false;
        asked
    }

    /// Ends a pass: wakes every thread waiting for one.
    pub(crate) fn pass_done(&self) {
        let mut state = self.state();
        state.passes += 1;
        if state.awaiting > 0 {
            self.passed.notify_all();
        }
    }

    /// The checkpoint failed: the file system stops accepting changes.
    pub(crate) fn fail(&self, why: String) {
        let mut state = self.state();
        state.failed = Some(why);
        self.stopping.store(true, Ordering::Release);
        state.passes += 1;
        self.passed.notify_all();
    }

    /// The counter, read before the caller lists the queues it hands to
    /// [`Progress::take_batch_into`] (see the module docs): every slot whose writer took an order
    /// below it is made before the read, so the list has its queue.
    pub(crate) fn mark(&self) -> Mark {
        Mark(self.current_order())
    }

    /// The watermark: no record below it can still be queued.
    fn safe_mark(&self, mark: Mark, queues: &[&Queue]) -> u64 {
        // The counter first: an order taken after this load is at least its value.
        let mut safe = mark.0;
        for queue in queues {
            safe = safe.min(queue.bound());
        }
        safe
    }

    /// No writer holds a ticket.
    pub(crate) fn all_quiet(&self, queues: &[&Queue]) -> bool {
        queues.iter().all(|q| q.bound() == NO_BOUND)
    }

    /// Takes a batch: the queued records below the watermark, merged by order, at most
    /// `limit` of them (an order prefix; the rest goes back to the front of its queues).
    /// `queues[i]` is slot `i`'s. An empty batch still raises `done_below` to the watermark.
    #[cfg(test)]
    pub(crate) fn take_batch(&self, mark: Mark, queues: &[&Queue], limit: usize) -> Batch {
        self.take_batch_into(mark, queues, limit, Vec::new())
    }

    /// [`Progress::take_batch_into`] into `records` (empty; the checkpoint passes the vector of
    /// its last batch, so that a batch's hundreds of records do not make the heap grow and
    /// give back tens of KiB each time: its first stores after a fresh allocation were page
    /// faults).
    pub(crate) fn take_batch_into(
        &self,
        mark: Mark,
        queues: &[&Queue],
        limit: usize,
        mut records: Vec<Pending>,
    ) -> Batch {
        debug_assert!(records.is_empty());
        let safe = self.safe_mark(mark, queues);
        // The least order of a movable record left in its queue: the batch is done below it.
        let mut first_left = safe;
        let mut spares = self.spares.lock().expect("spare queues");
        // Per queue with movable records: its index and the records taken from it, in order.
        let mut runs: Vec<(usize, VecDeque<Pending>)> = Vec::new();
        for (i, queue) in queues.iter().enumerate() {
            // A queue is in order: its movable records are a prefix, moved in one go (the
            // queue's lock is its writer's too). At most `limit` of them: the batch's
            // `limit` least orders are among each queue's first `limit`, so a backlog
            // costs a batch no more than that, however long it grew.
            let mut queued = queue.records();
            let movable = queued.partition_point(|p| p.order < safe);
            let take = movable.min(limit);
            if take < movable {
                first_left = first_left.min(queued[take].order);
            }
            if take == 0 {
                continue;
            }
            let mut run = spares.pop().unwrap_or_default();
            // Whichever moves fewer records under the lock its writer waits for (records
            // moved out under it made the writer sleep on it): those taken, or — mostly
            // nothing, else a few records above the watermark — those that stay. For the
            // second the whole queue is swapped for a spare, and what stays goes back to
            // the front after the lock was dropped, older than anything queued meanwhile.
            if queued.len() - take > take {
                run.extend(queued.drain(..take));
            } else {
                std::mem::swap(&mut *queued, &mut run);
                drop(queued);
                if run.len() > take {
                    let mut queued = queue.records();
                    for p in run.drain(take..).rev() {
                        queued.push_front(p);
                    }
                }
            }
            runs.push((i, run));
        }
        // The runs merged by order into the batch, each record moved once: collected and then
        // sorted, the records moved twice more (the stable sort merging two runs through its
        // scratch), 10 % of the checkpoint's time with two writers of 4 KiB blocks.
        match runs.as_mut_slice() {
            [] => {}
            [(_, run)] => records.extend(run.drain(..)),
            _ => {
                records.reserve(runs.iter().map(|(_, r)| r.len()).sum::<usize>().min(limit));
                while records.len() < limit {
                    let least = runs
                        .iter()
                        .enumerate()
                        .filter_map(|(j, (_, run))| run.front().map(|p| (p.order, j)))
                        .min();
                    let Some((_, j)) = least else { break };
                    records.extend(runs[j].1.pop_front());
                }
            }
        }
        // Past the batch's limit: back to the front of their queues (which stay in order).
        for (i, mut run) in runs {
            if let Some(p) = run.front() {
                first_left = first_left.min(p.order);
                let mut queued = queues[i].records();
                for p in run.drain(..).rev() {
                    queued.push_front(p);
                }
            }
            spares.push(run);
        }
        drop(spares);
        if records.is_empty() {
            self.done_below.fetch_max(safe, Ordering::AcqRel);
            return Batch {
                records,
                done_below: safe,
            };
        }
        // Orders are unique (one counter) and every one taken is below the watermark.
        assert!(
            records.windows(2).all(|w| w[0].order < w[1].order),
            "checkpoint batch orders are not strictly increasing"
        );
        assert!(
            records.last().is_some_and(|p| p.order < safe),
            "a checkpoint batch reaches the watermark {safe}"
        );
        Batch {
            records,
            done_below: first_left,
        }
    }

    /// A batch is committed: its records are part of their files.
    pub(crate) fn finish_batch(&self, batch: &Batch) {
        let Some(first) = batch.records.first() else {
            return;
        };
        self.finished.fetch_add(1, Ordering::AcqRel);
        self.moved
            .fetch_add(batch.records.len() as u64, Ordering::AcqRel);
        let before = self
            .done_below
            .fetch_max(batch.done_below, Ordering::AcqRel);
        // Only the checkpoint advances it, by a prefix of the order.
        assert!(
            before <= first.order,
            "records below done_below {before} were checkpointed again (first order {})",
            first.order
        );
    }

    /// Lets a small batch gather for `wait`, unless someone asks for something or a queue
    /// reaches [`GATHER_RECORDS`] first. `seen`: the requests the pass took.
    pub(crate) fn gather(&self, wait: Duration, seen: Requests) {
        let state = self.state();
        if Self::asked(&state, seen) {
            return;
        }
        self.sleep.store(GATHERING, Ordering::SeqCst);
        drop(
            self.wake
                .wait_timeout(state, wait)
                .expect("checkpoint state"),
        );
        self.sleep.store(AWAKE, Ordering::SeqCst);
    }

    /// Sleeps until there is work: a request, or what `until` adds. `seen`: the requests
    /// the pass took (a stop it saw does not count again).
    pub(crate) fn sleep(&self, queues: &[&Queue], until: Until, seen: Requests) {
        let state = self.state();
        if Self::asked(&state, seen) {
            return;
        }
        self.sleep.store(
            match until {
                Until::Asked => WAITING_FOR_REQUESTS,
                Until::Movable | Until::Quiet => IDLE,
            },
            Ordering::SeqCst,
        );
        // Look again after publishing the mode: a writer that finished before it did not
        // see a sleeper, so its record (or withdrawn bound) is visible here.
        let work = match until {
            Until::Asked => false,
            Until::Movable => self.movable(queues),
            Until::Quiet => {
                self.movable(queues)
                    || self.pending(queues.iter().copied()) == 0 && self.all_quiet(queues)
            }
        };
        if !work {
            drop(self.wake.wait(state).expect("checkpoint state"));
        }
        self.sleep.store(AWAKE, Ordering::SeqCst);
    }

    fn asked(state: &State, seen: Requests) -> bool {
        let a = state.asked;
        a.snapshot || a.drain || a.pass || a.abandon || a.stop && !seen.stop
    }

    /// Some queued record is below the watermark.
    fn movable(&self, queues: &[&Queue]) -> bool {
        // A queue made after the caller's list is missed here; its writer wakes the
        // checkpoint when it queues.
        let safe = self.safe_mark(self.mark(), queues);
        queues
            .iter()
            .any(|q| q.records().front().is_some_and(|p| p.order < safe))
    }
}

/// What, besides a request, ends the checkpoint's sleep.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Until {
    /// Nothing else (checkpoints on demand).
    Asked,
    /// A record becoming movable (background checkpoints).
    Movable,
    /// A record becoming movable, or every record moved and no writer left (stopping).
    Quiet,
}

impl Ticket<'_> {
    /// Takes the writer's place in the order (once).
    #[cfg(test)]
    pub(crate) fn order(&mut self) -> u64 {
        self.orders(1).start
    }

    /// Takes `count` consecutive places in the order (once): a write in several pieces.
    pub(crate) fn orders(&mut self, count: u64) -> std::ops::Range<u64> {
        assert!(self.orders.is_none(), "a ticket takes its orders once");
        let first = self.progress.order.0.fetch_add(count, Ordering::SeqCst);
        // Only this slot's writer stores here (a slot passes between threads under a lock).
        self.queue
            .published
            .floor
            .store(first + count, Ordering::Relaxed);
        debug_assert!(
            first >= self.queue.bound(),
            "an order below the published bound"
        );
        self.orders = Some(first..first + count);
        first..first + count
    }

    /// Queues the writer's logged record (carrying the ticket's order) for the checkpoint
    /// and closes the ticket.
    #[cfg(test)]
    pub(crate) fn queue(self, record: Pending) {
        self.queue_all(std::iter::once(record));
    }

    /// Queues the records of the writer's write (carrying the ticket's orders, in order) for
    /// the checkpoint and closes the ticket. They go straight into the queue as the iterator
    /// builds them, no list of them first.
    pub(crate) fn queue_all(mut self, records: impl ExactSizeIterator<Item = Pending>) {
        let taken = self.orders.clone().unwrap_or(0..0);
        let count = records.len() as u64;
        assert_eq!(
            count,
            taken.end - taken.start,
            "a ticket queues as many records as it took orders"
        );
        let depth = {
            let mut queued = self.queue.records();
            assert!(
                queued.back().is_none_or(|p| p.order < taken.start),
                "a slot's records are queued in order"
            );
            for (record, order) in records.zip(taken) {
                assert_eq!(
                    record.order, order,
                    "queued records carry their ticket's orders"
                );
                queued.push_back(record);
            }
            // Counted before the lock is dropped: the checkpoint cannot move a record
            // that is not counted yet. Only this writer stores here.
            let published = &self.queue.published.queued;
            published.store(published.load(Ordering::Relaxed) + count, Ordering::Release);
            queued.len()
        };
        let before = depth - count as usize;
        self.close(depth / GATHER_RECORDS > before / GATHER_RECORDS);
    }

    fn close(&mut self, filled: bool) {
        self.closed = true;
        self.queue.published.bound.store(NO_BOUND, Ordering::SeqCst);
        self.progress.finished(filled);
    }
}

impl Drop for Ticket<'_> {
    fn drop(&mut self) {
        if !self.closed {
            self.close(false);
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::mpsc;
    use std::thread;

    use super::*;
    use crate::buffers::Extents;

    fn record(slot: u32, order: u64) -> Pending {
        Pending {
            slot,
            page: crate::buffers::NO_PAGE,
            seq: order,
            order,
            ino: 2,
            offset: 0,
            len: 1,
            set: Arc::new(BufferSet::sealed_with(Extents::new(), 1)),
            mtime: 0,
            remapped: None,
        }
    }

    fn write(progress: &Progress, queue: &Queue, slot: u32) -> u64 {
        let mut ticket = progress.begin(queue);
        let order = ticket.order();
        ticket.queue(record(slot, order));
        order
    }

    fn orders(batch: &Batch) -> Vec<u64> {
        batch.records.iter().map(|p| p.order).collect()
    }

    #[test]
    fn an_open_ticket_holds_the_batch_below_its_order() {
        let progress = Progress::new(0);
        let queues = [Queue::with(VecDeque::new()), Queue::with(VecDeque::new())];
        let all: Vec<&Queue> = queues.iter().collect();
        // Slot 1's writer publishes its bound, then slot 0's writer takes order 0 and
        // queues it while slot 1 has not taken its order yet.
        let mut late = progress.begin(&queues[1]);
        assert_eq!(write(&progress, &queues[0], 0), 0);
        let batch = progress.take_batch(progress.mark(), &all, 100);
        assert!(
            batch.records.is_empty(),
            "passed an open ticket: {:?}",
            orders(&batch)
        );
        assert_eq!(progress.done_below(), 0);
        let order = late.order();
        assert_eq!(order, 1);
        late.queue(record(1, order));
        let batch = progress.take_batch(progress.mark(), &all, 100);
        assert_eq!(orders(&batch), [0, 1]);
        assert_eq!(batch.done_below, 2);
        assert_eq!(progress.pending(&queues), 2, "taken but not finished");
        progress.finish_batch(&batch);
        assert_eq!(progress.done_below(), 2);
        assert_eq!(progress.pending(&queues), 0);
    }

    /// A slot made while the checkpoint lists the queues: with the counter read first (the
    /// mark), a record its writer logged meanwhile is above the watermark of the batch that
    /// did not see its queue, so `done_below` never passes it. (Read after the list, as the
    /// checkpoint once did, the watermark was 2 and the record, order 1, was checkpointed
    /// after `done_below` had passed it: the assertion in `finish_batch`.)
    #[test]
    fn a_queue_made_after_the_list_is_never_passed() {
        let progress = Progress::new(0);
        let queues = [Queue::with(VecDeque::new()), Queue::with(VecDeque::new())];
        assert_eq!(write(&progress, &queues[0], 0), 0);
        let mark = progress.mark();
        let listed = [&queues[0]];
        // Meanwhile slot 1 is made and its writer logs order 1.
        assert_eq!(write(&progress, &queues[1], 1), 1);
        let batch = progress.take_batch(mark, &listed, 100);
        assert_eq!(orders(&batch), [0]);
        progress.finish_batch(&batch);
        assert_eq!(
            progress.done_below(),
            1,
            "passed the unlisted queue's record"
        );
        let all: Vec<&Queue> = queues.iter().collect();
        let batch = progress.take_batch(progress.mark(), &all, 100);
        assert_eq!(orders(&batch), [1]);
        progress.finish_batch(&batch);
        assert_eq!(progress.done_below(), 2);
    }

    #[test]
    fn a_dropped_ticket_releases_the_watermark() {
        let progress = Progress::new(10);
        let queues = [Queue::with(VecDeque::new()), Queue::with(VecDeque::new())];
        let all: Vec<&Queue> = queues.iter().collect();
        let mut failed = progress.begin(&queues[1]);
        assert_eq!(failed.order(), 10);
        assert_eq!(write(&progress, &queues[0], 0), 11);
        assert!(
            progress
                .take_batch(progress.mark(), &all, 100)
                .records
                .is_empty()
        );
        assert!(!progress.all_quiet(&all));
        drop(failed); // its append failed: no record
        assert!(progress.all_quiet(&all));
        assert_eq!(
            orders(&progress.take_batch(progress.mark(), &all, 100)),
            [11]
        );
    }

    #[test]
    fn a_batch_over_its_limit_leaves_its_tail_queued_in_order() {
        let progress = Progress::new(0);
        let queues = [Queue::with(VecDeque::new()), Queue::with(VecDeque::new())];
        let all: Vec<&Queue> = queues.iter().collect();
        for i in 0..6 {
            write(&progress, &queues[i % 2], (i % 2) as u32);
        }
        let first = progress.take_batch(progress.mark(), &all, 4);
        assert_eq!(orders(&first), [0, 1, 2, 3]);
        assert_eq!(
            first.done_below, 4,
            "done_below stops at the first record left"
        );
        progress.finish_batch(&first);
        assert_eq!(progress.pending(&queues), 2, "the tail left queued");
        let second = progress.take_batch(progress.mark(), &all, 4);
        assert_eq!(orders(&second), [4, 5]);
        assert_eq!(second.done_below, 6);
        progress.finish_batch(&second);
        assert_eq!(progress.pending(&queues), 0);
    }

    /// Three queues merged into a batch, one of them with records above the watermark (an
    /// open ticket holds it) and the batch over its limit: the batch is the least orders in
    /// order, and every queue keeps the rest in order, the records it had left above the
    /// watermark behind the ones the limit sent back.
    #[test]
    fn runs_of_three_queues_merge_in_order_and_leave_the_rest_queued_in_order() {
        let progress = Progress::new(0);
        let queues: Vec<Queue> = (0..3).map(|_| Queue::with(VecDeque::new())).collect();
        let all: Vec<&Queue> = queues.iter().collect();
        // Orders 0..9 round the three queues, then slot 2 opens a ticket (its bound is 9:
        // the watermark), and slot 0 writes 9 and 10 above it.
        for i in 0..9 {
            write(&progress, &queues[i % 3], (i % 3) as u32);
        }
        let mut open = progress.begin(&queues[2]);
        write(&progress, &queues[0], 0);
        write(&progress, &queues[0], 0);
        let queued = |q: &Queue| q.records().iter().map(|p| p.order).collect::<Vec<_>>();
        let first = progress.take_batch(progress.mark(), &all, 5);
        assert_eq!(orders(&first), [0, 1, 2, 3, 4]);
        assert_eq!(first.done_below, 5, "order 5 is left, in slot 2");
        assert_eq!(
            queued(&queues[0]),
            [6, 9, 10],
            "the limit's and the watermark's, in order"
        );
        assert_eq!(queued(&queues[1]), [7]);
        assert_eq!(queued(&queues[2]), [5, 8]);
        progress.finish_batch(&first);
        let second = progress.take_batch(progress.mark(), &all, 5);
        assert_eq!(
            orders(&second),
            [5, 6, 7, 8],
            "nothing at or past the open ticket's bound"
        );
        assert_eq!(second.done_below, 9);
        progress.finish_batch(&second);
        let order = open.order();
        assert_eq!(order, 11);
        open.queue(record(2, order));
        let third = progress.take_batch(progress.mark(), &all, 5);
        assert_eq!(orders(&third), [9, 10, 11]);
        progress.finish_batch(&third);
        assert_eq!(progress.pending(queues.iter()), 0);
    }

    /// A long queue gives a batch at most `limit` records (a backlog must not make every
    /// batch sort and put back all of it), and what it keeps still bounds `done_below`.
    #[test]
    fn a_long_queue_gives_a_batch_at_most_its_limit() {
        let progress = Progress::new(0);
        let queues = [Queue::with(VecDeque::new()), Queue::with(VecDeque::new())];
        let all: Vec<&Queue> = queues.iter().collect();
        for _ in 0..8 {
            write(&progress, &queues[0], 0);
        }
        write(&progress, &queues[1], 1);
        write(&progress, &queues[1], 1);
        let first = progress.take_batch(progress.mark(), &all, 4);
        assert_eq!(orders(&first), [0, 1, 2, 3]);
        assert_eq!(
            first.done_below, 4,
            "orders 4..8 are still queued in slot 0, behind what the batch took"
        );
        assert_eq!(
            queues[0]
                .records()
                .iter()
                .map(|p| p.order)
                .collect::<Vec<_>>(),
            [4, 5, 6, 7],
            "what the batch left is back in its queue, in order"
        );
        progress.finish_batch(&first);
        let second = progress.take_batch(progress.mark(), &all, 4);
        assert_eq!(orders(&second), [4, 5, 6, 7]);
        assert_eq!(second.done_below, 8);
        progress.finish_batch(&second);
        assert_eq!(
            orders(&progress.take_batch(progress.mark(), &all, 4)),
            [8, 9]
        );
    }

    /// Writers on three slots race a checkpoint taking batches: every batch continues the
    /// order exactly where the last one ended (no record is ever queued below `done_below`),
    /// and in the end every order was taken once.
    #[test]
    fn racing_writers_are_never_passed() {
        const SLOTS: usize = 3;
        const WRITES: u64 = 20_000;
        let progress = Arc::new(Progress::new(0));
        let queues: Arc<Vec<Queue>> =
            Arc::new((0..SLOTS).map(|_| Queue::with(VecDeque::new())).collect());
        let writers: Vec<_> = (0..SLOTS)
            .map(|slot| {
                let (progress, queues) = (Arc::clone(&progress), Arc::clone(&queues));
                thread::spawn(move || {
                    for i in 0..WRITES {
                        write(&progress, &queues[slot], slot as u32);
                        if i % 64 == 0 {
                            thread::yield_now();
                        }
                    }
                })
            })
            .collect();
        let all: Vec<&Queue> = queues.iter().collect();
        let total = SLOTS as u64 * WRITES;
        let mut next = 0;
        while next < total {
            let batch = progress.take_batch(progress.mark(), &all, 500);
            for p in &batch.records {
                assert_eq!(p.order, next, "a batch skipped or repeated an order");
                next += 1;
            }
            assert!(
                batch.done_below <= next,
                "done_below {} passed order {next}, which no batch has taken yet",
                batch.done_below
            );
            progress.finish_batch(&batch);
        }
        for writer in writers {
            writer.join().expect("writer");
        }
        assert_eq!(progress.pending(all.iter().copied()), 0);
        assert_eq!(progress.current_order(), total);
    }

    #[test]
    #[should_panic(expected = "checkpointed again")]
    fn done_below_never_moves_back() {
        let progress = Progress::new(0);
        let queue = Queue::with(VecDeque::new());
        write(&progress, &queue, 0);
        let batch = progress.take_batch(progress.mark(), &[&queue], 10);
        progress.finish_batch(&batch);
        progress.finish_batch(&batch);
    }

    #[test]
    #[should_panic(expected = "two writers hold tickets")]
    fn one_ticket_per_queue() {
        let progress = Progress::new(0);
        let queue = Queue::with(VecDeque::new());
        let _first = progress.begin(&queue);
        let _second = progress.begin(&queue);
    }

    /// Runs `f` on a thread and fails (instead of hanging) if it does not return in time.
    fn returns_soon(what: &str, f: impl FnOnce() + Send + 'static) -> thread::JoinHandle<()> {
        let (done, finished) = mpsc::channel();
        let what = what.to_owned();
        thread::spawn(move || {
            let worker = thread::spawn(move || {
                f();
                done.send(()).expect("receiver");
            });
            finished
                .recv_timeout(Duration::from_secs(20))
                .unwrap_or_else(|_| panic!("{what}: no wake-up"));
            worker.join().expect("worker");
        })
    }

    #[test]
    fn a_writer_wakes_an_idle_checkpoint() {
        for _ in 0..50 {
            let progress = Arc::new(Progress::new(0));
            let queues = Arc::new([Queue::with(VecDeque::new())]);
            let (p, q) = (Arc::clone(&progress), Arc::clone(&queues));
            let sleeper = returns_soon("idle checkpoint", move || {
                let all: Vec<&Queue> = q.iter().collect();
                // Sleeps until the record below is movable (at once if it already is).
                while p.take_batch(p.mark(), &all, 10).records.is_empty() {
                    p.sleep(&all, Until::Movable, Requests::default());
                }
            });
            // Write once the checkpoint sleeps (or is about to: the mode is set before it
            // looks for work a last time).
            while progress.sleep.load(Ordering::SeqCst) != IDLE {
                thread::yield_now();
            }
            write(&progress, &queues[0], 0);
            sleeper.join().expect("the checkpoint saw the write");
        }
    }

    #[test]
    fn a_checkpoint_on_demand_sleeps_through_writes_until_asked() {
        let progress = Arc::new(Progress::new(0));
        let queues = Arc::new([Queue::with(VecDeque::new())]);
        let (p, q) = (Arc::clone(&progress), Arc::clone(&queues));
        let (woke, woken) = mpsc::channel();
        let sleeper = thread::spawn(move || {
            let all: Vec<&Queue> = q.iter().collect();
            loop {
                p.sleep(&all, Until::Asked, Requests::default());
                let asked = p.take_requests();
                if asked.drain {
                    woke.send(()).expect("receiver");
                    p.pass_done();
                    return;
                }
            }
        });
        write(&progress, &queues[0], 0);
        assert!(
            woken.recv_timeout(Duration::from_millis(200)).is_err(),
            "a write woke a checkpoint that runs on demand"
        );
        let waiter = {
            let p = Arc::clone(&progress);
            returns_soon("drain request", move || {
                p.await_pass(|asked| asked.drain = true).expect("running");
            })
        };
        waiter.join().expect("the waiter saw the pass");
        sleeper.join().expect("sleeper");
    }

    #[test]
    fn waiters_learn_of_a_failure() {
        let progress = Arc::new(Progress::new(0));
        progress.next_order(); // a record the drain must wait for
        let p = Arc::clone(&progress);
        let (tx, rx) = mpsc::channel();
        let waiter = thread::spawn(move || tx.send(p.drain()).expect("receiver"));
        // The drain waits for a pass that never comes; the failure ends it.
        thread::sleep(Duration::from_millis(20));
        progress.fail("device gone".into());
        let result = rx.recv_timeout(Duration::from_secs(20)).expect("woken");
        assert!(
            matches!(&result, Err(FsError::Shutdown(why)) if why == "device gone"),
            "{result:?}"
        );
        waiter.join().expect("waiter");
    }
}
