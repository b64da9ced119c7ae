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
//!
//! A clean unmount, with every record retired, leaves a *seal* in the slot the next record
//! would take ([`LogArea::seal`]); the first append after it zeroes that slot, durably,
//! before it writes. Recovery finding the seal of the watermark's next sequence knows no
//! record followed, and reads two slots instead of the whole area — what every mount, and
//! so every program run through the preload library, paid for each thread slot.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use pmem::Region;
use smallvec::SmallVec;

use crate::error::{FsError, Result};

/// `LOCUSLOG`.
pub const LOG_MAGIC: u64 = u64::from_le_bytes(*b"LOCUSLOG");
/// Format version: records may carry the checksum of their data, and the header the
/// sequence through which data is confirmed whole ([`Confirmer`]).
pub const LOG_VERSION: u32 = 4;
/// The version before data checksums (still read; raised to the current one before its
/// first record with one is appended).
const LOG_VERSION_WITHOUT_DATA_SUMS: u32 = 3;
/// The version before groups (still read; raised to the current one before its first group
/// is appended).
const LOG_VERSION_WITHOUT_GROUPS: u32 = 2;
/// The version before records carried the write's time (still read, and written to as
/// version 1: its records keep `mtime` 0).
const LOG_VERSION_WITHOUT_TIMES: u32 = 1;
/// Bytes of the header and of each record slot (one cache line each).
pub const RECORD_BYTES: u64 = 64;
/// Most record slots in one area.
pub const MAX_RECORDS: u64 = 1 << 24;

// A record is one cache line: its encoding (7 words, the group count, the CRC) must fill it
// exactly, so that one flush of one line makes it durable and it cannot tear across lines.
const _: () =
    assert!(7 * 8 + 4 + 4 == RECORD_BYTES as usize && RECORD_BYTES == pmem::CACHE_LINE as u64);

/// XORed into a seal's CRC: a reader that does not know seals takes one for a torn slot and
/// skips it, and a seal can never pass for a record.
const SEAL_CRC_XOR: u32 = 0x5EA1_5EA1;
/// Bytes 8..16 of a seal.
const SEAL_MAGIC: u64 = u64::from_le_bytes(*b"LOGSEAL\0");

/// Set in a record's 4-byte length (bytes 24..28) when bytes 28..32 hold its data checksum.
/// Lengths stay below it: a record's data is at most `MAX_IO` (1 GiB).
const DATA_SUM_FLAG: u32 = 1 << 31;
const _: () = assert!(crate::fs::MAX_IO < DATA_SUM_FLAG as u64);

/// Header byte offset of the confirmation word ([`Confirmer`]).
const CONFIRMED_AT: u64 = 32;
/// The confirmation word's sequence bits (the rest are its check bits).
const CONFIRMED_MASK: u64 = (1 << 48) - 1;

/// The seal for `sequence`: no record of the area follows `sequence - 1`.
fn encode_seal(sequence: u64) -> [u8; RECORD_BYTES as usize] {
    let mut bytes = [0u8; RECORD_BYTES as usize];
    bytes[..8].copy_from_slice(&sequence.to_le_bytes());
    bytes[8..16].copy_from_slice(&SEAL_MAGIC.to_le_bytes());
    let crc = crc32c::crc32c(&bytes[..60]) ^ SEAL_CRC_XOR;
    bytes[60..64].copy_from_slice(&crc.to_le_bytes());
    bytes
}

/// Where part of a write's data is: `length` bytes for file offset `offset`, at the global
/// address `buffer`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Piece {
    /// Byte offset in the file.
    pub offset: u64,
    /// Bytes.
    pub length: u64,
    /// Global address of the persistent buffer holding them.
    pub buffer: u64,
    /// Their data checksum ([`pmem::data_checksum`]), when the caller computed it as it
    /// stored them and has not fenced them yet: the record's own fence then makes both
    /// durable, and recovery checks the newest write's data against it. `None`: the data is
    /// durable already (fenced before the append).
    pub data_sum: Option<u32>,
}

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
    /// This record's place in its write's group: a write whose data is in several pieces is
    /// one group of records `0..parts`, appended together, and counts only once all of them
    /// are durable.
    pub part: u16,
    /// Records in its write's group; 0 for a write of one record.
    pub parts: u16,
    /// The data checksum of the `length` bytes at `buffer`, when the data was stored
    /// behind the same fence as the record (version 4); `None` when it was durable first.
    pub data_sum: Option<u32>,
}

