//! Range locks on files: writers of disjoint ranges proceed in parallel, readers never
//! block readers, and a writer excludes everyone on the ranges it overlaps.
//!
//! Ranges are rounded out to a granule between 4 KiB and 2 MiB (the file system's), so two
//! writes in the same granule serialise even when their bytes do not overlap: a granule is
//! the unit a checkpoint may remap or copy, and it must not move under a writer.
//!
//! One [`RangeLocks`] serves every file of a file system. Held ranges sit in [`SHARDS`]
//! tables, each behind its own cache line, chosen by file and 2 MiB stretch of the file: a
//! file's consecutive stretches go to consecutive tables from a place its inode number
//! picks. A range is entered in the table of every stretch it touches, so two overlapping
//! ranges always meet in at least one table. Writers and the checkpoint work on different
//! stretches most of the time, and then never touch the same lock word: with one table per
//! file, the lock word bounced between their cores on every write and cost more than the
//! rest of a 4 KiB write together (measured with `perf`).
//!
//! There are enough tables that the stretches of a file up to 2 GiB each have their own, so
//! writers of disjoint parts of a file never write the same table: a table the other CPU
//! wrote last costs a lock a round trip between the CPUs (133 ns on the 2-CPU machine this
//! was measured on). With 64 tables, whose stretches went round them all, two writers of
//! random 4 KiB blocks, each in its half of a 256 MiB file, made 2.11–2.23 M writes a second
//! (median of seven runs 2.17 M, 1.49x one writer); with a table per stretch, 2.10–2.31 M
//! (median 2.30 M, 1.59x) — `bench fs --bs 4K --threads 1,2 --random-over thread`, the two
//! builds alternated. Writers of random blocks over the whole file gain nothing: the other
//! writer wrote a table last half the time however many tables there are.
//!
//! A range over more than [`WIDE_STRETCHES`] stretches (a truncation's, whose range is the
//! whole file) is wide: it is entered in one wide table instead of visiting a table per
//! stretch — entering all 1024 took a whole-file lock and unlock 28 µs, against 1.7 µs with 64
//! tables; the wide table takes 0.66 µs when the tables hold nothing and 2.8 µs when 200 of
//! them hold a range (a loop of whole-file locks in a unit test). Narrow lockers look at the
//! wide table only while some wide range is held, which they learn from a count
//! that stays in every CPU's cache; a wide locker then waits for the narrow holders it
//! overlaps, skipping tables that hold nothing by each table's count of entries. Each side
//! publishes first and looks second, both with sequentially consistent operations (a narrow
//! locker raises its tables' counts and then reads the wide count; a wide locker raises the
//! wide count and then reads the tables' counts), so at least one of two overlapping lockers
//! sees the other: a narrow locker that sees a conflicting wide range leaves its tables and
//! waits for it, and a wide locker waits for the narrow holders it finds.
//!
//! A wide locker is the one locker that waits while its range is entered somewhere (so that
//! narrow lockers arriving meanwhile keep out and it is not starved). That cannot deadlock:
//! what it waits for are holders, and a holder never waits for a range lock — a thread takes
//! one range lock at a time (`crate::lock_order`), and a writer never waits for the
//! checkpoint while holding one.
//!
//! The tables are the file system's, not each file's: sixteen cache-line tables in every
//! inode made each file cost 2 KiB of DRAM, most of a small file's share (a mount holding
//! 50,000 empty files used 3.6 KiB per file). Files share tables the way stretches of one
//! file did; an entry names its file, so ranges of different files never conflict.
//!
//! A locker takes the tables it needs in index order; if one holds a conflicting range it
//! lets go of all the others and waits on that one table, then starts over, so no locker
//! waits while holding a table. It tries again for a few microseconds first (ranges are
//! held for a write or a checkpoint group, a few microseconds): sleeping cost the waiter a
//! trip through the scheduler and the holder a wake-up call, with two writers a few
//! percent of both sides' time.

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Condvar, Mutex, MutexGuard};

use smallvec::SmallVec;

