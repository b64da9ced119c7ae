//! The file system's root: the one structure found without any pointer. Two copies sit at
//! the start of device 0's owner area; a change writes the copy not in use with the next
//! generation and persists it, so a torn write leaves the other copy as the root. Byte
//! layout: docs/format/fs-metadata.md.

use pmem::Region;

use crate::codec::{Decoder, Encoder};
use crate::error::{FsError, Result};
use crate::extent_map::BLOCK;

/// `LOCUSFS1`.
pub const ROOT_MAGIC: u64 = u64::from_le_bytes(*b"LOCUSFS1");
/// Format version: 2 adds `features` and the data-checksum directory.
pub const ROOT_VERSION: u32 = 2;
/// The version before data checksums (still read, as a root without them).
const ROOT_VERSION_WITHOUT_FEATURES: u32 = 1;
/// `features` bit: every data block has a crc32c in the checksum tables.
pub const FEATURE_DATA_CHECKSUMS: u32 = 1;
/// Every feature bit this version knows.
const KNOWN_FEATURES: u32 = FEATURE_DATA_CHECKSUMS;
/// Bytes of one root copy.
pub const ROOT_BYTES: u64 = 4096;
/// Most thread slots a root can describe.
pub const MAX_SLOTS: u32 = 120;
const HEADER_BYTES: usize = 128;
const SLOT_BYTES: usize = 32;
const _: () = assert!(HEADER_BYTES + MAX_SLOTS as usize * SLOT_BYTES + 4 <= ROOT_BYTES as usize);

/// The persistent areas of one thread slot (global addresses and lengths).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct SlotAreas {
    /// The data log area.
    pub log_addr: u64,
    /// Its length.
    pub log_len: u64,
    /// The metadata journal.
    pub journal_addr: u64,
    /// Its length.
    pub journal_len: u64,
}

impl SlotAreas {
    /// Volume memory the two areas hold (each a whole number of blocks).
    pub fn bytes(&self) -> u64 {
        self.log_len.next_multiple_of(BLOCK) + self.journal_len.next_multiple_of(BLOCK)
    }
}

/// What the root says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Root {
    /// Bumped by every root change; the valid copy with the higher one is the root.
    pub generation: u64,
    /// Bumped by every snapshot: journal records carry the epoch they belong to.
    pub epoch: u64,
    /// The volume this file system belongs to.
    pub volume_uuid: [u8; 16],
    /// Global address of the snapshot.
    pub snapshot_addr: u64,
    /// Its length in bytes.
    pub snapshot_len: u64,
    /// Thread slots the file system may use.
    pub slot_limit: u32,
    /// Record slots of each new data log area.
    pub log_records: u64,
    /// Bytes of each new metadata journal.
    pub journal_bytes: u64,
    /// Range-lock granule of files (bytes).
    pub granule: u64,
    /// Areas of the slots created so far (index = slot).
    pub slots: Vec<SlotAreas>,
    /// Global address of the data-checksum directory ([`crate::checksums`]) when the file
    /// system was formatted with data checksums.
    pub checksums: Option<u64>,
}

impl Root {
    fn encode(&self) -> Vec<u8> {
        let mut e = Encoder::default();
        e.u64(ROOT_MAGIC)
            .u32(ROOT_VERSION)
            .u32(self.slot_limit)
            .u64(self.generation)
            .u64(self.epoch);
        e.0.extend_from_slice(&self.volume_uuid);
        e.u64(self.snapshot_addr)
            .u64(self.snapshot_len)
            .u64(self.log_records)
            .u64(self.journal_bytes)
            .u64(self.granule)
            .u32(self.slots.len() as u32);
        match self.checksums {
            Some(dir) => e.u32(FEATURE_DATA_CHECKSUMS).u64(dir),
            None => e.u32(0).u64(0),
        };
        e.pad_to(HEADER_BYTES);
        for slot in &self.slots {
            e.u64(slot.log_addr)
                .u64(slot.log_len)
                .u64(slot.journal_addr)
                .u64(slot.journal_len);
        }
        e.0.resize(ROOT_BYTES as usize - 4, 0);
        let crc = crc32c::crc32c(&e.0);
        e.u32(crc);
        e.0
    }

