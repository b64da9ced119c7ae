//! Metadata journals: one per thread slot, so metadata operations of different threads never
//! share a lock to log. Each record is one whole operation (a create, a rename replacing its
//! target, a checkpoint batch), so an operation is in the file system entirely or not at all.
//! Records carry the global order they were taken in (recovery merges every journal and data
//! log by it) and the epoch of the snapshot they follow: a snapshot starts a new epoch and
//! the journals start again at byte 0. Byte layout: docs/format/fs-metadata.md.

use pmem::Region;

use crate::codec::{Decoder, Encoder};
use crate::error::{FsError, Result};

/// Header bytes: length, crc32c, kind + padding, epoch, order.
const HEADER: usize = 32;
/// Largest record (a checkpoint batch is cut to fit).
pub const MAX_RECORD: usize = 256 << 10;
/// Most runs one `Allocate` record maps (24 KiB of runs: a record that fits the smallest
/// journal); a larger allocation takes several records.
pub const MAX_ALLOCATE_RUNS: usize = 1024;

/// Kind of inode a create makes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// A regular file.
    File,
    /// A directory.
    Dir,
    /// A symbolic link: a path, stored with the inode, that path walks follow.
    Symlink,
    /// A named pipe (FIFO): a name and attributes; the kernel makes the pipe when a process
    /// opens it through `locus mount`.
    Fifo,
    /// A Unix-domain socket's name (what `bind` leaves in a directory).
    Socket,
    /// A character device node, with its device number.
    CharDevice,
    /// A block device node, with its device number.
    BlockDevice,
}

impl Kind {
    /// The byte journals and snapshots store.
    pub(crate) fn code(self) -> u8 {
        match self {
            Self::File => 1,
            Self::Dir => 2,
            Self::Symlink => 3,
            Self::Fifo => 4,
            Self::Socket => 5,
            Self::CharDevice => 6,
            Self::BlockDevice => 7,
        }
    }

    /// A FIFO, socket or device node: a name and attributes, no data of its own.
    pub fn is_special(self) -> bool {
        matches!(
            self,
            Self::Fifo | Self::Socket | Self::CharDevice | Self::BlockDevice
        )
    }

    /// A character or block device node (it carries a device number).
    pub fn is_device(self) -> bool {
        matches!(self, Self::CharDevice | Self::BlockDevice)
    }

    /// The kind a stored byte names, if any.
    pub(crate) fn from_code(code: u8) -> Option<Self> {
        match code {
            1 => Some(Self::File),
            2 => Some(Self::Dir),
            3 => Some(Self::Symlink),
            4 => Some(Self::Fifo),
            5 => Some(Self::Socket),
            6 => Some(Self::CharDevice),
            7 => Some(Self::BlockDevice),
            _ => None,
        }
    }
}

/// A run of file blocks moved into a file's extent map by the checkpoint.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MapEntry {
    /// The file.
    pub ino: u64,
    /// First file block.
    pub file_block: u64,
    /// Blocks.
    pub blocks: u64,
    /// Global address of the first block's page.
    pub addr: u64,
}

/// A file's size and time as a checkpoint batch leaves them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SizeEntry {
    /// The file.
    pub ino: u64,
    /// Bytes, at least.
    pub size: u64,
    /// Modification time of the latest record moved (ns).
    pub mtime: u64,
    /// Global order of that record (0 in batches of kind 6, written before times could be
    /// set): replay raises the time only when no `SetTimes` after this order set it.
    pub order: u64,
}

/// One metadata operation, as logged.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MetaOp {
    /// A new file or directory `name` in `parent`.
    Create {
        /// Directory the name goes into.
        parent: u64,
        /// The new inode's number.
        ino: u64,
        /// File or directory.
        kind: Kind,
        /// Permission bits.
        mode: u32,
        /// Creation time (ns since the epoch).
        time: u64,
        /// The name.
        name: String,
        /// What a symbolic link points to (empty for every other kind).
        target: String,
        /// A device node's device number (0 for every other kind).
        rdev: u64,
        /// Owning user ([`crate::Owner::UNOWNED`] in records of kind 1, written before
        /// owners were kept).
        uid: u32,
        /// Owning group (likewise).
        gid: u32,
    },
    /// A new file with no name (`open(O_TMPFILE)`): open in the process that made it, gone
    /// at its last close ([`MetaOp::DropUnnamed`]) or after a crash, unless a
    /// [`MetaOp::Link`] names it first.
    CreateUnnamed {
        /// The new inode's number.
        ino: u64,
        /// Permission bits.
        mode: u32,
        /// Creation time (ns since the epoch).
        time: u64,
        /// Owning user.
        uid: u32,
        /// Owning group.
        gid: u32,
    },
    /// An unnamed file closed for the last time without having been named: it is gone.
    DropUnnamed {
        /// The inode.
        ino: u64,
    },
    /// `name` removed from `parent` (unlink or rmdir); `ino` is the inode it named.
    Remove {
        /// The directory.
        parent: u64,
        /// The inode removed.
        ino: u64,
        /// The name.
        name: String,
        /// The directory's new modification time (0 in records of kind 2, written before
        /// times were recorded: the time is then left as it was).
        time: u64,
    },
    /// A further name `name` in `parent` for the existing file or symbolic link `ino` (a
    /// hard link).
    Link {
        /// Directory the name goes into.
        parent: u64,
        /// The inode named.
        ino: u64,
        /// The name.
        name: String,
        /// Time of the change: the directory's new modification time and the inode's new
        /// change time.
        time: u64,
    },
    /// `ino` moved from `src_parent/src_name` to `dst_parent/dst_name`, replacing `replaced`
    /// (0: nothing) there.
    Rename {
        /// Source directory.
        src_parent: u64,
        /// Source name.
        src_name: String,
        /// Target directory.
        dst_parent: u64,
        /// Target name.
        dst_name: String,
        /// The inode moved.
        ino: u64,
        /// The inode the target named before, now gone (0 when none).
        replaced: u64,
        /// Both directories' new modification time (0 in records of kind 3, written before
        /// times were recorded: the times are then left as they were).
        time: u64,
    },
    /// `a_name` in `a_parent` and `b_name` in `b_parent` trade the inodes they name
    /// (`renameat2(RENAME_EXCHANGE)`); both exist, and neither inode is removed.
    Exchange {
        /// The first name's directory.
        a_parent: u64,
        /// The first name.
        a_name: String,
        /// The second name's directory.
        b_parent: u64,
        /// The second name.
        b_name: String,
        /// The inode the first name held (the second holds it after).
        a_ino: u64,
        /// The inode the second name held.
        b_ino: u64,
        /// Both directories' new modification time and both inodes' change time.
        time: u64,
    },
    /// A file's size set (grow or shrink); blocks beyond it are freed.
    Truncate {
        /// The file.
        ino: u64,
        /// New size in bytes.
        size: u64,
        /// Time of the change.
        time: u64,
        /// When shrinking into the middle of a block: a fresh page holding the block's kept
        /// bytes, mapped in its place (0: none).
        tail: u64,
    },
    /// Permission bits changed.
    SetMode {
        /// The inode.
        ino: u64,
        /// New permission bits.
        mode: u32,
        /// Time of the change: the inode's new change time (0 in records of kind 5, written
        /// before times were recorded: the change time is then left as it was).
        time: u64,
    },
    /// Owner changed (`chown`), with the permission bits the change leaves: a file's
    /// set-user-ID bit, and its set-group-ID bit when group execution is on, are cleared
    /// with it, in the same record.
    SetOwner {
        /// The inode.
        ino: u64,
        /// New owning user.
        uid: u32,
        /// New owning group.
        gid: u32,
        /// Permission bits after the change.
        mode: u32,
        /// Time of the change: the inode's new change time.
        time: u64,
    },
    /// Extended attribute `name` of `ino` set to `value` (made or replaced).
    SetXattr {
        /// The inode.
        ino: u64,
        /// The attribute's name.
        name: String,
        /// Its value (up to [`crate::MAX_XATTR_VALUE`] bytes).
        value: Box<[u8]>,
        /// Time of the change: the inode's new change time.
        time: u64,
    },
    /// Extended attribute `name` of `ino` removed.
    RemoveXattr {
        /// The inode.
        ino: u64,
        /// The attribute's name.
        name: String,
        /// Time of the change: the inode's new change time.
        time: u64,
    },
    /// A POSIX access ACL set, replaced or dropped together with the permission bits it
    /// leaves (`setfacl`; `chmod` of a file that has one), so the two never disagree.
    SetAcl {
        /// The inode.
        ino: u64,
        /// Permission bits after the change.
        mode: u32,
        /// The ACL attribute's value (empty: the inode keeps none, its mode says it all).
        value: Box<[u8]>,
        /// Time of the change: the inode's new change time.
        time: u64,
    },
    /// Time stamps set (`utimensat`): access and modification time as given (0: left as
    /// they were), change time the time of the call.
    SetTimes {
        /// The inode.
        ino: u64,
        /// New access time (ns since the epoch; 0: unchanged).
        atime: u64,
        /// New modification time (ns since the epoch; 0: unchanged).
        mtime: u64,
        /// Time of the change: the inode's new change time.
        ctime: u64,
    },
    /// Whole blocks of a file unmapped (a hole punched; the size is kept); their memory is
    /// freed, and logged writes into them that are older than this are dropped.
    Punch {
        /// The file.
        ino: u64,
        /// First block.
        first_block: u64,
        /// Blocks (> 0).
        blocks: u64,
        /// Time of the change.
        time: u64,
    },
    /// Zeroed blocks mapped into holes of a file (`fallocate` without `PUNCH_HOLE`), so that
    /// writes into them cannot run out of space and the file's blocks count them; the size
    /// grows to `size` when it is below (0: kept, `FALLOC_FL_KEEP_SIZE`). The runs were holes
    /// when the record was taken, which replay checks.
    Allocate {
        /// The file.
        ino: u64,
        /// The size the file has at least afterwards (0: unchanged).
        size: u64,
        /// Time of the change: the file's new modification and change time.
        time: u64,
        /// Blocks mapped, in file order, none overlapping (at most [`MAX_ALLOCATE_RUNS`]).
        runs: Vec<crate::extent_map::Run>,
    },
    /// A checkpoint batch: blocks moved into files, sizes reached, and the data-log records
    /// that are now part of their files (retired through a sequence, per slot).
    Batch {
        /// Runs remapped or newly filled.
        maps: Vec<MapEntry>,
        /// Sizes and times reached.
        sizes: Vec<SizeEntry>,
        /// (slot, retired through sequence).
        retired: Vec<(u32, u64)>,
    },
}

