//! A shared mapping of a device file, unmapped on drop.

#![allow(unsafe_code, reason = "mmap, munmap and msync of device files")]

use std::fs::File;
use std::ops::Range;
use std::os::fd::AsRawFd;
use std::path::Path;
use std::ptr::NonNull;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};

use crate::error::{PmemError, Result};

/// `MAP_SYNC` from `<linux/mman.h>`: the kernel guarantees that a DAX mapping's metadata is
/// durable when a page fault returns, so user-space flushes alone persist data. Part of the
/// stable ABI; not exported by the libc crate for every target.
const MAP_SYNC: libc::c_int = 0x80000;

/// `MADV_POPULATE_READ` and `MADV_POPULATE_WRITE` from `<linux/mman.h>` (Linux 5.14), not
/// in every libc crate target.
const MADV_POPULATE_READ: libc::c_int = 22;
const MADV_POPULATE_WRITE: libc::c_int = 23;
/// `MADV_COLLAPSE` from `<linux/mman.h>` (Linux 6.1): make the range's pages huge pages now.
const MADV_COLLAPSE: libc::c_int = 25;

// Mappings start on a huge page's boundary, and emulated devices' pages are collapsed into
// pages of its size.
use topology::HUGE_PAGE;

/// What [`Mapping::populate_range`] populates at a time: 2 MiB (512 pages, one page-table
/// page), so that a process populates each part of a device once, in one call, however many
/// scattered pages of it it later asks for.
const POPULATE_CHUNK: usize = 2 << 20;

/// How the pages are mapped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum MapFlags {
    /// `MAP_SHARED`.
    Shared,
    /// `MAP_SHARED_VALIDATE | MAP_SYNC`: fails unless the file is on a DAX file system.
    SharedSync,
}

#[derive(Debug)]
pub(crate) struct Mapping {
    base: NonNull<u8>,
    len: usize,
    /// Every page was populated ([`Mapping::populate`]): a range needs no more.
    populated: AtomicBool,
    /// One bit per [`POPULATE_CHUNK`] of the mapping: set once its pages were populated
    /// ([`Mapping::populate_range`]).
    chunks: Box<[AtomicU64]>,
    /// The file is on tmpfs (an emulated device): how its pages are populated
    /// ([`populate_advice`]), and populated whole, they are made huge pages
    /// ([`Mapping::collapse`]).
    on_tmpfs: bool,
    /// Kept open for `msync` and so the mapping's file stays the one we checked.
    _file: File,
}

// SAFETY: the mapping is plain shared memory; `Region` mediates every access through raw
// pointer copies and atomics and never hands out references, so sharing it between threads
// cannot create aliasing `&mut`.
unsafe impl Send for Mapping {}
// SAFETY: see `Send`.
unsafe impl Sync for Mapping {}

impl Mapping {
    pub(crate) fn new(file: File, len: usize, flags: MapFlags, path: &Path) -> Result<Self> {
        let flags = match flags {
            MapFlags::Shared => libc::MAP_SHARED,
            MapFlags::SharedSync => libc::MAP_SHARED_VALIDATE | MAP_SYNC,
        };
        let on_tmpfs = on_tmpfs(&file);
        // The kernel places a DAX mapping on the device's alignment itself (a device-DAX
        // device with 1 GiB alignment refuses any other), and an ordinary file's pages are
        // never huge: only a tmpfs mapping is placed here.
        let address = if on_tmpfs {
            map_aligned(&file, len, flags)
        } else {
            map_anywhere(&file, len, flags)
        }
        .map_err(|source| PmemError::Io {
            path: path.to_owned(),
            action: if flags & MAP_SYNC != 0 {
                "mmap with MAP_SYNC"
            } else {
                "mmap"
            },
            source,
        })?;
        let base = NonNull::new(address.cast::<u8>()).expect("mmap never returns null on success");
        Ok(Self {
            base,
            len,
            populated: AtomicBool::new(false),
            chunks: (0..len.div_ceil(POPULATE_CHUNK).div_ceil(64))
                .map(|_| AtomicU64::new(0))
                .collect(),
            on_tmpfs,
            _file: file,
        })
    }

