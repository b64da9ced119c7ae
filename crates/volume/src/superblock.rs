//! The superblock at offset 0 of every device: which volume the device belongs to, its
//! place in it, and the layout of its space. Byte layout: docs/format/volume.md.
//!
//! Commit protocol: format zeroes the magic and persists, writes and persists every other
//! field (the CRC covers bytes 8..124), then stores the magic — one aligned 8-byte store —
//! and persists. A device whose magic is absent was never formatted or was interrupted; one
//! whose CRC does not match was damaged. Neither opens.
//!
//! A superblock that changes after format (`locus extend` raises every device's
//! `device_count`) is rewritten through a copy at [`COPY_OFFSET`]: the copy is written and
//! persisted with the same protocol, then the superblock, then the copy's magic is cleared.
//! A crash during the rewrite of the superblock leaves the copy whole, and
//! [`Superblock::read_with_copy`] takes it when the superblock itself is absent or torn.

use pmem::Region;

use crate::buddy::PAGE_BYTES;
use crate::error::{Result, VolumeError};

/// `LOCUSVOL`, little-endian, as the commit word.
pub const MAGIC: u64 = u64::from_le_bytes(*b"LOCUSVOL");
/// The only format version so far.
pub const VERSION: u32 = 1;
/// Bytes of the encoded superblock.
pub const SUPERBLOCK_BYTES: usize = 128;
/// Where allocatable space starts: 2 MiB, so the buddy allocator's largest blocks are
/// aligned on the device. Bytes 4 KiB..2 MiB are the owner area (see `Volume::owner_area`).
pub const DATA_OFFSET_BYTES: u64 = 2 << 20;
/// Smallest device: the reserved area plus one largest block.
pub const MIN_DEVICE_BYTES: u64 = DATA_OFFSET_BYTES + (2 << 20);
/// `node_at_format` for a device whose node is unknown.
pub const NO_NODE: u32 = u32::MAX;

/// Where a superblock's copy lives while the superblock is rewritten in place: in the
/// zero bytes between the superblock and the owner area.
pub const COPY_OFFSET: u64 = 2048;

const _: () = assert!(SUPERBLOCK_BYTES == 128);
const _: () = assert!(COPY_OFFSET >= SUPERBLOCK_BYTES as u64 && COPY_OFFSET + 128 <= 4096);
const CRC_OFFSET: usize = 124;
const CRC_START: usize = 8;

/// One device's superblock, decoded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Superblock {
    /// Identifies the volume; every device of a volume has the same one.
    pub volume_uuid: [u8; 16],
    /// This device's index in the volume (the high byte of its global addresses).
    pub device_index: u32,
    /// How many devices the volume has.
    pub device_count: u32,
    /// The NUMA node the device was on when formatted (`NO_NODE` if unknown).
    pub node_at_format: u32,
    /// Allocation unit (always 4096).
    pub block_bytes: u32,
    /// Device size the volume uses: at format, or as `locus extend --grow` last recorded.
    pub capacity_bytes: u64,
    /// First allocatable byte.
    pub data_offset_bytes: u64,
    /// Allocatable bytes from `data_offset_bytes` (a multiple of `block_bytes`).
    pub data_bytes: u64,
    /// When the volume was formatted, ns since the Unix epoch.
    pub format_unix_ns: u64,
}

/// The allocatable bytes of a device of `capacity_bytes`: whole pages after the data offset.
fn data_bytes(capacity_bytes: u64) -> u64 {
    (capacity_bytes.saturating_sub(DATA_OFFSET_BYTES) / PAGE_BYTES) * PAGE_BYTES
}

impl Superblock {
    /// A superblock for device `device_index` of `device_count`, with the layout derived from
    /// the device's size.
    pub fn new(
        volume_uuid: [u8; 16],
        device_index: u32,
        device_count: u32,
        node_at_format: Option<u32>,
        capacity_bytes: u64,
        format_unix_ns: u64,
    ) -> Self {
        Self {
            volume_uuid,
            device_index,
            device_count,
            node_at_format: node_at_format.unwrap_or(NO_NODE),
            block_bytes: PAGE_BYTES as u32,
            capacity_bytes,
            data_offset_bytes: DATA_OFFSET_BYTES,
            data_bytes: data_bytes(capacity_bytes),
            format_unix_ns,
        }
    }

