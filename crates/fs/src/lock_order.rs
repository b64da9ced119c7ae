//! Lock-order checking. Every lock the file system (and the preload library above it) takes
//! has a [`Rank`]; a thread takes locks in strictly increasing rank, so no two threads can
//! wait for each other. Debug builds (every test) assert it at each acquisition and count
//! what each thread holds; release builds compile it all away.
//!
//! One order for the whole process: callers above the file system (the preload library) use
//! ranks below [`FS_FIRST`], which they may hold while they call into it; the file system's
//! own ranks are the `FS_*` constants here, outermost first.
//!
//! A rank may admit a second lock of the same rank while a lock of another rank is held:
//! directory entries, two of which only a thread holding the rename lock may hold (it
//! orders them by inode number itself).

use std::marker::PhantomData;

/// A lock's place in the order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Rank {
    /// Locks are taken in increasing `level`.
    pub level: u8,
    /// For messages.
    pub name: &'static str,
    /// A second lock of this rank may be taken while one of rank `nests_under` is held.
    pub nests_under: Option<u8>,
}

impl Rank {
    /// A rank that admits one lock at a time.
    pub const fn new(level: u8, name: &'static str) -> Self {
        Self {
            level,
            name,
            nests_under: None,
        }
    }
}

/// The first level of the file system's own ranks.
pub const FS_FIRST: u8 = 100;
/// `Inner::batch`: a checkpoint batch, or a truncation or hole keeping batches out.
pub const FS_BATCH: Rank = Rank::new(FS_FIRST, "the checkpoint batch lock");
/// A file's range lock.
pub const FS_RANGE: Rank = Rank::new(FS_FIRST + 1, "a range lock");
/// `Inner::gate`: metadata operations (shared) against a snapshot (exclusive).
pub const FS_GATE: Rank = Rank::new(FS_FIRST + 2, "the metadata gate");
/// `Inner::rename`: renames and rmdir, which lock two directories.
pub const FS_RENAME: Rank = Rank::new(FS_FIRST + 3, "the rename lock");
/// A directory's entries; two only under the rename lock.
pub const FS_DIRECTORY: Rank = Rank {
    level: FS_FIRST + 4,
    name: "a directory's entries",
    nests_under: Some(FS_FIRST + 3),
};
/// A thread slot's journal.
pub const FS_JOURNAL: Rank = Rank::new(FS_FIRST + 5, "a journal");
/// A thread slot's log area.
pub const FS_LOG: Rank = Rank::new(FS_FIRST + 6, "a log area");
/// `Inner::inodes`, the inode table: innermost — looked up or changed with any of the above
/// held, and nothing of them taken while it is held (a live scrub that walked directories
/// holding it, taking their entries, deadlocked with a removal that holds its directory's
/// entries and then takes the table to drop the inode).
pub const FS_TABLE: Rank = Rank::new(FS_FIRST + 7, "the inode table");

/// Proof that the thread holds a lock of a rank (in debug builds, counted until dropped).
/// Not `Send`: a lock is released by the thread that took it.
#[derive(Debug)]
#[must_use = "the rank counts as held until this is dropped"]
pub struct Held {
    #[cfg(debug_assertions)]
    level: u8,
    _thread: PhantomData<*const ()>,
}

#[cfg(debug_assertions)]
mod held {
    use std::cell::Cell;

