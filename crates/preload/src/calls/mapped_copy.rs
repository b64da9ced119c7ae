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
//!
//! A page of the file that cannot be read (a block that fails its checksum) is left out of
//! the copy and listed in its [`Damage`]: the mappings map it to the empty file, so touching
//! it is `SIGBUS` — what a kernel file system's mapping does with a page it cannot read —
//! while the rest of the file maps as usual; a `read` of it fails with `EIO` as the file's
//! own does, and a write-back never writes it. A change that replaces the block (a write of
//! the whole page, a punched hole) gives the page back to the copy and the mappings
//! ([`crate::calls::shared::after_change`]).

use std::collections::BTreeSet;
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
    /// Pages left out of the copy because the file's blocks there cannot be read. Changed
    /// only under `lock` held exclusively.
    damage: Mutex<Damage>,
}

/// The pages of a copy the file could not fill (page numbers: file offset / 4 KiB).
#[derive(Default)]
struct Damage {
    /// Unreadable now: left out of the copy, `SIGBUS` through the mappings.
    pages: BTreeSet<u64>,
    /// Readable again since the mappings last looked (a change replaced the block): the
    /// copy holds their bytes, and the mappings map them to it next
    /// ([`MappedCopy::take_healed`]).
    healed: Vec<u64>,
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
                damage: Mutex::new(Damage::default()),
            });
            copies.retain(|c| c.strong_count() > 0);
            copies.push(Arc::downgrade(&copy));
            copy
        };
        // Changes of the file from now on find the copy and wait for it to be filled.
        let guard = copy.lock_exclusive();
        // Pairs with the fence in `change`.
        fence(Ordering::SeqCst);
        let damaged = fill_around_damage(copy.fd, file)?;
        if !damaged.is_empty() {
            const NAMED: usize = 8;
            let mut offsets: Vec<String> = damaged
                .iter()
                .take(NAMED)
                .map(|p| (p * PAGE as u64).to_string())
                .collect();
            if damaged.len() > NAMED {
                offsets.push(format!("{} more", damaged.len() - NAMED));
            }
            eprintln!(
                "locus preload: mapping file {} (inode number), whose 4 KiB pages at offsets {} \
                 cannot be read (damaged: they fail their checksum); touching them through \
                 the mapping is SIGBUS, reading them EIO",
                file.ino(),
                offsets.join(", ")
            );
        }
        copy.damage().pages = damaged;
        drop(guard);
        Ok(copy)
    }

    fn damage(&self) -> fs::lock_order::Ordered<parking_lot::MutexGuard<'_, Damage>> {
        state::ordered(rank::DAMAGE, || self.damage.lock())
    }

    /// The damaged pages among the file's pages `[first, end)`.
    pub(crate) fn damaged_pages(&self, first: u64, end: u64) -> Vec<u64> {
        if first >= end {
            return Vec::new();
        }
        self.damage().pages.range(first..end).copied().collect()
    }

    /// Whether any of the file's pages `[first, end)` is damaged (no list made: `read`
    /// asks on every call).
    fn any_damaged(&self, first: u64, end: u64) -> bool {
        first < end && self.damage().pages.range(first..end).next().is_some()
    }

    /// Pages made readable since the last call, for the mappings to map them to the copy.
    pub(crate) fn take_healed(&self) -> Vec<u64> {
        std::mem::take(&mut self.damage().healed)
    }

    /// After a change of `[from, to)` of the file: each damaged page there is read again
    /// through the file system; one the change replaced (the whole block written, or
    /// punched to a hole) goes back into the copy with its bytes, one still unreadable (a
    /// write of part of it) stays out. Under the copy's exclusive lock.
    fn recheck(&self, file: &fs::File, from: u64, to: u64) -> Result<(), c_int> {
        let pages = self.damaged_pages(from / PAGE as u64, to.div_ceil(PAGE as u64));
        if pages.is_empty() {
            return Ok(());
        }
        let mut page = vec![0u8; PAGE];
        for number in pages {
            let at = number * PAGE as u64;
            match read_file(file, &mut page, at) {
                Ok(n) => {
                    pwrite_all(self.fd, &page[..n], at)?;
                    let mut damage = self.damage();
                    damage.pages.remove(&number);
                    damage.healed.push(number);
                }
                Err(libc::EIO) => {}
                Err(e) => return Err(e),
            }
        }
        Ok(())
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

    /// The file's size and its damaged pages, read while no change of it is under way (one
    /// that follows sees the mapping being made, see `shared::map_copy`).
    pub(crate) fn layout(&self, file: &fs::File) -> (u64, Vec<u64>) {
        let _copy = state::ordered(rank::COPY, || self.lock.read());
        let size = file.len();
        (size, self.damaged_pages(0, size.div_ceil(PAGE as u64)))
    }

    /// The memory file, for mapping its pages.
    pub(crate) fn fd(&self) -> c_int {
        self.fd
    }

    /// Reads the file's bytes at `offset` (short only at its end). A read that touches a
    /// damaged page fails with `EIO`, as the file system's read of the file does.
    pub(crate) fn read(&self, buf: &mut [u8], offset: u64) -> Result<usize, c_int> {
        let _copy = state::ordered(rank::COPY, || self.lock.read());
        let end = offset.saturating_add(buf.len() as u64);
        if self.any_damaged(offset / PAGE as u64, end.div_ceil(PAGE as u64)) {
            return Err(libc::EIO);
        }
        pread_all(self.fd, buf, offset)
    }

    /// The copy's part of a write of `data` at `offset` of `file`.
    pub(crate) fn write(&self, file: &fs::File, data: &[u8], offset: u64) -> Result<(), c_int> {
        pwrite_all(self.fd, data, offset)?;
        self.recheck(file, offset, offset + data.len() as u64)
    }

    /// The copy's part of a size change: damaged pages wholly past the new end are gone.
    pub(crate) fn set_len(&self, size: u64) -> Result<(), c_int> {
        // SAFETY: our memory file.
        if unsafe { real::ftruncate64(self.fd, size as libc::off_t) } < 0 {
            return Err(errno::get());
        }
        let kept = size.div_ceil(PAGE as u64);
        self.damage().pages.retain(|&page| page < kept);
        Ok(())
    }

    /// The copy's part of zeroing `[offset, offset + len)` of `file` (a punched hole, a
    /// zeroed range).
    pub(crate) fn zero(&self, file: &fs::File, offset: u64, len: u64) -> Result<(), c_int> {
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
        self.recheck(file, offset, offset.saturating_add(len))
    }

    /// Writes the stores made through the mappings to `[from, to)` of the file: each run of
    /// the copy's pages there that differ from the file's is one write (atomic and durable
    /// when it returns). A part of the file that cannot be read (a damaged block) is written
    /// from the copy whole: the copy holds what the program sees — except the damaged pages
    /// the copy could not be filled with, which no store reached (they are `SIGBUS`).
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
            let mut differ: Vec<bool> = match read_file(file, &mut theirs[..want], at) {
                Ok(n) => ours[..want]
                    .chunks(PAGE)
                    .zip(theirs[..want].chunks(PAGE))
                    .enumerate()
                    .map(|(i, (a, b))| i * PAGE >= n || a != b)
                    .collect(),
                Err(_) => vec![true; want.div_ceil(PAGE)],
            };
            let first = at / PAGE as u64;
            for page in self.damaged_pages(first, first + differ.len() as u64) {
                differ[(page - first) as usize] = false;
            }
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
/// Every block read is checked against its checksum, if the volume keeps them; a damaged
/// one fails the copy with `EIO`.
pub(crate) fn fill_memory_file(fd: c_int, file: &fs::File) -> Result<(), c_int> {
    match fill_around_damage(fd, file)?.is_empty() {
        true => Ok(()),
        false => Err(libc::EIO),
    }
}

/// [`fill_memory_file`], leaving out (as holes) the pages whose bytes cannot be read: a
/// piece of the file that fails with `EIO` is read again a page at a time. Returns those
/// pages' numbers.
fn fill_around_damage(fd: c_int, file: &fs::File) -> Result<BTreeSet<u64>, c_int> {
    let mut damaged = BTreeSet::new();
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
            let got = match read_file(file, &mut buf[..want], at) {
                Err(libc::EIO) => {
                    fill_pages(fd, file, at, want, &mut buf, &mut damaged)?;
                    at += want as u64;
                    continue;
                }
                got => got?,
            };
            if got == 0 {
                break;
            }
            store_pages(fd, &buf[..got], at)?;
            at += got as u64;
        }
    }
    Ok(damaged)
}

/// The pages of `[at, at + len)` one at a time: a page that fails with `EIO` is added to
/// `damaged` and left a hole.
fn fill_pages(
    fd: c_int,
    file: &fs::File,
    at: u64,
    len: usize,
    buf: &mut [u8],
    damaged: &mut BTreeSet<u64>,
) -> Result<(), c_int> {
    let mut pos = at;
    while pos < at + len as u64 {
        let want = PAGE.min((at + len as u64 - pos) as usize);
        match read_file(file, &mut buf[..want], pos) {
            Ok(0) => break,
            Ok(got) => store_pages(fd, &buf[..got], pos)?,
            Err(libc::EIO) => {
                damaged.insert(pos / PAGE as u64);
            }
            Err(e) => return Err(e),
        }
        pos += want as u64;
    }
    Ok(())
}

/// Writes the pages of `data` (read at `at`) that are not all zeros into the memory file.
fn store_pages(fd: c_int, data: &[u8], at: u64) -> Result<(), c_int> {
    for (i, page) in data.chunks(PAGE).enumerate() {
        if page.iter().any(|&b| b != 0) {
            pwrite_all(fd, page, at + (i * PAGE) as u64)?;
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