    pub(crate) fn base(&self) -> *mut u8 {
        self.base.as_ptr()
    }

    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// Faults every page in for writing ([`populate_advice`], Linux 5.14+), so the page
    /// tables are filled now rather than on the data path, and `move_pages` can see where
    /// each page is. Contents are unchanged.
    ///
    /// On tmpfs the pages are then made huge pages ([`Mapping::collapse`]): populating the
    /// whole device is what a long-running user does at open (`locus serve`, `locus mount`,
    /// the benches), which pays the first collapse of a device once for every later process.
    /// Populating parts as they are used (a preloaded program, [`Mapping::populate_range`])
    /// maps huge pages where a collapse made them and does not collapse: there a first
    /// collapse (milliseconds a 2 MiB chunk) would fall on a short program's writes.
    pub(crate) fn populate(&self) -> std::io::Result<()> {
        self.populate_pages(0, self.len)?;
        self.populated.store(true, Ordering::Relaxed);
        self.collapse();
        Ok(())
    }

    /// Makes the pages of a tmpfs file's mapping huge pages mapped whole (`MADV_COLLAPSE`,
    /// Linux 6.1), where the kernel can; a range already made of them costs a page-table
    /// walk. Only emulated devices are on tmpfs, and a tmpfs mounted without `huge=` never
    /// gives a shared mapping huge pages on its own: every 4 KiB page of a device then took
    /// a TLB entry, and the data path's stores to pages all over the device missed the TLB
    /// on nearly every write, where a DAX device is mapped 2 MiB at a time. Measured (2 M
    /// writes of 4 KiB to random pages of a 1 GiB tmpfs file, each with a 64-byte record and
    /// two fences, as a write does): 459 ns a write with 4 KiB pages, 347 ns with huge
    /// pages. The first collapse copies the pages into huge ones (1–5 s per GiB here); the
    /// page cache keeps them, so a later mapping of the file, by any process, maps them 2 MiB
    /// at a time when populated (1 ms for 1 GiB against 0.7 s) and a later collapse finds
    /// nothing to do. Failure changes nothing but speed: a kernel without it, or a range it
    /// could not collapse now (no free huge page, pages busy), keeps small pages.
    fn collapse(&self) {
        // Whole huge pages only: the mapping starts on a huge-page boundary
        // ([`map_aligned`]), so these are the file's own.
        let end = self.len / HUGE_PAGE * HUGE_PAGE;
        if !self.on_tmpfs || end == 0 {
            return;
        }
        debug_assert!((self.base.as_ptr() as usize).is_multiple_of(HUGE_PAGE));
        let started = std::time::Instant::now();
        // SAFETY: the range lies within this mapping; collapsing keeps every byte as it was
        // (the kernel copies the pages, and accesses meanwhile wait for it).
        let rc = unsafe { libc::madvise(self.base.as_ptr().cast(), end, MADV_COLLAPSE) };
        let outcome = if rc == 0 {
            Ok(())
        } else {
            Err(std::io::Error::last_os_error())
        };
        tracing::debug!(
            bytes = end,
            elapsed_ms = started.elapsed().as_millis() as u64,
            ?outcome,
            "huge pages for a tmpfs mapping"
        );
    }

    /// Populates `[start, start + bytes)` for writing ([`populate_advice`]), which the caller
    /// keeps within the mapping.
    fn populate_pages(&self, start: usize, bytes: usize) -> std::io::Result<()> {
        assert!(
            start.checked_add(bytes).is_some_and(|end| end <= self.len),
            "populating outside the mapping"
        );
        // SAFETY: the range lies within this mapping (checked above); populating faults
        // pages in without changing what they hold.
        let rc = unsafe {
            libc::madvise(
                self.base.as_ptr().add(start).cast(),
                bytes,
                populate_advice(self.on_tmpfs),
            )
        };
        if rc != 0 {
            return Err(std::io::Error::last_os_error());
        }
        Ok(())
    }

    /// [`Mapping::populate`] for the [`POPULATE_CHUNK`]s that `[offset, offset + len)`
    /// touches (within the mapping), each once: a chunk populated before, or a mapping
    /// populated whole, costs a bit test.
    #[inline]
    pub(crate) fn populate_range(&self, offset: usize, len: usize) -> std::io::Result<()> {
        if self.populated.load(Ordering::Relaxed) || len == 0 || offset >= self.len {
            return Ok(());
        }
        let end = offset.saturating_add(len).min(self.len);
        for chunk in offset / POPULATE_CHUNK..end.div_ceil(POPULATE_CHUNK) {
            let (word, bit) = (&self.chunks[chunk / 64], 1u64 << (chunk % 64));
            // Marked first: a chunk is tried once, whether the call succeeds or not (a
            // kernel without it would fail it on every write), and by one thread.
            if word.load(Ordering::Relaxed) & bit != 0
                || word.fetch_or(bit, Ordering::Relaxed) & bit != 0
            {
                continue;
            }
            let start = chunk * POPULATE_CHUNK;
            self.populate_pages(start, POPULATE_CHUNK.min(self.len - start))?;
        }
        Ok(())
    }

