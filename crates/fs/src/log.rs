//! Per-thread log areas: the persistent user buffers' logs (Libpubl).
//!
//! A write's data sits in a persistent buffer; committing it appends one 64-byte record that
//! points at the buffer — inode, file offset, length, buffer address, the area's sequence and
//! the file system's global order — and persists that record before the write returns. Each
//! thread owns one area, so appends take no lock. The checkpoint later moves logged data into
//! files and *retires* records through a sequence number; the retirement is logged in the
//! checkpoint's own journal record (with the extent-map changes it made), so the area itself
//! is only ever appended to. Byte layout: docs/format/fs-log.md.
//!
//! Recovery is handed the retired watermark from the metadata, scans every slot and keeps
//! records whose CRC matches, whose sequence is above the watermark, and which sit in the
//! slot their sequence names. A torn record (a crash mid-append) fails its CRC and is
//! dropped: its write never returned. Because one writer persists each record before the
//! next, the kept sequences must be contiguous; a gap means damage and is reported, never
//! guessed around.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use pmem::Region;

use crate::error::{FsError, Result};

/// `LOCUSLOG`.
pub const LOG_MAGIC: u64 = u64::from_le_bytes(*b"LOCUSLOG");
/// Format version.
pub const LOG_VERSION: u32 = 2;
/// The version before records carried the write's time (still read, and written to as
/// version 1: its records keep `mtime` 0).
const LOG_VERSION_WITHOUT_TIMES: u32 = 1;
/// Bytes of the header and of each record slot (one cache line each).
pub const RECORD_BYTES: u64 = 64;
/// Most record slots in one area.
pub const MAX_RECORDS: u64 = 1 << 24;

// A record is one cache line: its encoding (7 words, 4 reserved bytes, the CRC) must fill it
// exactly, so that one flush of one line makes it durable and it cannot tear across lines.
const _: () =
    assert!(7 * 8 + 4 + 4 == RECORD_BYTES as usize && RECORD_BYTES == pmem::CACHE_LINE as u64);

/// What a record says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LogRecord {
    /// Position in the area's history, from 1.
    pub sequence: u64,
    /// The file written.
    pub inode: u64,
    /// Byte offset in the file.
    pub offset: u64,
    /// Bytes written.
    pub length: u64,
    /// Global address of the persistent buffer holding the data.
    pub buffer: u64,
    /// Place in the file system's global order of operations (replay order across areas).
    pub order: u64,
    /// The write's time (ns since the Unix epoch), the file's modification time from it on;
    /// 0 in areas of version 1, which did not record it.
    pub mtime: u64,
}

impl LogRecord {
    fn encode(&self) -> [u8; RECORD_BYTES as usize] {
        let mut bytes = [0u8; RECORD_BYTES as usize];
        for (i, value) in [
            self.sequence,
            self.inode,
            self.offset,
            self.length,
            self.buffer,
            self.order,
            self.mtime,
        ]
        .into_iter()
        .enumerate()
        {
            bytes[i * 8..i * 8 + 8].copy_from_slice(&value.to_le_bytes());
        }
        let crc = crc32c::crc32c(&bytes[..60]);
        bytes[60..64].copy_from_slice(&crc.to_le_bytes());
        bytes
    }

    /// `None` for an empty or torn slot (CRC mismatch), which recovery skips.
    fn decode(bytes: &[u8; RECORD_BYTES as usize]) -> Option<Self> {
        let crc = u32::from_le_bytes(bytes[60..64].try_into().expect("4 bytes"));
        if crc != crc32c::crc32c(&bytes[..60]) || bytes[56..60].iter().any(|&b| b != 0) {
            return None;
        }
        let word =
            |i: usize| u64::from_le_bytes(bytes[i * 8..i * 8 + 8].try_into().expect("8 bytes"));
        let record = Self {
            sequence: word(0),
            inode: word(1),
            offset: word(2),
            length: word(3),
            buffer: word(4),
            order: word(5),
            mtime: word(6),
        };
        (record.sequence != 0).then_some(record)
    }
}

/// One thread's log area.
#[derive(Debug)]
pub struct LogArea {
    region: Region,
    /// Whether records carry their time (version 2 areas).
    times: bool,
    id: u32,
    capacity: u64,
    next_sequence: u64,
    retired: Arc<AtomicU64>,
}

impl LogArea {
    /// Bytes an area of `records` slots needs.
    pub fn bytes_for(records: u64) -> u64 {
        RECORD_BYTES * (records + 1)
    }

    /// Formats `region` as a fresh, empty log area.
    pub fn format(region: Region, id: u32) -> Result<Self> {
        let capacity = (region.len() / RECORD_BYTES)
            .saturating_sub(1)
            .min(MAX_RECORDS);
        if capacity == 0 {
            return Err(FsError::BadLogHeader {
                field: "capacity_records",
                problem: "region too small for one record".into(),
            });
        }
        // Old records must not look live in the new area: clear the slots first.
        region.fill(RECORD_BYTES, capacity * RECORD_BYTES, 0)?;
        region.persist(RECORD_BYTES, capacity * RECORD_BYTES)?;
        let mut header = [0u8; RECORD_BYTES as usize];
        header[8..12].copy_from_slice(&LOG_VERSION.to_le_bytes());
        header[12..16].copy_from_slice(&id.to_le_bytes());
        header[16..24].copy_from_slice(&capacity.to_le_bytes());
        let crc = crc32c::crc32c(&header[8..24]);
        header[60..64].copy_from_slice(&crc.to_le_bytes());
        region.store_u64(0, 0)?;
        region.persist(0, 8)?;
        region.write(8, &header[8..])?;
        region.persist(8, RECORD_BYTES - 8)?;
        region.store_u64(0, LOG_MAGIC)?;
        region.persist(0, 8)?;
        Ok(Self {
            region,
            times: true,
            id,
            capacity,
            next_sequence: 1,
            retired: Arc::new(AtomicU64::new(0)),
        })
    }

