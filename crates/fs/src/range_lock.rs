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

use std::sync::{Condvar, Mutex, MutexGuard};

use smallvec::SmallVec;

use crate::error::{FsError, Result};

/// Smallest granule.
pub const MIN_GRANULE: u64 = 4096;
/// Largest granule.
pub const MAX_GRANULE: u64 = 2 << 20;
/// How many tables the locks are spread over (one bit each in [`ShardSet`]).
pub const SHARDS: usize = 64;
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
}

// The inline entries stay in the shard's own two cache lines.
const _: () = assert!(size_of::<Shard>() == 128);

/// The range locks of every file of a file system.
#[derive(Debug)]
pub struct RangeLocks {
    granule: u64,
    shards: Box<[Shard]>,
}

/// A held range; released when dropped.
#[derive(Debug)]
pub struct RangeGuard<'a> {
    locks: &'a RangeLocks,
    shards: ShardSet,
    /// The held range, rounded out to the granule, as entered in the tables.
    held: Held,
}

/// The tables a range touches, as a bit set (bit i = shard i).
#[derive(Debug, Clone, Copy)]
struct ShardSet(u64);

impl ShardSet {
    /// The tables of `[start, end)` of file `ino`.
    fn of(ino: u64, start: u64, end: u64) -> Self {
        let first = start / STRETCH;
        let last = (end - 1) / STRETCH;
        if last - first + 1 >= SHARDS as u64 {
            return Self(u64::MAX);
        }
        // Where the file's stretch 0 goes: the inode number's high bits after a
        // multiplicative hash, so that files numbered in sequence spread out.
        let base = ino.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> (64 - SHARDS.trailing_zeros());
        let mut bits = 0u64;
        for stretch in first..=last {
            bits |= 1 << (base.wrapping_add(stretch) % SHARDS as u64);
        }
        Self(bits)
    }

    /// The tables, in index order: one step per table (a scan of all [`SHARDS`] bits on
    /// every lock and unlock measured as twice the range locks' cost in a 4 KiB write).
    fn iter(self) -> impl Iterator<Item = usize> {
        let mut bits = self.0;
        std::iter::from_fn(move || {
            (bits != 0).then(|| {
                let index = bits.trailing_zeros() as usize;
                bits &= bits - 1;
                index
            })
        })
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
        })
    }

    /// Waits until `[offset, offset + len)` of file `ino` can be held in `mode`, then holds
    /// it.
    pub fn lock(&self, ino: u64, offset: u64, len: u64, mode: LockMode) -> Result<RangeGuard<'_>> {
        let held = self.round(ino, offset, len, mode)?;
        let shards = ShardSet::of(ino, held.start, held.end);
        let mut spun: Option<std::time::Instant> = None;
        loop {
            match self.try_enter(held, shards) {
                Ok(guard) => return Ok(guard),
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
                Err((index, mut table)) => {
                    // Every other table is released; wait here, then start over.
                    let shard = &self.shards[index];
                    table.waiting += 1;
                    while table.conflicts(&held) {
                        table = shard.released.wait(table).expect("range lock table");
                    }
                    table.waiting -= 1;
                }
            }
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
        Ok(self
            .try_enter(held, ShardSet::of(ino, held.start, held.end))
            .ok())
    }

    /// Takes the tables of `shards` in order and enters `held` in all of them, or returns
    /// the first table with a conflict (still locked; the others released).
    fn try_enter(
        &self,
        held: Held,
        shards: ShardSet,
    ) -> std::result::Result<RangeGuard<'_>, (usize, MutexGuard<'_, Table>)> {
        let mut tables: Vec<MutexGuard<'_, Table>> = Vec::new();
        let mut single = None;
        for index in shards.iter() {
            let table = self.shards[index].table.lock().expect("range lock table");
            if table.conflicts(&held) {
                return Err((index, table));
            }
            if single.is_none() && tables.is_empty() {
                single = Some(table);
            } else {
                tables.extend(single.take());
                tables.push(table);
            }
        }
        for table in single.iter_mut().chain(tables.iter_mut()) {
            table.held.push(held);
        }
        Ok(RangeGuard {
            locks: self,
            shards,
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
        for index in self.shards.iter() {
            let shard = &self.locks.shards[index];
            let mut table = shard.table.lock().expect("range lock table");
            if let Some(at) = table.held.iter().position(|h| *h == self.held) {
                table.held.swap_remove(at);
            }
            // Back beside the lock word once few enough: a table that once held more (a
            // truncation's range enters every table) would otherwise keep its entries in
            // the heap buffer for good.
            if table.held.spilled() && table.held.len() <= INLINE_HELD {
                table.held.shrink_to_fit();
            }
            let waiting = table.waiting > 0;
            drop(table);
            if waiting {
                shard.released.notify_all();
            }
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
                acquired.store(true, std::sync::atomic::Ordering::SeqCst);
            });
            std::thread::sleep(std::time::Duration::from_millis(20));
            assert!(
                !acquired.load(std::sync::atomic::Ordering::SeqCst),
                "the waiter must not get an overlapping range"
            );
            drop(first);
            waiter.join().unwrap();
        });
        assert!(acquired.load(std::sync::atomic::Ordering::SeqCst));
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
            let index = ShardSet::of(INO, at, at + 1).0.trailing_zeros() as usize;
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

    #[test]
    fn bad_requests_are_refused() {
        assert!(RangeLocks::new(1000).is_err());
        assert!(RangeLocks::new(4 << 20).is_err());
        let locks = RangeLocks::new(4096).unwrap();
        assert!(locks.lock(INO, 0, 0, LockMode::Shared).is_err());
        assert!(locks.lock(INO, u64::MAX, 2, LockMode::Shared).is_err());
    }
}
