//! Snapshots: the whole metadata (namespace, extent maps, sizes, how far each data log is
//! retired) written to a fresh extent, which a new root then names. A snapshot lets every
//! journal start again empty. Byte layout: docs/format/fs-metadata.md.

use crate::codec::{Decoder, Encoder};
use crate::error::Result;
use crate::extent_map::{BLOCK, Run};
use crate::journal::Kind;

/// `LOCUSSNP`.
pub const SNAPSHOT_MAGIC: u64 = u64::from_le_bytes(*b"LOCUSSNP");
/// Format version: 4 may hold unnamed files ([`UNNAMED`]); written only by a snapshot that
/// holds one, so that a volume without them stays readable by builds that read 3.
pub const SNAPSHOT_VERSION: u32 = 4;
/// Each inode's owner and extended attributes (still written when no file is unnamed).
const SNAPSHOT_VERSION_OWNERS: u32 = 3;
/// The `parent` of an unnamed file (`O_TMPFILE`, open when the snapshot was taken): in no
/// directory, and dropped by recovery unless a later journal record names it.
pub const UNNAMED: u64 = u64::MAX;
/// Access and change times and symbolic links, no owners or extended attributes (still read:
/// unowned, none).
const SNAPSHOT_VERSION_TIMES: u32 = 2;
/// The first version (still read): modification time only, files and directories.
const SNAPSHOT_VERSION_MTIME: u32 = 1;

/// `LOCUSSNX`: a snapshot index page, which the root names instead of the snapshot when no
/// single extent could hold the snapshot (free memory left in pieces).
pub const INDEX_MAGIC: u64 = u64::from_le_bytes(*b"LOCUSSNX");
/// Index format version: pages that may name a next page.
pub const INDEX_VERSION: u32 = 2;
/// The first index version: one index, no next page (still read).
const INDEX_VERSION_SINGLE: u32 = 1;
/// Most pieces one snapshot is in, over all its index pages.
pub const MAX_PIECES: u32 = 1 << 16;
/// Bytes of an index page: one block, so that a page fits wherever one free block is left.
pub const INDEX_PAGE_BYTES: u64 = 4096;
/// Pieces one index page names.
pub const INDEX_PAGE_PIECES: usize = ((INDEX_PAGE_BYTES - INDEX_HEADER - 4) / 16) as usize;
const INDEX_HEADER: u64 = 8 + 4 + 4 + 8 + 8 + 8;

/// One page of the index of a snapshot in pieces: `(global address, length)` of each piece
/// it names, in order, and where the next page is. The snapshot is the concatenation of the
/// pieces of every page, in page order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SnapshotIndex {
    /// Length of the snapshot (the sum of the pieces of every page).
    pub total: u64,
    /// The pieces this page names, in order.
    pub pieces: Vec<(u64, u64)>,
    /// `(global address, length)` of the next page, if any.
    pub next: Option<(u64, u64)>,
}

impl SnapshotIndex {
    /// Encodes it (version 2), checksum last.
    pub fn encode(&self) -> Vec<u8> {
        let mut e = Encoder::default();
        let (next, next_len) = self.next.unwrap_or((0, 0));
        e.u64(INDEX_MAGIC)
            .u32(INDEX_VERSION)
            .u32(self.pieces.len() as u32)
            .u64(self.total)
            .u64(next)
            .u64(next_len);
        for &(addr, len) in &self.pieces {
            e.u64(addr).u64(len);
        }
        let crc = crc32c::crc32c(&e.0);
        e.u32(crc);
        e.0
    }

