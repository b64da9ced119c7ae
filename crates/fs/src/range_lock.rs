//! Range locks on one file: writers of disjoint ranges proceed in parallel, readers never
//! block readers, and a writer excludes everyone on the ranges it overlaps.
//!
//! Ranges are rounded out to a granule between 4 KiB and 2 MiB (per file), so two writes in
//! the same granule serialise even when their bytes do not overlap: a granule is the unit a
//! checkpoint may remap or copy, and it must not move under a writer. Held locks sit in a
//! short list (one entry per holder, bounded by the threads using the file).

use std::sync::{Condvar, Mutex};

use crate::error::{FsError, Result};

/// Smallest granule.
pub const MIN_GRANULE: u64 = 4096;
/// Largest granule.
pub const MAX_GRANULE: u64 = 2 << 20;

/// Shared (read) or exclusive (write).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LockMode {
    /// Readers share.
    Shared,
    /// A writer excludes overlapping holders.
    Exclusive,
}

#[derive(Debug, Clone, Copy)]
struct Held {
    id: u64,
    start: u64,
    end: u64,
    mode: LockMode,
}

/// Held ranges, the next holder id, and how many lockers wait (unlocking wakes them only
/// when there are any: the common path makes no system call).
#[derive(Debug, Default)]
struct Table {
    next_id: u64,
    held: Vec<Held>,
    waiting: usize,
}

/// The range locks of one file.
#[derive(Debug)]
pub struct RangeLocks {
    granule: u64,
    held: Mutex<Table>,
    released: Condvar,
}

/// A held range; released when dropped.
#[derive(Debug)]
pub struct RangeGuard<'a> {
    locks: &'a RangeLocks,
    id: u64,
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
            held: Mutex::new(Table::default()),
            released: Condvar::new(),
        })
    }

    /// Waits until `[offset, offset + len)` can be held in `mode`, then holds it.
    pub fn lock(&self, offset: u64, len: u64, mode: LockMode) -> Result<RangeGuard<'_>> {
        let (start, end) = self.round(offset, len)?;
        let mut held = self.held.lock().expect("range lock table");
        while conflicts(&held.held, start, end, mode) {
            held.waiting += 1;
            held = self.released.wait(held).expect("range lock table");
            held.waiting -= 1;
        }
        Ok(self.insert(&mut held, start, end, mode))
    }

    /// Holds the range if nothing conflicts now; `None` otherwise.
    pub fn try_lock(
        &self,
        offset: u64,
        len: u64,
        mode: LockMode,
    ) -> Result<Option<RangeGuard<'_>>> {
        let (start, end) = self.round(offset, len)?;
        let mut held = self.held.lock().expect("range lock table");
        if conflicts(&held.held, start, end, mode) {
            return Ok(None);
        }
        Ok(Some(self.insert(&mut held, start, end, mode)))
    }

    fn insert(&self, held: &mut Table, start: u64, end: u64, mode: LockMode) -> RangeGuard<'_> {
        held.next_id += 1;
        let id = held.next_id;
        held.held.push(Held {
            id,
            start,
            end,
            mode,
        });
        RangeGuard { locks: self, id }
    }

    fn round(&self, offset: u64, len: u64) -> Result<(u64, u64)> {
        let end = offset.checked_add(len).filter(|_| len > 0).ok_or_else(|| {
            FsError::BadRange(format!("{len} bytes at {offset} is empty or overflows"))
        })?;
        let start = offset - offset % self.granule;
        let end = end.div_ceil(self.granule).saturating_mul(self.granule);
        Ok((start, end))
    }
}

fn conflicts(held: &[Held], start: u64, end: u64, mode: LockMode) -> bool {
    held.iter().any(|h| {
        h.start < end
            && start < h.end
            && (mode == LockMode::Exclusive || h.mode == LockMode::Exclusive)
    })
}

impl Drop for RangeGuard<'_> {
    fn drop(&mut self) {
        let mut held = self.locks.held.lock().expect("range lock table");
        held.held.retain(|h| h.id != self.id);
        let waiting = held.waiting > 0;
        drop(held);
        if waiting {
            self.locks.released.notify_all();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn disjoint_writers_and_shared_readers_coexist() {
        let locks = RangeLocks::new(4096).unwrap();
        let a = locks
            .try_lock(0, 4096, LockMode::Exclusive)
            .unwrap()
            .expect("free");
        let b = locks
            .try_lock(4096, 4096, LockMode::Exclusive)
            .unwrap()
            .expect("disjoint");
        let r1 = locks
            .try_lock(8192, 100, LockMode::Shared)
            .unwrap()
            .expect("free");
        let r2 = locks
            .try_lock(8192, 100, LockMode::Shared)
            .unwrap()
            .expect("readers share");
        assert!(
            locks.try_lock(100, 10, LockMode::Shared).unwrap().is_none(),
            "a reader waits for a writer"
        );
        assert!(
            locks
                .try_lock(8200, 10, LockMode::Exclusive)
                .unwrap()
                .is_none(),
            "a writer waits for readers"
        );
        drop((a, b, r1, r2));
        assert!(
            locks
                .try_lock(0, 1 << 20, LockMode::Exclusive)
                .unwrap()
                .is_some()
        );
    }

    #[test]
    fn granules_round_ranges_out() {
        let locks = RangeLocks::new(2 << 20).unwrap();
        let _a = locks.lock(0, 1, LockMode::Exclusive).unwrap();
        assert!(
            locks
                .try_lock((2 << 20) - 1, 1, LockMode::Exclusive)
                .unwrap()
                .is_none(),
            "same 2 MiB granule"
        );
        assert!(
            locks
                .try_lock(2 << 20, 1, LockMode::Exclusive)
                .unwrap()
                .is_some(),
            "next granule"
        );
    }

    #[test]
    fn a_blocked_writer_proceeds_when_the_range_is_released() {
        let locks = RangeLocks::new(4096).unwrap();
        let first = locks.lock(0, 4096, LockMode::Exclusive).unwrap();
        let acquired = std::sync::atomic::AtomicBool::new(false);
        std::thread::scope(|scope| {
            let waiter = scope.spawn(|| {
                let _guard = locks.lock(0, 4096, LockMode::Exclusive).unwrap();
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
    fn bad_requests_are_refused() {
        assert!(RangeLocks::new(1000).is_err());
        assert!(RangeLocks::new(4 << 20).is_err());
        let locks = RangeLocks::new(4096).unwrap();
        assert!(locks.lock(0, 0, LockMode::Shared).is_err());
        assert!(locks.lock(u64::MAX, 2, LockMode::Shared).is_err());
    }
}