    thread_local! {
        /// How many locks of each level the thread holds, and the name of the last taken.
        pub(super) static COUNT: [Cell<u8>; 256] = const { [const { Cell::new(0) }; 256] };
        pub(super) static NAME: [Cell<&'static str>; 256] = const { [const { Cell::new("") }; 256] };
    }
}

/// Records that the thread is about to take a lock of `rank`; call it just before the
/// acquisition and keep the result as long as the lock.
///
/// # Panics
/// In debug builds, when the thread holds a lock of the same or a later rank (the order is
/// broken: two threads could deadlock).
pub fn enter(rank: Rank) -> Held {
    #[cfg(debug_assertions)]
    held::COUNT.with(|count| {
        held::NAME.with(|name| {
            let level = usize::from(rank.level);
            let nested = rank
                .nests_under
                .is_some_and(|under| count[usize::from(under)].get() > 0);
            for later in level..count.len() {
                if count[later].get() > 0 && !(later == level && nested) {
                    panic!(
                        "lock order broken: taking {} while holding {}",
                        rank.name,
                        name[later].get()
                    );
                }
            }
            count[level].set(count[level].get() + 1);
            name[level].set(rank.name);
        });
    });
    #[cfg(not(debug_assertions))]
    let _ = rank;
    Held {
        #[cfg(debug_assertions)]
        level: rank.level,
        _thread: PhantomData,
    }
}

/// Asserts (debug builds) that the thread holds no lock at or after `rank` — before it waits
/// for something that needs those locks, such as the checkpoint.
///
/// # Panics
/// In debug builds, when it does.
pub fn assert_none_from(rank: Rank, waiting_for: &str) {
    #[cfg(debug_assertions)]
    held::COUNT.with(|count| {
        held::NAME.with(|name| {
            if let Some(level) =
                (usize::from(rank.level)..count.len()).find(|&l| count[l].get() > 0)
            {
                panic!(
                    "waiting for {waiting_for} while holding {}",
                    name[level].get()
                );
            }
        });
    });
    let _ = (rank, waiting_for);
}

impl Drop for Held {
    fn drop(&mut self) {
        #[cfg(debug_assertions)]
        held::COUNT.with(|count| {
            let c = &count[usize::from(self.level)];
            debug_assert!(c.get() > 0, "a lock released twice");
            c.set(c.get() - 1);
        });
    }
}

/// A lock guard with its rank held.
#[derive(Debug)]
pub struct Ordered<G> {
    // Declared first: the lock is released before the rank stops counting as held.
    guard: G,
    _held: Held,
}

impl<G> Ordered<G> {
    /// Takes a lock of `rank` with `acquire`.
    pub fn take(rank: Rank, acquire: impl FnOnce() -> G) -> Self {
        let held = enter(rank);
        Self {
            guard: acquire(),
            _held: held,
        }
    }

    /// The guard itself (for guards that are not smart pointers, such as a range lock's).
    pub fn guard(&self) -> &G {
        &self.guard
    }

    /// The guard itself, mutably (to wait on a condition variable with it).
    pub fn guard_mut(&mut self) -> &mut G {
        &mut self.guard
    }

    /// Takes a lock of `rank` with `acquire`, which may fail.
    pub fn try_take<E>(rank: Rank, acquire: impl FnOnce() -> Result<G, E>) -> Result<Self, E> {
        let held = enter(rank);
        Ok(Self {
            guard: acquire()?,
            _held: held,
        })
    }
}

impl<G: std::ops::Deref> std::ops::Deref for Ordered<G> {
    type Target = G::Target;
    fn deref(&self) -> &G::Target {
        &self.guard
    }
}

impl<G: std::ops::DerefMut> std::ops::DerefMut for Ordered<G> {
    fn deref_mut(&mut self) -> &mut G::Target {
        &mut self.guard
    }
}

#[cfg(all(test, debug_assertions))]
mod tests {
    use std::sync::Mutex;

    use super::*;

    #[test]
    fn increasing_ranks_are_fine_and_released_ranks_can_be_taken_again() {
        let (a, b) = (Mutex::new(1), Mutex::new(2));
        {
            let _a = Ordered::take(FS_GATE, || a.lock().unwrap());
            let _b = Ordered::take(FS_JOURNAL, || b.lock().unwrap());
        }
        let _b = Ordered::take(FS_JOURNAL, || b.lock().unwrap());
        drop(_b);
        let _a = Ordered::take(FS_GATE, || a.lock().unwrap());
    }

    #[test]
    #[should_panic(expected = "taking the metadata gate while holding a journal")]
    fn a_lower_rank_under_a_higher_one_panics() {
        let _j = enter(FS_JOURNAL);
        let _g = enter(FS_GATE);
    }

    #[test]
    #[should_panic(expected = "taking a directory's entries while holding a directory's entries")]
    fn two_directories_need_the_rename_lock() {
        let _d = enter(FS_DIRECTORY);
        let _e = enter(FS_DIRECTORY);
    }

    #[test]
    fn two_directories_under_the_rename_lock() {
        let _r = enter(FS_RENAME);
        let _d = enter(FS_DIRECTORY);
        let _e = enter(FS_DIRECTORY);
    }

    #[test]
    #[should_panic(expected = "taking a directory's entries while holding the inode table")]
    fn directories_are_not_walked_under_the_inode_table() {
        let _t = enter(FS_TABLE);
        let _d = enter(FS_DIRECTORY);
    }

    #[test]
    fn the_inode_table_is_looked_up_under_every_other_rank() {
        let _held: Vec<Held> = [FS_BATCH, FS_RANGE, FS_GATE, FS_RENAME, FS_DIRECTORY]
            .into_iter()
            .chain([FS_JOURNAL, FS_LOG, FS_TABLE])
            .map(enter)
            .collect();
    }

    #[test]
    #[should_panic(expected = "waiting for the checkpoint while holding a range lock")]
    fn waiting_with_a_lock_held_panics() {
        let _r = enter(FS_RANGE);
        assert_none_from(FS_BATCH, "the checkpoint");
    }
}
