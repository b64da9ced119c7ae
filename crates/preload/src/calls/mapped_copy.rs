//! A file's bytes in memory, for shared mappings of a file whose blocks cannot be mapped
//! themselves: on a volume with data checksums a store through a mapping of a block would
//! leave the block's checksum behind it, so `fs::File::map_shared` refuses, and the
//! library maps a memory file holding the file's bytes instead — what a kernel file
//! system's page cache is to its mappings. One copy per file, shared by all of the file's
//! mappings in the process (so they see each other's stores), alive while any of them is.
//!
//! The copy is the newest view of the file, and the library keeps it so within the process
//! (the only one using the volume):
//! - a `read` of the file reads the copy, so it sees stores made through the mappings;
//! - every change of the file's bytes or size (`write`, `truncate`, `fallocate`, a punched
//!   hole, `O_TRUNC`) goes to the file system and then to the copy, under the copy's lock
//!   ([`change`]);
//! - stores through the mappings reach the file when written back ([`MappedCopy::write_back`]:
//!   `msync`, `munmap`, exit and `fork`): the pages of the range that differ from the
//!   file's are written to it, each run of them one atomic, durable, checksummed write.
//!   A crash loses the stores not written back, never a block's checksum.
//!
//! The copy holds the whole file in memory (a hole stays a hole of the memory file) while it
//! is mapped: mapping a large file on such a volume costs its size in memory and one read
//! of it.

use std::ffi::{c_int, c_void};
use std::sync::atomic::{AtomicUsize, Ordering, fence};
use std::sync::{Arc, Weak};

use parking_lot::{Mutex, RwLock};

use super::fs_errno;
use crate::state::{self, rank};
use crate::{errno, real};

/// Bytes moved per step when filling, reading back or comparing.
const CHUNK: usize = 1 << 20;
const PAGE: usize = 4096;

/// The bytes of one file (inode `ino`) in a memory file.
pub(crate) struct MappedCopy {
    ino: u64,
    /// The memory file (one of the library's own fds).
    fd: c_int,
    /// Held shared to read the copy, exclusively to change it together with the file.
    lock: RwLock<()>,
}

/// Every copy alive (dead entries are dropped when a copy is made).
static COPIES: Mutex<Vec<Weak<MappedCopy>>> = Mutex::new(Vec::new());
/// Copies alive or being made: lets the calls of a process with none skip [`COPIES`].
static LIVE: AtomicUsize = AtomicUsize::new(0);

impl Drop for MappedCopy {
    fn drop(&mut self) {
        LIVE.fetch_sub(1, Ordering::SeqCst);
        state::forget_internal(self.fd);
        // SAFETY: the memory file is this copy's alone; its mappings are gone or private.
        unsafe { real::close(self.fd) };
    }
}

/// The copy of `file`, if it has one (one load when no file in the process has one).
pub(crate) fn of(file: &fs::File) -> Option<Arc<MappedCopy>> {
    if LIVE.load(Ordering::SeqCst) == 0 {
        return None;
    }
    let ino = file.ino();
    state::ordered(rank::COPIES, || COPIES.lock())
        .iter()
        .filter_map(Weak::upgrade)
        .find(|c| c.ino == ino)
}

/// Runs `op`, a change of `file`'s bytes or size that may be repeated (it sets bytes or a
/// size), so that the file's copy changes with it: `mirror` applies the change to the copy,
/// under its lock with `op`, so that a write-back never sees one without the other. A copy
/// made while `op` ran without one (another thread mapped the file) may have read the file
/// before `op` changed it: `op` is then run again under its lock, and mirrored.
pub(crate) fn change<T>(
    file: &fs::File,
    op: impl Fn() -> Result<T, c_int>,
    mirror: impl Fn(&MappedCopy) -> Result<(), c_int>,
) -> Result<T, c_int> {
    if let Some(copy) = of(file) {
        let _copy = copy.lock_exclusive();
        let done = op()?;
        mirror(&copy)?;
        return Ok(done);
    }
    let done = op()?;
    // Pairs with the fence in `make`: either this load sees the copy being made, or the
    // copy's filling sees everything `op` stored.
    fence(Ordering::SeqCst);
    if let Some(copy) = of(file) {
        let _copy = copy.lock_exclusive();
        op()?;
        mirror(&copy)?;
    }
    Ok(done)
}

/// Reads `buf.len()` bytes at `offset` of `fd` (fewer only at its end).
fn pread_all(fd: c_int, buf: &mut [u8], offset: u64) -> Result<usize, c_int> {
    let mut done = 0;
    while done < buf.len() {
        // SAFETY: `buf[done..]` is writable memory of that length.
        let n = unsafe {
            real::pread64(
                fd,
                buf[done..].as_mut_ptr().cast::<c_void>(),
                buf.len() - done,
                (offset + done as u64) as libc::off_t,
            )
        };
        match n {
            0 => break,
            n if n > 0 => done += n as usize,
            _ if errno::get() == libc::EINTR => {}
            _ => return Err(errno::get()),
        }
    }
    Ok(done)
}

