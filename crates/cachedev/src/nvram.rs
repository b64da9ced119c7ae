//! The NVRAM tier: one file of the locus file system (so its blocks are persistent memory
//! of the volume, allocated near the thread that first writes them, and every write to it is
//! atomic and durable when it returns), laid out as `format` says.

use crate::error::{CacheError, Result};
use crate::format::{Entry, HEADER_BYTES, Header};

/// The NVRAM file.
#[derive(Debug)]
pub(crate) struct Nvram {
    file: fs::File,
    header: Header,
    path: String,
}

impl Nvram {
    /// Opens the NVRAM file at `path`, creating it (and its parent directories) laid out as
    /// `want` if it does not exist. An existing file must have `want`'s layout. Returns the
    /// file and its index entries.
    pub(crate) fn open(fs: &fs::Fs, path: &str, want: Header) -> Result<(Self, Vec<Entry>)> {
        let exists = match fs.stat(path) {
            Ok(stat) if stat.kind == fs::Kind::Dir => {
                return Err(CacheError::Config(format!("{path} is a directory")));
            }
            Ok(_) => true,
            Err(fs::FsError::NotFound(_)) => false,
            Err(e) => return Err(CacheError::nvram(format!("looking up {path}"))(e)),
        };
        if !exists {
            fs.create_parents(path)
                .map_err(|(at, e)| CacheError::nvram(format!("creating directory {at}"))(e))?;
            let file = fs
                .open_file(path, fs::OpenOptions::create())
                .map_err(CacheError::nvram(format!("creating {path}")))?;
            file.set_len(want.file_bytes())
                .map_err(CacheError::nvram(format!("sizing {path}")))?;
            // The header last: a file without one is not a cache yet (open fails, naming it).
            file.write_at(&want.encode(), 0)
                .map_err(CacheError::nvram(format!("writing the header of {path}")))?;
            let nvram = Nvram {
                file,
                header: want,
                path: path.to_owned(),
            };
            let entries = vec![Entry::Free; want.slots as usize];
            return Ok((nvram, entries));
        }
        let file = fs
            .open_file(path, fs::OpenOptions::read_write())
            .map_err(CacheError::nvram(format!("opening {path}")))?;
        let mut head = [0u8; HEADER_BYTES];
        read_full(&file, &mut head, 0).map_err(CacheError::nvram(format!("reading {path}")))?;
        let header = Header::decode(&head).map_err(naming(path))?;
        let mismatch = |what: &str, has: u64, asked: u64| {
            CacheError::Config(format!(
                "{path} caches with {what} {has}, not {asked}; it still holds the cache's \
                 dirty blocks, so locus does not change it (write everything back and remove \
                 it first)"
            ))
        };
        if header.block_bytes != want.block_bytes {
            return Err(mismatch(
                "block size",
                header.block_bytes.into(),
                want.block_bytes.into(),
            ));
        }
        if header.slots != want.slots {
            return Err(mismatch(
                "NVRAM slots",
                header.slots.into(),
                want.slots.into(),
            ));
        }
        if header.backing_bytes != want.backing_bytes {
            return Err(mismatch(
                "a backing store of bytes",
                header.backing_bytes,
                want.backing_bytes,
            ));
        }
        if file.len() < header.file_bytes() {
            return Err(CacheError::Format {
                problem: format!(
                    "{path} has {} bytes; its header needs {}",
                    file.len(),
                    header.file_bytes()
                ),
            });
        }
        let mut index = vec![0u8; header.slots as usize * crate::format::ENTRY_BYTES];
        read_full(&file, &mut index, header.entry_offset(0))
            .map_err(CacheError::nvram(format!("reading the index of {path}")))?;
        let entries = decode_index(&index).map_err(naming(path))?;
        Ok((
            Nvram {
                file,
                header,
                path: path.to_owned(),
            },
            entries,
        ))
    }