impl LogRecord {
    /// The last record of its write.
    fn ends_write(&self) -> bool {
        self.part + 1 >= self.parts
    }

    /// The sequence of the first record of its write.
    fn write_start(&self) -> u64 {
        self.sequence - u64::from(self.part)
    }
}

impl LogRecord {
    fn encode(&self) -> [u8; RECORD_BYTES as usize] {
        let mut bytes = [0u8; RECORD_BYTES as usize];
        // Before version 4 bytes 24..32 were an 8-byte length: below 2^31, the same bytes
        // as a 4-byte length without the flag and a zero checksum.
        let (length, sum) = match self.data_sum {
            Some(sum) => (self.length | u64::from(DATA_SUM_FLAG), u64::from(sum) << 32),
            None => (self.length, 0),
        };
        debug_assert!(self.length < u64::from(DATA_SUM_FLAG));
        for (i, value) in [
            self.sequence,
            self.inode,
            self.offset,
            length | sum,
            self.buffer,
            self.order,
            self.mtime,
        ]
        .into_iter()
        .enumerate()
        {
            bytes[i * 8..i * 8 + 8].copy_from_slice(&value.to_le_bytes());
        }
        bytes[56..58].copy_from_slice(&self.part.to_le_bytes());
        bytes[58..60].copy_from_slice(&self.parts.to_le_bytes());
        let crc = crc32c::crc32c(&bytes[..60]);
        bytes[60..64].copy_from_slice(&crc.to_le_bytes());
        bytes
    }

    /// `None` for an empty or torn slot (CRC mismatch), which recovery skips.
    /// The sequence number a record's bytes say, unchecked (0: a slot never written).
    fn sequence_in(bytes: &[u8]) -> u64 {
        u64::from_le_bytes(bytes[..8].try_into().expect("8 bytes"))
    }

    fn decode(bytes: &[u8; RECORD_BYTES as usize]) -> Option<Self> {
        let crc = u32::from_le_bytes(bytes[60..64].try_into().expect("4 bytes"));
        if crc != crc32c::crc32c(&bytes[..60]) {
            return None;
        }
        let word =
            |i: usize| u64::from_le_bytes(bytes[i * 8..i * 8 + 8].try_into().expect("8 bytes"));
        let length = word(3);
        let (length, data_sum) = if length as u32 & DATA_SUM_FLAG != 0 {
            (
                u64::from(length as u32 & !DATA_SUM_FLAG),
                Some((length >> 32) as u32),
            )
        } else {
            (length, None)
        };
        let record = Self {
            sequence: Self::sequence_in(bytes),
            inode: word(1),
            offset: word(2),
            length,
            buffer: word(4),
            order: word(5),
            mtime: word(6),
            part: u16::from_le_bytes(bytes[56..58].try_into().expect("2 bytes")),
            parts: u16::from_le_bytes(bytes[58..60].try_into().expect("2 bytes")),
            data_sum,
        };
        (record.sequence != 0).then_some(record)
    }
}

/// The confirmation word for `sequence`: its low 48 bits, and 16 check bits above them.
fn encode_confirmed(sequence: u64) -> u64 {
    let low = sequence & CONFIRMED_MASK;
    low | u64::from(confirmed_check(low)) << 48
}

fn confirmed_check(low: u64) -> u16 {
    // XORed so that a word of zeros (an area never confirmed) is not a confirmation of 0.
    (crc32c::crc32c(&low.to_le_bytes()[..6]) as u16) ^ 0xC0F1
}

/// What an area's confirmation word said when it was opened.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Confirmed {
    /// Zero: never written.
    Never,
    /// The low 48 bits of the sequence confirmed.
    Through(u64),
    /// Its check bits do not match: damaged.
    Unreadable,
}

impl Confirmed {
    fn decode(word: u64) -> Self {
        let low = word & CONFIRMED_MASK;
        if word == 0 {
            Self::Never
        } else if (word >> 48) as u16 == confirmed_check(low) {
            Self::Through(low)
        } else {
            Self::Unreadable
        }
    }

    /// Whether it covers `sequence`, the last record of the area's newest write: whether it
    /// confirms exactly that one. Confirmations never pass the newest record appended (a
    /// writer publishes a write's last sequence once its append returned), and everything
    /// older than the newest write is whole anyway (appended before it), so a confirmation
    /// of an older sequence covers nothing recovery checks.
    fn covers(self, sequence: u64) -> bool {
        self == Self::Through(sequence & CONFIRMED_MASK)
    }
}