    /// Writes dirty pages of `[offset, offset + len)` back to the file and waits.
    pub(crate) fn msync(&self, offset: usize, len: usize) -> std::io::Result<()> {
        let page = topology::page_size();
        let start = offset - offset % page;
        let end = (offset + len).min(self.len);
        if RECORDERS.load(Ordering::Relaxed) > 0 {
            let base = self.base.as_ptr() as usize;
            MSYNCED
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .push(base + start..base + end);
        }
        // SAFETY: the page-aligned range lies inside this mapping.
        let rc = unsafe {
            libc::msync(
                self.base.as_ptr().add(start).cast(),
                end - start,
                libc::MS_SYNC,
            )
        };
        if rc != 0 {
            return Err(std::io::Error::last_os_error());
        }
        Ok(())
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        // SAFETY: unmaps exactly the mapping created in `new`; `Region` holds an `Arc` to the
        // mapping, so no access can outlive it.
        let rc = unsafe { libc::munmap(self.base.as_ptr().cast(), self.len) };
        debug_assert_eq!(rc, 0, "munmap of our own mapping failed");
    }
}

/// Maps `len` bytes of `file` shared (`flags`) where the kernel chooses.
fn map_anywhere(file: &File, len: usize, flags: libc::c_int) -> std::io::Result<*mut libc::c_void> {
    // SAFETY: a fresh mapping at an address of the kernel's choosing aliases no Rust object;
    // `file` is open for reading and writing.
    let address = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            flags,
            file.as_raw_fd(),
            0,
        )
    };
    if address == libc::MAP_FAILED {
        return Err(std::io::Error::last_os_error());
    }
    Ok(address)
}

/// Maps `len` bytes of a tmpfs `file` shared (`flags`) from a huge-page boundary when `len`
/// holds a huge page: the kernel maps a huge page only where the mapping has a whole one,
/// and left to choose it places the mapping of a file on a tmpfs mounted without `huge=`
/// wherever a gap is.
fn map_aligned(file: &File, len: usize, flags: libc::c_int) -> std::io::Result<*mut libc::c_void> {
    if len < HUGE_PAGE {
        return map_anywhere(file, len, flags);
    }
    use std::os::fd::AsFd;
    topology::map_on_huge_boundary(len, flags, Some(file.as_fd())).map(|a| a.as_ptr().cast())
}

/// Reserves the blocks of `[0, len)` (so a full file system cannot fault later with SIGBUS)
/// and, on tmpfs, allocates the pages under the mapping's memory policy.
///
/// Refused before anything is allocated when the file system has fewer free bytes than the
/// file still lacks: `fallocate` on a file system too small for the request (ext4, tmpfs)
/// allocates until the file system is full, fails, and keeps what it allocated — a device
/// too large for its disk would leave the disk full for every other program.
pub(crate) fn allocate(file: &File, len: u64, path: &Path) -> Result<()> {
    use std::os::unix::fs::MetadataExt;
    let held = file
        .metadata()
        .map_or(0, |m| m.blocks().saturating_mul(512));
    let lacking = len.saturating_sub(held);
    if lacking > 0
        && let Ok(free) = fstatfs_available(file)
        && lacking > free
    {
        return Err(PmemError::NoRoom {
            path: path.to_owned(),
            lacking,
            free,
        });
    }
    let len = libc::off_t::try_from(len).map_err(|_| PmemError::WrongKind {
        path: path.to_owned(),
        problem: format!("size {len} does not fit in off_t"),
    })?;
    // SAFETY: fallocate only reads its integer arguments.
    let rc = unsafe { libc::fallocate(file.as_raw_fd(), 0, 0, len) };
    if rc != 0 {
        return Err(PmemError::Io {
            path: path.to_owned(),
            action: "fallocate",
            source: std::io::Error::last_os_error(),
        });
    }
    Ok(())
}