use crate::error::{FsError, Result};

/// Smallest granule.
pub const MIN_GRANULE: u64 = 4096;
/// Largest granule.
pub const MAX_GRANULE: u64 = 2 << 20;
/// How many tables narrow ranges are spread over (a power of two): a file's stretches have
/// tables of their own up to 2 GiB into it. 128 KiB of DRAM a file system.
pub const SHARDS: usize = 1024;
/// A range over more stretches than this (128 MiB) is wide: held in the wide table.
const WIDE_STRETCHES: u64 = 64;
/// The part of a file whose ranges share a table (and the largest granule).
const STRETCH: u64 = MAX_GRANULE;
/// How long a locker that finds its range held tries again before it sleeps until the
/// holder lets go.
const SPIN: std::time::Duration = std::time::Duration::from_micros(5);
/// Pauses between those tries.
const SPIN_PAUSES: u32 = 32;
/// Entries a table holds without a heap buffer: two writers and a checkpoint group rarely
/// meet in one table, and two fit the shard's 128 bytes with its lock and condition.
const INLINE_HELD: usize = 2;

/// Shared (read) or exclusive (write).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LockMode {
    /// Readers share.
    Shared,
    /// A writer excludes overlapping holders.
    Exclusive,
}

/// A held range of file `ino`. Holders have no identity: two entries alike are two shared
/// holders of the same range (exclusive ones would conflict), and either may leave by
/// removing either entry — an id per holder would need a counter that every locker writes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Held {
    ino: u64,
    start: u64,
    end: u64,
    mode: LockMode,
}

impl Held {
    fn conflicts(&self, other: &Held) -> bool {
        self.ino == other.ino
            && self.start < other.end
            && other.start < self.end
            && (self.mode == LockMode::Exclusive || other.mode == LockMode::Exclusive)
    }
}

/// Held ranges of one table and how many lockers wait on it (unlocking wakes them only when
/// there are any: the common path makes no system call).
///
/// The first [`INLINE_HELD`] entries live in the table itself, in the shard's cache lines
/// beside its lock word: with them in a heap buffer, a locker on the other core missed twice
/// (the lock word, then the buffer its entry went to — the unlock's `xchg` waited for that
/// store), and the range locks cost a 4 KiB write 79 ns at two threads against 21 at one.
#[derive(Debug, Default)]
struct Table {
    held: SmallVec<[Held; INLINE_HELD]>,
    waiting: u32,
}

impl Table {
    fn conflicts(&self, range: &Held) -> bool {
        self.held.iter().any(|h| h.conflicts(range))
    }
}

#[derive(Debug, Default)]
#[repr(align(128))]
struct Shard {
    table: Mutex<Table>,
    released: Condvar,
    /// How many entries `table` holds: changed under its lock, read without it by wide
    /// lockers, which skip a table that holds none.
    entries: AtomicU32,
}

// The inline entries stay in the shard's own two cache lines.
const _: () = assert!(size_of::<Shard>() == 128);

impl Shard {
    fn lock(&self) -> MutexGuard<'_, Table> {
        self.table.lock().expect("range lock table")
    }

    /// Waits on this table until `held` conflicts with nothing in it; returns it locked.
    fn wait_clear<'a>(
        &'a self,
        mut table: MutexGuard<'a, Table>,
        held: &Held,
    ) -> MutexGuard<'a, Table> {
        if table.conflicts(held) {
            table.waiting += 1;
            while table.conflicts(held) {
                table = self.released.wait(table).expect("range lock table");
            }
            table.waiting -= 1;
        }
        table
    }

    /// Enters `held` in `table` (this shard's, locked) and counts it: a sequentially
    /// consistent locked addition, this side's half of the handshake between narrow and wide
    /// lockers (a fence instead cost two writers of random blocks 3–5 % of their writes).
    fn enter(&self, table: &mut MutexGuard<'_, Table>, held: Held) {
        table.held.push(held);
        self.entries.fetch_add(1, Ordering::SeqCst);
    }

    /// Takes one entry alike `held` out (if there is one) and wakes the waiters, if any.
    fn leave(&self, held: &Held) {
        let mut table = self.lock();
        if let Some(at) = table.held.iter().position(|h| h == held) {
            table.held.swap_remove(at);
            self.entries.fetch_sub(1, Ordering::Release);
        }
        // Back beside the lock word once few enough: a table that once held more would
        // otherwise keep its entries in the heap buffer for good.
        if table.held.spilled() && table.held.len() <= INLINE_HELD {
            table.held.shrink_to_fit();
        }
        let waiting = table.waiting > 0;
        drop(table);
        if waiting {
            self.released.notify_all();
        }
    }
}