    /// Decodes and checks an index page (version 2, or a version-1 index: one page); every
    /// failure names what is wrong.
    pub fn decode(bytes: &[u8]) -> Result<Self> {
        let structure = "file-system snapshot index";
        let d = Decoder::new(bytes, structure);
        if bytes.len() < 28 {
            return Err(d.error(format!("{} bytes is too short", bytes.len())));
        }
        let (body, crc) = bytes.split_at(bytes.len() - 4);
        let mut d = Decoder::new(body, structure);
        if d.u64("magic")? != INDEX_MAGIC {
            return Err(d.error("magic is not LOCUSSNX"));
        }
        if u32::from_le_bytes(crc.try_into().expect("4")) != crc32c::crc32c(body) {
            return Err(d.error("crc32c mismatch"));
        }
        let version = d.u32("version")?;
        if version != INDEX_VERSION && version != INDEX_VERSION_SINGLE {
            return Err(d.error(format!(
                "version {version}, expected {INDEX_VERSION_SINGLE} or {INDEX_VERSION}"
            )));
        }
        let count = d.u32("piece count")?;
        if count == 0 || count > MAX_PIECES {
            return Err(d.error(format!("{count} pieces; 1..={MAX_PIECES}")));
        }
        let total = d.u64("total length")?;
        let next = if version == INDEX_VERSION {
            let addr = d.u64("next page address")?;
            let len = d.u64("next page length")?;
            match (addr, len) {
                (0, 0) => None,
                (_, 28..=INDEX_PAGE_BYTES) if addr != 0 => Some((addr, len)),
                _ => {
                    return Err(d.error(format!(
                        "next page at {addr} of {len} bytes (a page is 28..={INDEX_PAGE_BYTES})"
                    )));
                }
            }
        } else {
            None
        };
        if d.remaining() != count as usize * 16 {
            return Err(d.error(format!(
                "{} bytes of pieces for {count} pieces of 16 bytes",
                d.remaining()
            )));
        }
        let mut pieces = Vec::with_capacity(count as usize);
        let mut sum = 0u64;
        for i in 0..count {
            let addr = d.u64("piece address")?;
            let len = d.u64("piece length")?;
            if len == 0 {
                return Err(d.error(format!("piece {i} is empty")));
            }
            sum = sum
                .checked_add(len)
                .ok_or_else(|| d.error("piece lengths overflow"))?;
            pieces.push((addr, len));
        }
        // A page of a chain names part of the snapshot (recovery checks the whole adds up);
        // a version-1 index names all of it.
        if sum > total || version == INDEX_VERSION_SINGLE && sum != total {
            return Err(d.error(format!(
                "pieces add up to {sum} bytes, the index says {total}"
            )));
        }
        Ok(Self {
            total,
            pieces,
            next,
        })
    }
}

/// One inode as a snapshot stores it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InodeImage {
    /// Number.
    pub ino: u64,
    /// File, directory or symbolic link.
    pub kind: Kind,
    /// Permission bits.
    pub mode: u32,
    /// Owning user ([`crate::Owner::UNOWNED`] from snapshots of versions 1 and 2).
    pub uid: u32,
    /// Owning group (likewise).
    pub gid: u32,
    /// Modification time (ns).
    pub mtime: u64,
    /// Access time (ns).
    pub atime: u64,
    /// Change time (ns).
    pub ctime: u64,
    /// A symbolic link's target (empty otherwise).
    pub target: String,
    /// A device node's device number (0 otherwise).
    pub rdev: u64,
    /// Size in bytes (files).
    pub size: u64,
    /// Parent directory (directories; 0 for files, [`UNNAMED`] for an unnamed file).
    pub parent: u64,
    /// Entries (directories).
    pub entries: Vec<(String, u64)>,
    /// Extent map (files).
    pub runs: Vec<Run>,
    /// Extended attributes, by name.
    pub xattrs: Vec<(String, Box<[u8]>)>,
}

impl InodeImage {
    /// An unnamed file (`O_TMPFILE`) that was open when the snapshot was taken.
    pub fn is_unnamed(&self) -> bool {
        self.parent == UNNAMED
    }
}