impl MetaOp {
    fn kind_code(&self) -> u8 {
        match self {
            Self::Create { .. } => 15,
            Self::CreateUnnamed { .. } => 22,
            Self::DropUnnamed { .. } => 23,
            Self::Remove { .. } => 8,
            Self::Link { .. } => 14,
            Self::Rename { .. } => 9,
            Self::Exchange { .. } => 19,
            Self::Truncate { .. } => 4,
            Self::SetMode { .. } => 12,
            Self::SetOwner { .. } => 16,
            Self::SetXattr { .. } => 17,
            Self::RemoveXattr { .. } => 18,
            Self::SetAcl { .. } => 21,
            Self::SetTimes { .. } => 11,
            Self::Batch { .. } => 13,
            Self::Punch { .. } => 7,
            Self::Allocate { .. } => 20,
        }
    }

    /// Encoded size of a batch with these many entries (to cut batches to fit).
    pub fn batch_bytes(maps: usize, sizes: usize, retired: usize) -> usize {
        HEADER + 12 + maps * 32 + sizes * 32 + retired * 12 + 8
    }

    fn encode_payload(&self, e: &mut Encoder) {
        match self {
            Self::Create {
                parent,
                ino,
                kind,
                mode,
                time,
                name,
                target,
                rdev,
                uid,
                gid,
            } => {
                e.u64(*parent).u64(*ino).u8(kind.code());
                e.u32(*mode).u32(*uid).u32(*gid).u64(*time).name(name);
                if *kind == Kind::Symlink {
                    e.text(target);
                }
                if kind.is_device() {
                    e.u64(*rdev);
                }
            }
            Self::CreateUnnamed {
                ino,
                mode,
                time,
                uid,
                gid,
            } => {
                e.u64(*ino).u32(*mode).u32(*uid).u32(*gid).u64(*time);
            }
            Self::DropUnnamed { ino } => {
                e.u64(*ino);
            }
            // One layout, two kinds.
            Self::Remove {
                parent,
                ino,
                name,
                time,
            }
            | Self::Link {
                parent,
                ino,
                name,
                time,
            } => {
                e.u64(*parent).u64(*ino).u64(*time).name(name);
            }
            // One layout, two kinds: two directories, two inodes, the time, two names.
            Self::Rename {
                src_parent: a_dir,
                dst_parent: b_dir,
                ino: a,
                replaced: b,
                time,
                src_name: a_name,
                dst_name: b_name,
            }
            | Self::Exchange {
                a_parent: a_dir,
                b_parent: b_dir,
                a_ino: a,
                b_ino: b,
                time,
                a_name,
                b_name,
            } => {
                e.u64(*a_dir).u64(*b_dir).u64(*a).u64(*b);
                e.u64(*time).name(a_name).name(b_name);
            }
            Self::Truncate {
                ino,
                size,
                time,
                tail,
            } => {
                e.u64(*ino).u64(*size).u64(*time).u64(*tail);
            }
            Self::SetMode { ino, mode, time } => {
                e.u64(*ino).u32(*mode).u64(*time);
            }
            Self::SetOwner {
                ino,
                uid,
                gid,
                mode,
                time,
            } => {
                e.u64(*ino).u32(*uid).u32(*gid).u32(*mode).u64(*time);
            }
            Self::SetXattr {
                ino,
                name,
                value,
                time,
            } => {
                e.u64(*ino).u64(*time);
                crate::xattr::encode(e, name, value);
            }
            Self::RemoveXattr { ino, name, time } => {
                e.u64(*ino).u64(*time);
                crate::xattr::encode(e, name, &[]);
            }
            Self::SetAcl {
                ino,
                mode,
                value,
                time,
            } => {
                e.u64(*ino).u32(*mode).u64(*time);
                crate::xattr::encode(e, crate::acl::ACCESS, value);
            }
            Self::SetTimes {
                ino,
                atime,
                mtime,
                ctime,
            } => {
                e.u64(*ino).u64(*atime).u64(*mtime).u64(*ctime);
            }
            Self::Punch {
                ino,
                first_block,
                blocks,
                time,
            } => {
                e.u64(*ino).u64(*first_block).u64(*blocks).u64(*time);
            }
            Self::Allocate {
                ino,
                size,
                time,
                runs,
            } => {
                e.u64(*ino).u64(*size).u64(*time).u32(runs.len() as u32);
                for run in runs {
                    e.u64(run.file_block).u64(run.blocks).u64(run.addr);
                }
            }
            Self::Batch {
                maps,
                sizes,
                retired,
            } => {
                e.u32(maps.len() as u32)
                    .u32(sizes.len() as u32)
                    .u32(retired.len() as u32);
                for m in maps {
                    e.u64(m.ino).u64(m.file_block).u64(m.blocks).u64(m.addr);
                }
                for z in sizes {
                    e.u64(z.ino).u64(z.size).u64(z.mtime).u64(z.order);
                }
                for (slot, seq) in retired {
                    e.u32(*slot).u64(*seq);
                }
            }
        }
    }