    /// This superblock for the device grown to `capacity_bytes` (its data area with it).
    pub fn grown(&self, capacity_bytes: u64) -> Self {
        Self {
            capacity_bytes,
            data_bytes: data_bytes(capacity_bytes),
            ..self.clone()
        }
    }

    /// The node recorded at format.
    pub fn node(&self) -> Option<u32> {
        (self.node_at_format != NO_NODE).then_some(self.node_at_format)
    }

    /// Encodes the superblock (magic included, CRC computed).
    pub fn encode(&self) -> [u8; SUPERBLOCK_BYTES] {
        let mut bytes = [0u8; SUPERBLOCK_BYTES];
        bytes[0..8].copy_from_slice(&MAGIC.to_le_bytes());
        bytes[8..12].copy_from_slice(&VERSION.to_le_bytes());
        bytes[12..16].copy_from_slice(&(SUPERBLOCK_BYTES as u32).to_le_bytes());
        bytes[16..32].copy_from_slice(&self.volume_uuid);
        bytes[32..36].copy_from_slice(&self.device_index.to_le_bytes());
        bytes[36..40].copy_from_slice(&self.device_count.to_le_bytes());
        bytes[40..44].copy_from_slice(&self.node_at_format.to_le_bytes());
        bytes[44..48].copy_from_slice(&self.block_bytes.to_le_bytes());
        bytes[48..56].copy_from_slice(&self.capacity_bytes.to_le_bytes());
        bytes[56..64].copy_from_slice(&self.data_offset_bytes.to_le_bytes());
        bytes[64..72].copy_from_slice(&self.data_bytes.to_le_bytes());
        bytes[72..80].copy_from_slice(&self.format_unix_ns.to_le_bytes());
        let crc = crc32c::crc32c(&bytes[CRC_START..CRC_OFFSET]);
        bytes[CRC_OFFSET..].copy_from_slice(&crc.to_le_bytes());
        bytes
    }