/// The range locks of every file of a file system.
#[derive(Debug)]
pub struct RangeLocks {
    granule: u64,
    shards: Box<[Shard]>,
    /// The wide ranges held. Narrow lockers read its count of entries on every lock and
    /// take its lock only while that is not 0; only wide lockers change it, so its lines
    /// stay in every CPU's cache.
    wide: Shard,
}

/// A held range; released when dropped.
#[derive(Debug)]
pub struct RangeGuard<'a> {
    locks: &'a RangeLocks,
    /// The tables it is entered in; `None`: the wide table.
    shards: Option<ShardSet>,
    /// The held range, rounded out to the granule, as entered in the tables.
    held: Held,
}

/// The tables a narrow range touches: `count` consecutive ones from `first`, wrapping past
/// the last table to the first (a file's consecutive stretches have consecutive tables).
#[derive(Debug, Clone, Copy)]
struct ShardSet {
    first: u32,
    count: u32,
}

impl ShardSet {
    /// The tables of `[start, end)` of file `ino`; `None` for a wide range.
    fn of(ino: u64, start: u64, end: u64) -> Option<Self> {
        let first = start / STRETCH;
        let last = (end - 1) / STRETCH;
        if last - first >= WIDE_STRETCHES {
            return None;
        }
        // Where the file's stretch 0 goes: the inode number's high bits after a
        // multiplicative hash, so that files numbered in sequence spread out.
        let base = ino.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> (64 - SHARDS.trailing_zeros());
        Some(Self {
            first: (base.wrapping_add(first) % SHARDS as u64) as u32,
            count: (last - first + 1) as u32,
        })
    }

    /// The tables, in index order (a range that wraps takes the low tables first).
    fn iter(self) -> impl Iterator<Item = usize> {
        let (first, end) = (self.first as usize, (self.first + self.count) as usize);
        let (wrapped, straight) = if end > SHARDS {
            (0..end - SHARDS, first..SHARDS)
        } else {
            (0..0, first..end)
        };
        wrapped.chain(straight)
    }
}

impl RangeLocks {
    /// Locks at `granule` bytes (a power of two between 4 KiB and 2 MiB).
    pub fn new(granule: u64) -> Result<Self> {
        if !granule.is_power_of_two() || !(MIN_GRANULE..=MAX_GRANULE).contains(&granule) {
            return Err(FsError::BadRange(format!(
                "granule {granule} is not a power of two in 4 KiB..=2 MiB"
            )));
        }
        Ok(Self {
            granule,
            shards: (0..SHARDS).map(|_| Shard::default()).collect(),
            wide: Shard::default(),
        })
    }