fn unconfirmed_newest(confirmed: Confirmed, live: &[LogRecord]) -> Option<(usize, bool)> {
    let last = live.last()?;
    let first = live
        .iter()
        .rposition(|r| r.sequence == last.write_start())?;
    if live[first..].iter().all(|r| r.data_sum.is_none()) || confirmed.covers(last.sequence) {
        return None;
    }
    Some((first, confirmed == Confirmed::Unreadable))
}

/// Stores an area's confirmation word: every record of the area through a sequence has its
/// data whole (its append returned). Recovery checks the data of an area's newest write
/// against its data checksums only when the word does not cover it — so the word must be
/// durable before anything stores to such a write's data in place (the checkpoint copying
/// a later write into a block whose page that write's buffer became, a process storing
/// through a shared mapping); until then only a crash mid-append can have changed it. Held
/// by the checkpoint apart from the area, whose lock its writer holds while it appends; it
/// stores only its own 8-byte word of the header, which the writer never rewrites.
#[derive(Debug, Clone)]
pub struct Confirmer {
    region: Region,
}

impl Confirmer {
    /// Stores and flushes the word for `sequence`; durable at the caller's next fence.
    pub fn store(&self, sequence: u64) -> Result<()> {
        self.region
            .store_u64(CONFIRMED_AT, encode_confirmed(sequence))?;
        self.region.flush(CONFIRMED_AT, 8)?;
        Ok(())
    }
}

