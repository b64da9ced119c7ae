//! Data checksums (`locus format --data-checksums`): a crc32c for every 4 KiB block of file
//! data, kept by the block's place on its device, in a table on that device.
//!
//! Why by place and not with the extent maps and log records: a block of data is written
//! only while nothing refers to it yet — a writer fills its buffer before the record that
//! names it is logged, and the checkpoint builds a partial block in a fresh page before the
//! batch that maps it commits — and it is never written again until it is freed (with
//! checksums on, writers never share a buffer block and the checkpoint never copies into a
//! file's block in place). So the block's entry is written with its data, both made durable
//! by the fence that precedes the record or batch; a crash before that leaves a block
//! nothing names, whose entry nobody reads. Remapping a block into a file moves no data and
//! needs no new entry; the maps, journals, snapshot and log formats stay as they are.
//!
//! A block's entry covers all 4096 bytes as they were when its writer was done (the bytes a
//! partial write did not store included). Reads verify every block they touch; a mismatch
//! is an error naming the file and offset, never bad bytes returned. When the checkpoint
//! builds a new block from one that fails its check, the new block's entry is *poisoned*
//! (the complement of its crc), so the damage stays visible instead of being blessed.
//!
//! Layout (docs/format/fs-metadata.md): the root names a one-block directory listing, per
//! device, the table's global address and entry count; a table is little-endian u32
//! entries, entry `i` for the block at byte `i * 4096` of its device.

use pmem::Region;
use volume::{Extent, GlobalAddress, Volume};

use crate::codec::{Decoder, Encoder};
use crate::error::{FsError, Result};
use crate::extent_map::BLOCK;

/// `LOCUSCKD`.
pub const DIR_MAGIC: u64 = u64::from_le_bytes(*b"LOCUSCKD");
/// Directory format version.
pub const DIR_VERSION: u32 = 1;
/// Bytes of the directory.
pub const DIR_BYTES: u64 = BLOCK;
const DIR_HEADER: usize = 16;
const DIR_ENTRY: usize = 24;
/// Devices one directory can name.
pub const MAX_DEVICES: usize = (DIR_BYTES as usize - DIR_HEADER - 4) / DIR_ENTRY;
/// Bytes of one table entry.
const ENTRY_BYTES: u64 = 4;

/// The crc32c of one block.
pub(crate) fn block_crc(block: &[u8]) -> u32 {
    debug_assert_eq!(block.len() as u64, BLOCK);
    crc32c::crc32c(block)
}

/// One device's table: `blocks` entries at the global address `addr`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct TableArea {
    device: u32,
    addr: u64,
    blocks: u64,
}

fn encode_dir(areas: &[TableArea]) -> Vec<u8> {
    let mut e = Encoder::default();
    e.u64(DIR_MAGIC).u32(DIR_VERSION).u32(areas.len() as u32);
    for a in areas {
        e.u32(a.device).u32(0).u64(a.addr).u64(a.blocks);
    }
    e.0.resize(DIR_BYTES as usize - 4, 0);
    let crc = crc32c::crc32c(&e.0);
    e.u32(crc);
    e.0
}

fn decode_dir(bytes: &[u8]) -> Result<Vec<TableArea>> {
    const WHAT: &str = "data-checksum directory";
    let mut d = Decoder::new(bytes, WHAT);
    if d.u64("magic")? != DIR_MAGIC {
        return Err(d.error("magic is not LOCUSCKD"));
    }
    let body = &bytes[..DIR_BYTES as usize - 4];
    let crc = u32::from_le_bytes(bytes[DIR_BYTES as usize - 4..].try_into().expect("4"));
    if crc != crc32c::crc32c(body) {
        return Err(d.error("crc32c mismatch"));
    }
    let version = d.u32("version")?;
    if version != DIR_VERSION {
        return Err(d.error(format!("version {version}, expected {DIR_VERSION}")));
    }
    let count = d.u32("count")? as usize;
    if count == 0 || count > MAX_DEVICES {
        return Err(d.error(format!(
            "field `count` is {count}; a directory names 1..={MAX_DEVICES} tables"
        )));
    }
    let mut areas = Vec::with_capacity(count);
    for i in 0..count {
        let device = d.u32("device")?;
        d.u32("reserved")?;
        let addr = d.u64("table address")?;
        let blocks = d.u64("table blocks")?;
        if device as usize != i {
            return Err(d.error(format!("table {i} names device {device}")));
        }
        if blocks == 0 || addr % BLOCK != 0 {
            return Err(d.error(format!(
                "table {i} is {blocks} entries at {}",
                GlobalAddress::from_raw(addr)
            )));
        }
        areas.push(TableArea {
            device,
            addr,
            blocks,
        });
    }
    Ok(areas)
}

