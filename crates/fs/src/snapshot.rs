//! Snapshots: the whole metadata (namespace, extent maps, sizes, how far each data log is
//! retired) written to a fresh extent, which a new root then names. A snapshot lets every
//! journal start again empty. Byte layout: docs/format/fs-metadata.md.

use crate::codec::{Decoder, Encoder};
use crate::error::Result;
use crate::extent_map::Run;
use crate::journal::Kind;

/// `LOCUSSNP`.
pub const SNAPSHOT_MAGIC: u64 = u64::from_le_bytes(*b"LOCUSSNP");
/// Format version.
pub const SNAPSHOT_VERSION: u32 = 1;

/// `LOCUSSNX`: a snapshot index, which the root names instead of the snapshot when no single
/// extent could hold the snapshot (free memory left in pieces).
pub const INDEX_MAGIC: u64 = u64::from_le_bytes(*b"LOCUSSNX");
/// Index format version.
pub const INDEX_VERSION: u32 = 1;
/// Most pieces one index names.
pub const MAX_PIECES: u32 = 1 << 16;

/// Where a snapshot's bytes lie when they are in pieces: `(global address, length)` of each
/// piece, in order; the snapshot is their concatenation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SnapshotIndex {
    /// Length of the snapshot (the sum of the pieces).
    pub total: u64,
    /// The pieces, in order.
    pub pieces: Vec<(u64, u64)>,
}

impl SnapshotIndex {
    /// Encodes it, checksum last.
    pub fn encode(&self) -> Vec<u8> {
        let mut e = Encoder::default();
        e.u64(INDEX_MAGIC)
            .u32(INDEX_VERSION)
            .u32(self.pieces.len() as u32)
            .u64(self.total);
        for &(addr, len) in &self.pieces {
            e.u64(addr).u64(len);
        }
        let crc = crc32c::crc32c(&e.0);
        e.u32(crc);
        e.0
    }

    /// Decodes and checks an index; every failure names what is wrong.
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
        if version != INDEX_VERSION {
            return Err(d.error(format!("version {version}, expected {INDEX_VERSION}")));
        }
        let count = d.u32("piece count")?;
        if count == 0 || count > MAX_PIECES {
            return Err(d.error(format!("{count} pieces; 1..={MAX_PIECES}")));
        }
        let total = d.u64("total length")?;
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
        if sum != total {
            return Err(d.error(format!(
                "pieces add up to {sum} bytes, the index says {total}"
            )));
        }
        Ok(Self { total, pieces })
    }
}

/// One inode as a snapshot stores it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InodeImage {
    /// Number.
    pub ino: u64,
    /// File or directory.
    pub kind: Kind,
    /// Permission bits.
    pub mode: u32,
    /// Modification time (ns).
    pub mtime: u64,
    /// Size in bytes (files).
    pub size: u64,
    /// Parent directory (directories; 0 for files).
    pub parent: u64,
    /// Entries (directories).
    pub entries: Vec<(String, u64)>,
    /// Extent map (files).
    pub runs: Vec<Run>,
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

impl Snapshot {
    /// Encodes it, checksum last.
    pub fn encode(&self) -> Vec<u8> {
        let mut e = Encoder::default();
        e.u64(SNAPSHOT_MAGIC).u32(SNAPSHOT_VERSION).u32(0);
        e.u64(self.epoch)
            .u64(self.next_ino)
            .u64(self.next_order)
            .u32(self.retired.len() as u32)
            .u64(self.inodes.len() as u64);
        for r in &self.retired {
            e.u64(*r);
        }
        for inode in &self.inodes {
            e.u64(inode.ino)
                .u8(match inode.kind {
                    Kind::File => 1,
                    Kind::Dir => 2,
                })
                .u32(inode.mode)
                .u64(inode.mtime)
                .u64(inode.size)
                .u64(inode.parent)
                .u64(inode.entries.len() as u64)
                .u64(inode.runs.len() as u64);
            for (name, ino) in &inode.entries {
                e.name(name).u64(*ino);
            }
            for run in &inode.runs {
                e.u64(run.file_block).u64(run.blocks).u64(run.addr);
            }
        }
        let crc = crc32c::crc32c(&e.0);
        e.u32(crc);
        e.0
    }

    /// Decodes and checks a snapshot; every failure names what is wrong.
    pub fn decode(bytes: &[u8]) -> Result<Self> {
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
        if version != SNAPSHOT_VERSION {
            return Err(d.error(format!("version {version}, expected {SNAPSHOT_VERSION}")));
        }
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
        let mut inodes = Vec::new();
        for _ in 0..count {
            let ino = d.u64("ino")?;
            let kind = match d.u8("kind")? {
                1 => Kind::File,
                2 => Kind::Dir,
                other => return Err(d.error(format!("inode {ino} has unknown kind {other}"))),
            };
            let mode = d.u32("mode")?;
            let mtime = d.u64("mtime")?;
            let size = d.u64("size")?;
            let parent = d.u64("parent")?;
            let entry_count = d.u64("entry count")?;
            let run_count = d.u64("run count")?;
            if entry_count.saturating_add(run_count) > d.remaining() as u64 {
                return Err(d.error(format!("inode {ino} claims more entries than bytes left")));
            }
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
                if run.blocks == 0 || run.file_block.checked_add(run.blocks).is_none() {
                    return Err(d.error(format!("inode {ino} has an invalid run {run:?}")));
                }
                runs.push(run);
            }
            inodes.push(InodeImage {
                ino,
                kind,
                mode,
                mtime,
                size,
                parent,
                entries,
                runs,
            });
        }
        if d.remaining() != 0 {
            return Err(d.error(format!("{} bytes left after the last inode", d.remaining())));
        }
        Ok(Self {
            epoch,
            next_ino,
            next_order,
            retired,
            inodes,
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
                    mtime: 1,
                    size: 0,
                    parent: 1,
                    entries: vec![("f".into(), 2)],
                    runs: vec![],
                },
                InodeImage {
                    ino: 2,
                    kind: Kind::File,
                    mode: 0o644,
                    mtime: 2,
                    size: 10_000,
                    parent: 0,
                    entries: vec![],
                    runs: vec![Run {
                        file_block: 0,
                        blocks: 3,
                        addr: 1 << 21,
                    }],
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

    #[test]
    fn an_index_round_trips_and_rejects_every_flipped_byte_and_bad_sums() {
        let index = SnapshotIndex {
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
            total: 5,
            pieces: vec![(0, 4)],
        };
        let err = SnapshotIndex::decode(&short.encode())
            .unwrap_err()
            .to_string();
        assert!(err.contains("add up to 4 bytes, the index says 5"), "{err}");
        let empty = SnapshotIndex {
            total: 0,
            pieces: vec![(0, 0)],
        };
        let err = SnapshotIndex::decode(&empty.encode())
            .unwrap_err()
            .to_string();
        assert!(err.contains("piece 0 is empty"), "{err}");
    }
}