/// Bytes an inode's fixed fields take in a snapshot.
pub(crate) const INODE_BYTES: u64 = 8 + 1 + 4 + 4 + 4 + 8 + 8 + 8 + 8 + 8 + 8 + 8 + 4;
/// Bytes one extent run takes.
pub(crate) const RUN_BYTES: u64 = 24;
/// The most a logged write of `len` bytes at `offset` can add to the next snapshot once the
/// checkpoint has moved it: every map change it causes (one per block, and the partial
/// blocks at its edges) splits at most one run into three.
pub(crate) fn write_growth_bound(offset: u64, len: u64) -> u64 {
    let blocks = (offset + len).div_ceil(BLOCK) - offset / BLOCK;
    2 * RUN_BYTES * (blocks + 2)
}

/// Bytes a directory entry named `name` takes.
pub(crate) fn entry_bytes(name: &str) -> u64 {
    2 + name.len() as u64 + 8
}

/// The whole metadata at one moment.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Snapshot {
    /// The epoch this snapshot starts.
    pub epoch: u64,
    /// Next inode number to hand out.
    pub next_ino: u64,
    /// Next global order to hand out.
    pub next_order: u64,
    /// Per slot: data-log records retired through this sequence.
    pub retired: Vec<u64>,
    /// Every inode.
    pub inodes: Vec<InodeImage>,
}

/// An inode's fixed fields and the strings that follow them, for [`SnapshotWriter::inode`].
#[derive(Debug, Clone, Copy)]
pub(crate) struct InodeHead<'a> {
    pub(crate) ino: u64,
    pub(crate) kind: Kind,
    pub(crate) mode: u32,
    pub(crate) uid: u32,
    pub(crate) gid: u32,
    pub(crate) mtime: u64,
    pub(crate) atime: u64,
    pub(crate) ctime: u64,
    pub(crate) size: u64,
    pub(crate) parent: u64,
    pub(crate) target: &'a str,
    pub(crate) rdev: u64,
}

/// Writes a snapshot an inode at a time — its entries, runs and extended attributes given
/// one by one and counted as they come — with the header and checksum added at the end:
/// the checkpoint encodes the running file system's inodes straight from their locks, with
/// no image of each (every name and run copied, then dropped) in between, and no count it
/// must know before it has walked them. [`Snapshot::encode`] is this over its images.
#[derive(Debug, Default)]
pub(crate) struct SnapshotWriter {
    body: Encoder,
    inodes: u64,
    unnamed: bool,
    /// Where the inode being written keeps its counts, and the counts so far.
    open: Option<OpenInode>,
}

#[derive(Debug)]
struct OpenInode {
    counts_at: usize,
    entries: u64,
    runs: u64,
    xattrs: u32,
}

impl SnapshotWriter {
    /// A writer with room for a snapshot of about `bytes`, reserved up front: grown by
    /// doubling, the buffer of a snapshot of 200,000 files (16 MiB) was copied and its new
    /// pages faulted in at each step, and copied once more behind the header at the end —
    /// three quarters of the time the snapshot held metadata operations off. Room reserved
    /// and not used is address space only: its pages are never touched.
    pub(crate) fn with_capacity(bytes: usize) -> Self {
        Self {
            body: Encoder(Vec::with_capacity(bytes)),
            ..Self::default()
        }
    }

    /// Starts the next inode (inodes go in increasing number).
    pub(crate) fn inode(&mut self, head: &InodeHead<'_>) {
        self.close_inode();
        self.inodes += 1;
        self.unnamed |= head.parent == UNNAMED;
        let e = &mut self.body;
        e.u64(head.ino)
            .u8(head.kind.code())
            .u32(head.mode)
            .u32(head.uid)
            .u32(head.gid)
            .u64(head.mtime)
            .u64(head.atime)
            .u64(head.ctime)
            .u64(head.size)
            .u64(head.parent);
        let counts_at = e.0.len();
        // Entry, run and extended-attribute counts, filled in when the inode is closed.
        e.u64(0).u64(0).u32(0);
        if head.kind == Kind::Symlink {
            e.text(head.target);
        }
        if head.kind.is_device() {
            e.u64(head.rdev);
        }
        self.open = Some(OpenInode {
            counts_at,
            entries: 0,
            runs: 0,
            xattrs: 0,
        });
    }

