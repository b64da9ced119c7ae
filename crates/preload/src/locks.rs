//! Advisory locks on locus files: `fcntl` record locks (process-owned, the classic POSIX
//! kind), open-file-description locks (`F_OFD_*`) and `flock`. One process owns a volume at a
//! time (the volume lock), so every lock lives in this process's table: process-owned record
//! locks never conflict with each other (POSIX: a process's own locks replace one another),
//! description-owned ones conflict between descriptions, and the two kinds conflict with each
//! other as in Linux. `flock` locks are a separate space, as in Linux.

use std::collections::HashMap;

use parking_lot::{Condvar, Mutex};

/// Which lock space.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Space {
    /// `fcntl` record locks (process-owned and OFD).
    Record,
    /// `flock`.
    Flock,
}

/// Who holds a lock.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Owner {
    /// This process (`F_SETLK`, `F_SETLKW`, `lockf`).
    Process,
    /// One open file description (`F_OFD_SETLK`, `flock`), by id.
    Description(u64),
}

/// What to do with a range.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// A read lock.
    Shared,
    /// A write lock.
    Exclusive,
    /// Remove the owner's locks on the range.
    Unlock,
}

/// A held lock: `[start, end)` in bytes, `end == u64::MAX` meaning "to the end, however far".
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Held {
    /// Holder.
    pub owner: Owner,
    /// First byte.
    pub start: u64,
    /// One past the last byte.
    pub end: u64,
    /// Write lock.
    pub exclusive: bool,
}

impl Held {
    fn conflicts(&self, owner: Owner, start: u64, end: u64, exclusive: bool) -> bool {
        let others = match (self.owner, owner) {
            (Owner::Process, Owner::Process) => false,
            (a, b) => a != b,
        };
        others && (self.exclusive || exclusive) && self.start < end && start < self.end
    }
}

/// The process's lock table.
#[derive(Debug, Default)]
pub struct Locks {
    held: Mutex<HashMap<(u64, Space), Vec<Held>>>,
    released: Condvar,
}

impl Locks {
    /// The first lock another owner holds that conflicts with the request.
    pub fn test(
        &self,
        ino: u64,
        space: Space,
        owner: Owner,
        range: (u64, u64),
        exclusive: bool,
    ) -> Option<Held> {
        let held = crate::state::ordered(crate::state::rank::LOCK_TABLE, || self.held.lock());
        first_conflict(held.get(&(ino, space)), owner, range, exclusive)
    }

    /// Locks or unlocks `range` for `owner`; with `wait`, sleeps until no conflict remains,
    /// otherwise returns the conflicting lock.
    pub fn set(
        &self,
        ino: u64,
        space: Space,
        owner: Owner,
        range: (u64, u64),
        kind: Kind,
        wait: bool,
    ) -> Result<(), Held> {
        let (start, end) = range;
        let mut held = crate::state::ordered(crate::state::rank::LOCK_TABLE, || self.held.lock());
        if kind != Kind::Unlock {
            let exclusive = kind == Kind::Exclusive;
            loop {
                match first_conflict(held.get(&(ino, space)), owner, range, exclusive) {
                    None => break,
                    Some(conflict) if !wait => return Err(conflict),
                    Some(_) => self.released.wait(held.guard_mut()),
                }
            }
        }
        let list = held.entry((ino, space)).or_default();
        // Take the owner's coverage of the range away, keeping what sticks out either side.
        let mut kept = Vec::with_capacity(list.len() + 2);
        for lock in list.drain(..) {
            if lock.owner != owner || lock.end <= start || end <= lock.start {
                kept.push(lock);
                continue;
            }
            if lock.start < start {
                kept.push(Held { end: start, ..lock });
            }
            if end < lock.end {
                kept.push(Held { start: end, ..lock });
            }
        }
        if kind != Kind::Unlock {
            kept.push(Held {
                owner,
                start,
                end,
                exclusive: kind == Kind::Exclusive,
            });
        }
        if kept.is_empty() {
            held.remove(&(ino, space));
        } else {
            *list = kept;
        }
        drop(held);
        self.released.notify_all();
        Ok(())
    }