    /// Opens an existing area whose records through `retired` are part of their files (the
    /// metadata says so) and returns it with its live records, oldest first.
    pub fn recover(region: Region, retired: u64) -> Result<(Self, Vec<LogRecord>)> {
        let mut header = [0u8; RECORD_BYTES as usize];
        region.read(0, &mut header)?;
        let bad = |field: &'static str, problem: String| FsError::BadLogHeader { field, problem };
        let u32_at =
            |at: usize| u32::from_le_bytes(header[at..at + 4].try_into().expect("4 bytes"));
        let u64_at =
            |at: usize| u64::from_le_bytes(header[at..at + 8].try_into().expect("8 bytes"));
        if u64_at(0) != LOG_MAGIC {
            return Err(bad("magic", "not a locus log area".into()));
        }
        let version = u32_at(8);
        if version != LOG_VERSION && version != LOG_VERSION_WITHOUT_TIMES {
            return Err(bad(
                "version",
                format!("{version}, expected {LOG_VERSION_WITHOUT_TIMES} or {LOG_VERSION}"),
            ));
        }
        let crc = u32_at(60);
        if crc != crc32c::crc32c(&header[8..24]) {
            return Err(bad("crc32c", "header checksum mismatch (damaged)".into()));
        }
        let id = u32_at(12);
        let capacity = u64_at(16);
        if capacity == 0 || capacity > MAX_RECORDS || LogArea::bytes_for(capacity) > region.len() {
            return Err(bad(
                "capacity_records",
                format!(
                    "{capacity} records do not fit the area's {} bytes",
                    region.len()
                ),
            ));
        }
        let mut live = Vec::new();
        let mut slot = [0u8; RECORD_BYTES as usize];
        for index in 0..capacity {
            region.read(RECORD_BYTES * (index + 1), &mut slot)?;
            let Some(record) = LogRecord::decode(&slot) else {
                continue;
            };
            if record.sequence <= retired {
                continue;
            }
            if (record.sequence - 1) % capacity != index {
                return Err(FsError::DamagedLog {
                    area: id,
                    problem: format!(
                        "record {} sits in slot {index}, not slot {}",
                        record.sequence,
                        (record.sequence - 1) % capacity
                    ),
                });
            }
            live.push(record);
        }
        live.sort_by_key(|r| r.sequence);
        let mut expected = retired + 1;
        for record in &live {
            if record.sequence != expected {
                return Err(FsError::DamagedLog {
                    area: id,
                    problem: format!(
                        "record {expected} is missing before record {}",
                        record.sequence
                    ),
                });
            }
            expected += 1;
        }
        if live.len() as u64 > capacity {
            return Err(FsError::DamagedLog {
                area: id,
                problem: "more live records than slots".into(),
            });
        }
        Ok((
            Self {
                region,
                times: version == LOG_VERSION,
                id,
                capacity,
                next_sequence: expected,
                retired: Arc::new(AtomicU64::new(retired)),
            },
            live,
        ))
    }

    /// The area's id.
    pub fn id(&self) -> u32 {
        self.id
    }

    /// The retired watermark: records through this sequence belong to their files.
    pub fn retired(&self) -> u64 {
        self.retired.load(Ordering::Acquire)
    }

    /// The watermark, shared with the checkpoint, which advances it.
    pub fn retired_handle(&self) -> Arc<AtomicU64> {
        Arc::clone(&self.retired)
    }

    /// Records appended and not yet retired.
    pub fn pending(&self) -> u64 {
        self.next_sequence - 1 - self.retired()
    }

    /// The sequence the next append gets.
    pub fn next_sequence(&self) -> u64 {
        self.next_sequence
    }

    /// Slots in the area.
    pub fn capacity(&self) -> u64 {
        self.capacity
    }

    /// Appends a record and persists it; on return the write it describes is durable.
    /// `LogFull` when every slot holds a record the checkpoint has not retired.
    pub fn append(
        &mut self,
        inode: u64,
        offset: u64,
        length: u64,
        buffer: u64,
        order: u64,
        mtime: u64,
    ) -> Result<LogRecord> {
        if self.pending() == self.capacity {
            return Err(FsError::LogFull {
                area: self.id,
                pending: self.pending(),
            });
        }
        let record = LogRecord {
            sequence: self.next_sequence,
            inode,
            offset,
            length,
            buffer,
            order,
            mtime: if self.times { mtime } else { 0 },
        };
        let at = RECORD_BYTES * ((record.sequence - 1) % self.capacity + 1);
        self.region.write(at, &record.encode())?;
        self.region.persist(at, RECORD_BYTES)?;
        self.next_sequence += 1;
        Ok(record)
    }

    /// Retires every record through `sequence`: their slots may be reused. The caller has
    /// made the retirement durable in the metadata journal first.
    pub fn retire_through(&self, sequence: u64) {
        assert!(
            sequence < self.next_sequence,
            "retiring record {sequence} never appended"
        );
        self.retired.fetch_max(sequence, Ordering::AcqRel);
    }
}