    fn decode_payload(kind: u8, d: &mut Decoder<'_>) -> Result<Self> {
        let op = match kind {
            // 1: a create as written before it carried the owner.
            1 | 15 => {
                let owned = kind == 15;
                let parent = d.u64("parent")?;
                let ino = d.u64("ino")?;
                let code = d.u8("kind")?;
                let kind = Kind::from_code(code)
                    .ok_or_else(|| d.error(format!("inode kind {code} is unknown")))?;
                let mode = d.u32("mode")?;
                let (uid, gid) = if owned {
                    (d.u32("uid")?, d.u32("gid")?)
                } else {
                    (crate::Owner::UNOWNED, crate::Owner::UNOWNED)
                };
                let time = d.u64("time")?;
                let name = d.name("name")?;
                let target = match kind {
                    Kind::Symlink => d.text("symlink target")?,
                    _ => String::new(),
                };
                let rdev = if kind.is_device() {
                    d.u64("device number")?
                } else {
                    0
                };
                Self::Create {
                    parent,
                    ino,
                    kind,
                    mode,
                    time,
                    name,
                    target,
                    rdev,
                    uid,
                    gid,
                }
            }
            22 => Self::CreateUnnamed {
                ino: d.u64("ino")?,
                mode: d.u32("mode")?,
                uid: d.u32("uid")?,
                gid: d.u32("gid")?,
                time: d.u64("time")?,
            },
            23 => Self::DropUnnamed { ino: d.u64("ino")? },
            // 2 and 3: Remove and Rename as written before they carried the time.
            2 | 8 => {
                let parent = d.u64("parent")?;
                let ino = d.u64("ino")?;
                let time = if kind == 8 { d.u64("time")? } else { 0 };
                Self::Remove {
                    parent,
                    ino,
                    name: d.name("name")?,
                    time,
                }
            }
            14 => Self::Link {
                parent: d.u64("parent")?,
                ino: d.u64("ino")?,
                time: d.u64("time")?,
                name: d.name("name")?,
            },
            // Rename (3: without the time) and Exchange share a layout.
            3 | 9 | 19 => {
                let a_dir = d.u64("first directory")?;
                let b_dir = d.u64("second directory")?;
                let a = d.u64("first inode")?;
                let b = d.u64("second inode")?;
                let time = if kind == 3 { 0 } else { d.u64("time")? };
                let a_name = d.name("first name")?;
                let b_name = d.name("second name")?;
                if kind == 19 {
                    Self::Exchange {
                        a_parent: a_dir,
                        a_name,
                        b_parent: b_dir,
                        b_name,
                        a_ino: a,
                        b_ino: b,
                        time,
                    }
                } else {
                    Self::Rename {
                        src_parent: a_dir,
                        src_name: a_name,
                        dst_parent: b_dir,
                        dst_name: b_name,
                        ino: a,
                        replaced: b,
                        time,
                    }
                }
            }
            4 => Self::Truncate {
                ino: d.u64("ino")?,
                size: d.u64("size")?,
                time: d.u64("time")?,
                tail: d.u64("tail")?,
            },
            // 5: SetMode as written before it carried the time.
            5 | 12 => Self::SetMode {
                ino: d.u64("ino")?,
                mode: d.u32("mode")?,
                time: if kind == 12 { d.u64("time")? } else { 0 },
            },
            16 => Self::SetOwner {
                ino: d.u64("ino")?,
                uid: d.u32("uid")?,
                gid: d.u32("gid")?,
                mode: d.u32("mode")?,
                time: d.u64("time")?,
            },
            17 | 18 => {
                let ino = d.u64("ino")?;
                let time = d.u64("time")?;
                let (name, value) = crate::xattr::decode(d)?;
                if kind == 17 {
                    Self::SetXattr {
                        ino,
                        name,
                        value,
                        time,
                    }
                } else if value.is_empty() {
                    Self::RemoveXattr { ino, name, time }
                } else {
                    return Err(d.error(format!(
                        "removal of extended attribute {name} carries a value of {} bytes",
                        value.len()
                    )));
                }
            }
            21 => {
                let ino = d.u64("ino")?;
                let mode = d.u32("mode")?;
                let time = d.u64("time")?;
                let (name, value) = crate::xattr::decode(d)?;
                if name != crate::acl::ACCESS {
                    return Err(d.error(format!(
                        "an ACL record names attribute {name}, not {}",
                        crate::acl::ACCESS
                    )));
                }
                Self::SetAcl {
                    ino,
                    mode,
                    value,
                    time,
                }
            }
            11 => Self::SetTimes {
                ino: d.u64("ino")?,
                atime: d.u64("atime")?,
                mtime: d.u64("mtime")?,
                ctime: d.u64("ctime")?,
            },
            7 => {
                let ino = d.u64("ino")?;
                let first_block = d.u64("first_block")?;
                let blocks = d.u64("blocks")?;
                let time = d.u64("time")?;
                if blocks == 0 || first_block.checked_add(blocks).is_none() {
                    return Err(d.error(format!(
                        "hole of {blocks} blocks from block {first_block} is not a range"
                    )));
                }
                Self::Punch {
                    ino,
                    first_block,
                    blocks,
                    time,
                }
            }
            20 => {
                let ino = d.u64("ino")?;
                let size = d.u64("size")?;
                let time = d.u64("time")?;
                let count = d.u32("runs")? as usize;
                if count > MAX_ALLOCATE_RUNS {
                    return Err(d.error(format!(
                        "allocation of {count} runs (at most {MAX_ALLOCATE_RUNS})"
                    )));
                }
                let mut runs: Vec<crate::extent_map::Run> = Vec::with_capacity(count);
                for _ in 0..count {
                    let run = crate::extent_map::Run {
                        file_block: d.u64("run file_block")?,
                        blocks: d.u64("run blocks")?,
                        addr: d.u64("run addr")?,
                    };
                    if !run.is_sound() {
                        return Err(d.error(format!("file {ino} allocates an invalid run {run:?}")));
                    }
                    if runs
                        .last()
                        .is_some_and(|last| last.file_block + last.blocks > run.file_block)
                    {
                        return Err(d.error(format!(
                            "file {ino} allocates run {run:?} out of order or over the one before"
                        )));
                    }
                    runs.push(run);
                }
                Self::Allocate {
                    ino,
                    size,
                    time,
                    runs,
                }
            }
            // 6: a batch as written before its sizes carried their order.
            6 | 13 => {
                let (m, s, r) = (d.u32("maps")?, d.u32("sizes")?, d.u32("retired")?);
                if Self::batch_bytes(m as usize, s as usize, r as usize) > MAX_RECORD {
                    return Err(d.error(format!(
                        "batch of {m} maps, {s} sizes, {r} retirements is too large"
                    )));
                }
                let mut maps = Vec::with_capacity(m as usize);
                for _ in 0..m {
                    let map = MapEntry {
                        ino: d.u64("map ino")?,
                        file_block: d.u64("map file_block")?,
                        blocks: d.u64("map blocks")?,
                        addr: d.u64("map addr")?,
                    };
                    let run = crate::extent_map::Run {
                        file_block: map.file_block,
                        blocks: map.blocks,
                        addr: map.addr,
                    };
                    if !run.is_sound() {
                        return Err(
                            d.error(format!("file {} maps an invalid run {run:?}", map.ino))
                        );
                    }
                    maps.push(map);
                }
                let mut sizes = Vec::with_capacity(s as usize);
                for _ in 0..s {
                    sizes.push(SizeEntry {
                        ino: d.u64("size ino")?,
                        size: d.u64("size")?,
                        mtime: d.u64("mtime")?,
                        order: if kind == 13 { d.u64("size order")? } else { 0 },
                    });
                }
                let mut retired = Vec::with_capacity(r as usize);
                for _ in 0..r {
                    retired.push((d.u32("retired slot")?, d.u64("retired sequence")?));
                }
                Self::Batch {
                    maps,
                    sizes,
                    retired,
                }
            }
            other => return Err(d.error(format!("record kind {other} is unknown"))),
        };
        Ok(op)
    }
}

/// A logged operation with its place in the global order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JournalRecord {
    /// Global order.
    pub order: u64,
    /// The operation.
    pub op: MetaOp,
}

/// Kind of the marker a reset writes at byte 0: the journal belongs to this epoch from now
/// on (evidence, for recovery, of which root generation the journals follow).
const EPOCH_MARKER: u8 = 10;

/// The epoch marker's payload when the file system was unmounted cleanly right after
/// writing it: nothing follows it in this epoch. At byte 0 a reset wrote it
/// ([`Journal::reset`] with `sealed`); after the records, an unmount that kept them
/// ([`Journal::seal`]).
const MARKER_SEALED: u64 = 1;

