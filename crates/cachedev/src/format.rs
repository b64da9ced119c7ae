//! The NVRAM file's layout (docs/format/cache.md): a header block, the index (one 32-byte
//! entry per slot), then the slots, each one cached block. Encoders and checked decoders;
//! every decoding problem is an error naming the field or the entry.

use crate::error::{CacheError, Result};

/// The header's magic: "LOCUSCA1".
pub const MAGIC: [u8; 8] = *b"LOCUSCA1";
/// Layout version.
pub const VERSION: u32 = 1;
/// Bytes of one index entry.
pub const ENTRY_BYTES: usize = 32;
/// Bytes of the header (in a block of its own).
pub const HEADER_BYTES: usize = 64;
/// An index entry's magic ("CENT"), so a zeroed entry (never used) is told from a damaged one.
const ENTRY_MAGIC: u32 = u32::from_le_bytes(*b"CENT");
/// Entry states.
const FREE: u32 = 0;
const DIRTY: u32 = 1;

/// The header: what the file caches and how it is laid out.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Header {
    /// Bytes per cached block.
    pub block_bytes: u32,
    /// Slots (NVRAM blocks).
    pub slots: u32,
    /// Size of the backing store the file caches.
    pub backing_bytes: u64,
}

impl Header {
    /// Blocks the index takes (after the header block).
    pub fn index_blocks(&self) -> u64 {
        (u64::from(self.slots) * ENTRY_BYTES as u64).div_ceil(u64::from(self.block_bytes))
    }

    /// Byte offset of index entry `slot`.
    pub fn entry_offset(&self, slot: u32) -> u64 {
        u64::from(self.block_bytes) + u64::from(slot) * ENTRY_BYTES as u64
    }

    /// Byte offset of slot `slot`'s data.
    pub fn slot_offset(&self, slot: u32) -> u64 {
        (1 + self.index_blocks() + u64::from(slot)) * u64::from(self.block_bytes)
    }

    /// Bytes of the whole file.
    pub fn file_bytes(&self) -> u64 {
        self.slot_offset(self.slots)
    }

    pub fn encode(&self) -> [u8; HEADER_BYTES] {
        let mut b = [0u8; HEADER_BYTES];
        b[0..8].copy_from_slice(&MAGIC);
        b[8..12].copy_from_slice(&VERSION.to_le_bytes());
        b[12..16].copy_from_slice(&self.block_bytes.to_le_bytes());
        b[16..20].copy_from_slice(&self.slots.to_le_bytes());
        b[24..32].copy_from_slice(&self.backing_bytes.to_le_bytes());
        let crc = crc32c::crc32c(&b[..60]);
        b[60..64].copy_from_slice(&crc.to_le_bytes());
        b
    }

    pub fn decode(b: &[u8]) -> Result<Self> {
        let bad = |problem: String| CacheError::Format { problem };
        if b.len() < HEADER_BYTES {
            return Err(bad(format!(
                "the header is {} bytes, not {HEADER_BYTES}",
                b.len()
            )));
        }
        if b[0..8] != MAGIC {
            return Err(bad(format!(
                "no cache header (magic {:02x?}, expected {:02x?} \"LOCUSCA1\")",
                &b[0..8],
                MAGIC
            )));
        }
        let crc = u32::from_le_bytes(b[60..64].try_into().expect("4 bytes"));
        if crc != crc32c::crc32c(&b[..60]) {
            return Err(bad("the header's checksum does not match its bytes".into()));
        }
        let word = |at: usize| u32::from_le_bytes(b[at..at + 4].try_into().expect("4 bytes"));
        let version = word(8);
        if version != VERSION {
            return Err(bad(format!(
                "layout version {version}; this locus reads {VERSION}"
            )));
        }
        let header = Header {
            block_bytes: word(12),
            slots: word(16),
            backing_bytes: u64::from_le_bytes(b[24..32].try_into().expect("8 bytes")),
        };
        if header.block_bytes < 512 || !header.block_bytes.is_power_of_two() {
            return Err(bad(format!(
                "block size {} is not a power of two of at least 512",
                header.block_bytes
            )));
        }
        if header.slots == 0 {
            return Err(bad("the header says 0 slots".into()));
        }
        Ok(header)
    }
}