/// The volume's checksum tables, open.
#[derive(Debug)]
pub(crate) struct Checksums {
    /// Per device (by index): its table.
    tables: Vec<(Region, u64)>,
    /// The directory and the tables: memory the file system owns.
    areas: Vec<Extent>,
}

/// Bytes of the table of a device of `blocks` blocks (whole blocks).
fn table_len(blocks: u64) -> u64 {
    (blocks * ENTRY_BYTES).next_multiple_of(BLOCK)
}

/// Volume memory the tables of `volume`'s devices and their directory take.
pub(crate) fn table_bytes(volume: &Volume) -> Result<u64> {
    let mut bytes = DIR_BYTES;
    for device in 0..volume.device_count() {
        bytes += table_len(volume.device_region(device)?.len() / BLOCK);
    }
    Ok(bytes)
}

/// A zeroed, persisted table for each of `devices`, on that device, added to `areas` and
/// (the memory it takes) `extents`.
fn add_zeroed_tables(
    volume: &Volume,
    devices: std::ops::Range<u32>,
    areas: &mut Vec<TableArea>,
    extents: &mut Vec<Extent>,
) -> Result<()> {
    for device in devices {
        let blocks = volume.device_region(device)?.len() / BLOCK;
        let bytes = table_len(blocks);
        let extent = volume.alloc_on(device, bytes)?;
        let region = volume.region(&extent)?;
        region.fill(0, bytes, 0)?;
        region.persist(0, bytes)?;
        areas.push(TableArea {
            device,
            addr: extent.start.raw(),
            blocks,
        });
        extents.push(extent);
    }
    Ok(())
}

/// A table of `blocks` entries for the device of `area`, which grew past it: on that
/// device, the old table's entries copied and the rest zeroed, persisted; `area` then names
/// it. Returns the memory it takes.
fn grow_table(volume: &Volume, area: &mut TableArea, blocks: u64) -> Result<Extent> {
    let old = Extent {
        start: GlobalAddress::from_raw(area.addr),
        len_bytes: table_len(area.blocks),
    };
    let bytes = table_len(blocks);
    let extent = volume.alloc_on(area.device, bytes)?;
    let region = volume.region(&extent)?;
    let kept = area.blocks * ENTRY_BYTES;
    // Mapping to mapping, no buffer: a large device's table is GiBs (4 bytes per 4 KiB block).
    region.copy_nt_from(0, &volume.region(&old)?, 0, kept)?;
    region.fill(kept, bytes - kept, 0)?;
    region.persist(0, bytes)?;
    area.addr = extent.start.raw();
    area.blocks = blocks;
    Ok(extent)
}

/// The directory at `dir`: its extent and the tables it names.
fn read_dir(volume: &Volume, dir: u64) -> Result<(Extent, Vec<TableArea>)> {
    let extent = Extent {
        start: GlobalAddress::from_raw(dir),
        len_bytes: DIR_BYTES,
    };
    let mut bytes = vec![0u8; DIR_BYTES as usize];
    volume.region(&extent)?.read(0, &mut bytes)?;
    Ok((extent, decode_dir(&bytes)?))
}

/// A persisted directory naming `areas`, on device 0 (the root's), else where there is room.
fn write_dir(volume: &Volume, areas: &[TableArea]) -> Result<Extent> {
    let dir = volume
        .alloc_on(0, DIR_BYTES)
        .or_else(|_| volume.alloc_local(DIR_BYTES))?;
    let region = volume.region(&dir)?;
    region.write(0, &encode_dir(areas))?;
    region.persist(0, DIR_BYTES)?;
    Ok(dir)
}

impl Checksums {
    /// Makes a table for every device of `volume`, each on its own device, zeroed, and the
    /// directory naming them; returns the directory's address. (Format: nothing is owned
    /// yet; the caller frees the extents again before opening, which marks them owned.)
    pub(crate) fn create(volume: &Volume) -> Result<(u64, Vec<Extent>)> {
        let devices = volume.device_count() as usize;
        if devices > MAX_DEVICES {
            return Err(FsError::Invalid(format!(
                "data checksums support at most {MAX_DEVICES} devices; the volume has {devices}"
            )));
        }
        let mut areas = Vec::with_capacity(devices);
        let mut extents = Vec::with_capacity(devices + 1);
        add_zeroed_tables(volume, 0..devices as u32, &mut areas, &mut extents)?;
        let dir = write_dir(volume, &areas)?;
        extents.push(dir);
        Ok((dir.start.raw(), extents))
    }