/// The epoch marker record: a header and 8 payload bytes, [`MARKER_SEALED`] or 0.
fn encode_marker(epoch: u64, sealed: bool) -> Vec<u8> {
    let mut e = Encoder::default();
    e.u32(0).u32(0).u8(EPOCH_MARKER).u8(0).u16(0).u32(0);
    e.u64(epoch)
        .u64(0)
        .u64(if sealed { MARKER_SEALED } else { 0 });
    finish(e)
}

fn finish(mut e: Encoder) -> Vec<u8> {
    let len = e.0.len() as u32;
    e.0[0..4].copy_from_slice(&len.to_le_bytes());
    let crc = crc32c::crc32c_append(crc32c::crc32c(&e.0[0..4]), &e.0[8..]);
    e.0[4..8].copy_from_slice(&crc.to_le_bytes());
    e.0
}

#[cfg(test)]
fn encode(epoch: u64, order: u64, op: &MetaOp) -> Vec<u8> {
    encode_into(Vec::new(), epoch, order, op)
}

/// The record of `op` in `buffer` (emptied first; its memory reused).
fn encode_into(mut buffer: Vec<u8>, epoch: u64, order: u64, op: &MetaOp) -> Vec<u8> {
    buffer.clear();
    // A checkpoint batch's room made at once: a few hundred remaps grew the vector a dozen
    // times, copying it each time (3 % of the checkpoint's samples with two writers of
    // random 4 KiB blocks). Other records are small.
    if let MetaOp::Batch {
        maps,
        sizes,
        retired,
    } = op
    {
        buffer.reserve(MetaOp::batch_bytes(maps.len(), sizes.len(), retired.len()));
    }
    let mut e = Encoder(buffer);
    e.u32(0).u32(0).u8(op.kind_code()).u8(0).u16(0).u32(0);
    e.u64(epoch).u64(order);
    debug_assert_eq!(e.0.len(), HEADER);
    op.encode_payload(&mut e);
    e.pad_to(8);
    finish(e)
}

/// The first whole record of `epoch` (plausible header, matching CRC) at or after `from` + 8,
/// scanning 8-byte positions. Only damage leaves one after the end of a journal's scan.
fn whole_record_after(region: &Region, from: u64, epoch: u64) -> Result<Option<u64>> {
    // Small enough to stay in the cache and come from the heap: every mount scans every
    // journal to its end, and a 1 MiB buffer was a fresh mapping each time (page faults to
    // fill it, an munmap to free it), a sixth of the time a short-lived program through the
    // preload library spent mounting.
    const CHUNK: u64 = 64 << 10;
    let end = region.len();
    let mut at = from + 8;
    let mut chunk = vec![0u8; CHUNK as usize];
    while at + HEADER as u64 <= end {
        // A window of headers, overlapping the next by one header.
        let n = (end - at).min(CHUNK);
        region.read(at, &mut chunk[..n as usize])?;
        let mut i = 0u64;
        while i + HEADER as u64 <= n {
            let h = &chunk[i as usize..(i + HEADER as u64) as usize];
            let rec_epoch = u64::from_le_bytes(h[16..24].try_into().expect("8"));
            let len = u64::from(u32::from_le_bytes(h[0..4].try_into().expect("4")));
            if rec_epoch == epoch
                && len >= HEADER as u64 + 8
                && len <= MAX_RECORD as u64
                && len.is_multiple_of(8)
                && at + i + len <= end
            {
                let mut bytes = vec![0u8; len as usize];
                region.read(at + i, &mut bytes)?;
                let crc = u32::from_le_bytes(bytes[4..8].try_into().expect("4"));
                if crc == crc32c::crc32c_append(crc32c::crc32c(&bytes[0..4]), &bytes[8..]) {
                    return Ok(Some(at + i));
                }
            }
            i += 8;
        }
        if at + n >= end {
            break;
        }
        at += n - HEADER as u64 + 8;
    }
    Ok(None)
}

/// One slot's journal.
#[derive(Debug)]
pub struct Journal {
    region: Region,
    epoch: u64,
    tail: u64,
    /// Where a sealed marker ends the journal (the file system was unmounted cleanly after
    /// it), if one does: at byte 0 (a reset's), which the first append rewrites unsealed
    /// before it writes, or at `tail` (after records an unmount kept, [`Journal::seal`]),
    /// which the first append writes over.
    sealed: Option<u64>,
    /// The last record's bytes, kept for the next one to be encoded into: a checkpoint
    /// batch's record is tens of KiB, and a fresh allocation of it a page fault per 4 KiB
    /// of it when the heap had given that memory back.
    encoded: Vec<u8>,
}

impl Journal {
    /// Opens a journal and returns it with its records of `epoch`, in the order written.
    /// Scanning stops at the first record that is torn, of another epoch, or empty: records
    /// are appended by one thread, each persisted before the next, so only the last can be
    /// torn. A whole record of `epoch` anywhere after that point means the stop was damage,
    /// not a torn append, and is reported as such — except when the last record is a sealed
    /// marker (a clean unmount wrote it, and no append follows one: the first unseals it or
    /// writes over it): nothing of the epoch can follow it, and the rest of the journal is
    /// not read.
    pub fn recover(region: Region, slot: u32, epoch: u64) -> Result<(Self, Vec<JournalRecord>)> {
        let (end, records, damage, sealed) = Self::scan(&region, slot, epoch, true)?;
        if let Some((_, damage)) = damage {
            return Err(damage);
        }
        // A seal after records is written over by the next append; one at byte 0 is the
        // epoch's marker, which stays.
        let tail = match sealed {
            Some(at) if at > 0 => at,
            _ => end,
        };
        Ok((
            Self {
                region,
                epoch,
                tail,
                sealed,
                encoded: Vec::new(),
            },
            records.into_iter().map(|(_, r)| r).collect(),
        ))
    }

    /// The records of `epoch` in order with their byte offsets, and — instead of an error —
    /// the damage that ends them, if any: (byte offset of the damaged record, what is
    /// wrong, the operations of the whole records of the epoch that follow it — `None` for
    /// one that does not decode). For `Fs::salvage`, which keeps what precedes the damage.
    #[allow(clippy::type_complexity)]
    pub fn salvage(
        region: &Region,
        slot: u32,
        epoch: u64,
    ) -> Result<(
        Vec<(u64, JournalRecord)>,
        Option<(u64, FsError, Vec<Option<MetaOp>>)>,
    )> {
        let (_, records, damage, _) = Self::scan(region, slot, epoch, false)?;
        let Some((at, error)) = damage else {
            return Ok((records, None));
        };
        let mut after = Vec::new();
        let mut from = at;
        while let Some(next) = whole_record_after(region, from, epoch)? {
            let mut header = [0u8; HEADER];
            region.read(next, &mut header)?;
            let len = u32::from_le_bytes(header[0..4].try_into().expect("4")) as usize;
            let mut bytes = vec![0u8; len];
            region.read(next, &mut bytes)?;
            let mut d = Decoder::new(&bytes[HEADER..], "journal record after damage");
            after.push(MetaOp::decode_payload(bytes[8], &mut d).ok());
            from = next;
        }
        Ok((records, Some((at, error, after))))
    }