    fn decode(bytes: &[u8], structure: &str) -> Result<Self> {
        let body = &bytes[..ROOT_BYTES as usize - 4];
        let crc = u32::from_le_bytes(bytes[ROOT_BYTES as usize - 4..].try_into().expect("4"));
        let mut d = Decoder::new(bytes, structure);
        if d.u64("magic")? != ROOT_MAGIC {
            return Err(d.error("magic is not LOCUSFS1"));
        }
        if crc != crc32c::crc32c(body) {
            return Err(d.error("crc32c mismatch"));
        }
        let version = d.u32("version")?;
        if version != ROOT_VERSION && version != ROOT_VERSION_WITHOUT_FEATURES {
            return Err(d.error(format!(
                "version {version}, expected {ROOT_VERSION_WITHOUT_FEATURES} or {ROOT_VERSION}"
            )));
        }
        let slot_limit = d.u32("slot_limit")?;
        let generation = d.u64("generation")?;
        let epoch = d.u64("epoch")?;
        let volume_uuid: [u8; 16] = d.take(16, "volume_uuid")?.try_into().expect("16");
        let snapshot_addr = d.u64("snapshot_addr")?;
        let snapshot_len = d.u64("snapshot_len")?;
        let log_records = d.u64("log_records")?;
        let journal_bytes = d.u64("journal_bytes")?;
        let granule = d.u64("granule")?;
        let slot_count = d.u32("slot_count")?;
        let checksums = if version >= ROOT_VERSION {
            let features = d.u32("features")?;
            let dir = d.u64("checksum_dir")?;
            if features & !KNOWN_FEATURES != 0 {
                return Err(d.error(format!(
                    "field `features` has bits this version does not know: {features:#x}"
                )));
            }
            match (features & FEATURE_DATA_CHECKSUMS != 0, dir) {
                (true, 0) => {
                    return Err(d.error("data checksums are on but `checksum_dir` is 0"));
                }
                (true, dir) => Some(dir),
                (false, 0) => None,
                (false, _) => {
                    return Err(d.error("data checksums are off but `checksum_dir` is set"));
                }
            }
        } else {
            None
        };
        if slot_limit == 0 || slot_limit > MAX_SLOTS || slot_count > slot_limit {
            return Err(d.error(format!(
                "field `slot_count`/`slot_limit` is invalid: {slot_count} of {slot_limit} (most {MAX_SLOTS})"
            )));
        }
        if !granule.is_power_of_two() || !(4096..=2 << 20).contains(&granule) {
            return Err(d.error(format!("field `granule` is invalid: {granule}")));
        }
        if log_records == 0 || journal_bytes < 4096 || snapshot_len == 0 {
            return Err(d.error("field `log_records`, `journal_bytes` or `snapshot_len` is zero"));
        }
        let mut d = Decoder::new(&bytes[HEADER_BYTES..], structure);
        let mut slots = Vec::with_capacity(slot_count as usize);
        for _ in 0..slot_count {
            slots.push(SlotAreas {
                log_addr: d.u64("slot log_addr")?,
                log_len: d.u64("slot log_len")?,
                journal_addr: d.u64("slot journal_addr")?,
                journal_len: d.u64("slot journal_len")?,
            });
        }
        Ok(Self {
            generation,
            epoch,
            volume_uuid,
            snapshot_addr,
            snapshot_len,
            slot_limit,
            log_records,
            journal_bytes,
            granule,
            slots,
            checksums,
        })
    }

    /// Clears both copies (before format writes the first root).
    pub fn clear(area: &Region) -> Result<()> {
        area.fill(0, 2 * ROOT_BYTES, 0)?;
        area.persist(0, 2 * ROOT_BYTES)?;
        Ok(())
    }

    /// Writes this root into the copy its generation selects and persists it.
    pub fn write(&self, area: &Region) -> Result<()> {
        let at = (self.generation % 2) * ROOT_BYTES;
        area.write(at, &self.encode())?;
        area.persist(at, ROOT_BYTES)?;
        Ok(())
    }

    /// Writes the next generation of this root, with `change` made to it, into the copy not
    /// in use: the commit of a change to the root alone.
    pub fn write_next(&self, area: &Region, change: impl FnOnce(&mut Root)) -> Result<()> {
        let mut next = Root {
            generation: self.generation + 1,
            ..self.clone()
        };
        change(&mut next);
        next.write(area)
    }

    /// Reads the root — the valid copy with the higher generation; damage to both is an
    /// error (`NoFileSystem` when neither carries the magic) — and says what is wrong with the other copy, if
    /// anything: it may be a root update a crash cut short (harmless: the copy in use is the
    /// last committed one) or damage — which the caller tells apart by what the journals say.
    pub fn read_reporting(area: &Region) -> Result<(Self, Option<(u64, FsError)>)> {
        let mut best: Option<(u64, Root)> = None;
        let mut damage: Option<(u64, FsError)> = None;
        let mut magic_seen = false;
        for copy in 0..2u64 {
            let mut bytes = vec![0u8; ROOT_BYTES as usize];
            area.read(copy * ROOT_BYTES, &mut bytes)?;
            magic_seen |= bytes[..8] == ROOT_MAGIC.to_le_bytes();
            match Root::decode(&bytes, &format!("file-system root copy {copy}")) {
                Ok(root) if root.generation % 2 != copy => {
                    damage = Some((
                        copy,
                        FsError::corrupt(
                            format!("file-system root copy {copy}"),
                            format!("generation {} belongs in the other copy", root.generation),
                        ),
                    ));
                }
                Ok(root) => match &best {
                    Some((_, b)) if b.generation >= root.generation => {}
                    _ => best = Some((copy, root)),
                },
                Err(e) => damage = damage.or(Some((copy, e))),
            }
        }
        match (best, magic_seen) {
            (Some((copy, root)), _) => {
                // Only a copy that is neither the root nor valid is damage; a valid older
                // copy is simply the previous generation.
                let damage = damage.filter(|(c, _)| *c != copy);
                Ok((root, damage))
            }
            (None, false) => Err(FsError::NoFileSystem),
            (None, true) => Err(damage.expect("a copy failed").1),
        }
    }
}
