//! What locus serves over NBD, behind `nbd::server::Export`: a file of the locus file system
//! as a block device ([`FsExport`]), and a cache device — a backing store behind NVRAM and
//! DRAM ([`CacheExport`], module `cache`); [`AnyExport`] serves either.
//!
//! Writes are copied, as they arrive, from the connection's input buffer into a persistent
//! buffer allocated by the receiving thread (pinned to its channel's node, so the buffer is
//! on that node) with non-temporal stores, and committed with `File::write_buffer`: the
//! buffer becomes the file's data, durable when the reply leaves. FLUSH and FUA therefore
//! have nothing left to do.
//!
//! Opening an export creates what it needs (parent directories, the file, its size) and
//! refuses, with an [`OpenError`] naming the export, what it cannot serve.

mod cache;

use std::ops::Range;

use nbd::consts::errno;
use nbd::server::{Export, ExportError, Payload};

pub use cache::{
    AnyExport, AnyStaged, CacheExport, CacheSpec, NVRAM_DIR, check_name as check_cache_name,
    nvram_path,
};

/// Why an export cannot be served.
#[derive(Debug, thiserror::Error)]
pub enum OpenError {
    /// The export's file is unusable as asked.
    #[error("export {name:?}: {problem}")]
    Refused {
        /// The export's name.
        name: String,
        /// What is wrong, in words.
        problem: String,
    },
    /// The file system failed.
    #[error("export {name:?}: {doing}: {source}")]
    Fs {
        /// The export's name.
        name: String,
        /// What was being done.
        doing: String,
        /// The file system's error.
        #[source]
        source: fs::FsError,
    },
}

/// An export: a name clients ask for and the file behind it (`locus serve --export
/// NAME=fs:/PATH[,size=SIZE][,ro]`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExportSpec {
    /// Export name clients ask for.
    pub name: String,
    /// File in the file system.
    pub path: String,
    /// Size to create the file with, or to grow it to.
    pub size: Option<u64>,
    /// Refuse writes.
    pub read_only: bool,
}

/// Export sizes are whole 512-byte sectors, so a client that works in sectors (the kernel's)
/// can reach every byte.
pub fn check_size(size: u64) -> Result<u64, String> {
    if size == 0 || !size.is_multiple_of(u64::from(nbd::server::SECTOR_BYTES)) {
        return Err(format!(
            "{size} bytes, not a positive multiple of {} (an export is whole sectors)",
            nbd::server::SECTOR_BYTES
        ));
    }
    Ok(size)
}

/// An open file served over NBD.
#[derive(Debug)]
pub struct FsExport {
    file: fs::File,
    path: String,
    size: u64,
    read_only: bool,
}

/// A received write payload: persistent buffers, each with its offset in the payload — one
/// buffer, unless free memory had no single extent that large (see [`FsExport::buffers`]).
#[derive(Debug)]
pub struct Staged {
    pieces: fs::Buffers,
}

/// Held shared by every change an [`FsExport`] makes to its file (a write, zeroes, a
/// punched hole), exclusively by [`held_still`].
static CHANGES: std::sync::RwLock<()> = std::sync::RwLock::new(());

/// Runs `f` once no export is changing its file, and with none starting to: the changes in
/// progress finish first, new ones wait until `f` returns (their clients' requests with
/// them). How `locus serve` checks its volume for `locus fsck` — with the file system's
/// checkpoint held too (`fs::Fs::quiesced`), the media hold still while `f` reads them.
pub fn held_still<R>(f: impl FnOnce() -> R) -> R {
    let _still = CHANGES
        .write()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    f()
}

/// A change of an export's file in progress ([`held_still`] waits for it).
fn changing() -> std::sync::RwLockReadGuard<'static, ()> {
    CHANGES
        .read()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// Largest zero run written per call when zeroing.
const ZERO_CHUNK: usize = 1 << 20;
/// Zeros lent for the part of a read past the end of a file shortened behind the export.
static ZEROS: [u8; 64 << 10] = [0; 64 << 10];