    /// Waits until `[offset, offset + len)` of file `ino` can be held in `mode`, then holds
    /// it.
    pub fn lock(&self, ino: u64, offset: u64, len: u64, mode: LockMode) -> Result<RangeGuard<'_>> {
        let held = self.round(ino, offset, len, mode)?;
        let Some(shards) = ShardSet::of(ino, held.start, held.end) else {
            return Ok(self.lock_wide(held));
        };
        let mut spun: Option<std::time::Instant> = None;
        loop {
            match self.try_enter(held, shards) {
                Ok(guard) => {
                    if !self.wide_conflicts(&held) {
                        return Ok(guard);
                    }
                    // A wide range overlaps: out of the tables (its locker may be waiting
                    // for this range to leave them), wait for it to go, start over.
                    drop(guard);
                    drop(self.wide.wait_clear(self.wide.lock(), &held));
                }
                Err((_, table))
                    if spun.get_or_insert_with(std::time::Instant::now).elapsed() < SPIN =>
                {
                    // Most ranges are held for a write's or a checkpoint group's few
                    // microseconds: try again before going to sleep, which costs both
                    // sides a system call and the waiter a trip through the scheduler.
                    drop(table);
                    for _ in 0..SPIN_PAUSES {
                        std::hint::spin_loop();
                    }
                }
                Err((index, table)) => {
                    // Every other table is released; wait here, then start over.
                    drop(self.shards[index].wait_clear(table, &held));
                }
            }
        }
    }

    /// Brings the first table of the range at `offset` of file `ino` into this CPU's cache,
    /// owned, ahead of a [`RangeLocks::lock`] of it.
    pub fn prefetch(&self, ino: u64, offset: u64) {
        if let Some(shards) = ShardSet::of(ino, offset, offset + 1) {
            pmem::prefetch_for_write(&self.shards[shards.first as usize]);
        }
    }

    /// Holds the range if nothing conflicts now; `None` otherwise.
    pub fn try_lock(
        &self,
        ino: u64,
        offset: u64,
        len: u64,
        mode: LockMode,
    ) -> Result<Option<RangeGuard<'_>>> {
        let held = self.round(ino, offset, len, mode)?;
        let Some(shards) = ShardSet::of(ino, held.start, held.end) else {
            return Ok(self.try_lock_wide(held));
        };
        Ok(self
            .try_enter(held, shards)
            .ok()
            .filter(|_| !self.wide_conflicts(&held)))
    }

    /// Takes the tables of `shards` in order and enters `held` in all of them, or returns
    /// the first table with a conflict (still locked; the others released).
    fn try_enter(
        &self,
        held: Held,
        shards: ShardSet,
    ) -> std::result::Result<RangeGuard<'_>, (usize, MutexGuard<'_, Table>)> {
        let mut tables: SmallVec<[(usize, MutexGuard<'_, Table>); 1]> = SmallVec::new();
        for index in shards.iter() {
            let table = self.shards[index].lock();
            if table.conflicts(&held) {
                return Err((index, table));
            }
            tables.push((index, table));
        }
        for (index, table) in &mut tables {
            self.shards[*index].enter(table, held);
        }
        Ok(RangeGuard {
            locks: self,
            shards: Some(shards),
            held,
        })
    }

    /// Whether a held wide range conflicts with `held`, which the caller just entered in
    /// its tables.
    fn wide_conflicts(&self, held: &Held) -> bool {
        // The tables' counts were raised (sequentially consistent) before this load; a wide
        // locker raises this count before it loads theirs, so one of the two sees the
        // other. A count seen raised brings the wide range's entry with it.
        self.wide.entries.load(Ordering::SeqCst) != 0 && self.wide.lock().conflicts(held)
    }

    /// Once a wide range is entered (and counted), narrow lockers that overlap it keep out,
    /// and the narrow holders already in the tables are the ones left to wait for.
    fn lock_wide(&self, held: Held) -> RangeGuard<'_> {
        // Wide ranges wait for each other in the wide table.
        let mut wide = self.wide.wait_clear(self.wide.lock(), &held);
        self.wide.enter(&mut wide, held);
        drop(wide);
        for shard in self.shards.iter() {
            if shard.entries.load(Ordering::SeqCst) != 0 {
                drop(shard.wait_clear(shard.lock(), &held));
            }
        }
        RangeGuard {
            locks: self,
            shards: None,
            held,
        }
    }

    fn try_lock_wide(&self, held: Held) -> Option<RangeGuard<'_>> {
        {
            let mut wide = self.wide.lock();
            if wide.conflicts(&held) {
                return None;
            }
            self.wide.enter(&mut wide, held);
        }
        let free = self.shards.iter().all(|shard| {
            shard.entries.load(Ordering::SeqCst) == 0 || !shard.lock().conflicts(&held)
        });
        if !free {
            self.wide.leave(&held);
            return None;
        }
        Some(RangeGuard {
            locks: self,
            shards: None,
            held,
        })
    }

    /// `[offset, offset + len)` of `ino` rounded out to the granule.
    fn round(&self, ino: u64, offset: u64, len: u64, mode: LockMode) -> Result<Held> {
        let end = offset.checked_add(len).filter(|_| len > 0).ok_or_else(|| {
            FsError::BadRange(format!("{len} bytes at {offset} is empty or overflows"))
        })?;
        // The granule is a power of two: masks, not divisions (two `div`s were an eighth of
        // a lock's samples).
        let mask = self.granule - 1;
        Ok(Held {
            ino,
            start: offset & !mask,
            end: end.checked_add(mask).map_or(u64::MAX, |e| e & !mask),
            mode,
        })
    }
}