    /// Scans from byte 0: the end of the last whole record, the records (with their
    /// offsets), the damage that ends them (a record that does not decode, or a whole
    /// record of the epoch after the first that fails), and — when `trust_seal` and the last
    /// record is a sealed marker — where that marker is; the search for whole records past
    /// the end is then skipped.
    #[allow(clippy::type_complexity)]
    fn scan(
        region: &Region,
        slot: u32,
        epoch: u64,
        trust_seal: bool,
    ) -> Result<(
        u64,
        Vec<(u64, JournalRecord)>,
        Option<(u64, FsError)>,
        Option<u64>,
    )> {
        // The last record read, when it is a sealed marker.
        let mut sealed_marker = None;
        let mut records = Vec::new();
        let mut tail = 0u64;
        let mut header = [0u8; HEADER];
        while tail + HEADER as u64 <= region.len() {
            region.read(tail, &mut header)?;
            let len = u64::from(u32::from_le_bytes(header[0..4].try_into().expect("4")));
            let rec_epoch = u64::from_le_bytes(header[16..24].try_into().expect("8"));
            if len < HEADER as u64 + 8
                || len > MAX_RECORD as u64
                || !len.is_multiple_of(8)
                || tail + len > region.len()
                || rec_epoch != epoch
            {
                break;
            }
            let mut bytes = vec![0u8; len as usize];
            region.read(tail, &mut bytes)?;
            let crc = u32::from_le_bytes(bytes[4..8].try_into().expect("4"));
            if crc != crc32c::crc32c_append(crc32c::crc32c(&bytes[0..4]), &bytes[8..]) {
                break;
            }
            if bytes[8] == EPOCH_MARKER {
                sealed_marker =
                    (u64::from_le_bytes(bytes[HEADER..HEADER + 8].try_into().expect("8"))
                        == MARKER_SEALED)
                        .then_some(tail);
                tail += len;
                continue;
            }
            sealed_marker = None;
            let structure = format!("journal of slot {slot}, record at byte {tail}");
            let mut d = Decoder::new(&bytes[HEADER..], &structure);
            let decoded = MetaOp::decode_payload(bytes[8], &mut d).and_then(|op| {
                if d.remaining() >= 8 {
                    Err(d.error(format!("{} bytes left after the record", d.remaining())))
                } else {
                    Ok(op)
                }
            });
            let op = match decoded {
                Ok(op) => op,
                Err(damage @ FsError::Corrupt { .. }) => {
                    return Ok((tail, records, Some((tail, damage)), None));
                }
                Err(other) => return Err(other),
            };
            let order = u64::from_le_bytes(bytes[24..32].try_into().expect("8"));
            records.push((tail, JournalRecord { order, op }));
            tail += len;
        }
        // A sealed marker last: the epoch ended with it (a clean unmount), so nothing of it
        // follows — and the search, the bulk of a mount's reading, is skipped. (Any record
        // after the marker cleared `sealed_marker`.)
        let sealed = sealed_marker.filter(|_| trust_seal);
        if sealed.is_some() {
            return Ok((tail, records, None, sealed));
        }
        if let Some(later) = whole_record_after(region, tail, epoch)? {
            let problem = format!(
                "the record at byte {tail} is damaged, and a whole record of the same epoch \
                 follows at byte {later}: {} record(s) before it replay, the rest would be lost",
                records.len()
            );
            let damage = FsError::corrupt(format!("journal of slot {slot}"), problem);
            return Ok((tail, records, Some((tail, damage)), None));
        }
        Ok((tail, records, None, None))
    }

    /// A new, empty journal of `epoch` (a freshly allocated area needs no clearing: records
    /// of other epochs end the scan).
    pub fn new(region: Region, epoch: u64) -> Self {
        Self {
            region,
            epoch,
            tail: 0,
            sealed: None,
            encoded: Vec::new(),
        }
    }

    /// A journal of `epoch` in an area that may have held anything — even a journal image
    /// of this epoch inside a file, which recovery would take for records after a damaged
    /// one: zeroed whole and persisted, then started with the epoch's marker.
    pub fn fresh(region: Region, epoch: u64) -> Result<Self> {
        let len = region.len();
        region.fill(0, len, 0)?;
        region.persist(0, len)?;
        let mut journal = Self::new(region, epoch);
        journal.reset(epoch, false)?;
        Ok(journal)
    }

    /// Past the mark where the checkpoint writes a snapshot, so that metadata operations
    /// rarely find the journal full: half of slot 0's (the checkpoint's own, whose batch
    /// records must always fit), three quarters of a writer's.
    pub fn past_snapshot_mark(&self, slot: u32) -> bool {
        let limit = if slot == 0 {
            self.capacity() / 2
        } else {
            self.capacity() * 3 / 4
        };
        self.used() > limit || slot == 0 && !self.fits(MAX_RECORD)
    }

    /// Bytes used.
    pub fn used(&self) -> u64 {
        self.tail
    }

    /// Bytes in the journal.
    pub fn capacity(&self) -> u64 {
        self.region.len()
    }

    /// True if a record of `bytes` fits.
    pub fn fits(&self, bytes: usize) -> bool {
        // Keep room for an empty header after the last record, so the scan stops there.
        self.tail + bytes as u64 + HEADER as u64 <= self.region.len()
    }

    /// Appends a record and persists it. `None` when it does not fit (the caller asks for a
    /// snapshot, which empties every journal).
    pub fn append(&mut self, order: u64, op: &MetaOp) -> Result<Option<u64>> {
        let bytes = encode_into(std::mem::take(&mut self.encoded), self.epoch, order, op);
        let appended = self.append_encoded(&bytes);
        self.encoded = bytes;
        appended
    }

    /// [`Journal::append`] of a record's `bytes`.
    fn append_encoded(&mut self, bytes: &[u8]) -> Result<Option<u64>> {
        if !self.fits(bytes.len()) {
            // Behind an epoch marker, an empty journal still has to hold it (else waiting
            // for a snapshot to empty the journal would wait forever).
            let room = self.region.len().saturating_sub(2 * HEADER as u64 + 8);
            if bytes.len() as u64 > room {
                return Err(FsError::TooBig(format!(
                    "a journal record of {} bytes, in a journal of {} bytes",
                    bytes.len(),
                    self.region.len()
                )));
            }
            return Ok(None);
        }
        // Nothing may follow a sealed marker: recovery reads one as the end of the epoch,
        // and would not look past a damaged record for whole ones. The marker at byte 0 is
        // rewritten unsealed first; one at the tail is written over by this record (torn, it
        // ends the scan as any torn append does; a record is never shorter than a marker, so
        // none of the marker is left after it).
        if self.sealed == Some(0) {
            let marker = encode_marker(self.epoch, false);
            self.region.write(0, &marker)?;
            self.region.persist(0, marker.len() as u64)?;
        }
        self.sealed = None;
        // Zero the header after the record first, so a stale record of this epoch can never
        // follow it (the area may hold anything when it was allocated).
        let end = self.tail + bytes.len() as u64;
        self.region.fill(end, HEADER as u64, 0)?;
        self.region.write(self.tail, bytes)?;
        self.region
            .persist(self.tail, bytes.len() as u64 + HEADER as u64)?;
        self.tail = end;
        Ok(Some(bytes.len() as u64 + HEADER as u64))
    }

    /// Whether the journal ends with the sealed marker of a clean unmount: nothing was
    /// appended since.
    pub fn is_sealed(&self) -> bool {
        self.sealed.is_some()
    }

    /// Seals the journal where it ends, keeping its records (a clean unmount that writes no
    /// snapshot): a sealed epoch marker after the last record, so that recovery replays the
    /// records and reads nothing past it. Returns `false` when the marker does not fit,
    /// writing nothing (the caller writes a snapshot instead); a journal sealed already
    /// stays as it is.
    pub fn seal(&mut self) -> Result<bool> {
        if self.sealed.is_some() {
            return Ok(true);
        }
        let marker = encode_marker(self.epoch, true);
        if !self.fits(marker.len()) {
            return Ok(false);
        }
        let end = self.tail + marker.len() as u64;
        self.region.fill(end, HEADER as u64, 0)?;
        self.region.write(self.tail, &marker)?;
        self.region
            .persist(self.tail, marker.len() as u64 + HEADER as u64)?;
        self.sealed = Some(self.tail);
        Ok(true)
    }

    /// Starts `epoch` at byte 0 (after a snapshot made every earlier record redundant).
    /// The marker at byte 0 says the journal is of `epoch` from now on (records of older
    /// epochs after it end the scan).
    /// `sealed` when nothing will be appended before the file system is closed (its
    /// unmount): recovery then does not read the rest of the journal (see [`Self::recover`]).
    pub fn reset(&mut self, epoch: u64, sealed: bool) -> Result<()> {
        self.epoch = epoch;
        self.sealed = sealed.then_some(0);
        let marker = encode_marker(epoch, sealed);
        let end = marker.len() as u64;
        self.region.fill(end, HEADER as u64, 0)?;
        self.region.write(0, &marker)?;
        self.region.persist(0, end + HEADER as u64)?;
        self.tail = end;
        Ok(())
    }