impl FsExport {
    /// Opens (creating parent directories and the file, and growing it, as asked) the file
    /// `spec` names.
    pub fn open(fs: &fs::Fs, spec: &ExportSpec) -> Result<Self, OpenError> {
        let refused = |problem: String| OpenError::Refused {
            name: spec.name.clone(),
            problem,
        };
        let failed = |doing: String| {
            let name = spec.name.clone();
            move |source| OpenError::Fs {
                name,
                doing,
                source,
            }
        };
        let exists = match fs.stat(&spec.path) {
            Ok(stat) if stat.kind == fs::Kind::Dir => {
                return Err(refused(format!("{} is a directory", spec.path)));
            }
            Ok(_) => true,
            Err(fs::FsError::NotFound(_)) => false,
            Err(e) => return Err(failed(format!("looking up {}", spec.path))(e)),
        };
        if !exists {
            if spec.read_only {
                return Err(refused(format!(
                    "{} does not exist (a read-only export serves an existing file)",
                    spec.path
                )));
            }
            if spec.size.is_none() {
                return Err(refused(format!(
                    "{} does not exist; give size=SIZE to create it",
                    spec.path
                )));
            }
            fs.create_parents(&spec.path)
                .map_err(|(at, e)| failed(format!("creating directory {at}"))(e))?;
        }
        let options = if spec.read_only {
            fs::OpenOptions::default()
        } else {
            fs::OpenOptions::create()
        };
        let file = fs
            .open_file(&spec.path, options)
            .map_err(failed(format!("opening {}", spec.path)))?;
        let current = file.len();
        let size = match spec.size {
            Some(size) if size > current && !spec.read_only => {
                file.set_len(size)
                    .map_err(failed(format!("sizing {} to {size} bytes", spec.path)))?;
                size
            }
            Some(size) if size != current => {
                return Err(refused(format!(
                    "{} has {current} bytes, not {size}; locus does not shrink (or, read-only, \
                     grow) an exported file — remove it or give its size",
                    spec.path
                )));
            }
            _ => current,
        };
        check_size(size).map_err(|e| refused(format!("{} has {e}", spec.path)))?;
        Ok(Self {
            file,
            path: spec.path.clone(),
            size,
            read_only: spec.read_only,
        })
    }
}

/// The NBD error for a file-system error.
fn nbd_error(e: &fs::FsError) -> ExportError {
    use fs::ErrorKind as K;
    let code = match e.kind() {
        K::NoSpace => errno::ENOSPC,
        K::TryAgain => errno::ENOMEM,
        // Past the largest file: the export's size keeps requests far below it, as it
        // keeps them inside the export.
        K::Invalid | K::TooLarge => errno::EINVAL,
        K::NotSupported => errno::ENOTSUP,
        K::BadHandle | K::NotPermitted => errno::EPERM,
        K::Shutdown => errno::ESHUTDOWN,
        // The export's own file: gone, replaced or unreadable is the media failing under
        // the client (exports never touch extended attributes: NoData, TooBig).
        K::NotFound
        | K::NoData
        | K::TooBig
        | K::Exists
        | K::NotDir
        | K::IsDir
        | K::NotEmpty
        | K::NameTooLong
        | K::Symlink
        | K::InUse
        | K::NoFileSystem
        | K::Io => errno::EIO,
    };
    ExportError::new(code, e.to_string())
}

impl Export for FsExport {
    type Staged = Staged;

    fn size(&self) -> u64 {
        self.size
    }

    fn read_only(&self) -> bool {
        self.read_only
    }

    fn description(&self) -> String {
        format!(
            "locus file {} ({}{})",
            self.path,
            exact_size(self.size),
            if self.read_only { ", read-only" } else { "" }
        )
    }

    fn read(&self, offset: u64, buf: &mut [u8]) -> Result<(), ExportError> {
        let n = self.file.read_at(buf, offset).map_err(|e| nbd_error(&e))?;
        // The export keeps its size; a file shortened behind our back reads as zeros.
        buf[n..].fill(0);
        Ok(())
    }

    fn read_with(
        &self,
        offset: u64,
        len: u32,
        _scratch: &mut Vec<u8>,
        send: &mut dyn FnMut(&[&[u8]]),
    ) -> Result<(), ExportError> {
        let len = u64::from(len);
        self.file
            .read_with(offset, len, |data| {
                // The export keeps its size; a file shortened behind our back reads as zeros.
                let covered: u64 = data.iter().map(|d| d.len() as u64).sum();
                if covered == len {
                    return send(data);
                }
                let mut padded = data.to_vec();
                let mut left = (len - covered) as usize;
                while left > 0 {
                    let n = left.min(ZEROS.len());
                    padded.push(&ZEROS[..n]);
                    left -= n;
                }
                send(&padded);
            })
            .map_err(|e| nbd_error(&e))?;
        Ok(())
    }

    fn data_ranges(&self, offset: u64, len: u64) -> Result<Vec<Range<u64>>, ExportError> {
        self.file
            .data_ranges(offset, len)
            .map_err(|e| nbd_error(&e))
    }