/// One thread's log area.
#[derive(Debug)]
pub struct LogArea {
    region: Region,
    /// The header's version.
    version: u32,
    /// Whether records carry their time (version 2 and later).
    times: bool,
    /// Slots (byte offsets) holding records of a group a crash cut short: valid records
    /// past the live ones, cleared before the next append so they cannot be mistaken for
    /// its successors.
    stale: Vec<u64>,
    id: u32,
    capacity: u64,
    next_sequence: u64,
    retired: Arc<AtomicU64>,
    /// A seal of `next_sequence` is in its slot (which `stale` then lists, to be zeroed
    /// before the next append).
    sealed: bool,
    /// The confirmation word as the area was opened.
    confirmed: Confirmed,
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
            version: LOG_VERSION,
            times: true,
            stale: Vec::new(),
            id,
            capacity,
            next_sequence: 1,
            retired: Arc::new(AtomicU64::new(0)),
            sealed: false,
            confirmed: Confirmed::Never,
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
        let mut version = u32_at(8);
        if !(LOG_VERSION_WITHOUT_TIMES..=LOG_VERSION).contains(&version) {
            return Err(bad(
                "version",
                format!("{version}, expected {LOG_VERSION_WITHOUT_TIMES}..={LOG_VERSION}"),
            ));
        }
        let crc = u32_at(60);
        let crc_with = |v: u32| {
            let mut h = header;
            h[8..12].copy_from_slice(&v.to_le_bytes());
            crc32c::crc32c(&h[8..24]) == crc
        };
        if !crc_with(version) {
            // Raising an area (to version 3 once, to 4 now) stores the version and the CRC
            // in different words: a crash between them leaves one of each. Nothing that
            // needs the new version was appended before both were durable, so such an area
            // is still the older of the two.
            let other = (LOG_VERSION_WITHOUT_TIMES..=LOG_VERSION)
                .filter(|&v| v != version && version.max(v) >= LOG_VERSION_WITHOUT_DATA_SUMS)
                .find(|&v| crc_with(v));
            match other {
                Some(other) => version = version.min(other),
                None => return Err(bad("crc32c", "header checksum mismatch (damaged)".into())),
            }
        }
        let confirmed = Confirmed::decode(u64_at(CONFIRMED_AT as usize));
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
        // Sealed at a clean unmount right after `retired`: nothing follows, and the slots
        // need not be read. (A seal of another sequence is stale — the metadata's watermark
        // is older than the unmount that wrote it — and the slots are read.)
        let next = retired + 1;
        let seal_at = RECORD_BYTES * (retired % capacity + 1);
        let mut slot = [0u8; RECORD_BYTES as usize];
        region.read(seal_at, &mut slot)?;
        let opened = |region, stale, next_sequence, sealed| Self {
            region,
            version,
            times: version >= LOG_VERSION_WITHOUT_GROUPS,
            stale,
            id,
            capacity,
            next_sequence,
            retired: Arc::new(AtomicU64::new(retired)),
            sealed,
            confirmed,
        };
        if slot == encode_seal(next) {
            return Ok((opened(region, vec![seal_at], next, true), Vec::new()));
        }
        let mut live = Vec::new();
        // Read a window of slots at a time; a slot whose sequence number is 0 (never
        // written) or retired is skipped before its CRC is computed — it would be skipped
        // after it anyway, valid or not — so the areas of a cleanly unmounted file system,
        // all retired, cost a mount a read and no checksums.
        const WINDOW: u64 = 1024;
        let mut window = vec![0u8; (WINDOW * RECORD_BYTES) as usize];
        for first in (0..capacity).step_by(WINDOW as usize) {
            let count = WINDOW.min(capacity - first);
            let bytes = &mut window[..(count * RECORD_BYTES) as usize];
            region.read(RECORD_BYTES * (first + 1), bytes)?;
            for (index, slot) in (first..).zip(bytes.chunks_exact(RECORD_BYTES as usize)) {
                let sequence = LogRecord::sequence_in(slot);
                if sequence == 0 || sequence <= retired {
                    continue;
                }
                let slot: &[u8; RECORD_BYTES as usize] = slot.try_into().expect("one slot");
                let Some(record) = LogRecord::decode(slot) else {
                    continue;
                };
                // Before groups the bytes were reserved, and before data checksums the flag
                // was a length bit no record had: a record with them set is not one.
                if version < LOG_VERSION_WITHOUT_DATA_SUMS && (record.part, record.parts) != (0, 0)
                    || version < LOG_VERSION && record.data_sum.is_some()
                {
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
        }
        live.sort_by_key(|r| r.sequence);
        if live.len() as u64 > capacity {
            return Err(FsError::DamagedLog {
                area: id,
                problem: "more live records than slots".into(),
            });
        }
        let damaged = |problem: String| FsError::DamagedLog { area: id, problem };
        // The contiguous records from the watermark on, checking that each record of a
        // group is followed by the next of the same group; `complete`: how many of them end
        // with a whole write.
        let mut complete = 0;
        for (expected, (i, record)) in (retired + 1..).zip(live.iter().enumerate()) {
            if record.sequence != expected {
                break;
            }
            if let Some(before) = i.checked_sub(1).map(|b| &live[b])
                && !before.ends_write()
                && (record.part != before.part + 1 || record.parts != before.parts)
            {
                return Err(damaged(format!(
                    "record {} is part {} of {} of its write, record {} part {} of {}",
                    before.sequence,
                    before.part + 1,
                    before.parts,
                    record.sequence,
                    record.part + 1,
                    record.parts
                )));
            }
            if record.ends_write() {
                complete = i + 1;
            }
        }
        // What follows the last whole write can only be the newest write, in several parts,
        // cut short by a crash (its records are stored together, behind one fence): it never
        // returned, and is dropped whole. Anything else — a gap before a record of another
        // write — is damage.
        let start = live[..complete]
            .last()
            .map_or(retired + 1, |r| r.sequence + 1);
        if let Some(stray) = live[complete..]
            .iter()
            .find(|r| r.parts < 2 || r.write_start() != start || r.parts != live[complete].parts)
        {
            let missing = (start..)
                .zip(&live[complete..])
                .find(|(seq, r)| r.sequence != *seq)
                .map_or(start, |(seq, _)| seq);
            return Err(damaged(format!(
                "record {missing} is missing before record {}",
                stray.sequence.max(missing + 1)
            )));
        }
        let stale: Vec<u64> = live[complete..]
            .iter()
            .map(|r| RECORD_BYTES * ((r.sequence - 1) % capacity + 1))
            .collect();
        live.truncate(complete);
        let next_sequence = live.last().map_or(retired + 1, |r| r.sequence + 1);
        Ok((opened(region, stale, next_sequence, false), live))
    }

    /// For `Fs::salvage` of a damaged area: the records [`LogArea::recover`] refuses over, cut
    /// to what provably precedes the damage — the writes complete and contiguous from the
    /// watermark on, a record in the wrong slot skipped — with the damage recover names
    /// (`None` when it would not refuse, and then all of its records), and the whole records
    /// found past the cut (dropped with it). The caller erases every other record slot.
    #[allow(clippy::type_complexity)]
    pub fn salvage(
        region: &Region,
        retired: u64,
    ) -> Result<(Vec<LogRecord>, Option<FsError>, Vec<LogRecord>)> {
        let damage = match Self::recover(region.clone(), retired) {
            Ok((_, live)) => return Ok((live, None, Vec::new())),
            Err(damage @ FsError::DamagedLog { .. }) => damage,
            Err(other) => return Err(other),
        };
        let mut capacity_bytes = [0u8; 8];
        region.read(16, &mut capacity_bytes)?;
        let capacity = u64::from_le_bytes(capacity_bytes);
        let mut live = Vec::new();
        let mut slot = [0u8; RECORD_BYTES as usize];
        for index in 0..capacity {
            region.read(RECORD_BYTES * (index + 1), &mut slot)?;
            if let Some(record) = LogRecord::decode(&slot)
                && record.sequence > retired
                && (record.sequence - 1) % capacity == index
            {
                live.push(record);
            }
        }
        live.sort_by_key(|r| r.sequence);
        let mut complete = 0;
        for (expected, (i, record)) in (retired + 1..).zip(live.iter().enumerate()) {
            let continues = i.checked_sub(1).map(|b| &live[b]).is_none_or(|before| {
                if before.ends_write() {
                    record.part == 0
                } else {
                    record.part == before.part + 1 && record.parts == before.parts
                }
            });
            if record.sequence != expected || !continues {
                break;
            }
            if record.ends_write() {
                complete = i + 1;
            }
        }
        let beyond = live.split_off(complete);
        Ok((live, Some(damage), beyond))
    }

    /// Zeroes every record slot of the area in `region` that does not hold one of the records
    /// `kept` names (by sequence), through the cache (the caller persists). Returns how many
    /// slots it zeroed.
    pub fn erase_all_but(region: &Region, kept: &std::collections::HashSet<u64>) -> Result<u64> {
        let mut capacity_bytes = [0u8; 8];
        region.read(16, &mut capacity_bytes)?;
        let capacity = u64::from_le_bytes(capacity_bytes).min(region.len() / RECORD_BYTES - 1);
        let mut slot = [0u8; RECORD_BYTES as usize];
        let mut erased = 0;
        for index in 0..capacity {
            let at = RECORD_BYTES * (index + 1);
            region.read(at, &mut slot)?;
            if slot.iter().all(|&b| b == 0) {
                continue;
            }
            if LogRecord::decode(&slot).is_some_and(|r| kept.contains(&r.sequence)) {
                continue;
            }
            region.fill(at, RECORD_BYTES, 0)?;
            erased += 1;
        }
        Ok(erased)
    }

    /// The area's newest write among `live` (the records [`LogArea::recover`] returned)
    /// when recovery must check its data against its checksums: some of its records carry
    /// one and the confirmation word does not cover it. `Some((first, unreadable))`:
    /// `live[first..]` is that write; `unreadable`: the confirmation word is damaged, so
    /// data that fails its checksum may as well be a write changed in place after it
    /// returned as one a crash cut short.
    pub fn unconfirmed_newest(&self, live: &[LogRecord]) -> Option<(usize, bool)> {
        unconfirmed_newest(self.confirmed, live)
    }

    /// [`LogArea::unconfirmed_newest`] for the area in `region` without opening it (a
    /// salvage's records).
    pub fn unconfirmed_newest_in(
        region: &Region,
        live: &[LogRecord],
    ) -> Result<Option<(usize, bool)>> {
        let word = Confirmed::decode(region.load_u64(CONFIRMED_AT)?);
        Ok(unconfirmed_newest(word, live))
    }

    /// Drops the newest write, `live[first..]` (found by [`LogArea::unconfirmed_newest`],
    /// its data failing its checksums: a crash cut its append short), as recovery drops a
    /// group cut short: its slots are zeroed before the next append, which takes its
    /// sequence.
    pub fn drop_newest_write(&mut self, live: &mut Vec<LogRecord>, first: usize) {
        let Some(start) = live.get(first).map(|r| r.sequence) else {
            return;
        };
        let capacity = self.capacity;
        self.stale.extend(
            live[first..]
                .iter()
                .map(|r| RECORD_BYTES * ((r.sequence - 1) % capacity + 1)),
        );
        live.truncate(first);
        self.next_sequence = start;
    }

    /// Whether the confirmation word, as the area was opened, names `sequence`.
    pub fn confirms(&self, sequence: u64) -> bool {
        self.confirmed.covers(sequence)
    }

    /// The handle that stores the area's confirmation word ([`Confirmer`]).
    pub fn confirmer(&self) -> Confirmer {
        Confirmer {
            region: self.region.clone(),
        }
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
        let piece = Piece {
            offset,
            length,
            buffer,
            data_sum: None,
        };
        Ok(self.append_group(inode, &[piece], order, mtime)?[0])
    }

    /// Appends the records of one write whose data is in `pieces` (orders `first_order`,
    /// `first_order + 1`, ...), as one group, and persists them; on return the write is
    /// durable, and a crash before that leaves none of it. `LogFull` when the area has not
    /// that many free slots.
    pub fn append_group(
        &mut self,
        inode: u64,
        pieces: &[Piece],
        first_order: u64,
        mtime: u64,
    ) -> Result<SmallVec<[LogRecord; 1]>> {
        let count = pieces.len() as u64;
        assert!(count > 0, "a write has at least one piece");
        if self.pending() + count > self.capacity {
            return Err(FsError::LogFull {
                area: self.id,
                pending: self.pending(),
            });
        }
        self.clear_stale()?;
        if count > 1 && self.version < LOG_VERSION_WITHOUT_DATA_SUMS
            || self.version < LOG_VERSION && pieces.iter().any(|p| p.data_sum.is_some())
        {
            self.raise_version()?;
        }
        let mut records = SmallVec::with_capacity(pieces.len());
        for (i, piece) in pieces.iter().enumerate() {
            let record = LogRecord {
                sequence: self.next_sequence + i as u64,
                inode,
                offset: piece.offset,
                length: piece.length,
                buffer: piece.buffer,
                order: first_order + i as u64,
                mtime: if self.times { mtime } else { 0 },
                // A write of one record is written as before groups (0 of 0): what a reader
                // of version 2 accepts.
                part: i as u16,
                parts: if count == 1 { 0 } else { count as u16 },
                data_sum: piece.data_sum,
            };
            let at = RECORD_BYTES * ((record.sequence - 1) % self.capacity + 1);
            // Non-temporal: a slot is written once per pass of the log, and a cached store
            // then a `clwb` of its line measured ~0.05 µs slower per write than streaming
            // the 64 bytes to memory.
            self.region.write_nt(at, &record.encode())?;
            records.push(record);
        }
        // One fence for the whole group.
        pmem::fence_all([&self.region]);
        self.next_sequence += count;
        Ok(records)
    }

    /// Zeroes the slots of a group a crash cut short (recovery found them), and a seal,
    /// before anything is appended after the live records: durably, so that no record of
    /// the append can be durable beside a seal that says nothing follows.
    fn clear_stale(&mut self) -> Result<()> {
        for &at in &self.stale {
            self.region.fill(at, RECORD_BYTES, 0)?;
            self.region.persist(at, RECORD_BYTES)?;
        }
        self.stale.clear();
        self.sealed = false;
        Ok(())
    }

    /// Seals the area when every record in it is retired (a clean unmount, after the
    /// metadata that retires them is durable): the seal of the next sequence goes into the
    /// slot that sequence takes, so the next recovery from that metadata reads two slots,
    /// not the whole area. Returns whether the area is sealed now; one already sealed is
    /// not written again. Records appended later zero the seal first.
    pub fn seal(&mut self) -> Result<bool> {
        if self.sealed {
            return Ok(true);
        }
        if self.pending() > 0 || !self.stale.is_empty() {
            return Ok(false);
        }
        let at = RECORD_BYTES * ((self.next_sequence - 1) % self.capacity + 1);
        self.region.write(at, &encode_seal(self.next_sequence))?;
        self.region.persist(at, RECORD_BYTES)?;
        self.stale.push(at);
        self.sealed = true;
        Ok(true)
    }

    /// Raises an area of an older version to the current one (its records read the same).
    fn raise_version(&mut self) -> Result<()> {
        let mut header = [0u8; RECORD_BYTES as usize];
        self.region.read(0, &mut header)?;
        header[8..12].copy_from_slice(&LOG_VERSION.to_le_bytes());
        let crc = crc32c::crc32c(&header[8..24]);
        // The version and the CRC are in different 8-byte words, so a crash can persist one
        // without the other: recovery reads such a header as the old version (nothing that
        // needs the new one was appended yet). Both are durable before anything that does
        // is. Only those two are stored: the checkpoint may be storing the confirmation word
        // of the same line meanwhile ([`Confirmer`]).
        self.region.write(8, &header[8..12])?;
        self.region.write(60, &crc.to_le_bytes())?;
        self.region.persist(8, RECORD_BYTES - 8)?;
        self.version = LOG_VERSION;
        self.times = true;
        Ok(())
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