    fn current(&mut self) -> &mut OpenInode {
        self.open
            .as_mut()
            .expect("entries, runs and attributes follow their inode")
    }

    /// A directory entry of the current inode (in name order).
    pub(crate) fn entry(&mut self, name: &str, ino: u64) {
        self.current().entries += 1;
        self.body.name(name).u64(ino);
    }

    /// A run of the current inode's extent map (in file order).
    pub(crate) fn run(&mut self, run: Run) {
        self.current().runs += 1;
        self.body.u64(run.file_block).u64(run.blocks).u64(run.addr);
    }

    /// An extended attribute of the current inode (in name order).
    pub(crate) fn xattr(&mut self, name: &str, value: &[u8]) {
        self.current().xattrs += 1;
        crate::xattr::encode(&mut self.body, name, value);
    }

    fn close_inode(&mut self) {
        if let Some(open) = self.open.take() {
            let at = open.counts_at;
            let counts = &mut self.body.0[at..at + 20];
            counts[0..8].copy_from_slice(&open.entries.to_le_bytes());
            counts[8..16].copy_from_slice(&open.runs.to_le_bytes());
            counts[16..20].copy_from_slice(&open.xattrs.to_le_bytes());
        }
    }

    /// The snapshot: header, the inodes written, checksum. Version 4 only when an inode
    /// is unnamed, so that a volume without one stays readable by builds that read 3.
    pub(crate) fn finish(
        mut self,
        epoch: u64,
        next_ino: u64,
        next_order: u64,
        retired: &[u64],
    ) -> Vec<u8> {
        self.close_inode();
        let version = if self.unnamed {
            SNAPSHOT_VERSION
        } else {
            SNAPSHOT_VERSION_OWNERS
        };
        // Magic, version, flags, epoch, next inode, next order, retired count, inode count.
        let fixed = 8 + 4 + 4 + 8 + 8 + 8 + 4 + 8;
        let mut header = Encoder(Vec::with_capacity(fixed + 8 * retired.len()));
        header.u64(SNAPSHOT_MAGIC).u32(version).u32(0);
        header
            .u64(epoch)
            .u64(next_ino)
            .u64(next_order)
            .u32(retired.len() as u32)
            .u64(self.inodes);
        for r in retired {
            header.u64(*r);
        }
        // The header goes in front of the body in the body's own buffer: one move of the
        // body within it (when it has the room), not a copy into fresh memory.
        let mut e = self.body;
        e.0.reserve(header.0.len() + 4);
        e.0.splice(0..0, header.0);
        let crc = crc32c::crc32c(&e.0);
        e.u32(crc);
        e.0
    }
}

impl Snapshot {
    /// Encodes it, checksum last.
    pub fn encode(&self) -> Vec<u8> {
        let mut w = SnapshotWriter::default();
        for inode in &self.inodes {
            w.inode(&InodeHead {
                ino: inode.ino,
                kind: inode.kind,
                mode: inode.mode,
                uid: inode.uid,
                gid: inode.gid,
                mtime: inode.mtime,
                atime: inode.atime,
                ctime: inode.ctime,
                size: inode.size,
                parent: inode.parent,
                target: &inode.target,
                rdev: inode.rdev,
            });
            for (name, ino) in &inode.entries {
                w.entry(name, *ino);
            }
            for run in &inode.runs {
                w.run(*run);
            }
            for (name, value) in &inode.xattrs {
                w.xattr(name, value);
            }
        }
        w.finish(self.epoch, self.next_ino, self.next_order, &self.retired)
    }

    /// Decodes and checks a snapshot; every failure names what is wrong. (Recovery uses
    /// [`Snapshot::decode_each`].)
    #[cfg(test)]
    pub fn decode(bytes: &[u8]) -> Result<Self> {
        let mut inodes = Vec::new();
        let mut snapshot = Self::decode_each(bytes, |image| {
            inodes.push(image);
            Ok(())
        })?;
        snapshot.inodes = inodes;
        Ok(snapshot)
    }