    /// Decodes and checks a superblock read from `device` (its path, for messages) of
    /// `device_bytes` bytes.
    pub fn decode(bytes: &[u8; SUPERBLOCK_BYTES], device: &str, device_bytes: u64) -> Result<Self> {
        let u32_at = |at: usize| u32::from_le_bytes(bytes[at..at + 4].try_into().expect("4 bytes"));
        let u64_at = |at: usize| u64::from_le_bytes(bytes[at..at + 8].try_into().expect("8 bytes"));
        let bad = |field: &'static str, problem: String| VolumeError::BadSuperblock {
            device: device.to_owned(),
            field,
            problem,
        };
        if u64_at(0) != MAGIC {
            return Err(VolumeError::NotFormatted {
                device: device.to_owned(),
            });
        }
        let version = u32_at(8);
        if version != VERSION {
            return Err(bad(
                "version",
                format!("{version}; this locus reads version {VERSION}"),
            ));
        }
        let crc = u32_at(CRC_OFFSET);
        let computed = crc32c::crc32c(&bytes[CRC_START..CRC_OFFSET]);
        if crc != computed {
            return Err(bad(
                "crc32c",
                format!("stored {crc:#010x}, computed {computed:#010x} (damaged)"),
            ));
        }
        let header_bytes = u32_at(12);
        if header_bytes as usize != SUPERBLOCK_BYTES {
            return Err(bad(
                "header_bytes",
                format!("{header_bytes}, expected {SUPERBLOCK_BYTES}"),
            ));
        }
        if bytes[80..CRC_OFFSET].iter().any(|&b| b != 0) {
            return Err(bad("reserved", "bytes 80..124 must be zero".into()));
        }
        let superblock = Self {
            volume_uuid: bytes[16..32].try_into().expect("16 bytes"),
            device_index: u32_at(32),
            device_count: u32_at(36),
            node_at_format: u32_at(40),
            block_bytes: u32_at(44),
            capacity_bytes: u64_at(48),
            data_offset_bytes: u64_at(56),
            data_bytes: u64_at(64),
            format_unix_ns: u64_at(72),
        };
        if superblock.volume_uuid == [0; 16] {
            return Err(bad("volume_uuid", "all zero".into()));
        }
        if superblock.device_count == 0 || superblock.device_count > crate::address::MAX_DEVICES {
            return Err(bad(
                "device_count",
                format!("{} is not in 1..=256", superblock.device_count),
            ));
        }
        if superblock.device_index >= superblock.device_count {
            return Err(bad(
                "device_index",
                format!(
                    "{} is not below device_count {}",
                    superblock.device_index, superblock.device_count
                ),
            ));
        }
        if u64::from(superblock.block_bytes) != PAGE_BYTES {
            return Err(bad(
                "block_bytes",
                format!("{}, expected {PAGE_BYTES}", superblock.block_bytes),
            ));
        }
        // Larger is a device `locus extend --grow` lengthened and stopped before recording
        // (the rest is unused until it does); smaller, one that lost its end.
        if superblock.capacity_bytes > device_bytes {
            return Err(bad(
                "capacity_bytes",
                format!(
                    "{} but the device has {device_bytes} bytes (shrunk or wrong device)",
                    superblock.capacity_bytes
                ),
            ));
        }
        if superblock.data_offset_bytes != DATA_OFFSET_BYTES {
            return Err(bad(
                "data_offset_bytes",
                format!(
                    "{}, expected {DATA_OFFSET_BYTES}",
                    superblock.data_offset_bytes
                ),
            ));
        }
        let room = superblock
            .capacity_bytes
            .saturating_sub(superblock.data_offset_bytes);
        if superblock.data_bytes == 0
            || !superblock.data_bytes.is_multiple_of(PAGE_BYTES)
            || superblock.data_bytes > room
        {
            return Err(bad(
                "data_bytes",
                format!(
                    "{} does not fit the {room} bytes after the data offset in whole pages",
                    superblock.data_bytes
                ),
            ));
        }
        Ok(superblock)
    }

    /// Reads and checks the superblock of `region` ([`Superblock::read_with_copy`]).
    pub fn read(region: &Region, device: &str) -> Result<Self> {
        Ok(Self::read_with_copy(region, device)?.0)
    }

    /// Reads and checks the superblock of `region`; when it is absent or fails its CRC and
    /// a whole copy is there (a rewrite was interrupted: [`Superblock::rewrite`]), the copy,
    /// with `true`. Any other problem of the superblock is its error, copy or not.
    pub fn read_with_copy(region: &Region, device: &str) -> Result<(Self, bool)> {
        let mut bytes = [0u8; SUPERBLOCK_BYTES];
        region.read(0, &mut bytes)?;
        let error = match Self::decode(&bytes, device, region.len()) {
            Ok(superblock) => return Ok((superblock, false)),
            Err(error) => error,
        };
        let torn = matches!(
            &error,
            VolumeError::NotFormatted { .. }
                | VolumeError::BadSuperblock {
                    field: "crc32c",
                    ..
                }
        );
        if torn && region.len() >= COPY_OFFSET + SUPERBLOCK_BYTES as u64 {
            region.read(COPY_OFFSET, &mut bytes)?;
            if let Ok(copy) = Self::decode(&bytes, device, region.len()) {
                return Ok((copy, true));
            }
        }
        Err(error)
    }

    /// Writes this superblock to a device being formatted, with the commit protocol in the
    /// module docs. A copy left by an interrupted rewrite is cleared first: it belongs to
    /// whatever the device held before.
    pub fn write(&self, region: &Region) -> Result<()> {
        region.store_u64(COPY_OFFSET, 0)?;
        region.persist(COPY_OFFSET, 8)?;
        self.write_at(region, 0)
    }

    /// Replaces the superblock of a device that holds a volume, so that a crash at any
    /// point leaves either the old superblock or this one readable
    /// ([`Superblock::read_with_copy`]): the copy first, then the superblock, then the
    /// copy's magic cleared.
    pub fn rewrite(&self, region: &Region) -> Result<()> {
        self.write_at(region, COPY_OFFSET)?;
        self.write_at(region, 0)?;
        region.store_u64(COPY_OFFSET, 0)?;
        region.persist(COPY_OFFSET, 8)?;
        Ok(())
    }

    /// The commit protocol at `at`: magic cleared, the fields, the magic, each persisted.
    fn write_at(&self, region: &Region, at: u64) -> Result<()> {
        let bytes = self.encode();
        region.store_u64(at, 0)?;
        region.persist(at, 8)?;
        region.write(at + 8, &bytes[8..])?;
        region.persist(at + 8, (SUPERBLOCK_BYTES - 8) as u64)?;
        region.store_u64(at, MAGIC)?;
        region.persist(at, 8)?;
        Ok(())
    }
}