/// How to map a file's pages for writing ahead of the writes. On tmpfs (every emulated
/// device, the only kind populated) `MADV_POPULATE_READ`: shmem keeps no dirty accounting,
/// so a read fault of a shared writable mapping maps the page writable, and it maps the
/// neighbours already in the page cache in the same fault (fault-around); a store later
/// takes no fault either. Measured on 1 GiB of a tmpfs file, pages allocated: 300–390 ns a
/// page against 730–900 ns for `MADV_POPULATE_WRITE`, and 4 ms to store to every page after
/// either (no faults); on pages not yet allocated or cleared, 2.1–2.6 µs against 2.9–5.3 µs.
/// Elsewhere a read fault maps the page read-only (the file system tracks dirty pages
/// through write faults), so the first store would fault all the same: `MADV_POPULATE_WRITE`.
fn populate_advice(on_tmpfs: bool) -> libc::c_int {
    if on_tmpfs {
        MADV_POPULATE_READ
    } else {
        MADV_POPULATE_WRITE
    }
}

/// Whether `file` is on tmpfs (as every emulated device is).
fn on_tmpfs(file: &File) -> bool {
    fstatfs(file).is_ok_and(|stats| stats.f_type == libc::TMPFS_MAGIC)
}

/// [`available_bytes`] of the file system holding `file`.
fn fstatfs_available(file: &File) -> std::io::Result<u64> {
    fstatfs(file).map(|stats| unprivileged_free(&stats))
}

/// `fstatfs` of `file`'s file system.
fn fstatfs(file: &File) -> std::io::Result<libc::statfs> {
    // SAFETY: statfs is plain old data; zeroed is a valid value.
    let mut stats: libc::statfs = unsafe { std::mem::zeroed() };
    // SAFETY: the descriptor is open for the call and `stats` is a valid out-pointer.
    let rc = unsafe { libc::fstatfs(file.as_raw_fd(), &mut stats) };
    if rc != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(stats)
}

/// The file system type of the file system holding `path` (`f_type` of statfs).
pub(crate) fn filesystem_magic(path: &Path) -> std::io::Result<i64> {
    statfs(path).map(|stats| stats.f_type)
}

/// Bytes an unprivileged user may still allocate on the file system holding `path`;
/// `u64::MAX` for a file system that reports no size (a tmpfs mounted with `size=0` has
/// no limit and reports 0 blocks, all of them taken).
pub fn available_bytes(path: &Path) -> std::io::Result<u64> {
    statfs(path).map(|stats| unprivileged_free(&stats))
}

/// What [`available_bytes`] reports, from a file system's counts.
fn unprivileged_free(stats: &libc::statfs) -> u64 {
    if stats.f_blocks == 0 {
        return u64::MAX;
    }
    stats.f_bavail.saturating_mul(stats.f_bsize as u64)
}

fn statfs(path: &Path) -> std::io::Result<libc::statfs> {
    use std::os::unix::ffi::OsStrExt;
    let c_path = std::ffi::CString::new(path.as_os_str().as_bytes())
        .map_err(|_| std::io::Error::new(std::io::ErrorKind::InvalidInput, "path contains NUL"))?;
    // SAFETY: statfs is plain old data; zeroed is a valid value.
    let mut stats: libc::statfs = unsafe { std::mem::zeroed() };
    // SAFETY: `c_path` is NUL-terminated and `stats` is a valid out-pointer.
    let rc = unsafe { libc::statfs(c_path.as_ptr(), &mut stats) };
    if rc != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(stats)
}

/// Live [`MsyncRecorder`]s.
static RECORDERS: AtomicUsize = AtomicUsize::new(0);
/// Address ranges `msync` wrote back while a recorder lived.
static MSYNCED: Mutex<Vec<Range<usize>>> = Mutex::new(Vec::new());

/// Records, while it lives, every address range `msync` writes back (ordinary-file devices):
/// how tests check that each write path makes its data durable on such a device. Ranges are
/// absolute addresses (`Region::address_of`), page-aligned; they include other threads'.
#[derive(Debug)]
pub struct MsyncRecorder(());

impl MsyncRecorder {
    /// Starts recording.
    pub fn start() -> Self {
        RECORDERS.fetch_add(1, Ordering::Relaxed);
        Self(())
    }

    /// The ranges written back so far (since the first live recorder started).
    pub fn ranges(&self) -> Vec<Range<usize>> {
        MSYNCED
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }

    /// Whether `[address, address + len)` was written back by one call.
    pub fn covered(&self, address: usize, len: usize) -> bool {
        self.ranges()
            .iter()
            .any(|r| r.start <= address && address + len <= r.end)
    }
}

impl Drop for MsyncRecorder {
    fn drop(&mut self) {
        if RECORDERS.fetch_sub(1, Ordering::Relaxed) == 1 {
            MSYNCED
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .clear();
        }
    }
}