    fn receive(&self, payload: &mut Payload<'_>) -> Result<Staged, ExportError> {
        let mut pieces = self.buffers(u64::from(payload.remaining()))?;
        // Non-temporal copies out of the connection's cache-hot input buffer: nothing to
        // write back at commit (see the nbd server's `inbox` for the measurements).
        payload.receive_with(|mut at, mut bytes| {
            while !bytes.is_empty() {
                let i = pieces.partition_point(|(start, _)| *start <= at) - 1;
                let (start, buffer) = &mut pieces[i];
                let n = (buffer.len() - (at - *start)).min(bytes.len() as u64);
                buffer
                    .write(at - *start, &bytes[..n as usize])
                    .map_err(|e| nbd_error(&e))?;
                (at, bytes) = (at + n, &bytes[n as usize..]);
            }
            Ok(())
        })?;
        Ok(Staged { pieces })
    }

    fn staged_node(&self, staged: &Staged) -> Option<u32> {
        staged.pieces.first().and_then(|(_, buffer)| buffer.node())
    }

    fn commit(&self, staged: Staged, offset: u64) -> Result<(), ExportError> {
        // Pieces are committed in order, each atomic; NBD promises no more for a write (a
        // crash may leave part of one that was not acknowledged).
        let _changing = changing();
        for (at, buffer) in staged.pieces {
            self.file
                .write_buffer(buffer, offset + at)
                .map_err(|e| nbd_error(&e))?;
        }
        Ok(())
    }

    fn write_zeroes(&self, offset: u64, len: u64, provision: bool) -> Result<(), ExportError> {
        if !provision {
            // A hole reads as zeros and gives the memory back.
            return self.punch(offset, len);
        }
        let _changing = changing();
        // NO_HOLE: every byte must be backed by memory, so zeros are written.
        let zeros = vec![0u8; ZERO_CHUNK.min(len as usize)];
        let (mut at, end) = (offset, offset + len);
        while at < end {
            let n = (end - at).min(zeros.len() as u64);
            self.file
                .write_at(&zeros[..n as usize], at)
                .map_err(|e| nbd_error(&e))?;
            at += n;
        }
        Ok(())
    }

    fn zeroes_fast(&self, offset: u64, len: u64, provision: bool) -> Result<bool, ExportError> {
        // A punched hole is one journal record; provisioning holes is a write.
        Ok(!provision || {
            let data: u64 = self
                .data_ranges(offset, len)?
                .iter()
                .map(|r| r.end - r.start)
                .sum();
            data == len
        })
    }

    fn trim(&self, offset: u64, len: u64) -> Result<(), ExportError> {
        // The protocol leaves a trimmed range's contents unspecified: it becomes a hole
        // (zeros), and its whole blocks go back to the volume.
        self.punch(offset, len)
    }

    fn flush(&self) -> Result<(), ExportError> {
        // Every write was durable before its reply; this is a barrier for the record.
        self.file.sync_all().map_err(|e| nbd_error(&e))
    }

    fn cache(&self, _offset: u64, _len: u64) -> Result<(), ExportError> {
        // The data sits on the memory bus already; there is nothing to prefetch.
        Ok(())
    }
}

impl FsExport {
    /// Persistent buffers for a payload of `len` bytes ([`fs::Fs::buffers`]: in pieces when
    /// free memory is fragmented).
    fn buffers(&self, len: u64) -> Result<fs::Buffers, ExportError> {
        self.file.fs().buffers(len).map_err(|e| nbd_error(&e))
    }

    /// Punches a hole over `[offset, offset + len)`, unless it holds no data already (then
    /// there is nothing to free, and no journal record is spent on it).
    fn punch(&self, offset: u64, len: u64) -> Result<(), ExportError> {
        if self.data_ranges(offset, len)?.is_empty() {
            return Ok(());
        }
        let _changing = changing();
        self.file.punch_hole(offset, len).map_err(|e| nbd_error(&e))
    }
}

/// A size as exactly as one unit says it: `1 GiB`, `3 MiB`, `1536 KiB`, `512 B`.
fn exact_size(bytes: u64) -> String {
    for (shift, unit) in [(40, "TiB"), (30, "GiB"), (20, "MiB"), (10, "KiB")] {
        if bytes >= 1 << shift && bytes.is_multiple_of(1 << shift) {
            return format!("{} {unit}", bytes >> shift);
        }
    }
    format!("{bytes} B")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_are_described_exactly() {
        assert_eq!(exact_size(1 << 30), "1 GiB");
        assert_eq!(exact_size(3 << 20), "3 MiB");
        assert_eq!(exact_size(1536 << 10), "1536 KiB");
        assert_eq!(exact_size(512), "512 B");
        assert_eq!(exact_size(20 << 30), "20 GiB");
    }

    #[test]
    fn sizes_must_be_whole_sectors() {
        assert_eq!(check_size(4096), Ok(4096));
        assert!(check_size(0).is_err());
        assert!(check_size(1000).unwrap_err().contains("multiple of 512"));
    }
}
