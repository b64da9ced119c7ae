//! Inodes in DRAM: attributes, directory entries, extent map, overlay; and
//! what `stat` and `readdir` report of them.

use std::collections::{BTreeMap, HashMap};
use std::hash::{BuildHasher, Hasher};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, RwLock};

use crate::extent_map::ExtentMap;
use crate::journal::Kind;
use crate::lock_order::{FS_DIRECTORY, Ordered};
use crate::overlay::Overlay;
use crate::xattr::Xattrs;

/// The inodes by number.
pub(crate) type InodeTable = HashMap<u64, Arc<Inode>, ByIno>;

/// Hashing for maps keyed by inode number: one multiplication and a fold. Inode numbers
/// are handed out by the file system in order (never chosen by a client, so no one can
/// aim keys at one bucket); SipHash's keyed rounds, the default, were the larger part of
/// each look-up, and a mount looks every inode up several times.
#[derive(Debug, Default, Clone, Copy)]
pub(crate) struct ByIno;

impl BuildHasher for ByIno {
    type Hasher = InoHasher;
    fn build_hasher(&self) -> InoHasher {
        InoHasher(0)
    }
}

/// See [`ByIno`].
#[derive(Debug)]
pub(crate) struct InoHasher(u64);

impl Hasher for InoHasher {
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.write_u64(u64::from(b));
        }
    }
    fn write_u64(&mut self, n: u64) {
        // An odd constant (2^64 / golden ratio): consecutive numbers land in different
        // buckets by the low bits, and the fold brings high bits down for strided ones.
        self.0 = (self.0.rotate_left(5) ^ n).wrapping_mul(0x9e37_79b9_7f4a_7c15);
    }
    fn finish(&self) -> u64 {
        self.0 ^ (self.0 >> 32)
    }
}

/// Who owns an inode: a user and a group.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Owner {
    /// User id.
    pub uid: u32,
    /// Group id.
    pub gid: u32,
}

impl Owner {
    /// The id an inode keeps for "no owner recorded": inodes made before the file system
    /// kept owners (snapshot versions 1 and 2, `Create` records of kind 1). `stat` reports
    /// it as `None`, and whoever shows the file shows its viewer as the owner, as before.
    /// No process can have it: to `chown(2)`, -1 means "leave unchanged".
    pub const UNOWNED: u32 = u32::MAX;

    /// The calling process's effective user and group (unowned if `/proc` is missing).
    pub fn of_process() -> Self {
        use std::os::unix::fs::MetadataExt;
        // /proc/self belongs to the process's effective ids.
        std::fs::metadata("/proc/self").map_or(
            Self {
                uid: Self::UNOWNED,
                gid: Self::UNOWNED,
            },
            |m| Self {
                uid: m.uid(),
                gid: m.gid(),
            },
        )
    }
}

/// `id`, or `None` for [`Owner::UNOWNED`].
fn recorded(id: u32) -> Option<u32> {
    (id != Owner::UNOWNED).then_some(id)
}

/// Attributes of an inode that change under its lock.
#[derive(Debug, Clone)]
pub(crate) struct Attr {
    pub(crate) mode: u32,
    /// Owner ([`Owner::UNOWNED`]: none recorded).
    pub(crate) uid: u32,
    pub(crate) gid: u32,
    /// Parent directory (directories only).
    pub(crate) parent: u64,
    /// How many directory entries name it: files and symbolic links can have several
    /// (hard links); a directory has one. Kept by the namespace operations ([`crate::apply`])
    /// and counted from the tree when a snapshot is loaded.
    pub(crate) links: u64,
    /// No longer named by any directory.
    pub(crate) unlinked: bool,
    /// Made without a name (`O_TMPFILE`) and not named since: a [`crate::journal::MetaOp::Link`]
    /// may still name it (unlike a file whose names were removed), snapshots keep it, and
    /// its last close or recovery drops it. Implies `unlinked`.
    pub(crate) unnamed: bool,
    /// An unnamed file that may never be named (`O_TMPFILE | O_EXCL`). Kept in DRAM only:
    /// no record names such a file, and recovery drops it.
    pub(crate) never_named: bool,
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
    /// Last access (ns): set by `utimensat`, and by a read when it is older than the last
    /// modification or change (relatime without the daily rule). A read's update is kept in
    /// DRAM and reaches the media with the next snapshot, never journaled: a crash can lose
    /// it, never a time that was set.
    pub(crate) atime: AtomicU64,
    /// Last change of the inode (ns): writes, size and mode changes, set times, renames.
    pub(crate) ctime: AtomicU64,
    /// Set when the times were looked at (`stat`) since a write last moved them: the next
    /// write takes the fine clock's time, so that it moves them on (`crate::fs::write_time`).
    pub(crate) times_seen: AtomicBool,
    /// A symbolic link's target (empty for files and directories); never changes.
    pub(crate) target: Box<str>,
    /// A device node's device number (0 for every other kind); never changes.
    pub(crate) rdev: u64,
    /// Entries, for directories.
    pub(crate) entries: Mutex<BTreeMap<String, u64>>,
    /// Extended attributes; set and removed under this lock, journal record inside.
    pub(crate) xattrs: Mutex<Xattrs>,
    /// How many of `entries` are directories (their `..` links to this one): what `stat`'s
    /// link count adds to 2, kept so that a `stat` of a directory does not look up every
    /// entry. Changed under the `entries` lock by the namespace operations ([`crate::apply`]);
    /// set from the whole tree at the end of recovery, which replays them too.
    pub(crate) subdirs: AtomicU64,
    /// Bytes, including logged writes not yet checkpointed.
    pub(crate) size: AtomicU64,
    pub(crate) extents: RwLock<ExtentMap>,
    /// Set when the file's blocks went back to the volume: nothing may map into it again.
    pub(crate) dead: AtomicBool,
    pub(crate) overlay: Overlay,
    pub(crate) opens: AtomicU64,
    /// Shared mappings of the file (`fs::mapped`): while any exist its blocks never move.
    pub(crate) mapped: AtomicU64,
}

