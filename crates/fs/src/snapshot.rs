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
}