    /// Drops every lock of `owner` on `ino` in `space`.
    pub fn release(&self, ino: u64, space: Space, owner: Owner) {
        let mut held = crate::state::ordered(crate::state::rank::LOCK_TABLE, || self.held.lock());
        if let Some(list) = held.get_mut(&(ino, space)) {
            list.retain(|l| l.owner != owner);
            if list.is_empty() {
                held.remove(&(ino, space));
            }
        }
        drop(held);
        self.released.notify_all();
    }

    /// Whether the process holds no lock at all.
    pub fn is_empty(&self) -> bool {
        crate::state::ordered(crate::state::rank::LOCK_TABLE, || self.held.lock()).is_empty()
    }

    /// Forgets every lock (a forked child: they belong to the parent).
    pub fn clear(&self) {
        crate::state::ordered(crate::state::rank::LOCK_TABLE, || self.held.lock()).clear();
    }

    /// The table's mutex, for the fork handlers.
    pub(crate) fn mutex(&self) -> &Mutex<HashMap<(u64, Space), Vec<Held>>> {
        &self.held
    }
}

fn first_conflict(
    list: Option<&Vec<Held>>,
    owner: Owner,
    (start, end): (u64, u64),
    exclusive: bool,
) -> Option<Held> {
    list?
        .iter()
        .find(|l| l.conflicts(owner, start, end, exclusive))
        .copied()
}

#[cfg(test)]
mod tests {
    use super::*;

    const A: Owner = Owner::Description(1);
    const B: Owner = Owner::Description(2);
    const P: Owner = Owner::Process;

    #[test]
    fn descriptions_conflict_and_the_process_never_with_itself() {
        let locks = Locks::default();
        locks
            .set(7, Space::Record, A, (0, 100), Kind::Exclusive, false)
            .unwrap();
        let conflict = locks
            .set(7, Space::Record, B, (50, 60), Kind::Shared, false)
            .unwrap_err();
        assert_eq!(conflict.owner, A);
        assert!(
            locks
                .set(7, Space::Record, P, (99, 200), Kind::Shared, false)
                .is_err()
        );
        locks
            .set(7, Space::Record, B, (100, 200), Kind::Shared, false)
            .unwrap();
        // Other space, other inode: free.
        locks
            .set(7, Space::Flock, B, (0, u64::MAX), Kind::Exclusive, false)
            .unwrap();
        locks
            .set(8, Space::Record, B, (0, 100), Kind::Exclusive, false)
            .unwrap();
        locks
            .set(9, Space::Record, P, (0, 10), Kind::Exclusive, false)
            .unwrap();
        locks
            .set(9, Space::Record, P, (5, 20), Kind::Exclusive, false)
            .unwrap();
    }

    #[test]
    fn unlocking_the_middle_splits_a_lock() {
        let locks = Locks::default();
        locks
            .set(1, Space::Record, A, (0, 100), Kind::Exclusive, false)
            .unwrap();
        locks
            .set(1, Space::Record, A, (40, 60), Kind::Unlock, false)
            .unwrap();
        assert!(locks.test(1, Space::Record, B, (40, 60), true).is_none());
        assert_eq!(
            locks.test(1, Space::Record, B, (30, 45), true).unwrap().end,
            40
        );
        assert_eq!(
            locks
                .test(1, Space::Record, B, (59, 70), true)
                .unwrap()
                .start,
            60
        );
        locks.release(1, Space::Record, A);
        assert!(
            locks
                .test(1, Space::Record, B, (0, u64::MAX), true)
                .is_none()
        );
    }

    #[test]
    fn a_waiter_gets_the_lock_when_it_is_released() {
        let locks = std::sync::Arc::new(Locks::default());
        locks
            .set(1, Space::Flock, A, (0, u64::MAX), Kind::Exclusive, false)
            .unwrap();
        let waiter = {
            let locks = locks.clone();
            std::thread::spawn(move || {
                locks
                    .set(1, Space::Flock, B, (0, u64::MAX), Kind::Exclusive, true)
                    .unwrap();
            })
        };
        std::thread::sleep(std::time::Duration::from_millis(50));
        assert!(!waiter.is_finished());
        locks.release(1, Space::Flock, A);
        waiter.join().unwrap();
        assert_eq!(
            locks.test(1, Space::Flock, A, (0, 1), false).unwrap().owner,
            B
        );
    }
}