impl Inode {
    pub(crate) fn new(ino: u64, kind: Kind, attr: Attr, mtime: u64) -> Self {
        Self {
            ino,
            kind,
            attr: Mutex::new(attr),
            mtime: AtomicU64::new(mtime),
            atime: AtomicU64::new(mtime),
            ctime: AtomicU64::new(mtime),
            times_seen: AtomicBool::new(false),
            target: Box::default(),
            rdev: 0,
            entries: Mutex::default(),
            xattrs: Mutex::default(),
            subdirs: AtomicU64::new(0),
            size: AtomicU64::new(0),
            extents: RwLock::default(),
            dead: AtomicBool::new(false),
            overlay: Overlay::default(),
            opens: AtomicU64::new(0),
            mapped: AtomicU64::new(0),
        }
    }

    /// Gives a new inode its size, directory entries and extent map (recovery, from a
    /// snapshot). Setters in place rather than builders by value: recovery fills an inode
    /// already in its allocation, so that each of a large file system's inodes is moved once.
    pub(crate) fn set_contents(
        &mut self,
        size: u64,
        entries: BTreeMap<String, u64>,
        extents: ExtentMap,
    ) {
        *self.size.get_mut() = size;
        *self.entries.get_mut().expect("directory") = entries;
        *self.extents.get_mut().expect("extent map") = extents;
    }

    /// Gives a new inode its extended attributes (recovery, from a snapshot).
    pub(crate) fn set_xattrs(&mut self, xattrs: Xattrs) {
        *self.xattrs.get_mut().expect("extended attributes") = xattrs;
    }

    /// The inode as a device node of number `rdev`.
    pub(crate) fn with_rdev(mut self, rdev: u64) -> Self {
        self.rdev = rdev;
        self
    }

    /// The inode as a symbolic link to `target` (its size is the target's length); an
    /// empty target changes nothing.
    pub(crate) fn with_target(mut self, target: &str) -> Self {
        self.set_target(target);
        self
    }

    /// [`Inode::with_target`] in place.
    pub(crate) fn set_target(&mut self, target: &str) {
        if !target.is_empty() {
            self.target = target.into();
            *self.size.get_mut() = target.len() as u64;
        }
    }

    /// Gives a new inode its access and change times (recovery, from a snapshot).
    pub(crate) fn set_times(&mut self, atime: u64, ctime: u64) {
        *self.atime.get_mut() = atime;
        *self.ctime.get_mut() = ctime;
    }

    /// A change of the inode at `time` (ns).
    pub(crate) fn changed(&self, time: u64) {
        // A locked instruction only when the time moves (writes of one tick share a time).
        if self.ctime.load(Ordering::Relaxed) < time {
            self.ctime.fetch_max(time, Ordering::AcqRel);
        }
    }

    /// The times were looked at: the next write moves them on ([`Inode::times_seen`]).
    pub(crate) fn times_looked_at(&self) {
        if !self.times_seen.load(Ordering::Relaxed) {
            self.times_seen.store(true, Ordering::Relaxed);
        }
    }

    /// A read: the access time moves to now when it is not newer than the last
    /// modification or change (as the kernel's `relatime` has it: writes of one clock tick
    /// share a time, so a write may leave the times equal), so "read since written" stays
    /// answerable at one store per write. Whether it moved (callers go through
    /// [`crate::fs::Inner::accessed`], which notes it for the next snapshot).
    pub(crate) fn accessed(&self) -> bool {
        let atime = self.atime.load(Ordering::Relaxed);
        if atime <= self.mtime.load(Ordering::Relaxed)
            || atime <= self.ctime.load(Ordering::Relaxed)
        {
            self.atime.fetch_max(crate::fs::now_ns(), Ordering::AcqRel);
            return true;
        }
        false
    }

    /// The directory's entries, locked (rank [`FS_DIRECTORY`]).
    pub(crate) fn entries(&self) -> Ordered<MutexGuard<'_, BTreeMap<String, u64>>> {
        Ordered::take(FS_DIRECTORY, || self.entries.lock().expect("directory"))
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
    /// File, directory or symbolic link.
    pub kind: Kind,
    /// Permission bits.
    pub mode: u32,
    /// Bytes (files); entries (directories).
    pub size: u64,
    /// Bytes of volume memory held by the file's blocks.
    pub allocated: u64,
    /// Last modification, ns since the Unix epoch.
    pub mtime_ns: u64,
    /// Last access, ns since the Unix epoch.
    pub atime_ns: u64,
    /// Last change of the inode, ns since the Unix epoch.
    pub ctime_ns: u64,
    /// Links: the names of a file, FIFO, socket, device node or symbolic link; 2 +
    /// subdirectories for directories.
    pub nlink: u64,
    /// A device node's device number (0 for every other kind).
    pub rdev: u64,
    /// Owning user; `None` for an inode made before the file system kept owners (see
    /// [`Owner::UNOWNED`]): show the viewer.
    pub uid: Option<u32>,
    /// Owning group; `None` as for `uid`.
    pub gid: Option<u32>,
}

impl Attr {
    /// The owner as `stat` reports it.
    pub(crate) fn owner(&self) -> (Option<u32>, Option<u32>) {
        (recorded(self.uid), recorded(self.gid))
    }
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