/// Writes all of `data` at `offset` of `fd`.
fn pwrite_all(fd: c_int, data: &[u8], offset: u64) -> Result<(), c_int> {
    let mut done = 0;
    while done < data.len() {
        // SAFETY: `data[done..]` is readable memory of that length.
        let n = unsafe {
            real::pwrite64(
                fd,
                data[done..].as_ptr().cast::<c_void>(),
                data.len() - done,
                (offset + done as u64) as libc::off_t,
            )
        };
        match n {
            n if n > 0 => done += n as usize,
            _ if n < 0 && errno::get() == libc::EINTR => {}
            // A memory file that cannot take the bytes: the machine is out of memory.
            0 => return Err(libc::ENOMEM),
            _ => return Err(errno::get()),
        }
    }
    Ok(())
}

impl MappedCopy {
    /// Makes the copy of `file` and fills it with the file's bytes (every block checked).
    /// The caller holds the table of mappings, so no other copy of the file is being made.
    pub(crate) fn make(file: &fs::File) -> Result<Arc<Self>, c_int> {
        // SAFETY: a NUL-terminated name.
        let fd = unsafe { libc::memfd_create(c"locus-mapped-file".as_ptr(), libc::MFD_CLOEXEC) };
        if fd < 0 {
            return Err(errno::get());
        }
        let fd = state::move_internal(fd);
        let copy = {
            let mut copies = state::ordered(rank::COPIES, || COPIES.lock());
            LIVE.fetch_add(1, Ordering::SeqCst);
            let copy = Arc::new(Self {
                ino: file.ino(),
                fd,
                lock: RwLock::new(()),
            });
            copies.retain(|c| c.strong_count() > 0);
            copies.push(Arc::downgrade(&copy));
            copy
        };
        // Changes of the file from now on find the copy and wait for it to be filled.
        let guard = copy.lock_exclusive();
        // Pairs with the fence in `change`.
        fence(Ordering::SeqCst);
        fill_memory_file(copy.fd, file)?;
        drop(guard);
        Ok(copy)
    }