    /// Writes a whole block into `slot` (atomic and durable when it returns).
    pub(crate) fn write_slot(&self, slot: u32, data: &[u8]) -> Result<()> {
        debug_assert_eq!(data.len(), self.header.block_bytes as usize);
        self.file
            .write_at(data, self.header.slot_offset(slot))
            .map_err(CacheError::nvram(format!(
                "writing slot {slot} of {}",
                self.path
            )))
    }

    /// Reads `slot`'s block.
    pub(crate) fn read_slot(&self, slot: u32, out: &mut [u8]) -> Result<()> {
        read_full(&self.file, out, self.header.slot_offset(slot)).map_err(CacheError::nvram(
            format!("reading slot {slot} of {}", self.path),
        ))
    }

    /// Writes `slot`'s index entry (atomic and durable when it returns).
    pub(crate) fn write_entry(&self, slot: u32, entry: Entry) -> Result<()> {
        self.file
            .write_at(&entry.encode(), self.header.entry_offset(slot))
            .map_err(CacheError::nvram(format!(
                "writing index entry {slot} of {}",
                self.path
            )))
    }
}

fn read_full(file: &fs::File, out: &mut [u8], offset: u64) -> fs::Result<()> {
    let mut done = 0;
    while done < out.len() {
        let n = file.read_at(&mut out[done..], offset + done as u64)?;
        if n == 0 {
            // Past the end reads as zeros (the file was sized; a hole is zeros).
            out[done..].fill(0);
            break;
        }
        done += n;
    }
    Ok(())
}

/// What a stopped cache's NVRAM file holds, read without opening the file system
/// (`locus status`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct NvramSummary {
    /// Cache block size.
    pub block_bytes: u32,
    /// NVRAM slots.
    pub slots: u32,
    /// Size of the backing store the cache was made for.
    pub backing_bytes: u64,
    /// Distinct backing blocks held dirty, awaiting write-back.
    pub dirty_blocks: u64,
}

/// Reads the header and index of the NVRAM file at `path` of a stopped file system.
pub fn summarize_offline(offline: &fs::OfflineFs<'_>, path: &str) -> Result<NvramSummary> {
    let read = |offset: u64, buf: &mut [u8]| -> Result<()> {
        let n = offline
            .read_at(path, offset, buf)
            .map_err(CacheError::nvram(format!("reading {path}")))?;
        if n < buf.len() {
            return Err(CacheError::Format {
                problem: format!(
                    "{path}: ends at {} bytes, inside its index",
                    offset + n as u64
                ),
            });
        }
        Ok(())
    };
    let mut head = [0u8; HEADER_BYTES];
    read(0, &mut head)?;
    let header = Header::decode(&head).map_err(naming(path))?;
    let mut index = vec![0u8; header.slots as usize * crate::format::ENTRY_BYTES];
    read(header.entry_offset(0), &mut index)?;
    let dirty: std::collections::HashSet<u64> = decode_index(&index)
        .map_err(naming(path))?
        .into_iter()
        .filter_map(|entry| match entry {
            Entry::Dirty { block, .. } => Some(block),
            Entry::Free => None,
        })
        .collect();
    Ok(NvramSummary {
        block_bytes: header.block_bytes,
        slots: header.slots,
        backing_bytes: header.backing_bytes,
        dirty_blocks: dirty.len() as u64,
    })
}

/// The index entries in `index` (slot order).
fn decode_index(index: &[u8]) -> Result<Vec<Entry>> {
    index
        .chunks_exact(crate::format::ENTRY_BYTES)
        .enumerate()
        .map(|(slot, b)| Entry::decode(b, slot as u32))
        .collect()
}

/// Prefixes a format problem with the NVRAM file's path.
fn naming(path: &str) -> impl Fn(CacheError) -> CacheError + '_ {
    move |e| match e {
        CacheError::Format { problem } => CacheError::Format {
            problem: format!("{path}: {problem}"),
        },
        other => other,
    }
}