    /// The epoch a journal area's first record (an epoch marker, or a record of a journal
    /// written before markers) says it belongs to; `None` when it holds no whole record.
    pub fn epoch_at_start(region: &Region) -> Result<Option<u64>> {
        let mut header = [0u8; HEADER];
        region.read(0, &mut header)?;
        let len = u64::from(u32::from_le_bytes(header[0..4].try_into().expect("4")));
        if len < HEADER as u64 + 8 || len > MAX_RECORD as u64 || len > region.len() {
            return Ok(None);
        }
        let mut bytes = vec![0u8; len as usize];
        region.read(0, &mut bytes)?;
        let crc = u32::from_le_bytes(bytes[4..8].try_into().expect("4"));
        if crc != crc32c::crc32c_append(crc32c::crc32c(&bytes[0..4]), &bytes[8..]) {
            return Ok(None);
        }
        Ok(Some(u64::from_le_bytes(
            bytes[16..24].try_into().expect("8"),
        )))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ops() -> Vec<MetaOp> {
        vec![
            MetaOp::Create {
                parent: 1,
                ino: 2,
                kind: Kind::Dir,
                mode: 0o755,
                time: 7,
                name: "d".into(),
                target: String::new(),
                rdev: 0,
                uid: 1000,
                gid: 100,
            },
            MetaOp::Create {
                parent: 2,
                ino: 6,
                kind: Kind::BlockDevice,
                mode: 0o660,
                time: 7,
                name: "disk".into(),
                target: String::new(),
                rdev: 0x1234_5678_9abc,
                uid: 0,
                gid: 6,
            },
            MetaOp::Create {
                parent: 2,
                ino: 7,
                kind: Kind::Fifo,
                mode: 0o600,
                time: 7,
                name: "pipe".into(),
                target: String::new(),
                rdev: 0,
                uid: 1000,
                gid: 100,
            },
            MetaOp::Create {
                parent: 2,
                ino: 5,
                kind: Kind::Symlink,
                mode: 0o777,
                time: 8,
                name: "l".into(),
                target: "../d/x".into(),
                rdev: 0,
                uid: 1000,
                gid: 100,
            },
            MetaOp::SetMode {
                ino: 5,
                mode: 0o700,
                time: 9,
            },
            MetaOp::SetOwner {
                ino: 6,
                uid: 65534,
                gid: 65533,
                mode: 0o660,
                time: 9,
            },
            MetaOp::SetXattr {
                ino: 6,
                name: "user.mime_type".into(),
                value: b"text/plain\0\xff".to_vec().into(),
                time: 9,
            },
            MetaOp::RemoveXattr {
                ino: 6,
                name: "trusted.x".into(),
                time: 10,
            },
            MetaOp::SetAcl {
                ino: 6,
                mode: 0o100_640,
                value: [
                    2, 0, 0, 0, 1, 0, 6, 0, 255, 255, 255, 255, 4, 0, 4, 0, 255, 255, 255, 255,
                ]
                .into_iter()
                .chain([32, 0, 0, 0, 255, 255, 255, 255])
                .collect(),
                time: 10,
            },
            MetaOp::CreateUnnamed {
                ino: 7,
                mode: 0o600,
                time: 12,
                uid: 1000,
                gid: 100,
            },
            MetaOp::DropUnnamed { ino: 7 },
            MetaOp::SetAcl {
                ino: 6,
                mode: 0o100_600,
                value: Box::new([]),
                time: 11,
            },
            MetaOp::SetTimes {
                ino: 5,
                atime: 1,
                mtime: 0,
                ctime: 10,
            },
            MetaOp::Rename {
                src_parent: 1,
                src_name: "a".into(),
                dst_parent: 2,
                dst_name: "b".repeat(255),
                ino: 3,
                replaced: 4,
                time: 11,
            },
            MetaOp::Remove {
                parent: 2,
                ino: 4,
                name: "gone".into(),
                time: 12,
            },
            MetaOp::Exchange {
                a_parent: 1,
                a_name: "x".into(),
                b_parent: 2,
                b_name: "y".into(),
                a_ino: 5,
                b_ino: 6,
                time: 12,
            },
            MetaOp::Link {
                parent: 2,
                ino: 3,
                name: "another name".into(),
                time: 13,
            },
            MetaOp::Batch {
                maps: vec![MapEntry {
                    ino: 3,
                    file_block: 9,
                    blocks: 2,
                    addr: 1 << 21,
                }],
                sizes: vec![SizeEntry {
                    ino: 3,
                    size: 40960,
                    mtime: 5,
                    order: 9,
                }],
                retired: vec![(1, 17)],
            },
            MetaOp::Allocate {
                ino: 3,
                size: 1 << 20,
                time: 14,
                runs: vec![
                    crate::extent_map::Run {
                        file_block: 0,
                        blocks: 4,
                        addr: 1 << 22,
                    },
                    crate::extent_map::Run {
                        file_block: 10,
                        blocks: 1,
                        addr: 3 << 21,
                    },
                ],
            },
        ]
    }

    /// A checkpoint batch encodes into a vector of the size [`MetaOp::batch_bytes`] bounds
    /// it by (which also cuts batches to fit a journal): it never grew, and at most the
    /// padding's 8 bytes of it are unused.
    #[test]
    fn batches_encode_to_their_computed_size() {
        let batch = |maps: u64, sizes: u64, retired: u32| MetaOp::Batch {
            maps: (0..maps)
                .map(|i| MapEntry {
                    ino: 3,
                    file_block: i,
                    blocks: 1,
                    addr: (i + 1) << 12,
                })
                .collect(),
            sizes: (0..sizes)
                .map(|i| SizeEntry {
                    ino: i + 2,
                    size: 4096,
                    mtime: 5,
                    order: 9,
                })
                .collect(),
            retired: (0..retired).map(|slot| (slot, 17)).collect(),
        };
        for (maps, sizes, retired) in [(0, 0, 0), (1, 1, 1), (700, 9, 64), (3, 0, 1)] {
            let bytes = encode(3, 7, &batch(maps, sizes, retired));
            let size = MetaOp::batch_bytes(maps as usize, sizes as usize, retired as usize);
            assert!(
                bytes.len() <= size && bytes.len() + 8 >= size && bytes.capacity() == size,
                "{maps} maps, {sizes} sizes, {retired} retired: {} bytes, capacity {}, bound \
                 {size}",
                bytes.len(),
                bytes.capacity()
            );
        }
    }

    /// An `Allocate` whose runs could not all be holes of one file, or could not be
    /// mapped, is refused by name.
    #[test]
    fn allocations_that_cannot_be_mapped_are_refused() {
        let decode = |runs: &[(u64, u64, u64)], count: u32| {
            let mut e = Encoder::default();
            e.u64(3).u64(0).u64(1).u32(count);
            for &(file_block, blocks, addr) in runs {
                e.u64(file_block).u64(blocks).u64(addr);
            }
            let mut d = Decoder::new(&e.0, "test");
            MetaOp::decode_payload(20, &mut d).map_err(|e| e.to_string())
        };
        assert!(decode(&[(0, 2, 1 << 21), (2, 1, 1 << 22)], 2).is_ok());
        let overlapping = decode(&[(0, 2, 1 << 21), (1, 1, 1 << 22)], 2).unwrap_err();
        assert!(overlapping.contains("over the one before"), "{overlapping}");
        let unaligned = decode(&[(0, 1, (1 << 21) + 512)], 1).unwrap_err();
        assert!(unaligned.contains("invalid run"), "{unaligned}");
        let empty = decode(&[(0, 0, 1 << 21)], 1).unwrap_err();
        assert!(empty.contains("invalid run"), "{empty}");
        let many = decode(&[], MAX_ALLOCATE_RUNS as u32 + 1).unwrap_err();
        assert!(many.contains("at most"), "{many}");
    }

    #[test]
    fn records_round_trip_and_the_scan_stops_at_a_torn_one() {
        let tracer = pmem::Tracer::new();
        let region = tracer.region(64 << 10);
        let mut journal = Journal::new(region.clone(), 3);
        for (i, op) in ops().iter().enumerate() {
            journal.append(10 + i as u64, op).unwrap().unwrap();
        }
        let (_, back) = Journal::recover(region.clone(), 1, 3).unwrap();
        assert_eq!(back.iter().map(|r| r.op.clone()).collect::<Vec<_>>(), ops());
        assert_eq!(back[3].order, 13);
        // Another epoch sees nothing.
        assert!(Journal::recover(region.clone(), 1, 4).unwrap().1.is_empty());
        // Flip a byte of the last record: a torn append, the scan keeps the others.
        let lens: Vec<u64> = ops()
            .iter()
            .enumerate()
            .map(|(i, op)| encode(3, 10 + i as u64, op).len() as u64)
            .collect();
        let flip = |at: u64| {
            let mut b = [0u8; 1];
            region.read(at, &mut b).unwrap();
            region.write(at, &[b[0] ^ 1]).unwrap();
        };
        let last_at: u64 = lens[..lens.len() - 1].iter().sum();
        flip(last_at + 40);
        assert_eq!(
            Journal::recover(region.clone(), 1, 3).unwrap().1.len(),
            ops().len() - 1
        );
        flip(last_at + 40);
        // Flip a byte of the second record: whole records follow it, so it is damage.
        flip(lens[0] + 40);
        let error = Journal::recover(region, 1, 3).unwrap_err().to_string();
        assert!(
            error.contains(&format!("the record at byte {} is damaged", lens[0]))
                && error.contains(&format!("follows at byte {}", lens[0] + lens[1])),
            "{error}"
        );
    }

    /// The scan for whole records after the end reads the journal in windows: a record
    /// anywhere — across a window's edge, at the very end — is found.
    #[test]
    fn a_whole_record_past_the_end_is_found_wherever_it_lies() {
        let record = encode(3, 7, &ops()[0]);
        let len = record.len() as u64;
        let window = 64u64 << 10;
        for at in [
            8,
            window - len,
            window - 40,
            window - 32,
            window - 8,
            window,
            3 * window - 24,
            (1 << 20) - len,
        ] {
            let tracer = pmem::Tracer::new();
            let region = tracer.region(1 << 20);
            // Something at byte 0 that is no record of the epoch, so the scan ends there.
            region.write(0, &[0xff; 8]).unwrap();
            region.write(at, &record).unwrap();
            let error = Journal::recover(region, 1, 3).unwrap_err().to_string();
            assert!(
                error.contains(&format!("follows at byte {at}")),
                "{at}: {error}"
            );
        }
    }

    /// A journal sealed at a clean unmount is not read past its marker; its first append
    /// unseals it, so damage to what follows is still found.
    #[test]
    fn a_sealed_journal_ends_at_its_marker_until_appended_to() {
        let tracer = pmem::Tracer::new();
        let region = tracer.region(1 << 20);
        let mut journal = Journal::new(region.clone(), 3);
        journal.reset(3, true).unwrap();
        // A whole record of the epoch far past the marker: only damage could put one there,
        // and a sealed journal is not searched for it (an unsealed one is).
        let stray = encode(3, 9, &ops()[0]);
        region.write(64 << 10, &stray).unwrap();
        let (journal, records) = Journal::recover(region.clone(), 1, 3).unwrap();
        assert!(records.is_empty() && journal.sealed == Some(0));
        let mut unsealed = Journal::new(region.clone(), 3);
        unsealed.reset(3, false).unwrap();
        assert!(Journal::recover(region.clone(), 1, 3).is_err());
        unsealed.reset(3, true).unwrap();
        region.fill(64 << 10, stray.len() as u64, 0).unwrap();

        // Appended to after the mount: unsealed first, so a damaged first record with a
        // whole one after it is damage again, not the end of the epoch.
        let (mut journal, _) = Journal::recover(region.clone(), 1, 3).unwrap();
        journal.append(10, &ops()[0]).unwrap().unwrap();
        journal.append(11, &ops()[1]).unwrap().unwrap();
        let (reopened, records) = Journal::recover(region.clone(), 1, 3).unwrap();
        assert_eq!(records.len(), 2);
        assert!(reopened.sealed.is_none());
        let marker = encode_marker(3, false).len() as u64;
        let mut b = [0u8; 1];
        region.read(marker + 40, &mut b).unwrap();
        region.write(marker + 40, &[b[0] ^ 1]).unwrap();
        let error = Journal::recover(region, 1, 3).unwrap_err().to_string();
        assert!(
            error.contains(&format!("the record at byte {marker} is damaged")),
            "{error}"
        );
    }

    /// A journal sealed after its records (a clean unmount that kept them instead of writing
    /// a snapshot) replays them and is not read past its seal; the next append writes over
    /// the seal, so the search past the end is back and a damaged record is found again.
    #[test]
    fn a_journal_sealed_after_its_records_replays_them_and_reads_no_further() {
        let tracer = pmem::Tracer::new();
        let region = tracer.region(1 << 20);
        let mut journal = Journal::new(region.clone(), 3);
        journal.reset(3, false).unwrap();
        journal.append(10, &ops()[0]).unwrap().unwrap();
        journal.append(11, &ops()[1]).unwrap().unwrap();
        let end = journal.used();
        assert!(journal.seal().unwrap());
        assert!(journal.seal().unwrap(), "sealed already: nothing written");
        assert_eq!(journal.used(), end, "the seal is not counted as used");
        // A whole record of the epoch far past the end: a scan takes it for damage, a sealed
        // journal is not searched.
        let stray = encode(3, 9, &ops()[2]);
        region.write(64 << 10, &stray).unwrap();
        let (sealed, records) = Journal::recover(region.clone(), 1, 3).unwrap();
        assert_eq!(
            records.iter().map(|r| r.order).collect::<Vec<_>>(),
            [10, 11]
        );
        assert!(sealed.is_sealed());
        assert_eq!(sealed.used(), end, "the next append goes where the seal is");

        // Appended to: the record takes the seal's place, so when it is damaged the journal
        // is searched past it again (a seal left before it would end the scan there, and
        // the record and the one after it would be lost unreported).
        let (mut journal, _) = Journal::recover(region.clone(), 1, 3).unwrap();
        journal.append(12, &ops()[3]).unwrap().unwrap();
        assert!(!journal.is_sealed());
        let mut b = [0u8; 1];
        region.read(end + 40, &mut b).unwrap();
        region.write(end + 40, &[b[0] ^ 1]).unwrap();
        let error = Journal::recover(region.clone(), 1, 3)
            .unwrap_err()
            .to_string();
        assert!(
            error.contains(&format!(
                "the record at byte {end} is damaged, and a whole record of the same epoch \
                 follows at byte 65536"
            )),
            "{error}"
        );
        region.write(end + 40, &b).unwrap();
        region.fill(64 << 10, stray.len() as u64, 0).unwrap();
        let (reopened, records) = Journal::recover(region.clone(), 1, 3).unwrap();
        assert_eq!(
            records.iter().map(|r| r.order).collect::<Vec<_>>(),
            [10, 11, 12]
        );
        assert!(!reopened.is_sealed());

        // A journal with no room for the seal is left as it is.
        let small = tracer.region(256);
        let mut full = Journal::new(small.clone(), 3);
        full.reset(3, false).unwrap();
        while full.append(20, &ops()[0]).unwrap().is_some() {}
        let before = tracer.contents()[1].clone();
        if !full.fits(encode_marker(3, true).len()) {
            assert!(!full.seal().unwrap());
            assert_eq!(tracer.contents()[1], before);
        }
    }

    /// Every crash image of appends after a seal that ended records recovers the records
    /// before the seal and a prefix of those appended after it — every acknowledged one —
    /// and never reports damage nor a seal beside a record that followed it.
    #[test]
    fn every_crash_image_after_a_seal_at_the_end_recovers_what_was_appended() {
        let written = pmem::Tracer::new();
        let region = written.region(64 << 10);
        let mut journal = Journal::new(region, 3);
        journal.reset(3, false).unwrap();
        journal.append(10, &ops()[0]).unwrap().unwrap();
        assert!(journal.seal().unwrap());
        let replay = pmem::Tracer::new();
        let region = replay.region_with(written.contents()[0].clone());
        let (mut journal, _) = Journal::recover(region, 1, 3).unwrap();
        let mut acknowledged = vec![replay.fence_count()];
        for (order, op) in (11..).zip(&ops()[1..4]) {
            journal.append(order, op).unwrap().unwrap();
            acknowledged.push(replay.fence_count());
        }
        let mut images = 0;
        for point in acknowledged[0]..replay.crash_points() {
            for image in replay.crash_images(point, 64, point as u64) {
                images += 1;
                let region = pmem::Tracer::new().region_with(image.regions[0].clone());
                let (reopened, records) = Journal::recover(region, 1, 3)
                    .unwrap_or_else(|e| panic!("{e} at {}", image.description));
                let orders: Vec<u64> = records.iter().map(|r| r.order).collect();
                // Appends whose fence came before this point are durable.
                let durable = acknowledged[1..].iter().filter(|&&f| f < point).count();
                assert!(
                    orders.len() > durable
                        && orders.iter().copied().eq(10..10 + orders.len() as u64),
                    "recovered {orders:?} (at least {durable} appended) at {}",
                    image.description
                );
                assert!(
                    !reopened.is_sealed() || orders == [10],
                    "sealed beside an appended record at {}",
                    image.description
                );
            }
        }
        assert!(images > 5, "only {images} images");
    }

    /// A create as written before owners were kept (kind 1) still reads, unowned.
    #[test]
    fn a_create_of_kind_1_reads_as_unowned() {
        let mut create = Encoder::default();
        create.u64(1).u64(9).u8(1).u32(0o640).u64(77).name("old");
        let mut d = Decoder::new(&create.0, "test");
        let op = MetaOp::decode_payload(1, &mut d).unwrap();
        assert_eq!(d.remaining(), 0);
        let MetaOp::Create {
            ino,
            mode,
            time,
            uid,
            gid,
            ..
        } = op
        else {
            panic!("{op:?}")
        };
        assert_eq!((ino, mode, time), (9, 0o640, 77));
        assert_eq!((uid, gid), (crate::Owner::UNOWNED, crate::Owner::UNOWNED));
    }

    /// Records of kinds written before times could be set still read: SetMode (kind 5)
    /// with time 0, a Batch (kind 6) with size orders 0.
    #[test]
    fn set_mode_and_batch_records_of_older_kinds_still_read() {
        let mut mode = Encoder::default();
        mode.u64(5).u32(0o600);
        let mut d = Decoder::new(&mode.0, "test");
        assert_eq!(
            MetaOp::decode_payload(5, &mut d).unwrap(),
            MetaOp::SetMode {
                ino: 5,
                mode: 0o600,
                time: 0
            }
        );
        let mut batch = Encoder::default();
        batch.u32(0).u32(1).u32(0).u64(3).u64(4096).u64(77);
        let mut d = Decoder::new(&batch.0, "test");
        assert_eq!(
            MetaOp::decode_payload(6, &mut d).unwrap(),
            MetaOp::Batch {
                maps: vec![],
                sizes: vec![SizeEntry {
                    ino: 3,
                    size: 4096,
                    mtime: 77,
                    order: 0
                }],
                retired: vec![],
            }
        );
        // A symbolic link with an empty target is damage, named.
        let mut link = Encoder::default();
        link.u64(1).u64(2).u8(3).u32(0o777).u64(1).name("l").u16(0);
        let mut d = Decoder::new(&link.0, "test");
        let err = MetaOp::decode_payload(1, &mut d).unwrap_err().to_string();
        assert!(err.contains("symlink target"), "{err}");
    }

    /// Remove and Rename records as written before they carried a time (kinds 2 and 3)
    /// still read, with time 0 ("leave the mtime as it was").
    #[test]
    fn remove_and_rename_records_without_a_time_still_read() {
        let mut remove = Encoder::default();
        remove.u64(1).u64(5).name("old");
        let mut rename = Encoder::default();
        rename.u64(1).u64(2).u64(5).u64(0).name("a").name("b");
        let read = |kind: u8, e: Encoder| {
            let mut d = Decoder::new(&e.0, "test");
            MetaOp::decode_payload(kind, &mut d).unwrap()
        };
        assert_eq!(
            read(2, remove),
            MetaOp::Remove {
                parent: 1,
                ino: 5,
                name: "old".into(),
                time: 0
            }
        );
        assert_eq!(
            read(3, rename),
            MetaOp::Rename {
                src_parent: 1,
                src_name: "a".into(),
                dst_parent: 2,
                dst_name: "b".into(),
                ino: 5,
                replaced: 0,
                time: 0
            }
        );
    }

    /// Decodes `payload` as a record of `kind`: an operation, or an error that names the
    /// journal — never a panic, whatever the bytes (a record's CRC only says the bytes are
    /// the ones written, not that whoever wrote them was right).
    fn decodes_or_names_the_journal(kind: u8, payload: &[u8]) -> Result<(), String> {
        let mut d = Decoder::new(payload, "journal of slot 7");
        match MetaOp::decode_payload(kind, &mut d) {
            Ok(_) => Ok(()),
            Err(e) if e.to_string().contains("journal of slot 7") => Ok(()),
            Err(e) => Err(format!(
                "kind {kind}: an error that does not name the journal: {e}"
            )),
        }
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(2000))]