impl RangeGuard<'_> {
    /// Whether this guard holds `[offset, offset + len)` of file `ino` in `locks`.
    pub fn covers(&self, locks: &RangeLocks, ino: u64, offset: u64, len: u64) -> bool {
        std::ptr::eq(self.locks, locks)
            && self.held.ino == ino
            && self.held.start <= offset
            && offset
                .checked_add(len)
                .is_some_and(|end| end <= self.held.end)
    }
}

impl Drop for RangeGuard<'_> {
    fn drop(&mut self) {
        match self.shards {
            Some(shards) => {
                for index in shards.iter() {
                    self.locks.shards[index].leave(&self.held);
                }
            }
            None => self.locks.wide.leave(&self.held),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The file most tests lock ranges of.
    const INO: u64 = 7;

    #[test]
    fn disjoint_writers_and_shared_readers_coexist() {
        let locks = RangeLocks::new(4096).unwrap();
        let a = locks
            .try_lock(INO, 0, 4096, LockMode::Exclusive)
            .unwrap()
            .expect("free");
        let b = locks
            .try_lock(INO, 4096, 4096, LockMode::Exclusive)
            .unwrap()
            .expect("disjoint");
        let r1 = locks
            .try_lock(INO, 8192, 100, LockMode::Shared)
            .unwrap()
            .expect("free");
        let r2 = locks
            .try_lock(INO, 8192, 100, LockMode::Shared)
            .unwrap()
            .expect("readers share");
        assert!(
            locks
                .try_lock(INO, 100, 10, LockMode::Shared)
                .unwrap()
                .is_none(),
            "a reader waits for a writer"
        );
        assert!(
            locks
                .try_lock(INO, 8200, 10, LockMode::Exclusive)
                .unwrap()
                .is_none(),
            "a writer waits for readers"
        );
        drop((a, b, r1, r2));
        assert!(
            locks
                .try_lock(INO, 0, 1 << 20, LockMode::Exclusive)
                .unwrap()
                .is_some()
        );
    }

    #[test]
    fn alike_shared_holders_leave_one_at_a_time() {
        let locks = RangeLocks::new(4096).unwrap();
        // Across two tables, so that each holds two alike entries.
        let (at, len) = ((2 << 20) - 4096, 8192);
        let a = locks.lock(INO, at, len, LockMode::Shared).unwrap();
        let b = locks.lock(INO, at, len, LockMode::Shared).unwrap();
        drop(a);
        for probe in [at, at + 4096] {
            assert!(
                locks
                    .try_lock(INO, probe, 1, LockMode::Exclusive)
                    .unwrap()
                    .is_none(),
                "a writer entered {probe} while a reader still held it"
            );
        }
        drop(b);
        assert!(
            locks
                .try_lock(INO, at, len, LockMode::Exclusive)
                .unwrap()
                .is_some()
        );
    }

    #[test]
    fn granules_round_ranges_out() {
        let locks = RangeLocks::new(2 << 20).unwrap();
        let _a = locks.lock(INO, 0, 1, LockMode::Exclusive).unwrap();
        assert!(
            locks
                .try_lock(INO, (2 << 20) - 1, 1, LockMode::Exclusive)
                .unwrap()
                .is_none(),
            "same 2 MiB granule"
        );
        assert!(
            locks
                .try_lock(INO, 2 << 20, 1, LockMode::Exclusive)
                .unwrap()
                .is_some(),
            "next granule"
        );
    }

    #[test]
    fn a_blocked_writer_proceeds_when_the_range_is_released() {
        let locks = RangeLocks::new(4096).unwrap();
        let first = locks.lock(INO, 0, 4096, LockMode::Exclusive).unwrap();
        let acquired = std::sync::atomic::AtomicBool::new(false);
        std::thread::scope(|scope| {
            let waiter = scope.spawn(|| {
                let _guard = locks.lock(INO, 0, 4096, LockMode::Exclusive).unwrap();
                acquired.store(true, Ordering::SeqCst);
            });
            std::thread::sleep(std::time::Duration::from_millis(20));
            assert!(
                !acquired.load(Ordering::SeqCst),
                "the waiter must not get an overlapping range"
            );
            drop(first);
            waiter.join().unwrap();
        });
        assert!(acquired.load(Ordering::SeqCst));
    }

    #[test]
    fn ranges_meet_in_every_table_they_share() {
        const MIB2: u64 = 2 << 20;
        let locks = RangeLocks::new(4096).unwrap();
        // Stretches 0 and SHARDS share a table but not bytes.
        let a = locks.try_lock(INO, 0, 4096, LockMode::Exclusive).unwrap();
        let b = locks
            .try_lock(INO, SHARDS as u64 * MIB2, 4096, LockMode::Exclusive)
            .unwrap();
        assert!(a.is_some() && b.is_some(), "same table, disjoint bytes");
        // A range across a stretch boundary conflicts with a holder in its second stretch.
        let c = locks
            .try_lock(INO, 3 * MIB2 + 8192, 4096, LockMode::Exclusive)
            .unwrap()
            .expect("free");
        assert!(
            locks
                .try_lock(INO, 3 * MIB2 - 4096, 16384, LockMode::Shared)
                .unwrap()
                .is_none(),
            "overlap found in the second stretch's table"
        );
        // A whole-file range conflicts with every holder, far ones included.
        assert!(
            locks
                .try_lock(INO, 0, u64::MAX / 2, LockMode::Exclusive)
                .unwrap()
                .is_none()
        );
        drop((a, b, c));
        let whole = locks
            .try_lock(INO, 0, u64::MAX / 2, LockMode::Exclusive)
            .unwrap()
            .expect("everything released");
        assert!(
            locks
                .try_lock(INO, 1000 * MIB2, 1, LockMode::Shared)
                .unwrap()
                .is_none()
        );
        drop(whole);
    }

    #[test]
    fn a_waiter_on_one_table_does_not_hold_another() {
        const MIB2: u64 = 2 << 20;
        let locks = RangeLocks::new(4096).unwrap();
        let far = locks.lock(INO, MIB2, 4096, LockMode::Exclusive).unwrap();
        std::thread::scope(|scope| {
            // Waits on stretch 1's table for `far`, having given up stretch 0's.
            let spanning = scope.spawn(|| {
                let _g = locks
                    .lock(INO, 0, MIB2 + 4096, LockMode::Exclusive)
                    .unwrap();
            });
            std::thread::sleep(std::time::Duration::from_millis(20));
            let near = locks
                .try_lock(INO, 0, 4096, LockMode::Exclusive)
                .unwrap()
                .expect("stretch 0 must stay free while the spanning locker waits");
            drop(near);
            drop(far);
            spanning.join().unwrap();
        });
    }

    #[test]
    fn files_never_conflict_with_each_other() {
        let locks = RangeLocks::new(4096).unwrap();
        // Enough files that several share each table.
        let guards: Vec<_> = (0..4 * SHARDS as u64)
            .map(|ino| {
                locks
                    .try_lock(ino, 0, 1 << 20, LockMode::Exclusive)
                    .unwrap()
                    .unwrap_or_else(|| panic!("file {ino} refused by another file's range"))
            })
            .collect();
        for ino in [0, 100, 4 * SHARDS as u64 - 1] {
            assert!(
                locks
                    .try_lock(ino, 4096, 1, LockMode::Shared)
                    .unwrap()
                    .is_none(),
                "file {ino}'s own range must still exclude"
            );
        }
        assert!(guards[5].covers(&locks, 5, 0, 1 << 20));
        assert!(
            !guards[5].covers(&locks, 6, 0, 4096),
            "another file's range"
        );
        drop(guards);
        assert!(
            locks
                .try_lock(3, 0, u64::MAX / 2, LockMode::Exclusive)
                .unwrap()
                .is_some()
        );
    }

    /// A table that had to hold more entries than fit beside its lock word takes them back
    /// there once few enough are left.
    #[test]
    fn a_table_takes_its_entries_back_inline() {
        let locks = RangeLocks::new(4096).unwrap();
        let table = |at: u64| {
            let index = ShardSet::of(INO, at, at + 1).expect("narrow").first as usize;
            locks.shards[index].table.lock().unwrap().held.spilled()
        };
        let guards: Vec<_> = (0..INLINE_HELD as u64 + 1)
            .map(|i| {
                locks
                    .lock(INO, i * 4096, 4096, LockMode::Exclusive)
                    .unwrap()
            })
            .collect();
        assert!(table(0), "more entries than fit inline");
        let mut guards = guards.into_iter();
        drop(guards.next());
        assert!(!table(0), "back inline with {INLINE_HELD} left");
        drop(guards);
        assert!(!table(0));
    }

    /// A file's stretches up to [`SHARDS`] have tables of their own, so writers of disjoint
    /// parts of it never write the same table; a file's first stretch goes to a table its
    /// number picks.
    #[test]
    fn disjoint_stretches_of_a_file_have_tables_of_their_own() {
        const MIB2: u64 = 2 << 20;
        for ino in [2, 7, 1000, u64::MAX / 3] {
            let mut seen = vec![false; SHARDS];
            for stretch in 0..SHARDS as u64 {
                let at = stretch * MIB2 + 4096;
                let set = ShardSet::of(ino, at, at + 4096).expect("narrow");
                assert_eq!(set.count, 1);
                assert!(
                    !std::mem::replace(&mut seen[set.first as usize], true),
                    "file {ino}: stretch {stretch} shares table {} with another",
                    set.first
                );
            }
        }
        let firsts: std::collections::HashSet<u32> = (0..64u64)
            .map(|ino| ShardSet::of(ino, 0, 4096).unwrap().first)
            .collect();
        assert!(
            firsts.len() > 32,
            "files numbered in sequence spread out: {firsts:?}"
        );
    }

    /// A narrow range across the last table and the first takes them low one first, and
    /// meets holders in both.
    #[test]
    fn a_range_that_wraps_round_the_tables_meets_holders_in_both() {
        const MIB2: u64 = 2 << 20;
        let locks = RangeLocks::new(4096).unwrap();
        // The stretch whose table is the last one.
        let last = (0..SHARDS as u64)
            .find(|&s| {
                ShardSet::of(INO, s * MIB2, s * MIB2 + 1).unwrap().first as usize == SHARDS - 1
            })
            .unwrap();
        let spanning = ShardSet::of(INO, last * MIB2, (last + 2) * MIB2).unwrap();
        assert_eq!(spanning.iter().collect::<Vec<_>>(), vec![0, SHARDS - 1]);
        for at in [last * MIB2 + 8192, (last + 1) * MIB2 + 8192] {
            let holder = locks.lock(INO, at, 4096, LockMode::Exclusive).unwrap();
            assert!(
                locks
                    .try_lock(INO, last * MIB2, 2 * MIB2, LockMode::Shared)
                    .unwrap()
                    .is_none(),
                "holder at {at} missed"
            );
            drop(holder);
        }
        assert!(
            locks
                .try_lock(INO, last * MIB2, 2 * MIB2, LockMode::Exclusive)
                .unwrap()
                .is_some()
        );
    }

    /// Wide ranges (a whole file) and narrow ones exclude each other while both kinds come
    /// and go on several threads: neither side publishes and looks in an order that lets
    /// both through. Shared wide and narrow ranges coexist.
    #[test]
    fn wide_and_narrow_lockers_exclude_each_other_under_contention() {
        use std::sync::atomic::{AtomicBool, AtomicU32};
        let locks = RangeLocks::new(4096).unwrap();
        let narrow_in = AtomicU32::new(0);
        let wide_in = AtomicBool::new(false);
        let overlaps = AtomicU32::new(0);
        std::thread::scope(|scope| {
            for t in 0..2u64 {
                let (locks, narrow_in, wide_in, overlaps) =
                    (&locks, &narrow_in, &wide_in, &overlaps);
                scope.spawn(move || {
                    let mut x = t * 7919 + 1;
                    for i in 0..20_000u64 {
                        x = x
                            .wrapping_mul(6364136223846793005)
                            .wrapping_add(1442695040888963407);
                        let block = (x >> 33) % 65_536;
                        let guard = if i % 8 == 0 {
                            match locks
                                .try_lock(INO, block * 4096, 4096, LockMode::Exclusive)
                                .unwrap()
                            {
                                Some(g) => g,
                                None => continue,
                            }
                        } else {
                            locks
                                .lock(INO, block * 4096, 4096, LockMode::Exclusive)
                                .unwrap()
                        };
                        narrow_in.fetch_add(1, Ordering::SeqCst);
                        if wide_in.load(Ordering::SeqCst) {
                            overlaps.fetch_add(1, Ordering::SeqCst);
                        }
                        std::hint::spin_loop();
                        narrow_in.fetch_sub(1, Ordering::SeqCst);
                        drop(guard);
                    }
                });
            }
            scope.spawn(|| {
                for i in 0..1_000 {
                    let guard = if i % 4 == 0 {
                        match locks
                            .try_lock(INO, 0, u64::MAX / 2, LockMode::Exclusive)
                            .unwrap()
                        {
                            Some(g) => g,
                            None => continue,
                        }
                    } else {
                        locks
                            .lock(INO, 0, u64::MAX / 2, LockMode::Exclusive)
                            .unwrap()
                    };
                    wide_in.store(true, Ordering::SeqCst);
                    for _ in 0..50 {
                        if narrow_in.load(Ordering::SeqCst) != 0 {
                            overlaps.fetch_add(1, Ordering::SeqCst);
                        }
                        std::hint::spin_loop();
                    }
                    wide_in.store(false, Ordering::SeqCst);
                    drop(guard);
                }
            });
        });
        assert_eq!(
            overlaps.load(Ordering::SeqCst),
            0,
            "a wide and a narrow holder overlapped"
        );
        // Shared ranges of both kinds coexist; an exclusive one of either kind is refused.
        let whole = locks.lock(INO, 0, u64::MAX / 2, LockMode::Shared).unwrap();
        let narrow = locks
            .try_lock(INO, 4096, 4096, LockMode::Shared)
            .unwrap()
            .expect("readers share");
        assert!(
            locks
                .try_lock(INO, 8192, 4096, LockMode::Exclusive)
                .unwrap()
                .is_none()
        );
        assert!(
            locks
                .try_lock(INO, 0, 1 << 40, LockMode::Exclusive)
                .unwrap()
                .is_none()
        );
        drop((whole, narrow));
        assert!(
            locks
                .try_lock(INO, 0, 1 << 40, LockMode::Exclusive)
                .unwrap()
                .is_some()
        );
    }

    #[test]
    fn bad_requests_are_refused() {
        assert!(RangeLocks::new(1000).is_err());
        assert!(RangeLocks::new(4 << 20).is_err());
        let locks = RangeLocks::new(4096).unwrap();
        assert!(locks.lock(INO, 0, 0, LockMode::Shared).is_err());
        assert!(locks.lock(INO, u64::MAX, 2, LockMode::Shared).is_err());
    }
}