    /// Opens the tables the directory at `dir` names, checking them against the volume: one
    /// per device, except — `adding` (only [`crate::Fs::add_device_tables`]) — devices
    /// `locus extend` added that have none yet, past the ones named.
    pub(crate) fn load(volume: &Volume, dir: u64, adding: bool) -> Result<Self> {
        let (dir_extent, areas) = read_dir(volume, dir)?;
        let devices = volume.device_count() as usize;
        if areas.len() != devices && !(adding && areas.len() < devices) {
            let problem = if areas.len() < devices {
                format!(
                    "it names {} tables; the volume has {devices} devices: the tables of the \
                     devices `locus extend` added are not made yet (`locus extend --volume DIR` \
                     makes them)",
                    areas.len()
                )
            } else {
                format!(
                    "it names {} tables; the volume has {devices} devices",
                    areas.len()
                )
            };
            return Err(FsError::corrupt("data-checksum directory", problem));
        }
        let mut tables = Vec::with_capacity(areas.len());
        let mut extents = vec![dir_extent];
        for area in &areas {
            let device_blocks = volume.device_region(area.device)?.len() / BLOCK;
            if area.blocks < device_blocks && !adding {
                return Err(FsError::corrupt(
                    "data-checksum directory",
                    format!(
                        "the table of device {} has {} entries; the device has {device_blocks} \
                         blocks: it grew, and its table is not grown yet (`locus extend \
                         --volume DIR` grows it)",
                        area.device, area.blocks
                    ),
                ));
            }
            if area.blocks > device_blocks {
                return Err(FsError::corrupt(
                    "data-checksum directory",
                    format!(
                        "the table of device {} has {} entries; the device has {device_blocks} blocks",
                        area.device, area.blocks
                    ),
                ));
            }
            let extent = Extent {
                start: GlobalAddress::from_raw(area.addr),
                len_bytes: table_len(area.blocks),
            };
            tables.push((volume.region(&extent)?, area.blocks));
            extents.push(extent);
        }
        Ok(Self {
            tables,
            areas: extents,
        })
    }

    /// Tables for the devices past those the directory at `dir` names (added by `locus
    /// extend`), each on its own device and zeroed (their blocks hold no data yet), larger
    /// tables for the devices that grew past theirs (`locus extend --grow`: the old entries
    /// copied, the new blocks' zeroed), and a new directory naming every table, in memory
    /// the file system does not own (the caller marked what it owns; the old tables of grown
    /// devices become free once a root names the new directory). Persisted, not fenced.
    /// `None` when every device has a table of its size.
    pub(crate) fn add_tables(volume: &Volume, dir: u64) -> Result<Option<(u64, Vec<Extent>)>> {
        let (_, mut areas) = read_dir(volume, dir)?;
        let devices = volume.device_count() as usize;
        let mut extents = Vec::new();
        for area in areas.iter_mut() {
            let blocks = volume.device_region(area.device)?.len() / BLOCK;
            if area.blocks < blocks {
                extents.push(grow_table(volume, area, blocks)?);
            }
        }
        if areas.len() >= devices && extents.is_empty() {
            return Ok(None);
        }
        if devices > MAX_DEVICES {
            return Err(FsError::Invalid(format!(
                "data checksums support at most {MAX_DEVICES} devices; the volume has {devices}"
            )));
        }
        let first = areas.len() as u32;
        add_zeroed_tables(volume, first..devices as u32, &mut areas, &mut extents)?;
        extents.push(write_dir(volume, &areas)?);
        Ok(Some((
            extents.last().expect("the directory").start.raw(),
            extents,
        )))
    }

    /// The directory and the tables (memory the file system owns).
    pub(crate) fn areas(&self) -> &[Extent] {
        &self.areas
    }

    fn entry(&self, block_addr: u64) -> Result<(&Region, u64)> {
        let at = GlobalAddress::from_raw(block_addr);
        let bad = || {
            FsError::corrupt(
                "data block address",
                format!("{at} has no data-checksum entry"),
            )
        };
        let (region, blocks) = self.tables.get(at.device() as usize).ok_or_else(bad)?;
        let index = at.offset() / BLOCK;
        if index >= *blocks {
            return Err(bad());
        }
        Ok((region, index * ENTRY_BYTES))
    }