        /// Any bytes under any kind byte.
        #[test]
        fn arbitrary_payloads_decode_or_are_refused(
            kind in proptest::prelude::any::<u8>(),
            payload in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..400),
        ) {
            proptest::prop_assert_eq!(decodes_or_names_the_journal(kind, &payload), Ok(()));
        }

        /// Each kind's real encoding with bytes changed and its end cut: counts, lengths
        /// and codes that lie are what damage looks like.
        #[test]
        fn damaged_encodings_decode_or_are_refused(
            which in proptest::prelude::any::<proptest::sample::Index>(),
            changes in proptest::collection::vec(
                (proptest::prelude::any::<proptest::sample::Index>(), 1u8..=255),
                1..6,
            ),
            cut in proptest::prelude::any::<proptest::sample::Index>(),
        ) {
            let ops = ops();
            let op = &ops[which.index(ops.len())];
            let mut e = Encoder::default();
            op.encode_payload(&mut e);
            let mut bytes = e.0;
            for (at, xor) in changes {
                let at = at.index(bytes.len());
                bytes[at] ^= xor;
            }
            let len = bytes.len() - cut.index(bytes.len() / 4 + 1);
            proptest::prop_assert_eq!(
                decodes_or_names_the_journal(op.kind_code(), &bytes[..len]),
                Ok(())
            );
        }
    }

    #[test]
    fn a_whole_record_with_a_bad_payload_is_named_damage() {
        let tracer = pmem::Tracer::new();
        let region = tracer.region(4096);
        let mut bytes = encode(1, 5, &ops()[0]);
        bytes[8] = 99; // unknown kind, CRC fixed below
        let crc = crc32c::crc32c_append(crc32c::crc32c(&bytes[0..4]), &bytes[8..]);
        bytes[4..8].copy_from_slice(&crc.to_le_bytes());
        region.write(0, &bytes).unwrap();
        let err = Journal::recover(region, 2, 1).unwrap_err().to_string();
        assert!(
            err.contains("journal of slot 2") && err.contains("kind 99"),
            "{err}"
        );
    }

    #[test]
    fn an_acl_record_whose_value_is_no_acl_is_named_damage() {
        let tracer = pmem::Tracer::new();
        let region = tracer.region(4096);
        let op = MetaOp::SetAcl {
            ino: 6,
            mode: 0o600,
            // Version 2 and one entry: no owning-group or other entry.
            value: [2, 0, 0, 0, 1, 0, 6, 0, 255, 255, 255, 255].into(),
            time: 1,
        };
        region.write(0, &encode(1, 5, &op)).unwrap();
        let err = Journal::recover(region, 2, 1).unwrap_err().to_string();
        assert!(
            err.contains("journal of slot 2") && err.contains("no owning group entry"),
            "{err}"
        );
    }
}