/// One index entry: which backing block a slot holds, dirty, and when it was put there.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Entry {
    /// The slot holds nothing (never used, or written back).
    Free,
    /// The slot holds dirty data of `block`, put there as write number `seq`.
    Dirty { block: u64, seq: u64 },
}

impl Entry {
    pub fn encode(&self) -> [u8; ENTRY_BYTES] {
        let mut b = [0u8; ENTRY_BYTES];
        let (state, block, seq) = match *self {
            Entry::Free => (FREE, 0, 0),
            Entry::Dirty { block, seq } => (DIRTY, block, seq),
        };
        b[0..4].copy_from_slice(&ENTRY_MAGIC.to_le_bytes());
        b[4..8].copy_from_slice(&state.to_le_bytes());
        b[8..16].copy_from_slice(&block.to_le_bytes());
        b[16..24].copy_from_slice(&seq.to_le_bytes());
        let crc = crc32c::crc32c(&b[..28]);
        b[28..32].copy_from_slice(&crc.to_le_bytes());
        b
    }

    /// Decodes entry `slot`; all zeros (a slot never used) is `Free`.
    pub fn decode(b: &[u8], slot: u32) -> Result<Self> {
        let bad = |problem: &str| CacheError::Format {
            problem: format!("index entry {slot}: {problem}"),
        };
        let b: &[u8; ENTRY_BYTES] = b.try_into().map_err(|_| bad("short"))?;
        if b.iter().all(|&x| x == 0) {
            return Ok(Entry::Free);
        }
        let word = |at: usize| u32::from_le_bytes(b[at..at + 4].try_into().expect("4 bytes"));
        let long = |at: usize| u64::from_le_bytes(b[at..at + 8].try_into().expect("8 bytes"));
        if word(0) != ENTRY_MAGIC {
            return Err(bad("not an index entry (bad magic)"));
        }
        if word(28) != crc32c::crc32c(&b[..28]) {
            return Err(bad("checksum does not match"));
        }
        match word(4) {
            FREE => Ok(Entry::Free),
            DIRTY => Ok(Entry::Dirty {
                block: long(8),
                seq: long(16),
            }),
            other => Err(bad(&format!("unknown state {other}"))),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn header_round_trips_and_the_layout_follows_from_it() {
        let h = Header {
            block_bytes: 4096,
            slots: 300,
            backing_bytes: 1 << 30,
        };
        assert_eq!(Header::decode(&h.encode()).unwrap(), h);
        assert_eq!(h.index_blocks(), 3, "300 entries of 32 bytes");
        assert_eq!(h.entry_offset(0), 4096);
        assert_eq!(h.slot_offset(0), 4 * 4096);
        assert_eq!(h.file_bytes(), (4 + 300) * 4096);
    }

    #[test]
    fn a_damaged_header_is_an_error_naming_what_is_wrong() {
        let h = Header {
            block_bytes: 4096,
            slots: 8,
            backing_bytes: 1 << 20,
        };
        let mut b = h.encode();
        b[17] ^= 1;
        let e = Header::decode(&b).unwrap_err().to_string();
        assert!(e.contains("checksum"), "{e}");
        let e = Header::decode(&[0u8; 64]).unwrap_err().to_string();
        assert!(e.contains("no cache header"), "{e}");
    }

    #[test]
    fn entries_round_trip_zeros_are_free_and_damage_names_the_entry() {
        let d = Entry::Dirty { block: 77, seq: 9 };
        assert_eq!(Entry::decode(&d.encode(), 3).unwrap(), d);
        assert_eq!(
            Entry::decode(&Entry::Free.encode(), 3).unwrap(),
            Entry::Free
        );
        assert_eq!(Entry::decode(&[0u8; 32], 3).unwrap(), Entry::Free);
        let mut b = d.encode();
        b[9] ^= 0x10;
        let e = Entry::decode(&b, 3).unwrap_err().to_string();
        assert!(e.contains("index entry 3") && e.contains("checksum"), "{e}");
    }
}
