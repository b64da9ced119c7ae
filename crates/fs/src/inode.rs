//! Inodes in DRAM: attributes, directory entries, extent map, overlay, range locks; and
//! what `stat` and `readdir` report of them.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU64};
use std::sync::{Mutex, MutexGuard, RwLock};

use crate::error::Result;
use crate::extent_map::ExtentMap;
use crate::journal::Kind;
use crate::lock_order::{FS_DIRECTORY, FS_RANGE, Ordered};
use crate::overlay::Overlay;
use crate::range_lock::{LockMode, RangeGuard, RangeLocks};

/// Attributes of an inode that change under its lock.
#[derive(Debug, Clone)]
pub(crate) struct Attr {
    pub(crate) mode: u32,
    /// Parent directory (directories only).
    pub(crate) parent: u64,
    /// No longer named by any directory.
    pub(crate) unlinked: bool,
}

/// A file or directory in DRAM.
#[derive(Debug)]
pub(crate) struct Inode {
    pub(crate) ino: u64,
    pub(crate) kind: Kind,
    pub(crate) attr: Mutex<Attr>,
    /// Last modification (ns since the Unix epoch). An atomic, not in `Attr`: every write
    /// raises it (`fetch_max`), and writers share no lock on the hot path.
    pub(crate) mtime: AtomicU64,
    /// Entries, for directories.
    pub(crate) entries: Mutex<BTreeMap<String, u64>>,
    /// Bytes, including logged writes not yet checkpointed.
    pub(crate) size: AtomicU64,
    pub(crate) extents: RwLock<ExtentMap>,
    /// Set when the file's blocks went back to the volume: nothing may map into it again.
    pub(crate) dead: AtomicBool,
    pub(crate) overlay: Overlay,
    pub(crate) locks: RangeLocks,
    pub(crate) opens: AtomicU64,
}

impl Inode {
    pub(crate) fn new(ino: u64, kind: Kind, attr: Attr, mtime: u64, granule: u64) -> Self {
        Self {
            ino,
            kind,
            attr: Mutex::new(attr),
            mtime: AtomicU64::new(mtime),
            entries: Mutex::default(),
            size: AtomicU64::new(0),
            extents: RwLock::default(),
            dead: AtomicBool::new(false),
            overlay: Overlay::default(),
            locks: RangeLocks::new(granule).expect("granule checked at open"),
            opens: AtomicU64::new(0),
        }
    }

    /// The inode with a size, directory entries and an extent map (recovery, from a
    /// snapshot).
    pub(crate) fn with_contents(
        mut self,
        size: u64,
        entries: BTreeMap<String, u64>,
        extents: ExtentMap,
    ) -> Self {
        *self.size.get_mut() = size;
        *self.entries.get_mut().expect("directory") = entries;
        *self.extents.get_mut().expect("extent map") = extents;
        self
    }

    /// The directory's entries, locked (rank [`FS_DIRECTORY`]).
    pub(crate) fn entries(&self) -> Ordered<MutexGuard<'_, BTreeMap<String, u64>>> {
        Ordered::take(FS_DIRECTORY, || self.entries.lock().expect("directory"))
    }

    /// `[offset, offset + len)` of the file, locked (rank [`FS_RANGE`]).
    pub(crate) fn lock_range(
        &self,
        offset: u64,
        len: u64,
        mode: LockMode,
    ) -> Result<Ordered<RangeGuard<'_>>> {
        Ordered::try_take(FS_RANGE, || self.locks.lock(offset, len, mode))
    }

    pub(crate) fn attr(&self) -> MutexGuard<'_, Attr> {
        self.attr.lock().expect("inode attributes")
    }
}

/// What `stat` says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Stat {
    /// Inode number.
    pub ino: u64,
    /// File or directory.
    pub kind: Kind,
    /// Permission bits.
    pub mode: u32,
    /// Bytes (files); entries (directories).
    pub size: u64,
    /// Bytes of volume memory held by the file's blocks.
    pub allocated: u64,
    /// Last modification, ns since the Unix epoch.
    pub mtime_ns: u64,
    /// Links: 1 for files, 2 + subdirectories for directories.
    pub nlink: u64,
}

/// One directory entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DirEntry {
    /// Name.
    pub name: String,
    /// Inode number.
    pub ino: u64,
    /// File or directory.
    pub kind: Kind,
}