    fn lock_exclusive(&self) -> fs::lock_order::Ordered<parking_lot::RwLockWriteGuard<'_, ()>> {
        state::ordered(rank::COPY, || self.lock.write())
    }

    /// The next stretch of the copy from `at` (before `end`) that holds pages: a hole of the
    /// memory file was never stored to, and the file reads zeros there too (every change
    /// of the file that puts bytes there puts them in the copy).
    fn next_data(&self, at: u64, end: u64) -> Result<Option<std::ops::Range<u64>>, c_int> {
        // SAFETY: our memory file; lseek moves nothing another call depends on (every read
        // and write of it is positioned).
        let data = unsafe { real::lseek64(self.fd, at as libc::off_t, libc::SEEK_DATA) };
        if data < 0 {
            return match errno::get() {
                libc::ENXIO => Ok(None),
                e => Err(e),
            };
        }
        let data = data as u64;
        if data >= end {
            return Ok(None);
        }
        // SAFETY: as above.
        let hole = unsafe { real::lseek64(self.fd, data as libc::off_t, libc::SEEK_HOLE) };
        if hole < 0 {
            return Err(errno::get());
        }
        Ok(Some(data..(hole as u64).min(end)))
    }

    /// The file's size, read while no change of it is under way (one that follows sees the
    /// mapping being made, see `shared::map_copy`).
    pub(crate) fn size(&self, file: &fs::File) -> u64 {
        let _copy = state::ordered(rank::COPY, || self.lock.read());
        file.len()
    }

    /// The memory file, for mapping its pages.
    pub(crate) fn fd(&self) -> c_int {
        self.fd
    }

    /// Reads the file's bytes at `offset` (short only at its end).
    pub(crate) fn read(&self, buf: &mut [u8], offset: u64) -> Result<usize, c_int> {
        let _copy = state::ordered(rank::COPY, || self.lock.read());
        pread_all(self.fd, buf, offset)
    }

    /// The copy's part of a write of `data` at `offset`.
    pub(crate) fn write(&self, data: &[u8], offset: u64) -> Result<(), c_int> {
        pwrite_all(self.fd, data, offset)
    }

    /// The copy's part of a size change.
    pub(crate) fn set_len(&self, size: u64) -> Result<(), c_int> {
        // SAFETY: our memory file.
        if unsafe { real::ftruncate64(self.fd, size as libc::off_t) } < 0 {
            return Err(errno::get());
        }
        Ok(())
    }

    /// The copy's part of zeroing `[offset, offset + len)` (a punched hole, a zeroed range).
    pub(crate) fn zero(&self, offset: u64, len: u64) -> Result<(), c_int> {
        // SAFETY: our memory file; punching keeps its size.
        let punched = unsafe {
            real::fallocate64(
                self.fd,
                libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE,
                offset as libc::off_t,
                len as libc::off_t,
            )
        };
        if punched < 0 {
            return Err(errno::get());
        }
        Ok(())
    }

    /// Writes the stores made through the mappings to `[from, to)` of the file: each run of
    /// the copy's pages there that differ from the file's is one write (atomic and durable
    /// when it returns). A part of the file that cannot be read (a damaged block) is written
    /// from the copy whole: the copy holds what the program sees.
    pub(crate) fn write_back(&self, file: &fs::File, from: u64, to: u64) -> Result<(), c_int> {
        let _copy = self.lock_exclusive();
        let end = to.min(file.len());
        let mut next = from - from % PAGE as u64;
        let (mut ours, mut theirs) = (Vec::new(), Vec::new());
        while let Some(stretch) = self.next_data(next, end)? {
            next = stretch.end;
            if ours.is_empty() {
                ours = vec![0u8; CHUNK];
                theirs = vec![0u8; CHUNK];
            }
            self.write_back_stretch(file, stretch, &mut ours, &mut theirs)?;
        }
        Ok(())
    }

    /// [`MappedCopy::write_back`] of `[at, end)`, a stretch of the copy that holds pages,
    /// a buffer's length at a time.
    fn write_back_stretch(
        &self,
        file: &fs::File,
        std::ops::Range { start: mut at, end }: std::ops::Range<u64>,
        ours: &mut [u8],
        theirs: &mut [u8],
    ) -> Result<(), c_int> {
        while at < end {
            let want = (end - at).min(CHUNK as u64) as usize;
            let got = pread_all(self.fd, &mut ours[..want], at)?;
            // The memory file is never shorter than the file; zeros if it were.
            ours[got..want].fill(0);
            let differ: Vec<bool> = match read_file(file, &mut theirs[..want], at) {
                Ok(n) => ours[..want]
                    .chunks(PAGE)
                    .zip(theirs[..want].chunks(PAGE))
                    .enumerate()
                    .map(|(i, (a, b))| i * PAGE >= n || a != b)
                    .collect(),
                Err(_) => vec![true; want.div_ceil(PAGE)],
            };
            let mut page = 0;
            while page < differ.len() {
                if !differ[page] {
                    page += 1;
                    continue;
                }
                let first = page;
                while page < differ.len() && differ[page] {
                    page += 1;
                }
                let bytes = &ours[first * PAGE..(page * PAGE).min(want)];
                file.write_at(bytes, at + (first * PAGE) as u64)
                    .map_err(|e| fs_errno(&e))?;
            }
            at += want as u64;
        }
        Ok(())
    }
}

/// Copies the bytes of `file` into the memory file `fd`, sized to it, leaving holes where it
/// reads zeros (its holes are not read at all: a large sparse file costs what it holds).
/// Every block read is checked against its checksum, if the volume keeps them.
pub(crate) fn fill_memory_file(fd: c_int, file: &fs::File) -> Result<(), c_int> {
    let size = file.len();
    // SAFETY: the caller's memory file.
    if unsafe { real::ftruncate64(fd, size as libc::off_t) } < 0 {
        return Err(errno::get());
    }
    let mut buf = vec![0u8; CHUNK];
    let ranges = file.data_ranges(0, size).map_err(|e| fs_errno(&e))?;
    for range in ranges {
        let mut at = range.start - range.start % PAGE as u64;
        let end = range.end.min(size);
        while at < end {
            let want = (end - at).min(CHUNK as u64) as usize;
            let got = read_file(file, &mut buf[..want], at)?;
            if got == 0 {
                break;
            }
            for (i, page) in buf[..got].chunks(PAGE).enumerate() {
                if page.iter().any(|&b| b != 0) {
                    pwrite_all(fd, page, at + (i * PAGE) as u64)?;
                }
            }
            at += got as u64;
        }
    }
    Ok(())
}

/// Reads `buf.len()` bytes of the file at `offset` through the file system (fewer only at
/// its end).
pub(crate) fn read_file(file: &fs::File, buf: &mut [u8], offset: u64) -> Result<usize, c_int> {
    let mut done = 0;
    while done < buf.len() {
        let n = file
            .read_at(&mut buf[done..], offset + done as u64)
            .map_err(|e| fs_errno(&e))?;
        if n == 0 {
            break;
        }
        done += n;
    }
    Ok(done)
}