    /// `Snapshot::decode` (tests only), handing each inode to `each` as it is decoded instead of
    /// collecting them (the returned snapshot's `inodes` is empty): recovery builds its
    /// table straight from them, without a vector of images for the whole file system to
    /// grow and move. An error of `each` stops the decoding and is returned.
    pub fn decode_each(
        bytes: &[u8],
        mut each: impl FnMut(InodeImage) -> Result<()>,
    ) -> Result<Self> {
        let structure = "file-system snapshot";
        let mut d = Decoder::new(bytes, structure);
        if bytes.len() < 48 {
            return Err(d.error(format!("{} bytes is too short", bytes.len())));
        }
        if d.u64("magic")? != SNAPSHOT_MAGIC {
            return Err(d.error("magic is not LOCUSSNP"));
        }
        let (body, crc) = bytes.split_at(bytes.len() - 4);
        if u32::from_le_bytes(crc.try_into().expect("4")) != crc32c::crc32c(body) {
            return Err(d.error("crc32c mismatch"));
        }
        let mut d = Decoder::new(body, structure);
        d.u64("magic")?;
        let version = d.u32("version")?;
        if !(SNAPSHOT_VERSION_MTIME..=SNAPSHOT_VERSION).contains(&version) {
            return Err(d.error(format!(
                "version {version}, expected {SNAPSHOT_VERSION_MTIME}..={SNAPSHOT_VERSION}"
            )));
        }
        let times = version >= SNAPSHOT_VERSION_TIMES;
        let owners_and_xattrs = version >= SNAPSHOT_VERSION_OWNERS;
        d.u32("reserved")?;
        let epoch = d.u64("epoch")?;
        let next_ino = d.u64("next_ino")?;
        let next_order = d.u64("next_order")?;
        let slots = d.u32("slot count")?;
        let count = d.u64("inode count")?;
        let mut retired = Vec::with_capacity(slots.min(1024) as usize);
        for _ in 0..slots {
            retired.push(d.u64("retired")?);
        }
        for _ in 0..count {
            let ino = d.u64("ino")?;
            let code = d.u8("kind")?;
            let kind = Kind::from_code(code)
                .filter(|k| times || matches!(k, Kind::File | Kind::Dir))
                .ok_or_else(|| d.error(format!("inode {ino} has unknown kind {code}")))?;
            let mode = d.u32("mode")?;
            let (uid, gid) = if owners_and_xattrs {
                (d.u32("uid")?, d.u32("gid")?)
            } else {
                (crate::Owner::UNOWNED, crate::Owner::UNOWNED)
            };
            let mtime = d.u64("mtime")?;
            let (atime, ctime) = if times {
                (d.u64("atime")?, d.u64("ctime")?)
            } else {
                (mtime, mtime)
            };
            let size = d.u64("size")?;
            let parent = d.u64("parent")?;
            let entry_count = d.u64("entry count")?;
            let run_count = d.u64("run count")?;
            let xattr_count = if owners_and_xattrs {
                d.u32("extended attribute count")?
            } else {
                0
            };
            if entry_count
                .saturating_add(run_count)
                .saturating_add(u64::from(xattr_count))
                > d.remaining() as u64
            {
                return Err(d.error(format!("inode {ino} claims more entries than bytes left")));
            }
            let target = match kind {
                Kind::Symlink => d.text("symlink target")?,
                _ => String::new(),
            };
            let rdev = if kind.is_device() {
                d.u64("device number")?
            } else {
                0
            };
            let mut entries = Vec::with_capacity(entry_count as usize);
            for _ in 0..entry_count {
                entries.push((d.name("entry name")?, d.u64("entry ino")?));
            }
            let mut runs = Vec::with_capacity(run_count as usize);
            for _ in 0..run_count {
                let run = Run {
                    file_block: d.u64("run file_block")?,
                    blocks: d.u64("run blocks")?,
                    addr: d.u64("run addr")?,
                };
                if !run.is_sound() {
                    return Err(d.error(format!("inode {ino} has an invalid run {run:?}")));
                }
                runs.push(run);
            }
            let mut xattrs: Vec<(String, Box<[u8]>)> = Vec::new();
            for _ in 0..xattr_count {
                let (name, value) = crate::xattr::decode(&mut d)?;
                if xattrs.last().is_some_and(|(last, _)| *last >= name) {
                    return Err(d.error(format!(
                        "inode {ino} lists extended attribute {name} out of order or twice"
                    )));
                }
                xattrs.push((name, value));
            }
            if parent == UNNAMED {
                if version < SNAPSHOT_VERSION {
                    return Err(d.error(format!(
                        "inode {ino} is unnamed, which version {version} cannot say"
                    )));
                }
                if kind != Kind::File || !entries.is_empty() {
                    return Err(d.error(format!(
                        "inode {ino} is unnamed but a {kind:?} with {} entries (only files can be)",
                        entries.len()
                    )));
                }
            }
            each(InodeImage {
                ino,
                kind,
                mode,
                uid,
                gid,
                mtime,
                atime,
                ctime,
                target,
                rdev,
                size,
                parent,
                entries,
                runs,
                xattrs,
            })?;
        }
        if d.remaining() != 0 {
            return Err(d.error(format!("{} bytes left after the last inode", d.remaining())));
        }
        Ok(Self {
            epoch,
            next_ino,
            next_order,
            retired,
            inodes: Vec::new(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Snapshot {
        Snapshot {
            epoch: 4,
            next_ino: 9,
            next_order: 1000,
            retired: vec![0, 5, 7],
            inodes: vec![
                InodeImage {
                    ino: 1,
                    kind: Kind::Dir,
                    mode: 0o755,
                    uid: 0,
                    gid: 0,
                    mtime: 1,
                    atime: 3,
                    ctime: 4,
                    target: String::new(),
                    rdev: 0,
                    size: 0,
                    parent: 1,
                    entries: vec![("f".into(), 2), ("l".into(), 3), ("c".into(), 4)],
                    runs: vec![],
                    xattrs: vec![],
                },
                InodeImage {
                    ino: 4,
                    kind: Kind::CharDevice,
                    mode: 0o600,
                    uid: 0,
                    gid: 6,
                    mtime: 5,
                    atime: 5,
                    ctime: 5,
                    target: String::new(),
                    rdev: 0x0001_0003,
                    size: 0,
                    parent: 0,
                    entries: vec![],
                    runs: vec![],
                    xattrs: vec![],
                },
                InodeImage {
                    ino: 3,
                    kind: Kind::Symlink,
                    mode: 0o777,
                    uid: 1000,
                    gid: 100,
                    mtime: 5,
                    atime: 5,
                    ctime: 5,
                    target: "../elsewhere/f".into(),
                    rdev: 0,
                    size: 14,
                    parent: 0,
                    entries: vec![],
                    runs: vec![],
                    xattrs: vec![],
                },
                InodeImage {
                    ino: 2,
                    kind: Kind::File,
                    mode: 0o644,
                    uid: 1000,
                    gid: 100,
                    mtime: 2,
                    atime: 6,
                    ctime: 7,
                    target: String::new(),
                    rdev: 0,
                    size: 10_000,
                    parent: 0,
                    entries: vec![],
                    runs: vec![Run {
                        file_block: 0,
                        blocks: 3,
                        addr: 1 << 21,
                    }],
                    xattrs: vec![
                        ("security.selinux".into(), b"label\0".to_vec().into()),
                        ("user.empty".into(), Box::default()),
                    ],
                },
            ],
        }
    }

    #[test]
    fn round_trips_and_rejects_every_flipped_byte() {
        let bytes = sample().encode();
        assert_eq!(Snapshot::decode(&bytes).unwrap(), sample());
        for i in 0..bytes.len() {
            let mut bad = bytes.clone();
            bad[i] ^= 0x40;
            let err = Snapshot::decode(&bad).unwrap_err().to_string();
            assert!(err.contains("file-system snapshot"), "byte {i}: {err}");
        }
        assert!(Snapshot::decode(&bytes[..bytes.len() - 1]).is_err());
    }

    /// Re-seals `bytes` (its checksum) after an edit.
    fn resealed(mut bytes: Vec<u8>) -> Vec<u8> {
        let body = bytes.len() - 4;
        let crc = crc32c::crc32c(&bytes[..body]);
        bytes[body..].copy_from_slice(&crc.to_le_bytes());
        bytes
    }

    #[test]
    fn an_unnamed_file_raises_the_version_and_only_a_file_can_be_one() {
        // Without one: version 3, which earlier builds read.
        assert_eq!(sample().encode()[8..12], 3u32.to_le_bytes());
        let mut with = sample();
        with.inodes[3].parent = UNNAMED;
        let bytes = with.encode();
        assert_eq!(bytes[8..12], 4u32.to_le_bytes());
        let back = Snapshot::decode(&bytes).unwrap();
        assert!(back.inodes[3].is_unnamed());
        assert_eq!(back, with);
        // Said in version 3: refused, by name.
        let mut old = bytes.clone();
        old[8..12].copy_from_slice(&3u32.to_le_bytes());
        let e = Snapshot::decode(&resealed(old)).unwrap_err().to_string();
        assert!(e.contains("inode 2 is unnamed"), "{e}");
        // A symbolic link cannot be unnamed.
        let mut link = sample();
        link.inodes[2].parent = UNNAMED;
        let e = Snapshot::decode(&link.encode()).unwrap_err().to_string();
        assert!(e.contains("inode 3 is unnamed but a Symlink"), "{e}");
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(2000))]

        /// A snapshot with bytes changed under a checksum that matches them (what a bug
        /// that wrote it would leave): it decodes, or the error names the snapshot — never
        /// a panic, nor an allocation its lengths and counts ask for but its bytes do not
        /// hold.
        #[test]
        fn resealed_damage_decodes_or_is_refused(
            changes in proptest::collection::vec(
                (proptest::prelude::any::<proptest::sample::Index>(), 1u8..=255),
                1..6,
            ),
            cut in proptest::prelude::any::<proptest::sample::Index>(),
        ) {
            let mut bytes = sample().encode();
            let body = bytes.len() - 4;
            // The magic stays: without it nothing past it is read.
            for (at, xor) in changes {
                bytes[8 + at.index(body - 8)] ^= xor;
            }
            bytes.truncate(body - cut.index((body - 48) / 4 + 1));
            bytes.extend_from_slice(&[0; 4]);
            let bytes = resealed(bytes);
            if let Err(e) = Snapshot::decode(&bytes) {
                proptest::prop_assert!(e.to_string().contains("file-system snapshot"), "{}", e);
            }
        }
    }

    /// A version-1 snapshot (modification time only) still reads: access and change time
    /// show the modification time; a symbolic link there is damage.
    #[test]
    fn a_version_1_snapshot_still_reads() {
        let v1 = |kind: u8| {
            let mut e = Encoder::default();
            e.u64(SNAPSHOT_MAGIC).u32(1).u32(0);
            e.u64(2).u64(3).u64(10).u32(0).u64(1);
            e.u64(1)
                .u8(kind)
                .u32(0o755)
                .u64(42)
                .u64(0)
                .u64(1)
                .u64(0)
                .u64(0);
            let crc = crc32c::crc32c(&e.0);
            e.u32(crc);
            e.0
        };
        let snapshot = Snapshot::decode(&v1(2)).unwrap();
        let root = &snapshot.inodes[0];
        assert_eq!((root.mtime, root.atime, root.ctime), (42, 42, 42));
        assert_eq!(root.kind, Kind::Dir);
        assert_eq!(
            (root.uid, root.gid),
            (crate::Owner::UNOWNED, crate::Owner::UNOWNED)
        );
        let err = Snapshot::decode(&v1(3)).unwrap_err().to_string();
        assert!(err.contains("inode 1 has unknown kind 3"), "{err}");
    }

    /// A version-2 snapshot (times, no owners) still reads, every inode unowned; a
    /// version this reader does not know is refused by number.
    #[test]
    fn a_version_2_snapshot_reads_unowned() {
        let image = |version: u32| {
            let mut e = Encoder::default();
            e.u64(SNAPSHOT_MAGIC).u32(version).u32(0);
            e.u64(2).u64(3).u64(10).u32(0).u64(1);
            e.u64(1).u8(2).u32(0o1777);
            e.u64(42).u64(43).u64(44).u64(0).u64(1).u64(0).u64(0);
            let crc = crc32c::crc32c(&e.0);
            e.u32(crc);
            e.0
        };
        let snapshot = Snapshot::decode(&image(2)).unwrap();
        let root = &snapshot.inodes[0];
        assert_eq!(
            (root.mode, root.mtime, root.atime, root.ctime),
            (0o1777, 42, 43, 44)
        );
        assert_eq!(
            (root.uid, root.gid),
            (crate::Owner::UNOWNED, crate::Owner::UNOWNED)
        );
        let err = Snapshot::decode(&image(5)).unwrap_err().to_string();
        assert!(err.contains("version 5, expected 1..=4"), "{err}");
    }

    #[test]
    fn an_index_round_trips_and_rejects_every_flipped_byte_and_bad_sums() {
        let index = SnapshotIndex {
            next: None,
            total: 12_288 + 100,
            pieces: vec![(1 << 21, 8192), (3 << 21, 4096 + 100)],
        };
        let bytes = index.encode();
        assert_eq!(SnapshotIndex::decode(&bytes).unwrap(), index);
        for i in 0..bytes.len() {
            let mut bad = bytes.clone();
            bad[i] ^= 0x10;
            let err = SnapshotIndex::decode(&bad).unwrap_err().to_string();
            assert!(err.contains("snapshot index"), "byte {i}: {err}");
        }
        let short = SnapshotIndex {
            next: None,
            total: 3,
            pieces: vec![(0, 4)],
        };
        let err = SnapshotIndex::decode(&short.encode())
            .unwrap_err()
            .to_string();
        assert!(err.contains("add up to 4 bytes, the index says 3"), "{err}");
        let empty = SnapshotIndex {
            next: None,
            total: 0,
            pieces: vec![(0, 0)],
        };
        let err = SnapshotIndex::decode(&empty.encode())
            .unwrap_err()
            .to_string();
        assert!(err.contains("piece 0 is empty"), "{err}");
    }

    #[test]
    fn an_index_page_names_its_next_page_and_a_full_page_fits_one_block() {
        let first = SnapshotIndex {
            total: 300 << 20,
            pieces: vec![(1 << 21, 1 << 20); INDEX_PAGE_PIECES],
            next: Some((5 << 21, 60)),
        };
        let bytes = first.encode();
        assert!(
            bytes.len() as u64 <= INDEX_PAGE_BYTES,
            "{} bytes",
            bytes.len()
        );
        assert_eq!(SnapshotIndex::decode(&bytes).unwrap(), first);
        // A page names part of the snapshot, never more than all of it.
        let last = SnapshotIndex {
            total: 300 << 20,
            pieces: vec![(7 << 21, 1 << 20)],
            next: None,
        };
        assert_eq!(SnapshotIndex::decode(&last.encode()).unwrap(), last);
        let over = SnapshotIndex {
            total: 1 << 19,
            ..last
        };
        let err = SnapshotIndex::decode(&over.encode())
            .unwrap_err()
            .to_string();
        assert!(err.contains("add up to 1048576 bytes"), "{err}");
        let bad_next = SnapshotIndex {
            next: Some((0, 60)),
            ..first
        };
        let err = SnapshotIndex::decode(&bad_next.encode())
            .unwrap_err()
            .to_string();
        assert!(err.contains("next page at 0"), "{err}");
    }
}