    /// Stores the entries of consecutive blocks from `first_block_addr` (durable at the
    /// next fence).
    pub(crate) fn store(&self, first_block_addr: u64, crcs: &[u32]) -> Result<()> {
        debug_assert!(first_block_addr.is_multiple_of(BLOCK));
        let (region, at) = self.entry(first_block_addr)?;
        let mut bytes = [0u8; 64];
        for (i, chunk) in crcs.chunks(16).enumerate() {
            for (j, crc) in chunk.iter().enumerate() {
                bytes[j * 4..j * 4 + 4].copy_from_slice(&crc.to_le_bytes());
            }
            region.write_nt(at + (i * 64) as u64, &bytes[..chunk.len() * 4])?;
        }
        Ok(())
    }

    /// The entry of the block at `block_addr`.
    pub(crate) fn expected(&self, block_addr: u64) -> Result<u32> {
        let (region, at) = self.entry(block_addr)?;
        let mut bytes = [0u8; 4];
        region.read(at, &mut bytes)?;
        Ok(u32::from_le_bytes(bytes))
    }

    /// Whether `block` (4096 bytes, as read from `block_addr`) matches its entry.
    pub(crate) fn matches(&self, block_addr: u64, block: &[u8]) -> Result<bool> {
        Ok(self.expected(block_addr)? == block_crc(block))
    }
}

/// The entry for a block built from data that failed its own check: never matches.
pub(crate) fn poisoned(crc: u32) -> u32 {
    !crc
}

#[cfg(test)]
mod tests {
    use super::*;

    fn areas() -> Vec<TableArea> {
        vec![
            TableArea {
                device: 0,
                addr: 1 << 21,
                blocks: 4096,
            },
            TableArea {
                device: 1,
                addr: (1 << 56) | (1 << 21),
                blocks: 8192,
            },
        ]
    }

    #[test]
    fn a_directory_round_trips() {
        assert_eq!(decode_dir(&encode_dir(&areas())).unwrap(), areas());
    }

    #[test]
    fn every_damaged_directory_is_named() {
        let good = encode_dir(&areas());
        let mut flipped = good.clone();
        flipped[20] ^= 1;
        let e = decode_dir(&flipped).unwrap_err().to_string();
        assert!(e.contains("crc32c mismatch"), "{e}");
        let mut magic = good.clone();
        magic[0] ^= 1;
        let e = decode_dir(&magic).unwrap_err().to_string();
        assert!(e.contains("magic"), "{e}");
        // Well-formed but wrong: a table naming the wrong device, an empty directory.
        let mut swapped = areas();
        swapped[1].device = 0;
        let e = decode_dir(&encode_dir(&swapped)).unwrap_err().to_string();
        assert!(e.contains("table 1 names device 0"), "{e}");
        let e = decode_dir(&encode_dir(&[])).unwrap_err().to_string();
        assert!(e.contains("`count` is 0"), "{e}");
        let mut unaligned = areas();
        unaligned[0].addr += 8;
        let e = decode_dir(&encode_dir(&unaligned)).unwrap_err().to_string();
        assert!(e.contains("table 0 is 4096 entries"), "{e}");
    }

    /// A grown table holds every old entry where it was, and zeros for the new blocks.
    #[test]
    fn a_grown_table_keeps_every_entry() {
        let tracer = pmem::Tracer::new();
        let volume =
            testkit::volume_over(vec![testkit::traced_volume_device(&tracer, 8 << 20)]).unwrap();
        let blocks = 1500;
        let old = volume.alloc_on(0, table_len(blocks)).unwrap();
        let entries: Vec<u8> = (0..blocks * ENTRY_BYTES)
            .map(|i| (i % 251) as u8 + 1)
            .collect();
        volume.region(&old).unwrap().write(0, &entries).unwrap();
        let mut area = TableArea {
            device: 0,
            addr: old.start.raw(),
            blocks,
        };
        let grown = grow_table(&volume, &mut area, 2048).unwrap();
        assert_eq!((area.addr, area.blocks), (grown.start.raw(), 2048));
        assert_eq!(grown.len_bytes, table_len(2048));
        let mut got = vec![0xffu8; table_len(2048) as usize];
        volume.region(&grown).unwrap().read(0, &mut got).unwrap();
        assert!(got[..entries.len()] == entries[..], "old entries changed");
        assert!(
            got[entries.len()..].iter().all(|&b| b == 0),
            "new entries not zero"
        );
    }

    #[test]
    fn a_poisoned_entry_never_matches() {
        let block = vec![7u8; BLOCK as usize];
        let crc = block_crc(&block);
        assert_ne!(poisoned(crc), crc);
    }
}
